//! A scripted model server: a test double that answers OpenAI-compatible chat, completion,
//! embedding and model-list requests and Anthropic Messages (`/v1/messages`) with canned text,
//! and can be told to throttle (429), fail (5xx), fail every other request, answer slowly,
//! stall mid-stream, or recover. It keeps the last request it was sent, headers included.
//!
//! For whole agent sessions it takes a queue of answers ([`ScriptedUpstream::queue`]): text, or
//! several tool calls at once, each call with its own id. It then checks every chat request the
//! way the real APIs do — each tool call answered by a result with its id, in the place the
//! format wants it, only offered tools called — and refuses a request that breaks a rule (400,
//! kept in [`ScriptedUpstream::violations`]).

use std::collections::VecDeque;
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
    /// Answer chat by the conversation's progress (when the queue is empty): the k-th answer
    /// to a request that already holds k assistant messages, the last past the end. Many
    /// conversations can run at once against one script this way.
    pub conversation: Vec<Answer>,
    /// Answer chat and completions with this text, completions streamed 3 characters a
    /// chunk (default: `hello from NAME`; completions: a line naming the prompt's length).
    pub answer: Option<String>,
}

/// One queued chat answer.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Text, streamed a word at a time.
    Text(String),
    /// Tool calls made together in one answer: (tool name, arguments).
    Calls(Vec<(String, Value)>),
}

/// The conversation of an agent that fixes `add.sh` (`echo $(( $1 - $2 ))` → `+`): it reads
/// the file, edits it, and says so — three model calls, two tools.
pub fn fix_add_conversation() -> Vec<Answer> {
    vec![
        Answer::Calls(vec![("read_file".into(), json!({"path": "add.sh"}))]),
        Answer::Calls(vec![(
            "edit_file".into(),
            json!({"path": "add.sh", "edit": "<<<<<<< SEARCH\necho $(( $1 - $2 ))\n=======\necho $(( $1 + $2 ))\n>>>>>>> REPLACE"}),
        )]),
        Answer::Text("add.sh adds now.".into()),
    ]
}

struct Script {
    name: String,
    queue: Mutex<VecDeque<Answer>>,
    violations: Mutex<Vec<String>>,
    chats: Mutex<Vec<Value>>,
    call_ids: AtomicU64,
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
            queue: Mutex::default(),
            violations: Mutex::default(),
            chats: Mutex::default(),
            call_ids: AtomicU64::new(0),
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

    /// Queues answers for the next chat requests (OpenAI or Anthropic) and completions (text
    /// only), one each, before the behaviour's own answer comes back into use.
    pub fn queue(&self, answers: impl IntoIterator<Item = Answer>) {
        self.script.queue.lock().unwrap().extend(answers);
    }

    /// Queued answers not given yet.
    pub fn queued(&self) -> usize {
        self.script.queue.lock().unwrap().len()
    }

    /// The rules chat requests broke (each refused with a 400).
    pub fn violations(&self) -> Vec<String> {
        self.script.violations.lock().unwrap().clone()
    }

    /// Every chat and completion request body received (OpenAI and Anthropic), in order.
    pub fn chats(&self) -> Vec<Value> {
        self.script.chats.lock().unwrap().clone()
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
    let stop = match answer_for(&s, &b, &req, Format::Anthropic) {
        Err(r) => return *r,
        Ok(Answer::Calls(calls)) => {
            for (i, (tool, args)) in calls.iter().enumerate() {
                let id = format!("toolu_{}", s.call_ids.fetch_add(1, Ordering::SeqCst) + 1);
                events.push((
                    "content_block_start",
                    json!({"type": "content_block_start", "index": i,
                           "content_block": {"type": "tool_use", "id": id, "name": tool, "input": {}}}),
                ));
                let args = args.to_string();
                let (head, tail) = halves(&args);
                for piece in [head, tail] {
                    events.push((
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i,
                               "delta": {"type": "input_json_delta", "partial_json": piece}}),
                    ));
                }
                events.push(("content_block_stop", json!({"type": "content_block_stop", "index": i})));
            }
            "tool_use"
        }
        Ok(Answer::Text(text)) => {
            events.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            for word in text.split_inclusive(' ') {
                events.push((
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}),
                ));
            }
            events.push(("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
            "end_turn"
        }
    };
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

#[derive(Clone, Copy, PartialEq)]
enum Format {
    OpenAi,
    Anthropic,
}

/// A string cut in two at about its middle.
fn halves(text: &str) -> (&str, &str) {
    let mut cut = text.len() / 2;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.split_at(cut)
}

/// The answer to a chat request that passed the verdict: the next queued one, else the
/// behaviour's; `Err` (400) when the request breaks the format's rules (or a queued answer
/// calls a tool the request does not offer).
fn answer_for(s: &Script, b: &Behaviour, req: &Value, format: Format) -> Result<Answer, Box<Response>> {
    s.chats.lock().unwrap().push(req.clone());
    let queued = s.queue.lock().unwrap().pop_front().or_else(|| {
        let said = req["messages"].as_array().map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
        b.conversation.get(said).or(b.conversation.last()).cloned()
    });
    let offer_checked = queued.is_some();
    let answer = queued.unwrap_or_else(|| match &b.tool_call {
        Some(tool) => {
            let args = b.tool_arguments.as_deref().unwrap_or("{\"path\":\"src/lib.rs\"}");
            Answer::Calls(vec![(tool.clone(), serde_json::from_str(args).unwrap_or(Value::String(args.to_owned())))])
        }
        None => Answer::Text(b.answer.clone().unwrap_or_else(|| format!("hello from {}", s.name))),
    });
    let broken = match format {
        Format::OpenAi => check_openai(req),
        Format::Anthropic => check_anthropic(req),
    }
    .err()
    .or_else(|| match &answer {
        // The behaviour's single call is made whatever the request offers (gateway tests).
        Answer::Calls(calls) if offer_checked => calls
            .iter()
            .find(|(name, _)| !offered(req, format).contains(name))
            .map(|(name, _)| format!("the script calls {name:?}, which the request does not offer")),
        _ => None,
    });
    match broken {
        Some(why) => {
            s.violations.lock().unwrap().push(why.clone());
            Err(Box::new(error(400, &why)))
        }
        None => Ok(answer),
    }
}

/// The names of the tools a request offers.
fn offered(req: &Value, format: Format) -> Vec<String> {
    let tools = req["tools"].as_array().map(Vec::as_slice).unwrap_or_default();
    let name = |t: &Value| match format {
        Format::OpenAi => t["function"]["name"].as_str().map(str::to_owned),
        Format::Anthropic => t["name"].as_str().map(str::to_owned),
    };
    tools.iter().filter_map(name).collect()
}

/// OpenAI chat rules: an assistant message's tool calls (id, function name, arguments as JSON
/// text) are each answered by a `tool` message with that id, right after it; no other `tool`
/// message.
fn check_openai(req: &Value) -> Result<(), String> {
    let messages = req["messages"].as_array().ok_or("no messages")?;
    if req.get("return_token_ids").is_some() || messages.iter().any(|m| m.get("token_ids").is_some()) {
        return Err("Caret's token-id extensions were sent to an OpenAI-compatible upstream".to_owned());
    }
    let mut open: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().ok_or(format!("message {i} has no role"))?;
        if role == "tool" {
            let id = m["tool_call_id"].as_str().ok_or(format!("tool message {i} has no tool_call_id"))?;
            let at =
                open.iter().position(|o| o == id).ok_or(format!("tool message {i} answers no open call ({id})"))?;
            open.remove(at);
            if !m["content"].is_string() {
                return Err(format!("tool message {i}'s content is not text"));
            }
            continue;
        }
        if !open.is_empty() {
            return Err(format!("message {i} ({role}) comes before the results of calls {open:?}"));
        }
        if !["system", "user", "assistant"].contains(&role) {
            return Err(format!("message {i} has role {role:?}"));
        }
        for call in m["tool_calls"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let id =
                call["id"].as_str().filter(|id| !id.is_empty()).ok_or(format!("a call in message {i} has no id"))?;
            let name = call["function"]["name"].as_str().unwrap_or("");
            let args = call["function"]["arguments"].as_str().ok_or(format!("call {id}'s arguments are not text"))?;
            if name.is_empty() || call["type"] != "function" || serde_json::from_str::<Value>(args).is_err() {
                return Err(format!("call {id} in message {i} is malformed: {call}"));
            }
            open.push(id.to_owned());
        }
    }
    if open.is_empty() { Ok(()) } else { Err(format!("calls {open:?} have no results")) }
}

/// Anthropic Messages rules: the system prompt at the top, user and assistant turns
/// alternating from a user one, each `tool_use` block (object input) answered by a
/// `tool_result` block with its id at the start of the next user message, and no other.
fn check_anthropic(req: &Value) -> Result<(), String> {
    if !req["max_tokens"].is_u64() {
        return Err("max_tokens is required".to_owned());
    }
    let messages = req["messages"].as_array().ok_or("no messages")?;
    let mut open: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or("");
        let expected = if i % 2 == 0 { "user" } else { "assistant" };
        if role != expected {
            return Err(format!("message {i} is {role:?} where a {expected} message must come"));
        }
        let blocks: Vec<Value> = match &m["content"] {
            Value::String(t) => vec![json!({"type": "text", "text": t})],
            Value::Array(a) => a.clone(),
            other => return Err(format!("message {i}'s content is {other}")),
        };
        let mut results_done = false;
        for b in &blocks {
            match b["type"].as_str() {
                Some("tool_result") => {
                    let id = b["tool_use_id"].as_str().unwrap_or("");
                    if role != "user" || results_done {
                        return Err(format!("a tool_result ({id}) out of place in message {i}"));
                    }
                    let at =
                        open.iter().position(|o| o == id).ok_or(format!("tool_result {id} answers no tool_use"))?;
                    open.remove(at);
                }
                Some("tool_use") => {
                    let id = b["id"].as_str().unwrap_or("");
                    if role != "assistant" || id.is_empty() || !b["input"].is_object() || !b["name"].is_string() {
                        return Err(format!("a malformed tool_use in message {i}: {b}"));
                    }
                    open.push(id.to_owned());
                }
                Some("text") => results_done = true,
                other => return Err(format!("a {other:?} block in message {i}")),
            }
            if role == "user" && b["type"] != "tool_result" {
                results_done = true;
            }
        }
        if role == "user" && !open.is_empty() {
            return Err(format!("tool_use {open:?} has no tool_result in message {i}"));
        }
    }
    if open.is_empty() { Ok(()) } else { Err(format!("tool_use {open:?} has no tool_result")) }
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
    let finish = match answer_for(&s, &b, &req, Format::OpenAi) {
        Err(r) => return *r,
        Ok(Answer::Calls(calls)) => {
            for (i, (tool, args)) in calls.iter().enumerate() {
                // The arguments come in two pieces, as streaming servers send them.
                let id = format!("call_{}", s.call_ids.fetch_add(1, Ordering::SeqCst) + 1);
                let args = args.to_string();
                let (head, tail) = halves(&args);
                events.push(chunk(
                    json!({"tool_calls": [{"index": i, "id": id, "type": "function", "function": {"name": tool, "arguments": head}}]}),
                    Value::Null,
                ));
                events.push(chunk(json!({"tool_calls": [{"index": i, "function": {"arguments": tail}}]}), Value::Null));
            }
            "tool_calls"
        }
        Ok(Answer::Text(text)) => {
            for word in text.split_inclusive(' ') {
                let mut c = chunk(json!({"content": word}), Value::Null);
                // As OpenAI answers `logprobs: true`: an entry per token of the content (a
                // word is a token here).
                if req["logprobs"] == true {
                    c["choices"][0]["logprobs"] =
                        json!({"content": [{"token": word, "logprob": -0.5, "bytes": null, "top_logprobs": []}]});
                }
                events.push(c);
            }
            "stop"
        }
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
    s.chats.lock().unwrap().push(req.clone());
    let queued = match s.queue.lock().unwrap().pop_front() {
        Some(Answer::Text(t)) => Some(t),
        Some(other) => return error(400, &format!("a completion cannot answer {other:?}")),
        None => None,
    };
    let mut events = match queued.as_ref().or(b.answer.as_ref()) {
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
