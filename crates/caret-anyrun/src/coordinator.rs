//! How a worker talks to the run service: the [`Coordinator`] trait (lease, bundle,
//! heartbeat, events, checkpoints, model calls, completion — each after the lease carrying its
//! fencing token), and [`InProcess`], the service itself in the same process.

use std::sync::Arc;

use caret_models::EventStream;
use caret_protocol::llm::ChatRequest;
use caret_protocol::runs::{CheckpointBody, Completion, Lease, LeaseRef, LeaseRequest, RunEvent, SandboxUsage};

use crate::Result;
use crate::runs::RunService;

/// What a worker asks of the run service: in process or over HTTP.
#[async_trait::async_trait]
pub trait Coordinator: Send + Sync {
    /// The next run for a free slot.
    async fn lease(&self, req: &LeaseRequest) -> Result<Option<Lease>>;
    /// A leased run's uploaded bundle.
    async fn bundle(&self, lease: &LeaseRef) -> Result<Vec<u8>>;
    /// Renews the lease, saying what the run's sandbox uses; `true`: the user cancelled the run.
    async fn heartbeat(&self, lease: &LeaseRef, usage: Option<SandboxUsage>) -> Result<bool>;
    /// Records events.
    async fn events(&self, lease: &LeaseRef, events: Vec<RunEvent>) -> Result<()>;
    /// Saves where the attempt has got to.
    async fn checkpoint(&self, body: CheckpointBody) -> Result<()>;
    /// A model call for the run.
    async fn chat(&self, lease: &LeaseRef, req: ChatRequest) -> caret_models::Result<EventStream>;
    /// Ends the attempt.
    async fn complete(&self, done: Completion) -> Result<()>;
    /// How long the sandbox took to be ready (for the operators' figures).
    async fn launched(&self, lease: &LeaseRef, seconds: f64);
}

/// The run service in this process as a coordinator.
#[derive(Clone)]
pub struct InProcess(pub Arc<RunService>);

#[async_trait::async_trait]
impl Coordinator for InProcess {
    async fn lease(&self, req: &LeaseRequest) -> Result<Option<Lease>> {
        self.0.lease(req).await
    }
    async fn bundle(&self, lease: &LeaseRef) -> Result<Vec<u8>> {
        self.0.bundle(lease).await
    }
    async fn heartbeat(&self, lease: &LeaseRef, usage: Option<SandboxUsage>) -> Result<bool> {
        self.0.heartbeat(lease, usage).await
    }
    async fn events(&self, lease: &LeaseRef, events: Vec<RunEvent>) -> Result<()> {
        self.0.append_events(lease, &events).await
    }
    async fn checkpoint(&self, body: CheckpointBody) -> Result<()> {
        self.0.checkpoint(&body).await
    }
    async fn chat(&self, lease: &LeaseRef, req: ChatRequest) -> caret_models::Result<EventStream> {
        self.0.chat(lease, req).await
    }
    async fn complete(&self, done: Completion) -> Result<()> {
        self.0.complete(done).await.map(|_| ())
    }
    async fn launched(&self, lease: &LeaseRef, seconds: f64) {
        self.0.observe_launch(lease, seconds).await;
    }
}
