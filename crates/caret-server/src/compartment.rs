//! Compartments: the heavy capabilities' requests run on pools of their own, so that
//! saturating one — a flood of embeddings or chat calls, an agent's or a run's handler stuck
//! in a loop — cannot starve the rest. Each compartment is a small tokio runtime of its own
//! (the embedding one's threads, workers and blocking ones, at a lower CPU priority: nice 19),
//! with a bound on requests in flight and waiting; beyond it, 503 `overloaded` with
//! `Retry-After`. The index's routes (sync and search: CPU in bursts of milliseconds) run in
//! one at the server's priority, so that a sync never holds up a Tab request. Token checks
//! and Tab stay on the server's own runtime, which no compartment's work runs on.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{Error, Result};

/// A compartment's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Worker threads of its runtime.
    pub threads: usize,
    /// Threads for blocking work (embedding) at most.
    pub blocking: usize,
    /// Requests running at once.
    pub in_flight: usize,
    /// Requests waiting for a turn; beyond: 503.
    pub waiting: usize,
    /// Its threads' CPU priority (nice: 0 as the server's own, 19 yields to everything).
    pub nice: i32,
}

/// One compartment.
pub struct Compartment {
    name: &'static str,
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    permits: Arc<tokio::sync::Semaphore>,
    waiting: AtomicUsize,
    bounds: Bounds,
}

impl std::fmt::Debug for Compartment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compartment").field("name", &self.name).field("bounds", &self.bounds).finish()
    }
}

impl Drop for Compartment {
    fn drop(&mut self) {
        // Dropping a runtime inside another one panics: let it go in the background.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Sets the calling thread's CPU priority (nice; 0 leaves it): a CPU-heavy compartment's
/// threads, or a benchmark's load, yield to the server's own when both want a core.
pub fn set_thread_nice(nice: i32) {
    if nice == 0 {
        return;
    }
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), nice) {
        tracing::debug!(error = %e, "the thread keeps its priority");
    }
}

impl Compartment {
    /// A compartment named `name` (`models`, `embedding`, `agent`, `runs`).
    pub fn new(name: &'static str, bounds: Bounds) -> Result<Compartment> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(bounds.threads.max(1))
            .max_blocking_threads(bounds.blocking.max(1))
            .thread_name(format!("caret-{name}"))
            .on_thread_start(move || set_thread_nice(bounds.nice))
            .enable_all()
            .build()
            .map_err(|source| Error::Io { what: "starting a compartment's threads", source })?;
        let handle = runtime.handle().clone();
        Ok(Compartment {
            name,
            runtime: Some(runtime),
            handle,
            permits: Arc::new(tokio::sync::Semaphore::new(bounds.in_flight.max(1))),
            waiting: AtomicUsize::new(0),
            bounds,
        })
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Runs `work` in the compartment once it has room; `Err` (503 `overloaded`) when its
    /// queue is full too.
    pub async fn run<F>(&self, work: F) -> Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.bounds.waiting {
                    self.waiting.fetch_sub(1, Ordering::AcqRel);
                    return Err(Error::Overloaded(self.name));
                }
                let acquired = self.permits.clone().acquire_owned().await;
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                acquired.map_err(|_| Error::Overloaded(self.name))?
            }
        };
        // The request's span goes along: the work's spans stay in its trace.
        let span = tracing::Span::current();
        let task = self.handle.spawn(tracing::Instrument::instrument(
            async move {
                let out = work.await;
                drop(permit);
                out
            },
            span,
        ));
        task.await.map_err(|e| Error::Internal(format!("the {} compartment's task ended: {e}", self.name)))
    }
}

/// The nice value of the compartments that yield to the server's own threads.
const YIELDING: i32 = 19;

/// The compartments of a server.
#[derive(Debug, Clone)]
pub struct Compartments {
    /// Model calls: chat, completions, embeddings through the gateway.
    pub models: Arc<Compartment>,
    /// Embedding chunks into an index.
    pub embedding: Arc<Compartment>,
    /// Agent sessions, apply's model merges.
    pub agent: Arc<Compartment>,
    /// Runs, episodes and the workers' routes.
    pub runs: Arc<Compartment>,
    /// The index: sync (tree, plan, commit, missing vectors) and search.
    pub index: Arc<Compartment>,
}

impl Compartments {
    /// The default bounds, scaled to the machine's cores.
    pub fn standard() -> Result<Compartments> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        // Embedding (CPU-heavy) yields (nice 19). Model calls keep the server's priority: a
        // deployment's pooled connections are driven by the runtime that opened them, and
        // Tab's requests share the connections `/v1/completions` opens. Agent sessions
        // (their sandboxed commands inherit a thread's priority) and runs (the workers'
        // heartbeats and leases must not starve under load) keep it too.
        let small = Bounds { threads: 1, blocking: cores.div_ceil(2).max(1), in_flight: 64, waiting: 256, nice: 0 };
        Ok(Compartments {
            models: Arc::new(Compartment::new(
                "models",
                Bounds { threads: 2, in_flight: 512, waiting: 1024, ..small },
            )?),
            embedding: Arc::new(Compartment::new(
                "embedding",
                Bounds { in_flight: cores.max(2), waiting: 64, nice: YIELDING, ..small },
            )?),
            agent: Arc::new(Compartment::new("agent", small)?),
            runs: Arc::new(Compartment::new("runs", Bounds { threads: 2, in_flight: 256, waiting: 1024, ..small })?),
            index: Arc::new(Compartment::new(
                "index",
                Bounds { threads: cores.max(2), in_flight: 512, waiting: 4096, ..small },
            )?),
        })
    }

    /// The compartment a route's requests run in; `None`: the server's own runtime.
    pub fn of(&self, path: &str) -> Option<&Arc<Compartment>> {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match parts.as_slice() {
            ["v1", "chat", ..] | ["v1", "completions"] | ["v1", "embeddings"] => Some(&self.models),
            ["v1", "workspaces", _, "embed"] => Some(&self.embedding),
            ["v1", "workspaces", _, "tree" | "plan" | "commit" | "search"] | ["v1", "workspaces", _, "vectors", _] => {
                Some(&self.index)
            }
            ["v1", "agent", ..] | ["v1", "apply"] => Some(&self.agent),
            ["v1", "runs", ..] | ["v1", "envs", ..] | ["v1", "workers", ..] | ["v1", "secrets", ..] => Some(&self.runs),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_find_their_compartments() {
        let c = Compartments::standard().expect("compartments");
        let of = |p: &str| c.of(p).map(|c| c.name());
        assert_eq!(of("/v1/chat/completions"), Some("models"));
        assert_eq!(of("/v1/embeddings"), Some("models"));
        assert_eq!(of("/v1/workspaces/w/embed"), Some("embedding"));
        assert_eq!(of("/v1/agent/sessions/s/events"), Some("agent"));
        assert_eq!(of("/v1/workers/lease"), Some("runs"));
        for index in ["/v1/workspaces/w/search", "/v1/workspaces/w/commit", "/v1/workspaces/w/vectors/missing"] {
            assert_eq!(of(index), Some("index"), "{index}");
        }
        for own in ["/v1/complete", "/v1/workspaces", "/v1/workspaces/w", "/healthz"] {
            assert_eq!(of(own), None, "{own} runs on the server's own runtime");
        }
    }

    /// The calling thread's nice value.
    fn nice() -> i32 {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).expect("read")
    }

    #[tokio::test]
    async fn embedding_yields_and_the_rest_keep_the_servers_priority() {
        let own = nice();
        let all = Compartments::standard().expect("built");
        let named =
            [(&all.embedding, YIELDING), (&all.models, own), (&all.agent, own), (&all.runs, own), (&all.index, own)];
        for (c, want) in named {
            // Its workers, and the blocking threads that embedding runs on.
            let (worker, blocking) =
                c.run(async { (nice(), tokio::task::spawn_blocking(nice).await.expect("ran")) }).await.expect("ran");
            // (A test process already running at a lower priority cannot go back up.)
            let want = want.max(own);
            assert_eq!((worker, blocking), (want, want), "{}", c.name());
        }
        assert_eq!(nice(), own, "the caller's own thread is left as it was");
    }

    #[tokio::test]
    async fn a_full_compartment_refuses_and_a_busy_one_leaves_the_rest_running() {
        let c = Compartment::new("test", Bounds { threads: 1, blocking: 1, in_flight: 1, waiting: 1, nice: 19 })
            .expect("built");
        let c = Arc::new(c);
        // A handler stuck in a loop holds the compartment's only slot and thread...
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spin = {
            let (c, stop) = (c.clone(), stop.clone());
            tokio::spawn(async move {
                c.run(async move {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
                .await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // ... one more waits, the next is refused at once ...
        let waiting = {
            let c = c.clone();
            tokio::spawn(async move { c.run(async { 1 }).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(matches!(c.run(async { 2 }).await, Err(Error::Overloaded("test"))));
        // ... and work outside the compartment goes on.
        assert_eq!(tokio::spawn(async { 3 }).await.expect("ran"), 3);
        stop.store(true, Ordering::Relaxed);
        assert!(spin.await.expect("joined").is_ok());
        assert_eq!(waiting.await.expect("joined").expect("its turn came"), 1);
    }
}
