//! The model gateway: every model call in Caret goes through here.
//!
//! Providers ([`Provider`]) speak to one kind of backend — an OpenAI-compatible server
//! ([`openai::OpenAiProvider`]), Anthropic's Messages API ([`anthropic::AnthropicProvider`]) —
//! and turn its answers into one stream of [`Event`]s. The [`Gateway`] maps a model alias to
//! deployments (provider + upstream model + limits) and decides, per request, which
//! deployment serves it: token buckets, concurrency with slow start, circuit breakers,
//! retries under a budget, failover, priority classes with deadlines and shedding.
//!
//! This crate never logs prompts or completions; metrics carry deployment names and classes
//! only.

mod error;
mod limits;
mod metrics;
mod provider;
mod router;
mod sse;

pub mod anthropic;
pub mod local;
pub mod openai;

pub use error::{Error, Result};
pub use limits::{Breaker, BreakerState, TokenBucket};
pub use metrics::GatewayMetrics;
pub use provider::{Event, EventStream, Provider, collect_chat, collect_completion};
pub use router::{
    CallContext, Class, Deployment, DeploymentLimits, Gateway, GatewaySettings, RetrySettings, recovery_share,
};
