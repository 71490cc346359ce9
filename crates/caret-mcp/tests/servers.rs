//! The hub against real MCP servers: `mcp-server-time` from PyPI over stdio; a probe server
//! written with the official Python SDK (`mcp` from PyPI, `MCPServer`, which speaks the
//! stateless `2026-07-28` revision) whose tools echo structured content, fail, hang, crash
//! the process and add a tool, over stdio and over Streamable HTTP behind a bearer token; and
//! `@modelcontextprotocol/server-everything` from npm (the TypeScript SDK's session-based
//! revision) over stdio and Streamable HTTP. The Python comes from `CARET_TEST_MCP_PYTHON`
//! (default `python3`) with `mcp-server-time` installed, the npm package from
//! `tests/npm` (`npm ci` there; `.ci/run` does both).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use caret_agent::tools::{Ctx, Tool, ToolApproval};
use caret_mcp::{Approval, Bearer, Hub, ServerConfig, Status, ToolSettings, Transport};
use caret_test_support::{ChildGuard, TempDir};
use serde_json::json;

const PROBE: &str = r#"
import asyncio, os, sys
from mcp.server.mcpserver import Context, MCPServer

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

@server.tool()
async def grow(ctx: Context) -> str:
    """Adds a tool named extra."""
    server.add_tool(lambda: "extra!", name="extra", description="Added while running.")
    await ctx.notify_tools_changed()
    return "grown"

if sys.argv[1:2] == ["http"]:
    # Streamable HTTP on this port, for requests with this bearer token and X-Team: caret.
    import uvicorn
    port, token = int(sys.argv[2]), sys.argv[3]
    inner = server.streamable_http_app()
    async def app(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {token}".encode() or headers.get(b"x-team") != b"caret":
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"www-authenticate", b'Bearer realm="probe"')]})
                await send({"type": "http.response.body", "body": b"who are you?"})
                return
        await inner(scope, receive, send)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
else:
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
        transport: Transport::stdio(python, args),
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
    assert!(matches!(hub.status()[0].1, Status::Ready { tools: 2, .. }), "{:?}", hub.status());
    let Status::Ready { protocol, .. } = &hub.status()[0].1 else { unreachable!() };
    assert_eq!(protocol, "2026-07-28", "the stateless revision, found with server/discover");
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
    assert_eq!(tools.len(), 5, "{:?}", hub.status());
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
            Status::Ready { .. } if said_down => break,
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

fn remote(name: &str, url: String, headers: &[(&str, &str)], bearer: Option<Bearer>) -> ServerConfig {
    ServerConfig {
        transport: Transport::Http {
            url,
            headers: headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            bearer,
        },
        ..server(name, "", &[])
    }
}

#[tokio::test]
async fn a_remote_server_over_streamable_http_with_a_bearer_token_and_headers() {
    let Some(python) = python() else { return };
    let dir = TempDir::new();
    let script = dir.write("probe.py", PROBE);
    let ctx = Ctx::new(dir.path()).unwrap();
    let port = caret_test_support::free_port();
    // The token is a variable this process already has (tests may not set variables): PATH's value.
    let token = std::env::var("PATH").unwrap();
    let _server = ChildGuard::listening(
        std::process::Command::new(&python).args([script.to_str().unwrap(), "http", &port.to_string(), &token]),
        port,
    );
    let url = format!("http://127.0.0.1:{port}/mcp");
    let good = remote("probe", url.clone(), &[("X-Team", "caret")], Some(Bearer::Env("PATH".into())));
    let wrong = remote("wrong", url.clone(), &[("X-Team", "caret")], Some(Bearer::Token("guess".into())));
    let unset = remote("unset", url, &[], Some(Bearer::Env("CARET_TEST_NO_SUCH_VARIABLE".into())));
    assert!(!format!("{wrong:?}").contains("guess"), "tokens are never shown");
    let hub = Hub::new(vec![good, wrong, unset]);
    hub.settled(Duration::from_secs(60)).await;
    let status = hub.status();
    match &status[0].1 {
        Status::Ready { tools: 5, protocol } => assert_eq!(protocol, "2026-07-28"),
        other => panic!("{other:?}"),
    }
    match &status[1].1 {
        Status::Down(why) => assert!(why.contains("authorization") && !why.contains("guess"), "{why}"),
        other => panic!("a wrong token: {other:?}"),
    }
    match &status[2].1 {
        Status::Down(why) => assert!(why.contains("CARET_TEST_NO_SUCH_VARIABLE is not set"), "{why}"),
        other => panic!("{other:?}"),
    }
    let tools = hub.tools();
    let echoed = find(&tools, "mcp__probe__echo").call(json!({"text": "over http"}), &ctx).await.unwrap();
    assert!(echoed.contains("\"length\": 9"), "{echoed}");
    // Calls go in parallel over one connection.
    let slow = find(&tools, "mcp__probe__sleep");
    let started = std::time::Instant::now();
    let (a, b) = tokio::join!(slow.call(json!({"seconds": 1}), &ctx), slow.call(json!({"seconds": 1}), &ctx));
    assert!(a.is_ok() && b.is_ok() && started.elapsed() < Duration::from_millis(1900), "{:?}", started.elapsed());

    // The server adds a tool and says so on its subscriptions/listen stream: offered next.
    assert!(!tools.iter().any(|t| t.spec().name == "mcp__probe__extra"));
    find(&tools, "mcp__probe__grow").call(json!({}), &ctx).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !hub.tools().iter().any(|t| t.spec().name == "mcp__probe__extra") {
        assert!(std::time::Instant::now() < deadline, "the new tool never came: {:?}", hub.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let extra = find(&hub.tools(), "mcp__probe__extra").call(json!({}), &ctx).await.unwrap();
    assert_eq!(extra, "extra!");
}

/// `@modelcontextprotocol/server-everything`'s entry point, or `None` (said as a skip).
fn everything() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("CARET_TEST_MCP_NPM")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/npm"));
    let entry = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !entry.exists() {
        caret_test_support::skip("server-everything is not installed (npm ci in crates/caret-mcp/tests/npm)");
        return None;
    }
    Some(entry)
}

#[tokio::test]
async fn the_everything_server_over_stdio_and_streamable_http() {
    let Some(entry) = everything() else { return };
    let dir = TempDir::new();
    let ctx = Ctx::new(dir.path()).unwrap();
    let port = caret_test_support::free_port();
    let _http = ChildGuard::listening(
        std::process::Command::new("node").arg(&entry).arg("streamableHttp").env("PORT", port.to_string()),
        port,
    );
    let stdio = server("everything", "node", &[entry.to_str().unwrap(), "stdio"]);
    let http = remote("everything-http", format!("http://127.0.0.1:{port}/mcp"), &[], None);
    let hub = Hub::new(vec![stdio, http]);
    hub.settled(Duration::from_secs(60)).await;
    for (name, status) in hub.status() {
        match status {
            // The TypeScript SDK's session-based revision, after server/discover was refused.
            Status::Ready { tools, protocol } => {
                assert!(tools >= 10 && protocol.as_str() < "2026-07-28", "{name}: {tools} tools, {protocol}")
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    let tools = hub.tools();
    for prefix in ["mcp__everything__", "mcp__everything-http__"] {
        let echoed = find(&tools, &format!("{prefix}echo")).call(json!({"message": "hi there"}), &ctx).await.unwrap();
        assert!(echoed.contains("hi there"), "{echoed}");
        let sum = find(&tools, &format!("{prefix}get-sum")).call(json!({"a": 2, "b": 40}), &ctx).await.unwrap();
        assert!(sum.contains("42"), "{sum}");
        let image = find(&tools, &format!("{prefix}get-tiny-image")).call(json!({}), &ctx).await.unwrap();
        assert!(image.contains("[image (image/png"), "{image}");
        let structured = find(&tools, &format!("{prefix}get-structured-content"))
            .call(json!({"location": "New York"}), &ctx)
            .await
            .unwrap();
        assert!(structured.contains("temperature"), "{structured}");
    }
}
