//! The client-side workspace core of Caret: everything that happens to a workspace before
//! anything leaves the machine.
//!
//! It walks a workspace honouring `.gitignore`, `.cursorignore`, `.caretignore` and default
//! excludes ([`walk`]), checks text for secrets ([`secrets`]), splits files into syntax-aware
//! chunks bounded in embedding-model tokens ([`chunk`], [`tokens`]), and keeps a Merkle tree of
//! file hashes ([`merkle`]) up to date through a persisted stat cache ([`statcache`]). The
//! [`scan`] module ties these together.
//!
//! This crate never touches the network, never follows a symlink out of the workspace root,
//! and never records a secret's value anywhere: findings carry a rule and a line only.

pub mod chunk;
pub mod merkle;
pub mod scan;
pub mod secrets;
pub mod statcache;
pub mod tokens;
pub mod walk;

mod error;
mod hash;
mod relpath;

pub use error::{Error, Result};
pub use hash::ContentHash;
pub use relpath::RelPath;
