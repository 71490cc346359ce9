//! Anyrun: background agent runs. A user hands off a task; it waits in a queue in the
//! metadata database ([`queue`]); a worker slot leases it, unpacks the code into a fresh
//! directory, prepares the environment and runs the same agent [`caret_agent::session::Session`]
//! and tools as `caret agent`, with commands in the sandbox ([`worker`]); the patch, the
//! transcript and the figures come back to the [`runs::RunService`], which the server's
//! routes and the embedded `caret run` both call.
//!
//! Workers talk to the service through [`worker::Coordinator`]: in process (the service
//! itself: `caret serve --workers N`, embedded runs) or over HTTP (`caret worker --server`).
//! Every call after the lease carries the lease's fencing token, so a worker that lost its
//! lease cannot report for the run.
//!
//! A run executes its repository's code, so the index's rule (no plaintext code on the
//! server) cannot hold for runs; instead everything the server keeps of a run — the uploaded
//! bundle, the task, events, results, secrets — is sealed with a per-tenant key
//! ([`caret_crypto::seal`]) and deleted when the run is collected or its retention ends.
//! This crate never serves HTTP itself.

mod checkout;
mod checkpoint;
mod coordinator;
pub mod docs_crawl;
pub mod environment;
pub mod episodes;
mod mcp;
pub mod queue;
pub mod redact;
pub mod remote;
pub mod rollout;
pub mod runs;
pub mod snapshot;
pub mod worker;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed or not allowed.
    #[error("{0}")]
    BadRequest(String),
    /// No such run (or another tenant's).
    #[error("{0} not found")]
    NotFound(String),
    /// The run is not in a state for this (no result yet, say).
    #[error("{0}")]
    Conflict(String),
    /// The caller's lease on the run is not its current one: another worker holds it, or the
    /// run has ended.
    #[error("the lease on run {0} is no longer held (another worker took it over, or the run ended)")]
    Fenced(String),
    /// A bound of the tenant's is reached (open episodes).
    #[error("{0}")]
    TooMany(String),
    /// Something needed is missing or failing (no models, the object store).
    #[error("{0}")]
    Unavailable(String),
    /// The database failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The run queue's schema could not be brought up to date.
    #[error("the run queue's schema")]
    Schema(#[from] caret_db::Error),
    /// Object storage failed (a passing fault: the caller may retry).
    #[error("{what}")]
    Store {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: object_store::Error,
    },
    /// Sealing what is kept of a run failed.
    #[error("{what}")]
    Seal {
        /// What was being sealed or opened.
        what: String,
        /// Why it failed.
        #[source]
        source: caret_crypto::Error,
    },
    /// What is kept of a run could not be opened (a wrong key, damaged data).
    #[error("{what}")]
    Open {
        /// What was being opened.
        what: String,
        /// Why it failed.
        #[source]
        source: caret_crypto::seal::OpenError,
    },
    /// What is kept of a run could not be written or read as JSON.
    #[error("{what}")]
    Json {
        /// What was being written or read.
        what: String,
        /// Why it failed.
        #[source]
        source: serde_json::Error,
    },
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
