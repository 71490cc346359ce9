//! A `caret ui` process for the page tests and benches.

#![allow(dead_code)] // each test file uses its own share of it

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A running `caret ui`, killed when dropped.
pub struct Ui {
    pub child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub token: String,
}

impl Drop for Ui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `caret` (the binary at `caret`) as `caret ui WORKSPACE` with `home` as its
/// `CARET_HOME` and `HOME`, and reads the address it prints first.
pub fn start(caret: &str, home: &Path, workspace: &Path) -> Ui {
    start_env(caret, home, workspace, &[])
}

/// [`start`] with more environment variables.
pub fn start_env(caret: &str, home: &Path, workspace: &Path, env: &[(&str, &str)]) -> Ui {
    let mut child = Command::new(caret)
        .args(["ui", workspace.to_str().unwrap()])
        .env("CARET_HOME", home)
        .env("HOME", home)
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().strip_prefix("caret ui: ").unwrap_or_else(|| panic!("no address printed: {line:?}"));
    let (base, token) = url.split_once("/#token=").unwrap();
    assert!(base.starts_with("http://127.0.0.1:"), "loopback only: {base}");
    assert_eq!(token.len(), 64);
    Ui { child, base: base.to_owned(), token: token.to_owned() }
}
