//! The gateway: aliases → deployments, and per request the choice of deployment under
//! limits, health and priorities.
//!
//! A request goes to the first order group that has a healthy deployment with room now
//! (weighted random within the group). With no room anywhere it waits in the queue of the
//! healthy deployment with the shortest one, ordered by class then deadline; a full queue
//! sheds its least important waiter (or refuses the newcomer if that is it). A waiter whose
//! deadline can no longer be met is dropped before it reaches a model. A retryable failure
//! is retried — at once on another deployment, else after a jittered exponential backoff —
//! while the retry budget and the deadline allow. A streamed answer is only retried before
//! its first token.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caret_protocol::llm::{ChatRequest, CompletionRequest, EmbeddingsRequest, EmbeddingsResponse};
use futures::StreamExt as _;
use tokio::sync::oneshot;

use crate::limits::{Breaker, BreakerState, TokenBucket};
use crate::metrics::GatewayMetrics;
use crate::provider::{Event, EventStream, Provider};
use crate::{Error, Result};

/// Priority classes, least important first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Batch and background work: shed first.
    Background,
    /// Agent turns.
    Agent,
    /// Tab and chat: a person is waiting.
    Interactive,
}

impl Class {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Class::Background => "background",
            Class::Agent => "agent",
            Class::Interactive => "interactive",
        }
    }

    /// Reads `interactive`, `agent`, `background` (or `batch`).
    pub fn parse(s: &str) -> Option<Class> {
        match s {
            "interactive" => Some(Class::Interactive),
            "agent" => Some(Class::Agent),
            "background" | "batch" => Some(Class::Background),
            _ => None,
        }
    }
}

/// Who is asking, how important it is, and by when the answer must start.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// Priority class.
    pub class: Class,
    /// After this, the request is dropped (before reaching a model if it is still waiting).
    pub deadline: Instant,
    /// The tenant (for quotas and recovery admission).
    pub tenant: String,
}

impl CallContext {
    /// A context with a deadline `within` from now.
    pub fn new(class: Class, within: Duration, tenant: impl Into<String>) -> Self {
        CallContext { class, deadline: Instant::now() + within, tenant: tenant.into() }
    }
}

/// Limits of one deployment.
#[derive(Debug, Clone)]
pub struct DeploymentLimits {
    /// Requests a minute (token bucket, bursting to a minute's worth).
    pub rpm: Option<u32>,
    /// Tokens a minute (prompt estimate + max tokens charged up front, corrected after).
    pub tpm: Option<u32>,
    /// Requests at once.
    pub max_concurrency: usize,
    /// Requests waiting at most.
    pub max_queue: usize,
    /// Longest time for one attempt to start answering, and longest silence mid-stream.
    pub attempt_timeout: Duration,
    /// After recovering, concurrency ramps from 1 to `max_concurrency` over this long.
    pub slow_start: Duration,
    /// Consecutive failures that open the breaker.
    pub breaker_threshold: u32,
    /// First open period (doubles on failed trials, up to 8x).
    pub breaker_cooldown: Duration,
}

impl Default for DeploymentLimits {
    fn default() -> Self {
        DeploymentLimits {
            rpm: None,
            tpm: None,
            max_concurrency: 16,
            max_queue: 64,
            attempt_timeout: Duration::from_secs(60),
            slow_start: Duration::from_secs(30),
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(5),
        }
    }
}

/// Why a waiter was woken.
#[derive(Debug)]
enum Grant {
    /// A slot is reserved for it.
    Go,
    /// Shed for a more important request.
    Shed,
    /// Its deadline can no longer be met.
    Expired,
}

#[derive(Debug)]
struct Waiter {
    class: Class,
    deadline: Instant,
    seq: u64,
    tx: oneshot::Sender<Grant>,
}

#[derive(Debug)]
struct DeploymentState {
    rpm: Option<TokenBucket>,
    tpm: Option<TokenBucket>,
    breaker: Breaker,
    in_flight: usize,
    waiters: Vec<Waiter>,
    seq: u64,
    /// Until when an upstream 429 asked us to stay away.
    cooling_until: Option<Instant>,
    /// Moving average of the time to first token: the least a request needs.
    ttft: Option<Duration>,
}

/// One upstream model behind an alias.
pub struct Deployment {
    name: String,
    provider: Arc<dyn Provider>,
    model: String,
    order: u32,
    weight: u32,
    limits: DeploymentLimits,
    state: Mutex<DeploymentState>,
}

impl std::fmt::Debug for Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployment").field("name", &self.name).field("model", &self.model).finish()
    }
}

impl Deployment {
    /// `provider` serving upstream model `model`; lower `order` is tried first, `weight`
    /// shares traffic within an order.
    pub fn new(
        name: impl Into<String>,
        provider: Arc<dyn Provider>,
        model: impl Into<String>,
        order: u32,
        weight: u32,
        limits: DeploymentLimits,
    ) -> Self {
        let now = Instant::now();
        let state = DeploymentState {
            rpm: limits.rpm.map(|n| TokenBucket::per_minute(n, now)),
            tpm: limits.tpm.map(|n| TokenBucket::per_minute(n, now)),
            breaker: Breaker::new(limits.breaker_threshold, limits.breaker_cooldown, limits.breaker_cooldown * 8),
            in_flight: 0,
            waiters: Vec::new(),
            seq: 0,
            cooling_until: None,
            ttft: None,
        };
        Deployment {
            name: name.into(),
            provider,
            model: model.into(),
            order,
            weight: weight.max(1),
            limits,
            state: Mutex::new(state),
        }
    }

    /// Its name (metrics label).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DeploymentState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Concurrency allowed now: the maximum, ramped up after a recovery.
    fn limit(&self, st: &DeploymentState, now: Instant) -> usize {
        let max = self.limits.max_concurrency.max(1);
        match st.breaker.recovered_at {
            Some(t)
                if !self.limits.slow_start.is_zero() && now.saturating_duration_since(t) < self.limits.slow_start =>
            {
                let share = now.saturating_duration_since(t).as_secs_f64() / self.limits.slow_start.as_secs_f64();
                ((max as f64 * share).ceil() as usize).clamp(1, max)
            }
            _ => max,
        }
    }

    fn healthy(&self, st: &mut DeploymentState, now: Instant) -> bool {
        st.cooling_until.is_none_or(|t| now >= t) && st.breaker.would_allow(now)
    }

    /// How long until the buckets allow a request of `tokens` (zero: now).
    fn bucket_wait(st: &mut DeploymentState, tokens: f64, now: Instant) -> Duration {
        let r = st.rpm.as_mut().map_or(Duration::ZERO, |b| b.wait_for(1.0, now));
        let t = st.tpm.as_mut().map_or(Duration::ZERO, |b| b.wait_for(tokens, now));
        r.max(t)
    }

    fn has_room(&self, st: &mut DeploymentState, tokens: f64, now: Instant) -> bool {
        st.in_flight < self.limit(st, now) && Self::bucket_wait(st, tokens, now).is_zero()
    }

    /// Takes a slot (the caller checked there is room).
    fn start(&self, st: &mut DeploymentState, tokens: f64, now: Instant) {
        st.in_flight += 1;
        if let Some(b) = st.rpm.as_mut() {
            b.try_take(1.0, now);
        }
        if let Some(b) = st.tpm.as_mut() {
            b.charge(tokens, now);
        }
        st.breaker.allow(now);
    }

    /// Frees a slot and hands free slots to the best waiters.
    fn release(&self, now: Instant) {
        let mut st = self.lock();
        st.in_flight = st.in_flight.saturating_sub(1);
        self.grant(&mut st, now);
    }

    fn grant(&self, st: &mut DeploymentState, now: Instant) {
        while st.in_flight < self.limit(st, now) && !st.waiters.is_empty() && st.breaker.would_allow(now) {
            // Most important first, then the earliest deadline.
            let Some(best) = (0..st.waiters.len())
                .max_by_key(|i| (st.waiters[*i].class, std::cmp::Reverse(st.waiters[*i].deadline)))
            else {
                break;
            };
            let w = st.waiters.swap_remove(best);
            let needs = st.ttft.unwrap_or(Duration::ZERO);
            if w.deadline <= now + needs {
                let _ = w.tx.send(Grant::Expired);
                continue;
            }
            if w.tx.send(Grant::Go).is_ok() {
                st.in_flight += 1;
                if let Some(b) = st.rpm.as_mut() {
                    b.try_take(1.0, now);
                }
                st.breaker.allow(now);
            }
        }
    }
}

/// A slot on a deployment; freed when dropped. The verdict feeds the breaker.
struct Permit {
    deployment: Arc<Deployment>,
    class: Class,
    started: Instant,
    metrics: Arc<GatewayMetrics>,
    estimate: f64,
    done: bool,
    /// The attempt's span (`model.call`): deployment, class, time to first token, tokens.
    span: tracing::Span,
}

impl Permit {
    fn first_token(&self) {
        let now = Instant::now();
        let ttft = now.saturating_duration_since(self.started);
        self.metrics.first_token(&self.deployment.name, self.class.label(), ttft);
        self.span.record("ttft_ms", ttft.as_secs_f64() * 1e3);
        let mut st = self.deployment.lock();
        st.ttft = Some(match st.ttft {
            Some(old) => old.mul_f64(0.8) + ttft.mul_f64(0.2),
            None => ttft,
        });
    }

    fn succeed(&mut self, usage: Option<(u32, u32)>) {
        let now = Instant::now();
        {
            let mut st = self.deployment.lock();
            st.breaker.success(now);
            if let (Some(b), Some((p, c))) = (st.tpm.as_mut(), usage) {
                // Correct the up-front estimate with what was used.
                b.charge(f64::from(p + c) - self.estimate, now);
            }
        }
        self.metrics.finished(&self.deployment.name, self.class.label(), now - self.started, usage);
        if let Some((p, c)) = usage {
            self.span.record("prompt_tokens", p);
            self.span.record("completion_tokens", c);
        }
        self.span.record("outcome", "ok");
        self.done = true;
    }

    fn fail(&mut self, e: &Error) {
        let now = Instant::now();
        self.span.record("outcome", e.kind());
        {
            let mut st = self.deployment.lock();
            if e.is_failure() {
                st.breaker.failure(now);
            } else {
                st.breaker.release_trial();
            }
            if let Error::RateLimited { retry_after, .. } = e {
                st.cooling_until = Some(now + retry_after.unwrap_or(Duration::from_secs(1)));
            }
        }
        self.metrics.error(&self.deployment.name, self.class.label(), e.kind());
        self.metrics.finished(&self.deployment.name, self.class.label(), now - self.started, None);
        self.done = true;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.done {
            self.deployment.lock().breaker.release_trial();
        }
        self.deployment.release(Instant::now());
    }
}

/// Retries and quotas.
#[derive(Debug, Clone)]
pub struct RetrySettings {
    /// Attempts per request at most (the first included).
    pub max_attempts: u32,
    /// First backoff (doubles, full jitter).
    pub backoff: Duration,
    /// Longest backoff.
    pub max_backoff: Duration,
    /// Retries earned per request (the budget), on top of `min_per_second`.
    pub budget_ratio: f64,
    /// Retries always allowed per second.
    pub min_per_second: f64,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            max_attempts: 3,
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            budget_ratio: 0.2,
            min_per_second: 5.0,
        }
    }
}

/// Gateway-wide settings.
#[derive(Debug, Clone, Default)]
pub struct GatewaySettings {
    /// Retry policy and budget.
    pub retry: RetrySettings,
    /// Requests a minute per tenant.
    pub tenant_rpm: Option<u32>,
    /// Tokens a minute per tenant (estimated up front).
    pub tenant_tpm: Option<u32>,
}

/// Recovery admission: a widening fraction of tenants (by hash) is let in.
#[derive(Debug, Clone, Copy)]
struct Recovery {
    started: Instant,
    from: f64,
    ramp: Duration,
}

impl Recovery {
    fn fraction(&self, now: Instant) -> f64 {
        recovery_share(self.from, self.ramp, now.saturating_duration_since(self.started))
    }
}

/// The share of tenants recovery admission lets in `elapsed` after it started: `from` at
/// once, widening linearly to all over `ramp`.
pub fn recovery_share(from: f64, ramp: Duration, elapsed: Duration) -> f64 {
    if ramp.is_zero() {
        return 1.0;
    }
    (from + (1.0 - from) * elapsed.as_secs_f64() / ramp.as_secs_f64()).min(1.0)
}

/// FNV-1a with a final mix: a stable hash of a tenant, as a fraction of the hash space.
fn tenant_point(tenant: &str) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tenant.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // FNV alone leaves similar names close together; a final mix spreads them.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// A tenant's request and token buckets.
type TenantBuckets = (Option<TokenBucket>, Option<TokenBucket>);

/// The model gateway.
pub struct Gateway {
    aliases: BTreeMap<String, Vec<Arc<Deployment>>>,
    settings: GatewaySettings,
    retry_budget: Mutex<TokenBucket>,
    tenants: Mutex<HashMap<String, TenantBuckets>>,
    recovery: Mutex<Option<Recovery>>,
    metrics: Arc<GatewayMetrics>,
    /// Deployments an operator switched off (kill switches): never chosen.
    switched_off: std::sync::RwLock<std::collections::HashSet<String>>,
    /// Where tenant quotas are kept when replicas share them.
    ledger: std::sync::OnceLock<Arc<dyn QuotaLedger>>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("aliases", &self.aliases.keys().collect::<Vec<_>>()).finish()
    }
}

/// Tenant quotas kept outside this process, so that they hold across a service's replicas.
#[async_trait::async_trait]
pub trait QuotaLedger: Send + Sync {
    /// Takes `cost` from `key`'s bucket (refilling at `per_second` up to `burst`):
    /// `(admitted, level after)`; `None` when unreachable (this gateway decides then).
    async fn take(&self, key: &str, cost: f64, per_second: f64, burst: f64) -> Option<(bool, f64)>;
}

/// What the chooser found.
enum Choice {
    /// Room now: the slot is taken.
    Now(Arc<Deployment>),
    /// No room: wait in this deployment's queue (re-checking after at most the duration).
    Wait(Arc<Deployment>, Duration),
}

impl Gateway {
    /// A gateway with no aliases yet.
    pub fn new(settings: GatewaySettings) -> Self {
        let r = &settings.retry;
        let budget = TokenBucket::new(10.0_f64.max(r.min_per_second), r.min_per_second, Instant::now());
        Gateway {
            aliases: BTreeMap::new(),
            settings,
            retry_budget: Mutex::new(budget),
            tenants: Mutex::new(HashMap::new()),
            recovery: Mutex::new(None),
            metrics: Arc::new(GatewayMetrics::default()),
            switched_off: std::sync::RwLock::default(),
            ledger: std::sync::OnceLock::new(),
        }
    }

    /// Keeps tenant quotas in `ledger` (once): one round trip per model call.
    pub fn set_quota_ledger(&self, ledger: Arc<dyn QuotaLedger>) {
        let _ = self.ledger.set(ledger);
    }

    /// Sets the deployments switched off (by name): passed over as if unhealthy.
    pub fn switch_off(&self, deployments: std::collections::HashSet<String>) {
        *self.switched_off.write().unwrap_or_else(std::sync::PoisonError::into_inner) = deployments;
    }

    /// Every deployment's name, of every alias.
    pub fn deployment_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.aliases.values().flatten().map(|d| d.name.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// Adds (or replaces) an alias.
    pub fn add_alias(&mut self, alias: impl Into<String>, deployments: Vec<Deployment>) {
        let mut deps: Vec<Arc<Deployment>> = deployments.into_iter().map(Arc::new).collect();
        deps.sort_by_key(|d| d.order);
        self.aliases.insert(alias.into(), deps);
    }

    /// The aliases served.
    pub fn aliases(&self) -> Vec<String> {
        self.aliases.keys().cloned().collect()
    }

    /// The upstream model names behind an alias (none for an unknown alias).
    pub fn models_of(&self, alias: &str) -> Vec<String> {
        self.aliases.get(alias).into_iter().flatten().map(|d| d.model.clone()).collect()
    }

    /// The metrics.
    pub fn metrics(&self) -> &GatewayMetrics {
        &self.metrics
    }

    /// The metrics with current gauges, as Prometheus text.
    pub fn metrics_text(&self) -> String {
        let now = Instant::now();
        let gauges: Vec<(String, usize, usize, u8)> = self
            .aliases
            .values()
            .flatten()
            .map(|d| {
                let mut st = d.lock();
                (d.name.clone(), st.waiters.len(), st.in_flight, st.breaker.state(now).gauge())
            })
            .collect();
        self.metrics.render(&gauges)
    }

    /// Breaker state of a deployment (for tests and status pages).
    pub fn breaker_state(&self, deployment: &str) -> Option<BreakerState> {
        let now = Instant::now();
        self.aliases.values().flatten().find(|d| d.name == deployment).map(|d| d.lock().breaker.state(now))
    }

    /// Starts recovery admission: `from` of the tenants (by a stable hash) are admitted at
    /// once, widening linearly to all over `ramp`.
    pub fn start_recovery(&self, from: f64, ramp: Duration) {
        self.resume_recovery(from, ramp, Duration::ZERO);
    }

    /// Recovery admission that began `elapsed` ago (an operator started it on another replica,
    /// or before a restart): the admitted share is where it would be by now.
    pub fn resume_recovery(&self, from: f64, ramp: Duration, elapsed: Duration) {
        let now = Instant::now();
        let started = now.checked_sub(elapsed).unwrap_or(now);
        let r = Recovery { started, from: from.clamp(0.0, 1.0), ramp };
        *self.recovery.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
    }

    /// Ends recovery admission: every tenant is admitted.
    pub fn end_recovery(&self) {
        *self.recovery.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The share of tenants admitted now (1 when not recovering).
    pub fn admitted_fraction(&self) -> f64 {
        self.recovery.lock().unwrap_or_else(|p| p.into_inner()).map_or(1.0, |r| r.fraction(Instant::now()))
    }

    /// Probes every deployment whose breaker is open, every `every`, so one that came back
    /// gets its trial without waiting for user traffic to find out.
    pub fn spawn_health_probes(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let gw = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(gw) = gw.upgrade() else { return };
                let now = Instant::now();
                let open: Vec<Arc<Deployment>> = gw
                    .aliases
                    .values()
                    .flatten()
                    .filter(|d| d.lock().breaker.state(now) == BreakerState::Open)
                    .cloned()
                    .collect();
                for d in open {
                    let probe = tokio::time::timeout(every.max(Duration::from_secs(1)), d.provider.health()).await;
                    if matches!(probe, Ok(Ok(()))) {
                        tracing::info!(deployment = %d.name, "health probe answered; trial request next");
                        d.lock().breaker.probe_ok(Instant::now());
                    }
                }
            }
        })
    }

    /// Tenant quotas in the shared ledger, when there is one; `None`: decide here.
    async fn admit_shared(&self, ctx: &CallContext, tokens: f64) -> Option<Result<()>> {
        let ledger = self.ledger.get()?;
        let refused = |level: f64, per_second: f64, cost: f64| Error::Quota {
            reason: "the tenant's model quota is spent".into(),
            retry_after: Duration::from_secs_f64(((cost - level) / per_second.max(f64::MIN_POSITIVE)).clamp(1.0, 60.0)),
        };
        for (kind, limit, cost) in [("rpm", self.settings.tenant_rpm, 1.0), ("tpm", self.settings.tenant_tpm, tokens)] {
            let Some(per_minute) = limit else { continue };
            let (burst, per_second) = (f64::from(per_minute), f64::from(per_minute) / 60.0);
            let (admitted, level) =
                ledger.take(&format!("quota-{kind}:{}", ctx.tenant), cost, per_second, burst).await?;
            if !admitted {
                return Some(Err(refused(level, per_second, cost)));
            }
        }
        Some(Ok(()))
    }

    fn admit(&self, ctx: &CallContext, tokens: f64) -> Result<()> {
        let now = Instant::now();
        if let Some(r) = *self.recovery.lock().unwrap_or_else(|p| p.into_inner()) {
            let fraction = r.fraction(now);
            if tenant_point(&ctx.tenant) >= fraction {
                return Err(Error::Shed {
                    reason: format!("recovering: {:.0}% of tenants admitted so far", fraction * 100.0),
                    retry_after: Duration::from_secs(5),
                });
            }
        }
        let (rpm, tpm) = (self.settings.tenant_rpm, self.settings.tenant_tpm);
        if rpm.is_none() && tpm.is_none() || self.ledger.get().is_some() {
            return Ok(());
        }
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        let (r, t) = tenants.entry(ctx.tenant.clone()).or_insert_with(|| {
            (rpm.map(|n| TokenBucket::per_minute(n, now)), tpm.map(|n| TokenBucket::per_minute(n, now)))
        });
        let wait = r
            .as_mut()
            .map_or(Duration::ZERO, |b| b.wait_for(1.0, now))
            .max(t.as_mut().map_or(Duration::ZERO, |b| b.wait_for(tokens, now)));
        if !wait.is_zero() {
            return Err(Error::Quota { reason: "the tenant's model quota is spent".into(), retry_after: wait });
        }
        if let Some(b) = r.as_mut() {
            b.try_take(1.0, now);
        }
        if let Some(b) = t.as_mut() {
            b.try_take(tokens, now);
        }
        Ok(())
    }

    fn deployments(&self, alias: &str) -> Result<&[Arc<Deployment>]> {
        self.aliases.get(alias).map(Vec::as_slice).ok_or_else(|| Error::UnknownModel(alias.to_owned()))
    }

    /// Picks a deployment: room now in the first order group that has it, else the queue of
    /// a healthy deployment with the fewest waiters.
    fn choose(&self, deps: &[Arc<Deployment>], avoid: Option<&str>, tokens: f64) -> Result<Choice> {
        let now = Instant::now();
        let mut queue: Option<(usize, Duration, &Arc<Deployment>)> = None;
        let mut cooling: Option<Duration> = None;
        // Avoid the deployment that just failed while any other is healthy.
        let avoid = avoid.filter(|name| {
            deps.iter().any(|d| {
                d.name != *name && {
                    let mut st = d.lock();
                    d.healthy(&mut st, now)
                }
            })
        });
        let off = self.switched_off.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let mut order_groups: Vec<u32> = deps.iter().map(|d| d.order).collect();
        order_groups.dedup();
        for order in order_groups {
            let mut ready: Vec<&Arc<Deployment>> = Vec::new();
            for d in
                deps.iter().filter(|d| d.order == order && Some(d.name.as_str()) != avoid && !off.contains(&d.name))
            {
                let mut st = d.lock();
                if !d.healthy(&mut st, now) {
                    let until =
                        st.cooling_until.map(|t| t.saturating_duration_since(now)).unwrap_or(Duration::from_secs(1));
                    cooling = Some(cooling.map_or(until, |c| c.min(until)));
                    continue;
                }
                if d.has_room(&mut st, tokens, now) {
                    ready.push(d);
                } else {
                    let recheck = Deployment::bucket_wait(&mut st, tokens, now).max(Duration::from_millis(5));
                    if queue.is_none_or(|(n, _, _)| st.waiters.len() < n) {
                        queue = Some((st.waiters.len(), recheck, d));
                    }
                }
            }
            let total: u32 = ready.iter().map(|d| d.weight).sum();
            let mut pick = if total > 0 { fastrand::u32(0..total) } else { 0 };
            for d in ready {
                if pick < d.weight {
                    let mut st = d.lock();
                    if d.has_room(&mut st, tokens, now) {
                        d.start(&mut st, tokens, now);
                        return Ok(Choice::Now(d.clone()));
                    }
                    break;
                }
                pick -= d.weight;
            }
        }
        match queue {
            Some((_, recheck, d)) => Ok(Choice::Wait(d.clone(), recheck)),
            None => Err(Error::Shed {
                reason: "every deployment of the model is unavailable".into(),
                retry_after: cooling.unwrap_or(Duration::from_secs(1)).max(Duration::from_secs(1)),
            }),
        }
    }

    /// A slot on some deployment of `deps`, waiting in a queue if needed.
    async fn acquire(
        &self,
        deps: &[Arc<Deployment>],
        ctx: &CallContext,
        avoid: Option<&str>,
        tokens: f64,
    ) -> Result<Permit> {
        let class = ctx.class.label();
        loop {
            let now = Instant::now();
            if now >= ctx.deadline {
                return Err(Error::Deadline("no deployment had room before the deadline".into()));
            }
            let (deployment, recheck) = match self.choose(deps, avoid, tokens)? {
                Choice::Now(d) => {
                    let needs = d.lock().ttft.unwrap_or(Duration::ZERO);
                    if ctx.deadline <= now + needs {
                        d.release(now);
                        return Err(Error::Deadline("too little time left to get an answer".into()));
                    }
                    return Ok(self.permit(d, ctx, tokens));
                }
                Choice::Wait(d, recheck) => (d, recheck),
            };
            let (tx, mut rx) = oneshot::channel();
            let seq = {
                let mut st = deployment.lock();
                st.seq += 1;
                let seq = st.seq;
                if st.waiters.len() >= deployment.limits.max_queue.max(1) {
                    // Full: shed the least important, latest-deadline waiter, unless that is us.
                    let worst = (0..st.waiters.len())
                        .min_by_key(|i| (st.waiters[*i].class, std::cmp::Reverse(st.waiters[*i].deadline)));
                    match worst {
                        Some(i) if st.waiters[i].class < ctx.class => {
                            let w = st.waiters.swap_remove(i);
                            self.metrics.shed(&deployment.name, w.class.label());
                            let _ = w.tx.send(Grant::Shed);
                        }
                        _ => {
                            drop(st);
                            self.metrics.shed(&deployment.name, class);
                            return Err(Error::Shed {
                                reason: "the model's queue is full".into(),
                                retry_after: Duration::from_secs(1),
                            });
                        }
                    }
                }
                st.waiters.push(Waiter { class: ctx.class, deadline: ctx.deadline, seq, tx });
                seq
            };
            let wake = (Instant::now() + recheck).min(ctx.deadline);
            let granted = tokio::time::timeout_at(wake.into(), &mut rx).await;
            let grant = match granted {
                Ok(Ok(g)) => Some(g),
                Ok(Err(_)) => None,
                Err(_) => {
                    // Timed out: leave the queue, unless a grant raced the timer.
                    let mut st = deployment.lock();
                    st.waiters.retain(|w| w.seq != seq);
                    drop(st);
                    rx.try_recv().ok()
                }
            };
            match grant {
                Some(Grant::Go) => return Ok(self.permit(deployment, ctx, tokens)),
                Some(Grant::Shed) => {
                    return Err(Error::Shed {
                        reason: "shed for more important requests".into(),
                        retry_after: Duration::from_secs(1),
                    });
                }
                Some(Grant::Expired) => {
                    self.metrics.shed(&deployment.name, class);
                    return Err(Error::Deadline("dropped in the queue: the deadline could not be met".into()));
                }
                None => continue,
            }
        }
    }

    fn permit(&self, deployment: Arc<Deployment>, ctx: &CallContext, tokens: f64) -> Permit {
        let span = tracing::info_span!(
            "model.call",
            deployment = %deployment.name,
            class = ctx.class.label(),
            ttft_ms = tracing::field::Empty,
            prompt_tokens = tracing::field::Empty,
            completion_tokens = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        Permit {
            span,
            deployment,
            class: ctx.class,
            started: Instant::now(),
            metrics: self.metrics.clone(),
            estimate: tokens,
            done: false,
        }
    }

    fn may_retry(&self) -> bool {
        self.retry_budget.lock().unwrap_or_else(|p| p.into_inner()).try_take(1.0, Instant::now())
    }

    /// Runs `call` on deployments of `alias` until one answers, within the deadline.
    async fn dispatch<T, F, Fut>(&self, alias: &str, ctx: &CallContext, tokens: f64, mut call: F) -> Result<(T, Permit)>
    where
        F: FnMut(Arc<dyn Provider>, String) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let deps = self.deployments(alias)?;
        self.admit(ctx, tokens)?;
        if let Some(shared) = self.admit_shared(ctx, tokens).await {
            shared?;
        }
        self.retry_budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .deposit(self.settings.retry.budget_ratio, Instant::now());
        let retry = &self.settings.retry;
        let mut failed: Option<String> = None;
        let mut last: Option<Error> = None;
        for attempt in 0..retry.max_attempts.max(1) {
            let mut permit = match self.acquire(deps, ctx, failed.as_deref(), tokens).await {
                Ok(p) => p,
                Err(e) => return Err(last.filter(|_| matches!(e, Error::Shed { .. })).unwrap_or(e)),
            };
            let d = permit.deployment.clone();
            let own = Instant::now() + d.limits.attempt_timeout;
            let attempt_call =
                tracing::Instrument::instrument(call(d.provider.clone(), d.model.clone()), permit.span.clone());
            let err = match tokio::time::timeout_at(own.min(ctx.deadline).into(), attempt_call).await {
                Ok(Ok(value)) => return Ok((value, permit)),
                Ok(Err(e)) => e,
                Err(_) if ctx.deadline < own => Error::Deadline(format!("the request's, before {} answered", d.name)),
                Err(_) => Error::Upstream {
                    upstream: d.name.clone(),
                    status: None,
                    message: "no answer before the attempt timeout".into(),
                },
            };
            permit.fail(&err);
            drop(permit);
            tracing::warn!(deployment = %d.name, attempt, kind = err.kind(), "model call failed");
            if !err.retryable() || attempt + 1 >= retry.max_attempts {
                return Err(err);
            }
            // Another deployment at once, free; the same one after a jittered backoff, paid
            // from the retry budget so a sick upstream is not hammered.
            let alone = deps.iter().filter(|x| x.name != d.name).all(|x| {
                let mut st = x.lock();
                !x.healthy(&mut st, Instant::now())
            });
            if alone {
                if !self.may_retry() {
                    return Err(err);
                }
                let cap = retry.backoff.saturating_mul(1 << attempt.min(16)).min(retry.max_backoff);
                let mut pause = cap.mul_f64(fastrand::f64());
                if let Some(after) = err.retry_after() {
                    pause = pause.max(after);
                }
                if Instant::now() + pause >= ctx.deadline {
                    return Err(err);
                }
                tokio::time::sleep(pause).await;
            }
            failed = Some(d.name.clone());
            last = Some(err);
        }
        Err(last.unwrap_or_else(|| Error::Deadline("no attempt was made".into())))
    }

    /// Chat, streamed. The stream's first event has arrived when this returns, so failures
    /// before the first token were retried; a failure later ends the stream with an error.
    pub async fn chat(&self, req: ChatRequest, ctx: CallContext) -> Result<EventStream> {
        let span = tracing::info_span!("gateway.chat", alias = %req.model, class = ctx.class.label());
        tracing::Instrument::instrument(self.chat_in_span(req, ctx), span).await
    }

    async fn chat_in_span(&self, req: ChatRequest, ctx: CallContext) -> Result<EventStream> {
        let prompt: usize = req.messages.iter().map(|m| m.content_text().len() + 8).sum();
        let tokens = (prompt / 4) as f64 + f64::from(req.max_tokens.unwrap_or(512));
        let (stream, permit) = self
            .dispatch(&req.model.clone(), &ctx, tokens, |provider, model| {
                let mut r = req.clone();
                r.model = model;
                async move { first_event(provider.chat(r).await?).await }
            })
            .await?;
        Ok(self.watch(stream, permit))
    }

    /// Completion (fill-in-the-middle with a suffix), streamed like [`Gateway::chat`].
    pub async fn complete(&self, req: CompletionRequest, ctx: CallContext) -> Result<EventStream> {
        let span = tracing::info_span!("gateway.complete", alias = %req.model, class = ctx.class.label());
        tracing::Instrument::instrument(self.complete_in_span(req, ctx), span).await
    }

    async fn complete_in_span(&self, req: CompletionRequest, ctx: CallContext) -> Result<EventStream> {
        let prompt = req.prompt.text().len() + req.suffix.as_ref().map_or(0, String::len);
        let tokens = (prompt / 4) as f64 + f64::from(req.max_tokens.unwrap_or(16));
        let (stream, permit) = self
            .dispatch(&req.model.clone(), &ctx, tokens, |provider, model| {
                let mut r = req.clone();
                r.model = model;
                async move { first_event(provider.complete(r).await?).await }
            })
            .await?;
        Ok(self.watch(stream, permit))
    }

    /// Embeddings.
    pub async fn embed(&self, req: EmbeddingsRequest, ctx: CallContext) -> Result<EmbeddingsResponse> {
        let span = tracing::info_span!("gateway.embed", alias = %req.model, class = ctx.class.label());
        tracing::Instrument::instrument(self.embed_in_span(req, ctx), span).await
    }

    async fn embed_in_span(&self, req: EmbeddingsRequest, ctx: CallContext) -> Result<EmbeddingsResponse> {
        let tokens = (req.input.texts().iter().map(|t| t.len()).sum::<usize>() / 4) as f64;
        let alias = req.model.clone();
        let (mut resp, mut permit) = self
            .dispatch(&alias, &ctx, tokens, |provider, model| {
                let mut r = req.clone();
                r.model = model;
                async move { provider.embed(r).await }
            })
            .await?;
        permit.first_token();
        permit.succeed(Some((resp.usage.prompt_tokens, 0)));
        resp.model = alias;
        Ok(resp)
    }

    /// Passes a started stream through, timing it, bounding silences, and giving the verdict
    /// to the deployment when it ends.
    fn watch(&self, stream: EventStream, permit: Permit) -> EventStream {
        permit.first_token();
        let stall = permit.deployment.limits.attempt_timeout;
        let name = permit.deployment.name.clone();
        futures::stream::unfold(Some((stream, permit, None::<(u32, u32)>)), move |state| {
            let name = name.clone();
            async move {
                let (mut stream, mut permit, mut usage) = state?;
                match tokio::time::timeout(stall, stream.next()).await {
                    Ok(Some(Ok(event))) => {
                        if let Event::Usage(u) = &event {
                            usage = Some((u.prompt_tokens, u.completion_tokens));
                        }
                        Some((Ok(event), Some((stream, permit, usage))))
                    }
                    Ok(Some(Err(e))) => {
                        permit.fail(&e);
                        Some((Err(e), None))
                    }
                    Ok(None) => {
                        permit.succeed(usage);
                        None
                    }
                    Err(_) => {
                        let e = Error::Upstream { upstream: name, status: None, message: "the stream stalled".into() };
                        permit.fail(&e);
                        Some((Err(e), None))
                    }
                }
            }
        })
        .boxed()
    }
}

/// Waits for a stream's first event: an error there fails the attempt (and can be retried);
/// otherwise the event is put back in front.
async fn first_event(mut stream: EventStream) -> Result<EventStream> {
    match stream.next().await {
        Some(Err(e)) => Err(e),
        Some(Ok(first)) => Ok(futures::stream::once(async move { Ok(first) }).chain(stream).boxed()),
        None => Ok(futures::stream::empty().boxed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider that is never called.
    struct Idle;

    #[async_trait::async_trait]
    impl Provider for Idle {
        fn describe(&self) -> String {
            "idle".into()
        }
        async fn health(&self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_recovered_deployment_ramps_its_concurrency_up() {
        let limits = DeploymentLimits {
            max_concurrency: 10,
            slow_start: Duration::from_secs(10),
            breaker_threshold: 1,
            ..DeploymentLimits::default()
        };
        let d = Deployment::new("d", Arc::new(Idle), "m", 0, 1, limits);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut st = d.lock();
        assert_eq!(d.limit(&st, t0), 10, "never failed: full concurrency");
        st.breaker.failure(t0);
        st.breaker.probe_ok(t0 + s(1));
        st.breaker.success(t0 + s(1));
        assert_eq!(d.limit(&st, t0 + s(1)), 1, "just recovered: one at a time");
        assert_eq!(d.limit(&st, t0 + s(6)), 5);
        assert_eq!(d.limit(&st, t0 + s(11)), 10);
    }

    #[test]
    fn recovery_admits_a_widening_stable_share_of_tenants() {
        let t0 = Instant::now();
        let r = Recovery { started: t0, from: 0.25, ramp: Duration::from_secs(100) };
        assert!((r.fraction(t0) - 0.25).abs() < 1e-9);
        assert!((r.fraction(t0 + Duration::from_secs(50)) - 0.625).abs() < 1e-9);
        assert_eq!(r.fraction(t0 + Duration::from_secs(500)), 1.0);
        let tenants: Vec<String> = (0..2000).map(|i| format!("tenant-{i}")).collect();
        let admitted = tenants.iter().filter(|t| tenant_point(t) < 0.25).count();
        assert!((400..600).contains(&admitted), "{admitted} of 2000 at 25%");
        assert_eq!(tenant_point("acme"), tenant_point("acme"));
    }
}
