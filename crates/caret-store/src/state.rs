//! A workspace's state in memory: its files, stored chunks and vectors, the segment's shared
//! tables and the log tail after it, kept up to date record by record.

use std::collections::{BTreeSet, HashMap};
use std::mem::size_of;
use std::sync::Arc;

use caret_workspace::merkle::MerkleTree;
use caret_workspace::{ContentHash, RelPath};

use crate::base::{Base, VecAt};
use crate::layered::{Layered, LayeredOrd};
use crate::memory::{ENTRY_OVERHEAD, Memory, chunk_record_bytes, file_bytes};
use crate::segment::{CompactionPlan, DeltaPlan};
use crate::{ChunkRecord, FileRecord, Missing, Record, Segment, VectorBatch, rank, refs, search};

/// Records applied after the segment, kept in memory and searched exactly.
#[derive(Debug, Default)]
pub(crate) struct Tail {
    pub(crate) chunks: Vec<(u64, ChunkRecord)>,
    pub(crate) vector_ids: Vec<(u64, [u8; 32])>,
    pub(crate) vectors: Vec<f32>,
    /// Log objects applied since the last compaction (of either kind).
    pub(crate) objects: u64,
    /// Records (chunks plus vectors) at the head of the tail that a delta holds already.
    pub(crate) folded: usize,
}

/// The state of a workspace: its files, its stored chunks and vectors, the segment and the
/// tail after it. What the segment says is a [`Base`] that every state loaded from the same
/// segment shares; the tables here hold this state's changes over it ([`layered`]).
#[derive(Debug, Default)]
pub struct State {
    /// The last applied log sequence number (0: none).
    pub seq: u64,
    /// Files by obfuscated path.
    pub(crate) files: LayeredOrd<String, FileRecord>,
    /// Stored chunks (with lexical data): id → length in tokens.
    pub(crate) chunks: Layered<[u8; 32], u32>,
    pub(crate) base: Option<Arc<Base>>,
    pub(crate) segment: Option<Arc<Segment>>,
    pub(crate) tail: Tail,
    /// The vectors' model and width.
    pub(crate) model: Option<(String, usize)>,
    pub(crate) vectors: Layered<[u8; 32], VecAt>,
    /// Where embeddable chunks are and which lack a vector (kept with each record).
    pub(crate) refs: refs::Refs,
    /// The Merkle tree, once built, kept with each record (see [`State::tree`]).
    pub(crate) tree: Option<Arc<MerkleTree>>,
    /// Files with a chunk that is not stored: their leaves in the tree are blank.
    pub(crate) incomplete: BTreeSet<String>,
    pub(crate) locations: Option<Arc<search::Locations>>,
    pub(crate) tail_lexical: Option<Arc<(Vec<[u8; 32]>, rank::LexicalIndex)>>,
}

impl State {
    /// The state a segment holds, sharing its tables with every other state loaded from it.
    pub(crate) fn from_base(base: Arc<Base>) -> State {
        let segment = base.segment.clone();
        State {
            seq: segment.seq,
            files: LayeredOrd::over(base.files.clone()),
            chunks: Layered::over(base.chunks.clone()),
            model: segment.model.clone().map(|m| (m, segment.dim)),
            vectors: Layered::over(base.vectors.clone()),
            refs: base.refs.clone(),
            incomplete: base.incomplete.clone(),
            segment: Some(segment),
            base: Some(base),
            ..State::default()
        }
    }

    /// Files in the workspace.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Stored chunks.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// What the workspace holds in memory (see [`Memory`]).
    pub fn memory(&self) -> Memory {
        let files: usize = self.files.own_values().map(file_bytes).sum::<usize>()
            + self.files.own_len().saturating_sub(self.files.own_values().count()) * ENTRY_OVERHEAD;
        let located = self.locations.as_ref().map_or(0, |l| l.own_len());
        let chunks = (self.chunks.own_len() + self.vectors.own_len() + self.refs.own_len() + located)
            * (32 + ENTRY_OVERHEAD + 8);
        let missing = self.refs.missing_len() * (32 + 8 + 8 + ENTRY_OVERHEAD);
        let tail = self.tail.chunks.iter().map(|(_, c)| chunk_record_bytes(c)).sum::<usize>()
            + self.tail.vector_ids.len() * size_of::<(u64, [u8; 32])>()
            + self.tail.vectors.len() * 4;
        let shared = match (&self.base, &self.segment) {
            (Some(base), _) => Some((base.segment.name.clone(), base.memory_bytes())),
            (None, Some(segment)) => Some((segment.name.clone(), segment.memory_bytes())),
            (None, None) => None,
        };
        Memory { own: (files + chunks + missing + tail) as u64, shared }
    }

    /// Whether a chunk is stored.
    pub fn has_chunk(&self, id: &[u8; 32]) -> bool {
        self.chunks.contains_key(id)
    }

    /// A file's record by obfuscated path.
    pub fn file(&self, path: &str) -> Option<&FileRecord> {
        self.files.get(path)
    }

    /// Entries this state keeps beside the base it shares (its files, chunks, vectors and
    /// places that differ from the segment's): what a fork costs in memory.
    pub fn own_entries(&self) -> usize {
        self.files.own_len()
            + self.chunks.own_len()
            + self.vectors.own_len()
            + self.refs.own_len()
            + self.locations.as_ref().map_or(0, |l| l.own_len())
    }

    /// How many of `sketch` (keyed leaves' first 8 bytes, big-endian) are a file's leaf here.
    pub fn leaves_matching(&self, sketch: &std::collections::HashSet<u64>) -> usize {
        let mut found = std::collections::HashSet::new();
        for f in self.files.values() {
            let mut head = [0u8; 8];
            head.copy_from_slice(&f.leaf[..8]);
            let head = u64::from_be_bytes(head);
            if sketch.contains(&head) {
                found.insert(head);
            }
        }
        found.len()
    }

    /// The shared base, if the state was loaded from a segment.
    pub fn base(&self) -> Option<&Arc<Base>> {
        self.base.as_ref()
    }

    /// Derives what follows the files, chunks and vectors anew, as a state without a base
    /// would: the chunks' places and what lacks a vector, the files that lack a chunk.
    #[cfg(test)]
    pub(crate) fn reindex(&mut self) {
        let vectors = &self.vectors;
        self.refs = refs::Refs::build(self.files.values(), |id| vectors.contains_key(id));
        self.incomplete = self.files.values().filter(|f| !self.stored_whole(f)).map(|f| f.path.clone()).collect();
        self.tree = None;
        self.locations = None;
    }

    /// Whether every chunk of a file is stored.
    pub(crate) fn stored_whole(&self, f: &FileRecord) -> bool {
        crate::base::stored_whole(f, |id| self.chunks.contains_key(id))
    }

    /// A file's leaf in the tree: its own, or blank where a chunk of it is not stored (a
    /// skipped corrupt log object, a chunk dropped by a racing compaction), so that no
    /// client's tree has it and the next sync sends the file again.
    pub(crate) fn leaf(&self, f: &FileRecord) -> [u8; 32] {
        if self.incomplete.contains(&f.path) { [0; 32] } else { f.leaf }
    }

    /// Sets a file's leaf in the tree, if one is built; a change the tree refuses in place
    /// (see [`MerkleTree::insert`]) leaves it to be built anew.
    pub(crate) fn set_leaf(&mut self, path: &str, leaf: [u8; 32]) {
        if let Some(tree) = self.tree.as_mut()
            && !Arc::make_mut(tree).insert(&RelPath::from_bytes(path.as_bytes()), ContentHash(leaf))
        {
            self.tree = None;
        }
    }

    /// Takes a file (or a directory's files) out of the tree, if one is built.
    pub(crate) fn unset_leaf(&mut self, path: &str) {
        if let Some(tree) = self.tree.as_mut()
            && !Arc::make_mut(tree).remove(&RelPath::from_bytes(path.as_bytes()))
        {
            self.tree = None;
        }
    }

    /// A file record no longer current: out of the caches that follow files.
    pub(crate) fn forget_file(&mut self, old: &FileRecord) {
        self.unlocate(old);
        let vectors = &self.vectors;
        self.refs.remove(old, |id| vectors.contains_key(id));
        self.incomplete.remove(&old.path);
    }

    pub(crate) fn apply(&mut self, seq: u64, records: Vec<Record>) {
        if self.tree.as_ref().is_some_and(|t| t.len() != self.files.len()) {
            // A file hidden by a directory of its name: the tree is built anew after changes,
            // as a load would build it, never changed in place.
            self.tree = None;
        }
        let mut stored_new = false;
        for r in records {
            match r {
                Record::Chunk(c) => {
                    if self.chunks.insert(c.id, c.length) {
                        stored_new = true;
                        // The cached tail index grows by the chunk rather than being rebuilt:
                        // a change costs what it adds, not the workspace's size.
                        if let Some(t) = self.tail_lexical.as_mut() {
                            let t = Arc::make_mut(t);
                            t.0.push(c.id);
                            t.1.push(&c.terms, c.length);
                        }
                        self.tail.chunks.push((seq, c));
                    }
                }
                Record::File(f) => {
                    if let Some(old) = self.files.remove(&f.path) {
                        self.forget_file(&old);
                    }
                    self.locate(&f);
                    let vectors = &self.vectors;
                    self.refs.add(&f, |id| vectors.contains_key(id));
                    if !self.stored_whole(&f) {
                        self.incomplete.insert(f.path.clone());
                    }
                    self.set_leaf(&f.path, self.leaf(&f));
                    self.files.insert(f.path.clone(), f);
                }
                Record::Delete(path) => {
                    let below = format!("{path}/");
                    let mut doomed: Vec<String> = self
                        .files
                        .range_from(&below)
                        .take_while(|(p, _)| p.starts_with(&below))
                        .map(|(p, _)| p.clone())
                        .collect();
                    self.unset_leaf(&path);
                    doomed.push(path);
                    for p in doomed {
                        if let Some(old) = self.files.remove(&p) {
                            self.forget_file(&old);
                        }
                    }
                }
                Record::Vectors(b) => self.apply_vectors(seq, b),
            }
        }
        if stored_new && !self.incomplete.is_empty() {
            // A file waiting for a chunk that has now come is found by it, and gets its own
            // leaf back once it has them all.
            let waiting: Vec<FileRecord> = self.incomplete.iter().filter_map(|p| self.files.get(p)).cloned().collect();
            for f in waiting {
                self.unlocate(&f);
                self.locate(&f);
                if self.stored_whole(&f) {
                    self.incomplete.remove(&f.path);
                    self.set_leaf(&f.path, f.leaf);
                }
            }
        }
    }

    pub(crate) fn apply_vectors(&mut self, seq: u64, b: VectorBatch) {
        let dim = b.dim as usize;
        if dim == 0 || b.data.len() != b.ids.len() * dim {
            tracing::error!(model = %b.model, "a vector batch has the wrong shape; ignoring it");
            return;
        }
        if self.model.as_ref().is_some_and(|(m, d)| *m != b.model || *d != dim) {
            // Another model now: the old vectors cannot be compared with the new ones.
            tracing::info!(model = %b.model, "vectors of a new model; dropping the old ones");
            self.vectors.clear();
            self.tail.vector_ids.clear();
            self.tail.vectors.clear();
            let files = self.files.values();
            self.refs = refs::Refs::build(files, |_| false);
        }
        self.model = Some((b.model, dim));
        for (id, row) in b.ids.iter().zip(b.data.chunks_exact(dim)) {
            if self.vectors.contains_key(id) {
                continue;
            }
            let at = u32::try_from(self.tail.vector_ids.len()).unwrap_or(u32::MAX);
            self.tail.vector_ids.push((seq, *id));
            self.tail.vectors.extend_from_slice(row);
            self.vectors.insert(*id, VecAt::Tail(at));
            self.refs.embedded(id);
        }
    }

    /// The Merkle tree over obfuscated paths and keyed leaves, built on first use and then
    /// changed in place by each record (a change costs the depth of the files it touched).
    /// A file with a chunk that is not stored (a skipped corrupt log object, a chunk dropped
    /// by a racing compaction) gets a leaf no client has, so the next sync sends it again.
    /// A state with no changes of its own takes its base's tree.
    pub fn tree(&mut self) -> Arc<MerkleTree> {
        if let Some(t) = &self.tree {
            return t.clone();
        }
        let tree = self.tree_over_base().unwrap_or_else(|| Arc::new(self.tree_anew()));
        self.tree = Some(tree.clone());
        tree
    }

    /// The tree built from the files.
    pub(crate) fn tree_anew(&self) -> MerkleTree {
        MerkleTree::from_files(
            self.files.values().map(|f| (RelPath::from_bytes(f.path.as_bytes()), ContentHash(self.leaf(f)))),
        )
    }

    /// The base's tree with this state's changes made in it (sharing every directory they do
    /// not touch); `None` without a base, or where a change needs the tree built anew (a file
    /// hidden by a directory of its name).
    fn tree_over_base(&self) -> Option<Arc<MerkleTree>> {
        let base = self.base.as_ref()?;
        let mut tree = base.tree();
        let changed: BTreeSet<&String> =
            self.files.own_keys().chain(base.incomplete.iter()).chain(self.incomplete.iter()).collect();
        if changed.is_empty() {
            return Some(tree);
        }
        let t = Arc::make_mut(&mut tree);
        for path in changed {
            let rel = RelPath::from_bytes(path.as_bytes());
            let done = match self.files.get(path.as_str()) {
                Some(f) => t.insert(&rel, ContentHash(self.leaf(f))),
                None => t.remove(&rel),
            };
            if !done {
                return None;
            }
        }
        (t.len() == self.files.len()).then_some(tree)
    }

    /// The vectors' model, if any vectors are stored.
    pub fn model(&self) -> Option<&str> {
        self.model.as_ref().map(|(m, _)| m.as_str())
    }

    /// The stored vector of a chunk by `model`.
    pub fn vector(&self, id: &[u8; 32], model: &str) -> Option<&[f32]> {
        let (m, dim) = self.model.as_ref()?;
        if m != model {
            return None;
        }
        match *self.vectors.get(id)? {
            VecAt::Segment(row) => self.segment.as_ref().map(|s| s.vector(row as usize)),
            VecAt::Tail(row) => self.tail.vectors.get(row as usize * dim..(row as usize + 1) * dim),
        }
    }

    /// Chunks referenced by current files that have no vector by `model`, each once with one
    /// obfuscated path that holds it, up to `limit`, in the order they should be embedded
    /// (see [`STAGES`]; bulk data is never listed); how many there are in all; and each
    /// stage's chunks and missing ones.
    pub fn missing_vectors(&self, model: &str, limit: usize) -> Missing {
        if self.same_model(model) {
            self.refs.missing(limit)
        } else {
            // Another model than the stored vectors': every chunk is missing.
            refs::Refs::build(self.files.values(), |_| false).missing(limit)
        }
    }

    /// Whether the stored vectors (if any) are by `model`: the chunks' places say what
    /// lacks a vector by it.
    pub(crate) fn same_model(&self, model: &str) -> bool {
        self.model.as_ref().is_none_or(|(m, _)| m == model)
    }

    /// The stage of each of `ids` that current files hold (its earliest: a chunk in code and
    /// in a test is code); bulk data and unknown ids are left out.
    pub fn stages_of(&self, ids: &std::collections::HashSet<[u8; 32]>) -> HashMap<[u8; 32], usize> {
        ids.iter().filter_map(|id| self.refs.stage(id).map(|s| (*id, s))).collect()
    }

    /// Distinct chunks referenced by current files that are embedded (not bulk data), and how
    /// many of them have a vector by `model`.
    pub fn vector_progress(&self, model: &str) -> (u64, u64) {
        let (total, with) = self.refs.progress();
        (total, if self.same_model(model) { with } else { 0 })
    }

    /// The current segment, if any.
    pub fn segment(&self) -> Option<&Arc<Segment>> {
        self.segment.as_ref()
    }

    /// Chunks in the current segment (0 without one).
    pub fn segment_chunks(&self) -> usize {
        self.segment.as_ref().map_or(0, |s| s.ids.len())
    }

    /// What the last compaction left unfolded: records (chunks plus vectors) and log objects.
    pub fn tail_size(&self) -> (usize, u64) {
        (self.tail_records().saturating_sub(self.tail.folded), self.tail.objects)
    }

    /// Records (chunks plus vectors) after the segment, a delta's included.
    pub fn tail_records(&self) -> usize {
        self.tail.chunks.len() + self.tail.vector_ids.len()
    }

    /// What a delta compaction of the current state would write; `None` without a segment,
    /// or where the segment's vectors are another model's (only a new segment drops them).
    pub fn delta_plan(&self) -> Option<DeltaPlan> {
        if !self.can_delta() {
            return None;
        }
        let segment = self.segment.as_ref()?;
        let mut records: Vec<Record> = self.tail.chunks.iter().map(|(_, c)| Record::Chunk(c.clone())).collect();
        let mut files = Vec::new();
        for path in self.files.own_keys() {
            match self.files.get(path.as_str()) {
                Some(f) => files.push(Record::File(f.clone())),
                None => records.push(Record::Delete(path.clone())),
            }
        }
        records.extend(files);
        if let Some((model, dim)) = self.model.as_ref().filter(|_| !self.tail.vector_ids.is_empty()) {
            records.push(Record::Vectors(VectorBatch {
                model: model.clone(),
                dim: u32::try_from(*dim).unwrap_or(0),
                ids: self.tail.vector_ids.iter().map(|(_, id)| *id).collect(),
                data: self.tail.vectors.clone(),
            }));
        }
        Some(DeltaPlan {
            seq: self.seq,
            segment: segment.name.clone(),
            segment_seq: segment.seq,
            ann: segment.ann.is_some(),
            records,
        })
    }

    /// Whether [`State::delta_plan`] has a plan (cheap: nothing is copied).
    pub fn can_delta(&self) -> bool {
        let Some(segment) = self.segment.as_ref() else { return false };
        let same_model = segment.vector_ids.is_empty()
            || self
                .model
                .as_ref()
                .is_some_and(|(m, d)| segment.model.as_deref() == Some(m.as_str()) && segment.dim == *d);
        self.base.is_some() && same_model
    }

    /// A delta covering the log up to `seq` was committed: what it holds is folded.
    pub fn delta_folded(&mut self, seq: u64) {
        self.tail.objects = self.seq.saturating_sub(seq);
        self.tail.folded = self.tail.chunks.iter().filter(|(s, _)| *s <= seq).count()
            + self.tail.vector_ids.iter().filter(|(s, _)| *s <= seq).count();
    }

    /// What a compaction of the current state would fold (cheap to take: the tail is
    /// bounded, the old segment shared).
    pub fn compaction_plan(&self) -> CompactionPlan {
        CompactionPlan {
            seq: self.seq,
            files: self.files.values().cloned().collect(),
            old: self.segment.clone(),
            tail_chunks: self.tail.chunks.iter().map(|(_, c)| c.clone()).collect(),
            model: self.model.clone(),
            tail_vector_ids: self.tail.vector_ids.iter().map(|(_, id)| *id).collect(),
            tail_vectors: self.tail.vectors.clone(),
        }
    }

    /// Switches to a newly compacted segment's base, keeping the tail after it: the state
    /// becomes the base with the changes made since the segment's cut replayed over it (the
    /// files that differ from the segment's, the tail's chunks and vectors). A segment no newer
    /// than the current one is ignored.
    pub fn install(&mut self, base: Arc<Base>) {
        let cut = base.segment.seq;
        if self.segment.as_ref().is_some_and(|s| s.seq >= cut) || cut > self.seq {
            return;
        }
        let old = std::mem::take(self);
        let mut next = State::from_base(base);
        next.seq = old.seq;
        if next.model.is_none() {
            next.model = old.model.clone();
        }
        for (seq, c) in old.tail.chunks.into_iter().filter(|(s, _)| *s > cut) {
            next.apply(seq, vec![Record::Chunk(c)]);
        }
        // The files as they are now, where they differ from the segment's.
        let mut gone: Vec<String> = Vec::new();
        let mut puts: Vec<Record> = Vec::new();
        {
            let mut shared = next.files.iter().peekable();
            for (path, f) in old.files.iter() {
                while let Some((p, _)) = shared.next_if(|(p, _)| *p < path) {
                    gone.push(p.clone());
                }
                match shared.next_if(|(p, _)| *p == path) {
                    Some((_, same)) if same == f => {}
                    _ => puts.push(Record::File(f.clone())),
                }
            }
            gone.extend(shared.map(|(p, _)| p.clone()));
        }
        for p in gone {
            if let Some(f) = next.files.remove(&p) {
                next.forget_file(&f);
            }
        }
        if !puts.is_empty() {
            next.apply(cut, puts);
        }
        if let Some((model, dim)) = old.model.clone().filter(|(_, d)| *d > 0) {
            for ((seq, id), row) in old.tail.vector_ids.into_iter().zip(old.tail.vectors.chunks_exact(dim)) {
                if seq > cut && !next.vectors.contains_key(&id) {
                    let batch =
                        VectorBatch { model: model.clone(), dim: dim as u32, ids: vec![id], data: row.to_vec() };
                    next.apply_vectors(seq, batch);
                }
            }
        }
        next.tail.objects = next.seq - cut;
        *self = next;
    }
}
