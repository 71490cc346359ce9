//! Background runs over HTTP: the tenants' routes (`/v1/runs`, `/v1/secrets`), the workers'
//! routes (`/v1/workers/…`, operator token) and the operators' fleet view (`/v1/fleet`).
//! Thin adapters over `caret_anyrun::runs::RunService`.
//!
//! - `POST /v1/runs` `CreateRun` → 201 `RunInfo`; `GET /v1/runs?limit=N`; `GET /v1/runs/{id}`;
//!   `POST /v1/runs/{id}/cancel`; `DELETE /v1/runs/{id}` (an ended run, now).
//! - `GET /v1/runs/{id}/events` — server-sent events: `id:` the event's number, `data:` the
//!   event (the agent's, or the run's own lifecycle). Resumes after `Last-Event-ID` (or
//!   `?after=N`); ends after the run's last event. `?follow=false` answers the events so far
//!   as a JSON array instead.
//! - `GET /v1/runs/{id}/result` → `RunResult` (409 until the run has ended with one).
//!
//! - `POST /v1/envs` `CreateEnv` → 201 `Observation`; `GET /v1/envs`;
//!   `POST /v1/envs/{id}/step` `Step` → `Observation`; `POST /v1/envs/{id}/grade` → `Graded`;
//!   `DELETE /v1/envs/{id}` (the environment API: episodes for an external policy).
//!
//! Another tenant's run (or episode) answers exactly like a missing one.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json as AxumJson};
use caret_anyrun::runs::{RunService, TenantRef};
use caret_identity::Role;
use caret_protocol::envs::{CreateEnv, EnvList, Step};
use caret_protocol::llm::ChatRequest;
use caret_protocol::runs::{
    CheckpointBody, Completion, CreateRun, EventBatch, Heartbeat, HeartbeatAnswer, LeaseRef, LeaseRequest, PutSecret,
    RunList, SecretList, ShareRun,
};
use serde::Deserialize;

use crate::state::{AppState, Caller, Json, Path, Query};
use crate::{Error, Result};
use caret_index::db::Tenant;

impl From<caret_anyrun::Error> for Error {
    fn from(e: caret_anyrun::Error) -> Self {
        use caret_anyrun::Error as E;
        match e {
            E::BadRequest(m) => Error::BadRequest(m),
            E::NotFound(m) => Error::NotFound(m),
            E::Conflict(m) => Error::Conflict(m),
            E::TooMany(m) => Error::TooMany(m),
            e @ E::Fenced(_) => Error::Conflict(e.to_string()),
            E::Unavailable(m) => Error::Unavailable(m),
            E::Database(e) => e.into(),
            E::Internal(m) => Error::Internal(m),
            other @ (E::Store { .. } | E::Seal { .. } | E::Open { .. } | E::Json { .. } | E::Schema(_)) => {
                Error::Runs(other)
            }
        }
    }
}

fn service(s: &AppState) -> Result<&Arc<RunService>> {
    s.runs.as_ref().ok_or_else(|| Error::Unavailable("background runs are not enabled on this server".into()))
}

/// Whether the caller may start a run on the model `asked` (none: the default): their groups
/// allow it and their budget is not spent (a run's calls count for them). An external policy's
/// rollout (`policy`) calls no model of the server's.
pub(crate) async fn allowed(s: &AppState, caller: &Caller, asked: Option<&str>, policy: bool) -> Result<()> {
    if policy {
        return Ok(());
    }
    let alias = service(s)?.model_alias(asked)?;
    crate::spend::admit(s, caller, &alias).await.map(|_| ())
}

fn tenant(t: &Tenant) -> TenantRef {
    TenantRef { id: t.id.clone(), name: t.name.clone() }
}

pub(crate) async fn create(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<CreateRun>,
) -> Result<Response> {
    if req.rollout.is_some() {
        s.allowed("rollouts", Some(&t.id))?;
    }
    allowed(&s, &caller, req.model.as_deref(), req.rollout.as_ref().is_some_and(|r| r.policy)).await?;
    let submitted = service(&s)?.submit(&tenant(&t), req).await.map_err(Error::from);
    // A person's run is theirs (members see their own and shared ones).
    if let Ok(info) = &submitted {
        s.own(&caller, "run", &info.id).await?;
    }
    let (target, outcome) = match &submitted {
        Ok(info) => (info.id.as_str(), "ok".to_owned()),
        Err(e) => ("-", format!("failed: {}", e.status().1)),
    };
    s.audit(&caller, "run.submit", target, &outcome).await?;
    Ok((StatusCode::CREATED, AxumJson(submitted?)).into_response())
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    limit: Option<u32>,
}

pub(crate) async fn list(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> Result<Response> {
    let runs = service(&s)?.list(&t.id, q.limit.unwrap_or(50)).await?;
    let runs = seen(&s, &caller, runs).await?;
    Ok(AxumJson(RunList { runs }).into_response())
}

/// The runs of `runs` the caller may see: their own, shared ones and the organisation's (an
/// admin sees all).
pub(crate) async fn seen(
    s: &AppState,
    caller: &Caller,
    mut runs: Vec<caret_protocol::runs::RunInfo>,
) -> Result<Vec<caret_protocol::runs::RunInfo>> {
    if let Some(identity) = &s.identity
        && caller.principal.role < Role::Admin
    {
        let ids: Vec<String> = runs.iter().map(|r| r.id.clone()).collect();
        let owners = identity.owners(&caller.tenant.id, "run", &ids).await?;
        runs.retain(|r| owners.get(&r.id).is_none_or(|o| o.shared || caller.principal.user.as_ref() == Some(&o.user)));
    }
    Ok(runs)
}

/// Refuses, as a missing one, another person's run that is not shared with the organisation.
pub(crate) async fn visible(s: &AppState, caller: &Caller, id: &str) -> Result<()> {
    s.visible(caller, "run", id, || Error::NotFound(format!("run {id}"))).await
}

pub(crate) async fn get(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response> {
    visible(&s, &caller, &id).await?;
    Ok(AxumJson(service(&s)?.get(&t.id, &id).await?).into_response())
}

/// `POST /v1/runs/{id}/share`: a person's run shared with the organisation, or no longer
/// (its owner's or an admin's to change).
pub(crate) async fn share(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Json(req): Json<ShareRun>,
) -> Result<Response> {
    let identity = s.identity()?.clone();
    let owner = identity.owner(&t.id, "run", &id).await?;
    let mine = owner.as_ref().is_some_and(|o| caller.principal.user.as_ref() == Some(&o.user));
    if !mine && caller.principal.role < Role::Admin {
        visible(&s, &caller, &id).await?;
        return Err(Error::Forbidden("forbidden", "only its owner or an admin shares a run".into()));
    }
    s.audited(&caller, if req.shared { "run.share" } else { "run.unshare" }, &id, async {
        Ok(identity.share(&t.id, "run", &id, req.shared).await?)
    })
    .await?;
    Ok(AxumJson(service(&s)?.get(&t.id, &id).await?).into_response())
}

pub(crate) async fn cancel(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response> {
    visible(&s, &caller, &id).await?;
    let runs = service(&s)?;
    let info = s.audited(&caller, "run.cancel", &id, async { Ok(runs.cancel(&t.id, &id).await?) }).await?;
    Ok(AxumJson(info).into_response())
}

pub(crate) async fn delete(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response> {
    visible(&s, &caller, &id).await?;
    // Its owner record goes with it (`spend::RunPeople`).
    service(&s)?.delete(&t.id, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(crate) async fn result(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response> {
    visible(&s, &caller, &id).await?;
    Ok(AxumJson(service(&s)?.result(&t.id, &id).await?).into_response())
}

#[derive(Debug, Deserialize)]
pub(crate) struct EventsQuery {
    after: Option<u64>,
    follow: Option<bool>,
}

/// How often a followed run's new events are looked for.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

pub(crate) async fn events(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response> {
    visible(&s, &caller, &id).await?;
    let runs = service(&s)?.clone();
    let last_seen = headers.get("last-event-id").and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    let after = last_seen.or(q.after).unwrap_or(0);
    // Checks the run is the tenant's before anything streams.
    let first = runs.events(&t.id, &id, after, 1000).await?;
    if q.follow == Some(false) {
        return Ok(AxumJson(first).into_response());
    }
    let tenant_id = t.id.clone();
    let stream = futures::stream::unfold(
        (runs, tenant_id, id, after, Some(first), false),
        |(runs, tenant_id, id, mut after, mut pending, mut ended)| async move {
            loop {
                let batch = match pending.take() {
                    Some(b) => b,
                    None if ended => return None,
                    None => {
                        // The state is read before the events: a run seen ended has all its
                        // events in the next read.
                        let state = runs.get(&tenant_id, &id).await.ok()?.state;
                        ended = state.is_final();
                        let b = runs.events(&tenant_id, &id, after, 1000).await.ok()?;
                        if b.is_empty() && !ended {
                            tokio::time::sleep(FOLLOW_POLL).await;
                        }
                        b
                    }
                };
                if batch.is_empty() {
                    continue;
                }
                after = batch.last().map_or(after, |e| e.seq);
                let text: String = batch
                    .iter()
                    .map(|e| {
                        format!("id: {}\ndata: {}\n\n", e.seq, serde_json::to_string(&e.event).unwrap_or_default())
                    })
                    .collect();
                return Some((
                    Ok::<_, Infallible>(bytes::Bytes::from(text)),
                    (runs, tenant_id, id, after, None, ended),
                ));
            }
        },
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(crate::sse::until_stopping(stream, s.stopping.subscribe())))
        .map_err(|e| Error::Internal(e.to_string()))
}

pub(crate) async fn put_secret(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(name): Path<String>,
    Json(req): Json<PutSecret>,
) -> Result<Response> {
    service(&s)?.put_secret(&t.id, &name, &req.value).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(crate) async fn list_secrets(State(s): State<AppState>, Extension(t): Extension<Tenant>) -> Result<Response> {
    Ok(AxumJson(SecretList { names: service(&s)?.secret_names(&t.id).await? }).into_response())
}

pub(crate) async fn delete_secret(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(name): Path<String>,
) -> Result<Response> {
    service(&s)?.delete_secret(&t.id, &name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

// ---- workers (operator token) ----

pub(crate) async fn lease(State(s): State<AppState>, Json(req): Json<LeaseRequest>) -> Result<Response> {
    match service(&s)?.lease(&req).await? {
        Some(lease) => Ok(AxumJson(lease).into_response()),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct TokenQuery {
    token: u64,
}

pub(crate) async fn bundle(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<TokenQuery>,
) -> Result<Response> {
    let bytes = service(&s)?.bundle(&LeaseRef { run: id, token: q.token }).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

fn same_run(id: &str, lease: &LeaseRef) -> Result<()> {
    if lease.run == id { Ok(()) } else { Err(Error::BadRequest("the lease names another run".into())) }
}

pub(crate) async fn heartbeat(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Json(req): Json<Heartbeat>,
) -> Result<Response> {
    same_run(&id, &req.lease)?;
    let cancel = service(&s)?.heartbeat(&req.lease, req.usage).await?;
    Ok(AxumJson(HeartbeatAnswer { cancel }).into_response())
}

pub(crate) async fn checkpoint(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Json(req): Json<CheckpointBody>,
) -> Result<Response> {
    same_run(&id, &req.lease)?;
    service(&s)?.checkpoint(&req).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(crate) async fn append_events(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Json(req): Json<EventBatch>,
) -> Result<Response> {
    same_run(&id, &req.lease)?;
    service(&s)?.append_events(&req.lease, &req.events).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(crate) async fn complete(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Json(req): Json<Completion>,
) -> Result<Response> {
    same_run(&id, &req.lease)?;
    Ok(AxumJson(service(&s)?.complete(req).await?).into_response())
}

/// A leased run's model calls: OpenAI-compatible, so workers use the gateway's own provider.
pub(crate) async fn chat(
    State(s): State<AppState>,
    Path((id, token)): Path<(String, u64)>,
    Json(req): Json<ChatRequest>,
) -> Response {
    let runs = match service(&s) {
        Ok(r) => r.clone(),
        Err(e) => return e.into_response(),
    };
    if req.messages.is_empty() {
        return Error::BadRequest("messages must not be empty".into()).into_response();
    }
    let usage_wanted = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let alias = req.model.clone();
    match runs.chat(&LeaseRef { run: id, token }, req).await {
        Ok(events) => crate::llm::stream_chat(events, alias, usage_wanted),
        Err(e) => crate::llm::gateway_error(&e),
    }
}

/// `POST /v1/envs`: an episode for an external policy → 201 and its first observation.
pub(crate) async fn create_env(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Json(req): Json<CreateEnv>,
) -> Result<Response> {
    let obs = service(&s)?.create_episode(&tenant(&t), req).await?;
    Ok((StatusCode::CREATED, AxumJson(obs)).into_response())
}

/// `GET /v1/envs`: the tenant's open episodes.
pub(crate) async fn list_envs(State(s): State<AppState>, Extension(t): Extension<Tenant>) -> Result<Response> {
    Ok(AxumJson(EnvList { episodes: service(&s)?.episodes().list(&t.id) }).into_response())
}

/// `POST /v1/envs/{id}/step`: the policy's message → what the tools answered.
pub(crate) async fn step_env(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
    Json(req): Json<Step>,
) -> Result<Response> {
    Ok(AxumJson(service(&s)?.step_episode(&t.id, &id, req.message).await?).into_response())
}

/// `POST /v1/envs/{id}/grade`: ends the turn, runs the grader → the reward.
pub(crate) async fn grade_env(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<Response> {
    Ok(AxumJson(service(&s)?.grade_episode(&t.id, &id).await?).into_response())
}

/// `DELETE /v1/envs/{id}`: closes the episode (its run cancelled if still going).
pub(crate) async fn close_env(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<Response> {
    service(&s)?.close_episode(&t.id, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(crate) async fn fleet(State(s): State<AppState>) -> Result<Response> {
    Ok(AxumJson(service(&s)?.fleet().await?).into_response())
}

/// The dashboard's headers: its own scripts and styles only, talking to this server only,
/// never framed, never cached.
pub(crate) fn dashboard_asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (axum::http::header::CONTENT_TYPE, content_type),
            (
                axum::http::header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                 base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            ),
            (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (axum::http::header::REFERRER_POLICY, "no-referrer"),
            (axum::http::header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

pub(crate) async fn dashboard_page() -> Response {
    dashboard_asset("text/html; charset=utf-8", include_str!("fleet/index.html"))
}

pub(crate) async fn dashboard_script() -> Response {
    dashboard_asset("text/javascript; charset=utf-8", include_str!("fleet/app.js"))
}

pub(crate) async fn dashboard_style() -> Response {
    dashboard_asset("text/css; charset=utf-8", include_str!("fleet/style.css"))
}
