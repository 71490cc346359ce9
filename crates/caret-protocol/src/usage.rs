//! `POST /v1/usage`: what an editor reports of its use, when its user turned usage telemetry
//! on — counts and latencies of named events only (never code, paths or queries). The server
//! keeps them only when its operator turned collection on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most events one report may carry.
pub const MAX_EVENTS: usize = 1000;

/// A batch of events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageReport {
    /// At most [`MAX_EVENTS`].
    pub events: Vec<UsageEvent>,
}

/// One event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageEvent {
    /// `tab.shown` or `tab.accepted`.
    pub event: String,
    /// Its latency in milliseconds, when it has one (`tab.shown`: from the request to the
    /// answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<f64>,
}

/// The answer to a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UsageReply {
    /// Events kept (0 when the server does not collect).
    pub recorded: u32,
    /// Whether the server collects usage: when false, a client stops reporting.
    pub collecting: bool,
}
