//! Background runs (Anyrun): what a user submits (`POST /v1/runs`), what they read back
//! (run info, events, the result), and what a worker and the server say to each other
//! (leases, heartbeats, event batches, completion).
//!
//! A run's events are the agent protocol's [`Event`]s plus the run's own lifecycle
//! ([`RunStatus`]), one JSON object each with a `type` field, numbered from 1 per run so that
//! a reader can resume after the last number it saw.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::agent::Event;

/// Where a run's code comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RepoSource {
    /// A repository the workers can reach: `file://…` or `https://…`.
    Git {
        /// The URL.
        url: String,
        /// A branch, tag or commit (default: the remote's HEAD).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        git_ref: Option<String>,
    },
    /// An uploaded `git bundle` of the local HEAD plus the uncommitted changes as a patch.
    Bundle {
        /// The bundle's bytes, base64 (standard alphabet).
        bundle: String,
        /// The commit the bundle's HEAD names (checked after unpacking).
        head: String,
        /// `git diff --binary HEAD` of the working tree, untracked files included.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        patch: String,
    },
}

/// Priority classes: interactive runs are always leased before batch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunClass {
    /// A person waits for it (`caret run`).
    #[default]
    Interactive,
    /// Evaluations, rollouts, bulk jobs.
    Batch,
}

impl RunClass {
    /// The name used on the wire and in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            RunClass::Interactive => "interactive",
            RunClass::Batch => "batch",
        }
    }

    /// The class of a name.
    pub fn parse(s: &str) -> Option<RunClass> {
        match s {
            "interactive" => Some(RunClass::Interactive),
            "batch" => Some(RunClass::Batch),
            _ => None,
        }
    }
}

/// Bounds on one run (each attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RunLimits {
    /// Wall time of an attempt, setup included, in seconds.
    pub wall_time_s: u64,
    /// Model tokens (prompt + completion) the run may use.
    pub model_tokens: u64,
    /// Model calls the agent may make.
    pub steps: u32,
    /// Disk the run's directory may take (checkout, what its commands write), in bytes.
    pub disk_bytes: u64,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits { wall_time_s: 1800, model_tokens: 2_000_000, steps: 50, disk_bytes: 10 << 30 }
    }
}

/// The environment a run prepares before the agent starts (added to what the repository's
/// `.caret/environment.toml` says).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RunEnvironment {
    /// Commands run in order in the sandbox before the agent (after the repository's own).
    pub setup: Vec<String>,
    /// Environment variables of every command.
    pub env: BTreeMap<String, String>,
    /// Names of the tenant's stored secrets to inject as environment variables.
    pub secrets: Vec<String>,
    /// A command run after the agent whose output is kept in the result (the tests; a
    /// rollout's grader).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test: Option<String>,
    /// The test command's own time limit, seconds (default: what is left of the wall time,
    /// at most 30 minutes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_timeout_s: Option<u64>,
    /// Whether commands may use the network (all of it).
    pub network: bool,
    /// Without the network, the hosts commands may still reach through the worker's proxy
    /// (`example.com`, `*.example.com`, an address, each with an optional `:port`; without
    /// one, ports 80 and 443).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// MCP servers whose tools the agent gets, by name (besides those of the repository's
    /// `.caret/environment.toml`, `.caret/mcp.json` and `.cursor/mcp.json`; a name here wins).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp_servers: BTreeMap<String, RunMcpServer>,
}

/// An MCP server of a run: a program run in the run's sandbox, under its network rules
/// (`command`), or a remote server reached through the run's allowed hosts (`url`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RunMcpServer {
    /// The program of a server spoken to over stdio, run in the checkout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Its environment, besides the run's.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// A remote server's URL (Streamable HTTP); its host must be allowed (`hosts`, or
    /// `network`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Headers sent to a remote server with every request.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// The run's variable (one of its `env` or `secrets`) holding a remote server's bearer
    /// token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bearer_token_env: Option<String>,
    /// How long a call may take, seconds (default 60).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_timeout_s: Option<u64>,
}

/// `POST /v1/runs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    /// Where the code comes from.
    pub repo: RepoSource,
    /// What the agent is asked to do.
    pub task: String,
    /// A model alias of the gateway (default: `agent`, else the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Bounds.
    #[serde(default)]
    pub limits: RunLimits,
    /// The environment.
    #[serde(default)]
    pub environment: RunEnvironment,
    /// Priority class.
    #[serde(default)]
    pub class: RunClass,
    /// Push the finished run's changes as a branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushTarget>,
    /// A stored secret holding an https token for the repository's host: used to clone a git
    /// source and to push, never put in the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_credential: Option<String>,
    /// Sampling and recording for rollouts (evaluation, RL); none: a user's run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutOptions>,
}

/// What a rollout run does besides a user's: how its model is sampled, and keeping the
/// conversation exactly as the model saw it. Tools, prompt, sandbox and limits stay the same.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutOptions {
    /// Sampling temperature (none: the agent's, 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Sampling seed (a seeded rollout on the local engine is reproducible).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Keep the transcript (tool definitions and every message) in the result.
    pub transcript: bool,
    /// Ask the model for token ids and log probabilities, and keep the token view in the
    /// transcript.
    pub tokens: bool,
    /// The model is an external policy answering through the environment API (`/v1/envs`);
    /// set by the server only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub policy: bool,
}

/// A run's conversation as the model saw it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Transcript {
    /// The tool definitions every model call carried.
    pub tools: Vec<crate::llm::Tool>,
    /// The messages, system prompt first.
    pub messages: Vec<crate::llm::ChatMessage>,
    /// The sampling used.
    pub temperature: Option<f64>,
    /// The seed used.
    pub seed: Option<u64>,
    /// The conversation as token ids, when they were asked for and the engine gave them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenView>,
    /// Why there is no token view although one was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_missing: Option<String>,
    /// Without a token view: the log probabilities of each model call's sampled tokens, where
    /// the provider gave them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<Vec<f32>>,
}

/// What one model call read and sampled, in token ids.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CallTokens {
    /// The whole prompt.
    pub prompt_ids: Vec<u32>,
    /// The sampled tokens (the turn's end token included when the model ended so).
    pub ids: Vec<u32>,
    /// Their log probabilities (empty when not given).
    pub logprobs: Vec<f32>,
}

/// A multi-turn conversation in the layout RL trainers consume (verl's agent loop output,
/// SkyRL's generator output): the first prompt, then everything after it as one response
/// whose mask tells the model's sampled tokens (1) from tool output and template (0).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TokenView {
    /// The first model call's prompt.
    pub prompt_ids: Vec<u32>,
    /// Every token after it: sampled answers, tool results, template.
    pub response_ids: Vec<u32>,
    /// 1 for a token the model sampled, 0 for the rest.
    pub response_mask: Vec<u8>,
    /// The sampling log probability of each sampled token; 0 for the rest.
    pub response_logprobs: Vec<f32>,
}

impl TokenView {
    /// Joins the calls of one conversation: each call's prompt must begin with the previous
    /// prompt and answer (the ids carried through, never tokenised again); what it adds is
    /// masked 0, its sampled tokens 1.
    pub fn assemble(calls: &[CallTokens]) -> Result<TokenView, String> {
        let first = calls.first().ok_or("no model call")?;
        let mut view = TokenView { prompt_ids: first.prompt_ids.clone(), ..TokenView::default() };
        for (i, call) in calls.iter().enumerate() {
            if call.ids.is_empty() {
                return Err(format!("model call {} gave no token ids", i + 1));
            }
            if !call.logprobs.is_empty() && call.logprobs.len() != call.ids.len() {
                return Err(format!(
                    "model call {} gave {} log probabilities for {} tokens",
                    i + 1,
                    call.logprobs.len(),
                    call.ids.len()
                ));
            }
            let so_far = view.prompt_ids.len() + view.response_ids.len();
            let extends = call.prompt_ids.len() >= so_far
                && call.prompt_ids[..view.prompt_ids.len()] == view.prompt_ids[..]
                && call.prompt_ids[view.prompt_ids.len()..so_far] == view.response_ids[..];
            if !extends {
                return Err(format!(
                    "model call {}'s prompt does not continue the conversation's tokens (it was compacted or \
                     rewritten)",
                    i + 1
                ));
            }
            let added = &call.prompt_ids[so_far..];
            view.response_ids.extend_from_slice(added);
            view.response_mask.extend(std::iter::repeat_n(0, added.len()));
            view.response_logprobs.extend(std::iter::repeat_n(0.0, added.len()));
            view.response_ids.extend_from_slice(&call.ids);
            view.response_mask.extend(std::iter::repeat_n(1, call.ids.len()));
            if call.logprobs.is_empty() {
                view.response_logprobs.extend(std::iter::repeat_n(0.0, call.ids.len()));
            } else {
                view.response_logprobs.extend_from_slice(&call.logprobs);
            }
        }
        Ok(view)
    }
}

/// Where a run's changes are pushed when it succeeds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PushTarget {
    /// The remote (`file://`, `https://`; default: a git source's URL; an uploaded bundle
    /// needs one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The branch (default `caret/<run id>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

/// What a push did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PushOutcome {
    /// The remote.
    pub url: String,
    /// The branch.
    pub branch: String,
    /// The commit pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Waiting for a worker.
    Queued,
    /// Leased to a worker.
    Running,
    /// The agent finished and the result is stored.
    Succeeded,
    /// It could not finish (the reason says why).
    Failed,
    /// Cancelled by the user.
    Cancelled,
}

impl RunState {
    /// The name used on the wire and in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::Running => "running",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
        }
    }

    /// The state of a name.
    pub fn parse(s: &str) -> Option<RunState> {
        [RunState::Queued, RunState::Running, RunState::Succeeded, RunState::Failed, RunState::Cancelled]
            .into_iter()
            .find(|state| state.as_str() == s)
    }

    /// Whether the run has ended.
    pub fn is_final(self) -> bool {
        matches!(self, RunState::Succeeded | RunState::Failed | RunState::Cancelled)
    }
}

/// A run as `GET /v1/runs/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunInfo {
    /// Its id.
    pub id: String,
    /// Where it is.
    pub state: RunState,
    /// Its class.
    pub class: RunClass,
    /// The task.
    pub task: String,
    /// The model alias.
    pub model: String,
    /// Attempts started so far (a worker lost mid-run means another attempt).
    pub attempt: u32,
    /// The most attempts.
    pub max_attempts: u32,
    /// The worker holding it now, while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// Why it failed or was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A cancel was asked for and has not yet reached the worker.
    #[serde(default)]
    pub cancel_requested: bool,
    /// When it was submitted, started (the last attempt) and ended: Unix milliseconds.
    pub created_ms: i64,
    /// See `created_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<i64>,
    /// See `created_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<i64>,
    /// Model tokens used (all attempts).
    pub tokens_used: u64,
    /// Events so far.
    pub events: u64,
}

/// `GET /v1/runs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunList {
    /// Newest first.
    pub runs: Vec<RunInfo>,
}

/// The run's own lifecycle events, beside the agent's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RunStatus {
    /// A worker leased it.
    RunStarted {
        /// Attempt number, from 1.
        attempt: u32,
        /// The worker.
        worker: String,
    },
    /// An environment step ran.
    SetupStep {
        /// The command.
        command: String,
        /// Its exit code (none: killed).
        exit_code: Option<i32>,
        /// The end of its output.
        output: String,
        /// Milliseconds.
        duration_ms: u64,
    },
    /// The environment's install step was skipped: the workspace started from a snapshot of
    /// its outputs (`saved: false`); or a cold run kept its outputs as one (`saved: true`).
    Snapshot {
        /// Saved now (a cold run), rather than started from.
        saved: bool,
        /// How the workspace was made: `overlay` or `copy`.
        method: String,
        /// Milliseconds it took.
        duration_ms: u64,
    },
    /// The attempt continues from an earlier attempt's checkpoint: its changes are in the
    /// workspace and, when `conversation`, the agent carries on its conversation.
    Resumed {
        /// Files the checkpoint had changed.
        files: u32,
        /// Whether the conversation was picked up too.
        conversation: bool,
    },
    /// An MCP server of the run answered, or did not: `status` says how (`ready (2 tools,
    /// MCP 2026-07-28)`, or why its tools are missing).
    McpServer {
        /// Its name.
        name: String,
        /// Whether its tools are offered.
        ready: bool,
        /// What happened, in words.
        status: String,
    },
    /// A docs crawl's counts so far.
    DocsProgress {
        /// What it has counted.
        counts: crate::docs::DocsCounts,
    },
    /// The run's attempt gave up for a reason outside the agent (a worker lost, say); another
    /// attempt follows if any are left.
    AttemptLost {
        /// Attempt number.
        attempt: u32,
        /// Why.
        reason: String,
    },
    /// The run ended.
    RunFinished {
        /// How.
        state: RunState,
        /// Why, when it did not succeed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// One event of a run: its lifecycle or the agent's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RunEvent {
    /// The run's lifecycle.
    Run(RunStatus),
    /// The agent's.
    Agent(Event),
}

/// A numbered event, as `GET /v1/runs/{id}/events` sends it (the SSE `id` is `seq`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NumberedEvent {
    /// From 1, per run.
    pub seq: u64,
    /// The attempt that produced it.
    pub attempt: u32,
    /// The event.
    pub event: RunEvent,
}

/// What a finished run produced (`GET /v1/runs/{id}/result`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunResult {
    /// The changes as a patch against the submitted tree (`git apply` form; empty: none).
    pub patch: String,
    /// Files the patch changes.
    pub files: Vec<String>,
    /// The agent's last message.
    pub final_message: String,
    /// How the agent's turn ended (`done`, `step_limit`, ...).
    pub turn_end: String,
    /// The output of the environment's test command, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<TestOutcome>,
    /// Model usage of the attempt that produced this.
    pub usage: Usage,
    /// Where the time went, in milliseconds.
    pub timings: Timings,
    /// The push asked for, and what came of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushOutcome>,
    /// The conversation, when the run asked for it (rollouts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript: Option<Transcript>,
}

/// The environment's test command after the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TestOutcome {
    /// The command.
    pub command: String,
    /// Exit code (none: killed).
    pub exit_code: Option<i32>,
    /// Killed at its time limit.
    #[serde(default)]
    pub timed_out: bool,
    /// The end of its output.
    pub output: String,
}

/// Model usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "RunUsage")]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Model calls.
    pub calls: u32,
}

/// Where an attempt's time went, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Timings {
    /// From the lease to a ready workspace (code unpacked, sandbox up).
    pub launch_ms: u64,
    /// Environment steps.
    pub setup_ms: u64,
    /// From the lease to the first model call.
    pub first_model_call_ms: u64,
    /// The agent.
    pub agent_ms: u64,
    /// The test command.
    pub test_ms: u64,
    /// The whole attempt.
    pub total_ms: u64,
    /// The workspace started from a snapshot of its prepared environment (no install).
    #[serde(default)]
    pub warm: bool,
}

/// `PUT /v1/secrets/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PutSecret {
    /// The value (stored encrypted; never shown again).
    pub value: String,
}

/// `GET /v1/secrets`: names only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SecretList {
    /// Names, sorted.
    pub names: Vec<String>,
}

// ---- between workers and the server ----

/// `POST /v1/workers/lease`: a worker with a free slot asks for a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// The worker's name (unique per process: host and pid, say).
    pub worker: String,
    /// Its slots in all.
    pub slots: u32,
    /// Slots busy now (this request's not counted).
    pub busy: u32,
    /// The sandbox backend it runs.
    pub sandbox: String,
}

/// What identifies a lease in every later call: the run and its fencing token.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct LeaseRef {
    /// The run.
    pub run: String,
    /// The lease's fencing token: larger for every new lease of the run; a call with an older
    /// one is refused.
    pub token: u64,
}

/// A leased run: everything a worker needs to execute it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Lease {
    /// The lease.
    pub lease: LeaseRef,
    /// The tenant (for the worker's logs and per-tenant directories; never sent to a model).
    pub tenant: String,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// The task.
    pub task: String,
    /// The model alias.
    pub model: String,
    /// Bounds.
    pub limits: RunLimits,
    /// Where the code comes from (a bundle's bytes are fetched separately, so this holds
    /// its `head` and `patch` with an empty `bundle`).
    pub repo: RepoSource,
    /// The environment, with `secrets` resolved into `secret_values`.
    pub environment: RunEnvironment,
    /// Secret values by name (to inject, and to redact from everything the run reports).
    pub secret_values: BTreeMap<String, String>,
    /// Seconds the lease lasts without a heartbeat.
    pub lease_ttl_s: u64,
    /// Model tokens the run has already used (earlier attempts).
    pub tokens_used: u64,
    /// Where to push the changes when the run succeeds (url and branch resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushTarget>,
    /// The https token for the repository's host, when the run names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_credential: Option<String>,
    /// Where an earlier attempt got to, when one left a checkpoint: this attempt continues
    /// from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<RunCheckpoint>,
    /// Sampling and recording, for a rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutOptions>,
    /// The W3C trace context of the request that queued the run, when traces are exported:
    /// the attempt's spans continue that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// A documentation crawl instead of an agent: the worker crawls the site through an
    /// allow-list proxy of its own and completes with the pages (the run's bundle holds the
    /// source's page state, for conditional requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docs: Option<DocsCrawl>,
}

/// A team docs source's crawl, run by a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DocsCrawl {
    /// The source's name (for the worker's logs).
    pub source: String,
    /// Where the crawl starts.
    pub url: String,
    /// Only URLs starting with this are pages of the source.
    pub prefix: String,
    /// Links followed from the start, at most.
    pub depth: u32,
    /// Pages kept, at most.
    pub max_pages: u64,
    /// Requests a second, at most.
    pub rate: f64,
}

/// What a docs crawl brings back (with its completion).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DocsCrawled {
    /// The source's page state after the crawl (URLs, validators, hashes, headings), JSON.
    pub state: String,
    /// The crawl's counts.
    pub counts: crate::docs::DocsCounts,
    /// The pages new or changed since the state the crawl started from: a JSON object of page
    /// file → Markdown, gzipped, base64.
    pub pages: String,
}

/// A run's work so far, saved after each agent step so that another attempt can continue it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunCheckpoint {
    /// The changes against the base commit (`git diff --binary`).
    pub patch: String,
    /// The agent's conversation so far (the session file: a header line, then one message
    /// per line).
    pub transcript: String,
}

/// `POST /v1/workers/runs/{id}/checkpoint` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointBody {
    /// The lease.
    pub lease: LeaseRef,
    /// The checkpoint.
    pub checkpoint: RunCheckpoint,
}

/// `POST /v1/workers/runs/{id}/heartbeat` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HeartbeatAnswer {
    /// The user cancelled the run: stop it and complete it as cancelled.
    pub cancel: bool,
}

/// `POST /v1/workers/runs/{id}/heartbeat` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// The lease.
    pub lease: LeaseRef,
    /// What the run's sandbox uses now, where the worker can tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<SandboxUsage>,
}

/// What a run's sandbox uses at one moment: its live processes and their memory, and the CPU
/// time they have had.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxUsage {
    /// Processes alive in the sandbox.
    pub processes: u32,
    /// Their resident memory, bytes.
    pub memory_bytes: u64,
    /// CPU time (user + system) of those processes, milliseconds.
    pub cpu_ms: u64,
}

/// `POST /v1/workers/runs/{id}/events` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventBatch {
    /// The lease.
    pub lease: LeaseRef,
    /// Events in order.
    pub events: Vec<RunEvent>,
}

/// `POST /v1/workers/runs/{id}/complete` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Completion {
    /// The lease.
    pub lease: LeaseRef,
    /// `succeeded`, `failed` or `cancelled`.
    pub state: RunState,
    /// Why, when not succeeded.
    #[serde(default)]
    pub reason: Option<String>,
    /// Whether the failure was the environment's (a sandbox that would not start, say) rather
    /// than the run's own: another attempt is made if any are left.
    #[serde(default)]
    pub retry: bool,
    /// The result (also for a failed run: what it had done).
    pub result: Option<RunResult>,
    /// A docs crawl's pages and state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docs: Option<DocsCrawled>,
}

/// The workers the server has heard from, for operators (`GET /v1/fleet`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Fleet {
    /// Workers seen recently.
    pub workers: Vec<WorkerInfo>,
    /// Runs by state, class and tenant.
    pub queue: Vec<QueueDepth>,
    /// Runs now running.
    pub running: Vec<RunningRun>,
    /// The most recent runs that ended.
    pub recent: Vec<EndedRun>,
    /// When this view was taken, Unix milliseconds.
    #[serde(default)]
    pub at_ms: i64,
}

/// A run that ended, for operators: whose, how it ended, how long it took — not its task
/// (tenants' words are not operators' to read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EndedRun {
    /// The run.
    pub id: String,
    /// Tenant name.
    pub tenant: String,
    /// Class.
    pub class: RunClass,
    /// How it ended.
    pub state: RunState,
    /// Attempts it took.
    pub attempt: u32,
    /// Why it failed or was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Submitted, Unix milliseconds.
    pub created_ms: i64,
    /// Its last attempt started (none: cancelled while queued).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<i64>,
    /// Ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<i64>,
    /// Model tokens used.
    pub tokens_used: u64,
}

/// One worker as the server last heard of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkerInfo {
    /// Its name.
    pub name: String,
    /// Slots in all.
    pub slots: u32,
    /// Slots busy.
    pub busy: u32,
    /// Sandbox backend.
    pub sandbox: String,
    /// Milliseconds since it was last heard from.
    pub last_seen_ms_ago: i64,
}

/// Queued or running runs of one class and tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QueueDepth {
    /// Class.
    pub class: RunClass,
    /// Tenant name.
    pub tenant: String,
    /// Queued.
    pub queued: u64,
    /// Running.
    pub running: u64,
}

/// A running run, for operators: which worker, whose, how old.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunningRun {
    /// The run.
    pub id: String,
    /// Tenant name.
    pub tenant: String,
    /// Class.
    pub class: RunClass,
    /// The worker.
    pub worker: String,
    /// Attempt.
    pub attempt: u32,
    /// Milliseconds since this attempt started.
    pub age_ms: i64,
    /// What its sandbox used at the last heartbeat (none before the first).
    #[serde(default)]
    pub usage: Option<SandboxUsage>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_events_of_both_kinds_round_trip_through_one_stream() {
        let events = vec![
            RunEvent::Run(RunStatus::RunStarted { attempt: 1, worker: "w".into() }),
            RunEvent::Agent(Event::TextDelta { text: "hi".into() }),
            RunEvent::Run(RunStatus::RunFinished { state: RunState::Succeeded, reason: None }),
        ];
        let text = serde_json::to_string(&events).unwrap();
        assert_eq!(
            text,
            r#"[{"type":"run_started","attempt":1,"worker":"w"},{"type":"text_delta","text":"hi"},{"type":"run_finished","state":"succeeded"}]"#
        );
        let back: Vec<RunEvent> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, events);
    }

    #[test]
    fn a_minimal_create_request_takes_the_defaults() {
        let req: CreateRun =
            serde_json::from_str(r#"{"repo":{"kind":"git","url":"file:///r"},"task":"fix it"}"#).unwrap();
        assert_eq!(req.class, RunClass::Interactive);
        assert_eq!(req.limits, RunLimits::default());
        assert!(serde_json::from_str::<CreateRun>(r#"{"repo":{"kind":"git","url":"x"},"task":"t","x":1}"#).is_err());
    }

    #[test]
    fn a_token_view_masks_sampled_tokens_1_and_what_came_between_0() {
        let calls = [
            CallTokens { prompt_ids: vec![1, 2, 3], ids: vec![10, 11], logprobs: vec![-0.5, -0.25] },
            // The tool's answer and the template (20, 21) after the first answer.
            CallTokens { prompt_ids: vec![1, 2, 3, 10, 11, 20, 21], ids: vec![12], logprobs: vec![-1.0] },
        ];
        let view = TokenView::assemble(&calls).unwrap();
        assert_eq!(view.prompt_ids, [1, 2, 3]);
        assert_eq!(view.response_ids, [10, 11, 20, 21, 12]);
        assert_eq!(view.response_mask, [1, 1, 0, 0, 1]);
        assert_eq!(view.response_logprobs, [-0.5, -0.25, 0.0, 0.0, -1.0]);
    }

    #[test]
    fn a_token_view_refuses_a_prompt_that_does_not_continue_the_conversation() {
        let first = CallTokens { prompt_ids: vec![1, 2], ids: vec![10], logprobs: vec![] };
        // Re-tokenised: the sampled 10 came back as 9.
        let rewritten = CallTokens { prompt_ids: vec![1, 2, 9, 20], ids: vec![11], logprobs: vec![] };
        let e = TokenView::assemble(&[first.clone(), rewritten]).unwrap_err();
        assert!(e.contains("call 2") && e.contains("does not continue"), "{e}");
        let short = CallTokens { prompt_ids: vec![1], ids: vec![11], logprobs: vec![] };
        assert!(TokenView::assemble(&[first.clone(), short]).is_err());
        let no_ids = CallTokens { prompt_ids: vec![1, 2, 10], ids: vec![], logprobs: vec![] };
        assert!(TokenView::assemble(&[first.clone(), no_ids]).unwrap_err().contains("no token ids"));
        let odd = CallTokens { prompt_ids: vec![1, 2], ids: vec![10, 11], logprobs: vec![-1.0] };
        assert!(TokenView::assemble(&[odd]).unwrap_err().contains("1 log probabilities for 2 tokens"));
        assert!(TokenView::assemble(&[]).is_err());
    }
}

/// `POST /v1/runs/{id}/share`: a person's run shared with the organisation (members see
/// their own runs and shared ones; admins all), or no longer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShareRun {
    /// Whether the organisation sees it.
    pub shared: bool,
}
