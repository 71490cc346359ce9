//! The environment API under load: `caret serve --workers N` and N episodes opened at the same
//! moment, each stepped by a scripted policy (a test double standing in for a trainer's
//! model: read the file, fix it, say so) and graded. Prints the episodes' start times, the
//! step overhead — the server's own time (`server_ms`) and the whole HTTP round trip less the
//! worker's time — and any episode that failed to start or finish.
//!
//! `cargo bench -p caret --bench envs [-- EPISODES]` (default 64).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use caret_test_support::TempDir;
use serde_json::{Value, json};

use common::{Server, quantile};

const FIX: &str = "<<<<<<< SEARCH\necho $(( $1 - $2 ))\n=======\necho $(( $1 + $2 ))\n>>>>>>> REPLACE";

fn call(id: u32, name: &str, arguments: Value) -> Value {
    json!({"id": format!("call_{id}"), "type": "function",
           "function": {"name": name, "arguments": arguments.to_string()}})
}

/// One episode's figures.
#[derive(Default)]
struct Episode {
    start_ms: f64,
    server_ms: Vec<f64>,
    overhead_ms: Vec<f64>,
    reward: Option<f64>,
    error: Option<String>,
}

fn episode(http: &reqwest::blocking::Client, url: &str, token: &str, task: &Value) -> Episode {
    let mut e = Episode::default();
    let post = |path: &str, body: Value| -> Result<Value, String> {
        let r = http.post(format!("{url}{path}")).bearer_auth(token).json(&body).send().map_err(|e| e.to_string())?;
        let status = r.status();
        let v: Value = r.json().map_err(|e| e.to_string())?;
        if status.is_success() { Ok(v) } else { Err(format!("{path}: {status} {v}")) }
    };
    let started = Instant::now();
    let obs = match post("/v1/envs", task.clone()) {
        Ok(o) => o,
        Err(err) => {
            e.error = Some(format!("start: {err}"));
            return e;
        }
    };
    e.start_ms = started.elapsed().as_secs_f64() * 1000.0;
    let id = obs["episode"].as_str().unwrap().to_owned();
    let messages = [
        json!({"role": "assistant", "tool_calls": [call(1, "read_file", json!({"path": "add.sh"}))]}),
        json!({"role": "assistant", "tool_calls": [call(2, "edit_file", json!({"path": "add.sh", "edit": FIX}))]}),
        json!({"role": "assistant", "content": "add.sh adds now."}),
    ];
    for m in messages {
        let sent = Instant::now();
        match post(&format!("/v1/envs/{id}/step"), json!({"message": m})) {
            Ok(obs) => {
                let round = sent.elapsed().as_secs_f64() * 1000.0;
                let worker = obs["worker_ms"].as_f64().unwrap_or(0.0);
                e.server_ms.push(obs["server_ms"].as_f64().unwrap_or(f64::NAN));
                e.overhead_ms.push(round - worker);
            }
            Err(err) => {
                e.error = Some(format!("step: {err}"));
                return e;
            }
        }
    }
    match post(&format!("/v1/envs/{id}/grade"), json!({})) {
        Ok(g) => e.reward = g["reward"].as_f64(),
        Err(err) => e.error = Some(format!("grade: {err}")),
    }
    let _ = http.delete(format!("{url}/v1/envs/{id}")).bearer_auth(token).send();
    e
}

fn main() {
    let n: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(64);
    let dir = TempDir::new();
    let config = format!("[runs]\nmax_running_per_tenant = {n}\nmax_episodes_per_tenant = {n}\n");
    let server = Server::start(dir.path(), &config, &["--workers", &n.to_string()], Vec::new(), "rl");
    let (url, token) = (server.url.clone(), server.token.clone());
    let repo = dir.join("repo");
    common::committed_repo(&repo, &[("add.sh", "echo $(( $1 - $2 ))\n")]);
    let task = json!({"repo": {"kind": "git", "url": format!("file://{}", repo.display())}, "prompt": "make add.sh add",
                      "grader": {"command": "[ \"$(sh add.sh 2 3)\" = 5 ]", "timeout_s": 60}});
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(600)).build().unwrap();
    let barrier = Arc::new(Barrier::new(n));
    let started = Instant::now();
    let episodes: Vec<Episode> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let (http, url, token, task, barrier) = (&http, &url, &token, &task, barrier.clone());
                s.spawn(move || {
                    barrier.wait();
                    episode(http, url, token, task)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let wall = started.elapsed().as_secs_f64();
    server.stop();

    let failed: Vec<&String> = episodes.iter().filter_map(|e| e.error.as_ref()).collect();
    let rewarded = episodes.iter().filter(|e| e.reward == Some(1.0)).count();
    let mut starts: Vec<f64> = episodes.iter().filter(|e| e.error.is_none()).map(|e| e.start_ms).collect();
    let mut server_ms: Vec<f64> = episodes.iter().flat_map(|e| e.server_ms.iter().copied()).collect();
    let mut overhead: Vec<f64> = episodes.iter().flat_map(|e| e.overhead_ms.iter().copied()).collect();
    println!(
        "envs ({n} episodes at once, caret serve --workers {n}): all graded in {wall:.1} s; reward 1: {rewarded}/{n}; \
         failed: {}; start p50 {:.0} ms p99 {:.0} ms; step server_ms p50 {:.2} p99 {:.2}; \
         step round trip less worker p50 {:.2} ms p99 {:.2} ms",
        failed.len(),
        quantile(&mut starts, 0.5),
        quantile(&mut starts, 0.99),
        quantile(&mut server_ms, 0.5),
        quantile(&mut server_ms, 0.99),
        quantile(&mut overhead, 0.5),
        quantile(&mut overhead, 0.99),
    );
    for f in &failed {
        println!("  {f}");
    }
    assert!(failed.is_empty() && rewarded == n, "episodes failed");
}
