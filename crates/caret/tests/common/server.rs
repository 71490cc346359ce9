//! A `caret serve` process on scratch storage, and clients of it, for the server's tests.

#![allow(dead_code)] // each test file uses its own share of it

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use caret_test_support::TempDir;
use serde_json::Value;

pub const CARET: &str = env!("CARGO_BIN_EXE_caret");

/// Storage flags of one backend.
pub fn backends() -> Vec<(String, Vec<String>)> {
    let mut v = vec![("embedded".to_owned(), Vec::new())];
    let db = std::env::var("CARET_TEST_DATABASE_URL").ok().filter(|s| !s.is_empty());
    let store = std::env::var("CARET_TEST_OBJECT_STORE").ok().filter(|s| !s.is_empty());
    if db.is_some() || store.is_some() {
        let mut args = Vec::new();
        if let Some(db) = db {
            args.extend(["--database-url".to_owned(), db]);
        }
        if let Some(store) = store {
            // A fresh prefix per server keeps runs apart in a shared bucket.
            args.extend(["--object-store".to_owned(), format!("{store}/{}", fastrand::u64(..))]);
        }
        v.push(("scaled".to_owned(), args));
    } else {
        caret_test_support::skip("PostgreSQL and S3: CARET_TEST_DATABASE_URL and CARET_TEST_OBJECT_STORE are not set");
    }
    v
}

pub struct Server {
    pub child: Child,
    pub url: String,
    pub data: TempDir,
    pub storage: Vec<String>,
    pub log: PathBuf,
}

impl Server {
    pub fn start(storage: &[String], extra: &[&str]) -> Server {
        Server::start_with_config(storage, extra, None)
    }

    /// Starts a server whose `$CARET_HOME/config.toml` is `config`.
    pub fn start_with_config(storage: &[String], extra: &[&str], config: Option<&str>) -> Server {
        let data = TempDir::new();
        if let Some(text) = config {
            data.write("home/config.toml", text);
        }
        std::fs::File::create(data.join("server.log")).unwrap();
        Server::spawn(data, storage, extra)
    }

    /// Starts `caret serve` on `data` (its log appended to `server.log` there).
    pub fn spawn(data: TempDir, storage: &[String], extra: &[&str]) -> Server {
        Server::spawn_env(data, storage, extra, &[])
    }

    /// [`Server::spawn`] with more environment.
    pub fn spawn_env(data: TempDir, storage: &[String], extra: &[&str], envs: &[(&str, &str)]) -> Server {
        let child = Server::launch(&data, storage, extra, envs);
        Server::started(child, data, storage)
    }

    /// Launches `caret serve` on `data` without waiting for it to listen (several at once).
    pub fn launch(data: &TempDir, storage: &[String], extra: &[&str], envs: &[(&str, &str)]) -> Child {
        let log = data.join("server.log");
        if !log.exists() {
            std::fs::File::create(&log).unwrap();
        }
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--addr".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            data.join("srv").display().to_string(),
        ];
        args.extend(storage.iter().cloned());
        args.extend(extra.iter().map(|s| s.to_string()));
        Command::new(CARET)
            .args(&args)
            .env("CARET_HOME", data.join("home"))
            .env("RUST_LOG", "debug")
            // Compact after every write, to exercise segments in every test.
            .env("CARET_COMPACT_RECORDS", "1")
            .env(
                "CARET_EMBED_MODEL",
                caret_test_support::models::TestModel::Embedding
                    .dir()
                    .unwrap_or_else(|| data.join("no-model"))
                    .display()
                    .to_string(),
            )
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::OpenOptions::new().append(true).open(&log).unwrap())
            .spawn()
            .unwrap()
    }

    /// A launched server once it listens (its first line says where).
    pub fn started(mut child: Child, data: TempDir, storage: &[String]) -> Server {
        let log = data.join("server.log");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let url = line.trim().rsplit(' ').next().unwrap_or_default().to_owned();
        assert!(
            url.starts_with("http"),
            "server did not start: {line:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Server { child, url, data, storage: storage.to_vec(), log }
    }

    pub fn admin(&self, args: &[&str]) -> String {
        let mut full: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        full.extend(["--data-dir".into(), self.data.join("srv").display().to_string()]);
        full.extend(self.storage.iter().cloned());
        let out = Command::new(CARET).args(&full).env("CARET_HOME", self.data.join("home")).output().unwrap();
        assert!(out.status.success(), "admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// A new tenant with a unique name, and a token for it.
    pub fn tenant(&self, name: &str) -> String {
        let name = format!("{name}-{}", fastrand::u32(..));
        self.admin(&["admin", "tenant", "create", &name]);
        self.admin(&["admin", "token", "create", "--tenant", &name])
    }

    /// A new organisation (unique name) and its first owner, made on the host; the owner's
    /// token, with every scope.
    pub fn owner(&self, organisation: &str) -> String {
        let name = format!("{organisation}-{}", fastrand::u32(..));
        let email = format!("owner@{name}.example");
        self.admin(&["admin", "bootstrap", "--organisation", &name, "--email", &email])
    }

    /// Kills the server (SIGKILL, wherever it is) and starts it again on the same data: a new
    /// port, the same database and objects (the first start's extra flags are not repeated).
    pub fn kill_and_restart(mut self) -> Server {
        let _ = Command::new("kill").arg("-KILL").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
        let data = std::mem::replace(&mut self.data, TempDir::new());
        Server::spawn(data, &self.storage, &[])
    }

    /// Stops the server gracefully (SIGTERM) and hands back its data directory and log.
    pub fn stop(mut self) -> (TempDir, PathBuf) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
        let data = std::mem::replace(&mut self.data, TempDir::new());
        (data, self.log.clone())
    }
}

impl Drop for Server {
    /// A failed assertion must not leave a server running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client with its own CARET_HOME (keys and state), talking to `url` with `token`.
pub struct Client {
    pub home: TempDir,
}

impl Client {
    pub fn new() -> Client {
        Client { home: TempDir::new() }
    }

    pub fn run(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(CARET);
        cmd.args(args).env("CARET_HOME", self.home.join("home")).env("HOME", self.home.path()).env_remove("RUST_LOG");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    pub fn sync(&self, dir: &Path, server: &Server, token: &str) -> Value {
        let out = self.run(&["sync", dir.to_str().unwrap(), "--server", &server.url, "--token", token, "--json"], &[]);
        assert!(out.status.success(), "sync failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn workspace_id(&self, dir: &Path) -> String {
        let out = self.run(&["status", dir.to_str().unwrap(), "--json"], &[]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["workspace"].as_str().unwrap().to_owned()
    }
}

pub fn http() -> reqwest::blocking::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

/// A repository whose `add.sh` subtracts, with a test that wants it to add (committed).
pub fn buggy_repo() -> TempDir {
    let repo = TempDir::new();
    repo.write("add.sh", "echo $(( $1 - $2 ))\n");
    repo.write("test.sh", "[ \"$(sh add.sh 2 3)\" = 5 ] && echo 'tests pass' || { echo 'tests FAIL'; exit 1; }\n");
    repo.write(".caret/environment.toml", "test = \"sh test.sh\"\n");
    repo.git_init();
    repo.git(&["add", "-A"]);
    repo.git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init"]);
    repo
}

/// An agent session's events from an event-stream answer, until one of type `until`.
pub fn events_until(r: reqwest::blocking::Response, until: &str) -> Vec<Value> {
    use std::io::BufRead as _;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let mut events = Vec::new();
    for line in BufReader::new(r).lines() {
        if let Some(data) = line.unwrap().strip_prefix("data: ") {
            let e: Value = serde_json::from_str(data).unwrap();
            let done = e["type"] == until;
            events.push(e);
            if done {
                break;
            }
        }
    }
    events
}
