//! The agent's terminal UI (`caret agent`), as state apart from the terminal: [`App`] takes
//! the agent's events and the user's keys and is drawn to any ratatui backend, which is how
//! it is tested.
//!
//! The screen: the conversation (the user's messages, the agent's text as it streams, each
//! tool call on one line with its outcome — `Ctrl-O` unfolds their outputs — and diffs
//! coloured), the todo list beside it when there is one, a status line (model, session,
//! context used) and the input box. `Enter` sends (a message typed during a turn waits for
//! it), `Esc` interrupts the turn, `PageUp`/`PageDown` scroll, `Ctrl-C` quits. A command that
//! needs approval asks in place: `y` once, `a` for the session, `n` no.

use caret_protocol::agent::{ChangeKind, Decision, Event, Op, TodoItem, TodoStatus, TurnEnd};
use caret_protocol::llm::{ChatMessage, Role};
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};

/// How a tool call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallState {
    Running,
    Ok,
    Failed,
}

/// One thing in the conversation pane.
#[derive(Debug, Clone, PartialEq)]
enum Entry {
    User(String),
    Assistant(String),
    Tool { id: String, name: String, summary: String, state: CallState, output: String },
    Diff { path: String, kind: ChangeKind, diff: String },
    Notice(String),
    Error(String),
}

/// A question waiting for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    call_id: String,
    command: String,
    reason: String,
}

/// What a key asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Nothing beyond redrawing.
    None,
    /// Send this to the agent.
    Op(Op),
    /// Leave.
    Quit,
}

/// The UI's state.
#[derive(Debug, Default)]
pub struct App {
    header: String,
    entries: Vec<Entry>,
    todos: Vec<TodoItem>,
    input: String,
    approval: Option<Pending>,
    /// A turn is running.
    busy: bool,
    /// Messages sent while a turn ran, not begun yet.
    queued: usize,
    /// (context tokens, window) after the last model call.
    usage: Option<(u32, u32)>,
    /// Lines scrolled up from the bottom.
    scroll: u16,
    /// Tool outputs shown.
    unfolded: bool,
    /// The documentation sources `@Docs` completes to.
    docs: Vec<String>,
    /// The custom commands `/` completes to.
    commands: Vec<String>,
    /// Planning or building (Shift-Tab switches).
    mode: caret_protocol::agent::Mode,
    /// The plan the agent proposed, waiting for the person (Ctrl-Y builds it).
    plan: Option<caret_protocol::agent::Plan>,
}

/// The short form of a call's arguments: its path, command, query or pattern.
fn summary(name: &str, args: &serde_json::Value) -> String {
    let s = |k: &str| args.get(k).and_then(serde_json::Value::as_str);
    let text = match name {
        "run_terminal_cmd" => s("command")
            .map(str::to_owned)
            .or_else(|| args.get("job").and_then(serde_json::Value::as_u64).map(|j| format!("job {j}"))),
        "codebase_search" => s("query").map(|q| format!("{q:?}")),
        "grep" | "glob" => s("pattern").map(str::to_owned),
        "todo_write" => Some(String::new()),
        _ => s("path").map(str::to_owned),
    };
    let text = text.unwrap_or_else(|| args.to_string());
    match text.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

impl App {
    /// A UI for the session `id` with `model` in `root`.
    pub fn new(id: &str, model: &str, root: &str) -> App {
        App { header: format!("caret agent · {model} · {root} · session {id}"), ..App::default() }
    }

    /// Shows a resumed conversation.
    pub fn replay(&mut self, messages: &[ChatMessage]) {
        for m in messages {
            match m.role {
                Role::User => self.entries.push(Entry::User(m.content_text())),
                Role::Assistant => {
                    let text = m.content_text();
                    if !text.is_empty() {
                        self.entries.push(Entry::Assistant(text));
                    }
                    for c in &m.tool_calls {
                        let args = serde_json::from_str(&c.function.arguments).unwrap_or(serde_json::Value::Null);
                        self.entries.push(Entry::Tool {
                            id: c.id.clone(),
                            name: c.function.name.clone(),
                            summary: summary(&c.function.name, &args),
                            state: CallState::Ok,
                            output: String::new(),
                        });
                    }
                }
                Role::Tool => {
                    let id = m.tool_call_id.clone().unwrap_or_default();
                    let text = m.content_text();
                    if let Some(Entry::Tool { output, state, .. }) =
                        self.entries.iter_mut().rev().find(|e| matches!(e, Entry::Tool { id: i, .. } if *i == id))
                    {
                        *state = if text.starts_with("error:") { CallState::Failed } else { CallState::Ok };
                        *output = text;
                    }
                }
                Role::System => {}
            }
        }
        if !self.entries.is_empty() {
            self.entries.push(Entry::Notice("(resumed)".to_owned()));
        }
    }

    /// Takes an agent event.
    pub fn on_event(&mut self, e: Event) {
        match e {
            Event::SessionConfigured { .. } => {}
            Event::TurnBegin { .. } => {
                self.busy = true;
                self.queued = self.queued.saturating_sub(1);
            }
            Event::TurnEnd { reason, .. } => {
                self.busy = false;
                self.approval = None;
                let why = match reason {
                    TurnEnd::Done => None,
                    TurnEnd::Interrupted => Some("interrupted"),
                    TurnEnd::StepLimit => Some("stopped at the step limit"),
                    TurnEnd::Failed => Some("failed"),
                };
                if let Some(why) = why {
                    self.entries.push(Entry::Notice(format!("turn {why}")));
                }
            }
            Event::TextDelta { text } => match self.entries.last_mut() {
                Some(Entry::Assistant(t)) => t.push_str(&text),
                _ => self.entries.push(Entry::Assistant(text)),
            },
            Event::ToolCallBegin { call_id, name, arguments, server } => self.entries.push(Entry::Tool {
                id: call_id,
                summary: match server {
                    Some(server) => format!("(MCP server {server}) {}", summary(&name, &arguments)),
                    None => summary(&name, &arguments),
                },
                name,
                state: CallState::Running,
                output: String::new(),
            }),
            Event::ToolCallEnd { call_id, ok, output: out, .. } => {
                if let Some(Entry::Tool { state, output, .. }) =
                    self.entries.iter_mut().rev().find(|e| matches!(e, Entry::Tool { id, .. } if *id == call_id))
                {
                    *state = if ok { CallState::Ok } else { CallState::Failed };
                    *output = out;
                }
            }
            Event::FileChange { path, kind, diff } => self.entries.push(Entry::Diff { path, kind, diff }),
            Event::TodoUpdate { items } => self.todos = items,
            Event::ApprovalRequest { call_id, command, reason } => {
                self.approval = Some(Pending { call_id, command, reason });
            }
            Event::TokenUsage { context_tokens, context_window, .. } => {
                self.usage = Some((context_tokens, context_window));
            }
            Event::Compacted { messages_before, messages_after, .. } => self.entries.push(Entry::Notice(format!(
                "older turns summarised to stay within the model's window ({messages_before} → {messages_after} \
                 messages)"
            ))),
            Event::Error { message } => self.entries.push(Entry::Error(message)),
            Event::Notice { message } => self.entries.push(Entry::Notice(message)),
            // A subagent's work, one line per call under the task that started it.
            Event::Subagent { agent, event, .. } => match *event {
                Event::ToolCallBegin { name, arguments, .. } => {
                    self.entries.push(Entry::Notice(format!("  ↳ {agent}: {}", summary(&name, &arguments))));
                }
                Event::Error { message } => self.entries.push(Entry::Error(format!("{agent}: {message}"))),
                _ => {}
            },
            Event::ModeChanged { mode } => {
                self.mode = mode;
                let what = match mode {
                    caret_protocol::agent::Mode::Plan => "plan mode: read-only tools; the agent proposes a plan",
                    caret_protocol::agent::Mode::Build => "build mode",
                };
                self.entries.push(Entry::Notice(what.into()));
            }
            Event::PlanProposed { plan } => {
                let mut text = format!("Plan: {}", plan.summary);
                for (i, step) in plan.steps.iter().enumerate() {
                    let files =
                        if step.files.is_empty() { String::new() } else { format!(" ({})", step.files.join(", ")) };
                    text.push_str(&format!("\n  {}. {}{files}", i + 1, step.title));
                }
                for risk in &plan.risks {
                    text.push_str(&format!("\n  risk: {risk}"));
                }
                text.push_str("\n  Ctrl-Y builds it; or say what to change.");
                self.entries.push(Entry::Assistant(text));
                self.plan = Some(plan);
            }
            // A hook is shown when it decided something or failed; one that let things be is not.
            Event::HookRun { event, command, decision, message, ms, .. } => {
                if decision != "pass" && decision != "allow" {
                    let why = message.map(|m| format!(": {m}")).unwrap_or_default();
                    self.entries.push(Entry::Notice(format!("hook {event} `{command}` ({ms:.0} ms): {decision}{why}")));
                }
            }
            Event::RulesApplied { rules, dropped } => {
                let mut note = String::new();
                if !rules.is_empty() {
                    note = format!("rules: {}", rules.join(", "));
                }
                if !dropped.is_empty() {
                    note.push_str(&format!(
                        "{}left out (over the size cap): {}",
                        if note.is_empty() { "" } else { "; " },
                        dropped.join(", ")
                    ));
                }
                self.entries.push(Entry::Notice(note));
            }
        }
    }

    /// The documentation sources `@Docs NAME` can attach (the input completes them).
    pub fn docs(&mut self, names: Vec<String>) {
        self.docs = names;
    }

    /// The custom commands a request may start with (`/name`; the input completes them).
    pub fn commands(&mut self, names: Vec<String>) {
        self.commands = names;
    }

    /// What the end of the input completes to: `@Docs NAME` for each source that fits what is
    /// typed (`@d`, `@Docs `, `@Docs sq`), with how many characters of the input it replaces.
    fn completions(&self) -> (usize, Vec<String>) {
        // `/re` at the start of a request: the commands it may be.
        if let Some(typed) = self.input.strip_prefix('/').filter(|t| !t.contains(char::is_whitespace)) {
            let names = self.commands.iter().filter(|n| n.starts_with(typed) && n.as_str() != typed);
            return (self.input.len(), names.map(|n| format!("/{n}")).collect());
        }
        let tail = &self.input[self.input.rfind('\n').map_or(0, |i| i + 1)..];
        let words: Vec<&str> = tail.split(' ').collect();
        let last = words.last().copied().unwrap_or("");
        let before = words.len().checked_sub(2).map(|i| words[i]);
        let is_docs = |w: &str| w.eq_ignore_ascii_case("@docs");
        let (replaced, prefix) = match before {
            // `@Docs ` or `@Docs sq`: the name is being typed.
            Some(b) if is_docs(b) => (b.len() + 1 + last.len(), last),
            // `@d`, `@Docs`: the mention itself.
            _ if last.len() >= 2 && "@docs".starts_with(&last.to_ascii_lowercase()) => (last.len(), ""),
            _ => return (0, Vec::new()),
        };
        let names = self.docs.iter().filter(|n| n.starts_with(prefix) && n.as_str() != prefix);
        (replaced, names.map(|n| format!("@Docs {n}")).collect())
    }

    /// Shows a message sent without typing it (the task given on the command line).
    pub fn sent(&mut self, text: &str) {
        self.entries.push(Entry::User(text.to_owned()));
        self.queued += 1;
    }

    /// Takes a key.
    pub fn on_key(&mut self, k: KeyEvent) -> Action {
        if k.kind == KeyEventKind::Release {
            return Action::None;
        }
        let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(k.code, KeyCode::Char('c' | 'd')) {
            return Action::Quit;
        }
        if let Some(p) = &self.approval {
            let decision = match k.code {
                KeyCode::Char('y' | 'Y') | KeyCode::Enter => Decision::Approve,
                KeyCode::Char('a' | 'A') => Decision::ApproveForSession,
                KeyCode::Char('n' | 'N') | KeyCode::Esc => Decision::Deny,
                _ => return Action::None,
            };
            let call_id = p.call_id.clone();
            self.approval = None;
            return Action::Op(Op::Approval { call_id, decision });
        }
        match k.code {
            KeyCode::Char('o') if ctrl => self.unfolded = !self.unfolded,
            KeyCode::Char(c) if !ctrl => self.input.push(c),
            KeyCode::Tab => {
                let (replaced, options) = self.completions();
                if let Some(first) = options.first() {
                    self.input.truncate(self.input.len() - replaced);
                    self.input.push_str(first);
                    self.input.push(' ');
                }
            }
            KeyCode::Backspace => {
                self.input.pop();
            }
            KeyCode::Enter if k.modifiers.contains(KeyModifiers::ALT) => self.input.push('\n'),
            KeyCode::Enter => {
                let text = std::mem::take(&mut self.input);
                if text.trim().is_empty() {
                    return Action::None;
                }
                self.entries.push(Entry::User(text.clone()));
                self.queued += 1;
                self.scroll = 0;
                return Action::Op(Op::UserInput { text });
            }
            KeyCode::Esc if self.busy => return Action::Op(Op::Interrupt),
            KeyCode::BackTab => {
                let mode = match self.mode {
                    caret_protocol::agent::Mode::Build => caret_protocol::agent::Mode::Plan,
                    caret_protocol::agent::Mode::Plan => caret_protocol::agent::Mode::Build,
                };
                return Action::Op(Op::SetMode { mode });
            }
            KeyCode::Char('y') if ctrl => {
                if let Some(plan) = self.plan.take() {
                    self.entries.push(Entry::Notice("plan approved: building it".into()));
                    self.queued += 1;
                    return Action::Op(Op::ApprovePlan { plan });
                }
            }
            KeyCode::PageUp => self.scroll = self.scroll.saturating_add(10),
            KeyCode::PageDown => self.scroll = self.scroll.saturating_sub(10),
            _ => {}
        }
        Action::None
    }

    /// The conversation as styled lines.
    fn lines(&self) -> Vec<Line<'static>> {
        // Tabs (read_file's line numbers) take two cells; a terminal cell holds no tab.
        let detab = |s: &str| s.replace('\t', "  ");
        let mut out = Vec::new();
        let dim = Style::default().fg(Color::DarkGray);
        for e in &self.entries {
            match e {
                Entry::User(t) => {
                    for (i, l) in t.lines().enumerate() {
                        let mark = if i == 0 { "› " } else { "  " };
                        out.push(Line::from(vec![
                            Span::styled(mark, Style::default().fg(Color::Cyan).add_modifier(Modifier::BOLD)),
                            Span::styled(l.to_owned(), Style::default().add_modifier(Modifier::BOLD)),
                        ]));
                    }
                }
                Entry::Assistant(t) => out.extend(t.lines().map(|l| Line::from(detab(l)))),
                Entry::Tool { name, summary, state, output, .. } => {
                    let (mark, color) = match state {
                        CallState::Running => ("…", Color::Yellow),
                        CallState::Ok => ("✓", Color::Green),
                        CallState::Failed => ("✗", Color::Red),
                    };
                    let first = detab(output.lines().next().unwrap_or(""));
                    let more = output.lines().count().saturating_sub(1);
                    let mut spans = vec![
                        Span::styled(format!("{mark} "), Style::default().fg(color)),
                        Span::styled(name.clone(), Style::default().fg(Color::Magenta)),
                        Span::raw(format!(" {summary}")),
                    ];
                    if !self.unfolded && !first.is_empty() {
                        let tail = if more > 0 { format!(" (+{more} lines)") } else { String::new() };
                        spans.push(Span::styled(format!("  {first}{tail}"), dim));
                    }
                    out.push(Line::from(spans));
                    if self.unfolded {
                        out.extend(output.lines().map(|l| Line::styled(format!("    {}", detab(l)), dim)));
                    }
                }
                Entry::Diff { path, kind, diff } => {
                    let what = match kind {
                        ChangeKind::Add => "added",
                        ChangeKind::Update => "edited",
                        ChangeKind::Delete => "deleted",
                    };
                    out.push(Line::styled(format!("  {what} {path}"), Style::default().add_modifier(Modifier::BOLD)));
                    for l in diff.lines().filter(|l| !l.starts_with("---") && !l.starts_with("+++")) {
                        let style = match l.chars().next() {
                            Some('+') => Style::default().fg(Color::Green),
                            Some('-') => Style::default().fg(Color::Red),
                            Some('@') => Style::default().fg(Color::Cyan),
                            _ => dim,
                        };
                        out.push(Line::styled(format!("    {}", detab(l)), style));
                    }
                }
                Entry::Notice(t) => out.push(Line::styled(format!("· {t}"), dim)),
                Entry::Error(t) => out.push(Line::styled(format!("error: {t}"), Style::default().fg(Color::Red))),
            }
        }
        out
    }

    /// Draws the UI on `f`.
    pub fn draw(&self, f: &mut Frame<'_>) {
        let input_lines = u16::try_from(self.input.lines().count().clamp(1, 6)).unwrap_or(6);
        let bottom = if self.approval.is_some() { 4 } else { input_lines + 2 };
        let [main, status, input] =
            Layout::vertical([Constraint::Min(3), Constraint::Length(1), Constraint::Length(bottom)]).areas(f.area());
        let (talk, todo) = if self.todos.is_empty() {
            (main, None)
        } else {
            let [a, b] = Layout::horizontal([Constraint::Min(20), Constraint::Length(36)]).areas(main);
            (a, Some(b))
        };
        self.draw_talk(f, talk);
        if let Some(area) = todo {
            let lines: Vec<Line<'_>> = self
                .todos
                .iter()
                .map(|t| {
                    let (mark, style) = match t.status {
                        TodoStatus::Pending => ("☐", Style::default()),
                        TodoStatus::InProgress => ("▶", Style::default().fg(Color::Yellow)),
                        TodoStatus::Completed => ("☑", Style::default().fg(Color::Green)),
                        TodoStatus::Cancelled => ("☒", Style::default().fg(Color::DarkGray)),
                    };
                    Line::styled(format!("{mark} {}", t.content), style)
                })
                .collect();
            let block = Block::default().borders(Borders::LEFT).title(" todo ");
            f.render_widget(Paragraph::new(lines).block(block).wrap(Wrap { trim: false }), area);
        }
        let mut state = self.header.clone();
        if self.mode == caret_protocol::agent::Mode::Plan {
            state.push_str(" · plan mode (Shift-Tab: build)");
        }
        if let Some((used, window)) = self.usage
            && window > 0
        {
            state.push_str(&format!(" · context {}%", u64::from(used) * 100 / u64::from(window)));
        }
        if self.busy {
            state.push_str(" · working (Esc interrupts)");
        }
        if self.queued > usize::from(self.busy) {
            state.push_str(&format!(" · {} queued", self.queued - usize::from(self.busy)));
        }
        f.render_widget(Paragraph::new(state).style(Style::default().fg(Color::DarkGray)), status);
        match &self.approval {
            Some(p) => {
                let lines = vec![
                    Line::styled(format!("run `{}`?", p.command), Style::default().add_modifier(Modifier::BOLD)),
                    Line::from(format!("{} — [y]es  [a]lways this session  [n]o", p.reason)),
                ];
                let block = Block::default().borders(Borders::ALL).title(" approval ").border_style(Color::Yellow);
                f.render_widget(Paragraph::new(lines).block(block).wrap(Wrap { trim: false }), input);
            }
            None => {
                let title = " message (Enter sends, Alt-Enter new line, Ctrl-O tool output, Ctrl-C quits) ";
                let block = Block::default().borders(Borders::ALL).title(title);
                f.render_widget(Paragraph::new(self.input.as_str()).block(block).wrap(Wrap { trim: false }), input);
                self.draw_completions(f, input);
            }
        }
    }

    /// The `@Docs` completions in a box just above the input (Tab takes the first).
    fn draw_completions(&self, f: &mut Frame<'_>, input: Rect) {
        let (_, options) = self.completions();
        let shown: Vec<&String> = options.iter().take(6).collect();
        if shown.is_empty() {
            return;
        }
        let width = shown.iter().map(|o| o.chars().count()).max().unwrap_or(0).max(14) + 4;
        let height = u16::try_from(shown.len()).unwrap_or(6) + 2;
        let area = Rect {
            x: input.x + 1,
            y: input.y.saturating_sub(height),
            width: u16::try_from(width).unwrap_or(u16::MAX).min(input.width.saturating_sub(2)),
            height: height.min(input.y),
        };
        let lines: Vec<Line<'_>> = shown
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let style = if i == 0 { Style::default().add_modifier(Modifier::REVERSED) } else { Style::default() };
                Line::styled(format!(" {o} "), style)
            })
            .collect();
        let block = Block::default().borders(Borders::ALL).title(" Tab ").border_style(Color::Cyan);
        f.render_widget(ratatui::widgets::Clear, area);
        f.render_widget(Paragraph::new(lines).block(block), area);
    }

    fn draw_talk(&self, f: &mut Frame<'_>, area: Rect) {
        let lines = self.lines();
        let para = Paragraph::new(lines).wrap(Wrap { trim: false });
        // Bottom-anchored: the newest lines show unless scrolled up.
        let total = u16::try_from(para.line_count(area.width)).unwrap_or(u16::MAX);
        let top = total.saturating_sub(area.height).saturating_sub(self.scroll);
        f.render_widget(para.scroll((top, 0)), area);
    }
}

/// Puts the terminal back however the UI ends (made once the screen is taken).
pub struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        let _ = crossterm::terminal::disable_raw_mode();
        let _ = crossterm::execute!(std::io::stdout(), crossterm::terminal::LeaveAlternateScreen);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn screen(app: &App, w: u16, h: u16) -> String {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| app.draw(f)).unwrap();
        let buf = t.backend().buffer().clone();
        (0..h)
            .map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_owned()).collect::<String>().trim_end().to_owned())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_turn_shows_text_tools_diffs_todos_and_asks_for_approval() {
        let mut app = App::new("s1", "local", "/ws");
        for c in "add a test".chars() {
            assert_eq!(app.on_key(key(KeyCode::Char(c))), Action::None);
        }
        assert_eq!(app.on_key(key(KeyCode::Enter)), Action::Op(Op::UserInput { text: "add a test".into() }));
        assert!(app.input.is_empty());
        app.on_event(Event::TurnBegin { turn: 1 });
        app.on_event(Event::TextDelta { text: "Reading ".into() });
        app.on_event(Event::TextDelta { text: "the code.".into() });
        app.on_event(Event::ToolCallBegin {
            call_id: "r1".into(),
            name: "read_file".into(),
            arguments: serde_json::json!({"path": "src/lib.rs"}),
            server: None,
        });
        app.on_event(Event::ToolCallEnd {
            call_id: "r1".into(),
            name: "read_file".into(),
            ok: true,
            output: "1\tfn a() {}\n2\t".into(),
            duration_ms: 1.0,
        });
        app.on_event(Event::FileChange {
            path: "src/lib.rs".into(),
            kind: ChangeKind::Update,
            diff: "--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -1 +1 @@\n-fn a() {}\n+fn a() -> u8 { 1 }\n".into(),
        });
        app.on_event(Event::TodoUpdate {
            items: vec![TodoItem { id: "1".into(), content: "write the test".into(), status: TodoStatus::InProgress }],
        });
        app.on_event(Event::TokenUsage {
            prompt_tokens: 900,
            completion_tokens: 100,
            context_tokens: 1000,
            context_window: 4000,
        });
        let s = screen(&app, 100, 20);
        assert!(s.contains("› add a test"), "{s}");
        assert!(s.contains("Reading the code."), "{s}");
        assert!(s.contains("✓ read_file src/lib.rs  1  fn a() {}"), "{s}");
        assert!(s.contains("(+1 lines)"), "{s}");
        assert!(
            s.contains("edited src/lib.rs") && s.contains("-fn a() {}") && s.contains("+fn a() -> u8 { 1 }"),
            "{s}"
        );
        assert!(s.contains("▶ write the test"), "{s}");
        assert!(s.contains("context 25%") && s.contains("working (Esc interrupts)"), "{s}");

        // Ctrl-O unfolds tool output.
        app.on_key(KeyEvent::new(KeyCode::Char('o'), KeyModifiers::CONTROL));
        let s = screen(&app, 100, 20);
        assert!(s.contains("    1  fn a() {}") && !s.contains("(+1 lines)"), "{s}");

        // An approval takes the input area; y answers it.
        app.on_event(Event::ApprovalRequest {
            call_id: "x1".into(),
            command: "rm -rf build".into(),
            reason: "`rm` may delete".into(),
        });
        let s = screen(&app, 100, 20);
        assert!(s.contains("run `rm -rf build`?") && s.contains("[y]es"), "{s}");
        assert_eq!(app.on_key(key(KeyCode::Char('q'))), Action::None, "other keys wait");
        assert_eq!(
            app.on_key(key(KeyCode::Char('a'))),
            Action::Op(Op::Approval { call_id: "x1".into(), decision: Decision::ApproveForSession })
        );
        assert!(app.approval.is_none());
        // Esc interrupts a running turn; the turn's end is shown.
        assert_eq!(app.on_key(key(KeyCode::Esc)), Action::Op(Op::Interrupt));
        app.on_event(Event::TurnEnd { turn: 1, reason: TurnEnd::Interrupted });
        assert!(screen(&app, 100, 20).contains("· turn interrupted"));
        assert_eq!(app.on_key(key(KeyCode::Esc)), Action::None, "nothing to interrupt");
        assert_eq!(app.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)), Action::Quit);
    }

    #[test]
    fn a_resumed_session_shows_its_conversation_and_the_newest_lines_stay_in_view() {
        use caret_protocol::llm::{FunctionCall, ToolCall};
        let mut call = ChatMessage::text(Role::Assistant, "Looking.");
        call.tool_calls = vec![ToolCall {
            id: "g1".into(),
            kind: "function".into(),
            function: FunctionCall { name: "grep".into(), arguments: r#"{"pattern": "fn main"}"#.into() },
        }];
        let mut result = ChatMessage::text(Role::Tool, "error: no such directory");
        result.tool_call_id = Some("g1".into());
        let mut app = App::new("s2", "m", "/ws");
        app.replay(&[ChatMessage::text(Role::System, "sys"), ChatMessage::text(Role::User, "find main"), call, result]);
        let s = screen(&app, 80, 12);
        assert!(s.contains("› find main") && s.contains("Looking.") && s.contains("✗ grep fn main"), "{s}");
        assert!(!s.contains("sys"));
        // Many lines: the last ones show; PageUp scrolls back.
        for i in 0..50 {
            app.on_event(Event::TextDelta { text: format!("line {i}\n") });
        }
        let s = screen(&app, 80, 12);
        assert!(s.contains("line 49") && !s.contains("line 10"), "{s}");
        app.on_key(key(KeyCode::PageUp));
        app.on_key(key(KeyCode::PageUp));
        let s = screen(&app, 80, 12);
        assert!(!s.contains("line 49") && s.contains("line 29") && !s.contains("line 30"), "{s}");
    }

    #[test]
    fn shift_tab_switches_to_plan_mode_and_ctrl_y_builds_the_plan() {
        use caret_protocol::agent::{Mode, Plan, PlanStep};
        let mut app = App::new("s", "m", "/ws");
        assert_eq!(app.on_key(key(KeyCode::BackTab)), Action::Op(Op::SetMode { mode: Mode::Plan }));
        app.on_event(Event::ModeChanged { mode: Mode::Plan });
        assert!(screen(&app, 100, 12).contains("plan mode (Shift-Tab: build)"));
        let ctrl_y = KeyEvent::new(KeyCode::Char('y'), KeyModifiers::CONTROL);
        assert_eq!(app.on_key(ctrl_y), Action::None, "no plan yet");
        let plan = Plan {
            summary: "Fix add.sh".into(),
            steps: vec![PlanStep { title: "Use +".into(), files: vec!["add.sh".into()], details: String::new() }],
            risks: vec![],
        };
        app.on_event(Event::PlanProposed { plan: plan.clone() });
        let s = screen(&app, 100, 16);
        assert!(s.contains("Plan: Fix add.sh") && s.contains("1. Use + (add.sh)") && s.contains("Ctrl-Y"), "{s}");
        assert_eq!(app.on_key(ctrl_y), Action::Op(Op::ApprovePlan { plan }));
        assert_eq!(app.on_key(ctrl_y), Action::None, "built once");
    }

    #[test]
    fn custom_commands_complete_at_the_start_of_a_request() {
        let mut app = App::new("s", "m", "/ws");
        app.commands(vec!["review".into(), "git:commit".into(), "release".into()]);
        for c in "/re".chars() {
            app.on_key(key(KeyCode::Char(c)));
        }
        let s = screen(&app, 80, 16);
        assert!(s.contains("│ /review") && s.contains("│ /release") && !s.contains("│ /git:commit"), "{s}");
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.input, "/review ");
        // Past the name, and anywhere but the start, nothing completes to a command.
        assert!(!screen(&app, 80, 16).contains("│ /release"));
    }

    #[test]
    fn docs_mentions_complete_from_the_sources() {
        let mut app = App::new("s3", "m", "/ws");
        app.docs(vec!["sqlite".into(), "mylib".into()]);
        for c in "how do I use @d".chars() {
            app.on_key(key(KeyCode::Char(c)));
        }
        let s = screen(&app, 80, 16);
        assert!(s.contains("│ @Docs sqlite") && s.contains("│ @Docs mylib"), "{s}");
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.input, "how do I use @Docs sqlite ");
        assert!(!screen(&app, 80, 16).contains("@Docs mylib"), "nothing left to complete");
        for c in "and @docs my".chars() {
            app.on_key(key(KeyCode::Char(c)));
        }
        let s = screen(&app, 80, 16);
        assert!(s.contains("│ @Docs mylib") && !s.contains("│ @Docs sqlite"), "{s}");
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.input, "how do I use @Docs sqlite and @Docs mylib ");
        // Nothing to complete: Tab changes nothing, and no box is drawn.
        app.on_key(key(KeyCode::Char('x')));
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.input, "how do I use @Docs sqlite and @Docs mylib x");
        assert!(!screen(&app, 80, 16).contains(" Tab "));
        let mut bare = App::new("s4", "m", "/ws");
        bare.on_key(key(KeyCode::Char('@')));
        bare.on_key(key(KeyCode::Char('d')));
        assert!(bare.completions().1.is_empty(), "no sources, no completions");
    }
}
