//! Tab suggestions: `POST /v1/complete`, and the stream loop it shares with the embedded
//! `caret lsp` (so both cut a model's text the same way).

use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use caret_complete::{Budget, Family, Limits, Plan, Snippet, Stopper};
use caret_models::{Class, Event, EventStream};
use caret_protocol::complete::{CompleteRequest, CompleteResponse};
use caret_protocol::llm::CompletionRequest;
use futures::StreamExt as _;

use crate::db::Tenant;
use crate::http::{AppState, Json};
use crate::{Error, Result};

/// What a model's stream gave, cut by the stop rules.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The suggestion.
    pub text: String,
    /// From `started` to the first streamed text.
    pub first: Option<Duration>,
    /// Pieces of text streamed before the stop.
    pub chunks: usize,
}

/// Feeds `events` to `stopper` until the suggestion is complete, then drops the stream —
/// which stops generation (the local engine checks for a closed stream between tokens, a
/// remote server sees the connection close).
pub async fn drive(mut events: EventStream, mut stopper: Stopper, started: Instant) -> caret_models::Result<Outcome> {
    let (mut first, mut chunks) = (None, 0);
    while let Some(event) = events.next().await {
        if let Event::Text(t) = event? {
            first.get_or_insert_with(|| started.elapsed());
            chunks += 1;
            if stopper.push(&t) {
                break;
            }
        }
    }
    drop(events);
    Ok(Outcome { text: stopper.finish(), first, chunks })
}

/// Runs a plan with `model` through `complete` and cuts the answer by its stop rules; an
/// empty answer to a split prompt is asked again with the whole prefix ([`Plan::unsplit`]: a
/// model sometimes closes a middle it was handed at once).
pub async fn run_plan<F, Fut>(
    plan: Plan,
    family: Option<&Family>,
    model: &str,
    started: Instant,
    complete: F,
) -> caret_models::Result<Outcome>
where
    F: Fn(CompletionRequest) -> Fut,
    Fut: std::future::Future<Output = caret_models::Result<EventStream>>,
{
    let unsplit = plan.unsplit(family);
    let req = CompletionRequest::greedy(model.to_owned(), plan.prompt, plan.max_tokens);
    let out = drive(complete(req).await?, plan.stopper, started).await?;
    match unsplit.filter(|_| out.text.is_empty()) {
        Some(again) => {
            let req = CompletionRequest::greedy(model.to_owned(), again.prompt, again.max_tokens);
            drive(complete(req).await?, again.stopper, started).await
        }
        None => Ok(out),
    }
}

/// The fill-in-the-middle family: `named` (`none`: prefix only), else guessed from the alias,
/// else from the models behind it.
pub fn family(named: Option<&str>, alias: &str, models: &[String]) -> std::result::Result<Option<Family>, String> {
    if let Some(name) = named {
        return match name {
            "none" => Ok(None),
            other => serde_json::from_value(serde_json::Value::String(other.to_owned())).map(Some).map_err(|_| {
                format!("family: qwen-coder, star-coder2, deep-seek-coder, code-llama or none, not {other:?}")
            }),
        };
    }
    Ok(Family::guess(alias).or_else(|| models.iter().find_map(|m| Family::guess(m))))
}

/// The budget a request asks for, kept within sane bounds.
pub fn budget(tokens: Option<usize>) -> Budget {
    let mut b = Budget::default();
    if let Some(t) = tokens {
        b.tokens = t.clamp(64, 32_768);
    }
    b
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `POST /v1/complete`.
pub(crate) async fn complete(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
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
    let out = run_plan(plan, family.as_ref(), &model, started, |call| gw.complete(call, ctx.clone()))
        .await
        .map_err(failed)?;
    let total = started.elapsed();
    let resp = CompleteResponse {
        text: out.text,
        multiline,
        model: model.clone(),
        first_text_ms: ms(out.first.unwrap_or(total)),
        total_ms: ms(total),
        generated_chunks: out.chunks,
    };
    Ok(axum::Json(resp).into_response())
}
