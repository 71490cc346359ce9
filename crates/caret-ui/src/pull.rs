//! The default code model, offered by a page that has no model: `GET /api/models/default` says
//! whether one is needed, which, its size and how far its download is; `POST` starts the
//! download (resumable: one cut short goes on from what it has). Once it is installed, Tab,
//! next edit and the agent use it at once — the page's gateway and Tab's model are swapped in
//! place, no restart. Only `caret ui` offers it: a team's page uses the server's models.

use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::Extension;
use axum::response::IntoResponse as _;
use caret_host::config::DEFAULT_CODE_MODEL;
use serde::Serialize;
use serde_json::json;

use crate::{Access, ApiResult, Ui, bad, internal};

/// Where a download is.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Progress {
    /// `idle`, `pulling`, `done` or `failed`.
    state: &'static str,
    /// Bytes downloaded, and of how many (the model's archives together).
    done: u64,
    total: u64,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The page's download of the default model.
#[derive(Default)]
pub(crate) struct Pull {
    progress: Arc<Mutex<Progress>>,
}

fn size() -> u64 {
    caret_weights::entry(DEFAULT_CODE_MODEL).map(|e| e.files.iter().map(|f| f.size).sum()).unwrap_or(0)
}

/// `GET /api/models/default`.
pub(crate) async fn status(Extension(ui): Extension<Arc<Ui>>) -> ApiResult {
    let progress = ui.pull.progress.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let offered = matches!(ui.access, Access::Launch { .. });
    Ok(axum::Json(json!({
        // Nothing to call: no model configured, none installed.
        "needed": offered && ui.gateway().is_none(),
        "model": DEFAULT_CODE_MODEL,
        "size": size(),
        "size_text": caret_host::units::human_bytes(size()),
        "pull": Progress { state: if progress.state.is_empty() { "idle" } else { progress.state }, ..progress },
    }))
    .into_response())
}

/// `POST /api/models/default`: starts the download (nothing when one is under way).
pub(crate) async fn start(Extension(ui): Extension<Arc<Ui>>) -> ApiResult {
    if !matches!(ui.access, Access::Launch { .. }) {
        return Err(bad("a team's page uses the server's models"));
    }
    let entry = caret_weights::entry(DEFAULT_CODE_MODEL).map_err(internal)?;
    let under_way = {
        let mut p = ui.pull.progress.lock().unwrap_or_else(PoisonError::into_inner);
        let under_way = p.state == "pulling";
        if !under_way {
            *p = Progress { state: "pulling", done: 0, total: size(), error: None };
        }
        under_way
    };
    if under_way {
        return status(Extension(ui)).await;
    }
    let me = ui.clone();
    tokio::spawn(async move {
        let progress = me.pull.progress.clone();
        // Each archive reports its own bytes: finished ones are added up here.
        let finished = Mutex::new((0u64, 0u64));
        let report = |done: u64, total: Option<u64>| {
            let mut f = finished.lock().unwrap_or_else(PoisonError::into_inner);
            if done < f.1 {
                f.0 += f.1;
            }
            f.1 = done;
            let mut p = progress.lock().unwrap_or_else(PoisonError::into_inner);
            p.done = f.0 + done;
            if let Some(t) = total {
                p.total = p.total.max(f.0 + t);
            }
        };
        let pulled = me.config.model_store().pull(entry, &report).await;
        let ended = match pulled {
            Ok(_) => {
                let mut config = me.config.clone();
                config.use_installed_code_model();
                me.use_models(&config).map_err(|e| format!("{e:#}"))
            }
            Err(e) => Err(format!("downloading {DEFAULT_CODE_MODEL}: {e}")),
        };
        let mut p = progress.lock().unwrap_or_else(PoisonError::into_inner);
        match ended {
            Ok(()) => {
                p.state = "done";
                p.done = p.total;
                tracing::info!("{DEFAULT_CODE_MODEL} installed from the page and in use");
            }
            Err(e) => {
                tracing::warn!("{e}");
                p.state = "failed";
                p.error = Some(e);
            }
        }
    });
    status(Extension(ui)).await
}
