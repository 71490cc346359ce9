//! The crate's error.

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed (a bad email, an unknown scope).
    #[error("{0}")]
    BadRequest(String),
    /// No such person, group or credential in this organisation.
    #[error("{0} not found")]
    NotFound(String),
    /// It exists already, or the change would leave the organisation without an owner.
    #[error("{0}")]
    Conflict(String),
    /// The caller's role does not allow it.
    #[error("{0}")]
    Forbidden(String),
    /// A token or code that is forged, expired, replayed or not for this server (an ID
    /// token, an authorization or device code, a refresh token).
    #[error("{0}")]
    BadToken(String),
    /// The identity provider (OIDC, LDAP) could not be reached or answered nonsense.
    #[error("{0}")]
    Upstream(String),
    /// The database failed.
    #[error("identity database")]
    Database(#[from] sqlx::Error),
    /// The identity schema could not be brought up to date.
    #[error("the identity schema")]
    Schema(#[from] caret_db::Error),
    /// The object store failed (the audit trail's exports).
    #[error("object store: {0}")]
    Store(String),
    /// No randomness for a token or an id.
    #[error("{what}")]
    Crypto {
        /// What was being made.
        what: &'static str,
        /// Why.
        #[source]
        source: caret_crypto::Error,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `e` unless it is a unique-key violation, which becomes [`Error::Conflict`] with `what`.
pub(crate) fn conflict_if_duplicate(e: sqlx::Error, what: impl FnOnce() -> String) -> Error {
    match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => Error::Conflict(what()),
        _ => Error::Database(e),
    }
}
