//! The client side of sync: keeping a server's copy of a workspace index in step with the
//! workspace, through a [`transport::Transport`] that is either HTTP or the embedded server
//! called in-process (the same service code, no daemon).
//!
//! The client owns the code: it obfuscates paths and keys every hash before anything is
//! sent, withholds chunks with secrets, and keeps the reverse path map to itself.

mod comments;
pub mod index;
pub mod state;
pub mod sync;
pub mod transport;
pub mod watch;

use std::path::PathBuf;

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error.
    #[error("server error {status} ({code}): {message}")]
    Server {
        /// HTTP status.
        status: u16,
        /// Stable code.
        code: String,
        /// Message.
        message: String,
    },
    /// The server could not be reached or answered nonsense.
    #[error("{0}")]
    Transport(String),
    /// Scanning failed.
    #[error(transparent)]
    Workspace(#[from] caret_workspace::Error),
    /// A key problem.
    #[error(transparent)]
    Crypto(#[from] caret_crypto::Error),
    /// A local file could not be used.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Local state is unreadable.
    #[error("corrupt client state: {0}")]
    Corrupt(String),
    /// A bug or a failed task.
    #[error("internal: {0}")]
    Internal(String),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
