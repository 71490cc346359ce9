//! Maps in two layers: what a segment says, shared by every state loaded from that segment (a
//! workspace and the forks of it, see [`crate::Bases`]), and one state's own changes over it.
//! A fork then costs what it changed, not the workspace's size.
//!
//! Reads look in the state's own layer first: a value there, or a tombstone where the key is
//! gone, hides the shared one. A change to a shared value copies that value into the own
//! layer first; the shared layer is never written.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

/// A hash map in two layers.
#[derive(Debug, Clone)]
pub(crate) struct Layered<K, V> {
    base: Arc<HashMap<K, V>>,
    /// A value, or `None` where the shared layer's key is gone.
    own: HashMap<K, Option<V>>,
    len: usize,
}

impl<K, V> Default for Layered<K, V> {
    fn default() -> Self {
        Layered { base: Arc::default(), own: HashMap::new(), len: 0 }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Layered<K, V> {
    /// A map that is `base`, with no changes of its own.
    pub(crate) fn over(base: Arc<HashMap<K, V>>) -> Self {
        Layered { len: base.len(), base, own: HashMap::new() }
    }

    pub(crate) fn get<Q>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.own.get(k) {
            Some(v) => v.as_ref(),
            None => self.base.get(k),
        }
    }

    pub(crate) fn contains_key<Q>(&self, k: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(k).is_some()
    }

    /// Sets `k`; whether it was absent before.
    pub(crate) fn insert(&mut self, k: K, v: V) -> bool {
        let absent = !self.contains_key(&k);
        self.own.insert(k, Some(v));
        if absent {
            self.len += 1;
        }
        absent
    }

    /// Takes `k` out, returning its value (a copy, when it was shared).
    pub(crate) fn remove(&mut self, k: &K) -> Option<V> {
        let old = match self.own.get_mut(k) {
            Some(slot) => slot.take(),
            None => self.base.get(k).cloned(),
        };
        if old.is_some() {
            self.len -= 1;
            if self.base.contains_key(k) {
                self.own.insert(k.clone(), None);
            } else {
                self.own.remove(k);
            }
        }
        old
    }

    /// `k`'s value to change in place (copied into the own layer first when shared).
    pub(crate) fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        if !self.own.contains_key(k) {
            let v = self.base.get(k)?.clone();
            self.own.insert(k.clone(), Some(v));
        }
        self.own.get_mut(k)?.as_mut()
    }

    /// `k`'s value to change in place, set to the default first when absent.
    pub(crate) fn or_default(&mut self, k: K) -> &mut V
    where
        V: Default,
    {
        if !self.own.contains_key(&k) {
            let shared = self.base.get(&k).cloned();
            self.own.insert(k.clone(), shared);
        }
        let slot = self.own.entry(k).or_default();
        if slot.is_none() {
            // Absent, or removed: it comes back with the default.
            self.len += 1;
        }
        slot.get_or_insert_with(V::default)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every key and value, the shared ones first (in no particular order).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        let own = &self.own;
        self.base
            .iter()
            .filter(move |(k, _)| !own.contains_key(*k))
            .chain(own.iter().filter_map(|(k, v)| v.as_ref().map(|v| (k, v))))
    }

    /// Empties the map (the shared layer is let go, not changed).
    pub(crate) fn clear(&mut self) {
        self.base = Arc::default();
        self.own.clear();
        self.len = 0;
    }

    /// Keys in the own layer (changes and tombstones): what this state adds to the shared one.
    pub(crate) fn own_len(&self) -> usize {
        self.own.len()
    }
}

/// An ordered map in two layers (a workspace's files by path).
#[derive(Debug, Clone)]
pub(crate) struct LayeredOrd<K, V> {
    base: Arc<BTreeMap<K, V>>,
    own: BTreeMap<K, Option<V>>,
    len: usize,
}

impl<K, V> Default for LayeredOrd<K, V> {
    fn default() -> Self {
        LayeredOrd { base: Arc::default(), own: BTreeMap::new(), len: 0 }
    }
}

impl<K: Ord + Clone, V: Clone> LayeredOrd<K, V> {
    /// A map that is `base`, with no changes of its own.
    pub(crate) fn over(base: Arc<BTreeMap<K, V>>) -> Self {
        LayeredOrd { len: base.len(), base, own: BTreeMap::new() }
    }

    pub(crate) fn get<Q>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self.own.get(k) {
            Some(v) => v.as_ref(),
            None => self.base.get(k),
        }
    }

    /// Sets `k`; whether it was absent before.
    pub(crate) fn insert(&mut self, k: K, v: V) -> bool {
        let absent = self.get(&k).is_none();
        self.own.insert(k, Some(v));
        if absent {
            self.len += 1;
        }
        absent
    }

    /// Takes `k` out, returning its value (a copy, when it was shared).
    pub(crate) fn remove(&mut self, k: &K) -> Option<V> {
        let old = match self.own.get_mut(k) {
            Some(slot) => slot.take(),
            None => self.base.get(k).cloned(),
        };
        if old.is_some() {
            self.len -= 1;
            if self.base.contains_key(k) {
                self.own.insert(k.clone(), None);
            } else {
                self.own.remove(k);
            }
        }
        old
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Keys and values in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        Merged::new(self.base.iter(), self.own.iter())
    }

    /// The own layer's values (its changes; tombstones left out).
    pub(crate) fn own_values(&self) -> impl Iterator<Item = &V> {
        self.own.values().flatten()
    }

    /// Values in key order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// Keys and values from `from` on, in order.
    pub(crate) fn range_from<'a>(&'a self, from: &K) -> impl Iterator<Item = (&'a K, &'a V)> {
        Merged::new(self.base.range(from.clone()..), self.own.range(from.clone()..))
    }

    /// The own layer's keys (changes and tombstones) in order, with whether each is present.
    pub(crate) fn own_keys(&self) -> impl Iterator<Item = &K> {
        self.own.keys()
    }

    /// Keys in the own layer (changes and tombstones).
    pub(crate) fn own_len(&self) -> usize {
        self.own.len()
    }
}

/// Two key-ordered iterators merged: where both hold a key, the own one's entry wins (a
/// tombstone hides the key).
struct Merged<'a, K: 'a, V: 'a, A: Iterator<Item = (&'a K, &'a V)>, B: Iterator<Item = (&'a K, &'a Option<V>)>> {
    base: std::iter::Peekable<A>,
    own: std::iter::Peekable<B>,
}

impl<'a, K: 'a, V: 'a, A, B> Merged<'a, K, V, A, B>
where
    A: Iterator<Item = (&'a K, &'a V)>,
    B: Iterator<Item = (&'a K, &'a Option<V>)>,
{
    fn new(base: A, own: B) -> Self {
        Merged { base: base.peekable(), own: own.peekable() }
    }
}

impl<'a, K: Ord + 'a, V: 'a, A, B> Iterator for Merged<'a, K, V, A, B>
where
    A: Iterator<Item = (&'a K, &'a V)>,
    B: Iterator<Item = (&'a K, &'a Option<V>)>,
{
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (take_own, replaces) = match (self.base.peek(), self.own.peek()) {
                (None, None) => return None,
                (Some(_), None) => (false, false),
                (None, Some(_)) => (true, false),
                (Some((b, _)), Some((o, _))) => (o <= b, o == b),
            };
            if replaces {
                // The own entry replaces the shared one.
                self.base.next();
            }
            if take_own {
                if let Some((k, Some(v))) = self.own.next() {
                    return Some((k, v));
                }
            } else {
                return self.base.next();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layered_map_reads_as_the_map_its_changes_make() {
        let base: HashMap<u32, String> = (0..100).map(|i| (i, i.to_string())).collect();
        let base = Arc::new(base);
        let mut layered = Layered::over(base.clone());
        let mut plain = (*base).clone();
        let mut rng = 7u64;
        for step in 0..2_000u32 {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let k = ((rng >> 33) % 150) as u32;
            match (rng >> 20) % 4 {
                0 => assert_eq!(layered.insert(k, format!("v{step}")), plain.insert(k, format!("v{step}")).is_none()),
                1 => assert_eq!(layered.remove(&k), plain.remove(&k)),
                2 => {
                    if let Some(v) = layered.get_mut(&k) {
                        v.push('m');
                    }
                    if let Some(v) = plain.get_mut(&k) {
                        v.push('m');
                    }
                }
                _ => {
                    layered.or_default(k).push('d');
                    plain.entry(k).or_default().push('d');
                }
            }
            assert_eq!(layered.len(), plain.len(), "step {step}");
            assert_eq!(layered.get(&k), plain.get(&k), "step {step}");
        }
        let mut all: Vec<(u32, String)> = layered.iter().map(|(k, v)| (*k, v.clone())).collect();
        all.sort();
        let mut want: Vec<(u32, String)> = plain.into_iter().collect();
        want.sort();
        assert_eq!(all, want);
        assert_eq!(
            *base,
            (0..100).map(|i| (i, i.to_string())).collect::<HashMap<_, _>>(),
            "the shared layer is never written"
        );
    }

    #[test]
    fn an_ordered_layered_map_iterates_in_order_with_its_changes() {
        let base: BTreeMap<String, u32> = (0..60).map(|i| (format!("k{i:03}"), i)).collect();
        let base = Arc::new(base);
        let mut layered = LayeredOrd::over(base.clone());
        let mut plain = (*base).clone();
        let mut rng = 11u64;
        for step in 0..1_000u32 {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let k = format!("k{:03}", (rng >> 33) % 90);
            if (rng >> 20).is_multiple_of(2) {
                assert_eq!(layered.insert(k.clone(), step), plain.insert(k, step).is_none());
            } else {
                assert_eq!(layered.remove(&k), plain.remove(&k));
            }
            assert_eq!(layered.len(), plain.len());
        }
        let got: Vec<(String, u32)> = layered.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let want: Vec<(String, u32)> = plain.iter().map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(got, want);
        let from = "k045".to_owned();
        let got: Vec<&String> = layered.range_from(&from).map(|(k, _)| k).collect();
        let want: Vec<&String> = plain.range(from.clone()..).map(|(k, _)| k).collect();
        assert_eq!(got, want);
        assert_eq!(base.len(), 60, "the shared layer is never written");
    }
}
