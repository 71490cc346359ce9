//! Model Context Protocol servers as the agent's tools.
//!
//! A [`Hub`] starts every configured server in the background — a child process speaking MCP
//! over stdio, or a remote one over Streamable HTTP, through the official SDK `rmcp` — settles
//! which protocol revision it speaks (the stateless `2026-07-28`, probed with
//! `server/discover`, or the session-based ones with `initialize`), lists its tools, and
//! offers them to a session as
//! `mcp__SERVER__TOOL` (see [`tool_name`]). Starting never blocks a session: a session takes
//! whatever tools are ready before each model call ([`caret_agent::tools::DynamicTools`]). A
//! server that exits is started again with a growing pause (0.5 s to 30 s); meanwhile its
//! tools answer a clear error. A call that outlasts the server's `tool_timeout` is dropped,
//! which sends `notifications/cancelled`; a result's text is capped at [`MAX_OUTPUT`]. A
//! server that says its tools changed (`notifications/tools/list_changed`, on a
//! `subscriptions/listen` stream for the stateless revision) is asked for them again, and the
//! next model call sees the new list.
//!
//! Where servers run is the hub's [`Place`]: stdio servers as Caret's own children, or
//! started by a [`Launcher`] (a background run's sandbox); remote servers reached directly
//! or through an HTTP proxy (a run's allowed-hosts proxy).
//!
//! Never reads configuration files or secrets' stores: the host hands it [`ServerConfig`]s
//! (a remote server's token included).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use caret_agent::tools::{Ctx, Image, Spec, Tool, ToolApproval, ToolError, ToolResult, intern};
use rmcp::model::CallToolRequestParams;
use rmcp::service::{Peer, RoleClient};
use serde_json::Value;

/// Most bytes of a tool's result the model reads.
pub const MAX_OUTPUT: usize = 64 * 1024;

/// Most images of one result attached for the model (each as the server sent it).
pub const MAX_IMAGES: usize = 4;

mod connect;
pub mod oauth;
pub mod project;
pub mod sandboxed;

/// Whether a server's (or a tool's) calls run without asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// Ask the user before each call (as a risky terminal command is asked).
    Ask,
    /// Run without asking.
    #[default]
    Always,
    /// Refuse every call.
    Never,
}

/// One tool's settings, overriding its server's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolSettings {
    /// Its approval (none: the server's).
    pub approval: Option<Approval>,
    /// Offered to the model at all.
    pub enabled: bool,
}

/// How a server is reached.
#[derive(Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking MCP on its standard input and output.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Environment added to Caret's.
        env: BTreeMap<String, String>,
        /// Its working directory (none: Caret's).
        cwd: Option<PathBuf>,
    },
    /// A remote server over Streamable HTTP.
    Http {
        /// Its endpoint (`https://host/mcp`).
        url: String,
        /// Headers sent with every request.
        headers: BTreeMap<String, String>,
        /// The bearer token sent as `Authorization` (never logged or shown).
        bearer: Option<Bearer>,
    },
}

/// Where a remote server's bearer token comes from; read each time the server is connected.
#[derive(Clone)]
pub enum Bearer {
    /// This token.
    Token(String),
    /// This environment variable's value (`bearer_token_env`).
    Env(String),
    /// OAuth: the tokens `caret mcp login` put in this store, refreshed as they expire.
    OAuth(Arc<dyn oauth::CredentialStore>),
}

impl PartialEq for Bearer {
    fn eq(&self, other: &Bearer) -> bool {
        match (self, other) {
            (Bearer::Token(a), Bearer::Token(b)) | (Bearer::Env(a), Bearer::Env(b)) => a == b,
            (Bearer::OAuth(a), Bearer::OAuth(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Bearer {}

impl Bearer {
    /// The token, or why there is none.
    pub fn token(&self) -> Result<String, String> {
        match self {
            Bearer::Token(t) => Ok(t.clone()),
            Bearer::Env(var) => match std::env::var(var) {
                Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_owned()),
                _ => Err(format!("its bearer token's variable {var} is not set")),
            },
            Bearer::OAuth(_) => Err("its tokens come from OAuth".to_owned()),
        }
    }
}

impl std::fmt::Debug for Transport {
    /// Headers' values and the token are not shown (they are often secrets).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Stdio { command, args, .. } => {
                f.debug_struct("Stdio").field("command", command).field("args", args).finish_non_exhaustive()
            }
            Transport::Http { url, headers, bearer } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .field(
                    "bearer",
                    &bearer.as_ref().map(|b| match b {
                        Bearer::Token(_) => "a token".to_owned(),
                        Bearer::Env(var) => format!("${var}"),
                        Bearer::OAuth(_) => "OAuth".to_owned(),
                    }),
                )
                .finish(),
        }
    }
}

impl Transport {
    /// A stdio server running `command` with `args`, nothing else set.
    pub fn stdio(command: impl Into<String>, args: &[&str]) -> Transport {
        Transport::Stdio {
            command: command.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: BTreeMap::new(),
            cwd: None,
        }
    }
}

/// Starts stdio servers somewhere other than as Caret's own children (in a background run's
/// sandbox, say).
#[async_trait::async_trait]
pub trait Launcher: Send + Sync {
    /// Starts `command` with `args` and `env` (in `cwd`, when given), its standard streams
    /// piped; the error says why it could not start.
    async fn launch(
        &self,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        cwd: Option<&Path>,
    ) -> Result<Launched, String>;
}

/// A server a [`Launcher`] started.
pub struct Launched {
    /// Its standard input.
    pub input: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    /// Its standard output.
    pub output: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    /// Its standard error (read into the debug log).
    pub diagnostics: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    /// The process's life: dropped when the connection ends, which stops it.
    pub alive: Box<dyn std::any::Any + Send + Sync>,
}

/// Where a hub's servers run.
#[derive(Clone, Default)]
pub struct Place {
    /// Starts stdio servers (none: as Caret's children).
    pub launcher: Option<Arc<dyn Launcher>>,
    /// The HTTP proxy remote servers are reached through (`http://127.0.0.1:PORT`; none:
    /// directly).
    pub proxy: Option<String>,
}

/// A server to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Its name (the `SERVER` of `mcp__SERVER__TOOL`).
    pub name: String,
    /// How it is reached.
    pub transport: Transport,
    /// Whether its calls run without asking.
    pub approval: Approval,
    /// How long a call may take.
    pub tool_timeout: Duration,
    /// Per-tool settings, by the server's own tool names.
    pub tools: BTreeMap<String, ToolSettings>,
}

/// A server as a session sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Being started.
    Starting,
    /// Answering.
    Ready {
        /// How many tools it lists.
        tools: usize,
        /// The protocol revision it speaks (`2026-07-28`, `2025-11-25`…).
        protocol: String,
    },
    /// Not running (it failed to start or exited); being started again.
    Down(String),
}

impl Status {
    /// Whether its tools answer.
    pub fn is_ready(&self) -> bool {
        matches!(self, Status::Ready { .. })
    }
}

impl std::fmt::Display for Status {
    /// `ready (6 tools, MCP 2026-07-28)`, `starting`, or why it is down.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::Ready { tools, protocol } => write!(f, "ready ({tools} tools, MCP {protocol})"),
            Status::Starting => f.write_str("starting"),
            Status::Down(why) => f.write_str(why),
        }
    }
}

/// The running servers of a session (or of `caret mcp ls`).
pub struct Hub {
    servers: Vec<Arc<Server>>,
    /// The servers' supervisors, once started.
    tasks: Mutex<Option<Vec<tokio::task::AbortHandle>>>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("servers", &self.servers.len()).finish()
    }
}

struct Server {
    config: ServerConfig,
    place: Place,
    state: RwLock<State>,
}

enum State {
    Starting,
    Ready { peer: Peer<RoleClient>, tools: Vec<rmcp::model::Tool>, protocol: String },
    Down { error: String, tools: Vec<rmcp::model::Tool> },
}

impl Hub {
    /// A hub for these servers; they start on the Tokio runtime of the first
    /// [`Hub::start`] or [`Hub::tools`] called within one, in the background.
    pub fn new(configs: Vec<ServerConfig>) -> Arc<Hub> {
        Hub::placed(configs, &Place::default())
    }

    /// A hub whose servers run at `place`.
    pub fn placed(configs: Vec<ServerConfig>, place: &Place) -> Arc<Hub> {
        let servers: Vec<Arc<Server>> = configs
            .into_iter()
            .map(|config| Arc::new(Server { config, place: place.clone(), state: RwLock::new(State::Starting) }))
            .collect();
        Arc::new(Hub { servers, tasks: Mutex::new(None) })
    }

    /// Starts every server in the background, once, when called within a Tokio runtime;
    /// returns at once.
    pub fn start(&self) {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        if tasks.is_some() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        *tasks =
            Some(self.servers.iter().map(|s| tokio::spawn(connect::supervise(s.clone())).abort_handle()).collect());
    }

    /// Each server's name and status.
    pub fn status(&self) -> Vec<(String, Status)> {
        self.servers
            .iter()
            .map(|s| {
                let status = match &*s.state.read().unwrap_or_else(PoisonError::into_inner) {
                    State::Starting => Status::Starting,
                    State::Ready { tools, protocol, .. } => {
                        Status::Ready { tools: tools.len(), protocol: protocol.clone() }
                    }
                    State::Down { error, .. } => Status::Down(error.clone()),
                };
                (s.config.name.clone(), status)
            })
            .collect()
    }

    /// Starts the servers and waits until none is starting any more, or `within` passed.
    pub async fn settled(&self, within: Duration) {
        self.start();
        let deadline = tokio::time::Instant::now() + within;
        while self.status().iter().any(|(_, s)| *s == Status::Starting) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The tools offered now: every enabled tool of each server that listed its tools (a
    /// server that went down keeps offering them, and they answer why they cannot run),
    /// named `mcp__SERVER__TOOL`, in a stable order.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.start();
        let mut taken = HashSet::new();
        let mut out: Vec<Arc<dyn Tool>> = Vec::new();
        for server in &self.servers {
            let listed = match &*server.state.read().unwrap_or_else(PoisonError::into_inner) {
                State::Starting => continue,
                State::Ready { tools, .. } | State::Down { tools, .. } => tools.clone(),
            };
            let mut listed: Vec<rmcp::model::Tool> = listed
                .into_iter()
                .filter(|t| server.config.tools.get(t.name.as_ref()).is_none_or(|s| s.enabled))
                .collect();
            listed.sort_by(|a, b| a.name.cmp(&b.name));
            for t in listed {
                let name = tool_name(&server.config.name, &t.name, &mut taken);
                let approval =
                    server.config.tools.get(t.name.as_ref()).and_then(|s| s.approval).unwrap_or(server.config.approval);
                let what = t.description.as_deref().unwrap_or("(no description)");
                let spec = Spec {
                    name: intern(name),
                    description: intern(format!("[MCP server {}] {what}", server.config.name)),
                    parameters: Value::Object((*t.input_schema).clone()),
                    // Calls run together, as the built-in reading tools do.
                    read_only: true,
                };
                out.push(Arc::new(McpTool { server: server.clone(), remote: t.name.to_string(), spec, approval }));
            }
        }
        out
    }
}

impl Drop for Hub {
    /// The servers stop with their hub (their processes are killed with their transports).
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap_or_else(PoisonError::into_inner).iter().flatten() {
            t.abort();
        }
    }
}

impl caret_agent::tools::DynamicTools for Hub {
    fn current(&self) -> Vec<Arc<dyn Tool>> {
        self.tools()
    }

    fn start(&self) {
        Hub::start(self);
    }

    fn starting(&self) -> bool {
        self.status().iter().any(|(_, s)| *s == Status::Starting)
    }

    fn not_ready(&self) -> Vec<(String, String)> {
        self.status().into_iter().filter(|(_, s)| !s.is_ready()).map(|(n, s)| (n, s.to_string())).collect()
    }
}

/// `mcp__SERVER__TOOL` with anything but `[A-Za-z0-9_-]` made `_`, at most 64 characters; a
/// name already `taken` gets `_2`, `_3`… (within the 64).
pub fn tool_name(server: &str, tool: &str, taken: &mut HashSet<String>) -> String {
    let clean = |s: &str| -> String {
        s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect()
    };
    let base: String = format!("mcp__{}__{}", clean(server), clean(tool)).chars().take(64).collect();
    let mut name = base.clone();
    let mut n = 2;
    while taken.contains(&name) {
        let suffix = format!("_{n}");
        name = format!("{}{suffix}", base.chars().take(64 - suffix.len()).collect::<String>());
        n += 1;
    }
    taken.insert(name.clone());
    name
}

/// One tool of a server.
struct McpTool {
    server: Arc<Server>,
    /// The server's own name for it.
    remote: String,
    spec: Spec,
    approval: Approval,
}

#[async_trait::async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    fn server(&self) -> Option<&str> {
        Some(&self.server.config.name)
    }

    fn approval(&self) -> Option<ToolApproval> {
        match self.approval {
            Approval::Always => None,
            Approval::Ask => Some(ToolApproval::Ask),
            Approval::Never => Some(ToolApproval::Never),
        }
    }

    async fn call(&self, args: Value, _ctx: &Ctx) -> ToolResult {
        let value = self.invoke(args).await?;
        let text = render(&value);
        if value["isError"].as_bool() == Some(true) {
            return Err(ToolError::new(text));
        }
        Ok(text)
    }

    async fn call_with_images(&self, args: Value, _ctx: &Ctx) -> ToolResult<(String, Vec<Image>)> {
        let value = self.invoke(args).await?;
        if value["isError"].as_bool() == Some(true) {
            return Err(ToolError::new(render(&value)));
        }
        Ok(render_with_images(&value))
    }
}

impl McpTool {
    /// Calls the server's tool; its result as JSON.
    async fn invoke(&self, args: Value) -> ToolResult<Value> {
        let name = &self.server.config.name;
        let peer = match &*self.server.state.read().unwrap_or_else(PoisonError::into_inner) {
            State::Ready { peer, .. } => peer.clone(),
            State::Starting => return Err(ToolError::new(format!("the MCP server {name} is still starting"))),
            State::Down { error, .. } => {
                return Err(ToolError::new(format!("the MCP server {name} is not running: {error}")));
            }
        };
        let mut params = CallToolRequestParams::new(self.remote.clone());
        params.arguments = match args {
            Value::Object(map) => Some(map),
            Value::Null => None,
            other => return Err(ToolError::new(format!("the arguments are a JSON object, not {other}"))),
        };
        let timeout = self.server.config.tool_timeout;
        // Dropping the call on timeout sends the server `notifications/cancelled`.
        let result = match tokio::time::timeout(timeout, peer.call_tool(params)).await {
            Err(_) => {
                return Err(ToolError::new(format!(
                    "{} did not answer within {timeout:?} (tool_timeout): the call was cancelled",
                    self.spec.name
                )));
            }
            Ok(Err(e)) => return Err(ToolError::new(format!("the MCP server {name} failed the call: {e}"))),
            Ok(Ok(result)) => result,
        };
        serde_json::to_value(&result).map_err(|e| ToolError::new(format!("reading the result: {e}")))
    }
}

/// A result's text as [`render`] makes it, but its images taken out as they are (for a model
/// that takes images; at most [`MAX_IMAGES`], the rest described).
pub fn render_with_images(result: &Value) -> (String, Vec<Image>) {
    let mut images = Vec::new();
    let mut rest = result.clone();
    if let Some(blocks) = rest["content"].as_array_mut() {
        blocks.retain(|b| {
            let image = b["type"] == "image" && images.len() < MAX_IMAGES;
            if let (true, Some(mime), Some(data)) = (image, b["mimeType"].as_str(), b["data"].as_str()) {
                images.push(Image { mime: mime.to_owned(), base64: data.to_owned() });
                return false;
            }
            true
        });
    }
    (render(&rest), images)
}

/// A call's result as the model reads it: text blocks, resources' text, what images and
/// links are, and structured content as JSON text; capped at [`MAX_OUTPUT`].
pub fn render(result: &Value) -> String {
    let mut parts: Vec<String> = Vec::new();
    for block in result["content"].as_array().into_iter().flatten() {
        match block["type"].as_str().unwrap_or("") {
            "text" => parts.push(block["text"].as_str().unwrap_or("").to_owned()),
            "image" | "audio" => parts.push(format!(
                "[{} ({}, {} bytes of base64): not shown to the model]",
                block["type"].as_str().unwrap_or(""),
                block["mimeType"].as_str().unwrap_or("unknown type"),
                block["data"].as_str().map_or(0, str::len)
            )),
            "resource" => {
                let r = &block["resource"];
                match r["text"].as_str() {
                    Some(text) => parts.push(format!("{}:\n{text}", r["uri"].as_str().unwrap_or("resource"))),
                    None => parts.push(format!("[binary resource {}]", r["uri"].as_str().unwrap_or(""))),
                }
            }
            "resource_link" => parts.push(format!("[link: {}]", block["uri"].as_str().unwrap_or(""))),
            other => parts.push(format!("[{other} content]")),
        }
    }
    if let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null()) {
        let json = serde_json::to_string_pretty(structured).unwrap_or_default();
        // Already said: the same JSON as text, or a lone value wrapped as `{"result": …}`.
        let wrapped = structured
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.values().next()?.as_str())
            .is_some_and(|v| parts.iter().any(|p| p.trim() == v.trim()));
        if !wrapped && !parts.iter().any(|p| p.trim() == json.trim()) {
            parts.push(format!("structured content:\n{json}"));
        }
    }
    let mut text = parts.join("\n");
    if text.len() > MAX_OUTPUT {
        let mut cut = MAX_OUTPUT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let total = text.len();
        text.truncate(cut);
        text.push_str(&format!("\n[cut: the result was {total} bytes; the first {cut} are shown]"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitised_bounded_and_unique() {
        let mut taken = HashSet::new();
        assert_eq!(tool_name("time", "get_current_time", &mut taken), "mcp__time__get_current_time");
        assert_eq!(tool_name("my server", "do.it/now", &mut taken), "mcp__my_server__do_it_now");
        assert_eq!(tool_name("my.server", "do it now", &mut taken), "mcp__my_server__do_it_now_2");
        let long = tool_name("s", &"x".repeat(100), &mut taken);
        assert_eq!(long.len(), 64);
        let again = tool_name("s", &"x".repeat(100), &mut taken);
        assert!(again.len() == 64 && again.ends_with("_2") && again != long);
    }

    #[test]
    fn results_render_text_resources_images_and_structure_within_the_cap() {
        let r = serde_json::json!({
            "content": [
                {"type": "text", "text": "hello"},
                {"type": "image", "mimeType": "image/png", "data": "aGVsbG8="},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "inside"}},
            ],
            "structuredContent": {"n": 1},
        });
        let text = render(&r);
        assert!(text.starts_with("hello\n[image (image/png, 8 bytes of base64)"), "{text}");
        assert!(text.contains("file:///a.txt:\ninside") && text.contains("structured content:\n{\n  \"n\": 1\n}"));
        let lone = serde_json::json!({"content": [{"type": "text", "text": "12:00"}], "structuredContent": {"result": "12:00"}});
        assert_eq!(render(&lone), "12:00", "a wrapped lone value is not said twice");
        let (text, images) = render_with_images(&r);
        assert_eq!(images, vec![Image { mime: "image/png".into(), base64: "aGVsbG8=".into() }]);
        assert!(text.starts_with("hello\nfile:///a.txt:\ninside"), "the image is attached, not described: {text}");
        let big = serde_json::json!({"content": [{"type": "text", "text": "é".repeat(MAX_OUTPUT)}]});
        let text = render(&big);
        assert!(text.len() < MAX_OUTPUT + 100 && text.ends_with("are shown]"), "{}", text.len());
    }
}
