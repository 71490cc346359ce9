//! A probe MCP server for tests, written with the official Python SDK (`mcp` from PyPI,
//! `MCPServer`, the stateless `2026-07-28` revision): `probe.py` runs it over stdio, `probe.py
//! http PORT TOKEN` over Streamable HTTP for requests with that bearer token and `X-Team:
//! caret`. Its tools echo structured content, fail, hang, crash the process, add a tool and
//! report what the process sees.

/// The server's Python source.
pub const PROBE: &str = r#"
import asyncio, os, sys
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("probe")

@server.tool()
def look(variable: str = "") -> dict:
    """What the server sees around it: its directory, process id, a variable's value, whether it can write /usr."""
    try:
        with open("/usr/.caret-probe", "w"):
            pass
        wrote = True
    except OSError:
        wrote = False
    return {"cwd": os.getcwd(), "pid": os.getpid(), "value": os.environ.get(variable, ""), "wrote_usr": wrote}

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
pub fn python() -> Option<String> {
    let python = std::env::var("CARET_TEST_MCP_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let ok = std::process::Command::new(&python)
        .args(["-c", "import mcp_server_time, mcp.server.mcpserver"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        crate::skip("mcp-server-time is not installed (pip install mcp-server-time; CARET_TEST_MCP_PYTHON)");
        return None;
    }
    Some(python)
}
