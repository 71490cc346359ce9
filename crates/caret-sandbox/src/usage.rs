//! What the sandboxes of one workspace use now, read from `/proc`: the bubblewrap processes
//! whose arguments name the workspace, and everything under them.
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

/// Whether a bubblewrap process's arguments name `workspace`.
fn names_workspace(pid: u32, workspace: &[u8]) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == workspace))
}

/// What the sandboxes working in `workspace` (as given to their [`crate::Policy`]) use now.
pub fn of_workspace(workspace: &Path) -> Usage {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Usage::default() };
    let table: HashMap<u32, Proc> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, read(pid)?)))
        .collect();
    let wanted = workspace.as_os_str().as_encoded_bytes();
    let roots: Vec<u32> = table
        .iter()
        .filter(|(pid, p)| p.name == "bwrap" && names_workspace(**pid, wanted))
        .map(|(pid, _)| *pid)
        .collect();
    // SAFETY: sysconf reads a constant of the running system.
    let mut usage = Usage::default();
    for (pid, p) in &table {
        // Inside when a root is among its ancestors (or it is one).
        let mut at = *pid;
        let mut inside = false;
        for _ in 0..64 {
            if roots.contains(&at) {
                inside = true;
                break;
            }
            match table.get(&at) {
                Some(q) if q.parent > 1 => at = q.parent,
                _ => break,
            }
        }
        if inside {
            usage.processes += 1;
            usage.memory_bytes += rss_kb(*pid) * 1024;
            usage.cpu_ms += p.cpu_ticks * 1000 / USER_HZ;
        }
    }
    usage
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
