//! Agent sessions for the page: each a [`Session`] in the workspace (as `caret agent` runs
//! it: the embedded gateway, the sandbox for commands, approvals asked), its events kept and
//! streamed to any number of watchers, and a checkpoint taken before each turn (see
//! [`Review`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use caret_protocol::agent::{Event, Op};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::review::Review;
use caret_host::backend::Backend;
use caret_host::config::Config;
use caret_host::session::{SessionOptions, session_on};

/// A session and what it said.
pub struct Hosted {
    pub ops: mpsc::UnboundedSender<Op>,
    /// Every event so far, and the live feed (none once the session ended).
    pub events: Mutex<(Vec<Value>, Option<broadcast::Sender<Value>>)>,
}

impl Hosted {
    fn emit(&self, e: Value) {
        let mut g = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = &g.1 {
            let _ = tx.send(e.clone());
        }
        g.0.push(e);
    }

    /// Past events and, while the session runs, the feed of later ones.
    pub fn subscribe(&self) -> (Vec<Value>, Option<broadcast::Receiver<Value>>) {
        let g = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        (g.0.clone(), g.1.as_ref().map(broadcast::Sender::subscribe))
    }
}

/// The page's sessions, oldest first.
#[derive(Default)]
pub struct Agents {
    sessions: Mutex<VecDeque<(String, Arc<Hosted>)>>,
}

impl Agents {
    /// Session `id`, when the page has it.
    pub fn get(&self, id: &str) -> Option<Arc<Hosted>> {
        let sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions.iter().find(|(i, _)| i == id).map(|(_, h)| h.clone())
    }

    /// Adds a session, ending and forgetting the oldest beyond `kept` (a reloaded page starts
    /// a new session and leaves its last one behind).
    fn add(&self, id: String, hosted: Arc<Hosted>, kept: usize) {
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions.push_back((id, hosted));
        while sessions.len() > kept.max(1) {
            if let Some((_, old)) = sessions.pop_front() {
                let _ = old.ops.send(Op::Interrupt);
                let _ = old.ops.send(Op::Shutdown);
            }
        }
    }
}

/// Starts a session as `args` say (the page's workspace and MCP servers) with `model` of
/// `backend`, keeping the page's newest `kept`; returns its id and model.
pub fn start(
    config: &Config,
    agents: &Agents,
    review: Arc<tokio::sync::Mutex<Review>>,
    args: &SessionOptions,
    backend: Backend,
    model: String,
    kept: usize,
) -> anyhow::Result<(String, String)> {
    let (mut session, id, model, root) = session_on(config, args, backend, model)?;
    let (ops_tx, mut ops) = mpsc::unbounded_channel::<Op>();
    let (live, _) = broadcast::channel(1024);
    let hosted = Arc::new(Hosted { ops: ops_tx, events: Mutex::new((Vec::new(), Some(live))) });
    agents.add(id.clone(), hosted.clone(), kept);
    hosted.emit(
        json!({"type": "session_configured", "session_id": id, "model": model, "cwd": root.display().to_string()}),
    );
    tokio::spawn(async move {
        let mut queue: VecDeque<Op> = VecDeque::new();
        loop {
            let op = match queue.pop_front() {
                Some(op) => Some(op),
                None => ops.recv().await,
            };
            let (text, plan) = match op {
                Some(Op::UserInput { text }) => (text, None),
                // An approved plan: a turn that builds it.
                Some(Op::ApprovePlan { plan }) => (String::from("(the approved plan)"), Some(plan)),
                Some(Op::SetMode { mode }) => {
                    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
                    session.set_mode(mode, &tx);
                    while let Ok(e) = rx.try_recv() {
                        hosted.emit(serde_json::to_value(&e).unwrap_or(Value::Null));
                    }
                    continue;
                }
                Some(Op::Shutdown) | None => {
                    let (tx, _rx) = mpsc::unbounded_channel::<Event>();
                    session.end(&tx, "shutdown").await;
                    break;
                }
                Some(Op::Interrupt | Op::Approval { .. }) => continue,
            };
            let checkpoint = {
                let mut r = review.lock().await;
                match tokio::task::block_in_place(|| r.checkpoint()) {
                    Ok(id) => Some(id),
                    Err(e) => {
                        hosted.emit(
                            json!({"type": "error", "message": format!("no checkpoint before this turn: {e:#}")}),
                        );
                        None
                    }
                }
            };
            hosted.emit(json!({"type": "user_message", "text": text, "turn": checkpoint}));
            let (events_tx, mut events_rx) = mpsc::unbounded_channel::<Event>();
            let forward = {
                let hosted = hosted.clone();
                let review = review.clone();
                tokio::spawn(async move {
                    while let Some(e) = events_rx.recv().await {
                        if let (Event::FileChange { path, .. }, Some(id)) = (&e, checkpoint) {
                            review.lock().await.note(id, path);
                        }
                        hosted.emit(serde_json::to_value(&e).unwrap_or(Value::Null));
                    }
                })
            };
            // The turn's end is sent once the review has seen what the turn changed.
            let (inner_tx, mut inner_rx) = mpsc::unbounded_channel::<Event>();
            let relay = tokio::spawn({
                let events_tx = events_tx.clone();
                async move {
                    let mut end = None;
                    while let Some(e) = inner_rx.recv().await {
                        if matches!(e, Event::TurnEnd { .. }) {
                            end = Some(e);
                        } else {
                            let _ = events_tx.send(e);
                        }
                    }
                    end
                }
            });
            match &plan {
                Some(plan) => session.build_plan(plan, &inner_tx, &mut ops).await,
                None => session.turn(&text, &inner_tx, &mut ops).await,
            };
            drop(inner_tx);
            let end = relay.await.ok().flatten();
            if let Some(id) = checkpoint {
                let mut r = review.lock().await;
                if let Err(e) = tokio::task::block_in_place(|| r.after_turn(id)) {
                    let _ = events_tx.send(Event::Error { message: format!("reviewing the turn's changes: {e:#}") });
                }
            }
            if let Some(end) = end {
                let _ = events_tx.send(end);
            }
            drop(events_tx);
            let _ = forward.await;
            queue.extend(session.take_pending());
        }
        hosted.events.lock().unwrap_or_else(PoisonError::into_inner).1 = None;
    });
    Ok((id, model))
}
