//! Background runs under worker crashes: `caret serve` with 4 `caret worker` processes and
//! 200 queued runs (a scripted model: a test double, so the figures are the orchestrator's),
//! 20 workers SIGKILLed at random moments (each replaced at once). Every run must end exactly
//! once — succeeded, or failed with a reason — and none may be lost or run twice at once.
//!
//! Counted from the outside, not from the server's own events: each attempt's first command
//! prints a token of its own (`start-NANOS`), which the agent sends back to the model, so the
//! model server — this process — sees which attempt each model call belongs to, which
//! attempts ran their command to the end, and whether two attempts of one run were alive at
//! once; the final states are what the client reads. The server's events are printed beside
//! them.
//!
//! `cargo bench -p caret --bench chaos [-- RUNS KILLS WORKERS]` (defaults 200 20 4); with
//! `CARET_BENCH_DATABASE_URL=postgres://…` the queue is on PostgreSQL (a schema of its own),
//! else SQLite.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use caret_test_support::TempDir;
use caret_test_support::scripted::{Answer, Behaviour, ScriptedUpstream};
use serde_json::{Value, json};

use common::{Server, worker};

/// One run's history from its events: how many ends, whether two attempts overlapped,
/// whether it was re-leased, its end and reason.
struct History {
    ends: usize,
    overlapped: bool,
    releases: usize,
    end: Option<(String, Option<String>)>,
}

fn history(events: &[Value]) -> History {
    let mut h = History { ends: 0, overlapped: false, releases: 0, end: None };
    let mut open = false;
    for e in events {
        let e = &e["event"];
        match e["type"].as_str() {
            Some("run_started") => {
                h.overlapped |= open;
                open = true;
                if e["attempt"].as_u64().unwrap_or(1) > 1 {
                    h.releases += 1;
                }
            }
            Some("attempt_lost") => open = false,
            Some("run_finished") => {
                open = false;
                h.ends += 1;
                h.end =
                    Some((e["state"].as_str().unwrap_or_default().to_owned(), e["reason"].as_str().map(str::to_owned)));
            }
            _ => {}
        }
    }
    h
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (runs, kills, workers) =
        (args.first().copied().unwrap_or(200), args.get(1).copied().unwrap_or(20), args.get(2).copied().unwrap_or(4));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("chaos-model"));
    // Each run: a command that names its attempt, one that takes a while (so kills land
    // mid-run), then an answer.
    up.set(Behaviour {
        conversation: vec![
            Answer::Calls(vec![("run_terminal_cmd".into(), json!({"command": "echo start-$(date +%s%N)"}))]),
            Answer::Calls(vec![("run_terminal_cmd".into(), json!({"command": "sleep 2; echo worked"}))]),
            Answer::Text("done".into()),
        ],
        ..Behaviour::default()
    });
    let dir = TempDir::new();
    let config = common::agent_config(&up.url, "[runs]\nlease_ttl = \"3s\"\nmax_running_per_tenant = 1000\n");
    let (db, db_name) = match std::env::var("CARET_BENCH_DATABASE_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) => {
            let schema = format!("chaos_{}", fastrand::u32(..));
            let made = Command::new("psql").arg(&url).arg("-qc").arg(format!("CREATE SCHEMA {schema}")).status();
            assert!(made.is_ok_and(|s| s.success()), "creating a schema (psql)");
            let sep = if url.contains('?') { '&' } else { '?' };
            (vec!["--database-url".to_owned(), format!("{url}{sep}options=-csearch_path%3D{schema}")], "PostgreSQL")
        }
        None => (Vec::new(), "SQLite"),
    };
    let server = Server::start(dir.path(), &config, &[], db, "chaos");
    let (url, token) = (server.url.clone(), server.token.clone());

    let repo = dir.join("repo");
    common::committed_repo(&repo, &[("README", "chaos\n")]);
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let mut ids = Vec::new();
    for i in 0..runs {
        let body = json!({
            "repo": {"kind": "git", "url": format!("file://{}", repo.display())},
            "task": format!("chaos {i}"),
            "class": if i % 2 == 0 { "batch" } else { "interactive" },
        });
        let r: Value =
            http.post(format!("{url}/v1/runs")).bearer_auth(&token).json(&body).send().unwrap().json().unwrap();
        ids.push(r["id"].as_str().unwrap_or_else(|| panic!("{r}")).to_owned());
    }

    let started = Instant::now();
    let mut fleet: Vec<Child> = (0..workers).map(|n| worker(&server, dir.path(), n, 8)).collect();
    let mut spawned = workers;
    // A GET as the tenant, waiting out rate limits.
    let get = |path: &str| -> Value {
        loop {
            let r = http.get(format!("{url}{path}")).bearer_auth(&token).send().unwrap();
            if r.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
            assert!(r.status().is_success(), "{path}: {}", r.status());
            return r.json().unwrap();
        }
    };
    let all_ended = || -> bool {
        let list = get(&format!("/v1/runs?limit={}", runs + 10));
        let list = list["runs"].as_array().cloned().unwrap_or_default();
        list.len() == runs
            && list
                .iter()
                .all(|r| ["succeeded", "failed", "cancelled"].contains(&r["state"].as_str().unwrap_or_default()))
    };
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(fastrand::u64(300..2500)));
        let victim = fastrand::usize(..fleet.len());
        let _ = fleet[victim].kill();
        let _ = fleet[victim].wait();
        fleet[victim] = worker(&server, dir.path(), spawned, 8);
        spawned += 1;
    }
    let until = Instant::now() + Duration::from_secs(1800);
    while !all_ended() {
        assert!(Instant::now() < until, "runs did not all end within 30 minutes");
        std::thread::sleep(Duration::from_millis(500));
    }
    let wall = started.elapsed();
    for mut w in fleet {
        let _ = w.kill();
        let _ = w.wait();
    }

    let (mut ends, mut reasons) = (BTreeMap::<String, usize>::new(), BTreeMap::<String, usize>::new());
    let (mut not_once, mut overlapped, mut releases) = (0, 0, 0);
    for id in &ids {
        // Every page of the run's events (a page holds at most 1,000).
        let mut all: Vec<Value> = Vec::new();
        loop {
            let after = all.last().and_then(|e| e["seq"].as_u64()).unwrap_or(0);
            let page = get(&format!("/v1/runs/{id}/events?follow=false&after={after}"));
            let page = page.as_array().cloned().unwrap_or_default();
            if page.is_empty() {
                break;
            }
            all.extend(page);
        }
        let list = all.as_slice();
        let h = history(list);
        if h.ends != 1 || h.overlapped {
            let kinds: Vec<String> = list
                .iter()
                .filter(|e| {
                    e["event"]["type"].as_str().is_some_and(|t| t.starts_with("run_") || t.starts_with("attempt"))
                })
                .map(|e| e["event"].to_string())
                .collect();
            println!("  {id}: {kinds:#?}");
        }
        not_once += usize::from(h.ends != 1);
        overlapped += usize::from(h.overlapped);
        releases += h.releases;
        if let Some((state, reason)) = h.end {
            *ends.entry(state).or_default() += 1;
            if let Some(r) = reason {
                *reasons.entry(r.chars().take(70).collect()).or_default() += 1;
            }
        }
    }
    // What the client reads: each run's final state.
    let finals: BTreeMap<String, String> = get(&format!("/v1/runs?limit={}", runs + 10))["runs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| {
            (r["task"].as_str().unwrap_or_default().to_owned(), r["state"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    server.stop();
    let (seen, first_calls) = outside(&up.chats());
    let (mut alive_together, mut succeeded_unworked, mut never_ended) = (0, 0, 0);
    let (mut attempts, mut worked) = (0, 0);
    let started: usize = first_calls.values().sum();
    for i in 0..runs {
        let task = format!("chaos {i}");
        let mine: Vec<&Attempt> = seen.get(&task).map(|a| a.iter().collect()).unwrap_or_default();
        attempts += mine.len();
        worked += mine.iter().filter(|a| a.worked).count();
        // Two attempts alive at once: one made a model call after the next had started.
        let mut spans: Vec<(usize, usize)> = mine.iter().map(|a| (a.first, a.last)).collect();
        spans.sort();
        alive_together += usize::from(spans.windows(2).any(|w| w[0].1 > w[1].0));
        match finals.get(&task).map(String::as_str) {
            Some("succeeded") if !mine.iter().any(|a| a.worked) => succeeded_unworked += 1,
            Some("succeeded" | "failed" | "cancelled") => {}
            _ => never_ended += 1,
        }
    }
    println!(
        "chaos ({db_name}, {workers} workers × 8 slots, {runs} runs, {kills} SIGKILLs): all ended in {:.1} s",
        wall.as_secs_f64()
    );
    println!(
        "  from the outside: attempts that called the model {started}, that ran their first command {attempts}, that \
         ran their long command to the end {worked}; runs with \
         two attempts alive at once: {alive_together}; runs succeeded without an attempt that ran its command: \
         {succeeded_unworked}; runs the client never saw end: {never_ended}"
    );
    println!(
        "  the server's events: {ends:?}; runs not ended exactly once: {not_once}; runs with overlapping attempts: \
         {overlapped}; attempts re-leased: {releases}"
    );
    if !reasons.is_empty() {
        println!("  reasons: {reasons:?}");
    }
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    println!("  the server's warnings and errors: {}", warnings.len());
    for w in warnings.iter().take(10) {
        println!("    {w}");
    }
    assert_eq!(
        (alive_together, succeeded_unworked, never_ended),
        (0, 0, 0),
        "seen from the outside: a run ran twice at once, succeeded without working, or was lost"
    );
    assert_eq!((not_once, overlapped), (0, 0), "the server's events: a run was lost, ended twice or ran twice at once");
}

/// One attempt as the model server saw it: the index of its first and last model call in the
/// order calls arrived, and whether it got as far as reporting its long command's output.
struct Attempt {
    first: usize,
    last: usize,
    worked: bool,
}

/// Attempts by task, from the model calls in the order they arrived. An attempt's first call
/// carries only the task (counted per task: every attempt that started); its later calls
/// carry the `start-NANOS` token its first command printed, which names it (its span starts
/// at the token's first appearance).
fn outside(chats: &[Value]) -> (BTreeMap<String, Vec<Attempt>>, BTreeMap<String, usize>) {
    let token = regex::Regex::new(r"start-[0-9]+").expect("a valid pattern");
    let task = regex::Regex::new(r"chaos [0-9]+").expect("a valid pattern");
    let mut by_token: BTreeMap<String, (String, Attempt)> = BTreeMap::new();
    let mut first_calls: BTreeMap<String, usize> = BTreeMap::new();
    for (n, chat) in chats.iter().enumerate() {
        let text = chat.to_string();
        let Some(t) = task.find(&text) else { continue };
        let Some(tok) = token.find(&text) else {
            *first_calls.entry(t.as_str().to_owned()).or_default() += 1;
            continue;
        };
        let worked = text.contains("worked");
        let entry = by_token
            .entry(tok.as_str().to_owned())
            .or_insert_with(|| (t.as_str().to_owned(), Attempt { first: n, last: n, worked: false }));
        entry.1.last = n;
        entry.1.worked |= worked;
    }
    let mut out: BTreeMap<String, Vec<Attempt>> = BTreeMap::new();
    for (_, (t, a)) in by_token {
        out.entry(t).or_default().push(a);
    }
    (out, first_calls)
}
