//! Whole agent turns driven by a scripted model (a test double that answers each model call
//! with the next scripted answer): parallel reads, an edit, an approval, a refused command,
//! an interrupt.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use caret_agent::policy::{Action, Rule};
use caret_agent::session::{ModelClient, Session};
use caret_agent::tools::terminal::RunTerminalCmd;
use caret_agent::tools::{Ctx, Registry};
use caret_models::{Event as ModelEvent, EventStream};
use caret_protocol::agent::{Decision, Event, Op, TurnEnd};
use caret_protocol::llm::{ChatRequest, Role};
use caret_sandbox::{Bwrap, Policy as SandboxPolicy};
use caret_test_support::TempDir;
use futures::StreamExt as _;
use tokio::sync::mpsc;

/// A test double: each model call gets the next scripted answer; with none left it hangs.
struct ScriptedModel {
    answers: Mutex<VecDeque<Vec<ModelEvent>>>,
    requests: Mutex<Vec<ChatRequest>>,
}

#[async_trait::async_trait]
impl ModelClient for ScriptedModel {
    async fn chat(&self, req: ChatRequest) -> caret_models::Result<EventStream> {
        self.requests.lock().unwrap().push(req);
        Ok(match self.answers.lock().unwrap().pop_front() {
            Some(events) => futures::stream::iter(events.into_iter().map(Ok)).boxed(),
            None => futures::stream::pending().boxed(),
        })
    }
}

fn calls(list: &[(&str, &str, &str)]) -> Vec<ModelEvent> {
    list.iter()
        .enumerate()
        .map(|(i, (id, name, args))| ModelEvent::ToolCall {
            index: i as u32,
            id: Some((*id).to_owned()),
            name: Some((*name).to_owned()),
            arguments: (*args).to_owned(),
        })
        .collect()
}

fn text(t: &str) -> Vec<ModelEvent> {
    vec![ModelEvent::Text(t.to_owned())]
}

fn setup(answers: Vec<Vec<ModelEvent>>) -> (Session, Arc<ScriptedModel>, TempDir) {
    let dir = TempDir::new();
    dir.write("src/a.py", "def a():\n    return 1\n");
    dir.write("src/b.py", "def b():\n    return 2\n");
    dir.write("notes.txt", "scratch\n");
    let model = Arc::new(ScriptedModel { answers: Mutex::new(answers.into()), requests: Mutex::default() });
    let ctx = Arc::new(Ctx::new(dir.path()).unwrap());
    let mut tools = Registry::workspace();
    let sandbox = Bwrap::new(SandboxPolicy::new(dir.path()).unwrap()).expect("bubblewrap (Debian: bubblewrap)");
    tools.add(Arc::new(RunTerminalCmd::new(Arc::new(sandbox))));
    let session = Session::new(model.clone(), "scripted", tools, ctx);
    (session, model, dir)
}

#[tokio::test]
async fn a_turn_reads_in_parallel_edits_asks_and_answers() {
    let edit =
        r#"{"path": "src/a.py", "edit": "<<<<<<< SEARCH\n    return 1\n=======\n    return 10\n>>>>>>> REPLACE\n"}"#;
    let (mut session, model, dir) = setup(vec![
        calls(&[("r1", "read_file", r#"{"path": "src/a.py"}"#), ("r2", "read_file", r#"{"path": "src/b.py"}"#)]),
        calls(&[
            ("e1", "edit_file", edit),
            ("t1", "todo_write", r#"{"todos": [{"id": "1", "content": "edit a", "status": "completed"}]}"#),
        ]),
        calls(&[("x1", "run_terminal_cmd", r#"{"command": "rm notes.txt && ls src"}"#)]),
        calls(&[("x2", "run_terminal_cmd", r#"{"command": "git push origin main"}"#)]),
        text("Changed `a` to return 10."),
    ]);
    session.policy.rules.push(Rule { prefix: "git push".into(), action: Action::Deny });
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (ops_tx, mut ops) = mpsc::unbounded_channel();
    // The user approves the risky command when asked.
    let watcher = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(e) = events.recv().await {
            if let Event::ApprovalRequest { call_id, .. } = &e {
                ops_tx.send(Op::Approval { call_id: call_id.clone(), decision: Decision::Approve }).unwrap();
            }
            seen.push(e);
        }
        seen
    });
    let end = session.turn("make a return 10", &events_tx, &mut ops).await;
    assert_eq!(end, TurnEnd::Done);
    drop(events_tx);
    let seen = watcher.await.unwrap();

    assert_eq!(std::fs::read_to_string(dir.join("src/a.py")).unwrap(), "def a():\n    return 10\n");
    assert!(!dir.join("notes.txt").exists(), "the approved command ran");
    let ends: Vec<(&str, bool)> = seen
        .iter()
        .filter_map(|e| match e {
            Event::ToolCallEnd { call_id, ok, .. } => Some((call_id.as_str(), *ok)),
            _ => None,
        })
        .collect();
    assert_eq!(ends.len(), 6, "{seen:?}");
    assert!(ends.contains(&("x1", true)) && ends.contains(&("x2", false)), "{ends:?}");
    assert!(seen.iter().any(
        |e| matches!(e, Event::FileChange { path, diff, .. } if path == "src/a.py" && diff.contains("+    return 10"))
    ));
    assert!(seen.iter().any(|e| matches!(e, Event::TodoUpdate { items } if items.len() == 1)));
    assert!(
        seen.iter().any(|e| matches!(e, Event::ApprovalRequest { command, .. } if command.starts_with("rm notes.txt")))
    );
    assert!(matches!(seen.first(), Some(Event::TurnBegin { turn: 1 })));
    assert!(matches!(seen.last(), Some(Event::TurnEnd { turn: 1, reason: TurnEnd::Done })));
    assert!(seen.iter().any(|e| matches!(e, Event::TextDelta { text } if text.contains("return 10"))));

    // The model saw the reads' results in call order, and the refusal's reason.
    let requests = model.requests.lock().unwrap();
    assert_eq!(requests.len(), 5);
    assert!(requests[0].tools.iter().any(|t| t.function.name == "grep") && requests[0].tools.len() == 9);
    let tool_msgs: Vec<String> =
        requests[1].messages.iter().filter(|m| m.role == Role::Tool).map(|m| m.content_text()).collect();
    assert_eq!(tool_msgs.len(), 2);
    assert!(tool_msgs[0].contains("def a()") && tool_msgs[1].contains("def b()"), "{tool_msgs:?}");
    let last_tool = requests[4].messages.iter().rev().find(|m| m.role == Role::Tool).unwrap().content_text();
    assert!(last_tool.contains("refused by policy"), "{last_tool}");
}

#[tokio::test]
async fn an_interrupt_ends_the_turn_and_a_denial_reaches_the_model() {
    // The model hangs (no scripted answer): Esc ends the turn.
    let (mut session, _model, _dir) = setup(vec![]);
    let (events_tx, _events) = mpsc::unbounded_channel();
    let (ops_tx, mut ops) = mpsc::unbounded_channel();
    ops_tx.send(Op::Interrupt).unwrap();
    assert_eq!(session.turn("hello", &events_tx, &mut ops).await, TurnEnd::Interrupted);

    // The user says no: the command does not run and the model is told.
    let (mut session, model, dir) =
        setup(vec![calls(&[("x", "run_terminal_cmd", r#"{"command": "rm notes.txt"}"#)]), text("Understood.")]);
    let (ops_tx, mut ops) = mpsc::unbounded_channel();
    ops_tx.send(Op::Approval { call_id: "x".into(), decision: Decision::Deny }).unwrap();
    assert_eq!(session.turn("clean up", &events_tx, &mut ops).await, TurnEnd::Done);
    assert!(dir.join("notes.txt").exists());
    let requests = model.requests.lock().unwrap();
    let told = requests[1].messages.iter().rev().find(|m| m.role == Role::Tool).unwrap().content_text();
    assert!(told.contains("refused"), "{told}");
}

#[tokio::test]
async fn a_saved_session_resumes_even_after_a_torn_last_line() {
    let (mut session, _model, dir) =
        setup(vec![calls(&[("r1", "read_file", r#"{"path": "src/a.py"}"#)]), text("It returns 1.")]);
    let file = dir.join("sessions/s1.jsonl");
    session.persist(&file, "s1").unwrap();
    let (events_tx, _events) = mpsc::unbounded_channel();
    let (_ops_tx, mut ops) = mpsc::unbounded_channel();
    assert_eq!(session.turn("what does a return?", &events_tx, &mut ops).await, TurnEnd::Done);
    // A crash in the middle of writing a line.
    let mut f = std::fs::OpenOptions::new().append(true).open(&file).unwrap();
    std::io::Write::write_all(&mut f, br#"{"role":"user","cont"#).unwrap();
    drop(f);
    let (mut resumed, model, _dir2) = setup(vec![text("2.")]);
    resumed.resume(&file).unwrap();
    assert_eq!(resumed.messages(), session.messages());
    assert_eq!(resumed.turn("and b?", &events_tx, &mut ops).await, TurnEnd::Done);
    let sent = &model.requests.lock().unwrap()[0];
    assert_eq!(sent.messages.len(), session.messages().len() + 1);
    // What was said after resuming is in the file too.
    let again = {
        let (mut s, _m, _d) = setup(vec![]);
        s.resume(&file).unwrap();
        s.messages().len()
    };
    assert_eq!(again, session.messages().len() + 2);
    assert!(resumed.resume(&dir.join("src/a.py")).is_err(), "not a session file");
}

#[tokio::test]
async fn old_turns_are_summarised_near_the_window_and_the_file_follows() {
    use caret_protocol::llm::Usage;
    let read = |id: &str| calls(&[(id, "read_file", r#"{"path": "big.txt"}"#)]);
    let mut first = read("r1");
    first.push(ModelEvent::Usage(Usage::new(900, 10)));
    let mut summary = text("The user asked to read big.txt; it was read (lines of filler).");
    summary.push(ModelEvent::Usage(Usage::new(700, 20)));
    let (mut session, model, dir) =
        setup(vec![first, read("r2"), read("r3"), read("r4"), summary, text("Read it four times.")]);
    dir.write("big.txt", &"filler line of the big file\n".repeat(80));
    session.context_window = 1500;
    let file = dir.join(".sessions/s.jsonl");
    session.persist(&file, "s").unwrap();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (_ops_tx, mut ops) = mpsc::unbounded_channel();
    assert_eq!(session.turn("read big.txt", &events_tx, &mut ops).await, TurnEnd::Done);
    drop(events_tx);
    let mut seen = Vec::new();
    while let Some(e) = events.recv().await {
        seen.push(e);
    }
    // Before the fifth call: system, user, 4 × (call, result) = 10 messages, over 75% of 1,500.
    let compacted = seen.iter().find_map(|e| match e {
        Event::Compacted { messages_before, messages_after, tokens_before, tokens_after } => {
            Some((*messages_before, *messages_after, *tokens_before, *tokens_after))
        }
        _ => None,
    });
    let (before, after, tokens_before, tokens_after) = compacted.expect("a compaction");
    assert_eq!((before, after), (10, 8));
    assert!(tokens_before > 1125 && tokens_after < tokens_before, "{tokens_before} → {tokens_after}");
    assert!(seen.iter().any(|e| matches!(e, Event::TokenUsage { context_window: 1500, prompt_tokens: 900, .. })));

    let requests = model.requests.lock().unwrap();
    assert_eq!(requests.len(), 6);
    // The summary request: no tools, the old part as a transcript.
    let ask = &requests[4];
    assert!(ask.tools.is_empty());
    let transcript = ask.messages[1].content_text();
    assert!(transcript.contains("## user\nread big.txt") && transcript.contains("[calls read_file"), "{transcript}");
    // The next call sees the summary in place of the first exchange, and the recent ones whole.
    let last = &requests[5].messages;
    assert_eq!(last.len(), 8);
    assert_eq!(last[0].role, Role::System);
    assert!(last[1].content_text().contains("summarised") && last[1].content_text().contains("asked to read big.txt"));
    assert_eq!(last[2].tool_calls[0].id, "r2");
    assert_eq!(last[3].role, Role::Tool);
    drop(requests);
    assert_eq!(session.usage(), (1600, 30, 2), "both reported usages counted, the summary's included");

    // The session file holds the compacted conversation, and resumes to it.
    let (mut resumed, _model, _dir2) = setup(vec![]);
    resumed.resume(&file).unwrap();
    assert_eq!(resumed.messages(), session.messages());
    assert_eq!(resumed.messages().len(), 9, "8 + the final answer");
}

#[test]
fn the_system_prompt_shows_the_repository_layout() {
    let (session, _model, _dir) = setup(vec![]);
    let system = session.messages()[0].content_text();
    assert!(system.contains("Repository layout:\nnotes.txt\nsrc/\nsrc/a.py\nsrc/b.py"), "{system}");
}

/// Files the request names are shown with it (and count as read); names that are not small
/// text files of the workspace are left alone.
#[tokio::test]
async fn files_a_request_names_come_with_it() {
    let write = r#"{"path": "src/a.py", "content": "def a():\n    return 5\n"}"#;
    let (mut session, model, dir) = setup(vec![calls(&[("w1", "write_file", write)]), text("Done.")]);
    dir.write("big.txt", &"x".repeat(20_000));
    std::fs::write(dir.join("blob.bin"), b"\0\x01\x02").unwrap();
    let (events_tx, _events) = mpsc::unbounded_channel();
    let (_ops_tx, mut ops) = mpsc::unbounded_channel();
    let input = "Make `src/a.py` return 5 (see notes.txt, big.txt, blob.bin, missing.py, ../outside.py).";
    assert_eq!(session.turn(input, &events_tx, &mut ops).await, TurnEnd::Done);
    let first = model.requests.lock().unwrap()[0].messages[1].content_text();
    assert_eq!(
        first,
        format!(
            "{input}\n\nFiles named above, as they are now:\n\nsrc/a.py\n```\ndef a():\n    return 1\n```\
             \n\nnotes.txt\n```\nscratch\n```"
        )
    );
    // Attached counts as read: the whole-file write went through.
    assert_eq!(std::fs::read_to_string(dir.join("src/a.py")).unwrap(), "def a():\n    return 5\n");
}

/// A model that falls silent right after a failed call is asked once to go on; silence after
/// successful calls (or a second time) ends the turn.
#[tokio::test]
async fn silence_after_a_failed_call_is_asked_once_to_go_on() {
    let (mut session, model, _dir) = setup(vec![
        calls(&[("r1", "read_file", r#"{"path": "missing.py"}"#)]),
        text(""),
        calls(&[("r2", "read_file", r#"{"path": "also-missing.py"}"#)]),
        text(""),
    ]);
    let (events_tx, _events) = mpsc::unbounded_channel();
    let (_ops_tx, mut ops) = mpsc::unbounded_channel();
    assert_eq!(session.turn("read the file", &events_tx, &mut ops).await, TurnEnd::Done);
    let requests = model.requests.lock().unwrap();
    assert_eq!(requests.len(), 4, "asked once again after the first silence, not after the second");
    let third = &requests[2].messages;
    assert_eq!(third.last().unwrap().content_text(), caret_agent::session::GO_ON);
    assert_eq!(third.last().unwrap().role, Role::User);
}

/// A test double: a tool whose result carries an image (as an MCP server's screenshot does).
struct Screenshot(caret_agent::tools::Spec);

#[async_trait::async_trait]
impl caret_agent::tools::Tool for Screenshot {
    fn spec(&self) -> &caret_agent::tools::Spec {
        &self.0
    }
    async fn call(&self, _args: serde_json::Value, _ctx: &Ctx) -> caret_agent::tools::ToolResult {
        Ok("the page".to_owned())
    }
    async fn call_with_images(
        &self,
        _args: serde_json::Value,
        _ctx: &Ctx,
    ) -> caret_agent::tools::ToolResult<(String, Vec<caret_agent::tools::Image>)> {
        let image = caret_agent::tools::Image { mime: "image/png".into(), base64: "iVBORw0KGgo=".into() };
        Ok(("the page".to_owned(), vec![image]))
    }
}

/// A tool's images are attached after its result for a model that takes images, in a user
/// message of image parts; for one that does not, the result says what they were.
#[tokio::test]
async fn a_tools_images_reach_a_model_that_takes_images() {
    for takes in [true, false] {
        let dir = TempDir::new();
        let answers = vec![calls(&[("s1", "screenshot", "{}")]), text("I see the page.")];
        let model = Arc::new(ScriptedModel { answers: Mutex::new(answers.into()), requests: Mutex::default() });
        let spec = caret_agent::tools::Spec {
            name: "screenshot",
            description: "a picture of the page",
            parameters: serde_json::json!({"type": "object"}),
            read_only: true,
        };
        let mut tools = Registry::workspace();
        tools.add(Arc::new(Screenshot(spec)));
        let mut session = Session::new(model.clone(), "scripted", tools, Arc::new(Ctx::new(dir.path()).unwrap()));
        session.images = takes;
        let (events_tx, _events) = mpsc::unbounded_channel();
        let (_ops_tx, mut ops) = mpsc::unbounded_channel();
        assert_eq!(session.turn("look at the page", &events_tx, &mut ops).await, TurnEnd::Done);
        let requests = model.requests.lock().unwrap();
        let second = &requests[1].messages;
        let result = second.iter().find(|m| m.role == Role::Tool).unwrap().content_text();
        let last = second.last().unwrap();
        if takes {
            assert_eq!(result, "the page\n[1 image(s) (image/png) attached below]");
            let Some(caret_protocol::llm::Content::Parts(parts)) = &last.content else { panic!("{last:?}") };
            assert_eq!((last.role, parts.len()), (Role::User, 2));
            assert_eq!(parts[0].text.as_deref(), Some("Images from screenshot (call s1):"));
            assert_eq!(parts[1].image_data(), Some(("image/png", "iVBORw0KGgo=")));
        } else {
            assert_eq!(result, "the page\n[1 image(s) (image/png): this model does not take images]");
            assert_eq!(last.role, Role::Tool, "nothing attached");
        }
    }
}

/// The repository's rules files reach the model: `AGENTS.md` (root first, the nearest last)
/// in the system prompt, a glob rule with the first result of a call on a matching file,
/// a described rule through `fetch_rule`; each said once in a `rules_applied` event.
#[tokio::test]
async fn rules_files_reach_the_model_where_they_apply() {
    let dir = TempDir::new();
    dir.write("AGENTS.md", "Run tests with `make check`, never pytest directly.\n");
    dir.write("src/CLAUDE.md", "Code under src/ is Python 3.12.\n");
    dir.write("src/a.py", "def a():\n    return 1\n");
    dir.write("src/b.py", "def b():\n    return 2\n");
    dir.write(
        ".cursor/rules/python.mdc",
        "---\ndescription: Python style\nglobs: \"*.py\"\n---\nUse type hints everywhere.\n",
    );
    dir.write(
        ".caret/rules/release.md",
        "---\ndescription: How to cut a release\n---\nTag vX.Y.Z, then run scripts/release.sh.\n",
    );
    let answers = vec![
        calls(&[("r1", "read_file", r#"{"path": "src/a.py"}"#), ("r2", "read_file", r#"{"path": "src/b.py"}"#)]),
        calls(&[("f1", "fetch_rule", r#"{"name": ".caret/rules/release.md"}"#)]),
        text("Done."),
    ];
    let model = Arc::new(ScriptedModel { answers: Mutex::new(answers.into()), requests: Mutex::default() });
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let rules = caret_agent::project_rules::ProjectRules::load(
        &root,
        &root.join("src"),
        None,
        caret_agent::project_rules::DEFAULT_CAP,
    );
    let ctx = Arc::new(Ctx::new(dir.path()).unwrap().with_rules(rules));
    let mut session = Session::new(model.clone(), "scripted", Registry::workspace(), ctx);
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (_ops_tx, mut ops) = mpsc::unbounded_channel();
    assert_eq!(session.turn("Add a function c.", &events_tx, &mut ops).await, TurnEnd::Done);

    let requests = model.requests.lock().unwrap();
    let system = requests[0].messages[0].content_text();
    let (root_rule, src_rule) = (system.find("make check").unwrap(), system.find("Python 3.12").unwrap());
    assert!(root_rule < src_rule, "root first, the nearest last: {system}");
    assert!(system.contains("- .caret/rules/release.md: How to cut a release"), "{system}");
    assert!(!system.contains("type hints") && !system.contains("release.sh"), "{system}");
    let tool_names: Vec<&str> = requests[0].tools.iter().map(|t| t.function.name.as_str()).collect();
    assert!(tool_names.contains(&"fetch_rule"), "{tool_names:?}");
    // The glob rule comes once, with whichever of the two matching reads (they run together)
    // attached it first, naming that read's file.
    let results: Vec<String> =
        requests[1].messages.iter().filter(|m| m.role == Role::Tool).map(|m| m.content_text()).collect();
    let with_rule: Vec<(usize, &String)> =
        results.iter().enumerate().filter(|(_, r)| r.contains("Use type hints everywhere.")).collect();
    assert_eq!(with_rule.len(), 1, "{results:?}");
    let file = ["src/a.py", "src/b.py"][with_rule[0].0];
    let tag = format!("<rule name=\".cursor/rules/python.mdc\" applies-to=\"{file}\">");
    assert!(with_rule[0].1.contains(&tag), "{results:?}");
    let fetched = requests[2].messages.last().unwrap().content_text();
    assert!(fetched.contains("Tag vX.Y.Z"), "{fetched}");
    drop(requests);

    let mut applied = Vec::new();
    while let Ok(e) = events.try_recv() {
        if let Event::RulesApplied { rules, .. } = e {
            applied.push(rules);
        }
    }
    assert_eq!(
        applied,
        vec![
            vec!["AGENTS.md".to_owned(), "src/CLAUDE.md".to_owned()],
            vec![".cursor/rules/python.mdc".to_owned()],
            vec![".caret/rules/release.md".to_owned()],
        ]
    );
}
