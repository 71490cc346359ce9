//! The hub against real MCP servers: `mcp-server-time` from PyPI over stdio; the probe server
//! of [`caret_test_support::mcp`] (the official Python SDK) over stdio and over Streamable
//! HTTP behind a bearer token; and
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
use caret_test_support::mcp::{PROBE, python};
use caret_test_support::{ChildGuard, TempDir};
use serde_json::json;

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
    assert_eq!(tools.len(), 6, "{:?}", hub.status());
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
        Status::Ready { tools: 6, protocol } => assert_eq!(protocol, "2026-07-28"),
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

    // Through an allowed-hosts proxy (a background run's): the same server answers; a proxy
    // that does not allow its host stops it.
    let proxied = |allowed: &str| {
        let socket = dir.join(format!("proxy-{}.sock", allowed.len()));
        let list = caret_sandbox::netproxy::AllowList::parse(&[allowed]).unwrap();
        let proxy = caret_sandbox::netproxy::Proxy::start(&socket, list).unwrap();
        let entrance = caret_sandbox::netproxy::Entrance::open(&proxy).unwrap();
        (proxy, entrance)
    };
    let (open, open_door) = proxied(&format!("127.0.0.1:{port}"));
    let (_closed, closed_door) = proxied("example.com");
    let through = |door: &caret_sandbox::netproxy::Entrance| {
        let good = remote(
            "probe",
            format!("http://127.0.0.1:{port}/mcp"),
            &[("X-Team", "caret")],
            Some(Bearer::Env("PATH".into())),
        );
        Hub::placed(vec![good], &caret_mcp::Place { launcher: None, proxy: Some(door.url()) })
    };
    let (allowed, refused) = (through(&open_door), through(&closed_door));
    allowed.settled(Duration::from_secs(60)).await;
    refused.settled(Duration::from_secs(60)).await;
    assert!(matches!(allowed.status()[0].1, Status::Ready { tools: 6, .. }), "{:?}", allowed.status());
    assert!(matches!(&refused.status()[0].1, Status::Down(_)), "{:?}", refused.status());
    let echoed = find(&allowed.tools(), "mcp__probe__echo").call(json!({"text": "proxied"}), &ctx).await.unwrap();
    assert!(echoed.contains("proxied"), "{echoed}");
    assert!(open.counters().allowed.load(std::sync::atomic::Ordering::Relaxed) >= 1);
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
        // For a model that takes images, the image itself (a real PNG), not its description.
        let (text, images) =
            find(&tools, &format!("{prefix}get-tiny-image")).call_with_images(json!({}), &ctx).await.unwrap();
        assert!(!text.contains("[image (") && images.len() == 1, "{text} {images:?}");
        assert_eq!(images[0].mime, "image/png");
        use base64::Engine as _;
        let png = base64::engine::general_purpose::STANDARD.decode(&images[0].base64).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{:?}", &png[..8]);
        let structured = find(&tools, &format!("{prefix}get-structured-content"))
            .call(json!({"location": "New York"}), &ctx)
            .await
            .unwrap();
        assert!(structured.contains("temperature"), "{structured}");
    }
}
