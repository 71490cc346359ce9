use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use caret_protocol::{ErrorBody, ErrorDetail};

/// Errors of the server. Messages are safe to send: they never contain code or real paths.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Missing or invalid credentials.
    #[error("missing or invalid API token")]
    Unauthorized,
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
    /// Too many requests.
    #[error("rate limit exceeded; retry in {retry_after} s")]
    RateLimited {
        /// Seconds to wait.
        retry_after: u64,
    },
    /// A bound of the tenant's is reached (open episodes, say); retry once some are closed.
    #[error("{0}")]
    TooMany(String),
    /// An edit that does not fit the text it was sent with (no place, or several). The
    /// message quotes the caller's own edit back to it; nothing of it is logged or stored.
    #[error("{0}")]
    EditDoesNotFit(String),
    /// The request's time budget (its deadline) ran out before it could be answered.
    #[error("{0}")]
    Timeout(String),
    /// A capability this server lacks (no embedding model, say).
    #[error("{0}")]
    Unavailable(String),
    /// The metadata database failed.
    #[error("database: {0}")]
    Database(String),
    /// Object storage failed.
    #[error("storage: {0}")]
    Store(#[from] caret_store::Error),
    /// Anything else.
    #[error("internal: {0}")]
    Internal(String),
}

impl From<sqlx::Error> for Error {
    /// The database unreachable, busy or gone for a moment is [`Error::Database`] (503, retry);
    /// a query it refuses is a bug here ([`Error::Internal`]).
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => Error::Database(e.to_string()),
            sqlx::Error::Database(ref d) if unavailable(d.as_ref()) => Error::Database(e.to_string()),
            other => Error::Internal(format!("database: {other}")),
        }
    }
}

/// Whether a database's error says it is unavailable rather than refusing the query:
/// PostgreSQL's fatal errors (a connection refused or ended: shutting down, not accepting
/// connections, too many clients) and its connection, resource and shutdown classes (08, 53,
/// 57P); SQLite's busy and locked.
fn unavailable(d: &dyn sqlx::error::DatabaseError) -> bool {
    if let Some(pg) = d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        use sqlx::postgres::PgSeverity;
        return matches!(pg.severity(), PgSeverity::Fatal | PgSeverity::Panic)
            || ["08", "53", "57P"].iter().any(|class| pg.code().starts_with(class));
    }
    d.code().is_some_and(|c| matches!(c.as_ref(), "5" | "6" | "261" | "517" | "262"))
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The HTTP status and stable code.
    pub fn status(&self) -> (StatusCode, &'static str) {
        match self {
            Error::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Error::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Error::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Error::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Error::MissingChunks(_) => (StatusCode::CONFLICT, "missing_chunks"),
            Error::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            Error::TooMany(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many"),
            Error::EditDoesNotFit(_) => (StatusCode::UNPROCESSABLE_ENTITY, "edit_does_not_fit"),
            Error::Timeout(_) => (StatusCode::REQUEST_TIMEOUT, "timeout"),
            Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::Database(_) => (StatusCode::SERVICE_UNAVAILABLE, "database_unavailable"),
            Error::Store(e) if e.is_transient() => (StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable"),
            Error::Store(_) | Error::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, code) = self.status();
        let message = if matches!(code, "database_unavailable" | "storage_unavailable") {
            tracing::warn!(error = %self, "request failed for a storage fault; the client is told to retry");
            "storage is failing for the moment; retry".to_owned()
        } else if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
            "internal error; see the server log".to_owned()
        } else {
            self.to_string()
        };
        let body = ErrorBody { error: ErrorDetail { code: code.to_owned(), message } };
        let mut response = (status, axum::Json(body)).into_response();
        match &self {
            Error::RateLimited { retry_after } => {
                if let Ok(v) = HeaderValue::from_str(&retry_after.to_string()) {
                    response.headers_mut().insert(header::RETRY_AFTER, v);
                }
            }
            Error::TooMany(_) => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            }
            // Storage faults pass; nothing was half-done (every write is one object put or
            // one transaction), so the same request can simply be sent again.
            Error::Database(_) | Error::Store(_) if status == StatusCode::SERVICE_UNAVAILABLE => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Error::Unauthorized => {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }
}
