//! The coding agent (issue 8, in progress): its tools and their parallel execution.
//!
//! - [`tools`]: the tool trait, the registry, and the workspace tools (`read_file`,
//!   `list_dir`, `glob`, `grep`, `edit_file` (every `caret apply` format), `write_file`,
//!   `delete_file`, `todo_write`, `run_terminal_cmd` in a `caret-sandbox`); outputs are truncated with a note saying so, paths cannot
//!   leave the workspace, writes are atomic and every change is recorded with a diff.
//! - [`exec`]: a model turn's tool calls run in batches: consecutive read-only calls
//!   concurrently, each mutating call alone and in the order given; results in call order.

pub mod exec;
pub mod policy;
pub mod session;
pub mod tools;
