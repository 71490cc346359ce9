//! Running one model turn's tool calls.
//!
//! Calls are taken in the order the model gave them and cut into batches: a run of read-only
//! calls is one batch, run concurrently; a call that may change something is a batch of its
//! own, run after everything before it finished and before anything after it starts. So
//! reads see the writes the model put before them, and ten reads cost about the slowest one.
//! Results come back in call order whatever order they finished in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::tools::{Ctx, Registry};

/// A tool call as the model made it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The model's id for it.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// Its arguments.
    pub arguments: Value,
}

/// What a call gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The call's id.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// Whether it succeeded.
    pub ok: bool,
    /// What the model reads (on failure: why).
    pub output: String,
    /// Images the result carries.
    pub images: Vec<crate::tools::Image>,
    /// How long it ran.
    pub duration: Duration,
}

/// Said after an error when the same call already failed the same way (small models retry a
/// failing call unchanged until the step limit).
pub const REPEATED: &str = "\n(This exact call already failed the same way: repeating it cannot work. Change \
                             something: read the file again, fix the arguments, or use another tool.)";

/// Runs one call.
async fn run_one(tools: &Registry, call: &Call, ctx: &Ctx) -> Outcome {
    let started = Instant::now();
    // The tool's name only when it is one of ours (the model may write anything there);
    // never its arguments or output.
    let known = tools.get(&call.name).is_some();
    let span = tracing::info_span!(
        "agent.tool",
        tool = if known { call.name.as_str() } else { "unknown" },
        ok = tracing::field::Empty
    );
    let result = match tools.get(&call.name) {
        Some(tool) => {
            tracing::Instrument::instrument(tool.call_with_images(call.arguments.clone(), ctx), span.clone()).await
        }
        None => Err(crate::tools::ToolError::new(format!("there is no tool named {:?}", call.name))),
    };
    span.record("ok", result.is_ok());
    let (ok, output, images) = match result {
        // A project rule for the file the call touched comes with its first result.
        Ok((mut out, images)) => {
            if let Some(rules) = call.arguments["path"].as_str().and_then(|p| ctx.attach_rules(p)) {
                out.push_str(&rules);
            }
            (true, out, images)
        }
        Err(e) => {
            let mut output = format!("error: {e}");
            if ctx.failed_before(format!("{}\0{}\0{output}", call.name, call.arguments)) {
                output.push_str(REPEATED);
            }
            (false, output, Vec::new())
        }
    };
    Outcome { id: call.id.clone(), name: call.name.clone(), ok, output, images, duration: started.elapsed() }
}

/// Whether a call only reads (unknown tools count as read-only: they fail without effect).
fn reads_only(tools: &Registry, call: &Call) -> bool {
    tools.get(&call.name).is_none_or(|t| t.spec().read_only)
}

/// Runs a turn's calls (see the module's description); `on_start` and `on_end` are told of
/// each call as it starts and ends (for the front end's events).
pub async fn run_calls(
    tools: &Registry,
    calls: &[Call],
    ctx: &Arc<Ctx>,
    on_start: &(dyn Fn(&Call) + Sync),
    on_end: &(dyn Fn(&Outcome) + Sync),
) -> Vec<Outcome> {
    let mut out = Vec::with_capacity(calls.len());
    let mut i = 0;
    while i < calls.len() {
        let mut j = i + 1;
        if reads_only(tools, &calls[i]) {
            while j < calls.len() && reads_only(tools, &calls[j]) {
                j += 1;
            }
        }
        let batch = calls[i..j].iter().map(|call| async move {
            on_start(call);
            let outcome = run_one(tools, call, ctx).await;
            on_end(&outcome);
            outcome
        });
        out.extend(futures::future::join_all(batch).await);
        i = j;
    }
    out
}
