//! Documentation sources (@Docs) of this machine: each in `$CARET_HOME/docs/NAME/` (see
//! [`caret_docs::pages`]), its pages indexed like a workspace — the same sync, chunking by
//! heading, embedding and hybrid search as code — and searched through the warm daemon when
//! it runs. A hit maps back to its page's URL (with the anchor of the heading above it), title,
//! heading path and text.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use caret_docs::pages::{Counts, Origin, Source, SourceDir};
use caret_library::index::{Index, Totals, hit};
use serde::Serialize;

use crate::config::Config;
use crate::remote::{Remote, open_workspace, transport};

/// Where sources live.
pub fn root(config: &Config) -> PathBuf {
    config.home.join("docs")
}

/// The directory of the source `name` (a name of letters, digits, `.`, `_` and `-`).
pub fn dir(config: &Config, name: &str) -> anyhow::Result<SourceDir> {
    check_name(name)?;
    Ok(SourceDir::new(root(config).join(name)))
}

pub use caret_library::source::{check_name, site};

/// A source as `caret docs ls` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    /// Its settings.
    pub source: Source,
    /// Pages kept.
    pub pages: usize,
    /// When its last complete update ended (Unix seconds).
    pub updated_at: Option<u64>,
    /// Whether an update of it was interrupted.
    pub unfinished: bool,
    /// What its last update counted.
    pub last: Counts,
}

/// Every source, by name.
pub fn list(config: &Config) -> anyhow::Result<Vec<Listed>> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(root(config)) else { return Ok(out) };
    let mut names: Vec<String> = entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    for name in names {
        let d = dir(config, &name)?;
        let Ok(source) = d.source() else { continue };
        let state = d.state().unwrap_or_default();
        out.push(Listed {
            source,
            pages: state.pages.len(),
            updated_at: state.finished_at,
            unfinished: state.unfinished.is_some(),
            last: state.last,
        });
    }
    Ok(out)
}

/// What an update did.
#[derive(Debug, Clone, Serialize)]
pub struct Updated {
    /// The crawl's (or the folder's) counts.
    pub counts: Counts,
    /// Seconds the crawl took.
    pub crawl_seconds: f64,
    /// The index syncs, together: files added, changed, removed.
    pub synced: (u64, u64, u64),
    /// Seconds from the crawl's end until lexical search had every page (the last sync).
    pub sync_seconds: f64,
    /// Chunks embedded (beside the crawl, then after it).
    pub embedded: u64,
    /// Chunks of the source, and those with vectors, at the end.
    pub vectors: (u64, u64),
    /// Seconds from the start until every chunk had its vector (none: not embedded).
    pub embedded_after: Option<f64>,
    /// The embedding model (none: lexical only).
    pub model: Option<String>,
}

/// How often pages written during a crawl are synced and embedded beside it.
const BESIDE: std::time::Duration = std::time::Duration::from_secs(3);

/// Crawls (or reads) the source `name` into its directory and keeps the index in step
/// beside it: every few seconds the pages written so far are synced and, with `embed`,
/// embedded (the crawl waits on the network, the embedding on the CPU); at the end a last
/// sync, then the rest embedded. `progress` hears the crawl's counts and may stop it (the next
/// update goes on from there).
pub async fn update(
    config: &Config,
    name: &str,
    progress: &mut (dyn FnMut(&Counts) -> ControlFlow<()> + Send),
    embed: bool,
) -> anyhow::Result<Updated> {
    let d = dir(config, name)?;
    let source = d.source().with_context(|| format!("no docs source {name} (`caret docs ls`)"))?;
    let _lock = lock(&d)?;
    std::fs::create_dir_all(d.pages())?;
    let index = index(config, Arc::from(transport(config, &Remote::default()).await?), embed)?;
    let ws = open_workspace(config, &d.pages())?;
    update_in(&d, &source, &index, ws, progress).await
}

/// The crawl (or the folder's reading) of `source` into `d` with the index kept in step
/// beside it. (A team server's crawls run on its workers instead, and are indexed after.)
async fn update_in(
    d: &SourceDir,
    source: &Source,
    index: &Index,
    ws: caret_client::state::WorkspaceState,
    progress: &mut (dyn FnMut(&Counts) -> ControlFlow<()> + Send),
) -> anyhow::Result<Updated> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let started = std::time::Instant::now();
    // The index beside the crawl: pages written so far, every few seconds.
    let written = Arc::new(AtomicU64::new(0));
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let beside = {
        let (index, written) = (index.clone(), written.clone());
        tokio::spawn(async move {
            let (mut done, mut totals) = (0, Totals::default());
            loop {
                tokio::select! {
                    () = tokio::time::sleep(BESIDE) => {}
                    _ = stop_rx.changed() => return (ws, totals),
                }
                let now = written.load(Ordering::Relaxed);
                if now == done {
                    continue;
                }
                done = now;
                if let Err(e) = index.step(&ws, &mut totals).await {
                    tracing::warn!("indexing pages beside the crawl: {e:#}");
                }
            }
        })
    };
    let mut counting = |c: &Counts| {
        written.store(c.written, Ordering::Relaxed);
        progress(c)
    };
    let crawled = match &source.origin {
        Origin::Site { url, prefix, depth, max_pages, rate } => {
            let mut settings = caret_docs::crawl::Settings::new(url::Url::parse(url)?);
            settings.prefix = prefix.clone();
            settings.depth = *depth;
            settings.max_pages = *max_pages;
            settings.rate = *rate;
            caret_docs::crawl::crawl(d, &settings, &mut counting).await
        }
        Origin::Folder { path } => read_folder(d, path, &mut counting).await,
    };
    let crawl_seconds = started.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    let (ws, mut totals) = beside.await.context("indexing beside the crawl")?;
    let counts = crawled?;
    // The rest: a last sync (lexical search has every page), then what lacks a vector.
    let last_sync = std::time::Instant::now();
    index.sync(&ws, &mut totals).await?;
    let sync_seconds = last_sync.elapsed().as_secs_f64();
    if index.embeds() {
        index.embed(&ws, &mut totals).await?;
    }
    Ok(Updated {
        counts,
        crawl_seconds,
        synced: totals.synced,
        sync_seconds,
        embedded: totals.embedded,
        vectors: totals.vectors,
        embedded_after: (index.embeds() && totals.model.is_some()).then(|| started.elapsed().as_secs_f64()),
        model: totals.model,
    })
}

/// The index of this machine's sources behind `transport`, with `config`'s scanner and sync
/// batches; `embed`: vectors too.
fn index(
    config: &Config,
    transport: Arc<dyn caret_client::transport::Transport>,
    embed: bool,
) -> anyhow::Result<Index> {
    Ok(Index::new(Arc::new(config.scanner()?), config.sync_options(), transport, embed))
}

/// The team server's library as `config` sets it: crawled pages indexed under `docs-work/`
/// of the server's data directory, sources added by admins unless `[server] docs_sources =
/// "members"` (anything else keeps it to admins: a typo fails closed), sites checked against
/// `[server] egress_allow`.
pub fn team_settings(config: &Config) -> anyhow::Result<caret_library::team::Settings> {
    let managed_by = match config.server.docs_sources.as_str() {
        "members" => caret_identity::Role::Member,
        _ => caret_identity::Role::Admin,
    };
    Ok(caret_library::team::Settings {
        work: crate::runs::data_dir(config).join("docs-work"),
        managed_by,
        egress: config.server.egress().context("[server] egress_allow")?,
        scanner: Arc::new(config.scanner()?),
        sync: config.sync_options(),
    })
}

/// Reads a folder source (blocking reads off the async threads; the progress stays here).
async fn read_folder(
    d: &SourceDir,
    path: &std::path::Path,
    progress: &mut (dyn FnMut(&Counts) -> ControlFlow<()> + Send),
) -> caret_docs::Result<Counts> {
    let (d2, path) = (d.clone(), path.to_path_buf());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Counts>();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let job = tokio::task::spawn_blocking(move || {
        caret_docs::local::import(&d2, &path, &mut |c| {
            let _ = tx.send(c.clone());
            if stop_rx.try_recv().is_ok() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })
    });
    while let Some(c) = rx.recv().await {
        if progress(&c).is_break() {
            let _ = stop_tx.send(());
        }
    }
    job.await.unwrap_or_else(|e| Err(caret_docs::Error::BadRequest(format!("reading the folder: {e}"))))
}

/// The source's update lock: one update of a source at a time (held until dropped).
fn lock(d: &SourceDir) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(&d.root)?;
    let path = d.root.join(".lock");
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => {
            anyhow::bail!("another update of {} is running", d.root.display())
        }
        Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}

/// The sources whose `refresh` interval has passed since their last complete update.
pub fn due(config: &Config) -> anyhow::Result<Vec<String>> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let due = |l: &Listed| caret_library::source::is_due(l.source.refresh.as_deref(), l.updated_at, now);
    Ok(list(config)?.into_iter().filter(due).map(|l| l.source.name).collect())
}

/// Starts `caret docs refresh --due` in the background when a source is due (see
/// [`crate::docs_refresh`]); what is being updated is searched as it was meanwhile.
pub fn refresh_due_in_background(config: &Config) {
    if due(config).is_ok_and(|d| !d.is_empty()) {
        crate::docs_refresh::spawn(config);
    }
}

/// Adds a source (its settings saved; nothing fetched yet: [`update`] does that).
pub fn add(config: &Config, source: &Source) -> anyhow::Result<()> {
    let d = dir(config, &source.name)?;
    anyhow::ensure!(
        !d.root.join("source.json").exists(),
        "a docs source {} exists already (`caret docs rm {}` first, or `caret docs refresh {}`)",
        source.name,
        source.name,
        source.name
    );
    d.save_source(source)?;
    Ok(())
}

/// Removes a source: its pages leave the index, then its directory goes.
pub async fn remove(config: &Config, name: &str) -> anyhow::Result<()> {
    let d = dir(config, name)?;
    anyhow::ensure!(d.root.join("source.json").exists(), "no docs source {name}");
    if d.pages().is_dir() {
        std::fs::remove_dir_all(d.pages())?;
        std::fs::create_dir_all(d.pages())?;
        let ws = open_workspace(config, &d.pages())?;
        let transport = Arc::from(transport(config, &Remote::default()).await?);
        index(config, transport, false)?.sync(&ws, &mut Totals::default()).await?;
        let state = config.workspace_state_dir(&std::fs::canonicalize(d.pages())?);
        let _ = std::fs::remove_dir_all(state);
    }
    std::fs::remove_dir_all(&d.root).with_context(|| format!("removing {}", d.root.display()))?;
    Ok(())
}

/// A documentation hit (the wire type: `caret docs search --json` prints these).
pub use caret_protocol::docs::DocsHit as DocHit;

/// Searches the sources `names` (none: all) for `query`: the best `k` hits, best first.
pub async fn search(config: &Config, query: &str, names: &[String], k: usize) -> anyhow::Result<Vec<DocHit>> {
    search_with(config, query, names, k, caret_protocol::SearchMode::Hybrid).await
}

/// [`search`] with one ranking only (`Lexical`, `Semantic`) or both (`Hybrid`): what the
/// benchmark compares.
pub async fn search_with(
    config: &Config,
    query: &str,
    names: &[String],
    k: usize,
    mode: caret_protocol::SearchMode,
) -> anyhow::Result<Vec<DocHit>> {
    let all = source_names(config);
    if let Some(missing) = names.iter().find(|n| !all.contains(n)) {
        anyhow::bail!("no docs source {missing} (`caret docs ls`)");
    }
    let mut hits = Vec::new();
    for name in all.iter().filter(|n| names.is_empty() || names.contains(n)) {
        let d = dir(config, name)?;
        if !d.pages().is_dir() {
            continue;
        }
        let outcome = crate::search::search_workspace(config, &d.pages(), &Remote::default(), query, k, mode).await?;
        let state = d.state()?;
        hits.extend(outcome.hits.into_iter().filter_map(|h| hit(name, &state, h)));
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    hits.truncate(k);
    Ok(hits)
}

/// The names of the sources, sorted (their settings are not read).
pub fn source_names(config: &Config) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(root(config)) else { return Vec::new() };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().join("source.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
