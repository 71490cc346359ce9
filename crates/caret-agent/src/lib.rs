//! The coding agent (issue 8, first part): its tools and their parallel execution.
//!
//! - [`tools`]: the tool trait, the registry, and the workspace tools (`read_file`,
//!   `list_dir`, `glob`, `grep`); outputs are truncated with a note saying so, and paths
//!   cannot leave the workspace.
//! - [`exec`]: a model turn's tool calls run in batches: consecutive read-only calls
//!   concurrently, each mutating call alone and in the order given; results in call order.

pub mod exec;
pub mod tools;
