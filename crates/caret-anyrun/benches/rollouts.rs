//! Load balancing of rollouts whose lengths vary wildly: the same heavy-tailed mix of attempts
//! (a scripted model — a test double — whose attempt runs `sleep $SECONDS`, 0.1–10 s,
//! Pareto-distributed) through Anyrun twice: workers pulling the next attempt when a slot frees
//! (how `caret rollout` submits), and a static round-robin partition (each slot owns a fixed
//! list, run in order). Prints makespan and slot utilisation side by side.
//!
//! `cargo bench -p caret-anyrun --bench rollouts [-- ATTEMPTS SLOTS SEED SHAPE×10]` (defaults
//! 96 8 7 10: Pareto shape 1.0).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use caret_anyrun::queue::{Dialect, Queue};
use caret_anyrun::runs::{RunService, RunSettings, TenantRef};
use caret_anyrun::worker::{InProcess, Worker, WorkerConfig};
use caret_protocol::runs::{CreateRun, RepoSource, RunClass, RunEnvironment, RunLimits, RunState};
use caret_test_support::TempDir;

/// Attempt lengths: Pareto (`shape`) from 0.1 s, capped at 10 s.
fn lengths(n: usize, shape: f64, seed: u64) -> Vec<f64> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n).map(|_| (0.1 / (1.0 - rng.f64()).powf(1.0 / shape)).min(10.0)).collect()
}

struct Outcome {
    makespan: f64,
    busy: f64,
    ok: usize,
}

async fn run_mix(s: &Arc<RunService>, url: &str, mix: &[f64], slots: usize, pull: bool) -> Outcome {
    let tenant = TenantRef { id: "t".into(), name: "t".into() };
    let request = |seconds: f64| CreateRun {
        repo: RepoSource::Git { url: url.into(), git_ref: None },
        task: "wait".into(),
        model: Some("agent".into()),
        limits: RunLimits::default(),
        environment: RunEnvironment {
            env: [("SECONDS_TO_WAIT".to_owned(), format!("{seconds:.3}"))].into(),
            ..RunEnvironment::default()
        },
        class: RunClass::Batch,
        push: None,
        git_credential: None,
        rollout: None,
    };
    let mut config = WorkerConfig::new(
        "bench",
        slots as u32,
        std::env::temp_dir().join(format!("caret-bench-{}", fastrand::u64(..))),
    );
    config.poll = Duration::from_millis(20);
    let (drain_tx, drained) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(Worker::new(Arc::new(InProcess(s.clone())), config).run(drained));
    let started = Instant::now();
    let ids: Vec<String> = if pull {
        let mut ids = Vec::new();
        for &d in mix {
            ids.push(s.submit(&tenant, request(d)).await.unwrap().id);
        }
        // Wait for all.
        for id in &ids {
            while matches!(s.get("t", id).await.unwrap().state, RunState::Queued | RunState::Running) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        ids
    } else {
        // Slot k owns attempts k, k + slots, …, run one after another.
        let mut lanes = Vec::new();
        for k in 0..slots {
            let (s, tenant, own): (Arc<RunService>, TenantRef, Vec<f64>) =
                (s.clone(), tenant.clone(), mix.iter().copied().skip(k).step_by(slots).collect());
            let make = request;
            let reqs: Vec<CreateRun> = own.into_iter().map(make).collect();
            lanes.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                for r in reqs {
                    let id = s.submit(&tenant, r).await.unwrap().id;
                    while matches!(s.get("t", &id).await.unwrap().state, RunState::Queued | RunState::Running) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    ids.push(id);
                }
                ids
            }));
        }
        let mut ids = Vec::new();
        for l in lanes {
            ids.extend(l.await.unwrap());
        }
        ids
    };
    let makespan = started.elapsed().as_secs_f64();
    let _ = drain_tx.send(true);
    let _ = worker.await;
    let (mut busy, mut ok) = (0.0, 0);
    for id in &ids {
        let info = s.get("t", id).await.unwrap();
        ok += usize::from(info.state == RunState::Succeeded);
        if let (Some(a), Some(b)) = (info.started_ms, info.finished_ms) {
            busy += (b - a) as f64 / 1000.0;
        }
    }
    Outcome { makespan, busy, ok }
}

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (attempts, slots, seed) = (
        args.first().copied().unwrap_or(96) as usize,
        args.get(1).copied().unwrap_or(8) as usize,
        args.get(2).copied().unwrap_or(7),
    );
    let shape = args.get(3).copied().unwrap_or(10) as f64 / 10.0;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let dir = TempDir::new();
        dir.write("repo/README", "wait\n");
        let repo = dir.join("repo");
        common::commit_all(&repo);
        let (_up, g) = common::scripted_agent("sleep $SECONDS_TO_WAIT").await;
        let (pool, _) = caret_test_support::database::scratch(dir.path(), "CARET_BENCH_DATABASE_URL").await;
        let q = Queue::open(pool, Dialect::Sqlite).await.unwrap();
        std::fs::create_dir_all(dir.join("objects")).unwrap();
        let store = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.join("objects")).unwrap());
        let key = caret_crypto::WorkspaceKey::generate().unwrap();
        let settings = RunSettings { max_running_per_tenant: 1024, ..RunSettings::default() };
        let s = Arc::new(RunService::new(q, store, key, Some(Arc::new(g)), settings));
        let url = format!("file://{}", repo.display());
        let mix = lengths(attempts, shape, seed);
        let work: f64 = mix.iter().sum();
        let longest = mix.iter().copied().fold(0.0, f64::max);
        println!(
            "rollout mix: {attempts} attempts of `sleep` 0.1–10 s (Pareto {shape}, seed {seed}): {work:.1} s of work, longest {longest:.1} s, {slots} slots; bound max(work/slots, longest) = {:.1} s, so no scheduler keeps slots over {:.0}% busy",
            (work / slots as f64).max(longest),
            100.0 * work / (slots as f64 * (work / slots as f64).max(longest))
        );
        for (name, pull) in [("pull (a slot takes the next attempt when it frees)", true), ("static round-robin partition", false)] {
            let o = run_mix(&s, &url, &mix, slots, pull).await;
            println!(
                "  {name}: makespan {:.1} s, slot utilisation {:.0}% ({}/{} succeeded)",
                o.makespan,
                100.0 * o.busy / (o.makespan * slots as f64),
                o.ok,
                attempts
            );
        }
    });
}
