//! What checking a request's credential costs on the server: `GET /v1/me` (authentication,
//! scope, a tiny JSON answer) against `GET /healthz` (no credential) through the real router
//! in-process, with a personal token of the identity store — first use (the database), then
//! from the replica's cache — and with a tenant token made before people existed.
//!
//! `cargo bench -p caret-server --bench credentials [-- N]` (default 20,000 requests a kind).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use caret_server::limit::RateLimit;
use tower::ServiceExt as _;

fn p(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

async fn time(app: &axum::Router, path: &str, token: Option<&str>, n: usize) -> Vec<Duration> {
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let mut req = Request::builder().uri(path);
        if let Some(token) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req.body(Body::empty()).unwrap();
        let start = Instant::now();
        let res = app.clone().oneshot(req).await.unwrap();
        t.push(start.elapsed());
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }
    t.sort();
    t
}

fn report(label: &str, t: &[Duration]) {
    println!("{label:<58} p50 {:>9.2?}  p99 {:>9.2?}  (n={})", p(t, 0.5), p(t, 0.99), t.len());
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let dir = caret_test_support::TempDir::new();
        let storage = caret_index::StorageConfig {
            database_url: format!("sqlite://{}/caret.db?mode=rwc", dir.path().display()),
            object_store: dir.path().join("objects").display().to_string(),
        };
        let service = Arc::new(caret_index::open(&storage).await.unwrap());
        let identity = Arc::new(caret_server::open_identity(&service).await.unwrap());
        let org = service.db().create_tenant("bench").await.unwrap();
        let legacy = service.db().create_token(&org, "t").await.unwrap();
        let new = caret_identity::people::NewUser {
            email: "ada@bench.example".into(),
            name: String::new(),
            role: caret_identity::Role::Owner,
            source: "bench".into(),
        };
        let ada = identity.create_user(&org.id, new).await.unwrap();
        let personal = caret_identity::tokens::NewCredential {
            holder: caret_identity::tokens::Holder::User(ada.id),
            kind: caret_identity::CredentialKind::Personal,
            name: "bench".into(),
            scopes: caret_identity::Scopes::ALL,
            expires_at: None,
        };
        let (token, _) = identity.create_credential(&org.id, personal).await.unwrap();
        let unlimited = RateLimit { per_second: 1e12, burst: u32::MAX };
        let config = caret_server::ServeConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            tls: None,
            allow_insecure_http: false,
            rate_limit: unlimited,
            ip_rate_limit: unlimited,
            body_limit: 1 << 16,
            gateway: None,
            agent: caret_server::sessions::AgentSettings::default(),
            runs: None,
            docs: None,
            pages: None,
            replicas: caret_server::Replicas::Join(None),
            usage: caret_usage::Recorder::off(),
            identity: Some(identity),
            sign_in: None,
        };
        let app = caret_server::app(service, &config);
        let started = Instant::now();
        time(&app, "/v1/me", Some(&token), 1).await;
        println!("{:<58} {:>9.2?}", "first use of a personal token (the database)", started.elapsed());
        let open = time(&app, "/healthz", None, n).await;
        let personal = time(&app, "/v1/me", Some(&token), n).await;
        let tenant = time(&app, "/v1/me", Some(&legacy), n).await;
        report("GET /healthz (no credential)", &open);
        report("GET /v1/me, personal token, cached", &personal);
        report("GET /v1/me, tenant token, cached", &tenant);
        let cost = p(&personal, 0.5).saturating_sub(p(&open, 0.5));
        println!("{:<58} {:>9.2?}  (target < 100µs)", "credential check + /v1/me over /healthz, p50", cost);
    });
}
