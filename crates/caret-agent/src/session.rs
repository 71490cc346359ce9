//! The turn loop: a user input, then model calls and tool batches until the model answers
//! without tools, the step limit, or an interrupt. Everything the front end shows goes out as
//! [`Event`]s; everything it decides comes in as [`Op`]s.

use std::sync::Arc;

use caret_models::{Event as ModelEvent, EventStream};
use caret_protocol::agent::{Event, Mode, Op, TurnEnd};
use caret_protocol::llm::{
    ChatMessage, ChatRequest, Content, FunctionCall, FunctionDef, Role, StreamOptions, Tool as ToolDef, ToolCall,
};
use caret_protocol::runs::CallTokens;
use futures::StreamExt as _;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::batch::Call;
use crate::policy::Policy;
use crate::tools::{Ctx, Registry};

mod calls;
mod compact;

/// What a front end attaches to a request for its mentions beyond files (`@Docs NAME`: the
/// sections of that documentation that answer it).
#[async_trait::async_trait]
pub trait Mentions: Send + Sync {
    /// Text to add to the request `input` (none: nothing is mentioned).
    async fn attach(&self, input: &str) -> Option<String>;
}

/// Where model answers come from (the gateway in the binary; a scripted model in tests).
#[async_trait::async_trait]
pub trait ModelClient: Send + Sync {
    /// A streamed chat answer.
    async fn chat(&self, req: ChatRequest) -> caret_models::Result<EventStream>;
}

/// The tool whose calls the policy and the user approve.
pub const TERMINAL: &str = "run_terminal_cmd";

/// The system prompt: search before editing, read in parallel, keep a todo list.
pub const SYSTEM_PROMPT: &str = "You are a coding agent working in the user's repository through tools. \
Paths are relative to the repository root; its layout is below. Find what you need before you change \
anything: grep for names, codebase_search for concepts, read_file for the code itself. Always read a file \
before you edit it. When you need several files or searches, call the tools together in one answer: they run \
in parallel. Edit with edit_file (search/replace blocks whose SEARCH text is copied exactly from what \
read_file showed, without its line numbers), then check your work with read_lints or by running the tests \
with run_terminal_cmd. When a tool answers an error, correct the call and go on. For a task of several steps \
keep a todo list with todo_write. When the task is done and checked, answer with a short summary of what you \
changed.";

/// Said when the model ends a turn without a word right after a failed call.
pub const GO_ON: &str = "You stopped without a word after a tool call failed. If the task is not done, go on: \
fix the call or try another way. If it is done, say what you changed.";

/// Most files a request's text attaches by naming them, and the largest attached.
const ATTACH_MAX_FILES: usize = 5;
const ATTACH_MAX_BYTES: u64 = 16 * 1024;

/// Lines of the repository layout in the system prompt.
const OVERVIEW_LINES: usize = 60;

/// An agent session: the conversation and what it works with.
pub struct Session {
    model: Arc<dyn ModelClient>,
    model_name: String,
    tools: Registry,
    /// Tools that come and go (MCP servers'), and the names taken from them last.
    dynamic: Option<(Arc<dyn crate::tools::DynamicTools>, Vec<&'static str>)>,
    /// What mentions in a request attach besides files.
    pub mentions: Option<Arc<dyn Mentions>>,
    /// Tools the user approved for the rest of the session.
    approved_tools: std::collections::HashSet<String>,
    /// Temperature and seed of model calls (none: 0 and none).
    sampling: (Option<f64>, Option<u64>),
    ctx: Arc<Ctx>,
    /// The command policy (session approvals are added to it).
    pub policy: Policy,
    messages: Vec<ChatMessage>,
    /// Ops that arrived while something else was awaited (an approval given before it was
    /// asked for, a user input for the next turn), oldest first.
    pending: std::collections::VecDeque<Op>,
    /// Model calls a turn may make.
    pub max_steps: u32,
    turn: u32,
    /// The JSON-lines file the conversation is appended to, when persisted.
    log: Option<(std::fs::File, std::path::PathBuf)>,
    /// The model's context window in tokens: older turns are summarised when the
    /// conversation nears it.
    pub context_window: u32,
    /// Whether the model takes images in its input: a tool's images are then attached after
    /// its result (else the result says what they were).
    pub images: bool,
    /// What the last model call's prompt and answer took, as its provider counted them, and
    /// how many messages that covered: the base of the next estimate.
    counted: Option<(u32, usize)>,
    /// Tokens used by every model call of the session (prompt, completion) and calls made.
    usage: (u64, u64, u32),
    /// Whether model calls ask for token ids and log probabilities.
    token_view: bool,
    /// What each model call read and sampled in tokens, when asked for.
    calls: Vec<CallTokens>,
    /// What the answer being read said in tokens.
    reading: CallTokens,
    /// Commands run at the session's events (none: none).
    hooks: Option<crate::hooks::Hooks>,
    /// Whether the session's start was told to its hooks.
    started: bool,
    /// A hook stopped the agent (`continue: false`): why; the turn ends after the batch.
    halted: Option<String>,
    /// What the person is told when the first turn begins.
    opening: Vec<String>,
    /// How long the first model call waits for tool sources still starting (MCP servers).
    pub startup_timeout: std::time::Duration,
    /// Whether the first model call waited for them already.
    waited: bool,
    /// The custom slash commands a request may start with.
    pub commands: Vec<crate::commands::Command>,
    /// This turn's model and tools, when a command set them.
    turn_model: Option<String>,
    turn_tools: Option<Vec<String>>,
    /// Planning (read-only tools, a plan at the end) or building.
    mode: Mode,
    /// Whether this is a subagent's session (its end is `SubagentStop` to hooks).
    pub subagent: bool,
}

/// Times a turn's Stop hooks may make the agent go on.
const MAX_STOP_LOOPS: u32 = 5;

/// Share of the window at which older turns are summarised.
const COMPACT_AT: f32 = 0.75;
/// Messages at the end kept as they are through a compaction.
const KEEP_RECENT: usize = 6;

/// Tokens of messages by their length: about 3 bytes a token in code-heavy text, plus the
/// chat template's few tokens per message (the provider's own count replaces this estimate
/// for everything up to its last answer).
fn estimate(messages: &[ChatMessage]) -> u32 {
    let bytes: usize = messages
        .iter()
        .map(|m| {
            m.content_text().len()
                + m.tool_calls.iter().map(|c| c.function.name.len() + c.function.arguments.len()).sum::<usize>()
                + 12
        })
        .sum();
    u32::try_from(bytes / 3).unwrap_or(u32::MAX)
}

/// The instructions for a compaction's summary.
/// The first line of a session file.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Header {
    session: String,
    model: String,
    cwd: String,
}

/// The turn's event sender lent to its tools, taken back when dropped.
struct Sink(Arc<std::sync::Mutex<Option<mpsc::UnboundedSender<Event>>>>);

impl Sink {
    fn open(
        slot: &Arc<std::sync::Mutex<Option<mpsc::UnboundedSender<Event>>>>,
        events: &mpsc::UnboundedSender<Event>,
    ) -> Sink {
        *slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(events.clone());
        Sink(slot.clone())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}

/// Sends an event (a front end that went away is not an error for the agent).
fn emit(events: &mpsc::UnboundedSender<Event>, e: Event) {
    let _ = events.send(e);
}

impl Session {
    /// A session with `model_name` on `model`, the `tools`, in the workspace of `ctx`.
    pub fn new(model: Arc<dyn ModelClient>, model_name: &str, mut tools: Registry, ctx: Arc<Ctx>) -> Session {
        let layout = crate::tools::fs::overview(&ctx.root, OVERVIEW_LINES);
        // The project's rules files (`ctx.rules`): always-rules in the system prompt, the
        // others fetched by name or attached to the result of a call on a matching file.
        let rules = ctx.rules.prompt().map(|p| format!("\n\n{p}")).unwrap_or_default();
        if !ctx.rules.on_request.is_empty() || !ctx.rules.globbed.is_empty() {
            tools.add(Arc::new(crate::tools::rules::FetchRule::new()));
        }
        tools.add(Arc::new(crate::plan::SubmitPlan::default()));
        Session {
            model,
            model_name: model_name.to_owned(),
            tools,
            dynamic: None,
            mentions: None,
            approved_tools: std::collections::HashSet::new(),
            ctx,
            policy: Policy::default(),
            messages: vec![ChatMessage::text(
                Role::System,
                format!("{SYSTEM_PROMPT}\n\nRepository layout:\n{layout}{rules}"),
            )],
            pending: std::collections::VecDeque::new(),
            max_steps: 25,
            turn: 0,
            log: None,
            context_window: 32_768,
            images: false,
            counted: None,
            usage: (0, 0, 0),
            sampling: (None, None),
            token_view: false,
            calls: Vec::new(),
            reading: CallTokens::default(),
            hooks: None,
            started: false,
            halted: None,
            opening: Vec::new(),
            startup_timeout: std::time::Duration::from_secs(10),
            waited: false,
            commands: Vec::new(),
            turn_model: None,
            turn_tools: None,
            mode: Mode::Build,
            subagent: false,
        }
    }

    /// Appends the conversation from now on (and what it holds already) to a new file at
    /// `path`: a header line, then one message per line. A message is written when it is
    /// added, so a killed process loses at most the message being written.
    pub fn persist(&mut self, path: &std::path::Path, id: &str) -> std::io::Result<()> {
        use std::io::Write as _;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = std::fs::OpenOptions::new().create_new(true).append(true).open(path)?;
        let header =
            Header { session: id.to_owned(), model: self.model_name.clone(), cwd: self.ctx.root.display().to_string() };
        let mut text = serde_json::to_string(&header).map_err(std::io::Error::other)? + "\n";
        for m in &self.messages {
            text += &(serde_json::to_string(m).map_err(std::io::Error::other)? + "\n");
        }
        file.write_all(text.as_bytes())?;
        self.log = Some((file, path.to_path_buf()));
        if let Some(h) = &mut self.hooks {
            h.session = id.to_owned();
            h.transcript = Some(path.to_path_buf());
        }
        Ok(())
    }

    /// Continues the session saved at `path` (its conversation, and further messages
    /// appended to it). A last line cut short by a crash is left out.
    pub fn resume(&mut self, path: &std::path::Path) -> std::io::Result<()> {
        let text = std::fs::read_to_string(path)?;
        let mut lines = text.lines();
        if lines.next().is_none_or(|l| serde_json::from_str::<Header>(l).is_err()) {
            return Err(std::io::Error::other(format!("{} is not a session file", path.display())));
        }
        let messages: Vec<ChatMessage> = lines.map_while(|l| serde_json::from_str(l).ok()).collect();
        if messages.is_empty() {
            return Err(std::io::Error::other(format!("{} holds no conversation", path.display())));
        }
        self.turn = u32::try_from(messages.iter().filter(|m| m.role == Role::User).count()).unwrap_or(u32::MAX);
        self.messages = messages;
        // Rewrite the file without a torn last line, then append.
        let mut kept = text.lines().take(1 + self.messages.len()).collect::<Vec<_>>().join("\n");
        kept.push('\n');
        std::fs::write(path, kept)?;
        self.log = Some((std::fs::OpenOptions::new().append(true).open(path)?, path.to_path_buf()));
        Ok(())
    }

    /// Writes the session file again from the conversation as it is now (after a
    /// compaction): a new file renamed over the old one, so a crash leaves one or the other.
    fn rewrite_log(&mut self) -> std::io::Result<()> {
        use std::io::Write as _;
        let Some((_, path)) = &self.log else { return Ok(()) };
        let path = path.clone();
        let first = std::fs::read_to_string(&path)?.lines().next().unwrap_or_default().to_owned();
        let mut text = first + "\n";
        for m in &self.messages {
            text += &(serde_json::to_string(m).map_err(std::io::Error::other)? + "\n");
        }
        let tmp = path.with_extension("jsonl.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        self.log = Some((std::fs::OpenOptions::new().append(true).open(&path)?, path));
        Ok(())
    }

    /// The mode: planning or building.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Plans (read-only tools; a plan ends the turn) or builds, from the next model call on.
    pub fn set_mode(&mut self, mode: Mode, events: &mpsc::UnboundedSender<Event>) {
        if self.mode != mode {
            self.mode = mode;
            emit(events, Event::ModeChanged { mode });
        }
    }

    /// Whether a tool is offered (and may run) in the current mode: in plan mode, the
    /// read-only tools (not MCP servers', which may change things) and `submit_plan`; in build
    /// mode, everything but `submit_plan`.
    fn offered_in_mode(&self, name: &str, read_only: bool) -> bool {
        match self.mode {
            Mode::Plan => read_only && !name.starts_with("mcp__"),
            Mode::Build => name != crate::plan::SUBMIT_PLAN,
        }
    }

    /// Builds `plan` (as the person approved it): build mode, its steps the todo list, and a
    /// turn that carries it out.
    pub async fn build_plan(
        &mut self,
        plan: &caret_protocol::agent::Plan,
        events: &mpsc::UnboundedSender<Event>,
        ops: &mut mpsc::UnboundedReceiver<Op>,
    ) -> TurnEnd {
        self.set_mode(Mode::Build, events);
        let items = crate::plan::todos(plan);
        *self.ctx.todos.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = items.clone();
        emit(events, Event::TodoUpdate { items });
        self.turn(&crate::plan::build_request(plan), events, ops).await
    }

    /// Gives the session `skills`: listed in the system prompt (names and short descriptions),
    /// loaded on demand with `load_skill`.
    pub fn set_skills(&mut self, skills: Vec<crate::skills::Skill>) {
        if skills.is_empty() {
            return;
        }
        self.append_system(&crate::skills::prompt(&skills, crate::skills::PROMPT_BUDGET));
        self.tools.add(Arc::new(crate::skills::LoadSkill::new(Arc::new(skills))));
    }

    /// Runs `hooks` at this session's events from now on (its id, model and log told to them).
    pub fn set_hooks(&mut self, mut hooks: crate::hooks::Hooks) {
        hooks.model = self.model_name.clone();
        if let Some((_, path)) = &self.log {
            hooks.transcript = Some(path.clone());
        }
        if hooks.session.is_empty() {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            hooks.session = format!("s-{nanos:x}");
        }
        self.hooks = Some(hooks);
    }

    /// Tells the person `message` when the first turn begins (what was left out at the start).
    pub fn notice_at_start(&mut self, message: String) {
        self.opening.push(message);
    }

    /// Runs the hooks of `moment`, telling the front end of each run and of what they say to
    /// the person; none when no hook ran.
    async fn hook(
        &self,
        moment: &crate::hooks::Moment<'_>,
        events: &mpsc::UnboundedSender<Event>,
    ) -> Option<crate::hooks::Verdict> {
        let (verdict, runs) = self.hooks.as_ref()?.run(moment).await;
        if runs.is_empty() {
            return None;
        }
        for r in runs {
            let (event, source, command, ms, decision, message) =
                (r.event.to_owned(), r.source, r.command, r.ms, r.decision, r.message);
            emit(events, Event::HookRun { event, source, command, ms, decision, message });
        }
        for n in &verdict.notes {
            emit(events, Event::Notice { message: n.clone() });
        }
        Some(verdict)
    }

    /// Ends the session for its hooks (`SessionEnd`, with why: `exit`, `shutdown`…).
    pub async fn end(&mut self, events: &mpsc::UnboundedSender<Event>, reason: &str) {
        if self.started {
            self.started = false;
            self.hook(&crate::hooks::Moment::SessionEnd(reason), events).await;
        }
    }

    /// Tokens the conversation takes now: the provider's count up to its last answer plus an
    /// estimate of what came after.
    pub fn context_tokens(&self) -> u32 {
        match self.counted {
            Some((tokens, n)) if n <= self.messages.len() => tokens.saturating_add(estimate(&self.messages[n..])),
            _ => estimate(&self.messages),
        }
    }

    /// Tokens used by the session's model calls, its subagents' included: (prompt, completion,
    /// calls).
    pub fn usage(&self) -> (u64, u64, u32) {
        let sub = *self.ctx.sub_usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (self.usage.0 + sub.0, self.usage.1 + sub.1, self.usage.2 + sub.2)
    }

    /// Adds `text` to the system prompt.
    pub fn append_system(&mut self, text: &str) {
        if let Some(system) = self.messages.first_mut().filter(|m| m.role == Role::System) {
            system.content = Some(Content::Text(format!("{}\n\n{text}", system.content_text())));
        }
    }

    /// The session's model, its name, its tools now and its hooks (what a subagent inherits).
    pub fn parts(&self) -> (Arc<dyn ModelClient>, &str, &Registry, Option<&crate::hooks::Hooks>) {
        (self.model.clone(), &self.model_name, &self.tools, self.hooks.as_ref())
    }

    /// Adds a tool.
    pub fn add_tool(&mut self, tool: Arc<dyn crate::tools::Tool>) {
        self.tools.add(tool);
    }

    fn push(&mut self, m: ChatMessage) {
        use std::io::Write as _;
        if let Some((f, _)) = &mut self.log
            && let Ok(line) = serde_json::to_string(&m)
            && let Err(e) = f.write_all(format!("{line}\n").as_bytes())
        {
            tracing::warn!("session file: {e}");
            self.log = None;
        }
        self.messages.push(m);
    }

    /// Serves a front end until it shuts the session down (or goes away): each user input
    /// runs a turn; inputs given during a turn wait for it to end; approvals and interrupts
    /// that come when no turn needs them are dropped.
    pub async fn serve(&mut self, ops: &mut mpsc::UnboundedReceiver<Op>, events: &mpsc::UnboundedSender<Event>) {
        loop {
            let op = match self.pending.pop_front() {
                Some(op) => Some(op),
                None => ops.recv().await,
            };
            match op {
                Some(Op::UserInput { text }) => {
                    self.turn(&text, events, ops).await;
                }
                Some(Op::SetMode { mode }) => self.set_mode(mode, events),
                Some(Op::ApprovePlan { plan }) => {
                    self.build_plan(&plan, events, ops).await;
                }
                Some(Op::Shutdown) => return self.end(events, "shutdown").await,
                None => return self.end(events, "other").await,
                Some(Op::Interrupt | Op::Approval { .. }) => {}
            }
        }
    }

    /// Takes the ops that arrived during a turn and were not for it (user inputs for the
    /// next turn, say).
    pub fn take_pending(&mut self) -> Vec<Op> {
        self.pending.drain(..).collect()
    }

    /// The conversation so far.
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// Sets how the model is sampled (none: temperature 0, no seed).
    pub fn set_sampling(&mut self, temperature: Option<f64>, seed: Option<u64>) {
        self.sampling = (temperature, seed);
    }

    /// Asks every model call for its token ids and log probabilities: the sampled ids go
    /// back to the engine with the conversation (token in, token out) and
    /// [`Session::token_calls`] keeps what each call read and sampled.
    pub fn keep_tokens(&mut self) {
        self.token_view = true;
    }

    /// What each model call read and sampled, in tokens (when [`Session::keep_tokens`] asked).
    pub fn token_calls(&self) -> &[CallTokens] {
        &self.calls
    }

    /// Adds tools that come and go: before each model call the session offers those
    /// `source` has then (MCP servers' tools, as their servers answer).
    pub fn add_dynamic_tools(&mut self, source: Arc<dyn crate::tools::DynamicTools>) {
        self.dynamic = Some((source, Vec::new()));
        self.refresh_dynamic_tools();
    }

    /// Before the session's first model call: waits (up to [`Session::startup_timeout`]) for
    /// tool sources still starting, so that the first request offers every server that started
    /// in time; those that did not are named and left out (their tools come once they answer).
    async fn await_dynamic_tools(&mut self, events: &mpsc::UnboundedSender<Event>) {
        if std::mem::replace(&mut self.waited, true) {
            return;
        }
        let Some((source, _)) = &self.dynamic else { return };
        let source = source.clone();
        source.start();
        let deadline = tokio::time::Instant::now() + self.startup_timeout;
        while source.starting() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let left_out: Vec<String> =
            source.not_ready().into_iter().map(|(name, why)| format!("{name} ({why})")).collect();
        if !left_out.is_empty() {
            let message = format!("MCP servers left out of the first request: {}", left_out.join(", "));
            emit(events, Event::Notice { message });
        }
    }

    /// Takes the dynamic tools offered now in place of those taken before.
    fn refresh_dynamic_tools(&mut self) {
        let Some((source, names)) = &mut self.dynamic else { return };
        for name in names.drain(..) {
            self.tools.remove(name);
        }
        for tool in source.current() {
            let name = tool.spec().name;
            // A built-in tool keeps its name.
            if self.tools.get(name).is_none() {
                names.push(name);
                self.tools.add(tool);
            }
        }
    }

    /// The tool definitions every model call carries.
    pub fn tool_defs(&self) -> Vec<ToolDef> {
        self.tools
            .specs()
            .into_iter()
            .filter(|s| self.turn_tools.as_ref().is_none_or(|only| only.iter().any(|t| t == s.name)))
            .filter(|s| self.offered_in_mode(s.name, s.read_only))
            .map(|s| ToolDef {
                kind: "function".into(),
                function: FunctionDef {
                    name: s.name.to_owned(),
                    description: Some(s.description.to_owned()),
                    parameters: Some(s.parameters.clone()),
                },
            })
            .collect()
    }

    fn request(&self) -> ChatRequest {
        let tools = self.tool_defs();
        ChatRequest {
            model: self.turn_model.clone().unwrap_or_else(|| self.model_name.clone()),
            messages: self.messages.clone(),
            tools,
            tool_choice: None,
            max_tokens: Some(4096),
            temperature: Some(self.sampling.0.unwrap_or(0.0) as f32),
            top_p: None,
            stop: None,
            stream: true,
            stream_options: Some(StreamOptions { include_usage: true }),
            seed: self.sampling.1,
            prediction: None,
            logprobs: self.token_view.then_some(true),
            return_token_ids: self.token_view.then_some(true),
        }
    }

    /// Runs one turn for `input`; ops that arrive meanwhile (an interrupt, approvals) are
    /// read from `ops`.
    #[tracing::instrument(name = "agent.turn", skip_all, fields(turn = self.turn + 1))]
    pub async fn turn(
        &mut self,
        input: &str,
        events: &mpsc::UnboundedSender<Event>,
        ops: &mut mpsc::UnboundedReceiver<Op>,
    ) -> TurnEnd {
        self.turn += 1;
        let turn = self.turn;
        emit(events, Event::TurnBegin { turn });
        if turn == 1 && (!self.ctx.rules.always.is_empty() || !self.ctx.rules.dropped.is_empty()) {
            emit(
                events,
                Event::RulesApplied {
                    rules: self.ctx.rules.always.iter().map(|r| r.name.clone()).collect(),
                    dropped: self.ctx.rules.dropped.iter().map(|(n, _)| n.clone()).collect(),
                },
            );
        }
        // A custom command: `/name args` becomes its prompt (its model and tools for the turn).
        let expanded;
        let input = match crate::commands::invocation(input)
            .and_then(|(name, args)| self.commands.iter().find(|c| c.name == name).map(|c| (c, args)))
        {
            Some((command, args)) => {
                expanded = crate::commands::expand(command, args);
                emit(events, Event::Notice { message: format!("/{} ({})", command.name, command.source) });
                self.turn_model.clone_from(&command.model);
                self.turn_tools = command.allowed_tools.as_deref().map(crate::commands::tool_names);
                expanded.as_str()
            }
            None => input,
        };
        // Hooks: the session's start (once), then the request (which they may refuse).
        let mut hooked = String::new();
        for message in std::mem::take(&mut self.opening) {
            emit(events, Event::Notice { message });
        }
        if !self.started {
            self.started = true;
            let source = if turn > 1 { "resume" } else { "startup" };
            if let Some(v) = self.hook(&crate::hooks::Moment::SessionStart(source), events).await {
                for c in v.context {
                    hooked.push_str(&format!("\n\n[Context from a SessionStart hook]\n{c}"));
                }
            }
        }
        if let Some(v) = self.hook(&crate::hooks::Moment::UserPromptSubmit(input), events).await {
            let refused = match v.decision {
                crate::hooks::Decision::Block(why) => Some(why),
                _ => v.stop,
            };
            if let Some(why) = refused {
                emit(events, Event::Error { message: format!("a hook refused the request: {why}") });
                emit(events, Event::TurnEnd { turn, reason: TurnEnd::Done });
                return TurnEnd::Done;
            }
            for c in v.context {
                hooked.push_str(&format!("\n\n[Context from a UserPromptSubmit hook]\n{c}"));
            }
        }
        let before = self.attached_rules();
        let attached = self.attach_named_files(input);
        self.emit_new_rules(events, before);
        let mentioned = match &self.mentions {
            Some(m) => m.attach(input).await.unwrap_or_default(),
            None => String::new(),
        };
        let planning = if self.mode == Mode::Plan { format!("\n\n{}", crate::plan::REMINDER) } else { String::new() };
        self.push(ChatMessage::text(Role::User, format!("{input}{attached}{mentioned}{hooked}{planning}")));
        // Tools' own events (a subagent's) go out while the turn runs, and never after: the
        // sink is cleared however the turn ends, dropped mid-way included, so the front end's
        // channel closes when its last sender goes.
        let _sink = Sink::open(&self.ctx.sink, events);
        let reason = self.steps(events, ops).await;
        (self.turn_model, self.turn_tools) = (None, None);
        emit(events, Event::TurnEnd { turn, reason });
        reason
    }

    /// The workspace files a request names (`calc.py`, `src/lib.rs`), as they are now, for
    /// the model to see with the request — as an editor attaches the files a user mentions.
    /// Small text files only (a few, each under [`ATTACH_MAX_BYTES`]); they count as read.
    /// How many rules were attached or fetched so far.
    fn attached_rules(&self) -> usize {
        self.ctx.attached.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Says which rules were attached or fetched since there were `before`.
    fn emit_new_rules(&self, events: &mpsc::UnboundedSender<Event>, before: usize) {
        let attached = self.ctx.attached.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if attached.len() > before {
            emit(events, Event::RulesApplied { rules: attached[before..].to_vec(), dropped: Vec::new() });
        }
    }

    fn attach_named_files(&self, input: &str) -> String {
        let mut out = String::new();
        let mut named: Vec<&str> = Vec::new();
        for word in input.split_whitespace() {
            let word = word.trim_matches(|c: char| !(c.is_alphanumeric() || "._-/".contains(c)));
            let word = word.trim_end_matches('.');
            if word.contains('.') && !named.contains(&word) && named.len() < ATTACH_MAX_FILES {
                named.push(word);
            }
        }
        for rel in named {
            let Ok(path) = self.ctx.resolve(rel) else { continue };
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            if !meta.is_file() || meta.len() > ATTACH_MAX_BYTES {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            if text.contains('\0') {
                continue;
            }
            let fence = if text.contains("```") { "````" } else { "```" };
            if out.is_empty() {
                out.push_str("\n\nFiles named above, as they are now:");
            }
            let body = text.strip_suffix('\n').unwrap_or(&text);
            out.push_str(&format!("\n\n{rel}\n{fence}\n{body}\n{fence}"));
            if let Some(rules) = self.ctx.attach_rules(rel) {
                out.push_str(&rules);
            }
            self.ctx.saw(&path);
        }
        out
    }

    async fn steps(&mut self, events: &mpsc::UnboundedSender<Event>, ops: &mut mpsc::UnboundedReceiver<Op>) -> TurnEnd {
        // Whether the last batch had a failed call, and whether the model was already asked
        // to go on after falling silent on one.
        let (mut failed, mut nudged, mut stops) = (false, false, 0);
        for _ in 0..self.max_steps {
            self.compact_if_needed(events).await;
            self.await_dynamic_tools(events).await;
            self.refresh_dynamic_tools();
            let stream = match self.model.chat(self.request()).await {
                Ok(s) => s,
                Err(e) => {
                    emit(events, Event::Error { message: format!("model: {e}") });
                    return TurnEnd::Failed;
                }
            };
            let Some((text, calls)) = self.read_answer(stream, events, ops).await else {
                return TurnEnd::Interrupted;
            };
            let text = match text {
                Ok(t) => t,
                Err(e) => {
                    emit(events, Event::Error { message: format!("model: {e}") });
                    return TurnEnd::Failed;
                }
            };
            let silent = text.trim().is_empty();
            let tool_calls: Vec<ToolCall> = calls
                .iter()
                .map(|c| ToolCall {
                    id: c.id.clone(),
                    kind: "function".into(),
                    function: FunctionCall { name: c.name.clone(), arguments: c.arguments.to_string() },
                })
                .collect();
            let reading = std::mem::take(&mut self.reading);
            let token_ids = (self.token_view && !reading.ids.is_empty()).then(|| reading.ids.clone());
            if self.token_view {
                self.calls.push(reading);
            }
            self.push(ChatMessage {
                role: Role::Assistant,
                content: (!text.is_empty()).then_some(Content::Text(text)),
                tool_calls,
                tool_call_id: None,
                name: None,
                token_ids,
            });
            if calls.is_empty() {
                // Small models fall silent right after a failed call, the task undone: asked
                // once per turn to go on (or to say what they did).
                if silent && failed && !nudged {
                    nudged = true;
                    self.push(ChatMessage::text(Role::User, GO_ON));
                    continue;
                }
                // Stop hooks may make the agent go on (a few times a turn at most).
                let moment = if self.subagent {
                    crate::hooks::Moment::SubagentStop { active: stops > 0 }
                } else {
                    crate::hooks::Moment::Stop { active: stops > 0, loops: stops }
                };
                if stops < MAX_STOP_LOOPS
                    && let Some(v) = self.hook(&moment, events).await
                {
                    if let Some(why) = v.stop {
                        emit(events, Event::Notice { message: format!("a hook stopped the agent: {why}") });
                    } else if let crate::hooks::Decision::Block(why) = v.decision {
                        stops += 1;
                        let go_on = format!("[A Stop hook asks you to go on before ending the turn]\n{why}");
                        self.push(ChatMessage::text(Role::User, go_on));
                        continue;
                    }
                }
                return TurnEnd::Done;
            }
            let Some(outcomes) = self.run_tools(&calls, events, ops).await else {
                for c in &calls {
                    self.push(tool_message(&c.id, "interrupted by the user"));
                }
                return TurnEnd::Interrupted;
            };
            self.push_results(&outcomes);
            failed = outcomes.iter().any(|o| !o.ok);
            // A plan proposed (plan mode): the turn ends with it, for the person.
            if let Some(plan) = calls
                .iter()
                .zip(&outcomes)
                .filter(|(c, o)| c.name == crate::plan::SUBMIT_PLAN && o.ok)
                .find_map(|(c, _)| crate::plan::parse(&c.arguments).ok())
            {
                emit(events, Event::PlanProposed { plan });
                return TurnEnd::Done;
            }
            if let Some(why) = self.halted.take() {
                emit(events, Event::Notice { message: format!("a hook stopped the agent: {why}") });
                return TurnEnd::Done;
            }
        }
        TurnEnd::StepLimit
    }

    /// Streams the model's answer out as text deltas and collects its tool calls; `None`
    /// when interrupted.
    async fn read_answer(
        &mut self,
        mut stream: EventStream,
        events: &mpsc::UnboundedSender<Event>,
        ops: &mut mpsc::UnboundedReceiver<Op>,
    ) -> Option<(caret_models::Result<String>, Vec<Call>)> {
        self.reading = CallTokens::default();
        let mut text = String::new();
        // (id, name, arguments text) per call index.
        let mut pieces: Vec<(String, String, String)> = Vec::new();
        loop {
            tokio::select! {
                op = ops.recv() => match op {
                    Some(Op::Shutdown) => {
                        self.pending.push_back(Op::Shutdown);
                        return None;
                    }
                    Some(Op::Interrupt) | None => return None,
                    Some(other) => self.pending.push_back(other),
                },
                item = stream.next() => match item {
                    None => break,
                    Some(Err(e)) => return Some((Err(e), Vec::new())),
                    Some(Ok(ModelEvent::Text(t))) => {
                        text.push_str(&t);
                        emit(events, Event::TextDelta { text: t });
                    }
                    Some(Ok(ModelEvent::ToolCall { index, .. })) if index >= caret_models::MAX_TOOL_CALLS => {
                        let e = caret_models::Error::Upstream { upstream: "the model".to_owned(), status: None, message: format!("tool call index {index} is past the limit") };
                        return Some((Err(e), Vec::new()));
                    }
                    Some(Ok(ModelEvent::ToolCall { index, id, name, arguments })) => {
                        let i = index as usize;
                        while pieces.len() <= i {
                            pieces.push(Default::default());
                        }
                        if let Some(id) = id {
                            pieces[i].0 = id;
                        }
                        if let Some(name) = name {
                            pieces[i].1 = name;
                        }
                        pieces[i].2.push_str(&arguments);
                    }
                    Some(Ok(ModelEvent::Usage(u))) => {
                        // The prompt covered every message so far; the answer is added next.
                        let tokens = u.prompt_tokens.saturating_add(u.completion_tokens);
                        self.counted = Some((tokens, self.messages.len() + 1));
                        self.usage.0 += u64::from(u.prompt_tokens);
                        self.usage.1 += u64::from(u.completion_tokens);
                        self.usage.2 += 1;
                        emit(events, Event::TokenUsage {
                            prompt_tokens: u.prompt_tokens,
                            completion_tokens: u.completion_tokens,
                            context_tokens: tokens,
                            context_window: self.context_window,
                        });
                    }
                    Some(Ok(ModelEvent::Finish(_))) => {}
                    Some(Ok(ModelEvent::PromptTokens(ids))) => self.reading.prompt_ids = ids,
                    Some(Ok(ModelEvent::Tokens { ids, logprobs })) => {
                        self.reading.ids.extend(ids);
                        self.reading.logprobs.extend(logprobs.iter().map(|l| l.logprob));
                    }
                },
            }
        }
        let calls = pieces
            .into_iter()
            .enumerate()
            .map(|(i, (id, name, args))| Call {
                id: if id.is_empty() { format!("call_{i}") } else { id },
                name,
                // Arguments that are not JSON go to the tool as they are: it answers why.
                arguments: serde_json::from_str(if args.trim().is_empty() { "{}" } else { &args })
                    .unwrap_or(Value::String(args)),
            })
            .collect();
        Some((Ok(text), calls))
    }
}

fn tool_message(id: &str, output: &str) -> ChatMessage {
    ChatMessage {
        role: Role::Tool,
        content: Some(Content::Text(output.to_owned())),
        tool_calls: Vec::new(),
        tool_call_id: Some(id.to_owned()),
        name: None,
        token_ids: None,
    }
}
