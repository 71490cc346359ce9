//! Episodes for external trainers (the server's `/v1/envs`): each is an Anyrun run whose
//! model is the caller. The run goes through the queue, a worker, its sandbox and the agent's
//! own session like any rollout, so the tools, the system prompt and the environment are a
//! user's; only its model calls are different: the run service hands them to the
//! episode's mailbox, where `step` answers them with the policy's message, and the next call
//! carries the tools' results back.
//!
//! Episodes live in the memory of the server that started them (one replica serves an
//! episode); a tenant holds a bounded number, and one left idle is closed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use caret_models::{Event, EventStream};
use caret_protocol::envs::EnvInfo;
use caret_protocol::llm::{ChatMessage, ChatRequest, FinishReason, Usage};
use tokio::sync::{mpsc, oneshot};

use crate::{Error, Result};

/// Bounds of episodes.
#[derive(Debug, Clone)]
pub struct EpisodeSettings {
    /// Episodes a tenant may hold open at once.
    pub max_per_tenant: usize,
    /// An episode the policy has not touched for this long is closed.
    pub idle: Duration,
    /// Longest wait for the worker: the first observation (setup included) or a step's tools.
    pub wait: Duration,
}

impl Default for EpisodeSettings {
    fn default() -> Self {
        EpisodeSettings { max_per_tenant: 64, idle: Duration::from_secs(600), wait: Duration::from_secs(900) }
    }
}

/// What a model call of an episode's run is answered with.
pub(crate) enum Answer {
    /// The policy's message, streamed to the agent as a model's answer.
    Message(ChatMessage),
}

/// A model call waiting for the policy.
pub(crate) type Call = (ChatRequest, oneshot::Sender<Answer>);

pub(crate) struct Episode {
    pub(crate) tenant: String,
    pub(crate) run: String,
    /// Model calls of the run, as they come.
    pub(crate) calls: tokio::sync::Mutex<mpsc::Receiver<Call>>,
    pub(crate) sender: mpsc::Sender<Call>,
    /// The call the policy answers next, and how many messages of the conversation the
    /// policy has seen.
    pub(crate) waiting: Mutex<(Option<oneshot::Sender<Answer>>, usize)>,
    pub(crate) last_used: Mutex<Instant>,
    /// One step at a time.
    pub(crate) busy: tokio::sync::Mutex<()>,
}

impl Episode {
    pub(crate) fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }
}

/// The open episodes.
#[derive(Default)]
pub struct Episodes {
    pub(crate) settings: EpisodeSettings,
    /// By episode id.
    pub(crate) open: Mutex<HashMap<String, Arc<Episode>>>,
}

impl std::fmt::Debug for Episodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Episodes").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl Episodes {
    /// No episodes yet, bounded by `settings`.
    pub fn new(settings: EpisodeSettings) -> Episodes {
        Episodes { settings, open: Mutex::default() }
    }

    pub(crate) fn get(&self, tenant: &str, id: &str) -> Result<Arc<Episode>> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        // Another tenant's episode is a missing one.
        open.get(id).filter(|e| e.tenant == tenant).cloned().ok_or_else(|| Error::NotFound(format!("episode {id}")))
    }

    /// Whether episode `id` lives here (in this process's memory).
    pub fn holds(&self, id: &str) -> bool {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).contains_key(id)
    }

    pub(crate) fn by_run(&self, run: &str) -> Option<Arc<Episode>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).values().find(|e| e.run == run).cloned()
    }

    /// A model call of an episode's run: handed to the policy, answered with its message.
    pub(crate) async fn model_call(&self, run: &str, req: ChatRequest) -> caret_models::Result<EventStream> {
        let gone = || caret_models::Error::Rejected {
            upstream: "episode".into(),
            status: 409,
            message: "the episode is closed".into(),
        };
        let episode = self.by_run(run).ok_or_else(gone)?;
        let (tx, rx) = oneshot::channel();
        episode.sender.send((req, tx)).await.map_err(|_| gone())?;
        let Answer::Message(message) = rx.await.map_err(|_| gone())?;
        Ok(answer_events(message))
    }

    /// The open episodes of a tenant.
    pub fn list(&self, tenant: &str) -> Vec<EnvInfo> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<EnvInfo> = open
            .iter()
            .filter(|(_, e)| e.tenant == tenant)
            .map(|(id, e)| EnvInfo {
                episode: id.clone(),
                run: e.run.clone(),
                idle_s: e.last_used.lock().unwrap_or_else(PoisonError::into_inner).elapsed().as_secs_f64(),
            })
            .collect();
        out.sort_by(|a, b| a.episode.cmp(&b.episode));
        out
    }

    /// Episodes idle past the limit (the run service closes them).
    pub(crate) fn idle(&self) -> Vec<(String, String)> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.iter()
            .filter(|(_, e)| e.last_used.lock().unwrap_or_else(PoisonError::into_inner).elapsed() > self.settings.idle)
            .map(|(id, e)| (e.tenant.clone(), id.clone()))
            .collect()
    }
}

/// A policy's message as a model's streamed answer.
pub(crate) fn answer_events(message: ChatMessage) -> EventStream {
    let mut events = Vec::new();
    let text = message.content_text();
    if !text.is_empty() {
        events.push(Ok(Event::Text(text)));
    }
    let calls = message.tool_calls.len();
    for (i, call) in message.tool_calls.into_iter().enumerate() {
        events.push(Ok(Event::ToolCall {
            index: u32::try_from(i).unwrap_or(u32::MAX),
            id: Some(call.id),
            name: Some(call.function.name),
            arguments: call.function.arguments,
        }));
    }
    events.push(Ok(Event::Finish(if calls > 0 { FinishReason::ToolCalls } else { FinishReason::Stop })));
    events.push(Ok(Event::Usage(Usage::new(0, 0))));
    Box::pin(futures::stream::iter(events))
}

#[cfg(test)]
mod tests {
    use caret_protocol::llm::{FunctionCall, Role, ToolCall};
    use futures::StreamExt as _;

    use super::*;

    #[tokio::test]
    async fn a_policy_message_streams_as_a_model_answer() {
        let mut m = ChatMessage::text(Role::Assistant, "reading");
        m.tool_calls = vec![ToolCall {
            id: "c1".into(),
            kind: "function".into(),
            function: FunctionCall { name: "read_file".into(), arguments: "{\"path\":\"a\"}".into() },
        }];
        let got = caret_models::collect_chat(answer_events(m.clone())).await.unwrap();
        assert_eq!(got.message.content_text(), "reading");
        assert_eq!(got.message.tool_calls, m.tool_calls);
        assert_eq!(got.finish, Some(FinishReason::ToolCalls));
        let text: Vec<_> = answer_events(ChatMessage::text(Role::Assistant, "done")).collect().await;
        assert!(matches!(text[1], Ok(Event::Finish(FinishReason::Stop))));
    }
}
