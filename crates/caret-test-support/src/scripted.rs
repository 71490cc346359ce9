//! A scripted model server: a test double that answers OpenAI-compatible chat, completion,
//! embedding and model-list requests and Anthropic Messages (`/v1/messages`) with canned text,
//! and can be told to throttle (429), fail (5xx), fail every other request, answer slowly,
//! stall mid-stream, or recover. It keeps the last request it was sent, headers included.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use futures::StreamExt as _;
use serde_json::{Value, json};

/// How the server behaves; change it at any time with [`ScriptedUpstream::set`].
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// Answer every request with this status (e.g. 500, 503, 400).
    pub status: Option<u16>,
    /// Answer 429 with this `Retry-After` (seconds).
    pub throttle: Option<u64>,
    /// Fail (500) every `n`th request (2: every other one).
    pub fail_every: Option<u64>,
    /// Wait this long before answering.
    pub delay: Duration,
    /// Send the first two events (a role, then some content), then go silent forever.
    pub stall_mid_stream: bool,
    /// Answer chat with a call of this tool (arguments `{"path":"src/lib.rs"}`, or
    /// `tool_arguments`).
    pub tool_call: Option<String>,
    /// The arguments of that call (JSON text).
    pub tool_arguments: Option<String>,
    /// Answer chat and completions with this text, completions streamed 3 characters a
    /// chunk (default: `hello from NAME`; completions: a line naming the prompt's length).
    pub answer: Option<String>,
}

struct Script {
    name: String,
    behaviour: Mutex<Behaviour>,
    requests: AtomicU64,
    last: Mutex<Option<(axum::http::HeaderMap, Value)>>,
    /// Requests inside their `delay` now, and the most at once since the last reset.
    waiting: AtomicU64,
    most_waiting: AtomicU64,
}

/// A running scripted server.
pub struct ScriptedUpstream {
    /// Its base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    script: Arc<Script>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedUpstream {
    /// Starts a server whose answers say `name`.
    pub async fn start(name: &str) -> Self {
        let script = Arc::new(Script {
            name: name.to_owned(),
            behaviour: Mutex::new(Behaviour::default()),
            requests: AtomicU64::new(0),
            last: Mutex::new(None),
            waiting: AtomicU64::new(0),
            most_waiting: AtomicU64::new(0),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/completions", post(completions))
            .route("/v1/embeddings", post(embeddings))
            .route("/v1/models", get(models))
            .route("/v1/messages", post(messages))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ScriptedUpstream { url, script, task }
    }

    /// The most requests that were in their `delay` at once since the last call (then resets):
    /// the concurrency the upstream saw.
    pub fn take_most_concurrent(&self) -> u64 {
        self.script.most_waiting.swap(0, Ordering::SeqCst)
    }

    /// The last chat or completions request (OpenAI or Anthropic Messages): headers and body.
    pub fn last_request(&self) -> Option<(axum::http::HeaderMap, Value)> {
        self.script.last.lock().unwrap().clone()
    }

    /// Changes the behaviour.
    pub fn set(&self, b: Behaviour) {
        *self.script.behaviour.lock().unwrap() = b;
    }

    /// Requests received so far (model lists included).
    pub fn requests(&self) -> u64 {
        self.script.requests.load(Ordering::SeqCst)
    }
}

/// Anthropic Messages, streamed: `event:` + `data:` pairs as Anthropic sends them.
async fn messages(State(s): State<Arc<Script>>, headers: axum::http::HeaderMap, Json(req): Json<Value>) -> Response {
    *s.last.lock().unwrap() = Some((headers, req.clone()));
    let b = match verdict(&s).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mut events = vec![(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
               "content": [], "model": req["model"], "usage": {"input_tokens": 10, "output_tokens": 1}}}),
    )];
    let stop = if let Some(tool) = &b.tool_call {
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "tool_use", "id": "toolu_1", "name": tool, "input": {}}}),
        ));
        for piece in ["{\"path\":", "\"src/lib.rs\"}"] {
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "input_json_delta", "partial_json": piece}}),
            ));
        }
        "tool_use"
    } else {
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ));
        let text = b.answer.clone().unwrap_or_else(|| format!("hello from {}", s.name));
        for word in text.split_inclusive(' ') {
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}),
            ));
        }
        "end_turn"
    };
    events.push(("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
    events.push((
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 3}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    let lines: Vec<Result<Bytes, Infallible>> =
        events.iter().map(|(kind, data)| Ok(Bytes::from(format!("event: {kind}\ndata: {data}\n\n")))).collect();
    let body = if b.stall_mid_stream {
        Body::from_stream(futures::stream::iter(lines.into_iter().take(3)).chain(futures::stream::pending()))
    } else {
        Body::from_stream(futures::stream::iter(lines))
    };
    Response::builder().header("content-type", "text/event-stream").body(body).unwrap()
}

/// The scripted verdict for one request: `Err(response)` to answer with an error.
async fn verdict(s: &Script) -> Result<Behaviour, Response> {
    let n = s.requests.fetch_add(1, Ordering::SeqCst) + 1;
    let b = s.behaviour.lock().unwrap().clone();
    if !b.delay.is_zero() {
        let now = s.waiting.fetch_add(1, Ordering::SeqCst) + 1;
        s.most_waiting.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(b.delay).await;
        s.waiting.fetch_sub(1, Ordering::SeqCst);
    }
    if let Some(after) = b.throttle {
        let mut r = error(429, "rate limited").into_response();
        r.headers_mut().insert("retry-after", HeaderValue::from(after));
        return Err(r);
    }
    if let Some(status) = b.status {
        return Err(error(status, "scripted failure"));
    }
    if b.fail_every.is_some_and(|every| n.is_multiple_of(every.max(1))) {
        return Err(error(500, "scripted intermittent failure"));
    }
    Ok(b)
}

fn error(status: u16, message: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, Json(json!({"error": {"message": message, "type": "scripted", "code": null}}))).into_response()
}

/// A server-sent-event response of `events` (then `[DONE]`), or the first two and then
/// silence.
fn sse(events: Vec<Value>, stall: bool) -> Response {
    let mut lines: Vec<String> = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    lines.push("data: [DONE]\n\n".to_owned());
    let body = if stall {
        let first = lines.into_iter().take(2).map(|l| Ok::<_, Infallible>(Bytes::from(l)));
        Body::from_stream(futures::stream::iter(first).chain(futures::stream::pending()))
    } else {
        Body::from_stream(futures::stream::iter(lines.into_iter().map(|l| Ok::<_, Infallible>(Bytes::from(l)))))
    };
    Response::builder().header("content-type", "text/event-stream").body(body).unwrap()
}

async fn chat(State(s): State<Arc<Script>>, headers: axum::http::HeaderMap, Json(req): Json<Value>) -> Response {
    *s.last.lock().unwrap() = Some((headers, req.clone()));
    let b = match verdict(&s).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let model = req["model"].as_str().unwrap_or("").to_owned();
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut events = vec![chunk(json!({"role": "assistant"}), Value::Null)];
    let finish = if let Some(tool) = &b.tool_call {
        // The arguments come in two pieces, as streaming servers send them.
        let args = b.tool_arguments.clone().unwrap_or_else(|| "{\"path\":\"src/lib.rs\"}".to_owned());
        let mut cut = args.len() / 2;
        while !args.is_char_boundary(cut) {
            cut -= 1;
        }
        events.push(chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": tool, "arguments": &args[..cut]}}]}),
            Value::Null,
        ));
        events.push(chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": &args[cut..]}}]}), Value::Null));
        "tool_calls"
    } else {
        let text = b.answer.clone().unwrap_or_else(|| format!("hello from {}", s.name));
        for word in text.split_inclusive(' ') {
            events.push(chunk(json!({"content": word}), Value::Null));
        }
        "stop"
    };
    events.push(chunk(json!({}), json!(finish)));
    events.push(json!({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [],
                       "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}));
    sse(events, b.stall_mid_stream)
}

async fn completions(State(s): State<Arc<Script>>, headers: axum::http::HeaderMap, Json(req): Json<Value>) -> Response {
    *s.last.lock().unwrap() = Some((headers, req.clone()));
    let b = match verdict(&s).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let model = req["model"].as_str().unwrap_or("").to_owned();
    let prompt = req["prompt"].as_str().unwrap_or("");
    let text =
        if req["suffix"].is_string() { format!("<fim {}>", s.name) } else { format!(" after {} chars", prompt.len()) };
    let chunk = |text: &str, finish: Value| {
        json!({"id": "p", "object": "text_completion", "created": 0, "model": model,
               "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": null}]})
    };
    let mut events = match &b.answer {
        Some(answer) => {
            let chars: Vec<char> = answer.chars().collect();
            chars.chunks(3).map(|c| chunk(&c.iter().collect::<String>(), Value::Null)).collect()
        }
        None => vec![chunk(&text, Value::Null)],
    };
    events.push(chunk("", json!("stop")));
    sse(events, b.stall_mid_stream)
}

async fn embeddings(State(s): State<Arc<Script>>, Json(req): Json<Value>) -> Response {
    if let Err(r) = verdict(&s).await {
        return r;
    }
    let texts: Vec<String> = match &req["input"] {
        Value::String(t) => vec![t.clone()],
        Value::Array(a) => a.iter().map(|v| v.as_str().unwrap_or("").to_owned()).collect(),
        _ => Vec::new(),
    };
    let data: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": [t.len() as f32, 1.0, 0.0]}))
        .collect();
    Json(json!({"object": "list", "data": data, "model": req["model"],
                "usage": {"prompt_tokens": texts.len(), "total_tokens": texts.len()}}))
    .into_response()
}

async fn models(State(s): State<Arc<Script>>) -> Response {
    if let Err(r) = verdict(&s).await {
        return r;
    }
    Json(json!({"object": "list", "data": [{"id": "scripted", "object": "model", "created": 0, "owned_by": s.name}]}))
        .into_response()
}
