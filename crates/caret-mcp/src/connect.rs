//! Starting a server and keeping it running: its transport (a child process or Streamable
//! HTTP), the protocol revision it speaks, its tool list and the notices that it changed.

use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, ProtocolVersion, ServerNotification, SubscriptionFilter,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt as _, NotificationContext, Peer, RoleClient};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};

use crate::{Bearer, Server, ServerConfig, State, Transport};

/// How long a server may take to start and list its tools.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Keeps a server running: starts it, lists its tools, waits for it to end, starts it again.
pub(crate) async fn supervise(server: Arc<Server>) {
    let mut pause = Duration::from_millis(500);
    loop {
        let known = |s: &State| match s {
            State::Ready { tools, .. } | State::Down { tools, .. } => tools.clone(),
            State::Starting => Vec::new(),
        };
        match connect(&server).await {
            Ok((service, tools, _alive)) => {
                pause = Duration::from_millis(500);
                let peer = service.peer().clone();
                let protocol = peer.peer_info().map(|i| i.protocol_version.to_string()).unwrap_or_default();
                tracing::info!(server = %server.config.name, tools = tools.len(), %protocol, "MCP server ready");
                *server.state.write().unwrap_or_else(PoisonError::into_inner) =
                    State::Ready { peer: peer.clone(), tools, protocol };
                let listening = tokio::spawn(listen(Arc::downgrade(&server), peer));
                let why = match service.waiting().await {
                    Ok(reason) => format!("{reason:?}"),
                    Err(e) => e.to_string(),
                };
                listening.abort();
                let mut state = server.state.write().unwrap_or_else(PoisonError::into_inner);
                let tools = known(&state);
                tracing::warn!(server = %server.config.name, "MCP server stopped ({why}); starting it again");
                *state = State::Down { error: format!("it stopped ({why}) and is being started again"), tools };
            }
            Err(error) => {
                tracing::warn!(server = %server.config.name, "MCP server did not start: {error}");
                let mut state = server.state.write().unwrap_or_else(PoisonError::into_inner);
                let tools = known(&state);
                *state = State::Down { error: format!("it did not start: {error}"), tools };
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(30));
    }
}

type Running = rmcp::service::RunningService<RoleClient, Handler>;

/// What the client does with a server's requests and notices: a changed tool list is asked
/// for again.
pub(crate) struct Handler {
    server: Weak<Server>,
}

impl rmcp::ClientHandler for Handler {
    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        if let Some(server) = self.server.upgrade() {
            relist(&server, &context.peer).await;
        }
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("caret", env!("CARGO_PKG_VERSION")))
    }
}

/// Asks the server for its tools again and offers the new list from the next model call on.
async fn relist(server: &Server, peer: &Peer<RoleClient>) {
    match tokio::time::timeout(START_TIMEOUT, peer.list_all_tools()).await {
        Ok(Ok(new)) => {
            let mut state = server.state.write().unwrap_or_else(PoisonError::into_inner);
            if let State::Ready { tools, .. } = &mut *state {
                tracing::info!(server = %server.config.name, before = tools.len(), after = new.len(), "MCP tools changed");
                *tools = new;
            }
        }
        Ok(Err(e)) => tracing::warn!(server = %server.config.name, "listing the changed tools: {e}"),
        Err(_) => {
            tracing::warn!(server = %server.config.name, "the changed tools were not listed within {START_TIMEOUT:?}")
        }
    }
}

/// On the stateless revision a server's notices come on a `subscriptions/listen` stream
/// (the session-based ones send them unasked, to [`Handler`]); listens while the connection
/// lasts when the server says its tool list may change.
async fn listen(server: Weak<Server>, peer: Peer<RoleClient>) {
    let Some(info) = peer.peer_info() else { return };
    let modern = info.protocol_version.as_str() >= ProtocolVersion::V_2026_07_28.as_str();
    let filter = SubscriptionFilter::builder().tools_list_changed().build().supported_by(&info.capabilities);
    if !modern || filter.tools_list_changed != Some(true) {
        return;
    }
    let mut subscription = match peer.listen(filter).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("subscriptions/listen refused: {e}");
            return;
        }
    };
    while let Ok(Some(notice)) = subscription.next().await {
        if let ServerNotification::ToolListChangedNotification(_) = notice {
            let Some(server) = server.upgrade() else { return };
            relist(&server, &peer).await;
        }
    }
}

/// What keeps a launched server's process alive while its connection lasts.
type Alive = Option<Box<dyn std::any::Any + Send + Sync>>;

/// Starts a server (its process, or its first request), settles the protocol revision and
/// lists its tools.
async fn connect(server: &Arc<Server>) -> Result<(Running, Vec<rmcp::model::Tool>, Alive), String> {
    let handler = Handler { server: Arc::downgrade(server) };
    let config = &server.config;
    let mut alive: Alive = None;
    let service = match (&config.transport, &server.place.launcher) {
        (Transport::Stdio { command, args, env, cwd }, Some(launcher)) => {
            let launched = launcher.launch(command, args, env, cwd.as_deref()).await?;
            log_diagnostics(&config.name, launched.diagnostics);
            alive = Some(launched.alive);
            start(handler, (launched.output, launched.input), &config.name)
                .await
                .map_err(|e| format!("{command}: {e}"))?
        }
        (Transport::Stdio { command, .. }, None) => {
            let transport = child(config)?;
            start(handler, transport, &config.name).await.map_err(|e| format!("{command}: {e}"))?
        }
        (Transport::Http { url, headers, bearer }, _) => {
            // reqwest's TLS takes the process's provider.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let mut custom = std::collections::HashMap::new();
            for (k, v) in headers {
                let name = http::HeaderName::try_from(k.as_str()).map_err(|e| format!("header {k}: {e}"))?;
                let value = http::HeaderValue::try_from(v.as_str()).map_err(|e| format!("header {k}'s value: {e}"))?;
                custom.insert(name, value);
            }
            let mut http = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom);
            let mut client = reqwest13::Client::builder();
            if let Some(proxy) = &server.place.proxy {
                client =
                    client.proxy(reqwest13::Proxy::all(proxy.as_str()).map_err(|e| format!("proxy {proxy}: {e}"))?);
            }
            let client = client.build().map_err(|e| format!("an HTTP client: {e}"))?;
            if let Some(Bearer::OAuth(store)) = bearer {
                let mut manager = crate::oauth::manager(url, store.clone()).await?;
                let ready =
                    manager.initialize_from_store().await.map_err(|e| format!("reading its OAuth tokens: {e}"))?;
                if !ready {
                    return Err(format!("not logged in: `caret mcp login {}`", config.name));
                }
                let client = rmcp::transport::AuthClient::new(client, manager);
                let transport = StreamableHttpClientTransport::with_client(client, http);
                start(handler, transport, &config.name).await.map_err(|e| format!("{url}: {e}"))?
            } else {
                if let Some(bearer) = bearer {
                    http = http.auth_header(bearer.token()?);
                }
                let transport = StreamableHttpClientTransport::with_client(client, http);
                start(handler, transport, &config.name).await.map_err(|e| format!("{url}: {e}"))?
            }
        }
    };
    let tools = tokio::time::timeout(START_TIMEOUT, service.list_all_tools())
        .await
        .map_err(|_| format!("no tool list within {START_TIMEOUT:?}"))?
        .map_err(|e| format!("listing its tools: {e}"))?;
    Ok((service, tools, alive))
}

/// The protocol over `transport`: the stateless revision when the server answers
/// `server/discover`, else the `initialize` handshake.
async fn start<T, E, A>(handler: Handler, transport: T, name: &str) -> Result<Running, String>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let lifecycle =
        ClientLifecycleMode::Auto { preferred_versions: vec![ProtocolVersion::V_2026_07_28], legacy_version: None };
    tokio::time::timeout(START_TIMEOUT, handler.serve_with_lifecycle(transport, lifecycle))
        .await
        .map_err(|_| format!("no answer within {START_TIMEOUT:?}"))?
        .map_err(|e| match e.auth_challenge() {
            Some(challenge) => {
                format!("it asks for authorization ({challenge}): `caret mcp login {name}`, or a bearer token")
            }
            None => format!("the protocol failed: {e}"),
        })
}

/// A stdio server's process, its diagnostics going to the debug log (a full pipe would stall it).
fn child(config: &ServerConfig) -> Result<TokioChildProcess, String> {
    let Transport::Stdio { command, args, env, cwd } = &config.transport else {
        return Err("not a stdio server".to_owned());
    };
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(args).envs(env).kill_on_drop(true);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let (transport, stderr) = TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {command}: {e}"))?;
    if let Some(stderr) = stderr {
        log_diagnostics(&config.name, stderr);
    }
    Ok(transport)
}

/// A server's standard error, line by line into the debug log, as it comes.
fn log_diagnostics(name: &str, stderr: impl tokio::io::AsyncRead + Send + Unpin + 'static) {
    let name = name.to_owned();
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt as _;
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::debug!(server = %name, "{line}");
        }
    });
}
