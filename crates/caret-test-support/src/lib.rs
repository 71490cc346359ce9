//! Test fixtures shared by Caret's crates: temporary directories and git repositories, and a
//! scripted OpenAI-compatible model server ([`scripted::ScriptedUpstream`]).
//!
//! Dev-only: this crate is a dev-dependency everywhere and never ships in the binary. Its
//! helpers panic when a fixture cannot be set up (a temporary file not written, a poisoned
//! lock after another test thread panicked): a test cannot go on without its fixture, and the
//! panic names the step that failed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod database;
pub mod faulty;
pub mod mcp;
pub mod models;
pub mod otlp;
pub mod proxy;
pub mod scripted;
pub mod sentry;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Says that a test, or a part of one, did not run because something it needs is absent (a
/// service, a model, a kernel feature): `skipped: TEST: WHY` on the terminal even though the
/// harness captures a passing test's output (written to the process's standard error
/// directly, which `cargo test` leaves alone), and a line in the file `CARET_TEST_SKIPS` names
/// when it is set, so that CI — where everything is set up — can fail on any skip.
pub fn skip(why: &str) {
    use std::io::Write as _;
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let line = format!("skipped: {test}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os("CARET_TEST_SKIPS").filter(|p| !p.is_empty()) {
        // One small append per line: lines from parallel tests do not interleave.
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = appended {
            panic!("recording a skip in {}: {e}", Path::new(&path).display());
        }
    }
}

/// A temporary directory, removed on drop, with helpers to lay out files.
pub struct TempDir {
    dir: tempfile::TempDir,
}

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

impl TempDir {
    /// A fresh empty directory.
    pub fn new() -> Self {
        TempDir { dir: tempfile::tempdir().expect("creating a temporary directory") }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The absolute path of `rel` inside it.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes a text file, creating parent directories; returns its path.
    pub fn write(&self, rel: impl AsRef<Path>, text: &str) -> PathBuf {
        self.write_bytes(rel, text.as_bytes())
    }

    /// Writes a file with the given bytes, creating parent directories; returns its path.
    pub fn write_bytes(&self, rel: impl AsRef<Path>, bytes: &[u8]) -> PathBuf {
        let path = self.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// Creates a directory and its parents.
    pub fn mkdir(&self, rel: impl AsRef<Path>) -> PathBuf {
        let path = self.join(rel);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    /// Creates a symbolic link at `rel` pointing to `target` (taken as is).
    pub fn symlink(&self, target: impl AsRef<Path>, rel: impl AsRef<Path>) -> PathBuf {
        let path = self.join(rel);
        std::os::unix::fs::symlink(target, &path).unwrap();
        path
    }

    /// Removes a file.
    pub fn remove(&self, rel: impl AsRef<Path>) {
        std::fs::remove_file(self.join(rel)).unwrap();
    }

    /// Runs `git init` in it, isolated from the user's git configuration.
    pub fn git_init(&self) {
        self.git(&["init", "-q", "-b", "main"]);
    }

    /// Runs a git command in it, isolated from the user's git configuration.
    pub fn git(&self, args: &[&str]) {
        let status = Command::new("git")
            .args(args)
            .current_dir(self.path())
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .status()
            .expect("running git");
        assert!(status.success(), "git {args:?} failed");
    }
}

impl TempDir {
    /// Sets the modification time of every file below the directory to `secs` seconds ago,
    /// so a stat cache trusts them (files modified just now are re-read, by design).
    pub fn backdate(&self, secs: u64) {
        let when = std::time::SystemTime::now() - std::time::Duration::from_secs(secs);
        fn visit(dir: &Path, when: std::time::SystemTime) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                let kind = entry.file_type().unwrap();
                if kind.is_dir() {
                    visit(&entry.path(), when);
                } else if kind.is_file() {
                    std::fs::File::options().write(true).open(entry.path()).unwrap().set_modified(when).unwrap();
                }
            }
        }
        visit(self.path(), when);
    }
}

/// An HTTP server on the host's loopback that answers every request with `body` (status 200);
/// its port. It serves until the test process ends.
pub fn http_server(body: &'static str) -> u16 {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    let port = listener.local_addr().expect("the bound port").port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(conn, "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        }
    });
    port
}

/// A child process killed (and reaped) when dropped, with its process group (a launcher such
/// as pyenv's `python3` shim may fork the real program), so a failing test leaves no server
/// behind holding its output open.
#[derive(Debug)]
pub struct ChildGuard(pub std::process::Child);

impl ChildGuard {
    /// Starts `cmd` in a process group of its own (its output discarded) and waits up to 30 s
    /// until something accepts connections on 127.0.0.1:`port`.
    pub fn listening(cmd: &mut std::process::Command, port: u16) -> ChildGuard {
        use std::os::unix::process::CommandExt as _;
        let child =
            cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).process_group(0).spawn();
        let guard = ChildGuard(child.unwrap_or_else(|e| panic!("starting {cmd:?}: {e}")));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "nothing listens on {port} ({cmd:?})");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        guard
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // The group, when the child leads one (`listening`); then the child itself.
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .stderr(std::process::Stdio::null())
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free port on 127.0.0.1 (free when asked; bind it soon).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

/// SQLite's documentation as Debian ships it (`sqlite3-doc`; `CARET_TEST_SQLITE_DOCS`,
/// default `/usr/share/doc/sqlite3`): a real docs site for the @Docs tests; `None` (said as a
/// skip) when it is not installed.
pub fn sqlite_docs() -> Option<std::path::PathBuf> {
    let dir = std::path::PathBuf::from(
        std::env::var("CARET_TEST_SQLITE_DOCS").unwrap_or_else(|_| "/usr/share/doc/sqlite3".to_owned()),
    );
    if dir.join("lang_select.html").is_file() {
        Some(dir)
    } else {
        skip("SQLite's documentation is not installed (Debian: sqlite3-doc; CARET_TEST_SQLITE_DOCS)");
        None
    }
}
