//! The environment API for external trainers: an episode is a rollout whose model is the
//! caller. `POST /v1/envs` starts one and answers the first observation (system prompt, tools,
//! the task, exactly as the agent sends them to a model); `POST /v1/envs/{id}/step` takes the
//! policy's assistant message and answers what the tools said; `POST /v1/envs/{id}/grade` ends
//! the agent's turn, runs the grader and answers the reward; `DELETE /v1/envs/{id}` ends it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::llm::{ChatMessage, Tool};
use crate::runs::{RepoSource, RunEnvironment, RunLimits, RunState, TestOutcome};

/// `POST /v1/envs`: a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEnv {
    /// The code (a git URL the workers can reach, or an uploaded bundle).
    pub repo: RepoSource,
    /// The task, as a user would write it.
    pub prompt: String,
    /// Run in the sandbox at grading: exit 0 is reward 1, else 0, unless it prints a reward.
    pub grader: Grader,
    /// Bounds of the episode (default: a run's).
    #[serde(default)]
    pub limits: Option<RunLimits>,
    /// Setup, variables, allowed hosts.
    #[serde(default)]
    pub environment: Option<RunEnvironment>,
}

/// A task's grader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Grader {
    /// The command.
    pub command: String,
    /// Its time limit (default 600 s).
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

/// What the policy sees: the start of the conversation, or what a step added to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Observation {
    /// The episode.
    pub episode: String,
    /// The run behind it (its events and result are a run's).
    pub run: String,
    /// The tool definitions (on the first observation; empty after).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// New messages: the system prompt and the task first, then the tools' results (and any
    /// message the agent adds, as it would for a model).
    pub messages: Vec<ChatMessage>,
    /// The agent's turn is over (no model call is waiting): grade next.
    pub done: bool,
    /// Where the run is.
    pub state: RunState,
    /// Why the run ended, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Server-side time of this call, outside the wait for the worker (ms).
    pub server_ms: f64,
    /// Time waiting for the worker: the tools' own time and the way there and back (ms).
    pub worker_ms: f64,
}

/// `POST /v1/envs/{id}/step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// The policy's answer: an assistant message, with the tool calls to run.
    pub message: ChatMessage,
}

/// `POST /v1/envs/{id}/grade` → the reward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Graded {
    /// The episode.
    pub episode: String,
    /// The reward (none: not graded for the environment's sake; see `failure`).
    pub reward: Option<f64>,
    /// Why it was not graded normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The grader's run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grader: Option<TestOutcome>,
    /// The run's end.
    pub state: RunState,
    /// The changes the episode made, as a patch.
    pub patch: String,
}

/// `GET /v1/envs`: a tenant's open episodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EnvList {
    /// Episode ids with their runs.
    pub episodes: Vec<EnvInfo>,
}

/// An open episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EnvInfo {
    /// The episode.
    pub episode: String,
    /// Its run.
    pub run: String,
    /// Seconds since the policy last used it.
    pub idle_s: f64,
}
