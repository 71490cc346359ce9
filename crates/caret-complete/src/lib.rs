//! Tab completion: everything between a keystroke and the model, and between the model and
//! the editor, that is not the model itself.
//!
//! - [`context`]: the prefix and suffix around the cursor, cut at line boundaries to a token
//!   budget that keeps the enclosing scope's head, plus snippets from other files.
//! - [`template`]: the fill-in-the-middle prompt for a model family (Qwen2.5-Coder,
//!   StarCoder2, DeepSeek-Coder, CodeLlama, or a custom one) and its stop tokens.
//! - [`post`]: single-line or multi-line from the cursor's situation; stop rules (end of
//!   line, end of block, an unbalanced closing bracket) applied while streaming; trimming of
//!   text the suffix already has.
//! - [`neighbours`]: snippets from other open and recently edited files, by similarity.
//! - [`debounce`]: how long to wait after a keystroke, from the user's rhythm.
//! - [`plan`]: all of the above for one request: prompt, mode, token limit, stopper.
//! - [`cache`]: serves the rest of a suggestion while the user types its first characters.
//! - [`engine`]: runs a plan against a model through the gateway and cuts its stream.
//! - [`next_edit`]: the edit likely next after the user's recent ones (Tab, Tab): recent
//!   edits, deterministic candidates, a Zeta-shaped prompt for a model; [`imports`]: the
//!   import a name the last edit brought in needs, as another open file has it; [`calls`]: a
//!   parameter added to a definition, carried to its calls.
//!
//! It knows nothing about LSP or HTTP: `caret lsp` and `POST /v1/complete` both call it.

pub mod cache;
pub mod calls;
pub mod context;
pub mod debounce;
pub mod engine;
pub mod imports;
pub mod neighbours;
pub mod next_edit;
pub mod plan;
pub mod post;
pub mod template;

pub use cache::Cache;
pub use context::{Budget, Context, Snippet};
pub use debounce::Debounce;
pub use neighbours::{Neighbour, Picking};
pub use plan::{Limits, Plan, plan};
pub use post::{Mode, Stopper};
pub use template::{Family, Template};

#[cfg(test)]
mod tests;
