//! `POST /v1/complete`: a Tab suggestion from the gateway, planned and cut by
//! `caret-complete`'s engine (the same one the embedded `caret lsp` runs).

use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use caret_complete::engine::{budget, family, run_plan};
use caret_complete::{Limits, Snippet};
use caret_models::Class;
use caret_protocol::complete::{CompleteRequest, CompleteResponse};

use crate::state::{AppState, Json};
use crate::{Error, Result};
use caret_index::db::Tenant;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `POST /v1/complete`.
#[tracing::instrument(name = "tab", skip_all)]
pub(crate) async fn complete(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<crate::state::Caller>,
    headers: HeaderMap,
    Json(req): Json<CompleteRequest>,
) -> Result<Response> {
    let started = Instant::now();
    let (gw, ctx) = crate::llm::prepare_for(&s, &headers, &t, Class::Interactive)?;
    if req.cursor > req.text.len() {
        return Err(Error::BadRequest(format!("cursor {} is past the text's {} bytes", req.cursor, req.text.len())));
    }
    let aliases = gw.aliases();
    let model = match req.model {
        Some(m) => m,
        None => aliases
            .iter()
            .find(|a| *a == "tab")
            .or_else(|| aliases.first())
            .cloned()
            .ok_or_else(|| Error::Unavailable("this server has no models configured".into()))?,
    };
    let warning = crate::spend::admit(&s, &caller, &model).await?;
    let family = family(req.family.as_deref(), &model, &gw.models_of(&model)).map_err(Error::BadRequest)?;
    let snippets: Vec<Snippet> = req.snippets.into_iter().map(|s| Snippet { path: s.path, text: s.text }).collect();
    let plan = caret_complete::plan(
        &req.text,
        req.cursor,
        req.path.as_deref(),
        &snippets,
        budget(req.budget),
        family.as_ref(),
        Limits::default(),
    );
    let failed = |e: caret_models::Error| crate::llm::model_failure(&format!("completing with model {model}"), &e);
    let multiline = plan.mode == caret_complete::Mode::MultiLine;
    let call = |call| {
        let ctx = ctx.clone();
        async { Ok(crate::spend::metered(gw.complete(call, ctx).await?, &s, &caller, &model)) }
    };
    let out = run_plan(plan, family.as_ref(), &model, started, call).await;
    s.usage.record(&t.id, caller.principal.user.as_deref(), "tab", "", Some(ms(started.elapsed())), out.is_ok());
    let out = out.map_err(failed)?;
    let total = started.elapsed();
    let resp = CompleteResponse {
        text: out.text,
        multiline,
        model: model.clone(),
        first_text_ms: ms(out.first.unwrap_or(total)),
        total_ms: ms(total),
        generated_chunks: out.chunks,
    };
    let mut response = axum::Json(resp).into_response();
    if let Some(w) = warning {
        response.headers_mut().insert(crate::spend::WARNING_HEADER, w);
    }
    Ok(response)
}
