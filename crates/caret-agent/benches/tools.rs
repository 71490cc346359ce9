//! A model turn with 10 `read_file` calls (and one with 10 `grep` calls): run as the agent
//! runs them (one concurrent batch) against one after another, in the same process; prints
//! medians, the slowest single call, and the ratio. Then the agent's own overhead per turn:
//! whole turns against an instant scripted model (a test double), minus the tools' time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use caret_agent::batch::{Call, run_calls};
use caret_agent::tools::{Ctx, Registry};
use serde_json::json;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let dir = std::env::temp_dir().join(format!("caret-agent-bench-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("src")).unwrap();
    // Ten source files of 20,000 lines (~0.9 MB) each.
    for f in 0..10 {
        let text: String =
            (0..20_000).map(|i| format!("fn item_{f}_{i}(x: u64) -> u64 {{ x * {i} + {f} }}\n")).collect();
        std::fs::write(dir.join(format!("src/m{f}.rs")), text).unwrap();
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let tools = Registry::read_only();
    let ctx = Arc::new(Ctx::new(&dir).unwrap());
    let runs = 15;
    for (what, calls) in [
        (
            "10 read_file (lines 19,000-19,400 of 20,000)",
            (0..10)
                .map(|f| Call {
                    id: format!("c{f}"),
                    name: "read_file".into(),
                    arguments: json!({"path": format!("src/m{f}.rs"), "start_line": 19_000, "end_line": 19_400}),
                })
                .collect::<Vec<_>>(),
        ),
        (
            "10 grep over 10 files (9 MB)",
            (0..10)
                .map(|f| Call {
                    id: format!("g{f}"),
                    name: "grep".into(),
                    arguments: json!({"pattern": format!("item_{f}_1999[0-9]\\b")}),
                })
                .collect::<Vec<_>>(),
        ),
    ] {
        let (mut batch, mut serial, mut slowest) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let started = Instant::now();
            let outs = rt.block_on(run_calls(&tools, &calls, &ctx, &|_| {}, &|_| {}));
            batch.push(started.elapsed());
            assert!(outs.iter().all(|o| o.ok), "{:?}", outs.iter().find(|o| !o.ok));
            slowest.push(outs.iter().map(|o| o.duration).max().unwrap());
            let started = Instant::now();
            for c in &calls {
                rt.block_on(run_calls(&tools, std::slice::from_ref(c), &ctx, &|_| {}, &|_| {}));
            }
            serial.push(started.elapsed());
        }
        let (b, s, w) = (median(batch), median(serial), median(slowest));
        println!(
            "{what}: one batch {:.1} ms, one after another {:.1} ms ({:.2}x); slowest call in the batch {:.1} ms \
             (batch / slowest {:.2})",
            b.as_secs_f64() * 1e3,
            s.as_secs_f64() * 1e3,
            s.as_secs_f64() / b.as_secs_f64(),
            w.as_secs_f64() * 1e3,
            b.as_secs_f64() / w.as_secs_f64()
        );
    }
    overhead(&rt, &dir);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A model that answers at once: first a `read_file` call, then text.
struct InstantModel;

#[async_trait::async_trait]
impl caret_agent::session::ModelClient for InstantModel {
    async fn chat(&self, req: caret_protocol::llm::ChatRequest) -> caret_models::Result<caret_models::EventStream> {
        use caret_models::Event;
        use futures::StreamExt as _;
        let answered = req.messages.iter().any(|m| m.role == caret_protocol::llm::Role::Tool);
        let events = if answered {
            vec![Event::Text("done".into())]
        } else {
            vec![Event::ToolCall {
                index: 0,
                id: Some("c".into()),
                name: Some("read_file".into()),
                arguments: r#"{"path": "src/m0.rs", "end_line": 50}"#.into(),
            }]
        };
        Ok(futures::stream::iter(events.into_iter().map(Ok)).boxed())
    }
}

fn overhead(rt: &tokio::runtime::Runtime, dir: &std::path::Path) {
    use caret_agent::session::Session;
    use caret_protocol::agent::Event;
    let ctx = Arc::new(Ctx::new(dir).unwrap());
    let mut times = Vec::new();
    for _ in 0..200 {
        let mut session = Session::new(Arc::new(InstantModel), "instant", Registry::workspace(), ctx.clone());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (_ops_tx, mut ops) = tokio::sync::mpsc::unbounded_channel();
        let started = Instant::now();
        rt.block_on(session.turn("read it", &tx, &mut ops));
        let total = started.elapsed();
        let mut tool = Duration::ZERO;
        while let Ok(e) = rx.try_recv() {
            if let Event::ToolCallEnd { duration_ms, .. } = e {
                tool += Duration::from_secs_f64(duration_ms / 1e3);
            }
        }
        times.push(total.saturating_sub(tool));
    }
    times.sort();
    println!(
        "agent overhead per turn (2 model calls, 1 tool call; model and tool time excluded), median / p99 of 200: \
         {:.3} / {:.3} ms",
        times[100].as_secs_f64() * 1e3,
        times[198].as_secs_f64() * 1e3
    );
}
