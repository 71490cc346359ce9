//! Checked credentials kept in a replica's memory, so that a request's credential costs a
//! hash and a map lookup. An entry lives at most [`Cache::max_age`]; every entry goes when
//! the identity epoch moves (a revocation, a deactivation, a lowered role on any replica),
//! which a replica reads every second or so — so a revocation holds everywhere within that.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Entries by token hash, valid for one epoch.
#[derive(Debug)]
pub struct Cache<V> {
    inner: Mutex<Inner<V>>,
    max_age: Duration,
    capacity: usize,
}

#[derive(Debug)]
struct Inner<V> {
    epoch: Option<i64>,
    entries: HashMap<String, (V, Instant)>,
}

impl<V: Clone> Cache<V> {
    /// A cache whose entries live at most `max_age`, holding at most `capacity` of them.
    pub fn new(max_age: Duration, capacity: usize) -> Cache<V> {
        Cache { inner: Mutex::new(Inner { epoch: None, entries: HashMap::new() }), max_age, capacity: capacity.max(1) }
    }

    /// How long an entry lives at most.
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// The value kept for `key`, while fresh.
    pub fn get(&self, key: &str) -> Option<V> {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.entries.get(key).filter(|(_, at)| at.elapsed() < self.max_age).map(|(v, _)| v.clone())
    }

    /// Keeps `value` for `key`, if the epoch it was read under is still the cache's.
    pub fn put(&self, key: String, value: V, read_under: Option<i64>) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if read_under != g.epoch {
            return;
        }
        if g.entries.len() >= self.capacity {
            let max_age = self.max_age;
            g.entries.retain(|_, (_, at)| at.elapsed() < max_age);
            if g.entries.len() >= self.capacity {
                g.entries.clear();
            }
        }
        g.entries.insert(key, (value, Instant::now()));
    }

    /// The epoch entries belong to.
    pub fn epoch(&self) -> Option<i64> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).epoch
    }

    /// Moves to `epoch`: everything kept goes when it differs from the cache's.
    pub fn observe(&self, epoch: i64) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if g.epoch != Some(epoch) {
            g.epoch = Some(epoch);
            g.entries.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_go_with_the_epoch_and_their_age() {
        let c = Cache::new(Duration::from_millis(200), 2);
        c.observe(1);
        c.put("a".into(), 1, Some(1));
        assert_eq!(c.get("a"), Some(1));
        c.put("stale".into(), 2, Some(0));
        assert_eq!(c.get("stale"), None, "read under an older epoch: not kept");
        c.observe(1);
        assert_eq!(c.get("a"), Some(1), "the same epoch keeps entries");
        c.observe(2);
        assert_eq!(c.get("a"), None, "a new epoch empties it");
        c.put("b".into(), 3, Some(2));
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(c.get("b"), None, "too old");
        c.put("c".into(), 4, Some(2));
        c.put("d".into(), 5, Some(2));
        c.put("e".into(), 6, Some(2));
        assert_eq!(c.get("e"), Some(6));
    }
}
