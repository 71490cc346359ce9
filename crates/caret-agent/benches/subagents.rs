//! Subagents side by side: a turn whose one answer starts three explorers, against a scripted
//! model (a test double) whose subagent calls take fixed latencies (200, 300 and 400 ms, by the
//! task's name) — the turn's time against the slowest subagent's alone. Prints both and the
//! ratio (target: under 1.5).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caret_agent::session::{ModelClient, Session};
use caret_agent::tools::{Ctx, Registry};
use caret_models::{Event as ModelEvent, EventStream};
use caret_protocol::llm::ChatRequest;
use futures::StreamExt as _;
use serde_json::json;

/// The parent's answers in order; a subagent's answer after its task's latency.
struct Scripted {
    parent: Mutex<Vec<Vec<ModelEvent>>>,
}

#[async_trait::async_trait]
impl ModelClient for Scripted {
    async fn chat(&self, req: ChatRequest) -> caret_models::Result<EventStream> {
        if req.messages[0].content_text().contains("You are the subagent") {
            let task = req.messages.last().unwrap().content_text();
            let ms = if task.contains("slow") {
                400
            } else if task.contains("medium") {
                300
            } else {
                200
            };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            return Ok(futures::stream::iter([Ok(ModelEvent::Text(format!("report: {task}")))]).boxed());
        }
        let next = self.parent.lock().unwrap().pop();
        let events = next.unwrap_or_else(|| vec![ModelEvent::Text("done".into())]);
        Ok(futures::stream::iter(events.into_iter().map(Ok)).boxed())
    }
}

fn tasks(names: &[&str]) -> Vec<ModelEvent> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| ModelEvent::ToolCall {
            index: i as u32,
            id: Some(format!("t{i}")),
            name: Some("task".into()),
            arguments: json!({"description": n, "prompt": format!("look at the {n} part")}).to_string(),
        })
        .collect()
}

fn turn(rt: &tokio::runtime::Runtime, dir: &std::path::Path, names: &[&str]) -> Duration {
    let model = Arc::new(Scripted { parent: Mutex::new(vec![tasks(names)]) });
    let ctx = Arc::new(Ctx::new(dir).unwrap());
    let mut session = Session::new(model, "bench", Registry::read_only(), ctx);
    caret_agent::subagents::enable(&mut session, vec![caret_agent::subagents::explorer()]);
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let (_ops_tx, mut ops) = tokio::sync::mpsc::unbounded_channel();
    let started = Instant::now();
    rt.block_on(session.turn("explore", &tx, &mut ops));
    started.elapsed()
}

fn main() {
    let dir = std::env::temp_dir().join(format!("caret-subagents-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let median = |names: &[&str]| {
        let mut v: Vec<Duration> = (0..5).map(|_| turn(&rt, &dir, names)).collect();
        v.sort();
        v[2]
    };
    let alone = median(&["slow"]);
    let together = median(&["fast", "medium", "slow"]);
    println!("subagents (scripted model: 200, 300 and 400 ms; medians of 5 turns):");
    println!("  the slowest alone   {:7.1} ms", alone.as_secs_f64() * 1e3);
    println!("  all three at once   {:7.1} ms", together.as_secs_f64() * 1e3);
    println!("  ratio               {:7.2} (target < 1.5)", together.as_secs_f64() / alone.as_secs_f64());
    let _ = std::fs::remove_dir_all(&dir);
}
