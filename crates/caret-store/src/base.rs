//! What a segment says, derived once and shared: every state loaded from one segment (a
//! workspace, and the workspaces forked from it, see [`crate::Namespace::fork_from`]) reads
//! the same files, chunk and vector tables, places and tree, and keeps only its own changes
//! beside them ([`crate::layered`]). A process holds each segment once, through [`Bases`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::mem::size_of;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use caret_workspace::merkle::MerkleTree;
use caret_workspace::{ContentHash, RelPath};

use crate::memory::{ENTRY_OVERHEAD, file_bytes};
use crate::refs::Refs;
use crate::{FileRecord, Segment};

/// Where a chunk's vector is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum VecAt {
    Segment(u32),
    Tail(u32),
}

/// A chunk in the stored-chunks map, in the vectors map and among the embeddable chunks'
/// places (each an entry keyed by its 32-byte id), in bytes (see [`crate::memory`]).
const CHUNK_TABLES: usize = 3 * (32 + ENTRY_OVERHEAD) + size_of::<u32>() + size_of::<VecAt>() + 48;
/// A chunk's entry among where the stored chunks are (built on the first search).
const LOCATION_BYTES: usize = 32 + ENTRY_OVERHEAD + 24 + size_of::<Location>();

/// A stored chunk's place in a current file.
#[derive(Debug, Clone)]
pub(crate) struct Location {
    pub path: Arc<str>,
    pub start_line: u32,
    pub end_line: u32,
    pub kind: Arc<str>,
}

/// A loaded segment with the tables its state derives from it, shared and never changed.
pub struct Base {
    pub(crate) segment: Arc<Segment>,
    pub(crate) files: Arc<BTreeMap<String, FileRecord>>,
    pub(crate) chunks: Arc<HashMap<[u8; 32], u32>>,
    pub(crate) vectors: Arc<HashMap<[u8; 32], VecAt>>,
    pub(crate) refs: Refs,
    /// Files with a chunk the segment does not hold.
    pub(crate) incomplete: BTreeSet<String>,
    /// Bytes the tables above hold (see [`crate::memory`]).
    tables: u64,
    tree: OnceLock<Arc<MerkleTree>>,
    locations: OnceLock<Arc<HashMap<[u8; 32], Vec<Location>>>>,
}

impl std::fmt::Debug for Base {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Base").field("segment", &self.segment).field("files", &self.files.len()).finish()
    }
}

impl Base {
    /// The tables of `segment`, whose files are `files`.
    pub(crate) fn new(segment: Arc<Segment>, files: Vec<FileRecord>) -> Base {
        let files: BTreeMap<String, FileRecord> = files.into_iter().map(|f| (f.path.clone(), f)).collect();
        let chunks: HashMap<[u8; 32], u32> = segment.ids.iter().copied().zip(segment.lengths.iter().copied()).collect();
        let vectors: HashMap<[u8; 32], VecAt> = segment
            .vector_ids
            .iter()
            .enumerate()
            .map(|(i, id)| (*id, VecAt::Segment(u32::try_from(i).unwrap_or(u32::MAX))))
            .collect();
        let refs = Refs::build(files.values(), |id| vectors.contains_key(id));
        let incomplete =
            files.values().filter(|f| !stored_whole(f, |id| chunks.contains_key(id))).map(|f| f.path.clone()).collect();
        let tables = (files.values().map(file_bytes).sum::<usize>() + chunks.len() * CHUNK_TABLES) as u64;
        Base {
            segment,
            files: Arc::new(files),
            chunks: Arc::new(chunks),
            vectors: Arc::new(vectors),
            refs,
            incomplete,
            tables,
            tree: OnceLock::new(),
            locations: OnceLock::new(),
        }
    }

    /// The sequence number the segment covers.
    pub fn seq(&self) -> u64 {
        self.segment.seq
    }

    /// Bytes the segment and the tables derived from it hold.
    pub fn memory_bytes(&self) -> u64 {
        let located = self.locations.get().map_or(0, |l| l.len() * LOCATION_BYTES);
        self.segment.memory_bytes() + self.tables + located as u64
    }

    /// Chunks in the segment.
    pub fn chunks(&self) -> usize {
        self.segment.ids.len()
    }

    /// Vectors in the segment.
    pub fn vectors(&self) -> usize {
        self.segment.vector_ids.len()
    }

    /// The segment.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }

    /// The segment's Merkle tree (a file missing a chunk gets a blank leaf), built once.
    pub(crate) fn tree(&self) -> Arc<MerkleTree> {
        self.tree
            .get_or_init(|| {
                Arc::new(MerkleTree::from_files(self.files.values().map(|f| {
                    let leaf = if self.incomplete.contains(&f.path) { [0; 32] } else { f.leaf };
                    (RelPath::from_bytes(f.path.as_bytes()), ContentHash(leaf))
                })))
            })
            .clone()
    }

    /// Where each of the segment's chunks occurs in its files, built once.
    pub(crate) fn locations(&self) -> Arc<HashMap<[u8; 32], Vec<Location>>> {
        self.locations
            .get_or_init(|| Arc::new(locate_all(self.files.values(), |id| self.chunks.contains_key(id))))
            .clone()
    }
}

/// The bases a process holds, by segment name (unique per compaction; a fork's copy keeps
/// its source's name), so that states loaded from one segment share it. Holds them weakly:
/// a base goes when its last state does.
#[derive(Debug, Default)]
pub struct Bases {
    by_name: Mutex<HashMap<String, Weak<Base>>>,
}

impl Bases {
    /// An empty registry.
    pub fn new() -> Self {
        Bases::default()
    }

    /// The base of segment `name`, if a state holds it.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Base>> {
        self.by_name.lock().unwrap_or_else(|p| p.into_inner()).get(name).and_then(Weak::upgrade)
    }

    /// Registers a base (dropping entries whose bases are gone).
    pub(crate) fn insert(&self, base: &Arc<Base>) {
        let mut map = self.by_name.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, b| b.strong_count() > 0);
        map.insert(base.segment.name.clone(), Arc::downgrade(base));
    }

    /// Bases held now, and the states sharing them (beyond the registry).
    pub fn held(&self) -> (usize, usize) {
        let map = self.by_name.lock().unwrap_or_else(|p| p.into_inner());
        let live: Vec<usize> = map.values().map(Weak::strong_count).filter(|n| *n > 0).collect();
        (live.len(), live.iter().sum())
    }
}

/// Whether every chunk of a file is stored.
pub(crate) fn stored_whole(f: &FileRecord, stored: impl Fn(&[u8; 32]) -> bool) -> bool {
    f.chunks.iter().all(|c| stored(&c.id))
}

/// A file kind as a shared string (the few usual ones interned).
pub(crate) fn kind_of(kind: &str) -> Arc<str> {
    thread_local! {
        static KINDS: HashMap<&'static str, Arc<str>> =
            ["code", "test", "docs", "config", "data"].into_iter().map(|k| (k, Arc::from(k))).collect();
    }
    KINDS.with(|k| k.get(kind).cloned()).unwrap_or_else(|| Arc::from(kind))
}

/// Where every chunk `stored` holds occurs in `files`.
pub(crate) fn locate_all<'a>(
    files: impl Iterator<Item = &'a FileRecord>,
    stored: impl Fn(&[u8; 32]) -> bool,
) -> HashMap<[u8; 32], Vec<Location>> {
    let mut map: HashMap<[u8; 32], Vec<Location>> = HashMap::new();
    for f in files {
        let path: Arc<str> = Arc::from(f.path.as_str());
        for c in f.chunks.iter().filter(|c| stored(&c.id)) {
            map.entry(c.id).or_default().push(Location {
                path: path.clone(),
                start_line: c.start_line,
                end_line: c.end_line,
                kind: kind_of(&c.kind),
            });
        }
    }
    map
}
