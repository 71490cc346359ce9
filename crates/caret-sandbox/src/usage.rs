//! What the sandboxes of one workspace use now, read from `/proc`: the sandbox launchers
//! (bubblewrap, gVisor's `runsc`) whose arguments name the workspace, and everything under
//! them.
//!
//! Commands come and go during a run (each tool call is its own sandbox), so the figure is a
//! sample: the processes alive at this moment, their resident memory, and the CPU time they
//! have had. Processes another user owns and `/proc` entries that vanish while being read are
//! skipped; on a system without `/proc` the answer is all zeros.

use std::collections::HashMap;
use std::path::Path;

/// A sample of what a workspace's sandboxes use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Processes alive (bubblewrap's own included).
    pub processes: u32,
    /// Their resident memory, bytes.
    pub memory_bytes: u64,
    /// Their CPU time, user + system, milliseconds.
    pub cpu_ms: u64,
}

/// The unit of `/proc`'s CPU times: fixed at 100 per second by the kernel's interface,
/// whatever the kernel's own tick.
const USER_HZ: u64 = 100;

/// One process as `/proc/PID/stat` describes it.
struct Proc {
    parent: u32,
    name: String,
    cpu_ticks: u64,
}

/// A process's resident memory (kB), from `/proc/PID/status`; 0 when gone.
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn read(pid: u32) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (name) state ppid …": the name may hold spaces and parentheses, so split at the
    // last ')'.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    // After the name: state(0) ppid(1) … utime(11) stime(12).
    let parent = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Proc { parent, name, cpu_ticks: utime + stime })
}

/// Sandbox launchers whose arguments name their workspace: bubblewrap, and gVisor's `runsc`
/// (its sandbox and gofer processes carry the same arguments).
fn is_launcher(name: &str) -> bool {
    name == "bwrap" || name.starts_with("runsc")
}

/// Every sandbox on the machine at one moment: each launcher's arguments and what it and
/// the processes under it use.
#[derive(Debug, Default)]
pub struct Sample {
    sandboxes: Vec<(Vec<Vec<u8>>, Usage)>,
}

impl Sample {
    /// Reads `/proc` once.
    pub fn take() -> Sample {
        let Ok(dir) = std::fs::read_dir("/proc") else { return Sample::default() };
        let table: HashMap<u32, Proc> = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| Some((pid, read(pid)?)))
            .collect();
        // The outermost launcher above each process, if any.
        let root_of = |pid: u32| -> Option<u32> {
            let (mut at, mut root) = (pid, None);
            for _ in 0..64 {
                let Some(p) = table.get(&at) else { break };
                if is_launcher(&p.name) {
                    root = Some(at);
                }
                if p.parent <= 1 {
                    break;
                }
                at = p.parent;
            }
            root
        };
        let mut by_root: HashMap<u32, Usage> = HashMap::new();
        for (pid, p) in &table {
            if let Some(root) = root_of(*pid) {
                let u = by_root.entry(root).or_default();
                u.processes += 1;
                u.memory_bytes += rss_kb(*pid) * 1024;
                u.cpu_ms += p.cpu_ticks * 1000 / USER_HZ;
            }
        }
        let sandboxes = by_root
            .into_iter()
            .filter_map(|(root, usage)| {
                let args = std::fs::read(format!("/proc/{root}/cmdline")).ok()?;
                Some((args.split(|b| *b == 0).map(<[u8]>::to_vec).collect(), usage))
            })
            .collect();
        Sample { sandboxes }
    }

    /// What the sandboxes working in `workspace` (as given to their [`crate::Policy`]) use:
    /// those whose launcher's arguments name it.
    pub fn of_workspace(&self, workspace: &Path) -> Usage {
        let wanted = workspace.as_os_str().as_encoded_bytes();
        let mut total = Usage::default();
        for (args, u) in &self.sandboxes {
            if args.iter().any(|a| a == wanted) {
                total.processes += u.processes;
                total.memory_bytes += u.memory_bytes;
                total.cpu_ms += u.cpu_ms;
            }
        }
        total
    }
}

/// Samples shared by many callers: `/proc` is read at most once per `max_age` however many
/// runs ask (a worker with 200 runs would otherwise read it 200 times per heartbeat).
#[derive(Debug)]
pub struct Sampler {
    max_age: std::time::Duration,
    last: std::sync::Mutex<Option<(std::time::Instant, std::sync::Arc<Sample>)>>,
}

impl Sampler {
    /// A sampler whose samples serve for `max_age`.
    pub fn new(max_age: std::time::Duration) -> Sampler {
        Sampler { max_age, last: std::sync::Mutex::new(None) }
    }

    /// A sample at most `max_age` old.
    pub fn sample(&self) -> std::sync::Arc<Sample> {
        let mut last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, s)) = &*last
            && at.elapsed() < self.max_age
        {
            return s.clone();
        }
        let s = std::sync::Arc::new(Sample::take());
        *last = Some((std::time::Instant::now(), s.clone()));
        s
    }
}

/// What the sandboxes working in `workspace` use now (a fresh sample).
pub fn of_workspace(workspace: &Path) -> Usage {
    Sample::take().of_workspace(workspace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_without_sandboxes_uses_nothing() {
        let dir = caret_test_support::TempDir::new();
        assert_eq!(of_workspace(dir.path()), Usage::default());
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let me = read(std::process::id()).expect("this process's stat");
        assert!(rss_kb(std::process::id()) > 0);
        assert_eq!(me.parent, std::os::unix::process::parent_id());
    }
}
