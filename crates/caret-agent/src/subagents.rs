//! Subagents: the `task` tool starts a session of its own (its own context window) for a
//! piece of work and returns what it concluded. A read-only `explorer` always exists; a
//! project or a user defines more in Markdown (`.caret/agents/*.md`, `.claude/agents/*.md`:
//! front matter `name`, `description`, `tools`, `model`; the body is its instructions). Calls
//! in one answer run at once; a subagent's events go to the front end nested under its call,
//! and its tokens count with the session's.

use std::path::PathBuf;
use std::sync::Arc;

use caret_protocol::agent::{Event, TurnEnd};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::front_matter;
use crate::session::{ModelClient, Session};
use crate::tools::{Ctx, Registry, Spec, Tool, ToolError, ToolResult};

/// The tool's name.
pub const TASK: &str = "task";
/// Model calls a subagent may make.
const MAX_STEPS: u32 = 15;

/// A kind of subagent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentDef {
    /// Its name.
    pub name: String,
    /// When to use it.
    pub description: String,
    /// Its tools (Caret's or Claude Code's names; none: the read-only ones).
    pub tools: Option<Vec<String>>,
    /// A model alias (none: the session's).
    pub model: Option<String>,
    /// Its instructions.
    pub prompt: String,
    /// Where it was defined (`built in`, `.claude/agents`).
    pub source: String,
}

/// The explorer every session has.
pub fn explorer() -> AgentDef {
    AgentDef {
        name: "explorer".into(),
        description: "Explores the codebase read-only and reports what it found (files, functions, how things \
                      fit), for questions that take many searches and reads."
            .into(),
        tools: None,
        model: None,
        prompt: "You are an explorer working for another agent: answer its question about this repository using \
                 read-only tools, searching and reading in parallel. End with a concise report: the relevant files \
                 with paths and line numbers, what you found, and what remains unclear. Change nothing."
            .into(),
        source: "built in".into(),
    }
}

/// The subagents defined in `places` (folders of Markdown files, each with how listings name
/// it), after the built-in explorer; the first of a name wins. Files left out, with why.
pub fn discover(places: &[(PathBuf, String)]) -> (Vec<AgentDef>, Vec<(PathBuf, String)>) {
    let mut out = vec![explorer()];
    let mut skipped = Vec::new();
    for (place, source) in places {
        let Ok(entries) = std::fs::read_dir(place) else { continue };
        let mut files: Vec<PathBuf> =
            entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "md")).collect();
        files.sort();
        for file in files {
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => {
                    skipped.push((file, e.to_string()));
                    continue;
                }
            };
            let (front, body) = front_matter::split(&text);
            let fields = front_matter::fields(front);
            let text_of =
                |k: &str| front_matter::get(&fields, k).map(front_matter::Value::text).filter(|t| !t.is_empty());
            let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let name = text_of("name").unwrap_or(stem);
            let Some(description) = text_of("description") else {
                skipped.push((file, "no description in its front matter".into()));
                continue;
            };
            if body.trim().is_empty() || out.iter().any(|a| a.name == name) {
                skipped.push((file, format!("{name}: no instructions, or a subagent of that name exists")));
                continue;
            }
            let tools = front_matter::get(&fields, "tools").map(front_matter::Value::items);
            out.push(AgentDef {
                name,
                description,
                tools: tools.map(|t| crate::commands::tool_names(&t)),
                model: text_of("model").filter(|m| m != "inherit"),
                prompt: body.trim().to_owned(),
                source: source.clone(),
            });
        }
    }
    (out, skipped)
}

/// Gives `session` the `task` tool: `agents` (the explorer first) as subagents, with the
/// session's model, tools (as they are now) and hooks.
pub fn enable(session: &mut Session, agents: Vec<AgentDef>) {
    let (model, name, tools, hooks) = session.parts();
    let task = Task::new(agents, model, name, tools.clone(), hooks.cloned());
    session.add_tool(Arc::new(task));
}

/// `task`: runs a subagent on a piece of work and answers its report.
pub struct Task {
    agents: Vec<AgentDef>,
    model: Arc<dyn ModelClient>,
    model_name: String,
    /// The tools subagents may be given (the session's own, less `task`).
    tools: Registry,
    hooks: Option<crate::hooks::Hooks>,
    spec: Spec,
}

impl Task {
    /// The tool: `agents` on `model` (`model_name` unless an agent names another), with tools
    /// from `tools`, and the session's `hooks`.
    pub fn new(
        agents: Vec<AgentDef>,
        model: Arc<dyn ModelClient>,
        model_name: &str,
        tools: Registry,
        hooks: Option<crate::hooks::Hooks>,
    ) -> Task {
        let kinds: Vec<String> = agents.iter().map(|a| format!("{}: {}", a.name, a.description)).collect();
        let description = format!(
            "Starts a subagent with its own context for a self-contained piece of work and returns its report. \
             Several task calls in one answer run at once. Subagents:\n{}",
            kinds.join("\n")
        );
        let names: Vec<&str> = agents.iter().map(|a| a.name.as_str()).collect();
        let spec = Spec {
            name: TASK,
            description: Box::leak(description.into_boxed_str()),
            parameters: json!({
                "type": "object",
                "properties": {
                    "description": {"type": "string", "description": "A few words on what it is for"},
                    "prompt": {"type": "string", "description": "The whole task: the subagent sees nothing else"},
                    "subagent_type": {"type": "string", "enum": names}
                },
                "required": ["description", "prompt"]
            }),
            read_only: true,
        };
        Task { agents, model, model_name: model_name.to_owned(), tools, hooks, spec }
    }
}

#[async_trait::async_trait]
impl Tool for Task {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let prompt = args.get("prompt").and_then(Value::as_str).filter(|p| !p.trim().is_empty());
        let prompt = prompt.ok_or_else(|| ToolError("task needs a prompt".into()))?;
        let kind = args.get("subagent_type").and_then(Value::as_str).unwrap_or("explorer");
        let agent = self.agents.iter().find(|a| a.name == kind).ok_or_else(|| {
            let known: Vec<&str> = self.agents.iter().map(|a| a.name.as_str()).collect();
            ToolError(format!("no subagent {kind:?} (there are: {})", known.join(", ")))
        })?;
        // Its tools: those it names (that the session has), else the read-only ones.
        let mut tools = Registry::default();
        for spec in self.tools.specs() {
            let wanted = match &agent.tools {
                Some(names) => names.iter().any(|n| n == spec.name),
                None => spec.read_only && !spec.name.starts_with("mcp__"),
            };
            if wanted
                && spec.name != TASK
                && let Some(t) = self.tools.get(spec.name)
            {
                tools.add(t.clone());
            }
        }
        // Its own context: the workspace and what was read, its own todo list.
        let mut sub_ctx = ctx.clone();
        sub_ctx.todos = Arc::default();
        sub_ctx.sink = Arc::default();
        let model_name = agent.model.clone().unwrap_or_else(|| self.model_name.clone());
        let mut session = Session::new(self.model.clone(), &model_name, tools, Arc::new(sub_ctx));
        session.max_steps = MAX_STEPS;
        session.subagent = true;
        session.append_system(&format!("You are the subagent \"{}\".\n{}", agent.name, agent.prompt));
        if let Some(h) = &self.hooks {
            session.set_hooks(h.clone());
        }
        // Its events, nested under this call, as they come.
        let call_id = format!(
            "task-{:x}",
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
        );
        let (events_tx, mut events) = mpsc::unbounded_channel::<Event>();
        let parent = ctx.clone();
        let name = agent.name.clone();
        let forward = tokio::spawn(async move {
            while let Some(e) = events.recv().await {
                parent.emit(Event::Subagent { call_id: call_id.clone(), agent: name.clone(), event: Box::new(e) });
            }
        });
        let (_ops_tx, mut ops) = mpsc::unbounded_channel();
        let reason = session.turn(prompt, &events_tx, &mut ops).await;
        drop(events_tx);
        let _ = forward.await;
        let (p, c, calls) = session.usage();
        {
            let mut used = ctx.sub_usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            *used = (used.0 + p, used.1 + c, used.2 + calls);
        }
        let report = session
            .messages()
            .iter()
            .rev()
            .find(|m| m.role == caret_protocol::llm::Role::Assistant && !m.content_text().trim().is_empty())
            .map(|m| m.content_text())
            .unwrap_or_default();
        let ended = match reason {
            TurnEnd::Done => String::new(),
            other => format!(" (it ended early: {other:?})"),
        };
        if report.trim().is_empty() {
            return Err(ToolError(format!("the {} subagent reported nothing{ended}", agent.name)));
        }
        Ok(format!("{} subagent's report{ended}:\n{}", agent.name, report.trim()))
    }
}
