//! `POST /v1/complete`: a Tab suggestion at a cursor, with the server's engine (the same
//! context rules, templates and stop rules as an embedded `caret lsp`). Nothing is stored.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A document and a cursor in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The document's text, or the part of it around the cursor a client sends (the context
    /// is cut from it).
    pub text: String,
    /// The cursor: a byte offset into `text` (clamped to a character boundary).
    pub cursor: usize,
    /// The file's workspace-relative path (or name), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Other files' snippets, most useful first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snippets: Vec<TabSnippet>,
    /// The model alias; absent: `tab`, else the server's first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The fill-in-the-middle format (`qwen-coder`, `star-coder2`, `deep-seek-coder`,
    /// `code-llama`, `none`); absent: guessed from the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    /// The context budget in tokens; absent: the engine's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<usize>,
}

/// A piece of another file sent as context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TabSnippet {
    /// Workspace-relative path.
    pub path: String,
    /// The text.
    pub text: String,
}

/// The suggestion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CompleteResponse {
    /// The text to insert at the cursor (empty: nothing to suggest).
    pub text: String,
    /// Whether it may span lines.
    pub multiline: bool,
    /// The model alias that answered.
    pub model: String,
    /// Milliseconds to the first streamed text.
    pub first_text_ms: f64,
    /// Milliseconds to the suggestion.
    pub total_ms: f64,
    /// Pieces of text the model streamed before it was stopped.
    pub generated_chunks: usize,
}
