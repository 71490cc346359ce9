//! Where a hook's command runs: `bash -c` on this machine in its own process group (all it
//! starts is killed at its timeout), or in a run's sandbox ([`SandboxShell`]). Its input goes
//! to its stdin; at most [`OUTPUT_CAP`] of each of its outputs is kept (the rest is read and
//! dropped, so a chatty hook never blocks on a full pipe).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// Bytes kept of a hook's stdout and of its stderr.
pub const OUTPUT_CAP: usize = 1 << 20;

/// How a hook's command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// With this code.
    Code(i32),
    /// Killed by this signal (not by Caret).
    Signal(i32),
    /// Past its timeout (killed, with all it started).
    TimedOut,
    /// It could not be started.
    NotStarted(String),
}

/// What a hook's command did.
#[derive(Debug, Clone)]
pub struct Ran {
    /// How it ended.
    pub exit: Exit,
    /// Its standard output (at most [`OUTPUT_CAP`]).
    pub stdout: String,
    /// Its standard error (at most [`OUTPUT_CAP`]).
    pub stderr: String,
    /// Whether either was cut at the cap.
    pub cut: bool,
}

/// A started command: its pipes, and a way to wait for (or kill) it.
pub struct Started {
    /// Its standard input.
    pub stdin: Box<dyn AsyncWrite + Send + Unpin>,
    /// Its standard output.
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    /// Its standard error.
    pub stderr: Box<dyn AsyncRead + Send + Unpin>,
    /// Waits for it to end: its exit code, or the signal that ended it.
    pub wait: futures::future::BoxFuture<'static, Exit>,
    /// Dropped, it is killed (with all it started).
    pub alive: Box<dyn Send>,
}

impl Started {
    fn new(
        stdin: impl AsyncWrite + Send + Unpin + 'static,
        stdout: impl AsyncRead + Send + Unpin + 'static,
        stderr: impl AsyncRead + Send + Unpin + 'static,
        wait: futures::future::BoxFuture<'static, Exit>,
        alive: Box<dyn Send>,
    ) -> Started {
        Started { stdin: Box::new(stdin), stdout: Box::new(stdout), stderr: Box::new(stderr), wait, alive }
    }
}

/// How a command ended, from its exit code or the signal that ended it.
fn exit_of(status: std::io::Result<(Option<i32>, Option<i32>)>) -> Exit {
    match status {
        Ok((Some(code), _)) => Exit::Code(code),
        Ok((None, Some(signal))) => Exit::Signal(signal),
        Ok((None, None)) => Exit::Code(-1),
        Err(e) => Exit::NotStarted(e.to_string()),
    }
}

/// Starts hook commands.
#[async_trait::async_trait]
pub trait Shell: Send + Sync {
    /// Starts `command` (a `bash -c` line) in `cwd` with `env` added.
    async fn start(&self, command: &str, cwd: &Path, env: &[(String, String)]) -> Result<Started, String>;
}

/// Runs `command` through `shell` with `input` on its stdin, for at most `timeout`.
pub async fn run(
    shell: &dyn Shell,
    command: &str,
    cwd: &Path,
    env: &[(String, String)],
    input: &[u8],
    timeout: Duration,
) -> Ran {
    let started = match shell.start(command, cwd, env).await {
        Ok(s) => s,
        Err(e) => return Ran { exit: Exit::NotStarted(e), stdout: String::new(), stderr: String::new(), cut: false },
    };
    let Started { mut stdin, stdout, stderr, wait, alive } = started;
    let input = input.to_vec();
    // A hook that never reads its input must not hold up the rest.
    let feed = tokio::spawn(async move {
        let _ = stdin.write_all(&input).await;
        let _ = stdin.shutdown().await;
    });
    let work = async {
        let (out, err, exit) = tokio::join!(capped(stdout), capped(stderr), wait);
        (out, err, exit)
    };
    let ran = match tokio::time::timeout(timeout, work).await {
        Ok(((stdout, cut_out), (stderr, cut_err), exit)) => Ran { exit, stdout, stderr, cut: cut_out || cut_err },
        Err(_) => Ran { exit: Exit::TimedOut, stdout: String::new(), stderr: String::new(), cut: false },
    };
    feed.abort();
    drop(alive);
    ran
}

/// Reads `r` to its end, keeping the first [`OUTPUT_CAP`] bytes; whether more came.
async fn capped(mut r: Box<dyn AsyncRead + Send + Unpin>) -> (String, bool) {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut cut = false;
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = OUTPUT_CAP.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                cut |= n > room;
            }
        }
    }
    (String::from_utf8_lossy(&kept).into_owned(), cut)
}

/// Hooks as children of this process: `bash -c` in a process group of their own.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalShell;

/// A process group killed when dropped.
struct Group(Option<u32>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[async_trait::async_trait]
impl Shell for LocalShell {
    async fn start(&self, command: &str, cwd: &Path, env: &[(String, String)]) -> Result<Started, String> {
        let mut cmd = tokio::process::Command::new("bash");
        cmd.arg("-c")
            .arg(command)
            .current_dir(cwd)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| format!("starting bash: {e}"))?;
        let group = Group(child.id());
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("the hook's pipes were not opened".into());
        };
        let wait = Box::pin(async move {
            use std::os::unix::process::ExitStatusExt as _;
            exit_of(child.wait().await.map(|s| (s.code(), s.signal())))
        });
        Ok(Started::new(stdin, stdout, stderr, wait, Box::new(group)))
    }
}

/// Hooks inside a sandbox (a background run's): started as the sandbox starts long-lived
/// commands, so they see what the run's commands see and nothing more.
pub struct SandboxShell {
    sandbox: Arc<dyn caret_sandbox::Sandbox>,
    root: PathBuf,
}

impl SandboxShell {
    /// Hooks in `sandbox`, whose workspace is `root`.
    pub fn new(sandbox: Arc<dyn caret_sandbox::Sandbox>, root: &Path) -> SandboxShell {
        SandboxShell { sandbox, root: root.to_path_buf() }
    }
}

#[async_trait::async_trait]
impl Shell for SandboxShell {
    async fn start(&self, command: &str, cwd: &Path, env: &[(String, String)]) -> Result<Started, String> {
        let cwd = if cwd.starts_with(&self.root) { cwd } else { &self.root };
        let mut spec = caret_sandbox::Spec::new(command, cwd);
        spec.env = env.to_vec();
        let process = self.sandbox.spawn(&spec).await.map_err(|e| e.to_string())?;
        let caret_sandbox::Process { stdin, stdout, stderr, mut alive } = process;
        // `alive` lives in the wait: dropped (a timeout), it kills the command.
        let wait = Box::pin(async move { exit_of(alive.wait().await) });
        Ok(Started::new(stdin, stdout, stderr, wait, Box::new(())))
    }
}
