//! The environment API under load: `caret serve --workers N` and N episodes opened at the same
//! moment, each stepped by a scripted policy (a test double standing in for a trainer's
//! model: read the file, fix it, say so) and graded. Prints the episodes' start times, the
//! step overhead — the server's own time (`server_ms`) and the whole HTTP round trip less the
//! worker's time — and any episode that failed to start or finish.
//!
//! `cargo bench -p caret --bench envs [-- EPISODES]` (default 64).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use caret_test_support::TempDir;
use serde_json::{Value, json};

const CARET: &str = env!("CARGO_BIN_EXE_caret");
const FIX: &str = "<<<<<<< SEARCH\necho $(( $1 - $2 ))\n=======\necho $(( $1 + $2 ))\n>>>>>>> REPLACE";

fn admin(home: &Path, data: &Path, args: &[&str]) -> String {
    let out = Command::new(CARET).args(args).arg("--data-dir").arg(data).env("CARET_HOME", home).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

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

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1))).copied().unwrap_or(f64::NAN)
}

fn main() {
    let n: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(64);
    let dir = TempDir::new();
    let (home, data) = (dir.join("home"), dir.join("srv"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!("[runs]\nmax_running_per_tenant = {n}\nmax_episodes_per_tenant = {n}\n"),
    )
    .unwrap();
    let mut server = Command::new(CARET)
        .args(["serve", "--addr", "127.0.0.1:0", "--workers", &n.to_string(), "--data-dir"])
        .arg(&data)
        .env("CARET_HOME", &home)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("server.log")).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().rsplit(' ').next().unwrap().to_owned();
    assert!(url.starts_with("http"), "the server did not start: {line}");
    admin(&home, &data, &["admin", "tenant", "create", "rl"]);
    let token = admin(&home, &data, &["admin", "token", "create", "--tenant", "rl"]);

    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("add.sh"), "echo $(( $1 - $2 ))\n").unwrap();
    for a in
        [&["init", "-q"][..], &["add", "-A"], &["-c", "user.name=c", "-c", "user.email=c@c", "commit", "-q", "-m", "i"]]
    {
        assert!(Command::new("git").args(a).current_dir(&repo).status().unwrap().success());
    }
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
    let _ = server.kill();
    let _ = server.wait();

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
        pct(&mut starts, 0.5),
        pct(&mut starts, 0.99),
        pct(&mut server_ms, 0.5),
        pct(&mut server_ms, 0.99),
        pct(&mut overhead, 0.5),
        pct(&mut overhead, 0.99),
    );
    for f in &failed {
        println!("  {f}");
    }
    assert!(failed.is_empty() && rewarded == n, "episodes failed");
}
