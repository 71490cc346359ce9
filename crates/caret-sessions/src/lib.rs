//! Agent sessions hosted by a team server for its people: the workspaces the operator
//! configured, the sessions running in them (each a [`Session`] whose model is the gateway
//! under its tenant's quotas and its person's model list and budget — a [`Spender`] — and whose
//! commands run in the sandbox), every event kept for late subscribers, idle sessions shut
//! down, turns and tool calls counted for usage telemetry. `caret-server`'s routes translate
//! HTTP to this; nothing here knows HTTP.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use caret_agent::policy::Approval;
use caret_agent::session::{ModelClient, Session};
use caret_agent::tools::{Ctx, Registry};
use caret_models::{CallContext, Class, Gateway};
use caret_protocol::agent::{CreateSession, Event, Op};
use caret_protocol::llm::ChatRequest;
use tokio::sync::{broadcast, mpsc};

/// Why a session could not start or be reached.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such workspace or session (another tenant's is as unknown as a made-up one).
    #[error("{0}")]
    NotFound(String),
    /// The request names something invalid.
    #[error("{0}")]
    BadRequest(String),
    /// The person may not use the model.
    #[error("{0}")]
    ModelNotAllowed(String),
    /// The tenant runs as many sessions as it may.
    #[error("{0}")]
    Conflict(String),
    /// Something the session needs is missing (models, the workspace, the sandbox).
    #[error("{0}")]
    Unavailable(String),
}

/// A `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Whose a session's model calls are: the person's model list and daily budget, and counting
/// what each call spends for them. (A caller without either allows everything and counts
/// nothing.)
#[async_trait::async_trait]
pub trait Spender: Send + Sync {
    /// The tenant's id.
    fn tenant(&self) -> &str;
    /// The person's opaque id, for usage telemetry (none: not a person).
    fn user(&self) -> Option<&str>;
    /// Whether they may use the model `alias`: `Err` with why not.
    fn may_use(&self, alias: &str) -> std::result::Result<(), String>;
    /// Whether a model call may go now: `Err` with why not (their budget is spent).
    async fn admit(&self) -> std::result::Result<(), String>;
    /// `events` of a call of `model`, the tokens they report counted for them.
    fn meter(&self, events: caret_models::EventStream, model: &str) -> caret_models::EventStream;
}

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
    /// MCP servers of each workspace's sessions, by workspace name (stdio ones run in the
    /// session's sandbox).
    pub mcp_servers: BTreeMap<String, Vec<caret_mcp::ServerConfig>>,
    /// Model aliases that take images in their input.
    pub image_models: Vec<String>,
    /// What remote MCP servers' connections may reach (through a proxy of the session's).
    pub egress: caret_sandbox::egress::Egress,
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
            mcp_servers: BTreeMap::new(),
            image_models: Vec::new(),
            egress: caret_sandbox::egress::Egress::Guarded(Vec::new()),
        }
    }
}

/// The workspaces agents may work in, and the sessions running.
pub struct AgentHost {
    settings: AgentSettings,
    sessions: Mutex<HashMap<String, Arc<Hosted>>>,
    usage: caret_usage::Recorder,
}

impl AgentHost {
    /// A host with these settings, recording turns and tool calls in `usage`.
    pub fn new(settings: AgentSettings, usage: caret_usage::Recorder) -> AgentHost {
        AgentHost { settings, sessions: Mutex::default(), usage }
    }

    /// Whether session `id` lives here (in this process's memory).
    pub fn holds(&self, id: &str) -> bool {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner).contains_key(id)
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

    /// Starts a session for `spender`'s caller in one of the configured workspaces, its model
    /// called through `gateway` under the tenant's quotas and the person's model list and
    /// budget; returns its id.
    pub async fn start(
        self: &Arc<Self>,
        spender: Arc<dyn Spender>,
        req: CreateSession,
        gateway: Arc<Gateway>,
    ) -> Result<String> {
        let tenant = spender.tenant().to_owned();
        let root = self
            .settings
            .workspaces
            .get(&req.workspace)
            .ok_or_else(|| Error::NotFound(format!("agent workspace {:?}", req.workspace)))?
            .clone();
        let model = match req.model {
            Some(m) if gateway.aliases().contains(&m) => m,
            Some(m) => return Err(Error::BadRequest(format!("unknown model alias {m:?}"))),
            None => {
                // `agent`, or the first alias the person may use.
                let aliases = gateway.aliases();
                let usable = |a: &&String| spender.may_use(a).is_ok();
                aliases
                    .iter()
                    .filter(usable)
                    .find(|a| *a == "agent")
                    .or_else(|| aliases.iter().find(usable))
                    .or_else(|| aliases.first())
                    .cloned()
                    .ok_or_else(|| Error::Unavailable("no models are configured".into()))?
            }
        };
        spender.may_use(&model).map_err(Error::ModelNotAllowed)?;
        let approval = match req.approval.as_deref() {
            None | Some("risky") => Approval::Risky,
            Some("never") => Approval::Never,
            Some("always") => Approval::Always,
            Some(other) => return Err(Error::BadRequest(format!("approval is never, risky or always, not {other:?}"))),
        };
        if !self.room_for(&tenant) {
            return Err(Error::Conflict(format!(
                "this tenant already runs {} agent sessions, the most allowed: shut one down first",
                self.settings.max_sessions_per_tenant
            )));
        }
        // The workspace's rules files (the server has no user of its own to add).
        let ctx = Ctx::new(&root).map_err(|e| Error::Unavailable(format!("agent workspace: {e}")))?;
        let ctx = Arc::new(ctx.with_workspace_rules());
        let mut tools = Registry::workspace();
        let mut policy =
            caret_sandbox::Policy::new(&ctx.root).map_err(|e| Error::Unavailable(e.to_string()))?.with_toolchains();
        policy.limits = self.settings.limits;
        if let Some(helper) = &self.settings.landlock_helper {
            policy = policy.with_landlock(helper.clone());
        }
        let sandbox = tokio::task::spawn_blocking(move || caret_sandbox::Bwrap::new(policy))
            .await
            .map_err(|e| Error::Unavailable(e.to_string()))?;
        let mut launcher: Option<Arc<dyn caret_mcp::Launcher>> = None;
        match sandbox {
            Ok(sandbox) => {
                if let Some(why) = sandbox.landlock_unavailable() {
                    tracing::warn!("agent session commands: {why}");
                }
                let sandbox: Arc<dyn caret_sandbox::Sandbox> = Arc::new(sandbox);
                tools.add(Arc::new(caret_agent::tools::terminal::RunTerminalCmd::new(sandbox.clone())));
                tools.add(Arc::new(caret_agent::tools::lints::ReadLints::new(sandbox.clone())));
                launcher = Some(Arc::new(caret_mcp::sandboxed::SandboxLauncher::new(sandbox, &ctx.root)));
            }
            Err(e) => tracing::warn!("agent sessions run without run_terminal_cmd and read_lints: {e}"),
        }
        let user = spender.user().map(str::to_owned);
        let client = Arc::new(GatewayModel { gateway, spender });
        let mut session = Session::new(client, &model, tools, ctx);
        session.images = self.settings.image_models.contains(&model);
        // The workspace's MCP servers, started alongside the first model call; stdio ones in
        // the session's sandbox (none without one).
        let mut gates = None;
        if let Some(servers) = self.settings.mcp_servers.get(&req.workspace).filter(|s| !s.is_empty()) {
            let stdio = |c: &caret_mcp::ServerConfig| matches!(c.transport, caret_mcp::Transport::Stdio { .. });
            let usable: Vec<_> = servers.iter().filter(|c| launcher.is_some() || !stdio(c)).cloned().collect();
            let gate = caret_mcp::sandboxed::remote_gate(&usable, &self.settings.egress).map_err(Error::Unavailable)?;
            let proxy = gate.as_ref().map(caret_sandbox::netproxy::Gate::url);
            session.add_dynamic_tools(caret_mcp::Hub::placed(usable, &caret_mcp::Place { launcher, proxy }));
            gates = gate;
        }
        session.policy.approval = approval;
        session.policy.rules = self.settings.rules.clone();
        session.max_steps = req.max_steps.unwrap_or(25).clamp(1, 200);

        let id = format!("as-{:016x}", fastrand::u64(..));
        let (ops_tx, mut ops) = mpsc::unbounded_channel();
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let (live, _) = broadcast::channel(1024);
        let hosted = Arc::new(Hosted {
            tenant,
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
            drop(gates);
        });
        let feed = hosted.clone();
        let (host2, id2) = (self.clone(), id.clone());
        let mut usage = Timings::new(self.usage.clone(), feed.tenant.clone(), user);
        tokio::spawn(async move {
            while let Some(e) = events.recv().await {
                usage.see(&e);
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
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner).insert(id.clone(), hosted);
        Ok(id)
    }

    /// Sends `op` to `tenant`'s session `id`.
    pub fn submit(&self, tenant: &str, id: &str, op: Op) -> Result<()> {
        let h = self.hosted(tenant, id)?;
        h.touch();
        h.ops.send(op).map_err(|_| Error::NotFound(format!("agent session {id} (it has ended)")))
    }

    /// `tenant`'s session `id`'s events so far, and the live feed while it runs.
    pub fn events(&self, tenant: &str, id: &str) -> Result<(Vec<Event>, Option<broadcast::Receiver<Event>>)> {
        let h = self.hosted(tenant, id)?;
        h.touch();
        let g = h.events.lock().unwrap_or_else(PoisonError::into_inner);
        Ok((g.0.clone(), g.1.as_ref().map(broadcast::Sender::subscribe)))
    }

    /// The session `id` if `tenant` owns it (another tenant's is as unknown as a made-up one).
    fn hosted(&self, tenant: &str, id: &str) -> Result<Arc<Hosted>> {
        let sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions
            .get(id)
            .filter(|h| h.tenant == tenant)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("agent session {id}")))
    }
}

/// A session's turns and tool calls, counted from its events for usage telemetry.
struct Timings {
    usage: caret_usage::Recorder,
    tenant: String,
    user: Option<String>,
    turn: Option<Instant>,
}

impl Timings {
    fn new(usage: caret_usage::Recorder, tenant: String, user: Option<String>) -> Timings {
        Timings { usage, tenant, user, turn: None }
    }

    fn see(&mut self, e: &Event) {
        if !self.usage.is_on() {
            return;
        }
        let ms = |t: Instant| Some(t.elapsed().as_secs_f64() * 1e3);
        match e {
            Event::TurnBegin { .. } => self.turn = Some(Instant::now()),
            Event::TurnEnd { reason, .. } => {
                let how = serde_json::to_value(reason).ok().and_then(|v| v.as_str().map(str::to_owned));
                let failed = matches!(reason, caret_protocol::agent::TurnEnd::Failed);
                let took = self.turn.take().and_then(ms);
                self.usage.record(
                    &self.tenant,
                    self.user.as_deref(),
                    "agent.turn",
                    how.as_deref().unwrap_or(""),
                    took,
                    !failed,
                );
            }
            Event::ToolCallEnd { name, ok, duration_ms, .. } => {
                self.usage.record(&self.tenant, self.user.as_deref(), "agent.tool", name, Some(*duration_ms), *ok);
            }
            _ => {}
        }
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

/// The gateway as a session's model, under its tenant's quotas and its person's budget.
struct GatewayModel {
    gateway: Arc<Gateway>,
    spender: Arc<dyn Spender>,
}

#[async_trait::async_trait]
impl ModelClient for GatewayModel {
    async fn chat(&self, req: ChatRequest) -> caret_models::Result<caret_models::EventStream> {
        // Past the budget, the turn ends with the reason (not retried: it renews tomorrow).
        if let Err(message) = self.spender.admit().await {
            return Err(caret_models::Error::Rejected { upstream: "caret".into(), status: 429, message });
        }
        let model = req.model.clone();
        let ctx = CallContext::new(Class::Agent, Duration::from_secs(600), self.spender.tenant().to_owned());
        Ok(self.spender.meter(self.gateway.chat(req, ctx).await?, &model))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_and_tool_calls_are_counted_from_a_sessions_events_without_their_content() {
        let dir = caret_test_support::TempDir::new();
        let store: Arc<dyn object_store::ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let usage = caret_usage::Recorder::new(store.clone(), caret_usage::Settings::default());
        let mut timings = Timings::new(usage.clone(), "t1".to_owned(), Some("u-1".to_owned()));
        let call = |id: &str, name: &str, ok: bool| Event::ToolCallEnd {
            call_id: id.to_owned(),
            name: name.to_owned(),
            ok,
            output: "fn canary_code() {}".to_owned(),
            duration_ms: 12.0,
        };
        timings.see(&Event::TurnBegin { turn: 1 });
        timings.see(&call("c1", "read_file", true));
        timings.see(&call("c2", "run_terminal_cmd", false));
        timings.see(&call("c3", "read_file", true));
        timings.see(&Event::TurnEnd { turn: 1, reason: caret_protocol::agent::TurnEnd::StepLimit });
        timings.see(&Event::TurnBegin { turn: 2 });
        timings.see(&Event::TurnEnd { turn: 2, reason: caret_protocol::agent::TurnEnd::Failed });
        usage.flush().await.unwrap();
        let read = caret_usage::read(store.as_ref(), Some("t1"), 0).await.unwrap();
        let got: Vec<(String, String, u64, u64)> = caret_usage::summarise(&read.rows, false)
            .into_iter()
            .map(|s| (s.event, s.label, s.count, s.failed))
            .collect();
        let want = [
            ("agent.tool", "read_file", 2, 0),
            ("agent.tool", "run_terminal_cmd", 1, 1),
            ("agent.turn", "failed", 1, 1),
            ("agent.turn", "step_limit", 1, 0),
        ];
        let want: Vec<(String, String, u64, u64)> =
            want.iter().map(|(e, l, c, f)| ((*e).to_owned(), (*l).to_owned(), *c, *f)).collect();
        assert_eq!(got, want);
        assert!(read.rows.iter().all(|r| !serde_json::to_string(r).unwrap().contains("canary")));
        assert!(read.rows.iter().all(|r| r.user == "u-1"), "each counted for the session's person");
    }
}
