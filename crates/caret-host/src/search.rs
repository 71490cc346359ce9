//! Searching a synced workspace: through the local daemon when it answers, else in-process
//! or on a server.

use std::sync::Arc;

use anyhow::Context as _;
use caret_client::index::search;
use caret_client::transport::Transport as _;

use crate::config::Config;
use crate::remote::{Remote, open_workspace, transport};

/// Searches the workspace at `path` (what was synced of it) on `remote`'s server, else the
/// embedded one, through the local daemon when it can (see [`crate::daemon`]): what
/// `caret search`, the LSP's `caret.search` and the agent's `codebase_search` all do.
pub async fn search_workspace(
    config: &Config,
    path: &std::path::Path,
    remote: &Remote,
    query: &str,
    k: usize,
    mode: caret_protocol::SearchMode,
) -> anyhow::Result<caret_client::index::SearchOutcome> {
    let ws = open_workspace(config, path)?;
    let scanner = Arc::new(config.scanner()?);
    let rerank = config.search_rerank()?;
    let embedded = remote.server.is_none() && config.sync.server.is_none();
    if embedded && let Some(daemon) = crate::daemon::connect(config).await {
        match search(scanner.clone(), &ws, &daemon, query, k, mode, rerank).await {
            Ok(outcome) => return Ok(outcome),
            // It went away mid-request: answer in-process instead.
            Err(caret_client::Error::Transport(e)) => {
                tracing::warn!("the local daemon did not answer ({e}); searching in-process");
            }
            Err(e) => {
                return Err(e).with_context(|| format!("searching {} on {}", ws.root.display(), daemon.describe()));
            }
        }
    }
    let transport = transport(config, remote).await?;
    search(scanner, &ws, transport.as_ref(), query, k, mode, rerank)
        .await
        .with_context(|| format!("searching {} on {}", ws.root.display(), transport.describe()))
}
