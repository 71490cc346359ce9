//! `caret bench mcp`: what an MCP server costs an agent — time to start one and list its
//! tools, the round trip of a tool call over stdio and over Streamable HTTP on loopback (an
//! upper bound on the client's overhead: the server's own work for the call is included;
//! the HTTP server is a one-tool server written with the Python SDK that answers at once),
//! and how long a session's first model request waits while three servers start, against
//! the slowest server's own start.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use std::sync::Arc;

use anyhow::Context as _;
use caret_agent::session::{ModelClient, Session};
use caret_agent::tools::Ctx;
use caret_mcp::{Approval, Hub, ServerConfig, Status, Transport};
use futures::StreamExt as _;

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

/// A model that notes when it was first called, and with how many tools, and answers "done".
#[derive(Default)]
struct FirstCall(std::sync::Mutex<Option<(Instant, usize)>>);

#[async_trait::async_trait]
impl ModelClient for FirstCall {
    async fn chat(&self, req: caret_protocol::llm::ChatRequest) -> caret_models::Result<caret_models::EventStream> {
        if let Ok(mut first) = self.0.lock() {
            first.get_or_insert((Instant::now(), req.tools.len()));
        }
        Ok(futures::stream::iter([Ok(caret_models::Event::Text("done".into()))]).boxed())
    }
}

/// A server with one tool that answers at once, over stdio or (`pong.py PORT`) Streamable HTTP.
const PONG: &str = r#"
import sys
from mcp.server.mcpserver import MCPServer
server = MCPServer("pong")
@server.tool()
def pong() -> str:
    """Answers pong."""
    return "pong"
if len(sys.argv) > 1:
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]), json_response=True)
else:
    server.run()
"#;

/// The median and the 99th percentile of `took` (sorted here).
fn p50_p99(took: &mut [f64]) -> (f64, f64) {
    took.sort_by(f64::total_cmp);
    let q = |p: f64| took.get(((took.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(0.0);
    (q(0.5), q(0.99))
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
        // Three servers starting and a session's first request: when the model was first called
        // (and with how many tools), against when each server was ready (watched every 5 ms).
        let three = Hub::new((0..3).map(|i| time_server(&format!("t{i}"), &bench.python)).collect());
        let model = Arc::new(FirstCall::default());
        let tools = caret_agent::tools::Registry::read_only();
        let mut session = Session::new(model.clone(), "bench", tools, Arc::new(Ctx::new(scratch.path())?));
        let started = Instant::now();
        session.add_dynamic_tools(three.clone());
        let watcher = {
            let three = three.clone();
            tokio::spawn(async move {
                let mut ready_at: Vec<Option<Duration>> = vec![None; 3];
                while started.elapsed() < Duration::from_secs(60) && ready_at.iter().any(Option::is_none) {
                    for (i, (_, s)) in three.status().iter().enumerate() {
                        if ready_at[i].is_none() && matches!(s, Status::Ready { .. }) {
                            ready_at[i] = Some(started.elapsed());
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                ready_at
            })
        };
        let (events, _seen) = tokio::sync::mpsc::unbounded_channel();
        let (_ops_tx, mut ops) = tokio::sync::mpsc::unbounded_channel();
        session.turn("what time is it?", &events, &mut ops).await;
        let (first, offered) = model.0.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.context("the model was never called")?;
        let ready_at = watcher.await?;
        anyhow::ensure!(
            ready_at.iter().all(Option::is_some),
            "the servers did not start: {:?} (is mcp-server-time installed for {}?)",
            three.status(),
            bench.python
        );
        let slowest = ready_at.iter().flatten().max().copied().unwrap_or_default();
        println!(
            "caret bench mcp: {} -m mcp_server_time\n\nthree servers starting: the session's first model request left after {:.0} ms with {offered} tools; the slowest server was ready after {:.0} ms (waited {:+.0} ms past it)",
            bench.python,
            ms(first - started),
            ms(slowest),
            ms(first - started) - ms(slowest)
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
        let (p50, p99) = p50_p99(&mut took);
        println!(
            "a tool call over stdio (get_current_time, {} calls): p50 {p50:.3} ms, p99 {p99:.3} ms — the server's own work included",
            took.len(),
        );
        drop(hub);

        // The same trivial tool over stdio and over Streamable HTTP on loopback.
        let script = scratch.path().join("pong.py");
        std::fs::write(&script, PONG)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut http_server = std::process::Command::new(&bench.python)
            .arg(&script)
            .arg(port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting the HTTP server")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let stdio = ServerConfig {
            name: "pong".into(),
            transport: Transport::stdio(&bench.python, &[script.to_str().unwrap_or_default()]),
            ..time_server("pong", &bench.python)
        };
        let http = ServerConfig {
            name: "pong-http".into(),
            transport: Transport::Http {
                url: format!("http://127.0.0.1:{port}/mcp"),
                headers: Default::default(),
                bearer: None,
            },
            ..time_server("pong-http", &bench.python)
        };
        let hub = Hub::new(vec![stdio, http]);
        hub.settled(Duration::from_secs(60)).await;
        for (name, how) in [("mcp__pong__pong", "stdio"), ("mcp__pong-http__pong", "Streamable HTTP")] {
            let tool = hub.tools().into_iter().find(|t| t.spec().name == name);
            let tool = tool.with_context(|| format!("{name} did not start: {:?}", hub.status()))?;
            let mut took = Vec::with_capacity(bench.calls);
            for i in 0..bench.calls.max(1) + 10 {
                let t = Instant::now();
                tool.call(serde_json::json!({}), &ctx).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                if i >= 10 {
                    took.push(ms(t.elapsed()));
                }
            }
            let (p50, p99) = p50_p99(&mut took);
            println!("a trivial tool over {how} ({} calls): p50 {p50:.3} ms, p99 {p99:.3} ms", took.len());
        }
        let _ = http_server.kill();
        let _ = http_server.wait();
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
