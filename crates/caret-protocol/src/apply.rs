//! `POST /v1/apply`: apply an edit to a file's text, in memory (nothing is stored).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An edit and the text it applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(example = serde_json::json!({
    "text": "def add(a, b):\n    return a - b\n",
    "edit": "<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n",
}))]
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
    /// A model alias of the server's gateway that merges a lazy snippet the matcher cannot
    /// place (with speculative edits); absent: such an edit is a 422.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// The new text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApplyResponse {
    /// The file's new text.
    pub text: String,
    /// The format the edit was read as.
    pub format: String,
    /// Whether the text changed.
    pub changed: bool,
    /// `matcher` (placed deterministically) or `model` (merged by a model).
    #[serde(default = "matcher")]
    pub method: String,
    /// How the model merge went, when a model merged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<MergeFacts>,
}

fn matcher() -> String {
    "matcher".to_owned()
}

/// How a model merge went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MergeFacts {
    /// The model alias.
    pub model: String,
    /// Why the matcher could not place the edit.
    pub reason: String,
    /// First and last line (1-based) of the region the model rewrote.
    pub region: [usize; 2],
    /// Tokens the model generated.
    pub generated_tokens: u32,
    /// Of those, taken from the speculative draft.
    pub accepted_prediction_tokens: u32,
    /// Draft tokens evaluated and rejected.
    pub rejected_prediction_tokens: u32,
}
