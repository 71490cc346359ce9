//! The async runtime every front end runs on (the server's asking the kernel for short slices
//! of the cores), and the signal that stops a long-running one.

use anyhow::Context as _;

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// How long a slice of a core the server's own threads (Tab, token checks) ask the kernel
/// for: with Linux's EEVDF scheduler (6.12 and later), a waking thread with a shorter slice
/// than the one running may take its core at once instead of after that one's slice (about
/// 1.5 ms on two cores), which is most of Tab's overhead p99 when the machine is busy.
const SHORT_SLICE_NS: u64 = 200_000;

/// Asks the kernel for a short slice of a core for the calling thread ([`SHORT_SLICE_NS`]):
/// for the threads of the server's own runtime, whose requests are the shortest and most
/// waited on (its blocking threads too: tokio's hook cannot tell them apart, and the heavy
/// blocking work runs in the compartments' runtimes). Needs no privilege; a kernel without
/// custom slices takes the call and ignores it, one that refuses it (an older one, a filter)
/// leaves the thread as it was.
pub fn ask_short_slice() {
    let nice = rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap_or(0);
    if let Err(e) = set_scheduling(Policy::Normal { nice, slice_ns: SHORT_SLICE_NS }) {
        tracing::debug!(error = %e, "the thread keeps the default slice");
    }
}

/// Runs the calling thread (and the threads it starts) only on cores nothing else wants
/// (`SCHED_IDLE`): for load that stands for other machines — a benchmark's simulated
/// developers scanning their workspaces — on the machine whose figures are measured. A
/// waking thread of any other kind takes the core at once. Needs no privilege; there is no
/// way back without one.
pub fn run_only_when_idle() -> std::io::Result<()> {
    set_scheduling(Policy::Idle)
}

enum Policy {
    /// `SCHED_OTHER` at `nice`, asking for slices of `slice_ns`.
    Normal { nice: i32, slice_ns: u64 },
    /// `SCHED_IDLE`.
    Idle,
}

/// Sets the calling thread's scheduling policy (`sched_setattr`, which no safe binding
/// offers): the one place the workspace allows `unsafe` code.
#[allow(unsafe_code)]
fn set_scheduling(policy: Policy) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        /// `struct sched_attr` (its first version, 56 bytes).
        #[repr(C)]
        struct SchedAttr {
            size: u32,
            policy: u32,
            flags: u64,
            nice: i32,
            priority: u32,
            runtime: u64,
            deadline: u64,
            period: u64,
            util_min: u32,
            util_max: u32,
        }
        let (policy, nice, runtime) = match policy {
            Policy::Normal { nice, slice_ns } => (0, nice, slice_ns),
            Policy::Idle => (5, 0, 0),
        };
        let attr = SchedAttr {
            size: std::mem::size_of::<SchedAttr>() as u32,
            policy,
            flags: 0,
            nice,
            priority: 0,
            runtime,
            deadline: 0,
            period: 0,
            util_min: 0,
            util_max: 0,
        };
        let tid = rustix::thread::gettid();
        // SAFETY: the attribute is a valid `sched_attr` whose size field says its size; the
        // call reads it and changes nothing but this thread's scheduling.
        let done = unsafe { libc::syscall(libc::SYS_sched_setattr, tid.as_raw_nonzero().get(), &raw const attr, 0) };
        if done != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = policy;
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

/// A multi-threaded Tokio runtime with I/O and timers.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")
}

/// The server's own runtime (Tab, token checks; the heavy capabilities run in compartments of
/// their own): its threads ask for short slices of the cores ([`ask_short_slice`]).
pub fn server_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(ask_short_slice)
        .build()
        .context("starting the async runtime")
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The calling thread's slice as the scheduler reports it (`None`: not reported).
    fn slice() -> Option<u64> {
        let sched = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
        let line = sched.lines().find(|l| l.starts_with("se.slice"))?;
        line.rsplit(':').next()?.trim().parse().ok()
    }

    /// Whether the kernel takes a custom slice for a normal thread (6.12 and later).
    fn custom_slices() -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (6, 12)
    }

    #[test]
    fn the_servers_threads_get_short_slices_and_others_keep_theirs() {
        if !custom_slices() || slice().is_none() {
            caret_test_support::skip("this kernel has no custom slices for normal threads (Linux 6.12 and later)");
            return;
        }
        let rt = server_runtime().expect("built");
        let (theirs, nice) = rt.block_on(async {
            tokio::spawn(async { (slice(), rustix::process::getpriority_process(None).unwrap_or(0)) })
                .await
                .expect("ran")
        });
        assert_eq!(theirs, Some(SHORT_SLICE_NS), "a worker of the server's runtime");
        // Its nice value is left as it was; a thread of another runtime keeps the default.
        assert_eq!(nice, rustix::process::getpriority_process(None).unwrap_or(0));
        let other = runtime().expect("built").block_on(async { tokio::spawn(async { slice() }).await.expect("ran") });
        assert_ne!(other, Some(SHORT_SLICE_NS));
    }

    /// The calling thread's policy as the scheduler reports it.
    fn policy() -> Option<u32> {
        let sched = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
        let line = sched.lines().find(|l| l.starts_with("policy"))?;
        line.rsplit(':').next()?.trim().parse().ok()
    }

    #[test]
    fn a_thread_that_runs_only_when_idle_and_the_threads_it_starts_are_sched_idle() {
        let (done, mine, started) = std::thread::spawn(|| {
            let done = run_only_when_idle();
            (done, policy(), std::thread::spawn(policy).join().expect("ran"))
        })
        .join()
        .expect("ran");
        if let Err(e) = done {
            // Lowering needs no privilege: only a system-call filter refuses it.
            caret_test_support::skip(&format!("sched_setattr is refused here: {e}"));
            return;
        }
        assert_eq!((mine, started), (Some(5), Some(5)), "SCHED_IDLE, inherited");
        assert_eq!(policy(), Some(0), "this thread is left as it was");
    }
}
