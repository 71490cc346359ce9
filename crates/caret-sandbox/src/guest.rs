//! The guest agent of the Firecracker backend ([`crate::firecracker`]): the program that runs
//! inside the microVM (as its init), keeps the VM's copy of the workspace in step with the
//! host's ([`crate::mirror`]) and runs the host's commands.
//!
//! It dials the host over vsock (Firecracker passes a guest's connection to host port `P` to
//! the Unix socket `{vsock path}_P`), so that the host only ever accepts: one connection waits
//! idle for a request, and a new one is dialled as soon as a request arrives, so commands can
//! run side by side. A connection carries one request:
//!
//! ```text
//! host → guest   Q {"op":"run",...}   change set (the host's edits since the last exchange)
//! guest → host   O bytes ...          (live output, as it comes)
//!                R {"exit_code":...}  change set (what the command changed)
//! ```
//!
//! Frames are a tag byte, a `u32` length and that many bytes. A host that hangs up mid-command
//! cancels it (its process group is killed).
//!
//! As init it mounts `/proc`, `/sys`, `/dev`, `/tmp`; mounts the environment's base system
//! (a read-only drive) and the workspace drive; builds the commands' root — the base system
//! read-only, the workspace at its host path, empty `/tmp` and home, `/proc` and `/dev` — and
//! starts itself again as the server chrooted into that root, reaping orphans meanwhile.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::mirror;

/// The vsock port of command connections (the host listens on `{vsock path}_52`).
pub const PORT: u32 = 52;

/// The host's vsock address.
const HOST_CID: u32 = 2;

/// Where the guest's configuration lies on its own drive.
pub const CONFIG_PATH: &str = "/caret/guest.json";

/// The label of the workspace drive (the base system's drive is the other one).
pub const WORKSPACE_LABEL: &str = "caret-ws";

/// Where init builds the commands' root.
const NEW_ROOT: &str = "/newroot";

/// Longest frame accepted (a JSON message or a chunk of output).
const FRAME_LIMIT: u32 = 64 << 20;

/// What the host tells the guest at boot (written to [`CONFIG_PATH`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GuestConfig {
    /// The workspace's path, the same as on the host.
    pub workspace: PathBuf,
    /// Directories shown empty (the user's home).
    pub hidden: Vec<PathBuf>,
    /// Whether commands reach allowed hosts through the host's proxy (the forwarder listens
    /// on `127.0.0.1:`[`crate::netproxy::PORT`]).
    pub proxy: bool,
}

/// A request of the host.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Request {
    /// What the VM uses now.
    Usage,
    /// Run a command (a change set follows).
    Run {
        command: String,
        /// Relative to the workspace.
        cwd: String,
        env: Vec<(String, String)>,
        timeout_ms: u64,
        output_limit: usize,
    },
}

/// How a command ended (a change set follows).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct RunReply {
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub truncated: bool,
    pub stdout: String,
    pub stderr: String,
    pub duration_ms: u64,
    /// The guest could not run it.
    pub error: Option<String>,
}

/// What the VM uses.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub(crate) struct UsageReply {
    pub processes: u32,
    pub memory_bytes: u64,
    pub cpu_ms: u64,
}

/// Writes one frame.
pub(crate) fn write_frame(w: &mut impl Write, tag: u8, body: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(body.len()).map_err(std::io::Error::other)?;
    let mut head = [0u8; 5];
    head[0] = tag;
    head[1..].copy_from_slice(&len.to_le_bytes());
    w.write_all(&head)?;
    w.write_all(body)
}

/// Reads one frame.
pub(crate) fn read_frame(r: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > FRAME_LIMIT {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "frame too long"));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    Ok((head[0], body))
}

/// How the guest reaches the host.
#[derive(Debug, Clone)]
pub enum Dial {
    /// Over vsock, to the host's `port` (in the microVM).
    Vsock(u32),
    /// Over a Unix socket (the agent run on the host, for tests).
    Unix(PathBuf),
}

impl Dial {
    fn connect(&self) -> std::io::Result<UnixStream> {
        match self {
            Dial::Unix(path) => UnixStream::connect(path),
            Dial::Vsock(port) => {
                use nix::sys::socket::{AddressFamily, SockFlag, SockType, VsockAddr, connect, socket};
                use std::os::fd::AsRawFd as _;
                let fd = socket(AddressFamily::Vsock, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
                connect(fd.as_raw_fd(), &VsockAddr::new(HOST_CID, *port))?;
                // Reads and writes on a connected stream socket are the same for any family.
                Ok(UnixStream::from(fd))
            }
        }
    }
}

/// The command server.
#[derive(Debug)]
pub struct Guest {
    root: PathBuf,
    dial: Dial,
    /// The workspace as of the last exchange.
    seen: Mutex<mirror::Manifest>,
}

impl Guest {
    /// Serves the workspace copy at `root`, dialling the host with `dial`.
    pub fn new(root: &Path, dial: Dial) -> std::io::Result<Guest> {
        let seen = mirror::scan(root)?;
        Ok(Guest { root: root.to_owned(), dial, seen: Mutex::new(seen) })
    }

    /// Serves until the host is gone: one connection always waits for the next request.
    pub fn serve(self: Arc<Self>) -> std::io::Result<()> {
        let mut failures = 0u32;
        loop {
            let mut conn = match self.dial.connect() {
                Ok(c) => {
                    failures = 0;
                    c
                }
                Err(e) => {
                    failures += 1;
                    // The host stopped listening: its sandbox is gone.
                    if failures > 50 {
                        return Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let Ok((b'Q', body)) = read_frame(&mut conn) else { continue };
            let me = self.clone();
            std::thread::spawn(move || {
                let _ = me.answer(conn, &body);
            });
        }
    }

    fn answer(&self, mut conn: UnixStream, body: &[u8]) -> std::io::Result<()> {
        let request: Request = serde_json::from_slice(body).map_err(std::io::Error::other)?;
        match request {
            Request::Usage => {
                let reply = serde_json::to_vec(&usage()).map_err(std::io::Error::other)?;
                write_frame(&mut conn, b'A', &reply)
            }
            Request::Run { command, cwd, env, timeout_ms, output_limit } => {
                let received = {
                    let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    mirror::receive(&mut conn, &self.root, &mut seen)
                };
                let reply = match received {
                    Err(e) => RunReply {
                        error: Some(format!("receiving the workspace's changes: {e}")),
                        ..RunReply::default()
                    },
                    Ok(()) => {
                        let spec = Job {
                            command,
                            cwd: self.root.join(cwd),
                            env,
                            timeout: Duration::from_millis(timeout_ms),
                            output_limit,
                        };
                        run(&spec, &mut conn)
                    }
                };
                let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let now = mirror::scan(&self.root)?;
                let changes = mirror::diff(&seen, &now);
                write_frame(&mut conn, b'R', &serde_json::to_vec(&reply).map_err(std::io::Error::other)?)?;
                let mut w = std::io::BufWriter::new(&mut conn);
                mirror::send(&mut w, &self.root, &changes)?;
                w.flush()?;
                *seen = now;
                Ok(())
            }
        }
    }
}

/// A command as the guest runs it.
struct Job {
    command: String,
    cwd: PathBuf,
    env: Vec<(String, String)>,
    timeout: Duration,
    output_limit: usize,
}

/// Runs a command, sending its output as it comes; killed (its process group) at the deadline
/// or when the host hangs up.
fn run(job: &Job, conn: &mut UnixStream) -> RunReply {
    use std::os::unix::process::CommandExt as _;
    let started = Instant::now();
    let child = std::process::Command::new("/bin/bash")
        .arg("-c")
        .arg(&job.command)
        .env_clear()
        .envs(job.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&job.cwd)
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return RunReply {
                error: Some(format!("starting bash in {}: {e}", job.cwd.display())),
                ..RunReply::default()
            };
        }
    };
    let group = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let (tx, rx) = std::sync::mpsc::channel::<(bool, Vec<u8>)>();
    for (err, stream) in [
        (false, child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>)),
        (true, child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>)),
    ] {
        let (Some(mut stream), tx) = (stream, tx.clone()) else { continue };
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16 << 10];
            while let Ok(n @ 1..) = stream.read(&mut buf) {
                if tx.send((err, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    // The host hanging up cancels the command.
    let gone = Arc::new(AtomicBool::new(false));
    if let Ok(mut watch) = conn.try_clone() {
        let gone = gone.clone();
        std::thread::spawn(move || {
            let mut b = [0u8; 1];
            if matches!(watch.read(&mut b), Ok(0) | Err(_)) {
                gone.store(true, Ordering::Release);
            }
        });
    }
    let (mut out, mut err, mut truncated, mut timed_out) = (Vec::new(), Vec::new(), false, false);
    let mut exited: Option<std::process::ExitStatus> = None;
    let mut ended_at: Option<Instant> = None;
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok((is_err, chunk)) => {
                let kept = if is_err { &mut err } else { &mut out };
                let room = job.output_limit.saturating_sub(kept.len());
                let take = chunk.len().min(room);
                truncated |= take < chunk.len();
                kept.extend_from_slice(&chunk[..take]);
                if take > 0 && write_frame(conn, b'O', &chunk[..take]).is_err() {
                    gone.store(true, Ordering::Release);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) if exited.is_some() => break,
            Err(_) => {}
        }
        if exited.is_none() {
            if let Ok(Some(status)) = child.try_wait() {
                exited = Some(status);
                ended_at = Some(Instant::now());
                // What it left running in its group goes with it (so the pipes close).
                let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            } else if started.elapsed() >= job.timeout || gone.load(Ordering::Acquire) {
                timed_out = !gone.load(Ordering::Acquire);
                let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                let _ = child.kill();
                exited = child.wait().ok();
                ended_at = Some(Instant::now());
            }
        } else if ended_at.is_some_and(|t| t.elapsed() > Duration::from_secs(1)) {
            // A process outside the group still holds the pipes: stop waiting for them.
            break;
        }
    }
    // A signal's end (the deadline's included) has no exit code.
    let exit_code = if timed_out { None } else { exited.and_then(|s| s.code()) };
    RunReply {
        exit_code,
        timed_out,
        truncated,
        stdout: String::from_utf8_lossy(&out).into_owned(),
        stderr: String::from_utf8_lossy(&err).into_owned(),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        error: None,
    }
}

/// The VM's use: all its processes (memory in use, CPU time since boot).
fn usage() -> UsageReply {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    let memory_bytes = field("MemTotal:").saturating_sub(field("MemAvailable:")) * 1024;
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: u64 = stat
        .lines()
        .next()
        .map(|l| l.split_whitespace().skip(1).take(3).filter_map(|v| v.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    let processes = std::fs::read_dir("/proc")
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit())).count())
        .unwrap_or(0);
    UsageReply { processes: u32::try_from(processes).unwrap_or(u32::MAX), memory_bytes, cpu_ms: ticks * 10 }
}

/// Passes each connection to `127.0.0.1:PORT` in the VM to the host's proxy (vsock port
/// [`crate::netproxy::PORT`]).
fn forward_to_host_proxy() -> std::io::Result<()> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", crate::netproxy::PORT))?;
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                if let Ok(up) = Dial::Vsock(u32::from(crate::netproxy::PORT)).connect() {
                    crate::netproxy::splice(conn, up);
                }
            });
        }
    });
    Ok(())
}

/// Brings the loopback interface up (an `RTM_NEWLINK` over netlink: index 1, `IFF_UP`).
fn loopback_up() -> std::io::Result<()> {
    use nix::sys::socket::{
        AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, socket,
    };
    use std::os::fd::AsRawFd as _;
    let fd = socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkRoute)?;
    let mut msg = Vec::with_capacity(32);
    msg.extend_from_slice(&32u32.to_ne_bytes()); // nlmsg_len
    msg.extend_from_slice(&16u16.to_ne_bytes()); // RTM_NEWLINK
    msg.extend_from_slice(&(1u16 | 4).to_ne_bytes()); // NLM_F_REQUEST | NLM_F_ACK
    msg.extend_from_slice(&1u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // pid
    msg.extend_from_slice(&[0, 0, 0, 0]); // family, pad, type
    msg.extend_from_slice(&1i32.to_ne_bytes()); // ifindex of lo
    msg.extend_from_slice(&1u32.to_ne_bytes()); // flags: IFF_UP
    msg.extend_from_slice(&1u32.to_ne_bytes()); // change: IFF_UP
    sendto(fd.as_raw_fd(), &msg, &NetlinkAddr::new(0, 0), MsgFlags::empty())?;
    let mut ack = [0u8; 256];
    let n = recv(fd.as_raw_fd(), &mut ack, MsgFlags::empty())?;
    // An NLMSG_ERROR whose error is 0 is the acknowledgement.
    if n >= 20 {
        let error = i32::from_ne_bytes([ack[16], ack[17], ack[18], ack[19]]);
        if error != 0 {
            return Err(std::io::Error::from_raw_os_error(-error));
        }
    }
    Ok(())
}

/// The volume label of an ext4 device (its superblock's, at byte 1024 + 0x78).
fn label(device: &Path) -> Option<String> {
    use std::io::Seek as _;
    let mut f = std::fs::File::open(device).ok()?;
    f.seek(std::io::SeekFrom::Start(1024 + 0x78)).ok()?;
    let mut name = [0u8; 16];
    f.read_exact(&mut name).ok()?;
    Some(String::from_utf8_lossy(&name).trim_end_matches('\0').to_owned())
}

/// Init in the microVM: mounts, builds the commands' root, starts the server (this program
/// again, `--serve`) and reaps orphans; powers the VM off when the server ends.
pub fn init_main() -> ! {
    if let Err(e) = init() {
        eprintln!("caret-guest: {e}");
    }
    let _ = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_POWER_OFF);
    std::process::exit(1);
}

fn init() -> std::io::Result<()> {
    use nix::mount::{MsFlags, mount};
    let none: Option<&str> = None;
    let fs = |what: &str, at: &str, flags: MsFlags| -> std::io::Result<()> {
        std::fs::create_dir_all(at)?;
        mount(Some(what), at, Some(what), flags, none)
            .map_err(|e| std::io::Error::other(format!("mounting {what} at {at}: {e}")))
    };
    fs("proc", "/proc", MsFlags::empty())?;
    fs("sysfs", "/sys", MsFlags::empty())?;
    // The kernel may have mounted /dev already.
    let _ = fs("devtmpfs", "/dev", MsFlags::empty());
    fs("tmpfs", "/tmp", MsFlags::empty())?;
    let config: GuestConfig = serde_json::from_slice(&std::fs::read(CONFIG_PATH)?).map_err(std::io::Error::other)?;
    // The drives besides the root: the workspace (by its label) and the base system.
    let (mut base, mut ws) = (None, None);
    for letter in b'b'..=b'z' {
        let dev = PathBuf::from(format!("/dev/vd{}", letter as char));
        if !dev.exists() {
            break;
        }
        if label(&dev).as_deref() == Some(WORKSPACE_LABEL) { ws = Some(dev) } else { base = Some(dev) }
    }
    let (Some(base), Some(ws)) = (base, ws) else {
        return Err(std::io::Error::other("the base system's drive or the workspace's is missing"));
    };
    let ext4 = |dev: &Path, at: &str, flags: MsFlags| -> std::io::Result<()> {
        std::fs::create_dir_all(at)?;
        mount(Some(dev), at, Some("ext4"), flags, none)
            .map_err(|e| std::io::Error::other(format!("mounting {} at {at}: {e}", dev.display())))
    };
    ext4(&base, "/base", MsFlags::MS_RDONLY)?;
    ext4(&ws, "/ws", MsFlags::empty())?;
    // The commands' root: the base system read-only, with the skeleton's mount points.
    std::fs::create_dir_all(NEW_ROOT)?;
    mount(Some("overlay"), NEW_ROOT, Some("overlay"), MsFlags::MS_RDONLY, Some("lowerdir=/skel:/base"))
        .map_err(|e| std::io::Error::other(format!("the commands' root needs overlayfs in the guest kernel: {e}")))?;
    let inside = |p: &Path| PathBuf::from(NEW_ROOT).join(p.strip_prefix("/").unwrap_or(p));
    let bind = |from: &Path, to: &Path| {
        mount(Some(from), to, none, MsFlags::MS_BIND | MsFlags::MS_REC, none)
            .map_err(|e| std::io::Error::other(format!("binding {} at {}: {e}", from.display(), to.display())))
    };
    bind(Path::new("/ws"), &inside(&config.workspace))?;
    bind(Path::new("/dev"), &inside(Path::new("/dev")))?;
    mount(Some("proc"), &inside(Path::new("/proc")), Some("proc"), MsFlags::empty(), none)
        .map_err(std::io::Error::other)?;
    for dir in std::iter::once(PathBuf::from("/tmp")).chain(config.hidden.iter().cloned()) {
        mount(Some("tmpfs"), &inside(&dir), Some("tmpfs"), MsFlags::empty(), none).map_err(std::io::Error::other)?;
    }
    loopback_up()?;
    let mut server = std::process::Command::new(std::env::current_exe()?).arg("--serve").spawn()?;
    let server_pid = nix::unistd::Pid::from_raw(i32::try_from(server.id()).unwrap_or(i32::MAX));
    // Orphans come to init; the server's end ends the VM.
    loop {
        match nix::sys::wait::wait() {
            Ok(status) if status.pid() == Some(server_pid) => {
                let _ = server.try_wait();
                return Err(std::io::Error::other(format!("the server ended: {status:?}")));
            }
            Ok(_) => {}
            Err(nix::errno::Errno::ECHILD) => std::thread::sleep(Duration::from_millis(100)),
            Err(_) => {}
        }
    }
}

/// The server in the microVM: chrooted into the commands' root, serving the workspace.
pub fn serve_main() -> std::io::Result<()> {
    let config: GuestConfig = serde_json::from_slice(&std::fs::read(CONFIG_PATH)?).map_err(std::io::Error::other)?;
    nix::unistd::chroot(NEW_ROOT)?;
    std::env::set_current_dir("/")?;
    if config.proxy {
        forward_to_host_proxy()?;
    }
    Arc::new(Guest::new(&config.workspace, Dial::Vsock(PORT))?).serve()
}
