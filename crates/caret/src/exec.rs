//! `caret exec "task"`: the agent without a terminal UI, for scripts and CI. Every event is
//! printed as a JSON line on stdout; questions for the user (approvals) cannot be asked, so
//! they are answered "no" (and said on stderr) — choose `--approval never` to run what the
//! rules do not refuse. Each session is saved as JSON lines under `$CARET_HOME/sessions`;
//! `--resume ID` continues one.

use std::path::PathBuf;
use std::process::ExitCode;

use caret_agent::policy::Approval;
use caret_protocol::agent::{Decision, Event, Op, TurnEnd};
use tokio::sync::mpsc;

use caret_host::config::Config;
use caret_host::runtime::runtime;
use caret_host::session::{SessionOptions, open_session};

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The task (or `/command args`).
    task: String,
    /// Plan only: read-only tools, and print the agent's plan (summary, steps, files, risks) as
    /// JSON instead of the events.
    #[arg(long)]
    plan: bool,
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
    /// The session these arguments ask for.
    pub fn options(&self) -> SessionOptions {
        SessionOptions {
            path: self.path.clone(),
            model: self.model.clone(),
            approval: match self.approval {
                ApprovalArg::Never => Approval::Never,
                ApprovalArg::Risky => Approval::Risky,
                ApprovalArg::Always => Approval::Always,
            },
            max_steps: self.max_steps,
            network: self.network,
            resume: self.resume.clone(),
            server: self.server.clone(),
            token: self.token.clone(),
            mcp: None,
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

pub fn run(config: &Config, args: ExecArgs) -> anyhow::Result<ExitCode> {
    let (mut session, id, model, session_root) = open_session(config, &args.session.options())?;
    let cwd = session_root.display().to_string();
    let reason = runtime()?.block_on(async {
        let (events_tx, mut events) = mpsc::unbounded_channel::<Event>();
        let _ = events_tx.send(Event::SessionConfigured { session_id: id, model: model.clone(), cwd });
        let (ops_tx, mut ops) = mpsc::unbounded_channel::<Op>();
        let planning = args.plan;
        let printer = tokio::spawn(async move {
            let mut plan = None;
            while let Some(e) = events.recv().await {
                if let Event::ApprovalRequest { call_id, command, reason } = &e {
                    eprintln!("caret: not run (nobody to approve it: {reason}): {command}");
                    let _ = ops_tx.send(Op::Approval { call_id: call_id.clone(), decision: Decision::Deny });
                }
                match &e {
                    Event::PlanProposed { plan: p } => plan = Some(p.clone()),
                    Event::Error { message } if planning => eprintln!("caret: {message}"),
                    _ => {}
                }
                if !planning {
                    println!("{}", serde_json::to_string(&e).unwrap_or_default());
                }
            }
            plan
        });
        if planning {
            session.set_mode(caret_protocol::agent::Mode::Plan, &events_tx);
        }
        let reason = session.turn(&args.task, &events_tx, &mut ops).await;
        session.end(&events_tx, "exit").await;
        drop(events_tx);
        let plan = printer.await.ok().flatten();
        (reason, plan)
    });
    let (reason, plan) = reason;
    if args.plan {
        let Some(plan) = plan else {
            eprintln!("caret: the agent proposed no plan (the turn ended: {reason:?})");
            return Ok(ExitCode::from(1));
        };
        println!("{}", serde_json::to_string_pretty(&plan)?);
        return Ok(ExitCode::SUCCESS);
    }
    Ok(if reason == TurnEnd::Done { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
