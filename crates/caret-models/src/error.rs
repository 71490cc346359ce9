//! Errors of the gateway and its providers, classified for retries and for HTTP answers.

use std::time::Duration;

/// What went wrong with a model call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The upstream answered 429.
    #[error("{upstream} is rate limiting")]
    RateLimited {
        /// Which deployment or URL.
        upstream: String,
        /// How long it asked us to wait.
        retry_after: Option<Duration>,
    },
    /// The upstream failed in a way worth retrying: 5xx, connection, timeout, a broken stream.
    #[error("{upstream} failed: {message}")]
    Upstream {
        /// Which deployment or URL.
        upstream: String,
        /// HTTP status, when there was one.
        status: Option<u16>,
        /// What happened (no prompt text).
        message: String,
    },
    /// The upstream refused the request itself (4xx other than 429): retrying cannot help.
    #[error("{upstream} rejected the request ({status}): {message}")]
    Rejected {
        /// Which deployment or URL.
        upstream: String,
        /// HTTP status.
        status: u16,
        /// Its message.
        message: String,
    },
    /// The request is malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// No alias of that name.
    #[error("no model {0:?} (GET /v1/models lists them)")]
    UnknownModel(String),
    /// The deployment's provider cannot do this (e.g. embeddings on Anthropic).
    #[error("{0}")]
    Unsupported(String),
    /// The request's deadline passed, or could no longer be met, before a model answered.
    #[error("deadline exceeded: {0}")]
    Deadline(String),
    /// Dropped to protect more important traffic, or every deployment is down.
    #[error("overloaded: {reason}")]
    Shed {
        /// Why.
        reason: String,
        /// When to try again.
        retry_after: Duration,
    },
    /// A tenant's quota is spent.
    #[error("quota exceeded: {reason}")]
    Quota {
        /// Which quota.
        reason: String,
        /// When it refills enough.
        retry_after: Duration,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether another attempt (here or on another deployment) may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, Error::RateLimited { .. } | Error::Upstream { .. })
    }

    /// Whether the failure counts against the deployment's health (a 429 does not: the
    /// deployment is alive, only busy).
    pub fn is_failure(&self) -> bool {
        matches!(self, Error::Upstream { .. })
    }

    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::RateLimited { .. } => "rate_limited",
            Error::Upstream { status: Some(_), .. } => "upstream_5xx",
            Error::Upstream { .. } => "upstream_io",
            Error::Rejected { .. } => "rejected",
            Error::BadRequest(_) => "bad_request",
            Error::UnknownModel(_) => "unknown_model",
            Error::Unsupported(_) => "unsupported",
            Error::Deadline(_) => "deadline",
            Error::Shed { .. } => "shed",
            Error::Quota { .. } => "quota",
        }
    }

    /// The HTTP status the gateway answers with.
    pub fn status(&self) -> u16 {
        match self {
            Error::RateLimited { .. } | Error::Quota { .. } => 429,
            Error::Upstream { .. } => 502,
            Error::Rejected { status, .. } => *status,
            Error::BadRequest(_) | Error::Unsupported(_) => 400,
            Error::UnknownModel(_) => 404,
            // The request's own time budget ran out: 408, which OpenAI's clients retry (a
            // 504 would blame a server that kept to the budget it was given).
            Error::Deadline(_) => 408,
            Error::Shed { .. } => 503,
        }
    }

    /// How long the client should wait before trying again, when known.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::RateLimited { retry_after, .. } => *retry_after,
            Error::Shed { retry_after, .. } | Error::Quota { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}
