//! What a command keeps so that, when the local daemon's watcher saw no change, it can
//! answer without walking the workspace: a scan's summary ([`ScanSummary`]) and a sync that
//! ended in step ([`InStep`], [`sync_without_scanning`]). Records live beside the stat cache,
//! under the watcher's id and count (see [`crate::watch`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use caret_client::state::WorkspaceState;
use caret_client::sync::SyncReport;
use caret_client::transport::HttpTransport;
use caret_protocol::TreeRequest;
use caret_workspace::scan::ScanReport;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::remote::Remote;
use crate::watch::WatchReply;

/// The daemon's watcher's answer for `root`, on a runtime of one thread (for a short
/// process that has nothing else to run).
pub fn ask_blocking(config: &Config, root: &Path, ignored: Vec<String>) -> Option<(WatchReply, HttpTransport)> {
    // No daemon, no runtime: building one costs a command that has nobody to ask.
    let transport = crate::daemon::running(config)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
    rt.block_on(crate::daemon::ask_watcher_of(transport, root, ignored))
}

/// What `caret scan` prints without `--explain`; also what a scan keeps for the watcher.
#[derive(Debug, Serialize, Deserialize)]
pub struct ScanSummary {
    /// The workspace root.
    pub root: String,
    /// The Merkle root hash, hex.
    pub root_hash: String,
    /// Files indexed.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Chunks that would be indexed.
    pub chunks: u64,
    /// Chunks withheld for secrets.
    pub withheld_chunks: u64,
    /// Skipped paths by category (and files with secrets).
    pub skipped: BTreeMap<String, usize>,
    /// Changes since the previous scan (none on a first scan).
    pub changes: Option<Changes>,
    /// Stat-cache use.
    pub cache: Cache,
    /// Wall time.
    pub elapsed_ms: f64,
    /// Answered from the last scan's summary: the daemon's watcher saw no change since.
    #[serde(default)]
    pub watcher: bool,
}

/// Files added, modified and deleted.
#[derive(Debug, Serialize, Deserialize)]
pub struct Changes {
    /// New files.
    pub added: usize,
    /// Changed files.
    pub modified: usize,
    /// Files gone.
    pub deleted: usize,
}

/// Files answered from the stat cache, and files read.
#[derive(Debug, Serialize, Deserialize)]
pub struct Cache {
    /// From the cache.
    pub hits: usize,
    /// Read.
    pub read: usize,
}

impl ScanSummary {
    /// The summary of a scan.
    pub fn of(report: &ScanReport) -> ScanSummary {
        ScanSummary {
            root: report.root.display().to_string(),
            root_hash: report.root_hash().to_hex(),
            files: report.files.len(),
            bytes: report.bytes(),
            chunks: report.chunks(),
            withheld_chunks: report.withheld(),
            skipped: skipped_counts(report).into_iter().map(|(k, n)| (k.to_owned(), n)).collect(),
            changes: report.changes.as_ref().map(|c| Changes {
                added: c.added.len(),
                modified: c.modified.len(),
                deleted: c.deleted.len(),
            }),
            cache: Cache { hits: report.stats.cache_hits, read: report.stats.files_read },
            elapsed_ms: report.stats.elapsed.as_secs_f64() * 1000.0,
            watcher: false,
        }
    }

    /// The same tree found again: nothing changed, nothing read.
    pub fn unchanged(&mut self, elapsed: Duration) {
        self.changes = Some(Changes { added: 0, modified: 0, deleted: 0 });
        self.cache = Cache { hits: self.cache.hits + self.cache.read, read: 0 };
        self.elapsed_ms = elapsed.as_secs_f64() * 1000.0;
        self.watcher = true;
    }
}

/// Skipped counts by category, secrets included.
pub fn skipped_counts(report: &ScanReport) -> BTreeMap<&'static str, usize> {
    let mut counts: BTreeMap<&'static str, usize> =
        ["ignored", "too-large", "binary", "secret", "symlink", "unreadable"].into_iter().map(|k| (k, 0)).collect();
    for s in &report.skipped {
        *counts.entry(s.reason.category()).or_default() += 1;
    }
    counts.insert("secret", report.files_with_secrets());
    counts
}

/// Directories the walk skipped by an ignore rule: the watcher leaves out events inside them.
pub fn ignored_dirs(report: &ScanReport) -> Vec<String> {
    report.skipped.iter().filter(|s| s.is_dir && s.reason.category() == "ignored").map(|s| s.path.to_string()).collect()
}

/// What a sync that ended in step keeps for the daemon's watcher: the root both sides agreed
/// on and the files under it.
#[derive(Debug, Serialize, Deserialize)]
pub struct InStep {
    /// The root hash both sides held.
    pub root: String,
    /// Files under it.
    pub files: u64,
}

/// The server a sync talks to, for the record's stamp.
pub fn server_named(config: &Config, remote: &Remote) -> String {
    remote.server.clone().or_else(|| config.sync.server.clone()).unwrap_or_else(|| "embedded".to_owned())
}

/// What a sync's record is only valid with (see [`crate::watch::stamp`]): the settings, the
/// server, the workspace and its key.
fn sync_stamp(config: &Config, ws: &WorkspaceState, remote: &Remote) -> String {
    let settings = format!(
        "{}|{}|{}|{}",
        crate::watch::settings(config, "sync"),
        server_named(config, remote),
        ws.id,
        ws.key.key_id()
    );
    crate::watch::stamp(&settings, &ws.root, &config.walk_config())
}

/// A sync answered without scanning: the daemon's watcher saw no change since a sync that
/// ended in step, and the server still holds that root (one small request: through the daemon
/// for the embedded server, so nothing is opened in-process) — the report and where it went.
/// Also the watcher's answer and the stamp, for the sync that scans when this one cannot
/// answer to record under.
pub async fn sync_without_scanning(
    config: &Config,
    ws: &WorkspaceState,
    remote: &Remote,
    record: &Path,
) -> (Option<(WatchReply, String)>, Option<(SyncReport, String)>) {
    let started = Instant::now();
    let Some((at, daemon)) = crate::daemon::ask_watcher(config, &ws.root, Vec::new()).await else {
        return (None, None);
    };
    let stamp = sync_stamp(config, ws, remote);
    let Some(kept) = crate::watch::load::<InStep>(record, &at, &stamp) else { return (Some((at, stamp)), None) };
    let watched = Some((at, stamp));
    let transport: Box<dyn caret_client::transport::Transport> = if server_named(config, remote) == "embedded" {
        Box::new(daemon)
    } else {
        match crate::remote::transport(config, remote).await {
            Ok(t) => t,
            Err(_) => return (watched, None),
        }
    };
    let req = TreeRequest { dirs: Vec::new(), known_root: Some(kept.root.clone()) };
    let before = transport.wire().get();
    match transport.tree(&ws.id, &req).await {
        Ok(resp) if resp.root_hash == kept.root => {
            let after = transport.wire().get();
            let report = SyncReport {
                unchanged: kept.files,
                local_root: kept.root.clone(),
                server_root: resp.root_hash,
                bytes_sent: after.0 - before.0,
                bytes_received: after.1 - before.1,
                requests: after.2 - before.2,
                seconds: started.elapsed().as_secs_f64(),
                watcher: true,
                ..SyncReport::default()
            };
            (watched, Some((report, transport.describe())))
        }
        _ => (watched, None),
    }
}
