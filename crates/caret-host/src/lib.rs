//! What every front end of Caret shares: the one [`config::Config`] (a TOML file, `CARET_*`
//! overrides), the async [`runtime`], the embedded-or-remote model [`backend`] and index
//! server ([`remote`]), the local [`daemon`] that keeps the embedded server warm and [`watch`]es
//! workspaces for change (what scans and syncs keep to answer from it: [`unchanged`]), workspace
//! [`search`] and documentation sources ([`docs`]), the Tab [`completer`] and the editor's open [`documents`], agent
//! [`session`]s with the hooks ([`hooks`]), skills, commands and subagents ([`conventions`])
//! developers bring from other agents, attempts side by side in git [`worktrees`], background
//! [`runs`], and collecting a model's merge of an edit ([`merge`]).
//!
//! The command line, the language server, the workspace page, the benchmarks and the
//! rollout CLI all stand on this crate; none of them reaches into another. It never parses
//! command-line arguments and never prints: front ends do both (a long-running part that
//! logs, like the daemon, is handed where its lines go).

pub mod backend;
pub mod completer;
pub mod config;
pub mod conventions;
pub mod credentials;
pub mod daemon;
pub mod docs;
pub mod docs_refresh;
pub mod documents;
pub mod hooks;
pub mod mcp;
pub mod mcp_server;
pub mod mcp_tokens;
pub mod merge;
pub mod remote;
pub mod runs;
pub mod runtime;
pub mod search;
pub mod session;
pub mod team_docs;
pub mod unchanged;
pub mod units;
pub mod watch;
pub mod worktrees;
