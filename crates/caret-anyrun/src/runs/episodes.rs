//! The run service's side of episodes: starting one (its run queued like any rollout),
//! stepping it with the policy's message, grading and closing it, and closing idle ones.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use caret_models::EventStream;
use caret_protocol::envs::{CreateEnv, Graded, Observation};
use caret_protocol::llm::{ChatMessage, ChatRequest, Role};
use caret_protocol::runs::{CreateRun, LeaseRef, RolloutOptions, RunClass, RunInfo, RunState};
use tokio::sync::{mpsc, oneshot};

use super::{RunService, TenantRef};
use crate::episodes::{Answer, Episode};
use crate::{Error, Result};

/// What the wait for the worker ended with.
enum Next {
    Call(ChatRequest, oneshot::Sender<Answer>),
    Ended(RunInfo),
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Where episodes live when several processes (replicas of `caret serve`) share the run
/// service: an episode is a model call waiting in one process's memory, so a worker's call
/// that reaches another process is sent on to it.
#[async_trait::async_trait]
pub trait Placement: Send + Sync {
    /// Records that `episode` lives in this process; an error message refuses the episode.
    async fn place(&self, episode: &str) -> std::result::Result<(), String>;
    /// The base URL of the process `episode` lives in and the bearer token its worker routes
    /// take from another process, when it lives in another one.
    async fn locate(&self, episode: &str) -> Option<(String, String)>;
}

/// The episode whose run is `run_id`.
pub fn episode_id(run_id: &str) -> String {
    format!("env-{}", run_id.trim_start_matches("run-"))
}

impl RunService {
    /// Sets where episodes live (once; later calls are ignored).
    pub fn set_placement(&self, placement: Arc<dyn Placement>) {
        let _ = self.placement.set(placement);
    }

    /// A model call of an episode's run: answered here when the episode lives here, else sent
    /// on to the process it lives in (looked for a few seconds: the run is queued before the
    /// episode is placed, and a fast worker may ask first).
    pub(super) async fn episode_call(&self, lease: &LeaseRef, req: ChatRequest) -> caret_models::Result<EventStream> {
        let episode = episode_id(&lease.run);
        if let Some(placement) = self.placement.get() {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !self.episodes.holds(&episode) {
                if let Some((base, token)) = placement.locate(&episode).await {
                    let url = format!("{}/v1/workers/runs/{}/{}", base.trim_end_matches('/'), lease.run, lease.token);
                    let owner = caret_models::openai::OpenAiProvider::new(&url, Some(token))?.caret_upstream();
                    return caret_models::Provider::chat(&owner, req).await;
                }
                if std::time::Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        self.episodes.model_call(&lease.run, req).await
    }

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
        let id = episode_id(&info.id);
        if let Some(placement) = self.placement.get() {
            // Before the first model call is waited for: the worker may reach another
            // replica, which must find where the episode lives.
            placement.place(&id).await.map_err(Error::Unavailable)?;
        }
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
