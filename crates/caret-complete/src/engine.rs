//! The engine that runs a [`Plan`] against a model: streams the model's text through the
//! plan's stop rules and drops the stream as soon as the suggestion is complete. Shared by the
//! embedded `caret lsp`, the workspace page and the server's `POST /v1/complete`, so all cut a
//! model's text the same way. It talks to the model gateway only through a closure, and knows
//! nothing about LSP or HTTP.

use std::time::{Duration, Instant};

use caret_models::{Event, EventStream};
use caret_protocol::llm::CompletionRequest;
use futures::StreamExt as _;

use crate::{Budget, Family, Plan, Stopper};

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
