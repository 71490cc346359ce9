//! `caret ui [PATH]`: the workspace in a browser. A local server on 127.0.0.1 (a free port
//! unless `--port`) serves the page built from `web/` and embedded in the binary (Monaco,
//! VS Code's editor component: no Node, no CDN, no network) and the API it calls:
//!
//! - files: `GET /api/tree`, `GET /api/file?path=`, `PUT /api/file` `{path, text, base}`
//!   (atomic; 409 with the disk's text when the file changed since version `base`),
//!   `GET /api/watch` (server-sent events: a file changed on disk, the tree changed);
//! - Tab: `POST /api/tab/complete` `{path, text, cursor}` (cursor in UTF-16 units, as Monaco
//!   counts), `POST /api/tab/open` (warm-up), `POST /api/tab/feedback`, `GET /metrics`;
//! - the agent: `POST /api/agent/sessions`, `POST /api/agent/sessions/{id}/ops`,
//!   `GET /api/agent/sessions/{id}/events`; the review of its changes: `GET /api/review`,
//!   `GET /api/review/diff?path=`, `POST /api/review/accept|reject` `{path}`,
//!   `POST /api/checkpoints/restore` `{turn}`;
//! - `POST /api/edit` (an instruction applied to a selection: Cmd-K), `GET /api/search?q=&mode=`;
//! - background runs on the embedded queue: `GET|POST /api/runs`, `GET /api/runs/{id}/events`,
//!   `GET /api/runs/{id}/patch`, `POST /api/runs/{id}/apply`.
//!
//! Security: the server binds loopback only, and every API request must carry the launch
//! token (random per launch, 256 bits; in the printed address's fragment, sent by the page as
//! a bearer token), come with a `Host` of this address (no DNS rebinding) and, when it has an
//! `Origin`, this origin — so neither another local user nor a web page in the same browser
//! can drive the agent. There are no CORS headers.
//!
//! The page's sources are `web/` beside this crate, bundled by `build.rs`. Sessions, Tab,
//! search and runs come from `caret_host`; this crate never reaches into another front end.

mod agent;
mod files;
mod parallel;
mod pull;
mod review;
mod runs;
mod search;
mod tab;
mod team;

pub use team::pages;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use caret_host::config::Config;
use caret_host::runtime::runtime;

mod assets {
    include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));
}

#[derive(Debug, clap::Args)]
/// `caret ui`'s arguments.
pub struct UiArgs {
    /// The workspace.
    #[arg(default_value = ".")]
    path: PathBuf,
    /// Port on 127.0.0.1 (default: a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Open the page in the desktop's browser (xdg-open).
    #[arg(long)]
    open: bool,
    /// Tab's model alias (default: `tab`, else the first configured).
    #[arg(long)]
    tab_model: Option<String>,
    /// The agent's model alias (default: `agent`, else the first configured).
    #[arg(long, short)]
    model: Option<String>,
}

/// One workspace's page: its files, Tab, agent sessions and their review, runs.
pub struct Ui {
    root: PathBuf,
    name: String,
    access: Access,
    config: Config,
    /// The gateway the page's models are called through (none: no models configured; set
    /// once the default model is pulled from the page) and the tenant its calls are charged to.
    gateway: std::sync::RwLock<Option<Arc<caret_models::Gateway>>>,
    tenant: String,
    model: Option<String>,
    tab_model: Option<String>,
    /// The default model's download, when the page offers it.
    pull: pull::Pull,
    changes: broadcast::Sender<Value>,
    tab: tab::Tab,
    agents: agent::Agents,
    review: Arc<tokio::sync::Mutex<review::Review>>,
    /// The MCP servers the page's chats share (the user's and the project's trusted ones),
    /// started on first use and again after a trust.
    mcp: std::sync::Mutex<Option<GatedHub>>,
    /// "Run N": attempts at one task in worktrees.
    parallel: parallel::Parallel,
    /// The run queue: the embedded one, opened on first use, or the server's.
    runs: tokio::sync::OnceCell<caret_host::runs::Runs>,
    /// Turns true when the server stops: the page's event streams end.
    stopping: tokio::sync::watch::Receiver<bool>,
    /// When search last synced the workspace.
    synced: tokio::sync::Mutex<Option<std::time::Instant>>,
}

/// MCP servers and, on a team's page, the egress proxy their remote ones go through.
type GatedHub = (Arc<caret_mcp::Hub>, Option<Arc<caret_sandbox::netproxy::Gate>>);

/// Who may call a page's API.
enum Access {
    /// `caret ui`: whoever has this launch's token, at `127.0.0.1:PORT`.
    Launch { token: String, host: String },
    /// A team's page on `caret serve`: the server has checked the tenant's token.
    Tenant,
}

/// What a page is built from, besides its workspace.
struct Parts {
    config: Config,
    gateway: Option<Arc<caret_models::Gateway>>,
    tenant: String,
    model: Option<String>,
    tab_model: Option<String>,
    changes: broadcast::Sender<Value>,
    stopping: tokio::sync::watch::Receiver<bool>,
}

impl Ui {
    fn new(root: PathBuf, access: Access, parts: Parts) -> anyhow::Result<Ui> {
        let Parts { config, gateway, tenant, model, tab_model, changes, stopping } = parts;
        let completer = match &gateway {
            Some(g) => Some(completer(&config, g, tab_model.as_deref(), &tenant)?),
            None => None,
        };
        let walk = config.walk_config();
        Ok(Ui {
            name: root.file_name().map_or_else(|| root.display().to_string(), |n| n.to_string_lossy().into_owned()),
            access,
            config,
            gateway: std::sync::RwLock::new(gateway),
            tenant,
            model,
            tab_model,
            pull: pull::Pull::default(),
            changes,
            tab: tab::Tab::new(root.clone(), completer, walk),
            agents: agent::Agents::default(),
            review: Arc::new(tokio::sync::Mutex::new(review::Review::new(&root))),
            mcp: std::sync::Mutex::new(None),
            runs: tokio::sync::OnceCell::new(),
            parallel: parallel::Parallel::default(),
            stopping,
            synced: tokio::sync::Mutex::new(None),
            root,
        })
    }

    /// The agent's model (`model`, else the page's, else the `agent` alias, else the first)
    /// and the gateway to call it through.
    fn agent_model(&self, model: Option<&str>) -> anyhow::Result<(caret_host::backend::Backend, String)> {
        let gateway = self.gateway().context(
            "no models are configured: download the default one from the page, or add [[models]] to caret's config",
        )?;
        let alias = caret_host::backend::Backend::alias(&gateway, model.or(self.model.as_deref()), &["agent"])?;
        Ok((caret_host::backend::Backend::Embedded { gateway, tenant: self.tenant.clone() }, alias))
    }
}

impl Ui {
    /// The gateway, when there are models.
    fn gateway(&self) -> Option<Arc<caret_models::Gateway>> {
        self.gateway.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Uses `config`'s models from now on (the default one, just installed): Tab, next edit
    /// and the agent work at once.
    fn use_models(&self, config: &Config) -> anyhow::Result<()> {
        let gateway = config.gateway()?.context("still no model configured")?;
        let tab = completer(config, &gateway, self.tab_model.as_deref(), &self.tenant)?;
        *self.gateway.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(gateway);
        self.tab.set_completer(tab);
        Ok(())
    }
}

/// Tab's completer over `gateway` (`alias`, else `tab`, else the first).
fn completer(
    config: &Config,
    gateway: &Arc<caret_models::Gateway>,
    alias: Option<&str>,
    tenant: &str,
) -> anyhow::Result<caret_host::completer::Completer> {
    let alias = caret_host::backend::Backend::alias(gateway, alias, &["tab"])?;
    let backend = caret_host::backend::Backend::Embedded { gateway: gateway.clone(), tenant: tenant.to_owned() };
    caret_host::completer::with_backend(config, backend, alias, None, caret_complete::engine::budget(None))
}

/// An API error: a status and a message, as `{"error": {"message"}}`.
struct ApiError(StatusCode, String, Option<Value>);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": {"message": self.1}});
        if let Some(Value::Object(extra)) = self.2 {
            for (k, v) in extra {
                body[k] = v;
            }
        }
        (self.0, Json(body)).into_response()
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into(), None)
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), None)
}

impl From<files::FileError> for ApiError {
    fn from(e: files::FileError) -> Self {
        use files::FileError as F;
        let status = match &e {
            F::Outside(_) => StatusCode::BAD_REQUEST,
            F::NotFound(_) => StatusCode::NOT_FOUND,
            F::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            F::Binary(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            F::Conflict { .. } => StatusCode::CONFLICT,
            F::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let extra = match &e {
            F::Conflict { version, text } => Some(json!({"version": version, "text": text})),
            _ => None,
        };
        ApiError(status, e.to_string(), extra)
    }
}

type ApiResult = Result<Response, ApiError>;

/// Bytes compared in constant time.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The checks of every API request of `caret ui`: the launch token, this server's `Host`,
/// and no foreign `Origin`; then the page goes with the request.
async fn guard(State(ui): State<Arc<Ui>>, mut req: Request, next: Next) -> Response {
    let Access::Launch { token: launch, host } = &ui.access else {
        return internal("a team's page behind a launch token").into_response();
    };
    let h = req.headers();
    let port = host.rsplit(':').next().unwrap_or("");
    let host_ok = h
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == host || v == format!("localhost:{port}"));
    if !host_ok {
        return ApiError(StatusCode::FORBIDDEN, "this server answers only to its own address".into(), None)
            .into_response();
    }
    if let Some(origin) = h.get(header::ORIGIN) {
        let ok =
            origin.to_str().is_ok_and(|o| o == format!("http://{host}") || o == format!("http://localhost:{port}"));
        if !ok {
            return foreign_origin();
        }
    }
    let token = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !same(token.as_bytes(), launch.as_bytes()) {
        return ApiError(
            StatusCode::UNAUTHORIZED,
            "a missing or wrong launch token: open the address `caret ui` printed".into(),
            None,
        )
        .into_response();
    }
    req.extensions_mut().insert(ui.clone());
    next.run(req).await
}

fn foreign_origin() -> Response {
    ApiError(StatusCode::FORBIDDEN, "requests from other origins are refused".into(), None).into_response()
}

/// A static response with the page's security headers.
fn asset(content_type: &str, body: &'static [u8]) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
                 font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; base-uri 'none'; \
                 form-action 'none'; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The page's file `rel` (`index.html`, or one under `assets/`).
fn asset_named(rel: &str) -> Response {
    match assets::ASSETS.iter().find(|(p, _, _)| *p == rel) {
        Some((_, ct, body)) => asset(ct, body),
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}

/// The page's files: `/` is `index.html`, the rest under `/assets/`.
async fn page(req: Request) -> Response {
    let path = req.uri().path();
    asset_named(if path == "/" { "index.html" } else { path.strip_prefix("/assets/").unwrap_or("") })
}

/// The API's routes; each handler finds its page in the request's extensions.
fn api() -> Router {
    Router::new()
        .route("/api/info", get(info))
        .route("/api/tree", get(tree))
        .route("/api/file", get(read_file).put(save_file))
        .route("/api/watch", get(watch))
        .route("/api/tab/complete", post(tab_complete))
        .route("/api/tab/open", post(tab_open))
        .route("/api/tab/feedback", post(tab_feedback))
        .route("/api/tab/next-edit", post(tab_next_edit))
        .route("/metrics", get(metrics))
        .route("/api/models/default", get(pull::status).post(pull::start))
        .route("/api/agent/sessions", post(start_session))
        .route("/api/agent/sessions/{id}/ops", post(session_op))
        .route("/api/agent/sessions/{id}/events", get(session_events))
        .route("/api/mcp", get(mcp_servers))
        .route("/api/docs", get(docs_sources))
        .route("/api/commands", get(custom_commands))
        .route("/api/mcp/trust", post(mcp_trust))
        .route("/api/review", get(review_list))
        .route("/api/review/diff", get(review_diff))
        .route("/api/review/accept", post(review_accept))
        .route("/api/review/reject", post(review_reject))
        .route("/api/checkpoints/restore", post(restore))
        .route("/api/edit", post(edit))
        .route("/api/search", get(search_route))
        .route("/api/parallel", get(parallel_status).post(parallel_start))
        .route("/api/parallel/apply", post(parallel_apply))
        .route("/api/runs", get(runs_list).post(runs_start))
        .route("/api/runs/{id}/events", get(runs_events))
        .route("/api/runs/{id}/patch", get(runs_patch))
        .route("/api/runs/{id}/apply", post(runs_apply))
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
}

/// The routes of `caret ui`: the page and its API over `ui`.
pub fn router(ui: Arc<Ui>) -> Router {
    let api = api().layer(axum::middleware::from_fn_with_state(ui, guard));
    Router::new().route("/", get(page)).route("/assets/{*path}", get(page)).merge(api)
}

async fn info(Extension(ui): Extension<Arc<Ui>>) -> ApiResult {
    Ok(Json(json!({
        // A team's page does not say where the server keeps the workspace.
        "root": match ui.access {
            Access::Launch { .. } => ui.root.display().to_string(),
            Access::Tenant => ui.name.clone(),
        },
        "name": ui.name,
        "tab": ui.tab.model(),
        "version": env!("CARGO_PKG_VERSION"),
        "bundle": {
            "files": assets::ASSETS.len(),
            "bytes": assets::ASSETS.iter().map(|(_, _, b)| b.len()).sum::<usize>(),
        },
    }))
    .into_response())
}

async fn tree(Extension(ui): Extension<Arc<Ui>>) -> ApiResult {
    let root = ui.root.clone();
    let (files, truncated) = tokio::task::spawn_blocking(move || files::tree(&root))
        .await
        .map_err(internal)?
        .map_err(|e| internal(format!("{e:#}")))?;
    Ok(Json(json!({"files": files, "truncated": truncated})).into_response())
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

async fn read_file(Extension(ui): Extension<Arc<Ui>>, Query(q): Query<PathQuery>) -> ApiResult {
    let root = ui.root.clone();
    let (text, version) =
        tokio::task::spawn_blocking(move || files::read(&root, &q.path)).await.map_err(internal)??;
    Ok(Json(json!({"text": text, "version": version})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Save {
    path: String,
    text: String,
    base: Option<String>,
}

async fn save_file(Extension(ui): Extension<Arc<Ui>>, Json(s): Json<Save>) -> ApiResult {
    let root = ui.root.clone();
    let version = tokio::task::spawn_blocking(move || files::save(&root, &s.path, &s.text, s.base.as_deref()))
        .await
        .map_err(internal)??;
    Ok(Json(json!({"version": version})).into_response())
}

/// A server-sent event stream of JSON values: `past` first, then `live` until it closes or
/// the server stops.
fn sse(ui: &Ui, past: Vec<Value>, live: Option<broadcast::Receiver<Value>>) -> Response {
    caret_server::sse::event_stream(past, live, ui.stopping.clone())
}

/// `values` as a server-sent event stream, until the server stops.
fn event_stream(ui: &Ui, values: impl futures::Stream<Item = Value> + Send + 'static) -> Response {
    let values = caret_server::sse::until_stopping(values, ui.stopping.clone());
    let body = values.map(|e| Ok::<_, Infallible>(bytes::Bytes::from(format!("data: {e}\n\n"))));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn watch(Extension(ui): Extension<Arc<Ui>>) -> Response {
    sse(&ui, vec![json!({"type": "hello"})], Some(ui.changes.subscribe()))
}

#[derive(Deserialize)]
struct TabRequest {
    path: String,
    text: String,
    cursor: usize,
}

async fn tab_complete(Extension(ui): Extension<Arc<Ui>>, Json(r): Json<TabRequest>) -> ApiResult {
    files::resolve(&ui.root, &r.path)?;
    match ui.tab.complete(&r.path, r.text, r.cursor).await {
        tab::Outcome::Suggestion(s) => Ok(Json(json!({
            "text": s.text,
            "cached": s.cached,
            "multiline": s.multiline,
            "ms": s.total_ms,
            "first_ms": s.first_text_ms,
            "model": ui.tab.model(),
        }))
        .into_response()),
        tab::Outcome::Superseded => {
            Err(ApiError(StatusCode::CONFLICT, "superseded by a newer request for the file".into(), None))
        }
        tab::Outcome::Failed(m) => Err(ApiError(StatusCode::BAD_GATEWAY, m, None)),
    }
}

async fn tab_open(Extension(ui): Extension<Arc<Ui>>, Json(r): Json<TabRequest>) -> ApiResult {
    files::resolve(&ui.root, &r.path)?;
    let warmed = ui.tab.warm(&r.path, r.text, r.cursor).await;
    Ok(Json(json!({"warmed": warmed})).into_response())
}

#[derive(Deserialize)]
struct NextEditRequest {
    path: String,
    text: String,
    cursor: usize,
    /// The file as opened: its edits are followed from here (nothing is predicted).
    #[serde(default)]
    open: bool,
}

/// The edit likely next after the user's recent ones (`null`: none), as UTF-16 offsets.
async fn tab_next_edit(Extension(ui): Extension<Arc<Ui>>, Json(r): Json<NextEditRequest>) -> ApiResult {
    files::resolve(&ui.root, &r.path)?;
    if r.open {
        ui.tab.follow(&r.path, &r.text).await;
        return Ok(Json(Value::Null).into_response());
    }
    Ok(Json(ui.tab.next_edit(&r.path, &r.text, r.cursor).await).into_response())
}

#[derive(Deserialize)]
struct Feedback {
    event: String,
    #[serde(default)]
    model: String,
}

async fn tab_feedback(Extension(ui): Extension<Arc<Ui>>, Json(f): Json<Feedback>) -> ApiResult {
    ui.tab.feedback(&f.model, &f.event).map_err(bad)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn metrics(Extension(ui): Extension<Arc<Ui>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], ui.tab.metrics()).into_response()
}

#[derive(Deserialize, Default)]
struct StartSession {
    model: Option<String>,
}

async fn start_session(Extension(ui): Extension<Arc<Ui>>, body: Option<Json<StartSession>>) -> ApiResult {
    let unavailable = |e: anyhow::Error| ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}"), None);
    let (backend, model) = ui.agent_model(body.and_then(|b| b.0.model).as_deref()).map_err(unavailable)?;
    let kept = ui.config.server.agent_sessions_per_tenant.max(1);
    let mut args = caret_host::session::SessionOptions::new(ui.root.clone(), None);
    args.mcp = Some(ui.mcp_hub().map_err(unavailable)?);
    let (id, model) =
        agent::start(&ui.config, &ui.agents, ui.review.clone(), &args, backend, model, kept).map_err(unavailable)?;
    Ok(Json(json!({"id": id, "model": model})).into_response())
}

impl Ui {
    /// The chats' MCP servers, started now if they were not.
    fn mcp_hub(&self) -> anyhow::Result<Arc<caret_mcp::Hub>> {
        let mut hub = self.mcp.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((h, _)) = &*hub {
            return Ok(h.clone());
        }
        let (servers, _) = caret_host::mcp::session_servers(&self.config.mcp_servers, &self.config.home, &self.root)?;
        // A team's page reaches remote servers through the server's egress policy.
        let gate = match self.access {
            Access::Launch { .. } => None,
            Access::Tenant => caret_mcp::sandboxed::remote_gate(&servers, &self.config.server.egress()?)
                .map_err(anyhow::Error::msg)?,
        };
        let proxy = gate.as_ref().map(caret_sandbox::netproxy::Gate::url);
        let made = caret_mcp::Hub::placed(servers, &caret_mcp::Place { launcher: None, proxy });
        made.start();
        *hub = Some((made.clone(), gate.map(Arc::new)));
        Ok(made)
    }
}

/// The chats' MCP servers and how each is (`servers`: name, `ready`, `status`), started if
/// they were not; and the project's that wait for the user's trust (`untrusted`: name, file,
/// command line or URL).
async fn mcp_servers(Extension(ui): Extension<Arc<Ui>>) -> ApiResult {
    let bad = |e: anyhow::Error| ApiError(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}"), None);
    let (_, untrusted) =
        caret_host::mcp::session_servers(&ui.config.mcp_servers, &ui.config.home, &ui.root).map_err(bad)?;
    let untrusted: Vec<Value> = untrusted
        .iter()
        .map(|p| json!({"name": p.name, "file": p.file, "command_line": p.command_line, "remote": p.remote}))
        .collect();
    let servers: Vec<Value> = ui
        .mcp_hub()
        .map_err(bad)?
        .status()
        .into_iter()
        .map(|(name, status)| json!({"name": name, "ready": status.is_ready(), "status": status.to_string()}))
        .collect();
    Ok(Json(json!({"servers": servers, "untrusted": untrusted})).into_response())
}

/// The documentation sources (`caret docs add`): `{sources: [{name, pages, …}]}`.
async fn docs_sources(Extension(ui): Extension<Arc<Ui>>) -> ApiResult {
    let sources = caret_host::docs::list(&ui.config)
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"), None))?;
    let sources: Vec<Value> =
        sources.iter().map(|l| json!({"name": l.source.name, "pages": l.pages, "updated_at": l.updated_at})).collect();
    Ok(Json(json!({ "sources": sources })).into_response())
}

/// The custom commands a request may start with (`/name args`), the project's and the
/// user's: `{commands: [{name, description, argument_hint, source}]}`.
async fn custom_commands(Extension(ui): Extension<Arc<Ui>>) -> ApiResult {
    let (commands, _) = caret_host::conventions::commands(&ui.config, &ui.root);
    let commands: Vec<Value> = commands
        .iter()
        .map(|c| json!({"name": c.name, "description": c.description, "argument_hint": c.argument_hint, "source": c.source}))
        .collect();
    Ok(Json(json!({ "commands": commands })).into_response())
}

#[derive(serde::Deserialize)]
struct TrustMcp {
    name: String,
}

/// Trusts a project's MCP server, as `caret mcp trust NAME` does: sessions started from now
/// on start it.
async fn mcp_trust(Extension(ui): Extension<Arc<Ui>>, Json(body): Json<TrustMcp>) -> ApiResult {
    let server =
        caret_host::mcp::project_servers(&ui.root).into_iter().find(|p| p.name == body.name).ok_or_else(|| {
            ApiError(StatusCode::NOT_FOUND, format!("the project declares no MCP server {}", body.name), None)
        })?;
    caret_host::mcp::trust(&ui.config.home, &ui.root, &server)
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"), None))?;
    // The next chat gets a hub with it (running chats keep theirs).
    *ui.mcp.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn hosted(ui: &Ui, id: &str) -> Result<Arc<agent::Hosted>, ApiError> {
    ui.agents.get(id).ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no session {id}"), None))
}

async fn session_op(
    Extension(ui): Extension<Arc<Ui>>,
    UrlPath(id): UrlPath<String>,
    Json(op): Json<caret_protocol::agent::Op>,
) -> ApiResult {
    let h = hosted(&ui, &id)?;
    h.ops.send(op).map_err(|_| ApiError(StatusCode::GONE, "the session has ended".into(), None))?;
    Ok(StatusCode::ACCEPTED.into_response())
}

async fn session_events(Extension(ui): Extension<Arc<Ui>>, UrlPath(id): UrlPath<String>) -> ApiResult {
    let (past, live) = hosted(&ui, &id)?.subscribe();
    Ok(sse(&ui, past, live))
}

async fn review_list(Extension(ui): Extension<Arc<Ui>>) -> ApiResult {
    let mut r = ui.review.lock().await;
    let files = tokio::task::block_in_place(|| r.list());
    Ok(Json(json!({"files": files})).into_response())
}

async fn review_diff(Extension(ui): Extension<Arc<Ui>>, Query(q): Query<PathQuery>) -> ApiResult {
    let r = ui.review.lock().await;
    let (before, after) = r.diff(&q.path).map_err(|e| ApiError(StatusCode::NOT_FOUND, format!("{e:#}"), None))?;
    Ok(Json(json!({"path": q.path, "before": before, "after": after})).into_response())
}

async fn review_accept(Extension(ui): Extension<Arc<Ui>>, Json(q): Json<PathQuery>) -> ApiResult {
    ui.review.lock().await.accept(&q.path).map_err(|e| ApiError(StatusCode::NOT_FOUND, format!("{e:#}"), None))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn review_reject(Extension(ui): Extension<Arc<Ui>>, Json(q): Json<PathQuery>) -> ApiResult {
    let mut r = ui.review.lock().await;
    tokio::task::block_in_place(|| r.reject(&q.path))
        .map_err(|e| ApiError(StatusCode::CONFLICT, format!("{e:#}"), None))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct Restore {
    turn: u32,
}

async fn restore(Extension(ui): Extension<Arc<Ui>>, Json(q): Json<Restore>) -> ApiResult {
    let mut r = ui.review.lock().await;
    let restored = tokio::task::block_in_place(|| r.restore(q.turn))
        .map_err(|e| ApiError(StatusCode::CONFLICT, format!("{e:#}"), None))?;
    Ok(Json(json!({"restored": restored})).into_response())
}

#[derive(Deserialize)]
struct EditRequest {
    path: String,
    text: String,
    start: usize,
    end: usize,
    instruction: String,
}

async fn edit(Extension(ui): Extension<Arc<Ui>>, Json(r): Json<EditRequest>) -> ApiResult {
    files::resolve(&ui.root, &r.path)?;
    let start = tab::byte_offset(&r.text, r.start);
    let end = tab::byte_offset(&r.text, r.end);
    let unprocessable = |e: anyhow::Error| ApiError(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}"), None);
    let (backend, model) = ui.agent_model(None).map_err(unprocessable)?;
    // The project's rules files: those always applied, and those whose globs match the file.
    let rules = ui.config.agent.project_rules(&ui.root, &ui.root, Some(&ui.config.home));
    let mut guidance = rules.prompt().unwrap_or_default();
    for rule in rules.matching(&r.path) {
        guidance.push_str(&format!("\n<rule name=\"{}\">\n{}\n</rule>\n", rule.name, rule.text.trim_end()));
    }
    let (text, format) = search::edit(&backend, &model, &r.path, &r.text, (start, end), &r.instruction, &guidance)
        .await
        .map_err(|e| ApiError(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}"), None))?;
    Ok(Json(json!({"text": text, "format": format})).into_response())
}

#[derive(Deserialize)]
struct SearchQuery {
    q: String,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    k: Option<usize>,
}

async fn search_route(Extension(ui): Extension<Arc<Ui>>, Query(q): Query<SearchQuery>) -> ApiResult {
    if q.q.trim().is_empty() {
        return Err(bad("an empty query"));
    }
    let k = q.k.unwrap_or(20).clamp(1, 200);
    let found = match q.mode.as_deref().unwrap_or("semantic") {
        "grep" => {
            let root = ui.root.clone();
            tokio::task::spawn_blocking(move || search::grep(&root, &q.q, k * 10)).await.map_err(internal)?
        }
        "semantic" => search::semantic(&ui.config, &ui.root, &q.q, k, &ui.synced).await,
        // The documentation sources (`caret docs add`): hits with their page's URL.
        "docs" => caret_host::docs::search(&ui.config, &q.q, &[], k.min(50)).await.map(|hits| {
            let note = match (hits.len(), caret_host::docs::source_names(&ui.config).len()) {
                (_, 0) => "no documentation added yet: `caret docs add URL --name NAME`".to_owned(),
                (n, s) => format!("{n} sections from {s} docs sources"),
            };
            json!({"hits": hits, "note": note})
        }),
        other => return Err(bad(format!("mode {other:?}: semantic, grep or docs"))),
    }
    .map_err(|e| bad(format!("{e:#}")))?;
    Ok(Json(found).into_response())
}

async fn run_queue(ui: &Ui) -> Result<&caret_host::runs::Runs, ApiError> {
    if matches!(ui.access, Access::Tenant) && ui.runs.get().is_none() {
        let message = "background runs are not enabled on this server".to_owned();
        return Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, message, None));
    }
    let target = caret_host::remote::Remote::default();
    ui.runs
        .get_or_try_init(|| caret_host::runs::Runs::open(&ui.config, &target))
        .await
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("the run queue: {e:#}"), None))
}

fn failed(e: anyhow::Error) -> ApiError {
    ApiError(StatusCode::CONFLICT, format!("{e:#}"), None)
}

async fn runs_list(Extension(ui): Extension<Arc<Ui>>) -> ApiResult {
    Ok(Json(runs::list(run_queue(&ui).await?).await.map_err(failed)?).into_response())
}

#[derive(Deserialize)]
struct StartRun {
    task: String,
    model: Option<String>,
}

async fn runs_start(Extension(ui): Extension<Arc<Ui>>, Json(r): Json<StartRun>) -> ApiResult {
    let model = r.model.or_else(|| ui.model.clone());
    let info = runs::start(run_queue(&ui).await?, &ui.root, &r.task, model).await.map_err(failed)?;
    Ok(Json(info).into_response())
}

async fn runs_events(Extension(ui): Extension<Arc<Ui>>, UrlPath(id): UrlPath<String>) -> ApiResult {
    run_queue(&ui).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let ui2 = ui.clone();
    tokio::spawn(async move {
        let Some(queue) = ui2.runs.get() else { return };
        if let Err(e) = runs::follow(queue, &id, tx.clone()).await {
            let _ = tx.send(json!({"type": "error", "message": format!("{e:#}")}));
        }
    });
    Ok(event_stream(&ui, futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })))
}

async fn runs_patch(Extension(ui): Extension<Arc<Ui>>, UrlPath(id): UrlPath<String>) -> ApiResult {
    Ok(Json(runs::patch(run_queue(&ui).await?, &ui.root, &id).await.map_err(failed)?).into_response())
}

async fn runs_apply(Extension(ui): Extension<Arc<Ui>>, UrlPath(id): UrlPath<String>) -> ApiResult {
    Ok(Json(runs::apply(run_queue(&ui).await?, &ui.root, &id).await.map_err(failed)?).into_response())
}

#[derive(serde::Deserialize)]
struct StartParallel {
    task: String,
    n: usize,
    /// Model aliases, attempt `i` taking `models[i % len]` (none: the page's model).
    #[serde(default)]
    models: Vec<String>,
}

/// Starts N attempts at a task, each in a worktree of its own. On this machine only: a team's
/// page has no checkout of the member's to make worktrees of.
async fn parallel_start(Extension(ui): Extension<Arc<Ui>>, Json(r): Json<StartParallel>) -> ApiResult {
    if matches!(ui.access, Access::Tenant) {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            "parallel attempts run on your own machine: caret ui".into(),
            None,
        ));
    }
    let models = if r.models.is_empty() { ui.model.iter().cloned().collect() } else { r.models };
    ui.parallel.start(&ui.config, ui.root.clone(), &r.task, r.n, models).await.map_err(failed)?;
    Ok(Json(ui.parallel.status().await).into_response())
}

async fn parallel_status(Extension(ui): Extension<Arc<Ui>>) -> ApiResult {
    Ok(Json(ui.parallel.status().await).into_response())
}

#[derive(serde::Deserialize)]
struct ApplyParallel {
    /// The attempt to apply; 0: none (every worktree is removed either way).
    number: usize,
}

async fn parallel_apply(Extension(ui): Extension<Arc<Ui>>, Json(r): Json<ApplyParallel>) -> ApiResult {
    let said = ui.parallel.apply(ui.root.clone(), r.number).await.map_err(failed)?;
    Ok(Json(json!({ "applied": said })).into_response())
}

/// Serves the workspace page until interrupted.
pub fn run(config: &Config, args: UiArgs) -> anyhow::Result<ExitCode> {
    let root = args.path.canonicalize().with_context(|| format!("opening {}", args.path.display()))?;
    anyhow::ensure!(root.is_dir(), "{} is not a directory", root.display());
    let rt = runtime()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], args.port)))
            .await
            .with_context(|| format!("binding 127.0.0.1:{}", args.port))?;
        let addr = listener.local_addr()?;
        let token = {
            let mut b = [0u8; 32];
            getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness for the launch token: {e}"))?;
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        };
        let (changes, _) = broadcast::channel(1024);
        let _watcher = files::watch(&root, changes.clone())?;
        let (stop, stopping) = tokio::sync::watch::channel(false);
        // One gateway for Tab, the agent and Cmd-K: a local model's weights are loaded once.
        let gateway = config.gateway()?;
        let parts = Parts {
            config: config.clone(),
            gateway,
            tenant: "local".to_owned(),
            model: args.model.clone(),
            tab_model: args.tab_model.clone(),
            changes,
            stopping,
        };
        let access = Access::Launch { token: token.clone(), host: addr.to_string() };
        let ui = Arc::new(Ui::new(root.clone(), access, parts)?);
        let url = format!("http://{addr}/#token={token}");
        println!("caret ui: {url}");
        eprintln!(
            "caret ui: {} on {addr} (loopback only; the address carries this launch's token). Ctrl-C stops it.",
            root.display()
        );
        if args.open {
            let _ = std::process::Command::new("xdg-open")
                .arg(&url)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn();
        }
        axum::serve(listener, router(ui))
            .with_graceful_shutdown(async move {
                let _ = tokio::signal::ctrl_c().await;
                stop.send_replace(true);
            })
            .await
            .context("serving the page")?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
