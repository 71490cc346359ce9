//! Immutable segments: the state folded up to a sequence number, as stored and as searched.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::ann::{AnnIndex, AnnParams};
use crate::bm25::Bm25Index;
use crate::{ANN_THRESHOLD, ChunkRecord, FileRecord};

/// A segment as stored (`seg/<name>`, sealed).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SegmentData {
    pub version: u32,
    /// The last log sequence number folded in.
    pub seq: u64,
    pub files: Vec<FileRecord>,
    /// The chunk table: every stored chunk referenced by a file, with its keyed terms.
    pub chunks: Vec<ChunkRecord>,
    /// The model of the vectors, if any.
    pub model: Option<String>,
    pub dim: u32,
    pub vector_ids: Vec<[u8; 32]>,
    /// Row-major, `dim` wide.
    pub vectors: Vec<f32>,
}

impl SegmentData {
    /// Whether the parts agree: the vector block is `dim` wide for every id, a model names
    /// any vectors, and ids are not repeated.
    pub(crate) fn check(&self) -> crate::Result<()> {
        let dim = self.dim as usize;
        let bad = |why: &str| Err(crate::Error::Inconsistent(format!("segment {}: {why}", self.seq)));
        if self.vector_ids.len().checked_mul(dim) != Some(self.vectors.len()) {
            return bad("the vector block is not one row per id");
        }
        if !self.vector_ids.is_empty() && (dim == 0 || self.model.is_none()) {
            return bad("vectors without a model or a width");
        }
        if !self.chunks.iter().all(ChunkRecord::is_sound) {
            return bad("a chunk counts more tokens than a chunk can hold");
        }
        let mut ids = HashSet::with_capacity(self.chunks.len());
        if !self.chunks.iter().all(|c| ids.insert(c.id)) {
            return bad("a chunk is listed twice");
        }
        let mut ids = HashSet::with_capacity(self.vector_ids.len());
        if !self.vector_ids.iter().all(|id| ids.insert(*id)) {
            return bad("a vector is listed twice");
        }
        Ok(())
    }
}

/// A manifest (`manifest/<n>`, sealed): which segment is current, and the log since it folded
/// into one delta object (`delta/<name>`: the records that turn the segment into the state at
/// `seq`), if any. Written as [`ManifestV1`] when there is no delta, so a reader of that
/// format reads it; a manifest with a delta carries [`MANIFEST_DELTA`] as its version, which
/// such a reader takes for a damaged one (and falls back to the one before).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub version: u32,
    /// The last log sequence number the manifest covers (with its delta).
    pub seq: u64,
    pub segment: String,
    /// The last log sequence number folded into the segment.
    pub segment_seq: u64,
    pub ann: bool,
    pub delta: Option<String>,
}

/// The version of a manifest naming a delta.
pub(crate) const MANIFEST_DELTA: u32 = 2;

/// A manifest without a delta, as first written.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ManifestV1 {
    pub version: u32,
    pub seq: u64,
    pub segment: String,
    pub ann: bool,
}

/// What was read from storage beside a segment's data; missing parts are rebuilt.
#[derive(Default)]
pub(crate) struct Stored {
    pub ann: Option<AnnIndex>,
    pub bm25: Option<Bm25Index>,
}

/// A loaded segment, ready to search: a tantivy BM25 index over the chunk table's keyed
/// terms, the vector block and, above [`ANN_THRESHOLD`] vectors, an HNSW graph over it.
pub struct Segment {
    pub(crate) name: String,
    pub(crate) seq: u64,
    pub(crate) ids: Vec<[u8; 32]>,
    pub(crate) lengths: Vec<u32>,
    pub(crate) bm25: Bm25Index,
    pub(crate) model: Option<String>,
    pub(crate) dim: usize,
    pub(crate) vector_ids: Vec<[u8; 32]>,
    pub(crate) vectors: Vec<f32>,
    pub(crate) ann: Option<AnnIndex>,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("name", &self.name)
            .field("seq", &self.seq)
            .field("chunks", &self.ids.len())
            .field("vectors", &self.vector_ids.len())
            .field("ann", &self.ann.is_some())
            .finish()
    }
}

impl Segment {
    /// Builds the in-memory indexes of stored segment data. `stored` holds the BM25 index and
    /// graph read from storage, when they loaded; missing ones are rebuilt (the graph only when
    /// the segment is large enough to need it).
    pub(crate) fn from_data(name: String, data: &SegmentData, stored: Stored) -> crate::Result<Segment> {
        data.check()?;
        let bm25 = match stored.bm25 {
            Some(b) if b.docs() == data.chunks.len() as u64 => b,
            _ => Bm25Index::build(&data.chunks)?,
        };
        let dim = data.dim as usize;
        let ann = match stored.ann {
            Some(a) if a.len() == data.vector_ids.len() => Some(a),
            other if data.vector_ids.len() >= ANN_THRESHOLD => {
                tracing::info!(
                    vectors = data.vector_ids.len(),
                    stored = other.map(|a| a.len()),
                    "building a segment's graph anew"
                );
                Some(AnnIndex::build(&data.vectors, dim, AnnParams::default())?)
            }
            _ => None,
        };
        Ok(Segment {
            name,
            seq: data.seq,
            ids: data.chunks.iter().map(|c| c.id).collect(),
            lengths: data.chunks.iter().map(|c| c.length).collect(),
            bm25,
            model: data.model.clone(),
            dim,
            vector_ids: data.vector_ids.clone(),
            vectors: data.vectors.clone(),
            ann,
        })
    }

    /// The sequence number this segment covers.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Chunks in the segment.
    pub fn chunks(&self) -> usize {
        self.ids.len()
    }

    /// Vectors in the segment.
    pub fn vectors(&self) -> usize {
        self.vector_ids.len()
    }

    /// Bytes the segment holds: its id and length columns, the vector block, the graph and
    /// the lexical index.
    pub fn memory_bytes(&self) -> u64 {
        let columns = self.ids.len() * (32 + 4) + self.vector_ids.len() * 32 + self.vectors.len() * 4;
        let ann = self.ann.as_ref().map_or(0, |a| a.memory_bytes());
        (columns + ann) as u64 + self.bm25.memory_bytes()
    }

    /// Whether the segment searches vectors through an HNSW graph.
    pub fn has_ann(&self) -> bool {
        self.ann.is_some()
    }

    /// The vector of row `row`.
    pub(crate) fn vector(&self, row: usize) -> &[f32] {
        &self.vectors[row * self.dim..(row + 1) * self.dim]
    }
}

/// What a delta compaction writes: the records that turn the current segment into the state
/// at `seq` (the tail's chunks and vectors, the files that differ from the segment's), as one
/// object beside the segment. It costs what changed since the segment, not the workspace's
/// size, and keeps the segment — shared with forks — as it is.
#[derive(Debug, Clone)]
pub struct DeltaPlan {
    pub(crate) seq: u64,
    pub(crate) segment: String,
    pub(crate) segment_seq: u64,
    pub(crate) ann: bool,
    pub(crate) records: Vec<crate::Record>,
}

impl DeltaPlan {
    /// The sequence number the delta will cover.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// What a compaction folds: the files at `seq`, the old segment, and the tail up to `seq`.
#[derive(Debug, Clone)]
pub struct CompactionPlan {
    pub(crate) seq: u64,
    pub(crate) files: Vec<FileRecord>,
    pub(crate) old: Option<std::sync::Arc<Segment>>,
    pub(crate) tail_chunks: Vec<ChunkRecord>,
    pub(crate) model: Option<(String, usize)>,
    pub(crate) tail_vector_ids: Vec<[u8; 32]>,
    pub(crate) tail_vectors: Vec<f32>,
}

impl CompactionPlan {
    /// The sequence number the compaction will cover.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Builds the new segment's data; `old_chunks` is the old segment's chunk table, re-read
    /// from storage. Chunks no file references any more are dropped. The old vector block is
    /// kept whole, its rows first and in order (so its graph can be extended rather than built
    /// anew), while at most a quarter of it is vectors of chunks no file holds — a chunk
    /// that comes back has its vector still; past that it is rewritten without them. Also
    /// returns how many leading rows are the old block's.
    pub(crate) fn fold(self, old_chunks: Vec<ChunkRecord>) -> (SegmentData, usize) {
        let live: HashSet<[u8; 32]> = self.files.iter().flat_map(|f| f.chunks.iter().map(|c| c.id)).collect();
        let mut seen = HashSet::new();
        let chunks: Vec<ChunkRecord> = old_chunks
            .into_iter()
            .chain(self.tail_chunks)
            .filter(|c| live.contains(&c.id) && seen.insert(c.id))
            .collect();
        let (model, dim) = match &self.model {
            Some((m, d)) => (Some(m.clone()), *d),
            None => (None, 0),
        };
        let mut vector_ids = Vec::new();
        let mut vectors = Vec::new();
        let mut seen = HashSet::new();
        let mut kept = 0;
        if let Some(old) = self.old.as_ref().filter(|o| o.model == model && o.dim == dim) {
            let dead = old.vector_ids.iter().filter(|id| !live.contains(*id)).count();
            if dead * 4 <= old.vector_ids.len() {
                vector_ids.clone_from(&old.vector_ids);
                vectors.clone_from(&old.vectors);
                seen.extend(old.vector_ids.iter().copied());
                kept = old.vector_ids.len();
            } else {
                for (row, id) in old.vector_ids.iter().enumerate() {
                    if live.contains(id) && seen.insert(*id) {
                        vector_ids.push(*id);
                        vectors.extend_from_slice(old.vector(row));
                    }
                }
            }
        }
        if dim > 0 {
            for (id, row) in self.tail_vector_ids.iter().zip(self.tail_vectors.chunks_exact(dim)) {
                if live.contains(id) && seen.insert(*id) {
                    vector_ids.push(*id);
                    vectors.extend_from_slice(row);
                }
            }
        }
        let data = SegmentData {
            version: crate::FORMAT,
            seq: self.seq,
            files: self.files,
            chunks,
            model,
            dim: u32::try_from(dim).unwrap_or(0),
            vector_ids,
            vectors,
        };
        (data, kept)
    }
}

/// The old segment's graph with the rows after its own added, where the new block starts with
/// the old one's rows (`kept` of them, see [`CompactionPlan::fold`]) and has at least
/// `min_rows`: a compaction then costs what the tail added, not the workspace's size (a
/// graph over 95k vectors took a minute of CPU to build). `None`: the segment builds its own.
pub(crate) fn extended_graph(
    old: Option<&Segment>,
    data: &SegmentData,
    kept: usize,
    min_rows: usize,
) -> crate::Result<Option<AnnIndex>> {
    let Some(graph) = old.and_then(|o| o.ann.as_ref()) else { return Ok(None) };
    if kept == 0 || graph.len() != kept || data.vector_ids.len() < min_rows {
        return Ok(None);
    }
    // A copy: the live segment's graph answers searches meanwhile and must not grow.
    let copy = AnnIndex::from_bytes(&graph.to_bytes()?, data.dim as usize, AnnParams::default())?;
    copy.add_rows(&data.vectors, kept)?;
    Ok(Some(copy))
}
