//! `/mcp`: the server as a Model Context Protocol server over Streamable HTTP (the `rmcp`
//! SDK's service, mounted in the router behind the same tenant tokens, limits and flags as
//! `/v1`), so another agent (Claude Code, Codex, Cursor) can hand work to Caret's background
//! runs: `start_run`, `run_status`, `run_diff`, `cancel_run`, `list_runs`. Every request
//! stands alone (no MCP session kept in memory): any replica answers it, for the stateless
//! revision and the session-based ones alike. A tenant sees only its own runs; another's
//! run answers as a missing one. Requests from a browser page (an `Origin` header) are
//! refused: a page cannot call the server with a user's token behind their back.
//!
//! Code search is not here: the server holds no code, only obfuscated locations. It is in
//! `caret mcp serve` beside the workspace, which reads the hits from the local disk.

use std::sync::Arc;

use caret_anyrun::runs::TenantRef;
use caret_protocol::runs::{CreateRun, RepoSource, RunEnvironment};
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{MaybeSendFuture, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde::Deserialize;

use crate::state::{AppState, Caller};

/// `start_run`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartRunArgs {
    /// The git repository the run works on, as the workers reach it (`https://…`, `file://…`).
    pub repo: String,
    /// A branch, tag or commit (default: the repository's HEAD).
    #[serde(default)]
    pub git_ref: Option<String>,
    /// What the agent is asked to do.
    pub task: String,
    /// A model alias of the server's gateway (default: `agent`).
    #[serde(default)]
    pub model: Option<String>,
    /// The sandbox's setup commands, environment, test command and network.
    #[serde(default)]
    pub environment: Option<RunEnvironment>,
}

/// The arguments of the tools that name one run.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// The run's id (from `start_run` or `list_runs`).
    pub id: String,
}

/// `list_runs`' arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// How many of the newest runs (default 20, at most 100).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// The service mounted at `/mcp`.
pub fn service(state: AppState) -> StreamableHttpService<RunsMcp, NeverSessionManager> {
    let config = StreamableHttpServerConfig::default()
        // Stateless: no session ties a client to one replica.
        .with_legacy_session_mode(false)
        .with_json_response(true)
        // Every request carries a token, so the Host header proves nothing either way (the
        // defence against DNS rebinding it serves is for servers without one)…
        .disable_allowed_hosts()
        // …and no browser page may call with it.
        .enforce_origin_validation();
    StreamableHttpService::new(
        move || Ok(RunsMcp { state: state.clone() }),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// The handler of one request.
pub struct RunsMcp {
    state: AppState,
}

/// Who the token of the request acts as (set by the authentication in front of `/mcp`).
fn caller(context: &RequestContext<RoleServer>) -> Result<Caller, String> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>())
        .cloned()
        .ok_or_else(|| "no caller for this request".to_owned())
}

fn args<T: serde::de::DeserializeOwned>(request: &CallToolRequestParams) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::Object(request.arguments.clone().unwrap_or_default()))
        .map_err(|e| format!("arguments: {e}"))
}

fn json_text(value: &impl serde::Serialize) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(serde_json::to_string_pretty(value).unwrap_or_default())])
}

impl RunsMcp {
    /// A tool call, as the caller: their runs are theirs (another person's unshared run
    /// answers as a missing one), and what changes is audited as on `/v1/runs`.
    async fn call(&self, request: CallToolRequestParams, caller: Caller) -> Result<CallToolResult, String> {
        let tenant = caller.tenant.clone();
        let state = &self.state;
        let runs = state.runs.as_ref().ok_or("background runs are not enabled on this server")?;
        let may_see = |id: String| {
            let caller = caller.clone();
            async move { crate::runs::visible(state, &caller, &id).await.map_err(|e| e.to_string()) }
        };
        self.state.allowed("runs", Some(&tenant.id)).map_err(|e| e.to_string())?;
        let who = TenantRef { id: tenant.id.clone(), name: tenant.name.clone() };
        let failed = |e: caret_anyrun::Error| e.to_string();
        match request.name.as_ref() {
            "start_run" => {
                let a: StartRunArgs = args(&request)?;
                let create = CreateRun {
                    repo: RepoSource::Git { url: a.repo, git_ref: a.git_ref },
                    task: a.task,
                    model: a.model,
                    limits: Default::default(),
                    environment: a.environment.unwrap_or_default(),
                    class: Default::default(),
                    push: None,
                    git_credential: None,
                    rollout: None,
                };
                crate::runs::allowed(state, &caller, create.model.as_deref(), false)
                    .await
                    .map_err(|e| e.to_string())?;
                let submitted = runs.submit(&who, create).await;
                if let Ok(info) = &submitted {
                    state.own(&caller, "run", &info.id).await.map_err(|e| e.to_string())?;
                }
                let (target, outcome) = match &submitted {
                    Ok(info) => (info.id.clone(), "ok".to_owned()),
                    Err(e) => ("-".to_owned(), format!("failed: {e}")),
                };
                state.audit(&caller, "run.submit", &target, &outcome).await.map_err(|e| e.to_string())?;
                Ok(json_text(&submitted.map_err(failed)?))
            }
            "run_status" => {
                let a: RunArgs = args(&request)?;
                may_see(a.id.clone()).await?;
                Ok(json_text(&runs.get(&tenant.id, &a.id).await.map_err(failed)?))
            }
            "cancel_run" => {
                let a: RunArgs = args(&request)?;
                may_see(a.id.clone()).await?;
                let cancelled = runs.cancel(&tenant.id, &a.id).await;
                let outcome = if cancelled.is_ok() { "ok".to_owned() } else { "failed".to_owned() };
                state.audit(&caller, "run.cancel", &a.id, &outcome).await.map_err(|e| e.to_string())?;
                Ok(json_text(&cancelled.map_err(failed)?))
            }
            "list_runs" => {
                let a: ListArgs = args(&request)?;
                let limit = a.limit.unwrap_or(20).clamp(1, 100);
                let listed = runs.list(&tenant.id, limit).await.map_err(failed)?;
                Ok(json_text(&crate::runs::seen(state, &caller, listed).await.map_err(|e| e.to_string())?))
            }
            "run_diff" => {
                let a: RunArgs = args(&request)?;
                may_see(a.id.clone()).await?;
                let result = runs.result(&tenant.id, &a.id).await.map_err(failed)?;
                let mut text = format!("{} ({})\n\n", result.final_message.trim(), result.turn_end);
                if let Some(test) = &result.test {
                    text.push_str(&format!("test `{}`: exit {:?}\n\n", test.command, test.exit_code));
                }
                text.push_str(if result.patch.is_empty() { "no changes" } else { &result.patch });
                Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
            }
            other => Err(format!("there is no tool named {other:?}")),
        }
    }
}

/// A tool whose input schema is `T`'s (also for `caret mcp serve`'s tools).
pub fn tool<T: schemars::JsonSchema>(name: &'static str, description: &'static str) -> Tool {
    let schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default();
    Tool::new(name, description, Arc::new(schema.as_object().cloned().unwrap_or_default()))
}

/// What a Caret MCP server says of itself: its name and that it has tools.
pub fn server_info() -> ServerConfig {
    let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
    info.server_info = rmcp::model::Implementation::new("caret", env!("CARGO_PKG_VERSION"));
    info
}

/// A tool's answer: its failure is the caller's to read (`isError`), not a protocol error.
pub fn answer(outcome: Result<CallToolResult, String>) -> CallToolResponse {
    match outcome {
        Ok(result) => result.into(),
        Err(why) => CallToolResult::error(vec![ContentBlock::text(why)]).into(),
    }
}

impl rmcp::ServerHandler for RunsMcp {
    fn get_info(&self) -> ServerConfig {
        server_info()
    }

    fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListToolsResult, ErrorData>> + MaybeSendFuture + '_ {
        let tools = vec![
            tool::<StartRunArgs>(
                "start_run",
                "Start a background run: Caret's agent works on the task in a sandbox with its own copy of the \
                 repository, and its changes come back as a patch (run_diff). Answers the run, with its id.",
            ),
            tool::<RunArgs>(
                "run_status",
                "Where a run is (queued, running, succeeded, failed, cancelled), its attempts and why it failed.",
            ),
            tool::<RunArgs>(
                "run_diff",
                "An ended run's outcome: the agent's last message, its test command's exit code, and its changes \
                 as a patch (`git apply` form).",
            ),
            tool::<RunArgs>("cancel_run", "Cancel a queued or running run."),
            tool::<ListArgs>("list_runs", "This tenant's newest runs, newest first."),
        ];
        std::future::ready(Ok(ListToolsResult::with_all_items(tools)))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(answer(match caller(&context) {
            Ok(c) => self.call(request, c).await,
            Err(e) => Err(e),
        }))
    }
}
