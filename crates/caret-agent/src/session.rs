//! The turn loop: a user input, then model calls and tool batches until the model answers
//! without tools, the step limit, or an interrupt. Everything the front end shows goes out as
//! [`Event`]s; everything it decides comes in as [`Op`]s.

use std::sync::Arc;

use caret_models::{Event as ModelEvent, EventStream};
use caret_protocol::agent::{Decision, Event, Op, TurnEnd};
use caret_protocol::llm::{
    ChatMessage, ChatRequest, Content, FunctionCall, FunctionDef, Role, StreamOptions, Tool as ToolDef, ToolCall,
};
use futures::StreamExt as _;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::exec::{Call, Outcome, run_calls};
use crate::policy::{Policy, Verdict};
use crate::tools::{Ctx, Registry};

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
Find what you need before you change anything: grep for names, codebase_search for concepts, read_file for \
the code itself. When you need several files or searches, call the tools together in one answer: they run in \
parallel. Edit with edit_file (search/replace blocks copied exactly from the file), then check your work \
with read_lints or by running the tests with run_terminal_cmd. For a task of several steps keep a todo list \
with todo_write. When the task is done, answer with a short summary of what you changed.";

/// An agent session: the conversation and what it works with.
pub struct Session {
    model: Arc<dyn ModelClient>,
    model_name: String,
    tools: Registry,
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
    log: Option<std::fs::File>,
}

/// The first line of a session file.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Header {
    session: String,
    model: String,
    cwd: String,
}

/// Sends an event (a front end that went away is not an error for the agent).
fn emit(events: &mpsc::UnboundedSender<Event>, e: Event) {
    let _ = events.send(e);
}

impl Session {
    /// A session with `model_name` on `model`, the `tools`, in the workspace of `ctx`.
    pub fn new(model: Arc<dyn ModelClient>, model_name: &str, tools: Registry, ctx: Arc<Ctx>) -> Session {
        Session {
            model,
            model_name: model_name.to_owned(),
            tools,
            ctx,
            policy: Policy::default(),
            messages: vec![ChatMessage::text(Role::System, SYSTEM_PROMPT)],
            pending: std::collections::VecDeque::new(),
            max_steps: 25,
            turn: 0,
            log: None,
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
        self.log = Some(file);
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
        self.log = Some(std::fs::OpenOptions::new().append(true).open(path)?);
        Ok(())
    }

    fn push(&mut self, m: ChatMessage) {
        use std::io::Write as _;
        if let Some(f) = &mut self.log
            && let Ok(line) = serde_json::to_string(&m)
            && let Err(e) = f.write_all(format!("{line}\n").as_bytes())
        {
            tracing::warn!("session file: {e}");
            self.log = None;
        }
        self.messages.push(m);
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

    fn request(&self) -> ChatRequest {
        let tools = self
            .tools
            .specs()
            .into_iter()
            .map(|s| ToolDef {
                kind: "function".into(),
                function: FunctionDef {
                    name: s.name.to_owned(),
                    description: Some(s.description.to_owned()),
                    parameters: Some(s.parameters.clone()),
                },
            })
            .collect();
        ChatRequest {
            model: self.model_name.clone(),
            messages: self.messages.clone(),
            tools,
            tool_choice: None,
            max_tokens: Some(4096),
            temperature: Some(0.0),
            top_p: None,
            stop: None,
            stream: true,
            stream_options: Some(StreamOptions { include_usage: true }),
            seed: None,
            prediction: None,
        }
    }

    /// Runs one turn for `input`; ops that arrive meanwhile (an interrupt, approvals) are
    /// read from `ops`.
    pub async fn turn(
        &mut self,
        input: &str,
        events: &mpsc::UnboundedSender<Event>,
        ops: &mut mpsc::UnboundedReceiver<Op>,
    ) -> TurnEnd {
        self.turn += 1;
        let turn = self.turn;
        emit(events, Event::TurnBegin { turn });
        self.push(ChatMessage::text(Role::User, input));
        let reason = self.steps(events, ops).await;
        emit(events, Event::TurnEnd { turn, reason });
        reason
    }

    async fn steps(&mut self, events: &mpsc::UnboundedSender<Event>, ops: &mut mpsc::UnboundedReceiver<Op>) -> TurnEnd {
        for _ in 0..self.max_steps {
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
            let tool_calls: Vec<ToolCall> = calls
                .iter()
                .map(|c| ToolCall {
                    id: c.id.clone(),
                    kind: "function".into(),
                    function: FunctionCall { name: c.name.clone(), arguments: c.arguments.to_string() },
                })
                .collect();
            self.push(ChatMessage {
                role: Role::Assistant,
                content: (!text.is_empty()).then_some(Content::Text(text)),
                tool_calls,
                tool_call_id: None,
                name: None,
            });
            if calls.is_empty() {
                return TurnEnd::Done;
            }
            let Some(outcomes) = self.run_tools(&calls, events, ops).await else {
                for c in &calls {
                    self.push(tool_message(&c.id, "interrupted by the user"));
                }
                return TurnEnd::Interrupted;
            };
            for o in &outcomes {
                self.push(tool_message(&o.id, &o.output));
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
        let mut text = String::new();
        // (id, name, arguments text) per call index.
        let mut pieces: Vec<(String, String, String)> = Vec::new();
        loop {
            tokio::select! {
                op = ops.recv() => match op {
                    Some(Op::Interrupt | Op::Shutdown) | None => return None,
                    Some(other) => self.pending.push_back(other),
                },
                item = stream.next() => match item {
                    None => break,
                    Some(Err(e)) => return Some((Err(e), Vec::new())),
                    Some(Ok(ModelEvent::Text(t))) => {
                        text.push_str(&t);
                        emit(events, Event::TextDelta { text: t });
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
                    Some(Ok(ModelEvent::Usage(u))) => emit(events, Event::TokenUsage {
                        prompt_tokens: u.prompt_tokens,
                        completion_tokens: u.completion_tokens,
                        context_tokens: u.prompt_tokens + u.completion_tokens,
                        context_window: 0,
                    }),
                    Some(Ok(ModelEvent::Finish(_))) => {}
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

    /// Asks for approvals, runs the calls, reports what they did; `None` when interrupted.
    async fn run_tools(
        &mut self,
        calls: &[Call],
        events: &mpsc::UnboundedSender<Event>,
        ops: &mut mpsc::UnboundedReceiver<Op>,
    ) -> Option<Vec<Outcome>> {
        // Terminal commands pass the policy (and the user) first, in call order.
        let mut refused: Vec<Option<String>> = vec![None; calls.len()];
        for (i, c) in calls.iter().enumerate().filter(|(_, c)| c.name == TERMINAL) {
            // A call without a command looks at a background job: nothing runs.
            let Some(command) = c.arguments.get("command").and_then(Value::as_str).map(str::to_owned) else {
                continue;
            };
            match self.policy.check(&command) {
                Verdict::Run => {}
                Verdict::Refuse(why) => refused[i] = Some(format!("error: refused by policy: {why}")),
                Verdict::Ask(reason) => {
                    emit(events, Event::ApprovalRequest { call_id: c.id.clone(), command: command.clone(), reason });
                    // An answer may have come early.
                    let early = self
                        .pending
                        .iter()
                        .position(|op| matches!(op, Op::Approval { call_id, .. } if *call_id == c.id));
                    let mut early = early.and_then(|i| self.pending.remove(i));
                    loop {
                        let next = match early.take() {
                            Some(op) => Some(op),
                            None => ops.recv().await,
                        };
                        match next {
                            Some(Op::Approval { call_id, decision }) if call_id == c.id => {
                                match decision {
                                    Decision::Approve => {}
                                    Decision::ApproveForSession => self.policy.approve_for_session(&command),
                                    Decision::Deny => refused[i] = Some("error: the user refused to run it".into()),
                                }
                                break;
                            }
                            Some(Op::Interrupt | Op::Shutdown) | None => return None,
                            Some(other) => self.pending.push_back(other),
                        }
                    }
                }
            }
        }
        let runnable: Vec<Call> =
            calls.iter().zip(&refused).filter(|(_, r)| r.is_none()).map(|(c, _)| c.clone()).collect();
        let refusal = |c: &Call, why: &str| Outcome {
            id: c.id.clone(),
            name: c.name.clone(),
            ok: false,
            output: why.to_owned(),
            duration: std::time::Duration::ZERO,
        };
        let on_start = |c: &Call| {
            emit(
                events,
                Event::ToolCallBegin { call_id: c.id.clone(), name: c.name.clone(), arguments: c.arguments.clone() },
            )
        };
        let on_end = |o: &Outcome| {
            emit(
                events,
                Event::ToolCallEnd {
                    call_id: o.id.clone(),
                    name: o.name.clone(),
                    ok: o.ok,
                    output: o.output.clone(),
                    duration_ms: o.duration.as_secs_f64() * 1e3,
                },
            )
        };
        for (c, why) in calls.iter().zip(&refused) {
            if let Some(why) = why {
                on_start(c);
                on_end(&refusal(c, why));
            }
        }
        let ran = tokio::select! {
            ran = run_calls(&self.tools, &runnable, &self.ctx, &on_start, &on_end) => ran,
            () = interrupted(ops, &mut self.pending) => return None,
        };
        for change in self.ctx.take_changes() {
            emit(events, Event::FileChange { path: change.path, kind: change.kind, diff: change.diff });
        }
        if calls.iter().any(|c| c.name == "todo_write") {
            let items = self.ctx.todos.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            emit(events, Event::TodoUpdate { items });
        }
        let mut ran = ran.into_iter();
        let outcomes = calls
            .iter()
            .zip(&refused)
            .map(|(c, r)| match r {
                Some(why) => refusal(c, why),
                None => ran.next().unwrap_or_else(|| refusal(c, "error: not run")),
            })
            .collect();
        Some(outcomes)
    }
}

/// Resolves when the user interrupts (or the front end goes away); other ops are kept.
async fn interrupted(ops: &mut mpsc::UnboundedReceiver<Op>, pending: &mut std::collections::VecDeque<Op>) {
    loop {
        match ops.recv().await {
            Some(Op::Interrupt | Op::Shutdown) | None => return,
            Some(other) => pending.push_back(other),
        }
    }
}

fn tool_message(id: &str, output: &str) -> ChatMessage {
    ChatMessage {
        role: Role::Tool,
        content: Some(Content::Text(output.to_owned())),
        tool_calls: Vec::new(),
        tool_call_id: Some(id.to_owned()),
        name: None,
    }
}
