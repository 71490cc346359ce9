//! Errors of the workspace core, each saying what was being done and to which path.

use std::path::PathBuf;

/// Errors of the workspace core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An IO operation on a path failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done, e.g. "reading directory".
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The workspace root is not a directory.
    #[error("workspace root {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A tokenizer file could not be used.
    #[error("loading tokenizer {}: {reason}", path.display())]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// Why it could not be used.
        reason: String,
    },
    /// A tree-sitter grammar could not be loaded (a version mismatch between crates).
    #[error("loading the tree-sitter grammar for {language}: {reason}")]
    Grammar {
        /// The language whose grammar failed.
        language: &'static str,
        /// What tree-sitter said.
        reason: String,
    },
}

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { action, path: path.into(), source }
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
