//! The page for a team, on `caret serve`: `/ui/{workspace}/` for each workspace the operator
//! configured for agents (`[server.agent_workspaces]`). The page and its scripts are public
//! (they hold no data); its API (`/ui/{workspace}/api/…`, `/ui/{workspace}/metrics`) runs
//! behind the server's tenant token check and rate limits, and refuses a foreign `Origin`.
//! Each tenant has its own page per workspace — agent sessions and their review, Tab's open
//! documents and counts, its runs — with models called through the server's gateway under the
//! tenant's quotas, and runs on the server's queue (its workers).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, PoisonError};

use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{any, get};
use axum::{Extension, Router};
use caret_anyrun::runs::{RunService, TenantRef};
use caret_index::db::Tenant;
use serde_json::Value;
use tokio::sync::broadcast;
use tower::ServiceExt as _;

use super::{Access, ApiError, Parts, Ui, api, asset_named, files, foreign_origin, internal};
use caret_host::config::Config;

/// The pages of a server's workspaces.
pub struct Team {
    config: Config,
    /// Name → directory.
    workspaces: BTreeMap<String, PathBuf>,
    gateway: Option<Arc<caret_models::Gateway>>,
    runs: Option<Arc<RunService>>,
    stopping: tokio::sync::watch::Receiver<bool>,
    api: Router,
    /// (tenant id, workspace) → its page.
    pages: tokio::sync::Mutex<HashMap<(String, String), Arc<Ui>>>,
    /// Workspace → its changes on disk, shared by every tenant's page of it.
    watched: std::sync::Mutex<HashMap<String, (broadcast::Sender<Value>, notify::RecommendedWatcher)>>,
}

/// The routes under `/ui` of a server with `config`'s workspaces, this gateway and run
/// service; the pages' event streams end when `stopping` turns true.
pub fn pages(
    config: &Config,
    gateway: Option<Arc<caret_models::Gateway>>,
    runs: Option<Arc<RunService>>,
    stopping: tokio::sync::watch::Receiver<bool>,
) -> caret_server::Pages {
    let team = Arc::new(Team {
        config: config.clone(),
        workspaces: config.server.agent_workspaces.clone(),
        gateway,
        runs,
        stopping,
        api: api(),
        pages: tokio::sync::Mutex::new(HashMap::new()),
        watched: std::sync::Mutex::new(HashMap::new()),
    });
    let public = Router::new()
        .route("/{workspace}", get(to_slash))
        .route("/{workspace}/", get(index))
        .route("/{workspace}/assets/{*path}", get(script))
        .with_state(team.clone());
    let tenant = Router::new()
        .route("/{workspace}/api/{*rest}", any(dispatch))
        .route("/{workspace}/metrics", get(dispatch))
        .with_state(team);
    caret_server::Pages { public, tenant }
}

fn unknown(workspace: &str) -> Response {
    ApiError(StatusCode::NOT_FOUND, format!("no workspace {workspace:?} on this server"), None).into_response()
}

/// `/ui/NAME` → `/ui/NAME/` (the page's addresses are relative to it).
async fn to_slash(State(team): State<Arc<Team>>, UrlPath(ws): UrlPath<String>, req: Request) -> Response {
    if !team.workspaces.contains_key(&ws) {
        return unknown(&ws);
    }
    // Relative to `/ui/NAME`: its last segment again, with the slash.
    let last = req.uri().path().rsplit('/').next().unwrap_or_default().to_owned();
    Redirect::permanent(&format!("{last}/")).into_response()
}

async fn index(State(team): State<Arc<Team>>, UrlPath(ws): UrlPath<String>) -> Response {
    if !team.workspaces.contains_key(&ws) {
        return unknown(&ws);
    }
    asset_named("index.html")
}

async fn script(UrlPath((_, path)): UrlPath<(String, String)>) -> Response {
    asset_named(&path)
}

/// An API request of a tenant's page: checked for its origin, then answered by the page's
/// routes with the `/ui/NAME` prefix taken off.
async fn dispatch(
    State(team): State<Arc<Team>>,
    Extension(tenant): Extension<Tenant>,
    UrlPath(params): UrlPath<HashMap<String, String>>,
    req: Request,
) -> Response {
    let Some(ws) = params.get("workspace").cloned() else { return internal("no workspace").into_response() };
    if !team.workspaces.contains_key(&ws) {
        return unknown(&ws);
    }
    // The page is served by this server: any `Origin` must be this server's own.
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
        let ok =
            origin.to_str().ok().and_then(|o| o.split_once("://")).is_some_and(|(_, h)| !host.is_empty() && h == host);
        if !ok {
            return foreign_origin();
        }
    }
    let ui = match team.page(&tenant, &ws).await {
        Ok(ui) => ui,
        Err(e) => return ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}"), None).into_response(),
    };
    let prefix = format!("/{ws}");
    let rest = req.uri().path().strip_prefix(&prefix).unwrap_or("/").to_owned();
    let rewritten = match req.uri().query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest,
    };
    let uri = match rewritten.parse::<Uri>() {
        Ok(uri) => uri,
        Err(e) => return ApiError(StatusCode::BAD_REQUEST, format!("the address: {e}"), None).into_response(),
    };
    // A new request: the outer route's path parameters must not reach the page's routes.
    let (parts, body) = req.into_parts();
    let mut inner = Request::new(body);
    *inner.method_mut() = parts.method;
    *inner.uri_mut() = uri;
    *inner.version_mut() = parts.version;
    *inner.headers_mut() = parts.headers;
    inner.extensions_mut().insert(ui);
    match team.api.clone().oneshot(inner).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

impl Team {
    /// `tenant`'s page of workspace `ws`, made on first use.
    async fn page(&self, tenant: &Tenant, ws: &str) -> anyhow::Result<Arc<Ui>> {
        let key = (tenant.id.clone(), ws.to_owned());
        let mut pages = self.pages.lock().await;
        if let Some(ui) = pages.get(&key) {
            return Ok(ui.clone());
        }
        let dir = self.workspaces.get(ws).ok_or_else(|| anyhow::anyhow!("no workspace {ws:?}"))?;
        let root = dir.canonicalize().map_err(|e| anyhow::anyhow!("workspace {ws:?} ({}): {e}", dir.display()))?;
        let changes = self.changes(ws, &root)?;
        let parts = Parts {
            config: self.config.clone(),
            gateway: self.gateway.clone(),
            tenant: tenant.id.clone(),
            model: None,
            tab_model: None,
            changes,
            stopping: self.stopping.clone(),
        };
        let mut ui = Ui::new(root, Access::Tenant, parts)?;
        ui.name = ws.to_owned();
        if let Some(service) = &self.runs {
            let tenant = TenantRef { id: tenant.id.clone(), name: tenant.name.clone() };
            let _ = ui.runs.set(caret_host::runs::Runs::served(&self.config, service.clone(), tenant));
        }
        let ui = Arc::new(ui);
        pages.insert(key, ui.clone());
        Ok(ui)
    }

    /// The feed of workspace `ws`'s changes on disk, watched from the first page of it on.
    fn changes(&self, ws: &str, root: &std::path::Path) -> anyhow::Result<broadcast::Sender<Value>> {
        let mut watched = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((tx, _)) = watched.get(ws) {
            return Ok(tx.clone());
        }
        let (tx, _) = broadcast::channel(1024);
        let watcher = files::watch(root, tx.clone())?;
        watched.insert(ws.to_owned(), (tx.clone(), watcher));
        Ok(tx)
    }
}
