//! Errors of applying an edit: each says what did not fit and where to look.

/// Why an edit could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The edit itself is malformed.
    #[error("the edit is malformed: {0}")]
    Malformed(String),
    /// An anchor (a search block, a diff hunk's context) is nowhere in the file.
    #[error("no place in the file matches:\n{anchor}")]
    NoMatch {
        /// The text looked for (first lines).
        anchor: String,
    },
    /// An anchor fits several places equally well.
    #[error("the edit fits {} places equally well (lines {}):\n{anchor}", lines.len(), join_lines(lines))]
    Ambiguous {
        /// The text looked for (first lines).
        anchor: String,
        /// 1-based first lines of the candidates.
        lines: Vec<usize>,
    },
    /// The file is not text.
    #[error("not a text file: {0}")]
    NotText(String),
}

impl Error {
    /// Whether the edit is well formed but could not be placed (no place, or several): the
    /// case a model merge can still handle for a lazy snippet.
    pub fn is_unplaced(&self) -> bool {
        matches!(self, Error::NoMatch { .. } | Error::Ambiguous { .. })
    }
}

fn join_lines(lines: &[usize]) -> String {
    lines.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The first lines of an anchor, for error messages.
pub(crate) fn excerpt(lines: &[&str]) -> String {
    const MAX: usize = 6;
    let mut s = lines.iter().take(MAX).copied().collect::<Vec<_>>().join("\n");
    if lines.len() > MAX {
        s.push_str(&format!("\n… ({} more lines)", lines.len() - MAX));
    }
    s
}
