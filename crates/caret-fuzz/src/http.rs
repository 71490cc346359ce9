//! The HTTP API in-process: a real service (SQLite, a local object store) behind the real
//! router, two tenants, any method, path, headers and body.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt as _;

struct Harness {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
    /// Tenant A's token; its workspace; tenant B's workspace (A must never reach it).
    token: String,
    own: String,
    other: String,
    _dir: tempfile::TempDir,
}

/// Workspace ids are 26 base32 characters.
const OWN: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaa";
const OTHER: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbb";

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a runtime: {e}"));
        let (app, token) = rt.block_on(async {
            let storage = caret_index::StorageConfig {
                database_url: format!("sqlite://{}/caret.db?mode=rwc", dir.path().display()),
                object_store: dir.path().join("objects").display().to_string(),
            };
            let service = Arc::new(caret_index::open(&storage).await.unwrap_or_else(|e| panic!("{e}")));
            let db = service.db();
            let a = db.create_tenant("a").await.unwrap_or_else(|e| panic!("{e}"));
            let b = db.create_tenant("b").await.unwrap_or_else(|e| panic!("{e}"));
            let token = db.create_token(&a, "fuzz").await.unwrap_or_else(|e| panic!("{e}"));
            let key = caret_protocol::CreateWorkspace { key_id: "k".repeat(16), sketch: Vec::new() };
            service.create_workspace(&a, OWN, &key).await.unwrap_or_else(|e| panic!("{e}"));
            service.create_workspace(&b, OTHER, &key).await.unwrap_or_else(|e| panic!("{e}"));
            let config = caret_server::ServeConfig {
                addr: "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
                tls: None,
                allow_insecure_http: false,
                rate_limit: caret_server::limit::RateLimit { per_second: 1e9, burst: u32::MAX },
                ip_rate_limit: caret_server::limit::RateLimit { per_second: 1e9, burst: u32::MAX },
                body_limit: 1 << 20,
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
            (caret_server::app(service, &config), token)
        });
        Harness { rt, app, token, own: OWN.to_owned(), other: OTHER.to_owned(), _dir: dir }
    })
}

const METHODS: &[&str] = &["GET", "POST", "PUT", "DELETE", "PATCH"];

/// Route templates; `{ws}` is a workspace id, `{x}` anything.
const ROUTES: &[&str] = &[
    "/v1/workspaces",
    "/v1/workspaces/{ws}",
    "/v1/workspaces/{ws}/tree",
    "/v1/workspaces/{ws}/plan",
    "/v1/workspaces/{ws}/commit",
    "/v1/workspaces/{ws}/vectors/missing?limit={x}",
    "/v1/workspaces/{ws}/embed",
    "/v1/workspaces/{ws}/search",
    "/v1/apply",
    "/v1/complete",
    "/v1/chat/completions",
    "/v1/agent/sessions",
    "/v1/agent/sessions/{x}/ops",
    "/v1/runs",
    "/v1/runs/{x}",
    "/v1/envs",
    "/v1/secrets/{x}",
    "/v1/workers/lease",
    "/readyz",
    "/{x}",
];

/// Any request: never a 500, never a panic; with tenant A's token, tenant B's workspace is
/// never answered with success.
pub fn http_api(data: &[u8]) {
    let [route, method, flags, rest @ ..] = data else { return };
    let h = harness();
    let (x, body) = crate::split_at_byte(rest, 0);
    let x: String =
        String::from_utf8_lossy(x).chars().filter(|c| c.is_ascii_graphic() && !"?#%/".contains(*c)).take(64).collect();
    let ws = match flags % 3 {
        0 => h.own.as_str(),
        1 => h.other.as_str(),
        _ => x.as_str(),
    };
    let template = ROUTES[usize::from(*route) % ROUTES.len()];
    let x_or_one = if x.is_empty() { "1" } else { x.as_str() };
    let path = template.replace("{ws}", if ws.is_empty() { "w" } else { ws }).replace("{x}", x_or_one);
    let method = METHODS[usize::from(*method) % METHODS.len()];
    // Workspace ids are per tenant: tenant A's PUT of B's id makes A a workspace of its own
    // under that name (B's is untouched), after which A's requests to it rightly succeed and
    // the check below would no longer be about B. Not sent.
    if method == "PUT" && template == "/v1/workspaces/{ws}" && ws == h.other {
        return;
    }
    let mut req = Request::builder().method(method).uri(&path);
    if flags & 0x04 == 0 {
        req = req.header("authorization", format!("Bearer {}", h.token));
    } else if flags & 0x08 != 0 {
        req = req.header("authorization", format!("Bearer caret_{x}"));
    }
    if flags & 0x10 == 0 {
        req = req.header("content-type", "application/json");
    }
    if flags & 0x20 == 0 {
        req = req.header(caret_protocol::SERVER_KEY_HEADER, "a".repeat(64));
    } else if flags & 0x40 != 0 {
        req = req.header(caret_protocol::SERVER_KEY_HEADER, x.as_str());
    }
    let Ok(req) = req.body(Body::from(body.to_vec())) else { return };
    let status = h.rt.block_on(async {
        let resp = h.app.clone().oneshot(req).await.unwrap_or_else(|e| match e {});
        let status = resp.status();
        // Read the body (for at most 200 ms: event streams never end), so that a handler
        // failing while it writes fails here.
        let body = axum::body::to_bytes(resp.into_body(), 4 << 20);
        let _ = tokio::time::timeout(std::time::Duration::from_millis(200), body).await;
        status
    });
    assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR, "{method} {path}: 500");
    assert!(!status.is_server_error() || status == StatusCode::SERVICE_UNAVAILABLE, "{method} {path}: {status}");
    if ws == h.other && template.contains("{ws}") && flags & 0x04 == 0 {
        assert!(!status.is_success(), "{method} {path}: another tenant's workspace answered {status}");
    }
}
