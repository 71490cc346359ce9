//! Hooks: commands a repository or a user sets to run at the agent's lifecycle events, each
//! given a JSON object on stdin and answering with its exit code (2: block, its stderr the
//! reason) or a JSON object on stdout — in the format of the file that declared it: Caret's
//! and Claude Code's (`PreToolUse`, `permissionDecision`, `updatedInput`, `additionalContext`,
//! `decision: "block"`, `continue: false`…) or Cursor's (`beforeShellExecution`, `permission`,
//! `agent_message`, `followup_message`…), with tool names and inputs as that agent has them
//! ([`names`]), so a hook written for either runs unchanged.
//!
//! A hook that fails, hangs past its timeout, prints too much or dies of a signal is an event,
//! never the session's end: it decides nothing. Hooks of one event run at once; the strictest
//! answer wins (block, then ask, then allow).

pub mod files;
mod model;
pub mod names;
pub mod shell;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub use model::{Dialect, Hook, HookEvent, Problem, Tools};
pub use shell::{LocalShell, SandboxShell, Shell};

/// Whether `hook` runs for a call of `tool` (none: an event about no tool).
fn applies(hook: &Hook, tool: Option<&str>) -> bool {
    let Some(tool) = tool else { return true };
    hook.tools.covers(tool)
        && hook.matcher.as_ref().is_none_or(|m| m.is_match(names::tool_name(hook.dialect, tool)) || m.is_match(tool))
}

/// What an event is about.
#[derive(Debug, Clone)]
pub enum Moment<'a> {
    /// The session starts: `startup`, `resume` or `compact`.
    SessionStart(&'a str),
    /// A request.
    UserPromptSubmit(&'a str),
    /// A tool call about to run.
    PreToolUse {
        /// The tool.
        tool: &'a str,
        /// Its call's id.
        id: &'a str,
        /// Its arguments (Caret's).
        input: &'a Value,
    },
    /// A tool call that ran.
    PostToolUse {
        /// The tool.
        tool: &'a str,
        /// Its call's id.
        id: &'a str,
        /// Its arguments.
        input: &'a Value,
        /// What it answered.
        output: &'a str,
        /// Whether it succeeded.
        ok: bool,
        /// How long it took.
        duration: Duration,
    },
    /// The agent waits for the person: what it asks.
    Notification(&'a str),
    /// The turn would end; `active`: a Stop hook already made it go on this turn; `loops`:
    /// how many times.
    Stop {
        /// Whether a hook made it go on before.
        active: bool,
        /// How many times.
        loops: u32,
    },
    /// A subagent would end.
    SubagentStop {
        /// Whether a hook made it go on before.
        active: bool,
    },
    /// Older turns are about to be summarised: `auto` or `manual`.
    PreCompact(&'a str),
    /// The session ends: why.
    SessionEnd(&'a str),
}

impl Moment<'_> {
    fn event(&self) -> HookEvent {
        match self {
            Moment::SessionStart(_) => HookEvent::SessionStart,
            Moment::UserPromptSubmit(_) => HookEvent::UserPromptSubmit,
            Moment::PreToolUse { .. } => HookEvent::PreToolUse,
            Moment::PostToolUse { .. } => HookEvent::PostToolUse,
            Moment::Notification(_) => HookEvent::Notification,
            Moment::Stop { .. } => HookEvent::Stop,
            Moment::SubagentStop { .. } => HookEvent::SubagentStop,
            Moment::PreCompact(_) => HookEvent::PreCompact,
            Moment::SessionEnd(_) => HookEvent::SessionEnd,
        }
    }

    fn tool(&self) -> Option<&str> {
        match self {
            Moment::PreToolUse { tool, .. } | Moment::PostToolUse { tool, .. } => Some(tool),
            _ => None,
        }
    }
}

/// What the hooks of an event decided, together.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// The strictest decision.
    pub decision: Decision,
    /// Text the model is to see (context, feedback), in hook order.
    pub context: Vec<String>,
    /// A tool call's input as a hook changed it (Caret's arguments).
    pub input: Option<Value>,
    /// A hook stopped the agent (`continue: false`): why.
    pub stop: Option<String>,
    /// What hooks tell the person.
    pub notes: Vec<String>,
}

/// A decision about what was about to happen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Decision {
    /// No hook decided.
    #[default]
    Pass,
    /// Let it happen without asking.
    Allow,
    /// Ask the person first: why.
    Ask(String),
    /// Refuse it (a tool call, a request), or — at `Stop` — go on: why.
    Block(String),
}

impl Decision {
    fn rank(&self) -> u8 {
        match self {
            Decision::Pass => 0,
            Decision::Allow => 1,
            Decision::Ask(_) => 2,
            Decision::Block(_) => 3,
        }
    }

    /// The word the events use.
    pub fn word(&self) -> &'static str {
        match self {
            Decision::Pass => "pass",
            Decision::Allow => "allow",
            Decision::Ask(_) => "ask",
            Decision::Block(_) => "block",
        }
    }
}

/// One hook's run, as the session's events tell it.
#[derive(Debug, Clone, PartialEq)]
pub struct HookRun {
    /// The event (Caret's name).
    pub event: &'static str,
    /// The hook's file.
    pub source: String,
    /// Its command.
    pub command: String,
    /// How long it took.
    pub ms: f64,
    /// What it decided (`pass`, `allow`, `ask`, `block`, `error`).
    pub decision: String,
    /// Its reason, or what went wrong.
    pub message: Option<String>,
}

/// A session's hooks: where they run and what they are about.
#[derive(Clone)]
pub struct Hooks {
    hooks: Vec<Hook>,
    shell: Arc<dyn Shell>,
    root: PathBuf,
    /// The session's id, as hooks are told it.
    pub session: String,
    /// The session's log, as hooks are told it (`transcript_path`).
    pub transcript: Option<PathBuf>,
    /// The session's model.
    pub model: String,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks").field("hooks", &self.hooks.len()).field("root", &self.root).finish_non_exhaustive()
    }
}

impl Hooks {
    /// `hooks` of the workspace `root`, run by `shell`.
    pub fn new(hooks: Vec<Hook>, root: &Path, shell: Arc<dyn Shell>) -> Hooks {
        Hooks { hooks, shell, root: root.to_path_buf(), session: String::new(), transcript: None, model: String::new() }
    }

    /// The hooks.
    pub fn list(&self) -> &[Hook] {
        &self.hooks
    }

    /// Whether any hook runs at `event`.
    pub fn any(&self, event: HookEvent) -> bool {
        self.hooks.iter().any(|h| h.event == event)
    }

    /// Runs the hooks of `moment` (all at once) and puts their answers together.
    pub async fn run(&self, moment: &Moment<'_>) -> (Verdict, Vec<HookRun>) {
        let event = moment.event();
        let chosen: Vec<&Hook> = self.hooks.iter().filter(|h| h.event == event && applies(h, moment.tool())).collect();
        let runs = futures::future::join_all(chosen.iter().map(|h| self.run_one(h, moment))).await;
        let mut verdict = Verdict::default();
        let mut out = Vec::new();
        for (one, run) in runs {
            if one.decision.rank() > verdict.decision.rank() {
                verdict.decision = one.decision;
            }
            verdict.context.extend(one.context);
            verdict.notes.extend(one.notes);
            if one.input.is_some() {
                verdict.input = one.input;
            }
            if verdict.stop.is_none() {
                verdict.stop = one.stop;
            }
            out.push(run);
        }
        (verdict, out)
    }

    async fn run_one(&self, hook: &Hook, moment: &Moment<'_>) -> (Verdict, HookRun) {
        let input = self.payload(hook, moment);
        let root = self.root.display().to_string();
        let env: Vec<(String, String)> = ["CARET_PROJECT_DIR", "CLAUDE_PROJECT_DIR", "CURSOR_PROJECT_DIR"]
            .iter()
            .map(|k| ((*k).to_owned(), root.clone()))
            .collect();
        let started = Instant::now();
        let ran = shell::run(
            self.shell.as_ref(),
            &hook.command,
            &self.root,
            &env,
            input.to_string().as_bytes(),
            hook.timeout,
        )
        .await;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let (verdict, failure) = interpret(hook, moment, &ran, &self.root);
        let message = failure.or_else(|| match &verdict.decision {
            Decision::Ask(why) | Decision::Block(why) => Some(why.clone()),
            _ => None,
        });
        let decision = if matches!(ran.exit, shell::Exit::Code(0 | 2)) { verdict.decision.word() } else { "error" };
        let run = HookRun {
            event: hook.event.name(),
            source: hook.source.clone(),
            command: hook.command.clone(),
            ms,
            decision: decision.to_owned(),
            message,
        };
        (verdict, run)
    }

    /// What `hook` reads on stdin about `moment`, in its dialect.
    fn payload(&self, hook: &Hook, moment: &Moment<'_>) -> Value {
        let tool = moment.tool().map(|t| names::tool_name(hook.dialect, t).to_owned());
        let input_of = |i: &Value| names::tool_input(hook.dialect, moment.tool().unwrap_or(""), i, &self.root);
        if hook.dialect == Dialect::Cursor {
            let mut o = serde_json::Map::new();
            o.insert("hook_event_name".into(), json!(hook.native));
            o.insert("conversation_id".into(), json!(self.session));
            o.insert("generation_id".into(), json!(self.session));
            o.insert("workspace_roots".into(), json!([self.root.display().to_string()]));
            o.insert("model".into(), json!(self.model));
            let mut put = |k: &str, x: Value| {
                o.insert(k.to_owned(), x);
            };
            match moment {
                Moment::PreToolUse { input, .. } | Moment::PostToolUse { input, .. } => {
                    let theirs = input_of(input);
                    match hook.tools {
                        Tools::Terminal => {
                            put("command", theirs.get("command").cloned().unwrap_or(Value::Null));
                            put("cwd", json!(self.root.display().to_string()));
                        }
                        Tools::Read => {
                            let path = theirs.get("file_path").cloned().unwrap_or(Value::Null);
                            let content = path.as_str().and_then(|p| read_capped(Path::new(p)));
                            put("file_path", path);
                            put("content", json!(content.unwrap_or_default()));
                            put("attachments", json!([]));
                        }
                        Tools::Edits => {
                            put("file_path", theirs.get("file_path").cloned().unwrap_or(Value::Null));
                            let edit = json!({"old_string": theirs.get("old_string").cloned().unwrap_or(json!("")),
                                "new_string": theirs.get("new_string").or(theirs.get("content")).cloned().unwrap_or(json!(""))});
                            put("edits", json!([edit]));
                        }
                        _ => {
                            put("tool_name", json!(tool));
                            put("tool_input", theirs);
                        }
                    }
                    if let Moment::PostToolUse { output, duration, .. } = moment {
                        put("output", json!(output));
                        put("result_json", json!(output));
                        put("duration", json!(duration.as_millis() as u64));
                    }
                }
                Moment::UserPromptSubmit(prompt) => {
                    put("prompt", json!(prompt));
                    put("attachments", json!([]));
                }
                Moment::Stop { loops, .. } => {
                    put("status", json!("completed"));
                    put("loop_count", json!(loops));
                }
                Moment::SessionEnd(reason) => put("reason", json!(reason)),
                _ => {}
            }
            return Value::Object(o);
        }
        let mut o = serde_json::Map::new();
        o.insert("session_id".into(), json!(self.session));
        let transcript = self.transcript.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        o.insert("transcript_path".into(), json!(transcript));
        o.insert("cwd".into(), json!(self.root.display().to_string()));
        o.insert("hook_event_name".into(), json!(hook.event.name()));
        o.insert("permission_mode".into(), json!("default"));
        let mut put = |k: &str, x: Value| {
            o.insert(k.to_owned(), x);
        };
        match moment {
            Moment::SessionStart(source) => put("source", json!(source)),
            Moment::UserPromptSubmit(prompt) => put("prompt", json!(prompt)),
            Moment::PreToolUse { id, input, .. } => {
                put("tool_name", json!(tool));
                put("tool_input", input_of(input));
                put("tool_use_id", json!(id));
            }
            Moment::PostToolUse { id, input, output, ok, .. } => {
                put("tool_name", json!(tool));
                put("tool_input", input_of(input));
                put("tool_response", json!({"output": output, "success": ok}));
                put("tool_use_id", json!(id));
            }
            Moment::Notification(message) => put("message", json!(message)),
            Moment::Stop { active, .. } | Moment::SubagentStop { active } => put("stop_hook_active", json!(active)),
            Moment::PreCompact(trigger) => {
                put("trigger", json!(trigger));
                put("custom_instructions", json!(""));
            }
            Moment::SessionEnd(reason) => put("reason", json!(reason)),
        }
        Value::Object(o)
    }
}

/// A file's text for Cursor's `beforeReadFile` (at most 1 MiB; none when not text).
fn read_capped(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let bytes = &bytes[..bytes.len().min(shell::OUTPUT_CAP)];
    std::str::from_utf8(bytes).ok().map(str::to_owned)
}

/// What a hook's run decided (and, when it failed, why).
fn interpret(hook: &Hook, moment: &Moment<'_>, ran: &shell::Ran, root: &Path) -> (Verdict, Option<String>) {
    let event = hook.event;
    let mut v = Verdict::default();
    let stderr = ran.stderr.trim();
    let why = |fallback: &str| if stderr.is_empty() { fallback.to_owned() } else { stderr.to_owned() };
    match &ran.exit {
        shell::Exit::Code(0) => {}
        shell::Exit::Code(2) => {
            let reason = why("blocked by a hook");
            match event {
                HookEvent::PreToolUse
                | HookEvent::PostToolUse
                | HookEvent::UserPromptSubmit
                | HookEvent::Stop
                | HookEvent::SubagentStop => v.decision = Decision::Block(reason),
                _ => v.notes.push(reason),
            }
            return (v, None);
        }
        shell::Exit::Code(c) => return (v, Some(format!("exited with {c}: {}", why("no message")))),
        shell::Exit::Signal(s) => return (v, Some(format!("killed by signal {s}"))),
        shell::Exit::TimedOut => {
            return (v, Some(format!("still running after {} s: stopped", hook.timeout.as_secs_f64())));
        }
        shell::Exit::NotStarted(e) => return (v, Some(format!("not started: {e}"))),
    }
    let out = ran.stdout.trim();
    let Some(answer) = serde_json::from_str::<Value>(out).ok().filter(Value::is_object) else {
        // Plain output: context where the event takes it.
        if !out.is_empty() && matches!(event, HookEvent::UserPromptSubmit | HookEvent::SessionStart) {
            v.context.push(out.to_owned());
        }
        let failure = ran.cut.then(|| format!("its output passed {} bytes and was cut", shell::OUTPUT_CAP));
        return (v, failure);
    };
    let text = |k: &str| answer.get(k).and_then(Value::as_str).map(str::to_owned);
    if hook.dialect == Dialect::Cursor {
        let to_model = text("agent_message").or_else(|| text("agentMessage"));
        let to_user = text("user_message").or_else(|| text("userMessage"));
        let reason = to_model.clone().or(to_user.clone()).unwrap_or_else(|| "refused by a hook".into());
        match answer.get("permission").and_then(Value::as_str) {
            Some("allow") => v.decision = Decision::Allow,
            Some("deny") => v.decision = Decision::Block(reason.clone()),
            Some("ask") => v.decision = Decision::Ask(reason.clone()),
            _ => {}
        }
        if answer.get("continue").and_then(Value::as_bool) == Some(false) {
            v.decision = Decision::Block(to_user.clone().unwrap_or(reason));
        }
        if let Some(follow) = text("followup_message").filter(|_| event == HookEvent::Stop) {
            v.decision = Decision::Block(follow);
        }
        v.notes.extend(to_user);
        return (v, None);
    }
    if answer.get("continue").and_then(Value::as_bool) == Some(false) {
        v.stop = Some(text("stopReason").unwrap_or_else(|| "a hook stopped the agent".into()));
    }
    v.notes.extend(text("systemMessage"));
    let reason = text("reason");
    match answer.get("decision").and_then(Value::as_str) {
        Some("block") => v.decision = Decision::Block(reason.clone().unwrap_or_else(|| "blocked by a hook".into())),
        Some("approve") if event == HookEvent::PreToolUse => v.decision = Decision::Allow,
        _ => {}
    }
    if let Some(specific) = answer.get("hookSpecificOutput") {
        let s = |k: &str| specific.get(k).and_then(Value::as_str).map(str::to_owned);
        let because = s("permissionDecisionReason").or(reason).unwrap_or_else(|| "a hook's decision".into());
        match s("permissionDecision").as_deref() {
            Some("allow") => v.decision = Decision::Allow,
            Some("deny") => v.decision = Decision::Block(because),
            Some("ask") => v.decision = Decision::Ask(because),
            _ => {}
        }
        if let (Some(changed), Some(tool)) = (specific.get("updatedInput"), moment.tool()) {
            v.input = Some(names::caret_input(hook.dialect, tool, changed, root));
        }
        v.context.extend(s("additionalContext"));
    }
    (v, None)
}

#[cfg(test)]
mod tests;
