//! The server's one error type: a stable code and a safe message for the client, the detail
//! and its causes for the log.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use caret_protocol::{ErrorBody, ErrorDetail};

/// Errors of the server. Messages are safe to send: they never contain code or real paths.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Missing or invalid credentials.
    #[error("missing or invalid API token")]
    Unauthorized,
    /// A sign-in's name or password is wrong (the same answer for both).
    #[error("{0}")]
    SignInRefused(String),
    /// The caller is known but may not do this: a code (`forbidden`, `insufficient_scope`)
    /// and why.
    #[error("{1}")]
    Forbidden(&'static str, String),
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
    /// The person's daily budget of model tokens is spent.
    #[error("{message}")]
    BudgetExhausted {
        /// What was spent of what.
        message: String,
        /// Seconds until the budget renews.
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
    /// A capability an operator switched off (a kill switch or a rollout that leaves this
    /// tenant out): the flag's name.
    #[error("{0} is switched off on this server for now")]
    Disabled(String),
    /// A compartment's bound is reached (its requests in flight and waiting): retry shortly.
    #[error("the server's {0} work is at its bound; retry in a moment")]
    Overloaded(&'static str),
    /// The metadata database failed; [`caret_index::database_unavailable`] tells a passing
    /// fault (503, retry) from a refused query (500).
    #[error("database")]
    Database(#[source] sqlx::Error),
    /// Object storage failed.
    #[error("storage")]
    Store(#[from] caret_store::Error),
    /// The index service failed in a way that is the server's fault (an embedding model that
    /// broke, say).
    #[error("index")]
    Index(#[source] caret_index::Error),
    /// The run service failed in a way that is the server's fault (its storage, what it keeps
    /// of a run).
    #[error("runs")]
    Runs(#[source] caret_anyrun::Error),
    /// The runs' key could not be read, made or imported.
    #[error("{what}")]
    Key {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: caret_crypto::Error,
    },
    /// The listener or a connection failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// Anything else.
    #[error("internal: {0}")]
    Internal(String),
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Database(e)
    }
}

impl From<caret_index::Error> for Error {
    /// The client's mistakes keep their kind; the rest keep their cause.
    fn from(e: caret_index::Error) -> Self {
        use caret_index::Error as E;
        match e {
            E::NotFound(m) => Error::NotFound(m),
            E::BadRequest(m) => Error::BadRequest(m),
            E::Conflict(m) => Error::Conflict(m),
            E::MissingChunks(ids) => Error::MissingChunks(ids),
            E::Unavailable(m) => Error::Unavailable(m),
            E::Database(e) | E::Connect(e) => Error::Database(e),
            E::Store(e) => Error::Store(e),
            other => Error::Index(other),
        }
    }
}

impl From<caret_sessions::Error> for Error {
    fn from(e: caret_sessions::Error) -> Self {
        use caret_sessions::Error as E;
        match e {
            E::NotFound(m) => Error::NotFound(m),
            E::BadRequest(m) => Error::BadRequest(m),
            E::ModelNotAllowed(m) => Error::Forbidden("model_not_allowed", m),
            E::Conflict(m) => Error::Conflict(m),
            E::Unavailable(m) => Error::Unavailable(m),
        }
    }
}

impl From<caret_identity::Error> for Error {
    /// The caller's mistakes keep their kind; the rest keep their cause.
    fn from(e: caret_identity::Error) -> Self {
        use caret_identity::Error as E;
        match e {
            E::NotFound(m) => Error::NotFound(m),
            E::BadRequest(m) => Error::BadRequest(m),
            E::Conflict(m) => Error::Conflict(m),
            E::Forbidden(m) => Error::Forbidden("forbidden", m),
            E::BadToken(m) => Error::BadRequest(m),
            E::Upstream(m) => {
                tracing::warn!(error = %m, "the identity provider failed");
                Error::Unavailable(format!("the identity provider: {m}"))
            }
            E::Database(e) => Error::Database(e),
            other => Error::Internal(chain(&other)),
        }
    }
}

/// What a failed request's answer carries for the report (never sent to the client).
#[derive(Debug, Clone)]
pub struct Failed(pub String);

/// An error and its causes, outermost first, as one line for the log.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The HTTP status and stable code.
    pub fn status(&self) -> (StatusCode, &'static str) {
        match self {
            Error::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Error::SignInRefused(_) => (StatusCode::UNAUTHORIZED, "invalid_credentials"),
            Error::Forbidden(code, _) => (StatusCode::FORBIDDEN, code),
            Error::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Error::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Error::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Error::MissingChunks(_) => (StatusCode::CONFLICT, "missing_chunks"),
            Error::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            Error::TooMany(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many"),
            Error::BudgetExhausted { .. } => (StatusCode::TOO_MANY_REQUESTS, "budget_exhausted"),
            Error::EditDoesNotFit(_) => (StatusCode::UNPROCESSABLE_ENTITY, "edit_does_not_fit"),
            Error::Timeout(_) => (StatusCode::REQUEST_TIMEOUT, "timeout"),
            Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::Disabled(_) => (StatusCode::SERVICE_UNAVAILABLE, "disabled"),
            Error::Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Error::Database(e) if caret_index::database_unavailable(e) => {
                (StatusCode::SERVICE_UNAVAILABLE, "database_unavailable")
            }
            Error::Store(e) if e.is_transient() => (StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable"),
            Error::Runs(caret_anyrun::Error::Store { .. }) => (StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable"),
            Error::Database(_)
            | Error::Store(_)
            | Error::Index(_)
            | Error::Runs(_)
            | Error::Key { .. }
            | Error::Io { .. }
            | Error::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, code) = self.status();
        let mut failed = None;
        let message = if matches!(code, "database_unavailable" | "storage_unavailable") {
            tracing::warn!(error = %chain(&self), "request failed for a storage fault; the client is told to retry");
            "storage is failing for the moment; retry".to_owned()
        } else if let Error::Disabled(_) | Error::Overloaded(_) = &self {
            self.to_string()
        } else if status.is_server_error() {
            // Logged and reported once, with the request's context, by the router's `observe`.
            failed = Some(Failed(chain(&self)));
            "internal error; see the server log".to_owned()
        } else {
            self.to_string()
        };
        let body = ErrorBody { error: ErrorDetail { code: code.to_owned(), message } };
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(f) = failed {
            response.extensions_mut().insert(f);
        }
        match &self {
            Error::RateLimited { retry_after } | Error::BudgetExhausted { retry_after, .. } => {
                if let Ok(v) = HeaderValue::from_str(&retry_after.to_string()) {
                    response.headers_mut().insert(header::RETRY_AFTER, v);
                }
            }
            Error::TooMany(_) => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            }
            Error::Overloaded(_) => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            // Storage faults pass; nothing was half-done (every write is one object put or
            // one transaction), so the same request can simply be sent again.
            Error::Database(_) | Error::Store(_) | Error::Runs(_) if status == StatusCode::SERVICE_UNAVAILABLE => {
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
