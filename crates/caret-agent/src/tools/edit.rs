//! Changing the workspace: `edit_file` (any `caret apply` format), `write_file`,
//! `delete_file`; and `todo_write`. Writes are atomic (`caret_workspace::statcache::write_atomic`:
//! a synced temporary file renamed over the old one, its permissions kept); each change is
//! recorded with a unified diff.

use caret_protocol::agent::{ChangeKind, TodoItem};
use serde_json::{Value, json};

use super::{Ctx, FileChange, Spec, Tool, ToolError, ToolResult, blocking, io, string_arg};

/// A unified diff between two versions of `path` (3 lines of context).
pub fn unified_diff(path: &str, old: &str, new: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string()
}

fn record(ctx: &Ctx, change: FileChange) {
    ctx.changes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(change);
}

/// A summary of a diff: `+A -R lines`.
fn counts(diff: &str) -> String {
    let body = diff.lines().filter(|l| !l.starts_with("+++") && !l.starts_with("---"));
    let (mut add, mut del) = (0, 0);
    for l in body {
        if l.starts_with('+') {
            add += 1;
        } else if l.starts_with('-') {
            del += 1;
        }
    }
    format!("+{add} -{del} lines")
}

/// `edit_file`.
pub struct EditFile {
    spec: Spec,
}

impl EditFile {
    /// The tool.
    pub fn new() -> EditFile {
        EditFile {
            spec: Spec {
                name: "edit_file",
                description: "Edit a file. `edit` is one of: search/replace blocks (<<<<<<< SEARCH / ======= / \
                              >>>>>>> REPLACE, the SEARCH text copied exactly from the file), a unified diff, or \
                              the changed code with unchanged stretches elided by comments like \
                              `// ... existing code ...`. Read the file first. An edit that fits no place or two \
                              places is refused with the candidates; nothing is written then.",
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "edit": {"type": "string"},
                        "format": {"type": "string", "enum": ["auto", "lazy", "search-replace", "udiff"]}
                    },
                    "required": ["path", "edit"]
                }),
                read_only: false,
            },
        }
    }
}

impl Default for EditFile {
    fn default() -> Self {
        EditFile::new()
    }
}

#[async_trait::async_trait]
impl Tool for EditFile {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let rel = string_arg(&args, "path")?.to_owned();
        let edit = string_arg(&args, "edit")?.to_owned();
        let format = match args.get("format").and_then(Value::as_str) {
            None | Some("auto") => None,
            Some(name) => Some(caret_apply::Format::parse(name).map_err(|e| ToolError::new(e.to_string()))?),
        };
        let path = ctx.resolve(&rel)?;
        let ctx = ctx.clone();
        blocking(move || {
            let bytes = std::fs::read(&path).map_err(|e| io(&rel, e))?;
            let text = caret_apply::Text::parse(&bytes).map_err(|e| ToolError::new(format!("{rel}: {e}")))?;
            let (new, format) =
                caret_apply::apply(&text, &edit, format, Some(&rel)).map_err(|e| ToolError::new(e.to_string()))?;
            let (old, new) = (text.render(), new.render());
            if old == new {
                // An error, so that a model repeating it is told to change course.
                return Err(ToolError::new(format!(
                    "the edit ({}) changes nothing in {rel}: what it puts in is what is there already; nothing \
                     was written",
                    format.name()
                )));
            }
            caret_workspace::statcache::write_atomic(&path, new.as_bytes()).map_err(|e| io(&rel, e))?;
            ctx.saw(&path);
            let diff = unified_diff(&rel, &old, &new);
            let summary = format!("edited {rel} ({}, {})", format.name(), counts(&diff));
            record(&ctx, FileChange { path: rel, kind: ChangeKind::Update, diff });
            Ok(summary)
        })
        .await
    }
}

/// `write_file`.
pub struct WriteFile {
    spec: Spec,
}

impl WriteFile {
    /// The tool.
    pub fn new() -> WriteFile {
        WriteFile {
            spec: Spec {
                name: "write_file",
                description: "Create a file, or replace a file's whole content (prefer edit_file for changes to an \
                              existing file). Directories are created as needed.",
                parameters: json!({
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["path", "content"]
                }),
                read_only: false,
            },
        }
    }
}

impl Default for WriteFile {
    fn default() -> Self {
        WriteFile::new()
    }
}

#[async_trait::async_trait]
impl Tool for WriteFile {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let rel = string_arg(&args, "path")?.to_owned();
        let content = string_arg(&args, "content")?.to_owned();
        let path = ctx.resolve(&rel)?;
        let ctx = ctx.clone();
        blocking(move || {
            if path.is_dir() {
                return Err(ToolError::new(format!("{rel} is a directory")));
            }
            let old = match std::fs::read(&path) {
                Ok(b) => {
                    Some(String::from_utf8(b).map_err(|_| ToolError::new(format!("{rel} is not text: not replaced")))?)
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(io(&rel, e)),
            };
            if let Some(old) = old.as_deref() {
                if !ctx.has_seen(&path) {
                    return Err(unread(&ctx, &path, &rel, old));
                }
                if old == content {
                    return Err(ToolError::new(format!(
                        "{rel} already has exactly this content: nothing changed (the task is not done by this call)"
                    )));
                }
                let kept = definitions(&content);
                let lost: Vec<String> = definitions(old).into_iter().filter(|d| !kept.contains(d)).collect();
                if !lost.is_empty() && !ctx.failed_before(format!("write_file drops\0{rel}\0{old}\0{content}")) {
                    return Err(ToolError::new(format!(
                        "nothing was written: this content drops {} from {rel}. To add or change code and keep \
                         the rest, use edit_file (a search/replace block), or write_file the whole file with the \
                         old code kept. If dropping them is meant, make this same call again.",
                        lost.join(", ")
                    )));
                }
            }
            caret_workspace::statcache::write_atomic(&path, content.as_bytes()).map_err(|e| io(&rel, e))?;
            ctx.saw(&path);
            let diff = unified_diff(&rel, old.as_deref().unwrap_or(""), &content);
            let kind = if old.is_some() { ChangeKind::Update } else { ChangeKind::Add };
            let summary = format!("{} {rel} ({})", if old.is_some() { "replaced" } else { "created" }, counts(&diff));
            record(&ctx, FileChange { path: rel, kind, diff });
            Ok(summary)
        })
        .await
    }
}

/// The definitions a file makes, as `keyword name` (`def add`, `fn main`, `class Stack`),
/// read from the start of its lines: what a whole-file rewrite should not lose unnoticed.
pub fn definitions(text: &str) -> Vec<String> {
    const MODIFIERS: &[&str] = &["pub", "export", "async", "default", "static", "public", "private", "protected"];
    const KEYWORDS: &[&str] =
        &["def", "fn", "class", "struct", "enum", "trait", "func", "function", "interface", "type", "mod"];
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace().peekable();
        while let Some(w) = words.peek() {
            if MODIFIERS.contains(w) || w.starts_with("pub(") {
                words.next();
            } else {
                break;
            }
        }
        let (Some(keyword), Some(name)) = (words.next(), words.next()) else { continue };
        let name: String = name.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if KEYWORDS.contains(&keyword) && !name.is_empty() {
            let def = format!("{keyword} {name}");
            if !out.contains(&def) {
                out.push(def);
            }
        }
    }
    out
}

/// Lines of an unread file shown when `write_file` refuses to replace it.
const UNREAD_SHOWN_LINES: usize = 200;

/// The refusal to replace a file the agent has not read. Small models rewrite a whole file with
/// the one function they meant to add; the refusal shows the content (so the next call can be
/// right) and counts as a read when the whole file fits.
fn unread(ctx: &Ctx, path: &std::path::Path, rel: &str, old: &str) -> ToolError {
    let total = old.lines().count();
    let shown: Vec<&str> = old.lines().take(UNREAD_SHOWN_LINES).collect();
    let mut shown = shown.join("\n");
    if total > UNREAD_SHOWN_LINES {
        shown.push_str(&format!("\n[first {UNREAD_SHOWN_LINES} of {total} lines; read_file the rest]"));
    } else {
        ctx.saw(path);
    }
    ToolError::new(format!(
        "{rel} exists and you had not read it, so nothing was written. Its content now:\n```\n{shown}\n```\n\
         Change it with edit_file (a search/replace block), or write_file again with the whole new content \
         (everything that should stay, too)."
    ))
}

/// `delete_file`.
pub struct DeleteFile {
    spec: Spec,
}

impl DeleteFile {
    /// The tool.
    pub fn new() -> DeleteFile {
        DeleteFile {
            spec: Spec {
                name: "delete_file",
                description: "Delete a file of the workspace (not a directory).",
                parameters: json!({
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"]
                }),
                read_only: false,
            },
        }
    }
}

impl Default for DeleteFile {
    fn default() -> Self {
        DeleteFile::new()
    }
}

#[async_trait::async_trait]
impl Tool for DeleteFile {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let rel = string_arg(&args, "path")?.to_owned();
        let path = ctx.resolve(&rel)?;
        if path.is_dir() {
            return Err(ToolError::new(format!("{rel} is a directory: not deleted")));
        }
        let old = std::fs::read(&path).map_err(|e| io(&rel, e))?;
        std::fs::remove_file(&path).map_err(|e| io(&rel, e))?;
        let diff = unified_diff(&rel, &String::from_utf8_lossy(&old), "");
        record(ctx, FileChange { path: rel.clone(), kind: ChangeKind::Delete, diff });
        Ok(format!("deleted {rel}"))
    }
}

/// `todo_write`.
pub struct TodoWrite {
    spec: Spec,
}

impl TodoWrite {
    /// The tool.
    pub fn new() -> TodoWrite {
        TodoWrite {
            spec: Spec {
                name: "todo_write",
                description: "Keep a todo list for a task of several steps: send the whole list each time, with \
                              each item's status (pending, in_progress, completed, cancelled). One item \
                              in_progress at a time.",
                parameters: json!({
                    "type": "object",
                    "properties": {"todos": {"type": "array", "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string"},
                            "content": {"type": "string"},
                            "status": {"type": "string", "enum": ["pending", "in_progress", "completed", "cancelled"]}
                        },
                        "required": ["id", "content", "status"]
                    }}},
                    "required": ["todos"]
                }),
                read_only: false,
            },
        }
    }
}

impl Default for TodoWrite {
    fn default() -> Self {
        TodoWrite::new()
    }
}

#[async_trait::async_trait]
impl Tool for TodoWrite {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let items: Vec<TodoItem> = serde_json::from_value(args.get("todos").cloned().unwrap_or(Value::Null))
            .map_err(|e| ToolError::new(format!("`todos` must be a list of {{id, content, status}}: {e}")))?;
        let done = items.iter().filter(|t| t.status == caret_protocol::agent::TodoStatus::Completed).count();
        let summary = format!("todo list: {} items, {done} completed", items.len());
        *ctx.todos.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = items;
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::definitions;

    #[test]
    fn definitions_are_read_from_line_starts_in_several_languages() {
        let text = "pub(crate) async fn run() {}\nfn main() {\n    let fn_x = 1;\n}\nclass Stack:\n    def push(self, x):\n\
                    export default function App() {}\ntype Id = u32;\nimpl Foo {}\n# def not_code\nstruct P<T>(T);\n";
        assert_eq!(
            definitions(text),
            ["fn run", "fn main", "class Stack", "def push", "function App", "type Id", "struct P"]
        );
    }
}
