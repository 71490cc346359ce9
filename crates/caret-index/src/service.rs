//! The sync service: what the HTTP routes and the in-process transport both call, so embedded
//! and remote use share one code path.
//!
//! Chunk texts and queries are held in memory only while their ids are checked and their
//! keyed terms and vectors computed; nothing here writes or logs them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use caret_crypto::ServerKey;
use caret_embed::Embedder;
use caret_protocol::{
    ChunkText, CommitRequest, CommitResponse, CreateWorkspace, DirListing, EmbedRequest, EmbedResponse, MissingVector,
    MissingVectors, PlanRequest, PlanResponse, SearchMode, SearchRequest, SearchResponse, TreeEntry, TreeRequest,
    TreeResponse, WorkspaceInfo,
};
use caret_store::{ChunkRecord, Namespace, Query, Record, State, VectorBatch, Weights};
use caret_workspace::merkle::{MerkleTree, Node};
use caret_workspace::{ContentHash, RelPath};
use object_store::ObjectStore;
use tokio::sync::Mutex;

use crate::db::{Db, Tenant};
use crate::held::{Held, HeldTexts};
use crate::{Error, Result};

mod checks;
mod residency;
mod siblings;

use checks::{check_id, check_path, file_record, hex32, is_valid_id};

pub use residency::{Residency, half_of_memory};

/// Largest number of files in one plan or commit.
pub const MAX_FILES: usize = 10_000;
/// Largest number of directories in one tree request.
pub const MAX_DIRS: usize = 20_000;
/// Largest chunk text.
pub const MAX_CHUNK_BYTES: usize = 1 << 20;

/// Largest number of chunks in one embed request.
pub const MAX_EMBED_CHUNKS: usize = 1024;
/// Longest search query in bytes.
pub const MAX_QUERY_BYTES: usize = 4096;

/// A loaded workspace: its state behind a lock, and whether a compaction is running.
#[derive(Debug, Default)]
struct Loaded {
    state: Mutex<State>,
    compacting: AtomicBool,
    /// The public id of the workspace's key (siblings under the same key share vectors).
    key_id: String,
    /// When a request last used it (milliseconds since the service started).
    used: AtomicU64,
    /// Its memory as last estimated (read while a request holds the state).
    memory: std::sync::Mutex<caret_store::Memory>,
}

/// Loaded workspaces by (tenant id, workspace id).
type LoadedMap = HashMap<(String, String), Arc<Loaded>>;

type Loader = Box<dyn Fn() -> std::result::Result<Arc<dyn Embedder>, String> + Send + Sync>;

/// The server's embedding model, loaded on first use (a server that only syncs never pays
/// for it).
pub struct EmbeddingModel {
    id: String,
    load: Loader,
    loaded: OnceLock<std::result::Result<Arc<dyn Embedder>, String>>,
}

impl std::fmt::Debug for EmbeddingModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddingModel").field("id", &self.id).finish()
    }
}

impl EmbeddingModel {
    /// A model with id `id` (as its embedder will report it), loaded by `load` when first used.
    pub fn lazy(
        id: impl Into<String>,
        load: impl Fn() -> std::result::Result<Arc<dyn Embedder>, String> + Send + Sync + 'static,
    ) -> Self {
        EmbeddingModel { id: id.into(), load: Box::new(load), loaded: OnceLock::new() }
    }

    /// A model already loaded.
    pub fn ready(embedder: Arc<dyn Embedder>) -> Self {
        let id = embedder.model_id().to_owned();
        EmbeddingModel::lazy(id, move || Ok(embedder.clone()))
    }

    /// The model's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The embedder, loading it now if needed (blocking).
    fn get(&self) -> Result<Arc<dyn Embedder>> {
        self.loaded
            .get_or_init(|| (self.load)())
            .clone()
            .map_err(|e| Error::Unavailable(format!("the embedding model could not be loaded: {e}")))
    }

    /// Embeds texts on a blocking thread (loading the model there first if needed), each by
    /// its first `window` word pieces when given; returns the vectors and their width.
    async fn embed(self: &Arc<Self>, texts: Vec<String>, window: Option<usize>) -> Result<(Vec<Vec<f32>>, usize)> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let embedder = this.get()?;
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let vectors = match window {
                Some(w) => embedder.embed_window(&refs, w),
                None => embedder.embed(&refs),
            }
            .map_err(Error::Embed)?;
            Ok((vectors, embedder.dim()))
        })
        .await
        .map_err(|e| Error::Internal(format!("the embedding task ended: {e}")))?
    }
}

/// When to fold a workspace's log tail into a new segment.
#[derive(Debug, Clone, Copy)]
pub struct CompactionPolicy {
    /// Tail records (chunks plus vectors).
    pub records: usize,
    /// Tail log objects.
    pub objects: u64,
}

impl CompactionPolicy {
    /// Whether a tail of `records` in `objects` log objects after a segment of `segment`
    /// chunks is worth folding. Many small objects are (they slow a cold load), but folding
    /// rebuilds the segment's indexes whole — a large workspace's HNSW graph is a minute of
    /// CPU — so past the object count the tail must also be a twentieth of the segment, until
    /// 16 times the object count.
    pub fn due(&self, records: usize, objects: u64, segment: usize) -> bool {
        records >= self.records
            || objects >= self.objects.saturating_mul(16)
            || (objects >= self.objects && records.saturating_mul(20) >= segment)
    }
}

/// A fold of a workspace's log: a delta beside its segment, or a new segment.
enum Fold {
    Delta(caret_store::DeltaPlan),
    Segment(caret_store::CompactionPlan),
}

impl CompactionPolicy {
    /// Whether the tail is small enough beside the segment to fold into a delta (an eighth of
    /// it): the delta then costs what changed, and the segment — shared with forks — stays.
    /// Past that a new segment: the tail is searched exactly, and each search pays for it.
    fn delta_fits(state: &State) -> bool {
        state.tail_records().saturating_mul(8) < state.segment_chunks() && state.can_delta()
    }

    /// Whether a fold is due now: as [`CompactionPolicy::due`] for a new segment; for a delta,
    /// as soon as either count since the last fold reaches its mark (a delta is cheap).
    pub fn due_now(&self, state: &State) -> bool {
        let (records, objects) = state.tail_size();
        if Self::delta_fits(state) {
            return records >= self.records || objects >= self.objects;
        }
        self.due(state.tail_records(), objects, state.segment_chunks())
    }

    /// The fold due now, if any.
    fn choose(&self, state: &State) -> Option<Fold> {
        self.due_now(state).then(|| self.shape(state))
    }

    /// The fold for the state as it is: a delta where one fits, else a new segment.
    fn shape(&self, state: &State) -> Fold {
        match Self::delta_fits(state).then(|| state.delta_plan()).flatten() {
            Some(plan) => Fold::Delta(plan),
            None => Fold::Segment(state.compaction_plan()),
        }
    }
}

/// Whether the state is its segment alone: nothing after it (no delta, no log object) that
/// a fold into a new segment would take in.
fn segment_alone(state: &State) -> bool {
    state.tail_records() == 0 && state.tail_size().1 == 0
}

/// Runs a fold and records it in the loaded state; whether it committed.
async fn fold_now(ns: &Namespace, cell: &Loaded, fold: Fold) -> Result<bool> {
    let started = std::time::Instant::now();
    let (kind, seq) = match fold {
        Fold::Delta(plan) => match ns.compact_delta(plan).await? {
            Some(seq) => {
                cell.state.lock().await.delta_folded(seq);
                ("delta", seq)
            }
            None => return Ok(false),
        },
        Fold::Segment(plan) => match ns.compact(plan).await? {
            Some(base) => {
                let seq = base.seq();
                cell.state.lock().await.install(base);
                ("segment", seq)
            }
            None => return Ok(false),
        },
    };
    let state = cell.state.lock().await;
    let (records, objects) = state.tail_size();
    tracing::info!(
        namespace = %ns.prefix(),
        kind,
        seq,
        chunks = state.segment_chunks(),
        tail = state.tail_records(),
        unfolded_records = records,
        unfolded_objects = objects,
        ms = started.elapsed().as_millis() as u64,
        "compacted"
    );
    Ok(true)
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        CompactionPolicy { records: caret_store::COMPACT_RECORDS, objects: caret_store::COMPACT_OBJECTS }
    }
}

/// The service.
pub struct Service {
    db: Db,
    store: Arc<dyn ObjectStore>,
    loaded: std::sync::Mutex<LoadedMap>,
    embedding: Option<Arc<EmbeddingModel>>,
    /// The embedding window of each stage's chunks ([`caret_store::STAGES`]); `None`: the
    /// model's own.
    stage_windows: [Option<usize>; 3],
    compaction: CompactionPolicy,
    /// Turns for background compactions (one at a time).
    compactions: Arc<tokio::sync::Semaphore>,
    weights: Weights,
    /// Texts received at commit time, held in memory until embedded.
    held: HeldTexts,
    /// Segments loaded, shared by every workspace state holding one (forks).
    bases: Arc<caret_store::Bases>,
    /// Which workspaces stay loaded.
    residency: Residency,
    /// When the service started (workspaces' last use is counted from it).
    epoch: std::time::Instant,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("store", &self.store.to_string()).finish()
    }
}

impl Service {
    /// A service over a database and an object store.
    pub fn new(db: Db, store: Arc<dyn ObjectStore>) -> Self {
        Service {
            db,
            store,
            loaded: std::sync::Mutex::new(HashMap::new()),
            embedding: None,
            stage_windows: [None; 3],
            compaction: CompactionPolicy::default(),
            compactions: Arc::new(tokio::sync::Semaphore::new(1)),
            weights: Weights::default(),
            held: HeldTexts::new(crate::held::DEFAULT_BUDGET),
            bases: Arc::new(caret_store::Bases::new()),
            residency: Residency::default(),
            epoch: std::time::Instant::now(),
        }
    }

    /// The service holding at most `bytes` of committed texts in memory until they are
    /// embedded (0: none; every text is then sent again to be embedded).
    pub fn with_held_budget(mut self, bytes: usize) -> Self {
        self.held = HeldTexts::new(bytes);
        self
    }

    /// `(texts, bytes)` of committed texts held in memory until embedded.
    pub fn held_usage(&self) -> (usize, usize) {
        self.held.usage()
    }

    /// The service with an embedding model: chunks get vectors and search is hybrid.
    pub fn with_embedding(mut self, model: EmbeddingModel) -> Self {
        self.embedding = Some(Arc::new(model));
        self
    }

    /// The service embedding each stage's chunks ([`caret_store::STAGES`]: code, tests, the
    /// rest) by at most this many word pieces (`None`: the model's window).
    pub fn with_stage_windows(mut self, windows: [Option<usize>; 3]) -> Self {
        self.stage_windows = windows;
        self
    }

    /// Loads the embedding model now rather than on the first query (a local daemon does this
    /// when it starts, while its first caller is still waiting on the index).
    pub async fn warm_embedding(&self) -> Result<()> {
        if let Some(model) = &self.embedding {
            model.embed(vec!["warm".to_owned()], None).await?;
        }
        Ok(())
    }

    /// The service with another compaction policy.
    pub fn with_compaction(mut self, policy: CompactionPolicy) -> Self {
        self.compaction = policy;
        self
    }

    /// The service with other fusion weights and kind boosts.
    pub fn with_weights(mut self, weights: Weights) -> Self {
        self.weights = weights;
        self
    }

    /// The embedding model's id, if the service has one.
    pub fn model_id(&self) -> Option<&str> {
        self.embedding.as_deref().map(EmbeddingModel::id)
    }

    /// The object store (other services keep their objects under their own prefixes).
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The metadata database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Whether the object store answers.
    pub async fn ping_store(&self) -> Result<()> {
        use futures::StreamExt as _;
        let mut list = self.store.list(Some(&object_store::path::Path::from("health")));
        if let Some(Err(e)) = list.next().await {
            return Err(Error::Store(e.into()));
        }
        Ok(())
    }

    fn namespace(&self, tenant: &Tenant, id: &str) -> Namespace {
        Namespace::new(self.store.clone(), &format!("t/{}/w/{id}", tenant.id)).with_bases(self.bases.clone())
    }

    /// The loaded state of a workspace that exists for this tenant, brought up to date.
    async fn state(&self, tenant: &Tenant, id: &str) -> Result<Arc<Loaded>> {
        check_id(id)?;
        let Some(row) = self.db.workspace(tenant, id).await? else {
            return Err(Error::NotFound("workspace".into()));
        };
        let key = (tenant.id.clone(), id.to_owned());
        let existing = self.loaded.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
        let cell = match existing {
            Some(cell) => {
                cell.touch(self.now_ms());
                let mut state = cell.state.lock().await;
                // Every append records its sequence number in the row: a copy that far along
                // has nothing to list (on S3, a LIST per request saved).
                if row.log_within(state.seq) {
                    drop(state);
                    return Ok(cell);
                }
                let ns = self.namespace(tenant, id);
                match ns.refresh(&mut state).await {
                    // Another replica compacted past this copy: load it afresh.
                    Err(caret_store::Error::Gap(_)) => {
                        tracing::info!(namespace = %ns.prefix(), seq = state.seq, "the log moved past this copy; loading afresh");
                        *state = ns.load().await?
                    }
                    other => other?,
                }
                drop(state);
                cell
            }
            None => {
                let started = std::time::Instant::now();
                let state = self.namespace(tenant, id).load().await?;
                tracing::info!(
                    workspace = id,
                    files = state.file_count(),
                    chunks = state.chunk_count(),
                    ms = started.elapsed().as_millis() as u64,
                    "workspace loaded"
                );
                let cell = Arc::new(Loaded {
                    state: Mutex::new(state),
                    compacting: AtomicBool::new(false),
                    key_id: row.key_id,
                    used: AtomicU64::new(self.now_ms()),
                    memory: std::sync::Mutex::default(),
                });
                let cell = self.loaded.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(cell).clone();
                // Room for it: the held clone keeps it from being the one unloaded.
                self.unload_idle();
                cell
            }
        };
        Ok(cell)
    }

    /// Appends to the workspace's log and records how far it reaches in its row. A copy the
    /// row says is current appends without listing the log first.
    async fn append(&self, tenant: &Tenant, id: &str, state: &mut State, records: Vec<Record>) -> Result<u64> {
        let ns = self.namespace(tenant, id);
        let current = self.db.workspace(tenant, id).await?.is_some_and(|w| w.log_within(state.seq));
        let seq = if current { ns.append_current(state, records).await? } else { ns.append(state, records).await? };
        self.db.note_log_seq(tenant, id, seq).await?;
        Ok(seq)
    }

    /// Segments held in memory, and the workspace states sharing them (see
    /// [`caret_store::Bases::held`]).
    pub fn shared_bases(&self) -> (usize, usize) {
        self.bases.held()
    }

    /// Starts a background compaction when the tail is long enough and none is running.
    /// Readers and writers go on meanwhile; the new segment is swapped in when it is done.
    fn maybe_compact(&self, tenant: &Tenant, id: &str, cell: &Arc<Loaded>, state: &State) {
        if !self.compaction.due_now(state) {
            return;
        }
        if cell.compacting.swap(true, Ordering::AcqRel) {
            return;
        }
        let ns = self.namespace(tenant, id);
        let cell = cell.clone();
        let turn = self.compactions.clone();
        let policy = self.compaction;
        tokio::spawn(async move {
            // One compaction at a time per server: folding a large workspace is seconds of
            // CPU, and several at once would take every core from the requests. The plan is
            // taken when its turn comes, so a wait folds more rather than a stale tail.
            let Ok(_turn) = turn.acquire_owned().await else { return };
            // Appends meanwhile found this one running and left it theirs: while the tail is
            // still due when a fold goes in (a sibling's vectors copied during the fold,
            // say), fold again rather than wait for the next append.
            for _ in 0..4 {
                let Some(fold) = policy.choose(&*cell.state.lock().await) else { break };
                match fold_now(&ns, &cell, fold).await {
                    Ok(true) if policy.due_now(&*cell.state.lock().await) => {}
                    Ok(_) => break,
                    Err(e) => {
                        tracing::error!("compaction failed (the log still holds everything): {e}");
                        break;
                    }
                }
            }
            cell.compacting.store(false, Ordering::Release);
        });
    }

    /// Compacts now and waits, if the tail holds at least `min_records` unfolded records or
    /// any log object at all with `min_records == 0`: a delta beside the segment while the
    /// tail is small beside it, else a new segment. Returns whether anything was folded.
    pub async fn compact(&self, tenant: &Tenant, id: &str, min_records: usize) -> Result<bool> {
        self.compact_as(tenant, id, min_records, false).await
    }

    /// Folds every log record after the segment into a new segment now (a delta's too), so
    /// that the segment alone holds the workspace: what a fork of it then shares whole.
    pub async fn compact_into_segment(&self, tenant: &Tenant, id: &str) -> Result<bool> {
        self.compact_as(tenant, id, 0, true).await
    }

    async fn compact_as(&self, tenant: &Tenant, id: &str, min_records: usize, segment: bool) -> Result<bool> {
        let cell = self.state(tenant, id).await?;
        let fold = {
            let state = cell.state.lock().await;
            let (records, objects) = state.tail_size();
            let empty = if segment { segment_alone(&state) } else { objects == 0 };
            if empty || records < min_records || cell.compacting.swap(true, Ordering::AcqRel) {
                return Ok(false);
            }
            if segment { Fold::Segment(state.compaction_plan()) } else { self.compaction.shape(&state) }
        };
        let result = fold_now(&self.namespace(tenant, id), &cell, fold).await;
        cell.compacting.store(false, Ordering::Release);
        result
    }

    fn info(&self, id: &str, key_id: &str, state: &mut State) -> WorkspaceInfo {
        let model = self.model_id();
        let (embeddable, embedded) = state.vector_progress(model.unwrap_or(""));
        WorkspaceInfo {
            id: id.to_owned(),
            key_id: key_id.to_owned(),
            root_hash: state.tree().root_hash().to_hex(),
            files: state.file_count() as u64,
            chunks: state.chunk_count() as u64,
            embeddable,
            embedded,
            model: model.map(str::to_owned),
        }
    }

    /// Creates a workspace, or returns the existing one if it has the same key.
    pub async fn create_workspace(&self, tenant: &Tenant, id: &str, req: &CreateWorkspace) -> Result<WorkspaceInfo> {
        check_id(id)?;
        if !is_valid_id(&req.key_id) {
            return Err(Error::BadRequest("key_id must be 1-64 characters of a-z and 0-9".into()));
        }
        let empty = MerkleTree::default().root_hash().to_hex();
        self.db.create_workspace(tenant, id, &req.key_id, &empty).await?;
        let row = self.db.workspace(tenant, id).await?.ok_or_else(|| Error::NotFound("workspace".into()))?;
        if row.key_id != req.key_id {
            return Err(Error::Conflict("this workspace was created with another key".into()));
        }
        if !req.sketch.is_empty() && req.sketch.len() <= caret_protocol::MAX_SKETCH {
            // A copy that cannot be made costs only the sync it would have saved.
            if let Err(e) = self.fork_from_sibling(tenant, id, &row.key_id, &req.sketch).await {
                tracing::warn!(workspace = id, "starting from a sibling workspace failed; syncing in full: {e}");
            }
        }
        self.workspace_info(tenant, id).await
    }

    /// A workspace's current state.
    pub async fn workspace_info(&self, tenant: &Tenant, id: &str) -> Result<WorkspaceInfo> {
        let row = self.db.workspace(tenant, id).await?.ok_or_else(|| Error::NotFound("workspace".into()))?;
        let cell = self.state(tenant, id).await?;
        let mut state = cell.state.lock().await;
        Ok(self.info(id, &row.key_id, &mut state))
    }

    /// A tenant's workspaces, as recorded after their last commits.
    pub async fn list_workspaces(&self, tenant: &Tenant) -> Result<Vec<WorkspaceInfo>> {
        Ok(self
            .db
            .workspaces(tenant)
            .await?
            .into_iter()
            .map(|w| WorkspaceInfo {
                id: w.id,
                key_id: w.key_id,
                root_hash: w.root_hash,
                files: u64::try_from(w.files).unwrap_or(0),
                chunks: u64::try_from(w.chunks).unwrap_or(0),
                embeddable: 0,
                embedded: 0,
                model: None,
            })
            .collect())
    }

    /// Deletes a workspace and all its objects.
    pub async fn delete_workspace(&self, tenant: &Tenant, id: &str) -> Result<()> {
        check_id(id)?;
        if !self.db.delete_workspace(tenant, id).await? {
            return Err(Error::NotFound("workspace".into()));
        }
        self.loaded.lock().unwrap_or_else(|p| p.into_inner()).remove(&(tenant.id.clone(), id.to_owned()));
        self.namespace(tenant, id).destroy().await?;
        self.held.forget_workspace(&tenant.id, id);
        Ok(())
    }

    /// Listings of the asked directories.
    #[tracing::instrument(name = "index.tree", skip_all, fields(tenant = %tenant.id))]
    pub async fn tree(&self, tenant: &Tenant, id: &str, req: &TreeRequest) -> Result<TreeResponse> {
        if req.dirs.len() > MAX_DIRS {
            return Err(Error::BadRequest(format!("at most {MAX_DIRS} directories per request")));
        }
        for d in &req.dirs {
            check_path(d, true)?;
        }
        let cell = self.state(tenant, id).await?;
        let tree = cell.state.lock().await.tree();
        let root_hash = tree.root_hash().to_hex();
        if req.known_root.as_deref() == Some(root_hash.as_str()) {
            return Ok(TreeResponse { root_hash, dirs: Vec::new() });
        }
        let dirs = req
            .dirs
            .iter()
            .map(|path| match tree.get(&RelPath::from_bytes(path.as_bytes())) {
                Some(Node::Dir { children, .. }) => DirListing {
                    path: path.clone(),
                    exists: true,
                    entries: children
                        .iter()
                        .map(|(name, node)| TreeEntry {
                            name: String::from_utf8_lossy(name).into_owned(),
                            dir: matches!(node, Node::Dir { .. }),
                            hash: node.hash().to_hex(),
                        })
                        .collect(),
                },
                _ => DirListing { path: path.clone(), exists: false, entries: Vec::new() },
            })
            .collect();
        Ok(TreeResponse { root_hash, dirs })
    }

    /// The chunk ids of these files the server lacks.
    #[tracing::instrument(name = "index.plan", skip_all, fields(tenant = %tenant.id))]
    pub async fn plan(&self, tenant: &Tenant, id: &str, req: &PlanRequest) -> Result<PlanResponse> {
        if req.files.len() > MAX_FILES {
            return Err(Error::BadRequest(format!("at most {MAX_FILES} files per request")));
        }
        let records = req.files.iter().map(file_record).collect::<Result<Vec<_>>>()?;
        let cell = self.state(tenant, id).await?;
        let state = cell.state.lock().await;
        let mut seen = HashSet::new();
        let missing = records
            .iter()
            .flat_map(|f| f.chunks.iter())
            .filter(|c| !state.has_chunk(&c.id) && seen.insert(c.id))
            .map(|c| ContentHash(c.id).to_hex())
            .collect();
        Ok(PlanResponse { missing })
    }

    /// Stores the sent chunks, then records the files and deletions, in one log object.
    #[tracing::instrument(name = "index.commit", skip_all, fields(tenant = %tenant.id, files = req.files.len()))]
    pub async fn commit(
        &self,
        tenant: &Tenant,
        id: &str,
        key: &ServerKey,
        req: CommitRequest,
    ) -> Result<CommitResponse> {
        if req.files.len() > MAX_FILES || req.deletes.len() > MAX_FILES {
            return Err(Error::BadRequest(format!("at most {MAX_FILES} files and {MAX_FILES} deletions per request")));
        }
        let files = req.files.iter().map(file_record).collect::<Result<Vec<_>>>()?;
        for d in &req.deletes {
            check_path(d, false)?;
        }
        // Check every sent chunk against its id and compute its keyed terms, in memory, off
        // the threads that answer other requests.
        let embedding = self.embedding.is_some();
        let (chunk_records, mut for_model) = cpu_bound(|| commit_records(key, req.chunks, embedding))?;

        let cell = self.state(tenant, id).await?;
        let mut state = cell.state.lock().await;
        let sent: HashSet<[u8; 32]> = chunk_records.iter().map(|c| c.id).collect();
        let mut missing: Vec<String> = files
            .iter()
            .flat_map(|f| f.chunks.iter())
            .filter(|c| !state.has_chunk(&c.id) && !sent.contains(&c.id))
            .map(|c| ContentHash(c.id).to_hex())
            .collect();
        if !missing.is_empty() {
            missing.sort();
            missing.dedup();
            return Err(Error::MissingChunks(missing));
        }
        let new_chunks = chunk_records.iter().filter(|c| !state.has_chunk(&c.id)).count() as u64;
        // The new chunks' texts wait in memory for the client's embed request, which then
        // asks for them by count instead of sending them again.
        for_model.retain(|(c, _)| !state.has_chunk(c));
        let (n_files, n_deletes) = (files.len() as u64, req.deletes.len() as u64);
        let records: Vec<Record> = chunk_records
            .into_iter()
            .filter(|c| !state.has_chunk(&c.id))
            .map(Record::Chunk)
            .chain(req.deletes.into_iter().map(Record::Delete))
            .chain(files.into_iter().map(Record::File))
            .collect();
        if !records.is_empty() {
            self.append(tenant, id, &mut state, records).await?;
            self.maybe_compact(tenant, id, &cell, &state);
        }
        self.held.hold(&tenant.id, id, for_model);
        let root = state.tree().root_hash().to_hex();
        self.db.update_root(tenant, id, &root, state.file_count() as u64, state.chunk_count() as u64).await?;
        Ok(CommitResponse { root_hash: root, files: n_files, deleted: n_deletes, chunks_stored: new_chunks })
    }
}

impl Service {
    /// Chunks of current files without a vector by the service's model, up to `limit`.
    /// Vectors that a sibling workspace (same tenant, same key) already has are copied first:
    /// the embedding cache is keyed by (key, model, chunk id), so clones, branches and
    /// teammates sharing a key embed each chunk once.
    pub async fn missing_vectors(&self, tenant: &Tenant, id: &str, limit: usize) -> Result<MissingVectors> {
        let cell = self.state(tenant, id).await?;
        let Some(model) = self.model_id().map(str::to_owned) else {
            let state = cell.state.lock().await;
            let (total, _) = state.vector_progress("");
            return Ok(MissingVectors {
                model: None,
                total,
                missing_total: 0,
                missing: Vec::new(),
                stages: Vec::new(),
            });
        };
        let wanted = cell.state.lock().await.missing_vectors(&model, usize::MAX).chunks;
        if !wanted.is_empty() {
            self.copy_from_siblings(tenant, id, &cell, &model, wanted.into_iter().map(|(c, _)| c).collect()).await?;
        }
        let state = cell.state.lock().await;
        let missing = state.missing_vectors(&model, limit.min(100_000));
        let (total, _) = state.vector_progress(&model);
        let held = self.held.holding(&tenant.id, id, missing.chunks.iter().map(|(c, _)| *c));
        Ok(MissingVectors {
            model: Some(model),
            total,
            missing_total: missing.total as u64,
            missing: missing
                .chunks
                .into_iter()
                .zip(held)
                .map(|((c, path), held)| MissingVector { id: caret_workspace::ContentHash(c).to_hex(), path, held })
                .collect(),
            stages: caret_store::STAGES
                .iter()
                .zip(missing.stages)
                .map(|(name, s)| caret_protocol::EmbedStage {
                    name: (*name).to_owned(),
                    total: s.total,
                    missing: s.missing,
                })
                .collect(),
        })
    }

    /// Embeds sent texts of stored chunks that lack vectors, and records the vectors rotated
    /// by the request's key.
    #[tracing::instrument(name = "index.embed", skip_all, fields(tenant = %tenant.id, chunks = req.chunks.len()))]
    pub async fn embed(&self, tenant: &Tenant, id: &str, key: &ServerKey, req: EmbedRequest) -> Result<EmbedResponse> {
        let model = self
            .embedding
            .clone()
            .ok_or_else(|| Error::Unavailable("this server has no embedding model; search is lexical only".into()))?;
        if req.chunks.len() + req.held_next as usize > MAX_EMBED_CHUNKS {
            return Err(Error::BadRequest(format!("at most {MAX_EMBED_CHUNKS} chunks per request")));
        }
        let mut texts: Vec<([u8; 32], String)> =
            checked_texts(key, req.chunks)?.into_iter().map(|(c, text, _, _)| (c, text)).collect();
        let cell = self.state(tenant, id).await?;
        if req.held_next > 0 {
            // The next held texts in embedding order, each checked against the request's key
            // as a sent text is.
            let order = cell.state.lock().await.missing_vectors(model.id(), usize::MAX).chunks;
            let chunk_ids = key.chunk_ids();
            let next = order.into_iter().map(|(c, _)| c);
            for (c, held) in self.held.first_held(&tenant.id, id, next, req.held_next as usize) {
                if chunk_ids.id(&held.content) != c {
                    return Err(Error::BadRequest("a chunk's id does not match its text (wrong key?)".into()));
                }
                texts.push((c, held.text));
            }
        }
        let sent = texts.len() as u64;
        // Each text with the window of its stage (tests are read by their start).
        let mut todo: Vec<(Option<usize>, [u8; 32], String)> = {
            let state = cell.state.lock().await;
            let mut seen = HashSet::new();
            let todo: Vec<([u8; 32], String)> = texts
                .into_iter()
                .filter(|(c, _)| state.has_chunk(c) && state.vector(c, model.id()).is_none() && seen.insert(*c))
                .collect();
            let stages =
                if self.stage_windows.iter().any(Option::is_some) { state.stages_of(&seen) } else { HashMap::new() };
            todo.into_iter().map(|(c, text)| (stages.get(&c).and_then(|s| self.stage_windows[*s]), c, text)).collect()
        };
        if todo.is_empty() {
            return Ok(EmbedResponse { embedded: 0, skipped: sent });
        }
        todo.sort_by_key(|(window, _, _)| *window);
        let mut ids = Vec::with_capacity(todo.len());
        let mut data = Vec::new();
        let mut dim = 0;
        let mut rest = todo.as_slice();
        while let Some((window, _, _)) = rest.first() {
            let same = rest.iter().take_while(|(w, _, _)| w == window).count();
            let (group, after) = rest.split_at(same);
            rest = after;
            let (vectors, width) = model.embed(group.iter().map(|(_, _, t)| t.clone()).collect(), *window).await?;
            dim = width;
            let rotation = key.vectors(dim);
            for (mut v, (_, id, _)) in vectors.into_iter().zip(group) {
                if v.len() != dim {
                    return Err(Error::Internal(format!(
                        "the model returned a vector of {} values, not {dim}",
                        v.len()
                    )));
                }
                rotation.apply(&mut v);
                data.extend_from_slice(&v);
                ids.push(*id);
            }
        }
        let embedded = ids.len() as u64;
        let done = ids.clone();
        let batch = VectorBatch { model: model.id().to_owned(), dim: u32::try_from(dim).unwrap_or(0), ids, data };
        let mut state = cell.state.lock().await;
        self.append(tenant, id, &mut state, vec![Record::Vectors(batch)]).await?;
        self.maybe_compact(tenant, id, &cell, &state);
        self.held.release(&tenant.id, id, &done);
        Ok(EmbedResponse { embedded, skipped: sent - embedded })
    }

    /// Hybrid search: the query's keyed terms against BM25, its rotated embedding against the
    /// vectors (when the workspace has any by this model), fused.
    #[tracing::instrument(name = "index.search", skip_all, fields(tenant = %tenant.id, k = req.k))]
    pub async fn search(
        &self,
        tenant: &Tenant,
        id: &str,
        key: &ServerKey,
        req: &SearchRequest,
    ) -> Result<SearchResponse> {
        if req.query.trim().is_empty() || req.query.len() > MAX_QUERY_BYTES {
            return Err(Error::BadRequest(format!("a query is 1-{MAX_QUERY_BYTES} bytes of text")));
        }
        if !(1..=1000).contains(&req.k) {
            return Err(Error::BadRequest("k must be 1-1000".into()));
        }
        let hasher = key.tokens();
        let (mut terms, mut definitions) = (Vec::new(), Vec::new());
        caret_store::lexical::terms(&req.query, |t| {
            terms.push(hasher.hash(t));
            definitions.push(hasher.hash(&caret_store::lexical::definition_term(t)));
        });
        let mut symbols: Vec<u64> = caret_store::lexical::symbols(&req.query)
            .iter()
            .map(|s| hasher.hash(&caret_store::lexical::definition_term(s)))
            .collect();
        let cell = self.state(tenant, id).await?;
        let model = self.embedding.clone();
        let mut has_vectors = {
            let state = cell.state.lock().await;
            model.as_ref().is_some_and(|m| state.model() == Some(m.id()))
        };
        if req.mode == SearchMode::Lexical {
            has_vectors = false;
        }
        if req.mode == SearchMode::Semantic {
            terms.clear();
            definitions.clear();
            symbols.clear();
        }
        let vector = match (&model, has_vectors) {
            (Some(m), true) => {
                let (mut v, dim) = m.embed(vec![req.query.clone()], None).await?;
                let mut v =
                    v.pop().filter(|v| v.len() == dim).ok_or_else(|| Error::Internal("empty embedding".into()))?;
                key.vectors(dim).apply(&mut v);
                Some((m.id().to_owned(), v))
            }
            _ => None,
        };
        let semantic = vector.is_some();
        let k = req.k as usize;
        let query =
            Query { terms, definitions, symbols, vector, k, candidates: (k * 4).max(100), weights: self.weights };
        let mut state = cell.state.lock().await;
        let hits = cpu_bound(|| state.search(&query));
        let (embeddable, embedded) = state.vector_progress(model.as_ref().map_or("", |m| m.id()));
        Ok(SearchResponse {
            hits: hits
                .into_iter()
                .map(|h| caret_protocol::SearchHit {
                    leaf: state
                        .file(&h.path)
                        .map(|f| caret_workspace::ContentHash(f.leaf).to_hex())
                        .unwrap_or_default(),
                    path: h.path,
                    start_line: h.start_line,
                    end_line: h.end_line,
                    id: caret_workspace::ContentHash(h.id).to_hex(),
                    kind: h.kind,
                    score: h.score,
                    lexical_rank: h.lexical_rank,
                    vector_rank: h.vector_rank,
                })
                .collect(),
            semantic,
            embeddable,
            embedded,
        })
    }
}

/// Names a chunk may say it defines.
const MAX_DEFINES: usize = 256;

/// A sent chunk, checked: its id, the text that is indexed and embedded, its defined names.
type CheckedChunk = ([u8; 32], String, Vec<String>, [u8; 32]);

/// Checks each sent chunk against its claimed id (keyed hash of its context and text) and
/// the names it says it defines against its text, and returns `(id, context + text, names)`:
/// the text that is indexed and embedded.
fn checked_texts(key: &ServerKey, chunks: Vec<ChunkText>) -> Result<Vec<CheckedChunk>> {
    let ids = key.chunk_ids();
    chunks
        .into_iter()
        .map(|c| {
            if c.text.len() > MAX_CHUNK_BYTES {
                return Err(Error::BadRequest(format!("a chunk is larger than {MAX_CHUNK_BYTES} bytes")));
            }
            let content = caret_crypto::chunk_content_hash(&c.context, &c.text);
            // An id left out is the text's own: the files' chunk lists then say whether it
            // was the one meant (a wrong key leaves their chunks missing).
            let claimed = if c.id.is_empty() { ids.id(&content) } else { hex32(&c.id, "chunk id")? };
            if ids.id(&content) != claimed {
                return Err(Error::BadRequest("a chunk's id does not match its text (wrong key?)".into()));
            }
            if c.defines.len() > MAX_DEFINES || c.defines.iter().any(|n| n.is_empty() || !c.text.contains(n.as_str())) {
                return Err(Error::BadRequest(format!(
                    "a chunk's defined names must be at most {MAX_DEFINES}, each found in its text"
                )));
            }
            let mut text = c.context.join("\n");
            text.push('\n');
            text.push_str(&c.text);
            Ok((claimed, text, c.defines, content))
        })
        .collect()
}

/// Texts to hold for the model, by chunk id.
type HeldBatch = Vec<([u8; 32], Held)>;

/// Chunk records (keyed terms) of the sent texts, checked against their ids, and the texts to
/// hold for the model.
fn commit_records(key: &ServerKey, chunks: Vec<ChunkText>, embedding: bool) -> Result<(Vec<ChunkRecord>, HeldBatch)> {
    let hasher = key.tokens();
    let mut chunk_records = Vec::with_capacity(chunks.len());
    let mut for_model = Vec::new();
    for (claimed, text, defines, content) in checked_texts(key, chunks)? {
        let (mut terms, length) = caret_store::lexical::hashed_terms(&text, |t| hasher.hash(t));
        // Defined names: terms of their own, not counted in the length.
        let mut defined: Vec<u64> = Vec::new();
        caret_store::lexical::defined_terms(&defines, |t| defined.push(hasher.hash(t)));
        for h in defined {
            match terms.binary_search_by_key(&h, |(t, _)| *t) {
                Ok(i) => terms[i].1 += 1,
                Err(i) => terms.insert(i, (h, 1)),
            }
        }
        chunk_records.push(ChunkRecord { id: claimed, length, terms });
        if embedding {
            for_model.push((claimed, Held { content, text }));
        }
    }
    Ok((chunk_records, for_model))
}

/// Runs CPU-bound work (a search, a commit's terms) without holding up the runtime's other
/// requests: on a multi-threaded runtime the worker hands its queue to another thread first.
fn cpu_bound<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod compaction_tests {
    use std::sync::Arc;

    use caret_store::{ChunkRecord, ChunkRef, FileRecord, Namespace, Record, State};

    use super::{CompactionPolicy, Fold, Loaded, fold_now};

    #[test]
    fn a_large_segment_is_not_rebuilt_for_a_few_small_objects() {
        let p = CompactionPolicy { records: 20_000, objects: 256 };
        assert!(p.due(20_000, 1, 1_000_000), "enough records");
        assert!(!p.due(10, 255, 0), "too few objects");
        assert!(p.due(10, 256, 0), "many objects, no segment");
        assert!(p.due(600, 256, 10_000), "many objects, a tail of a twentieth");
        assert!(!p.due(600, 256, 95_000), "many objects, a small tail of a large segment");
        assert!(p.due(600, 4_096, 95_000), "very many objects");
    }

    fn chunk(id: u8) -> Record {
        Record::Chunk(ChunkRecord { id: [id; 32], length: 3, terms: vec![(u64::from(id), 1)] })
    }

    fn file(path: &str, id: u8) -> Record {
        let chunk = ChunkRef { id: [id; 32], start_line: 1, end_line: 2, language: "rust".into(), kind: "code".into() };
        Record::File(FileRecord { path: path.to_owned(), leaf: [id; 32], chunks: vec![chunk] })
    }

    /// A tail small beside the segment folds into a delta as soon as a mark is reached (it
    /// costs what changed); one of a quarter of the segment or more folds into a new segment,
    /// under the rule for those.
    #[tokio::test]
    async fn a_small_tail_folds_into_a_delta_and_a_large_one_into_a_segment() {
        let ns = Namespace::new(Arc::new(object_store::memory::InMemory::new()), "t/w");
        let mut state = ns.load().await.unwrap();
        let p = CompactionPolicy { records: 1_000, objects: 4 };
        let files: Vec<Record> = (1..=40u8).flat_map(|i| [chunk(i), file(&format!("f{i}"), i)]).collect();
        ns.append(&mut state, files).await.unwrap();
        assert!(!p.due_now(&state), "40 records in one object");
        assert!(matches!(p.shape(&state), Fold::Segment(_)), "no segment yet");
        assert!(fold_now(&ns, &loaded(state), p.shape(&ns.load().await.unwrap())).await.unwrap());
        let mut state = ns.load().await.unwrap();
        assert_eq!(state.segment_chunks(), 40);
        for i in 41..=44u8 {
            assert!(!p.due_now(&state), "{} objects", i - 41);
            ns.append(&mut state, vec![chunk(i), file(&format!("f{i}"), i)]).await.unwrap();
        }
        assert!(p.due_now(&state), "4 objects after the segment");
        assert!(matches!(p.choose(&state), Some(Fold::Delta(_))), "4 records beside 40: a delta");
        let cell = loaded(state);
        let fold = p.shape(&*cell.state.lock().await);
        assert!(fold_now(&ns, &cell, fold).await.unwrap());
        let mut state = cell.state.into_inner();
        assert!(!p.due_now(&state), "folded");
        assert_eq!(state.segment_chunks(), 40, "the segment is kept");
        for i in 45..=60u8 {
            ns.append(&mut state, vec![chunk(i), file(&format!("f{i}"), i)]).await.unwrap();
        }
        assert!(matches!(p.choose(&state), Some(Fold::Segment(_))), "20 records beside 40: a new segment");
    }

    fn loaded(state: State) -> Loaded {
        Loaded { state: tokio::sync::Mutex::new(state), ..Loaded::default() }
    }
}
