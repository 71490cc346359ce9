//! Which workspaces stay loaded: a workspace nobody has asked for in a while, or the least
//! recently used beyond the most a server holds (by count and by memory), is dropped from
//! memory. Its log and segment are in the bucket, so the next request loads it again; a
//! segment shared with loaded forks stays in memory while any of them holds it
//! ([`caret_store::Bases`]), so it counts once, and is freed with the last of them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Loaded, LoadedMap, Service};

/// How many workspaces a server keeps loaded, and how long an unused one stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Residency {
    /// Workspaces held in memory at most (the least recently used beyond are unloaded when
    /// another is loaded).
    pub max_loaded: usize,
    /// Bytes the loaded workspaces may hold at most, by [`caret_store::State::memory`]'s
    /// estimate, a segment shared by forks counted once (the least recently used beyond are
    /// unloaded; `u64::MAX`: no limit).
    pub max_bytes: u64,
    /// A workspace no request has used for this long is unloaded.
    pub idle: Duration,
}

impl Default for Residency {
    fn default() -> Self {
        Residency { max_loaded: 1_000, max_bytes: u64::MAX, idle: Duration::from_secs(30 * 60) }
    }
}

/// Half the memory this process may use: the cgroup's limit where one is set (a container),
/// else the machine's (Linux; `None` elsewhere).
pub fn half_of_memory() -> Option<u64> {
    // cgroup v2, else v1 (whose "no limit" is a number near 2^63: the machine's is less).
    let cgroup = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse::<u64>().ok()));
    let machine = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    });
    let limit = match (cgroup, machine) {
        (Some(c), Some(m)) => c.min(m),
        (c, m) => c.or(m)?,
    };
    Some(limit / 2)
}

impl Loaded {
    /// Marks the workspace used at `now` (milliseconds since the service started).
    pub(super) fn touch(&self, now: u64) {
        self.used.store(now, Ordering::Relaxed);
    }

    /// Whether nothing but the map holds it: no request, no compaction.
    fn unused(self: &Arc<Self>) -> bool {
        Arc::strong_count(self) == 1 && !self.compacting.load(Ordering::Acquire)
    }

    /// Its memory now, or as last estimated while a request holds its state.
    fn memory(&self) -> caret_store::Memory {
        let mut last = self.memory.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(state) = self.state.try_lock() {
            *last = state.memory();
        }
        last.clone()
    }
}

impl Service {
    /// The service keeping workspaces loaded as `residency` says.
    pub fn with_residency(mut self, residency: Residency) -> Self {
        self.residency = residency;
        self
    }

    /// Milliseconds since the service started.
    pub(super) fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Workspaces loaded in memory now.
    pub fn loaded_count(&self) -> usize {
        self.loaded.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Bytes the loaded workspaces hold, by estimate, a shared segment counted once.
    pub fn loaded_bytes(&self) -> u64 {
        Usage::of(self.estimates().values()).bytes
    }

    /// Each loaded workspace's memory, estimated without the map's lock held (an estimate
    /// costs what the state's own changes hold; requests look workspaces up meanwhile).
    fn estimates(&self) -> Estimates {
        let cells: Vec<((String, String), Arc<Loaded>)> =
            self.loaded.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, c)| (k.clone(), c.clone())).collect();
        cells.into_iter().map(|(key, cell)| (key, cell.memory())).collect()
    }

    /// A loaded workspace's memory (`None` when it is not loaded).
    pub fn workspace_memory(&self, tenant: &crate::db::Tenant, id: &str) -> Option<caret_store::Memory> {
        let map = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&(tenant.id.clone(), id.to_owned())).map(|cell| cell.memory())
    }

    /// Unloads the workspaces unused for the idle time, then the least recently used beyond
    /// the most kept, by count and by bytes; one in use (a request or a compaction holds it)
    /// stays. Returns how many were unloaded.
    pub fn unload_idle(&self) -> usize {
        let now = self.now_ms();
        let memory = if self.residency.max_bytes < u64::MAX { self.estimates() } else { Estimates::new() };
        // Freed after the map's lock is let go: dropping a large state takes a while.
        let gone = unload(&mut self.loaded.lock().unwrap_or_else(|p| p.into_inner()), self.residency, now, &memory);
        let unloaded = gone.len();
        drop(gone);
        if unloaded > 0 {
            tracing::info!(unloaded, "unloaded workspaces not in use (they load again when asked for)");
        }
        unloaded
    }

    /// Unloads idle workspaces every `every` while the service lives.
    pub fn spawn_unloading(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let service = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(service) = service.upgrade() else { return };
                service.unload_idle();
            }
        })
    }
}

/// Loaded workspaces' memory by (tenant id, workspace id).
type Estimates = HashMap<(String, String), caret_store::Memory>;

/// Bytes held by a set of workspaces: their own, and each shared segment once.
struct Usage {
    bytes: u64,
    /// States loaded over each shared segment, with its bytes.
    sharing: HashMap<String, (usize, u64)>,
}

impl Usage {
    fn of<'a>(memory: impl Iterator<Item = &'a caret_store::Memory>) -> Usage {
        let mut usage = Usage { bytes: 0, sharing: HashMap::new() };
        for m in memory {
            usage.bytes += m.own;
            if let Some((name, bytes)) = &m.shared {
                let entry = usage.sharing.entry(name.clone()).or_insert((0, *bytes));
                if entry.0 == 0 {
                    usage.bytes += *bytes;
                }
                entry.0 += 1;
            }
        }
        usage
    }

    /// Takes one workspace out: its own bytes, and its segment's once no other holds it.
    fn remove(&mut self, m: &caret_store::Memory) {
        self.bytes = self.bytes.saturating_sub(m.own);
        if let Some((name, _)) = &m.shared
            && let Some(entry) = self.sharing.get_mut(name)
        {
            entry.0 -= 1;
            if entry.0 == 0 {
                self.bytes = self.bytes.saturating_sub(entry.1);
            }
        }
    }
}

/// Takes from `map` the entries unused for `residency.idle`, then the least recently used
/// unused ones while it holds more than `residency.max_loaded`, then while the rest hold
/// more than `residency.max_bytes` (by `memory`, a shared segment counted once; one loaded
/// since it was estimated counts nothing until the next sweep).
fn unload(map: &mut LoadedMap, residency: Residency, now: u64, memory: &Estimates) -> Vec<Arc<Loaded>> {
    let idle = u64::try_from(residency.idle.as_millis()).unwrap_or(u64::MAX);
    let mut unused: Vec<(u64, (String, String))> = map
        .iter()
        .filter(|(_, cell)| cell.unused())
        .map(|(key, cell)| (cell.used.load(Ordering::Relaxed), key.clone()))
        .collect();
    unused.sort_unstable();
    let idle_ones = unused.iter().take_while(|(used, _)| now.saturating_sub(*used) >= idle).count();
    let excess = map.len().saturating_sub(residency.max_loaded);
    let mut going = idle_ones.max(excess);
    if residency.max_bytes < u64::MAX {
        let none = caret_store::Memory::default();
        let of = |key: &(String, String)| memory.get(key).unwrap_or(&none);
        let mut usage = Usage::of(map.keys().map(of));
        for (_, key) in &unused[..going] {
            usage.remove(of(key));
        }
        while usage.bytes > residency.max_bytes && going < unused.len() {
            usage.remove(of(&unused[going].1));
            going += 1;
        }
    }
    unused.into_iter().take(going).filter_map(|(_, key)| map.remove(&key)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(used: u64) -> Arc<Loaded> {
        let cell = Arc::new(Loaded::default());
        cell.touch(used);
        cell
    }

    fn key(w: &str) -> (String, String) {
        ("t".to_owned(), w.to_owned())
    }

    #[test]
    fn the_idle_and_the_least_recently_used_go_and_those_in_use_stay() {
        let residency = Residency { max_loaded: 2, max_bytes: u64::MAX, idle: Duration::from_millis(1_000) };
        let mut map: LoadedMap = [("a", 100), ("b", 5_000), ("c", 5_200), ("d", 5_100)]
            .into_iter()
            .map(|(w, used)| (key(w), cell(used)))
            .collect();
        // A request holds the oldest of the recent ones; a compaction runs on another.
        let held = map[&key("b")].clone();
        map[&key("c")].compacting.store(true, Ordering::Release);
        assert_eq!(unload(&mut map, residency, 5_500, &Estimates::new()).len(), 2, "a idle; d the least recent unused");
        let mut left: Vec<&str> = map.keys().map(|(_, w)| w.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["b", "c"]);
        // Once no one holds them, idle time takes both.
        drop(held);
        map[&key("c")].compacting.store(false, Ordering::Release);
        assert_eq!(
            unload(&mut map, residency, 5_900, &Estimates::new()).len(),
            0,
            "within the idle time and the count"
        );
        assert_eq!(unload(&mut map, residency, 7_000, &Estimates::new()).len(), 2);
        assert!(map.is_empty());
    }

    #[test]
    fn beyond_the_bytes_the_least_recently_used_go_and_a_shared_segment_counts_once() {
        use caret_store::Memory;
        let shared = |own: u64, name: &str, bytes: u64| Memory { own, shared: Some((name.to_owned(), bytes)) };
        let memory: Estimates = [
            ("a", shared(10, "s", 100)),
            ("b", shared(10, "s", 100)),
            ("c", Memory { own: 50, shared: None }),
            ("d", shared(30, "t", 40)),
        ]
        .into_iter()
        .map(|(w, m)| (key(w), m))
        .collect();
        let map = || -> LoadedMap {
            [("a", 100), ("b", 200), ("c", 300), ("d", 400)].into_iter().map(|(w, used)| (key(w), cell(used))).collect()
        };
        let residency = |max_bytes| Residency { max_loaded: 10, max_bytes, idle: Duration::from_secs(60) };
        // The workspaces unloaded, by name.
        let names = |map: &mut LoadedMap, max_bytes| {
            let before: Vec<(String, String)> = map.keys().cloned().collect();
            unload(map, residency(max_bytes), 500, &memory);
            let mut gone: Vec<String> = before.into_iter().filter(|k| !map.contains_key(k)).map(|(_, w)| w).collect();
            gone.sort_unstable();
            gone
        };
        // 240 bytes in all: the segment `s` once for a and b.
        assert_eq!(Usage::of(memory.values()).bytes, 240);
        assert!(names(&mut map(), 240).is_empty(), "within the bytes");
        // a goes first (least recent) and frees only its own 10: b still holds `s`.
        assert_eq!(names(&mut map(), 235), ["a"]);
        // Under 230, b goes too, and with it `s`: 120 left.
        assert_eq!(names(&mut map(), 150), ["a", "b"]);
        assert_eq!(names(&mut map(), 120), ["a", "b"]);
        assert_eq!(names(&mut map(), 119), ["a", "b", "c"]);
        // One a request holds stays, however far over.
        let mut held_map = map();
        let held = held_map[&key("a")].clone();
        assert_eq!(names(&mut held_map, 0), ["b", "c", "d"]);
        drop(held);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_default_bytes_are_half_of_what_the_machine_or_its_container_allows() {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let kib: u64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let half = half_of_memory().expect("Linux reports its memory");
        assert!(half > 0 && half <= kib * 1024 / 2, "{half} of {} KiB", kib);
    }
}
