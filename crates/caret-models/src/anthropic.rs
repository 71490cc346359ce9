//! A provider for Anthropic's Messages API (tools, streaming). OpenAI-shaped requests are
//! translated: system messages become `system`, tool calls `tool_use` blocks, tool results
//! `tool_result` blocks of a user turn; consecutive turns of one role are merged.

use std::collections::HashMap;

use caret_protocol::llm::{ChatRequest, FinishReason, Role, Usage};
use futures::StreamExt as _;
use serde_json::{Value, json};

use crate::openai::{checked, http_client};
use crate::provider::{Event, EventStream, Provider};
use crate::sse::events;
use crate::{Error, Result};

/// The API version header sent.
const VERSION: &str = "2023-06-01";

/// Anthropic's API (or a compatible one).
#[derive(Debug, Clone)]
pub struct AnthropicProvider {
    base: String,
    api_key: Option<String>,
    client: reqwest::Client,
}

impl AnthropicProvider {
    /// A provider for `url` (e.g. `https://api.anthropic.com`).
    pub fn new(url: &str, api_key: Option<String>) -> Result<Self> {
        let base = url.trim_end_matches('/').trim_end_matches("/v1").to_owned();
        Ok(AnthropicProvider { base, api_key, client: http_client()? })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut req = self.client.request(method, format!("{}{path}", self.base)).header("anthropic-version", VERSION);
        if let Some(key) = &self.api_key {
            req = req.header("x-api-key", key);
        }
        if let Some(parent) = caret_trace::traceparent() {
            req = req.header(caret_trace::TRACEPARENT, parent);
        }
        req
    }
}

/// A user message's blocks: its text, and its images (`data:` URLs) as base64 image blocks
/// (links as URL images).
fn user_blocks(m: &caret_protocol::llm::ChatMessage) -> Vec<Value> {
    let Some(caret_protocol::llm::Content::Parts(parts)) = &m.content else {
        return vec![json!({"type": "text", "text": m.content_text()})];
    };
    parts
        .iter()
        .filter_map(|p| match (&p.text, p.image_data(), &p.image_url) {
            (Some(text), _, _) => Some(json!({"type": "text", "text": text})),
            (None, Some((mime, data)), _) => {
                Some(json!({"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}}))
            }
            (None, None, Some(link)) => Some(json!({"type": "image", "source": {"type": "url", "url": link.url}})),
            (None, None, None) => None,
        })
        .collect()
}

/// The Messages request for an OpenAI-shaped chat request.
pub fn messages_body(req: &ChatRequest) -> Result<Value> {
    let mut system: Vec<String> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for m in &req.messages {
        let (role, blocks) = match m.role {
            Role::System => {
                system.push(m.content_text());
                continue;
            }
            Role::User => ("user", user_blocks(m)),
            Role::Tool => {
                let id = m
                    .tool_call_id
                    .clone()
                    .ok_or_else(|| Error::BadRequest("a tool message needs tool_call_id".into()))?;
                ("user", vec![json!({"type": "tool_result", "tool_use_id": id, "content": m.content_text()})])
            }
            Role::Assistant => {
                let mut blocks = Vec::new();
                let text = m.content_text();
                if !text.is_empty() {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                for call in &m.tool_calls {
                    let input: Value = if call.function.arguments.trim().is_empty() {
                        json!({})
                    } else {
                        serde_json::from_str(&call.function.arguments).map_err(|e| {
                            Error::BadRequest(format!("tool call {} has arguments that are not JSON: {e}", call.id))
                        })?
                    };
                    blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.function.name, "input": input}));
                }
                ("assistant", blocks)
            }
        };
        match turns.last_mut() {
            Some((last, b)) if *last == role => b.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages: Vec<Value> =
        turns.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    let mut body = json!({
        "model": req.model,
        "max_tokens": req.max_tokens.unwrap_or(1024),
        "messages": messages,
        "stream": true,
    });
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                json!({
                    "name": t.function.name,
                    "description": t.function.description.clone().unwrap_or_default(),
                    "input_schema": t.function.parameters.clone().unwrap_or_else(|| json!({"type": "object"})),
                })
            })
            .collect();
    }
    if let Some(choice) = &req.tool_choice {
        body["tool_choice"] = match choice {
            Value::String(s) if s == "required" => json!({"type": "any"}),
            Value::String(s) if s == "none" => json!({"type": "none"}),
            Value::Object(o) => match o.get("function").and_then(|f| f.get("name")) {
                Some(name) => json!({"type": "tool", "name": name}),
                None => json!({"type": "auto"}),
            },
            _ => json!({"type": "auto"}),
        };
    }
    if let Some(t) = req.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(p) = req.top_p {
        body["top_p"] = json!(p);
    }
    if let Some(stop) = &req.stop {
        body["stop_sequences"] = json!(stop.to_vec());
    }
    Ok(body)
}

/// Stream state: prompt tokens, and content block index → tool call index.
#[derive(Default)]
struct Reading {
    input_tokens: u32,
    tools: HashMap<u64, u32>,
}

impl Reading {
    fn read(&mut self, upstream: &str, kind: Option<&str>, data: &str) -> Result<Vec<Event>> {
        let v: Value = serde_json::from_str(data).map_err(|e| Error::Upstream {
            upstream: upstream.to_owned(),
            status: None,
            message: format!("unreadable event: {e}"),
        })?;
        let kind = kind.or_else(|| v["type"].as_str()).unwrap_or("");
        let mut out = Vec::new();
        match kind {
            "message_start" => {
                self.input_tokens = v["message"]["usage"]["input_tokens"].as_u64().unwrap_or(0) as u32;
            }
            "content_block_start" => {
                let block = &v["content_block"];
                if block["type"] == "tool_use" {
                    let index = self.tools.len() as u32;
                    self.tools.insert(v["index"].as_u64().unwrap_or(0), index);
                    out.push(Event::ToolCall {
                        index,
                        id: block["id"].as_str().map(str::to_owned),
                        name: block["name"].as_str().map(str::to_owned),
                        arguments: String::new(),
                    });
                } else if let Some(t) = block["text"].as_str().filter(|t| !t.is_empty()) {
                    out.push(Event::Text(t.to_owned()));
                }
            }
            "content_block_delta" => {
                let d = &v["delta"];
                if let Some(t) = d["text"].as_str() {
                    out.push(Event::Text(t.to_owned()));
                } else if let Some(json) = d["partial_json"].as_str() {
                    let index = self.tools.get(&v["index"].as_u64().unwrap_or(0)).copied().unwrap_or(0);
                    out.push(Event::ToolCall { index, id: None, name: None, arguments: json.to_owned() });
                }
            }
            "message_delta" => {
                if let Some(reason) = v["delta"]["stop_reason"].as_str() {
                    out.push(Event::Finish(match reason {
                        "max_tokens" => FinishReason::Length,
                        "tool_use" => FinishReason::ToolCalls,
                        _ => FinishReason::Stop,
                    }));
                }
                if let Some(n) = v["usage"]["output_tokens"].as_u64() {
                    out.push(Event::Usage(Usage::new(self.input_tokens, n as u32)));
                }
            }
            "error" => {
                let message = v["error"]["message"].as_str().unwrap_or("stream error").to_owned();
                return Err(match v["error"]["type"].as_str() {
                    Some("rate_limit_error") => Error::RateLimited { upstream: upstream.to_owned(), retry_after: None },
                    Some("invalid_request_error") => {
                        Error::Rejected { upstream: upstream.to_owned(), status: 400, message }
                    }
                    _ => Error::Upstream { upstream: upstream.to_owned(), status: None, message },
                });
            }
            _ => {}
        }
        Ok(out)
    }
}

/// The events of a Messages API streamed body.
pub(crate) fn message_stream<S, E>(upstream: String, body: S) -> EventStream
where
    S: futures::Stream<Item = std::result::Result<bytes::Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let mut reading = Reading::default();
    events(body)
        .map(move |e| {
            let items: Vec<Result<Event>> = match e
                .map_err(|e| Error::Upstream { upstream: upstream.clone(), status: None, message: e.to_string() })
                .and_then(|e| reading.read(&upstream, e.event.as_deref(), &e.data))
            {
                Ok(events) => events.into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            futures::stream::iter(items)
        })
        .flatten()
        .boxed()
}

#[async_trait::async_trait]
impl Provider for AnthropicProvider {
    fn describe(&self) -> String {
        format!("anthropic {}", self.base)
    }

    async fn chat(&self, req: ChatRequest) -> Result<EventStream> {
        let body = messages_body(&req)?;
        let resp =
            checked(&self.base, self.request(reqwest::Method::POST, "/v1/messages").json(&body).send().await).await?;
        Ok(message_stream(self.base.clone(), resp.bytes_stream()))
    }

    async fn health(&self) -> Result<()> {
        checked(&self.base, self.request(reqwest::Method::GET, "/v1/models").send().await).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn translates_a_tool_conversation_and_its_stream() {
        let req: ChatRequest = serde_json::from_value(json!({
            "model": "claude", "max_tokens": 50, "tool_choice": "required",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}},
                    {"id": "t2", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Bergen\"}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "-3C"},
                {"role": "tool", "tool_call_id": "t2", "content": "4C"}],
            "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
        }))
        .unwrap();
        let body = messages_body(&req).unwrap();
        assert_eq!(body["system"], "be brief");
        assert_eq!(body["tool_choice"], json!({"type": "any"}));
        let msgs = body["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3, "the two tool results share one user turn: {body}");
        assert_eq!(msgs[1]["content"][1]["input"], json!({"city": "Bergen"}));
        assert_eq!(msgs[2]["content"][1], json!({"type": "tool_result", "tool_use_id": "t2", "content": "4C"}));
        // Images after tool results (a tool's attachments) go in the same user turn.
        let with_image: ChatRequest = serde_json::from_value(json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": "look"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "[1 image below]"},
                {"role": "user", "content": [{"type": "text", "text": "from shot:"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0="}}]}]
        }))
        .unwrap();
        let body = messages_body(&with_image).unwrap();
        assert_eq!(
            body["messages"][2]["content"],
            json!([
                {"type": "tool_result", "tool_use_id": "t1", "content": "[1 image below]"},
                {"type": "text", "text": "from shot:"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0="}},
            ])
        );

        let mut r = Reading::default();
        let mut got = Vec::new();
        for (kind, data) in [
            ("message_start", r#"{"type":"message_start","message":{"usage":{"input_tokens":12}}}"#),
            ("content_block_start", r#"{"index":0,"content_block":{"type":"text","text":""}}"#),
            ("content_block_delta", r#"{"index":0,"delta":{"type":"text_delta","text":"Let me see."}}"#),
            ("content_block_start", r#"{"index":1,"content_block":{"type":"tool_use","id":"t9","name":"weather"}}"#),
            ("content_block_delta", r#"{"index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\":"}}"#),
            ("content_block_delta", r#"{"index":1,"delta":{"type":"input_json_delta","partial_json":"\"Oslo\"}"}}"#),
            ("message_delta", r#"{"delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":7}}"#),
            ("message_stop", r#"{}"#),
        ] {
            got.extend(r.read("a", Some(kind), data).unwrap());
        }
        assert_eq!(
            got,
            vec![
                Event::Text("Let me see.".into()),
                Event::ToolCall {
                    index: 0,
                    id: Some("t9".into()),
                    name: Some("weather".into()),
                    arguments: String::new()
                },
                Event::ToolCall { index: 0, id: None, name: None, arguments: "{\"city\":".into() },
                Event::ToolCall { index: 0, id: None, name: None, arguments: "\"Oslo\"}".into() },
                Event::Finish(FinishReason::ToolCalls),
                Event::Usage(Usage::new(12, 7)),
            ]
        );
        let err = r.read("a", Some("error"), r#"{"error":{"type":"overloaded_error","message":"busy"}}"#).unwrap_err();
        assert!(err.retryable(), "{err}");
    }
}
