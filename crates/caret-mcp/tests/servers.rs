//! The hub against real MCP servers over stdio: `mcp-server-time` from PyPI, and a probe
//! server written with the official Python SDK (`mcp` from PyPI, `MCPServer`) whose tools
//! echo structured content, fail, hang and crash the process. The Python comes from
//! `CARET_TEST_MCP_PYTHON` (default `python3`) with `mcp-server-time` installed (`.ci/run`
//! installs it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use caret_agent::tools::{Ctx, Tool, ToolApproval};
use caret_mcp::{Approval, Hub, ServerConfig, Status, ToolSettings};
use caret_test_support::TempDir;
use serde_json::json;

const PROBE: &str = r#"
import asyncio, os
from mcp.server.mcpserver import MCPServer

server = MCPServer("probe")

@server.tool()
def echo(text: str) -> dict:
    """Echo a text back with its length."""
    return {"text": text, "length": len(text)}

@server.tool()
async def sleep(seconds: float) -> str:
    """Sleep for a while."""
    await asyncio.sleep(seconds)
    return "slept"

@server.tool()
def fail(why: str) -> str:
    """Always fails."""
    raise ValueError(why)

@server.tool()
def crash() -> str:
    """Ends the server's process."""
    os._exit(3)

server.run()
"#;

/// The Python with the MCP packages, or `None` (said as a skip).
fn python() -> Option<String> {
    let python = std::env::var("CARET_TEST_MCP_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let ok = std::process::Command::new(&python)
        .args(["-c", "import mcp_server_time, mcp.server.mcpserver"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        caret_test_support::skip(
            "mcp-server-time is not installed (pip install mcp-server-time; CARET_TEST_MCP_PYTHON)",
        );
        return None;
    }
    Some(python)
}

fn server(name: &str, python: &str, args: &[&str]) -> ServerConfig {
    ServerConfig {
        name: name.to_owned(),
        command: python.to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        env: BTreeMap::new(),
        cwd: None,
        approval: Approval::Always,
        tool_timeout: Duration::from_secs(20),
        tools: BTreeMap::new(),
    }
}

fn find(tools: &[Arc<dyn Tool>], name: &str) -> Arc<dyn Tool> {
    let names: Vec<&str> = tools.iter().map(|t| t.spec().name).collect();
    tools.iter().find(|t| t.spec().name == name).cloned().unwrap_or_else(|| panic!("no {name} in {names:?}"))
}

#[tokio::test]
async fn the_time_servers_tools_are_offered_and_answer() {
    let Some(python) = python() else { return };
    let dir = TempDir::new();
    let ctx = Ctx::new(dir.path()).unwrap();
    let mut time = server("time", &python, &["-m", "mcp_server_time", "--local-timezone", "UTC"]);
    time.tools.insert("convert_time".into(), ToolSettings { approval: None, enabled: false });
    let hub = Hub::new(vec![time]);
    assert!(hub.tools().is_empty(), "nothing before the server answers");
    hub.settled(Duration::from_secs(60)).await;
    assert!(matches!(hub.status()[0].1, Status::Ready(2)), "{:?}", hub.status());
    let tools = hub.tools();
    assert_eq!(tools.len(), 1, "convert_time is switched off");
    let now = find(&tools, "mcp__time__get_current_time");
    assert!(now.spec().description.starts_with("[MCP server time] "), "{}", now.spec().description);
    assert_eq!(now.spec().parameters["type"], "object");
    let out = now.call(json!({"timezone": "Europe/Paris"}), &ctx).await.unwrap();
    assert!(out.contains("Europe/Paris") && out.contains("datetime"), "{out}");
    let err = now.call(json!({"timezone": "Not/AZone"}), &ctx).await.unwrap_err();
    assert!(err.to_string().contains("Not/AZone"), "{err}");
}

#[tokio::test]
async fn structured_results_errors_timeouts_and_crashes() {
    let Some(python) = python() else { return };
    let dir = TempDir::new();
    let script = dir.write("probe.py", PROBE);
    let ctx = Ctx::new(dir.path()).unwrap();
    let mut probe = server("probe", &python, &[script.to_str().unwrap()]);
    probe.tool_timeout = Duration::from_millis(800);
    probe.tools.insert("fail".into(), ToolSettings { approval: Some(Approval::Never), enabled: true });
    probe.approval = Approval::Ask;
    let hub = Hub::new(vec![probe]);
    hub.settled(Duration::from_secs(60)).await;
    let tools = hub.tools();
    assert_eq!(tools.len(), 4, "{:?}", hub.status());
    assert_eq!(find(&tools, "mcp__probe__echo").approval(), Some(ToolApproval::Ask));
    assert_eq!(find(&tools, "mcp__probe__fail").approval(), Some(ToolApproval::Never));

    let echoed = find(&tools, "mcp__probe__echo").call(json!({"text": "héllo"}), &ctx).await.unwrap();
    assert!(echoed.contains("\"length\": 5"), "{echoed}");
    let failed = find(&tools, "mcp__probe__fail").call(json!({"why": "no reason"}), &ctx).await.unwrap_err();
    // (The Python SDK words the error itself and keeps the exception's text to the server.)
    assert!(failed.to_string().contains("fail"), "isError becomes a tool error: {failed}");
    let bad = find(&tools, "mcp__probe__echo").call(json!(["not", "an", "object"]), &ctx).await.unwrap_err();
    assert!(bad.to_string().contains("JSON object"), "{bad}");

    // A hanging call is cancelled at the timeout; the server still answers after it.
    let started = std::time::Instant::now();
    let hung = find(&tools, "mcp__probe__sleep").call(json!({"seconds": 30}), &ctx).await.unwrap_err();
    assert!(hung.to_string().contains("tool_timeout"), "{hung}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(find(&tools, "mcp__probe__echo").call(json!({"text": "still here"}), &ctx).await.is_ok());

    // A crashed server: its tools say so, then it is started again.
    let _ = find(&tools, "mcp__probe__crash").call(json!({}), &ctx).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut said_down = false;
    loop {
        match &hub.status()[0].1 {
            // Seen within moments of the crash: the restart is at least half a second away.
            Status::Down(why) if !said_down => {
                said_down = true;
                let err = find(&hub.tools(), "mcp__probe__echo").call(json!({"text": "x"}), &ctx).await.unwrap_err();
                assert!(err.to_string().contains("not running"), "{err} ({why})");
            }
            Status::Ready(_) if said_down => break,
            _ => {}
        }
        assert!(std::time::Instant::now() < deadline, "not restarted: {:?}", hub.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = find(&hub.tools(), "mcp__probe__echo").call(json!({"text": "back"}), &ctx).await.unwrap();
    assert!(again.contains("back"), "{again}");
}

#[tokio::test]
async fn a_server_that_cannot_start_is_down_with_the_reason() {
    let hub = Hub::new(vec![server("ghost", "/nonexistent/mcp-server", &[])]);
    hub.settled(Duration::from_secs(10)).await;
    match &hub.status()[0].1 {
        Status::Down(why) => assert!(why.contains("/nonexistent/mcp-server"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(hub.tools().is_empty());
}
