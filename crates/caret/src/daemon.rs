//! `caret daemon`: the embedded server kept warm on loopback (see `caret_host::daemon`).

use std::process::ExitCode;

use caret_host::config::Config;

#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// Stop after this long without a request (default: `[daemon] idle`, 15m).
    #[arg(long)]
    idle: Option<String>,
}

pub fn run(config: &Config, args: DaemonArgs) -> anyhow::Result<ExitCode> {
    caret_host::daemon::serve(config, args.idle.as_deref(), |line| eprintln!("{line}"))?;
    Ok(ExitCode::SUCCESS)
}
