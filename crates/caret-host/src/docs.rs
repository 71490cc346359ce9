//! Documentation sources (@Docs) of this machine: each in `$CARET_HOME/docs/NAME/` (see
//! [`caret_docs::pages`]), its pages indexed like a workspace — the same sync, chunking by
//! heading, embedding and hybrid search as code — and searched through the warm daemon when
//! it runs. A hit maps back to its page's URL (with the anchor of the heading above it), title,
//! heading path and text.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use caret_docs::pages::{Counts, Origin, Source, SourceDir, State};
use caret_workspace::scan::{Depth, Scanner};
use serde::Serialize;

use crate::config::Config;
use crate::remote::{Remote, engine, open_workspace, transport};

/// Where sources live.
pub fn root(config: &Config) -> PathBuf {
    config.home.join("docs")
}

/// The directory of the source `name` (a name of letters, digits, `.`, `_` and `-`).
pub fn dir(config: &Config, name: &str) -> anyhow::Result<SourceDir> {
    anyhow::ensure!(
        !name.is_empty()
            && name.len() <= 64
            && !name.starts_with('.')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)),
        "a docs source's name is letters, digits, `.`, `_` and `-` (at most 64), not {name:?}"
    );
    Ok(SourceDir::new(root(config).join(name)))
}

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
    /// The index sync: files added, changed, removed.
    pub synced: (u64, u64, u64),
    /// Seconds the sync took (after it, lexical search has the pages).
    pub sync_seconds: f64,
}

/// Crawls (or reads) the source `name` into its directory and syncs its pages with the
/// index; `progress` hears the counts and may stop the crawl (it resumes next time).
pub async fn update(
    config: &Config,
    name: &str,
    progress: &mut (dyn FnMut(&Counts) -> ControlFlow<()> + Send),
) -> anyhow::Result<Updated> {
    let d = dir(config, name)?;
    let source = d.source().with_context(|| format!("no docs source {name} (`caret docs ls`)"))?;
    let _lock = lock(&d)?;
    let started = std::time::Instant::now();
    let counts = match &source.origin {
        Origin::Site { url, prefix, depth, max_pages, rate } => {
            let mut settings = caret_docs::crawl::Settings::new(url::Url::parse(url)?);
            settings.prefix = prefix.clone();
            settings.depth = *depth;
            settings.max_pages = *max_pages;
            settings.rate = *rate;
            caret_docs::crawl::crawl(&d, &settings, progress).await?
        }
        Origin::Folder { path } => {
            let (d2, path) = (d.clone(), path.clone());
            // Reading files blocks: off the async threads (the progress stays here).
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
            job.await.context("reading the folder")??
        }
    };
    let crawl_seconds = started.elapsed().as_secs_f64();
    let started = std::time::Instant::now();
    let report = sync_pages(config, &d).await?;
    Ok(Updated { counts, crawl_seconds, synced: report, sync_seconds: started.elapsed().as_secs_f64() })
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
    let mut out = Vec::new();
    for l in list(config)? {
        let Some(every) = l.source.refresh.as_deref().and_then(|r| crate::units::parse_duration(r).ok()) else {
            continue;
        };
        if l.updated_at.is_none_or(|t| now.saturating_sub(t) >= every.as_secs()) {
            out.push(l.source.name);
        }
    }
    Ok(out)
}

/// Starts `caret docs refresh --due` in the background when a source is due (its output in
/// `$CARET_HOME/docs/refresh.log`); what is being updated is searched as it was meanwhile.
pub fn refresh_due_in_background(config: &Config) {
    if due(config).is_ok_and(|d| d.is_empty()) {
        return;
    }
    let (Ok(me), Ok(log)) = (
        std::env::current_exe(),
        std::fs::OpenOptions::new().create(true).append(true).open(root(config).join("refresh.log")),
    ) else {
        return;
    };
    let mut cmd = std::process::Command::new(me);
    cmd.args(["docs", "refresh", "--due"]).env("CARET_HOME", &config.home).stdin(std::process::Stdio::null());
    if let Ok(err) = log.try_clone() {
        cmd.stdout(log).stderr(err);
    }
    if let Err(e) = cmd.spawn() {
        tracing::warn!("refreshing docs sources in the background: {e}");
    }
}

/// Syncs a source's pages with the index: (added, changed, removed).
async fn sync_pages(config: &Config, d: &SourceDir) -> anyhow::Result<(u64, u64, u64)> {
    std::fs::create_dir_all(d.pages())?;
    let ws = open_workspace(config, &d.pages())?;
    let transport = transport(config, &Remote::default()).await?;
    let sync = engine(config)?
        .sync(&ws, transport.as_ref())
        .await
        .with_context(|| format!("indexing the pages of {}", d.root.display()))?;
    Ok((sync.added, sync.modified, sync.deleted))
}

/// Embeds what the source's pages lack (search by meaning then has them); `progress` hears
/// how far it got.
pub async fn embed(
    config: &Config,
    name: &str,
    progress: impl FnMut(&caret_client::index::EmbedProgress) + Send,
) -> anyhow::Result<caret_client::index::EmbedReport> {
    let d = dir(config, name)?;
    let ws = open_workspace(config, &d.pages())?;
    let scanner = Arc::new(Scanner::new(config.walk_config(), config.chunker()?, Depth::Hash));
    let transport = transport(config, &Remote::default()).await?;
    caret_client::index::embed_missing(scanner, &ws, transport.as_ref(), progress)
        .await
        .with_context(|| format!("embedding the pages of {name}"))
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
        sync_pages(config, &d).await?;
        let state = config.workspace_state_dir(&std::fs::canonicalize(d.pages())?);
        let _ = std::fs::remove_dir_all(state);
    }
    std::fs::remove_dir_all(&d.root).with_context(|| format!("removing {}", d.root.display()))?;
    Ok(())
}

/// A documentation hit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DocHit {
    /// The page's URL, with the anchor of the heading above the hit.
    pub url: String,
    /// The page's title.
    pub title: String,
    /// The headings above the hit, outermost first, ` > ` between.
    pub heading: String,
    /// The hit's text.
    pub text: String,
    /// Its score (higher is better).
    pub score: f32,
    /// The source's name.
    pub source: String,
}

/// Searches the sources `names` (none: all) for `query`: the best `k` hits, best first.
pub async fn search(config: &Config, query: &str, names: &[String], k: usize) -> anyhow::Result<Vec<DocHit>> {
    let all = list(config)?;
    let chosen: Vec<&Listed> = all.iter().filter(|l| names.is_empty() || names.contains(&l.source.name)).collect();
    if let Some(missing) = names.iter().find(|n| !all.iter().any(|l| &l.source.name == *n)) {
        anyhow::bail!("no docs source {missing} (`caret docs ls`)");
    }
    let mut hits = Vec::new();
    for l in chosen {
        let d = dir(config, &l.source.name)?;
        if !d.pages().is_dir() {
            continue;
        }
        let state = d.state()?;
        let outcome = crate::search::search_workspace(
            config,
            &d.pages(),
            &Remote::default(),
            query,
            k,
            caret_protocol::SearchMode::Hybrid,
        )
        .await?;
        hits.extend(outcome.hits.into_iter().filter_map(|h| hit(&l.source.name, &state, h)));
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    hits.truncate(k);
    Ok(hits)
}

/// A search hit of a source's pages as a documentation hit (`None`: not a page any more).
fn hit(source: &str, state: &State, h: caret_client::index::Hit) -> Option<DocHit> {
    let (url, page) = state.pages.iter().find(|(_, p)| p.file == h.path)?;
    // The headings above the hit's first line, innermost last.
    let mut path: Vec<&caret_docs::extract::Heading> = Vec::new();
    for heading in page.headings.iter().filter(|x| x.line > 0 && x.line <= h.start_line) {
        path.retain(|p| p.level < heading.level);
        path.push(heading);
    }
    // The page's own title heading is the title, not a heading.
    let shown: Vec<&str> =
        path.iter().filter(|x| !(x.line == 1 && x.text == page.title)).map(|x| x.text.as_str()).collect();
    let anchor = path.iter().rev().find_map(|x| x.anchor.as_deref());
    let url = match anchor {
        Some(a) => format!("{url}#{a}"),
        None => url.clone(),
    };
    Some(DocHit {
        url,
        title: page.title.clone(),
        heading: shown.join(" > "),
        text: h.snippet,
        score: h.score,
        source: source.to_owned(),
    })
}
