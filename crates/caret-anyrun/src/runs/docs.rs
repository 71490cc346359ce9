//! Documentation crawls as runs: a team's docs source is crawled by a worker (any `caret
//! worker`, or the server's own slots), under the same network rules as an agent's run, and
//! what it brings back is handed to the server's docs library ([`DocsCrawls`]) to index.
//!
//! The source's page state (URLs, validators, hashes) travels as the run's bundle, sealed like
//! any bundle, so that the worker's requests are conditional and only changed pages come back.

use std::sync::Arc;

use caret_protocol::runs::{
    Completion, DocsCrawl, DocsCrawled, NumberedEvent, RepoSource, RunClass, RunEnvironment, RunEvent, RunInfo,
    RunLimits, RunState, RunStatus,
};

use super::{RunService, Spec, TenantRef};
use crate::{Error, Result};

/// The wall time of a docs crawl's attempt.
const CRAWL_WALL_TIME_S: u64 = 3 * 3600;
/// The disk a docs crawl's directory may take.
const CRAWL_DISK_BYTES: u64 = 4 << 30;

/// What the server's docs library does when a docs crawl ends.
#[async_trait::async_trait]
pub trait DocsCrawls: Send + Sync {
    /// A worker completed the crawl of `job` for `tenant_id` as run `run`: `crawled` holds its
    /// pages when it succeeded. Called before the run is recorded as ended; an error makes the
    /// completion fail (the worker's lease then runs out and another attempt follows), so what
    /// `crawled` holds must be kept before this returns.
    async fn ended(
        &self,
        tenant_id: &str,
        run: &str,
        job: &DocsCrawl,
        state: RunState,
        reason: Option<&str>,
        crawled: Option<DocsCrawled>,
    ) -> std::result::Result<(), String>;
}

impl RunService {
    /// Sets the docs library docs crawls end in (once; later calls are ignored).
    pub fn set_docs(&self, docs: Arc<dyn DocsCrawls>) {
        let _ = self.docs.set(docs);
    }

    /// Queues a crawl of a tenant's docs source; `state` is the source's page state (JSON, empty
    /// for a first crawl).
    pub async fn submit_docs(
        &self,
        tenant: &TenantRef,
        class: RunClass,
        job: DocsCrawl,
        state: &[u8],
    ) -> Result<RunInfo> {
        let id = super::new_run_id();
        let sealed = self
            .sealer(&tenant.id)
            .seal(&format!("{id}/bundle"), state)
            .map_err(|source| Error::Seal { what: format!("sealing run {id}'s page state"), source })?;
        self.store
            .put(&Self::object(&tenant.id, &id, "bundle"), sealed.into())
            .await
            .map_err(|e| super::store_err("storing the page state", e))?;
        let spec = Spec {
            task: format!("crawl the docs source {}", job.source),
            model: "none".into(),
            limits: RunLimits {
                wall_time_s: CRAWL_WALL_TIME_S,
                model_tokens: 1,
                steps: 1,
                disk_bytes: CRAWL_DISK_BYTES,
            },
            environment: RunEnvironment::default(),
            repo: RepoSource::Bundle { bundle: String::new(), head: String::new(), patch: String::new() },
            push: None,
            git_credential: None,
            rollout: None,
            traceparent: caret_trace::traceparent(),
            docs: Some(job),
        };
        self.enqueue(tenant, &id, class, &spec).await
    }

    /// The latest counts a running docs crawl reported, if any.
    pub async fn docs_progress(&self, tenant_id: &str, run: &RunInfo) -> Option<caret_protocol::docs::DocsCounts> {
        let events: Vec<NumberedEvent> = self.events(tenant_id, &run.id, run.events.saturating_sub(8), 8).await.ok()?;
        events.into_iter().rev().find_map(|e| match e.event {
            RunEvent::Run(RunStatus::DocsProgress { counts }) => Some(counts),
            _ => None,
        })
    }

    /// Hands a docs crawl's completion to the docs library (a run of another kind: nothing).
    pub(super) async fn docs_ended(&self, tenant_id: &str, spec: &Spec, done: &mut Completion) -> Result<()> {
        let Some(job) = &spec.docs else { return Ok(()) };
        let Some(docs) = self.docs.get() else {
            return Err(Error::Unavailable("this server keeps no docs sources".into()));
        };
        docs.ended(tenant_id, &done.lease.run, job, done.state, done.reason.as_deref(), done.docs.take())
            .await
            .map_err(|e| Error::Unavailable(format!("keeping the crawl's pages: {e}")))
    }
}
