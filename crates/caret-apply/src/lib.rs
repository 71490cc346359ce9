//! Apply: turn a model's proposed edit into the exact new file.
//!
//! A file is read into a [`Text`] (lines plus the line ending, final newline and byte-order
//! mark it had, so writing it back changes only what the edit changed). Edits are located by
//! the [`matcher`]: exact first, then ignoring trailing whitespace, then ignoring indentation
//! (the edit's indentation is carried over to where it lands). Two equally good places are an
//! [`Error::Ambiguous`] naming them, never a guess.

mod align;
mod error;
pub mod lazy;
pub mod matcher;
pub mod merge;
pub mod patch;
pub mod search_replace;
mod text;
pub mod udiff;

pub use error::{Error, Result};
pub use text::{Eol, Text, line_counts};

/// An edit format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `<<<<<<< SEARCH` / `=======` / `>>>>>>> REPLACE` blocks.
    SearchReplace,
    /// A unified diff.
    Udiff,
    /// The new code with `... existing code ...` markers.
    Lazy,
    /// A `*** Begin Patch` envelope of several files' changes.
    Patch,
}

impl Format {
    /// The format's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::SearchReplace => "search-replace",
            Format::Udiff => "udiff",
            Format::Lazy => "lazy",
            Format::Patch => "patch",
        }
    }

    /// A format by name.
    pub fn parse(name: &str) -> Result<Format> {
        match name {
            "search-replace" => Ok(Format::SearchReplace),
            "udiff" | "diff" => Ok(Format::Udiff),
            "lazy" => Ok(Format::Lazy),
            "patch" => Ok(Format::Patch),
            other => {
                Err(Error::Malformed(format!("unknown edit format {other:?} (search-replace, udiff, lazy, patch)")))
            }
        }
    }

    /// The format an edit is written in, if it is recognisable.
    pub fn detect(edit: &str) -> Option<Format> {
        if patch::detect(edit) {
            Some(Format::Patch)
        } else if search_replace::detect(edit) {
            Some(Format::SearchReplace)
        } else if udiff::detect(edit) {
            Some(Format::Udiff)
        } else if lazy::detect(edit) {
            Some(Format::Lazy)
        } else {
            None
        }
    }
}

/// Applies an edit to one file. `format`: `None` to detect it; `path`: the file's path, to
/// pick its part of a multi-file diff.
pub fn apply(text: &Text, edit: &str, format: Option<Format>, path: Option<&str>) -> Result<(Text, Format)> {
    // A text file stays text: NUL bytes would make the result a binary file.
    if edit.contains('\0') {
        return Err(Error::Malformed("the edit contains NUL bytes".to_owned()));
    }
    let format = match format {
        Some(f) => f,
        None => Format::detect(edit).ok_or_else(|| {
            Error::Malformed(
                "cannot tell the edit's format (no SEARCH/REPLACE blocks, no @@ hunks, no `... existing code ...` \
                 markers); name it with --format"
                    .to_owned(),
            )
        })?,
    };
    let out = match format {
        Format::SearchReplace => search_replace::apply(text, &search_replace::parse(edit)?)?,
        Format::Lazy => lazy::apply(text, &lazy::parse(edit)?)?,
        Format::Patch => {
            return Err(Error::Malformed(
                "a patch envelope changes a tree, not one file: apply it to the workspace directory".to_owned(),
            ));
        }
        Format::Udiff => {
            let files = udiff::parse(edit)?;
            let diff = match files.as_slice() {
                [one] => one,
                many => {
                    let wanted = path.unwrap_or_default();
                    let named = |p: &Option<String>| {
                        p.as_deref().is_some_and(|p| !wanted.is_empty() && (wanted.ends_with(p) || p.ends_with(wanted)))
                    };
                    many.iter().find(|f| named(&f.new_path) || named(&f.old_path)).ok_or_else(|| {
                        Error::Malformed(format!("the diff has {} files and none is {wanted:?}", many.len()))
                    })?
                }
            };
            udiff::apply(text, diff)?
        }
    };
    Ok((out, format))
}
