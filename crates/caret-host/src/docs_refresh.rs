//! Refreshing documentation sources in the background: `caret docs refresh --due` as a
//! process of its own, its output appended to `$CARET_HOME/docs/refresh.log` (it refreshes
//! what is due and exits; a source being updated is left to that update).

use crate::config::Config;

/// Starts `caret docs refresh --due` in the background.
pub fn spawn(config: &Config) {
    let dir = config.home.join("docs");
    let (Ok(me), Ok(log)) =
        (std::env::current_exe(), std::fs::OpenOptions::new().create(true).append(true).open(dir.join("refresh.log")))
    else {
        return;
    };
    let mut cmd = std::process::Command::new(me);
    cmd.args(["docs", "refresh", "--due"]).env("CARET_HOME", &config.home).stdin(std::process::Stdio::null());
    if let Ok(err) = log.try_clone() {
        cmd.stdout(log).stderr(err);
    }
    if let Err(e) = cmd.spawn() {
        tracing::warn!("refreshing docs sources in the background: {e}");
    }
}
