//! Which server a command talks to — a `caret serve` over HTTP, or the embedded server under
//! `$CARET_HOME/local` in-process — and the client-side state of a workspace.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use caret_client::state::WorkspaceState;
use caret_client::sync::{SyncEngine, SyncOptions};
use caret_client::transport::{HttpTransport, InProcessTransport, Transport};
use caret_workspace::scan::{Depth, Scanner};

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

/// The sync engine with the configured scanner and batch size.
pub fn engine(config: &Config) -> anyhow::Result<SyncEngine> {
    let scanner = Scanner::new(config.walk_config(), config.chunker()?, Depth::Hash);
    let options = SyncOptions { batch_files: config.sync.batch_files.max(1), ..SyncOptions::default() };
    Ok(SyncEngine::new(Arc::new(scanner), options))
}
