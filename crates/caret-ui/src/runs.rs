//! Background runs from the page, on the embedded queue (a local worker starts on demand, as
//! for `caret run`): start one on the workspace's checkout (HEAD and uncommitted changes),
//! list them, follow a run's events, review its patch file by file and apply it.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use caret_protocol::runs::{CreateRun, RunClass, RunEnvironment, RunLimits, RunState};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use caret_host::runs::{Runs, apply_patch, bundle_checkout};

/// Starts a run of `task` on the checkout at `root`.
pub async fn start(runs: &Runs, root: &Path, task: &str, model: Option<String>) -> anyhow::Result<Value> {
    anyhow::ensure!(!task.trim().is_empty(), "say what the run should do");
    let repo = bundle_checkout(root).context("a background run starts from the workspace's git checkout")?;
    let info = runs
        .submit(CreateRun {
            repo,
            task: task.to_owned(),
            model,
            limits: RunLimits::default(),
            environment: RunEnvironment::default(),
            class: RunClass::Interactive,
            push: None,
            git_credential: None,
            rollout: None,
        })
        .await?;
    Ok(serde_json::to_value(info)?)
}

/// The newest runs.
pub async fn list(runs: &Runs) -> anyhow::Result<Value> {
    Ok(json!({"runs": runs.list(50).await?}))
}

/// Sends a run's events as they come, until it ends (`{"type": "end", "state"}` last).
pub async fn follow(runs: &Runs, id: &str, out: mpsc::UnboundedSender<Value>) -> anyhow::Result<()> {
    let mut after = 0;
    loop {
        let events = runs.events(id, after).await?;
        for e in &events {
            after = after.max(e.seq);
            if out.send(serde_json::to_value(e)?).is_err() {
                return Ok(());
            }
        }
        if events.is_empty() {
            let info = runs.get(id).await?;
            if !matches!(info.state, RunState::Queued | RunState::Running) {
                let _ = out.send(json!({"type": "end", "state": info.state.as_str()}));
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// A finished run's patch as each file before (the workspace now) and after.
pub async fn patch(runs: &Runs, root: &Path, id: &str) -> anyhow::Result<Value> {
    let result = runs.result(id).await?;
    let mut files = Vec::new();
    for (path, section) in sections(&result.patch) {
        let before = std::fs::read_to_string(root.join(&path)).unwrap_or_default();
        let after = caret_apply::apply(
            &caret_apply::Text::new(&before),
            &section,
            Some(caret_apply::Format::Udiff),
            Some(&path),
        )
        .map(|(t, _)| t.render())
        .unwrap_or_else(|e| format!("(the patch does not apply to the file as it is now: {e})"));
        files.push(json!({"path": path, "before": before, "after": after}));
    }
    Ok(json!({"files": files, "final_message": result.final_message, "test": result.test}))
}

/// Applies a finished run's patch to the checkout (`git apply --3way`; refused when the
/// files it changes have uncommitted changes).
pub async fn apply(runs: &Runs, root: &Path, id: &str) -> anyhow::Result<Value> {
    let result = runs.result(id).await?;
    let root = root.to_path_buf();
    let files = result.files.clone();
    tokio::task::spawn_blocking(move || apply_patch(&root, &result, false)).await??;
    Ok(json!({"changed": files}))
}

/// A git patch cut into its files: (path, that file's part).
fn sections(patch: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in patch.split_inclusive('\n') {
        if let Some(rest) = line.strip_prefix("diff --git ") {
            let path = rest.trim_end().rsplit_once(" b/").map_or(rest.trim_end(), |(_, b)| b).to_owned();
            out.push((path, String::new()));
        }
        if let Some((_, s)) = out.last_mut() {
            s.push_str(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_is_cut_into_its_files() {
        let patch = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n\
                     diff --git a/d/new.txt b/d/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/d/new.txt\n@@ -0,0 +1 @@\n+n\n";
        let s = sections(patch);
        assert_eq!(s.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(), ["x.py", "d/new.txt"]);
        assert!(s[0].1.ends_with("+b\n") && s[1].1.starts_with("diff --git a/d/new.txt"));
        let (after, _) =
            caret_apply::apply(&caret_apply::Text::new("a\n"), &s[0].1, Some(caret_apply::Format::Udiff), Some("x.py"))
                .map(|(t, f)| (t.render(), f))
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(after, "b\n");
    }
}
