//! Per-workspace index data on object storage.
//!
//! A workspace is a namespace: a key prefix holding immutable objects.
//! - `wal/<seq>`: every commit appends one write-ahead-log object, written with
//!   create-if-absent, so two writers cannot both take a sequence number and a commit is
//!   durable once its put returns.
//! - `seg/<name>`: compaction folds the state up to a sequence number into an immutable
//!   segment (files, the chunk table with keyed terms, the vector block) and `seg/<name>.ann`
//!   (the HNSW graph over the vectors, for large namespaces).
//! - `manifest/<n>`: each compaction commits by writing the next numbered manifest with
//!   create-if-absent, naming its segment and the sequence number it covers; of two
//!   compactors racing, one wins and the other deletes its segment.
//!
//! - A new namespace can start as a fork of another ([`Namespace::fork_from`]): its first
//!   manifest names a copy of the other's current segment, made inside the bucket and keeping
//!   the segment's name; its log continues after the segment's sequence number.
//!
//! In memory, every state loaded from one segment shares what the segment says (a [`Base`]:
//! files, chunk and vector tables, places, tree; held once per process through [`Bases`]) and
//! keeps only its own changes beside it, so a fork costs what it changed.
//!
//! Readers take the newest manifest whose segment is readable, then apply the WAL after it
//! (the tail, kept in memory and searched exactly). Compaction builds outside any lock and
//! swaps in at the end, so readers never wait for it. A corrupt WAL object is skipped with a
//! logged error (its files then differ from the client's tree and are sent again); a corrupt or
//! missing segment is logged and the state rebuilt from an older manifest or the WAL; a
//! corrupt ANN graph is rebuilt from the vector block.
//!
//! Records hold obfuscated paths, keyed ids, keyed token hashes and rotated vectors only:
//! nothing here ever sees plaintext code or real file names. This crate knows nothing about
//! HTTP.

pub mod ann;
mod base;
pub mod bm25;
mod layered;
pub mod lexical;
mod memory;
pub mod objects;
pub mod rank;
mod refs;
mod search;
mod segment;
mod state;

pub use base::{Base, Bases};
pub use memory::Memory;
pub use search::{Query, SearchHit, Weights};
pub use segment::{CompactionPlan, DeltaPlan, Segment};
pub use state::State;

use crate::ann::{AnnIndex, AnnParams};
use crate::bm25::Bm25Index;
use crate::segment::{MANIFEST_DELTA, Manifest, ManifestV1, SegmentData, Stored};

use std::sync::Arc;

use futures::TryStreamExt as _;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object store failed.
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),
    /// Too many concurrent writers raced for the next sequence number.
    #[error("could not append to the log of {namespace} after {attempts} attempts (concurrent writers)")]
    Contention {
        /// The namespace.
        namespace: String,
        /// Attempts made.
        attempts: u32,
    },
    /// Encoding a batch failed.
    #[error("encoding a log batch: {0}")]
    Encode(String),
    /// Log objects this state needs were removed by compaction (it is too old): load again.
    #[error("the log of {0} was compacted past this state; reload it")]
    Gap(String),
    /// Building or searching an ANN index failed.
    #[error("ann index: {0}")]
    Ann(String),
    /// The object store returned fewer bytes than the object has.
    #[error("object store: read {got} of the {expected} bytes of {object}")]
    ShortRead {
        /// The object.
        object: String,
        /// Bytes returned.
        got: u64,
        /// Bytes it has.
        expected: u64,
    },
    /// Stored data whose checksum holds but whose parts disagree (a writer's bug).
    #[error("inconsistent stored data: {0}")]
    Inconsistent(String),
}

impl Error {
    /// Whether the storage itself failed (unreachable, throttling, timing out, short reads,
    /// writers racing): the same request may succeed later. The rest are bugs or bad data.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::ObjectStore(_) | Error::ShortRead { .. } | Error::Contention { .. } | Error::Gap(_))
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A chunk's place in a file: where it is, never what it says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// Keyed chunk id.
    pub id: [u8; 32],
    /// First line, 1-based.
    pub start_line: u32,
    /// Last line, 1-based, inclusive.
    pub end_line: u32,
    /// Language name.
    pub language: String,
    /// File kind.
    pub kind: String,
}

/// The stages chunks are embedded in, first to last: source code (so that search by meaning
/// over the code is complete early), then tests, then docs and everything else.
pub const STAGES: [&str; 3] = ["code", "tests", "docs and other"];

/// The stage (index into [`STAGES`]) of a chunk of a file of `kind`; `None` for bulk data
/// (`data`: translation catalogs, tables), which is searched by its words only.
pub fn stage(kind: &str) -> Option<usize> {
    match kind {
        "code" => Some(0),
        "test" => Some(1),
        "data" => None,
        _ => Some(2),
    }
}

/// One stage's chunks, and how many of them lack a vector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageCount {
    /// Distinct chunks in the stage.
    pub total: u64,
    /// Of which without a vector.
    pub missing: u64,
}

/// What [`State::missing_vectors`] found.
#[derive(Debug, Clone, Default)]
pub struct Missing {
    /// Chunks to embed, in order, each with one obfuscated path that holds it.
    pub chunks: Vec<([u8; 32], String)>,
    /// How many lack a vector in all.
    pub total: usize,
    /// Per stage, in the order of [`STAGES`].
    pub stages: [StageCount; 3],
}

/// A file as indexed: obfuscated path, keyed leaf, chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Obfuscated path.
    pub path: String,
    /// Keyed Merkle leaf.
    pub leaf: [u8; 32],
    /// Chunks in file order.
    pub chunks: Vec<ChunkRef>,
}

/// A stored chunk: its keyed id and lexical data (keyed token hashes with counts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRecord {
    /// Keyed chunk id.
    pub id: [u8; 32],
    /// Tokens in the chunk (for BM25 length normalisation).
    pub length: u32,
    /// Keyed token hash and term frequency, sorted by hash.
    pub terms: Vec<(u64, u32)>,
}

/// The most tokens a chunk may count (its term frequencies summed). A chunk's text is at
/// most 1 MiB, so a real one stays far below; a stored record above it is damage, and is
/// refused before an index is built from it.
pub const MAX_CHUNK_TOKENS: u64 = 1 << 22;

impl ChunkRecord {
    /// Whether the record is one a chunk's text could have made: term frequencies within
    /// [`MAX_CHUNK_TOKENS`] in all.
    pub fn is_sound(&self) -> bool {
        self.terms.iter().map(|(_, tf)| u64::from(*tf)).sum::<u64>() <= MAX_CHUNK_TOKENS
    }
}

/// One log record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Record {
    /// A chunk became available.
    Chunk(ChunkRecord),
    /// A file was added or replaced (its chunks are in this batch or earlier).
    File(FileRecord),
    /// A file, or every file below a directory, was removed.
    Delete(String),
    /// Embeddings of chunks (rotated by the workspace key).
    Vectors(VectorBatch),
}

/// Embeddings of stored chunks by one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VectorBatch {
    /// The model's id.
    pub model: String,
    /// Vector width.
    pub dim: u32,
    /// Keyed chunk ids.
    pub ids: Vec<[u8; 32]>,
    /// Row-major vectors, one row of `dim` per id.
    pub data: Vec<f32>,
}

#[derive(Serialize, Deserialize)]
struct Batch {
    version: u32,
    records: Vec<Record>,
}

impl Batch {
    /// Whether every chunk record in it is sound (see [`ChunkRecord::is_sound`]).
    fn is_sound(&self) -> bool {
        self.records.iter().all(|r| !matches!(r, Record::Chunk(c) if !c.is_sound()))
    }
}

const FORMAT: u32 = 1;
/// Tail records (chunks plus vectors) that make compaction worthwhile.
pub const COMPACT_RECORDS: usize = 20_000;
/// Tail log objects that make compaction worthwhile.
pub const COMPACT_OBJECTS: u64 = 256;
/// Vectors above which a segment carries an HNSW graph; below, exact search is as fast.
pub const ANN_THRESHOLD: usize = 20_000;
const APPEND_ATTEMPTS: u32 = 16;

/// Serialises with postcard and appends a BLAKE3 checksum.
fn seal<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    let mut bytes = postcard::to_stdvec(value).map_err(|e| Error::Encode(e.to_string()))?;
    let sum = blake3::hash(&bytes);
    bytes.extend_from_slice(sum.as_bytes());
    Ok(bytes)
}

/// Raw bytes (a stored index) with a BLAKE3 checksum appended.
fn seal_raw(mut bytes: Vec<u8>) -> Vec<u8> {
    let sum = blake3::hash(&bytes);
    bytes.extend_from_slice(sum.as_bytes());
    bytes
}

/// The body of bytes sealed by [`seal_raw`]; `None` when the sum does not hold.
fn unseal_raw(bytes: &[u8]) -> Option<&[u8]> {
    let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(32)?)?;
    (blake3::hash(body).as_bytes() == sum).then_some(body)
}

/// A stored HNSW graph. Its reader (usearch, C++) trusts the header it is given — a damaged
/// one can make it allocate without bound — so only a graph whose checksum holds reaches it.
fn open_ann(bytes: &[u8], dim: usize) -> Result<AnnIndex> {
    let body = unseal_raw(bytes).ok_or_else(|| Error::Ann("the stored graph's checksum does not hold".into()))?;
    AnnIndex::from_bytes(body, dim, AnnParams::default())
}

/// A stored BM25 index, its checksum checked. tantivy asserts on some damaged files rather
/// than returning an error; such a panic is this index's error too.
fn open_bm25(bytes: &[u8]) -> Result<Bm25Index> {
    let body = unseal_raw(bytes)
        .ok_or_else(|| Error::Inconsistent("the stored BM25 index's checksum does not hold".into()))?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Bm25Index::from_bytes(body)))
        .unwrap_or_else(|_| Err(Error::Inconsistent("the stored BM25 index is damaged".into())))
}

/// Checks the checksum and deserialises; `None` for anything corrupt.
fn open<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Option<T> {
    let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(32)?)?;
    if blake3::hash(body).as_bytes() != sum {
        return None;
    }
    postcard::from_bytes(body).ok()
}

/// A stored manifest of either format; `None` for anything corrupt or of an unknown version.
fn open_manifest(bytes: &[u8]) -> Option<Manifest> {
    if let Some(m) = open::<Manifest>(bytes).filter(|m| m.version == MANIFEST_DELTA) {
        return Some(m);
    }
    open::<ManifestV1>(bytes).filter(|m| m.version == FORMAT).map(|m| Manifest {
        version: FORMAT,
        seq: m.seq,
        segment: m.segment,
        segment_seq: m.seq,
        ann: m.ann,
        delta: None,
    })
}

/// A manifest sealed in the oldest format that holds it.
fn seal_manifest(m: &Manifest) -> Result<Vec<u8>> {
    match &m.delta {
        None => seal(&ManifestV1 { version: FORMAT, seq: m.seq, segment: m.segment.clone(), ann: m.ann }),
        Some(_) => seal(&Manifest { version: MANIFEST_DELTA, ..m.clone() }),
    }
}

/// A workspace's namespace on an object store.
#[derive(Debug, Clone)]
pub struct Namespace {
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    /// Bases loaded by this process, shared with other namespaces' states (forks).
    bases: Option<Arc<Bases>>,
}

fn seq_name(seq: u64) -> String {
    format!("{seq:020}")
}

fn create() -> PutOptions {
    PutOptions { mode: PutMode::Create, ..PutOptions::default() }
}

impl Namespace {
    /// The namespace under `prefix` (e.g. `tenants/<t>/workspaces/<w>`).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Self {
        Namespace { store, prefix: ObjPath::from(prefix), bases: None }
    }

    /// Shares loaded segments through `bases`: a state loaded from a segment another state
    /// of this process holds (its own earlier copy, or the workspace it was forked from)
    /// reads it from memory instead of the bucket, and shares its tables.
    pub fn with_bases(mut self, bases: Arc<Bases>) -> Self {
        self.bases = Some(bases);
        self
    }

    /// Where the namespace's objects live (for logs).
    pub fn prefix(&self) -> &str {
        self.prefix.as_ref()
    }

    fn wal(&self) -> ObjPath {
        self.prefix.child("wal")
    }

    fn manifests(&self) -> ObjPath {
        self.prefix.child("manifest")
    }

    fn seg(&self, name: &str) -> ObjPath {
        self.prefix.child("seg").child(name)
    }

    fn ann(&self, name: &str) -> ObjPath {
        self.prefix.child("seg").child(format!("{name}.ann"))
    }

    fn delta(&self, name: &str) -> ObjPath {
        self.prefix.child("delta").child(name)
    }

    fn bm25(&self, name: &str) -> ObjPath {
        self.prefix.child("seg").child(format!("{name}.bm25"))
    }

    /// An object whole: a read that returns fewer bytes than the object has is an error (a
    /// storage fault to retry), never data to decode.
    async fn get(&self, path: &ObjPath) -> Result<bytes::Bytes> {
        let result = self.store.get(path).await?;
        let expected = result.range.end - result.range.start;
        let bytes = result.bytes().await?;
        if bytes.len() as u64 != expected {
            return Err(Error::ShortRead { object: path.to_string(), got: bytes.len() as u64, expected });
        }
        Ok(bytes)
    }

    /// Manifest numbers and paths, newest first.
    async fn list_manifests(&self) -> Result<Vec<(u64, ObjPath)>> {
        let mut found: Vec<(u64, ObjPath)> = self
            .store
            .list(Some(&self.manifests()))
            .map_ok(|m| m.location)
            .try_collect::<Vec<_>>()
            .await?
            .into_iter()
            .filter_map(|p| p.filename().and_then(|n| n.parse::<u64>().ok()).map(|n| (n, p)))
            .collect();
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        Ok(found)
    }

    /// Reads a manifest's segment and builds its indexes; `None` (logged) when anything of it
    /// is unreadable, so the caller falls back to an older one or the log.
    async fn open_segment(&self, manifest: &ObjPath) -> Result<Option<(Arc<Base>, Manifest)>> {
        // A storage fault is not a corrupt manifest: falling back to an older generation on
        // a failed read could find its log collected and start the namespace empty.
        let bytes = match self.get(manifest).await {
            Ok(b) => Some(b),
            Err(Error::ObjectStore(object_store::Error::NotFound { .. })) => None,
            Err(e) => return Err(e),
        };
        let Some(m) = bytes.and_then(|b| open_manifest(&b)) else {
            tracing::error!(object = %manifest, "manifest is corrupt; trying an older one");
            return Ok(None);
        };
        if let Some(base) = self.bases.as_ref().and_then(|b| b.get(&m.segment)).filter(|b| b.seq() == m.segment_seq) {
            // Held by this process already (names are unique per compaction): shared, not
            // read again. A segment whose object was damaged since is still whole in memory.
            return Ok(Some((base, m)));
        }
        let data = match self.get(&self.seg(&m.segment)).await {
            Ok(bytes) => open::<SegmentData>(&bytes)
                .filter(|d| d.version == FORMAT && d.seq == m.segment_seq && d.check().is_ok()),
            Err(Error::ObjectStore(object_store::Error::NotFound { .. })) => None,
            Err(e) => return Err(e),
        };
        let Some(data) = data else {
            tracing::error!(segment = %m.segment, "segment is corrupt or missing; rebuilding from an older one and the log");
            return Ok(None);
        };
        let dim = data.dim as usize;
        let mut stored = Stored::default();
        if m.ann {
            match self.get(&self.ann(&m.segment)).await {
                Ok(bytes) => match open_ann(&bytes, dim) {
                    Ok(a) => stored.ann = Some(a),
                    Err(e) => tracing::warn!(segment = %m.segment, "ANN graph is unreadable ({e}); rebuilding it"),
                },
                Err(e) => tracing::warn!(segment = %m.segment, "ANN graph is missing ({e}); rebuilding it"),
            }
        }
        match self.get(&self.bm25(&m.segment)).await {
            Ok(bytes) => match open_bm25(&bytes) {
                Ok(b) => stored.bm25 = Some(b),
                Err(e) => tracing::warn!(segment = %m.segment, "BM25 index is unreadable ({e}); rebuilding it"),
            },
            Err(e) => tracing::warn!(segment = %m.segment, "BM25 index is missing ({e}); rebuilding it"),
        }
        let rebuilt = (stored.bm25.is_none(), m.ann && stored.ann.is_none());
        let name = m.segment.clone();
        let built = tokio::task::spawn_blocking(move || {
            Segment::from_data(name, &data, stored).map(|s| {
                let s = Arc::new(s);
                (s.clone(), Base::new(s, data.files))
            })
        })
        .await
        .map_err(|e| Error::Encode(format!("segment task: {e}")))??;
        // What was rebuilt is stored again (sealed), so the next load reads it instead of
        // rebuilding: a damaged or older index mends itself once. Best effort.
        if rebuilt.0
            && let Ok(bytes) = built.0.bm25.to_bytes()
            && let Err(e) = self.store.put(&self.bm25(&m.segment), PutPayload::from(seal_raw(bytes))).await
        {
            tracing::warn!(segment = %m.segment, "storing the rebuilt BM25 index: {e}");
        }
        if rebuilt.1
            && let Some(ann) = &built.0.ann
            && let Ok(bytes) = ann.to_bytes()
            && let Err(e) = self.store.put(&self.ann(&m.segment), PutPayload::from(seal_raw(bytes))).await
        {
            tracing::warn!(segment = %m.segment, "storing the rebuilt ANN graph: {e}");
        }
        let base = Arc::new(built.1);
        if let Some(bases) = &self.bases {
            bases.insert(&base);
        }
        Ok(Some((base, m)))
    }

    /// The state a manifest describes: its segment's base, with its delta's records applied
    /// (as the log after the segment). `None` (logged) when its delta is unreadable, so the
    /// caller falls back to an older generation and the log it kept.
    async fn open_manifest_state(&self, manifest: &ObjPath) -> Result<Option<State>> {
        let Some((base, m)) = self.open_segment(manifest).await? else { return Ok(None) };
        let mut state = State::from_base(base);
        if let Some(delta) = &m.delta {
            let bytes = match self.get(&self.delta(delta)).await {
                Ok(b) => Some(b),
                Err(Error::ObjectStore(object_store::Error::NotFound { .. })) => None,
                Err(e) => return Err(e),
            };
            let Some(batch) = bytes.and_then(|b| open::<Batch>(&b)).filter(|b| b.version == FORMAT && b.is_sound())
            else {
                tracing::error!(delta = %delta, "a manifest's delta is corrupt or missing; trying an older one");
                return Ok(None);
            };
            state.apply(m.seq, batch.records);
        }
        state.seq = m.seq;
        state.tail.folded = state.tail_records();
        Ok(Some(state))
    }

    /// Loads the state: the newest readable segment, then the log after it. If compaction
    /// removes log objects meanwhile, it starts over; if no readable segment and log are left
    /// at all (both kept generations damaged), it logs an error and starts empty at the end
    /// of the log, so clients send everything again.
    pub async fn load(&self) -> Result<State> {
        for _ in 0..3 {
            let mut state = State::default();
            for (_, path) in self.list_manifests().await? {
                if let Some(loaded) = self.open_manifest_state(&path).await? {
                    state = loaded;
                    break;
                }
            }
            match self.refresh(&mut state).await {
                Ok(()) => return Ok(state),
                Err(Error::Gap(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        tracing::error!(namespace = %self.prefix, "no readable segment covers the kept log; starting empty (clients will resend)");
        Ok(State { seq: self.wal_seqs(0).await?.last().map_or(0, |(s, _)| *s), ..State::default() })
    }

    /// Log objects after `after`, in order.
    async fn wal_seqs(&self, after: u64) -> Result<Vec<(u64, ObjPath)>> {
        let offset = self.wal().child(seq_name(after));
        let mut newer: Vec<(u64, ObjPath)> = self
            .store
            .list_with_offset(Some(&self.wal()), &offset)
            .map_ok(|m| m.location)
            .try_collect::<Vec<_>>()
            .await?
            .into_iter()
            .filter_map(|p| p.filename().and_then(|n| n.parse::<u64>().ok()).map(|s| (s, p)))
            .filter(|(s, _)| *s > after)
            .collect();
        newer.sort();
        Ok(newer)
    }

    /// Applies log objects newer than `state.seq`, in order. [`Error::Gap`] when the next
    /// one was removed by compaction (the state must be loaded again).
    pub async fn refresh(&self, state: &mut State) -> Result<()> {
        let newer = self.wal_seqs(state.seq).await?;
        if newer.first().is_some_and(|(s, _)| *s != state.seq + 1) {
            return Err(Error::Gap(self.prefix.to_string()));
        }
        for (seq, path) in newer {
            let bytes = match self.get(&path).await {
                Ok(b) => b,
                Err(Error::ObjectStore(object_store::Error::NotFound { .. })) => {
                    return Err(Error::Gap(self.prefix.to_string()));
                }
                Err(e) => return Err(e),
            };
            match open::<Batch>(&bytes).filter(|b| b.version == FORMAT && b.is_sound()) {
                Some(batch) => state.apply(seq, batch.records),
                None => {
                    tracing::error!(object = %path, "log object is corrupt; skipping it (its files will be synced again)")
                }
            }
            state.seq = seq;
            state.tail.objects += 1;
        }
        Ok(())
    }

    /// After manifest `current` committed: removes what two kept generations no longer need —
    /// manifests and segments older than the previous one, and log objects the previous
    /// segment covers (so a corrupt current segment can still be rebuilt from the previous
    /// one plus the log). Best effort: leftovers only cost space.
    async fn collect_garbage(&self, current: u64) -> Result<()> {
        let manifests = self.list_manifests().await?;
        let Some((prev_n, prev_path)) = manifests.iter().find(|(n, _)| *n < current) else { return Ok(()) };
        let Some(prev) = open_manifest(&self.get(prev_path).await?) else { return Ok(()) };
        let Some((_, current_path)) = manifests.iter().find(|(n, _)| *n == current) else { return Ok(()) };
        let Some(current) = open_manifest(&self.get(current_path).await?) else { return Ok(()) };
        // A delta compaction keeps its segment: what the two kept generations name stays.
        let segments = [current.segment.as_str(), prev.segment.as_str()];
        let deltas = [current.delta.as_deref(), prev.delta.as_deref()];
        for (n, path) in manifests.iter().filter(|(n, _)| n < prev_n) {
            if let Some(m) = self.get(path).await.ok().and_then(|b| open_manifest(&b)) {
                if !segments.contains(&m.segment.as_str()) {
                    self.discard(&m.segment).await;
                }
                if let Some(delta) = m.delta.as_deref().filter(|d| !deltas.contains(&Some(*d))) {
                    let _ = self.store.delete(&self.delta(delta)).await;
                }
            }
            let _ = self.store.delete(path).await;
            tracing::debug!(manifest = n, "removed an old generation");
        }
        for (_, path) in self.wal_seqs(0).await?.into_iter().take_while(|(s, _)| *s <= prev.seq) {
            let _ = self.store.delete(&path).await;
        }
        Ok(())
    }

    /// Appends a batch as the next log object; on a race for the sequence number, catches up
    /// and tries the next one. Applies the batch to `state`.
    pub async fn append(&self, state: &mut State, records: Vec<Record>) -> Result<u64> {
        self.append_from(state, records, false).await
    }

    /// [`append`](Self::append) for a caller that knows `state` was current moments ago (the
    /// metadata database said so): the first try lists nothing. The next number is claimed by
    /// a create-only put, so a copy that fell behind meanwhile loses the race and catches up.
    pub async fn append_current(&self, state: &mut State, records: Vec<Record>) -> Result<u64> {
        self.append_from(state, records, true).await
    }

    async fn append_from(&self, state: &mut State, records: Vec<Record>, current: bool) -> Result<u64> {
        let bytes = bytes::Bytes::from(seal(&Batch { version: FORMAT, records: records.clone() })?);
        for attempt in 0..APPEND_ATTEMPTS {
            if attempt > 0 || !current {
                self.refresh(state).await?;
            }
            let seq = state.seq + 1;
            let path = self.wal().child(seq_name(seq));
            match self.store.put_opts(&path, PutPayload::from_bytes(bytes.clone()), create()).await {
                Ok(_) => {
                    state.apply(seq, records);
                    state.seq = seq;
                    state.tail.objects += 1;
                    return Ok(seq);
                }
                Err(object_store::Error::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contention { namespace: self.prefix.to_string(), attempts: APPEND_ATTEMPTS })
    }

    /// Folds a plan into a new segment and commits it with the next manifest. Runs without
    /// any lock on the state: install the result with [`State::install`]. `Ok(None)` when
    /// another compactor committed first (its segment wins; ours is deleted).
    pub async fn compact(&self, plan: CompactionPlan) -> Result<Option<Arc<Base>>> {
        let old_chunks = match &plan.old {
            Some(old) => {
                let bytes = self.get(&self.seg(&old.name)).await?;
                open::<SegmentData>(&bytes)
                    .ok_or_else(|| Error::Encode(format!("segment {} became unreadable", old.name)))?
                    .chunks
            }
            None => Vec::new(),
        };
        let name = format!("{}-{}", seq_name(plan.seq), &blake3::hash(&nonce()).to_hex()[..16]);
        // Folding, indexing and encoding are CPU-bound: off the runtime's threads.
        let (segment, sealed, bm25, ann) = {
            let name = name.clone();
            tokio::task::spawn_blocking(move || {
                let old = plan.old.clone();
                let (data, kept) = plan.fold(old_chunks);
                let ann = segment::extended_graph(old.as_deref(), &data, kept, ANN_THRESHOLD)?;
                drop(old);
                let segment = Arc::new(Segment::from_data(name, &data, Stored { ann, bm25: None })?);
                let sealed = seal(&data)?;
                let bm25 = seal_raw(segment.bm25.to_bytes()?);
                let ann = segment.ann.as_ref().map(|a| a.to_bytes().map(seal_raw)).transpose()?;
                let base = Base::new(segment, data.files);
                Ok::<_, Error>((base, sealed, bm25, ann))
            })
            .await
            .map_err(|e| Error::Encode(format!("compaction task: {e}")))??
        };
        let store = self.store.as_ref();
        objects::put_new(store, &self.seg(&name), sealed.into(), objects::ONE_REQUEST).await?;
        objects::put_new(store, &self.bm25(&name), bm25.into(), objects::ONE_REQUEST).await?;
        if let Some(ann) = ann {
            objects::put_new(store, &self.ann(&name), ann.into(), objects::ONE_REQUEST).await?;
        }
        let manifests = self.list_manifests().await?;
        let next = manifests.first().map_or(1, |(n, _)| n + 1);
        if let Some((_, newest)) = manifests.first() {
            let covered = self.get(newest).await.ok().and_then(|b| open_manifest(&b)).map(|m| m.seq);
            if covered.is_some_and(|seq| seq >= segment.seq()) {
                tracing::info!(namespace = %self.prefix, "a newer compaction committed first; discarding ours");
                self.discard(&name).await;
                return Ok(None);
            }
        }
        let manifest = Manifest {
            version: FORMAT,
            seq: segment.seq(),
            segment: name.clone(),
            segment_seq: segment.seq(),
            ann: segment.segment.ann.is_some(),
            delta: None,
        };
        let path = self.manifests().child(seq_name(next));
        match self.store.put_opts(&path, PutPayload::from(seal_manifest(&manifest)?), create()).await {
            Ok(_) => {
                if let Err(e) = self.collect_garbage(next).await {
                    tracing::warn!(namespace = %self.prefix, "removing old generations failed: {e}");
                }
                let base = Arc::new(segment);
                if let Some(bases) = &self.bases {
                    bases.insert(&base);
                }
                Ok(Some(base))
            }
            Err(object_store::Error::AlreadyExists { .. }) => {
                tracing::info!(namespace = %self.prefix, "another compaction committed first; discarding ours");
                self.discard(&name).await;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Writes a delta plan as one object beside the current segment and commits it with the
    /// next manifest (see [`DeltaPlan`]): the log it covers is folded without touching the
    /// segment. Runs without any lock on the state: mark it with [`State::delta_folded`].
    /// `Ok(None)` when another compaction committed first (ours is deleted).
    pub async fn compact_delta(&self, plan: DeltaPlan) -> Result<Option<u64>> {
        let name = format!("{}-{}", seq_name(plan.seq), &blake3::hash(&nonce()).to_hex()[..16]);
        let records = plan.records;
        let sealed = tokio::task::spawn_blocking(move || seal(&Batch { version: FORMAT, records }))
            .await
            .map_err(|e| Error::Encode(format!("delta task: {e}")))??;
        objects::put_new(self.store.as_ref(), &self.delta(&name), sealed.into(), objects::ONE_REQUEST).await?;
        let manifests = self.list_manifests().await?;
        let next = manifests.first().map_or(1, |(n, _)| n + 1);
        let discard = async || {
            let _ = self.store.delete(&self.delta(&name)).await;
        };
        if let Some((_, newest)) = manifests.first() {
            let covered = self.get(newest).await.ok().and_then(|b| open_manifest(&b)).map(|m| m.seq);
            if covered.is_some_and(|seq| seq >= plan.seq) {
                tracing::info!(namespace = %self.prefix, "a newer compaction committed first; discarding our delta");
                discard().await;
                return Ok(None);
            }
        }
        let manifest = Manifest {
            version: MANIFEST_DELTA,
            seq: plan.seq,
            segment: plan.segment,
            segment_seq: plan.segment_seq,
            ann: plan.ann,
            delta: Some(name.clone()),
        };
        let path = self.manifests().child(seq_name(next));
        match self.store.put_opts(&path, PutPayload::from(seal_manifest(&manifest)?), create()).await {
            Ok(_) => {
                if let Err(e) = self.collect_garbage(next).await {
                    tracing::warn!(namespace = %self.prefix, "removing old generations failed: {e}");
                }
                Ok(Some(plan.seq))
            }
            Err(object_store::Error::AlreadyExists { .. }) => {
                tracing::info!(namespace = %self.prefix, "another compaction committed first; discarding our delta");
                discard().await;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Starts this namespace, which must hold nothing yet, from `source`'s current segment: its
    /// objects are copied under this prefix keeping their name (a copy inside the bucket: a
    /// hard link on a local directory, a server-side copy on S3; no bytes pass through this
    /// process), and this namespace's first manifest names the copy. A process holding that
    /// segment then shares it between both states ([`Bases`]). Returns the sequence number
    /// the copy covers, where this namespace's log continues; `None` when this namespace is
    /// not empty, `source` has no readable manifest, or another writer came first.
    pub async fn fork_from(&self, source: &Namespace) -> Result<Option<u64>> {
        if !self.list_manifests().await?.is_empty() || !self.wal_seqs(0).await?.is_empty() {
            return Ok(None);
        }
        let Some((_, newest)) = source.list_manifests().await?.into_iter().next() else { return Ok(None) };
        let Some(m) = open_manifest(&source.get(&newest).await?) else { return Ok(None) };
        let (store, limit) = (self.store.as_ref(), objects::ONE_REQUEST);
        objects::copy(store, &source.seg(&m.segment), &self.seg(&m.segment), limit).await?;
        if let Some(delta) = &m.delta {
            objects::copy(store, &source.delta(delta), &self.delta(delta), limit).await?;
        }
        let mut indexes = vec![(source.bm25(&m.segment), self.bm25(&m.segment))];
        if m.ann {
            indexes.push((source.ann(&m.segment), self.ann(&m.segment)));
        }
        for (from, to) in indexes {
            match objects::copy(store, &from, &to, limit).await {
                // A missing index is rebuilt when the segment loads, as for any segment.
                Ok(()) | Err(Error::ObjectStore(object_store::Error::NotFound { .. })) => {}
                Err(e) => return Err(e),
            }
        }
        let first = self.manifests().child(seq_name(1));
        match self.store.put_opts(&first, PutPayload::from(seal_manifest(&m)?), create()).await {
            Ok(_) => Ok(Some(m.seq)),
            Err(object_store::Error::AlreadyExists { .. }) => {
                // Another fork of this namespace won (its copies have the same names); a
                // compaction cannot have, the namespace had no log.
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes a segment no manifest names (best effort: an orphan is only wasted space).
    async fn discard(&self, name: &str) {
        let _ = self.store.delete(&self.seg(name)).await;
        let _ = self.store.delete(&self.ann(name)).await;
        let _ = self.store.delete(&self.bm25(name)).await;
    }

    /// Removes every object of the namespace.
    pub async fn destroy(&self) -> Result<()> {
        let paths: Vec<ObjPath> = self.store.list(Some(&self.prefix)).map_ok(|m| m.location).try_collect().await?;
        for p in paths {
            self.store.delete(&p).await?;
        }
        Ok(())
    }
}

/// A value unique to this call (segment names must not collide between compactors).
fn nonce() -> Vec<u8> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mut v = now.to_le_bytes().to_vec();
    v.extend_from_slice(&std::process::id().to_le_bytes());
    v.extend_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    v
}

#[cfg(test)]
mod tests;

/// Entry points for the fuzz targets (`crates/caret-fuzz`): the decoders of stored objects, fed
/// from memory, and a search over what they decode to. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    fn sealed(body: &[u8]) -> Vec<u8> {
        let mut bytes = body.to_vec();
        bytes.extend_from_slice(blake3::hash(body).as_bytes());
        bytes
    }

    /// Searches `state` with terms and a vector taken from `salt`: every ranking path runs.
    fn search_all(state: &mut State, salt: u64) {
        let vector =
            state.model.clone().map(|(m, dim)| (m, (0..dim).map(|i| ((i as u64 ^ salt) % 7) as f32 - 3.0).collect()));
        let terms: Vec<u64> = state
            .chunks
            .iter()
            .map(|(id, _)| id)
            .take(4)
            .map(|id| u64::from_le_bytes([id[0], id[1], id[2], id[3], id[4], id[5], id[6], id[7]]) ^ salt)
            .collect();
        for k in [1, 10] {
            let q = Query {
                terms: terms.clone(),
                definitions: terms.clone(),
                symbols: terms.clone(),
                vector: vector.clone(),
                k,
                candidates: 100,
                weights: Weights::default(),
            };
            let hits = state.search(&q);
            assert!(hits.len() <= k, "more hits than asked for");
            let _ = state.tree();
            let _ = state.missing_vectors(state.model().unwrap_or("m"), 10);
        }
    }

    /// A log object's body (the checksum is added here): decoded; when it decodes, applied to
    /// an empty state, which is then searched.
    pub fn log_object(body: &[u8]) {
        if let Some(batch) = open::<Batch>(&sealed(body)).filter(Batch::is_sound) {
            let mut state = State::default();
            state.apply(1, batch.records.clone());
            state.apply(2, batch.records);
            search_all(&mut state, body.len() as u64);
        }
    }

    /// A segment's body (the checksum is added here): decoded; when it decodes and is
    /// consistent, built and searched. An inconsistent one must be refused, not built.
    pub fn segment(body: &[u8]) {
        let Some(data) = open::<SegmentData>(&sealed(body)) else { return };
        let built = Segment::from_data("fuzz".to_owned(), &data, Stored::default());
        match data.check() {
            Ok(()) => {
                let segment = Arc::new(built.unwrap_or_else(|e| panic!("a consistent segment failed to build: {e}")));
                let mut state = State::from_base(Arc::new(Base::new(segment, data.files)));
                search_all(&mut state, body.len() as u64);
            }
            Err(_) => assert!(built.is_err(), "an inconsistent segment was built"),
        }
    }

    /// A stored BM25 index as stored (checksum included): refused unless its sum holds.
    /// tantivy's reader behind the checksum trusts the lengths in its files (a file swapped
    /// for another, each with a valid footer, can make it allocate without bound), so the
    /// checksum is what guards it, as for the HNSW graph.
    pub fn bm25(bytes: &[u8]) {
        let _ = open_bm25(bytes);
    }

    /// A stored HNSW graph of `dim`-wide vectors, as stored (checksum included): refused
    /// unless its sum holds. The graph reader behind the checksum is usearch's own.
    pub fn ann(bytes: &[u8], dim: usize) {
        let _ = open_ann(bytes, dim);
    }
}
