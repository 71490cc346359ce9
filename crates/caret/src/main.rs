//! `caret`: the command-line entry point. Thin glue: it parses arguments, loads the
//! configuration, sets up tracing and calls the library crates.

mod agent;
mod apply;
mod chat;
mod complete;
mod conventions;
mod daemon;
mod docs;
mod exec;
mod index;
mod models;
mod runs;
mod scan;
mod server;
mod sync;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use caret_host::config::Config;

// Scans allocate many small paths; mimalloc cuts the warm scan's user time markedly.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Caret: a self-hostable AI coding platform.
#[derive(Debug, Parser)]
#[command(name = "caret", version, about, propagate_version = true)]
struct Cli {
    /// Configuration file (default: $CARET_HOME/config.toml when it exists).
    #[arg(long, global = true, env = "CARET_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show what would be indexed in a workspace, and why the rest would not.
    Scan(scan::ScanArgs),
    /// Keep a server's copy of the workspace index in step (embedded server by default).
    Sync(sync::SyncArgs),
    /// Sync the workspace, then embed what lacks vectors (progress on a terminal).
    Index(index::IndexArgs),
    /// Search the workspace: semantic and lexical, fused.
    Search(index::SearchArgs),
    /// Show the workspace's root hash here and on the server, and what is pending.
    Status(sync::StatusArgs),
    /// Keep the embedded server warm for searches (started on demand; stops when idle).
    Daemon(daemon::DaemonArgs),
    /// Export or import the workspace key (for sharing an index with a team).
    #[command(subcommand)]
    Key(sync::KeyCommand),
    /// Run the multi-tenant server.
    Serve(server::ServeArgs),
    /// Administer the server: on its host (tenants, tenant tokens, flags, the first owner) or,
    /// with --server, the organisation through the admin API (people, groups, tokens, audit).
    #[command(subcommand)]
    Admin(caret_admin::AdminCommand),
    /// Who the token acts as on a team server.
    Whoami(caret_admin::ServerArgs),
    /// Sign in to a team server (an invitation, or a token you have): the token is kept for
    /// that server under $CARET_HOME and every client uses it.
    Login(caret_admin::LoginArgs),
    /// Sign out of a team server: the kept token revoked there and forgotten here.
    Logout(caret_admin::ServerArgs),
    /// Talk to a model of the gateway (embedded, or a server's).
    Chat(chat::ChatArgs),
    /// Apply an edit (search/replace blocks, a unified diff or a lazy snippet) to a file.
    Apply(apply::ApplyArgs),
    /// Suggest what comes at a cursor in a file (Tab completion, fill-in-the-middle).
    Complete(complete::CompleteArgs),
    /// Language server over stdio: Tab completions in any editor.
    Lsp(caret_lsp::LspArgs),
    /// Documentation sources (@Docs): add a docs site or folder, refresh, list, search.
    Docs(docs::DocsArgs),
    /// Open the workspace in a browser: editor, Tab, agent, search (loopback only).
    Ui(caret_ui::UiArgs),
    /// The project rules files (`AGENTS.md`, `.cursor/rules`, …) an agent session would apply,
    /// and why; with a path, also the rules attached when the session touches it.
    Rules(agent::RulesArgs),
    /// MCP servers whose tools the agent gets (`[mcp_servers.NAME]`).
    #[command(subcommand)]
    Mcp(agent::McpCommand),
    /// Hooks: commands run at the agent's events, from Caret's, Claude Code's and Cursor's
    /// hook files (`ls`, `trust`).
    #[command(subcommand)]
    Hooks(conventions::HooksCommand),
    /// The skills a session here has (`SKILL.md` folders of the project's and yours).
    Skills(conventions::ListArgs),
    /// The custom slash commands a session here has (`/name args` in any front end).
    Commands(conventions::ListArgs),
    /// The coding agent in an interactive terminal UI.
    Agent(agent::AgentArgs),
    /// Run the agent on a task without a terminal UI (events as JSON lines).
    Exec(exec::ExecArgs),
    /// Hand a task to a background agent (on a server, or the embedded queue).
    Run(Box<runs::RunArgs>),
    /// Many graded attempts per task (evaluation, RL): `caret rollout TASKS.jsonl -n 8`,
    /// `caret rollout report DIR`.
    Rollout(Box<caret_rollout::RolloutArgs>),
    /// Background runs: list, show, logs, diff, apply, cancel, rm.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// Execute background runs: a server's (operator token), or the embedded queue's.
    Worker(runs::WorkerArgs),
    /// Secrets for background runs (stored encrypted, put in the sandbox's environment).
    #[command(subcommand)]
    Secret(runs::SecretCommand),
    /// List or download model weight files.
    #[command(subcommand)]
    Models(models::ModelsCommand),
    /// Measure a capability and print its figures.
    #[command(subcommand)]
    Bench(caret_bench::BenchCommand),
    /// Print the server's HTTP API description (OpenAPI 3.1, JSON; also at `/openapi.json`).
    Openapi,
}

/// The commands a developer runs by hand many times a day, which the daemon answers in a few
/// milliseconds. clap builds every subcommand's arguments before it parses (about a
/// millisecond for this binary's thirty-odd), so these are parsed by a parser that holds only
/// them; anything it does not take as is (help, a version, an error) goes to the full one, so
/// what is printed never differs.
#[derive(Debug, Parser)]
#[command(name = "caret", version, propagate_version = true)]
struct QuickCli {
    /// Configuration file (default: $CARET_HOME/config.toml when it exists).
    #[arg(long, global = true, env = "CARET_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: QuickCommand,
}

#[derive(Debug, Subcommand)]
enum QuickCommand {
    Scan(scan::ScanArgs),
    Sync(sync::SyncArgs),
    Search(index::SearchArgs),
    Status(sync::StatusArgs),
}

impl From<QuickCli> for Cli {
    fn from(q: QuickCli) -> Cli {
        let command = match q.command {
            QuickCommand::Scan(a) => Command::Scan(a),
            QuickCommand::Sync(a) => Command::Sync(a),
            QuickCommand::Search(a) => Command::Search(a),
            QuickCommand::Status(a) => Command::Status(a),
        };
        Cli { config: q.config, command }
    }
}

/// The command line, through the quick parser when its first word is one of its commands.
fn parse_from(args: Vec<std::ffi::OsString>) -> Result<Cli, clap::Error> {
    use clap::Subcommand as _;
    if args.get(1).and_then(|a| a.to_str()).is_some_and(QuickCommand::has_subcommand)
        && let Ok(quick) = QuickCli::try_parse_from(&args)
    {
        return Ok(quick.into());
    }
    Cli::try_parse_from(args)
}

fn main() -> ExitCode {
    // Inside an agent's sandbox `caret` is also the Landlock helper (see caret_sandbox::landlock).
    caret_sandbox::landlock::enter_helper_if_asked();
    let cli = parse_from(std::env::args_os().collect()).unwrap_or_else(|e| e.exit());
    // A server logs its requests by default; other commands only warn.
    let service = match cli.command {
        Command::Serve(_) => "caret-server",
        Command::Worker(_) => "caret-worker",
        _ => "caret-client",
    };
    let exporter = init_tracing(if service == "caret-client" { "warn" } else { "info" }, service);
    // Failures and panics: to the log, and to a Sentry-protocol receiver when SENTRY_DSN names one.
    let reports = match caret_trace::report::init(service) {
        Ok(reports) => reports,
        Err(e) => {
            eprintln!("caret: warning: errors are not reported: {e}");
            None
        }
    };
    let code = match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("caret: error: {err:#}");
            ExitCode::FAILURE
        }
    };
    // The last spans and reports are sent before the process ends.
    drop(reports);
    drop(exporter);
    code
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = Config::load(cli.config.as_deref())?;
    match cli.command {
        Command::Scan(args) => scan::run(&config, args),
        Command::Sync(args) => sync::sync(&config, args),
        Command::Status(args) => sync::status(&config, args),
        Command::Daemon(args) => daemon::run(&config, args),
        Command::Index(args) => index::index(&config, args),
        Command::Search(args) => index::run_search(&config, args),
        Command::Key(cmd) => sync::key(&config, cmd),
        Command::Serve(args) => server::serve(&config, args),
        Command::Admin(cmd) => caret_admin::run(&config, cmd),
        Command::Whoami(args) => caret_admin::whoami(&config, &args),
        Command::Login(args) => caret_admin::login(&config, &args),
        Command::Logout(args) => caret_admin::logout(&config, &args),
        Command::Models(cmd) => models::run(&config, cmd),
        Command::Chat(args) => chat::run(&config, args),
        Command::Apply(args) => apply::run(&config, args),
        Command::Complete(args) => complete::run(&config, args),
        Command::Lsp(args) => caret_lsp::run(&config, args),
        Command::Ui(args) => caret_ui::run(&config, args),
        Command::Docs(cmd) => docs::run(&config, cmd),
        Command::Rules(args) => agent::rules(&config, args),
        Command::Mcp(cmd) => agent::mcp(&config, cmd),
        Command::Hooks(cmd) => conventions::run(&config, cmd),
        Command::Skills(args) => conventions::skills(&config, args),
        Command::Commands(args) => conventions::commands(&config, args),
        Command::Agent(args) => agent::run(&config, args),
        Command::Exec(args) => exec::run(&config, args),
        Command::Bench(cmd) => caret_bench::run(&config, cmd),
        Command::Run(args) => runs::run(&config, *args),
        Command::Runs(cmd) => runs::runs(&config, cmd),
        Command::Rollout(args) => caret_rollout::run(&config, *args),
        Command::Worker(args) => runs::worker(&config, args),
        Command::Secret(cmd) => runs::secret(&config, cmd),
        Command::Openapi => {
            println!("{:#}", caret_server::openapi::document());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Logs to standard error (filtered by `RUST_LOG`), and Caret's spans to an OpenTelemetry
/// collector when `OTEL_EXPORTER_OTLP_ENDPOINT` names one.
fn init_tracing(default: &str, service: &'static str) -> Option<caret_trace::Exporter> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // The HTML parser's debug lines quote the pages it reads: never logged.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let filter =
        ["html5ever=warn", "markup5ever=warn"].iter().flat_map(|d| d.parse()).fold(filter, |f, d| f.add_directive(d));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_target(false).with_filter(filter);
    let (traces, exporter) = match caret_trace::layer(service) {
        Ok(Some((layer, exporter))) => (Some(layer), Some(exporter)),
        Ok(None) => (None, None),
        Err(e) => {
            eprintln!("caret: warning: traces are not exported: {e}: {}", e.source);
            (None, None)
        }
    };
    tracing_subscriber::registry().with(logs).with(traces).init();
    exporter
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    fn both(line: &str) -> (String, String) {
        let args: Vec<std::ffi::OsString> = line.split_whitespace().map(Into::into).collect();
        let quick = parse_from(args.clone()).map(|c| format!("{c:?}")).unwrap_or_else(|e| e.to_string());
        let full = Cli::try_parse_from(args).map(|c| format!("{c:?}")).unwrap_or_else(|e| e.to_string());
        (quick, full)
    }

    #[test]
    fn the_quick_parser_reads_a_command_line_as_the_full_one_does() {
        for line in [
            "caret scan .",
            "caret scan --json --explain /tmp/w",
            "caret --config /tmp/c.toml scan .",
            "caret scan . --config /tmp/c.toml --max-file-size 1000",
            "caret sync . --server http://127.0.0.1:1",
            "caret search how are chunks embedded",
            "caret search -k 5 --json where is the merkle tree",
            "caret status .",
            // What the quick parser does not take goes to the full one: errors and help.
            "caret scan --no-such-flag",
            "caret scan --help",
            "caret search",
            "caret --version",
            "caret serve --help",
        ] {
            let (quick, full) = both(line);
            assert_eq!(quick, full, "{line}");
        }
    }

    #[test]
    fn the_quick_commands_take_the_same_arguments_as_the_full_ones() {
        let full = Cli::command();
        let quick = QuickCli::command();
        let ids = |c: &clap::Command| {
            let mut v: Vec<String> = c.get_arguments().map(|a| format!("{a:?}")).collect();
            v.sort();
            v
        };
        assert_eq!(quick.get_subcommands().count(), 4);
        for sub in quick.get_subcommands() {
            let name = sub.get_name();
            let same = full.find_subcommand(name).unwrap_or_else(|| panic!("{name} is not a command"));
            assert_eq!(ids(sub), ids(same), "{name}");
        }
        assert_eq!(ids(&quick), ids(&full));
    }
}
