//! Which server a command talks to — a `caret serve` over HTTP, or the embedded server under
//! `$CARET_HOME/local` in-process — and the client-side state of a workspace.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use caret_client::state::WorkspaceState;
use caret_client::sync::SyncEngine;
use caret_client::transport::{HttpTransport, InProcessTransport, Transport};

use crate::config::Config;

/// Which server to talk to: a URL and its API token, or (no URL here nor in the config's
/// `[sync]`) the embedded one.
#[derive(Debug, Clone, Default)]
pub struct Remote {
    /// A `caret serve` URL.
    pub server: Option<String>,
    /// Its API token.
    pub token: Option<String>,
}

/// Opens the local state of the workspace at `path`.
pub fn open_workspace(config: &Config, path: &Path) -> anyhow::Result<WorkspaceState> {
    let root = std::fs::canonicalize(path).with_context(|| format!("opening workspace {}", path.display()))?;
    let state = config.workspace_state_dir(&root);
    WorkspaceState::open(&root, &state, &config.keys_dir())
        .with_context(|| format!("opening the client state of {}", root.display()))
}

/// The transport for `remote`: HTTP, or the embedded server.
pub async fn transport(config: &Config, remote: &Remote) -> anyhow::Result<Box<dyn Transport>> {
    let server = remote.server.clone().or_else(|| config.sync.server.clone());
    match server {
        Some(url) => {
            let token = remote.token.clone().or_else(|| config.sync.token.clone()).context(
                "--server needs an API token: --token or CARET_TOKEN (create one with `caret admin token create`)",
            )?;
            let ca = match &config.sync.ca_cert {
                Some(path) => {
                    Some(std::fs::read(path).with_context(|| format!("reading CA certificate {}", path.display()))?)
                }
                None => None,
            };
            Ok(Box::new(HttpTransport::new(&url, &token, ca.as_deref())?))
        }
        None => {
            let (service, tenant) = embedded_service(config).await?;
            let dir = config.home.join("local");
            Ok(Box::new(InProcessTransport::new(service, tenant, &format!("embedded ({})", dir.display()))))
        }
    }
}

/// The embedded server in `$CARET_HOME/local` (with the configured embedding model and
/// search weights) and its one tenant, `local`: what commands use in-process and what the
/// local daemon keeps warm.
pub async fn embedded_service(
    config: &Config,
) -> anyhow::Result<(Arc<caret_index::service::Service>, caret_index::db::Tenant)> {
    let dir = config.home.join("local");
    let mut service = caret_index::open(&caret_index::StorageConfig::local(&dir))
        .await
        .with_context(|| format!("opening the embedded server in {}", dir.display()))?;
    if let Some(model) = config.embedding_model()? {
        service = service.with_embedding(model);
    }
    let service = service.with_weights(config.search_weights()?).with_stage_windows(config.stage_windows()?);
    let tenant = match service.db().tenant_by_name("local").await? {
        Some(t) => t,
        None => service.db().create_tenant("local").await?,
    };
    Ok((Arc::new(service), tenant))
}

/// The index service of `caret serve` on `storage`, with the configured embedding model
/// (loaded on first use), held-text budget, search weights and stage windows.
pub async fn server_service(
    config: &Config,
    storage: &caret_index::StorageConfig,
) -> anyhow::Result<Arc<caret_index::service::Service>> {
    let mut service = caret_index::open(storage).await.context("opening the server's storage")?;
    match config.embedding_model()? {
        Some(model) => {
            tracing::info!(model = model.id(), "embedding model (loaded on first use)");
            service = service.with_embedding(model);
        }
        None => tracing::warn!("no embedding model: search is lexical only"),
    }
    service = service.with_held_budget(usize::try_from(config.server.held_texts.0).unwrap_or(usize::MAX));
    service = service.with_residency(caret_index::service::Residency {
        max_loaded: config.server.loaded_workspaces.max(1),
        max_bytes: config
            .server
            .loaded_memory
            .map(|s| s.0)
            .or_else(caret_index::service::half_of_memory)
            .unwrap_or(u64::MAX),
        idle: crate::config::parse_duration(&config.server.unload_idle_after).context("[server] unload_idle_after")?,
    });
    if let Some(records) = std::env::var("CARET_COMPACT_RECORDS").ok().and_then(|v| v.parse().ok()) {
        let policy = caret_index::service::CompactionPolicy { records, ..Default::default() };
        service = service.with_compaction(policy);
    }
    Ok(Arc::new(service.with_weights(config.search_weights()?).with_stage_windows(config.stage_windows()?)))
}

/// The MCP servers of each agent workspace's sessions: the server's `[mcp_servers]` and the
/// workspace's own that the operator trusted (`caret mcp trust NAME -C WORKSPACE`).
pub fn agent_workspace_servers(
    config: &Config,
) -> anyhow::Result<std::collections::BTreeMap<String, Vec<caret_mcp::ServerConfig>>> {
    let mut out = std::collections::BTreeMap::new();
    for (name, root) in &config.server.agent_workspaces {
        let (servers, untrusted) = crate::mcp::session_servers(&config.mcp_servers, &config.home, root)
            .with_context(|| format!("MCP servers of agent workspace {name}"))?;
        for p in untrusted {
            tracing::warn!(
                "agent workspace {name}: its MCP server {} is not started: trust it with `caret mcp trust {} -C {}`",
                p.name,
                p.name,
                root.display()
            );
        }
        out.insert(name.clone(), servers);
    }
    Ok(out)
}

/// The sync engine with the configured scanner and batch size.
pub fn engine(config: &Config) -> anyhow::Result<SyncEngine> {
    Ok(SyncEngine::new(Arc::new(config.scanner()?), config.sync_options()))
}

/// A `caret serve` over HTTP for the tenant routes (runs, docs sources): its base URL, the
/// token and a client.
#[derive(Debug, Clone)]
pub struct Api {
    /// The base URL, without a trailing `/`.
    pub base: String,
    /// The tenant's API token.
    pub token: String,
    /// The HTTP client.
    pub client: reqwest::Client,
}

impl Api {
    /// The server `target` names (none: it names none).
    pub fn open(target: &Remote) -> anyhow::Result<Option<Api>> {
        let Some(base) = &target.server else { return Ok(None) };
        let kept = || crate::credentials::token_for(&crate::config::home(), base);
        let token = target
            .token
            .clone()
            .or_else(kept)
            .context("--server needs --token (or CARET_TOKEN), or `caret login --server URL` first")?;
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(600))
            .build()
            .context("building the HTTP client")?;
        Ok(Some(Api { base: base.trim_end_matches('/').to_owned(), token, client }))
    }

    /// The server URL for an API path.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends a request and reads its JSON answer (an error body as the error). Rate limited:
    /// waits as the server says (two minutes in all), then gives up.
    pub async fn call<T: serde::de::DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> anyhow::Result<T> {
        use std::time::Duration;
        let mut waited = Duration::ZERO;
        let resp = loop {
            let attempt = req.try_clone().context("a request that cannot be sent again")?;
            let resp = attempt.bearer_auth(&self.token).send().await.context("reaching the server")?;
            if resp.status() != reqwest::StatusCode::TOO_MANY_REQUESTS || waited >= Duration::from_secs(120) {
                break resp;
            }
            let after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .unwrap_or(1)
                .clamp(1, 30);
            tokio::time::sleep(Duration::from_secs(after)).await;
            waited += Duration::from_secs(after);
        };
        let status = resp.status();
        let text = resp.text().await.context("reading the server's answer")?;
        if !status.is_success() {
            let message =
                serde_json::from_str::<caret_protocol::ErrorBody>(&text).map(|b| b.error.message).unwrap_or(text);
            anyhow::bail!("the server answered {status}: {message}");
        }
        let text = if text.is_empty() { "null".to_owned() } else { text };
        serde_json::from_str(&text).with_context(|| format!("reading the server's answer {text:?}"))
    }
}
