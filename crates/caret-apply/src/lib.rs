//! Apply: turn a model's proposed edit into the exact new file.
//!
//! A file is read into a [`Text`] (lines plus the line ending, final newline and byte-order
//! mark it had, so writing it back changes only what the edit changed). Edits are located by
//! the [`matcher`]: exact first, then ignoring trailing whitespace, then ignoring indentation
//! (the edit's indentation is carried over to where it lands). Two equally good places are an
//! [`Error::Ambiguous`] naming them, never a guess.

mod error;
pub mod lazy;
pub mod matcher;
pub mod search_replace;
mod text;
pub mod udiff;

pub use error::{Error, Result};
pub use text::{Eol, Text};
