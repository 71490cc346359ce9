//! The server's routes in-process, through its own API (`caret_server::app` and
//! `tower::ServiceExt::oneshot`): no process, no socket. A real index service (SQLite and a
//! local object store in a temporary directory) behind the real router, with two tenants.
//! What needs a process — TLS, draining on shutdown, a server killed mid-write — is tested
//! from `crates/caret/tests/server.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use caret_server::limit::RateLimit;
use serde_json::{Value, json};
use tower::ServiceExt as _;

const ALICE_WS: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaa";
const BOB_WS: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbb";

struct Harness {
    app: axum::Router,
    alice: String,
    bob: String,
    _dir: caret_test_support::TempDir,
}

async fn harness(rate_limit: RateLimit) -> Harness {
    let dir = caret_test_support::TempDir::new();
    let storage = caret_index::StorageConfig {
        database_url: format!("sqlite://{}/caret.db?mode=rwc", dir.path().display()),
        object_store: dir.path().join("objects").display().to_string(),
    };
    let service = Arc::new(caret_index::open(&storage).await.unwrap());
    let db = service.db();
    let (a, b) = (db.create_tenant("alice").await.unwrap(), db.create_tenant("bob").await.unwrap());
    let (alice, bob) = (db.create_token(&a, "t").await.unwrap(), db.create_token(&b, "t").await.unwrap());
    let key = caret_protocol::CreateWorkspace { key_id: "k".repeat(16), sketch: Vec::new() };
    service.create_workspace(&a, ALICE_WS, &key).await.unwrap();
    service.create_workspace(&b, BOB_WS, &key).await.unwrap();
    let config = caret_server::ServeConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        tls: None,
        allow_insecure_http: false,
        rate_limit,
        ip_rate_limit: RateLimit { per_second: 1e9, burst: u32::MAX },
        body_limit: 1 << 16,
        gateway: None,
        agent: caret_server::sessions::AgentSettings::default(),
        runs: None,
        docs: None,
        pages: None,
        replicas: caret_server::Replicas::Join(None),
        usage: caret_usage::Recorder::off(),
        identity: None,
        sign_in: None,
    };
    Harness { app: caret_server::app(service, &config), alice, bob, _dir: dir }
}

fn unlimited() -> RateLimit {
    RateLimit { per_second: 1e9, burst: u32::MAX }
}

/// Sends a request: `(status, headers, body as JSON or as a string)`.
async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, axum::http::HeaderMap, Value) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    let resp = app.clone().oneshot(req.body(Body::from(body.unwrap_or("").to_owned())).unwrap()).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    let value =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, headers, value)
}

#[tokio::test]
async fn health_and_the_description_need_no_token_and_everything_else_does() {
    let h = harness(unlimited()).await;
    assert_eq!(call(&h.app, "GET", "/healthz", None, None).await.0, StatusCode::OK);
    let (status, _, doc) = call(&h.app, "GET", "/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    let (status, headers, body) = call(&h.app, "GET", "/v1/workspaces", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
    assert_eq!(body["error"]["code"], "unauthorized");
    let (status, _, _) = call(&h.app, "GET", "/v1/workspaces", Some("caret_not-a-token"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn another_tenants_workspace_answers_exactly_like_a_missing_one() {
    let h = harness(unlimited()).await;
    let (status, _, mine) = call(&h.app, "GET", &format!("/v1/workspaces/{ALICE_WS}"), Some(&h.alice), None).await;
    assert_eq!(status, StatusCode::OK, "{mine}");
    let theirs = call(&h.app, "GET", &format!("/v1/workspaces/{BOB_WS}"), Some(&h.alice), None).await;
    let missing = call(&h.app, "GET", "/v1/workspaces/cccccccccccccccccccccccccc", Some(&h.alice), None).await;
    assert_eq!(theirs.0, StatusCode::NOT_FOUND);
    assert_eq!((theirs.0, theirs.2), (missing.0, missing.2));
    // Bob still has his: nothing Alice did reached it.
    let (status, _, _) = call(&h.app, "GET", &format!("/v1/workspaces/{BOB_WS}"), Some(&h.bob), None).await;
    assert_eq!(status, StatusCode::OK);
    let (_, _, list) = call(&h.app, "GET", "/v1/workspaces", Some(&h.alice), None).await;
    assert!(!list.to_string().contains(BOB_WS), "{list}");
}

#[tokio::test]
async fn malformed_requests_get_a_json_4xx_that_says_why() {
    let h = harness(unlimited()).await;
    let tree = format!("/v1/workspaces/{ALICE_WS}/tree");
    let (status, _, body) = call(&h.app, "POST", &tree, Some(&h.alice), Some("{not json")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "bad_request");
    assert!(body["error"]["message"].as_str().unwrap().contains("malformed JSON"), "{body}");
    let (status, _, body) = call(&h.app, "POST", &tree, Some(&h.alice), Some(r#"{"dirs": 7}"#)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("bad_request")),
        "{body}"
    );
    let big = format!(r#"{{"dirs": ["{}"]}}"#, "a".repeat(1 << 17));
    let (status, _, body) = call(&h.app, "POST", &tree, Some(&h.alice), Some(&big)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("too_large")));
    let (status, _, body) =
        call(&h.app, "GET", "/v1/workspaces/x/vectors/missing?limit=many", Some(&h.alice), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"]["message"].is_string(), "a query rejection is our error body too: {body}");
    // A model route on a server without models: unavailable, said in the same shape.
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let (status, _, body) = call(&h.app, "POST", "/v1/chat/completions", Some(&h.alice), Some(&chat)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
}

#[tokio::test]
async fn a_tenant_over_its_rate_limit_is_told_when_to_come_back() {
    let h = harness(RateLimit { per_second: 0.001, burst: 3 }).await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(call(&h.app, "GET", "/v1/workspaces", Some(&h.alice), None).await);
    }
    let codes: Vec<u16> = statuses.iter().map(|s| s.0.as_u16()).collect();
    assert_eq!(codes, vec![200, 200, 200, 429, 429]);
    let (_, headers, body) = &statuses[3];
    assert!(headers[header::RETRY_AFTER].to_str().unwrap().parse::<u64>().unwrap() > 0);
    assert_eq!(body["error"]["code"], "rate_limited");
    // Another tenant's budget is its own.
    assert_eq!(call(&h.app, "GET", "/v1/workspaces", Some(&h.bob), None).await.0, StatusCode::OK);
}

/// Sends `body` (already encoded) with `headers`: `(status, headers, raw body)`.
async fn raw(
    app: &axum::Router,
    path: &str,
    token: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let mut req = Request::builder().method("POST").uri(path).header(header::AUTHORIZATION, format!("Bearer {token}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = app.clone().oneshot(req.body(Body::from(body)).unwrap()).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    (status, headers, axum::body::to_bytes(resp.into_body(), 1 << 24).await.unwrap().to_vec())
}

#[tokio::test]
async fn bodies_are_compressed_both_ways_and_a_bomb_stops_at_the_limit() {
    let h = harness(unlimited()).await;
    let tree = format!("/v1/workspaces/{ALICE_WS}/tree");
    let json = [("content-type", "application/json")];
    // Every answer says what a request may be compressed with.
    let (status, headers, _) = raw(&h.app, &tree, &h.alice, &json, br#"{"dirs": [""]}"#.to_vec()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers[header::ACCEPT_ENCODING], "zstd, gzip");
    // A zstd request body is read as the JSON it holds.
    let zstd_json = [("content-type", "application/json"), ("content-encoding", "zstd")];
    let small = zstd::encode_all(&br#"{"dirs": [""]}"#[..], 3).unwrap();
    let (status, _, body) = raw(&h.app, &tree, &h.alice, &zstd_json, small).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    // 1 MiB of JSON in 100-odd bytes: refused at the 64 KiB limit, decompressed no further.
    let bomb = format!(r#"{{"dirs": ["{}"]}}"#, "a".repeat(1 << 20));
    let packed = zstd::encode_all(bomb.as_bytes(), 19).unwrap();
    assert!(packed.len() < 1024, "{}", packed.len());
    let (status, _, body) = raw(&h.app, &tree, &h.alice, &zstd_json, packed).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{}", String::from_utf8_lossy(&body));
    // An encoding it does not take, and bytes that are not what they claim: clear refusals.
    let br = [("content-type", "application/json"), ("content-encoding", "br")];
    let (status, _, _) = raw(&h.app, &tree, &h.alice, &br, b"x".to_vec()).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, _, _) = raw(&h.app, &tree, &h.alice, &zstd_json, b"not zstd at all".to_vec()).await;
    assert!(status.is_client_error(), "{status}");
    // A large answer comes compressed when asked for, plain otherwise.
    let get = |encoding: Option<&'static str>| {
        let app = h.app.clone();
        async move {
            let mut req = Request::builder().uri("/openapi.json");
            if let Some(e) = encoding {
                req = req.header(header::ACCEPT_ENCODING, e);
            }
            let resp = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
            let encoding = resp.headers().get(header::CONTENT_ENCODING).map(|v| v.to_str().unwrap().to_owned());
            (encoding, axum::body::to_bytes(resp.into_body(), 1 << 24).await.unwrap())
        }
    };
    let (plain_encoding, plain) = get(None).await;
    let (encoding, packed) = get(Some("zstd")).await;
    assert_eq!((plain_encoding, encoding.as_deref()), (None, Some("zstd")));
    assert!(packed.len() * 3 < plain.len(), "{} of {}", packed.len(), plain.len());
    assert_eq!(zstd::decode_all(&packed[..]).unwrap(), plain.to_vec());
}

#[tokio::test]
async fn every_answer_names_the_sync_version() {
    let h = harness(unlimited()).await;
    let (status, headers, _) = call(&h.app, "GET", "/healthz", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers[caret_protocol::SYNC_VERSION_HEADER], caret_protocol::SYNC_VERSION.to_string());
}
