//! Checkpoints of a run's attempt: saved while the agent works (the changes since the base
//! and the conversation so far), and applied to the next attempt's fresh checkout.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use caret_protocol::llm::{ChatMessage, Role};
use caret_protocol::runs::{CheckpointBody, LeaseRef, RunCheckpoint};
use tokio::sync::mpsc;

use crate::Error;
use crate::checkout::{MAX_PATCH_BYTES, git, git_indexed};
use crate::coordinator::Coordinator;

/// Applies an earlier attempt's checkpoint to a fresh checkout: its patch on the base, and its
/// conversation written to `transcript` for the session to resume, calls left unanswered
/// answered as interrupted. Answers (files changed, conversation ready); a patch that does not
/// apply leaves the checkout as it was (the attempt starts afresh).
pub(crate) async fn restore(run_dir: &Path, repo: &Path, transcript: &Path, cp: &RunCheckpoint) -> (u32, bool) {
    if !cp.patch.trim().is_empty() {
        let file = run_dir.join("checkpoint.patch");
        let applied = match std::fs::write(&file, &cp.patch) {
            Ok(()) => git(repo, &["apply", "--binary", "--whitespace=nowarn", &file.display().to_string()]).await,
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = applied {
            tracing::warn!("the checkpoint's changes do not apply; starting afresh: {e}");
            return (0, false);
        }
    }
    let files = u32::try_from(cp.patch.lines().filter(|l| l.starts_with("diff --git ")).count()).unwrap_or(u32::MAX);
    let mut lines = cp.transcript.lines();
    let Some(header) = lines.next() else { return (files, false) };
    let mut messages: Vec<ChatMessage> = lines.map_while(|l| serde_json::from_str(l).ok()).collect();
    if messages.is_empty() {
        return (files, false);
    }
    let answered: std::collections::HashSet<String> = messages.iter().filter_map(|m| m.tool_call_id.clone()).collect();
    let unanswered: Vec<String> = messages
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.id.clone()))
        .filter(|id| !answered.contains(id))
        .collect();
    for id in unanswered {
        let mut m =
            ChatMessage::text(Role::Tool, "interrupted: the run moved to another machine before this call ended");
        m.tool_call_id = Some(id);
        messages.push(m);
    }
    let mut text = format!("{header}\n");
    for m in &messages {
        match serde_json::to_string(m) {
            Ok(line) => text += &(line + "\n"),
            Err(_) => return (files, false),
        }
    }
    (files, std::fs::write(transcript, text).is_ok())
}

/// Saves checkpoints while the agent works: after each tool call (coalesced: one per
/// `pause`), the changes since `base` (through an index of its own) and the conversation so
/// far. Stops when `steps` closes or the lease is lost.
pub(crate) async fn checkpoints(
    coord: Arc<dyn Coordinator>,
    lease: LeaseRef,
    repo: PathBuf,
    base: String,
    transcript: PathBuf,
    mut steps: mpsc::UnboundedReceiver<()>,
) {
    let index = transcript.with_file_name("checkpoint.index");
    while steps.recv().await.is_some() {
        tokio::time::sleep(Duration::from_millis(300)).await;
        while steps.try_recv().is_ok() {}
        let patch = match git_indexed(&repo, Some(&index), &["add", "-A"]).await {
            Ok(_) => git_indexed(&repo, Some(&index), &["diff", "--cached", "--binary", &base]).await,
            Err(e) => Err(e),
        };
        let patch = match patch {
            Ok(p) if p.len() <= MAX_PATCH_BYTES => p,
            Ok(p) => {
                tracing::warn!(run = %lease.run, "no checkpoint: the changes are {} bytes as a patch", p.len());
                continue;
            }
            Err(e) => {
                tracing::warn!(run = %lease.run, "no checkpoint: {e}");
                continue;
            }
        };
        let transcript = std::fs::read_to_string(&transcript).unwrap_or_default();
        let body = CheckpointBody { lease: lease.clone(), checkpoint: RunCheckpoint { patch, transcript } };
        match coord.checkpoint(body).await {
            Ok(()) => {}
            Err(Error::Fenced(_)) => return,
            Err(e) => tracing::warn!(run = %lease.run, "saving a checkpoint: {e}"),
        }
    }
}
