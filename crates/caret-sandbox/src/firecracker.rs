//! The Firecracker backend: a sandbox is a microVM (its own kernel under KVM), booted once and
//! serving every command of its run.
//!
//! A VM gets three drives: its root, a small image made here holding the guest agent
//! ([`crate::guest`], with the shared libraries it needs) and its configuration; the
//! environment's base system, an ext4 image the operator provides (the distribution and
//! toolchains commands need), attached read-only and shared by every VM; and the workspace, an
//! ext4 image made from the prepared tree (the checkout after install) with room to grow. No
//! network device: commands reach allowed hosts through the host's proxy over vsock
//! ([`crate::netproxy`]), and nothing else.
//!
//! Firecracker shares no filesystem with the host, so the workspace lives twice and is kept in
//! step around each command ([`crate::mirror`]): the host's edits (the agent's file tools)
//! go in before the command, the command's changes come back after it. [`GuestLink`] is that
//! half — a sandbox whose commands run in a guest that dials in — and [`Firecracker`] boots the
//! VM behind it.
//!
//! Needs: a KVM host (`/dev/kvm` readable and writable), the `firecracker` binary, an
//! uncompressed guest kernel with virtio-blk, vsock, ext4 and overlayfs built in, the base
//! image, `mkfs.ext4` (e2fsprogs) and `ldd`. Where any is missing, [`Firecracker::new`] says
//! which.

use std::collections::VecDeque;
use std::io::{BufReader, Read as _, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::guest::{GuestConfig, Request, RunReply, UsageReply, read_frame, write_frame};
use crate::{Error, Output, Policy, Result, Sandbox, Spec, mirror, netproxy, working_directory};

/// Connections from the guest, waiting to be used.
#[derive(Debug, Default)]
struct Pool {
    idle: Mutex<VecDeque<UnixStream>>,
    arrived: Condvar,
    stop: AtomicBool,
}

impl Pool {
    /// The next idle connection, waiting up to `within`.
    fn take(&self, within: Duration) -> Option<UnixStream> {
        let until = Instant::now() + within;
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            if let Some(c) = idle.pop_front() {
                return Some(c);
            }
            let left = until.checked_duration_since(Instant::now())?;
            idle = self.arrived.wait_timeout(idle, left).unwrap_or_else(std::sync::PoisonError::into_inner).0;
        }
    }

    /// Whether a connection has arrived.
    fn any(&self) -> bool {
        !self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_empty()
    }
}

/// A sandbox whose commands run in a guest that dials in (the microVM's agent), the workspace
/// mirrored around each command.
#[derive(Debug)]
pub struct GuestLink {
    policy: Policy,
    socket: PathBuf,
    pool: Arc<Pool>,
    /// The host's workspace as of the last exchange.
    seen: Arc<Mutex<mirror::Manifest>>,
}

impl GuestLink {
    /// Listens on `socket` for a guest serving a copy of `policy`'s workspace as it is now.
    pub fn listen(policy: Policy, socket: &Path) -> Result<GuestLink> {
        let seen = mirror::scan(&policy.workspace)?;
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)?;
        let pool = Arc::new(Pool::default());
        let bg = pool.clone();
        std::thread::Builder::new().name("caret-guest-accept".into()).spawn(move || {
            for conn in listener.incoming() {
                if bg.stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                bg.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push_back(conn);
                bg.arrived.notify_one();
            }
        })?;
        Ok(GuestLink { policy, socket: socket.to_owned(), pool, seen: Arc::new(Mutex::new(seen)) })
    }

    /// Waits until the guest has dialled in.
    pub fn wait_ready(&self, within: Duration, mut alive: impl FnMut() -> Result<()>) -> Result<()> {
        let until = Instant::now() + within;
        while !self.pool.any() {
            alive()?;
            if Instant::now() >= until {
                return Err(Error::Unavailable(format!("the guest did not dial in within {within:?}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

impl Drop for GuestLink {
    fn drop(&mut self) {
        self.pool.stop.store(true, Ordering::Release);
        let _ = UnixStream::connect(&self.socket);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Shuts a connection down when dropped (a dropped command's guest side sees the hang-up
/// and kills the command).
struct HangUp(UnixStream);

impl Drop for HangUp {
    fn drop(&mut self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

/// One command's exchange: the host's changes and the request out, output and the guest's
/// changes in.
fn exchange(
    conn: UnixStream,
    workspace: &Path,
    seen: &Mutex<mirror::Manifest>,
    request: &Request,
    spec_timeout: Duration,
    live: Option<&crate::Live>,
) -> Result<RunReply> {
    conn.set_read_timeout(Some(spec_timeout + Duration::from_secs(60)))?;
    {
        let mut seen = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = mirror::scan(workspace)?;
        let changes = mirror::diff(&seen, &now);
        let mut w = std::io::BufWriter::new(&conn);
        write_frame(&mut w, b'Q', &serde_json::to_vec(request).map_err(std::io::Error::other)?)?;
        mirror::send(&mut w, workspace, &changes)?;
        w.flush()?;
        *seen = now;
    }
    let mut r = BufReader::new(&conn);
    let reply: RunReply = loop {
        match read_frame(&mut r)? {
            (b'O', chunk) => {
                if let Some(live) = live {
                    live.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(&chunk);
                }
            }
            (b'R', body) => break serde_json::from_slice(&body).map_err(std::io::Error::other)?,
            (tag, _) => return Err(Error::Unavailable(format!("the guest answered an unknown frame {tag:#x}"))),
        }
    };
    let mut seen = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    mirror::receive(&mut r, workspace, &mut seen)?;
    Ok(reply)
}

#[async_trait::async_trait]
impl Sandbox for GuestLink {
    fn name(&self) -> &'static str {
        "guest"
    }

    async fn usage(&self) -> Option<crate::usage::Usage> {
        let pool = self.pool.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = pool.take(Duration::from_secs(2))?;
            conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            write_frame(&mut conn, b'Q', &serde_json::to_vec(&Request::Usage).ok()?).ok()?;
            let (_, body) = read_frame(&mut conn).ok()?;
            let u: UsageReply = serde_json::from_slice(&body).ok()?;
            Some(crate::usage::Usage { processes: u.processes, memory_bytes: u.memory_bytes, cpu_ms: u.cpu_ms })
        })
        .await
        .ok()
        .flatten()
    }

    async fn run(&self, spec: &Spec) -> Result<Output> {
        let cwd = working_directory(&self.policy, spec)?;
        let rel = cwd.strip_prefix(&self.policy.workspace).unwrap_or(Path::new("")).to_str().map(str::to_owned);
        let Some(rel) = rel else {
            return Err(Error::Refused(format!("working directory {} is not UTF-8", cwd.display())));
        };
        let request = Request::Run {
            command: spec.command.clone(),
            cwd: rel,
            env: self.policy.command_env(&spec.env),
            timeout_ms: u64::try_from(spec.timeout.as_millis()).unwrap_or(u64::MAX),
            output_limit: spec.output_limit,
        };
        let started = Instant::now();
        let pool = self.pool.clone();
        let conn = tokio::task::spawn_blocking(move || pool.take(Duration::from_secs(30)))
            .await
            .map_err(Error::Task)?
            .ok_or_else(|| Error::Unavailable("the guest has not dialled in for 30 s (is the VM alive?)".into()))?;
        let _hang_up = HangUp(conn.try_clone()?);
        let (ws, seen, live, timeout) =
            (self.policy.workspace.clone(), self.seen.clone(), spec.live.clone(), spec.timeout);
        let reply = tokio::task::spawn_blocking(move || exchange(conn, &ws, &seen, &request, timeout, live.as_ref()))
            .await
            .map_err(Error::Task)??;
        if let Some(why) = reply.error {
            return Err(Error::Unavailable(format!("the guest could not run the command: {why}")));
        }
        Ok(Output {
            exit_code: reply.exit_code,
            stdout: reply.stdout,
            stderr: reply.stderr,
            timed_out: reply.timed_out,
            truncated: reply.truncated,
            oom_killed: false,
            duration: started.elapsed(),
        })
    }
}

/// Where the VMs come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The `firecracker` binary.
    pub firecracker: PathBuf,
    /// The guest kernel (uncompressed `vmlinux`).
    pub kernel: PathBuf,
    /// The base system: an ext4 image with the distribution and toolchains commands need.
    pub rootfs: PathBuf,
    /// The guest agent (`caret-guest`).
    pub guest: PathBuf,
    /// Room for the workspace to grow, bytes.
    pub disk_bytes: u64,
    /// How long a VM may take to boot and dial in.
    pub boot_timeout: Duration,
}

impl Config {
    /// `kernel` and `rootfs`, `firecracker` from the usual places, the guest agent beside this
    /// program, 8 GiB of room, 30 s to boot.
    pub fn new(kernel: PathBuf, rootfs: PathBuf) -> Config {
        let firecracker = ["/usr/local/bin/firecracker", "/usr/bin/firecracker"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("/usr/local/bin/firecracker"));
        let guest = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("caret-guest")))
            .unwrap_or_else(|| PathBuf::from("caret-guest"));
        Config { firecracker, kernel, rootfs, guest, disk_bytes: 8 << 30, boot_timeout: Duration::from_secs(30) }
    }

    /// Why VMs cannot start here, if they cannot: KVM, the files, the tools.
    pub fn check(&self) -> Result<()> {
        if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
            return Err(Error::Device { what: "Firecracker needs KVM: opening /dev/kvm", source: e });
        }
        for (what, path) in [
            ("the firecracker binary", &self.firecracker),
            ("the guest kernel", &self.kernel),
            ("the base system image", &self.rootfs),
            ("the guest agent (cargo build --release -p caret-sandbox --bin caret-guest)", &self.guest),
        ] {
            if !path.is_file() {
                return Err(Error::Unavailable(format!("Firecracker: {what} is not at {}", path.display())));
            }
        }
        crate::installed(&["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"], "mkfs.ext4", "e2fsprogs")?;
        crate::installed(&["/usr/bin/ldd", "/bin/ldd"], "ldd", "libc-bin")?;
        Ok(())
    }
}

/// Names VM directories apart.
static VMS: AtomicU64 = AtomicU64::new(0);

/// The Firecracker backend: a microVM per sandbox.
#[derive(Debug)]
pub struct Firecracker {
    link: GuestLink,
    vm: Mutex<std::process::Child>,
    dir: PathBuf,
    _proxy: Option<Arc<netproxy::Proxy>>,
}

impl Firecracker {
    /// Boots a microVM for `policy`'s workspace as it is now, and waits for its agent.
    pub fn new(policy: Policy, config: &Config) -> Result<Firecracker> {
        config.check()?;
        let n = VMS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("caret-fc-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let booted = boot(policy, config, &dir);
        if booted.is_err() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        booted
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.link.policy
    }
}

fn boot(policy: Policy, config: &Config, dir: &Path) -> Result<Firecracker> {
    // The root drive: the agent, its libraries, its configuration, the mount points.
    let stage = dir.join("root.d");
    for d in ["caret", "proc", "sys", "dev", "tmp", "base", "ws", "newroot", "skel/tmp", "skel/proc", "skel/dev"] {
        std::fs::create_dir_all(stage.join(d))?;
    }
    for d in std::iter::once(&policy.workspace).chain(&policy.hidden) {
        std::fs::create_dir_all(stage.join("skel").join(d.strip_prefix("/").unwrap_or(d)))?;
    }
    let agent = stage.join("caret/caret-guest");
    std::fs::copy(&config.guest, &agent)?;
    for lib in libraries(&config.guest)? {
        let to = stage.join(lib.strip_prefix("/").unwrap_or(&lib));
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(&lib, &to)?;
    }
    let guest =
        GuestConfig { workspace: policy.workspace.clone(), hidden: policy.hidden.clone(), proxy: policy.proxied() };
    std::fs::write(stage.join("caret/guest.json"), serde_json::to_vec(&guest).map_err(std::io::Error::other)?)?;
    let staged: u64 = mirror::scan(&stage)?.values().map(entry_bytes).sum();
    mkfs(&stage, &dir.join("root.ext4"), staged + (64 << 20), "caret-root")?;
    let _ = std::fs::remove_dir_all(&stage);

    // The workspace drive, from the prepared tree (the link's first view of it comes first:
    // anything changed meanwhile goes over at the first command).
    let link = GuestLink::listen(policy, &dir.join(format!("v.sock_{}", crate::guest::PORT)))?;
    let tree: u64 = link.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().map(entry_bytes).sum();
    mkfs(
        &link.policy.workspace,
        &dir.join("ws.ext4"),
        tree + tree / 8 + (64 << 20) + config.disk_bytes,
        crate::guest::WORKSPACE_LABEL,
    )?;
    let proxy = if link.policy.proxied() {
        let socket = dir.join(format!("v.sock_{}", netproxy::PORT));
        Some(Arc::new(netproxy::Proxy::start(&socket, link.policy.hosts.clone())?))
    } else {
        None
    };

    let console = dir.join("console.log");
    let api = dir.join("api.sock");
    let log = std::fs::File::create(&console)?;
    let mut vm = std::process::Command::new(&config.firecracker)
        .arg("--api-sock")
        .arg(&api)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let failed = |vm: &mut std::process::Child, why: String| -> Error {
        let _ = vm.kill();
        let _ = vm.wait();
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect();
        Error::Unavailable(format!("{why}; the VM's console ends:\n{}", tail.join("\n")))
    };
    let until = Instant::now() + Duration::from_secs(5);
    while !api.exists() {
        if let Ok(Some(status)) = vm.try_wait() {
            return Err(failed(&mut vm, format!("firecracker exited at start ({status})")));
        }
        if Instant::now() >= until {
            return Err(failed(&mut vm, "firecracker did not open its API socket".into()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let limits = link.policy.limits;
    let vcpus = limits.cpus.map_or(2, |c| c.ceil().clamp(1.0, 32.0) as u32);
    let memory_mib = limits.memory_bytes.map_or(2048, |m| (m >> 20).max(128));
    let boot_args =
        "console=ttyS0 reboot=k panic=1 pci=off quiet root=/dev/vda rw rootfstype=ext4 init=/caret/caret-guest";
    let drive = |id: &str, path: &Path, root: bool, read_only: bool| json!({"drive_id": id, "path_on_host": path, "is_root_device": root, "is_read_only": read_only});
    let calls = [
        ("/machine-config", json!({"vcpu_count": vcpus, "mem_size_mib": memory_mib})),
        ("/boot-source", json!({"kernel_image_path": config.kernel, "boot_args": boot_args})),
        ("/drives/root", drive("root", &dir.join("root.ext4"), true, false)),
        ("/drives/base", drive("base", &config.rootfs, false, true)),
        ("/drives/ws", drive("ws", &dir.join("ws.ext4"), false, false)),
        ("/vsock", json!({"guest_cid": 3, "uds_path": dir.join("v.sock")})),
        ("/actions", json!({"action_type": "InstanceStart"})),
    ];
    for (path, body) in calls {
        if let Err(e) = put(&api, path, &body) {
            return Err(failed(&mut vm, e.to_string()));
        }
    }
    let ready = link.wait_ready(config.boot_timeout, || match vm.try_wait() {
        Ok(Some(status)) => Err(Error::Unavailable(format!("the VM stopped while booting ({status})"))),
        _ => Ok(()),
    });
    if let Err(e) = ready {
        return Err(failed(&mut vm, e.to_string()));
    }
    Ok(Firecracker { link, vm: Mutex::new(vm), dir: dir.to_owned(), _proxy: proxy })
}

/// Bytes an entry takes in an image, roughly (a block per directory and link).
fn entry_bytes(e: &mirror::Entry) -> u64 {
    match e {
        mirror::Entry::File { size, .. } => size.div_ceil(4096) * 4096 + 256,
        _ => 4096,
    }
}

/// An ext4 image of `bytes` (sparse) holding `source`'s tree.
fn mkfs(source: &Path, image: &Path, bytes: u64, label: &str) -> Result<()> {
    std::fs::File::create(image)?.set_len(bytes)?;
    let mkfs = crate::installed(&["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"], "mkfs.ext4", "e2fsprogs")?;
    let out = std::process::Command::new(mkfs)
        .args(["-q", "-F", "-L", label, "-d"])
        .arg(source)
        .arg(image)
        .stdin(std::process::Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(Error::Unavailable(format!(
            "making the {label} image from {}: {}",
            source.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The shared libraries (and loader) a binary needs, as `ldd` lists them.
fn libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = std::process::Command::new("ldd").arg(binary).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            let path = match l.split_once("=>") {
                Some((_, after)) => after.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// `PUT path` with a JSON body on Firecracker's API socket; an error unless it answers 2xx.
fn put(api: &Path, path: &str, body: &serde_json::Value) -> Result<()> {
    let mut s = UnixStream::connect(api)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let body = body.to_string();
    write!(
        s,
        "PUT {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut r = BufReader::new(s);
    let mut head = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut r, &mut line)? == 0 {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
        if head.is_empty() {
            head = line.trim().to_owned();
        }
    }
    let mut answer = vec![0u8; length.min(1 << 20)];
    r.read_exact(&mut answer)?;
    let status: u16 = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    if !(200..300).contains(&status) {
        return Err(Error::Unavailable(format!(
            "firecracker refused PUT {path}: {head} {}",
            String::from_utf8_lossy(&answer).trim()
        )));
    }
    Ok(())
}

impl Drop for Firecracker {
    fn drop(&mut self) {
        let vm = self.vm.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = vm.kill();
        let _ = vm.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[async_trait::async_trait]
impl Sandbox for Firecracker {
    fn name(&self) -> &'static str {
        "firecracker"
    }

    async fn usage(&self) -> Option<crate::usage::Usage> {
        self.link.usage().await
    }

    async fn run(&self, spec: &Spec) -> Result<Output> {
        self.link.run(spec).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The root drive's pieces: a binary's loader and libraries are found, and an image made
    /// from a tree holds that tree under its label.
    #[test]
    fn images_hold_their_tree_and_binaries_their_libraries() {
        let libs = libraries(Path::new("/bin/bash")).unwrap();
        assert!(libs.iter().any(|l| l.to_string_lossy().contains("libc.so")), "{libs:?}");
        assert!(libs.iter().any(|l| l.to_string_lossy().contains("ld-linux")), "{libs:?}");
        let (tree, out) = (caret_test_support::TempDir::new(), caret_test_support::TempDir::new());
        tree.write("caret/guest.json", "{}");
        tree.write("skel/work/space/.keep", "");
        let image = out.join("root.ext4");
        mkfs(tree.path(), &image, 16 << 20, "caret-test").unwrap();
        let ls = std::process::Command::new("debugfs").args(["-R", "ls -p /caret"]).arg(&image).output().unwrap();
        assert!(String::from_utf8_lossy(&ls.stdout).contains("guest.json"), "{ls:?}");
        let label = std::process::Command::new("e2label").arg(&image).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&label.stdout).trim(), "caret-test");
        // A tree that does not fit is an error that says which image.
        let big = caret_test_support::TempDir::new();
        std::fs::write(big.join("blob"), vec![7u8; 8 << 20]).unwrap();
        let err = mkfs(big.path(), &out.join("small.ext4"), 4 << 20, "caret-small").unwrap_err();
        assert!(err.to_string().contains("caret-small"), "{err}");
    }
}
