//! The audit trail: who did what, when, from which address, and how it ended — never code,
//! queries or prompts. Records are numbered without gaps and each carries the SHA-256 of
//! its fields and of the record before, so [`Identity::verify_audit`] finds one altered,
//! deleted or inserted. A record is written before the answer it describes goes out.

use data_encoding::HEXLOWER;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use sqlx::Row as _;
use sqlx::any::AnyRow;

use crate::db::{Identity, now_ms};
use crate::error::{Error, Result};

/// What happened, as the caller describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The organisation (tenant id); `-` for the server's own (a sign-in that named none).
    pub tenant: String,
    /// Who: `user:ID`, `service:CREDENTIAL`, `operator`, or `anonymous`.
    pub actor: String,
    /// The client's address.
    pub address: String,
    /// What: `token.create`, `user.role`, `signin`, `run.submit`…
    pub action: String,
    /// On what: an id or a name of Caret's (a person, a token, a group, a source), never code.
    pub target: String,
    /// How it ended: `ok`, or `denied` / `failed` with a short reason.
    pub outcome: String,
}

/// A stored record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Its number (1, 2, …, no gaps).
    pub seq: i64,
    /// When, Unix ms.
    pub at_ms: i64,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
    /// The hash of the record before (64 zeros for the first).
    pub prev_hash: String,
    /// This record's hash.
    pub hash: String,
}

/// The hash before the first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The hash of a record: SHA-256 over its fields as a JSON array, after the previous hash.
pub fn hash_of(prev_hash: &str, seq: i64, at_ms: i64, e: &Event) -> String {
    let fields = serde_json::json!([seq, at_ms, e.tenant, e.actor, e.address, e.action, e.target, e.outcome]);
    let mut h = Sha256::new();
    h.update(prev_hash.as_bytes());
    h.update(b"\n");
    h.update(fields.to_string().as_bytes());
    HEXLOWER.encode(&h.finalize())
}

/// What a filter asks of the trail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this organisation's.
    pub tenant: Option<String>,
    /// Only from this time (Unix ms).
    pub since_ms: Option<i64>,
    /// Only this actor's (`user:ID`…).
    pub actor: Option<String>,
    /// Only after this record (paging).
    pub after_seq: Option<i64>,
    /// At most this many.
    pub limit: i64,
}

/// What a check of the whole chain found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verification {
    /// Records checked.
    pub records: i64,
    /// The last record's hash (the chain's head).
    pub head: String,
    /// Every break found: a missing number, a record whose hash is not its own, a record not
    /// chained to the one before.
    pub problems: Vec<String>,
}

const COLUMNS: &str = "seq, at_ms, tenant_id, actor, address, action, target, outcome, prev_hash, hash";

fn record_of(r: &AnyRow) -> Record {
    Record {
        seq: r.get(0),
        at_ms: r.get(1),
        event: Event {
            tenant: r.get(2),
            actor: r.get(3),
            address: r.get(4),
            action: r.get(5),
            target: r.get(6),
            outcome: r.get(7),
        },
        prev_hash: r.get(8),
        hash: r.get(9),
    }
}

/// Cuts a field to a sane length (the trail never holds bulk text).
fn short(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(300).collect()
}

impl Identity {
    /// Appends `event` at the chain's head. Writers on any replica race for the next number;
    /// the loser reads the new head and tries again.
    pub async fn audit(&self, event: Event) -> Result<Record> {
        let event = Event {
            tenant: short(&event.tenant),
            actor: short(&event.actor),
            address: short(&event.address),
            action: short(&event.action),
            target: short(&event.target),
            outcome: short(&event.outcome),
        };
        for _ in 0..64 {
            let head = sqlx::query("SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1")
                .fetch_optional(&self.pool)
                .await?
                .map(|r| (r.get::<i64, _>(0), r.get::<String, _>(1)));
            let (prev_seq, prev_hash) = head.unwrap_or((0, GENESIS.to_owned()));
            let (seq, at_ms) = (prev_seq + 1, now_ms());
            let hash = hash_of(&prev_hash, seq, at_ms, &event);
            let inserted = sqlx::query(
                "INSERT INTO audit_log (seq, tenant_id, at_ms, actor, address, action, target, outcome, prev_hash, hash) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(seq)
            .bind(&event.tenant)
            .bind(at_ms)
            .bind(&event.actor)
            .bind(&event.address)
            .bind(&event.action)
            .bind(&event.target)
            .bind(&event.outcome)
            .bind(&prev_hash)
            .bind(&hash)
            .execute(&self.pool)
            .await;
            match inserted {
                Ok(_) => return Ok(Record { seq, at_ms, event, prev_hash, hash }),
                Err(sqlx::Error::Database(d)) if d.is_unique_violation() => {
                    tokio::time::sleep(std::time::Duration::from_millis(u64::from(fastish_jitter()))).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Conflict("the audit trail is too busy to append to".into()))
    }

    /// Records matching `filter`, oldest first.
    pub async fn audit_records(&self, filter: &Filter) -> Result<Vec<Record>> {
        let mut sql = format!("SELECT {COLUMNS} FROM audit_log WHERE seq > $1 AND at_ms >= $2");
        let mut n = 2;
        let mut binds: Vec<&str> = Vec::new();
        if let Some(t) = &filter.tenant {
            n += 1;
            sql.push_str(&format!(" AND tenant_id = ${n}"));
            binds.push(t);
        }
        if let Some(a) = &filter.actor {
            n += 1;
            sql.push_str(&format!(" AND actor = ${n}"));
            binds.push(a);
        }
        sql.push_str(&format!(" ORDER BY seq LIMIT {}", filter.limit.clamp(1, 10_000)));
        let mut q = sqlx::query(&sql).bind(filter.after_seq.unwrap_or(0)).bind(filter.since_ms.unwrap_or(0));
        for b in binds {
            q = q.bind(b);
        }
        Ok(q.fetch_all(&self.pool).await?.iter().map(record_of).collect())
    }

    /// Checks the whole chain, in pages.
    pub async fn verify_audit(&self) -> Result<Verification> {
        let mut v = Verification { records: 0, head: GENESIS.to_owned(), problems: Vec::new() };
        let mut expected_seq = 1;
        loop {
            let page = sqlx::query(&format!("SELECT {COLUMNS} FROM audit_log WHERE seq >= $1 ORDER BY seq LIMIT 1000"))
                .bind(expected_seq)
                .fetch_all(&self.pool)
                .await?;
            let Some(last) = page.last().map(record_of) else { break };
            for r in page.iter().map(record_of) {
                if r.seq != expected_seq {
                    v.problems.push(format!("records {expected_seq} to {} are missing", r.seq - 1));
                }
                if r.prev_hash != v.head {
                    v.problems.push(format!("record {} is not chained to the record before it", r.seq));
                }
                if hash_of(&r.prev_hash, r.seq, r.at_ms, &r.event) != r.hash {
                    v.problems.push(format!("record {} was altered (its hash is not its own)", r.seq));
                }
                v.head = r.hash.clone();
                v.records += 1;
                expected_seq = r.seq + 1;
            }
            expected_seq = expected_seq.max(last.seq + 1);
        }
        Ok(v)
    }
}

/// A few milliseconds, different per call, so racing writers spread out.
fn fastish_jitter() -> u8 {
    use std::sync::atomic::{AtomicU8, Ordering};
    static N: AtomicU8 = AtomicU8::new(0);
    1 + N.fetch_add(7, Ordering::Relaxed) % 13
}
