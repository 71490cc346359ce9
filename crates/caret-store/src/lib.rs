//! Per-workspace state on object storage.
//!
//! A workspace is a namespace: a key prefix holding immutable objects. Every commit appends
//! one write-ahead-log object `wal/<seq>` written with create-if-absent, so two writers cannot
//! both take a sequence number and a commit is durable once its put returns. A snapshot
//! `snap/<seq>` folds the state up to `seq` so loading does not replay everything. Readers
//! take the newest readable snapshot, then replay the WAL after it in order.
//!
//! Records hold obfuscated paths, keyed ids and keyed token hashes only: nothing here ever
//! sees plaintext code or real file names. A corrupt WAL object is skipped with a logged error
//! (its files then differ from the client's tree and are sent again); a corrupt snapshot is
//! ignored and the WAL replayed instead.
//!
//! This crate knows nothing about HTTP.

pub mod ann;
pub mod lexical;
pub mod rank;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use caret_workspace::merkle::MerkleTree;
use caret_workspace::{ContentHash, RelPath};
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
    /// Building or searching an ANN index failed.
    #[error("ann index: {0}")]
    Ann(String),
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

/// One log record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// A chunk became available.
    Chunk(ChunkRecord),
    /// A file was added or replaced (its chunks are in this batch or earlier).
    File(FileRecord),
    /// A file, or every file below a directory, was removed.
    Delete(String),
}

#[derive(Serialize, Deserialize)]
struct Batch {
    version: u32,
    records: Vec<Record>,
}

#[derive(Serialize, Deserialize)]
struct Snapshot {
    version: u32,
    seq: u64,
    files: Vec<FileRecord>,
    chunks: Vec<([u8; 32], u32)>,
}

const FORMAT: u32 = 1;
const SNAPSHOT_EVERY: u64 = 64;
const APPEND_ATTEMPTS: u32 = 16;

/// Serialises with postcard and appends a BLAKE3 checksum.
fn seal<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    let mut bytes = postcard::to_stdvec(value).map_err(|e| Error::Encode(e.to_string()))?;
    let sum = blake3::hash(&bytes);
    bytes.extend_from_slice(sum.as_bytes());
    Ok(bytes)
}

/// Checks the checksum and deserialises; `None` for anything corrupt.
fn open<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Option<T> {
    let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(32)?)?;
    if blake3::hash(body).as_bytes() != sum {
        return None;
    }
    postcard::from_bytes(body).ok()
}

/// The state of a workspace: its files and which chunks are stored.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// The last applied log sequence number (0: none).
    pub seq: u64,
    /// Files by obfuscated path.
    pub files: BTreeMap<String, FileRecord>,
    /// Stored chunks: id → length in tokens.
    pub chunks: HashMap<[u8; 32], u32>,
    /// Log objects applied since the last snapshot.
    since_snapshot: u64,
    tree: Option<Arc<MerkleTree>>,
}

impl State {
    fn apply(&mut self, records: Vec<Record>) {
        for r in records {
            match r {
                Record::Chunk(c) => {
                    self.chunks.insert(c.id, c.length);
                }
                Record::File(f) => {
                    self.files.insert(f.path.clone(), f);
                }
                Record::Delete(path) => {
                    self.files.remove(&path);
                    let below = format!("{path}/");
                    let doomed: Vec<String> = self
                        .files
                        .range(below.clone()..)
                        .take_while(|(p, _)| p.starts_with(&below))
                        .map(|(p, _)| p.clone())
                        .collect();
                    for p in doomed {
                        self.files.remove(&p);
                    }
                }
            }
        }
        self.tree = None;
    }

    /// The Merkle tree over obfuscated paths and keyed leaves (cached until the next change).
    pub fn tree(&mut self) -> Arc<MerkleTree> {
        if let Some(t) = &self.tree {
            return t.clone();
        }
        let tree = Arc::new(MerkleTree::from_files(
            self.files.values().map(|f| (RelPath::from_bytes(f.path.as_bytes()), ContentHash(f.leaf))),
        ));
        self.tree = Some(tree.clone());
        tree
    }
}

/// A workspace's namespace on an object store.
#[derive(Debug, Clone)]
pub struct Namespace {
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
}

fn seq_name(seq: u64) -> String {
    format!("{seq:020}")
}

impl Namespace {
    /// The namespace under `prefix` (e.g. `tenants/<t>/workspaces/<w>`).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Self {
        Namespace { store, prefix: ObjPath::from(prefix) }
    }

    fn wal(&self) -> ObjPath {
        self.prefix.child("wal")
    }

    fn snap(&self) -> ObjPath {
        self.prefix.child("snap")
    }

    /// Loads the state: newest readable snapshot, then the log after it.
    pub async fn load(&self) -> Result<State> {
        let mut snaps: Vec<ObjPath> = self.store.list(Some(&self.snap())).map_ok(|m| m.location).try_collect().await?;
        snaps.sort();
        let mut state = State::default();
        for path in snaps.iter().rev() {
            let bytes = self.store.get(path).await?.bytes().await?;
            match open::<Snapshot>(&bytes).filter(|s| s.version == FORMAT) {
                Some(s) => {
                    state.seq = s.seq;
                    state.files = s.files.into_iter().map(|f| (f.path.clone(), f)).collect();
                    state.chunks = s.chunks.into_iter().collect();
                    break;
                }
                None => tracing::error!(object = %path, "snapshot is corrupt; ignoring it and replaying the log"),
            }
        }
        self.refresh(&mut state).await?;
        Ok(state)
    }

    /// Applies log objects newer than `state.seq`, in order.
    pub async fn refresh(&self, state: &mut State) -> Result<()> {
        let offset = self.wal().child(seq_name(state.seq));
        let mut newer: Vec<(u64, ObjPath)> = self
            .store
            .list_with_offset(Some(&self.wal()), &offset)
            .map_ok(|m| m.location)
            .try_collect::<Vec<_>>()
            .await?
            .into_iter()
            .filter_map(|p| p.filename().and_then(|n| n.parse::<u64>().ok()).map(|s| (s, p)))
            .filter(|(s, _)| *s > state.seq)
            .collect();
        newer.sort();
        for (seq, path) in newer {
            let bytes = self.store.get(&path).await?.bytes().await?;
            match open::<Batch>(&bytes).filter(|b| b.version == FORMAT) {
                Some(batch) => state.apply(batch.records),
                None => {
                    tracing::error!(object = %path, "log object is corrupt; skipping it (its files will be synced again)")
                }
            }
            state.seq = seq;
            state.since_snapshot += 1;
        }
        Ok(())
    }

    /// Appends a batch as the next log object; on a race for the sequence number, catches up
    /// and tries the next one. Applies the batch to `state`, and snapshots now and then.
    pub async fn append(&self, state: &mut State, records: Vec<Record>) -> Result<u64> {
        let bytes = bytes::Bytes::from(seal(&Batch { version: FORMAT, records: records.clone() })?);
        for _ in 0..APPEND_ATTEMPTS {
            self.refresh(state).await?;
            let seq = state.seq + 1;
            let path = self.wal().child(seq_name(seq));
            let opts = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
            match self.store.put_opts(&path, PutPayload::from_bytes(bytes.clone()), opts).await {
                Ok(_) => {
                    state.apply(records);
                    state.seq = seq;
                    state.since_snapshot += 1;
                    if state.since_snapshot >= SNAPSHOT_EVERY {
                        self.snapshot(state).await?;
                    }
                    return Ok(seq);
                }
                Err(object_store::Error::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contention { namespace: self.prefix.to_string(), attempts: APPEND_ATTEMPTS })
    }

    /// Writes a snapshot of `state` (an optimisation: losing one costs only replay time).
    pub async fn snapshot(&self, state: &mut State) -> Result<()> {
        let snap = Snapshot {
            version: FORMAT,
            seq: state.seq,
            files: state.files.values().cloned().collect(),
            chunks: state.chunks.iter().map(|(k, v)| (*k, *v)).collect(),
        };
        let path = self.snap().child(seq_name(state.seq));
        let opts = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        match self.store.put_opts(&path, PutPayload::from(seal(&snap)?), opts).await {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {
                state.since_snapshot = 0;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
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

#[cfg(test)]
mod tests;
