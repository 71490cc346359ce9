//! The run service: what the server's `/v1/runs` routes (and the embedded `caret run`) ask
//! of the queue, and what workers ask while they execute runs. Everything kept of a run is
//! sealed with its tenant's key before it reaches the database or the object store.

mod calls;
mod docs;
mod episodes;
mod metrics;
mod people;

pub use docs::DocsCrawls;
pub use episodes::{Placement, episode_id};
pub use metrics::RunMetrics;
pub use people::People;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use caret_crypto::WorkspaceKey;
use caret_crypto::seal::Sealer;
use caret_models::Gateway;
use caret_protocol::runs::{
    CheckpointBody, Completion, CreateRun, EndedRun, Fleet, Lease, LeaseRef, LeaseRequest, NumberedEvent, PushTarget,
    QueueDepth, RepoSource, RunCheckpoint, RunClass, RunEnvironment, RunEvent, RunInfo, RunLimits, RunResult, RunState,
    RunStatus, RunningRun, SandboxUsage, WorkerInfo,
};
use futures::StreamExt as _;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use serde::{Deserialize, Serialize};

use crate::queue::{NewRun, Queue, RunRow};
use crate::{Error, Result, now_ms};

/// How runs are kept and bounded.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// A lease lasts this long without a heartbeat.
    pub lease_ttl: Duration,
    /// Attempts a run gets (a worker lost mid-run costs one).
    pub max_attempts: u32,
    /// Runs a tenant may have running at once (new tenants; operators can change it).
    pub max_running_per_tenant: u32,
    /// Ended runs (events, result) are deleted after this long.
    pub retention: Duration,
    /// Largest uploaded bundle, in bytes (after base64 decoding).
    pub max_bundle_bytes: usize,
    /// Largest sealed event body, in bytes: longer tool outputs are cut.
    pub max_event_bytes: usize,
    /// Episodes of the environment API.
    pub episodes: crate::episodes::EpisodeSettings,
    /// What runs' hosts may reach: a host written as an internal address that the policy
    /// refuses is refused at submission (names are checked where they resolve, by workers).
    pub egress: caret_sandbox::egress::Egress,
    /// Whether a run may ask for the whole network (nothing filters it).
    pub whole_network: bool,
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            lease_ttl: Duration::from_secs(30),
            max_attempts: 3,
            max_running_per_tenant: 8,
            retention: Duration::from_secs(7 * 24 * 3600),
            max_bundle_bytes: 256 << 20,
            max_event_bytes: 256 << 10,
            episodes: crate::episodes::EpisodeSettings::default(),
            egress: caret_sandbox::egress::Egress::Open,
            whole_network: true,
        }
    }
}

/// A tenant as the service sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRef {
    /// Opaque id.
    pub id: String,
    /// Name (operators' views).
    pub name: String,
}

/// What is sealed as a run's spec.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Spec {
    task: String,
    model: String,
    limits: RunLimits,
    environment: RunEnvironment,
    /// A bundle's `bundle` field is empty here (the bytes are an object of their own).
    repo: RepoSource,
    /// Where to push, url and branch resolved.
    #[serde(default)]
    push: Option<PushTarget>,
    /// The secret holding the https token for clone and push.
    #[serde(default)]
    git_credential: Option<String>,
    /// A rollout's sampling and recording.
    #[serde(default)]
    rollout: Option<caret_protocol::runs::RolloutOptions>,
    /// The trace of the request that queued it (ids only).
    #[serde(default)]
    traceparent: Option<String>,
    /// A docs crawl instead of an agent.
    #[serde(default)]
    docs: Option<caret_protocol::runs::DocsCrawl>,
}

/// A remote the workers may clone from or push to.
fn check_remote(url: &str) -> Result<()> {
    let allowed = ["file://", "https://", "http://"];
    if allowed.iter().any(|p| url.starts_with(p)) {
        Ok(())
    } else {
        Err(Error::BadRequest(format!("repository URL {url:?}: use file://, https:// or http://")))
    }
}

/// A branch name git takes and that cannot be read as an option or climb out of refs/heads.
fn valid_branch(b: &str) -> bool {
    !b.is_empty()
        && b.len() <= 200
        && !b.starts_with(['-', '/', '.'])
        && !b.ends_with(['/', '.'])
        && !b.contains("..")
        && !b.contains("//")
        && !b.ends_with(".lock")
        && b.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

/// The largest checkpoint (patch and conversation together).
const MAX_CHECKPOINT_BYTES: usize = 48 << 20;

/// The run service.
pub struct RunService {
    queue: Queue,
    store: Arc<dyn ObjectStore>,
    key: WorkspaceKey,
    gateway: Option<Arc<Gateway>>,
    settings: RunSettings,
    /// Run figures for `/metrics`.
    pub metrics: RunMetrics,
    /// When a lease last collected expired leases.
    last_expire_ms: AtomicI64,
    /// Episodes of the environment API, open on this server.
    episodes: crate::episodes::Episodes,
    /// Where episodes live, when replicas share the service.
    placement: std::sync::OnceLock<Arc<dyn episodes::Placement>>,
    /// Where docs crawls end.
    docs: std::sync::OnceLock<Arc<dyn docs::DocsCrawls>>,
    /// The people behind runs (a team server's).
    people: std::sync::OnceLock<Arc<dyn people::People>>,
}

impl std::fmt::Debug for RunService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunService")
            .field("queue", &self.queue)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(text: &str) -> Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| Error::BadRequest(format!("not base64: {e}")))
}

fn store_err(doing: &str, e: object_store::Error) -> Error {
    Error::Store { what: doing.to_owned(), source: e }
}

/// A run id: `run-` and 16 hex digits.
fn new_run_id() -> String {
    format!("run-{:016x}", fastrand::u64(..))
}

/// Whether a secret name can be an environment variable.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

impl RunService {
    /// The service over a queue, an object store and the runs' master key.
    pub fn new(
        queue: Queue,
        store: Arc<dyn ObjectStore>,
        key: WorkspaceKey,
        gateway: Option<Arc<Gateway>>,
        settings: RunSettings,
    ) -> RunService {
        RunService {
            queue,
            store,
            key,
            gateway,
            metrics: RunMetrics::default(),
            last_expire_ms: AtomicI64::new(0),
            episodes: crate::episodes::Episodes::new(settings.episodes.clone()),
            settings,
            placement: std::sync::OnceLock::new(),
            docs: std::sync::OnceLock::new(),
            people: std::sync::OnceLock::new(),
        }
    }

    /// The queue.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// The settings.
    pub fn settings(&self) -> &RunSettings {
        &self.settings
    }

    /// The environment API's open episodes.
    pub fn episodes(&self) -> &crate::episodes::Episodes {
        &self.episodes
    }

    /// A key derived from the runs' key for another purpose of the server's (a tenant's
    /// documentation sources): replicas sharing the runs' key derive the same one.
    pub fn derived_key(&self, purpose: &str) -> caret_crypto::WorkspaceKey {
        self.key.derive(purpose)
    }

    fn sealer(&self, tenant_id: &str) -> Sealer {
        self.key.sealer(&format!("anyrun/{tenant_id}"))
    }

    fn seal_text(&self, tenant_id: &str, label: &str, text: &[u8]) -> Result<String> {
        let sealed = self
            .sealer(tenant_id)
            .seal(label, text)
            .map_err(|source| Error::Seal { what: format!("sealing {label}"), source })?;
        Ok(b64(&sealed))
    }

    fn open_text(&self, tenant_id: &str, label: &str, sealed: &str) -> Result<Vec<u8>> {
        let bytes = unb64(sealed).map_err(|_| Error::Internal(format!("{label}: stored data is not base64")))?;
        self.sealer(tenant_id)
            .open(label, &bytes)
            .map_err(|source| Error::Open { what: format!("opening {label}"), source })
    }

    fn object(tenant_id: &str, run: &str, name: &str) -> ObjectPath {
        ObjectPath::from(format!("anyrun/{tenant_id}/{run}/{name}"))
    }

    fn spec(&self, row: &RunRow) -> Result<Spec> {
        let text = self.open_text(&row.tenant_id, &format!("{}/spec", row.id), &row.spec)?;
        serde_json::from_slice(&text)
            .map_err(|source| Error::Json { what: format!("reading run {}'s spec", row.id), source })
    }

    fn info(&self, row: &RunRow) -> Result<RunInfo> {
        let spec = self.spec(row)?;
        Ok(RunInfo {
            id: row.id.clone(),
            state: row.state,
            class: row.class,
            task: spec.task,
            model: row.model.clone(),
            attempt: row.attempt,
            max_attempts: row.max_attempts,
            worker: row.worker.clone(),
            reason: row.reason.clone(),
            cancel_requested: row.cancel_requested && !row.state.is_final(),
            created_ms: row.created_ms,
            started_ms: row.started_ms,
            finished_ms: row.finished_ms,
            tokens_used: row.tokens_used,
            events: row.events,
        })
    }

    /// The model alias a request names, or the default one (`agent`, else the first).
    pub fn model_alias(&self, asked: Option<&str>) -> Result<String> {
        let Some(gateway) = &self.gateway else {
            return asked.map(str::to_owned).ok_or_else(|| {
                Error::Unavailable("no models are configured ([[models]] in the config): name one with model".into())
            });
        };
        let aliases = gateway.aliases();
        match asked {
            Some(m) if aliases.iter().any(|a| a == m) => Ok(m.to_owned()),
            Some(m) => Err(Error::BadRequest(format!("unknown model alias {m:?} (known: {})", aliases.join(", ")))),
            None => aliases
                .iter()
                .find(|a| *a == "agent")
                .or_else(|| aliases.first())
                .cloned()
                .ok_or_else(|| Error::Unavailable("no models are configured".into())),
        }
    }

    /// Queues a run.
    pub async fn submit(&self, tenant: &TenantRef, req: CreateRun) -> Result<RunInfo> {
        if req.rollout.as_ref().is_some_and(|r| r.policy) {
            return Err(Error::BadRequest("a run answered by an external policy is started with POST /v1/envs".into()));
        }
        self.queue_run(tenant, req).await
    }

    /// Queues an episode's run (its model calls go to the policy, not the gateway).
    pub(crate) async fn submit_episode(&self, tenant: &TenantRef, req: CreateRun) -> Result<RunInfo> {
        self.queue_run(tenant, req).await
    }

    async fn queue_run(&self, tenant: &TenantRef, req: CreateRun) -> Result<RunInfo> {
        if req.task.trim().is_empty() {
            return Err(Error::BadRequest("task must not be empty".into()));
        }
        let l = req.limits;
        if l.wall_time_s == 0 || l.steps == 0 || l.model_tokens == 0 || l.disk_bytes == 0 {
            return Err(Error::BadRequest(
                "limits must be positive (wall_time_s, model_tokens, steps, disk_bytes)".into(),
            ));
        }
        for name in req.environment.secrets.iter().chain(req.environment.env.keys()) {
            if !valid_name(name) {
                return Err(Error::BadRequest(format!("{name:?} is not a valid environment variable name")));
            }
        }
        if let Some(t) = req.rollout.as_ref().and_then(|r| r.temperature)
            && !(0.0..=2.0).contains(&t)
        {
            return Err(Error::BadRequest(format!("rollout temperature {t} is outside 0..=2")));
        }
        crate::environment::check_hosts(&req.environment.hosts)
            .map_err(|e| Error::BadRequest(format!("environment: {e}")))?;
        crate::environment::check_reach(&req.environment, &self.settings.egress, self.settings.whole_network)
            .map_err(Error::BadRequest)?;
        for name in &req.environment.secrets {
            if self.queue.secret(&tenant.id, name).await?.is_none() {
                return Err(Error::BadRequest(format!("no secret named {name:?} (PUT /v1/secrets/{name} first)")));
            }
        }
        if let Some(name) = &req.git_credential
            && self.queue.secret(&tenant.id, name).await?.is_none()
        {
            return Err(Error::BadRequest(format!("no secret named {name:?} (PUT /v1/secrets/{name} first)")));
        }
        let policy = req.rollout.as_ref().is_some_and(|r| r.policy);
        let model = if policy { "policy".to_owned() } else { self.model_alias(req.model.as_deref())? };
        let id = new_run_id();
        let push = match req.push {
            None => None,
            Some(p) => {
                let url = match (p.url, &req.repo) {
                    (Some(url), _) => url,
                    (None, RepoSource::Git { url, .. }) => url.clone(),
                    (None, RepoSource::Bundle { .. }) => {
                        return Err(Error::BadRequest("push: an uploaded bundle needs the remote's url".into()));
                    }
                };
                check_remote(&url)?;
                let branch = p.branch.unwrap_or_else(|| format!("caret/{id}"));
                if !valid_branch(&branch) {
                    return Err(Error::BadRequest(format!("push: {branch:?} is not a usable branch name")));
                }
                Some(PushTarget { url: Some(url), branch: Some(branch) })
            }
        };
        let repo = match req.repo {
            RepoSource::Git { url, git_ref } => {
                check_remote(&url)?;
                if git_ref.as_deref().is_some_and(|r| r.starts_with('-') || r.contains("..")) {
                    return Err(Error::BadRequest("git_ref must name a branch, tag or commit".into()));
                }
                RepoSource::Git { url, git_ref }
            }
            RepoSource::Bundle { bundle, head, patch } => {
                let bytes = unb64(&bundle)?;
                if bytes.len() > self.settings.max_bundle_bytes {
                    return Err(Error::BadRequest(format!(
                        "the bundle is {} bytes; the most is {}",
                        bytes.len(),
                        self.settings.max_bundle_bytes
                    )));
                }
                if !bytes.starts_with(b"# v2 git bundle") && !bytes.starts_with(b"# v3 git bundle") {
                    return Err(Error::BadRequest("bundle is not a git bundle (git bundle create)".into()));
                }
                if head.len() < 7 || !head.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(Error::BadRequest(format!("head {head:?} is not a commit id")));
                }
                let sealed = self
                    .sealer(&tenant.id)
                    .seal(&format!("{id}/bundle"), &bytes)
                    .map_err(|source| Error::Seal { what: format!("sealing run {id}'s bundle"), source })?;
                self.store
                    .put(&Self::object(&tenant.id, &id, "bundle"), sealed.into())
                    .await
                    .map_err(|e| store_err("storing the bundle", e))?;
                RepoSource::Bundle { bundle: String::new(), head, patch }
            }
        };
        let spec = Spec {
            task: req.task,
            model: model.clone(),
            limits: req.limits,
            environment: req.environment,
            repo,
            push,
            git_credential: req.git_credential,
            rollout: req.rollout,
            traceparent: caret_trace::traceparent(),
            docs: None,
        };
        self.enqueue(tenant, &id, req.class, &spec).await
    }

    /// Seals `spec` and queues it as run `id`.
    async fn enqueue(&self, tenant: &TenantRef, id: &str, class: RunClass, spec: &Spec) -> Result<RunInfo> {
        let text =
            serde_json::to_vec(spec).map_err(|source| Error::Json { what: "writing a run's spec".into(), source })?;
        let sealed = self.seal_text(&tenant.id, &format!("{id}/spec"), &text)?;
        self.queue.ensure_tenant(&tenant.id, &tenant.name, self.settings.max_running_per_tenant).await?;
        let run = NewRun {
            id: id.to_owned(),
            tenant_id: tenant.id.clone(),
            class,
            spec: sealed,
            model: spec.model.clone(),
            max_attempts: self.settings.max_attempts,
        };
        self.queue.insert(&run, now_ms()).await?;
        tracing::info!(run = %id, class = class.as_str(), docs = spec.docs.is_some(), "run queued");
        self.get(&tenant.id, id).await
    }

    /// A tenant's run.
    pub async fn get(&self, tenant_id: &str, id: &str) -> Result<RunInfo> {
        let row = self.queue.get(tenant_id, id).await?.ok_or_else(|| Error::NotFound(format!("run {id}")))?;
        self.info(&row)
    }

    /// A tenant's runs, newest first.
    pub async fn list(&self, tenant_id: &str, limit: u32) -> Result<Vec<RunInfo>> {
        self.queue.list(tenant_id, limit.clamp(1, 1000)).await?.iter().map(|r| self.info(r)).collect()
    }

    /// Asks a run to stop.
    pub async fn cancel(&self, tenant_id: &str, id: &str) -> Result<RunInfo> {
        let state = self.queue.cancel(tenant_id, id, now_ms()).await?;
        match state {
            None => Err(Error::NotFound(format!("run {id}"))),
            Some(state) => {
                let row = self.queue.get(tenant_id, id).await?.ok_or_else(|| Error::NotFound(format!("run {id}")))?;
                if state == RunState::Cancelled && row.events == 0 {
                    // Cancelled before it started: its bundle is collected now.
                    self.finished(&row, RunState::Cancelled, row.reason.clone()).await;
                }
                self.info(&row)
            }
        }
    }

    /// Events after `after` (a tenant's run), at most `limit`.
    pub async fn events(&self, tenant_id: &str, id: &str, after: u64, limit: u32) -> Result<Vec<NumberedEvent>> {
        let row = self.queue.get(tenant_id, id).await?.ok_or_else(|| Error::NotFound(format!("run {id}")))?;
        self.read_events(&row, after, limit).await
    }

    async fn read_events(&self, row: &RunRow, after: u64, limit: u32) -> Result<Vec<NumberedEvent>> {
        let label = format!("{}/event", row.id);
        let mut out = Vec::new();
        for e in self.queue.events_after(&row.id, after, limit.clamp(1, 10_000)).await? {
            let text = self.open_text(&row.tenant_id, &label, &e.body)?;
            let event: RunEvent = serde_json::from_slice(&text)
                .map_err(|source| Error::Json { what: format!("reading an event of run {}", row.id), source })?;
            out.push(NumberedEvent { seq: e.seq, attempt: e.attempt, event });
        }
        Ok(out)
    }

    /// The result of a run (of the lease that completed it).
    pub async fn result(&self, tenant_id: &str, id: &str) -> Result<RunResult> {
        let row = self.queue.get(tenant_id, id).await?.ok_or_else(|| Error::NotFound(format!("run {id}")))?;
        let Some(token) = row.result_token else {
            return Err(Error::Conflict(format!("run {id} has no result ({})", row.state.as_str())));
        };
        let name = format!("result-{token}");
        let bytes = self
            .store
            .get(&Self::object(tenant_id, id, &name))
            .await
            .map_err(|e| store_err("reading the result", e))?
            .bytes()
            .await
            .map_err(|e| store_err("reading the result", e))?;
        let text = self
            .sealer(tenant_id)
            .open(&format!("{id}/{name}"), &bytes)
            .map_err(|source| Error::Open { what: format!("opening run {id}'s result"), source })?;
        serde_json::from_slice(&text)
            .map_err(|source| Error::Json { what: format!("reading run {id}'s result"), source })
    }

    /// Deletes an ended run now: its events, result and row.
    pub async fn delete(&self, tenant_id: &str, id: &str) -> Result<()> {
        let row = self.queue.get(tenant_id, id).await?.ok_or_else(|| Error::NotFound(format!("run {id}")))?;
        if !row.state.is_final() {
            return Err(Error::Conflict(format!("run {id} is {}: cancel it first", row.state.as_str())));
        }
        self.collect(&row).await
    }

    async fn collect(&self, row: &RunRow) -> Result<()> {
        let prefix = ObjectPath::from(format!("anyrun/{}/{}", row.tenant_id, row.id));
        let objects: Vec<_> = self.store.list(Some(&prefix)).collect().await;
        for o in objects.into_iter().flatten() {
            match self.store.delete(&o.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_err("deleting a run's objects", e)),
            }
        }
        self.queue.delete(&row.id).await?;
        if let Some(people) = self.people.get() {
            people.gone(&row.tenant_id, &row.id).await;
        }
        Ok(())
    }

    /// Deletes runs whose retention has ended; how many.
    pub async fn collect_expired(&self) -> Result<usize> {
        let before = now_ms() - i64::try_from(self.settings.retention.as_millis()).unwrap_or(i64::MAX);
        let rows = self.queue.ended_before(before, 500).await?;
        for r in &rows {
            self.collect(r).await?;
        }
        Ok(rows.len())
    }

    /// Stores a tenant's secret (sealed).
    pub async fn put_secret(&self, tenant_id: &str, name: &str, value: &str) -> Result<()> {
        if !valid_name(name) {
            return Err(Error::BadRequest(format!("{name:?} is not a valid environment variable name")));
        }
        if value.is_empty() || value.len() > 64 << 10 {
            return Err(Error::BadRequest("a secret's value must be 1 byte to 64 KiB".into()));
        }
        let sealed = self.seal_text(tenant_id, &format!("secret/{name}"), value.as_bytes())?;
        self.queue.put_secret(tenant_id, name, &sealed, now_ms()).await
    }

    /// A tenant's secret names.
    pub async fn secret_names(&self, tenant_id: &str) -> Result<Vec<String>> {
        self.queue.secret_names(tenant_id).await
    }

    /// Deletes a secret.
    pub async fn delete_secret(&self, tenant_id: &str, name: &str) -> Result<()> {
        if self.queue.delete_secret(tenant_id, name).await? {
            Ok(())
        } else {
            Err(Error::NotFound(format!("secret {name}")))
        }
    }

    /// Hands back runs whose workers went silent; records each lost attempt.
    pub async fn expire(&self) -> Result<usize> {
        let lost = |id: &str, tenant: &str, attempt: u32, reason: &str| {
            self.sealed_event(tenant, id, RunStatus::AttemptLost { attempt, reason: reason.to_owned() })
        };
        let expired = self.queue.expire(now_ms(), lost).await?;
        for e in &expired {
            let Some(row) = self.queue.get_any(&e.id).await? else { continue };
            let tenant = self.tenant_name(&row).await;
            self.metrics.observe("lease_expiries", row.class, &tenant, 0.0);
            let reason = row.reason.clone().unwrap_or_default();
            if e.now.is_final() {
                self.finished(&row, e.now, Some(reason)).await;
            } else {
                self.metrics.observe("retries", row.class, &tenant, 0.0);
            }
        }
        Ok(expired.len())
    }

    /// The tenant's name for operators' figures (its id when unknown).
    async fn tenant_name(&self, row: &RunRow) -> String {
        self.queue.tenant_name(&row.tenant_id).await.ok().flatten().unwrap_or_else(|| row.tenant_id.clone())
    }

    /// A lifecycle event sealed for a run (none, logged, when it cannot be).
    fn sealed_event(&self, tenant_id: &str, run: &str, status: RunStatus) -> Option<String> {
        let text = serde_json::to_vec(&RunEvent::Run(status)).ok()?;
        match self.seal_text(tenant_id, &format!("{run}/event"), &text) {
            Ok(sealed) => Some(sealed),
            Err(e) => {
                tracing::warn!(%run, "sealing a run event: {e}");
                None
            }
        }
    }

    async fn system_event(&self, row: &RunRow, status: RunStatus) {
        let result = async {
            let text = serde_json::to_vec(&RunEvent::Run(status))
                .map_err(|source| Error::Json { what: "writing a run's status".into(), source })?;
            let sealed = self.seal_text(&row.tenant_id, &format!("{}/event", row.id), &text)?;
            self.queue.append_system(&row.id, &[sealed]).await
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(run = %row.id, "recording a run event: {e}");
        }
    }

    /// A run ended: the last event, figures, and its bundle collected.
    async fn finished(&self, row: &RunRow, state: RunState, reason: Option<String>) {
        self.system_event(row, RunStatus::RunFinished { state, reason }).await;
        let tenant = self.tenant_name(row).await;
        let took = row.started_ms.map(|started| (now_ms() - started) as f64);
        if let Some(ms) = took {
            self.metrics.observe("duration_seconds", row.class, &tenant, ms / 1e3);
        }
        self.metrics.ended(&row.tenant_id, state, took);
        // The bundle and every attempt's checkpoint go (the result holds the final patch).
        let names =
            std::iter::once("bundle".to_owned()).chain((1..=row.lease_token + 1).map(|t| format!("checkpoint-{t}")));
        for name in names {
            match self.store.delete(&Self::object(&row.tenant_id, &row.id, &name)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => tracing::warn!(run = %row.id, "deleting the run's {name}: {e}"),
            }
        }
    }

    /// Stores an attempt's checkpoint (sealed, under its lease token; the latest of an attempt
    /// replaces the one before). A stale attempt's checkpoint is refused and not kept.
    pub async fn checkpoint(&self, body: &CheckpointBody) -> Result<()> {
        let row = self.queue.check(&body.lease.run, body.lease.token).await?;
        let size = body.checkpoint.patch.len() + body.checkpoint.transcript.len();
        if size > MAX_CHECKPOINT_BYTES {
            return Err(Error::BadRequest(format!(
                "the checkpoint is {size} bytes; the most is {MAX_CHECKPOINT_BYTES}"
            )));
        }
        let name = format!("checkpoint-{}", row.lease_token);
        let text = serde_json::to_vec(&body.checkpoint)
            .map_err(|source| Error::Json { what: "writing a checkpoint".into(), source })?;
        let sealed = self
            .sealer(&row.tenant_id)
            .seal(&format!("{}/{name}", row.id), &text)
            .map_err(|source| Error::Seal { what: format!("sealing run {}'s {name}", row.id), source })?;
        let path = Self::object(&row.tenant_id, &row.id, &name);
        self.store.put(&path, sealed.into()).await.map_err(|e| store_err("storing the checkpoint", e))?;
        if let Err(e) = self.queue.checkpointed(&row.id, row.lease_token).await {
            let _ = self.store.delete(&path).await;
            return Err(e);
        }
        Ok(())
    }

    /// The last checkpoint a run's attempts saved, if any (for operators' tools and tests).
    pub async fn saved_checkpoint(&self, id: &str) -> Result<Option<RunCheckpoint>> {
        match self.queue.get_any(id).await? {
            Some(row) => Ok(self.last_checkpoint(&row).await),
            None => Ok(None),
        }
    }

    /// The run's last checkpoint, if an attempt left one (and it can be read: one that
    /// cannot is passed over, and the attempt starts afresh).
    async fn last_checkpoint(&self, row: &RunRow) -> Option<RunCheckpoint> {
        let token = self.queue.checkpoint_token(&row.id).await.ok()??;
        let name = format!("checkpoint-{token}");
        let read = async {
            let bytes = self
                .store
                .get(&Self::object(&row.tenant_id, &row.id, &name))
                .await
                .map_err(|e| e.to_string())?
                .bytes()
                .await
                .map_err(|e| e.to_string())?;
            let text =
                self.sealer(&row.tenant_id).open(&format!("{}/{name}", row.id), &bytes).map_err(|e| e.to_string())?;
            serde_json::from_slice::<RunCheckpoint>(&text).map_err(|e| e.to_string())
        };
        match read.await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(run = %row.id, "the run's checkpoint cannot be read, the attempt starts afresh: {e}");
                None
            }
        }
    }

    // ---- workers ----

    /// Gives a worker the next run, or `None`.
    pub async fn lease(&self, req: &LeaseRequest) -> Result<Option<Lease>> {
        let now = now_ms();
        // Expired leases are collected here too (at most once a second, so a busy fleet does not
        // pay a scan per lease) besides the server's upkeep.
        let last = self.last_expire_ms.load(Ordering::Relaxed);
        if now - last >= 1000
            && self.last_expire_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            self.expire().await?;
        }
        let ttl = i64::try_from(self.settings.lease_ttl.as_millis()).unwrap_or(30_000);
        let Some(leased) = self.queue.lease(req, now, ttl).await? else { return Ok(None) };
        let row = leased.run;
        let tenant = self.tenant_name(&row).await;
        self.metrics.observe("queue_wait_seconds", row.class, &tenant, (now - row.created_ms).max(0) as f64 / 1e3);
        if row.attempt > 1 {
            self.metrics.observe("retries", row.class, &tenant, 0.0);
        }
        let lease = LeaseRef { run: row.id.clone(), token: row.lease_token };
        let spec = match self.spec(&row) {
            Ok(s) => s,
            Err(e) => {
                let reason = format!("the run's stored spec cannot be read: {e}");
                self.queue.finish(&row.id, row.lease_token, RunState::Failed, Some(&reason), None, now).await?;
                self.finished(&row, RunState::Failed, Some(reason)).await;
                return Ok(None);
            }
        };
        let mut secret_values = BTreeMap::new();
        for name in &spec.environment.secrets {
            let Some(sealed) = self.queue.secret(&row.tenant_id, name).await? else {
                let reason = format!("secret {name:?} was deleted before the run started");
                self.queue.finish(&row.id, row.lease_token, RunState::Failed, Some(&reason), None, now).await?;
                self.finished(&row, RunState::Failed, Some(reason)).await;
                return Ok(None);
            };
            let value = self.open_text(&row.tenant_id, &format!("secret/{name}"), &sealed)?;
            secret_values.insert(name.clone(), String::from_utf8_lossy(&value).into_owned());
        }
        let git_credential = match &spec.git_credential {
            None => None,
            Some(name) => {
                let Some(sealed) = self.queue.secret(&row.tenant_id, name).await? else {
                    let reason = format!("secret {name:?} (the git credential) was deleted before the run started");
                    self.queue.finish(&row.id, row.lease_token, RunState::Failed, Some(&reason), None, now).await?;
                    self.finished(&row, RunState::Failed, Some(reason)).await;
                    return Ok(None);
                };
                let value = self.open_text(&row.tenant_id, &format!("secret/{name}"), &sealed)?;
                Some(String::from_utf8_lossy(&value).into_owned())
            }
        };
        let checkpoint = if row.attempt > 1 { self.last_checkpoint(&row).await } else { None };
        self.system_event(&row, RunStatus::RunStarted { attempt: row.attempt, worker: req.worker.clone() }).await;
        tracing::info!(run = %row.id, attempt = row.attempt, worker = %req.worker, "run leased");
        Ok(Some(Lease {
            lease,
            tenant: row.tenant_id.clone(),
            attempt: row.attempt,
            task: spec.task,
            model: spec.model,
            limits: spec.limits,
            repo: spec.repo,
            environment: spec.environment,
            secret_values,
            lease_ttl_s: self.settings.lease_ttl.as_secs().max(1),
            tokens_used: row.tokens_used,
            push: spec.push,
            git_credential,
            checkpoint,
            rollout: spec.rollout,
            traceparent: spec.traceparent,
            docs: spec.docs,
        }))
    }

    /// The uploaded bundle of a leased run.
    pub async fn bundle(&self, lease: &LeaseRef) -> Result<Vec<u8>> {
        let row = self.queue.check(&lease.run, lease.token).await?;
        let bytes = self
            .store
            .get(&Self::object(&row.tenant_id, &row.id, "bundle"))
            .await
            .map_err(|e| store_err("reading the bundle", e))?
            .bytes()
            .await
            .map_err(|e| store_err("reading the bundle", e))?;
        self.sealer(&row.tenant_id)
            .open(&format!("{}/bundle", row.id), &bytes)
            .map_err(|source| Error::Open { what: format!("opening run {}'s bundle", row.id), source })
    }

    /// Renews a lease; whether to cancel.
    pub async fn heartbeat(&self, lease: &LeaseRef, usage: Option<SandboxUsage>) -> Result<bool> {
        let ttl = i64::try_from(self.settings.lease_ttl.as_millis()).unwrap_or(30_000);
        self.queue.heartbeat(&lease.run, lease.token, usage, now_ms(), ttl).await
    }

    /// Records events of a leased run.
    pub async fn append_events(&self, lease: &LeaseRef, events: &[RunEvent]) -> Result<()> {
        let row = self.queue.check(&lease.run, lease.token).await?;
        let label = format!("{}/event", row.id);
        let mut sealed = Vec::with_capacity(events.len());
        for e in events {
            let mut text =
                serde_json::to_vec(e).map_err(|source| Error::Json { what: "writing an event".into(), source })?;
            if text.len() > self.settings.max_event_bytes {
                text = serde_json::to_vec(&cut_event(e, self.settings.max_event_bytes))
                    .map_err(|source| Error::Json { what: "writing an event".into(), source })?;
            }
            sealed.push(self.seal_text(&row.tenant_id, &label, &text)?);
        }
        self.queue.append(&lease.run, lease.token, &sealed).await?;
        Ok(())
    }

    /// Ends a leased run (or hands it back for another attempt).
    pub async fn complete(&self, mut done: Completion) -> Result<RunInfo> {
        let row = self.queue.check(&done.lease.run, done.lease.token).await?;
        let now = now_ms();
        if done.retry {
            let reason = done.reason.clone().unwrap_or_else(|| "the worker handed the run back".into());
            let lost = self.sealed_event(
                &row.tenant_id,
                &row.id,
                RunStatus::AttemptLost { attempt: row.attempt, reason: reason.clone() },
            );
            let state = self.queue.hand_back(&row.id, row.lease_token, &reason, now, lost).await?;
            if state.is_final() {
                self.finished(&row, state, Some(reason)).await;
            }
            return self.info(&self.queue.get_any(&row.id).await?.unwrap_or(row));
        }
        if !done.state.is_final() {
            return Err(Error::BadRequest("a completion's state is succeeded, failed or cancelled".into()));
        }
        if let Ok(spec) = self.spec(&row) {
            self.docs_ended(&row.tenant_id, &spec, &mut done).await?;
        }
        if let Some(result) = &done.result {
            let name = format!("result-{}", row.lease_token);
            let text = serde_json::to_vec(result)
                .map_err(|source| Error::Json { what: "writing a run's result".into(), source })?;
            let sealed = self
                .sealer(&row.tenant_id)
                .seal(&format!("{}/{name}", row.id), &text)
                .map_err(|source| Error::Seal { what: format!("sealing run {}'s {name}", row.id), source })?;
            let path = Self::object(&row.tenant_id, &row.id, &name);
            self.store.put(&path, sealed.into()).await.map_err(|e| store_err("storing the result", e))?;
            if let Err(e) = self
                .queue
                .finish(&row.id, row.lease_token, done.state, done.reason.as_deref(), Some(row.lease_token), now)
                .await
            {
                // Fenced between the check and now: this result is not the run's.
                let _ = self.store.delete(&path).await;
                return Err(e);
            }
        } else {
            self.queue.finish(&row.id, row.lease_token, done.state, done.reason.as_deref(), None, now).await?;
        }
        self.finished(&row, done.state, done.reason.clone()).await;
        tracing::info!(run = %row.id, state = done.state.as_str(), "run ended");
        self.info(&self.queue.get_any(&row.id).await?.unwrap_or(row))
    }

    /// Records how long a worker took to launch a run's sandbox.
    pub async fn observe_launch(&self, lease: &LeaseRef, seconds: f64) {
        if let Ok(Some(row)) = self.queue.get_any(&lease.run).await {
            let tenant = self.tenant_name(&row).await;
            self.metrics.observe("sandbox_launch_seconds", row.class, &tenant, seconds);
        }
    }

    /// The fleet as operators see it.
    pub async fn fleet(&self) -> Result<Fleet> {
        let now = now_ms();
        let queue = self
            .queue
            .depth()
            .await?
            .into_iter()
            .map(|(class, tenant, queued, running)| QueueDepth { class, tenant, queued, running })
            .collect();
        let running: Vec<RunningRun> = self
            .queue
            .running()
            .await?
            .into_iter()
            .map(|(r, tenant, usage)| RunningRun {
                id: r.id,
                tenant,
                class: r.class,
                worker: r.worker.unwrap_or_default(),
                attempt: r.attempt,
                age_ms: r.started_ms.map_or(0, |s| now - s),
                usage,
            })
            .collect();
        let workers = self
            .queue
            .workers(now - 5 * 60_000)
            .await?
            .into_iter()
            .map(|(name, slots, sandbox, seen)| WorkerInfo {
                busy: u32::try_from(running.iter().filter(|r| r.worker == name).count()).unwrap_or(u32::MAX),
                name,
                slots,
                sandbox,
                last_seen_ms_ago: now - seen,
            })
            .collect();
        let recent = self
            .queue
            .recent(20)
            .await?
            .into_iter()
            .map(|(r, tenant)| EndedRun {
                id: r.id,
                tenant,
                class: r.class,
                state: r.state,
                attempt: r.attempt,
                reason: r.reason,
                created_ms: r.created_ms,
                started_ms: r.started_ms,
                finished_ms: r.finished_ms,
                tokens_used: r.tokens_used,
            })
            .collect();
        Ok(Fleet { workers, queue, running, recent, at_ms: now })
    }
}

/// An event too large to keep whole, with its long strings cut.
fn cut_event(e: &RunEvent, max: usize) -> RunEvent {
    let Ok(mut v) = serde_json::to_value(e) else { return e.clone() };
    fn cut(v: &mut serde_json::Value, room: usize) {
        match v {
            serde_json::Value::String(s) if s.len() > room => {
                let mut end = room;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                s.truncate(end);
                s.push_str(" [... cut: the event was too large to keep]");
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|i| cut(i, room)),
            serde_json::Value::Object(map) => map.values_mut().for_each(|i| cut(i, room)),
            _ => {}
        }
    }
    cut(&mut v, max / 2);
    serde_json::from_value(v).unwrap_or_else(|_| e.clone())
}
