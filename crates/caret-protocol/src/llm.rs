//! The model gateway's wire types: the OpenAI-compatible API (`/v1/chat/completions`,
//! `/v1/completions`, `/v1/embeddings`, `/v1/models`) as the official client libraries send
//! and expect it. Fields the gateway does not use are accepted and ignored.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Header naming a model request's priority class: `interactive`, `agent` or `background`.
pub const PRIORITY_HEADER: &str = "x-caret-priority";
/// Header giving a model request's deadline in milliseconds from now.
pub const DEADLINE_HEADER: &str = "x-caret-deadline-ms";

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions (`developer` is read as this too).
    #[serde(alias = "developer")]
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

/// Message content: a string, or parts of which the text ones count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts (`{"type": "text", "text": …}`; other kinds are kept but not read).
    Parts(Vec<ContentPart>),
}

impl Content {
    /// The text of the content (text parts joined).
    pub fn text(&self) -> String {
        match self {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts.iter().filter_map(|p| p.text.as_deref()).collect::<Vec<_>>().join(""),
        }
    }
}

/// One part of a message's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ContentPart {
    /// `text`, `image_url`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The image of an `image_url` part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_url: Option<ImageUrl>,
}

/// An image in a message: a `data:` URL (`data:image/png;base64,…`) or a link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ImageUrl {
    /// Where it is.
    pub url: String,
}

impl ContentPart {
    /// A text part.
    pub fn text(text: impl Into<String>) -> ContentPart {
        ContentPart { kind: "text".into(), text: Some(text.into()), image_url: None }
    }

    /// An image part from its type (`image/png`) and base64 bytes.
    pub fn image(mime: &str, base64: &str) -> ContentPart {
        ContentPart {
            kind: "image_url".into(),
            text: None,
            image_url: Some(ImageUrl { url: format!("data:{mime};base64,{base64}") }),
        }
    }

    /// An image part's type and base64 bytes, when it holds a `data:` URL.
    pub fn image_data(&self) -> Option<(&str, &str)> {
        let url = self.image_url.as_ref()?.url.strip_prefix("data:")?;
        let (mime, data) = url.split_once(";base64,")?;
        Some((mime, data))
    }
}

/// A message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// What it says (absent on an assistant message that only calls tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Content>,
    /// Tool calls the assistant made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a tool message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Optional author name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Caret's extension, on an assistant message: the token ids the engine sampled for it
    /// (from `return_token_ids`). An in-process engine puts them back into later prompts
    /// verbatim instead of tokenising the message's text again (token in, token out); other
    /// providers never receive them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

impl ChatMessage {
    /// A message of plain text.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: Some(Content::Text(text.into())),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            token_ids: None,
        }
    }

    /// The message's text ("" when it has none).
    pub fn content_text(&self) -> String {
        self.content.as_ref().map(Content::text).unwrap_or_default()
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Tool {
    /// Always `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The function.
    pub function: FunctionDef,
}

fn function_kind() -> String {
    "function".to_owned()
}

/// A callable function: name, description and JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FunctionDef {
    /// Name.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolCall {
    /// The call's id (answered by a tool message with this `tool_call_id`).
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// A function call: name and arguments as a JSON string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FunctionCall {
    /// Name.
    pub name: String,
    /// Arguments, a JSON object as text.
    pub arguments: String,
}

/// Stop sequences: one or several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Stop {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// As a list.
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        }
    }
}

/// Streaming options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StreamOptions {
    /// Send a last chunk with the usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChatRequest {
    /// A model alias of the gateway.
    #[schemars(example = &"agent")]
    pub model: String,
    /// The conversation.
    #[schemars(example = serde_json::json!([{ "role": "user", "content": "Say hello." }]))]
    pub messages: Vec<ChatMessage>,
    /// Tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// `auto`, `none`, `required` or a named function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Most tokens to generate (`max_completion_tokens` is read as this too).
    #[serde(default, alias = "max_completion_tokens", skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Text the answer is expected to mostly repeat (OpenAI's predicted outputs): a local
    /// model verifies it as a speculative draft; OpenAI-compatible servers get it as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Prediction>,
    /// The log probability of each sampled token (OpenAI's `logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// The token ids of the prompt and of the answer (vLLM's `return_token_ids`): the prompt's
    /// on the first chunk (`prompt_token_ids`), the answer's on its choice (`token_ids`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_token_ids: Option<bool>,
}

impl ChatRequest {
    /// A streamed request for `messages` with nothing else set (no tools, the server's
    /// sampling defaults).
    pub fn new(model: impl Into<String>, messages: Vec<ChatMessage>) -> ChatRequest {
        ChatRequest {
            model: model.into(),
            messages,
            tools: Vec::new(),
            tool_choice: None,
            max_tokens: None,
            temperature: None,
            top_p: None,
            stop: None,
            stream: true,
            stream_options: None,
            seed: None,
            prediction: None,
            logprobs: None,
            return_token_ids: None,
        }
    }
}

/// A predicted output: `{"type": "content", "content": "…"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Prediction {
    /// Always `content`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The predicted text (a string or text parts).
    pub content: Content,
}

impl Prediction {
    /// A prediction of `text`.
    pub fn content(text: impl Into<String>) -> Self {
        Prediction { kind: "content".to_owned(), content: Content::Text(text.into()) }
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end or a stop sequence.
    Stop,
    /// The token limit.
    Length,
    /// The model called tools.
    ToolCalls,
    /// Filtered.
    ContentFilter,
}

/// Token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Both.
    pub total_tokens: u32,
    /// How a predicted output fared, when one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

/// Details of the generated tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CompletionTokensDetails {
    /// Predicted tokens that appeared in the answer.
    #[serde(default)]
    pub accepted_prediction_tokens: u32,
    /// Predicted tokens that were evaluated but did not appear.
    #[serde(default)]
    pub rejected_prediction_tokens: u32,
}

impl Usage {
    /// Usage of `prompt` and `completion` tokens.
    pub fn new(prompt: u32, completion: u32) -> Self {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            completion_tokens_details: None,
        }
    }
}

/// The answer to a non-streaming chat request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChatResponse {
    /// Response id.
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model alias asked for.
    pub model: String,
    /// One choice.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    #[serde(default)]
    pub usage: Usage,
}

/// A choice of a chat response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChatChoice {
    /// Index.
    pub index: u32,
    /// The assistant's message.
    pub message: ChatMessage,
    /// Why it stopped.
    pub finish_reason: Option<FinishReason>,
}

/// One server-sent event of a streaming chat response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChatChunk {
    /// Response id (the same on every chunk).
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model alias.
    pub model: String,
    /// Deltas (empty on the usage chunk).
    pub choices: Vec<ChunkChoice>,
    /// On the last chunk when `stream_options.include_usage` was set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The prompt's token ids, on one chunk, when asked for with `return_token_ids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// A delta of a streamed choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChunkChoice {
    /// Index.
    pub index: u32,
    /// What is new.
    pub delta: ChatDelta,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<FinishReason>,
    /// Log probabilities of the tokens of this delta (when asked for with `logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<ChoiceLogprobs>,
    /// Ids of the tokens of this delta (when asked for with `return_token_ids`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// OpenAI's `logprobs` of a choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChoiceLogprobs {
    /// One entry per sampled token of the content (tool-call text included).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub content: Vec<TokenLogprob>,
}

/// A sampled token and its log probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TokenLogprob {
    /// The token's text (lossy where it is part of a character).
    pub token: String,
    /// Its log probability under the sampling distribution.
    pub logprob: f32,
    /// The token's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
    /// The most likely alternatives (Caret's engine gives none).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub top_logprobs: Vec<serde_json::Value>,
}

fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// New content of a streamed message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChatDelta {
    /// On the first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// New text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New tool-call pieces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A piece of a streamed tool call: the first carries id and name, later ones more arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolCallDelta {
    /// Which call of the message.
    pub index: u32,
    /// The call's id (first piece).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (first piece).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name (first piece) and argument text.
    pub function: FunctionCallDelta,
}

/// Part of a function call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FunctionCallDelta {
    /// Name (first piece).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More argument text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A prompt: one text (arrays of one text are accepted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    One(String),
    /// Several texts (the gateway answers the first).
    Many(Vec<String>),
}

impl Prompt {
    /// The text to complete.
    pub fn text(&self) -> &str {
        match self {
            Prompt::One(s) => s,
            Prompt::Many(v) => v.first().map_or("", String::as_str),
        }
    }
}

/// `POST /v1/completions`, fill-in-the-middle when `suffix` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CompletionRequest {
    /// A model alias of the gateway.
    #[schemars(example = &"tab")]
    pub model: String,
    /// The text before the cursor.
    pub prompt: Prompt,
    /// The text after the cursor (fill-in-the-middle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
    /// Most tokens to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl CompletionRequest {
    /// A streamed request for `prompt` with greedy sampling (temperature 0) and nothing else
    /// set: what Tab and the benchmarks send.
    pub fn greedy(model: impl Into<String>, prompt: String, max_tokens: u32) -> CompletionRequest {
        CompletionRequest {
            model: model.into(),
            prompt: Prompt::One(prompt),
            suffix: None,
            max_tokens: Some(max_tokens),
            temperature: Some(0.0),
            top_p: None,
            stop: None,
            stream: true,
            stream_options: None,
            seed: None,
        }
    }
}

/// The answer to a completion request (also each streamed event, with the new text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CompletionResponse {
    /// Response id.
    pub id: String,
    /// `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model alias.
    pub model: String,
    /// One choice.
    pub choices: Vec<CompletionChoice>,
    /// Token counts (absent on streamed events but the last with `include_usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A choice of a completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CompletionChoice {
    /// Index.
    pub index: u32,
    /// The generated text (new text, when streamed).
    pub text: String,
    /// Why it stopped (on the last event).
    pub finish_reason: Option<FinishReason>,
    /// Always null.
    #[serde(default)]
    pub logprobs: Option<Value>,
}

/// Texts to embed: one or several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum EmbeddingInput {
    /// One text.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl EmbeddingInput {
    /// As a list.
    pub fn texts(&self) -> Vec<&str> {
        match self {
            EmbeddingInput::One(s) => vec![s.as_str()],
            EmbeddingInput::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EmbeddingsRequest {
    /// A model alias of the gateway.
    #[schemars(example = &"embed")]
    pub model: String,
    /// The texts.
    pub input: EmbeddingInput,
    /// `float` (default) or `base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding_format: Option<String>,
}

/// The answer to an embeddings request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EmbeddingsResponse {
    /// `list`.
    pub object: String,
    /// One per input, in order.
    pub data: Vec<EmbeddingData>,
    /// The model alias.
    pub model: String,
    /// Token counts (completion 0).
    pub usage: EmbeddingUsage,
}

/// Token counts of an embeddings request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EmbeddingUsage {
    /// Input tokens.
    pub prompt_tokens: u32,
    /// The same.
    pub total_tokens: u32,
}

/// One embedding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EmbeddingData {
    /// `embedding`.
    pub object: String,
    /// Which input.
    pub index: u32,
    /// The vector (floats; a base64 string of little-endian f32 when asked so).
    pub embedding: Value,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    /// The aliases.
    pub data: Vec<ModelCard>,
}

/// One model alias.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelCard {
    /// The alias.
    pub id: String,
    /// `model`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// `caret`.
    pub owned_by: String,
}

/// The OpenAI error body: `{"error": {"message", "type", "code"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApiError {
    /// The error.
    pub error: ApiErrorDetail,
}

/// Message, kind and code of an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApiErrorDetail {
    /// Safe to show.
    pub message: String,
    /// e.g. `invalid_request_error`, `rate_limit_error`, `server_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A stable code.
    #[serde(default)]
    pub code: Option<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_what_the_official_clients_send() {
        let req: ChatRequest = serde_json::from_str(
            r#"{"model":"chat","messages":[{"role":"developer","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]},
                {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
                {"role":"tool","tool_call_id":"c1","content":"42"}],
               "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
               "max_completion_tokens":5,"stream":true,"stream_options":{"include_usage":true},"n":1,"user":"u"}"#,
        )
        .unwrap();
        assert_eq!(req.messages[0].role, Role::System);
        assert_eq!(req.messages[1].content_text(), "hi there");
        assert_eq!(req.messages[2].tool_calls[0].function.name, "f");
        assert_eq!(req.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!((req.max_tokens, req.stream), (Some(5), true));
        assert!(req.stream_options.unwrap().include_usage);
        let c: CompletionRequest =
            serde_json::from_str(r#"{"model":"m","prompt":["def f("],"suffix":"\n","max_tokens":8}"#).unwrap();
        assert_eq!((c.prompt.text(), c.suffix.as_deref()), ("def f(", Some("\n")));
    }
}
