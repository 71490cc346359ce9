//! Errors of the index service. Messages are safe to send to a client: they never contain
//! code or real paths.

/// What went wrong in the index service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such resource for this tenant (another tenant's looks exactly the same).
    #[error("{0} not found")]
    NotFound(String),
    /// The request is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The request conflicts with the current state.
    #[error("{0}")]
    Conflict(String),
    /// A commit referenced chunks the server does not have.
    #[error("{} chunks are neither stored nor sent; plan again", .0.len())]
    MissingChunks(Vec<String>),
    /// A capability this server lacks (no embedding model, say).
    #[error("{0}")]
    Unavailable(String),
    /// The metadata database could not be reached.
    #[error("connecting to the database")]
    Connect(#[source] sqlx::Error),
    /// The metadata database failed ([`Error::database_unavailable`] tells a passing fault
    /// from a refused query).
    #[error("database")]
    Database(#[from] sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("database schema")]
    Schema(#[from] caret_db::Error),
    /// Object storage failed.
    #[error("storage")]
    Store(#[from] caret_store::Error),
    /// The embedding model failed.
    #[error("embedding")]
    Embed(#[source] caret_embed::Error),
    /// Random ids or tokens could not be made, or a key could not be used.
    #[error("{what}")]
    Crypto {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: caret_crypto::Error,
    },
    /// A file or directory of the embedded storage could not be made.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// With what.
        path: std::path::PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The HTTP status and stable error code `caret serve` answers this with; the in-process
    /// transport reports the same, so a client reacts alike to both.
    pub fn code(&self) -> (u16, &'static str) {
        match self {
            Error::NotFound(_) => (404, "not_found"),
            Error::BadRequest(_) => (400, "bad_request"),
            Error::Conflict(_) => (409, "conflict"),
            Error::MissingChunks(_) => (409, "missing_chunks"),
            Error::Unavailable(_) => (503, "unavailable"),
            e if e.database_unavailable() => (503, "database_unavailable"),
            Error::Store(e) if e.is_transient() => (503, "storage_unavailable"),
            _ => (500, "internal"),
        }
    }

    /// Whether the database is unavailable for a moment (unreachable, busy, shutting down)
    /// rather than refusing the query: a client should retry.
    pub fn database_unavailable(&self) -> bool {
        match self {
            Error::Connect(_) => true,
            Error::Database(e) => database_unavailable(e),
            _ => false,
        }
    }
}

/// Whether a database error says it is unavailable rather than refusing the query: I/O and
/// pool failures, PostgreSQL's fatal errors (a connection refused or ended: shutting down,
/// not accepting connections, too many clients) and its connection, resource and shutdown
/// classes (08, 53, 57P); SQLite's busy and locked.
pub fn database_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => {
            if let Some(pg) = d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                use sqlx::postgres::PgSeverity;
                return matches!(pg.severity(), PgSeverity::Fatal | PgSeverity::Panic)
                    || ["08", "53", "57P"].iter().any(|class| pg.code().starts_with(class));
            }
            d.code().is_some_and(|c| matches!(c.as_ref(), "5" | "6" | "261" | "517" | "262"))
        }
        _ => false,
    }
}
