//! A provider for OpenAI-compatible servers: OpenAI itself, vLLM, llama.cpp's server, TEI,
//! Ollama. Always streams from the upstream; the gateway collects for non-streaming clients.

use std::time::Duration;

use caret_protocol::llm::{
    ChatChunk, ChatRequest, CompletionRequest, CompletionResponse, EmbeddingsRequest, EmbeddingsResponse, StreamOptions,
};
use futures::StreamExt as _;

use crate::provider::{Event, EventStream, Provider};
use crate::sse::events;
use crate::{Error, Result};

/// An OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    base: String,
    api_key: Option<String>,
    client: reqwest::Client,
    /// The upstream is a Caret server: requests keep Caret's extensions (sampled token ids
    /// on messages, `return_token_ids`), which other servers would refuse.
    caret: bool,
}

impl OpenAiProvider {
    /// A provider for the server at `url` (with or without the trailing `/v1`).
    pub fn new(url: &str, api_key: Option<String>) -> Result<Self> {
        let base = url.trim_end_matches('/').trim_end_matches("/v1").to_owned();
        Ok(OpenAiProvider { base, api_key, client: http_client()?, caret: false })
    }

    /// Requests keep Caret's extensions: the upstream is a Caret server.
    #[must_use]
    pub fn caret_upstream(mut self) -> Self {
        self.caret = true;
        self
    }

    async fn post(&self, path: &str, body: &impl serde::Serialize) -> Result<reqwest::Response> {
        let mut req = self.client.post(format!("{}{path}", self.base)).json(body);
        // The caller's trace continues upstream (nothing is added without a collector).
        if let Some(parent) = caret_trace::traceparent() {
            req = req.header(caret_trace::TRACEPARENT, parent);
        }
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        checked(&self.base, req.send().await).await
    }
}

/// The HTTP client providers share settings with: connect timeout only (deadlines are the
/// gateway's), rustls.
pub(crate) fn http_client() -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| Error::Upstream { upstream: "http client".into(), status: None, message: e.to_string() })
}

/// Classifies a response: 2xx passes, 429 is rate limiting, 5xx a retryable failure, other
/// 4xx a rejection; transport errors are retryable failures.
pub(crate) async fn checked(
    upstream: &str,
    sent: std::result::Result<reqwest::Response, reqwest::Error>,
) -> Result<reqwest::Response> {
    let resp = sent.map_err(|e| transport(upstream, &e))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64);
    let body = resp.text().await.unwrap_or_default();
    let message = error_message(&body).unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_owned());
    let upstream = upstream.to_owned();
    Err(match status.as_u16() {
        429 => Error::RateLimited { upstream, retry_after },
        s @ 500..=599 => Error::Upstream { upstream, status: Some(s), message },
        s => Error::Rejected { upstream, status: s, message },
    })
}

/// The message of an error body in OpenAI's or Anthropic's shape.
fn error_message(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let m = v["error"]["message"].as_str().or_else(|| v["message"].as_str())?;
    Some(m.chars().take(500).collect())
}

pub(crate) fn transport(upstream: &str, e: &reqwest::Error) -> Error {
    Error::Upstream { upstream: upstream.to_owned(), status: None, message: e.to_string() }
}

/// Server-sent `data:` payloads of a response body, up to `[DONE]`.
pub(crate) fn data_events<S, E>(upstream: String, body: S) -> futures::stream::BoxStream<'static, Result<String>>
where
    S: futures::Stream<Item = std::result::Result<bytes::Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display + Send + 'static,
{
    events(body)
        .map(move |e| {
            e.map(|e| e.data).map_err(|e| Error::Upstream {
                upstream: upstream.clone(),
                status: None,
                message: e.to_string(),
            })
        })
        .take_while(|d| futures::future::ready(!matches!(d, Ok(d) if d == "[DONE]")))
        .boxed()
}

fn parse<T: serde::de::DeserializeOwned>(upstream: &str, data: &str) -> Result<T> {
    serde_json::from_str(data).map_err(|e| Error::Upstream {
        upstream: upstream.to_owned(),
        status: None,
        message: format!("unreadable event: {e}"),
    })
}

fn chat_events(upstream: &str, chunk: ChatChunk) -> Result<Vec<Event>> {
    let mut out = Vec::new();
    if let Some(ids) = chunk.prompt_token_ids {
        out.push(Event::PromptTokens(ids));
    }
    for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
        if let Some(t) = choice.delta.content.filter(|t| !t.is_empty()) {
            out.push(Event::Text(t));
        }
        for call in choice.delta.tool_calls {
            // Calls are collected by index: a huge one would make room for that many.
            if call.index >= crate::MAX_TOOL_CALLS {
                return Err(Error::Upstream {
                    upstream: upstream.to_owned(),
                    status: None,
                    message: format!("tool call index {} is past the limit of {}", call.index, crate::MAX_TOOL_CALLS),
                });
            }
            out.push(Event::ToolCall {
                index: call.index,
                id: call.id,
                name: call.function.name,
                arguments: call.function.arguments.unwrap_or_default(),
            });
        }
        let ids = choice.token_ids.unwrap_or_default();
        let logprobs = choice.logprobs.map(|l| l.content).unwrap_or_default();
        if !ids.is_empty() || !logprobs.is_empty() {
            out.push(Event::Tokens { ids, logprobs });
        }
        if let Some(f) = choice.finish_reason {
            out.push(Event::Finish(f));
        }
    }
    if let Some(u) = chunk.usage {
        out.push(Event::Usage(u));
    }
    Ok(out)
}

fn completion_events(_upstream: &str, chunk: CompletionResponse) -> Result<Vec<Event>> {
    let mut out = Vec::new();
    for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
        if !choice.text.is_empty() {
            out.push(Event::Text(choice.text));
        }
        if let Some(f) = choice.finish_reason {
            out.push(Event::Finish(f));
        }
    }
    if let Some(u) = chunk.usage {
        out.push(Event::Usage(u));
    }
    Ok(out)
}

/// Flattens the parsed payloads of a response body into events.
fn event_stream<S, E, T, F>(upstream: String, body: S, to_events: F) -> EventStream
where
    S: futures::Stream<Item = std::result::Result<bytes::Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display + Send + 'static,
    T: serde::de::DeserializeOwned,
    F: Fn(&str, T) -> Result<Vec<Event>> + Send + 'static,
{
    let name = upstream.clone();
    data_events(upstream, body)
        .flat_map(move |data| {
            let items: Vec<Result<Event>> = match data.and_then(|d| to_events(&name, parse::<T>(&name, &d)?)) {
                Ok(events) => events.into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            futures::stream::iter(items)
        })
        .boxed()
}

/// The events of a chat completion's streamed body.
pub(crate) fn chat_stream<S, E>(upstream: String, body: S) -> EventStream
where
    S: futures::Stream<Item = std::result::Result<bytes::Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display + Send + 'static,
{
    event_stream(upstream, body, chat_events)
}

#[async_trait::async_trait]
impl Provider for OpenAiProvider {
    fn describe(&self) -> String {
        format!("openai {}", self.base)
    }

    async fn chat(&self, mut req: ChatRequest) -> Result<EventStream> {
        if !self.caret {
            req.return_token_ids = None;
            for m in &mut req.messages {
                m.token_ids = None;
            }
        }
        req.stream = true;
        req.stream_options = Some(StreamOptions { include_usage: true });
        let resp = self.post("/v1/chat/completions", &req).await?;
        Ok(chat_stream(self.base.clone(), resp.bytes_stream()))
    }

    async fn complete(&self, mut req: CompletionRequest) -> Result<EventStream> {
        req.stream = true;
        req.stream_options = Some(StreamOptions { include_usage: true });
        let resp = self.post("/v1/completions", &req).await?;
        Ok(event_stream(self.base.clone(), resp.bytes_stream(), completion_events))
    }

    async fn embed(&self, req: EmbeddingsRequest) -> Result<EmbeddingsResponse> {
        let resp = self.post("/v1/embeddings", &req).await?;
        let text = resp.text().await.map_err(|e| transport(&self.base, &e))?;
        parse(&self.base, &text)
    }

    async fn health(&self) -> Result<()> {
        let mut req = self.client.get(format!("{}/v1/models", self.base));
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        checked(&self.base, req.send().await).await.map(|_| ())
    }
}
