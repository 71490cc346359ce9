//! The provider trait and the one stream format every provider produces.

use caret_protocol::llm::{
    ChatMessage, ChatRequest, CompletionRequest, EmbeddingsRequest, EmbeddingsResponse, FinishReason, FunctionCall,
    Role, TokenLogprob, ToolCall, Usage,
};
use futures::StreamExt as _;
use futures::stream::BoxStream;

use crate::{Error, Result};

/// A piece of a model's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// More text.
    Text(String),
    /// A piece of a tool call: the first piece of call `index` carries its id and name.
    ToolCall {
        /// Which call of the answer.
        index: u32,
        /// The call's id (first piece).
        id: Option<String>,
        /// The function's name (first piece).
        name: Option<String>,
        /// More argument text.
        arguments: String,
    },
    /// Why generation stopped.
    Finish(FinishReason),
    /// Token counts.
    Usage(Usage),
    /// The prompt's token ids as the engine read it (asked for with `return_token_ids`).
    PromptTokens(Vec<u32>),
    /// Sampled tokens of the answer, in order: their ids (asked for with `return_token_ids`,
    /// from engines that give them) and log probabilities (asked for with `logprobs`).
    Tokens {
        /// Token ids (empty when the engine gave none).
        ids: Vec<u32>,
        /// Log probabilities (empty when none were asked for or given).
        logprobs: Vec<TokenLogprob>,
    },
}

/// A model's answer as it arrives. An `Err` item ends it.
pub type EventStream = BoxStream<'static, Result<Event>>;

/// One kind of backend. `req.model` is the upstream's model name (the gateway rewrites the
/// alias). Methods a backend cannot serve answer [`Error::Unsupported`].
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// A short description for logs (`openai http://host:8000`).
    fn describe(&self) -> String;

    /// Chat with tools, streamed.
    async fn chat(&self, req: ChatRequest) -> Result<EventStream> {
        let _ = req;
        Err(Error::Unsupported(format!("{} does not serve chat", self.describe())))
    }

    /// Completion (fill-in-the-middle when `suffix` is set), streamed.
    async fn complete(&self, req: CompletionRequest) -> Result<EventStream> {
        let _ = req;
        Err(Error::Unsupported(format!("{} does not serve completions", self.describe())))
    }

    /// Embeddings.
    async fn embed(&self, req: EmbeddingsRequest) -> Result<EmbeddingsResponse> {
        let _ = req;
        Err(Error::Unsupported(format!("{} does not serve embeddings", self.describe())))
    }

    /// A cheap liveness check, used to probe a deployment whose breaker is open.
    async fn health(&self) -> Result<()>;
}

/// Everything a chat stream said, as one assistant message.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    /// Text and tool calls (and the sampled token ids, when the engine gave them).
    pub message: ChatMessage,
    /// Why it stopped.
    pub finish: Option<FinishReason>,
    /// Token counts, when the provider gave them.
    pub usage: Option<Usage>,
    /// The prompt's token ids, when asked for and given.
    pub prompt_ids: Vec<u32>,
    /// Log probabilities of the sampled tokens, when asked for and given.
    pub logprobs: Vec<TokenLogprob>,
}

/// Reads a chat stream to its end.
pub async fn collect_chat(mut stream: EventStream) -> Result<Collected> {
    let mut text = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    let (mut finish, mut usage) = (None, None);
    let (mut prompt_ids, mut ids, mut logprobs) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(event) = stream.next().await {
        match event? {
            Event::PromptTokens(p) => prompt_ids = p,
            Event::Tokens { ids: more, logprobs: lp } => {
                ids.extend(more);
                logprobs.extend(lp);
            }
            Event::Text(t) => text.push_str(&t),
            Event::ToolCall { index, id, name, arguments } => {
                if index >= crate::MAX_TOOL_CALLS {
                    return Err(crate::Error::Upstream {
                        upstream: "the model".to_owned(),
                        status: None,
                        message: format!("tool call index {index} is past the limit"),
                    });
                }
                let i = index as usize;
                while calls.len() <= i {
                    calls.push(ToolCall {
                        id: String::new(),
                        kind: "function".to_owned(),
                        function: FunctionCall { name: String::new(), arguments: String::new() },
                    });
                }
                if let Some(id) = id {
                    calls[i].id = id;
                }
                if let Some(name) = name {
                    calls[i].function.name.push_str(&name);
                }
                calls[i].function.arguments.push_str(&arguments);
            }
            Event::Finish(f) => finish = Some(f),
            Event::Usage(u) => usage = Some(u),
        }
    }
    let mut message = ChatMessage::text(Role::Assistant, text);
    if !calls.is_empty() {
        if message.content_text().is_empty() {
            message.content = None;
        }
        message.tool_calls = calls;
    }
    message.token_ids = (!ids.is_empty()).then_some(ids);
    Ok(Collected { message, finish, usage, prompt_ids, logprobs })
}

/// Reads a completion stream to its end: the text, why it stopped, and the usage.
pub async fn collect_completion(stream: EventStream) -> Result<(String, Option<FinishReason>, Option<Usage>)> {
    let c = collect_chat(stream).await?;
    Ok((c.message.content_text(), c.finish, c.usage))
}
