//! Anyrun's figures: lease latency with a deep queue, and many concurrent sandboxed runs
//! against a scripted model (a test double, so the figures are the orchestrator's own).
//!
//! `cargo bench -p caret-anyrun --bench runs [-- QUEUED LEASES RUNS PAIRS]` (defaults 10000 500 200 10);
//! with `CARET_BENCH_DATABASE_URL=postgres://…` the queue is on PostgreSQL (a new schema).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use caret_anyrun::queue::{Dialect, Queue};
use caret_anyrun::runs::{RunService, RunSettings, TenantRef};
use caret_anyrun::worker::{InProcess, Worker, WorkerConfig};
use caret_models::openai::OpenAiProvider;
use caret_models::{Deployment, DeploymentLimits, Gateway, GatewaySettings};
use caret_protocol::runs::{CreateRun, LeaseRequest, RepoSource, RunClass, RunEnvironment, RunLimits, RunState};
use caret_test_support::TempDir;
use caret_test_support::scripted::{Answer, Behaviour, ScriptedUpstream};

async fn queue(dir: &TempDir) -> (Queue, String) {
    let (pool, postgres) = caret_test_support::database::scratch(dir.path(), "CARET_BENCH_DATABASE_URL").await;
    let (dialect, name) = if postgres { (Dialect::Postgres, "PostgreSQL") } else { (Dialect::Sqlite, "SQLite") };
    (Queue::open(pool, dialect).await.unwrap(), name.into())
}

async fn service(dir: &TempDir, gateway: Option<Arc<Gateway>>, settings: RunSettings) -> (Arc<RunService>, String) {
    let (q, db) = queue(dir).await;
    std::fs::create_dir_all(dir.join("objects")).unwrap();
    let store = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.join("objects")).unwrap());
    let key = caret_crypto::WorkspaceKey::generate().unwrap();
    (Arc::new(RunService::new(q, store, key, gateway, settings)), db)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn request(url: &str, class: RunClass) -> CreateRun {
    CreateRun {
        repo: RepoSource::Git { url: url.into(), git_ref: None },
        task: "make add.sh add".into(),
        model: Some("agent".into()),
        limits: RunLimits::default(),
        environment: RunEnvironment::default(),
        class,
        push: None,
        git_credential: None,
        rollout: None,
    }
}

/// Lease latency with `queued` runs waiting (one tenant holds most of them, 19 others a few).
async fn leases(queued: usize, leases: usize) {
    if leases == 0 {
        return;
    }
    let dir = TempDir::new();
    let settings = RunSettings { max_running_per_tenant: 1_000_000, ..RunSettings::default() };
    let (s, db) = service(&dir, None, settings).await;
    let started = Instant::now();
    for i in 0..queued {
        let t = if i % 10 == 0 { format!("t{}", i % 19) } else { "big".into() };
        let tenant = TenantRef { id: t.clone(), name: t };
        let class = if i % 4 == 0 { RunClass::Interactive } else { RunClass::Batch };
        s.submit(&tenant, request("file:///r", class)).await.unwrap();
    }
    let submit = started.elapsed();
    let req = LeaseRequest { worker: "bench".into(), slots: 1, busy: 0, sandbox: "none".into() };
    // The queue's transaction alone, then the whole worker call (spec opened, `run_started`
    // event written); half the leases each, the queue as deep for both.
    let mut queue_times = Vec::with_capacity(leases / 2);
    for _ in 0..leases / 2 {
        let t = Instant::now();
        let run = s.queue().lease(&req, caret_anyrun::now_ms(), 30_000).await.unwrap().unwrap().run;
        queue_times.push(t.elapsed().as_secs_f64() * 1e3);
        s.queue()
            .finish(&run.id, run.lease_token, RunState::Succeeded, None, None, caret_anyrun::now_ms())
            .await
            .unwrap();
    }
    let mut times = Vec::with_capacity(leases - leases / 2);
    for _ in leases / 2..leases {
        let t = Instant::now();
        let lease = s.lease(&req).await.unwrap().unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        s.queue()
            .finish(&lease.lease.run, lease.lease.token, RunState::Succeeded, None, None, caret_anyrun::now_ms())
            .await
            .unwrap();
    }
    for (what, times) in [("queue lease", &mut queue_times), ("worker lease", &mut times)] {
        times.sort_by(f64::total_cmp);
        println!(
            "{what} ({db}, {queued} queued, 20 tenants, 2 classes): p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms over {} leases",
            percentile(times, 0.5),
            percentile(times, 0.99),
            times.last().copied().unwrap_or_default(),
            times.len()
        );
    }
    println!("submit ({db}): {:.2} ms/run", submit.as_secs_f64() * 1e3 / queued.max(1) as f64);
}

/// RSS of this process's descendants (kB) and how many of them are sandboxes (bwrap).
fn descendants() -> (u64, usize) {
    let me = std::process::id();
    let mut parent = std::collections::HashMap::new();
    let mut rss = std::collections::HashMap::new();
    let mut names = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        for line in status.lines() {
            if let Some(v) = line.strip_prefix("PPid:") {
                parent.insert(pid, v.trim().parse::<u32>().unwrap_or(0));
            } else if let Some(v) = line.strip_prefix("VmRSS:") {
                rss.insert(pid, v.trim().trim_end_matches(" kB").trim().parse::<u64>().unwrap_or(0));
            } else if let Some(v) = line.strip_prefix("Name:") {
                names.insert(pid, v.trim().to_owned());
            }
        }
    }
    let (mut total, mut sandboxes) = (0, 0);
    for &pid in parent.keys() {
        let mut p = pid;
        let mut depth = 0;
        while p > 1 && p != me && depth < 64 {
            p = parent.get(&p).copied().unwrap_or(0);
            depth += 1;
        }
        if p == me && pid != me {
            total += rss.get(&pid).copied().unwrap_or(0);
            if names.get(&pid).is_some_and(|n| n == "bwrap") {
                sandboxes += 1;
            }
        }
    }
    (total, sandboxes / 2)
}

/// `runs` runs at once, each: clone, sandbox, a 2-second command, an answer.
async fn concurrent(runs: usize) {
    if runs == 0 {
        return;
    }
    let dir = TempDir::new();
    dir.write("repo/add.sh", "echo $(( $1 - $2 ))\n");
    let repo = dir.join("repo");
    common::commit_all(&repo);
    let (_up, g) = common::scripted_agent("sleep 2; sh add.sh 2 3").await;
    let settings = RunSettings { max_running_per_tenant: runs as u32, ..RunSettings::default() };
    let (s, db) = service(&dir, Some(Arc::new(g)), settings).await;
    let tenant = TenantRef { id: "t".into(), name: "t".into() };
    let url = format!("file://{}", repo.display());
    let mut ids = Vec::new();
    for _ in 0..runs {
        ids.push(s.submit(&tenant, request(&url, RunClass::Batch)).await.unwrap().id);
    }
    let mut config = WorkerConfig::new("bench", runs as u32, dir.join("work"));
    config.poll = Duration::from_millis(20);
    config.exit_when_idle = Some(Duration::from_millis(500));
    let started = Instant::now();
    let (_drain, drained) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(Worker::new(Arc::new(InProcess(s.clone())), config).run(drained));
    // Sample the sandboxes while the commands sleep.
    let (mut peak_sandboxes, mut rss_at_peak) = (0, 0);
    while !worker.is_finished() {
        let (rss, n) = descendants();
        if n > peak_sandboxes {
            (peak_sandboxes, rss_at_peak) = (n, rss);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let summary = worker.await.unwrap().unwrap();
    let wall = started.elapsed();
    let (mut launch, mut first_call, mut ok) = (Vec::new(), Vec::new(), 0);
    for id in &ids {
        let info = s.get("t", id).await.unwrap();
        if info.state == RunState::Succeeded {
            ok += 1;
        }
        if let Ok(r) = s.result("t", id).await {
            launch.push(r.timings.launch_ms as f64);
            first_call.push(r.timings.first_model_call_ms as f64);
        }
    }
    launch.sort_by(f64::total_cmp);
    first_call.sort_by(f64::total_cmp);
    println!(
        "concurrent runs ({db}, {runs} slots, each: git clone, bwrap sandbox, one 2 s command): {ok}/{runs} succeeded \
         ({} completed by the worker) in {:.1} s",
        summary.completed,
        wall.as_secs_f64()
    );
    println!(
        "  launch (lease → checkout + sandbox ready) p50 {:.0} ms p99 {:.0} ms; lease → first model call p50 {:.0} ms p99 {:.0} ms",
        percentile(&launch, 0.5),
        percentile(&launch, 0.99),
        percentile(&first_call, 0.5),
        percentile(&first_call, 0.99)
    );
    if peak_sandboxes > 0 {
        println!(
            "  {peak_sandboxes} sandboxes live at once: {:.1} MB RSS of their processes in all, {:.2} MB per sandbox",
            rss_at_peak as f64 / 1024.0,
            rss_at_peak as f64 / 1024.0 / peak_sandboxes as f64
        );
    }
}

/// A repository whose install step leaves `files` ignored files (a dependency tree).
fn environment_repo(dir: &TempDir, files: usize) -> std::path::PathBuf {
    dir.write("repo/add.sh", "echo $(( $1 + $2 ))\n");
    dir.write("repo/.gitignore", "deps/\n");
    dir.write(
        "repo/.caret/environment.toml",
        &format!("install = \"mkdir -p deps && for i in $(seq {files}); do echo $i > deps/f$i; done\"\n"),
    );
    let repo = dir.join("repo");
    for args in
        [&["init", "-q"][..], &["add", "-A"], &["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "i"]]
    {
        assert!(std::process::Command::new("git").args(args).current_dir(&repo).status().unwrap().success());
    }
    repo
}

/// Warm starts: a snapshot becoming a ready sandbox (each method), then whole runs of a
/// 2,000-file environment cold (a tenant's first) and warm (its second).
async fn warm(pairs: usize) {
    use caret_anyrun::snapshot::{Method, Snapshots};
    if pairs == 0 {
        return;
    }
    const FILES: usize = 2000;
    let dir = TempDir::new();
    let repo = environment_repo(&dir, FILES);
    // The snapshot alone: outputs saved once, then materialized over a checkout and a sandbox
    // started on it, as a warm attempt does.
    let install = format!("mkdir -p deps && for i in $(seq {FILES}); do echo $i > deps/f$i; done");
    assert!(std::process::Command::new("sh").args(["-c", &install]).current_dir(&repo).status().unwrap().success());
    let probe = Snapshots::new(dir.join("probe"), 1).method();
    let mut methods = vec![Method::Copy];
    if probe == Method::Overlay {
        methods.insert(0, Method::Overlay);
    }
    for method in methods {
        let snaps = Arc::new(Snapshots::new(dir.join(format!("snaps-{}", method.name())), 4).with_method(method));
        snaps.save("k", &repo).unwrap();
        let mut times = Vec::new();
        for i in 0..50 {
            let run = dir.join(format!("w/{}-{i}", method.name()));
            std::fs::create_dir_all(&run).unwrap();
            let code = run.join("code");
            let cloned = std::process::Command::new("git").args(["clone", "-q"]).arg(&repo).arg(&code).status();
            assert!(cloned.unwrap().success());
            let t = Instant::now();
            let ws = snaps.materialize("k", &code, &run.join("repo"), &run.join("overlay")).unwrap();
            let policy = caret_sandbox::Policy::new(&run.join("repo")).unwrap();
            let sandbox = caret_sandbox::Bwrap::new(policy).unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e3);
            drop((sandbox, ws));
            let _ = std::fs::remove_dir_all(&run);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "warm start ({}, {FILES}-file snapshot → sandbox ready): p50 {:.1} ms p99 {:.1} ms over {} starts",
            method.name(),
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            times.len()
        );
    }
    let _ = std::fs::remove_dir_all(repo.join("deps"));

    // Whole runs.
    let up = ScriptedUpstream::start("bench-model").await;
    up.set(Behaviour { conversation: vec![Answer::Text("done".into())], ..Behaviour::default() });
    let provider = Arc::new(OpenAiProvider::new(&up.url, None).unwrap());
    let mut g = Gateway::new(GatewaySettings::default());
    g.add_alias("agent", vec![Deployment::new("scripted", provider, "m", 0, 1, DeploymentLimits::default())]);
    let (s, db) = service(&dir, Some(Arc::new(g)), RunSettings::default()).await;
    let mut config = WorkerConfig::new("bench", 1, dir.join("work"));
    config.poll = Duration::from_millis(5);
    let (drain_tx, drained) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(Worker::new(Arc::new(InProcess(s.clone())), config).run(drained));
    let url = format!("file://{}", repo.display());
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for p in 0..pairs {
        let tenant = TenantRef { id: format!("t{p}"), name: format!("t{p}") };
        for into in [&mut cold, &mut warm] {
            let id = s.submit(&tenant, request(&url, RunClass::Interactive)).await.unwrap().id;
            while !s.get(&tenant.id, &id).await.unwrap().state.is_final() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let r = s.result(&tenant.id, &id).await.unwrap();
            into.push((r.timings.launch_ms as f64, r.timings.first_model_call_ms as f64, r.timings.warm));
        }
    }
    drain_tx.send_replace(true);
    worker.await.unwrap().unwrap();
    for (what, runs) in [("cold", &cold), ("warm", &warm)] {
        let mut launch: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let mut first: Vec<f64> = runs.iter().map(|r| r.1).collect();
        launch.sort_by(f64::total_cmp);
        first.sort_by(f64::total_cmp);
        println!(
            "{what} runs ({db}, {FILES}-file environment, {} runs, {} from a snapshot): launch p50 {:.0} ms; \
             lease → first model call p50 {:.0} ms p99 {:.0} ms",
            runs.len(),
            runs.iter().filter(|r| r.2).count(),
            percentile(&launch, 0.5),
            percentile(&first, 0.5),
            percentile(&first, 0.99)
        );
    }
}

/// `-- QUEUED LEASES RUNS PAIRS`: `-- 10000 500 0 0` measures leases alone.
fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (queued, lease_count, runs, pairs) = (
        args.first().copied().unwrap_or(10_000),
        args.get(1).copied().unwrap_or(500),
        args.get(2).copied().unwrap_or(200),
        args.get(3).copied().unwrap_or(10),
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        leases(queued, lease_count).await;
        concurrent(runs).await;
        warm(pairs).await;
    });
}
