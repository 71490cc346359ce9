//! Plan mode, subagents and custom commands through whole turns, driven by a scripted model (a
//! test double): the parent's answers are scripted in order; a subagent's request (its system
//! prompt names it) is answered after a delay with a report naming its task.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use caret_agent::session::{ModelClient, Session};
use caret_agent::tools::{Ctx, Registry};
use caret_models::{Event as ModelEvent, EventStream};
use caret_protocol::agent::{Event, Mode, Op, TurnEnd};
use caret_protocol::llm::ChatRequest;
use caret_test_support::TempDir;
use futures::StreamExt as _;
use tokio::sync::mpsc;

/// A test double: the parent's calls get the next scripted answer; a subagent's get its report.
struct ScriptedModel {
    answers: Mutex<VecDeque<Vec<ModelEvent>>>,
    requests: Mutex<Vec<ChatRequest>>,
    subagent_delay: Duration,
    /// Subagent calls answering now, and the most at once.
    in_flight: AtomicUsize,
    most: AtomicUsize,
}

#[async_trait::async_trait]
impl ModelClient for ScriptedModel {
    async fn chat(&self, req: ChatRequest) -> caret_models::Result<EventStream> {
        self.requests.lock().unwrap().push(req.clone());
        let system = req.messages[0].content_text();
        if system.contains("You are the subagent") {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(self.subagent_delay).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            let task = req.messages.last().unwrap().content_text();
            let usage = caret_protocol::llm::Usage::new(100, 10);
            let events = vec![ModelEvent::Text(format!("report on: {task}")), ModelEvent::Usage(usage)];
            return Ok(futures::stream::iter(events.into_iter().map(Ok)).boxed());
        }
        Ok(match self.answers.lock().unwrap().pop_front() {
            Some(events) => futures::stream::iter(events.into_iter().map(Ok)).boxed(),
            None => futures::stream::iter([Ok(ModelEvent::Text("done".into()))]).boxed(),
        })
    }
}

fn calls(list: &[(&str, &str, serde_json::Value)]) -> Vec<ModelEvent> {
    list.iter()
        .enumerate()
        .map(|(i, (id, name, args))| ModelEvent::ToolCall {
            index: i as u32,
            id: Some((*id).to_owned()),
            name: Some((*name).to_owned()),
            arguments: args.to_string(),
        })
        .collect()
}

fn setup(answers: Vec<Vec<ModelEvent>>) -> (Session, Arc<ScriptedModel>, TempDir) {
    let dir = TempDir::new();
    dir.write("add.sh", "echo $(( $1 - $2 ))\n");
    let model = Arc::new(ScriptedModel {
        answers: Mutex::new(answers.into()),
        requests: Mutex::default(),
        subagent_delay: Duration::from_millis(300),
        in_flight: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
    });
    let ctx = Arc::new(Ctx::new(dir.path()).unwrap());
    let session = Session::new(model.clone(), "scripted", Registry::workspace(), ctx);
    (session, model, dir)
}

/// Runs `f` with an event channel and collects what it emitted.
async fn collect<F, Fut>(f: F) -> (TurnEnd, Vec<Event>)
where
    F: FnOnce(mpsc::UnboundedSender<Event>, mpsc::UnboundedReceiver<Op>) -> Fut,
    Fut: std::future::Future<Output = TurnEnd>,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (_ops_tx, ops) = mpsc::unbounded_channel();
    let end = f(tx, ops).await;
    let mut seen = Vec::new();
    while let Ok(e) = rx.try_recv() {
        seen.push(e);
    }
    (end, seen)
}

fn tool_names(req: &ChatRequest) -> Vec<String> {
    req.tools.iter().map(|t| t.function.name.clone()).collect()
}

#[tokio::test]
async fn plan_mode_reads_proposes_a_plan_and_builds_it_once_approved() {
    let edit = serde_json::json!({"path": "add.sh", "edit": "<<<<<<< SEARCH\necho $(( $1 - $2 ))\n=======\necho $(( $1 + $2 ))\n>>>>>>> REPLACE\n"});
    let plan = serde_json::json!({"summary": "Fix add.sh", "steps": [
        {"title": "Replace - with +", "files": ["add.sh"]}], "risks": ["none"]});
    let (mut session, model, dir) = setup(vec![
        // Planning: a read, an edit it may not make, then the plan.
        calls(&[("r1", "read_file", serde_json::json!({"path": "add.sh"})), ("e1", "edit_file", edit.clone())]),
        calls(&[("p1", "submit_plan", plan.clone())]),
        // Building: the edit, then a word.
        calls(&[("e2", "edit_file", edit)]),
    ]);
    let (end, seen) = collect(|tx, mut ops| async move {
        session.set_mode(Mode::Plan, &tx);
        let end = session.turn("add.sh subtracts", &tx, &mut ops).await;
        let untouched = std::fs::read_to_string(dir.join("add.sh")).unwrap();
        assert_eq!(untouched, "echo $(( $1 - $2 ))\n", "plan mode changed a file");
        let proposed = caret_agent::plan::parse(&plan).unwrap();
        let built = session.build_plan(&proposed, &tx, &mut ops).await;
        assert_eq!(built, TurnEnd::Done);
        assert_eq!(std::fs::read_to_string(dir.join("add.sh")).unwrap(), "echo $(( $1 + $2 ))\n");
        assert_eq!(session.mode(), Mode::Build);
        end
    })
    .await;
    assert_eq!(end, TurnEnd::Done);
    let requests = model.requests.lock().unwrap().clone();
    let planning = tool_names(&requests[0]);
    assert!(planning.contains(&"submit_plan".to_owned()) && planning.contains(&"read_file".to_owned()));
    assert!(!planning.contains(&"edit_file".to_owned()) && !planning.contains(&"run_terminal_cmd".to_owned()));
    assert!(requests[0].messages.last().unwrap().content_text().contains("[Plan mode:"));
    let building = tool_names(&requests[2]);
    assert!(building.contains(&"edit_file".to_owned()) && !building.contains(&"submit_plan".to_owned()));
    let refused = seen.iter().find_map(|e| match e {
        Event::ToolCallEnd { call_id, ok: false, output, .. } if call_id == "e1" => Some(output.clone()),
        _ => None,
    });
    assert!(refused.unwrap().contains("plan mode"), "the edit was refused in plan mode");
    assert!(seen.iter().any(|e| matches!(e, Event::PlanProposed { plan } if plan.steps.len() == 1)));
    assert!(seen.iter().any(|e| matches!(e, Event::ModeChanged { mode: Mode::Build })));
    assert!(seen.iter().any(|e| matches!(e, Event::TodoUpdate { items } if items[0].content == "Replace - with +")));
}

#[tokio::test]
async fn three_explorers_run_at_once_their_events_nested_and_their_tokens_counted() {
    let task = |what: &str| serde_json::json!({"description": what, "prompt": format!("find {what}")});
    let (mut session, model, _dir) = setup(vec![calls(&[
        ("t1", "task", task("the parser")),
        ("t2", "task", task("the lexer")),
        ("t3", "task", task("the printer")),
    ])]);
    caret_agent::subagents::enable(&mut session, vec![caret_agent::subagents::explorer()]);
    let (end, seen) = collect(|tx, mut ops| async move {
        let end = session.turn("how does this compile?", &tx, &mut ops).await;
        assert!(session.usage().0 >= 300, "the subagents' prompt tokens count: {:?}", session.usage());
        end
    })
    .await;
    assert_eq!(end, TurnEnd::Done);
    // Each ran in its own session, with read-only tools and no task of its own.
    let requests = model.requests.lock().unwrap().clone();
    let subs: Vec<&ChatRequest> =
        requests.iter().filter(|r| r.messages[0].content_text().contains("You are the subagent")).collect();
    assert_eq!(subs.len(), 3);
    for r in &subs {
        let tools = tool_names(r);
        assert!(
            tools.contains(&"read_file".to_owned())
                && !tools.contains(&"edit_file".to_owned())
                && !tools.contains(&"task".to_owned())
        );
    }
    let reports: Vec<String> = seen
        .iter()
        .filter_map(|e| match e {
            Event::ToolCallEnd { name, ok: true, output, .. } if name == "task" => Some(output.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(reports.len(), 3, "{seen:?}");
    assert!(reports.iter().any(|r| r.contains("report on: find the lexer")));
    let nested = seen.iter().filter(|e| matches!(e, Event::Subagent { agent, .. } if agent == "explorer")).count();
    assert!(nested >= 6, "each subagent's turn begins and ends under its call: {nested}");
    assert_eq!(model.most.load(Ordering::SeqCst), 3, "the three subagents did not run at once");
}

#[tokio::test]
async fn a_custom_command_becomes_its_prompt_with_its_model_and_tools() {
    let dir = TempDir::new();
    dir.write(
        ".claude/commands/review.md",
        "---\ndescription: Review a file\nallowed-tools: Read, Grep\nmodel: big\n---\nReview $1 for $2.\n",
    );
    let (commands, _) =
        caret_agent::commands::discover(&[(dir.path().join(".claude/commands"), ".claude/commands".into())]);
    let (mut session, model, _d) = setup(vec![]);
    session.commands = commands;
    let (end, seen) =
        collect(|tx, mut ops| async move { session.turn("/review add.sh overflow", &tx, &mut ops).await }).await;
    assert_eq!(end, TurnEnd::Done);
    let req = model.requests.lock().unwrap()[0].clone();
    assert_eq!(req.model, "big");
    assert_eq!(tool_names(&req), vec!["grep".to_owned(), "read_file".to_owned()]);
    assert!(req.messages.last().unwrap().content_text().starts_with("Review add.sh for overflow."));
    assert!(seen.iter().any(|e| matches!(e, Event::Notice { message } if message == "/review (.claude/commands)")));
}
