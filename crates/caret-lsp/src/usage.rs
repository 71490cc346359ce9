//! Tab usage the editor reports when its user turned `[usage] share` on
//! (`CARET_USAGE_SHARE=on`): suggestions shown, with the time from the request to the answer,
//! and suggestions accepted (the editor runs the `caret.tabAccepted` command each suggestion
//! carries); next edits offered and applied (`caret.nextEditAccepted`). They go in batches to the team's server (`--server`, else `[sync] server`) every
//! minute and at exit. Nothing is sent when sharing is off, without a server, or once the
//! server answers that it does not collect usage.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use caret_client::transport::HttpTransport;
use caret_host::config::Config;
use caret_protocol::usage::{MAX_EVENTS, UsageEvent, UsageReport};

/// Events kept while the server cannot be reached; older ones are dropped beyond it.
const MAX_PENDING: usize = 10 * MAX_EVENTS;

/// How often pending events are sent.
const EVERY: Duration = Duration::from_secs(60);

/// The events not yet sent, and where they go.
pub(crate) struct Reporter {
    transport: HttpTransport,
    pending: Mutex<Vec<UsageEvent>>,
    /// The server said it does not collect: nothing more is kept or sent.
    refused: AtomicBool,
}

impl Reporter {
    /// A reporter when the user shares usage and a server is named; `None` otherwise.
    pub(crate) fn from_config(config: &Config, server: Option<&str>, token: Option<&str>) -> Option<Arc<Reporter>> {
        if !config.usage.share {
            return None;
        }
        let url = server.map(str::to_owned).or_else(|| config.sync.server.clone())?;
        let token = token.map(str::to_owned).or_else(|| config.sync.token.clone())?;
        let ca = config.sync.ca_cert.as_ref().and_then(|p| std::fs::read(p).ok());
        match HttpTransport::new(&url, &token, ca.as_deref()) {
            Ok(transport) => Some(Arc::new(Reporter {
                transport: transport.without_reconnects(),
                pending: Mutex::new(Vec::new()),
                refused: AtomicBool::new(false),
            })),
            Err(e) => {
                tracing::warn!("usage is not reported: {e}");
                None
            }
        }
    }

    fn push(&self, event: UsageEvent) {
        if self.refused.load(Ordering::Relaxed) {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.len() >= MAX_PENDING {
            pending.remove(0);
        }
        pending.push(event);
    }

    /// A suggestion was shown, `ms` after it was asked for.
    pub(crate) fn shown(&self, ms: f64) {
        self.push(UsageEvent { event: "tab.shown".to_owned(), ms: Some(ms) });
    }

    /// A suggestion was accepted.
    pub(crate) fn accepted(&self) {
        self.push(UsageEvent { event: "tab.accepted".to_owned(), ms: None });
    }

    /// A next edit was offered, `ms` after it was asked for.
    pub(crate) fn next_edit_shown(&self, ms: f64) {
        self.push(UsageEvent { event: "next_edit.shown".to_owned(), ms: Some(ms) });
    }

    /// A next edit was applied (the editor runs `caret.nextEditAccepted`).
    pub(crate) fn next_edit_accepted(&self) {
        self.push(UsageEvent { event: "next_edit.accepted".to_owned(), ms: None });
    }

    /// Sends what is pending, in reports of at most [`MAX_EVENTS`]; kept for the next try
    /// when the server cannot be reached.
    pub(crate) async fn send(&self) {
        loop {
            let batch: Vec<UsageEvent> = {
                let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
                let n = pending.len().min(MAX_EVENTS);
                pending.drain(..n).collect()
            };
            if batch.is_empty() {
                return;
            }
            match self.transport.report_usage(&UsageReport { events: batch.clone() }).await {
                Ok(reply) if !reply.collecting => {
                    tracing::info!("the server does not collect usage: this editor stops reporting it");
                    self.refused.store(true, Ordering::Relaxed);
                    self.pending.lock().unwrap_or_else(PoisonError::into_inner).clear();
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!("usage not reported now (kept for the next try): {e}");
                    let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
                    let later = std::mem::take(&mut *pending);
                    *pending = batch;
                    pending.extend(later);
                    let over = pending.len().saturating_sub(MAX_PENDING);
                    pending.drain(..over);
                    return;
                }
            }
        }
    }

    /// Sends every minute until aborted.
    pub(crate) fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            tick.tick().await;
            loop {
                tick.tick().await;
                this.send().await;
            }
        })
    }
}
