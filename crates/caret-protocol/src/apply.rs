//! `POST /v1/apply`: apply an edit to a file's text, in memory (nothing is stored).

use serde::{Deserialize, Serialize};

/// An edit and the text it applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyRequest {
    /// The file's current text.
    pub text: String,
    /// The edit: search/replace blocks, a unified diff or a lazy snippet.
    pub edit: String,
    /// `lazy`, `search-replace` or `udiff`; absent: detected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// The file's path, to pick its part of a multi-file diff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// The new text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyResponse {
    /// The file's new text.
    pub text: String,
    /// The format the edit was read as.
    pub format: String,
    /// Whether the text changed.
    pub changed: bool,
}
