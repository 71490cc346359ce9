//! This replica among the others on one database: it announces itself (a heartbeat with the
//! address the others reach it at), reloads the feature flags, and settles its rate-limit
//! takings into the shared buckets, every moment; and it hands a request for something living
//! in another replica's memory (an agent session, an episode) to that replica.
//!
//! Why routing and not shared state for those two: an agent session is a running loop with a
//! sandboxed workspace on one machine's disk, and an episode is a worker's model call waiting
//! in one process for the policy's answer; neither can be moved into a database without
//! moving the process. So each is placed (a row: kind, id, replica), and whichever replica a
//! plain round-robin load balancer picks sends the request on, once (a hop carries the
//! cluster's secret and is never sent on again). Everything else (sync, search, runs, their
//! events) is in the database and the object store, and any replica answers it.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use caret_index::Db;
use caret_index::cluster::{Replica, Spent};
use caret_index::flags::Flags;

use crate::limit::{Decision, Limiter};
use crate::{Error, Result};

/// The header a replica sends a request on with: the cluster's secret.
pub const HOP_HEADER: &str = "x-caret-hop";

/// A replica not heard from for this long is taken for gone.
const ALIVE_MS: i64 = 15_000;

/// How often a replica beats, reloads flags and settles limits.
pub const TICK: Duration = Duration::from_millis(500);

/// Heartbeats are written every this many ticks.
const BEAT_EVERY: u32 = 6;

/// This replica.
pub struct Cluster {
    me: Replica,
    secret: String,
    db: Db,
    http: reqwest::Client,
    flags: RwLock<Arc<Flags>>,
    /// Live replicas at the last heartbeat (this one included).
    live: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("me", &self.me).finish_non_exhaustive()
    }
}

impl Cluster {
    /// Joins the replicas on `db`, reachable at `url`.
    pub async fn join(db: Db, url: String) -> Result<Cluster> {
        let id = caret_crypto::random_id().map_err(|source| Error::Key { what: "making a replica id", source })?;
        let me = Replica { id, url };
        let secret = db.cluster_secret().await?;
        db.heartbeat(&me).await?;
        let flags = db.flags().await?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .build()
            .map_err(|e| Error::Internal(format!("making the replicas' HTTP client: {e}")))?;
        tracing::info!(replica = %me.id, url = %me.url, "joined the replicas on the database");
        let live = db.replicas(ALIVE_MS).await?.len().max(1);
        Ok(Cluster { me, secret, db, http, flags: RwLock::new(Arc::new(flags)), live: live.into() })
    }

    /// This replica.
    pub fn me(&self) -> &Replica {
        &self.me
    }

    /// The flags as last loaded.
    pub fn flags(&self) -> Arc<Flags> {
        self.flags.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Whether a request came from another replica (it bears the cluster's secret).
    pub fn is_hop(&self, headers: &HeaderMap) -> bool {
        headers.get(HOP_HEADER).is_some_and(|v| self.is_secret(v.to_str().unwrap_or_default()))
    }

    /// Whether `token` is the cluster's secret (a replica sending a worker's model call on).
    pub fn is_secret(&self, token: &str) -> bool {
        constant_time_eq(token.as_bytes(), self.secret.as_bytes())
    }

    /// One tick: flags reloaded, limits settled, and every [`BEAT_EVERY`] ticks a heartbeat.
    pub async fn tick(&self, n: u32, limiters: &[(&str, &Limiter)]) -> Result<()> {
        if n.is_multiple_of(BEAT_EVERY) {
            self.db.heartbeat(&self.me).await?;
            let live = self.db.replicas(ALIVE_MS).await?.len().max(1);
            self.live.store(live, std::sync::atomic::Ordering::Relaxed);
        }
        let flags = self.db.flags().await?;
        *self.flags.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(flags);
        for (scope, limiter) in limiters {
            let now = Instant::now();
            let taken = limiter.take_spent(now);
            if taken.is_empty() {
                continue;
            }
            let limit = limiter.limit();
            let spent: Vec<Spent> = taken
                .iter()
                .map(|(key, tokens)| Spent {
                    key: format!("{scope}:{key}"),
                    tokens: *tokens,
                    per_second: limit.per_second,
                    burst: f64::from(limit.burst.max(1)),
                })
                .collect();
            let levels = self.db.settle(&spent).await?;
            for ((key, _), level) in taken.iter().zip(levels) {
                limiter.settle(key, level, now);
            }
        }
        Ok(())
    }

    /// Live replicas (at the last heartbeat).
    pub fn live(&self) -> usize {
        self.live.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Admits a request of `key` under `limiter` (`scope` names the limiter in the shared
    /// buckets) or says how many seconds to wait. A database that fails here lets the request
    /// through: this replica's own view decided the rest.
    pub async fn admit(&self, limiter: &Limiter, scope: &str, key: &str) -> std::result::Result<(), u64> {
        let now = Instant::now();
        match limiter.decide(key, now, self.live()) {
            Decision::Admit => Ok(()),
            Decision::Refuse(wait) => Err(wait),
            Decision::Shared { cost } => {
                let l = limiter.limit();
                let shared = format!("{scope}:{key}");
                match self.db.take(&shared, cost, l.per_second, f64::from(l.burst.max(1))).await {
                    Ok(taken) => limiter.took(key, cost, taken.level, taken.admitted, now),
                    Err(e) => {
                        tracing::warn!(error = %crate::error::chain(&e), "the shared rate limit is unreachable");
                        limiter.unasked(key, cost);
                        Ok(())
                    }
                }
            }
        }
    }

    /// Leaves: the others stop sending requests here.
    pub async fn leave(&self) {
        if let Err(e) = self.db.leave(&self.me.id).await {
            tracing::warn!(error = %crate::error::chain(&e), "leaving the replicas");
        }
    }

    /// Records that `kind`/`id` lives here.
    pub async fn place(&self, kind: &str, id: &str) -> Result<()> {
        Ok(self.db.place(kind, id, &self.me.id).await?)
    }

    /// The other replica `kind`/`id` lives on, if it lives on a live one.
    pub async fn elsewhere(&self, kind: &str, id: &str) -> Result<Option<Replica>> {
        Ok(self.db.placement(kind, id, ALIVE_MS).await?.filter(|r| r.id != self.me.id))
    }

    /// Sends `req` on to `to` and streams its answer back.
    pub async fn forward(&self, to: &Replica, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let url = format!("{}{path}", to.url.trim_end_matches('/'));
        let mut headers = parts.headers;
        for hop_by_hop in ["host", "connection", "keep-alive", "transfer-encoding", "te", "upgrade"] {
            headers.remove(hop_by_hop);
        }
        let Ok(secret) = HeaderValue::from_str(&self.secret) else {
            return Error::Internal("the cluster secret is not a header value".into()).into_response();
        };
        headers.insert(HOP_HEADER, secret);
        if let Some(parent) = caret_trace::traceparent().and_then(|p| HeaderValue::from_str(&p).ok()) {
            headers.insert(caret_trace::TRACEPARENT, parent);
        }
        let sent = self
            .http
            .request(parts.method, &url)
            .headers(headers)
            .body(reqwest::Body::wrap_stream(body.into_data_stream()))
            .send()
            .await;
        match sent {
            Ok(answer) => {
                let mut response = Response::builder().status(answer.status());
                if let Some(h) = response.headers_mut() {
                    for (name, value) in answer.headers() {
                        if !matches!(name.as_str(), "connection" | "keep-alive" | "transfer-encoding") {
                            h.append(name.clone(), value.clone());
                        }
                    }
                }
                response
                    .body(Body::from_stream(answer.bytes_stream()))
                    .unwrap_or_else(|e| Error::Internal(format!("relaying an answer: {e}")).into_response())
            }
            Err(e) => {
                tracing::warn!(replica = %to.id, error = %e, "the replica holding the request's session did not answer");
                Error::Unavailable("the server holding this session is not answering; retry".into()).into_response()
            }
        }
    }
}

/// Episodes live in one replica's memory: placed there, found from the others.
#[async_trait::async_trait]
impl caret_anyrun::runs::Placement for Cluster {
    async fn place(&self, episode: &str) -> std::result::Result<(), String> {
        Cluster::place(self, "episode", episode).await.map_err(|e| crate::error::chain(&e))
    }

    async fn locate(&self, episode: &str) -> Option<(String, String)> {
        match self.elsewhere("episode", episode).await {
            Ok(found) => found.map(|r| (r.url, self.secret.clone())),
            Err(e) => {
                tracing::warn!(error = %crate::error::chain(&e), "looking up where an episode lives");
                None
            }
        }
    }
}

/// Tenants' model quotas, shared by every replica's gateway through the same buckets as the
/// rate limits.
#[async_trait::async_trait]
impl caret_models::QuotaLedger for Cluster {
    async fn take(&self, key: &str, cost: f64, per_second: f64, burst: f64) -> Option<(bool, f64)> {
        match self.db.take(key, cost, per_second, burst).await {
            Ok(t) => Some((t.admitted, t.level)),
            Err(e) => {
                tracing::warn!(error = %crate::error::chain(&e), "the shared model quota is unreachable");
                None
            }
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What a path names that may live in one replica's memory: `(kind, id)`.
pub fn resident(path: &str) -> Option<(&'static str, String)> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["v1", "agent", "sessions", id, ..] => Some(("session", (*id).to_owned())),
        ["v1", "envs", id, ..] => Some(("episode", (*id).to_owned())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_what_lives_in_a_replica() {
        assert_eq!(resident("/v1/agent/sessions/s1/events"), Some(("session", "s1".to_owned())));
        assert_eq!(resident("/v1/agent/sessions/s1/ops"), Some(("session", "s1".to_owned())));
        assert_eq!(resident("/v1/envs/env-12/step"), Some(("episode", "env-12".to_owned())));
        assert_eq!(resident("/v1/envs/env-12"), Some(("episode", "env-12".to_owned())));
        assert_eq!(resident("/v1/workers/runs/run-12/7/v1/chat/completions"), None, "sent on by the run service");
        assert_eq!(resident("/v1/agent/sessions"), None);
        assert_eq!(resident("/v1/envs"), None);
        assert_eq!(resident("/v1/runs/run-12/events"), None, "runs live in the database");
        assert!(
            constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd") && !constant_time_eq(b"a", b"ab")
        );
    }
}
