//! `caret agent`: the agent in an interactive terminal UI (its state and drawing:
//! `caret_tui`), `caret rules` and `caret mcp`. The session is saved as it goes; `caret agent
//! --resume ID` continues it, with the conversation shown again.

use std::process::ExitCode;

use caret_protocol::agent::{Event, Op};
use caret_tui::{Action, App, TerminalGuard};
use futures::StreamExt as _;
use tokio::sync::mpsc;

use caret_host::config::Config;
use caret_host::session::open_session;

use crate::exec::SessionArgs;
use caret_host::runtime::runtime;

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// A first message to start with.
    task: Option<String>,
    #[command(flatten)]
    session: SessionArgs,
    /// Try the task N times at once, each attempt in a git worktree of its own (`--model a,b`
    /// spreads them over models); their diffs are shown, one is applied, the worktrees removed.
    #[arg(long, value_name = "N")]
    parallel: Option<usize>,
    /// With --parallel: the attempt to apply (else asked; 0: none).
    #[arg(long, value_name = "K", requires = "parallel")]
    apply: Option<usize>,
}

pub fn run(config: &Config, args: AgentArgs) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal as _;
    if let Some(n) = args.parallel {
        return parallel(config, &args, n);
    }
    anyhow::ensure!(
        std::io::stdin().is_terminal() && std::io::stdout().is_terminal(),
        "caret agent needs a terminal; for scripts use `caret exec \"task\"` (JSON-lines events)"
    );
    let options = args.session.options();
    // The project's MCP servers not trusted yet: asked here, once, before the screen is taken.
    if let Ok(root) = std::fs::canonicalize(&options.path) {
        let (_, untrusted) = caret_host::mcp::session_servers(&config.mcp_servers, &config.home, &root)?;
        caret_host::mcp::ask_trust(
            &config.home,
            &root,
            &untrusted,
            &mut std::io::stdin().lock(),
            &mut std::io::stderr(),
        )?;
    }
    // No model anywhere: offered here, before the screen is taken.
    let mut config = config.clone();
    if config.models.is_empty() && options.server.is_none() && config.sync.server.is_none() {
        let mut out = std::io::stderr();
        if crate::models::offer_default(&config, &mut std::io::stdin().lock(), &mut out)? {
            config.use_installed_code_model();
        }
    }
    let config = &config;
    let (mut session, id, model, root) = open_session(config, &options)?;
    let mut app = App::new(&id, &model, &root.display().to_string());
    app.replay(session.messages());
    app.docs(caret_host::docs::source_names(config));
    app.commands(session.commands.iter().map(|c| c.name.clone()).collect());
    runtime()?.block_on(async move {
        let (ops_tx, mut ops) = mpsc::unbounded_channel::<Op>();
        let (events_tx, mut events) = mpsc::unbounded_channel::<Event>();
        let agent = tokio::spawn(async move {
            session.serve(&mut ops, &events_tx).await;
        });
        if let Some(task) = args.task {
            app.sent(&task);
            let _ = ops_tx.send(Op::UserInput { text: task });
        }
        crossterm::terminal::enable_raw_mode()?;
        let guard = TerminalGuard;
        crossterm::execute!(std::io::stdout(), crossterm::terminal::EnterAlternateScreen)?;
        let mut terminal = ratatui::Terminal::new(ratatui::backend::CrosstermBackend::new(std::io::stdout()))?;
        let mut keys = crossterm::event::EventStream::new();
        loop {
            terminal.draw(|f| app.draw(f))?;
            tokio::select! {
                key = keys.next() => match key {
                    Some(Ok(crossterm::event::Event::Key(k))) => match app.on_key(k) {
                        Action::Op(op) => { let _ = ops_tx.send(op); }
                        Action::Quit => break,
                        Action::None => {}
                    },
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e.into()),
                    None => break,
                },
                event = events.recv() => match event {
                    Some(e) => app.on_event(e),
                    None => break,
                },
            }
        }
        let _ = ops_tx.send(Op::Shutdown);
        drop(guard);
        // A turn still running is cut short; what it did so far is in the session file.
        agent.abort();
        eprintln!("session {id} saved; continue it with `caret agent --resume {id}`");
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

#[derive(Debug, clap::Args)]
pub struct RulesArgs {
    /// A file (or directory) the session would work on, workspace-relative or absolute.
    path: Option<std::path::PathBuf>,
    /// The workspace (default: the current directory).
    #[arg(short = 'C', long, default_value = ".")]
    workspace: std::path::PathBuf,
}

/// `caret rules [PATH]`: what an agent session here would apply, and why.
pub fn rules(config: &Config, args: RulesArgs) -> anyhow::Result<std::process::ExitCode> {
    use anyhow::Context as _;
    let root = std::fs::canonicalize(&args.workspace)
        .with_context(|| format!("opening the workspace {}", args.workspace.display()))?;
    let cwd = std::env::current_dir().ok().and_then(|d| std::fs::canonicalize(d).ok()).unwrap_or(root.clone());
    let rules = config.agent.project_rules(&root, &cwd, Some(&config.home));
    let rel = args.path.as_ref().map(|p| {
        let abs = if p.is_absolute() { p.clone() } else { cwd.join(p) };
        let abs = std::fs::canonicalize(&abs).unwrap_or(abs);
        abs.strip_prefix(&root).map(|r| r.to_string_lossy().into_owned()).unwrap_or_else(|_| p.display().to_string())
    });
    let explained = rules.explain(rel.as_deref());
    if explained.is_empty() && rules.dropped.is_empty() {
        println!("no rules files apply in {}", root.display());
    }
    for (rule, why) in explained {
        println!("{}  ({why}, {} bytes)", rule.name, rule.text.len());
    }
    for (name, bytes) in &rules.dropped {
        println!(
            "{name}  (left out: {bytes} bytes would pass the {} byte cap, [agent] rules_max_bytes)",
            config.agent.rules_max_bytes.0
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}

#[derive(Debug, clap::Subcommand)]
pub enum McpCommand {
    /// The MCP servers a session here would start (the config's and the project's trusted
    /// ones), started now: whether each answers, and its tools; and the project's untrusted
    /// ones.
    Ls {
        /// The project (default: the current directory).
        #[arg(short = 'C', long, default_value = ".")]
        workspace: std::path::PathBuf,
    },
    /// Serve this workspace to other agents over MCP (stdio): `codebase_search` (the synced
    /// index; hits with their code read from disk) and `grep`.
    Serve {
        /// The workspace (default: the current directory).
        #[arg(short = 'C', long, default_value = ".")]
        workspace: std::path::PathBuf,
        /// Search this server's index instead of the embedded one (env CARET_SERVER).
        #[arg(long, env = "CARET_SERVER")]
        server: Option<String>,
        /// API token for --server (env CARET_TOKEN).
        #[arg(long, env = "CARET_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Add an MCP server to the config: one run over stdio (`caret mcp add time -- python3 -m
    /// mcp_server_time`) or a remote one (`caret mcp add tracker --url https://…/mcp
    /// --bearer-token-env TRACKER_TOKEN`); the rest of the file stays as it is.
    Add {
        /// Its name: the `NAME` of its tools' `mcp__NAME__TOOL`.
        name: String,
        /// Environment for it (`KEY=VALUE`, repeatable).
        #[arg(long = "env", value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// A remote server's URL (Streamable HTTP) instead of a command.
        #[arg(long)]
        url: Option<String>,
        /// The environment variable holding the remote server's bearer token.
        #[arg(long, value_name = "VAR")]
        bearer_token_env: Option<String>,
        /// A header sent to the remote server (`NAME: VALUE`, repeatable).
        #[arg(long, value_name = "NAME: VALUE")]
        header: Vec<String>,
        /// The program and its arguments, after `--`.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Remove a server from the config.
    Rm {
        /// Its name.
        name: String,
    },
    /// Authorize Caret with a remote server that asks for OAuth: prints the page to open (in
    /// any browser; it comes back to 127.0.0.1) and keeps the tokens, encrypted, in
    /// $CARET_HOME.
    Login {
        /// The server's name (the config's, or the project's).
        name: String,
        /// The project (default: the current directory).
        #[arg(short = 'C', long, default_value = ".")]
        workspace: std::path::PathBuf,
        /// Also open the page in the desktop's browser (xdg-open).
        #[arg(long)]
        open: bool,
    },
    /// Call one tool of a server as the agent would, and print what the model would read.
    Call {
        /// The server's name.
        server: String,
        /// The tool's name (the server's own, not `mcp__…`).
        tool: String,
        /// Its arguments, a JSON object.
        #[arg(default_value = "{}")]
        arguments: String,
        /// The project (default: the current directory).
        #[arg(short = 'C', long, default_value = ".")]
        workspace: std::path::PathBuf,
    },
    /// Forget a remote server's OAuth tokens.
    Logout {
        /// The server's name.
        name: String,
    },
    /// Trust a server the project declares (`.caret/mcp.json`, `.cursor/mcp.json`): sessions
    /// in this project start it from now on, as long as its command line stays the same.
    Trust {
        /// The server's name.
        name: String,
        /// The project (default: the current directory).
        #[arg(short = 'C', long, default_value = ".")]
        workspace: std::path::PathBuf,
    },
}

/// `caret mcp …`.
pub fn mcp(config: &Config, cmd: McpCommand) -> anyhow::Result<ExitCode> {
    use anyhow::Context as _;
    let canonical =
        |w: &std::path::Path| std::fs::canonicalize(w).with_context(|| format!("opening the project {}", w.display()));
    let config_file = config.file.clone().unwrap_or_else(|| config.home.join("config.toml"));
    match cmd {
        McpCommand::Add { name, env, url, bearer_token_env, header, command } => {
            let pairs = |list: &[String], flag: &str, sep: char| -> anyhow::Result<Vec<(String, String)>> {
                list.iter()
                    .map(|kv| {
                        kv.split_once(sep)
                            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                            .with_context(|| format!("{flag} takes KEY{sep}VALUE, not {kv:?}"))
                    })
                    .collect()
            };
            let env = pairs(&env, "--env", '=')?;
            let headers = pairs(&header, "--header", ':')?;
            let server = match &url {
                Some(url) => {
                    anyhow::ensure!(
                        command.is_empty() && env.is_empty(),
                        "a remote server (--url) takes no command or --env"
                    );
                    caret_host::mcp::NewServer::Http {
                        url,
                        bearer_token_env: bearer_token_env.as_deref(),
                        headers: &headers,
                    }
                }
                None => {
                    anyhow::ensure!(
                        bearer_token_env.is_none() && headers.is_empty(),
                        "--bearer-token-env and --header are for remote servers (--url)"
                    );
                    caret_host::mcp::NewServer::Stdio { command_line: &command, env: &env }
                }
            };
            caret_host::mcp::add_to_config(&config_file, &name, server)?;
            println!(
                "added [mcp_servers.{name}] to {}: `caret mcp ls` starts it and lists its tools",
                config_file.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        McpCommand::Rm { name } => {
            let had = caret_host::mcp::remove_from_config(&config_file, &name)
                .with_context(|| format!("editing {}", config_file.display()))?;
            anyhow::ensure!(had, "{} has no [mcp_servers.{name}]", config_file.display());
            println!("removed [mcp_servers.{name}] from {}", config_file.display());
            Ok(ExitCode::SUCCESS)
        }
        McpCommand::Login { name, workspace, open } => {
            let root = canonical(&workspace)?;
            let url = caret_host::mcp::remote_url(&config.mcp_servers, &root, &name)?;
            let store = std::sync::Arc::new(caret_host::mcp_tokens::TokenStore::new(&config.home, &name, &url));
            caret_host::runtime::runtime()?.block_on(async {
                let login = caret_mcp::oauth::Login::begin(&url, store).await.map_err(anyhow::Error::msg)?;
                println!("Open this page to authorize Caret with {name} ({url}):\n{}", login.page());
                use std::io::Write as _;
                std::io::stdout().flush()?;
                if open {
                    let _ = std::process::Command::new("xdg-open")
                        .arg(login.page())
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .spawn();
                }
                login.finish(std::time::Duration::from_secs(600)).await.map_err(anyhow::Error::msg)?;
                println!("logged in to {name}: its tokens are kept encrypted under {}", config.home.display());
                anyhow::Ok(())
            })?;
            Ok(ExitCode::SUCCESS)
        }
        McpCommand::Call { server, tool, arguments, workspace } => {
            let root = canonical(&workspace)?;
            let args: serde_json::Value =
                serde_json::from_str(&arguments).context("the arguments are a JSON object")?;
            let (servers, _) = caret_host::mcp::session_servers(&config.mcp_servers, &config.home, &root)?;
            let chosen: Vec<_> = servers.into_iter().filter(|s| s.name == server).collect();
            anyhow::ensure!(!chosen.is_empty(), "no MCP server {server} (or the project's, not trusted)");
            caret_host::runtime::runtime()?.block_on(async {
                let hub = caret_mcp::Hub::new(chosen);
                hub.settled(std::time::Duration::from_secs(30)).await;
                if let Some((_, caret_mcp::Status::Down(why))) = hub.status().first() {
                    anyhow::bail!("{server} is not running: {why}");
                }
                let name = caret_mcp::tool_name(&server, &tool, &mut Default::default());
                let found = hub.tools().into_iter().find(|t| t.spec().name == name);
                let found = found.with_context(|| format!("{server} has no tool {tool}"))?;
                let ctx = caret_agent::tools::Ctx::new(&root)?;
                match found.call(args, &ctx).await {
                    Ok(text) => {
                        println!("{text}");
                        Ok(ExitCode::SUCCESS)
                    }
                    Err(e) => {
                        eprintln!("{e}");
                        Ok(ExitCode::FAILURE)
                    }
                }
            })
        }
        McpCommand::Logout { name } => {
            let had = caret_host::mcp_tokens::TokenStore::remove(&config.home, &name)
                .with_context(|| format!("forgetting {name}'s tokens"))?;
            anyhow::ensure!(had, "no tokens kept for {name}");
            println!("logged out of {name}");
            Ok(ExitCode::SUCCESS)
        }
        McpCommand::Serve { workspace, server, token } => {
            let root = canonical(&workspace)?;
            let remote = caret_host::remote::Remote { server, token };
            let server = caret_host::mcp_server::CaretServer::new(config.clone(), root, remote)?;
            caret_host::runtime::runtime()?.block_on(server.serve_stdio())?;
            Ok(ExitCode::SUCCESS)
        }
        McpCommand::Trust { name, workspace } => {
            let root = canonical(&workspace)?;
            let declared = caret_host::mcp::project_servers(&root);
            let server = declared.iter().find(|p| p.name == name).with_context(|| {
                let names: Vec<&str> = declared.iter().map(|p| p.name.as_str()).collect();
                format!("{} declares no MCP server {name:?} (it declares {names:?})", root.display())
            })?;
            caret_host::mcp::trust(&config.home, &root, server)?;
            println!("trusted {name} of {} ({}): {}", root.display(), server.file, server.command_line.join(" "));
            Ok(ExitCode::SUCCESS)
        }
        McpCommand::Ls { workspace } => {
            let root = canonical(&workspace)?;
            let (servers, untrusted) = caret_host::mcp::session_servers(&config.mcp_servers, &config.home, &root)?;
            if servers.is_empty() && untrusted.is_empty() {
                println!("no MCP servers: add [mcp_servers.NAME] with `command` and `args` to the config");
                return Ok(ExitCode::SUCCESS);
            }
            caret_host::runtime::runtime()?.block_on(async {
                let hub = caret_mcp::Hub::new(servers);
                hub.settled(std::time::Duration::from_secs(30)).await;
                let tools = hub.tools();
                let mut taken = std::collections::HashSet::new();
                for (name, status) in hub.status() {
                    match status {
                        caret_mcp::Status::Starting => println!("{name}  still starting after 30 s"),
                        caret_mcp::Status::Down(why) => println!("{name}  not running: {why}"),
                        ready => println!("{name}  {ready}"),
                    }
                    let prefix = caret_mcp::tool_name(&name, "", &mut taken);
                    for t in tools.iter().filter(|t| t.spec().name.starts_with(&prefix)) {
                        let what = t.spec().description.lines().next().unwrap_or("");
                        println!("  {}  {what}", t.spec().name);
                    }
                }
            });
            for p in untrusted {
                println!(
                    "{}  not started: declared by the project ({}) and not trusted — `caret mcp trust {}` uses: {}",
                    p.name,
                    p.file,
                    p.name,
                    p.command_line.join(" ")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `caret agent --parallel N "task"`: N attempts in worktrees, their diffs, one applied.
fn parallel(config: &Config, args: &AgentArgs, n: usize) -> anyhow::Result<ExitCode> {
    use anyhow::Context as _;
    use caret_host::worktrees;
    use std::io::IsTerminal as _;
    anyhow::ensure!((1..=8).contains(&n), "--parallel takes 1 to 8 attempts, not {n}");
    let task = args.task.clone().context("--parallel needs the task: caret agent --parallel 3 \"task\"")?;
    let options = args.session.options();
    let root = std::fs::canonicalize(&options.path).with_context(|| format!("opening {}", options.path.display()))?;
    let models: Vec<String> = options
        .model
        .iter()
        .flat_map(|m| m.split(','))
        .map(|m| m.trim().to_owned())
        .filter(|m| !m.is_empty())
        .collect();
    eprintln!("caret agent: {n} attempts in worktrees of {} …", root.display());
    let rt = runtime()?;
    let trees = rt.block_on(worktrees::create(config, &root, n, options.network))?;
    let attempts = rt.block_on(worktrees::run_all(config, &trees, &task, &models, options.approval, options.max_steps));
    for a in &attempts {
        let files: Vec<String> = a.files.iter().map(|(f, add, del)| format!("{f} +{add} -{del}")).collect();
        println!(
            "attempt {} ({}): {} — {}",
            a.number,
            a.model,
            a.ended,
            if files.is_empty() { "no changes".into() } else { files.join(", ") }
        );
    }
    for a in attempts.iter().filter(|a| !a.diff.is_empty()) {
        println!("\n=== attempt {} ({}) ===\n{}", a.number, a.model, a.diff.trim_end());
    }
    let chosen = match args.apply {
        Some(k) => k,
        None if std::io::stdin().is_terminal() => {
            eprint!("apply which attempt (1-{n}, 0 for none)? ");
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)?;
            line.trim().parse().unwrap_or(0)
        }
        None => 0,
    };
    let outcome = match attempts.iter().find(|a| a.number == chosen) {
        Some(a) => worktrees::apply(&root, a).map(|()| format!("applied attempt {} to {}", a.number, root.display())),
        None if chosen == 0 => Ok("nothing applied".to_owned()),
        None => Err(anyhow::anyhow!("there is no attempt {chosen}")),
    };
    worktrees::remove(&root, &trees);
    println!("\n{}", outcome?);
    Ok(ExitCode::SUCCESS)
}
