//! The coding agent: its tools, their execution in batches, approvals, and the turn loop.
//!
//! - [`tools`]: the tool trait, the registry, and the workspace tools (`read_file`,
//!   `list_dir`, `glob`, `grep`, `edit_file` (every `caret apply` format), `write_file`,
//!   `delete_file`, `todo_write`, `read_lints`, `run_terminal_cmd` in a `caret-sandbox`);
//!   outputs are truncated with a note saying so, paths cannot leave the workspace, writes are
//!   atomic and every change is recorded with a diff.
//! - [`batch`]: a model turn's tool calls run in batches: consecutive read-only calls
//!   concurrently, each mutating call alone and in the order given; results in call order.
//! - [`plan`]: plan mode (read-only tools, `submit_plan`, the approved plan as a todo list).
//! - [`policy`]: which commands run, ask or are refused (approvals and the operator's rules).
//! - [`skills`]: Agent Skills (`SKILL.md` folders): listed by name in the prompt, loaded on
//!   demand with `load_skill`; [`commands`]: custom slash commands (Markdown prompts with
//!   `$ARGUMENTS`); [`front_matter`]: the front matter those files share.
//! - [`subagents`]: the `task` tool: a subagent's own session (the read-only explorer, or one
//!   defined in `.caret/agents`/`.claude/agents`), its events nested, its tokens counted.
//! - [`hooks`]: commands run at the session's lifecycle events (Caret's, Claude Code's and
//!   Cursor's hook files), which may refuse, allow or change a tool call, add context, or make
//!   the agent go on.
//! - [`session`]: the turn loop, token accounting and compaction, persistence as JSON lines,
//!   and `serve`, which any front end drives with `Op`s and reads as `Event`s.
//!
//! It never knows about HTTP, LSP or terminals: `caret agent`, `caret exec`, the workspace
//! page and the server's agent sessions are its front ends.

pub mod batch;
pub mod commands;
pub mod front_matter;
pub mod hooks;
pub mod plan;
pub mod policy;
pub mod project_rules;
pub mod session;
pub mod skills;
pub mod subagents;
pub mod tools;
