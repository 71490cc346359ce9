//! The `caret` processes the server benchmarks start: admin commands, and a `caret serve`
//! killed when it goes out of scope.

use std::path::Path;
use std::process::Command;

use anyhow::Context as _;

/// A child process, killed and reaped when dropped.
pub(crate) struct Child(pub(crate) std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs this binary's `caret ARGS --data-dir DATA` with `CARET_HOME` set; its trimmed output.
pub(crate) fn caret(data: &Path, home: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(std::env::current_exe()?)
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .env("CARET_HOME", home)
        .output()
        .context("running caret")?;
    anyhow::ensure!(out.status.success(), "caret {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Starts `serve` (a `caret serve --addr 127.0.0.1:0 …` with its output piped) and reads the
/// address it prints when listening.
pub(crate) fn start_serve(serve: &mut Command) -> anyhow::Result<(Child, String)> {
    let mut child = Child(serve.spawn().context("starting caret serve")?);
    let mut line = String::new();
    let stdout = child.0.stdout.take().context("the server's output")?;
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
    let url = line.trim().rsplit(' ').next().unwrap_or_default().to_owned();
    anyhow::ensure!(url.starts_with("http"), "the server did not start: {line:?}");
    Ok((child, url))
}
