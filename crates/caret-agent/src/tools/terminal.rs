//! `run_terminal_cmd`: a shell command in the sandbox, in the workspace, with a timeout and
//! its output capped — waited for, or left running in the background (a server, a watcher, a
//! long build) and looked at later by its job number.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use caret_sandbox::{Live, Output, Sandbox, Spec as Command};
use serde_json::{Value, json};

use super::{Ctx, Spec, Tool, ToolError, ToolResult, string_arg, truncate, usize_arg};

/// Longest timeout a call may ask for, in seconds.
const MAX_TIMEOUT_S: usize = 600;
/// Longest a background job may run, and its default, in seconds.
const MAX_BACKGROUND_S: usize = 4 * 3600;
const BACKGROUND_S: usize = 3600;

/// A command left running.
struct Job {
    command: String,
    started: Instant,
    live: Live,
    /// Taken out once it has ended and was looked at.
    handle: Option<tokio::task::JoinHandle<caret_sandbox::Result<Output>>>,
    /// How it ended, once looked at after it ended.
    ended: Option<String>,
}

/// `run_terminal_cmd`. Background jobs end with it (with the session).
pub struct RunTerminalCmd {
    spec: Spec,
    sandbox: Arc<dyn Sandbox>,
    jobs: Mutex<BTreeMap<usize, Job>>,
}

impl Drop for RunTerminalCmd {
    fn drop(&mut self) {
        for job in self.jobs.get_mut().unwrap_or_else(PoisonError::into_inner).values() {
            if let Some(h) = &job.handle {
                h.abort();
            }
        }
    }
}

/// How a finished command ended, in words.
fn status(out: &Output, timeout: usize) -> String {
    if out.oom_killed {
        return "killed: it went over the sandbox's memory limit".to_owned();
    }
    match (out.timed_out, out.exit_code) {
        (true, _) => format!("killed after {timeout} s (timeout)"),
        (false, Some(code)) => format!("exit code {code}"),
        (false, None) => "killed by a signal".to_owned(),
    }
}

impl RunTerminalCmd {
    /// The tool, running commands in `sandbox`.
    pub fn new(sandbox: Arc<dyn Sandbox>) -> RunTerminalCmd {
        RunTerminalCmd {
            spec: Spec {
                name: "run_terminal_cmd",
                description: "Run a shell command (bash) in the workspace, isolated: the workspace is writable, \
                              the rest of the system read-only, no network. Answers the exit code and output (long \
                              output is cut). Give timeout_s for long builds or tests (default 120, at most 600). \
                              background: true leaves it running (a server, a watcher) and answers a job number; \
                              call again with {job} alone to see its output so far, {job, kill: true} to stop it.",
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "command": {"type": "string"},
                        "cwd": {"type": "string", "description": "Workspace-relative directory (default: the root)"},
                        "timeout_s": {"type": "integer", "minimum": 1, "maximum": MAX_BACKGROUND_S},
                        "background": {"type": "boolean"},
                        "job": {"type": "integer", "description": "A background job's number (without command)"},
                        "kill": {"type": "boolean", "description": "With job: stop it"}
                    }
                }),
                read_only: false,
            },
            sandbox,
            jobs: Mutex::default(),
        }
    }

    /// Starts `command` in the background: its job number.
    fn start(&self, mut command: Command, timeout: usize) -> usize {
        let live = Live::default();
        command.live = Some(live.clone());
        command.timeout = Duration::from_secs(timeout as u64);
        let sandbox = self.sandbox.clone();
        let text = command.command.clone();
        let handle = tokio::spawn(async move { sandbox.run(&command).await });
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        let n = jobs.keys().next_back().map_or(1, |n| n + 1);
        jobs.insert(n, Job { command: text, started: Instant::now(), live, handle: Some(handle), ended: None });
        n
    }

    /// A background job's state and its output so far (the last `max` bytes).
    async fn look(&self, n: usize, kill: bool, max: usize) -> ToolResult {
        let (command, running, seconds, live, finished) = {
            let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
            let job = jobs.get_mut(&n).ok_or_else(|| ToolError::new(format!("there is no background job {n}")))?;
            let running = job.handle.as_ref().is_some_and(|h| !h.is_finished());
            if kill && running {
                if let Some(h) = job.handle.take() {
                    h.abort();
                }
                job.ended = Some("stopped (killed on request)".to_owned());
            }
            let finished = if running { None } else { job.handle.take() };
            (job.command.clone(), running && !kill, job.started.elapsed().as_secs_f64(), job.live.clone(), finished)
        };
        if let Some(handle) = finished {
            let ended = match handle.await {
                Ok(Ok(out)) => format!("ended: {} after {:.1} s", status(&out, 0), out.duration.as_secs_f64()),
                Ok(Err(e)) => format!("could not run: {e}"),
                Err(_) => "stopped".to_owned(),
            };
            if let Some(job) = self.jobs.lock().unwrap_or_else(PoisonError::into_inner).get_mut(&n) {
                job.ended = Some(ended);
            }
        }
        let state = if running {
            format!("running for {seconds:.0} s")
        } else {
            let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
            jobs.get(&n).and_then(|j| j.ended.clone()).unwrap_or_else(|| "ended".to_owned())
        };
        let output = String::from_utf8_lossy(&live.lock().unwrap_or_else(PoisonError::into_inner)).into_owned();
        let mut tail = output.as_str();
        let mut text = format!("job {n} (`{command}`): {state}\n");
        if tail.len() > max {
            let mut at = tail.len() - max;
            while !tail.is_char_boundary(at) {
                at += 1;
            }
            tail = &tail[at..];
            text.push_str(&format!("[earlier output left out: the last {} bytes follow]\n", tail.len()));
        }
        text.push_str(if tail.is_empty() { "(no output yet)\n" } else { tail });
        if !text.ends_with('\n') {
            text.push('\n');
        }
        Ok(text)
    }
}

#[async_trait::async_trait]
impl Tool for RunTerminalCmd {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: &Ctx) -> ToolResult {
        let flag = |name: &str| args.get(name).and_then(Value::as_bool).unwrap_or(false);
        if args.get("command").is_none()
            && let Some(n) = usize_arg(&args, "job")?
        {
            return self.look(n, flag("kill"), ctx.max_output_bytes).await;
        }
        let command = string_arg(&args, "command")?;
        let cwd = ctx.resolve(args.get("cwd").and_then(Value::as_str).unwrap_or("."))?;
        let mut spec = Command::new(command, cwd);
        if flag("background") {
            let timeout = usize_arg(&args, "timeout_s")?.unwrap_or(BACKGROUND_S).clamp(1, MAX_BACKGROUND_S);
            // Its output is kept whole up to 1 MiB per stream; the model reads the tail.
            spec.output_limit = 1 << 20;
            let n = self.start(spec, timeout);
            return Ok(format!(
                "started background job {n} (killed after {timeout} s); see its output with {{\"job\": {n}}}, \
                 stop it with {{\"job\": {n}, \"kill\": true}}\n"
            ));
        }
        let timeout = usize_arg(&args, "timeout_s")?.unwrap_or(120).clamp(1, MAX_TIMEOUT_S);
        spec.timeout = Duration::from_secs(timeout as u64);
        spec.output_limit = ctx.max_output_bytes;
        let out = self.sandbox.run(&spec).await.map_err(|e| ToolError::new(e.to_string()))?;
        let mut text = format!("{} ({:.1} s)\n", status(&out, timeout), out.duration.as_secs_f64());
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
