//! Replicas of one service on one metadata database: who is alive and at which address
//! (a heartbeat row each), what lives in one replica's memory (an agent session, an episode:
//! a placement names its replica, so any other can send requests for it there), the
//! rate-limit buckets every replica settles into (so a tenant's limit holds across them), and
//! the secret a replica shows when it hands a request to another. Rows hold ids, addresses
//! and counters only: never code, paths or tokens.

use sqlx::Row as _;

use crate::db::{Db, now};
use crate::{Error, Result};

/// A live replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    /// Its id (random, new at each start).
    pub id: String,
    /// Where other replicas reach it (`http://10.0.0.7:8080`).
    pub url: String,
}

/// One key's settlement: what this replica took from the bucket since it last settled.
#[derive(Debug, Clone, PartialEq)]
pub struct Spent {
    /// The bucket (`token:…`, `ip:…`, `tenant-rpm:…`).
    pub key: String,
    /// Tokens taken.
    pub tokens: f64,
    /// Refill per second.
    pub per_second: f64,
    /// Most tokens the bucket holds.
    pub burst: f64,
}

const MICRO: f64 = 1e6;

fn ms_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What taking from a shared bucket found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Taken {
    /// The bucket's level after the taking.
    pub level: f64,
    /// Whether the last of the tokens asked for was there (the others were taken anyway:
    /// they were admitted already).
    pub admitted: bool,
}

impl Db {
    /// Takes `cost` tokens from the shared bucket `key` (refilled for the time since it was
    /// last touched): all of them when it holds them, else all but the last one, which is
    /// this request's (refused) — the others were admitted by the caller already.
    pub async fn take(&self, key: &str, cost: f64, per_second: f64, burst: f64) -> Result<Taken> {
        let t = ms_now();
        let burst = (burst * MICRO) as i64;
        let cost = (cost * MICRO) as i64;
        let mut tx = self.pool.begin().await?;
        // A new bucket starts full (a concurrent creation waits for the first, then finds it).
        sqlx::query(
            "INSERT INTO rate_buckets (key, micro_tokens, updated_ms) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING",
        )
        .bind(key)
        .bind(burst)
        .bind(t)
        .execute(&mut *tx)
        .await?;
        let lock = if self.dialect == caret_db::Dialect::Postgres { " FOR UPDATE" } else { "" };
        let row = sqlx::query(&format!("SELECT micro_tokens, updated_ms FROM rate_buckets WHERE key = $1{lock}"))
            .bind(key)
            .fetch_one(&mut *tx)
            .await?;
        let (before, last): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
        let refilled = (before + ((t - last).max(0) as f64 * per_second * MICRO / 1000.0) as i64).min(burst);
        let admitted = refilled >= cost;
        let level = if admitted { refilled - cost } else { (refilled - (cost - MICRO as i64)).max(-burst) };
        sqlx::query("UPDATE rate_buckets SET micro_tokens = $1, updated_ms = $2 WHERE key = $3")
            .bind(level)
            .bind(t.max(last))
            .bind(key)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Taken { level: level as f64 / MICRO, admitted })
    }

    /// Records (or refreshes) a replica's heartbeat.
    pub async fn heartbeat(&self, replica: &Replica) -> Result<()> {
        let t = ms_now();
        let updated = sqlx::query("UPDATE replicas SET url = $1, seen_at = $2 WHERE id = $3")
            .bind(&replica.url)
            .bind(t)
            .bind(&replica.id)
            .execute(&self.pool)
            .await?;
        if updated.rows_affected() == 0 {
            sqlx::query("INSERT INTO replicas (id, url, started_at, seen_at) VALUES ($1, $2, $3, $3)")
                .bind(&replica.id)
                .bind(&replica.url)
                .bind(t)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    /// Removes a stopping replica and what was placed on it.
    pub async fn leave(&self, replica_id: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM placements WHERE replica_id = $1").bind(replica_id).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM replicas WHERE id = $1").bind(replica_id).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Replicas heard from within `alive_ms`, oldest first.
    pub async fn replicas(&self, alive_ms: i64) -> Result<Vec<Replica>> {
        Ok(sqlx::query("SELECT id, url FROM replicas WHERE seen_at >= $1 ORDER BY started_at, id")
            .bind(ms_now() - alive_ms)
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .map(|r| Replica { id: r.get(0), url: r.get(1) })
            .collect())
    }

    /// Records that `kind`/`id` lives on `replica_id`.
    pub async fn place(&self, kind: &str, id: &str, replica_id: &str) -> Result<()> {
        sqlx::query("INSERT INTO placements (kind, id, replica_id, created_at) VALUES ($1, $2, $3, $4)")
            .bind(kind)
            .bind(id)
            .bind(replica_id)
            .bind(now())
            .execute(&self.pool)
            .await
            .map_err(|e| match e {
                sqlx::Error::Database(d) if d.is_unique_violation() => Error::Conflict(format!("{kind} placed twice")),
                e => e.into(),
            })?;
        Ok(())
    }

    /// Forgets where `kind`/`id` lives.
    pub async fn unplace(&self, kind: &str, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM placements WHERE kind = $1 AND id = $2")
            .bind(kind)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The live replica `kind`/`id` lives on, if any.
    pub async fn placement(&self, kind: &str, id: &str, alive_ms: i64) -> Result<Option<Replica>> {
        Ok(sqlx::query(
            "SELECT r.id, r.url FROM placements p JOIN replicas r ON r.id = p.replica_id \
             WHERE p.kind = $1 AND p.id = $2 AND r.seen_at >= $3",
        )
        .bind(kind)
        .bind(id)
        .bind(ms_now() - alive_ms)
        .fetch_optional(&self.pool)
        .await?
        .map(|r| Replica { id: r.get(0), url: r.get(1) }))
    }

    /// The secret replicas show one another when one hands a request on (made by the first
    /// replica that asks; every later one reads it).
    pub async fn cluster_secret(&self) -> Result<String> {
        let read = || sqlx::query("SELECT secret FROM cluster_secret WHERE id = 1").fetch_optional(&self.pool);
        if let Some(row) = read().await? {
            return Ok(row.get(0));
        }
        let secret = caret_crypto::new_api_token()
            .map_err(|source| Error::Crypto { what: "making the cluster secret", source })?;
        let inserted = sqlx::query("INSERT INTO cluster_secret (id, secret) VALUES (1, $1)")
            .bind(&secret)
            .execute(&self.pool)
            .await;
        match inserted {
            Ok(_) => Ok(secret),
            // Another replica made it at the same moment: theirs stands.
            Err(sqlx::Error::Database(d)) if d.is_unique_violation() => {
                read().await?.map(|r| r.get(0)).ok_or_else(|| Error::Internal("the cluster secret vanished".into()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Settles what this replica took from shared buckets since it last settled: each bucket
    /// refills for the time since anyone settled it (up to its burst), loses what was taken
    /// (down to one burst in debt: replicas that took at once pay it back before taking more),
    /// and its level now comes back, in the order given.
    pub async fn settle(&self, spent: &[Spent]) -> Result<Vec<f64>> {
        let t = ms_now();
        let mut levels = Vec::with_capacity(spent.len());
        let mut tx = self.pool.begin().await?;
        for s in spent {
            let burst = (s.burst * MICRO) as i64;
            let taken = (s.tokens * MICRO) as i64;
            // Micro-tokens per millisecond.
            let rate = (s.per_second * MICRO / 1000.0) as i64;
            let level: i64 = sqlx::query(
                "INSERT INTO rate_buckets (key, micro_tokens, updated_ms) VALUES ($1, $2 - $3, $4) \
                 ON CONFLICT (key) DO UPDATE SET \
                 micro_tokens = CASE \
                   WHEN rate_buckets.micro_tokens + (CASE WHEN $4 > rate_buckets.updated_ms \
                        THEN $4 - rate_buckets.updated_ms ELSE 0 END) * $5 - $3 < 0 - $2 THEN 0 - $2 \
                   WHEN rate_buckets.micro_tokens + (CASE WHEN $4 > rate_buckets.updated_ms \
                        THEN $4 - rate_buckets.updated_ms ELSE 0 END) * $5 > $2 THEN $2 - $3 \
                   ELSE rate_buckets.micro_tokens + (CASE WHEN $4 > rate_buckets.updated_ms \
                        THEN $4 - rate_buckets.updated_ms ELSE 0 END) * $5 - $3 END, \
                 updated_ms = CASE WHEN $4 > rate_buckets.updated_ms THEN $4 ELSE rate_buckets.updated_ms END \
                 RETURNING micro_tokens",
            )
            .bind(&s.key)
            .bind(burst)
            .bind(taken)
            .bind(t)
            .bind(rate)
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
            levels.push(level as f64 / MICRO);
        }
        tx.commit().await?;
        Ok(levels)
    }
}
