//! The sync engine: bring the server's copy of a workspace index in step with the client's
//! tree, sending only what changed.
//!
//! 1. Scan (stat cache: unchanged files cost a `stat`), obfuscate paths, key the leaves.
//! 2. Compare trees level by level: one request lists every mismatched directory of a level,
//!    so a one-file change costs O(depth × fan-out) bytes and O(depth) round trips.
//! 3. For changed files: chunk, withhold chunks with secrets, ask which chunk ids the server
//!    lacks, then commit files with only the missing texts, in batches. Each commit is one
//!    atomic log object on the server, so a sync killed at any point leaves whole files only
//!    and the next sync resumes from what the trees still disagree on.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use caret_crypto::{LeafKey, PathObfuscator, ServerKey};
use caret_protocol::{ChunkMeta, ChunkText, CommitRequest, CreateWorkspace, FileMeta, PlanRequest, TreeRequest};
use caret_workspace::merkle::{MerkleTree, Node};
use caret_workspace::scan::{ScanReport, Scanner, chunk_is_withheld};
use caret_workspace::statcache::StatCache;
use caret_workspace::{ContentHash, RelPath};
use rayon::prelude::*;

use crate::state::WorkspaceState;
use crate::transport::Transport;
use crate::{Error, Result};

/// Batch sizes.
#[derive(Debug, Clone, Copy)]
pub struct SyncOptions {
    /// Chunk text per commit, in bytes (before JSON).
    pub batch_bytes: usize,
    /// Files per commit.
    pub batch_files: usize,
    /// Directories per tree request.
    pub tree_batch: usize,
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions { batch_bytes: 4 << 20, batch_files: 2000, tree_batch: 5000 }
    }
}

/// What a sync did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SyncReport {
    /// Files new on the server.
    pub added: u64,
    /// Files changed.
    pub modified: u64,
    /// Paths removed from the server (files or whole directories).
    pub deleted: u64,
    /// Files already in step.
    pub unchanged: u64,
    /// Chunk texts sent.
    pub chunks_sent: u64,
    /// Chunks the server already had.
    pub chunks_reused: u64,
    /// Chunks withheld because they hold secrets.
    pub chunks_withheld: u64,
    /// Files that could not be read now (synced next time).
    pub files_skipped: u64,
    /// Request bytes.
    pub bytes_sent: u64,
    /// Response bytes.
    pub bytes_received: u64,
    /// Requests made.
    pub requests: u64,
    /// Wall time.
    pub seconds: f64,
    /// Of which the local scan (on the developer's machine; none when the daemon's watcher
    /// answered).
    pub scan_seconds: f64,
    /// The client's root hash.
    pub local_root: String,
    /// The server's root hash afterwards.
    pub server_root: String,
    /// Answered without scanning: the local daemon's watcher saw no change since a sync that
    /// ended in step, and the server still held its root.
    pub watcher: bool,
}

/// The client's side of a comparison.
pub struct LocalTree {
    /// Merkle tree over obfuscated paths and keyed leaves.
    pub tree: MerkleTree,
    /// Obfuscated path → real path and content hash.
    pub files: HashMap<String, (RelPath, ContentHash)>,
    /// The scan it came from.
    pub scan: ScanReport,
}

/// What differs between client and server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// Obfuscated paths of files the server lacks.
    pub added: Vec<String>,
    /// Obfuscated paths of files that differ.
    pub modified: Vec<String>,
    /// Obfuscated paths (files or directories) only the server has.
    pub deletes: Vec<String>,
    /// The server's root hash.
    pub server_root: String,
}

/// Syncs workspaces through a transport.
pub struct SyncEngine {
    scanner: Arc<Scanner>,
    options: SyncOptions,
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() { name.to_owned() } else { format!("{dir}/{name}") }
}

/// Every file path below a node, prefixed with `at`.
fn files_below(node: &Node, at: &str, out: &mut Vec<String>) {
    match node {
        Node::File(_) => out.push(at.to_owned()),
        Node::Dir { children, .. } => {
            for (name, child) in children.iter() {
                files_below(child, &join(at, &String::from_utf8_lossy(name)), out);
            }
        }
    }
}

impl SyncEngine {
    /// An engine scanning with `scanner`.
    pub fn new(scanner: Arc<Scanner>, options: SyncOptions) -> Self {
        SyncEngine { scanner, options }
    }

    /// Scans the workspace and builds its obfuscated tree.
    pub async fn local_tree(&self, ws: &WorkspaceState) -> Result<LocalTree> {
        let scanner = self.scanner.clone();
        let root = ws.root.clone();
        let cache_path = ws.cache_file();
        let paths = ws.key.paths();
        let leaves = ws.key.leaves();
        tokio::task::spawn_blocking(move || -> Result<LocalTree> {
            let (scan, cache) = scanner.scan_loading(&root, || StatCache::load(&cache_path))?;
            if scan.stats.cache_changed {
                cache.save(&cache_path)?;
            }
            Ok(build_local_tree(scan, &paths, &leaves, &scanner.content_fingerprint()))
        })
        .await
        .map_err(|e| Error::Internal(format!("scan task: {e}")))?
    }

    /// Compares the local tree with the server's, level by level.
    pub async fn compare(&self, ws: &WorkspaceState, local: &LocalTree, transport: &dyn Transport) -> Result<Pending> {
        let mut pending = Pending::default();
        let mut level = vec![String::new()];
        let local_root = local.tree.root_hash().to_hex();
        while !level.is_empty() {
            let mut next = Vec::new();
            for batch in level.chunks(self.options.tree_batch) {
                let known_root = pending.server_root.is_empty().then(|| local_root.clone());
                let resp = transport.tree(&ws.id, &TreeRequest { dirs: batch.to_vec(), known_root }).await?;
                if pending.server_root.is_empty() {
                    pending.server_root = resp.root_hash.clone();
                    if resp.root_hash == local_root {
                        return Ok(pending);
                    }
                }
                for listing in resp.dirs {
                    let local_children = match local.tree.get(&RelPath::from_bytes(listing.path.as_bytes())) {
                        Some(Node::Dir { children, .. }) => Some(children),
                        _ => None,
                    };
                    let server: BTreeMap<&str, &caret_protocol::TreeEntry> =
                        listing.entries.iter().map(|e| (e.name.as_str(), e)).collect();
                    if let Some(children) = local_children {
                        for (name, node) in children.iter() {
                            let name = String::from_utf8_lossy(name);
                            let path = join(&listing.path, &name);
                            match (node, server.get(name.as_ref())) {
                                (_, Some(s))
                                    if s.hash == node.hash().to_hex() && s.dir == matches!(node, Node::Dir { .. }) => {}
                                (Node::File(_), Some(s)) if !s.dir => pending.modified.push(path),
                                (Node::Dir { .. }, Some(s)) if s.dir => next.push(path),
                                (node, Some(_)) => {
                                    // A file became a directory or the other way round.
                                    pending.deletes.push(path.clone());
                                    files_below(node, &path, &mut pending.added);
                                }
                                (node, None) => files_below(node, &path, &mut pending.added),
                            }
                        }
                    }
                    for entry in &listing.entries {
                        let present = local_children.is_some_and(|c| c.contains_key(entry.name.as_bytes()));
                        if !present {
                            pending.deletes.push(join(&listing.path, &entry.name));
                        }
                    }
                }
            }
            level = next;
        }
        Ok(pending)
    }

    /// Syncs the workspace: compare, then send what changed.
    #[tracing::instrument(name = "sync", skip_all)]
    pub async fn sync(&self, ws: &WorkspaceState, transport: &dyn Transport) -> Result<SyncReport> {
        let started = Instant::now();
        let wire_before = transport.wire().get();
        let local = self.local_tree(ws).await?;
        let scan_seconds = started.elapsed().as_secs_f64();
        let sketch = if ws.has_synced() { Vec::new() } else { sketch(&local.tree) };
        transport.create_workspace(&ws.id, &CreateWorkspace { key_id: ws.key.key_id(), sketch }).await?;
        let pending = self.compare(ws, &local, transport).await?;
        let mut report = SyncReport {
            added: pending.added.len() as u64,
            modified: pending.modified.len() as u64,
            deleted: pending.deletes.len() as u64,
            local_root: local.tree.root_hash().to_hex(),
            server_root: pending.server_root.clone(),
            chunks_withheld: 0,
            scan_seconds,
            ..SyncReport::default()
        };
        report.unchanged = (local.tree.len() as u64).saturating_sub(report.added + report.modified);

        let changed: Vec<&String> = pending.added.iter().chain(&pending.modified).collect();
        // A server that holds none of the workspace's files (a first sync) lacks every chunk:
        // no plan to ask, the chunks' metadata crosses the wire once, in the commit.
        let server_empty = report.modified == 0 && report.unchanged == 0 && pending.deletes.is_empty();
        let server_key = ws.key.server_key();
        let mut deletes = pending.deletes.clone();
        let mut start = 0;
        while start < changed.len() || !deletes.is_empty() {
            // Read and chunk up to a batch of files.
            let mut end = start;
            let mut files = Vec::new();
            let mut texts: HashMap<String, ChunkText> = HashMap::new();
            let mut text_bytes = 0;
            while end < changed.len() && text_bytes < self.options.batch_bytes && files.len() < self.options.batch_files
            {
                let step = (changed.len() - end).min(64).min(self.options.batch_files - files.len());
                let prepared = self.prepare(ws, &local, &changed[end..end + step], &server_key).await?;
                for p in prepared {
                    match p {
                        Some((meta, chunk_texts, withheld)) => {
                            report.chunks_withheld += withheld;
                            for t in chunk_texts {
                                text_bytes += t.text.len();
                                texts.insert(t.id.clone(), t);
                            }
                            files.push(meta);
                        }
                        None => report.files_skipped += 1,
                    }
                }
                end += step;
            }
            start = end;
            let response = self
                .commit_batch(
                    ws,
                    transport,
                    &server_key,
                    files,
                    texts,
                    std::mem::take(&mut deletes),
                    server_empty,
                    &mut report,
                )
                .await?;
            report.server_root = response;
        }

        self.save_path_map(ws, &local)?;
        let (sent, received, requests) = transport.wire().get();
        report.bytes_sent = sent - wire_before.0;
        report.bytes_received = received - wire_before.1;
        report.requests = requests - wire_before.2;
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Plans then commits one batch (sending every text without a plan when the server holds
    /// no file of the workspace); plans again once if the server lost a race.
    #[allow(clippy::too_many_arguments)]
    async fn commit_batch(
        &self,
        ws: &WorkspaceState,
        transport: &dyn Transport,
        key: &ServerKey,
        files: Vec<FileMeta>,
        texts: HashMap<String, ChunkText>,
        deletes: Vec<String>,
        server_empty: bool,
        report: &mut SyncReport,
    ) -> Result<String> {
        let mut attempt = 0;
        loop {
            let missing = if files.is_empty() {
                Vec::new()
            } else if server_empty && attempt == 0 {
                texts.keys().cloned().collect()
            } else {
                transport.plan(&ws.id, &PlanRequest { files: files.clone() }).await?.missing
            };
            let chunks: Vec<ChunkText> = missing.iter().filter_map(|id| texts.get(id).cloned()).collect();
            let total: u64 = files.iter().map(|f| f.chunks.len() as u64).sum();
            let sent = chunks.len() as u64;
            let req = CommitRequest { files: files.clone(), deletes: deletes.clone(), chunks };
            match transport.commit(&ws.id, key, req).await {
                Ok(r) => {
                    report.chunks_sent += sent;
                    report.chunks_reused += total.saturating_sub(sent);
                    return Ok(r.root_hash);
                }
                Err(Error::Server { code, .. }) if code == "missing_chunks" && attempt == 0 => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads and chunks files (in parallel, off the async runtime). `None` for a file that
    /// cannot be read now; it is synced next time.
    #[allow(clippy::type_complexity)]
    async fn prepare(
        &self,
        ws: &WorkspaceState,
        local: &LocalTree,
        obf_paths: &[&String],
        key: &ServerKey,
    ) -> Result<Vec<Option<(FileMeta, Vec<ChunkText>, u64)>>> {
        let scanner = self.scanner.clone();
        let root = ws.root.clone();
        let leaves = ws.key.leaves();
        let ids = key.chunk_ids();
        let jobs: Vec<(String, RelPath)> = obf_paths
            .iter()
            .filter_map(|p| local.files.get(p.as_str()).map(|(real, _)| ((*p).clone(), real.clone())))
            .collect();
        tokio::task::spawn_blocking(move || {
            let fingerprint = scanner.content_fingerprint();
            jobs.par_iter()
                .map(|(obf, real)| {
                    let bytes = std::fs::read(real.under(&root)).ok()?;
                    let text = std::str::from_utf8(&bytes).ok()?;
                    // The leaf follows what was read, so it always matches the chunks sent.
                    let leaf = leaves.leaf(&ContentHash::of(&bytes).0, &fingerprint);
                    let (chunks, findings) = scanner.chunk_text(real, text);
                    let mut metas = Vec::new();
                    let mut texts = Vec::new();
                    let mut withheld = 0;
                    for c in &chunks {
                        if chunk_is_withheld(c, &findings) {
                            withheld += 1;
                            continue;
                        }
                        let id = ContentHash(ids.id(&c.hash.0)).to_hex();
                        metas.push(ChunkMeta {
                            id: id.clone(),
                            start_line: c.start_line,
                            end_line: c.end_line,
                            language: c.language.name().to_owned(),
                            kind: c.kind.name().to_owned(),
                        });
                        texts.push(ChunkText {
                            id,
                            context: c.context.clone(),
                            text: c.text(text).to_owned(),
                            defines: c.defines.clone(),
                        });
                    }
                    Some((
                        FileMeta { path: obf.clone(), leaf: ContentHash(leaf).to_hex(), chunks: metas },
                        texts,
                        withheld,
                    ))
                })
                .collect()
        })
        .await
        .map_err(|e| Error::Internal(format!("chunking task: {e}")))
    }

    fn save_path_map(&self, ws: &WorkspaceState, local: &LocalTree) -> Result<()> {
        let mut map: Vec<(String, RelPath)> = local.files.iter().map(|(o, (r, _))| (o.clone(), r.clone())).collect();
        map.sort();
        ws.save_path_map(&map)
    }
}

/// Entries of a first sync's sketch: enough for a match of half of them to mean a copy of
/// the same tree, few enough to cost under 600 bytes once.
const SKETCH: usize = 32;

/// The smallest distinct keyed leaves of a tree, as 16 hex characters each (see
/// [`CreateWorkspace::sketch`]): a sample of its files that another tree with most of the
/// same files shares, whatever it adds or lacks.
pub fn sketch(tree: &MerkleTree) -> Vec<String> {
    let mut leaves: Vec<[u8; 32]> = tree.files().into_iter().map(|(_, leaf)| leaf.0).collect();
    leaves.sort_unstable();
    leaves.dedup();
    leaves.iter().take(SKETCH).map(|l| ContentHash(*l).to_hex()[..16].to_owned()).collect()
}

/// The obfuscated, keyed tree of a scan.
pub fn build_local_tree(scan: ScanReport, paths: &PathObfuscator, leaves: &LeafKey, fingerprint: &str) -> LocalTree {
    let entries: Vec<(String, RelPath, ContentHash, ContentHash)> = scan
        .files
        .par_iter()
        .map(|f| {
            let obf = paths.path(f.path.as_bytes());
            let leaf = ContentHash(leaves.leaf(&f.hash.0, fingerprint));
            (obf, f.path.clone(), f.hash, leaf)
        })
        .collect();
    let tree = MerkleTree::from_files(entries.iter().map(|(o, _, _, l)| (RelPath::from_bytes(o.as_bytes()), *l)));
    let files = entries.into_iter().map(|(o, r, h, _)| (o, (r, h))).collect();
    LocalTree { tree, files, scan }
}
