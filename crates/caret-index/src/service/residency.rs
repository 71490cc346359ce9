//! Which workspaces stay loaded: a workspace nobody has asked for in a while, or the least
//! recently used beyond the most a server holds, is dropped from memory. Its log and segment
//! are in the bucket, so the next request loads it again; a segment shared with loaded forks
//! stays in memory while any of them holds it ([`caret_store::Bases`]).

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
    /// A workspace no request has used for this long is unloaded.
    pub idle: Duration,
}

impl Default for Residency {
    fn default() -> Self {
        Residency { max_loaded: 1_000, idle: Duration::from_secs(30 * 60) }
    }
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

    /// Unloads the workspaces unused for the idle time, then the least recently used beyond
    /// the most kept; one in use (a request or a compaction holds it) stays. Returns how many
    /// were unloaded.
    pub fn unload_idle(&self) -> usize {
        let now = self.now_ms();
        // Freed after the map's lock is let go: dropping a large state takes a while.
        let gone = unload(&mut self.loaded.lock().unwrap_or_else(|p| p.into_inner()), self.residency, now);
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

/// Takes from `map` the entries unused for `residency.idle`, then the least recently used
/// unused ones while it holds more than `residency.max_loaded`.
fn unload(map: &mut LoadedMap, residency: Residency, now: u64) -> Vec<Arc<Loaded>> {
    let idle = u64::try_from(residency.idle.as_millis()).unwrap_or(u64::MAX);
    let mut unused: Vec<(u64, (String, String))> = map
        .iter()
        .filter(|(_, cell)| cell.unused())
        .map(|(key, cell)| (cell.used.load(Ordering::Relaxed), key.clone()))
        .collect();
    unused.sort_unstable();
    let idle_ones = unused.iter().take_while(|(used, _)| now.saturating_sub(*used) >= idle).count();
    let excess = map.len().saturating_sub(residency.max_loaded);
    unused.into_iter().take(idle_ones.max(excess)).filter_map(|(_, key)| map.remove(&key)).collect()
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
        let residency = Residency { max_loaded: 2, idle: Duration::from_millis(1_000) };
        let mut map: LoadedMap = [("a", 100), ("b", 5_000), ("c", 5_200), ("d", 5_100)]
            .into_iter()
            .map(|(w, used)| (key(w), cell(used)))
            .collect();
        // A request holds the oldest of the recent ones; a compaction runs on another.
        let held = map[&key("b")].clone();
        map[&key("c")].compacting.store(true, Ordering::Release);
        assert_eq!(unload(&mut map, residency, 5_500).len(), 2, "a idle; d the least recent unused");
        let mut left: Vec<&str> = map.keys().map(|(_, w)| w.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["b", "c"]);
        // Once no one holds them, idle time takes both.
        drop(held);
        map[&key("c")].compacting.store(false, Ordering::Release);
        assert_eq!(unload(&mut map, residency, 5_900).len(), 0, "within the idle time and the count");
        assert_eq!(unload(&mut map, residency, 7_000).len(), 2);
        assert!(map.is_empty());
    }
}
