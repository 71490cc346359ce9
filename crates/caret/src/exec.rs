//! `caret exec "task"`: the agent without a terminal UI, for scripts and CI. Every event is
//! printed as a JSON line on stdout; questions for the user (approvals) cannot be asked, so
//! they are answered "no" (and said on stderr) — choose `--approval never` to run what the
//! rules do not refuse. Each session is saved as JSON lines under `$CARET_HOME/sessions`;
//! `--resume ID` continues one.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use caret_agent::policy::Approval;
use caret_agent::session::{ModelClient, Session};
use caret_agent::tools::lints::ReadLints;
use caret_agent::tools::terminal::RunTerminalCmd;
use caret_agent::tools::{Ctx, Registry};
use caret_protocol::agent::{Decision, Event, Op, TurnEnd};
use caret_protocol::llm::ChatRequest;
use tokio::sync::mpsc;

use crate::chat::Backend;
use crate::config::Config;
use crate::server::runtime;

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The task.
    task: String,
    #[command(flatten)]
    session: SessionArgs,
}

/// What `caret exec` and `caret agent` share: where, with which model, under which rules.
#[derive(Debug, Clone, clap::Args)]
pub struct SessionArgs {
    /// The workspace (repository) to work in.
    #[arg(long, short = 'C', default_value = ".")]
    path: PathBuf,
    /// Model alias (default: `agent`, else the first configured).
    #[arg(long, short)]
    model: Option<String>,
    /// When commands need the user's approval: never, risky or always (`caret exec` has
    /// nobody to ask: asked means refused).
    #[arg(long, value_enum, default_value = "risky")]
    pub approval: ApprovalArg,
    /// Model calls the turn may make.
    #[arg(long, default_value_t = 25)]
    max_steps: u32,
    /// Let commands use the network.
    #[arg(long)]
    network: bool,
    /// Continue a saved session (its id, printed in `session_configured`).
    #[arg(long)]
    pub resume: Option<String>,
    /// Use this server's gateway instead of the embedded one (env CARET_SERVER).
    #[arg(long, env = "CARET_SERVER")]
    server: Option<String>,
    /// API token for --server (env CARET_TOKEN).
    #[arg(long, env = "CARET_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

impl SessionArgs {
    /// A new session in `path` with `model` (default: the `agent` alias), commands needing
    /// approval when risky, the embedded gateway.
    pub fn new(path: PathBuf, model: Option<String>) -> SessionArgs {
        SessionArgs {
            path,
            model,
            approval: ApprovalArg::Risky,
            max_steps: 25,
            network: false,
            resume: None,
            server: None,
            token: None,
        }
    }
}

/// `--approval`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ApprovalArg {
    Never,
    Risky,
    Always,
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
pub fn open_session(config: &Config, args: &SessionArgs) -> anyhow::Result<(Session, String, String, PathBuf)> {
    let (backend, model) = Backend::connect(
        config,
        args.server.as_deref(),
        args.token.as_deref(),
        args.model.as_deref(),
        &["agent"],
        "agent",
    )?
    .context(
        "no models are configured: add [[models]] to the config (an `agent` alias is used first; for a local \
         model, `caret models pull qwen2.5-coder-1.5b-instruct-q4`), or use --server",
    )?;
    session_on(config, args, backend, model)
}

/// [`open_session`] with the model `model` of `backend`.
pub(crate) fn session_on(
    config: &Config,
    args: &SessionArgs,
    backend: Backend,
    model: String,
) -> anyhow::Result<(Session, String, String, PathBuf)> {
    let ctx = Arc::new(Ctx::new(&args.path).with_context(|| format!("opening {}", args.path.display()))?);
    let mut tools = Registry::workspace();
    let remote = crate::sync::Remote { server: args.server.clone(), token: args.token.clone() };
    tools.add(Arc::new(CodebaseSearch::new(config.clone(), remote)));
    let mut policy = caret_sandbox::Policy::new(&ctx.root)?.with_toolchains();
    policy.network = args.network;
    policy.limits = config.agent.limits();
    if let Ok(me) = std::env::current_exe() {
        policy = policy.with_landlock(me);
    }
    match caret_sandbox::Bwrap::new(policy) {
        Ok(sandbox) => {
            if let Some(why) = sandbox.landlock_unavailable() {
                eprintln!("caret: {why}");
            }
            let sandbox: Arc<dyn caret_sandbox::Sandbox> = Arc::new(sandbox);
            tools.add(Arc::new(RunTerminalCmd::new(sandbox.clone())));
            tools.add(Arc::new(ReadLints::new(sandbox)));
        }
        Err(e) => eprintln!("caret: {e}; the agent runs without run_terminal_cmd and read_lints"),
    }
    let root = ctx.root.clone();
    let mut session = Session::new(Arc::new(GatewayModel(backend)), &model, tools, ctx);
    session.max_steps = args.max_steps.max(1);
    session.context_window = config.context_window(&model).unwrap_or(32_768);
    session.policy.rules = config.agent.rules();
    session.policy.approval = match args.approval {
        ApprovalArg::Never => Approval::Never,
        ApprovalArg::Risky => Approval::Risky,
        ApprovalArg::Always => Approval::Always,
    };
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

pub fn run(config: &Config, args: ExecArgs) -> anyhow::Result<ExitCode> {
    let (mut session, id, model, session_root) = open_session(config, &args.session)?;
    let cwd = session_root.display().to_string();
    let reason = runtime()?.block_on(async {
        let (events_tx, mut events) = mpsc::unbounded_channel::<Event>();
        let _ = events_tx.send(Event::SessionConfigured { session_id: id, model: model.clone(), cwd });
        let (ops_tx, mut ops) = mpsc::unbounded_channel::<Op>();
        let printer = tokio::spawn(async move {
            while let Some(e) = events.recv().await {
                if let Event::ApprovalRequest { call_id, command, reason } = &e {
                    eprintln!("caret: not run (nobody to approve it: {reason}): {command}");
                    let _ = ops_tx.send(Op::Approval { call_id: call_id.clone(), decision: Decision::Deny });
                }
                println!("{}", serde_json::to_string(&e).unwrap_or_default());
            }
        });
        let reason = session.turn(&args.task, &events_tx, &mut ops).await;
        drop(events_tx);
        let _ = printer.await;
        reason
    });
    Ok(if reason == TurnEnd::Done { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `codebase_search`: the workspace's semantic index (hybrid: vectors and BM25) through the
/// same client `caret search` uses; hits come back with their current code.
pub struct CodebaseSearch {
    spec: caret_agent::tools::Spec,
    config: Config,
    remote: crate::sync::Remote,
}

impl CodebaseSearch {
    /// The tool, searching with `config`'s server (`remote`, else the embedded one).
    pub fn new(config: Config, remote: crate::sync::Remote) -> CodebaseSearch {
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
        let query = args
            .get("query")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| ToolError::new("missing string argument `query`"))?;
        let k = args.get("k").and_then(serde_json::Value::as_u64).unwrap_or(8).clamp(1, 30) as usize;
        let mode = caret_protocol::SearchMode::Hybrid;
        let outcome = crate::index::search_workspace(&self.config, &ctx.root, &self.remote, query, k, mode)
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
