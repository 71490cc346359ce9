//! `caret run`, `caret runs …`, `caret worker` and `caret secret`: background runs, on a
//! server (`--server`) or on the embedded queue under `$CARET_HOME`, where a local worker is
//! started on demand and stops when the queue has been empty for a while.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use caret_anyrun::worker::{InProcess, Worker};
use caret_protocol::agent::Event;
use caret_protocol::runs::{
    CreateRun, NumberedEvent, PushTarget, RepoSource, RunClass, RunEnvironment, RunEvent, RunInfo, RunLimits, RunList,
    RunStatus,
};

use caret_host::config::Config;
use caret_host::remote::Remote;
use caret_host::runs::{
    Runs, apply_patch, bundle_checkout, open_service, origin_url, spawn_upkeep, with_snapshots, worker_config,
};
use caret_host::runtime::runtime;

/// Where runs go: a server, or the embedded queue.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// A `caret serve` to run on (env CARET_SERVER); default: the embedded queue.
    #[arg(long, env = "CARET_SERVER")]
    server: Option<String>,
    /// API token for --server (env CARET_TOKEN).
    #[arg(long, env = "CARET_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
}

impl Target {
    /// The server these arguments name (none: the embedded queue).
    pub fn remote(&self) -> Remote {
        Remote { server: self.server.clone(), token: self.token.clone() }
    }
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// What the agent should do.
    task: String,
    /// The repository (its HEAD and uncommitted changes are sent as a bundle).
    #[arg(long, short = 'C', default_value = ".")]
    path: PathBuf,
    /// Run on this git URL (file:// or https://) instead of sending the local checkout.
    #[arg(long, conflicts_with = "path")]
    repo: Option<String>,
    /// With --repo: a branch, tag or commit.
    #[arg(long, requires = "repo")]
    git_ref: Option<String>,
    /// Model alias (default: `agent`, else the first configured).
    #[arg(long, short)]
    model: Option<String>,
    /// Priority class: interactive (default) or batch.
    #[arg(long, default_value = "interactive", value_parser = parse_class)]
    class: RunClass,
    /// A command to prepare the environment (repeatable; after the repository's own steps).
    #[arg(long)]
    setup: Vec<String>,
    /// A command run after the agent whose output is kept (the tests).
    #[arg(long)]
    test: Option<String>,
    /// A stored secret to put in the environment (repeatable; see `caret secret`).
    #[arg(long)]
    secret: Vec<String>,
    /// An environment variable, NAME=VALUE (repeatable).
    #[arg(long, value_parser = parse_var)]
    env: Vec<(String, String)>,
    /// Let commands use the network.
    #[arg(long)]
    network: bool,
    /// Without --network, a host commands may still reach (repeatable): example.com,
    /// *.example.com, an address; 80/443 unless a :port is given.
    #[arg(long = "allow-host")]
    allow_host: Vec<String>,
    /// An MCP server of the config (`[mcp_servers.NAME]`) whose tools the run's agent gets
    /// (repeatable): a stdio one runs in the sandbox; a remote one's host is allowed, and its
    /// `bearer_token_env` must name one of the run's --secret.
    #[arg(long = "mcp", value_name = "NAME")]
    mcp: Vec<String>,
    /// Wall time of an attempt (e.g. 30m).
    #[arg(long, default_value = "30m")]
    wall_time: String,
    /// Model calls the agent may make.
    #[arg(long, default_value_t = RunLimits::default().steps)]
    steps: u32,
    /// Model tokens the run may use.
    #[arg(long, default_value_t = RunLimits::default().model_tokens)]
    model_tokens: u64,
    /// Disk the run's directory may take (checkout and what its commands write): 10G, 500M.
    #[arg(long, default_value = "10G")]
    disk: String,
    /// Follow the run's events until it ends (exit code 0 only if it succeeded).
    #[arg(long)]
    wait: bool,
    /// When the run succeeds, push its changes as a branch (to --push-url, else the
    /// repository's URL or the checkout's `origin`).
    #[arg(long)]
    push: bool,
    /// Where to push (implies --push).
    #[arg(long)]
    push_url: Option<String>,
    /// The branch to push (default caret/RUN-ID; implies --push).
    #[arg(long)]
    branch: Option<String>,
    /// A stored secret holding an https token for the repository's host (clone and push).
    #[arg(long)]
    git_credential: Option<String>,
    #[command(flatten)]
    target: Target,
}

fn parse_class(s: &str) -> Result<RunClass, String> {
    RunClass::parse(s).ok_or_else(|| format!("{s:?}: interactive or batch"))
}

fn parse_var(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| format!("{s:?} is not NAME=VALUE"))
}

#[derive(Debug, clap::Subcommand)]
pub enum RunsCommand {
    /// List runs, newest first.
    Ls {
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[command(flatten)]
        target: Target,
    },
    /// A run's state, and its result when it has one.
    Show {
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// A run's events (`-f`: follow until it ends).
    Logs {
        id: String,
        #[arg(long, short)]
        follow: bool,
        #[command(flatten)]
        target: Target,
    },
    /// A run's changes as a patch.
    Diff {
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// Applies a run's changes to the local checkout (`git apply --3way`).
    Apply {
        id: String,
        /// The checkout.
        #[arg(long, short = 'C', default_value = ".")]
        path: PathBuf,
        /// Also when a file the patch changes has uncommitted changes.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Stops a run.
    Cancel {
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// Shares one of your runs with your organisation on a team server (`--off`: no longer).
    Share {
        id: String,
        /// Stop sharing it.
        #[arg(long)]
        off: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Deletes an ended run now (events, result).
    Rm {
        id: String,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum SecretCommand {
    /// Stores a secret for runs; the value is read from standard input.
    Set {
        name: String,
        #[command(flatten)]
        target: Target,
    },
    /// Lists secret names.
    Ls {
        #[command(flatten)]
        target: Target,
    },
    /// Deletes a secret.
    Rm {
        name: String,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// The server whose runs to execute (default: the embedded queue).
    #[arg(long, env = "CARET_SERVER")]
    server: Option<String>,
    /// An operator token of that server (`caret admin operator-token create`).
    #[arg(long, env = "CARET_WORKER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Runs at once.
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// Sandbox backend: bwrap (bubblewrap + Landlock + seccomp + cgroups), gvisor (runsc,
    /// needs root) or firecracker (a microVM per run; needs KVM, --vm-kernel, --vm-rootfs).
    #[arg(long, default_value = "bwrap")]
    sandbox: String,
    /// Firecracker: the guest kernel (uncompressed vmlinux with virtio-blk, vsock, ext4 and
    /// overlayfs built in).
    #[arg(long)]
    vm_kernel: Option<PathBuf>,
    /// Firecracker: the base system, an ext4 image with what commands need (shared read-only).
    #[arg(long)]
    vm_rootfs: Option<PathBuf>,
    /// Firecracker: its binary (default /usr/local/bin/firecracker or /usr/bin/firecracker).
    #[arg(long)]
    firecracker: Option<PathBuf>,
    /// Firecracker: the guest agent (default: caret-guest beside this program).
    #[arg(long)]
    vm_guest: Option<PathBuf>,
    /// Stop after the queue has been empty this long (e.g. 30s); default: run until SIGTERM.
    #[arg(long)]
    exit_when_idle: Option<String>,
    /// Where runs' directories are made (default $CARET_HOME/runs/work).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Prepared environments kept for warm starts (least recently used dropped); 0: every
    /// run installs its environment.
    #[arg(long, default_value_t = 8)]
    snapshots: usize,
}

pub fn run(config: &Config, args: RunArgs) -> anyhow::Result<ExitCode> {
    let wall = caret_host::config::parse_duration(&args.wall_time).context("--wall-time")?;
    let repo = match &args.repo {
        Some(url) => RepoSource::Git { url: url.clone(), git_ref: args.git_ref.clone() },
        None => bundle_checkout(&args.path)?,
    };
    let mut hosts = args.allow_host.clone();
    let mut mcp_servers = std::collections::BTreeMap::new();
    for name in &args.mcp {
        let section = config.mcp_servers.get(name).with_context(|| format!("--mcp {name}: no [mcp_servers.{name}]"))?;
        let server = caret_host::mcp::run_server(name, section)?;
        if let Some(host) = server.url.as_deref().and_then(caret_host::mcp::url_host) {
            hosts.extend((!hosts.contains(&host)).then_some(host));
        }
        mcp_servers.insert(name.clone(), server);
    }
    let req = CreateRun {
        repo,
        task: args.task.clone(),
        model: args.model.clone(),
        limits: RunLimits {
            wall_time_s: wall.as_secs().max(1),
            model_tokens: args.model_tokens,
            steps: args.steps,
            disk_bytes: caret_host::config::parse_size(&args.disk).context("--disk")?,
        },
        environment: RunEnvironment {
            setup: args.setup.clone(),
            env: args.env.iter().cloned().collect(),
            secrets: args.secret.clone(),
            test: args.test.clone(),
            network: args.network,
            hosts,
            test_timeout_s: None,
            mcp_servers,
        },
        class: args.class,
        push: None,
        git_credential: args.git_credential.clone(),
        rollout: None,
    };
    let mut req = req;
    if args.push || args.push_url.is_some() || args.branch.is_some() {
        let url = match (&args.push_url, &args.repo) {
            (Some(url), _) => Some(url.clone()),
            (None, Some(_)) => None,
            (None, None) => Some(
                origin_url(&args.path)
                    .context("--push: the checkout has no `origin` remote; say where with --push-url")?,
            ),
        };
        req.push = Some(PushTarget { url, branch: args.branch.clone() });
    }
    runtime()?.block_on(async {
        let runs = Runs::open(config, &args.target.remote()).await?;
        let info = runs.submit(req).await?;
        if args.target.json && !args.wait {
            println!("{}", serde_json::to_string(&info)?);
        } else if !args.wait {
            println!("{}", info.id);
            eprintln!("queued; follow it with: caret runs logs -f {}", info.id);
        } else {
            eprintln!("run {} queued", info.id);
        }
        if !args.wait {
            return Ok(ExitCode::SUCCESS);
        }
        let end = follow(&runs, &info.id, 0, args.target.json).await?;
        Ok(if end.state == caret_protocol::runs::RunState::Succeeded { ExitCode::SUCCESS } else { ExitCode::FAILURE })
    })
}

/// Prints events after `after` until the run ends (reconnecting as needed); the run at its end.
async fn follow(runs: &Runs, id: &str, mut after: u64, json: bool) -> anyhow::Result<RunInfo> {
    let mut failures = 0;
    loop {
        // The state first: once it is final, the events read next are all there are.
        let info = match runs.get(id).await {
            Ok(i) => i,
            Err(e) if failures < 30 => {
                failures += 1;
                eprintln!("caret: {e:#}; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let events = runs.events(id, after).await.unwrap_or_default();
        failures = 0;
        for e in &events {
            print_event(e, json);
            after = e.seq;
        }
        if info.state.is_final() && events.is_empty() {
            if !json {
                let why = info.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
                eprintln!("run {} {}{why}", info.id, info.state.as_str());
            }
            return Ok(info);
        }
        if events.is_empty() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

fn print_event(e: &NumberedEvent, json: bool) {
    let mut out = std::io::stdout().lock();
    if json {
        let _ = writeln!(out, "{}", serde_json::to_string(e).unwrap_or_default());
        return;
    }
    let line = match &e.event {
        RunEvent::Run(RunStatus::RunStarted { attempt, worker }) => format!("── attempt {attempt} on {worker}"),
        RunEvent::Run(RunStatus::SetupStep { command, exit_code, duration_ms, .. }) => {
            format!("$ {command}  → {}  ({duration_ms} ms)", exit_code.map_or("killed".into(), |c| c.to_string()))
        }
        RunEvent::Run(RunStatus::Snapshot { saved: false, method, duration_ms }) => {
            format!("── environment ready from its snapshot ({method}, {duration_ms} ms)")
        }
        RunEvent::Run(RunStatus::Snapshot { saved: true, duration_ms, .. }) => {
            format!("── environment snapshot saved ({duration_ms} ms)")
        }
        RunEvent::Run(RunStatus::Resumed { files, conversation }) => {
            let talk = if *conversation { " and the conversation" } else { "" };
            format!("── continuing from the last checkpoint ({files} changed files{talk})")
        }
        RunEvent::Run(RunStatus::AttemptLost { attempt, reason }) => format!("── attempt {attempt} lost: {reason}"),
        RunEvent::Run(RunStatus::McpServer { name, status, .. }) => format!("── MCP server {name}: {status}"),
        RunEvent::Run(RunStatus::DocsProgress { counts: c }) => {
            format!("── {} found, {} fetched, {} written, {} unchanged", c.found, c.fetched, c.written, c.unchanged)
        }
        RunEvent::Run(RunStatus::RunFinished { state, reason }) => {
            format!("── {}{}", state.as_str(), reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())
        }
        RunEvent::Agent(Event::TextDelta { text }) => {
            let _ = write!(out, "{text}");
            let _ = out.flush();
            return;
        }
        RunEvent::Agent(Event::ToolCallBegin { name, arguments, .. }) => {
            let args = arguments.to_string();
            let args: String = args.chars().take(120).collect();
            format!("\n▸ {name} {args}")
        }
        RunEvent::Agent(Event::ToolCallEnd { name, ok, output, .. }) => {
            let first = output.lines().next().unwrap_or("");
            format!("  {} {name}: {}", if *ok { "✓" } else { "✗" }, first.chars().take(120).collect::<String>())
        }
        RunEvent::Agent(Event::FileChange { path, .. }) => format!("  edited {path}"),
        RunEvent::Agent(Event::Error { message }) => format!("  error: {message}"),
        RunEvent::Agent(Event::TurnEnd { reason, .. }) => format!("\n── agent: {reason:?}"),
        RunEvent::Agent(_) => return,
    };
    let _ = writeln!(out, "{line}");
}

pub fn runs(config: &Config, cmd: RunsCommand) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        match cmd {
            RunsCommand::Ls { limit, target } => {
                let runs = Runs::open(config, &target.remote()).await?;
                let list = runs.list(limit).await?;
                if target.json {
                    println!("{}", serde_json::to_string(&RunList { runs: list })?);
                } else {
                    for r in list {
                        let task: String = r.task.lines().next().unwrap_or("").chars().take(60).collect();
                        println!("{}  {:<9}  {:<11}  {task}", r.id, r.state.as_str(), r.class.as_str());
                    }
                }
            }
            RunsCommand::Show { id, target } => {
                let runs = Runs::open(config, &target.remote()).await?;
                let info = runs.get(&id).await?;
                let result = if info.state.is_final() { runs.result(&id).await.ok() } else { None };
                if target.json {
                    println!("{}", serde_json::json!({"run": info, "result": result}));
                } else {
                    println!(
                        "{}  {} ({} attempt {} of {})",
                        info.id,
                        info.state.as_str(),
                        info.class.as_str(),
                        info.attempt,
                        info.max_attempts
                    );
                    println!("task: {}", info.task);
                    if let Some(r) = &info.reason {
                        println!("reason: {r}");
                    }
                    println!("model: {}  tokens used: {}", info.model, info.tokens_used);
                    if let Some(res) = result {
                        println!(
                            "files changed: {}",
                            if res.files.is_empty() { "none".into() } else { res.files.join(", ") }
                        );
                        if let Some(t) = &res.test {
                            println!("tests ({}): exit {:?}", t.command, t.exit_code);
                        }
                        println!(
                            "timings: launch {} ms, first model call {} ms, agent {} ms, total {} ms",
                            res.timings.launch_ms,
                            res.timings.first_model_call_ms,
                            res.timings.agent_ms,
                            res.timings.total_ms
                        );
                        if !res.final_message.is_empty() {
                            println!("\n{}", res.final_message);
                        }
                    }
                }
            }
            RunsCommand::Logs { id, follow: f, target } => {
                let runs = Runs::open(config, &target.remote()).await?;
                if f {
                    follow(&runs, &id, 0, target.json).await?;
                } else {
                    let mut after = 0;
                    loop {
                        let events = runs.events(&id, after).await?;
                        if events.is_empty() {
                            break;
                        }
                        for e in &events {
                            print_event(e, target.json);
                            after = e.seq;
                        }
                    }
                }
            }
            RunsCommand::Diff { id, target } => {
                let runs = Runs::open(config, &target.remote()).await?;
                let result = runs.result(&id).await?;
                if target.json {
                    println!("{}", serde_json::json!({"patch": result.patch, "files": result.files}));
                } else {
                    print!("{}", result.patch);
                }
            }
            RunsCommand::Apply { id, path, force, target } => {
                let runs = Runs::open(config, &target.remote()).await?;
                let result = runs.result(&id).await?;
                apply_patch(&path, &result, force)?;
                if target.json {
                    println!("{}", serde_json::json!({"applied": result.files}));
                } else {
                    println!("applied {} file(s): {}", result.files.len(), result.files.join(", "));
                }
            }
            RunsCommand::Cancel { id, target } => {
                let runs = Runs::open(config, &target.remote()).await?;
                let info = runs.cancel(&id).await?;
                if target.json {
                    println!("{}", serde_json::to_string(&info)?);
                } else if info.state.is_final() {
                    println!("{} {}", info.id, info.state.as_str());
                } else {
                    println!("{}: cancel asked; the worker stops it within seconds", info.id);
                }
            }
            RunsCommand::Share { id, off, target } => {
                let runs = Runs::open(config, &target.remote()).await?;
                let info = runs.share(&id, !off).await?;
                if target.json {
                    println!("{}", serde_json::to_string(&info)?);
                } else {
                    println!("{} {}", info.id, if off { "is yours alone" } else { "is shared with your organisation" });
                }
            }
            RunsCommand::Rm { id, target } => {
                let runs = Runs::open(config, &target.remote()).await?;
                runs.delete(&id).await?;
                if !target.json {
                    println!("deleted {id}");
                }
            }
        }
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

pub fn secret(config: &Config, cmd: SecretCommand) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        match cmd {
            SecretCommand::Set { name, target } => {
                let mut value = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut value).context("reading the value")?;
                let value = value.trim_end_matches(['\n', '\r']).to_owned();
                Runs::open(config, &target.remote()).await?.put_secret(&name, value).await?;
                eprintln!("stored secret {name} (encrypted; runs name it with --secret {name})");
            }
            SecretCommand::Ls { target } => {
                for n in Runs::open(config, &target.remote()).await?.secrets().await? {
                    println!("{n}");
                }
            }
            SecretCommand::Rm { name, target } => {
                Runs::open(config, &target.remote()).await?.delete_secret(&name).await?;
            }
        }
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

pub fn worker(config: &Config, args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let sandbox = match args.sandbox.as_str() {
        "firecracker" => {
            let (Some(kernel), Some(rootfs)) = (args.vm_kernel.clone(), args.vm_rootfs.clone()) else {
                bail!("--sandbox firecracker needs --vm-kernel and --vm-rootfs");
            };
            let mut vm = caret_sandbox::firecracker::Config::new(kernel, rootfs);
            if let Some(p) = &args.firecracker {
                vm.firecracker = p.clone();
            }
            if let Some(p) = &args.vm_guest {
                vm.guest = p.clone();
            }
            vm.check()?;
            caret_anyrun::worker::SandboxKind::Firecracker(Arc::new(vm))
        }
        name => match caret_anyrun::worker::SandboxKind::parse(name) {
            Some(kind) => kind,
            None => bail!(
                "unknown sandbox {name:?}: bwrap (bubblewrap + Landlock + seccomp + cgroups), gvisor (runsc) or \
                 firecracker (a microVM per run)"
            ),
        },
    };
    // The backend must work here before any run is taken.
    let probe = args.work_dir.clone().unwrap_or_else(|| config.home.join("runs").join("work")).join(".sandbox-probe");
    std::fs::create_dir_all(&probe).with_context(|| format!("creating {}", probe.display()))?;
    // (A microVM is not booted for this: its configuration was checked above.)
    let works = match &sandbox {
        caret_anyrun::worker::SandboxKind::Firecracker(_) => Ok(()),
        kind => caret_sandbox::Policy::new(&probe).and_then(|policy| kind.open(policy)).map(drop),
    };
    let _ = std::fs::remove_dir_all(&probe);
    works?;
    let idle = args
        .exit_when_idle
        .as_deref()
        .map(caret_host::config::parse_duration)
        .transpose()
        .context("--exit-when-idle")?;
    runtime()?.block_on(async {
        let (drain_tx, drain) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            caret_host::runtime::shutdown_signal().await;
            eprintln!("caret worker: draining (running attempts finish or are handed back)");
            let _ = drain_tx.send(true);
        });
        let summary = match &args.server {
            Some(server) => {
                let token = args.token.clone().context("--server needs --token (an operator token)")?;
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(120))
                    .build()
                    .context("building the HTTP client")?;
                let w = with_snapshots(worker_config(config, args.slots, idle, args.work_dir.clone()), args.snapshots);
                let mut w = caret_host::runs::for_team(w, config)?;
                w.sandbox = sandbox.clone();
                let coord = Arc::new(caret_anyrun::remote::Remote::new(server, &token, client));
                eprintln!("caret worker: {} slot(s) taking runs from {server}", args.slots);
                Worker::new(coord, w).run(drain).await?
            }
            None => {
                let service = caret_index::open(&config.storage()).await.context("opening the embedded queue")?;
                let gateway = config.gateway()?;
                let runs = Arc::new(open_service(config, &service, gateway, caret_host::runs::Reach::Local).await?);
                let _upkeep = spawn_upkeep(runs.clone());
                let pid_file = config.home.join("runs").join("worker.pid");
                if let Some(dir) = pid_file.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                std::fs::write(&pid_file, std::process::id().to_string())?;
                let mut w =
                    with_snapshots(worker_config(config, args.slots, idle, args.work_dir.clone()), args.snapshots);
                w.sandbox = sandbox;
                let summary = Worker::new(Arc::new(InProcess(runs)), w).run(drain).await;
                if std::fs::read_to_string(&pid_file).is_ok_and(|p| p.trim() == std::process::id().to_string()) {
                    let _ = std::fs::remove_file(&pid_file);
                }
                summary?
            }
        };
        eprintln!("caret worker: stopped ({} run(s) ended, {} handed back)", summary.completed, summary.abandoned);
        anyhow::Ok(ExitCode::SUCCESS)
    })
}
