//! The model gateway's OpenAI-compatible endpoints: `/v1/chat/completions`,
//! `/v1/completions`, `/v1/embeddings`, `/v1/models`. Authenticated like every `/v1` route;
//! the tenant feeds the gateway's quotas and recovery admission. Optional headers:
//! `x-caret-priority` (`interactive`, `agent`, `background`) and `x-caret-deadline-ms`.
//! Errors use OpenAI's body shape, with `Retry-After` on 429 and 503.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use caret_models::{CallContext, Class, Event, EventStream, Gateway, collect_chat};
use caret_protocol::llm::{
    ApiError, ApiErrorDetail, ChatChoice, ChatChunk, ChatDelta, ChatRequest, ChatResponse, ChoiceLogprobs, ChunkChoice,
    CompletionChoice, CompletionRequest, CompletionResponse, EmbeddingsRequest, FinishReason, FunctionCallDelta,
    ModelCard, ModelList, Role, ToolCallDelta, Usage,
};
use futures::StreamExt as _;

use caret_index::db::Tenant;
use caret_protocol::llm::{DEADLINE_HEADER, PRIORITY_HEADER};

use crate::state::{AppState, Caller, Json};

/// An error answer in OpenAI's shape.
struct ApiFailure {
    status: u16,
    kind: &'static str,
    message: String,
    retry_after: Option<Duration>,
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ApiError { error: ApiErrorDetail { message: self.message, kind: self.kind.to_owned(), code: None } };
        let mut r = (code, axum::Json(body)).into_response();
        if let Some(after) = self.retry_after {
            let secs = after.as_secs_f64().ceil().max(1.0) as u64;
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        r
    }
}

fn api_error(status: u16, kind: &'static str, message: String, retry_after: Option<Duration>) -> ApiFailure {
    ApiFailure { status, kind, message, retry_after }
}

/// Refuses a model alias an operator switched off (flag `model.<alias>`), and one the
/// caller's groups do not allow (403 `model_not_allowed`).
fn model_allowed(s: &AppState, t: &Tenant, caller: &Caller, alias: &str) -> Result<(), ApiFailure> {
    if let Err(e) = crate::spend::model_allowed(caller, alias) {
        return Err(api_error(403, "model_not_allowed", e.to_string(), None));
    }
    let flag = format!("model.{alias}");
    s.allowed(&flag, Some(&t.id)).map_err(|e| api_error(503, "disabled", e.to_string(), None))
}

pub(crate) fn gateway_error(e: &caret_models::Error) -> Response {
    let status = e.status();
    let kind = match status {
        429 => "rate_limit_error",
        400 | 404 => "invalid_request_error",
        408 => "timeout",
        _ => "server_error",
    };
    if status >= 500 {
        tracing::warn!(kind = e.kind(), error = %e, "model request failed");
    }
    api_error(status, kind, e.to_string(), e.retry_after()).into_response()
}

fn gateway(s: &AppState) -> Result<&Gateway, ApiFailure> {
    s.gateway.as_deref().ok_or_else(|| {
        api_error(503, "server_error", "this server has no models configured ([[models]] in the config)".into(), None)
    })
}

/// The request's class and deadline from its headers (`default` class otherwise).
fn context(headers: &HeaderMap, tenant: &Tenant, default: Class) -> Result<CallContext, ApiFailure> {
    let (class, within) = class_and_deadline(headers, default)?;
    Ok(CallContext::new(class, within, tenant.id.to_string()))
}

/// Refuses malformed priority and deadline headers, for a route that calls a model only
/// sometimes (Apply merges with one only when its matcher cannot place an edit): a request's
/// headers are checked whether or not they end up used.
pub(crate) fn check_model_headers(headers: &HeaderMap) -> crate::error::Result<()> {
    class_and_deadline(headers, Class::Interactive).map(|_| ()).map_err(|f| crate::error::Error::BadRequest(f.message))
}

fn class_and_deadline(headers: &HeaderMap, default: Class) -> Result<(Class, Duration), ApiFailure> {
    let class = match headers.get(PRIORITY_HEADER).map(|v| v.to_str().ok().and_then(Class::parse)) {
        None => default,
        Some(Some(c)) => c,
        Some(None) => {
            let msg = format!("{PRIORITY_HEADER} must be interactive, agent or background");
            return Err(api_error(400, "invalid_request_error", msg, None));
        }
    };
    let default_ms = match class {
        Class::Interactive => 60_000,
        Class::Agent => 300_000,
        Class::Background => 900_000,
    };
    let ms = match headers.get(DEADLINE_HEADER).map(|v| v.to_str().ok().and_then(|v| v.parse::<u64>().ok())) {
        None => default_ms,
        Some(Some(ms)) if ms > 0 => ms.min(3_600_000),
        Some(_) => {
            let msg = format!("{DEADLINE_HEADER} must be a positive number of milliseconds");
            return Err(api_error(400, "invalid_request_error", msg, None));
        }
    };
    Ok((class, Duration::from_millis(ms)))
}

/// The gateway and the request's context, or the error to answer with.
fn prepare<'a>(
    s: &'a AppState,
    headers: &HeaderMap,
    tenant: &Tenant,
    default: Class,
) -> Result<(&'a Gateway, CallContext), ApiFailure> {
    Ok((gateway(s)?, context(headers, tenant, default)?))
}

/// [`prepare`] for routes that answer with the server's own error body.
pub(crate) fn prepare_for<'a>(
    s: &'a AppState,
    headers: &HeaderMap,
    tenant: &Tenant,
    default: Class,
) -> crate::error::Result<(&'a Gateway, CallContext)> {
    use crate::error::Error;
    prepare(s, headers, tenant, default).map_err(|f| match f.status {
        503 => Error::Unavailable(f.message),
        _ => Error::BadRequest(f.message),
    })
}

/// A model call's failure as the server's error (`doing`: what was being done, for 5xx).
pub(crate) fn model_failure(doing: &str, e: &caret_models::Error) -> crate::error::Error {
    use crate::error::Error;
    match e.status() {
        429 => Error::RateLimited { retry_after: e.retry_after().map_or(1, |d| d.as_secs().max(1)) },
        400 | 404 => Error::BadRequest(e.to_string()),
        408 => Error::Timeout(format!("{doing}: {e}")),
        _ => Error::Unavailable(format!("{doing}: {e}")),
    }
}

/// The events up to and including the first error.
fn until_error(events: EventStream) -> impl futures::Stream<Item = caret_models::Result<Event>> + Send {
    events.scan(false, |failed, e| futures::future::ready((!*failed).then(|| e.inspect_err(|_| *failed = true))))
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn response_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}", fastrand::u64(..))
}

/// A server-sent-event body of JSON payloads, then `[DONE]`.
fn sse<S>(payloads: S) -> Response
where
    S: futures::Stream<Item = String> + Send + 'static,
{
    let body = payloads
        .map(|p| format!("data: {p}\n\n"))
        .chain(futures::stream::once(async { "data: [DONE]\n\n".to_owned() }))
        .map(|s| Ok::<_, Infallible>(bytes::Bytes::from(s)));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A mid-stream error as the last payload (the status line has already gone out).
fn stream_error(e: &caret_models::Error) -> String {
    let body = ApiError { error: ApiErrorDetail { message: e.to_string(), kind: "server_error".into(), code: None } };
    serde_json::to_string(&body).unwrap_or_default()
}

pub(crate) async fn chat_completions(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Json(req): Json<ChatRequest>,
) -> Response {
    let (gw, ctx) = match prepare(&s, &headers, &t, Class::Interactive) {
        Ok(found) => found,
        Err(r) => return r.into_response(),
    };
    if req.messages.is_empty() {
        return api_error(400, "invalid_request_error", "messages must not be empty".into(), None).into_response();
    }
    if let Err(r) = model_allowed(&s, &t, &caller, &req.model) {
        return r.into_response();
    }
    let warning = match budget(&s, &caller).await {
        Ok(w) => w,
        Err(r) => return r.into_response(),
    };
    let (alias, stream, usage_wanted) =
        (req.model.clone(), req.stream, req.stream_options.as_ref().is_some_and(|o| o.include_usage));
    let started = std::time::Instant::now();
    let opened = gw.chat(req, ctx).await;
    s.usage.record(
        &t.id,
        caller.principal.user.as_deref(),
        "chat",
        &alias,
        Some(started.elapsed().as_secs_f64() * 1e3),
        opened.is_ok(),
    );
    let events = match opened {
        Ok(events) => crate::spend::metered(events, &s, &caller, &alias),
        Err(e) => return gateway_error(&e),
    };
    warned(chat_answer(events, alias, stream, usage_wanted).await, warning)
}

/// A person's budget checked: refused (429 `budget_exhausted`) when spent, else a warning to
/// put on the answer once 80% is.
async fn budget(s: &AppState, caller: &Caller) -> Result<Option<HeaderValue>, ApiFailure> {
    crate::spend::check(s, caller)
        .await
        .map_err(|(why, after)| api_error(429, "budget_exhausted", why, Some(Duration::from_secs(after))))
}

/// `response` with the budget's warning, if any.
fn warned(mut response: Response, warning: Option<HeaderValue>) -> Response {
    if let Some(w) = warning {
        response.headers_mut().insert(crate::spend::WARNING_HEADER, w);
    }
    response
}

/// A chat's answer: one JSON body, or its stream of chunks.
async fn chat_answer(events: EventStream, alias: String, stream: bool, usage_wanted: bool) -> Response {
    if !stream {
        return match collect_chat(events).await {
            Ok(c) => axum::Json(ChatResponse {
                id: response_id("chatcmpl"),
                object: "chat.completion".into(),
                created: now_secs(),
                model: alias,
                choices: vec![ChatChoice { index: 0, message: c.message, finish_reason: c.finish }],
                usage: c.usage.unwrap_or_default(),
            })
            .into_response(),
            Err(e) => gateway_error(&e),
        };
    }
    stream_chat(events, alias, usage_wanted)
}

/// What one streamed chunk carries.
#[derive(Default)]
struct Piece {
    delta: ChatDelta,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    prompt_ids: Option<Vec<u32>>,
    ids: Option<Vec<u32>>,
    logprobs: Option<ChoiceLogprobs>,
}

/// A chat answer as OpenAI's streamed chunks (server-sent events).
pub(crate) fn stream_chat(events: EventStream, alias: String, usage_wanted: bool) -> Response {
    let (id, created) = (response_id("chatcmpl"), now_secs());
    let chunk = move |p: Piece| {
        let choices = if p.usage.is_some() || p.prompt_ids.is_some() {
            Vec::new()
        } else {
            vec![ChunkChoice {
                index: 0,
                delta: p.delta,
                finish_reason: p.finish,
                logprobs: p.logprobs,
                token_ids: p.ids,
            }]
        };
        let c = ChatChunk {
            id: id.clone(),
            object: "chat.completion.chunk".into(),
            created,
            model: alias.clone(),
            choices,
            usage: p.usage,
            prompt_token_ids: p.prompt_ids,
        };
        serde_json::to_string(&c).unwrap_or_default()
    };
    let first =
        chunk(Piece { delta: ChatDelta { role: Some(Role::Assistant), ..ChatDelta::default() }, ..Piece::default() });
    let rest = chat_payloads(events, chunk, usage_wanted);
    sse(futures::stream::once(async move { first }).chain(rest))
}

/// Events as chat chunk payloads (usage only when asked for; an error ends the stream).
fn chat_payloads<F>(events: EventStream, chunk: F, usage_wanted: bool) -> impl futures::Stream<Item = String> + Send
where
    F: Fn(Piece) -> String + Send + 'static,
{
    until_error(events).filter_map(move |e| {
        let payload = match e {
            Ok(Event::Text(t)) => {
                Some(chunk(Piece { delta: ChatDelta { content: Some(t), ..ChatDelta::default() }, ..Piece::default() }))
            }
            Ok(Event::ToolCall { index, id, name, arguments }) => {
                let kind = id.as_ref().map(|_| "function".to_owned());
                let function = FunctionCallDelta { name, arguments: Some(arguments) };
                let delta =
                    ChatDelta { tool_calls: vec![ToolCallDelta { index, id, kind, function }], ..ChatDelta::default() };
                Some(chunk(Piece { delta, ..Piece::default() }))
            }
            Ok(Event::Finish(f)) => Some(chunk(Piece { finish: Some(f), ..Piece::default() })),
            Ok(Event::Usage(u)) => usage_wanted.then(|| chunk(Piece { usage: Some(u), ..Piece::default() })),
            Ok(Event::PromptTokens(ids)) => Some(chunk(Piece { prompt_ids: Some(ids), ..Piece::default() })),
            Ok(Event::Tokens { ids, logprobs }) => Some(chunk(Piece {
                ids: (!ids.is_empty()).then_some(ids),
                logprobs: (!logprobs.is_empty()).then_some(ChoiceLogprobs { content: logprobs }),
                ..Piece::default()
            })),
            Err(e) => Some(stream_error(&e)),
        };
        futures::future::ready(payload)
    })
}

pub(crate) async fn completions(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Json(req): Json<CompletionRequest>,
) -> Response {
    let (gw, ctx) = match prepare(&s, &headers, &t, Class::Interactive) {
        Ok(found) => found,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = model_allowed(&s, &t, &caller, &req.model) {
        return r.into_response();
    }
    let warning = match budget(&s, &caller).await {
        Ok(w) => w,
        Err(r) => return r.into_response(),
    };
    let (alias, stream, usage_wanted) =
        (req.model.clone(), req.stream, req.stream_options.as_ref().is_some_and(|o| o.include_usage));
    let events = match gw.complete(req, ctx).await {
        Ok(events) => crate::spend::metered(events, &s, &caller, &alias),
        Err(e) => return gateway_error(&e),
    };
    warned(completion_answer(events, alias, stream, usage_wanted).await, warning)
}

/// A completion's answer: one JSON body, or its stream.
async fn completion_answer(events: EventStream, alias: String, stream: bool, usage_wanted: bool) -> Response {
    let (id, created) = (response_id("cmpl"), now_secs());
    let make = move |text: String, finish: Option<FinishReason>, usage: Option<Usage>| CompletionResponse {
        id: id.clone(),
        object: "text_completion".into(),
        created,
        model: alias.clone(),
        choices: if usage.is_some() && text.is_empty() && finish.is_none() {
            Vec::new()
        } else {
            vec![CompletionChoice { index: 0, text, finish_reason: finish, logprobs: None }]
        },
        usage,
    };
    if !stream {
        return match collect_chat(events).await {
            Ok(c) => {
                axum::Json(make(c.message.content_text(), c.finish, Some(c.usage.unwrap_or_default()))).into_response()
            }
            Err(e) => gateway_error(&e),
        };
    }
    let payloads = until_error(events).filter_map(move |e| {
        let payload = match e {
            Ok(Event::Text(t)) => Some(make(t, None, None)),
            Ok(Event::Finish(f)) => Some(make(String::new(), Some(f), None)),
            Ok(Event::Usage(u)) => usage_wanted.then(|| make(String::new(), None, Some(u))),
            Ok(Event::ToolCall { .. } | Event::PromptTokens(_) | Event::Tokens { .. }) => None,
            Err(e) => return futures::future::ready(Some(stream_error(&e))),
        };
        futures::future::ready(payload.map(|p| serde_json::to_string(&p).unwrap_or_default()))
    });
    sse(payloads)
}

pub(crate) async fn embeddings(
    State(s): State<AppState>,
    Extension(t): Extension<Tenant>,
    headers: HeaderMap,
    Json(req): Json<EmbeddingsRequest>,
) -> Response {
    let (gw, ctx) = match prepare(&s, &headers, &t, Class::Background) {
        Ok(found) => found,
        Err(r) => return r.into_response(),
    };
    match gw.embed(req, ctx).await {
        Ok(r) => axum::Json(r).into_response(),
        Err(e) => gateway_error(&e),
    }
}

pub(crate) async fn models(State(s): State<AppState>) -> Response {
    let data = s
        .gateway
        .as_ref()
        .map(|g| g.aliases())
        .unwrap_or_default()
        .into_iter()
        .map(|id| ModelCard { id, object: "model".into(), created: 0, owned_by: "caret".into() })
        .collect();
    axum::Json(ModelList { object: "list".into(), data }).into_response()
}

/// Keeps the gateway's recovery admission in step with the database (where `caret admin
/// recovery` writes it), so every replica admits the same tenants: polled every `every`.
pub fn spawn_recovery_watch(
    service: Arc<caret_index::service::Service>,
    gateway: Arc<Gateway>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut applied = None;
        loop {
            match service.db().recovery().await {
                Ok(row) if row != applied => {
                    match row {
                        Some(r) => {
                            let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
                            let elapsed =
                                Duration::from_secs(now.saturating_sub(u64::try_from(r.started_at).unwrap_or(0)));
                            let ramp = Duration::from_secs(u64::try_from(r.ramp_s).unwrap_or(0));
                            gateway.resume_recovery(r.from_permille as f64 / 1000.0, ramp, elapsed);
                            tracing::warn!(
                                from_permille = r.from_permille,
                                ramp_s = r.ramp_s,
                                "gateway recovery admission on"
                            );
                        }
                        None => {
                            gateway.end_recovery();
                            tracing::info!("gateway recovery admission off");
                        }
                    }
                    applied = row;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reading recovery admission"),
            }
            tokio::time::sleep(every).await;
        }
    })
}

/// A model of the gateway merges a lazy snippet the matcher could not place (`why`), the
/// region's current text sent as the speculative draft.
pub(crate) async fn merge(
    s: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    text: &caret_apply::Text,
    req: &caret_protocol::apply::ApplyRequest,
    model: &str,
    why: &caret_apply::Error,
) -> crate::error::Result<(caret_apply::Text, caret_protocol::apply::MergeFacts)> {
    use crate::error::Error;
    let (gw, ctx) = prepare_for(s, headers, &caller.tenant, Class::Agent)?;
    let plan =
        caret_apply::merge::plan(text, &req.edit, req.path.as_deref()).map_err(|e| Error::BadRequest(e.to_string()))?;
    let failed = |e: caret_models::Error| model_failure(&format!("merging with model {model}"), &e);
    let events = gw.chat(plan.request(model, true), ctx).await.map_err(failed)?;
    let answer = collect_chat(events).await.map_err(failed)?;
    let merged = caret_apply::merge::splice(text, &plan, &answer.message.content_text())
        .map_err(|e| Error::EditDoesNotFit(format!("{why}\nthe model's merge failed too: {e}")))?;
    let usage = answer.usage.unwrap_or_default();
    crate::spend::record(s, caller, model, i64::from(usage.prompt_tokens) + i64::from(usage.completion_tokens));
    let details = usage.completion_tokens_details.unwrap_or_default();
    let facts = caret_protocol::apply::MergeFacts {
        model: model.to_owned(),
        reason: why.to_string(),
        region: [plan.start + 1, plan.end],
        generated_tokens: usage.completion_tokens,
        accepted_prediction_tokens: details.accepted_prediction_tokens,
        rejected_prediction_tokens: details.rejected_prediction_tokens,
    };
    Ok((merged, facts))
}
