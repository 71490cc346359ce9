//! The priorities of the bench's own threads: the simulated developers' (their runtime and
//! the rayon pool their scans use) run only on cores the server, the model double,
//! PostgreSQL and moto leave idle.

use anyhow::Context as _;

/// The nice value of the load's threads where the kernel will not run them only when idle.
const LOAD_NICE: i32 = 10;

/// Puts the calling thread on idle cores only (`SCHED_IDLE`), or at nice 10 where the kernel
/// refuses it: what every thread of the load starts with.
fn yield_to_all() {
    if caret_host::runtime::run_only_when_idle().is_err() {
        caret_server::compartment::set_thread_nice(LOAD_NICE);
    }
}

/// The runtime the simulated developers run on: its threads (workers, blocking ones, and those
/// they start: a scan's) run only on cores the server, the model double, PostgreSQL and moto
/// leave idle (`SCHED_IDLE`; nice 10 where that is refused), so that the server's figures are
/// its own: on a real installation the developers' scans run on their own machines. The
/// server and the double are started from other threads, at the priority `caret bench` was
/// started with (a child process inherits its starting thread's).
pub(super) fn load_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // Named, so a scheduler's trace tells the load from the double in this process.
        .thread_name("capacity-load")
        .on_thread_start(yield_to_all)
        .build()?;
    Ok(rt)
}

/// The process's rayon pool, where a scan walks, hashes and chunks the workspace's files:
/// like the load's runtime, on idle cores only. Its threads are the load's; left to rayon,
/// the pool is built by whichever thread first uses it (the setup's first sync, at the
/// priority `caret bench` was started with) and the developers' scans would then take the
/// cores from the server at a normal priority.
pub(super) fn idle_scan_pool() -> anyhow::Result<()> {
    rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("capacity-scan-{i}"))
        .start_handler(|_| yield_to_all())
        .build_global()
        .context("the scans' thread pool was built before the load's (nothing may use rayon before)")
}
