//! `caret bench mcp`: what an MCP server costs an agent — time to start one and list its
//! tools, the round trip of a tool call over stdio (an upper bound on the client's overhead:
//! the server's own work for the call is included), and how long taking the tools blocks a
//! session while three servers are still starting.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use caret_agent::tools::Ctx;
use caret_mcp::{Approval, Hub, ServerConfig, Status, Transport};

/// The bench's settings.
#[derive(Debug, Clone)]
pub struct McpBench {
    /// A Python with `mcp-server-time` installed.
    pub python: String,
    /// Tool calls to time.
    pub calls: usize,
}

fn time_server(name: &str, python: &str) -> ServerConfig {
    ServerConfig {
        name: name.to_owned(),
        transport: Transport::stdio(python, &["-m", "mcp_server_time", "--local-timezone", "UTC"]),
        approval: Approval::Always,
        tool_timeout: Duration::from_secs(30),
        tools: Default::default(),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs the bench and prints its figures.
pub fn run(bench: McpBench) -> anyhow::Result<ExitCode> {
    let rt = caret_host::runtime::runtime()?;
    rt.block_on(async {
        let scratch = tempfile::tempdir()?;
        let ctx = Ctx::new(scratch.path())?;
        // Taking the tools while three servers start: what a session's first model call waits.
        let three = Hub::new((0..3).map(|i| time_server(&format!("t{i}"), &bench.python)).collect());
        let started = Instant::now();
        let offered = three.tools().len();
        let blocked = started.elapsed();
        three.settled(Duration::from_secs(60)).await;
        let ready = started.elapsed();
        anyhow::ensure!(
            three.status().iter().all(|(_, s)| matches!(s, Status::Ready { .. })),
            "the servers did not start: {:?} (is mcp-server-time installed for {}?)",
            three.status(),
            bench.python
        );
        println!(
            "caret bench mcp: {} -m mcp_server_time\n\nthree servers starting: taking the tools took {:.3} ms ({offered} ready then); all three ready after {:.0} ms",
            bench.python,
            ms(blocked),
            ms(ready)
        );
        drop(three);

        let hub = Hub::new(vec![time_server("time", &bench.python)]);
        hub.settled(Duration::from_secs(60)).await;
        let tool = hub
            .tools()
            .into_iter()
            .find(|t| t.spec().name == "mcp__time__get_current_time")
            .context("the time server offers no get_current_time")?;
        let args = serde_json::json!({"timezone": "UTC"});
        for _ in 0..10 {
            tool.call(args.clone(), &ctx).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let mut took = Vec::with_capacity(bench.calls);
        for _ in 0..bench.calls.max(1) {
            let t = Instant::now();
            tool.call(args.clone(), &ctx).await.map_err(|e| anyhow::anyhow!("{e}"))?;
            took.push(ms(t.elapsed()));
        }
        took.sort_by(f64::total_cmp);
        let q = |p: f64| took[((took.len() - 1) as f64 * p).round() as usize];
        println!(
            "a tool call over stdio (get_current_time, {} calls): p50 {:.3} ms, p99 {:.3} ms — the server's own work included",
            took.len(),
            q(0.5),
            q(0.99)
        );
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
