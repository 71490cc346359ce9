//! Agent sessions over HTTP, for front ends elsewhere: the same [`Op`]s in and [`Event`]s
//! out as `caret agent` and `caret exec`.
//!
//! - `POST /v1/agent/sessions` `{"workspace", "model"?, "approval"?, "max_steps"?}` starts a
//!   session in one of the workspaces the operator configured (`[server.agent_workspaces]`,
//!   name → directory: the server never takes a path from a request) → `{"id"}`.
//! - `POST /v1/agent/sessions/{id}/ops` takes an [`Op`] (a user input, an approval, an
//!   interrupt, a shutdown) → 202.
//! - `GET /v1/agent/sessions/{id}/events` streams the session's events as server-sent events,
//!   from its first (a client that connects late, or again, misses nothing) until it ends.
//!
//! Sessions belong to the tenant whose token started them, and a person's to that person
//! (admins reach every one); another tenant's or person's id is answered 404 like an unknown
//! one. Models are called through the server's gateway under the
//! tenant's quotas, in the `agent` class; commands run in the sandbox (bubblewrap), in the
//! workspace only, without network. The hosting itself is `sessions`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json as AxumJson};
use caret_index::Tenant;
#[cfg(doc)]
use caret_protocol::agent::Event;
use caret_protocol::agent::{CreateSession, Op, SessionCreated};

use crate::sessions::AgentHost;
use crate::state::{AppState, Caller, Json, Path};
use crate::{Error, Result};

fn host(s: &AppState) -> Result<&Arc<AgentHost>> {
    s.agent.as_ref().ok_or_else(|| {
        Error::Unavailable("no agent workspaces are configured on this server ([server.agent_workspaces])".into())
    })
}

pub(crate) async fn create(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<CreateSession>,
) -> Result<Response> {
    let host = host(&s)?.clone();
    let gateway = s.gateway.clone().ok_or_else(|| Error::Unavailable("no models are configured".into()))?;
    let spender = Arc::new(crate::spend::Person { state: s.clone(), caller: caller.clone() });
    let id = host.start(spender, req, gateway).await?;
    // A person's session is theirs: another member's answers as an unknown one.
    s.own(&caller, "session", &id).await?;
    if let Some(cluster) = &s.cluster {
        // Other replicas send this session's ops and event streams here.
        cluster.place("session", &id).await?;
    }
    Ok((StatusCode::CREATED, AxumJson(SessionCreated { id })).into_response())
}

pub(crate) async fn submit(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Json(op): Json<Op>,
) -> Result<Response> {
    s.visible(&caller, "session", &id, || Error::NotFound(format!("agent session {id}"))).await?;
    host(&s)?.submit(&t.id, &id, op)?;
    Ok(StatusCode::ACCEPTED.into_response())
}

pub(crate) async fn events(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response> {
    s.visible(&caller, "session", &id, || Error::NotFound(format!("agent session {id}"))).await?;
    let (past, live) = host(&s)?.events(&t.id, &id)?;
    Ok(crate::sse::event_stream(past, live, s.stopping.subscribe()))
}
