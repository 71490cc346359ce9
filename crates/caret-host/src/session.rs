//! An agent session for a front end: the workspace's tools (with `codebase_search` over its
//! index and commands in the sandbox), the model through a [`Backend`], the operator's rules,
//! persisted as JSON lines under `$CARET_HOME/sessions` or resumed from there.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use caret_agent::policy::Approval;
use caret_agent::session::{ModelClient, Session};
use caret_agent::tools::lints::ReadLints;
use caret_agent::tools::terminal::RunTerminalCmd;
use caret_agent::tools::{Ctx, Registry};
use caret_protocol::llm::ChatRequest;

use crate::backend::Backend;
use crate::config::Config;
use crate::remote::Remote;

/// Where a session works, with which model, under which rules (what `caret agent`,
/// `caret exec` and the workspace page share).
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// The workspace (repository) to work in.
    pub path: PathBuf,
    /// Model alias (default: `agent`, else the first configured).
    pub model: Option<String>,
    /// When commands need the user's approval.
    pub approval: Approval,
    /// Model calls a turn may make.
    pub max_steps: u32,
    /// Let commands use the network.
    pub network: bool,
    /// Continue this saved session.
    pub resume: Option<String>,
    /// A server's gateway instead of the embedded one.
    pub server: Option<String>,
    /// API token for `server`.
    pub token: Option<String>,
    /// MCP servers already running for the workspace (a page's, shared by its chats); none:
    /// the session starts its own.
    pub mcp: Option<Arc<caret_mcp::Hub>>,
}

impl SessionOptions {
    /// A new session in `path` with `model` (default: the `agent` alias), commands needing
    /// approval when risky, the embedded gateway.
    pub fn new(path: PathBuf, model: Option<String>) -> SessionOptions {
        SessionOptions {
            path,
            model,
            approval: Approval::Risky,
            max_steps: 25,
            network: false,
            resume: None,
            server: None,
            mcp: None,
            token: None,
        }
    }
}

/// The gateway as the agent's model.
struct GatewayModel(Backend);

#[async_trait::async_trait]
impl ModelClient for GatewayModel {
    async fn chat(&self, req: ChatRequest) -> caret_models::Result<caret_models::EventStream> {
        self.0.chat(req).await
    }
}

/// A session as the arguments say (new and saved under `$CARET_HOME/sessions`, or resumed):
/// the session, its id, the model alias and the workspace root.
pub fn open_session(config: &Config, args: &SessionOptions) -> anyhow::Result<(Session, String, String, PathBuf)> {
    let (backend, model) = Backend::connect(
        config,
        args.server.as_deref(),
        args.token.as_deref(),
        args.model.as_deref(),
        &["agent"],
        "agent",
    )?
    .context(
        "no models are configured: `caret models pull qwen2.5-coder-1.5b-instruct-q4` (the local code model, \
         used as soon as it is installed), or add [[models]] to the config (an `agent` alias is used first), or \
         use --server",
    )?;
    session_on(config, args, backend, model)
}

/// [`open_session`] with the model `model` of `backend`.
pub fn session_on(
    config: &Config,
    args: &SessionOptions,
    backend: Backend,
    model: String,
) -> anyhow::Result<(Session, String, String, PathBuf)> {
    let ctx = Ctx::new(&args.path).with_context(|| format!("opening {}", args.path.display()))?;
    // The working directory counts when it lies inside the workspace.
    let cwd = std::env::current_dir().ok().and_then(|d| std::fs::canonicalize(d).ok()).unwrap_or(ctx.root.clone());
    let rules = config.agent.project_rules(&ctx.root, &cwd, Some(&config.home));
    let ctx = Arc::new(ctx.with_rules(rules));
    let mut tools = Registry::workspace();
    let remote = Remote { server: args.server.clone(), token: args.token.clone() };
    tools.add(Arc::new(CodebaseSearch::new(config.clone(), remote)));
    let docs = DocsSearch::new(config.clone());
    let has_docs = docs.is_some();
    if let Some(docs) = docs {
        tools.add(Arc::new(docs));
    }
    let mut policy = caret_sandbox::Policy::new(&ctx.root)?.with_toolchains();
    policy.network = args.network;
    policy.limits = config.agent.limits();
    if let Ok(me) = std::env::current_exe() {
        policy = policy.with_landlock(me);
    }
    match caret_sandbox::Bwrap::new(policy) {
        Ok(sandbox) => {
            if let Some(why) = sandbox.landlock_unavailable() {
                tracing::warn!("{why}");
            }
            let sandbox: Arc<dyn caret_sandbox::Sandbox> = Arc::new(sandbox);
            tools.add(Arc::new(RunTerminalCmd::new(sandbox.clone())));
            tools.add(Arc::new(ReadLints::new(sandbox)));
        }
        Err(e) => tracing::warn!("{e}; the agent runs without run_terminal_cmd and read_lints"),
    }
    let root = ctx.root.clone();
    let mut session = Session::new(Arc::new(GatewayModel(backend)), &model, tools, ctx);
    session.max_steps = args.max_steps.max(1);
    session.context_window = config.context_window(&model).unwrap_or(32_768);
    session.images = config.takes_images(&model);
    if has_docs {
        session.mentions = Some(Arc::new(DocsMentions::new(config.clone())));
    }
    session.policy.rules = config.agent.rules();
    session.policy.approval = args.approval;
    // MCP servers start with the session's first model call, in the background; a project's
    // own only once the user trusted them.
    match &args.mcp {
        Some(hub) => session.add_dynamic_tools(hub.clone()),
        None => {
            let (servers, untrusted) = crate::mcp::session_servers(&config.mcp_servers, &config.home, &root)?;
            for p in &untrusted {
                tracing::warn!(
                    "the project's MCP server {} ({}) is not started: trust it with `caret mcp trust {}`",
                    p.name,
                    p.file,
                    p.name
                );
            }
            if !servers.is_empty() {
                session.add_dynamic_tools(caret_mcp::Hub::new(servers));
            }
        }
    }
    session.startup_timeout = crate::mcp::startup_timeout(&config.mcp_servers)?;
    // Hooks: the user's, and the project's once trusted (`caret hooks trust`).
    let hooks = crate::hooks::load_for(config, &root);
    for f in &hooks.untrusted {
        session.notice_at_start(format!(
            "the project's hook file {} does not run until you trust it (`caret hooks trust`)",
            f.shown
        ));
    }
    for p in &hooks.problems {
        session.notice_at_start(format!("hooks: {}: {}", p.source, p.message));
    }
    if !hooks.hooks.is_empty() {
        let shell = Arc::new(caret_agent::hooks::LocalShell);
        session.set_hooks(caret_agent::hooks::Hooks::new(hooks.hooks, &root, shell));
    }
    // Skills and custom commands, the project's and the user's.
    let (skills, skipped) = crate::conventions::skills(config, &root);
    for s in skipped {
        session.notice_at_start(format!("skill {} left out: {}", s.dir.display(), s.why));
    }
    session.set_skills(skills);
    let (commands, skipped) = crate::conventions::commands(config, &root);
    for c in skipped {
        session.notice_at_start(format!("command {} left out: {}", c.file.display(), c.why));
    }
    session.commands = commands;
    let (agents, skipped) = crate::conventions::subagents(config, &root);
    for (file, why) in skipped {
        session.notice_at_start(format!("subagent {} left out: {why}", file.display()));
    }
    caret_agent::subagents::enable(&mut session, agents);
    // Sessions are saved as JSON lines under $CARET_HOME/sessions.
    let id = match &args.resume {
        Some(id) => {
            anyhow::ensure!(
                !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
                "--resume takes a session id, not {id:?}"
            );
            let path = config.home.join("sessions").join(format!("{id}.jsonl"));
            session.resume(&path).with_context(|| format!("resuming session {id} ({})", path.display()))?;
            id.clone()
        }
        None => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let id = format!("{}-{:04x}", now.as_secs(), (now.subsec_nanos() ^ std::process::id()) & 0xffff);
            let path = config.home.join("sessions").join(format!("{id}.jsonl"));
            session.persist(&path, &id).with_context(|| format!("saving the session to {}", path.display()))?;
            id
        }
    };
    Ok((session, id, model, root))
}

/// `codebase_search`: the workspace's semantic index (hybrid: vectors and BM25) through the
/// same client `caret search` uses; hits come back with their current code.
pub struct CodebaseSearch {
    spec: caret_agent::tools::Spec,
    config: Config,
    remote: Remote,
}

impl CodebaseSearch {
    /// The tool, searching with `config`'s server (`remote`, else the embedded one).
    pub fn new(config: Config, remote: Remote) -> CodebaseSearch {
        CodebaseSearch {
            spec: caret_agent::tools::Spec {
                name: "codebase_search",
                description: "Search the codebase by meaning: a question or a description of the code you look for \
                              (\"where are API tokens checked?\"). Answers the best matching chunks with their \
                              path and lines. Use grep for exact names.",
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {
                        "query": {"type": "string"},
                        "k": {"type": "integer", "minimum": 1, "maximum": 30}
                    },
                    "required": ["query"]
                }),
                read_only: true,
            },
            config,
            remote,
        }
    }
}

#[async_trait::async_trait]
impl caret_agent::tools::Tool for CodebaseSearch {
    fn spec(&self) -> &caret_agent::tools::Spec {
        &self.spec
    }

    async fn call(&self, args: serde_json::Value, ctx: &Ctx) -> caret_agent::tools::ToolResult {
        use std::fmt::Write as _;

        use caret_agent::tools::ToolError;
        let (query, k) = query_and_k(&args, 8, 30)?;
        let mode = caret_protocol::SearchMode::Hybrid;
        let outcome = crate::search::search_workspace(&self.config, &ctx.root, &self.remote, query, k, mode)
            .await
            .map_err(|e| ToolError::new(format!("codebase_search: {e:#}")))?;
        let mut out = String::new();
        if !outcome.semantic {
            out.push_str("[lexical results only: the workspace has no vectors yet (caret index)]\n");
        }
        for h in &outcome.hits {
            let _ = writeln!(out, "{}:{}-{} (score {:.3})", h.path, h.start_line, h.end_line, h.score);
            for line in h.snippet.lines().take(30) {
                let _ = writeln!(out, "    {line}");
            }
        }
        if outcome.hits.is_empty() {
            out.push_str("no results (is the workspace synced? caret index)\n");
        }
        Ok(caret_agent::tools::truncate(out, ctx.max_output_bytes, "ask for fewer hits (k)"))
    }
}

/// A search tool's `query` and `k` (`default`, at most `most`).
fn query_and_k(args: &serde_json::Value, default: u64, most: u64) -> caret_agent::tools::ToolResult<(&str, usize)> {
    let query = args
        .get("query")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| caret_agent::tools::ToolError::new("missing string argument `query`"))?;
    let k = args.get("k").and_then(serde_json::Value::as_u64).unwrap_or(default).clamp(1, most);
    Ok((query, usize::try_from(k).unwrap_or(1)))
}

/// `docs_search`: the documentation sources of this machine (`caret docs add`), each hit with
/// its page's URL and heading.
pub struct DocsSearch {
    spec: caret_agent::tools::Spec,
    config: Config,
}

impl DocsSearch {
    /// The tool over `config`'s sources, when there are any (their names in its description).
    pub fn new(config: Config) -> Option<DocsSearch> {
        let names = crate::docs::source_names(&config);
        if names.is_empty() {
            return None;
        }
        let description = format!(
            "Search third-party documentation the user added ({}) by meaning: a question about a library \
             or tool. Answers the best matching sections with their page's URL. Prefer it over your memory \
             for these libraries. When the user writes @Docs NAME, search that source.",
            names.join(", ")
        );
        Some(DocsSearch {
            spec: caret_agent::tools::Spec {
                name: "docs_search",
                description: caret_agent::tools::intern(description),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {
                        "query": {"type": "string"},
                        "source": {"type": "string", "enum": names, "description": "one source (default: all)"},
                        "k": {"type": "integer", "minimum": 1, "maximum": 20}
                    },
                    "required": ["query"]
                }),
                read_only: true,
            },
            config,
        })
    }
}

#[async_trait::async_trait]
impl caret_agent::tools::Tool for DocsSearch {
    fn spec(&self) -> &caret_agent::tools::Spec {
        &self.spec
    }

    async fn call(&self, args: serde_json::Value, ctx: &Ctx) -> caret_agent::tools::ToolResult {
        use std::fmt::Write as _;

        use caret_agent::tools::ToolError;
        let (query, k) = query_and_k(&args, 5, 20)?;
        // Sources due a refresh are refreshed in the background (once per process).
        static DUE: std::sync::Once = std::sync::Once::new();
        DUE.call_once(|| crate::docs::refresh_due_in_background(&self.config));
        let names: Vec<String> =
            args.get("source").and_then(serde_json::Value::as_str).map(str::to_owned).into_iter().collect();
        let hits = crate::docs::search(&self.config, query, &names, k)
            .await
            .map_err(|e| ToolError::new(format!("docs_search: {e:#}")))?;
        let mut out = String::new();
        for h in &hits {
            let heading = if h.heading.is_empty() { String::new() } else { format!(" › {}", h.heading) };
            let _ = writeln!(out, "{}{heading} — {} ({}, score {:.3})", h.title, h.url, h.source, h.score);
            for line in h.text.lines().take(40) {
                let _ = writeln!(out, "    {line}");
            }
        }
        if hits.is_empty() {
            out.push_str("no results\n");
        }
        Ok(caret_agent::tools::truncate(out, ctx.max_output_bytes, "ask for fewer hits (k)"))
    }
}

/// `@Docs NAME` in a request: the sections of that documentation source that best answer
/// it come with it (as an editor attaches the docs a user mentions).
pub struct DocsMentions {
    config: Config,
}

/// Sections attached for one `@Docs` mention.
const MENTION_HITS: usize = 4;

impl DocsMentions {
    /// Mentions of `config`'s sources.
    pub fn new(config: Config) -> DocsMentions {
        DocsMentions { config }
    }

    /// The sources `input` mentions (`@Docs NAME`, any case), known ones only, in order.
    pub fn mentioned(input: &str, known: &[String]) -> Vec<String> {
        let words: Vec<&str> = input.split_whitespace().collect();
        let mut out = Vec::new();
        for pair in words.windows(2) {
            let name = pair[1].trim_end_matches([',', '.', ':', ';', '!', '?']);
            if pair[0].eq_ignore_ascii_case("@docs")
                && known.iter().any(|k| k == name)
                && !out.iter().any(|o| o == name)
            {
                out.push(name.to_owned());
            }
        }
        out
    }
}

#[async_trait::async_trait]
impl caret_agent::session::Mentions for DocsMentions {
    async fn attach(&self, input: &str) -> Option<String> {
        use std::fmt::Write as _;
        let names = DocsMentions::mentioned(input, &crate::docs::source_names(&self.config));
        if names.is_empty() {
            return None;
        }
        let mut out = String::new();
        for name in names {
            match crate::docs::search(&self.config, input, std::slice::from_ref(&name), MENTION_HITS).await {
                Ok(hits) => {
                    let _ = write!(out, "\n\n[@Docs {name}: the sections that best match this request]");
                    for h in hits {
                        let heading = if h.heading.is_empty() { String::new() } else { format!(" › {}", h.heading) };
                        let _ = write!(out, "\n\n{}{heading} — {}\n{}", h.title, h.url, h.text.trim_end());
                    }
                }
                Err(e) => tracing::warn!("@Docs {name}: {e:#}"),
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_mentions_name_known_sources() {
        let known = vec!["sqlite".to_owned(), "mylib".to_owned()];
        let got = DocsMentions::mentioned("use @Docs sqlite, and @docs mylib. Not @Docs other or @Docssqlite", &known);
        assert_eq!(got, ["sqlite", "mylib"]);
        assert!(DocsMentions::mentioned("@Docs", &known).is_empty());
    }
}
