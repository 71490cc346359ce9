//! A leased run's model calls: through the gateway under its tenant's quotas, counted against
//! the run's token limit and, where the server knows its [`People`](super::People), its
//! owner's daily budget.

use std::sync::Arc;
use std::time::Duration;

use caret_models::{CallContext, Class, EventStream};
use caret_protocol::llm::ChatRequest;
use caret_protocol::runs::{LeaseRef, RunClass};
use futures::StreamExt as _;

use super::RunService;

impl RunService {
    /// A model call for a leased run, through the gateway under its tenant's quotas, counted
    /// against the run's token limit and (where one is set) its owner's budget.
    pub async fn chat(self: &Arc<Self>, lease: &LeaseRef, req: ChatRequest) -> caret_models::Result<EventStream> {
        let refused =
            |status: u16, message: String| caret_models::Error::Rejected { upstream: "anyrun".into(), status, message };
        let row = self.queue.check(&lease.run, lease.token).await.map_err(|e| refused(409, e.to_string()))?;
        let spec = self.spec(&row).map_err(|e| refused(500, e.to_string()))?;
        if spec.rollout.as_ref().is_some_and(|r| r.policy) {
            return self.episode_call(lease, req).await;
        }
        if row.tokens_used >= spec.limits.model_tokens {
            return Err(refused(403, format!("the run's model token limit ({}) is used up", spec.limits.model_tokens)));
        }
        let gateway =
            self.gateway.clone().ok_or_else(|| refused(503, "this server has no models configured".into()))?;
        let class = match row.class {
            RunClass::Interactive => Class::Agent,
            RunClass::Batch => Class::Background,
        };
        let mut req = req;
        req.model = spec.model.clone();
        let people = self.people.get().cloned();
        if let Some(people) = &people {
            people.admit(&row.tenant_id, &row.id).await.map_err(|why| refused(429, why))?;
        }
        let ctx = CallContext::new(class, Duration::from_secs(900), row.tenant_id.clone());
        let stream = gateway.chat(req, ctx).await?;
        let (service, lease, tenant, model) = (self.clone(), lease.clone(), row.tenant_id.clone(), spec.model.clone());
        Ok(stream
            .then(move |item| {
                let (service, lease) = (service.clone(), lease.clone());
                if let (Ok(caret_models::Event::Usage(u)), Some(people)) = (&item, &people) {
                    let n = u64::from(u.prompt_tokens) + u64::from(u.completion_tokens);
                    people.spent(&tenant, &lease.run, &model, n);
                }
                async move {
                    if let Ok(caret_models::Event::Usage(u)) = &item {
                        let n = u64::from(u.prompt_tokens) + u64::from(u.completion_tokens);
                        if let Err(e) = service.queue.add_tokens(&lease.run, lease.token, n).await {
                            tracing::warn!(run = %lease.run, "counting tokens: {e}");
                        }
                    }
                    item
                }
            })
            .boxed())
    }
}
