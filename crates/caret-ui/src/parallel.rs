//! The page's "run N": one task tried by N agents at once, each in a git worktree of its own
//! (as `caret agent --parallel N`), their diffs shown side by side, one applied to the
//! checkout, and every worktree removed after.

use std::path::PathBuf;
use std::sync::Arc;

use caret_host::config::Config;
use caret_host::worktrees::{self, Attempt};
use serde_json::{Value, json};

/// At most this many attempts at once.
const MOST: usize = 8;

/// The page's one batch of attempts (none until started; gone once applied or discarded).
#[derive(Default)]
pub struct Parallel {
    batch: Arc<tokio::sync::Mutex<Option<Batch>>>,
}

struct Batch {
    task: String,
    n: usize,
    /// The worktrees, once made.
    worktrees: Vec<PathBuf>,
    /// How it stands.
    state: State,
}

enum State {
    Running,
    Done(Vec<Attempt>),
    Failed(String),
}

impl Parallel {
    /// Starts `n` attempts at `task` in worktrees of `root` (attempt `i` on `models[i % len]`;
    /// none: the default model). A batch still running is left alone; a finished one that was
    /// never applied is discarded.
    pub async fn start(
        &self,
        config: &Config,
        root: PathBuf,
        task: &str,
        n: usize,
        models: Vec<String>,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(!task.trim().is_empty(), "say what the attempts should do");
        anyhow::ensure!((1..=MOST).contains(&n), "1 to {MOST} attempts, not {n}");
        let mut batch = self.batch.lock().await;
        if let Some(old) = batch.take() {
            if matches!(old.state, State::Running) {
                *batch = Some(old);
                anyhow::bail!("attempts are already running: wait for them, then apply one or discard them");
            }
            remove(root.clone(), old.worktrees).await;
        }
        *batch = Some(Batch { task: task.to_owned(), n, worktrees: Vec::new(), state: State::Running });
        drop(batch);
        let (config, task, shared) = (config.clone(), task.to_owned(), self.batch.clone());
        tokio::spawn(async move {
            let options = caret_host::session::SessionOptions::new(root.clone(), None);
            let state = match worktrees::create(&config, &root, n, options.network).await {
                Ok(trees) => {
                    if let Some(b) = shared.lock().await.as_mut() {
                        b.worktrees.clone_from(&trees);
                    }
                    let attempts =
                        worktrees::run_all(&config, &trees, &task, &models, options.approval, options.max_steps).await;
                    State::Done(attempts)
                }
                Err(e) => State::Failed(format!("{e:#}")),
            };
            if let Some(b) = shared.lock().await.as_mut() {
                b.state = state;
            }
        });
        Ok(())
    }

    /// `{state: none|running|done|failed, task, n, attempts: [{number, model, ended, files:
    /// [{path, added, removed}], diff}], error}`.
    pub async fn status(&self) -> Value {
        let batch = self.batch.lock().await;
        let Some(b) = batch.as_ref() else { return json!({"state": "none"}) };
        let (state, attempts, error) = match &b.state {
            State::Running => ("running", Vec::new(), None),
            State::Done(attempts) => ("done", attempts.iter().map(attempt).collect(), None),
            State::Failed(e) => ("failed", Vec::new(), Some(e.clone())),
        };
        json!({"state": state, "task": b.task, "n": b.n, "attempts": attempts, "error": error})
    }

    /// Applies attempt `number` to the checkout at `root` (0: none) and removes every
    /// worktree. Answers what was done.
    pub async fn apply(&self, root: PathBuf, number: usize) -> anyhow::Result<String> {
        let mut batch = self.batch.lock().await;
        let b = batch.take().ok_or_else(|| anyhow::anyhow!("no attempts to apply: start some first"))?;
        let attempts = match &b.state {
            State::Running => {
                *batch = Some(b);
                anyhow::bail!("the attempts are still running");
            }
            State::Done(attempts) => attempts.clone(),
            State::Failed(_) => Vec::new(),
        };
        let chosen = attempts.into_iter().find(|a| a.number == number);
        let applied = match (number, chosen) {
            (0, _) => Ok("nothing applied".to_owned()),
            (_, Some(a)) => {
                let (root, n) = (root.clone(), a.number);
                tokio::task::spawn_blocking(move || worktrees::apply(&root, &a))
                    .await
                    .map_err(|e| anyhow::anyhow!("applying: {e}"))?
                    .map(|()| format!("applied attempt {n}"))
            }
            (k, None) => Err(anyhow::anyhow!("there is no attempt {k}")),
        };
        match applied {
            Ok(said) => {
                remove(root, b.worktrees).await;
                Ok(said)
            }
            // Kept, so that another may be applied (or all discarded).
            Err(e) => {
                *batch = Some(b);
                Err(e)
            }
        }
    }
}

fn attempt(a: &Attempt) -> Value {
    let files: Vec<Value> = a
        .files
        .iter()
        .map(|(path, added, removed)| json!({"path": path, "added": added, "removed": removed}))
        .collect();
    json!({"number": a.number, "model": a.model, "ended": a.ended, "files": files, "diff": a.diff})
}

async fn remove(root: PathBuf, trees: Vec<PathBuf>) {
    if trees.is_empty() {
        return;
    }
    let _ = tokio::task::spawn_blocking(move || worktrees::remove(&root, &trees)).await;
}
