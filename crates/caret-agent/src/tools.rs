//! The agent's tools: what each one is (name, description, JSON schema, whether it only
//! reads), how it is called, and how its output is cut down to what a model should read.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

pub mod edit;
pub mod fs;
pub mod grep;
pub mod lints;
pub mod rules;
pub mod terminal;

/// What a tool tells the model about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The name the model calls it by.
    pub name: &'static str,
    /// What it does and when to use it.
    pub description: &'static str,
    /// JSON schema of its arguments.
    pub parameters: Value,
    /// It changes nothing: calls of read-only tools run concurrently.
    pub read_only: bool,
}

/// Why a call failed; the message is what the model reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> ToolError {
        ToolError(message.into())
    }
}

/// Result alias of tools.
pub type ToolResult<T = String> = Result<T, ToolError>;

/// A change a tool made to a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// Workspace-relative path.
    pub path: String,
    /// Added, updated or deleted.
    pub kind: caret_protocol::agent::ChangeKind,
    /// A unified diff of it.
    pub diff: String,
}

/// What every call can see: the workspace it works in, and where tools leave what they did.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The workspace root (canonical).
    pub root: PathBuf,
    /// Most bytes of output a call returns before it is cut.
    pub max_output_bytes: usize,
    /// File changes made by tools, for the front end (taken by whoever reports them).
    pub changes: Arc<std::sync::Mutex<Vec<FileChange>>>,
    /// The todo list as `todo_write` last left it.
    pub todos: Arc<std::sync::Mutex<Vec<caret_protocol::agent::TodoItem>>>,
    /// Files the agent has read or written in this session: `write_file` replaces only
    /// those (a model that never looked at a file would drop what it holds).
    pub seen: Arc<std::sync::Mutex<std::collections::HashSet<PathBuf>>>,
    /// Calls that failed (tool, arguments and error), to tell a model that repeats one.
    pub failed: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// The project's rules files.
    pub rules: Arc<crate::project_rules::ProjectRules>,
    /// Names of the rules attached or fetched so far (besides the always-rules), in order.
    pub attached: Arc<std::sync::Mutex<Vec<String>>>,
    /// Where a tool's own events go while a turn runs (a subagent's, nested under its call).
    pub sink: Arc<std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<caret_protocol::agent::Event>>>>,
    /// Tokens subagents used (prompt, completion, calls), counted with the session's own.
    pub sub_usage: Arc<std::sync::Mutex<(u64, u64, u32)>>,
}

impl Ctx {
    /// A context for the workspace at `root`.
    pub fn new(root: &Path) -> std::io::Result<Ctx> {
        Ok(Ctx {
            root: std::fs::canonicalize(root)?,
            max_output_bytes: 32 * 1024,
            changes: Arc::default(),
            todos: Arc::default(),
            seen: Arc::default(),
            failed: Arc::default(),
            rules: Arc::default(),
            attached: Arc::default(),
            sink: Arc::default(),
            sub_usage: Arc::default(),
        })
    }

    /// Sends `event` to the session's front end (nothing outside a turn).
    pub fn emit(&self, event: caret_protocol::agent::Event) {
        if let Some(sink) = &*self.sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
            let _ = sink.send(event);
        }
    }

    /// The same context with these rules (by default: none; hosts load them with
    /// [`crate::project_rules::ProjectRules::load`]).
    pub fn with_rules(mut self, rules: crate::project_rules::ProjectRules) -> Ctx {
        self.rules = Arc::new(rules);
        self
    }

    /// The same context with the workspace's own rules files, read from its root with the
    /// default cap: for sessions with no user of their own (a server's, a background run's).
    pub fn with_workspace_rules(self) -> Ctx {
        let rules =
            crate::project_rules::ProjectRules::load(&self.root, &self.root, None, crate::project_rules::DEFAULT_CAP);
        self.with_rules(rules)
    }

    /// The glob rules matching `path` (workspace-relative) not attached before, now noted as
    /// attached: the text a tool result carries for them, if any.
    pub fn attach_rules(&self, path: &str) -> Option<String> {
        let matching = self.rules.matching(path);
        if matching.is_empty() {
            return None;
        }
        let mut attached = self.attached.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut text = String::new();
        for rule in matching {
            if attached.contains(&rule.name) {
                continue;
            }
            attached.push(rule.name.clone());
            text.push_str(&format!(
                "\n\n<rule name=\"{}\" applies-to=\"{path}\">\n{}\n</rule>",
                rule.name,
                rule.text.trim_end()
            ));
        }
        (!text.is_empty()).then_some(text)
    }

    /// Notes that the agent has seen `path`'s current content.
    pub fn saw(&self, path: &Path) {
        self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(path.to_path_buf());
    }

    /// Whether the agent has seen `path` in this session.
    pub fn has_seen(&self, path: &Path) -> bool {
        self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(path)
    }

    /// Notes a failed call; whether the very same call failed the same way before.
    pub fn failed_before(&self, call: String) -> bool {
        !self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(call)
    }

    /// Takes the file changes recorded so far.
    pub fn take_changes(&self) -> Vec<FileChange> {
        std::mem::take(&mut *self.changes.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// The absolute path of `rel` (workspace-relative, or absolute inside the workspace). A
    /// path that leaves the workspace — by `..`, or by a symbolic link pointing outside — is
    /// refused.
    pub fn resolve(&self, rel: &str) -> ToolResult<PathBuf> {
        let given = Path::new(rel);
        let joined = if given.is_absolute() { given.to_path_buf() } else { self.root.join(given) };
        // Lexically first (for paths that do not exist yet)...
        let mut clean = PathBuf::new();
        for c in joined.components() {
            match c {
                Component::ParentDir => {
                    clean.pop();
                }
                Component::CurDir => {}
                other => clean.push(other),
            }
        }
        if !clean.starts_with(&self.root) {
            return Err(ToolError::new(format!("{rel} is outside the workspace")));
        }
        // ...then through links, for what exists (the deepest existing ancestor).
        let mut existing = clean.as_path();
        while !existing.exists() {
            match existing.parent() {
                Some(p) => existing = p,
                None => break,
            }
        }
        if let Ok(real) = std::fs::canonicalize(existing)
            && !real.starts_with(&self.root)
        {
            return Err(ToolError::new(format!("{rel} leads outside the workspace (a symbolic link)")));
        }
        Ok(clean)
    }

    /// `path` relative to the workspace root, `/`-separated.
    pub fn relative(&self, path: &Path) -> String {
        let rel = path.strip_prefix(&self.root).unwrap_or(path);
        let s = rel.to_string_lossy().replace('\\', "/");
        if s.is_empty() { ".".to_owned() } else { s }
    }
}

/// A tool.
#[async_trait::async_trait]
pub trait Tool: Send + Sync {
    /// What it is.
    fn spec(&self) -> &Spec;
    /// Runs it with the model's arguments.
    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult;
    /// Runs it, with the images its result carries beside its text (an MCP server's
    /// screenshot, say); by default [`Tool::call`]'s text and none.
    async fn call_with_images(&self, args: Value, ctx: &Ctx) -> ToolResult<(String, Vec<Image>)> {
        self.call(args, ctx).await.map(|text| (text, Vec::new()))
    }
    /// Whether its calls need the user's approval first (none: the session's policy decides,
    /// which only looks at terminal commands).
    fn approval(&self) -> Option<ToolApproval> {
        None
    }
    /// The MCP server it comes from (none: built in), shown with each of its calls.
    fn server(&self) -> Option<&str> {
        None
    }
}

/// A `&'static str` for a dynamic name or description (a tool's [`Spec`] holds static
/// strings): each distinct text is leaked once and reused.
pub fn intern(s: String) -> &'static str {
    static SEEN: std::sync::Mutex<Option<std::collections::HashSet<&'static str>>> = std::sync::Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let set = seen.get_or_insert_with(std::collections::HashSet::new);
    if let Some(found) = set.get(s.as_str()) {
        return found;
    }
    let leaked: &'static str = Box::leak(s.into_boxed_str());
    set.insert(leaked);
    leaked
}

/// An image a tool's result carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Its type (`image/png`).
    pub mime: String,
    /// Its bytes, base64.
    pub base64: String,
}

/// What a tool's own settings say of its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolApproval {
    /// Ask the user before each call (unless approved for the session).
    Ask,
    /// Refuse every call.
    Never,
}

/// Tools that come and go while a session runs (an MCP server's, once it answers): the
/// session takes [`DynamicTools::current`] before each model call.
pub trait DynamicTools: Send + Sync {
    /// The tools offered now.
    fn current(&self) -> Vec<Arc<dyn Tool>>;
    /// Starts what the tools come from (servers), when that waits for a runtime.
    fn start(&self) {}
    /// Whether more may come soon (a server still starting).
    fn starting(&self) -> bool {
        false
    }
    /// The sources not answering now, with why (`still starting`, the error).
    fn not_ready(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// The tools an agent has, by name.
#[derive(Clone, Default)]
pub struct Registry {
    tools: BTreeMap<&'static str, Arc<dyn Tool>>,
}

impl Registry {
    /// The read-only workspace tools: `read_file`, `list_dir`, `glob`, `grep`.
    pub fn read_only() -> Registry {
        let mut r = Registry::default();
        r.add(Arc::new(fs::ReadFile::new()));
        r.add(Arc::new(fs::ListDir::new()));
        r.add(Arc::new(fs::Glob::new()));
        r.add(Arc::new(grep::Grep::new()));
        r
    }

    /// The read-only tools plus those that change the workspace (`edit_file`, `write_file`,
    /// `delete_file`) and `todo_write`.
    pub fn workspace() -> Registry {
        let mut r = Registry::read_only();
        r.add(Arc::new(edit::EditFile::new()));
        r.add(Arc::new(edit::WriteFile::new()));
        r.add(Arc::new(edit::DeleteFile::new()));
        r.add(Arc::new(edit::TodoWrite::new()));
        r
    }

    /// Adds (or replaces) a tool.
    pub fn add(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.spec().name, tool);
    }

    /// Removes a tool by name.
    pub fn remove(&mut self, name: &str) {
        self.tools.remove(name);
    }

    /// A tool by name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Every tool's spec, by name.
    pub fn specs(&self) -> Vec<&Spec> {
        self.tools.values().map(|t| t.spec()).collect()
    }
}

/// Runs blocking file work off the async threads, so concurrent calls really run side by
/// side.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> ToolResult<T> + Send + 'static) -> ToolResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ToolError::new(format!("the tool failed: {e}")))?
}

/// An I/O error on a workspace path, as the model reads it.
pub(crate) fn io(rel: &str, e: std::io::Error) -> ToolError {
    ToolError::new(format!("{rel}: {e}"))
}

/// A string argument.
pub(crate) fn string_arg<'a>(args: &'a Value, name: &str) -> ToolResult<&'a str> {
    args.get(name).and_then(Value::as_str).ok_or_else(|| ToolError::new(format!("missing string argument `{name}`")))
}

/// An optional non-negative integer argument.
pub(crate) fn usize_arg(args: &Value, name: &str) -> ToolResult<Option<usize>> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| ToolError::new(format!("`{name}` must be a non-negative integer"))),
    }
}

/// Cuts `text` to at most `max_bytes` at a line boundary, with a note saying how much was
/// left out and how to see it (`hint`).
pub fn truncate(text: String, max_bytes: usize, hint: &str) -> String {
    if text.len() <= max_bytes {
        return text;
    }
    let mut cut = max_bytes;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let cut = text[..cut].rfind('\n').map_or(cut, |i| i + 1);
    let left = text[cut..].lines().count();
    format!("{}[output truncated: {left} more lines, {} more bytes; {hint}]\n", &text[..cut], text.len() - cut)
}
