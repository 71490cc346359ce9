//! Many rollouts under crashes: `caret rollout` of TASKS tasks × ATTEMPTS attempts against
//! `caret serve` with two `caret worker` processes (a scripted model: a test double, so the
//! figures are the orchestrator's). Once a third of the attempts are in, one worker is
//! SIGKILLed and replaced; once two thirds are, the `caret rollout` process itself is
//! SIGKILLed and run again, resuming from its `attempts.jsonl`. Every attempt must end with
//! one trajectory, graded with the reward its grader gives — none lost, none twice.
//!
//! `cargo bench -p caret --bench rollout-soak [-- TASKS ATTEMPTS SLOTS]` (defaults 125 8 8:
//! 1,000 attempts, two workers of 8 slots).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use caret_test_support::TempDir;
use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
use serde_json::{Value, json};

use common::{CARET, Server, worker};

/// Lines of the rollout's progress file (finished attempts).
fn finished(out: &Path) -> usize {
    std::fs::read_to_string(out.join("attempts.jsonl")).map_or(0, |t| t.lines().count())
}

/// Task `i`'s repository: `add.sh` subtracts; the grader checks it adds. Every fifth task's
/// grader also wants a file nobody writes (reward 0: the model's failure, not the
/// environment's).
fn task(dir: &Path, i: usize) -> Value {
    common::committed_repo(
        &dir.join(format!("repos/t{i}")),
        &[("add.sh", "echo $(( $1 - $2 ))\n"), ("README", &format!("task {i}\n"))],
    );
    let extra = if i.is_multiple_of(5) { " && test -f NEVER" } else { "" };
    json!({"id": format!("t{i}"), "repo": format!("repos/t{i}"), "prompt": "make add.sh add",
           "grader": {"command": format!("[ \"$(sh add.sh 2 3)\" = 5 ]{extra}"), "timeout_s": 60}})
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (tasks, attempts, slots) =
        (args.first().copied().unwrap_or(125), args.get(1).copied().unwrap_or(8), args.get(2).copied().unwrap_or(8));
    let total = tasks * attempts;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("soak-model"));
    // Read, fix, say so: three model calls and two tools per attempt.
    up.set(Behaviour {
        conversation: caret_test_support::scripted::fix_add_conversation(),
        delay: Duration::from_millis(100),
        ..Behaviour::default()
    });
    let dir = TempDir::new();
    let config = common::agent_config(&up.url, "[runs]\nlease_ttl = \"3s\"\nmax_running_per_tenant = 10000\n");
    let server = Server::start(dir.path(), &config, &[], Vec::new(), "soak");
    let (url, token) = (server.url.clone(), server.token.clone());

    let lines: String = (0..tasks).map(|i| format!("{}\n", task(dir.path(), i))).collect();
    let task_file = dir.join("tasks.jsonl");
    std::fs::write(&task_file, lines).unwrap();
    let out = dir.join("out");
    let rollout = || {
        Command::new(CARET)
            .arg("rollout")
            .arg(&task_file)
            .args(["-n", &attempts.to_string(), "--concurrency", &(4 * slots).to_string(), "--out"])
            .arg(&out)
            .args(["--server", &url, "--token", &token])
            .env("CARET_HOME", dir.join("client"))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::options().create(true).append(true).open(dir.join("rollout.log")).unwrap())
            .spawn()
            .unwrap()
    };
    let started = Instant::now();
    let mut client = rollout();
    let mut fleet = [worker(&server, dir.path(), 0, slots), worker(&server, dir.path(), 1, slots)];
    let wait_for = |n: usize| {
        let until = Instant::now() + Duration::from_secs(3600);
        while finished(&out) < n {
            assert!(Instant::now() < until, "{} of {n} attempts in after an hour", finished(&out));
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait_for(total / 3);
    let _ = fleet[0].kill();
    let _ = fleet[0].wait();
    let worker_killed_at = finished(&out);
    fleet[0] = worker(&server, dir.path(), 2, slots);
    wait_for(2 * total / 3);
    let _ = client.kill();
    let _ = client.wait();
    let client_killed_at = finished(&out);
    let client = rollout();
    let report = client.wait_with_output().unwrap();
    let wall = started.elapsed();
    assert!(
        report.status.success(),
        "the resumed rollout failed: {}",
        std::fs::read_to_string(dir.join("rollout.log")).unwrap_or_default()
    );
    for mut w in fleet {
        let _ = w.kill();
        let _ = w.wait();
    }
    server.stop();

    let text = std::fs::read_to_string(out.join("trajectories.jsonl")).unwrap();
    let ts: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut seen = BTreeMap::<(String, u64), usize>::new();
    let (mut wrong, mut run_attempts, mut retried, mut tokens) = (0, 0, 0, 0);
    for t in &ts {
        let id = t["task_id"].as_str().unwrap().to_owned();
        *seen.entry((id.clone(), t["attempt"].as_u64().unwrap())).or_default() += 1;
        let expected = if id[1..].parse::<usize>().unwrap().is_multiple_of(5) { 0.0 } else { 1.0 };
        if t["reward"].as_f64() != Some(expected) {
            wrong += 1;
            println!("  {id} #{}: reward {} ({})", t["attempt"], t["reward"], t["reason"]);
        }
        run_attempts += usize::from(t["run_attempts"].as_u64().unwrap_or(1) > 1);
        retried += usize::from(t["retries"].as_u64().unwrap_or(0) > 0);
        tokens +=
            t["usage"]["prompt_tokens"].as_u64().unwrap_or(0) + t["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    }
    let twice = seen.values().filter(|n| **n > 1).count();
    let log = std::fs::read_to_string(dir.join("rollout.log")).unwrap_or_default();
    let adopted = log
        .lines()
        .find(|l| l.contains("followed again"))
        .and_then(|l| l.split_whitespace().next()?.parse::<usize>().ok())
        .unwrap_or(0);
    println!(
        "rollout soak ({tasks} tasks × {attempts} attempts, 2 workers × {slots} slots, a worker SIGKILLed at {worker_killed_at} \
         and the client at {client_killed_at} attempts in): {} trajectories in {:.1} s ({:.1} attempts/s); \
         wrong or missing reward: {wrong}; written twice: {twice}; re-leased after the kill: {run_attempts}; \
         adopted by the restarted client: {adopted}; retried for the environment: {retried}; model tokens: {tokens}",
        ts.len(),
        wall.as_secs_f64(),
        ts.len() as f64 / wall.as_secs_f64()
    );
    assert_eq!((ts.len(), seen.len(), wrong, twice), (total, total, 0, 0), "an attempt was lost, misgraded or doubled");
}
