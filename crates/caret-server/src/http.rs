//! Routes: thin adapters from HTTP to [`Service`]. Every `/v1` request is authenticated and
//! rate limited per token; request logs carry method, route template, status and latency,
//! never bodies, ids of files or anything derived from code.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post, put};
use axum::{Extension, Router};
use caret_crypto::ServerKey;
use caret_protocol::{
    CommitRequest, CreateWorkspace, EmbedRequest, PlanRequest, SERVER_KEY_HEADER, SearchRequest, TreeRequest,
};

use caret_index::Tenant;

use crate::state::{AppState, Caller, Json, Limiting, Path, Query};
use crate::{Error, Result};

/// A route table: paths and what answers on them.
type Routes = Vec<(&'static str, MethodRouter<AppState>)>;

/// Routes holding no tenant's data.
fn public_routes() -> Routes {
    vec![
        ("/healthz", get(|| async { "ok" })),
        ("/readyz", get(ready)),
        ("/metrics", get(metrics)),
        ("/openapi.json", get(openapi)),
        // The fleet dashboard's page and assets (the page asks for an operator token and reads
        // /v1/fleet with it).
        ("/fleet", get(crate::runs::dashboard_page)),
        ("/fleet/app.js", get(crate::runs::dashboard_script)),
        ("/fleet/style.css", get(crate::runs::dashboard_style)),
        // The admin page and its script (the page asks for a token and reads /v1/admin with it).
        ("/admin", get(crate::admin::page)),
        ("/admin/app.js", get(crate::admin::page_script)),
        // An invitation's code is its own credential.
        ("/v1/invitations/accept", post(crate::admin::accept)),
        // Signing in: the provider's answer, codes and refresh tokens are their own credentials.
        ("/v1/auth/methods", get(crate::signin::methods)),
        ("/v1/auth/login", get(crate::signin::login)),
        ("/v1/auth/callback", get(crate::signin::callback)),
        ("/v1/auth/device", get(crate::signin::device_page).post(crate::signin::device_start)),
        ("/v1/auth/token", post(crate::signin::token)),
        ("/v1/auth/ldap", post(crate::signin::ldap)),
        // SCIM discovery describes the service, no organisation's data.
        ("/scim/v2/ServiceProviderConfig", get(crate::scim::service_provider_config)),
        ("/scim/v2/Schemas", get(crate::scim::schema_list)),
        ("/scim/v2/Schemas/{id}", get(crate::scim::schema)),
        ("/scim/v2/ResourceTypes", get(crate::scim::resource_type_list)),
        ("/scim/v2/ResourceTypes/{id}", get(crate::scim::resource_type)),
    ]
}

/// Routes behind a tenant's token.
fn tenant_routes() -> Routes {
    vec![
        ("/v1/workspaces", get(list_workspaces)),
        ("/v1/workspaces/{id}", put(create_workspace).get(workspace).delete(delete_workspace)),
        ("/v1/workspaces/{id}/tree", post(tree)),
        ("/v1/workspaces/{id}/plan", post(plan)),
        ("/v1/workspaces/{id}/commit", post(commit)),
        ("/v1/workspaces/{id}/vectors/missing", get(missing_vectors)),
        ("/v1/workspaces/{id}/embed", post(embed)),
        ("/v1/workspaces/{id}/search", post(search)),
        ("/v1/chat/completions", post(crate::llm::chat_completions)),
        ("/v1/completions", post(crate::llm::completions)),
        ("/v1/embeddings", post(crate::llm::embeddings)),
        ("/v1/models", get(crate::llm::models)),
        ("/v1/apply", post(apply_edit)),
        ("/v1/complete", post(crate::tab::complete)),
        ("/v1/usage", post(report_usage)),
        ("/v1/agent/sessions", post(crate::agent::create)),
        ("/v1/agent/sessions/{id}/ops", post(crate::agent::submit)),
        ("/v1/agent/sessions/{id}/events", get(crate::agent::events)),
        ("/v1/runs", post(crate::runs::create).get(crate::runs::list)),
        ("/v1/runs/{id}", get(crate::runs::get).delete(crate::runs::delete)),
        ("/v1/runs/{id}/cancel", post(crate::runs::cancel)),
        ("/v1/runs/{id}/share", post(crate::runs::share)),
        ("/v1/runs/{id}/events", get(crate::runs::events)),
        ("/v1/runs/{id}/result", get(crate::runs::result)),
        ("/v1/envs", post(crate::runs::create_env).get(crate::runs::list_envs)),
        ("/v1/envs/{id}", delete(crate::runs::close_env)),
        ("/v1/envs/{id}/step", post(crate::runs::step_env)),
        ("/v1/envs/{id}/grade", post(crate::runs::grade_env)),
        ("/v1/docs/sources", post(crate::docs::add).get(crate::docs::list)),
        ("/v1/docs/sources/{name}", delete(crate::docs::remove)),
        ("/v1/docs/sources/{name}/refresh", post(crate::docs::refresh)),
        ("/v1/docs/search", post(crate::docs::search)),
        ("/v1/secrets", get(crate::runs::list_secrets)),
        ("/v1/secrets/{name}", put(crate::runs::put_secret).delete(crate::runs::delete_secret)),
        ("/v1/me", get(crate::admin::me)),
        ("/v1/me/tokens", get(crate::admin::my_tokens).post(crate::admin::create_my_token)),
        ("/v1/me/tokens/{id}", delete(crate::admin::revoke_my_token)),
        ("/v1/auth/logout", post(crate::signin::logout)),
    ]
}

/// Routes of an organisation's admins and owners: a tenant's token with the `admin` scope.
fn admin_routes() -> Routes {
    use crate::admin;
    vec![
        ("/v1/admin/users", get(admin::users).post(admin::add_user)),
        ("/v1/admin/users/{id}", get(admin::user).patch(admin::change_user)),
        ("/v1/admin/tokens", get(admin::tokens).post(admin::create_token)),
        ("/v1/admin/tokens/{id}", delete(admin::revoke_token)),
        ("/v1/admin/groups", get(admin::groups).post(admin::create_group)),
        ("/v1/admin/groups/{id}", delete(admin::delete_group)),
        ("/v1/admin/groups/{id}/models", put(admin::group_models)),
        ("/v1/admin/groups/{id}/budget", put(admin::group_budget)),
        ("/v1/admin/usage", get(admin::usage)),
        ("/v1/admin/settings", get(crate::settings::get).patch(crate::settings::change)),
        ("/v1/admin/flags", get(crate::settings::flags)),
        ("/v1/admin/groups/{id}/members/{user}", put(admin::add_member).delete(admin::remove_member)),
        ("/v1/admin/invitations", post(admin::invite)),
        ("/v1/admin/audit", get(admin::audit)),
        ("/v1/admin/audit/verify", post(admin::verify)),
    ]
}

/// Routes of the identity provider: the organisation's SCIM token, which opens nothing else.
fn scim_routes() -> Routes {
    use crate::scim;
    vec![
        ("/scim/v2/Users", get(scim::list).post(scim::create)),
        ("/scim/v2/Users/{id}", get(scim::get).put(scim::change).patch(scim::change).delete(scim::delete)),
        ("/scim/v2/Groups", get(scim::list).post(scim::create)),
        ("/scim/v2/Groups/{id}", get(scim::get).put(scim::change).patch(scim::change).delete(scim::delete)),
    ]
}

/// Routes of workers and operators: an operator's token, never a tenant's.
fn operator_routes() -> Routes {
    vec![
        ("/v1/workers/lease", post(crate::runs::lease)),
        ("/v1/workers/runs/{id}/bundle", get(crate::runs::bundle)),
        ("/v1/workers/runs/{id}/heartbeat", post(crate::runs::heartbeat)),
        ("/v1/workers/runs/{id}/events", post(crate::runs::append_events)),
        ("/v1/workers/runs/{id}/checkpoint", post(crate::runs::checkpoint)),
        ("/v1/workers/runs/{id}/complete", post(crate::runs::complete)),
        ("/v1/workers/runs/{id}/{token}/v1/chat/completions", post(crate::runs::chat)),
        ("/v1/fleet", get(crate::runs::fleet)),
    ]
}

/// Every path the router answers (besides the pages under `/ui`), with who may call it.
pub fn route_paths() -> Vec<(&'static str, crate::openapi::Access)> {
    use crate::openapi::Access;
    let tagged = |routes: Routes, access| routes.into_iter().map(move |(path, _)| (path, access));
    tagged(public_routes(), Access::Public)
        .chain(tagged(tenant_routes(), Access::Tenant))
        .chain(tagged(admin_routes(), Access::Admin))
        .chain(tagged(scim_routes(), Access::Scim))
        .chain(tagged(operator_routes(), Access::Operator))
        .collect()
}

fn table(routes: Routes) -> Router<AppState> {
    routes.into_iter().fold(Router::new(), |router, (path, methods)| router.route(path, methods))
}

/// The router. `body_limit` caps request bodies (413 beyond it).
pub fn router(state: AppState, body_limit: usize, pages: Option<crate::Pages>) -> Router {
    // Authenticated (and limited, flagged, sent on) first; then, for the heavy capabilities,
    // run in their compartment.
    let compartments = middleware::from_fn_with_state(state.clone(), enter_compartment);
    let v1 = table(tenant_routes())
        .merge(table(admin_routes()))
        .route_layer(compartments.clone())
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    let operators = table(operator_routes())
        .route_layer(compartments)
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate_operator));
    // SCIM behind its own token, every refusal in SCIM's error body.
    let scim = table(scim_routes())
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .route_layer(middleware::from_fn(crate::scim::errors));
    // MCP over Streamable HTTP, behind a tenant's token like /v1.
    let mcp = Router::new()
        .route_service("/mcp", crate::mcp::service(state.clone()))
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    let mut router = Router::new();
    if let Some(pages) = pages {
        let tenant = pages.tenant.route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
        router = router.nest_service("/ui", pages.public.merge(tenant));
    }
    router
        .merge(table(public_routes()))
        .merge(v1)
        .merge(scim)
        .merge(mcp)
        .merge(operators)
        .fallback(|method: axum::http::Method, uri: axum::http::Uri| async move {
            if uri.path().starts_with("/scim/") {
                return crate::scim::unknown(&method, uri.path());
            }
            Error::NotFound("route".into()).into_response()
        })
        .layer(DefaultBodyLimit::max(body_limit))
        // Bodies compressed both ways, negotiated: a request's `Content-Encoding` (zstd or
        // gzip) is undone before the handler reads it, and the body limit above counts the
        // decompressed bytes (a small bomb stops at the limit); answers are compressed when the
        // caller's `Accept-Encoding` allows (not event streams: each event must leave at once).
        .layer(tower_http::decompression::RequestDecompressionLayer::new().no_br().no_deflate())
        .layer(tower_http::compression::CompressionLayer::new().no_br().no_deflate().compress_when(compressible()))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// Which answers are worth compressing: a kilobyte or more, not an event stream, an image or
/// gRPC.
fn compressible() -> impl tower_http::compression::Predicate {
    use tower_http::compression::Predicate as _;
    use tower_http::compression::predicate::{NotForContentType, SizeAbove};
    SizeAbove::new(1024)
        .and(NotForContentType::GRPC)
        .and(NotForContentType::IMAGES)
        .and(NotForContentType::SSE)
        .and(NotForContentType::const_new("application/x-ndjson"))
}

/// What a request body may be compressed with (sent on every answer, so that a client learns
/// it before its first large request).
pub const ACCEPTED_ENCODINGS: &str = "zstd, gzip";

/// The API's description (built once).
async fn openapi() -> Response {
    static DOCUMENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| crate::openapi::document().to_string());
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT.as_str()).into_response()
}

/// Logs and counts every request (route template only).
async fn observe(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().to_string();
    let route = match req.extensions().get::<MatchedPath>() {
        Some(m) => m.as_str(),
        // The pages under `/ui` are a service of their own: one label for all of them.
        None if req.uri().path().starts_with("/ui/") => "/ui/{page}",
        None => "unmatched",
    }
    .to_owned();
    if let Some(len) = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok()) {
        state.metrics.bytes_in.fetch_add(len, Ordering::Relaxed);
    }
    // One span per request, the caller's trace continued: the route's template, never its
    // path (ids of workspaces and sessions stay out too); the tenant's opaque id once known.
    let span = tracing::info_span!(
        "request",
        http.method = %method,
        http.route = %route,
        http.status = tracing::field::Empty,
        tenant = tracing::field::Empty,
        replica = tracing::field::Empty,
    );
    caret_trace::set_parent(&span, caret_trace::from_headers(req.headers()));
    if let Some(c) = &state.cluster {
        span.record("replica", c.me().id.as_str());
    }
    let mut response = tracing::Instrument::instrument(next.run(req), span.clone()).await;
    response.headers_mut().insert(header::ACCEPT_ENCODING, header::HeaderValue::from_static(ACCEPTED_ENCODINGS));
    response
        .headers_mut()
        .insert(caret_protocol::SYNC_VERSION_HEADER, header::HeaderValue::from(caret_protocol::SYNC_VERSION));
    let secs = started.elapsed().as_secs_f64();
    let status = response.status().as_u16();
    span.record("http.status", status);
    // A failure on our side (not a 503: that one says "a moment" or "switched off") is
    // reported once, with its context.
    if status >= 500 && status != 503 {
        let detail = response.extensions().get::<crate::error::Failed>().map(|f| f.0.as_str()).unwrap_or("");
        let tenant = response.extensions().get::<TenantId>().map(|t| t.0.as_str());
        let code = match status {
            500 => "internal",
            502 => "upstream",
            504 => "timeout",
            _ => "server_error",
        };
        let trace_id = caret_trace::trace_id(&span);
        caret_trace::report::failure(&caret_trace::report::Failure {
            method: &method,
            route: &route,
            status,
            code,
            tenant,
            trace_id,
            detail,
        });
    }
    state.metrics.request(&method, &route, status, secs);
    tracing::info!(method, route, status, latency_ms = secs * 1000.0, "request");
    response
}

/// Resolves the bearer token to a tenant, applies the token's rate limit and the flags, and
/// sends a request for what lives in another replica's memory there. A request another
/// replica sent on was limited there: it is only authenticated again.
async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let hop = state.cluster.as_ref().is_some_and(|c| c.is_hop(req.headers()));
    let token = bearer(req.headers());
    // The client address's limit comes first: it also bounds token guessing.
    if !hop
        && let Some(axum::extract::ConnectInfo(peer)) =
            req.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        && let Err(retry_after) = state.limited(Limiting::Address, &peer.ip().to_string()).await
    {
        return Error::RateLimited { retry_after }.into_response();
    }
    // Without a bearer token, a team page's session cookie; a change made with it must carry
    // the session's CSRF token.
    let token = match token {
        Some(t) => t,
        None => match crate::signin::cookie(req.headers(), crate::signin::SESSION_COOKIE) {
            Some(session) if state.sign_in.is_some() => {
                let safe = matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD);
                let sent = req.headers().get(crate::signin::CSRF_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
                if !safe && sent != crate::signin::csrf_of(session) {
                    let why = "a change made with the page's session needs its X-CSRF-Token".to_owned();
                    return Error::Forbidden("csrf", why).into_response();
                }
                session
            }
            _ => return Error::Unauthorized.into_response(),
        },
    };
    let address = crate::state::peer_address(req.extensions());
    let caller = match caller(&state, token, address).await {
        Ok(Some(found)) => found,
        Ok(None) => return Error::Unauthorized.into_response(),
        Err(e) => return e.into_response(),
    };
    let tenant = caller.tenant.clone();
    tracing::Span::current().record("tenant", tenant.id.as_str());
    // One bucket per person (all their tokens), else per token.
    let bucket = caller.principal.user.as_deref().unwrap_or(&caller.principal.credential);
    if !hop && let Err(retry_after) = state.limited(Limiting::Token, bucket).await {
        return Error::RateLimited { retry_after }.into_response();
    }
    // The SCIM token opens SCIM only, and SCIM takes nothing else.
    let scim_route = req.uri().path().starts_with("/scim/");
    if scim_route != (caller.principal.kind == caret_identity::CredentialKind::Scim) {
        let why = if scim_route {
            "this route takes the organisation's SCIM token"
        } else {
            "a SCIM token is for /scim/v2 only"
        };
        return Error::Forbidden("forbidden", why.to_owned()).into_response();
    }
    if let Some(scope) = crate::state::scope(req.uri().path())
        && !caller.principal.may(scope)
    {
        let why = format!("this token may not be used for {} (it lacks the {} scope)", req.uri().path(), scope.name());
        return Error::Forbidden("insufficient_scope", why).into_response();
    }
    if let Some(flag) = capability(req.uri().path())
        && let Err(e) = state.allowed(flag, Some(&tenant.id))
    {
        return e.into_response();
    }
    if !hop {
        match elsewhere(&state, req.uri().path()).await {
            Ok(Some((cluster, replica))) => return cluster.forward(&replica, req).await,
            Ok(None) => {}
            Err(e) => return e.into_response(),
        }
    }
    let id = TenantId(tenant.id.clone());
    req.extensions_mut().insert(tenant);
    req.extensions_mut().insert(caller);
    let mut response = next.run(req).await;
    response.extensions_mut().insert(id);
    response
}

/// Who `token` acts as: from this replica's cache while the identity epoch stands, else
/// the identity store's credentials, else a tenant's API token made before people existed
/// (a service account of its organisation with the member's scopes).
async fn caller(state: &AppState, token: &str, address: String) -> Result<Option<Caller>> {
    let key = caret_crypto::hash_api_token(token);
    let now = caret_identity::db::now_ms();
    if state.identity.is_some()
        && let Some(mut c) = state.credentials.get(&key)
    {
        if c.principal.expired(now) {
            return Ok(None);
        }
        c.address = address;
        return Ok(Some(c));
    }
    let epoch = state.credentials.epoch();
    let found = match &state.identity {
        Some(identity) => match identity.authenticate(token).await? {
            Some(principal) => {
                let _ = identity.touch(&principal.credential).await;
                state.service.db().tenant(&principal.tenant).await?.map(|tenant| (tenant, principal))
            }
            None => None,
        },
        None => None,
    };
    let found = match found {
        Some(f) => Some(f),
        None => state.service.db().authenticate(token).await?.map(|(tenant, id)| {
            let principal = caret_identity::Principal {
                tenant: tenant.id.clone(),
                user: None,
                name: format!("tenant token {id}"),
                role: caret_identity::Role::Member,
                scopes: caret_identity::Role::Member.allows(),
                credential: id,
                kind: caret_identity::CredentialKind::Service,
                expires_at: None,
            };
            (tenant, principal)
        }),
    };
    let Some((tenant, principal)) = found else { return Ok(None) };
    let (models, budget) = match (&state.identity, &principal.user) {
        (Some(identity), Some(user)) => (
            identity.allowed_models(&tenant.id, user).await?.map(Arc::new),
            identity.budget_of(&tenant.id, user).await?,
        ),
        _ => (None, None),
    };
    let caller = Caller { tenant, principal, address, models, budget };
    if state.identity.is_some() {
        state.credentials.put(key, caller.clone(), epoch);
    }
    Ok(Some(caller))
}

/// The tenant a request was made for, on its answer (for the failure report).
#[derive(Debug, Clone)]
struct TenantId(String);

/// Runs the request in its compartment, when its route has one.
async fn enter_compartment(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(compartments) = &state.compartments else { return next.run(req).await };
    let Some(c) = compartments.of(req.uri().path()).cloned() else { return next.run(req).await };
    match c.run(next.run(req)).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// The flag a route answers under, where the path alone tells (search modes and model
/// aliases are checked by their handlers).
fn capability(path: &str) -> Option<&'static str> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    Some(match parts.as_slice() {
        ["v1", "workspaces", _, "embed"] | ["v1", "embeddings"] => "embedding",
        ["v1", "workspaces", _, "search"] => return None,
        ["v1", "workspaces", ..] => "sync",
        ["v1", "complete"] => "tab",
        ["v1", "apply"] => "apply",
        ["v1", "agent", ..] => "agent",
        ["v1", "runs", ..] => "runs",
        ["v1", "envs", ..] => "rollouts",
        _ => return None,
    })
}

/// The other replica what `path` names lives on, when it lives neither here nor nowhere.
async fn elsewhere(
    state: &AppState,
    path: &str,
) -> Result<Option<(std::sync::Arc<crate::cluster::Cluster>, caret_index::cluster::Replica)>> {
    let (Some(cluster), Some((kind, id))) = (&state.cluster, crate::cluster::resident(path)) else { return Ok(None) };
    let here = match kind {
        "session" => state.agent.as_ref().is_some_and(|a| a.holds(&id)),
        _ => state.runs.as_ref().is_some_and(|r| r.episodes().holds(&id)),
    };
    if here {
        return Ok(None);
    }
    Ok(cluster.elsewhere(kind, &id).await?.map(|replica| (cluster.clone(), replica)))
}

/// Lets through requests bearing an operator token. A fleet of workers behind one address
/// (a NAT) makes many requests a second, so valid operator requests are not charged to the
/// client address's limit; refused ones are, and an address over its limit is refused before
/// any token is looked up (guessing stays bounded).
async fn authenticate_operator(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|axum::extract::ConnectInfo(peer)| peer.ip().to_string());
    if let Some(retry_after) = peer.as_ref().and_then(|p| state.ip_limiter.exhausted(p, Instant::now())) {
        return Error::RateLimited { retry_after }.into_response();
    }
    let refused = |state: &AppState| {
        if let Some(p) = &peer
            && let Err(retry_after) = state.ip_limiter.check(p, Instant::now())
        {
            return Error::RateLimited { retry_after }.into_response();
        }
        Error::Unauthorized.into_response()
    };
    let Some(token) = bearer(req.headers()) else { return refused(&state) };
    // Another replica sending on a worker's model call for an episode that lives here.
    if state.cluster.as_ref().is_some_and(|c| c.is_secret(token)) {
        return next.run(req).await;
    }
    match state.service.db().authenticate_operator(token).await {
        Ok(Some(_)) => next.run(req).await,
        Ok(None) => refused(&state),
        Err(e) => Error::from(e).into_response(),
    }
}

/// The bearer token of a request, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

async fn ready(State(state): State<AppState>) -> Response {
    if *state.stopping.borrow() {
        return (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], "not ready: stopping").into_response();
    }
    match (state.service.db().ping().await, state.service.ping_store().await) {
        (Ok(()), Ok(())) => "ready".into_response(),
        (db, store) => {
            tracing::warn!(db_ok = db.is_ok(), store_ok = store.is_ok(), "not ready");
            let what = match (db.is_ok(), store.is_ok()) {
                (false, false) => "not ready: the database and the object store are failing",
                (false, true) => "not ready: the database is failing",
                _ => "not ready: the object store is failing",
            };
            (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], what).into_response()
        }
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    let mut text = state.metrics.render();
    if let Some(g) = &state.gateway {
        text.push_str(&g.metrics_text());
    }
    if let Some(runs) = &state.runs {
        text.push_str(&runs.metrics.render());
    }
    {
        use std::fmt::Write as _;
        let _ = writeln!(
            text,
            "# HELP caret_workspaces_loaded Workspaces whose index is loaded in memory.\n\
             # TYPE caret_workspaces_loaded gauge\ncaret_workspaces_loaded {}\n\
             # HELP caret_workspaces_loaded_bytes Bytes the loaded indexes hold, by estimate (a segment shared by copies counted once).\n\
             # TYPE caret_workspaces_loaded_bytes gauge\ncaret_workspaces_loaded_bytes {}",
            state.service.loaded_count(),
            state.service.loaded_bytes()
        );
    }
    if let Some(cluster) = &state.cluster {
        use std::fmt::Write as _;
        let _ = writeln!(
            text,
            "# HELP caret_replicas_live Replicas seen alive at the last heartbeat (shared limits are split among them).\n\
             # TYPE caret_replicas_live gauge\ncaret_replicas_live {}",
            cluster.live()
        );
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn list_workspaces(State(s): State<AppState>, Extension(t): Extension<Tenant>) -> Result<Response> {
    Ok(axum::Json(s.service.list_workspaces(&t).await?).into_response())
}

async fn create_workspace(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
    Json(req): Json<CreateWorkspace>,
) -> Result<Response> {
    Ok(axum::Json(s.service.create_workspace(&t, &id, &req).await?).into_response())
}

async fn workspace(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<Response> {
    Ok(axum::Json(s.service.workspace_info(&t, &id).await?).into_response())
}

async fn delete_workspace(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<Response> {
    s.service.delete_workspace(&t, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn tree(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
    Json(req): Json<TreeRequest>,
) -> Result<Response> {
    Ok(axum::Json(s.service.tree(&t, &id, &req).await?).into_response())
}

async fn plan(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
    Json(req): Json<PlanRequest>,
) -> Result<Response> {
    Ok(axum::Json(s.service.plan(&t, &id, &req).await?).into_response())
}

async fn commit(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<CommitRequest>,
) -> Result<Response> {
    let key = server_key(&headers, "commit")?;
    let n_files = req.files.len() as u64;
    let response = s.service.commit(&t, &id, &key, req).await?;
    s.metrics.files_committed.fetch_add(n_files, Ordering::Relaxed);
    s.metrics.chunks_stored.fetch_add(response.chunks_stored, Ordering::Relaxed);
    Ok(axum::Json(response).into_response())
}

/// The request's server key (never stored, never logged).
fn server_key(headers: &HeaderMap, action: &str) -> Result<ServerKey> {
    let key = headers
        .get(SERVER_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| Error::BadRequest(format!("the {SERVER_KEY_HEADER} header is required to {action}")))?;
    ServerKey::decode(key).map_err(|e| Error::BadRequest(e.to_string()))
}

/// `?limit=N` of the missing-vectors listing.
#[derive(Debug, serde::Deserialize)]
struct Limit {
    limit: Option<usize>,
}

async fn missing_vectors(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
    Query(q): Query<Limit>,
) -> Result<Response> {
    Ok(axum::Json(s.service.missing_vectors(&t, &id, q.limit.unwrap_or(1000)).await?).into_response())
}

async fn embed(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<EmbedRequest>,
) -> Result<Response> {
    let key = server_key(&headers, "embed")?;
    Ok(axum::Json(s.service.embed(&t, &id, &key, req).await?).into_response())
}

/// Applies an edit in memory: the text comes and goes with the request. A lazy snippet the
/// matcher cannot place is merged by the request's `model`, when it names one.
#[tracing::instrument(name = "apply", skip_all)]
async fn apply_edit(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Json(req): Json<caret_protocol::apply::ApplyRequest>,
) -> Result<Response> {
    crate::llm::check_model_headers(&headers)?;
    let format = match req.format.as_deref() {
        None | Some("auto") => None,
        Some(name) => Some(caret_apply::Format::parse(name).map_err(|e| Error::BadRequest(e.to_string()))?),
    };
    let text = caret_apply::Text::new(&req.text);
    let lazy = format.or_else(|| caret_apply::Format::detect(&req.edit)) == Some(caret_apply::Format::Lazy);
    let (new, format, merge) = match caret_apply::apply(&text, &req.edit, format, req.path.as_deref()) {
        Ok((new, format)) => (new, format, None),
        Err(e) if e.is_unplaced() => match &req.model {
            Some(model) if lazy => {
                crate::spend::admit(&s, &caller, model).await?;
                let (new, facts) = crate::llm::merge(&s, &caller, &headers, &text, &req, model, &e).await?;
                (new, caret_apply::Format::Lazy, Some(facts))
            }
            _ => return Err(Error::EditDoesNotFit(e.to_string())),
        },
        Err(other) => return Err(Error::BadRequest(other.to_string())),
    };
    let rendered = new.render();
    let changed = rendered != req.text;
    let method = if merge.is_some() { "model" } else { "matcher" };
    let resp = caret_protocol::apply::ApplyResponse {
        text: rendered,
        format: format.name().to_owned(),
        changed,
        method: method.to_owned(),
        merge,
    };
    Ok(axum::Json(resp).into_response())
}

async fn search(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<SearchRequest>,
) -> Result<Response> {
    let key = server_key(&headers, "search")?;
    let mode = match req.mode {
        caret_protocol::SearchMode::Hybrid => "hybrid",
        caret_protocol::SearchMode::Lexical => "lexical",
        caret_protocol::SearchMode::Semantic => "semantic",
    };
    s.allowed(&format!("search.{mode}"), Some(&t.id))?;
    let started = std::time::Instant::now();
    let found = s.service.search(&t, &id, &key, &req).await;
    s.usage.record(
        &t.id,
        caller.principal.user.as_deref(),
        "search",
        mode,
        Some(started.elapsed().as_secs_f64() * 1e3),
        found.is_ok(),
    );
    Ok(axum::Json(found?).into_response())
}

/// `POST /v1/usage`: an editor's own events (those [`caret_usage::EVENTS`] lets clients
/// report), kept when this server collects usage.
async fn report_usage(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Json(report): Json<caret_protocol::usage::UsageReport>,
) -> Result<Response> {
    use caret_protocol::usage::{MAX_EVENTS, UsageReply};
    if report.events.len() > MAX_EVENTS {
        return Err(Error::BadRequest(format!(
            "a usage report holds at most {MAX_EVENTS} events, not {}",
            report.events.len()
        )));
    }
    for e in &report.events {
        if !caret_usage::event(&e.event).is_some_and(|k| k.from_clients) {
            return Err(Error::BadRequest(format!("{:?} is not an event editors report", e.event)));
        }
        if e.ms.is_some_and(|ms| !ms.is_finite() || ms < 0.0) {
            return Err(Error::BadRequest(format!("{}: a latency is a number of milliseconds, 0 or more", e.event)));
        }
    }
    let collecting = s.usage.is_on();
    if collecting {
        for e in &report.events {
            s.usage.record(&t.id, caller.principal.user.as_deref(), &e.event, "", e.ms, true);
        }
    }
    let recorded = if collecting { u32::try_from(report.events.len()).unwrap_or(u32::MAX) } else { 0 };
    Ok(axum::Json(UsageReply { recorded, collecting }).into_response())
}
