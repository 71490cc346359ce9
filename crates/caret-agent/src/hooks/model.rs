//! What a hook is: the events it runs at, the tools it is about, its command, its file's
//! format, and what Caret could not take from a file.

use std::time::Duration;

/// Whose names and payloads a hook speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Caret's (`.caret/hooks.json`): Claude Code's format with Caret's tool names.
    Caret,
    /// Claude Code's settings files.
    Claude,
    /// Cursor's `hooks.json`.
    Cursor,
}

/// When a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookEvent {
    /// A session starts (or resumes).
    SessionStart,
    /// A person's request, before the model sees it: may add context or refuse it.
    UserPromptSubmit,
    /// Before a tool call: may allow it, refuse it, ask the person, or change its input.
    PreToolUse,
    /// After a tool call: may add context or tell the model what to fix.
    PostToolUse,
    /// The agent is about to wait for the person (it asks for an approval).
    Notification,
    /// The agent would end its turn: may make it go on (a few times a turn at most).
    Stop,
    /// A subagent would end.
    SubagentStop,
    /// Before older turns are summarised.
    PreCompact,
    /// The session ends.
    SessionEnd,
}

impl HookEvent {
    /// Every event.
    pub const ALL: [HookEvent; 9] = [
        HookEvent::SessionStart,
        HookEvent::UserPromptSubmit,
        HookEvent::PreToolUse,
        HookEvent::PostToolUse,
        HookEvent::Notification,
        HookEvent::Stop,
        HookEvent::SubagentStop,
        HookEvent::PreCompact,
        HookEvent::SessionEnd,
    ];

    /// Its name (Claude Code's, which Caret's files use too).
    pub fn name(self) -> &'static str {
        match self {
            HookEvent::SessionStart => "SessionStart",
            HookEvent::UserPromptSubmit => "UserPromptSubmit",
            HookEvent::PreToolUse => "PreToolUse",
            HookEvent::PostToolUse => "PostToolUse",
            HookEvent::Notification => "Notification",
            HookEvent::Stop => "Stop",
            HookEvent::SubagentStop => "SubagentStop",
            HookEvent::PreCompact => "PreCompact",
            HookEvent::SessionEnd => "SessionEnd",
        }
    }

    /// The event named `name`.
    pub fn parse(name: &str) -> Option<HookEvent> {
        HookEvent::ALL.into_iter().find(|e| e.name() == name)
    }
}

/// Which tools a hook is about, besides its matcher (Cursor's events name kinds of tools).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tools {
    /// Every tool (the matcher decides).
    Any,
    /// Terminal commands.
    Terminal,
    /// MCP servers' tools.
    Mcp,
    /// Reading a file.
    Read,
    /// Editing or writing a file.
    Edits,
}

impl Tools {
    /// Whether a call of `tool` is one of them.
    pub fn covers(self, tool: &str) -> bool {
        match self {
            Tools::Any => true,
            Tools::Terminal => tool == "run_terminal_cmd",
            Tools::Mcp => tool.starts_with("mcp__"),
            Tools::Read => tool == "read_file",
            Tools::Edits => matches!(tool, "edit_file" | "write_file"),
        }
    }
}

/// One hook.
#[derive(Debug, Clone)]
pub struct Hook {
    /// When it runs.
    pub event: HookEvent,
    /// The event's name in its file.
    pub native: String,
    /// Tool names it applies to, in its dialect's names (none: all).
    pub matcher: Option<regex::Regex>,
    /// Kinds of tools it applies to.
    pub tools: Tools,
    /// The `bash -c` line.
    pub command: String,
    /// How long it may run.
    pub timeout: Duration,
    /// Its file's format.
    pub dialect: Dialect,
    /// Its file (`.claude/settings.json`, `~/.cursor/hooks.json`…).
    pub source: String,
}

/// Something in a hook file Caret did not take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file.
    pub source: String,
    /// What.
    pub message: String,
}

impl Problem {
    /// A problem with `source`.
    pub fn new(source: &str, message: impl Into<String>) -> Problem {
        Problem { source: source.to_owned(), message: message.into() }
    }
}
