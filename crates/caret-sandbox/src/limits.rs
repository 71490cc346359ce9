//! What a sandboxed command may use: CPU, memory and process limits through cgroups, and a
//! seccomp filter of system calls it never needs.
//!
//! **cgroups.** Each command gets its own group, created before it starts and removed after
//! it ends. Hosts differ: a pure cgroup v2 host has one hierarchy at `/sys/fs/cgroup`; a
//! hybrid host (this kind of machine) has v1 hierarchies per controller (`memory`, `pids`,
//! `cpu`) beside a v2 one at `/sys/fs/cgroup/unified` that holds no controllers. For each
//! limit the v2 hierarchy is used when it offers the controller, else the v1 one. The command
//! joins its groups before bubblewrap starts (a shell writes its own pid into each
//! `cgroup.procs`, then becomes bwrap), so everything it forks is inside. Where groups cannot
//! be made (no permission, no cgroup file system), the command runs without them and
//! [`Group::create`] says why.
//!
//! **seccomp.** A deny list (answered `EPERM`): tracing other processes, mounting, loading
//! kernel modules or BPF programs, kexec, reboot, swap, the kernel keyring, new namespaces,
//! `userfaultfd`, `perf_event_open`, setting the clock. Compiled to a BPF program with
//! `seccompiler` and handed to bubblewrap (`--seccomp`), which installs it last, right before
//! the command runs.

use std::path::{Path, PathBuf};

/// Resource limits of one command.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Limits {
    /// Most memory (bytes) before the kernel kills it.
    pub memory_bytes: Option<u64>,
    /// Most processes and threads at once.
    pub pids: Option<u64>,
    /// Most CPU, in cores (1.5: one and a half cores' worth of time).
    pub cpus: Option<f64>,
}

impl Limits {
    /// 4 GiB, 512 processes, 2 cores: room for a build and its tests, not for a fork bomb.
    pub fn standard() -> Limits {
        Limits { memory_bytes: Some(4 << 30), pids: Some(512), cpus: Some(2.0) }
    }

    fn is_empty(&self) -> bool {
        self.memory_bytes.is_none() && self.pids.is_none() && self.cpus.is_none()
    }
}

/// A limit's files: (file, value) for the v2 hierarchy, then for v1.
type Files = Vec<(&'static str, String)>;

/// The cgroup file system root.
const ROOT: &str = "/sys/fs/cgroup";

/// One command's cgroups (one per hierarchy used), removed on drop.
#[derive(Debug, Default)]
pub struct Group {
    dirs: Vec<PathBuf>,
}

/// The v2 hierarchy and the controllers it offers, if any.
fn v2() -> Option<(PathBuf, Vec<String>)> {
    for dir in [PathBuf::from(ROOT), Path::new(ROOT).join("unified")] {
        if let Ok(list) = std::fs::read_to_string(dir.join("cgroup.subtree_control")) {
            return Some((dir, list.split_whitespace().map(str::to_owned).collect()));
        }
    }
    None
}

impl Group {
    /// Groups for `limits`, named `name`; `Err` says why none could be made.
    pub fn create(name: &str, limits: &Limits) -> Result<Group, String> {
        let mut g = Group::default();
        if limits.is_empty() {
            return Ok(g);
        }
        let v2 = v2();
        // (controller, v2 files, v1 files) for each limit asked.
        let mut wanted: Vec<(&str, Files, Files)> = Vec::new();
        if let Some(m) = limits.memory_bytes {
            wanted.push((
                "memory",
                vec![("memory.max", m.to_string()), ("memory.swap.max", "0".into())],
                vec![("memory.limit_in_bytes", m.to_string())],
            ));
        }
        if let Some(p) = limits.pids {
            wanted.push(("pids", vec![("pids.max", p.to_string())], vec![("pids.max", p.to_string())]));
        }
        if let Some(c) = limits.cpus {
            let period = 100_000u64;
            let quota = ((c.max(0.01) * period as f64) as u64).max(1000);
            wanted.push((
                "cpu",
                vec![("cpu.max", format!("{quota} {period}"))],
                vec![("cpu.cfs_period_us", period.to_string()), ("cpu.cfs_quota_us", quota.to_string())],
            ));
        }
        for (controller, v2_files, v1_files) in wanted {
            let (dir, files) = match &v2 {
                Some((root, offered)) if offered.iter().any(|c| c == controller) => (root.join(name), v2_files),
                _ => (Path::new(ROOT).join(controller).join(name), v1_files),
            };
            if !g.dirs.contains(&dir) {
                std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                g.dirs.push(dir.clone());
            }
            for (file, value) in files {
                // memory.swap.max is absent without swap accounting: not an error.
                if let Err(e) = std::fs::write(dir.join(file), &value)
                    && file != "memory.swap.max"
                {
                    return Err(format!("{}: {e}", dir.join(file).display()));
                }
            }
        }
        Ok(g)
    }

    /// The `cgroup.procs` files a process joins.
    pub fn procs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Whether the memory limit killed something (v1 `memory.failcnt`/`oom_control`, v2
    /// `memory.events`).
    pub fn oom_killed(&self) -> bool {
        self.dirs.iter().any(|d| {
            let v2 = std::fs::read_to_string(d.join("memory.events")).ok().and_then(|t| {
                t.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse::<u64>().ok())
            });
            let v1 = std::fs::read_to_string(d.join("memory.oom_control")).ok().and_then(|t| {
                t.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse::<u64>().ok())
            });
            v2.or(v1).unwrap_or(0) > 0
        })
    }
}

impl Drop for Group {
    /// Removes the groups once their processes are gone (they die with the sandbox's PID
    /// namespace; a few tries cover the moment that takes).
    fn drop(&mut self) {
        for d in &self.dirs {
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

/// The seccomp program (BPF, native byte order) for this machine's architecture; `None` on
/// one `seccompiler` does not know.
pub fn seccomp_program() -> Result<Option<Vec<u8>>, String> {
    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
    let arch = match std::env::consts::ARCH {
        "x86_64" => TargetArch::x86_64,
        "aarch64" => TargetArch::aarch64,
        "riscv64" => TargetArch::riscv64,
        _ => return Ok(None),
    };
    let denied = [
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_keyctl,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_open_by_handle_at,
        libc::SYS_userfaultfd,
        libc::SYS_acct,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
    ];
    let rules = denied.iter().map(|&n| (n, Vec::new())).collect();
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch)
        .map_err(|e| format!("building the seccomp filter: {e}"))?;
    let program: BpfProgram = filter.try_into().map_err(|e| format!("compiling the seccomp filter: {e}"))?;
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for i in &program {
        bytes.extend_from_slice(&i.code.to_ne_bytes());
        bytes.push(i.jt);
        bytes.push(i.jf);
        bytes.extend_from_slice(&i.k.to_ne_bytes());
    }
    Ok(Some(bytes))
}
