//! Rollouts: many attempts per task, each an ordinary background run (same tools, prompt,
//! sandbox and limits as a user's), graded by the task's command, scored with group-relative
//! advantages for a trainer. This module is the data side — the task format, rewards,
//! advantages, pass@k — free of IO; `caret rollout` drives runs with it.

use caret_protocol::runs::{RunEnvironment, RunInfo, RunLimits, RunResult, RunState};
use serde::{Deserialize, Serialize};

/// One task of a task file (one JSON object per line; `docs/rollout-task.schema.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Unique in its file.
    pub id: String,
    /// A git checkout's directory, or a git URL (`file://`, `https://`).
    pub repo: String,
    /// A branch, tag or commit of a URL (default: its HEAD).
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<String>,
    /// What the agent is asked.
    pub prompt: String,
    /// How an attempt is graded.
    pub grader: Grader,
    /// Limits of each attempt (default: a run's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RunLimits>,
    /// Environment of each attempt, besides the repository's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<RunEnvironment>,
}

/// Runs in the sandbox after the agent: exit 0 is reward 1, anything else 0 — unless its
/// output's last `reward: X` line (or `{"reward": X}` line) says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grader {
    /// A shell command.
    pub command: String,
    /// Its time limit (default 600 s); running out is the environment's failure, not the
    /// model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
}

/// Reads a task file: one task per line (blank lines and `#` comments skipped); errors name
/// the line. Ids must be unique.
pub fn parse_tasks(text: &str) -> Result<Vec<Task>, String> {
    let mut tasks: Vec<Task> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let task: Task = serde_json::from_str(line).map_err(|e| format!("line {}: {e}", n + 1))?;
        if task.id.trim().is_empty() || task.prompt.trim().is_empty() || task.grader.command.trim().is_empty() {
            return Err(format!("line {}: id, prompt and grader.command must not be empty", n + 1));
        }
        if tasks.iter().any(|t| t.id == task.id) {
            return Err(format!("line {}: task id {:?} appears twice", n + 1, task.id));
        }
        tasks.push(task);
    }
    Ok(tasks)
}

/// Why an attempt has no reward, or why it scored 0 without being graded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// The environment failed (sandbox, setup, lease, provider): no reward, left out of its
    /// group's baseline.
    Environment,
    /// The grader ran out of time: no reward.
    GraderTimeout,
    /// The model ran out of its limits (wall time, tokens): reward 0.
    Limit,
    /// Cancelled: no reward.
    Cancelled,
}

/// An attempt's score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Score {
    /// None: not scored (left out of the group's baseline).
    pub reward: Option<f64>,
    /// Why it was not graded normally, if so.
    pub failure: Option<Failure>,
}

/// The reward a grader's output states: the last `reward: X` or `{"reward": X}` line.
pub fn stated_reward(output: &str) -> Option<f64> {
    output.lines().rev().find_map(|l| {
        let l = l.trim();
        let value = if let Some(v) = l.strip_prefix("reward:") {
            v.trim().parse::<f64>().ok()
        } else if l.starts_with('{') {
            serde_json::from_str::<serde_json::Value>(l).ok().and_then(|v| v.get("reward")?.as_f64())
        } else {
            None
        };
        value.filter(|v| v.is_finite())
    })
}

/// Scores an ended attempt.
pub fn score(info: &RunInfo, result: Option<&RunResult>) -> Score {
    let none = |failure| Score { reward: None, failure: Some(failure) };
    match info.state {
        RunState::Succeeded => match result.and_then(|r| r.test.as_ref()) {
            Some(t) if t.timed_out => none(Failure::GraderTimeout),
            Some(t) => {
                let reward = stated_reward(&t.output).unwrap_or(if t.exit_code == Some(0) { 1.0 } else { 0.0 });
                Score { reward: Some(reward), failure: None }
            }
            None => none(Failure::Environment),
        },
        RunState::Failed => {
            let reason = info.reason.as_deref().unwrap_or_default();
            if reason.contains("wall time limit") || reason.contains("token limit") || reason.contains("model tokens") {
                Score { reward: Some(0.0), failure: Some(Failure::Limit) }
            } else {
                none(Failure::Environment)
            }
        }
        RunState::Cancelled => none(Failure::Cancelled),
        RunState::Queued | RunState::Running => none(Failure::Environment),
    }
}

/// Group-relative advantages: (r − mean) / std over the scored attempts of one task; 0 when
/// they all agree (or only one was scored); none for unscored attempts.
pub fn advantages(rewards: &[Option<f64>]) -> Vec<Option<f64>> {
    let scored: Vec<f64> = rewards.iter().flatten().copied().collect();
    if scored.is_empty() {
        return vec![None; rewards.len()];
    }
    let n = scored.len() as f64;
    let mean = scored.iter().sum::<f64>() / n;
    let std = (scored.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n).sqrt();
    rewards.iter().map(|r| r.map(|r| if std < 1e-12 { 0.0 } else { (r - mean) / std })).collect()
}

/// pass@k: the chance that at least one of k attempts drawn from n (c of them correct)
/// passes — the unbiased estimator `1 − C(n−c, k) / C(n, k)`.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if k == 0 || n == 0 || k > n {
        return 0.0;
    }
    if n - c < k {
        return 1.0;
    }
    // C(n−c, k) / C(n, k) = Π_{i=n−c+1}^{n} (1 − k / i)
    let fail: f64 = ((n - c + 1)..=n).map(|i| 1.0 - k as f64 / i as f64).product();
    1.0 - fail
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn advantages_are_group_relative_and_skip_the_unscored() {
        let a = advantages(&[Some(1.0), Some(0.0), None, Some(1.0), Some(0.0)]);
        assert_eq!(a, vec![Some(1.0), Some(-1.0), None, Some(1.0), Some(-1.0)]);
        assert_eq!(advantages(&[Some(1.0), Some(1.0), None]), vec![Some(0.0), Some(0.0), None]);
        assert_eq!(advantages(&[None, None]), vec![None, None]);
        let a = advantages(&[Some(1.0), Some(0.0), Some(0.0), Some(0.0)]);
        // mean 0.25, std sqrt(0.1875)
        let s = 0.1875f64.sqrt();
        assert!((a[0].unwrap() - 0.75 / s).abs() < 1e-9 && (a[1].unwrap() + 0.25 / s).abs() < 1e-9);
    }

    #[test]
    fn pass_at_k_matches_the_estimator() {
        assert_eq!(pass_at_k(8, 0, 1), 0.0);
        assert_eq!(pass_at_k(8, 8, 1), 1.0);
        assert!((pass_at_k(8, 2, 1) - 0.25).abs() < 1e-12);
        // 1 − C(6,4)/C(8,4) = 1 − 15/70
        assert!((pass_at_k(8, 2, 4) - (1.0 - 15.0 / 70.0)).abs() < 1e-12);
        assert_eq!(pass_at_k(8, 5, 4), 1.0);
    }

    #[test]
    fn rewards_come_from_the_grader_and_failures_are_told_apart() {
        assert_eq!(stated_reward("ok\nreward: 0.5\n"), Some(0.5));
        assert_eq!(stated_reward("{\"reward\": 0.25}\nbye"), Some(0.25));
        assert_eq!(stated_reward("reward: nan\nno reward here"), None);
        let info = |state, reason: Option<&str>| RunInfo {
            state,
            reason: reason.map(str::to_owned),
            ..serde_json::from_value(serde_json::json!({
                "id": "r", "state": "queued", "class": "batch", "task": "t", "model": "m", "attempt": 1,
                "max_attempts": 3, "cancel_requested": false, "created_ms": 0, "tokens_used": 0, "events": 0
            }))
            .unwrap()
        };
        let graded = |exit_code, output: &str, timed_out| RunResult {
            test: Some(caret_protocol::runs::TestOutcome {
                command: "g".into(),
                exit_code,
                timed_out,
                output: output.into(),
            }),
            ..RunResult::default()
        };
        let ok = info(RunState::Succeeded, None);
        assert_eq!(score(&ok, Some(&graded(Some(0), "", false))).reward, Some(1.0));
        assert_eq!(score(&ok, Some(&graded(Some(1), "", false))).reward, Some(0.0));
        assert_eq!(score(&ok, Some(&graded(Some(1), "reward: 0.5", false))).reward, Some(0.5));
        assert_eq!(
            score(&ok, Some(&graded(None, "", true))),
            Score { reward: None, failure: Some(Failure::GraderTimeout) }
        );
        let limit = info(RunState::Failed, Some("the wall time limit (60 s) was reached while the agent worked"));
        assert_eq!(score(&limit, None), Score { reward: Some(0.0), failure: Some(Failure::Limit) });
        let env = info(RunState::Failed, Some("setup step \"make\" exited with Some(2)"));
        assert_eq!(score(&env, None), Score { reward: None, failure: Some(Failure::Environment) });
    }

    #[test]
    fn task_files_are_read_with_their_errors_located() {
        let text =
            "# tasks\n{\"id\":\"a\",\"repo\":\"/r\",\"prompt\":\"fix\",\"grader\":{\"command\":\"make test\"}}\n\n";
        let tasks = parse_tasks(text).unwrap();
        assert_eq!(tasks[0].grader, Grader { command: "make test".into(), timeout_s: None });
        let twice = format!("{}{}", text, text.lines().nth(1).unwrap());
        assert!(parse_tasks(&twice).unwrap_err().contains("appears twice"));
        let bad = "{\"id\":\"a\",\"repo\":\"/r\",\"prompt\":\"x\",\"grader\":{\"command\":\"t\"},\"extra\":1}";
        assert!(parse_tasks(bad).unwrap_err().starts_with("line 1:"));
    }
}
