//! The agent's protocol: submissions in ([`Op`]), events out ([`Event`]). Every front end —
//! the terminal UI, `caret exec` (JSON lines), the server's SSE stream — speaks it, and a
//! session is persisted as the JSON lines of these events.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a front end submits to a running agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    /// The user's message: starts a turn (or is queued until the current one ends).
    UserInput {
        /// The text.
        text: String,
    },
    /// Stop the current turn: the model call and running tools are cancelled.
    Interrupt,
    /// The answer to an [`Event::ApprovalRequest`].
    Approval {
        /// The tool call it answers.
        call_id: String,
        /// What the user decided.
        decision: Decision,
    },
    /// Plan first (only read-only tools run; the agent proposes a plan) or build.
    SetMode {
        /// The mode from the next model call on.
        mode: Mode,
    },
    /// Build the plan (as the person edited it): the session leaves plan mode, the plan's
    /// steps become its todo list, and a turn carries it out.
    ApprovePlan {
        /// The plan.
        plan: Plan,
    },
    /// End the session.
    Shutdown,
}

/// Whether the agent plans or builds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Every tool (under the policy and approvals).
    #[default]
    Build,
    /// Read-only tools only; the agent ends its turn with a plan for the person to approve.
    Plan,
}

/// A plan the agent proposes (and the person edits) before building.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// What will be done, in a sentence or two.
    pub summary: String,
    /// The steps, in order.
    pub steps: Vec<PlanStep>,
    /// What could go wrong, and what to watch.
    #[serde(default)]
    pub risks: Vec<String>,
}

/// One step of a [`Plan`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanStep {
    /// What the step does.
    pub title: String,
    /// The files it reads or changes (workspace-relative).
    #[serde(default)]
    pub files: Vec<String>,
    /// How, when it needs saying.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

/// An approval decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Run it, this once.
    Approve,
    /// Run it, and commands starting the same way for the rest of the session.
    ApproveForSession,
    /// Do not run it; the model is told it was refused.
    Deny,
}

/// What the agent tells its front ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    /// The session is ready.
    SessionConfigured {
        /// The session's id (what `--resume` takes).
        session_id: String,
        /// The model alias.
        model: String,
        /// The workspace root.
        cwd: String,
    },
    /// A turn starts (a user input was taken).
    TurnBegin {
        /// Turn number in the session, from 1.
        turn: u32,
    },
    /// A piece of the assistant's text, as it streams.
    TextDelta {
        /// The text.
        text: String,
    },
    /// A tool call starts.
    ToolCallBegin {
        /// The call's id (the model's).
        call_id: String,
        /// The tool.
        name: String,
        /// Its arguments as the model gave them.
        arguments: Value,
        /// The MCP server the tool comes from (none: a built-in tool).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        server: Option<String>,
    },
    /// A tool call ended.
    ToolCallEnd {
        /// The call's id.
        call_id: String,
        /// The tool.
        name: String,
        /// Whether it succeeded (a failure's output says why).
        ok: bool,
        /// What the model is told (truncated, with a note saying so).
        output: String,
        /// How long it ran.
        duration_ms: f64,
    },
    /// A file was changed by a tool.
    FileChange {
        /// Workspace-relative path.
        path: String,
        /// What happened.
        kind: ChangeKind,
        /// A unified diff of the change.
        diff: String,
    },
    /// The todo list changed.
    TodoUpdate {
        /// The whole list.
        items: Vec<TodoItem>,
    },
    /// A tool call waits for the user's decision (answer with [`Op::Approval`]).
    ApprovalRequest {
        /// The call.
        call_id: String,
        /// The command (or what the call does).
        command: String,
        /// Why it needs approval.
        reason: String,
    },
    /// Tokens used by a model call.
    TokenUsage {
        /// Prompt tokens.
        prompt_tokens: u32,
        /// Generated tokens.
        completion_tokens: u32,
        /// Prompt tokens of the whole conversation against the model's window, after this call.
        context_tokens: u32,
        /// The model's window.
        context_window: u32,
    },
    /// Older messages were replaced by a summary to stay within the model's window.
    Compacted {
        /// Messages before.
        messages_before: u32,
        /// Messages after (the summary counted as one).
        messages_after: u32,
        /// Estimated tokens of the conversation before.
        tokens_before: u32,
        /// Estimated tokens after.
        tokens_after: u32,
    },
    /// Something went wrong (the turn may go on).
    Error {
        /// What.
        message: String,
    },
    /// Project rules files now in the conversation: at the first turn those always applied
    /// (and those the size cap left out), later those attached for a file the session touched
    /// or fetched by the model.
    RulesApplied {
        /// Their names: paths from the repository root, or `~/AGENTS.md`.
        rules: Vec<String>,
        /// Files left out by the size cap.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        dropped: Vec<String>,
    },
    /// An event of a subagent (a `task` call's own session), nested under that call.
    Subagent {
        /// The `task` call that started it.
        call_id: String,
        /// The subagent (`explorer`, or one the project defines).
        agent: String,
        /// Its event.
        event: Box<Event>,
    },
    /// The session's mode changed (an [`Op::SetMode`], or an approved plan).
    ModeChanged {
        /// The mode now.
        mode: Mode,
    },
    /// In plan mode, the agent's plan: the person edits and approves it ([`Op::ApprovePlan`])
    /// or says what to change (a user input, still planning).
    PlanProposed {
        /// The plan.
        plan: Plan,
    },
    /// A hook ran (see `caret_agent::hooks`): at which event, from which file, how long it
    /// took and what it decided.
    HookRun {
        /// The event (`PreToolUse`, `Stop`…).
        event: String,
        /// The file that declared it (`.claude/settings.json`…).
        source: String,
        /// Its command.
        command: String,
        /// How long it ran, in milliseconds.
        ms: f64,
        /// `pass`, `allow`, `ask`, `block`, or `error` (it failed, timed out or died: it decided
        /// nothing).
        decision: String,
        /// Its reason, or what went wrong.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// Something the person should know that is neither an error nor the agent's answer (a
    /// hook's message, an MCP server left out at the start).
    Notice {
        /// What.
        message: String,
    },
    /// A turn ended.
    TurnEnd {
        /// Its number.
        turn: u32,
        /// Why.
        reason: TurnEnd,
    },
}

/// How a file changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Created.
    Add,
    /// Edited.
    Update,
    /// Deleted.
    Delete,
}

/// Why a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnEnd {
    /// The model answered without calling tools.
    Done,
    /// The user interrupted it.
    Interrupted,
    /// The step limit was reached.
    StepLimit,
    /// A model error the turn could not recover from.
    Failed,
}

/// One entry of the agent's todo list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TodoItem {
    /// Stable id.
    pub id: String,
    /// What to do.
    pub content: String,
    /// Where it stands.
    pub status: TodoStatus,
}

/// A todo's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    /// Not started.
    Pending,
    /// Being worked on.
    InProgress,
    /// Finished.
    Completed,
    /// Dropped.
    Cancelled,
}

/// `POST /v1/agent/sessions`: start a session in a workspace the server was configured with.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// A workspace name from the server's configuration.
    pub workspace: String,
    /// A model alias of the gateway (default: `agent`, else the first).
    pub model: Option<String>,
    /// `never`, `risky` (default) or `always`.
    pub approval: Option<String>,
    /// Model calls a turn may make (default 25).
    pub max_steps: Option<u32>,
}

/// The answer to [`CreateSession`].
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SessionCreated {
    /// The session's id.
    pub id: String,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn ops_and_events_are_tagged_json() {
        let op: Op = serde_json::from_value(json!({"type": "user_input", "text": "add a test"})).unwrap();
        assert_eq!(op, Op::UserInput { text: "add a test".into() });
        let op: Op =
            serde_json::from_value(json!({"type": "approval", "call_id": "c1", "decision": "approve_for_session"}))
                .unwrap();
        assert_eq!(op, Op::Approval { call_id: "c1".into(), decision: Decision::ApproveForSession });
        assert!(serde_json::from_value::<Op>(json!({"type": "user_input"})).is_err());
        assert!(serde_json::from_value::<Op>(json!({"type": "nope"})).is_err());
        let e = Event::TurnEnd { turn: 2, reason: TurnEnd::Interrupted };
        assert_eq!(serde_json::to_value(&e).unwrap(), json!({"type": "turn_end", "turn": 2, "reason": "interrupted"}));
        let todo = Event::TodoUpdate {
            items: vec![TodoItem { id: "1".into(), content: "write it".into(), status: TodoStatus::InProgress }],
        };
        let back: Event = serde_json::from_str(&serde_json::to_string(&todo).unwrap()).unwrap();
        assert_eq!(back, todo);
    }
}
