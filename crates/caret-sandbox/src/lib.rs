//! Commands run isolated: the [`Sandbox`] trait, which the agent's terminal tool and the
//! background-run orchestrator share, and its first backend, [`Bwrap`] (bubblewrap: Linux
//! namespaces without privileges).
//!
//! What a command sees under [`Bwrap`]: the system read-only; the workspace read-write; an
//! empty `/tmp` and an empty home (the user's real home — `~/.ssh`, `~/.aws`, tokens — is
//! not there); no network unless the policy allows it; its own PID namespace, so nothing it
//! starts outlives it; a clean environment. Its time is bounded (the whole process tree is
//! killed at the deadline) and so is its output (the rest is read and dropped, so a chatty
//! command cannot block on a full pipe).
//!
//! Toolchains in the home (rustup, cargo's crate cache, pyenv) can be bound back read-only
//! with [`Policy::with_toolchains`], so that builds and linters run offline inside.
//!
//! Each command also runs in its own cgroups (CPU, memory, process count; v2, or v1 on
//! hybrid hosts) and under a seccomp filter of system calls it never needs (see [`limits`]);
//! nested user namespaces are refused. Where the kernel has Landlock and the policy names a
//! helper program ([`Policy::with_landlock`]), writes are also fenced by Landlock to the
//! workspace and the sandbox's own scratch directories (see [`landlock`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};

pub mod egress;
pub mod firecracker;
pub mod guest;
pub mod gvisor;
pub mod landlock;
pub mod limits;
pub mod mirror;
pub mod netproxy;
pub mod usage;
pub use gvisor::Gvisor;
pub use limits::Limits;

/// What went wrong starting or running a command (its own failure is an [`Output`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The backend is missing or unusable here.
    #[error("sandbox unavailable: {0}")]
    Unavailable(String),
    /// The request is not allowed (a working directory outside the workspace, say).
    #[error("{0}")]
    Refused(String),
    /// Starting or waiting failed.
    #[error("running the command: {0}")]
    Io(#[from] std::io::Error),
    /// A device or file the backend needs could not be opened (`/dev/kvm`, say).
    #[error("sandbox unavailable: {what}")]
    Device {
        /// What was needed and why.
        what: &'static str,
        /// Why opening it failed.
        #[source]
        source: std::io::Error,
    },
    /// A blocking task of the backend ended without answering (it panicked or was cancelled).
    #[error("a task of the sandbox ended without answering")]
    Task(#[source] tokio::task::JoinError),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A command to run.
#[derive(Debug, Clone)]
pub struct Spec {
    /// A shell command line (run with `bash -c`).
    pub command: String,
    /// The working directory: the workspace or a directory in it.
    pub cwd: PathBuf,
    /// Killed after this long.
    pub timeout: Duration,
    /// Bytes kept of stdout and of stderr each.
    pub output_limit: usize,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Where the output also goes as it comes (stdout and stderr as read, up to the limit
    /// each), for commands watched while they run.
    pub live: Option<Live>,
}

/// Output of a running command, readable while it runs.
pub type Live = std::sync::Arc<std::sync::Mutex<Vec<u8>>>;

impl Spec {
    /// `command` in `cwd`, with a 2-minute timeout and 64 KiB of each stream kept.
    pub fn new(command: impl Into<String>, cwd: impl Into<PathBuf>) -> Spec {
        Spec {
            command: command.into(),
            cwd: cwd.into(),
            timeout: Duration::from_secs(120),
            output_limit: 64 << 10,
            env: Vec::new(),
            live: None,
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Its exit code; `None` when a signal ended it (the timeout's included).
    pub exit_code: Option<i32>,
    /// Standard output (lossy UTF-8), cut at the limit.
    pub stdout: String,
    /// Standard error, likewise.
    pub stderr: String,
    /// Killed at the deadline.
    pub timed_out: bool,
    /// Some output was dropped at the limit.
    pub truncated: bool,
    /// The memory limit killed a process of it.
    pub oom_killed: bool,
    /// How long it ran.
    pub duration: Duration,
}

impl Output {
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// Somewhere commands run isolated.
#[async_trait::async_trait]
pub trait Sandbox: Send + Sync {
    /// The backend's name.
    fn name(&self) -> &'static str;
    /// Runs a command and waits for it (or its deadline).
    async fn run(&self, spec: &Spec) -> Result<Output>;
    /// What its live commands use now, when the backend can say; none: sample `/proc` by
    /// workspace ([`usage::Sample`]).
    async fn usage(&self) -> Option<usage::Usage> {
        None
    }
    /// Starts a long-lived command (a stdio MCP server, say) with its standard streams piped,
    /// under the same isolation as [`Sandbox::run`]; its timeout and output limit do not
    /// apply. It lives until the [`Process`] is dropped.
    async fn spawn(&self, spec: &Spec) -> Result<Process> {
        let _ = spec;
        Err(Error::Unavailable(format!("the {} sandbox runs commands to their end only", self.name())))
    }
}

/// A command started with [`Sandbox::spawn`]; it, and all it started, is killed when this is
/// dropped.
#[derive(Debug)]
pub struct Process {
    /// Its standard input.
    pub stdin: tokio::process::ChildStdin,
    /// Its standard output.
    pub stdout: tokio::process::ChildStdout,
    /// Its standard error.
    pub stderr: tokio::process::ChildStderr,
    /// The process itself: dropping this kills it.
    pub alive: Alive,
}

/// A spawned command's life: dropped, it is killed (with all it started).
#[derive(Debug)]
pub struct Alive {
    child: tokio::process::Child,
    /// Its cgroups, removed once it is gone.
    _group: Option<limits::Group>,
    /// The seccomp program's file, read at its start.
    _seccomp: Option<TempFile>,
}

impl Alive {
    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for it to end: its exit code, or the signal that ended it.
    pub async fn wait(&mut self) -> std::io::Result<(Option<i32>, Option<i32>)> {
        use std::os::unix::process::ExitStatusExt as _;
        let status = self.child.wait().await?;
        Ok((status.code(), status.signal()))
    }
}

/// A file removed when dropped.
#[derive(Debug)]
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// What a sandbox allows.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The directory commands may write (and work in).
    pub workspace: PathBuf,
    /// Directories replaced by empty ones (the user's home, by default).
    pub hidden: Vec<PathBuf>,
    /// Directories inside hidden ones bound back read-only: toolchains installed in the
    /// user's home (`~/.rustup`, `~/.cargo/bin`, ...), never the home as a whole.
    pub exposed: Vec<PathBuf>,
    /// Directories put before the system's on `PATH` (exposed `bin` directories).
    pub path: Vec<PathBuf>,
    /// Whether commands may use the network (all of it).
    pub network: bool,
    /// Without the network, the hosts commands may still reach (through a proxy, see
    /// [`netproxy`]); empty: none.
    pub hosts: netproxy::AllowList,
    /// Environment variables of every command (a background run's environment and secrets),
    /// set after the defaults and before a command's own.
    pub env: Vec<(String, String)>,
    /// CPU, memory and process limits of each command (cgroups).
    pub limits: Limits,
    /// Whether the seccomp filter applies.
    pub seccomp: bool,
    /// The Landlock helper program (a binary that calls [`landlock::enter_helper_if_asked`]);
    /// none: no Landlock.
    pub landlock: Option<PathBuf>,
}

impl Policy {
    /// Writable `workspace`, the user's home hidden, no network.
    pub fn new(workspace: &Path) -> Result<Policy> {
        let workspace = std::fs::canonicalize(workspace)
            .map_err(|e| Error::Refused(format!("workspace {}: {e}", workspace.display())))?;
        let hidden = std::env::var_os("HOME").map(PathBuf::from).into_iter().collect();
        Ok(Policy {
            workspace,
            hidden,
            exposed: Vec::new(),
            path: Vec::new(),
            network: false,
            hosts: netproxy::AllowList::default(),
            env: Vec::new(),
            limits: Limits::standard(),
            seccomp: true,
            landlock: None,
        })
    }

    /// Also exposes, read-only, the toolchains a project's builds and linters need that live
    /// in the user's home, where they exist: Rust (`~/.rustup`, `~/.cargo/bin`, and the
    /// downloaded crates in `~/.cargo/registry` and `~/.cargo/git`, so that offline builds
    /// work — not `~/.cargo/credentials.toml`), pyenv (`~/.pyenv`), Go's module cache
    /// (`~/go/pkg/mod`) and `~/.local/bin`. Their `bin` directories go on `PATH`.
    pub fn with_toolchains(mut self) -> Policy {
        let Some(home) = std::env::var_os("HOME").map(PathBuf::from) else {
            return self;
        };
        let dirs = [".rustup", ".cargo/bin", ".cargo/registry", ".cargo/git", ".pyenv", "go/pkg/mod", ".local/bin"];
        self.exposed.extend(dirs.iter().map(|d| home.join(d)).filter(|d| d.is_dir()));
        let bins = [".cargo/bin", ".pyenv/shims", ".pyenv/bin", ".local/bin"];
        self.path.extend(bins.iter().map(|d| home.join(d)).filter(|d| d.is_dir()));
        self
    }

    /// Whether commands reach the allowed hosts through the proxy.
    pub fn proxied(&self) -> bool {
        !self.network && !self.hosts.is_empty()
    }

    /// A command's whole environment, in order: the defaults (`PATH` with the exposed
    /// toolchains first, `HOME` the hidden home, `LANG`, `TERM`, the proxy's variables when
    /// hosts are allowed), the policy's variables, then the command's own.
    pub fn command_env(&self, own: &[(String, String)]) -> Vec<(String, String)> {
        let home = self.hidden.first().map_or_else(|| "/tmp".to_owned(), |h| h.display().to_string());
        let path = self.path.iter().map(|p| format!("{}:", p.display())).collect::<String>() + PATH;
        let defaults = [
            ("PATH".to_owned(), path),
            ("HOME".to_owned(), home),
            ("LANG".into(), "C.UTF-8".into()),
            ("TERM".into(), "dumb".into()),
        ];
        let proxy = if self.proxied() { netproxy::proxy_env() } else { Vec::new() };
        defaults.into_iter().chain(proxy).chain(self.env.iter().chain(own).cloned()).collect()
    }

    /// Also fences writes with Landlock, through `helper` (a binary that becomes the helper
    /// when asked: `caret` itself, `std::env::current_exe()`), where the kernel has it.
    pub fn with_landlock(mut self, helper: PathBuf) -> Policy {
        self.landlock = Some(helper);
        self
    }
}

/// Where the Landlock helper appears inside the sandbox (`/tmp` is the sandbox's own).
pub(crate) const HELPER_INSIDE: &str = "/tmp/.caret-landlock";

/// The bubblewrap backend.
#[derive(Debug, Clone)]
pub struct Bwrap {
    policy: Policy,
    program: PathBuf,
    /// Whether commands run under Landlock (the helper works here).
    landlock: bool,
    /// Why not, when the policy asked for it.
    no_landlock: Option<String>,
    /// The compiled seccomp filter, when the policy has one and this architecture allows it.
    seccomp: Option<std::sync::Arc<Vec<u8>>>,
    /// Why limits are not enforced here (cgroups could not be made), if so.
    unlimited: Option<String>,
    /// The allow-list proxy, when the policy allows hosts.
    proxy: Option<std::sync::Arc<netproxy::Proxy>>,
}

/// Joins the cgroups given before `--` (the shell's own pid into each `cgroup.procs`), then
/// becomes the command after it: everything the command starts is inside from its first
/// instruction.
const JOIN: &str = r#"while [ "$1" != "--" ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@""#;

/// Names each command's cgroups apart.
static GROUPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A command's own cgroups, named apart from every other's (this process's and others').
fn new_group(limits: &Limits) -> std::result::Result<limits::Group, String> {
    let n = GROUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    limits::Group::create(&format!("caret-{}-{n}", std::process::id()), limits)
}

/// The first of `paths` that exists, or why the backend is unavailable.
pub(crate) fn installed(paths: &[&str], what: &str, debian: &str) -> Result<PathBuf> {
    paths
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| Error::Unavailable(format!("{what} is not installed (Debian: {debian})")))
}

/// `PATH` inside the sandbox.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Bwrap {
    /// A sandbox with `policy`, if bubblewrap is installed and works here (checked by
    /// running `true` in one).
    pub fn new(policy: Policy) -> Result<Bwrap> {
        let program =
            installed(&["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"], "bubblewrap (bwrap)", "bubblewrap")?;
        let seccomp = if policy.seccomp {
            limits::seccomp_program().map_err(Error::Unavailable)?.map(std::sync::Arc::new)
        } else {
            None
        };
        // Whether cgroups can be made here: tried once.
        let unlimited = match new_group(&policy.limits) {
            Ok(_) => None,
            Err(why) => Some(format!("limits not enforced (cannot make cgroups: {why})")),
        };
        let proxy = proxy_for(&policy)?;
        let mut b = Bwrap { policy, program, landlock: false, no_landlock: None, seccomp, unlimited, proxy };
        let probe = b.probe()?;
        if !probe.status.success() {
            let why = String::from_utf8_lossy(&probe.stderr).trim().to_owned();
            return Err(Error::Unavailable(format!("bwrap cannot create a sandbox here: {why}")));
        }
        if b.policy.landlock.as_ref().is_some_and(|h| h.is_file()) {
            b.landlock = true;
            let probe = b.probe()?;
            if !probe.status.success() {
                b.landlock = false;
                let why = String::from_utf8_lossy(&probe.stderr).trim().to_owned();
                b.no_landlock = Some(format!("Landlock not applied: {why}"));
            }
        } else if let Some(helper) = &b.policy.landlock {
            b.no_landlock = Some(format!("Landlock not applied: no helper at {}", helper.display()));
        }
        Ok(b)
    }

    /// Runs `true` in a sandbox as commands will run.
    fn probe(&self) -> Result<std::process::Output> {
        let mut args = self.arguments(&self.policy.workspace, &[]);
        args.extend(self.command(&["true".to_owned()]));
        let mut probe = std::process::Command::new(&self.program)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        if let (Some(mut stdin), Some(program)) = (probe.stdin.take(), &self.seccomp) {
            use std::io::Write as _;
            stdin.write_all(program)?;
        }
        Ok(probe.wait_with_output()?)
    }

    /// Whether the helper runs first (Landlock, or the allow-list's forwarder).
    fn helped(&self) -> bool {
        self.landlock || self.proxy.is_some()
    }

    /// What runs inside for `command`: itself, or the helper and then it.
    fn command(&self, command: &[String]) -> Vec<String> {
        if !self.helped() {
            return command.to_vec();
        }
        let mut writable = vec![self.policy.workspace.clone(), PathBuf::from("/tmp"), PathBuf::from("/dev")];
        writable.extend(self.policy.hidden.iter().filter(|h| h.exists()).cloned());
        let rules = landlock::Rules {
            writable,
            no_network: !self.policy.network,
            forward: self.proxy.as_ref().map(|_| PathBuf::from(netproxy::SOCKET_INSIDE)),
            no_landlock: !self.landlock,
        };
        let mut all = vec![HELPER_INSIDE.to_owned()];
        all.extend(rules.arguments(command));
        all
    }

    /// Whether commands run under Landlock.
    pub fn landlocked(&self) -> bool {
        self.landlock
    }

    /// Why Landlock is not applied though the policy asked for it, if so.
    pub fn landlock_unavailable(&self) -> Option<&str> {
        self.no_landlock.as_deref()
    }

    /// Why resource limits are not enforced on this host, if they are not.
    pub fn limits_unavailable(&self) -> Option<&str> {
        self.unlimited.as_deref()
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// bwrap's arguments up to the command, with `env` set besides the defaults. Later mounts
    /// cover earlier ones: the system read-only first, then the empty directories, then the
    /// workspace (which may lie in one of them).
    fn arguments(&self, cwd: &Path, env: &[(String, String)]) -> Vec<String> {
        self.arguments_reading_seccomp_from(cwd, env, 0)
    }

    /// [`Bwrap::arguments`] with the seccomp program read from descriptor `fd`.
    fn arguments_reading_seccomp_from(&self, cwd: &Path, env: &[(String, String)], fd: u8) -> Vec<String> {
        let mut a: Vec<String> = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        if let (true, Some(helper)) = (self.helped(), &self.policy.landlock) {
            a.extend(["--ro-bind".to_owned(), helper.display().to_string(), HELPER_INSIDE.to_owned()]);
        }
        if let Some(proxy) = &self.proxy {
            a.extend(["--bind".to_owned(), proxy.socket().display().to_string(), netproxy::SOCKET_INSIDE.to_owned()]);
        }
        for h in &self.policy.hidden {
            // A hidden directory may hold the workspace (it is bound again below), not lie in it.
            if h.exists() && !h.starts_with(&self.policy.workspace) {
                a.extend(["--tmpfs".to_owned(), h.display().to_string()]);
            }
        }
        for d in &self.policy.exposed {
            if d.exists() {
                let d = d.display().to_string();
                a.extend(["--ro-bind".to_owned(), d.clone(), d]);
            }
        }
        let ws = self.policy.workspace.display().to_string();
        a.extend(["--bind".to_owned(), ws.clone(), ws]);
        a.extend(
            ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session", "--clearenv"]
                .map(str::to_owned),
        );
        if self.seccomp.is_some() {
            // The program comes on bwrap's standard input (the command's is then at its end),
            // or, for a command that reads its input, on another descriptor.
            a.extend(["--seccomp".to_owned(), fd.to_string()]);
        }
        if self.policy.network {
            a.push("--share-net".to_owned());
        }
        for (k, v) in self.policy.command_env(env) {
            a.extend(["--setenv".to_owned(), k, v]);
        }
        a.extend(["--chdir".to_owned(), cwd.display().to_string(), "--".to_owned()]);
        a
    }
}

/// Names proxy sockets apart.
static PROXIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The allow-list proxy a policy needs (none when it allows no host or the whole network);
/// the helper program, which starts the forwarder inside, must be there.
fn proxy_for(policy: &Policy) -> Result<Option<std::sync::Arc<netproxy::Proxy>>> {
    if !policy.proxied() {
        return Ok(None);
    }
    if !policy.landlock.as_ref().is_some_and(|h| h.is_file()) {
        return Err(Error::Unavailable(
            "allowed hosts need the helper program in the sandbox (Policy::with_landlock)".into(),
        ));
    }
    let n = PROXIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let socket = std::env::temp_dir().join(format!("caret-proxy-{}-{n}.sock", std::process::id()));
    let proxy = netproxy::Proxy::start(&socket, policy.hosts.clone())
        .map_err(|e| Error::Unavailable(format!("starting the allowed-hosts proxy at {}: {e}", socket.display())))?;
    Ok(Some(std::sync::Arc::new(proxy)))
}

/// The command's working directory, real path, refused unless inside the workspace.
pub(crate) fn working_directory(policy: &Policy, spec: &Spec) -> Result<PathBuf> {
    let cwd = std::fs::canonicalize(&spec.cwd)
        .map_err(|e| Error::Refused(format!("working directory {}: {e}", spec.cwd.display())))?;
    if !cwd.starts_with(&policy.workspace) {
        return Err(Error::Refused(format!("working directory {} is outside the workspace", cwd.display())));
    }
    Ok(cwd)
}

/// A command that ended, or was killed at its deadline, and its output.
struct Finished {
    status: Option<std::process::ExitStatus>,
    timed_out: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    truncated: bool,
}

/// Waits for a started command (stdout and stderr piped) until the spec's deadline, reading
/// its output up to the limit; at the deadline `at_deadline` runs, then the child is killed.
async fn finish(
    mut child: tokio::process::Child,
    spec: &Spec,
    at_deadline: impl std::future::Future<Output = ()>,
) -> Result<Finished> {
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(Error::Unavailable("no pipes to the command".into()));
    };
    let (limit, live) = (spec.output_limit, spec.live.clone());
    let readers =
        tokio::spawn(async move { tokio::join!(read_capped(out, limit, live.clone()), read_capped(err, limit, live)) });
    let (status, timed_out) = match tokio::time::timeout(spec.timeout, child.wait()).await {
        Ok(status) => (Some(status?), false),
        Err(_) => {
            at_deadline.await;
            child.kill().await?;
            (None, true)
        }
    };
    let ((stdout, more_out), (stderr, more_err)) =
        readers.await.map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
    Ok(Finished { status, timed_out, stdout, stderr, truncated: more_out || more_err })
}

impl Finished {
    /// The command's [`Output`], started at `started`.
    fn output(self, oom_killed: bool, started: Instant) -> Output {
        Output {
            exit_code: self.status.and_then(|s| s.code()),
            stdout: String::from_utf8_lossy(&self.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&self.stderr).into_owned(),
            timed_out: self.timed_out,
            truncated: self.truncated,
            oom_killed,
            duration: started.elapsed(),
        }
    }
}

/// Reads a stream to its end, keeping at most `limit` bytes; `true` if more came.
async fn read_capped(mut r: impl AsyncRead + Unpin, limit: usize, live: Option<Live>) -> (Vec<u8>, bool) {
    let (mut kept, mut buf, mut more) = (Vec::new(), vec![0u8; 16 << 10], false);
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, more),
            Ok(n) => {
                let room = limit.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                if let Some(live) = &live {
                    live.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .extend_from_slice(&buf[..n.min(room)]);
                }
                more |= n > room;
            }
        }
    }
}

#[async_trait::async_trait]
impl Sandbox for Bwrap {
    fn name(&self) -> &'static str {
        "bwrap"
    }

    async fn run(&self, spec: &Spec) -> Result<Output> {
        let cwd = working_directory(&self.policy, spec)?;
        let mut args = self.arguments(&cwd, &spec.env);
        args.extend(self.command(&["bash".to_owned(), "-c".to_owned(), spec.command.clone()]));
        let group = if self.unlimited.is_none() { new_group(&self.policy.limits).ok() } else { None };
        let procs = group.as_ref().map(limits::Group::procs).unwrap_or_default();
        let mut command = if procs.is_empty() {
            tokio::process::Command::new(&self.program)
        } else {
            let mut c = tokio::process::Command::new("/bin/sh");
            c.args(["-c", JOIN, "caret-sandbox"]).args(&procs).arg("--").arg(&self.program);
            c
        };
        let started = Instant::now();
        let mut child = command
            .args(&args)
            .stdin(if self.seccomp.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        if let (Some(mut stdin), Some(program)) = (child.stdin.take(), self.seccomp.clone()) {
            stdin.write_all(&program).await?;
        }
        // bwrap's death takes the sandbox's PID namespace, and all in it, along.
        let done = finish(child, spec, async {}).await?;
        Ok(done.output(group.as_ref().is_some_and(limits::Group::oom_killed), started))
    }

    async fn spawn(&self, spec: &Spec) -> Result<Process> {
        let cwd = working_directory(&self.policy, spec)?;
        // Its input is its own: the seccomp program comes from a file on descriptor 3,
        // opened by the shell that becomes bwrap.
        let mut args = self.arguments_reading_seccomp_from(&cwd, &spec.env, 3);
        args.extend(self.command(&["bash".to_owned(), "-c".to_owned(), spec.command.clone()]));
        let seccomp = match &self.seccomp {
            Some(program) => {
                let n = SECCOMP_FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let path = std::env::temp_dir().join(format!("caret-seccomp-{}-{n}.bpf", std::process::id()));
                tokio::fs::write(&path, program.as_slice()).await?;
                Some(TempFile(path))
            }
            None => None,
        };
        let group = if self.unlimited.is_none() { new_group(&self.policy.limits).ok() } else { None };
        let procs = group.as_ref().map(limits::Group::procs).unwrap_or_default();
        let mut command = tokio::process::Command::new("/bin/sh");
        match &seccomp {
            Some(file) => command.args(["-c", &format!("exec 3<\"$1\"; shift; {JOIN}"), "caret-sandbox"]).arg(&file.0),
            None => command.args(["-c", JOIN, "caret-sandbox"]),
        };
        command.args(&procs).arg("--").arg(&self.program);
        let mut child = command
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(Error::Unavailable("no pipes to the command".into()));
        };
        Ok(Process { stdin, stdout, stderr, alive: Alive { child, _group: group, _seccomp: seccomp } })
    }
}

/// Names seccomp program files apart.
static SECCOMP_FILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
