//! Which current files hold each embeddable chunk, and which of those chunks lack a vector,
//! kept up to date with every record applied: what a sync asks after a change ("what is left
//! to embed", "how far along") costs what the change touched, not the workspace's size.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::layered::Layered;
use crate::{FileRecord, Missing, StageCount, stage};

/// A chunk's place: its stage (from the file's kind) and the file's obfuscated path.
type Place = (u8, Arc<str>);

/// The embeddable chunks of current files (bulk data is never embedded: left out). A copy
/// shares the places with the original (see [`crate::layered`]).
#[derive(Debug, Default, Clone)]
pub(crate) struct Refs {
    /// Each chunk's places, sorted: the first is the one it is embedded from (its earliest
    /// stage, then the first path: a chunk in code and in a test is code).
    places: Layered<[u8; 32], Vec<Place>>,
    /// Chunks without a vector, by their first place: the order they are embedded in (stage,
    /// then file, so the client reads each file once).
    missing: BTreeSet<(u8, Arc<str>, [u8; 32])>,
    /// Per stage (by each chunk's first place): distinct chunks and missing ones.
    stages: [StageCount; 3],
}

impl Refs {
    /// The index over `files`; `has` says whether a chunk has a vector.
    pub(crate) fn build<'a>(files: impl Iterator<Item = &'a FileRecord>, has: impl Fn(&[u8; 32]) -> bool) -> Refs {
        let mut refs = Refs::default();
        let mut all: HashMap<[u8; 32], Vec<Place>> = HashMap::new();
        for f in files {
            let path: Arc<str> = Arc::from(f.path.as_str());
            for c in &f.chunks {
                let Some(s) = stage(&c.kind) else { continue };
                all.entry(c.id).or_default().push((s as u8, path.clone()));
            }
        }
        for (id, places) in &mut all {
            places.sort();
            let (s, path) = places[0].clone();
            refs.stages[s as usize].total += 1;
            if !has(id) {
                refs.stages[s as usize].missing += 1;
                refs.missing.insert((s, path, *id));
            }
        }
        refs.places = Layered::over(Arc::new(all));
        refs
    }

    /// A file's chunks now have places in it.
    pub(crate) fn add(&mut self, f: &FileRecord, has: impl Fn(&[u8; 32]) -> bool) {
        let path: Arc<str> = Arc::from(f.path.as_str());
        for c in &f.chunks {
            let Some(s) = stage(&c.kind) else { continue };
            let places = self.places.or_default(c.id);
            let before = places.first().cloned();
            let place = (s as u8, path.clone());
            let at = places.partition_point(|p| *p < place);
            places.insert(at, place);
            self.moved(c.id, before, has(&c.id));
        }
    }

    /// A replaced or deleted file's chunks no longer have places in it.
    pub(crate) fn remove(&mut self, f: &FileRecord, has: impl Fn(&[u8; 32]) -> bool) {
        for c in &f.chunks {
            let Some(places) = self.places.get_mut(&c.id) else { continue };
            let before = places.first().cloned();
            places.retain(|(_, p)| **p != *f.path);
            if places.is_empty() {
                self.places.remove(&c.id);
            }
            self.moved(c.id, before, has(&c.id));
        }
    }

    /// Moves a chunk's counts and its missing entry from its first place `before` to its
    /// first place now.
    fn moved(&mut self, id: [u8; 32], before: Option<Place>, has: bool) {
        let now = self.places.get(&id).and_then(|p| p.first()).cloned();
        if before == now {
            return;
        }
        if let Some((s, path)) = before {
            self.stages[s as usize].total -= 1;
            if self.missing.remove(&(s, path, id)) {
                self.stages[s as usize].missing -= 1;
            }
        }
        if let Some((s, path)) = now {
            self.stages[s as usize].total += 1;
            if !has {
                self.stages[s as usize].missing += 1;
                self.missing.insert((s, path, id));
            }
        }
    }

    /// A chunk got a vector.
    pub(crate) fn embedded(&mut self, id: &[u8; 32]) {
        let Some((s, path)) = self.places.get(id).and_then(|p| p.first()) else { return };
        if self.missing.remove(&(*s, path.clone(), *id)) {
            self.stages[*s as usize].missing -= 1;
        }
    }

    /// Chunks without a vector.
    pub(crate) fn missing_len(&self) -> usize {
        self.missing.len()
    }

    /// The missing chunks in embedding order, up to `limit`, each with the path it is
    /// embedded from.
    pub(crate) fn missing(&self, limit: usize) -> Missing {
        Missing {
            chunks: self.missing.iter().take(limit).map(|(_, path, id)| (*id, path.to_string())).collect(),
            total: self.missing.len(),
            stages: self.stages,
        }
    }

    /// A chunk's stage (its earliest), if a current file holds it and it is embeddable.
    pub(crate) fn stage(&self, id: &[u8; 32]) -> Option<usize> {
        self.places.get(id).and_then(|p| p.first()).map(|(s, _)| *s as usize)
    }

    /// Chunks whose places this copy changed (see [`Layered::own_len`]).
    pub(crate) fn own_len(&self) -> usize {
        self.places.own_len()
    }

    /// Distinct embeddable chunks, and how many of them have a vector.
    pub(crate) fn progress(&self) -> (u64, u64) {
        let total: u64 = self.stages.iter().map(|s| s.total).sum();
        (total, total - self.missing.len() as u64)
    }
}
