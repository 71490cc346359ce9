//! Episodes for external trainers (the server's `/v1/envs`): each is an Anyrun run whose
//! model is the caller. The run goes through the queue, a worker, its sandbox and the agent's
//! own session like any rollout, so the tools, the system prompt and the environment are a
//! user's; only its model calls are different: [`RunService::chat`] hands them to the
//! episode's mailbox, where `step` answers them with the policy's message, and the next call
//! carries the tools' results back.
//!
//! Episodes live in the memory of the server that started them (one replica serves an
//! episode); a tenant holds a bounded number, and one left idle is closed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use caret_models::{Event, EventStream};
use caret_protocol::envs::{CreateEnv, EnvInfo, Graded, Observation};
use caret_protocol::llm::{ChatMessage, ChatRequest, FinishReason, Role, Usage};
use caret_protocol::runs::{CreateRun, RolloutOptions, RunClass, RunInfo, RunState};
use tokio::sync::{mpsc, oneshot};

use crate::service::{RunService, TenantRef};
use crate::{Error, Result};

/// Bounds of episodes.
#[derive(Debug, Clone)]
pub struct EnvSettings {
    /// Episodes a tenant may hold open at once.
    pub max_per_tenant: usize,
    /// An episode the policy has not touched for this long is closed.
    pub idle: Duration,
    /// Longest wait for the worker: the first observation (setup included) or a step's tools.
    pub wait: Duration,
}

impl Default for EnvSettings {
    fn default() -> Self {
        EnvSettings { max_per_tenant: 64, idle: Duration::from_secs(600), wait: Duration::from_secs(900) }
    }
}

/// What a model call of an episode's run is answered with.
enum Answer {
    /// The policy's message, streamed to the agent as a model's answer.
    Message(ChatMessage),
}

/// A model call waiting for the policy.
type Call = (ChatRequest, oneshot::Sender<Answer>);

struct Episode {
    tenant: String,
    run: String,
    /// Model calls of the run, as they come.
    calls: tokio::sync::Mutex<mpsc::Receiver<Call>>,
    sender: mpsc::Sender<Call>,
    /// The call the policy answers next, and how many messages of the conversation the
    /// policy has seen.
    waiting: Mutex<(Option<oneshot::Sender<Answer>>, usize)>,
    last_used: Mutex<Instant>,
    /// One step at a time.
    busy: tokio::sync::Mutex<()>,
}

impl Episode {
    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }
}

/// The open episodes.
#[derive(Default)]
pub struct Episodes {
    settings: EnvSettings,
    /// By episode id.
    open: Mutex<HashMap<String, Arc<Episode>>>,
}

impl std::fmt::Debug for Episodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Episodes").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// What the wait for the worker ended with.
enum Next {
    Call(ChatRequest, oneshot::Sender<Answer>),
    Ended(RunInfo),
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Episodes {
    /// No episodes yet, bounded by `settings`.
    pub fn new(settings: EnvSettings) -> Episodes {
        Episodes { settings, open: Mutex::default() }
    }

    fn get(&self, tenant: &str, id: &str) -> Result<Arc<Episode>> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        // Another tenant's episode is a missing one.
        open.get(id).filter(|e| e.tenant == tenant).cloned().ok_or_else(|| Error::NotFound(format!("episode {id}")))
    }

    fn by_run(&self, run: &str) -> Option<Arc<Episode>> {
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

    /// Episodes idle past the limit (closed by [`RunService::reap_episodes`]).
    fn idle(&self) -> Vec<(String, String)> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.iter()
            .filter(|(_, e)| e.last_used.lock().unwrap_or_else(PoisonError::into_inner).elapsed() > self.settings.idle)
            .map(|(id, e)| (e.tenant.clone(), id.clone()))
            .collect()
    }
}

/// A policy's message as a model's streamed answer.
fn answer_events(message: ChatMessage) -> EventStream {
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

impl RunService {
    /// Starts an episode: queues its run and answers the first observation once the agent
    /// asks its first model call (setup done).
    pub async fn create_episode(self: &Arc<Self>, tenant: &TenantRef, req: CreateEnv) -> Result<Observation> {
        let started = Instant::now();
        let episodes = self.episodes();
        if req.prompt.trim().is_empty() || req.grader.command.trim().is_empty() {
            return Err(Error::BadRequest("prompt and grader.command must not be empty".into()));
        }
        let held = episodes.list(&tenant.id).len();
        if held >= episodes.settings.max_per_tenant {
            return Err(Error::TooMany(format!(
                "{held} episodes are open (the most a tenant may hold); close some (DELETE /v1/envs/{{id}})"
            )));
        }
        let mut environment = req.environment.unwrap_or_default();
        environment.test = Some(req.grader.command.clone());
        environment.test_timeout_s = Some(req.grader.timeout_s.unwrap_or(600));
        let run = CreateRun {
            repo: req.repo,
            task: req.prompt,
            model: None,
            limits: req.limits.unwrap_or_default(),
            environment,
            class: RunClass::Batch,
            push: None,
            git_credential: None,
            rollout: Some(RolloutOptions { transcript: true, policy: true, ..RolloutOptions::default() }),
        };
        let info = self.submit_episode(tenant, run).await?;
        let id = format!("env-{}", info.id.trim_start_matches("run-"));
        let (sender, receiver) = mpsc::channel(1);
        let episode = Arc::new(Episode {
            tenant: tenant.id.clone(),
            run: info.id.clone(),
            calls: tokio::sync::Mutex::new(receiver),
            sender,
            waiting: Mutex::new((None, 0)),
            last_used: Mutex::new(Instant::now()),
            busy: tokio::sync::Mutex::new(()),
        });
        episodes.open.lock().unwrap_or_else(PoisonError::into_inner).insert(id.clone(), episode.clone());
        let _busy = episode.busy.lock().await;
        let waited = Instant::now();
        let next = self.next(&episode).await;
        let worker_ms = ms(waited.elapsed());
        let mut obs = self.observe(&id, &episode, next, true).await?;
        obs.worker_ms = worker_ms;
        obs.server_ms = ms(started.elapsed()) - worker_ms;
        Ok(obs)
    }

    /// One step: the policy's message answers the waiting model call; the observation is
    /// what the agent sends next (the tools' results), or the end of its turn.
    pub async fn step_episode(
        self: &Arc<Self>,
        tenant_id: &str,
        id: &str,
        message: ChatMessage,
    ) -> Result<Observation> {
        let started = Instant::now();
        if message.role != Role::Assistant {
            return Err(Error::BadRequest("the policy's message must be an assistant message".into()));
        }
        for call in &message.tool_calls {
            if call.id.is_empty() || call.function.name.is_empty() {
                return Err(Error::BadRequest("every tool call needs an id and a function name".into()));
            }
        }
        let episode = self.episodes().get(tenant_id, id)?;
        let _busy = episode.busy.lock().await;
        episode.touch();
        let answer = {
            let mut w = episode.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            let tx = w.0.take().ok_or_else(|| Error::Conflict("no model call is waiting: the turn is over".into()))?;
            // The policy's message is part of the conversation it has seen.
            w.1 += 1;
            tx
        };
        let _ = answer.send(Answer::Message(message));
        let waited = Instant::now();
        let next = self.next(&episode).await;
        let worker_ms = ms(waited.elapsed());
        let mut obs = self.observe(id, &episode, next, false).await?;
        episode.touch();
        obs.worker_ms = worker_ms;
        obs.server_ms = ms(started.elapsed()) - worker_ms;
        Ok(obs)
    }

    /// Ends the agent's turn (a waiting model call is answered with an empty message), waits
    /// for the grader, and answers the reward.
    pub async fn grade_episode(self: &Arc<Self>, tenant_id: &str, id: &str) -> Result<Graded> {
        let episode = self.episodes().get(tenant_id, id)?;
        let _busy = episode.busy.lock().await;
        episode.touch();
        let end = ChatMessage::text(Role::Assistant, "");
        let mut pending = episode.waiting.lock().unwrap_or_else(PoisonError::into_inner).0.take();
        // The agent may ask once more (it asks a silent model to go on once): answered alike.
        let info = loop {
            if let Some(tx) = pending.take() {
                let _ = tx.send(Answer::Message(end.clone()));
            }
            match self.next(&episode).await {
                Next::Call(_, tx) => pending = Some(tx),
                Next::Ended(info) => break info,
            }
        };
        let result = self.result(tenant_id, &info.id).await.ok();
        let score = crate::rollout::score(&info, result.as_ref());
        let r = result.unwrap_or_default();
        episode.touch();
        Ok(Graded {
            episode: id.to_owned(),
            reward: score.reward,
            failure: score.failure.and_then(|f| serde_json::to_value(f).ok()?.as_str().map(str::to_owned)),
            grader: r.test,
            state: info.state,
            patch: r.patch,
        })
    }

    /// Closes an episode: its run is cancelled if it has not ended.
    pub async fn close_episode(self: &Arc<Self>, tenant_id: &str, id: &str) -> Result<()> {
        let episode = self.episodes().get(tenant_id, id)?;
        self.episodes().open.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
        let waiting = episode.waiting.lock().unwrap_or_else(PoisonError::into_inner).0.take();
        let info = self.get(tenant_id, &episode.run).await?;
        if matches!(info.state, RunState::Queued | RunState::Running) {
            self.cancel(tenant_id, &episode.run).await?;
        }
        // The waiting model call is left unanswered until the worker has seen the cancel (its
        // next heartbeat), so the run ends cancelled rather than failed; then it fails.
        let ttl = self.settings().lease_ttl;
        tokio::spawn(async move {
            tokio::time::sleep(ttl).await;
            drop(waiting);
        });
        Ok(())
    }

    /// Closes the episodes idle past the limit; answers how many.
    pub async fn reap_episodes(self: &Arc<Self>) -> usize {
        let idle = self.episodes().idle();
        for (tenant, id) in &idle {
            if let Err(e) = self.close_episode(tenant, id).await {
                tracing::warn!(episode = %id, "closing an idle episode: {e}");
            }
        }
        idle.len()
    }

    /// Waits for the run's next model call, or its end.
    async fn next(&self, episode: &Episode) -> Next {
        let wait = self.episodes().settings.wait;
        let deadline = Instant::now() + wait;
        let mut calls = episode.calls.lock().await;
        loop {
            // The run's state is looked at between short waits for a call: a run that ends
            // (setup failed, limits, the agent done) makes no more calls.
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = left.min(Duration::from_millis(250));
            if let Ok(Some((req, tx))) = tokio::time::timeout(slice, calls.recv()).await {
                return Next::Call(req, tx);
            }
            match self.queue().get(&episode.tenant, &episode.run).await {
                Ok(Some(row)) if !matches!(row.state, RunState::Queued | RunState::Running) => {
                    if let Ok(info) = self.get(&episode.tenant, &episode.run).await {
                        return Next::Ended(info);
                    }
                }
                _ => {}
            }
            if left.is_zero() {
                // The worker took too long: the run is stopped and reported as it ends.
                let _ = self.cancel(&episode.tenant, &episode.run).await;
                if let Ok(info) = self.get(&episode.tenant, &episode.run).await {
                    return Next::Ended(info);
                }
            }
        }
    }

    /// The observation for what the wait ended with (the call kept for the next step).
    async fn observe(&self, id: &str, episode: &Episode, next: Next, first: bool) -> Result<Observation> {
        match next {
            Next::Call(req, tx) => {
                let mut w = episode.waiting.lock().unwrap_or_else(PoisonError::into_inner);
                let seen = w.1.min(req.messages.len());
                let messages = req.messages[seen..].to_vec();
                *w = (Some(tx), req.messages.len());
                Ok(Observation {
                    episode: id.to_owned(),
                    run: episode.run.clone(),
                    tools: if first { req.tools } else { Vec::new() },
                    messages,
                    done: false,
                    state: RunState::Running,
                    reason: None,
                    server_ms: 0.0,
                    worker_ms: 0.0,
                })
            }
            Next::Ended(info) => Ok(Observation {
                episode: id.to_owned(),
                run: episode.run.clone(),
                tools: Vec::new(),
                messages: Vec::new(),
                done: true,
                state: info.state,
                reason: info.reason,
                server_ms: 0.0,
                worker_ms: 0.0,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use caret_protocol::llm::{FunctionCall, ToolCall};
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
