//! The run queue in the metadata database (SQLite embedded, PostgreSQL for a team), through
//! sqlx's `Any` driver with `$N` placeholders and portable types.
//!
//! - **Leasing** picks, among queued runs, the highest class first (interactive before
//!   batch); within a class the tenant with the fewest runs running (fair share), then the
//!   oldest run. A tenant at its cap of running runs is skipped. On PostgreSQL the tenant's
//!   row is locked `FOR UPDATE SKIP LOCKED` while its running runs are counted, so concurrent
//!   workers cannot push a tenant past its cap, and a worker that finds a tenant locked moves
//!   on to the next instead of waiting.
//! - **Fencing.** Every lease increments the run's `lease_token`. Heartbeats, events, token
//!   accounting and completion carry the token and change nothing unless it is the run's
//!   current one while it runs: a worker that lost its lease (it stalled, the network
//!   parted) is refused, so a run is never completed twice or by two workers.
//! - **Expiry.** A running run whose lease was not renewed in time goes back to the queue
//!   (attempt + 1 at the next lease) until its attempts are used up, then fails with the
//!   reason. Nothing is lost: every state change is one transaction.
//!
//! Payloads (the run's spec, events, secrets) arrive here already sealed: this module stores
//! text it cannot read.

use caret_protocol::runs::{LeaseRequest, RunClass, RunState, SandboxUsage};
use sqlx::{AnyPool, Row as _};

use crate::{Error, Result};

/// Schema versions, applied in order, each once (own version table: the queue can share a
/// database with the server's tables).
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE anyrun_tenants (
        tenant_id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        max_running BIGINT NOT NULL
    );
    CREATE TABLE anyrun_runs (
        id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL,
        class_rank BIGINT NOT NULL,
        state TEXT NOT NULL,
        spec TEXT NOT NULL,
        model TEXT NOT NULL,
        attempt BIGINT NOT NULL,
        max_attempts BIGINT NOT NULL,
        lease_token BIGINT NOT NULL,
        worker TEXT,
        lease_expires_ms BIGINT,
        cancel_requested BIGINT NOT NULL,
        reason TEXT,
        created_ms BIGINT NOT NULL,
        started_ms BIGINT,
        finished_ms BIGINT,
        tokens_used BIGINT NOT NULL,
        events BIGINT NOT NULL,
        result_token BIGINT
    );
    CREATE INDEX anyrun_runs_queue ON anyrun_runs (state, class_rank, tenant_id, created_ms);
    CREATE INDEX anyrun_runs_tenant ON anyrun_runs (tenant_id, created_ms);
    CREATE TABLE anyrun_events (
        run_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        attempt BIGINT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE anyrun_secrets (
        tenant_id TEXT NOT NULL,
        name TEXT NOT NULL,
        sealed TEXT NOT NULL,
        updated_ms BIGINT NOT NULL,
        PRIMARY KEY (tenant_id, name)
    );
    CREATE TABLE anyrun_workers (
        name TEXT PRIMARY KEY,
        slots BIGINT NOT NULL,
        busy BIGINT NOT NULL,
        sandbox TEXT NOT NULL,
        last_seen_ms BIGINT NOT NULL
    )",
    ),
    (
        2,
        "ALTER TABLE anyrun_runs ADD COLUMN usage_processes BIGINT;
    ALTER TABLE anyrun_runs ADD COLUMN usage_memory_bytes BIGINT;
    ALTER TABLE anyrun_runs ADD COLUMN usage_cpu_ms BIGINT;
    ALTER TABLE anyrun_runs ADD COLUMN checkpoint_token BIGINT",
    ),
];

pub use caret_db::Dialect;

/// Row locks where the dialect has them.
fn skip_locked(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => "",
        Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
    }
}

/// A new run, as the queue stores it.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// Its id.
    pub id: String,
    /// The tenant.
    pub tenant_id: String,
    /// Its class.
    pub class: RunClass,
    /// The sealed spec.
    pub spec: String,
    /// The model alias (kept in clear for operators' views).
    pub model: String,
    /// The most attempts.
    pub max_attempts: u32,
}

/// A run's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRow {
    /// Its id.
    pub id: String,
    /// The tenant.
    pub tenant_id: String,
    /// Its class.
    pub class: RunClass,
    /// Where it is.
    pub state: RunState,
    /// The sealed spec.
    pub spec: String,
    /// The model alias.
    pub model: String,
    /// Attempts started.
    pub attempt: u32,
    /// The most attempts.
    pub max_attempts: u32,
    /// The current (or last) lease's fencing token.
    pub lease_token: u64,
    /// The worker holding it.
    pub worker: Option<String>,
    /// When the lease ends unless renewed (Unix ms).
    pub lease_expires_ms: Option<i64>,
    /// Cancel asked for.
    pub cancel_requested: bool,
    /// Why it failed or was cancelled.
    pub reason: Option<String>,
    /// Unix ms.
    pub created_ms: i64,
    /// Unix ms of the last attempt's start.
    pub started_ms: Option<i64>,
    /// Unix ms.
    pub finished_ms: Option<i64>,
    /// Model tokens used.
    pub tokens_used: u64,
    /// Events appended.
    pub events: u64,
    /// The lease token whose result is stored, if any.
    pub result_token: Option<u64>,
}

const COLUMNS: &str = "id, tenant_id, class_rank, state, spec, model, attempt, max_attempts, lease_token, worker, \
                       lease_expires_ms, cancel_requested, reason, created_ms, started_ms, finished_ms, tokens_used, \
                       events, result_token";

fn rank(class: RunClass) -> i64 {
    match class {
        RunClass::Interactive => 0,
        RunClass::Batch => 1,
    }
}

fn class_of(rank: i64) -> RunClass {
    if rank == 0 { RunClass::Interactive } else { RunClass::Batch }
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn row(r: &sqlx::any::AnyRow) -> Result<RunRow> {
    let state: String = r.try_get(3)?;
    Ok(RunRow {
        id: r.try_get(0)?,
        tenant_id: r.try_get(1)?,
        class: class_of(r.try_get(2)?),
        state: RunState::parse(&state).ok_or_else(|| Error::Internal(format!("unknown run state {state:?}")))?,
        spec: r.try_get(4)?,
        model: r.try_get(5)?,
        attempt: u32::try_from(r.try_get::<i64, _>(6)?).unwrap_or(0),
        max_attempts: u32::try_from(r.try_get::<i64, _>(7)?).unwrap_or(0),
        lease_token: u(r.try_get(8)?),
        worker: r.try_get(9)?,
        lease_expires_ms: r.try_get(10)?,
        cancel_requested: r.try_get::<i64, _>(11)? != 0,
        reason: r.try_get(12)?,
        created_ms: r.try_get(13)?,
        started_ms: r.try_get(14)?,
        finished_ms: r.try_get(15)?,
        tokens_used: u(r.try_get(16)?),
        events: u(r.try_get(17)?),
        result_token: r.try_get::<Option<i64>, _>(18)?.map(u),
    })
}

/// An insert's outcome, where a row inserted meanwhile by another process is as good as ours.
/// Appends sealed event bodies to a run inside `tx` (numbered after its last); with `token`,
/// only while that lease holds the run. Answers the last number.
async fn push_events(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: &str,
    token: Option<u64>,
    bodies: &[String],
) -> Result<u64> {
    let n = i64::try_from(bodies.len()).unwrap_or(i64::MAX);
    let r = match token {
        Some(token) => sqlx::query(
            "UPDATE anyrun_runs SET events = events + $1 WHERE id = $2 AND lease_token = $3 AND state = 'running' \
             RETURNING events, attempt",
        )
        .bind(n)
        .bind(id)
        .bind(i(token)),
        None => sqlx::query("UPDATE anyrun_runs SET events = events + $1 WHERE id = $2 RETURNING events, attempt")
            .bind(n)
            .bind(id),
    }
    .fetch_optional(&mut **tx)
    .await?;
    let Some(r) = r else { return Err(Error::Fenced(id.to_owned())) };
    let (last, attempt): (i64, i64) = (r.try_get(0)?, r.try_get(1)?);
    for (k, body) in bodies.iter().enumerate() {
        sqlx::query("INSERT INTO anyrun_events (run_id, seq, attempt, body) VALUES ($1, $2, $3, $4)")
            .bind(id)
            .bind(last - n + 1 + i64::try_from(k).unwrap_or(0))
            .bind(attempt)
            .bind(body)
            .execute(&mut **tx)
            .await?;
    }
    Ok(u(last))
}

fn unless_duplicate(inserted: std::result::Result<sqlx::any::AnyQueryResult, sqlx::Error>) -> Result<()> {
    match inserted {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(d)) if d.is_unique_violation() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A run a worker leased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    /// The run as it is now (running, this lease's token and attempt).
    pub run: RunRow,
}

/// What expiry did to a run whose worker went silent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// The run.
    pub id: String,
    /// The attempt that was lost.
    pub attempt: u32,
    /// Queued again, or ended (failed: attempts used up; cancelled: it was being cancelled).
    pub now: RunState,
}

/// One event row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    /// From 1.
    pub seq: u64,
    /// The attempt.
    pub attempt: u32,
    /// Sealed body.
    pub body: String,
}

/// The queue.
#[derive(Debug, Clone)]
pub struct Queue {
    pool: AnyPool,
    dialect: Dialect,
}

impl Queue {
    /// The queue on `pool`, its tables created or brought up to date.
    pub async fn open(pool: AnyPool, dialect: Dialect) -> Result<Queue> {
        let q = Queue { pool, dialect };
        q.migrate().await?;
        Ok(q)
    }

    /// The dialect.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    async fn migrate(&self) -> Result<()> {
        let schema = caret_db::Schema { table: "anyrun_schema", steps: MIGRATIONS };
        caret_db::migrate(&self.pool, self.dialect, schema).await?;
        Ok(())
    }

    /// Records a tenant (its name for operators' views, its cap of running runs), keeping a
    /// cap set before.
    pub async fn ensure_tenant(&self, tenant_id: &str, name: &str, max_running: u32) -> Result<()> {
        let r = sqlx::query("UPDATE anyrun_tenants SET name = $1 WHERE tenant_id = $2")
            .bind(name)
            .bind(tenant_id)
            .execute(&self.pool)
            .await?;
        if r.rows_affected() == 0 {
            let inserted = sqlx::query("INSERT INTO anyrun_tenants (tenant_id, name, max_running) VALUES ($1, $2, $3)")
                .bind(tenant_id)
                .bind(name)
                .bind(i64::from(max_running))
                .execute(&self.pool)
                .await;
            unless_duplicate(inserted)?;
        }
        Ok(())
    }

    /// A tenant's name.
    pub async fn tenant_name(&self, tenant_id: &str) -> Result<Option<String>> {
        Ok(sqlx::query("SELECT name FROM anyrun_tenants WHERE tenant_id = $1")
            .bind(tenant_id)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.try_get(0))
            .transpose()?)
    }

    /// Sets a tenant's cap of running runs.
    pub async fn set_tenant_cap(&self, tenant_id: &str, max_running: u32) -> Result<()> {
        sqlx::query("UPDATE anyrun_tenants SET max_running = $1 WHERE tenant_id = $2")
            .bind(i64::from(max_running))
            .bind(tenant_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Queues a run (its tenant must have been recorded).
    pub async fn insert(&self, run: &NewRun, now_ms: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO anyrun_runs (id, tenant_id, class_rank, state, spec, model, attempt, max_attempts, \
             lease_token, cancel_requested, created_ms, tokens_used, events) \
             VALUES ($1, $2, $3, 'queued', $4, $5, 0, $6, 0, 0, $7, 0, 0)",
        )
        .bind(&run.id)
        .bind(&run.tenant_id)
        .bind(rank(run.class))
        .bind(&run.spec)
        .bind(&run.model)
        .bind(i64::from(run.max_attempts.max(1)))
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A run of a tenant (another tenant's is `None`, like a missing one).
    pub async fn get(&self, tenant_id: &str, id: &str) -> Result<Option<RunRow>> {
        let r = sqlx::query(&format!("SELECT {COLUMNS} FROM anyrun_runs WHERE id = $1 AND tenant_id = $2"))
            .bind(id)
            .bind(tenant_id)
            .fetch_optional(&self.pool)
            .await?;
        r.as_ref().map(row).transpose()
    }

    /// A run, whoever's (for workers and operators).
    pub async fn get_any(&self, id: &str) -> Result<Option<RunRow>> {
        let r = sqlx::query(&format!("SELECT {COLUMNS} FROM anyrun_runs WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        r.as_ref().map(row).transpose()
    }

    /// A tenant's runs, newest first.
    pub async fn list(&self, tenant_id: &str, limit: u32) -> Result<Vec<RunRow>> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM anyrun_runs WHERE tenant_id = $1 ORDER BY created_ms DESC, id DESC LIMIT $2"
        ))
        .bind(tenant_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(row).collect()
    }

    /// Leases the next run to the worker asking for `ttl_ms`, or `None` when nothing can start
    /// now. The worker's slots and load are recorded in the same transaction.
    pub async fn lease(&self, worker: &LeaseRequest, now_ms: i64, ttl_ms: i64) -> Result<Option<Leased>> {
        let mut tx = self.pool.begin().await?;
        // A write first: on SQLite the transaction takes the write lock now, so two processes
        // cannot both read the queue and then collide on the update.
        sqlx::query(
            "INSERT INTO anyrun_workers (name, slots, busy, sandbox, last_seen_ms) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (name) DO UPDATE SET slots = excluded.slots, busy = excluded.busy, \
             sandbox = excluded.sandbox, last_seen_ms = excluded.last_seen_ms",
        )
        .bind(&worker.worker)
        .bind(i64::from(worker.slots))
        .bind(i64::from(worker.busy))
        .bind(&worker.sandbox)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
        // One statement finds every line that may start a run: the head of each (tenant, class)
        // line is one index probe, so the cost follows the number of tenants, not the depth of
        // the queue; tenants at their cap are left out. Sorted: class first, then the tenant
        // with fewest running, then the oldest head.
        let candidates: Vec<(i64, String)> = sqlx::query(&format!(
            "WITH busy AS (\
               SELECT tenant_id, COUNT(*) AS n FROM anyrun_runs WHERE state = 'running' GROUP BY tenant_id\
             ), heads AS (\
               SELECT t.tenant_id AS tenant_id, t.max_running AS cap, c.class_rank AS class_rank, \
                 (SELECT MIN(r.created_ms) FROM anyrun_runs r WHERE r.state = 'queued' \
                   AND r.class_rank = c.class_rank AND r.tenant_id = t.tenant_id) AS head \
               FROM anyrun_tenants t CROSS JOIN (SELECT {} AS class_rank UNION ALL SELECT {}) c\
             ) \
             SELECT h.class_rank, h.tenant_id FROM heads h LEFT JOIN busy b ON b.tenant_id = h.tenant_id \
             WHERE h.head IS NOT NULL AND COALESCE(b.n, 0) < h.cap \
             ORDER BY h.class_rank, COALESCE(b.n, 0), h.head, h.tenant_id",
            rank(RunClass::Interactive),
            rank(RunClass::Batch)
        ))
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_>>()?;
        for (class_rank, tenant) in candidates {
            if self.dialect == Dialect::Postgres {
                // Hold the tenant while counting its running runs; a tenant another worker
                // holds is passed over.
                let locked = sqlx::query(&format!(
                    "SELECT max_running FROM anyrun_tenants WHERE tenant_id = $1{}",
                    skip_locked(self.dialect)
                ))
                .bind(&tenant)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(locked) = locked else { continue };
                let cap: i64 = locked.try_get(0)?;
                let busy: i64 =
                    sqlx::query("SELECT COUNT(*) FROM anyrun_runs WHERE tenant_id = $1 AND state = 'running'")
                        .bind(&tenant)
                        .fetch_one(&mut *tx)
                        .await?
                        .try_get(0)?;
                if busy >= cap {
                    continue;
                }
            }
            let next = sqlx::query(&format!(
                "SELECT id FROM anyrun_runs WHERE state = 'queued' AND tenant_id = $1 AND class_rank = $2 \
                 ORDER BY created_ms, id LIMIT 1{}",
                skip_locked(self.dialect)
            ))
            .bind(&tenant)
            .bind(class_rank)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(next) = next else { continue };
            let id: String = next.try_get(0)?;
            let leased = sqlx::query(&format!(
                "UPDATE anyrun_runs SET state = 'running', attempt = attempt + 1, lease_token = lease_token + 1, \
                 usage_processes = NULL, usage_memory_bytes = NULL, usage_cpu_ms = NULL, worker = $1, lease_expires_ms = $2, started_ms = $3 WHERE id = $4 AND state = 'queued' \
                 RETURNING {COLUMNS}"
            ))
            .bind(&worker.worker)
            .bind(now_ms + ttl_ms)
            .bind(now_ms)
            .bind(&id)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(r) = leased {
                let run = row(&r)?;
                tx.commit().await?;
                return Ok(Some(Leased { run }));
            }
        }
        tx.commit().await?;
        Ok(None)
    }

    /// Renews a lease; answers whether a cancel was asked for. [`Error::Fenced`] when the
    /// token is not the run's current lease.
    pub async fn heartbeat(
        &self,
        id: &str,
        token: u64,
        usage: Option<SandboxUsage>,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let r = sqlx::query(
            "UPDATE anyrun_runs SET lease_expires_ms = $1, \
             usage_processes = COALESCE($2, usage_processes), usage_memory_bytes = COALESCE($3, usage_memory_bytes), \
             usage_cpu_ms = COALESCE($4, usage_cpu_ms) \
             WHERE id = $5 AND lease_token = $6 AND state = 'running' RETURNING cancel_requested, worker",
        )
        .bind(now_ms + ttl_ms)
        .bind(usage.map(|u| i64::from(u.processes)))
        .bind(usage.map(|u| i(u.memory_bytes)))
        .bind(usage.map(|u| i(u.cpu_ms)))
        .bind(id)
        .bind(i(token))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(r) = r else { return Err(Error::Fenced(id.to_owned())) };
        // A worker whose slots are all busy asks for no runs; its runs' heartbeats say it lives.
        if let Some(worker) = r.try_get::<Option<String>, _>(1)? {
            sqlx::query("UPDATE anyrun_workers SET last_seen_ms = $1 WHERE name = $2")
                .bind(now_ms)
                .bind(worker)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(r.try_get::<i64, _>(0)? != 0)
    }

    /// Records that the attempt holding `token` stored a checkpoint (under its token);
    /// [`Error::Fenced`] when it no longer holds the run.
    pub async fn checkpointed(&self, id: &str, token: u64) -> Result<()> {
        let r = sqlx::query(
            "UPDATE anyrun_runs SET checkpoint_token = $1 WHERE id = $2 AND lease_token = $1 AND state = 'running'",
        )
        .bind(i(token))
        .bind(id)
        .execute(&self.pool)
        .await?;
        if r.rows_affected() == 0 {
            return Err(Error::Fenced(id.to_owned()));
        }
        Ok(())
    }

    /// The lease token under which the run's last checkpoint was stored, if any.
    pub async fn checkpoint_token(&self, id: &str) -> Result<Option<u64>> {
        let r = sqlx::query("SELECT checkpoint_token FROM anyrun_runs WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match r {
            Some(r) => r.try_get::<Option<i64>, _>(0)?.map(u),
            None => None,
        })
    }

    /// Checks that `token` is the run's current lease (and returns the run).
    pub async fn check(&self, id: &str, token: u64) -> Result<RunRow> {
        match self.get_any(id).await? {
            Some(r) if r.state == RunState::Running && r.lease_token == token => Ok(r),
            _ => Err(Error::Fenced(id.to_owned())),
        }
    }

    /// Appends events of the current lease, numbered after the last.
    pub async fn append(&self, id: &str, token: u64, bodies: &[String]) -> Result<u64> {
        self.append_as(id, Some(token), bodies).await
    }

    /// Appends events on the queue's own behalf (no lease: expiry, cancel).
    pub async fn append_system(&self, id: &str, bodies: &[String]) -> Result<u64> {
        self.append_as(id, None, bodies).await
    }

    async fn append_as(&self, id: &str, token: Option<u64>, bodies: &[String]) -> Result<u64> {
        if bodies.is_empty() {
            return Ok(0);
        }
        let mut tx = self.pool.begin().await?;
        let last = push_events(&mut tx, id, token, bodies).await?;
        tx.commit().await?;
        Ok(last)
    }

    /// Events after `after`, at most `limit`.
    pub async fn events_after(&self, id: &str, after: u64, limit: u32) -> Result<Vec<EventRow>> {
        let rows = sqlx::query(
            "SELECT seq, attempt, body FROM anyrun_events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(id)
        .bind(i(after))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(EventRow {
                    seq: u(r.try_get(0)?),
                    attempt: u32::try_from(r.try_get::<i64, _>(1)?).unwrap_or(0),
                    body: r.try_get(2)?,
                })
            })
            .collect()
    }

    /// Adds model tokens to a run under its current lease; returns the total.
    pub async fn add_tokens(&self, id: &str, token: u64, tokens: u64) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE anyrun_runs SET tokens_used = tokens_used + $1 WHERE id = $2 AND lease_token = $3 \
             AND state = 'running' RETURNING tokens_used",
        )
        .bind(i(tokens))
        .bind(id)
        .bind(i(token))
        .fetch_optional(&self.pool)
        .await?;
        match r {
            Some(r) => Ok(u(r.try_get(0)?)),
            None => Err(Error::Fenced(id.to_owned())),
        }
    }

    /// Ends a run under its current lease (`result_token`: the lease whose result is stored).
    pub async fn finish(
        &self,
        id: &str,
        token: u64,
        state: RunState,
        reason: Option<&str>,
        result_token: Option<u64>,
        now_ms: i64,
    ) -> Result<()> {
        let r = sqlx::query(
            "UPDATE anyrun_runs SET state = $1, reason = $2, finished_ms = $3, worker = NULL, lease_expires_ms = NULL, \
             result_token = $4 WHERE id = $5 AND lease_token = $6 AND state = 'running'",
        )
        .bind(state.as_str())
        .bind(reason)
        .bind(now_ms)
        .bind(result_token.map(i))
        .bind(id)
        .bind(i(token))
        .execute(&self.pool)
        .await?;
        if r.rows_affected() == 0 {
            return Err(Error::Fenced(id.to_owned()));
        }
        Ok(())
    }

    /// Hands a run back under its current lease: queued again for another attempt, or failed
    /// when its attempts are used up (or cancelled when a cancel was asked for). Returns the
    /// state it is in now.
    pub async fn hand_back(
        &self,
        id: &str,
        token: u64,
        reason: &str,
        now_ms: i64,
        event: Option<String>,
    ) -> Result<RunState> {
        let mut tx = self.pool.begin().await?;
        let r = sqlx::query(
            "SELECT attempt, max_attempts, cancel_requested FROM anyrun_runs \
             WHERE id = $1 AND lease_token = $2 AND state = 'running'",
        )
        .bind(id)
        .bind(i(token))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(r) = r else { return Err(Error::Fenced(id.to_owned())) };
        let (attempt, max, cancel): (i64, i64, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        let (state, why) = if cancel != 0 {
            (RunState::Cancelled, "cancelled by the user".to_owned())
        } else if attempt >= max {
            (RunState::Failed, format!("{reason} (attempt {attempt} of {max}; no attempts left)"))
        } else {
            (RunState::Queued, reason.to_owned())
        };
        let finished = state.is_final().then_some(now_ms);
        sqlx::query(
            "UPDATE anyrun_runs SET state = $1, reason = $2, finished_ms = $3, worker = NULL, lease_expires_ms = NULL \
             WHERE id = $4 AND lease_token = $5",
        )
        .bind(state.as_str())
        .bind(&why)
        .bind(finished)
        .bind(id)
        .bind(i(token))
        .execute(&mut *tx)
        .await?;
        // The attempt's end is recorded with it: no event of a next attempt can come first.
        if let Some(body) = event {
            push_events(&mut tx, id, None, &[body]).await?;
        }
        tx.commit().await?;
        Ok(state)
    }

    /// Runs whose lease ran out by `now_ms`: each is handed back as its worker would have,
    /// with the event `lost` makes (from the run's id, tenant, attempt and the reason)
    /// recorded in the same transaction.
    pub async fn expire(
        &self,
        now_ms: i64,
        lost: impl Fn(&str, &str, u32, &str) -> Option<String>,
    ) -> Result<Vec<Expired>> {
        let rows = sqlx::query(
            "SELECT id, lease_token, attempt, tenant_id FROM anyrun_runs WHERE state = 'running' AND lease_expires_ms < $1",
        )
        .bind(now_ms)
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::new();
        const REASON: &str = "the worker stopped answering (lease expired)";
        for r in rows {
            let (id, token, attempt, tenant): (String, i64, i64, String) =
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?);
            let attempt = u32::try_from(attempt).unwrap_or(0);
            let event = lost(&id, &tenant, attempt, REASON);
            match self.hand_back(&id, u(token), REASON, now_ms, event).await {
                Ok(now) => out.push(Expired { id, attempt, now }),
                // Renewed or ended meanwhile.
                Err(Error::Fenced(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Asks for a run to stop: a queued run is cancelled at once; a running one is marked and
    /// its worker told at the next heartbeat. `None` for another tenant's or a missing run.
    pub async fn cancel(&self, tenant_id: &str, id: &str, now_ms: i64) -> Result<Option<RunState>> {
        let queued = sqlx::query(
            "UPDATE anyrun_runs SET state = 'cancelled', reason = 'cancelled by the user', finished_ms = $1, \
             cancel_requested = 1 WHERE id = $2 AND tenant_id = $3 AND state = 'queued'",
        )
        .bind(now_ms)
        .bind(id)
        .bind(tenant_id)
        .execute(&self.pool)
        .await?;
        if queued.rows_affected() > 0 {
            return Ok(Some(RunState::Cancelled));
        }
        sqlx::query(
            "UPDATE anyrun_runs SET cancel_requested = 1 WHERE id = $1 AND tenant_id = $2 AND state = 'running'",
        )
        .bind(id)
        .bind(tenant_id)
        .execute(&self.pool)
        .await?;
        Ok(self.get(tenant_id, id).await?.map(|r| r.state))
    }

    /// Deletes a run and its events.
    pub async fn delete(&self, id: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM anyrun_events WHERE run_id = $1").bind(id).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM anyrun_runs WHERE id = $1").bind(id).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Ended runs that finished before `before_ms` (for retention), at most `limit`.
    pub async fn ended_before(&self, before_ms: i64, limit: u32) -> Result<Vec<RunRow>> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM anyrun_runs WHERE state IN ('succeeded', 'failed', 'cancelled') \
             AND finished_ms < $1 ORDER BY finished_ms LIMIT $2"
        ))
        .bind(before_ms)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(row).collect()
    }

    /// Stores a sealed secret.
    pub async fn put_secret(&self, tenant_id: &str, name: &str, sealed: &str, now_ms: i64) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM anyrun_secrets WHERE tenant_id = $1 AND name = $2")
            .bind(tenant_id)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO anyrun_secrets (tenant_id, name, sealed, updated_ms) VALUES ($1, $2, $3, $4)")
            .bind(tenant_id)
            .bind(name)
            .bind(sealed)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// A sealed secret.
    pub async fn secret(&self, tenant_id: &str, name: &str) -> Result<Option<String>> {
        Ok(sqlx::query("SELECT sealed FROM anyrun_secrets WHERE tenant_id = $1 AND name = $2")
            .bind(tenant_id)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.try_get(0))
            .transpose()?)
    }

    /// A tenant's secret names.
    pub async fn secret_names(&self, tenant_id: &str) -> Result<Vec<String>> {
        let rows = sqlx::query("SELECT name FROM anyrun_secrets WHERE tenant_id = $1 ORDER BY name")
            .bind(tenant_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// Deletes a secret; whether it existed.
    pub async fn delete_secret(&self, tenant_id: &str, name: &str) -> Result<bool> {
        let r = sqlx::query("DELETE FROM anyrun_secrets WHERE tenant_id = $1 AND name = $2")
            .bind(tenant_id)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    /// Workers heard from since `since_ms`: (name, slots, sandbox, last seen). How many slots
    /// are busy is counted from the runs each holds, not from what it said at its last lease.
    pub async fn workers(&self, since_ms: i64) -> Result<Vec<(String, u32, String, i64)>> {
        let rows = sqlx::query(
            "SELECT name, slots, sandbox, last_seen_ms FROM anyrun_workers WHERE last_seen_ms >= $1 ORDER BY name",
        )
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((r.try_get(0)?, u32::try_from(r.try_get::<i64, _>(1)?).unwrap_or(0), r.try_get(2)?, r.try_get(3)?))
            })
            .collect()
    }

    /// Queued and running runs by class and tenant: (class, tenant name, queued, running).
    pub async fn depth(&self) -> Result<Vec<(RunClass, String, u64, u64)>> {
        let rows = sqlx::query(
            "SELECT r.class_rank, COALESCE(t.name, r.tenant_id), \
             SUM(CASE WHEN r.state = 'queued' THEN 1 ELSE 0 END), SUM(CASE WHEN r.state = 'running' THEN 1 ELSE 0 END) \
             FROM anyrun_runs r LEFT JOIN anyrun_tenants t ON t.tenant_id = r.tenant_id \
             WHERE r.state IN ('queued', 'running') GROUP BY r.class_rank, COALESCE(t.name, r.tenant_id) \
             ORDER BY 1, 2",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((class_of(r.try_get(0)?), r.try_get(1)?, u(r.try_get(2)?), u(r.try_get(3)?)))).collect()
    }

    /// Running runs with their tenants' names, oldest first.
    pub async fn running(&self) -> Result<Vec<(RunRow, String, Option<SandboxUsage>)>> {
        self.with_names("r.state = 'running' ORDER BY r.started_ms", 1000).await
    }

    /// The most recently ended runs with their tenants' names.
    pub async fn recent(&self, limit: u32) -> Result<Vec<(RunRow, String)>> {
        let rows = self
            .with_names("r.state IN ('succeeded', 'failed', 'cancelled') ORDER BY r.finished_ms DESC", limit)
            .await?;
        Ok(rows.into_iter().map(|(r, name, _)| (r, name)).collect())
    }

    async fn with_names(&self, filter: &str, limit: u32) -> Result<Vec<(RunRow, String, Option<SandboxUsage>)>> {
        let columns = COLUMNS.split(", ").map(|c| format!("r.{c}")).collect::<Vec<_>>().join(", ");
        let rows = sqlx::query(&format!(
            "SELECT {columns}, COALESCE(t.name, r.tenant_id), r.usage_processes, r.usage_memory_bytes, r.usage_cpu_ms \
             FROM anyrun_runs r LEFT JOIN anyrun_tenants t ON t.tenant_id = r.tenant_id WHERE {filter} LIMIT $1"
        ))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let processes: Option<i64> = r.try_get(20)?;
                let usage = match processes {
                    Some(p) => Some(SandboxUsage {
                        processes: u32::try_from(p).unwrap_or(0),
                        memory_bytes: u(r.try_get::<Option<i64>, _>(21)?.unwrap_or(0)),
                        cpu_ms: u(r.try_get::<Option<i64>, _>(22)?.unwrap_or(0)),
                    }),
                    None => None,
                };
                Ok((row(r)?, r.try_get(19)?, usage))
            })
            .collect()
    }
}
