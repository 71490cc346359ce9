//! `caret rollout`: N attempts of every task of a task file as batch background runs, graded,
//! written as trajectories; `caret rollout report DIR` summarises them; `caret rollout
//! convert` turns public task sets into task files. Every attempt is an ordinary batch run
//! through `caret_host::runs` (the same tools, prompt and sandbox as a user's); this crate
//! never runs an agent itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use caret_anyrun::rollout::{Failure, Task, advantages, pass_at_k, score};
use caret_protocol::agent::Event;
use caret_protocol::runs::{
    CreateRun, RepoSource, RolloutOptions, RunClass, RunEnvironment, RunEvent, RunInfo, RunResult, RunState,
};
use serde::{Deserialize, Serialize};

use caret_host::config::Config;
use caret_host::runs::Runs;

use caret_host::remote::Remote;
use caret_host::runtime::runtime;

mod convert;

/// Where the attempts run: a server, or the embedded queue.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// A `caret serve` to run on (env CARET_SERVER); default: the embedded queue.
    #[arg(long, env = "CARET_SERVER")]
    server: Option<String>,
    /// API token for --server (env CARET_TOKEN).
    #[arg(long, env = "CARET_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

impl Target {
    fn remote(&self) -> Remote {
        Remote { server: self.server.clone(), token: self.token.clone() }
    }
}

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
/// `caret rollout`'s arguments.
pub struct RolloutArgs {
    #[command(subcommand)]
    report: Option<RolloutCommand>,
    /// The task file (JSON lines; docs/rollout-task.schema.json).
    tasks: Option<PathBuf>,
    /// Attempts per task.
    #[arg(short = 'n', long, default_value_t = 8)]
    attempts: u32,
    /// Model alias.
    #[arg(long)]
    model: Option<String>,
    /// Where trajectories and the summary go.
    #[arg(long, default_value = "rollouts")]
    out: PathBuf,
    /// Attempts queued or running at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Sampling temperature of every attempt.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Seeds every attempt: attempt i of task T gets `attempt_seed(seed, T, i)` (S + i in
    /// the low 32 bits, a hash of the task's id above); none: unseeded.
    #[arg(long)]
    seed: Option<u64>,
    /// Leave out the token view (token ids, mask and log probabilities of each attempt).
    #[arg(long)]
    no_tokens: bool,
    /// Times an attempt that failed for the environment's sake (sandbox, setup, provider,
    /// grader timeout) is run again before it is recorded with no reward.
    #[arg(long, default_value_t = 1)]
    retries: u32,
    #[command(flatten)]
    target: Target,
}

#[derive(Debug, clap::Subcommand)]
/// `caret rollout report` and `caret rollout convert`.
pub enum RolloutCommand {
    /// pass@1 / pass@k per task and overall, tokens, time, failures by kind.
    Report {
        /// A rollout's output directory.
        dir: PathBuf,
    },
    /// A public task set as a task file with one small git repository per problem.
    Convert(convert::ConvertArgs),
}

/// One attempt, as written to `trajectories.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trajectory {
    /// The task.
    pub task_id: String,
    /// Which attempt of the task (0-based).
    pub attempt: u32,
    /// The background run that made it.
    pub run_id: String,
    /// Times this attempt was run again after an environment failure.
    #[serde(default)]
    pub retries: u32,
    /// Anyrun attempts its last run took (more than 1: a worker was lost and it started
    /// again on another).
    #[serde(default)]
    pub run_attempts: u32,
    /// The grader's reward (1 passed, 0 failed; none when the attempt failed for the environment's sake).
    pub reward: Option<f64>,
    /// The reward minus the task's mean reward, over its standard deviation.
    pub advantage: Option<f64>,
    /// Why the attempt has no reward, when it has none.
    pub failure: Option<Failure>,
    /// How the run ended.
    pub state: RunState,
    #[serde(default)]
    /// Why it ended so.
    pub reason: Option<String>,
    #[serde(default)]
    /// How the agent's turn ended.
    pub turn_end: String,
    /// The grader's outcome.
    pub grader: Option<caret_protocol::runs::TestOutcome>,
    /// Tokens used.
    pub usage: caret_protocol::runs::Usage,
    /// Where the time went.
    pub timings: caret_protocol::runs::Timings,
    /// The sampling temperature.
    pub temperature: Option<f64>,
    /// The sampling seed.
    pub seed: Option<u64>,
    /// Tool definitions and messages exactly as the model saw them.
    pub tools: Vec<caret_protocol::llm::Tool>,
    /// The conversation.
    pub messages: Vec<caret_protocol::llm::ChatMessage>,
    /// Each tool call: name, arguments, result, time.
    pub steps: Vec<Step>,
    /// The change the attempt made, as a patch.
    pub patch: String,
    /// The token view: `prompt_ids`, `response_ids`, `response_mask`, `response_logprobs`.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<caret_protocol::runs::TokenView>,
    /// Why there is no token view (an upstream that gives no token ids, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_missing: Option<String>,
    /// Without a token view: each model call's sampled-token log probabilities, if given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<Vec<f32>>,
}

/// A tool call of an attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    /// The tool call's id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments.
    pub arguments: serde_json::Value,
    /// Whether it succeeded.
    pub ok: bool,
    /// What it returned.
    pub output: String,
    /// How long it took.
    pub duration_ms: f64,
}

/// Runs the rollout, or the report or conversion asked for.
pub fn run(config: &Config, args: RolloutArgs) -> anyhow::Result<ExitCode> {
    match &args.report {
        Some(RolloutCommand::Report { dir }) => return report(dir),
        Some(RolloutCommand::Convert(convert)) => return convert::run(convert),
        None => {}
    }
    let Some(path) = &args.tasks else { bail!("give a task file (or `caret rollout report DIR`)") };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let tasks = caret_anyrun::rollout::parse_tasks(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    anyhow::ensure!(!tasks.is_empty(), "{} holds no tasks", path.display());
    anyhow::ensure!(args.attempts > 0, "-n must be at least 1");
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    // Each task's request, its code bundled once.
    let mut requests = Vec::new();
    for task in &tasks {
        requests.push(request(task, base, &args).with_context(|| format!("task {}", task.id))?);
    }
    // One trace for the rollout: each attempt's run continues it (ids and counts only).
    let _span = tracing::info_span!("rollout", tasks = tasks.len(), attempts = args.attempts).entered();
    runtime()?.block_on(async {
        let runs = Runs::open(config, &args.target.remote()).await?;
        let started = Instant::now();
        // Attempts finished by an earlier, interrupted invocation on the same output are kept.
        let progress = args.out.join("attempts.jsonl");
        let mut done = read_progress(&progress)?;
        done.retain(|t| t.attempt < args.attempts && tasks.iter().any(|task| task.id == t.task_id));
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&progress)
            .with_context(|| format!("opening {}", progress.display()))?;
        let finished: std::collections::HashSet<(String, u32)> =
            done.iter().map(|t| (t.task_id.clone(), t.attempt)).collect();
        if !finished.is_empty() {
            eprintln!("{} attempts already done in {}", finished.len(), progress.display());
        }
        // (task, attempt, retries so far), last first.
        let mut pending: Vec<(usize, u32, u32)> = (0..tasks.len())
            .flat_map(|t| (0..args.attempts).map(move |a| (t, a, 0)))
            .filter(|(t, a, _)| !finished.contains(&(tasks[*t].id.clone(), *a)))
            .rev()
            .collect();
        let total = done.len() + pending.len();
        let mut live: Vec<(usize, u32, u32, String)> = Vec::new();
        // Runs an earlier, interrupted invocation submitted and did not collect are adopted,
        // not submitted again: they may be running, or done.
        let submitted_file = args.out.join("submitted.jsonl");
        for s in read_submitted(&submitted_file)? {
            let Some(at) = pending.iter().position(|(t, a, _)| tasks[*t].id == s.task_id && *a == s.attempt) else {
                continue;
            };
            if runs.get(&s.run_id).await.is_ok() {
                let (t, a, _) = pending.remove(at);
                live.push((t, a, s.retries, s.run_id));
            }
        }
        if !live.is_empty() {
            eprintln!("{} attempts an earlier invocation started are followed again", live.len());
        }
        let mut submitted = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&submitted_file)
            .with_context(|| format!("opening {}", submitted_file.display()))?;
        while !pending.is_empty() || !live.is_empty() {
            while live.len() < args.concurrency.max(1)
                && let Some((t, a, retries)) = pending.pop()
            {
                let mut req = requests[t].clone();
                if let Some(r) = req.rollout.as_mut() {
                    r.seed = args.seed.map(|s| attempt_seed(s, &tasks[t].id, a));
                }
                let info = runs.submit(req).await?;
                let line = Submitted { task_id: tasks[t].id.clone(), attempt: a, retries, run_id: info.id.clone() };
                use std::io::Write as _;
                writeln!(submitted, "{}", serde_json::to_string(&line)?)
                    .with_context(|| format!("writing {}", submitted_file.display()))?;
                live.push((t, a, retries, info.id));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut still = Vec::new();
            // One listing a tick finds the live runs (the latest ones, as a rule); a run it
            // misses is asked for alone.
            let listed: std::collections::HashMap<String, RunInfo> = match live.len() {
                0 => Default::default(),
                n => runs.list(u32::try_from(2 * n + 16).unwrap_or(1000).min(1000)).await?,
            }
            .into_iter()
            .map(|r| (r.id.clone(), r))
            .collect();
            for (t, a, retries, id) in live.drain(..) {
                let info = match listed.get(&id) {
                    Some(info) => info.clone(),
                    None => runs.get(&id).await?,
                };
                if matches!(info.state, RunState::Queued | RunState::Running) {
                    still.push((t, a, retries, id));
                    continue;
                }
                let mut trajectory = collect(&runs, &tasks[t], a, &info).await?;
                trajectory.retries = retries;
                let environmental = matches!(trajectory.failure, Some(Failure::Environment | Failure::GraderTimeout));
                if environmental && retries < args.retries {
                    eprintln!(
                        "{} #{a}: {} ({}); running it again",
                        trajectory.task_id,
                        info.state.as_str(),
                        info.reason.as_deref().unwrap_or("no grade")
                    );
                    // Next to start.
                    pending.push((t, a, retries + 1));
                    continue;
                }
                eprintln!(
                    "[{}/{total}] {} #{}: {} reward {}",
                    done.len() + 1,
                    trajectory.task_id,
                    a,
                    info.state.as_str(),
                    trajectory.reward.map_or("none".to_owned(), |r| format!("{r}"))
                );
                use std::io::Write as _;
                writeln!(log, "{}", serde_json::to_string(&trajectory)?)
                    .with_context(|| format!("writing {}", progress.display()))?;
                done.push(trajectory);
            }
            live = still;
        }
        // Advantages within each task's group, then written in task and attempt order.
        done.sort_by(|a, b| (&a.task_id, a.attempt).cmp(&(&b.task_id, b.attempt)));
        let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, t) in done.iter().enumerate() {
            groups.entry(t.task_id.clone()).or_default().push(i);
        }
        for idx in groups.values() {
            let adv = advantages(&idx.iter().map(|i| done[*i].reward).collect::<Vec<_>>());
            for (i, a) in idx.iter().zip(adv) {
                done[*i].advantage = a;
            }
        }
        let mut lines = String::new();
        for t in &done {
            lines.push_str(&serde_json::to_string(t)?);
            lines.push('\n');
        }
        let file = args.out.join("trajectories.jsonl");
        std::fs::write(&file, lines).with_context(|| format!("writing {}", file.display()))?;
        eprintln!("{} attempts in {:.1} s → {}", done.len(), started.elapsed().as_secs_f64(), file.display());
        report(&args.out)
    })
}

/// The seed of attempt `attempt` of task `task` under `--seed base`: `base + attempt` in the
/// low 32 bits and a hash of the task's id in the high ones. Attempt i of two tasks must not
/// share a seed: with one sampler stream for every task, the draws that decide (say) a tool
/// call or a text answer after the same system prompt come out alike across tasks, and the
/// attempts of a pass@k estimate stop being independent.
fn attempt_seed(base: u64, task: &str, attempt: u32) -> u64 {
    let hash = blake3::hash(task.as_bytes());
    let high =
        u64::from(u32::from_le_bytes([hash.as_bytes()[0], hash.as_bytes()[1], hash.as_bytes()[2], hash.as_bytes()[3]]));
    (high << 32) ^ base.wrapping_add(u64::from(attempt))
}

/// A submitted attempt, as written to `submitted.jsonl`.
#[derive(Debug, Serialize, Deserialize)]
struct Submitted {
    task_id: String,
    attempt: u32,
    retries: u32,
    run_id: String,
}

/// The runs earlier invocations submitted, the latest per attempt last; unreadable lines (a
/// torn last one) are skipped — at worst an attempt is submitted again.
fn read_submitted(path: &Path) -> anyhow::Result<Vec<Submitted>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut latest: BTreeMap<(String, u32), Submitted> = BTreeMap::new();
    for s in text.lines().filter_map(|l| serde_json::from_str::<Submitted>(l).ok()) {
        latest.insert((s.task_id.clone(), s.attempt), s);
    }
    if !text.is_empty() && !text.ends_with('\n') {
        // Appends start on a line of their own.
        let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
        use std::io::Write as _;
        writeln!(f)?;
    }
    Ok(latest.into_values().collect())
}

/// The attempts an earlier invocation finished (`attempts.jsonl`); a torn last line (the
/// process killed while writing it) is dropped.
fn read_progress(path: &Path) -> anyhow::Result<Vec<Trajectory>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        match serde_json::from_str::<Trajectory>(line) {
            Ok(t) => out.push(t),
            Err(_) if n + 1 == lines.len() && !text.ends_with('\n') => {}
            Err(e) => bail!("{} line {}: {e}", path.display(), n + 1),
        }
    }
    if !text.is_empty() && !text.ends_with('\n') {
        // Drop the torn line so that appends start on a line of their own.
        let keep: String = out.iter().map(|t| serde_json::to_string(t).map(|l| l + "\n")).collect::<Result<_, _>>()?;
        std::fs::write(path, keep).with_context(|| format!("rewriting {}", path.display()))?;
    }
    Ok(out)
}

/// A task's run request (the code bundled once; every attempt reuses it).
fn request(task: &Task, base: &Path, args: &RolloutArgs) -> anyhow::Result<CreateRun> {
    let repo = if task.repo.contains("://") {
        RepoSource::Git { url: task.repo.clone(), git_ref: task.git_ref.clone() }
    } else {
        let dir = base.join(&task.repo);
        caret_host::runs::bundle_checkout(&dir).with_context(|| format!("bundling {}", dir.display()))?
    };
    let mut environment: RunEnvironment = task.environment.clone().unwrap_or_default();
    environment.test = Some(task.grader.command.clone());
    environment.test_timeout_s = Some(task.grader.timeout_s.unwrap_or(600));
    Ok(CreateRun {
        repo,
        task: task.prompt.clone(),
        model: args.model.clone(),
        limits: task.limits.unwrap_or_default(),
        environment,
        class: RunClass::Batch,
        push: None,
        git_credential: None,
        rollout: Some(RolloutOptions {
            temperature: Some(args.temperature),
            seed: None,
            transcript: true,
            tokens: !args.no_tokens,
            policy: false,
        }),
    })
}

/// An ended attempt's trajectory (advantage filled in later, per group).
async fn collect(runs: &Runs, task: &Task, attempt: u32, info: &RunInfo) -> anyhow::Result<Trajectory> {
    let result: Option<RunResult> = runs.result(&info.id).await.ok();
    let scored = score(info, result.as_ref());
    let mut steps: Vec<Step> = Vec::new();
    let mut after = 0;
    loop {
        let batch = runs.events(&info.id, after).await?;
        let Some(last) = batch.last() else { break };
        after = last.seq;
        for e in batch {
            match e.event {
                RunEvent::Agent(Event::ToolCallBegin { call_id, name, arguments, .. }) => steps.push(Step {
                    call_id,
                    tool: name,
                    arguments,
                    ok: false,
                    output: String::new(),
                    duration_ms: 0.0,
                }),
                RunEvent::Agent(Event::ToolCallEnd { call_id, ok, output, duration_ms, .. }) => {
                    if let Some(s) = steps.iter_mut().rev().find(|s| s.call_id == call_id) {
                        s.ok = ok;
                        s.output = output;
                        s.duration_ms = duration_ms;
                    }
                }
                _ => {}
            }
        }
    }
    let r = result.unwrap_or_default();
    let transcript = r.transcript.unwrap_or_default();
    Ok(Trajectory {
        task_id: task.id.clone(),
        attempt,
        run_id: info.id.clone(),
        retries: 0,
        run_attempts: info.attempt,
        reward: scored.reward,
        advantage: None,
        failure: scored.failure,
        state: info.state,
        reason: info.reason.clone(),
        turn_end: r.turn_end,
        grader: r.test,
        usage: r.usage,
        timings: r.timings,
        temperature: transcript.temperature,
        seed: transcript.seed,
        tools: transcript.tools,
        messages: transcript.messages,
        steps,
        patch: r.patch,
        tokens: transcript.tokens,
        tokens_missing: transcript.tokens_missing,
        logprobs: transcript.logprobs,
    })
}

/// Prints pass@1 / pass@k per task and overall, tokens, time and failures by kind.
fn report(dir: &Path) -> anyhow::Result<ExitCode> {
    let file = dir.join("trajectories.jsonl");
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let mut by_task: BTreeMap<String, Vec<Trajectory>> = BTreeMap::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let t: Trajectory = serde_json::from_str(line).with_context(|| format!("{} line {}", file.display(), n + 1))?;
        by_task.entry(t.task_id.clone()).or_default().push(t);
    }
    let k = by_task.values().map(Vec::len).max().unwrap_or(1);
    println!(
        "{:<28} {:>5} {:>6} {:>8} {:>8} {:>10} {:>8}",
        "task",
        "n",
        "scored",
        "pass@1",
        format!("pass@{k}"),
        "tokens",
        "s/att"
    );
    let (mut p1, mut pk, mut counted) = (0.0, 0.0, 0usize);
    let mut failures: BTreeMap<String, usize> = BTreeMap::new();
    for (task, ts) in &by_task {
        let scored: Vec<f64> = ts.iter().filter_map(|t| t.reward).collect();
        let correct = scored.iter().filter(|r| **r >= 1.0).count();
        let n = scored.len();
        let tokens: u64 = ts.iter().map(|t| t.usage.prompt_tokens + t.usage.completion_tokens).sum();
        let secs = ts.iter().map(|t| t.timings.total_ms as f64 / 1000.0).sum::<f64>() / ts.len() as f64;
        for t in ts {
            if let Some(f) = &t.failure {
                *failures.entry(serde_json::to_value(f)?.as_str().unwrap_or_default().to_owned()).or_default() += 1;
            }
        }
        let (a, b) = (pass_at_k(n, correct, 1), pass_at_k(n, correct, k.min(n.max(1))));
        if n > 0 {
            p1 += a;
            pk += b;
            counted += 1;
        }
        println!("{task:<28} {:>5} {n:>6} {a:>8.3} {b:>8.3} {tokens:>10} {secs:>8.1}", ts.len());
    }
    let mean = |v: f64| if counted == 0 { 0.0 } else { v / counted as f64 };
    println!("{:<28} {:>5} {:>6} {:>8.3} {:>8.3}", "overall", "", counted, mean(p1), mean(pk));
    if !failures.is_empty() {
        let list: Vec<String> = failures.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("not graded normally: {}", list.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trajectory(task: &str, attempt: u32) -> Trajectory {
        serde_json::from_value(serde_json::json!({
            "task_id": task, "attempt": attempt, "run_id": "run-1", "reward": 1.0, "advantage": null,
            "failure": null, "state": "succeeded", "grader": null,
            "usage": caret_protocol::runs::Usage::default(), "timings": caret_protocol::runs::Timings::default(),
            "temperature": null, "seed": null, "tools": [], "messages": [], "steps": [], "patch": ""
        }))
        .unwrap()
    }

    #[test]
    fn attempts_of_different_tasks_never_share_a_seed() {
        let a: Vec<u64> = (0..4).map(|i| attempt_seed(100, "fix-add", i)).collect();
        let b: Vec<u64> = (0..4).map(|i| attempt_seed(100, "fix-sub", i)).collect();
        assert!(a.iter().all(|s| !b.contains(s)), "{a:?} {b:?}");
        assert_eq!(a.iter().map(|s| s & 0xffff_ffff).collect::<Vec<_>>(), [100, 101, 102, 103]);
        assert!(a.iter().all(|s| s >> 32 == a[0] >> 32), "one task's attempts share the high half");
        assert_eq!(attempt_seed(100, "fix-add", 2), a[2], "the same every time");
    }

    #[test]
    fn the_latest_run_of_each_submitted_attempt_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("submitted.jsonl");
        assert!(read_submitted(&path).unwrap().is_empty());
        let line = |task: &str, attempt: u32, retries: u32, run: &str| {
            serde_json::to_string(&Submitted { task_id: task.into(), attempt, retries, run_id: run.into() }).unwrap()
        };
        let torn = &line("b", 0, 0, "run-4")[..20];
        let text =
            format!("{}\n{}\n{}\n{torn}", line("a", 0, 0, "run-1"), line("a", 1, 0, "run-2"), line("a", 0, 1, "run-3"));
        std::fs::write(&path, text).unwrap();
        let got: Vec<(String, u32, u32, String)> =
            read_submitted(&path).unwrap().into_iter().map(|s| (s.task_id, s.attempt, s.retries, s.run_id)).collect();
        assert_eq!(got, [("a".into(), 0, 1, "run-3".into()), ("a".into(), 1, 0, "run-2".into())]);
        assert!(std::fs::read_to_string(&path).unwrap().ends_with('\n'), "appends start on a new line");
    }

    #[test]
    fn progress_keeps_whole_lines_and_drops_a_torn_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attempts.jsonl");
        assert!(read_progress(&path).unwrap().is_empty(), "no file: nothing done");
        let whole = serde_json::to_string(&trajectory("a", 0)).unwrap();
        let torn = &serde_json::to_string(&trajectory("a", 1)).unwrap()[..40];
        std::fs::write(&path, format!("{whole}\n{torn}")).unwrap();
        let done = read_progress(&path).unwrap();
        assert_eq!(done.iter().map(|t| (t.task_id.as_str(), t.attempt)).collect::<Vec<_>>(), [("a", 0)]);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{whole}\n"), "appends start on a new line");
        // A bad line in the middle is not silently dropped.
        std::fs::write(&path, format!("{torn}\n{whole}\n")).unwrap();
        assert!(read_progress(&path).unwrap_err().to_string().contains("line 1"));
    }
}
