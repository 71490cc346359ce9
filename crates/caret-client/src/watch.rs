//! `sync --watch`: sync now, then again every interval, or sooner when files change.

use std::time::Duration;

use notify::Watcher as _;

use crate::state::WorkspaceState;
use crate::sync::{SyncEngine, SyncReport};
use crate::transport::Transport;
use crate::{Error, Result};

/// Quiet time after a file event before syncing, and the least time between two syncs that
/// file events bring forward.
pub const DEBOUNCE: Duration = Duration::from_secs(2);

/// Syncs until `stop` resolves: once at the start, then every `interval`, or `DEBOUNCE` after
/// the last file change when that comes first. Each result goes to `on_report`; a failed sync
/// is reported and retried at the next tick, never fatal.
pub async fn watch(
    engine: &SyncEngine,
    ws: &WorkspaceState,
    transport: &dyn Transport,
    interval: Duration,
    mut on_report: impl FnMut(Result<SyncReport>),
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    })
    .map_err(|e| Error::Internal(format!("starting the file watcher: {e}")))?;
    watcher
        .watch(&ws.root, notify::RecursiveMode::Recursive)
        .map_err(|e| Error::Internal(format!("watching {}: {e}", ws.root.display())))?;
    tokio::pin!(stop);
    loop {
        on_report(engine.sync(ws, transport).await);
        // Events during the sync (our own reads included) are not a reason to sync again.
        while rx.try_recv().is_ok() {}
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tokio::time::sleep(interval) => {}
            Some(()) = rx.recv() => {
                // Wait for a quiet moment, so a burst of saves is one sync.
                loop {
                    tokio::select! {
                        _ = &mut stop => return Ok(()),
                        _ = tokio::time::sleep(DEBOUNCE) => break,
                        Some(()) = rx.recv() => {}
                    }
                }
            }
        }
    }
}
