//! A scan: walk the workspace, read what changed, classify, hash, chunk and check for secrets,
//! and compare with the previous scan's files; the Merkle tree is built on demand.
//!
//! Unchanged files (equal `stat`, see [`crate::statcache`]) are not opened. Files are read
//! once, checked again with `fstat` after reading, and re-read when they changed meanwhile.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use rayon::prelude::*;
use regex::bytes::Regex;

use crate::chunk::{Chunk, Chunker};
use crate::merkle::{MerkleTree, TreeDiff};
use crate::secrets::{Finding, SecretScanner};
use crate::statcache::{Entry, Outcome, StatCache};
use crate::walk::{self, DefaultRule, FileStat, SkipReason, Skipped, WalkConfig, WalkOutput, WalkedFile};
use crate::{ContentHash, Error, RelPath, Result};

/// How much work a scan does per changed file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Hash, chunk and check for secrets (what `caret scan` reports).
    Full,
    /// Read, classify and hash only: enough for the Merkle tree. Sync uses it and chunks just
    /// the files that changed, once.
    Hash,
}

/// An indexed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedFile {
    /// Path relative to the root.
    pub path: RelPath,
    /// Size in bytes.
    pub size: u64,
    /// Content hash (the Merkle leaf).
    pub hash: ContentHash,
    /// Chunks produced (0 under [`Depth::Hash`]).
    pub chunks: u32,
    /// Chunks withheld because they contain a secret.
    pub withheld: u32,
    /// Secret findings: rule and line.
    pub findings: Vec<(String, u32)>,
}

/// Counters of a scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Files served from the stat cache without being opened.
    pub cache_hits: usize,
    /// Files read.
    pub files_read: usize,
    /// Bytes read.
    pub bytes_read: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Whether the stat cache changed (and so is worth saving).
    pub cache_changed: bool,
}

/// The result of a scan.
#[derive(Debug)]
pub struct ScanReport {
    /// The canonical root.
    pub root: PathBuf,
    /// Indexed files, sorted by path.
    pub files: Vec<ScannedFile>,
    /// Skipped paths with reasons, sorted by path.
    pub skipped: Vec<Skipped>,
    /// Changes since the previous scan recorded in the cache (`None` on a first scan).
    pub changes: Option<TreeDiff>,
    /// Counters.
    pub stats: ScanStats,
    /// The Merkle root of `files`, from the stat cache when nothing changed since it was
    /// recorded, else hashed by the scan.
    root_hash: ContentHash,
}

impl ScanReport {
    /// The Merkle tree of the indexed files (built on demand: a sync keys its own).
    pub fn tree(&self) -> MerkleTree {
        MerkleTree::from_files(self.files.iter().map(|f| (&f.path, f.hash)))
    }

    /// Its root hash (what [`ScanReport::tree`]'s root would be, without building the tree).
    pub fn root_hash(&self) -> ContentHash {
        self.root_hash
    }

    /// Total bytes of indexed files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// Total chunks that would be indexed (withheld ones excluded).
    pub fn chunks(&self) -> u64 {
        self.files.iter().map(|f| u64::from(f.chunks - f.withheld)).sum()
    }

    /// Chunks withheld for secrets.
    pub fn withheld(&self) -> u64 {
        self.files.iter().map(|f| u64::from(f.withheld)).sum()
    }

    /// Files with at least one secret finding.
    pub fn files_with_secrets(&self) -> usize {
        self.files.iter().filter(|f| !f.findings.is_empty()).count()
    }
}

/// Scans workspaces.
#[derive(Debug)]
pub struct Scanner {
    walk: WalkConfig,
    chunker: Chunker,
    /// Compiled on the first file read: a scan that finds nothing changed reads none, and a
    /// short `caret scan` process would otherwise spend a good part of its time compiling.
    secrets: std::sync::OnceLock<SecretScanner>,
    depth: Depth,
    generated: std::sync::OnceLock<Regex>,
}

/// A file's outcome.
enum Found {
    File(ScannedFile),
    Skip(Skipped),
}

/// A file read in this scan: its outcome and the cache entry to record (none for a file that
/// could not be read, whose stale entry is dropped).
struct Processed {
    found: Found,
    entry: Option<Entry>,
}

impl Scanner {
    /// A scanner with the given walk options and chunker.
    pub fn new(walk: WalkConfig, chunker: Chunker, depth: Depth) -> Self {
        Scanner { walk, chunker, secrets: std::sync::OnceLock::new(), depth, generated: std::sync::OnceLock::new() }
    }

    fn secrets(&self) -> &SecretScanner {
        self.secrets.get_or_init(SecretScanner::new)
    }

    #[allow(clippy::expect_used)]
    fn generated(&self) -> &Regex {
        self.generated.get_or_init(|| {
            Regex::new(
                r"(?i-u)(@generated\b|code generated .{0,80}do not edit|auto-?generated .{0,80}do not (edit|modify))",
            )
            .expect("the generated-file marker is a valid regex (every scan test builds it)")
        })
    }

    /// What decides cached chunk facts: a change makes the next scan re-read every file.
    pub fn fingerprint(&self) -> String {
        match self.depth {
            Depth::Full => format!("full/{}/maxsize-{}", self.content_fingerprint(), self.walk.max_file_size),
            Depth::Hash => format!("hash/maxsize-{}", self.walk.max_file_size),
        }
    }

    /// What decides a file's chunks and which are withheld: chunker and secret rules. Sync
    /// keys its leaves with it, so a change re-sends every file.
    pub fn content_fingerprint(&self) -> String {
        format!("{}/secrets-v1", self.chunker.fingerprint())
    }

    /// The chunker in use.
    pub fn chunker(&self) -> &Chunker {
        &self.chunker
    }

    /// Scans `root`, reusing and updating `cache`.
    pub fn scan(&self, root: &Path, cache: &mut StatCache) -> Result<ScanReport> {
        let started = Instant::now();
        let walked = walk::walk(root, &self.walk)?;
        self.finish(started, root, walked, cache)
    }

    /// Scans `root` while `load` produces the stat cache (loading it from disk overlaps the
    /// walk); returns the report and the updated cache.
    pub fn scan_loading(
        &self,
        root: &Path,
        load: impl FnOnce() -> StatCache + Send,
    ) -> Result<(ScanReport, StatCache)> {
        let started = Instant::now();
        let (walked, mut cache) = rayon::join(|| walk::walk(root, &self.walk), load);
        let report = self.finish(started, root, walked?, &mut cache)?;
        Ok((report, cache))
    }

    fn finish(&self, started: Instant, root: &Path, walked: WalkOutput, cache: &mut StatCache) -> Result<ScanReport> {
        tracing::debug!(elapsed_ms = started.elapsed().as_millis(), files = walked.files.len(), "walked");
        let root = std::fs::canonicalize(root).map_err(|e| Error::io("opening workspace root", root, e))?;

        let first_scan = cache.entries.is_empty();
        let trusted = cache.fingerprint == self.fingerprint();

        // Cache hits borrow their entry; only misses produce a new one (and take room).
        let misses: Vec<usize> = (0..walked.files.len())
            .into_par_iter()
            .filter(|&i| {
                let file = &walked.files[i];
                !matches!(cache.entries.get(&file.path), Some(entry) if trusted && entry.is_fresh(&file.stat))
            })
            .collect();
        let mut processed: Vec<Option<Processed>> =
            misses.par_iter().map(|&i| Some(self.process(&root, &walked.files[i]))).collect();
        tracing::debug!(elapsed_ms = started.elapsed().as_millis(), "files processed");
        let mut next_miss = misses.iter().zip(processed.iter_mut()).peekable();

        let mut stats = ScanStats::default();
        let mut files = Vec::with_capacity(walked.files.len());
        let mut skipped = walked.skipped;
        let mut updates = Vec::new();
        let mut unreadable = 0;
        let walked_count = walked.files.len();
        for (i, WalkedFile { path, stat }) in walked.files.into_iter().enumerate() {
            let result = match next_miss.peek() {
                Some((miss, _)) if **miss == i => next_miss.next().and_then(|(_, p)| p.take()),
                _ => None,
            };
            let found = match result {
                None => {
                    stats.cache_hits += 1;
                    match cache.entries.get(&path) {
                        Some(entry) => from_cache(path, stat.size, entry),
                        None => continue,
                    }
                }
                Some(Processed { found, entry }) => {
                    stats.files_read += 1;
                    stats.bytes_read += stat.size;
                    unreadable += usize::from(entry.is_none());
                    updates.push((path, entry));
                    found
                }
            };
            match found {
                Found::File(f) => files.push(f),
                Found::Skip(s) => skipped.push(s),
            }
        }
        skipped.sort_by(|a, b| a.path.cmp(&b.path));
        tracing::debug!(elapsed_ms = started.elapsed().as_millis(), "gathered");
        let changes = (!first_scan).then(|| changes_since(cache, &files));
        tracing::debug!(elapsed_ms = started.elapsed().as_millis(), "changes");
        // The files are those the cache indexed, hash for hash: the root it recorded holds.
        let recorded_root = cache.root.filter(|_| trusted && changes.as_ref().is_some_and(TreeDiff::is_empty));

        {
            if !trusted {
                cache.entries.clear();
                cache.fingerprint = self.fingerprint();
            }
            stats.cache_changed = !updates.is_empty() || !trusted;
            for (path, entry) in updates {
                match entry {
                    Some(e) => cache.entries.insert(path, e),
                    None => cache.entries.remove(&path),
                };
            }
            // Every walked file now has an entry but the unreadable; more entries are files
            // gone or now ignored, whose entries go: the cache indexes exactly `files`, as
            // its root says (an indexed file newly ignored was kept before, and reported
            // deleted again by every scan).
            if cache.entries.len() > walked_count - unreadable {
                let indexed: std::collections::HashSet<&RelPath> = files.iter().map(|f| &f.path).collect();
                let other: std::collections::HashSet<&RelPath> = skipped.iter().map(|s| &s.path).collect();
                cache.entries.retain(|p, e| match e.outcome {
                    Outcome::Indexed { .. } => indexed.contains(p),
                    _ => other.contains(p),
                });
                stats.cache_changed = true;
            }
        }
        let root_hash = recorded_root.unwrap_or_else(|| MerkleTree::root_hash_by(&files, |f| (&f.path, f.hash)));
        if cache.root != Some(root_hash) {
            cache.root = Some(root_hash);
            stats.cache_changed = true;
        }
        stats.elapsed = started.elapsed();
        Ok(ScanReport { root, files, skipped, changes, stats, root_hash })
    }

    /// Reads, classifies, hashes and (at full depth) chunks one file.
    fn process(&self, root: &Path, file: &WalkedFile) -> Processed {
        let abs = file.path.under(root);
        let read_at_ns = now_ns();
        let skip = |reason| Processed {
            found: Found::Skip(Skipped { path: file.path.clone(), is_dir: false, reason }),
            entry: None,
        };
        let (bytes, stat) = match read_stable(&abs, &file.stat, self.walk.max_file_size) {
            Ok(Read::Stable(bytes, stat)) => (bytes, stat),
            Ok(Read::Changing) => return skip(SkipReason::Changing),
            Ok(Read::Grew(size)) => {
                return skip(SkipReason::TooLarge { size, limit: self.walk.max_file_size });
            }
            Err(e) => return skip(SkipReason::Unreadable { error: e.to_string() }),
        };
        let cached_skip = |reason: SkipReason, outcome| {
            let entry = Entry { stat, read_at_ns, outcome };
            Processed {
                found: Found::Skip(Skipped { path: file.path.clone(), is_dir: false, reason }),
                entry: Some(entry),
            }
        };
        let sniff = &bytes[..bytes.len().min(8000)];
        if memchr::memchr(0, sniff).is_some() {
            let detail = "NUL byte";
            return cached_skip(SkipReason::Binary { detail }, Outcome::Binary { detail: detail.to_owned() });
        }
        let Ok(text) = std::str::from_utf8(&bytes) else {
            let detail = "not UTF-8";
            return cached_skip(SkipReason::Binary { detail }, Outcome::Binary { detail: detail.to_owned() });
        };
        if let Some(marker) = self.generated_marker(text) {
            let reason = SkipReason::Excluded { rule: DefaultRule::Generated, pattern: format!("marker \"{marker}\"") };
            return cached_skip(reason, Outcome::Generated { marker });
        }
        let hash = ContentHash::of(&bytes);
        let (chunks, withheld, findings) = match self.depth {
            Depth::Hash => (0, 0, Vec::new()),
            Depth::Full => {
                let (chunks, findings) = self.chunk_text(&file.path, text);
                let withheld = chunks.iter().filter(|c| overlaps_any(c, &findings)).count();
                let findings = findings.into_iter().map(|f| (f.rule.to_owned(), f.line)).collect();
                (to_u32(chunks.len()), to_u32(withheld), findings)
            }
        };
        let scanned = ScannedFile { path: file.path.clone(), size: stat.size, hash, chunks, withheld, findings };
        let outcome = Outcome::Indexed {
            hash,
            chunks: scanned.chunks,
            withheld: scanned.withheld,
            findings: scanned.findings.clone(),
        };
        Processed { found: Found::File(scanned), entry: Some(Entry { stat, read_at_ns, outcome }) }
    }

    /// Chunks a file's text and finds its secrets. Chunks that overlap a finding must not be
    /// indexed (see [`chunk_is_withheld`]).
    pub fn chunk_text(&self, path: &RelPath, text: &str) -> (Vec<Chunk>, Vec<Finding>) {
        (self.chunker.chunk(path, text), self.secrets().scan(text))
    }

    fn generated_marker(&self, text: &str) -> Option<String> {
        // Only the head of a file: the marker is a header comment.
        let head_end = text.char_indices().filter(|(_, c)| *c == '\n').nth(4).map_or(text.len(), |(i, _)| i);
        let head = &text.as_bytes()[..head_end.min(1024)];
        self.generated().find(head).map(|m| String::from_utf8_lossy(m.as_bytes()).into_owned())
    }
}

/// Whether a chunk contains (part of) a secret and so must not leave the machine.
pub fn chunk_is_withheld(chunk: &Chunk, findings: &[Finding]) -> bool {
    overlaps_any(chunk, findings)
}

fn overlaps_any(chunk: &Chunk, findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.span.start < chunk.bytes.end && chunk.bytes.start < f.span.end)
}

fn from_cache(path: RelPath, size: u64, entry: &Entry) -> Found {
    match &entry.outcome {
        Outcome::Indexed { hash, chunks, withheld, findings } => Found::File(ScannedFile {
            path,
            size,
            hash: *hash,
            chunks: *chunks,
            withheld: *withheld,
            findings: findings.clone(),
        }),
        Outcome::Binary { detail } => {
            let detail = if detail == "NUL byte" { "NUL byte" } else { "not UTF-8" };
            Found::Skip(Skipped { path, is_dir: false, reason: SkipReason::Binary { detail } })
        }
        Outcome::Generated { marker } => {
            let reason = SkipReason::Excluded { rule: DefaultRule::Generated, pattern: format!("marker \"{marker}\"") };
            Found::Skip(Skipped { path, is_dir: false, reason })
        }
    }
}

/// Changes between the files recorded in the cache and `files` (sorted by path), by a flat
/// comparison: cheaper than building the previous tree when both sides are at hand.
fn changes_since(cache: &StatCache, files: &[ScannedFile]) -> TreeDiff {
    let mut diff = TreeDiff::default();
    let mut matched = 0;
    for f in files {
        match cache.entries.get(&f.path).map(|e| &e.outcome) {
            Some(Outcome::Indexed { hash, .. }) => {
                matched += 1;
                if *hash != f.hash {
                    diff.modified.push((f.path.clone(), f.hash));
                }
            }
            _ => diff.added.push((f.path.clone(), f.hash)),
        }
        diff.visited += 1;
    }
    let indexed_before = cache.entries.values().filter(|e| matches!(e.outcome, Outcome::Indexed { .. })).count();
    if indexed_before > matched {
        let now: std::collections::HashSet<&RelPath> = files.iter().map(|f| &f.path).collect();
        diff.deleted = cache
            .entries
            .iter()
            .filter(|(p, e)| matches!(e.outcome, Outcome::Indexed { .. }) && !now.contains(p))
            .map(|(p, _)| p.clone())
            .collect();
        diff.deleted.sort();
    }
    diff
}

enum Read {
    Stable(Vec<u8>, FileStat),
    Changing,
    Grew(u64),
}

/// Reads a file whole, retrying while it changes under us.
fn read_stable(path: &Path, walked: &FileStat, max_size: u64) -> std::io::Result<Read> {
    let mut expected = *walked;
    for _ in 0..3 {
        let mut f = std::fs::File::open(path)?;
        let before = FileStat::from(&f.metadata()?);
        if !before.is_regular() {
            return Err(std::io::Error::other("no longer a regular file"));
        }
        if before.size > max_size {
            return Ok(Read::Grew(before.size));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(before.size).unwrap_or(0) + 1);
        (&mut f).take(max_size + 1).read_to_end(&mut bytes)?;
        let after = FileStat::from(&f.metadata()?);
        let unchanged = before.same_content_stat(&after) && after.size == bytes.len() as u64;
        if unchanged {
            if !expected.same_content_stat(&after) {
                tracing::debug!(path = %path.display(), "file changed between walk and read");
            }
            return Ok(Read::Stable(bytes, after));
        }
        if bytes.len() as u64 > max_size {
            return Ok(Read::Grew(bytes.len() as u64));
        }
        expected = after;
    }
    Ok(Read::Changing)
}

impl FileStat {
    fn same_content_stat(&self, other: &FileStat) -> bool {
        self.size == other.size && self.mtime_ns == other.mtime_ns && self.ino == other.ino
    }

    fn is_regular(&self) -> bool {
        self.mode & 0o170000 == 0o100000
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
