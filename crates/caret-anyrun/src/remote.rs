//! A worker's coordinator over HTTP: `caret worker --server URL --token T` on another machine.
//! Routes (operator token): `POST /v1/workers/lease`, and per run `GET …/bundle?token=N`,
//! `POST …/heartbeat`, `POST …/events`, `POST …/complete`, and the model at
//! `…/{run}/{token}/v1/chat/completions` (OpenAI-compatible, so the gateway's own provider
//! speaks it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use caret_models::{EventStream, Provider as _};
use caret_protocol::llm::ChatRequest;
use caret_protocol::runs::{
    CheckpointBody, Completion, EventBatch, Heartbeat, HeartbeatAnswer, Lease, LeaseRef, LeaseRequest, RunEvent,
    SandboxUsage,
};

use crate::worker::Coordinator;
use crate::{Error, Result};

/// The run service of a `caret serve` reached over HTTP.
pub struct Remote {
    base: String,
    token: String,
    client: reqwest::Client,
    /// Model endpoints per lease (one HTTP client each, reused across the run's calls).
    models: Mutex<HashMap<LeaseRef, Arc<caret_models::openai::OpenAiProvider>>>,
}

impl Remote {
    /// A coordinator at `base` (`https://caret.example.com`) with an operator token.
    pub fn new(base: &str, token: &str, client: reqwest::Client) -> Remote {
        Remote {
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            client,
            models: Mutex::default(),
        }
    }

    fn run_url(&self, run: &str, what: &str) -> String {
        format!("{}/v1/workers/runs/{run}/{what}", self.base)
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        let req = match caret_trace::traceparent() {
            Some(parent) => req.header(caret_trace::TRACEPARENT, parent),
            None => req,
        };
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| Error::Unavailable(format!("reaching {}: {e}", self.base)))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<caret_protocol::ErrorBody>(&body)
            .map(|b| b.error.message)
            .unwrap_or_else(|_| body.chars().take(300).collect());
        Err(match status.as_u16() {
            409 => Error::Fenced(message),
            404 => Error::NotFound(message),
            400 | 422 => Error::BadRequest(message),
            _ => Error::Unavailable(format!("{}: {status}: {message}", self.base)),
        })
    }

    async fn json<T: serde::de::DeserializeOwned>(resp: reqwest::Response) -> Result<T> {
        resp.json().await.map_err(|e| Error::Unavailable(format!("reading the server's answer: {e}")))
    }
}

#[async_trait::async_trait]
impl Coordinator for Remote {
    async fn lease(&self, req: &LeaseRequest) -> Result<Option<Lease>> {
        let resp = self.send(self.client.post(format!("{}/v1/workers/lease", self.base)).json(req)).await?;
        if resp.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(None);
        }
        Ok(Some(Self::json(resp).await?))
    }

    async fn bundle(&self, lease: &LeaseRef) -> Result<Vec<u8>> {
        let url = self.run_url(&lease.run, &format!("bundle?token={}", lease.token));
        let resp = self.send(self.client.get(url)).await?;
        Ok(resp.bytes().await.map_err(|e| Error::Unavailable(format!("reading the bundle: {e}")))?.to_vec())
    }

    async fn heartbeat(&self, lease: &LeaseRef, usage: Option<SandboxUsage>) -> Result<bool> {
        let body = Heartbeat { lease: lease.clone(), usage };
        let resp = self.send(self.client.post(self.run_url(&lease.run, "heartbeat")).json(&body)).await?;
        Ok(Self::json::<HeartbeatAnswer>(resp).await?.cancel)
    }

    async fn checkpoint(&self, body: CheckpointBody) -> Result<()> {
        self.send(self.client.post(self.run_url(&body.lease.run, "checkpoint")).json(&body)).await?;
        Ok(())
    }

    async fn events(&self, lease: &LeaseRef, events: Vec<RunEvent>) -> Result<()> {
        let body = EventBatch { lease: lease.clone(), events };
        self.send(self.client.post(self.run_url(&lease.run, "events")).json(&body)).await?;
        Ok(())
    }

    async fn chat(&self, lease: &LeaseRef, req: ChatRequest) -> caret_models::Result<EventStream> {
        let provider = {
            let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
            match models.get(lease) {
                Some(p) => p.clone(),
                None => {
                    let base = self.run_url(&lease.run, &lease.token.to_string());
                    let p = Arc::new(
                        caret_models::openai::OpenAiProvider::new(&base, Some(self.token.clone()))?.caret_upstream(),
                    );
                    models.insert(lease.clone(), p.clone());
                    p
                }
            }
        };
        provider.chat(req).await
    }

    async fn complete(&self, done: Completion) -> Result<()> {
        self.models.lock().unwrap_or_else(PoisonError::into_inner).remove(&done.lease);
        self.send(self.client.post(self.run_url(&done.lease.run, "complete")).json(&done)).await?;
        Ok(())
    }

    async fn launched(&self, _lease: &LeaseRef, _seconds: f64) {
        // The server measures remote workers by their timings in the result.
    }
}
