//! Parallel agents in git worktrees: each attempt at a task works in a `git worktree` of its
//! own (detached at `HEAD`, under `$CARET_HOME/worktrees/`), set up by the repository's
//! `.caret/worktrees.json` or `.cursor/worktrees.json` (`setup-worktree-unix` or
//! `setup-worktree`: commands run in the new worktree inside the sandbox, with
//! `ROOT_WORKTREE_PATH` naming the main checkout, which they may read), runs the same session a `caret exec` would
//! (sandbox and approvals as always), and ends as a diff against `HEAD`. One diff is then applied
//! to the main checkout, and every worktree is removed.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use caret_agent::policy::Approval;
use caret_protocol::agent::{Decision, Event, Op, TurnEnd};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::session::{SessionOptions, open_session};

/// A changed file: its path, lines added, lines removed.
pub type FileStat = (String, usize, usize);

/// One attempt's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// 1, 2, …
    pub number: usize,
    /// The model alias it used.
    pub model: String,
    /// Its worktree (removed by [`remove`]).
    pub worktree: PathBuf,
    /// How its turn ended (`done`, `step_limit`, `failed`, `interrupted`), or why it did not run.
    pub ended: String,
    /// Its changes against `HEAD`, as a patch (new files included).
    pub diff: String,
    /// Files it changed, with lines added and removed.
    pub files: Vec<FileStat>,
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().context("running git")?;
    anyhow::ensure!(out.status.success(), "git {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The setup commands of the repository at `root` (Caret's file, else Cursor's).
pub fn setup_commands(root: &Path) -> anyhow::Result<Vec<String>> {
    for file in [".caret/worktrees.json", ".cursor/worktrees.json"] {
        let Ok(text) = std::fs::read_to_string(root.join(file)) else { continue };
        let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("reading {file}"))?;
        let list = v.get("setup-worktree-unix").or_else(|| v.get("setup-worktree"));
        return Ok(match list {
            Some(serde_json::Value::Array(items)) => {
                items.iter().filter_map(|i| i.as_str().map(str::to_owned)).collect()
            }
            // A script's path, relative to the file's folder.
            Some(serde_json::Value::String(script)) => {
                vec![format!("bash {}", shell_quote(&format!(".{}/{script}", &file[..file.rfind('/').unwrap_or(0)])))]
            }
            _ => Vec::new(),
        });
    }
    Ok(Vec::new())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Makes `n` worktrees of the repository at `root`, detached at its `HEAD`, and runs the
/// setup commands in each (inside the sandbox; `network` as the sessions get it).
pub async fn create(config: &Config, root: &Path, n: usize, network: bool) -> anyhow::Result<Vec<PathBuf>> {
    let head = git(root, &["rev-parse", "HEAD"]).context("the workspace must be a git repository with a commit")?;
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
    let id = format!("{}-{}-{started}", head.trim().get(..8).unwrap_or("head"), std::process::id());
    let base = config.home.join("worktrees").join(id);
    let setup = setup_commands(root)?;
    let mut made = Vec::new();
    match make(root, &base, n, network, &setup, &mut made).await {
        Ok(()) => Ok(made),
        // Half made: none is left behind.
        Err(e) => {
            remove(root, &made);
            Err(e)
        }
    }
}

async fn make(
    root: &Path,
    base: &Path,
    n: usize,
    network: bool,
    setup: &[String],
    made: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    for i in 1..=n {
        let dir = base.join(format!("attempt-{i}"));
        std::fs::create_dir_all(base)?;
        git(root, &["worktree", "add", "--detach", dir.to_str().unwrap_or_default(), "HEAD"])?;
        made.push(dir.clone());
        let mut policy = caret_sandbox::Policy::new(&dir)?.with_toolchains();
        policy.network = network;
        // The main checkout, read-only: setups copy from it (`cp "$ROOT_WORKTREE_PATH/.env" .`).
        policy.exposed.push(root.to_path_buf());
        let sandbox = caret_sandbox::Bwrap::new(policy)?;
        for command in setup {
            let mut spec = caret_sandbox::Spec::new(command.clone(), &dir);
            spec.timeout = std::time::Duration::from_secs(600);
            spec.env.push(("ROOT_WORKTREE_PATH".into(), root.display().to_string()));
            let out = caret_sandbox::Sandbox::run(&sandbox, &spec).await?;
            anyhow::ensure!(
                out.exit_code == Some(0),
                "setting up {}: `{command}` failed: {}",
                dir.display(),
                out.stderr.trim()
            );
        }
    }
    Ok(())
}

/// Runs `task` in each of `worktrees` at once, attempt `i` on `models[i % len]` (none: the
/// default model): each a session as `caret exec` runs it, questions answered "no" unless
/// `approval` is never. Each ends as its diff against `HEAD`.
pub async fn run_all(
    config: &Config,
    worktrees: &[PathBuf],
    task: &str,
    models: &[String],
    approval: Approval,
    max_steps: u32,
) -> Vec<Attempt> {
    let jobs = worktrees.iter().enumerate().map(|(i, dir)| {
        let model = (!models.is_empty()).then(|| models[i % models.len()].clone());
        let mut options = SessionOptions::new(dir.clone(), model);
        options.approval = approval;
        options.max_steps = max_steps;
        async move {
            let (ended, model) = match open_session(config, &options) {
                Ok((mut session, _, model, _)) => {
                    let (tx, mut events) = mpsc::unbounded_channel::<Event>();
                    let (ops_tx, mut ops) = mpsc::unbounded_channel::<Op>();
                    let answer = tokio::spawn(async move {
                        while let Some(e) = events.recv().await {
                            if let Event::ApprovalRequest { call_id, .. } = e {
                                let _ = ops_tx.send(Op::Approval { call_id, decision: Decision::Deny });
                            }
                        }
                    });
                    let end = session.turn(task, &tx, &mut ops).await;
                    session.end(&tx, "exit").await;
                    drop(tx);
                    let _ = answer.await;
                    let ended = match end {
                        TurnEnd::Done => "done",
                        TurnEnd::Interrupted => "interrupted",
                        TurnEnd::StepLimit => "step_limit",
                        TurnEnd::Failed => "failed",
                    };
                    (ended.to_owned(), model)
                }
                Err(e) => (format!("not run: {e:#}"), options.model.clone().unwrap_or_default()),
            };
            let (diff, files) =
                diff(dir).unwrap_or_else(|e| (String::new(), vec![(format!("(no diff: {e:#})"), 0, 0)]));
            Attempt { number: i + 1, model, worktree: dir.clone(), ended, diff, files }
        }
    });
    futures::future::join_all(jobs).await
}

/// The worktree's changes against `HEAD` (new files included), and per file the lines added
/// and removed.
pub fn diff(dir: &Path) -> anyhow::Result<(String, Vec<FileStat>)> {
    git(dir, &["add", "--all", "--intent-to-add"])?;
    let patch = git(dir, &["diff", "--binary", "HEAD"])?;
    let mut files = Vec::new();
    for line in git(dir, &["diff", "--numstat", "HEAD"])?.lines() {
        let mut parts = line.split('\t');
        let (Some(a), Some(r), Some(f)) = (parts.next(), parts.next(), parts.next()) else { continue };
        files.push((f.to_owned(), a.parse().unwrap_or(0), r.parse().unwrap_or(0)));
    }
    Ok((patch, files))
}

/// Applies `attempt`'s diff to the main checkout at `root` (three-way, so a checkout that moved
/// meanwhile merges or says why not).
pub fn apply(root: &Path, attempt: &Attempt) -> anyhow::Result<()> {
    if attempt.diff.trim().is_empty() {
        return Ok(());
    }
    let mut child = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["apply", "--3way", "--whitespace=nowarn", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running git apply")?;
    std::io::Write::write_all(child.stdin.as_mut().context("git apply's input")?, attempt.diff.as_bytes())?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "applying attempt {}: {}",
        attempt.number,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Removes the worktrees (and their folder).
pub fn remove(root: &Path, worktrees: &[PathBuf]) {
    for dir in worktrees {
        if let Err(e) = git(root, &["worktree", "remove", "--force", dir.to_str().unwrap_or_default()]) {
            tracing::warn!("removing the worktree {}: {e:#}", dir.display());
        }
    }
    if let Some(base) = worktrees.first().and_then(|d| d.parent()) {
        let _ = std::fs::remove_dir_all(base);
    }
    let _ = git(root, &["worktree", "prune"]);
}
