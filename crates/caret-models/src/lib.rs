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
pub mod openai;

pub use error::{Error, Result};

/// Most tool calls one answer may make: streamed pieces name their call by index, and
/// readers refuse an index past this rather than make room for it.
pub const MAX_TOOL_CALLS: u32 = 256;
pub use limits::{Breaker, BreakerState, TokenBucket};
pub use metrics::GatewayMetrics;
pub use provider::{Event, EventStream, Provider, collect_chat, collect_completion};
pub use router::{
    CallContext, Class, Deployment, DeploymentLimits, Gateway, GatewaySettings, QuotaLedger, RetrySettings,
    recovery_share,
};

/// Entry points for the fuzz targets (`crates/caret-fuzz`): the readers of what model servers
/// and local engines send, fed from memory. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    use bytes::Bytes;

    fn body(pieces: Vec<Vec<u8>>) -> impl futures::Stream<Item = std::result::Result<Bytes, std::convert::Infallible>> {
        futures::stream::iter(pieces.into_iter().map(|p| Ok(Bytes::from(p))))
    }

    /// An OpenAI-compatible streamed chat body, arriving in `pieces`, read and collected.
    pub fn openai_chat(pieces: Vec<Vec<u8>>) -> crate::Result<crate::provider::Collected> {
        futures::executor::block_on(crate::collect_chat(crate::openai::chat_stream("fuzz".to_owned(), body(pieces))))
    }

    /// An Anthropic Messages streamed body, arriving in `pieces`, read and collected.
    pub fn anthropic_messages(pieces: Vec<Vec<u8>>) -> crate::Result<crate::provider::Collected> {
        futures::executor::block_on(crate::collect_chat(crate::anthropic::message_stream(
            "fuzz".to_owned(),
            body(pieces),
        )))
    }
}
