//! Documentation sources of a team server's tenants (`/v1/docs/...` on `caret serve`): a
//! tenant adds a docs site once, the server crawls it through an allow-list proxy (the runs'
//! network rules: the site's host and port only, no name leading to an internal address),
//! indexes its pages in a workspace of the tenant's own index (the same chunking, embedding
//! and hybrid search as code), and every member searches it.
//!
//! At rest on the object store, under `docs/{tenant}/{source id}/`: `record` (the source's
//! settings and status), `state` (its pages' URLs, validators and headings) and one object
//! per page, all sealed with a key of the tenant's; object names reveal nothing (the source id
//! and the page names are keyed). The key of a source's index workspace is derived from the
//! runs' key, which replicas share, so any replica searches what another crawled. A crawl
//! works in a plaintext directory under the server's data directory, removed when it ends; one
//! killed halfway leaves it, and the next update goes on from it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use caret_anyrun::docs_crawl::unpack_pages;
use caret_anyrun::runs::{DocsCrawls, RunService, TenantRef};
use caret_client::sync::SyncOptions;
use caret_crypto::WorkspaceKey;
use caret_docs::pages::{Origin, Source, SourceDir, State};
use caret_index::db::Tenant;
use caret_protocol::docs::{AddDocsSource, DocsCounts, DocsHit, DocsSearch, DocsSource, DocsState};
use caret_protocol::runs::{DocsCrawl, DocsCrawled, RunClass, RunState};
use caret_server::docs_library::{DocsError, DocsLibrary};
use caret_workspace::scan::Scanner;
use futures::StreamExt as _;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use serde::{Deserialize, Serialize};

use crate::index::{Index, Totals, hit};
use crate::source::{check_name, is_due, refresh_interval, site};

/// An update that has written nothing for this long is taken for dead (its replica gone).
const STALE: Duration = Duration::from_secs(120);
/// How often an update writes its progress (its sign of life).
const BEAT: Duration = Duration::from_secs(5);
/// Updates running at once on one replica.
const AT_ONCE: usize = 2;
/// The most a crawl's pages may come to, unpacked.
const MAX_UNPACKED: u64 = 1 << 30;

/// Whether a page file a worker names stays under the pages' folder.
fn safe_file(file: &str) -> bool {
    let path = std::path::Path::new(file);
    !file.is_empty() && path.components().all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// What is kept of a source (sealed).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    source: Source,
    state: DocsState,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    last: DocsCounts,
    #[serde(default)]
    pages: u64,
    #[serde(default)]
    updated_at: Option<u64>,
    /// When `state` last changed or the update last wrote its progress (Unix seconds).
    since: u64,
    /// The run crawling it on the workers (the last one queued).
    #[serde(default)]
    run: Option<String>,
}

/// A source's pages as search reads them: its state and its index's names of the page files.
struct Loaded {
    updated_at: Option<u64>,
    state: State,
    /// Obfuscated path in the index → page file.
    files: HashMap<String, String>,
}

/// How a team server keeps its library: what its config decides.
#[derive(Clone)]
pub struct Settings {
    /// Where crawled pages are indexed (plaintext while an update runs, removed after).
    pub work: PathBuf,
    /// The least role that may add and remove sources, unless an organisation's settings say.
    pub managed_by: caret_identity::Role,
    /// What a site may be: a source written as an internal address is refused when added.
    pub egress: caret_sandbox::egress::Egress,
    /// How pages are read and chunked for the index.
    pub scanner: Arc<Scanner>,
    /// The sync's batches.
    pub sync: SyncOptions,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("work", &self.work)
            .field("managed_by", &self.managed_by)
            .field("egress", &self.egress)
            .finish_non_exhaustive()
    }
}

/// The team server's documentation library.
#[derive(Clone)]
pub struct TeamDocs {
    inner: Arc<Inner>,
}

struct Inner {
    service: Arc<caret_index::service::Service>,
    /// Where crawls run: the workers' queue (it hands finished crawls back to this library).
    runs: Arc<RunService>,
    master: WorkspaceKey,
    settings: Settings,
    /// Updates running on this replica, with their stop flags.
    running: Mutex<HashMap<(String, String), Arc<AtomicBool>>>,
    loaded: Mutex<HashMap<(String, String), Arc<Loaded>>>,
    slots: tokio::sync::Semaphore,
    /// Where updates run: a runtime of their own (two threads), so that crawling, parsing
    /// and indexing never hold up the requests the server answers.
    updates: tokio::runtime::Handle,
}

/// A runtime for the updates, kept by a thread of its own for the life of the process.
fn updates_runtime() -> tokio::runtime::Handle {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name("caret-docs".into()).spawn(move || {
        match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("caret-docs")
            .enable_all()
            .build()
        {
            Ok(rt) => {
                let _ = tx.send(Some(rt.handle().clone()));
                rt.block_on(std::future::pending::<()>());
            }
            Err(e) => {
                tracing::warn!("docs updates share the server's runtime: {e}");
                let _ = tx.send(None);
            }
        }
    });
    match spawned.ok().and_then(|_| rx.recv().ok().flatten()) {
        Some(handle) => handle,
        None => tokio::runtime::Handle::current(),
    }
}

impl std::fmt::Debug for TeamDocs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TeamDocs").field("settings", &self.inner.settings).finish_non_exhaustive()
    }
}

/// The object (under a source's folder) of a page file: its name keyed.
fn page_object(names: &caret_crypto::PathObfuscator, file: &str) -> String {
    format!("page/{}", names.segment(file.as_bytes()))
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn internal(e: impl std::fmt::Display) -> DocsError {
    DocsError::Internal(e.to_string())
}

impl TeamDocs {
    /// The library of `caret serve`: over its index `service`, keyed from the runs' key,
    /// indexing crawled pages under `settings.work`; its crawls are runs of `runs`, which
    /// hands them back here when they end.
    pub fn open(settings: Settings, service: Arc<caret_index::service::Service>, runs: Arc<RunService>) -> TeamDocs {
        let docs = TeamDocs {
            inner: Arc::new(Inner {
                service,
                master: runs.derived_key("docs"),
                runs: runs.clone(),
                settings,
                running: Mutex::default(),
                loaded: Mutex::default(),
                slots: tokio::sync::Semaphore::new(AT_ONCE),
                updates: updates_runtime(),
            }),
        };
        // The service holds the library for as long as the server lives (and the library the
        // service: a cycle of the process's lifetime).
        runs.set_docs(Arc::new(docs.clone()));
        docs
    }

    /// Every `every`: follows crawls the workers ended without a word (a lease that ran out),
    /// indexes what a lost replica left halfway and queues crawls of what is due by its
    /// `refresh` interval (the first look at once, so a restart resumes).
    pub fn spawn_upkeep(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = me.upkeep().await {
                    tracing::warn!("docs sources' upkeep: {e:#}");
                }
                tokio::time::sleep(every).await;
            }
        })
    }

    async fn upkeep(&self) -> anyhow::Result<()> {
        let tenants = self.inner.service.db().tenants().await?;
        let t = now();
        for tenant in tenants {
            for (sid, record) in self.records(&tenant).await.map_err(|e| anyhow::anyhow!("{e}"))? {
                let name = record.source.name.clone();
                let stale = t.saturating_sub(record.since) > STALE.as_secs();
                let due = matches!(record.state, DocsState::Ready | DocsState::Failed)
                    && is_due(record.source.refresh.as_deref(), record.updated_at, t);
                if !matches!(record.state, DocsState::Queued | DocsState::Updating) {
                    if due {
                        tracing::info!(tenant = %tenant.id, source = %sid, "refreshing a docs source");
                        self.crawl(&tenant, &name, RunClass::Batch).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                    }
                    continue;
                }
                // In flight: its crawl's run tells where it is.
                let run = match &record.run {
                    Some(id) => self.inner.runs.get(&tenant.id, id).await.ok(),
                    None => None,
                };
                let crawled = self.get_sealed(&tenant.id, &sid, "crawled").await.ok().flatten().is_some();
                match run.map(|r| (r.state, r.reason)) {
                    Some((state, _)) if !state.is_final() => {}
                    // Crawled, and its indexing not under way anywhere: index it here.
                    _ if crawled && stale && !self.is_running(&tenant.id, &name) => self.ingest(tenant.clone(), name),
                    _ if crawled => {}
                    Some((RunState::Failed | RunState::Cancelled, reason)) => {
                        let why = reason.unwrap_or_else(|| "the crawl ended without its pages".into());
                        self.fail(&tenant.id, &name, &why).await;
                    }
                    // No run (never queued, or gone), or one that ended and was indexed here
                    // while this look began: queue a crawl when nothing moved for a while.
                    _ if stale || record.run.is_none() => {
                        self.crawl(&tenant, &name, RunClass::Batch).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn is_running(&self, tenant: &str, name: &str) -> bool {
        self.inner
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&(tenant.to_owned(), name.to_owned()))
    }

    /// The key of a source's index workspace.
    fn source_key(&self, tenant: &str, name: &str) -> WorkspaceKey {
        self.inner.master.derive(&format!("docs/{tenant}/{name}"))
    }

    /// The source's id: its objects' folder and (with `docs` before it) its workspace's id.
    fn sid(&self, tenant: &str, name: &str) -> String {
        self.source_key(tenant, name).key_id()
    }

    fn object(tenant: &str, sid: &str, rest: &str) -> ObjectPath {
        ObjectPath::from(format!("docs/{tenant}/{sid}/{rest}"))
    }

    fn store(&self) -> &Arc<dyn ObjectStore> {
        self.inner.service.store()
    }

    async fn put_sealed(&self, tenant: &str, sid: &str, rest: &str, bytes: &[u8]) -> Result<(), DocsError> {
        let sealed = self
            .inner
            .master
            .sealer(&format!("docs/{tenant}"))
            .seal(&format!("{sid}/{rest}"), bytes)
            .map_err(internal)?;
        self.store().put(&Self::object(tenant, sid, rest), sealed.into()).await.map_err(internal)?;
        Ok(())
    }

    async fn get_sealed(&self, tenant: &str, sid: &str, rest: &str) -> Result<Option<Vec<u8>>, DocsError> {
        let got = match self.store().get(&Self::object(tenant, sid, rest)).await {
            Ok(g) => g.bytes().await.map_err(internal)?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(internal(e)),
        };
        let opened = self
            .inner
            .master
            .sealer(&format!("docs/{tenant}"))
            .open(&format!("{sid}/{rest}"), &got)
            .map_err(|e| DocsError::Internal(format!("a stored docs object does not open: {e}")))?;
        Ok(Some(opened))
    }

    async fn record(&self, tenant: &str, name: &str) -> Result<Option<Record>, DocsError> {
        let sid = self.sid(tenant, name);
        match self.get_sealed(tenant, &sid, "record").await? {
            Some(bytes) => Ok(Some(serde_json::from_slice(&bytes).map_err(internal)?)),
            None => Ok(None),
        }
    }

    async fn save_record(&self, tenant: &str, record: &Record) -> Result<(), DocsError> {
        let sid = self.sid(tenant, &record.source.name);
        let json = serde_json::to_vec(record).map_err(internal)?;
        self.put_sealed(tenant, &sid, "record", &json).await
    }

    /// The tenant's sources, by name, with their ids.
    async fn records(&self, tenant: &Tenant) -> Result<Vec<(String, Record)>, DocsError> {
        let prefix = ObjectPath::from(format!("docs/{}", tenant.id));
        let objects: Vec<_> = self.store().list(Some(&prefix)).collect().await;
        let mut out = Vec::new();
        for o in objects {
            let o = o.map_err(internal)?;
            let parts: Vec<_> = o.location.parts().map(|p| p.as_ref().to_owned()).collect();
            if let [_, _, sid, last] = parts.as_slice()
                && last == "record"
                && let Some(bytes) = self.get_sealed(&tenant.id, sid, "record").await?
            {
                let record: Record = serde_json::from_slice(&bytes).map_err(internal)?;
                out.push((sid.clone(), record));
            }
        }
        out.sort_by(|a, b| a.1.source.name.cmp(&b.1.source.name));
        Ok(out)
    }

    /// Queues a crawl of a source on the workers (its page state as the run's bundle, so that
    /// its requests are conditional) and records it.
    async fn crawl(&self, tenant: &Tenant, name: &str, class: RunClass) -> Result<Record, DocsError> {
        let Some(mut record) = self.record(&tenant.id, name).await? else {
            return Err(DocsError::NotFound(name.to_owned()));
        };
        let Origin::Site { url, prefix, depth, max_pages, rate } = &record.source.origin else {
            return Err(DocsError::BadRequest("a team server crawls docs sites only".into()));
        };
        let job = DocsCrawl {
            source: name.to_owned(),
            url: url.clone(),
            prefix: prefix.clone(),
            depth: *depth,
            max_pages: *max_pages as u64,
            rate: *rate,
        };
        let sid = self.sid(&tenant.id, name);
        let state = self.get_sealed(&tenant.id, &sid, "state").await?.unwrap_or_default();
        let who = TenantRef { id: tenant.id.clone(), name: tenant.name.clone() };
        let run = self.inner.runs.submit_docs(&who, class, job, &state).await.map_err(internal)?;
        record.run = Some(run.id);
        record.state = DocsState::Queued;
        record.error = None;
        record.since = now();
        self.save_record(&tenant.id, &record).await?;
        Ok(record)
    }

    /// Records a source's update as failed.
    async fn fail(&self, tenant: &str, name: &str, why: &str) {
        if let Ok(Some(mut record)) = self.record(tenant, name).await {
            record.state = DocsState::Failed;
            record.error = Some(why.to_owned());
            record.since = now();
            if let Err(e) = self.save_record(tenant, &record).await {
                tracing::warn!(tenant, "recording a docs source's failure: {e}");
            }
        }
    }

    /// Indexes a source's crawled pages on this replica (at most [`AT_ONCE`] at once, the
    /// others wait for a slot); nothing when it is being indexed here already.
    fn ingest(&self, tenant: Tenant, name: String) {
        let stop = Arc::new(AtomicBool::new(false));
        {
            let mut running = self.inner.running.lock().unwrap_or_else(PoisonError::into_inner);
            let key = (tenant.id.clone(), name.clone());
            if running.contains_key(&key) {
                return;
            }
            running.insert(key, stop.clone());
        }
        let me = self.clone();
        self.inner.updates.spawn(async move {
            let _slot = me.inner.slots.acquire().await;
            if let Err(e) = me.index_crawled(&tenant, &name, &stop).await {
                tracing::warn!(tenant = %tenant.id, "indexing a docs source: {e}");
                if !stop.load(Ordering::Relaxed) {
                    me.fail(&tenant.id, &name, &e.to_string()).await;
                }
            }
            me.inner.running.lock().unwrap_or_else(PoisonError::into_inner).remove(&(tenant.id.clone(), name.clone()));
            me.inner.loaded.lock().unwrap_or_else(PoisonError::into_inner).remove(&(tenant.id.clone(), name));
        });
    }

    /// Indexes what a worker's crawl brought (kept sealed as `crawled` until this ends), then
    /// seals what changed.
    async fn index_crawled(&self, tenant: &Tenant, name: &str, stop: &Arc<AtomicBool>) -> Result<(), DocsError> {
        let Some(mut record) = self.record(&tenant.id, name).await? else { return Ok(()) };
        let sid = self.sid(&tenant.id, name);
        let Some(bytes) = self.get_sealed(&tenant.id, &sid, "crawled").await? else { return Ok(()) };
        let crawled: DocsCrawled = serde_json::from_slice(&bytes).map_err(internal)?;
        record.state = DocsState::Updating;
        record.since = now();
        self.save_record(&tenant.id, &record).await?;
        // The working directory: what a killed indexing left, or the pages as stored; then
        // the crawl's changes over it.
        let d = SourceDir::new(self.inner.settings.work.join(&tenant.id).join(&sid));
        let before = self.restore(&tenant.id, &sid, &d, &record.source).await?;
        let after: State = serde_json::from_str(&crawled.state).map_err(internal)?;
        let pages = unpack_pages(&crawled.pages, MAX_UNPACKED).map_err(DocsError::Internal)?;
        let had = d.state().map_err(internal)?;
        for page in had.pages.values().filter(|p| !after.pages.values().any(|a| a.file == p.file)) {
            d.remove_page(&page.file);
        }
        for (file, text) in &pages {
            if !safe_file(file) || !after.pages.values().any(|p| &p.file == file) {
                return Err(DocsError::Internal(format!("the crawl sent a page {file:?} its state does not name")));
            }
            d.write_page(file, text).map_err(internal)?;
        }
        d.save_state(&after).map_err(internal)?;
        // Index: the tenant's own, in a workspace keyed for this source.
        let key = self.source_key(&tenant.id, name);
        let ws =
            caret_client::state::WorkspaceState::given(&d.pages(), &d.root.join("index"), &format!("docs{sid}"), key)
                .map_err(internal)?;
        let transport: Arc<dyn caret_client::transport::Transport> = Arc::new(
            caret_client::transport::InProcessTransport::new(self.inner.service.clone(), tenant.clone(), "team docs"),
        );
        let embed = self.inner.service.model_id().is_some();
        let index = Index::new(self.inner.settings.scanner.clone(), self.inner.settings.sync, transport, embed);
        // A sign of life every few seconds, so that no other replica starts it again.
        let beat = {
            let (me, tenant, mut record) = (self.clone(), tenant.id.clone(), record.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(BEAT).await;
                    record.since = now();
                    let _ = me.save_record(&tenant, &record).await;
                }
            })
        };
        let indexed = index.step(&ws, &mut Totals::default()).await;
        beat.abort();
        if stop.load(Ordering::Relaxed) {
            let _ = std::fs::remove_dir_all(&d.root);
            return Ok(());
        }
        indexed.map_err(|e| DocsError::Internal(format!("{e:#}")))?;
        self.seal_pages(&tenant.id, &sid, &d, &before, &after).await?;
        let _ = std::fs::remove_dir_all(&d.root);
        let _ = self.store().delete(&Self::object(&tenant.id, &sid, "crawled")).await;
        let Some(mut record) = self.record(&tenant.id, name).await? else { return Ok(()) };
        record.pages = after.pages.len() as u64;
        record.since = now();
        record.state = DocsState::Ready;
        record.last = crawled.counts;
        record.updated_at = Some(now());
        self.save_record(&tenant.id, &record).await
    }

    /// Fills `d` with the source's stored pages unless an update killed halfway left it (that
    /// one goes on from there); the stored state, to tell what changed.
    async fn restore(&self, tenant: &str, sid: &str, d: &SourceDir, source: &Source) -> Result<State, DocsError> {
        let stored: State = match self.get_sealed(tenant, sid, "state").await? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(internal)?,
            None => State::default(),
        };
        if d.root.join("state.json").is_file() && d.state().is_ok() {
            return Ok(stored);
        }
        let _ = std::fs::remove_dir_all(&d.root);
        std::fs::create_dir_all(d.pages()).map_err(internal)?;
        d.save_source(source).map_err(internal)?;
        let names = self.source_key(tenant, &source.name).paths();
        for page in stored.pages.values() {
            if let Some(text) = self.get_sealed(tenant, sid, &page_object(&names, &page.file)).await? {
                d.write_page(&page.file, &String::from_utf8_lossy(&text)).map_err(internal)?;
            }
        }
        d.save_state(&stored).map_err(internal)?;
        Ok(stored)
    }

    /// Seals the pages that are new or changed since `before`, deletes those gone, then the
    /// state.
    async fn seal_pages(
        &self,
        tenant: &str,
        sid: &str,
        d: &SourceDir,
        before: &State,
        now: &State,
    ) -> Result<(), DocsError> {
        let name = d.source().map_err(internal)?.name;
        let names = self.source_key(tenant, &name).paths();
        let old: BTreeMap<&str, &str> = before.pages.values().map(|p| (p.file.as_str(), p.hash.as_str())).collect();
        let kept: HashSet<&str> = now.pages.values().map(|p| p.file.as_str()).collect();
        for page in now.pages.values() {
            if old.get(page.file.as_str()) == Some(&page.hash.as_str()) {
                continue;
            }
            let text = std::fs::read(d.pages().join(&page.file)).map_err(internal)?;
            self.put_sealed(tenant, sid, &page_object(&names, &page.file), &text).await?;
        }
        for file in old.keys().filter(|f| !kept.contains(*f)) {
            let path = Self::object(tenant, sid, &page_object(&names, file));
            let _ = self.store().delete(&path).await;
        }
        let json = serde_json::to_vec(now).map_err(internal)?;
        self.put_sealed(tenant, sid, "state", &json).await
    }

    /// A source's pages as search reads them (kept while its last update stands).
    async fn loaded(&self, tenant: &str, record: &Record) -> Result<Arc<Loaded>, DocsError> {
        let key = (tenant.to_owned(), record.source.name.clone());
        if let Some(l) = self.inner.loaded.lock().unwrap_or_else(PoisonError::into_inner).get(&key)
            && l.updated_at == record.updated_at
        {
            return Ok(l.clone());
        }
        let sid = self.sid(tenant, &record.source.name);
        let state: State = match self.get_sealed(tenant, &sid, "state").await? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(internal)?,
            None => State::default(),
        };
        let paths = self.source_key(tenant, &record.source.name).paths();
        let files = state.pages.values().map(|p| (paths.path(p.file.as_bytes()), p.file.clone())).collect();
        let loaded = Arc::new(Loaded { updated_at: record.updated_at, state, files });
        self.inner.loaded.lock().unwrap_or_else(PoisonError::into_inner).insert(key, loaded.clone());
        Ok(loaded)
    }

    fn as_wire(record: &Record) -> DocsSource {
        let (url, prefix) = match &record.source.origin {
            Origin::Site { url, prefix, .. } => (url.clone(), prefix.clone()),
            Origin::Folder { path } => (path.display().to_string(), String::new()),
        };
        DocsSource {
            name: record.source.name.clone(),
            url,
            prefix,
            refresh: record.source.refresh.clone(),
            state: record.state,
            pages: record.pages,
            updated_at: record.updated_at,
            last: record.last.clone(),
            error: record.error.clone(),
        }
    }
}

#[async_trait::async_trait]
impl DocsLibrary for TeamDocs {
    fn managed_by(&self) -> caret_identity::Role {
        self.inner.settings.managed_by
    }

    async fn add(&self, tenant: &Tenant, req: AddDocsSource) -> Result<DocsSource, DocsError> {
        let bad = |e: anyhow::Error| DocsError::BadRequest(format!("{e:#}"));
        check_name(&req.name).map_err(bad)?;
        if let Some(r) = &req.refresh {
            refresh_interval(r).context("refresh").map_err(bad)?;
        }
        let max_pages = req.max_pages.unwrap_or(2000).clamp(1, 100_000) as usize;
        let origin =
            site(&req.url, req.prefix.clone(), req.depth.unwrap_or(6).min(64), max_pages, req.rate.unwrap_or(20.0))
                .map_err(bad)?;
        // A site written as an internal address is refused now; a name, where the worker
        // resolves it.
        if let Ok(url) = url::Url::parse(&req.url)
            && let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default())
        {
            self.inner.settings.egress.check_literal(host, port).map_err(|e| DocsError::BadRequest(e.to_string()))?;
        }
        if self.record(&tenant.id, &req.name).await?.is_some() {
            return Err(DocsError::Conflict(format!("a docs source {} exists already", req.name)));
        }
        let source = Source { name: req.name.clone(), origin, refresh: req.refresh.clone() };
        let record = Record {
            source,
            state: DocsState::Queued,
            error: None,
            last: DocsCounts::default(),
            pages: 0,
            updated_at: None,
            since: now(),
            run: None,
        };
        self.save_record(&tenant.id, &record).await?;
        let record = self.crawl(tenant, &req.name, RunClass::Interactive).await?;
        Ok(Self::as_wire(&record))
    }

    async fn list(&self, tenant: &Tenant) -> Result<Vec<DocsSource>, DocsError> {
        let mut out = Vec::new();
        for (_, record) in self.records(tenant).await? {
            let mut wire = Self::as_wire(&record);
            // A crawl a worker has taken: updating, with the counts it last reported.
            if record.state == DocsState::Queued
                && let Some(id) = &record.run
                && let Ok(run) = self.inner.runs.get(&tenant.id, id).await
                && run.state == RunState::Running
            {
                wire.state = DocsState::Updating;
                if let Some(counts) = self.inner.runs.docs_progress(&tenant.id, &run).await {
                    wire.last = counts;
                }
            }
            out.push(wire);
        }
        Ok(out)
    }

    async fn remove(&self, tenant: &Tenant, name: &str) -> Result<(), DocsError> {
        let record = match check_name(name) {
            Ok(()) => self.record(&tenant.id, name).await?,
            Err(_) => None,
        };
        let Some(record) = record else { return Err(DocsError::NotFound(name.to_owned())) };
        if let Some(run) = &record.run
            && let Err(e) = self.inner.runs.cancel(&tenant.id, run).await
        {
            tracing::debug!(tenant = %tenant.id, "cancelling a removed docs source's crawl: {e}");
        }
        let running = self
            .inner
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(tenant.id.clone(), name.to_owned()))
            .cloned();
        if let Some(stop) = running {
            stop.store(true, Ordering::Relaxed);
        }
        let sid = self.sid(&tenant.id, name);
        // The record first: an update still ending sees it gone and keeps nothing.
        let _ = self.store().delete(&Self::object(&tenant.id, &sid, "record")).await;
        match self.inner.service.delete_workspace(tenant, &format!("docs{sid}")).await {
            Ok(()) | Err(caret_index::Error::NotFound(_)) => {}
            Err(e) => return Err(internal(e)),
        }
        let prefix = ObjectPath::from(format!("docs/{}/{sid}", tenant.id));
        let objects: Vec<_> = self.store().list(Some(&prefix)).collect().await;
        for o in objects.into_iter().flatten() {
            let _ = self.store().delete(&o.location).await;
        }
        self.inner.loaded.lock().unwrap_or_else(PoisonError::into_inner).remove(&(tenant.id.clone(), name.to_owned()));
        Ok(())
    }

    async fn refresh(&self, tenant: &Tenant, name: &str) -> Result<DocsSource, DocsError> {
        let missing = || DocsError::NotFound(name.to_owned());
        check_name(name).map_err(|_| missing())?;
        let record = self.record(&tenant.id, name).await?.ok_or_else(missing)?;
        let alive = now().saturating_sub(record.since) <= STALE.as_secs();
        let crawling = match &record.run {
            Some(id) => self.inner.runs.get(&tenant.id, id).await.is_ok_and(|r| !r.state.is_final()),
            None => false,
        };
        if crawling || self.is_running(&tenant.id, name) || (record.state == DocsState::Updating && alive) {
            return Err(DocsError::Conflict(format!("{name} is being updated; its crawl goes on")));
        }
        let record = self.crawl(tenant, name, RunClass::Interactive).await?;
        Ok(Self::as_wire(&record))
    }

    async fn search(&self, tenant: &Tenant, req: &DocsSearch) -> Result<Vec<DocsHit>, DocsError> {
        let records = self.records(tenant).await?;
        if let Some(missing) = req.names.iter().find(|n| !records.iter().any(|(_, r)| &r.source.name == *n)) {
            return Err(DocsError::NotFound(missing.clone()));
        }
        let mut hits = Vec::new();
        for (sid, record) in records.iter().filter(|(_, r)| req.names.is_empty() || req.names.contains(&r.source.name))
        {
            let name = &record.source.name;
            let key = self.source_key(&tenant.id, name).server_key();
            let search = caret_protocol::SearchRequest {
                query: req.query.clone(),
                k: req.k,
                mode: caret_protocol::SearchMode::Hybrid,
            };
            let found = match self.inner.service.search(tenant, &format!("docs{sid}"), &key, &search).await {
                Ok(found) => found,
                // Nothing indexed yet (its first crawl is queued).
                Err(caret_index::Error::NotFound(_)) => continue,
                Err(caret_index::Error::BadRequest(m)) => return Err(DocsError::BadRequest(m)),
                Err(e) => return Err(internal(e)),
            };
            let loaded = self.loaded(&tenant.id, record).await?;
            let names = self.source_key(&tenant.id, name).paths();
            let mut texts: HashMap<String, Option<String>> = HashMap::new();
            for h in found.hits {
                let Some(file) = loaded.files.get(&h.path) else { continue };
                if !texts.contains_key(file) {
                    let object = page_object(&names, file);
                    let text = self
                        .get_sealed(&tenant.id, sid, &object)
                        .await?
                        .map(|b| String::from_utf8_lossy(&b).into_owned());
                    texts.insert(file.clone(), text);
                }
                let Some(Some(text)) = texts.get(file) else { continue };
                let lines: Vec<&str> = text.lines().collect();
                let (a, b) = ((h.start_line as usize).saturating_sub(1), (h.end_line as usize).min(lines.len()));
                let snippet = lines.get(a..b).map(|l| l.join("\n")).unwrap_or_default();
                let client_hit = caret_client::index::Hit {
                    path: file.clone(),
                    start_line: h.start_line,
                    end_line: h.end_line,
                    score: h.score,
                    snippet,
                };
                hits.extend(hit(name, &loaded.state, client_hit));
            }
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
        hits.truncate(req.k as usize);
        Ok(hits)
    }
}

#[async_trait::async_trait]
impl DocsCrawls for TeamDocs {
    async fn ended(
        &self,
        tenant_id: &str,
        run: &str,
        job: &DocsCrawl,
        state: RunState,
        reason: Option<&str>,
        crawled: Option<DocsCrawled>,
    ) -> Result<(), String> {
        let name = &job.source;
        let Some(mut record) = self.record(tenant_id, name).await.map_err(|e| e.to_string())? else { return Ok(()) };
        if record.run.as_deref() != Some(run) {
            // Removed and added again, or crawled again since: not this source's crawl now.
            return Ok(());
        }
        let Some(crawled) = crawled.filter(|_| state == RunState::Succeeded) else {
            self.fail(tenant_id, name, reason.unwrap_or("the crawl ended without its pages")).await;
            return Ok(());
        };
        // Kept (sealed) before the worker hears that it may go: a replica lost while indexing
        // leaves it for another to index.
        let sid = self.sid(tenant_id, name);
        let json = serde_json::to_vec(&crawled).map_err(|e| e.to_string())?;
        self.put_sealed(tenant_id, &sid, "crawled", &json).await.map_err(|e| e.to_string())?;
        record.state = DocsState::Updating;
        record.last = crawled.counts;
        record.since = now();
        self.save_record(tenant_id, &record).await.map_err(|e| e.to_string())?;
        let tenants = self.inner.service.db().tenants().await.map_err(|e| e.to_string())?;
        if let Some(tenant) = tenants.into_iter().find(|t| t.id == tenant_id) {
            self.ingest(tenant, name.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::safe_file;

    #[test]
    fn a_worker_names_page_files_under_the_pages_only() {
        assert!(safe_file("guide/start.md"));
        assert!(safe_file("index.md"));
        for bad in ["", "../escape.md", "/etc/passwd", "guide/../../x.md", "./x.md"] {
            assert!(!safe_file(bad), "{bad:?} was taken");
        }
    }
}
