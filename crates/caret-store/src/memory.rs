//! What a loaded workspace holds in memory, estimated from its tables' lengths: a server
//! unloads workspaces by it. A segment and the tables derived from it are
//! counted apart, once for every state that shares them (a workspace and its forks); the rest
//! is the state's own ([`crate::State::memory`], [`crate::Base::memory_bytes`],
//! [`crate::Segment::memory_bytes`]). The estimate counts the data and a hash map's or a tree's per-entry
//! overhead, not the allocator's slack.

use std::mem::size_of;

use crate::{ChunkRecord, ChunkRef, FileRecord};

/// Bytes a hash map or a B-tree spends per entry beyond its key and value (control bytes,
/// load factor, node headers), roughly.
pub(crate) const ENTRY_OVERHEAD: usize = 24;
/// Bytes an allocation spends at least (the allocator's smallest class).
const MIN_ALLOCATION: usize = 16;

/// A workspace's memory: its own bytes and the shared segment it is loaded over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    /// Bytes this state alone holds: its changes over the segment, the log's tail, its
    /// chunks waiting for a vector.
    pub own: u64,
    /// The segment it is loaded over (its name, unique per compaction) and the bytes the
    /// segment and its tables hold, shared with every state loaded over the same one.
    pub shared: Option<(String, u64)>,
}

fn heap(len: usize) -> usize {
    if len == 0 { 0 } else { len.max(MIN_ALLOCATION) }
}

fn chunk_ref_bytes(c: &ChunkRef) -> usize {
    size_of::<ChunkRef>() + heap(c.language.len()) + heap(c.kind.len())
}

/// A file record with its path and chunk list, as a map entry.
pub(crate) fn file_bytes(f: &FileRecord) -> usize {
    ENTRY_OVERHEAD
        + size_of::<String>()
        + size_of::<FileRecord>()
        + 2 * heap(f.path.len())
        + f.chunks.iter().map(chunk_ref_bytes).sum::<usize>()
}

pub(crate) fn chunk_record_bytes(c: &ChunkRecord) -> usize {
    size_of::<(u64, ChunkRecord)>() + c.terms.len() * size_of::<(u64, u32)>()
}
