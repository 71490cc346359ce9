//! Agent sessions run by the server, for front ends elsewhere: the same [`Op`]s in and
//! [`Event`]s out as `caret agent` and `caret exec`, over HTTP.
//!
//! - `POST /v1/agent/sessions` `{"workspace", "model"?, "approval"?, "max_steps"?}` starts a
//!   session in one of the workspaces the operator configured (`[server.agent_workspaces]`,
//!   name → directory: the server never takes a path from a request) → `{"id"}`.
//! - `POST /v1/agent/sessions/{id}/ops` takes an [`Op`] (a user input, an approval, an
//!   interrupt, a shutdown) → 202.
//! - `GET /v1/agent/sessions/{id}/events` streams the session's events as server-sent events,
//!   from its first (a client that connects late, or again, misses nothing) until it ends.
//!
//! Sessions belong to the tenant whose token started them; another tenant's id is answered
//! 404 like an unknown one. Models are called through the server's gateway under the
//! tenant's quotas, in the `agent` class; commands run in the sandbox (bubblewrap), in the
//! workspace only, without network.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json as AxumJson};
use caret_agent::policy::Approval;
use caret_agent::session::{ModelClient, Session};
use caret_agent::tools::{Ctx, Registry};
use caret_models::{CallContext, Class, Gateway};
use caret_protocol::agent::{Event, Op};
use caret_protocol::llm::ChatRequest;
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc};

use crate::db::Tenant;
use crate::http::{AppState, Json, Path};
use crate::{Error, Result};

/// What the operator configured for agent sessions.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// Workspaces sessions may run in, by name (none: `/v1/agent/...` answers 503).
    pub workspaces: BTreeMap<String, PathBuf>,
    /// Command rules of every session (the operator's; a session adds its approvals).
    pub rules: Vec<caret_agent::policy::Rule>,
    /// Sandbox limits of each command.
    pub limits: caret_sandbox::Limits,
    /// Sessions a tenant may have running at once.
    pub max_sessions_per_tenant: usize,
    /// A session nobody sent an op to or watched for this long is shut down.
    pub idle_timeout: Duration,
    /// The Landlock helper for sandboxed commands (see `caret_sandbox::landlock`); none: none.
    pub landlock_helper: Option<PathBuf>,
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            workspaces: BTreeMap::new(),
            rules: Vec::new(),
            limits: caret_sandbox::Limits::standard(),
            max_sessions_per_tenant: 4,
            idle_timeout: Duration::from_secs(3600),
            landlock_helper: None,
        }
    }
}

/// The workspaces agents may work in, and the sessions running.
pub struct AgentHost {
    settings: AgentSettings,
    sessions: Mutex<HashMap<String, Arc<Hosted>>>,
}

impl AgentHost {
    /// A host with these settings.
    pub fn new(settings: AgentSettings) -> AgentHost {
        AgentHost { settings, sessions: Mutex::default() }
    }

    /// Shuts down sessions idle past the timeout; then whether `tenant` may start another.
    fn room_for(&self, tenant: &str) -> bool {
        let sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        let mut running = 0;
        for h in sessions.values() {
            if h.idle() > self.settings.idle_timeout {
                // The forwarder forgets it once the session has ended.
                let _ = h.ops.send(Op::Shutdown);
            } else if h.tenant == tenant {
                running += 1;
            }
        }
        running < self.settings.max_sessions_per_tenant
    }
}

/// A running session as the routes see it.
struct Hosted {
    tenant: String,
    ops: mpsc::UnboundedSender<Op>,
    /// When an op or a watcher last came.
    active: Mutex<Instant>,
    /// Every event so far, and the live feed; written together under this lock so that a
    /// new subscriber gets each event exactly once.
    events: Mutex<(Vec<Event>, Option<broadcast::Sender<Event>>)>,
}

impl Hosted {
    fn touch(&self) {
        *self.active.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    fn idle(&self) -> Duration {
        self.active.lock().unwrap_or_else(PoisonError::into_inner).elapsed()
    }
}

/// `POST /v1/agent/sessions`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// A workspace name from the server's configuration.
    pub workspace: String,
    /// A model alias of the gateway (default: `agent`, else the first).
    pub model: Option<String>,
    /// `never`, `risky` (default) or `always`.
    pub approval: Option<String>,
    /// Model calls a turn may make (default 25).
    pub max_steps: Option<u32>,
}

/// The answer to [`CreateSession`].
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SessionCreated {
    /// The session's id.
    pub id: String,
}

/// The gateway as a session's model, under its tenant's quotas.
struct GatewayModel {
    gateway: Arc<Gateway>,
    tenant: String,
}

#[async_trait::async_trait]
impl ModelClient for GatewayModel {
    async fn chat(&self, req: ChatRequest) -> caret_models::Result<caret_models::EventStream> {
        let ctx = CallContext::new(Class::Agent, Duration::from_secs(600), self.tenant.clone());
        self.gateway.chat(req, ctx).await
    }
}

fn host(s: &AppState) -> Result<&Arc<AgentHost>> {
    s.agent.as_ref().ok_or_else(|| {
        Error::Unavailable("no agent workspaces are configured on this server ([server.agent_workspaces])".into())
    })
}

fn hosted(s: &AppState, t: &Tenant, id: &str) -> Result<Arc<Hosted>> {
    let sessions = host(s)?.sessions.lock().unwrap_or_else(PoisonError::into_inner);
    sessions.get(id).filter(|h| h.tenant == t.id).cloned().ok_or_else(|| Error::NotFound(format!("agent session {id}")))
}

pub(crate) async fn create(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Json(req): Json<CreateSession>,
) -> Result<Response> {
    let host = host(&s)?.clone();
    let gateway = s.gateway.clone().ok_or_else(|| Error::Unavailable("no models are configured".into()))?;
    let root = host
        .settings
        .workspaces
        .get(&req.workspace)
        .ok_or_else(|| Error::NotFound(format!("agent workspace {:?}", req.workspace)))?
        .clone();
    let model = match req.model {
        Some(m) if gateway.aliases().contains(&m) => m,
        Some(m) => return Err(Error::BadRequest(format!("unknown model alias {m:?}"))),
        None => {
            let aliases = gateway.aliases();
            aliases
                .iter()
                .find(|a| *a == "agent")
                .or_else(|| aliases.first())
                .cloned()
                .ok_or_else(|| Error::Unavailable("no models are configured".into()))?
        }
    };
    let approval = match req.approval.as_deref() {
        None | Some("risky") => Approval::Risky,
        Some("never") => Approval::Never,
        Some("always") => Approval::Always,
        Some(other) => return Err(Error::BadRequest(format!("approval is never, risky or always, not {other:?}"))),
    };
    if !host.room_for(&t.id) {
        return Err(Error::Conflict(format!(
            "this tenant already runs {} agent sessions, the most allowed: shut one down first",
            host.settings.max_sessions_per_tenant
        )));
    }
    let ctx = Arc::new(Ctx::new(&root).map_err(|e| Error::Unavailable(format!("agent workspace: {e}")))?);
    let mut tools = Registry::workspace();
    let mut policy =
        caret_sandbox::Policy::new(&ctx.root).map_err(|e| Error::Unavailable(e.to_string()))?.with_toolchains();
    policy.limits = host.settings.limits;
    if let Some(helper) = &host.settings.landlock_helper {
        policy = policy.with_landlock(helper.clone());
    }
    let sandbox = tokio::task::spawn_blocking(move || caret_sandbox::Bwrap::new(policy))
        .await
        .map_err(|e| Error::Unavailable(e.to_string()))?;
    match sandbox {
        Ok(sandbox) => {
            if let Some(why) = sandbox.landlock_unavailable() {
                tracing::warn!("agent session commands: {why}");
            }
            let sandbox: Arc<dyn caret_sandbox::Sandbox> = Arc::new(sandbox);
            tools.add(Arc::new(caret_agent::tools::terminal::RunTerminalCmd::new(sandbox.clone())));
            tools.add(Arc::new(caret_agent::tools::lints::ReadLints::new(sandbox)));
        }
        Err(e) => tracing::warn!("agent sessions run without run_terminal_cmd and read_lints: {e}"),
    }
    let client = Arc::new(GatewayModel { gateway, tenant: t.id.clone() });
    let mut session = Session::new(client, &model, tools, ctx);
    session.policy.approval = approval;
    session.policy.rules = host.settings.rules.clone();
    session.max_steps = req.max_steps.unwrap_or(25).clamp(1, 200);

    let id = format!("as-{:016x}", fastrand::u64(..));
    let (ops_tx, mut ops) = mpsc::unbounded_channel();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (live, _) = broadcast::channel(1024);
    let hosted = Arc::new(Hosted {
        tenant: t.id.clone(),
        ops: ops_tx,
        active: Mutex::new(Instant::now()),
        events: Mutex::new((Vec::new(), Some(live))),
    });
    let _ = events_tx.send(Event::SessionConfigured {
        session_id: id.clone(),
        model: model.clone(),
        cwd: req.workspace.clone(),
    });
    // The session, then a forwarder that keeps every event and feeds subscribers.
    tokio::spawn(async move {
        session.serve(&mut ops, &events_tx).await;
    });
    let feed = hosted.clone();
    let (host2, id2) = (host.clone(), id.clone());
    tokio::spawn(async move {
        while let Some(e) = events.recv().await {
            let mut g = feed.events.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(live) = &g.1 {
                let _ = live.send(e.clone());
            }
            g.0.push(e);
        }
        // The session ended: streams end; the session is forgotten.
        feed.events.lock().unwrap_or_else(PoisonError::into_inner).1 = None;
        host2.sessions.lock().unwrap_or_else(PoisonError::into_inner).remove(&id2);
    });
    host.sessions.lock().unwrap_or_else(PoisonError::into_inner).insert(id.clone(), hosted);
    Ok((StatusCode::CREATED, AxumJson(SessionCreated { id })).into_response())
}

pub(crate) async fn submit(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
    Json(op): Json<Op>,
) -> Result<Response> {
    let h = hosted(&s, &t, &id)?;
    h.touch();
    h.ops.send(op).map_err(|_| Error::NotFound(format!("agent session {id} (it has ended)")))?;
    Ok(StatusCode::ACCEPTED.into_response())
}

pub(crate) async fn events(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<Response> {
    let h = hosted(&s, &t, &id)?;
    h.touch();
    let (past, live) = {
        let g = h.events.lock().unwrap_or_else(PoisonError::into_inner);
        (g.0.clone(), g.1.as_ref().map(broadcast::Sender::subscribe))
    };
    Ok(event_stream(past, live, s.stopping.subscribe()))
}

/// A server-sent event stream of `past`, then of `live` until it closes or the server stops
/// (a subscriber too slow for the channel's capacity loses the oldest and goes on). Each event
/// is one `data:` line of JSON.
pub fn event_stream<T: Serialize + Clone + Send + 'static>(
    past: Vec<T>,
    live: Option<broadcast::Receiver<T>>,
    stopping: tokio::sync::watch::Receiver<bool>,
) -> Response {
    let live = futures::stream::unfold(live, |rx| async move {
        let mut rx = rx?;
        loop {
            match rx.recv().await {
                Ok(e) => return Some((e, Some(rx))),
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let body = until_stopping(
        futures::stream::iter(past)
            .chain(live)
            .map(|e| format!("data: {}\n\n", serde_json::to_string(&e).unwrap_or_default()))
            .map(|s| Ok::<_, Infallible>(bytes::Bytes::from(s))),
        stopping,
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|e| Error::Unavailable(e.to_string()).into_response())
}

/// `stream` until `stopping` turns true (or its sender goes away): a server that stops ends
/// its event streams, so that draining the connections does not wait on them.
pub fn until_stopping<S: futures::Stream + Send + 'static>(
    stream: S,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> impl futures::Stream<Item = S::Item> + Send + 'static {
    stream.take_until(Box::pin(async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    }))
}
