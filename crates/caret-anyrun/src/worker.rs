//! Workers: slots that lease runs and execute them.
//!
//! One attempt of a run, in a slot: lease → a fresh directory → the code (a bundle unpacked
//! and the uncommitted patch applied, or a clone) committed as the base → the sandbox →
//! the environment's steps → the agent [`Session`] with the same tools as `caret agent`,
//! its model calls going through the coordinator (the server's gateway, counted against the
//! run's limits) → the test command → the patch against the base → complete. Meanwhile a
//! heartbeat renews the lease; a cancel stops the attempt within a heartbeat, and a lost
//! lease (another worker took over) stops it without reporting anything more.
//!
//! Secret values are in the sandbox's environment only and are redacted from every event
//! and from the result before they leave the worker.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use caret_agent::policy::{Approval, Rule};
use caret_agent::session::{ModelClient, Session};
use caret_agent::tools::{Ctx, Registry};
use caret_models::EventStream;
use caret_protocol::agent::{Event, TurnEnd};
use caret_protocol::llm::{ChatMessage, ChatRequest, Role};
use caret_protocol::runs::{
    Completion, Lease, LeaseRef, LeaseRequest, RunEvent, RunResult, RunState, RunStatus, SandboxUsage, TestOutcome,
    Timings, TokenView, Transcript, Usage,
};
use tokio::sync::{mpsc, watch};

use crate::checkout::{Failure, checkout, commit_base, fail, git, patch, push, tail};
pub use crate::coordinator::{Coordinator, InProcess};
use crate::redact::Redactor;
use crate::{Error, Result};

/// Which sandbox runs a run's commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxKind {
    /// bubblewrap + Landlock + seccomp + cgroups.
    Bwrap,
    /// gVisor (`runsc`): an application kernel per command.
    Gvisor,
    /// A Firecracker microVM per run, booted from these.
    Firecracker(Arc<caret_sandbox::firecracker::Config>),
}

impl SandboxKind {
    /// Its name.
    pub fn name(&self) -> &'static str {
        match self {
            SandboxKind::Bwrap => "bwrap",
            SandboxKind::Gvisor => "gvisor",
            SandboxKind::Firecracker(_) => "firecracker",
        }
    }

    /// The backend named `name` (bwrap or gvisor; Firecracker needs its configuration).
    pub fn parse(name: &str) -> Option<SandboxKind> {
        match name {
            "bwrap" => Some(SandboxKind::Bwrap),
            "gvisor" | "runsc" => Some(SandboxKind::Gvisor),
            _ => None,
        }
    }

    /// A sandbox of this kind with `policy` (blocking: a microVM boots here).
    pub fn open(&self, policy: caret_sandbox::Policy) -> caret_sandbox::Result<Arc<dyn caret_sandbox::Sandbox>> {
        Ok(match self {
            SandboxKind::Bwrap => Arc::new(caret_sandbox::Bwrap::new(policy)?),
            SandboxKind::Gvisor => Arc::new(caret_sandbox::Gvisor::new(policy)?),
            SandboxKind::Firecracker(config) => Arc::new(caret_sandbox::firecracker::Firecracker::new(policy, config)?),
        })
    }
}

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Its name (unique: host and process id, say).
    pub name: String,
    /// Runs at once.
    pub slots: u32,
    /// Where runs' directories are made (each deleted after its attempt).
    pub work_dir: PathBuf,
    /// The sandbox backend.
    pub sandbox: SandboxKind,
    /// How often an idle slot asks for work.
    pub poll: Duration,
    /// Stop when no run was leased for this long (local workers started on demand).
    pub exit_when_idle: Option<Duration>,
    /// Operator command rules (deny first); nobody is asked in a background run.
    pub rules: Vec<Rule>,
    /// Limits of each sandboxed command.
    pub limits: caret_sandbox::Limits,
    /// The Landlock helper (see `caret_sandbox::landlock`).
    pub landlock_helper: Option<PathBuf>,
    /// The model's context window (the agent compacts near it).
    pub context_window: u32,
    /// Model aliases that take images in their input (tools' images are attached for them).
    pub image_models: Vec<String>,
    /// After a drain is asked for, running attempts get this long before they are handed back.
    pub drain_timeout: Duration,
    /// Prepared environments kept for warm starts (none: every run installs).
    pub snapshots: Option<Arc<crate::snapshot::Snapshots>>,
    /// What runs' and crawls' connections may reach (guarded on a team server's workers).
    pub egress: caret_sandbox::egress::Egress,
    /// Whether a run may have the whole network (nothing filters it); refused otherwise.
    pub whole_network: bool,
}

impl WorkerConfig {
    /// A worker named `name` with `slots` slots working under `work_dir`.
    pub fn new(name: impl Into<String>, slots: u32, work_dir: impl Into<PathBuf>) -> WorkerConfig {
        let work_dir: PathBuf = work_dir.into();
        WorkerConfig {
            snapshots: Some(Arc::new(crate::snapshot::Snapshots::new(work_dir.join("snapshots"), 8))),
            name: name.into(),
            slots: slots.max(1),
            work_dir,
            sandbox: SandboxKind::Bwrap,
            poll: Duration::from_millis(500),
            exit_when_idle: None,
            rules: Vec::new(),
            limits: caret_sandbox::Limits::standard(),
            landlock_helper: None,
            context_window: 32_768,
            image_models: Vec::new(),
            drain_timeout: Duration::from_secs(60),
            egress: caret_sandbox::egress::Egress::Open,
            whole_network: true,
        }
    }
}

/// What a worker did, when it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerSummary {
    /// Attempts run to an end (any state).
    pub completed: u32,
    /// Attempts handed back (drained) or abandoned (lease lost).
    pub abandoned: u32,
}

/// A worker.
pub struct Worker {
    coord: Arc<dyn Coordinator>,
    config: Arc<WorkerConfig>,
}

/// Why an attempt stops early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Go,
    Cancel,
    Lost,
    Drain,
    /// The run's directory grew past its disk limit.
    Disk,
}

impl Worker {
    /// A worker taking runs from `coord`.
    pub fn new(coord: Arc<dyn Coordinator>, config: WorkerConfig) -> Worker {
        Worker { coord, config: Arc::new(config) }
    }

    /// Runs slots until `drain` turns true (then lets running attempts finish within the
    /// drain timeout and hands back the rest), or until idle past `exit_when_idle`.
    pub async fn run(self, drain: watch::Receiver<bool>) -> Result<WorkerSummary> {
        std::fs::create_dir_all(&self.config.work_dir)
            .map_err(|e| Error::Unavailable(format!("creating {}: {e}", self.config.work_dir.display())))?;
        if let Some(snapshots) = &self.config.snapshots {
            snapshots.claim(&self.config.work_dir);
        }
        let busy = Arc::new(AtomicU32::new(0));
        let last_active = Arc::new(Mutex::new(Instant::now()));
        let mut slots = Vec::new();
        for _ in 0..self.config.slots {
            let (coord, config, busy, last_active, drain) =
                (self.coord.clone(), self.config.clone(), busy.clone(), last_active.clone(), drain.clone());
            slots.push(tokio::spawn(slot(coord, config, busy, last_active, drain)));
        }
        let mut summary = WorkerSummary::default();
        for s in slots {
            let s = s.await.map_err(|e| Error::Internal(format!("a worker slot failed: {e}")))?;
            summary.completed += s.completed;
            summary.abandoned += s.abandoned;
        }
        Ok(summary)
    }
}

async fn slot(
    coord: Arc<dyn Coordinator>,
    config: Arc<WorkerConfig>,
    busy: Arc<AtomicU32>,
    last_active: Arc<Mutex<Instant>>,
    mut drain: watch::Receiver<bool>,
) -> WorkerSummary {
    let mut summary = WorkerSummary::default();
    loop {
        if *drain.borrow() {
            return summary;
        }
        let req = LeaseRequest {
            worker: config.name.clone(),
            slots: config.slots,
            busy: busy.load(Ordering::Relaxed),
            sandbox: config.sandbox.name().to_owned(),
        };
        match coord.lease(&req).await {
            Ok(Some(lease)) => {
                busy.fetch_add(1, Ordering::Relaxed);
                let finished = attempt(coord.clone(), config.clone(), lease, drain.clone()).await;
                busy.fetch_sub(1, Ordering::Relaxed);
                *last_active.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
                if finished {
                    summary.completed += 1;
                } else {
                    summary.abandoned += 1;
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(worker = %config.name, "asking for a run: {e}"),
        }
        // Idle — no run to take, or no coordinator answering (its storage gone, say) — for
        // long enough: done.
        if let Some(idle) = config.exit_when_idle {
            let quiet = last_active.lock().unwrap_or_else(PoisonError::into_inner).elapsed();
            if busy.load(Ordering::Relaxed) == 0 && quiet >= idle {
                return summary;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(config.poll) => {}
            _ = drain.changed() => {}
        }
    }
}

/// Runs one attempt with its heartbeat; `true` when it was completed (not handed back or
/// lost).
async fn attempt(
    coord: Arc<dyn Coordinator>,
    config: Arc<WorkerConfig>,
    lease: Lease,
    drain: watch::Receiver<bool>,
) -> bool {
    // The attempt continues the trace of the request that queued the run.
    let span = tracing::info_span!("run.attempt", run = %lease.lease.run, attempt = lease.attempt);
    caret_trace::set_parent(&span, lease.traceparent.as_deref());
    tracing::Instrument::instrument(attempt_in_span(coord, config, lease, drain), span).await
}

async fn attempt_in_span(
    coord: Arc<dyn Coordinator>,
    config: Arc<WorkerConfig>,
    lease: Lease,
    mut drain: watch::Receiver<bool>,
) -> bool {
    let lease_ref = lease.lease.clone();
    let (stop_tx, stop_rx) = watch::channel(Stop::Go);
    let stop_tx = Arc::new(stop_tx);
    let run_dir = config.work_dir.join(format!("{}-{}", lease_ref.run, lease_ref.token));
    // The attempt's sandbox once it exists, for the heartbeat's figures.
    let live: Arc<OnceLock<Arc<dyn caret_sandbox::Sandbox>>> = Arc::default();
    // The heartbeat: renews the lease a few times per lease period (at least every 5 s, so
    // operators see the sandbox's use move; the first after a second, so a new sandbox shows
    // at once), with a sample of what the sandbox uses.
    let beat = {
        let (coord, lease_ref, stop_tx, run_dir, live) =
            (coord.clone(), lease_ref.clone(), stop_tx.clone(), run_dir.clone(), live.clone());
        let every = Duration::from_millis((lease.lease_ttl_s * 1000 / 3).clamp(100, 5000));
        let ttl = Duration::from_secs(lease.lease_ttl_s);
        let disk_limit = lease.limits.disk_bytes;
        tokio::spawn(async move {
            let mut last_ok = Instant::now();
            let mut first = true;
            loop {
                tokio::time::sleep(if first { every.min(Duration::from_secs(1)) } else { every }).await;
                first = false;
                let own = match live.get() {
                    Some(sandbox) => sandbox.usage().await,
                    None => None,
                };
                let (usage, disk) = {
                    let run_dir = run_dir.clone();
                    tokio::task::spawn_blocking(move || {
                        // `/proc` only for a backend without figures of its own.
                        let usage = own.or_else(|| {
                            let ws = std::fs::canonicalize(run_dir.join("repo")).ok()?;
                            Some(sampler().sample().of_workspace(&ws))
                        });
                        (usage, disk_used(&run_dir))
                    })
                    .await
                    .unwrap_or((None, 0))
                };
                if disk > disk_limit {
                    stop_tx.send_if_modified(|s| std::mem::replace(s, Stop::Disk) == Stop::Go);
                }
                let usage = usage.map(|u| SandboxUsage {
                    processes: u.processes,
                    memory_bytes: u.memory_bytes,
                    cpu_ms: u.cpu_ms,
                });
                match coord.heartbeat(&lease_ref, usage).await {
                    Ok(cancel) => {
                        last_ok = Instant::now();
                        if cancel {
                            stop_tx.send_if_modified(|s| std::mem::replace(s, Stop::Cancel) == Stop::Go);
                        }
                    }
                    Err(Error::Fenced(_)) => {
                        stop_tx.send_replace(Stop::Lost);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(run = %lease_ref.run, "heartbeat: {e}");
                        // Past the lease's end the run is someone else's: stop.
                        if last_ok.elapsed() > ttl {
                            stop_tx.send_replace(Stop::Lost);
                            return;
                        }
                    }
                }
            }
        })
    };
    let work = {
        let (coord, config, run_dir) = (coord.clone(), config.clone(), run_dir.clone());
        let live = live.clone();
        tokio::spawn(async move { execute(coord, &config, &lease, &run_dir, stop_rx, &live).await })
    };
    tokio::pin!(work);
    // A drain gives the attempt the drain timeout to end by itself.
    let outcome = loop {
        tokio::select! {
            done = &mut work => break done.ok(),
            changed = drain.changed(), if !*drain.borrow() => {
                if changed.is_err() { continue; }
                if *drain.borrow() {
                    match tokio::time::timeout(config.drain_timeout, &mut work).await {
                        Ok(done) => break done.ok(),
                        Err(_) => {
                            stop_tx.send_replace(Stop::Drain);
                            break (&mut work).await.ok();
                        }
                    }
                }
            }
        }
    };
    beat.abort();
    let _ = std::fs::remove_dir_all(&run_dir);
    let stop = *stop_tx.borrow();
    match (stop, outcome) {
        (Stop::Lost, _) => {
            tracing::warn!(run = %lease_ref.run, "lease lost: the attempt was stopped and reports nothing");
            false
        }
        (Stop::Drain, _) => {
            let back = Completion {
                lease: lease_ref.clone(),
                state: RunState::Queued,
                reason: Some(format!("the worker {} was drained before the attempt ended", config.name)),
                retry: true,
                result: None,
                docs: None,
            };
            if let Err(e) = coord.complete(back).await {
                tracing::warn!(run = %lease_ref.run, "handing the run back: {e}");
            }
            false
        }
        (_, Some(done)) => match coord.complete(done).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(run = %lease_ref.run, "completing the run: {e}");
                false
            }
        },
        (_, None) => {
            let back = Completion {
                lease: lease_ref.clone(),
                state: RunState::Failed,
                reason: Some("the worker's attempt crashed".into()),
                retry: true,
                result: None,
                docs: None,
            };
            let _ = coord.complete(back).await;
            false
        }
    }
}

/// Bytes under `dir` on its own file system (a mount inside, such as a warm workspace's
/// overlay, is not entered: its writes are counted in its upper directory, which is here).
fn disk_used(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(top) = std::fs::symlink_metadata(dir) else { return 0 };
    let (dev, mut total, mut stack) = (top.dev(), 0u64, vec![dir.to_path_buf()]);
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.blocks() * 512;
            }
        }
    }
    total
}

/// The process's view of its sandboxes: `/proc` read at most once a second, whatever the
/// number of runs.
fn sampler() -> &'static caret_sandbox::usage::Sampler {
    static SAMPLER: OnceLock<caret_sandbox::usage::Sampler> = OnceLock::new();
    SAMPLER.get_or_init(|| caret_sandbox::usage::Sampler::new(Duration::from_secs(1)))
}

/// Sends events in batches as they come: every 200 ms or 64 events, redacted.
struct Reporter {
    tx: mpsc::UnboundedSender<RunEvent>,
    task: tokio::task::JoinHandle<()>,
}

impl Reporter {
    fn start(coord: Arc<dyn Coordinator>, lease: LeaseRef, redactor: Redactor) -> Reporter {
        let (tx, mut rx) = mpsc::unbounded_channel::<RunEvent>();
        let task = tokio::spawn(async move {
            let mut open = true;
            while open {
                let mut batch = Vec::new();
                match rx.recv().await {
                    Some(e) => batch.push(e),
                    None => break,
                }
                let until = tokio::time::Instant::now() + Duration::from_millis(200);
                while batch.len() < 64 {
                    match tokio::time::timeout_at(until, rx.recv()).await {
                        Ok(Some(e)) => batch.push(e),
                        Ok(None) => {
                            open = false;
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let batch: Vec<RunEvent> = batch.into_iter().map(|e| redactor.apply(e)).collect();
                // A failed report is retried a few times; events are not worth losing the run.
                for pause in [0u64, 200, 1000, 3000] {
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    match coord.events(&lease, batch.clone()).await {
                        Ok(()) => break,
                        Err(Error::Fenced(_)) => return,
                        Err(e) => tracing::warn!(run = %lease.run, "reporting events: {e}"),
                    }
                }
            }
        });
        Reporter { tx, task }
    }

    fn send(&self, e: RunEvent) {
        let _ = self.tx.send(e);
    }

    async fn finish(self) {
        drop(self.tx);
        let _ = self.task.await;
    }
}

/// A rollout's conversation as the model saw it, with its token view when asked for.
fn transcript_of(session: &Session, options: &caret_protocol::runs::RolloutOptions) -> Transcript {
    // The sampled ids are in the token view; the messages stay text.
    let messages = session.messages().iter().cloned().map(|m| ChatMessage { token_ids: None, ..m }).collect();
    let mut transcript = Transcript {
        tools: session.tool_defs(),
        messages,
        temperature: options.temperature,
        seed: options.seed,
        ..Transcript::default()
    };
    if options.tokens {
        let calls = session.token_calls();
        match TokenView::assemble(calls) {
            Ok(view) => transcript.tokens = Some(view),
            Err(why) => {
                transcript.tokens_missing = Some(why);
                transcript.logprobs = calls.iter().map(|c| c.logprobs.clone()).filter(|l| !l.is_empty()).collect();
            }
        }
    }
    transcript
}

/// The agent's model: calls through the coordinator under the run's lease.
struct LeaseModel {
    coord: Arc<dyn Coordinator>,
    lease: LeaseRef,
    started: Instant,
    first_call: OnceLock<Duration>,
}

#[async_trait::async_trait]
impl ModelClient for LeaseModel {
    async fn chat(&self, req: ChatRequest) -> caret_models::Result<EventStream> {
        let _ = self.first_call.set(self.started.elapsed());
        self.coord.chat(&self.lease, req).await
    }
}

/// The snapshot key of the checkout's environment (see [`crate::snapshot`]).
async fn environment_key(
    tenant: &str,
    code: &Path,
    prepared: &crate::environment::Prepared,
) -> std::result::Result<String, String> {
    let roots = git(code, &["rev-list", "--max-parents=0", "HEAD"]).await?;
    let mut inputs = Vec::new();
    for path in &prepared.install_inputs {
        let inside = code.join(path);
        // Only files inside the checkout count (no `..`, no links out).
        let content = match std::fs::canonicalize(&inside) {
            Ok(real) if real.starts_with(std::fs::canonicalize(code).map_err(|e| e.to_string())?) => {
                std::fs::read(real).ok()
            }
            _ => None,
        };
        inputs.push((path.clone(), content));
    }
    Ok(crate::snapshot::Snapshots::key(tenant, roots.trim(), &prepared.install, &inputs))
}

/// Runs a command in the sandbox unless the attempt stops first.
async fn sandboxed(
    sandbox: &Arc<dyn caret_sandbox::Sandbox>,
    spec: &caret_sandbox::Spec,
    stop: &mut watch::Receiver<Stop>,
) -> std::result::Result<caret_sandbox::Output, String> {
    tokio::select! {
        out = sandbox.run(spec) => out.map_err(|e| e.to_string()),
        () = stopped(stop) => Err("stopped".into()),
    }
}

/// Resolves when the attempt must stop.
async fn stopped(stop: &mut watch::Receiver<Stop>) {
    loop {
        if *stop.borrow_and_update() != Stop::Go {
            return;
        }
        if stop.changed().await.is_err() {
            // The sender lives as long as the attempt.
            std::future::pending::<()>().await;
        }
    }
}

/// Executes one attempt; the completion to report.
async fn execute(
    coord: Arc<dyn Coordinator>,
    config: &WorkerConfig,
    lease: &Lease,
    run_dir: &Path,
    mut stop: watch::Receiver<Stop>,
    live: &OnceLock<Arc<dyn caret_sandbox::Sandbox>>,
) -> Completion {
    if let Some(job) = &lease.docs {
        let go = {
            let stop = stop.clone();
            move || *stop.borrow() == Stop::Go
        };
        let outcome = crate::docs_crawl::crawl(&coord, lease, job, run_dir, &config.egress, go).await;
        let end = |state, reason: Option<String>, retry, docs| Completion {
            lease: lease.lease.clone(),
            state,
            reason,
            retry,
            result: None,
            docs,
        };
        return match (*stop.borrow(), outcome) {
            (Stop::Cancel, _) => end(RunState::Cancelled, Some("cancelled by the user".into()), false, None),
            (Stop::Disk, _) => end(RunState::Failed, Some("the crawl grew past its disk limit".into()), false, None),
            (_, Ok(crawled)) => end(RunState::Succeeded, None, false, Some(crawled)),
            (_, Err((reason, retry))) => end(RunState::Failed, Some(reason), retry, None),
        };
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(lease.limits.wall_time_s);
    let mut secrets = lease.secret_values.clone();
    if let Some(token) = &lease.git_credential {
        secrets.insert("git credential".into(), token.clone());
    }
    let redactor = Redactor::new(&secrets);
    let reporter = Reporter::start(coord.clone(), lease.lease.clone(), redactor.clone());
    let mut timings = Timings::default();
    let mut result = RunResult::default();
    let outcome =
        run_attempt(&coord, config, lease, run_dir, &mut stop, &reporter, &mut timings, &mut result, deadline, live)
            .await;
    timings.total_ms = ms(started.elapsed());
    result.timings = timings;
    reporter.finish().await;
    let stop_now = *stop.borrow();
    let (state, reason, retry) = match (stop_now, outcome) {
        (Stop::Cancel, _) => (RunState::Cancelled, Some("cancelled by the user".to_owned()), false),
        (Stop::Disk, _) => (
            RunState::Failed,
            Some(format!("the run's directory grew past its disk limit ({} bytes)", lease.limits.disk_bytes)),
            false,
        ),
        (_, Ok(None)) => (RunState::Succeeded, None, false),
        (_, Ok(Some(why))) => (RunState::Failed, Some(why), false),
        (_, Err(f)) => (RunState::Failed, Some(f.reason), f.retry),
    };
    let result = redactor.apply(result);
    let reason = reason.map(|r| redactor.text(&r));
    Completion { lease: lease.lease.clone(), state, reason, retry, result: Some(result), docs: None }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The attempt's steps. `Ok(None)`: the agent finished; `Ok(Some(why))`: the run failed on
/// its own account (a setup step, the model, a limit); `Err`: it could not be run.
#[allow(clippy::too_many_arguments)]
async fn run_attempt(
    coord: &Arc<dyn Coordinator>,
    config: &WorkerConfig,
    lease: &Lease,
    run_dir: &Path,
    stop: &mut watch::Receiver<Stop>,
    reporter: &Reporter,
    timings: &mut Timings,
    result: &mut RunResult,
    deadline: Instant,
    live: &OnceLock<Arc<dyn caret_sandbox::Sandbox>>,
) -> std::result::Result<Option<String>, Failure> {
    let started = Instant::now();
    let left = |what: &str| {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("the wall time limit ({} s) was reached during {what}", lease.limits.wall_time_s))
    };
    std::fs::create_dir_all(run_dir)
        .map_err(|e| Failure { reason: format!("creating {}: {e}", run_dir.display()), retry: true })?;
    let (code, repo) = (run_dir.join("code"), run_dir.join("repo"));
    checkout(coord.as_ref(), lease, run_dir, &code).await?;
    let prepared = crate::environment::prepare(&code, &lease.environment).map_err(|e| fail(e.to_string()))?;
    // The environment's snapshot, when its install step has one ready: the workspace starts
    // from it (the snapshot's tree over the checkout) and the install is skipped.
    let key = match (&config.snapshots, prepared.install.is_empty()) {
        (Some(_), false) => Some(environment_key(&lease.tenant, &code, &prepared).await.map_err(fail)?),
        _ => None,
    };
    let warm_started = Instant::now();
    let snapshots = config.snapshots.clone();
    let workspace = match (&snapshots, &key) {
        (Some(snaps), Some(k)) if snaps.get(k).is_some() => {
            let (snaps, k, code, repo, scratch) =
                (snaps.clone(), k.clone(), code.clone(), repo.clone(), run_dir.join("overlay"));
            let made = tokio::task::spawn_blocking(move || snaps.materialize(&k, &code, &repo, &scratch))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
            Some(made.map_err(|e| Failure {
                reason: format!("starting from the environment's snapshot: {e}"),
                retry: true,
            })?)
        }
        _ => {
            std::fs::rename(&code, &repo).map_err(|e| fail(format!("{}: {e}", repo.display())))?;
            None
        }
    };
    timings.warm = workspace.is_some();

    // The sandbox: the checkout writable, the run's variables and secrets in every command.
    let mut policy = caret_sandbox::Policy::new(&repo).map_err(|e| fail(e.to_string()))?.with_toolchains();
    if prepared.network && !config.whole_network {
        return Err(Failure {
            reason: "the run asks for the whole network, which this server's operator does not allow (ask for hosts instead)".into(),
            retry: false,
        });
    }
    policy.network = prepared.network;
    policy.hosts =
        caret_sandbox::netproxy::AllowList::parse(&prepared.hosts).map_err(fail)?.under(config.egress.clone());
    policy.limits = config.limits;
    policy.env = prepared.env.iter().chain(&lease.secret_values).map(|(k, v)| (k.clone(), v.clone())).collect();
    if let Some(helper) = &config.landlock_helper {
        policy = policy.with_landlock(helper.clone());
    }
    let kind = config.sandbox.clone();
    let sandbox = tokio::task::spawn_blocking(move || kind.open(policy))
        .await
        .map_err(|e| Failure { reason: format!("starting the sandbox: {e}"), retry: true })?
        .map_err(|e| Failure { reason: format!("starting the sandbox: {e}"), retry: true })?;
    let _ = live.set(sandbox.clone());
    timings.launch_ms = ms(started.elapsed());
    coord.launched(&lease.lease, started.elapsed().as_secs_f64()).await;
    if let Some(ws) = &workspace {
        reporter.send(RunEvent::Run(RunStatus::Snapshot {
            saved: false,
            method: ws.method.name().to_owned(),
            duration_ms: ms(warm_started.elapsed()),
        }));
    }

    // The environment's steps: install (unless warm; its outputs are then kept), start, the
    // request's own.
    let setup_started = Instant::now();
    let install = if workspace.is_some() { &[][..] } else { &prepared.install[..] };
    for (n, command) in install.iter().chain(&prepared.setup).enumerate() {
        let mut spec = caret_sandbox::Spec::new(command.clone(), &repo);
        spec.timeout = left("setup")?;
        let t = Instant::now();
        let out = sandboxed(&sandbox, &spec, stop).await.map_err(|e| fail(format!("setup step {command:?}: {e}")))?;
        let output = tail(&format!("{}{}", out.stdout, out.stderr), 4000);
        reporter.send(RunEvent::Run(RunStatus::SetupStep {
            command: command.clone(),
            exit_code: out.exit_code,
            output,
            duration_ms: ms(t.elapsed()),
        }));
        if !out.success() {
            timings.setup_ms = ms(setup_started.elapsed());
            let how =
                if out.timed_out { "ran out of time".to_owned() } else { format!("exited with {:?}", out.exit_code) };
            return Ok(Some(format!("setup step {command:?} {how}")));
        }
        if n + 1 == install.len()
            && let (Some(snaps), Some(k)) = (&snapshots, &key)
        {
            let t = Instant::now();
            let (snaps_bg, k, tree) = (snaps.clone(), k.clone(), repo.clone());
            // Copying the outputs blocks: off the async threads.
            let saved = tokio::task::spawn_blocking(move || snaps_bg.save(&k, &tree))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
            match saved {
                Ok(()) => reporter.send(RunEvent::Run(RunStatus::Snapshot {
                    saved: true,
                    method: snaps.method().name().to_owned(),
                    duration_ms: ms(t.elapsed()),
                })),
                Err(e) => tracing::warn!(run = %lease.lease.run, "keeping the environment's snapshot: {e}"),
            }
        }
    }
    timings.setup_ms = ms(setup_started.elapsed());
    // The starting point the run's changes are measured from: the code and its prepared
    // environment.
    let base = commit_base(&repo).await?;
    // An earlier attempt's work: its changes applied, its conversation ready to go on.
    let transcript = run_dir.join("transcript.jsonl");
    let mut resumed = false;
    if let Some(cp) = &lease.checkpoint {
        let (files, conversation) = crate::checkpoint::restore(run_dir, &repo, &transcript, cp).await;
        reporter.send(RunEvent::Run(RunStatus::Resumed { files, conversation }));
        resumed = conversation;
    }

    // The agent, with the tools `caret agent` has (the sandbox's terminal and linters).
    // The repository's rules files, as a user's session in it would read them.
    let ctx = Ctx::new(&repo).map_err(|e| fail(format!("opening the checkout: {e}")))?.with_workspace_rules();
    let ctx = Arc::new(ctx);
    let mut tools = Registry::workspace();
    tools.add(Arc::new(caret_agent::tools::terminal::RunTerminalCmd::new(sandbox.clone())));
    tools.add(Arc::new(caret_agent::tools::lints::ReadLints::new(sandbox.clone())));
    let model =
        Arc::new(LeaseModel { coord: coord.clone(), lease: lease.lease.clone(), started, first_call: OnceLock::new() });
    let mut session = Session::new(model.clone(), &lease.model, tools, ctx);
    // The run's MCP servers, started after the environment's steps (a server may need what
    // they installed); the agent starts with their tools (every attempt of a rollout sees the
    // same ones), waiting for them at most 30 s.
    let variables = prepared.env.iter().chain(&lease.secret_values).map(|(k, v)| (k.clone(), v.clone())).collect();
    let report = {
        let tx = reporter.tx.clone();
        move |s| drop(tx.send(RunEvent::Run(s)))
    };
    let servers = crate::mcp::start(&repo, &prepared, &variables, &config.egress, sandbox.clone(), report);
    if let Some(servers) = &servers {
        servers.hub.settled(crate::mcp::SETTLE).await;
        session.add_dynamic_tools(servers.hub.clone());
    }
    // The repository's hooks, run inside the sandbox (as its MCP servers are).
    let (hooks, problems) = caret_agent::hooks::files::project(&repo);
    for p in problems {
        tracing::warn!(run = %lease.lease.run, "hooks: {}: {}", p.source, p.message);
    }
    if !hooks.is_empty() {
        let shell = Arc::new(caret_agent::hooks::SandboxShell::new(sandbox.clone(), &repo));
        session.set_hooks(caret_agent::hooks::Hooks::new(hooks, &repo, shell));
    }
    session.max_steps = lease.limits.steps.max(1);
    session.context_window = config.context_window;
    session.images = config.image_models.contains(&lease.model);
    session.policy.approval = Approval::Never;
    session.policy.rules = config.rules.clone();
    if let Some(r) = &lease.rollout {
        session.set_sampling(r.temperature, r.seed);
        if r.tokens {
            session.keep_tokens();
        }
    }
    // The conversation is written as it grows: each checkpoint carries it.
    let task = if resumed && session.resume(&transcript).is_ok() {
        CONTINUE.to_owned()
    } else {
        let _ = std::fs::remove_file(&transcript);
        session.persist(&transcript, &lease.lease.run).map_err(|e| fail(format!("the session file: {e}")))?;
        lease.task.clone()
    };
    let (steps_tx, steps_rx) = mpsc::unbounded_channel::<()>();
    let checkpointer = tokio::spawn(crate::checkpoint::checkpoints(
        coord.clone(),
        lease.lease.clone(),
        repo.clone(),
        base.clone(),
        transcript.clone(),
        steps_rx,
    ));
    let (events_tx, mut events_rx) = mpsc::unbounded_channel::<Event>();
    let (_ops_tx, mut ops_rx) = mpsc::unbounded_channel();
    let agent_started = Instant::now();
    let wall = left("the agent's start")?;
    // The agent's events go out as they come; the last error is kept as the reason.
    let last_error: Arc<Mutex<Option<String>>> = Arc::default();
    let forward = {
        let (tx, last_error) = (reporter.tx.clone(), last_error.clone());
        tokio::spawn(async move {
            while let Some(e) = events_rx.recv().await {
                match &e {
                    Event::Error { message } => {
                        *last_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(message.clone());
                    }
                    Event::ToolCallEnd { .. } => {
                        let _ = steps_tx.send(());
                    }
                    _ => {}
                }
                let _ = tx.send(RunEvent::Agent(e));
            }
        })
    };
    let turn = tokio::select! {
        end = session.turn(&task, &events_tx, &mut ops_rx) => Some(end),
        () = stopped(stop) => None,
        () = tokio::time::sleep(wall) => None,
    };
    drop(events_tx);
    let _ = forward.await;
    // The result supersedes any checkpoint still being made.
    checkpointer.abort();
    timings.agent_ms = ms(agent_started.elapsed());
    timings.first_model_call_ms = model.first_call.get().map_or(0, |d| ms(*d));
    let (prompt, completion, calls) = session.usage();
    result.usage = Usage { prompt_tokens: prompt, completion_tokens: completion, calls };
    result.final_message = session
        .messages()
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant && !m.content_text().trim().is_empty())
        .map(|m| m.content_text())
        .unwrap_or_default();
    if let Some(r) = lease.rollout.as_ref().filter(|r| r.transcript) {
        result.transcript = Some(transcript_of(&session, r));
    }
    result.turn_end = match turn {
        Some(end) => serde_json::to_value(end).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
        None if *stop.borrow() != Stop::Go => "interrupted".into(),
        None => "wall_time".into(),
    };

    // What the agent changed, even when it did not finish: the user may want it.
    patch(&repo, &base, result).await?;
    if *stop.borrow() != Stop::Go {
        return Ok(Some("stopped".into()));
    }
    let failed = match turn {
        None => {
            Some(format!("the wall time limit ({} s) was reached while the agent worked", lease.limits.wall_time_s))
        }
        Some(TurnEnd::Failed) => Some(
            last_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
                .unwrap_or_else(|| "the agent failed".into()),
        ),
        Some(_) => None,
    };
    if let (None, Some(command)) = (&failed, &prepared.test) {
        let t = Instant::now();
        let mut spec = caret_sandbox::Spec::new(command.clone(), &repo);
        let own = lease.environment.test_timeout_s.map_or(Duration::from_secs(1800), Duration::from_secs);
        spec.timeout = left("the tests")?.min(own);
        let out = sandboxed(&sandbox, &spec, stop).await.map_err(|e| fail(format!("test command: {e}")))?;
        timings.test_ms = ms(t.elapsed());
        result.test = Some(TestOutcome {
            command: command.clone(),
            exit_code: out.exit_code,
            timed_out: out.timed_out,
            output: tail(&format!("{}{}", out.stdout, out.stderr), 16_000),
        });
    }
    if let (None, Some(target)) = (&failed, &lease.push) {
        let outcome = push(&repo, lease, target).await;
        let error = outcome.error.clone();
        result.push = Some(outcome);
        if let Some(e) = error {
            return Ok(Some(format!("the push failed: {e}")));
        }
    }
    Ok(failed)
}

/// What an attempt that continues an earlier one's conversation is told first.
const CONTINUE: &str = "(This run moved to another machine part-way through. The workspace holds your changes so \
                        far; a command that was running when it moved did not finish. Carry on with the task from \
                        where you were.)";
