//! `run_terminal_cmd`: a shell command in the sandbox, in the workspace, with a timeout and
//! its output capped.

use std::sync::Arc;
use std::time::Duration;

use caret_sandbox::{Sandbox, Spec as Command};
use serde_json::{Value, json};

use super::{Ctx, Spec, Tool, ToolError, ToolResult, string_arg, truncate, usize_arg};

/// Longest timeout a call may ask for, in seconds.
const MAX_TIMEOUT_S: usize = 600;

/// `run_terminal_cmd`.
pub struct RunTerminalCmd {
    spec: Spec,
    sandbox: Arc<dyn Sandbox>,
}

impl RunTerminalCmd {
    /// The tool, running commands in `sandbox`.
    pub fn new(sandbox: Arc<dyn Sandbox>) -> RunTerminalCmd {
        RunTerminalCmd {
            spec: Spec {
                name: "run_terminal_cmd",
                description: "Run a shell command (bash) in the workspace, isolated: the workspace is writable, \
                              the rest of the system read-only, no network. Answers the exit code and output (long \
                              output is cut). Give timeout_s for long builds or tests (default 120, at most 600).",
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "command": {"type": "string"},
                        "cwd": {"type": "string", "description": "Workspace-relative directory (default: the root)"},
                        "timeout_s": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_S}
                    },
                    "required": ["command"]
                }),
                read_only: false,
            },
            sandbox,
        }
    }
}

#[async_trait::async_trait]
impl Tool for RunTerminalCmd {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let command = string_arg(&args, "command")?;
        let cwd = ctx.resolve(args.get("cwd").and_then(Value::as_str).unwrap_or("."))?;
        let timeout = usize_arg(&args, "timeout_s")?.unwrap_or(120).clamp(1, MAX_TIMEOUT_S);
        let mut spec = Command::new(command, cwd);
        spec.timeout = Duration::from_secs(timeout as u64);
        spec.output_limit = ctx.max_output_bytes;
        let out = self.sandbox.run(&spec).await.map_err(|e| ToolError::new(e.to_string()))?;
        let status = match (out.timed_out, out.exit_code) {
            (true, _) => format!("killed after {timeout} s (timeout)"),
            (false, Some(code)) => format!("exit code {code}"),
            (false, None) => "killed by a signal".to_owned(),
        };
        let mut text = format!("{status} ({:.1} s)\n", out.duration.as_secs_f64());
        if !out.stdout.is_empty() {
            text.push_str("stdout:\n");
            text.push_str(&out.stdout);
            if !out.stdout.ends_with('\n') {
                text.push('\n');
            }
        }
        if !out.stderr.is_empty() {
            text.push_str("stderr:\n");
            text.push_str(&out.stderr);
            if !out.stderr.ends_with('\n') {
                text.push('\n');
            }
        }
        if out.truncated {
            text.push_str("[output cut at the limit; redirect to a file and read parts of it]\n");
        }
        Ok(truncate(text, ctx.max_output_bytes * 2, "redirect to a file and read parts of it"))
    }
}
