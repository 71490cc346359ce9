//! What the whole-binary benches share: a `caret serve` with a tenant, its token and an
//! operator token; `caret worker` processes; committed repositories.
#![allow(dead_code)]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub const CARET: &str = env!("CARGO_BIN_EXE_caret");

/// The config of an `agent` alias on a scripted upstream at `url`, plus `extra` TOML.
pub fn agent_config(url: &str, extra: &str) -> String {
    format!(
        "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{url}\", model = \"m\" }}]\n{extra}"
    )
}

/// A running `caret serve` on loopback with one tenant.
pub struct Server {
    pub child: Child,
    pub url: String,
    pub home: PathBuf,
    pub data: PathBuf,
    /// `--database-url …` when not on SQLite.
    pub db: Vec<String>,
    /// The tenant's API token.
    pub token: String,
    /// An operator token (workers, the fleet view).
    pub operator: String,
}

impl Server {
    /// Starts `caret serve` under `dir` (home `dir/home` with `config` as its config file,
    /// data `dir/srv`, log `dir/server.log`) with `args`, and creates `tenant`.
    pub fn start(dir: &Path, config: &str, args: &[&str], db: Vec<String>, tenant: &str) -> Server {
        let (home, data) = (dir.join("home"), dir.join("srv"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(home.join("config.toml"), config).unwrap();
        let mut child = Command::new(CARET)
            .args(["serve", "--addr", "127.0.0.1:0"])
            .args(args)
            .arg("--data-dir")
            .arg(&data)
            .args(&db)
            .env("CARET_HOME", &home)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("server.log")).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let url = line.trim().rsplit(' ').next().unwrap().to_owned();
        assert!(url.starts_with("http"), "the server did not start: {line}");
        let mut s = Server { child, url, home, data, db, token: String::new(), operator: String::new() };
        s.admin(&["admin", "tenant", "create", tenant]);
        s.token = s.admin(&["admin", "token", "create", "--tenant", tenant]);
        s.operator = s.admin(&["admin", "operator-token", "create"]);
        s
    }

    /// Runs `caret admin …` on the server's storage; answers its output.
    pub fn admin(&self, args: &[&str]) -> String {
        let out = Command::new(CARET)
            .args(args)
            .arg("--data-dir")
            .arg(&self.data)
            .args(&self.db)
            .env("CARET_HOME", &self.home)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `caret worker` number `n` with `slots` slots, its work and home directories under `dir`.
pub fn worker(server: &Server, dir: &Path, n: usize, slots: usize) -> Child {
    Command::new(CARET)
        .args(["worker", "--server", &server.url, "--token", &server.operator, "--slots", &slots.to_string()])
        .arg("--work-dir")
        .arg(dir.join(format!("work-{n}")))
        .env("CARET_HOME", dir.join(format!("worker-{n}")))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Writes `files` into `dir` and commits them in a new git repository.
pub fn committed_repo(dir: &Path, files: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (path, text) in files {
        std::fs::write(dir.join(path), text).unwrap();
    }
    for a in
        [&["init", "-q"][..], &["add", "-A"], &["-c", "user.name=c", "-c", "user.email=c@c", "commit", "-q", "-m", "i"]]
    {
        assert!(Command::new("git").args(a).current_dir(dir).status().unwrap().success());
    }
}

/// The p-th quantile (0–1) of `v` (sorted here); NaN when empty.
pub fn quantile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1))).copied().unwrap_or(f64::NAN)
}
