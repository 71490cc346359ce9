//! The persisted stat cache: what the last scan learned about each file, keyed by path and
//! trusted while the file's `stat` is unchanged, so an unchanged file costs one `stat`.
//!
//! A file modified within [`RACY_WINDOW_NS`] of being read is not trusted on the next scan
//! (it could have changed again within the same timestamp tick, as git's "racy clean" case).
//! The file format is a small versioned binary with a BLAKE3 checksum; a cache that fails to
//! load for any reason is discarded with a warning and rebuilt, never trusted in part.

use std::io::Write as _;
use std::path::Path;

use crate::walk::FileStat;
use crate::{ContentHash, Error, RelPath, Result};

/// Modification times this close to the read time are not trusted (coarse file systems tick
/// in up to 2 s).
pub const RACY_WINDOW_NS: i64 = 2_000_000_000;

/// The format before the root hash was kept: still read (its root unknown).
const MAGIC_V1: &[u8; 8] = b"CARETSC\x01";
const MAGIC: &[u8; 8] = b"CARETSC\x02";

/// What scanning a file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Indexed: its hash and chunk summary.
    Indexed {
        /// Content hash.
        hash: ContentHash,
        /// Chunks produced.
        chunks: u32,
        /// Chunks withheld because they hold a secret.
        withheld: u32,
        /// Secret findings: rule id and line.
        findings: Vec<(String, u32)>,
    },
    /// Not text.
    Binary {
        /// How that was decided.
        detail: String,
    },
    /// Generated code, by marker.
    Generated {
        /// The marker.
        marker: String,
    },
}

/// One file's cached facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The `stat` when it was read.
    pub stat: FileStat,
    /// Wall-clock time (ns since the epoch) just before it was read.
    pub read_at_ns: i64,
    /// What the scan found.
    pub outcome: Outcome,
}

impl Entry {
    /// Whether this entry still describes a file whose `stat` is now `current`.
    pub fn is_fresh(&self, current: &FileStat) -> bool {
        self.stat == *current && self.stat.mtime_ns.saturating_add(RACY_WINDOW_NS) < self.read_at_ns
    }
}

/// A map keyed by path with a fast hasher (paths are not attacker-chosen here).
pub type PathMap<V> = std::collections::HashMap<RelPath, V, rustc_hash::FxBuildHasher>;

/// The cache of one workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatCache {
    /// Describes what produced the outcomes (chunker and scanner versions); entries made under
    /// another fingerprint keep their hashes but are not trusted for chunk facts.
    pub fingerprint: String,
    /// Entries by path.
    pub entries: PathMap<Entry>,
    /// The Merkle root hash of the files the entries index, when the last scan left it: a scan
    /// that finds every file as recorded reports it without hashing the tree again. The
    /// scanner keeps it; whoever changes `entries` otherwise must clear it.
    pub root: Option<ContentHash>,
}

impl StatCache {
    /// Loads a cache; a missing file gives an empty cache, and so does a corrupt one (with a
    /// warning).
    pub fn load(path: &Path) -> StatCache {
        match std::fs::read(path) {
            Ok(bytes) => decode(&bytes).unwrap_or_else(|| {
                tracing::warn!(path = %path.display(), "stat cache is corrupt or from another version; rebuilding it");
                StatCache::default()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => StatCache::default(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "stat cache unreadable; rebuilding it");
                StatCache::default()
            }
        }
    }

    /// Writes the cache atomically (see [`write_atomic`]).
    pub fn save(&self, path: &Path) -> Result<()> {
        write_atomic(path, &encode(self)).map_err(|e| Error::io("writing stat cache", path, e))
    }
}

/// Writes a file atomically: parents created, a temporary file beside it written and synced
/// (with the permissions of the file it replaces, if any), then renamed over it. Readers see
/// the old content or the new, never a torn file; a failed write leaves no temporary file
/// behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        if let Ok(meta) = std::fs::metadata(path) {
            std::fs::set_permissions(&tmp, meta.permissions())?;
        }
        std::fs::rename(&tmp, path)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

fn encode(cache: &StatCache) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + cache.entries.len() * 96);
    out.extend_from_slice(MAGIC);
    put_bytes(&mut out, cache.fingerprint.as_bytes());
    match cache.root {
        Some(root) => {
            out.push(1);
            out.extend_from_slice(&root.0);
        }
        None => out.push(0),
    }
    put_u64(&mut out, cache.entries.len() as u64);
    let mut entries: Vec<_> = cache.entries.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    for (path, e) in entries {
        put_bytes(&mut out, path.as_bytes());
        let s = &e.stat;
        put_u64(&mut out, s.size);
        put_u64(&mut out, s.mtime_ns as u64);
        put_u64(&mut out, s.ctime_ns as u64);
        put_u64(&mut out, s.ino);
        put_u64(&mut out, s.dev);
        put_u64(&mut out, u64::from(s.mode));
        put_u64(&mut out, e.read_at_ns as u64);
        match &e.outcome {
            Outcome::Indexed { hash, chunks, withheld, findings } => {
                out.push(0);
                out.extend_from_slice(&hash.0);
                put_u64(&mut out, u64::from(*chunks));
                put_u64(&mut out, u64::from(*withheld));
                put_u64(&mut out, findings.len() as u64);
                for (rule, line) in findings {
                    put_bytes(&mut out, rule.as_bytes());
                    put_u64(&mut out, u64::from(*line));
                }
            }
            Outcome::Binary { detail } => {
                out.push(1);
                put_bytes(&mut out, detail.as_bytes());
            }
            Outcome::Generated { marker } => {
                out.push(2);
                put_bytes(&mut out, marker.as_bytes());
            }
        }
    }
    let checksum = blake3::hash(&out);
    out.extend_from_slice(checksum.as_bytes());
    out
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u64(out, b.len() as u64);
    out.extend_from_slice(b);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.u64().and_then(|v| u32::try_from(v).ok())
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }
    fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
}

fn decode(bytes: &[u8]) -> Option<StatCache> {
    let (body, checksum) = bytes.split_at_checked(bytes.len().checked_sub(32)?)?;
    let v1 = body.starts_with(MAGIC_V1);
    if blake3::hash(body).as_bytes() != checksum || !(v1 || body.starts_with(MAGIC)) {
        return None;
    }
    let mut r = Reader(&body[MAGIC.len()..]);
    let fingerprint = r.string()?;
    let root = match if v1 { 0 } else { r.u8()? } {
        0 => None,
        1 => Some(ContentHash(r.take(32)?.try_into().ok()?)),
        _ => return None,
    };
    let count = r.u64()?;
    // Room for what the bytes left can hold (an entry takes at least 61), not for what the
    // count claims: a damaged count must not make a tiny file allocate gigabytes.
    let room = count.min(r.0.len() as u64 / 61);
    let mut entries = PathMap::with_capacity_and_hasher(usize::try_from(room).ok()?, Default::default());
    for _ in 0..count {
        let path = RelPath::from_bytes(r.bytes()?);
        let stat = FileStat {
            size: r.u64()?,
            mtime_ns: r.u64()? as i64,
            ctime_ns: r.u64()? as i64,
            ino: r.u64()?,
            dev: r.u64()?,
            mode: r.u32()?,
        };
        let read_at_ns = r.u64()? as i64;
        let outcome = match r.u8()? {
            0 => {
                let hash = ContentHash(r.take(32)?.try_into().ok()?);
                let chunks = r.u32()?;
                let withheld = r.u32()?;
                let n = r.u64()?;
                let mut findings = Vec::new();
                for _ in 0..n {
                    findings.push((r.string()?, r.u32()?));
                }
                Outcome::Indexed { hash, chunks, withheld, findings }
            }
            1 => Outcome::Binary { detail: r.string()? },
            2 => Outcome::Generated { marker: r.string()? },
            _ => return None,
        };
        entries.insert(path, Entry { stat, read_at_ns, outcome });
    }
    r.0.is_empty().then_some(StatCache { fingerprint, entries, root })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StatCache {
        let mut entries = PathMap::default();
        let stat = FileStat { size: 10, mtime_ns: 1_000, ctime_ns: 2_000, ino: 3, dev: 4, mode: 0o100644 };
        entries.insert(
            RelPath::from_bytes("src/a.rs"),
            Entry {
                stat,
                read_at_ns: 9_000_000_000,
                outcome: Outcome::Indexed {
                    hash: ContentHash::of(b"x"),
                    chunks: 3,
                    withheld: 1,
                    findings: vec![("jwt".to_owned(), 7)],
                },
            },
        );
        entries.insert(
            RelPath::from_bytes(b"bin/\xff.dat".to_vec()),
            Entry { stat, read_at_ns: 5, outcome: Outcome::Binary { detail: "NUL byte".to_owned() } },
        );
        entries.insert(
            RelPath::from_bytes("gen.go"),
            Entry { stat, read_at_ns: 5, outcome: Outcome::Generated { marker: "DO NOT EDIT".to_owned() } },
        );
        StatCache { fingerprint: "fp".to_owned(), entries, root: Some(ContentHash::of(b"root")) }
    }

    #[test]
    fn round_trips_through_disk() {
        let dir = caret_test_support::TempDir::new();
        let path = dir.join("state/cache.bin");
        let cache = sample();
        cache.save(&path).unwrap();
        assert_eq!(StatCache::load(&path), cache);
    }

    #[test]
    fn a_cache_of_the_format_before_roots_loads_with_its_root_unknown() {
        let dir = caret_test_support::TempDir::new();
        let path = dir.join("cache.bin");
        let cache = StatCache { root: None, ..sample() };
        let v2 = encode(&cache);
        // The old layout: the old magic, no root byte after the fingerprint.
        let body = &v2[..v2.len() - 32];
        let after_fingerprint = MAGIC.len() + 8 + cache.fingerprint.len();
        assert_eq!(body[after_fingerprint], 0, "no root");
        let mut v1 = [&MAGIC_V1[..], &body[MAGIC.len()..after_fingerprint], &body[after_fingerprint + 1..]].concat();
        let checksum = blake3::hash(&v1);
        v1.extend_from_slice(checksum.as_bytes());
        std::fs::write(&path, &v1).unwrap();
        assert_eq!(StatCache::load(&path), cache);
        // A bad root marker is a corrupt file.
        let mut bad = body.to_vec();
        bad[after_fingerprint] = 7;
        let checksum = blake3::hash(&bad);
        bad.extend_from_slice(checksum.as_bytes());
        std::fs::write(&path, &bad).unwrap();
        assert_eq!(StatCache::load(&path), StatCache::default());
    }

    #[test]
    fn corrupt_or_truncated_files_load_as_empty() {
        let dir = caret_test_support::TempDir::new();
        let path = dir.join("cache.bin");
        let good = encode(&sample());
        for bad in [&good[..good.len() - 1], &good[..10], &[][..], b"not a cache at all, clearly"] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(StatCache::load(&path), StatCache::default());
        }
        let mut flipped = good.clone();
        flipped[20] ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        assert_eq!(StatCache::load(&path), StatCache::default());
        assert_eq!(StatCache::load(&dir.join("missing.bin")), StatCache::default());
    }

    #[test]
    fn freshness_needs_equal_stat_and_an_old_enough_mtime() {
        let stat = FileStat { size: 1, mtime_ns: 10_000_000_000, ..FileStat::default() };
        let entry = |read_at_ns| Entry { stat, read_at_ns, outcome: Outcome::Binary { detail: String::new() } };
        assert!(entry(20_000_000_000).is_fresh(&stat));
        assert!(!entry(11_000_000_000).is_fresh(&stat), "modified within the racy window of the read");
        assert!(!entry(20_000_000_000).is_fresh(&FileStat { size: 2, ..stat }));
        assert!(!entry(20_000_000_000).is_fresh(&FileStat { ino: 9, ..stat }), "replaced by rename");
    }
}
