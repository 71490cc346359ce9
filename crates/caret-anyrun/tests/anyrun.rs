//! Anyrun end to end: the queue's scheduling and fencing on the metadata database (SQLite,
//! and PostgreSQL when `CARET_TEST_DATABASE_URL` is set), and whole runs executed by a worker
//! in the bubblewrap sandbox against a scripted model (a test double from
//! `caret-test-support`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use caret_anyrun::queue::{Dialect, Queue};
use caret_anyrun::runs::{RunService, RunSettings, TenantRef};
use caret_anyrun::worker::{InProcess, Worker, WorkerConfig};
use caret_anyrun::{Error, now_ms};
use caret_models::openai::OpenAiProvider;
use caret_models::{Deployment, DeploymentLimits, Gateway, GatewaySettings};
use caret_protocol::agent::Event;
use caret_protocol::runs::{
    Completion, CreateRun, LeaseRequest, RepoSource, RunClass, RunEnvironment, RunEvent, RunLimits, RunState, RunStatus,
};
use caret_test_support::TempDir;
use caret_test_support::database::Which;
use caret_test_support::scripted::{Answer, Behaviour, ScriptedUpstream};
use serde_json::json;

/// A fresh database: SQLite in `dir`, or a new schema on the test PostgreSQL.
async fn database(dir: &TempDir) -> (sqlx::AnyPool, Dialect) {
    let (pool, postgres) = caret_test_support::database::scratch(dir.path(), "CARET_TEST_DATABASE_URL").await;
    (pool, if postgres { Dialect::Postgres } else { Dialect::Sqlite })
}

/// A run service on a fresh database of the kind asked for (`None`, said as a skip, when
/// that kind is not available here).
async fn service_on(dir: &TempDir, which: Which, settings: RunSettings) -> Option<Arc<RunService>> {
    let pool = caret_test_support::database::scratch_on(dir.path(), which, "CARET_TEST_DATABASE_URL").await?;
    let dialect = if which == Which::Postgres { Dialect::Postgres } else { Dialect::Sqlite };
    let queue = Queue::open(pool, dialect).await.unwrap();
    let store = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let key = caret_crypto::WorkspaceKey::generate().unwrap();
    Some(Arc::new(RunService::new(queue, store, key, None, settings)))
}

struct Setup {
    service: Arc<RunService>,
    objects: std::path::PathBuf,
}

async fn setup(dir: &TempDir, gateway: Option<Arc<Gateway>>, settings: RunSettings) -> Setup {
    let (pool, dialect) = database(dir).await;
    let queue = Queue::open(pool, dialect).await.unwrap();
    let objects = dir.join("objects");
    std::fs::create_dir_all(&objects).unwrap();
    let store = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&objects).unwrap());
    let key = caret_crypto::WorkspaceKey::generate().unwrap();
    Setup { service: Arc::new(RunService::new(queue, store, key, gateway, settings)), objects }
}

fn tenant(name: &str) -> TenantRef {
    TenantRef { id: format!("id-{name}"), name: name.into() }
}

fn git_run(task: &str, class: RunClass) -> CreateRun {
    CreateRun {
        repo: RepoSource::Git { url: "file:///nowhere".into(), git_ref: None },
        task: task.into(),
        model: Some("agent".into()),
        limits: RunLimits::default(),
        environment: RunEnvironment::default(),
        class,
        push: None,
        git_credential: None,
        rollout: None,
    }
}

fn lease_req(worker: &str) -> LeaseRequest {
    LeaseRequest { worker: worker.into(), slots: 1, busy: 0, sandbox: "test".into() }
}

/// On the embedded default's SQLite queue and on PostgreSQL alike.
#[tokio::test]
async fn leases_go_to_interactive_runs_first_then_to_the_tenant_with_fewest_running() {
    for which in Which::ALL {
        let dir = TempDir::new();
        let settings = RunSettings { max_running_per_tenant: 3, ..RunSettings::default() };
        if let Some(s) = service_on(&dir, which, settings).await {
            leases_in_order(s).await;
        }
    }
}

async fn leases_in_order(s: Arc<RunService>) {
    let (big, small) = (tenant("big"), tenant("small"));
    // 6 batch runs and 5 interactive runs of one tenant, then one interactive run of another.
    let mut big_batch = Vec::new();
    for i in 0..6 {
        big_batch.push(s.submit(&big, git_run(&format!("batch {i}"), RunClass::Batch)).await.unwrap().id);
    }
    let mut big_interactive = Vec::new();
    for i in 0..5 {
        big_interactive.push(s.submit(&big, git_run(&format!("i {i}"), RunClass::Interactive)).await.unwrap().id);
    }
    let lonely = s.submit(&small, git_run("one", RunClass::Interactive)).await.unwrap().id;
    let mut order = Vec::new();
    while let Some(l) = s.lease(&lease_req("w")).await.unwrap() {
        order.push(l.lease.run);
    }
    // Oldest interactive first; then the other tenant's, which has none running; then the big
    // tenant up to its cap of 3 running. Batch runs wait behind every interactive one.
    assert_eq!(order, vec![big_interactive[0].clone(), lonely, big_interactive[1].clone(), big_interactive[2].clone()]);
    assert_eq!(s.get(&small.id, &order[1]).await.unwrap().state, RunState::Running);
    // The other tenant's view of a run is a missing run.
    assert!(matches!(s.get(&small.id, &order[0]).await, Err(Error::NotFound(_))));
    assert!(matches!(s.cancel(&small.id, &order[0]).await, Err(Error::NotFound(_))));
    assert!(matches!(s.events(&small.id, &order[0], 0, 10).await, Err(Error::NotFound(_))));
    assert!(matches!(s.result(&small.id, &order[0]).await, Err(Error::NotFound(_))));
    assert_eq!(s.list(&small.id, 10).await.unwrap().len(), 1);
    // A cancelled queued run never starts.
    s.cancel(&big.id, &big_interactive[3]).await.unwrap();
    s.queue().set_tenant_cap(&big.id, 20).await.unwrap();
    let mut rest = Vec::new();
    while let Some(l) = s.lease(&lease_req("w")).await.unwrap() {
        rest.push(l.lease.run);
    }
    let mut expected = vec![big_interactive[4].clone()];
    expected.extend(big_batch);
    assert_eq!(rest, expected);
    assert_eq!(s.get(&big.id, &big_interactive[3]).await.unwrap().state, RunState::Cancelled);
}

/// On the embedded default's SQLite queue and on PostgreSQL alike.
#[tokio::test]
async fn a_lost_lease_is_fenced_and_the_run_is_leased_again_until_its_attempts_are_used_up() {
    for which in Which::ALL {
        let dir = TempDir::new();
        if let Some(s) = service_on(&dir, which, RunSettings { max_attempts: 2, ..RunSettings::default() }).await {
            lost_leases_are_fenced(s).await;
        }
    }
}

async fn lost_leases_are_fenced(s: Arc<RunService>) {
    let q = s.queue();
    let t = tenant("t");
    let id = s.submit(&t, git_run("task", RunClass::Interactive)).await.unwrap().id;
    let t0 = now_ms();
    let first = q.lease(&lease_req("w1"), t0, 1000).await.unwrap().unwrap().run;
    assert_eq!((first.attempt, first.lease_token), (1, 1));
    assert!(!q.heartbeat(&id, 1, None, t0 + 500, 1000).await.unwrap());
    // The worker goes silent: the lease ends; the run is queued again.
    assert!(q.expire(t0 + 1400, |_, _, _, _| None).await.unwrap().is_empty(), "the heartbeat renewed it");
    let expired = q.expire(t0 + 1600, |_, _, _, _| None).await.unwrap();
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].now, RunState::Queued);
    let second = q.lease(&lease_req("w2"), t0 + 1700, 1000).await.unwrap().unwrap().run;
    assert_eq!((second.attempt, second.lease_token, second.worker.as_deref()), (2, 2, Some("w2")));
    // The first worker wakes up: everything it says is refused.
    assert!(matches!(q.heartbeat(&id, 1, None, t0 + 1800, 1000).await, Err(Error::Fenced(_))));
    assert!(matches!(q.append(&id, 1, &["x".into()]).await, Err(Error::Fenced(_))));
    assert!(matches!(q.add_tokens(&id, 1, 10).await, Err(Error::Fenced(_))));
    assert!(matches!(q.finish(&id, 1, RunState::Succeeded, None, None, t0).await, Err(Error::Fenced(_))));
    let stale = Completion {
        lease: caret_protocol::runs::LeaseRef { run: id.clone(), token: 1 },
        state: RunState::Succeeded,
        reason: None,
        retry: false,
        result: None,
        docs: None,
    };
    assert!(matches!(s.complete(stale).await, Err(Error::Fenced(_))));
    // The second attempt is lost too: no attempts are left, so the run fails with the reason.
    let expired = q.expire(t0 + 3000, |_, _, _, _| None).await.unwrap();
    assert_eq!(expired[0].now, RunState::Failed);
    let row = q.get(&t.id, &id).await.unwrap().unwrap();
    assert_eq!(row.state, RunState::Failed);
    assert!(row.reason.unwrap().contains("lease expired"), "the reason says why");
    assert!(q.lease(&lease_req("w3"), t0 + 3100, 1000).await.unwrap().is_none());
}

/// A repository whose `add.sh` subtracts, with a test that says so.
fn buggy_repo(dir: &TempDir) -> std::path::PathBuf {
    dir.write("repo/add.sh", "echo $(( $1 - $2 ))\n");
    dir.write("repo/test.sh", "[ \"$(sh add.sh 2 3)\" = 5 ] && echo 'tests pass' || { echo 'tests FAIL'; exit 1; }\n");
    dir.write("repo/.caret/environment.toml", "install = \"echo installing\"\ntest = \"sh test.sh\"\n");
    dir.write("repo/AGENTS.md", "Check your work with `sh test.sh`.\n");
    let repo = dir.join("repo");
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(&repo)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["add", "-A"]);
    git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init"]);
    // An uncommitted change travels with the bundle.
    dir.write("repo/NOTES.md", "uncommitted notes\n");
    repo
}

/// The repository as `caret run` sends it: a bundle of HEAD and the uncommitted changes.
fn bundle_of(repo: &std::path::Path) -> RepoSource {
    use base64::Engine as _;
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git").args(args).current_dir(repo).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    let file = repo.join("../code.bundle");
    git(&["bundle", "create", "-q", file.to_str().unwrap(), "HEAD"]);
    let head = String::from_utf8(git(&["rev-parse", "HEAD"])).unwrap().trim().to_owned();
    git(&["add", "-N", "NOTES.md"]);
    let patch = String::from_utf8(git(&["diff", "--binary", "HEAD"])).unwrap();
    RepoSource::Bundle {
        bundle: base64::engine::general_purpose::STANDARD.encode(std::fs::read(&file).unwrap()),
        head,
        patch,
    }
}

async fn scripted_gateway(conversation: Vec<Answer>) -> (ScriptedUpstream, Arc<Gateway>) {
    let up = ScriptedUpstream::start("agent-model").await;
    up.set(Behaviour { conversation, ..Behaviour::default() });
    let provider = Arc::new(OpenAiProvider::new(&up.url, None).unwrap());
    let mut g = Gateway::new(GatewaySettings::default());
    g.add_alias("agent", vec![Deployment::new("scripted", provider, "m", 0, 1, DeploymentLimits::default())]);
    (up, Arc::new(g))
}

/// What is left in the worker's directory besides its lock file: the snapshots only, once
/// runs are over.
fn run_dirs_left(dir: &TempDir) -> Vec<std::ffi::OsString> {
    let names = dir.join("work").read_dir().unwrap().flatten().map(|e| e.file_name());
    names.filter(|n| n != ".worker.lock").collect()
}

/// The scripted agent's edit that makes `add.sh` of [`buggy_repo`] add.
fn fix_add() -> Answer {
    Answer::Calls(vec![(
        "edit_file".into(),
        json!({"path": "add.sh", "edit": "<<<<<<< SEARCH\necho $(( $1 - $2 ))\n=======\necho $(( $1 + $2 ))\n>>>>>>> REPLACE"}),
    )])
}

/// What the run's first terminal command printed (as its event reports it).
fn terminal_output(events: &[caret_protocol::runs::NumberedEvent]) -> String {
    events
        .iter()
        .find_map(|e| match &e.event {
            RunEvent::Agent(Event::ToolCallEnd { name, output, .. }) if name == "run_terminal_cmd" => {
                Some(output.clone())
            }
            _ => None,
        })
        .expect("a terminal command ran")
}

fn worker(s: &Arc<RunService>, dir: &TempDir, slots: u32) -> Worker {
    let mut config = WorkerConfig::new("test-worker", slots, dir.join("work"));
    config.poll = Duration::from_millis(50);
    config.exit_when_idle = Some(Duration::from_millis(300));
    Worker::new(Arc::new(InProcess(s.clone())), config)
}

async fn wait_for(s: &RunService, t: &TenantRef, id: &str, within: Duration) -> caret_protocol::runs::RunInfo {
    let until = Instant::now() + within;
    loop {
        let info = s.get(&t.id, id).await.unwrap();
        if info.state.is_final() || Instant::now() > until {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn files_containing(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in walk(dir) {
        if std::fs::read(&entry).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)) {
            found.push(entry);
        }
    }
    found
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

#[tokio::test]
async fn a_run_fixes_a_bug_in_its_sandbox_and_the_patch_passes_the_tests() {
    let dir = TempDir::new();
    let repo = buggy_repo(&dir);
    let conversation = vec![
        Answer::Calls(vec![("read_file".into(), json!({"path": "add.sh"}))]),
        fix_add(),
        Answer::Calls(vec![("run_terminal_cmd".into(), json!({"command": "echo token=$DEPLOY_TOKEN; sh test.sh"}))]),
        Answer::Text("Fixed add.sh: it subtracted.".into()),
    ];
    let (up, gateway) = scripted_gateway(conversation).await;
    let s = setup(&dir, Some(gateway), RunSettings::default()).await;
    let service = s.service.clone();
    // Usage telemetry, on: the run's end is counted.
    std::fs::create_dir_all(dir.join("usage")).unwrap();
    let usage_store: Arc<dyn object_store::ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.join("usage")).unwrap());
    let usage = caret_usage::Recorder::new(usage_store.clone(), caret_usage::Settings::default());
    service.metrics.set_usage(usage.clone());
    let t = tenant("acme");
    let canary = "canary-9f8e7d6c5b4a";
    service.put_secret(&t.id, "DEPLOY_TOKEN", canary).await.unwrap();
    let req = CreateRun {
        repo: bundle_of(&repo),
        task: "add.sh subtracts; make it add".into(),
        model: None,
        limits: RunLimits::default(),
        environment: RunEnvironment {
            setup: vec!["echo setup-ok".into()],
            secrets: vec!["DEPLOY_TOKEN".into()],
            ..RunEnvironment::default()
        },
        class: RunClass::Interactive,
        push: None,
        git_credential: None,
        rollout: None,
    };
    let id = service.submit(&t, req).await.unwrap().id;
    let bundle_dir = s.objects.join("anyrun").join(&t.id).join(&id);
    assert!(bundle_dir.join("bundle").exists(), "the bundle is stored");
    assert!(files_containing(&s.objects, b"echo $(( $1 - $2 ))").is_empty(), "the bundle is sealed at rest");

    let (_drain, drained) = tokio::sync::watch::channel(false);
    let summary = worker(&service, &dir, 1).run(drained).await.unwrap();
    assert_eq!(summary.completed, 1);
    assert!(up.violations().is_empty(), "{:?}", up.violations());
    // The repository's AGENTS.md reached the run's agent.
    let first = &up.chats()[0];
    let system = first["messages"][0]["content"].as_str().unwrap_or_default();
    assert!(system.contains("Check your work with `sh test.sh`."), "{system}");
    let info = service.get(&t.id, &id).await.unwrap();
    assert_eq!(info.state, RunState::Succeeded, "{info:?}");
    assert_eq!(info.attempt, 1);
    usage.flush().await.unwrap();
    let counted = caret_usage::read(usage_store.as_ref(), Some(&t.id), 0).await.unwrap();
    let summary = caret_usage::summarise(&counted.rows, false);
    assert_eq!(summary.len(), 1, "{summary:?}");
    assert_eq!((summary[0].event.as_str(), summary[0].label.as_str(), summary[0].count), ("run", "succeeded", 1));
    assert!(summary[0].p50_ms.is_some_and(|ms| ms > 0.0), "{summary:?}");

    let result = service.result(&t.id, &id).await.unwrap();
    assert_eq!(result.turn_end, "done");
    assert_eq!(result.final_message, "Fixed add.sh: it subtracted.");
    assert_eq!(result.files, vec!["add.sh".to_owned()], "only the agent's change; NOTES.md was the base");
    let test = result.test.clone().unwrap();
    assert_eq!((test.command.as_str(), test.exit_code), ("sh test.sh", Some(0)));
    assert!(test.output.contains("tests pass"));
    assert!(result.timings.first_model_call_ms >= result.timings.launch_ms);

    // The patch applies to the user's checkout (with its uncommitted notes) and the tests pass.
    let patch = dir.join("run.patch");
    std::fs::write(&patch, &result.patch).unwrap();
    let apply =
        std::process::Command::new("git").args(["apply", patch.to_str().unwrap()]).current_dir(&repo).status().unwrap();
    assert!(apply.success());
    let tests = std::process::Command::new("sh").arg("test.sh").current_dir(&repo).output().unwrap();
    assert!(tests.status.success(), "{}", String::from_utf8_lossy(&tests.stdout));

    // Events: the lifecycle and the agent's, in order, the secret redacted.
    let events = service.events(&t.id, &id, 0, 1000).await.unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    assert!(matches!(events[0].event, RunEvent::Run(RunStatus::RunStarted { attempt: 1, .. })));
    let steps: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.event {
            RunEvent::Run(RunStatus::SetupStep { command, exit_code: Some(0), .. }) => Some(command.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(steps, vec!["echo installing", "echo setup-ok"]);
    let terminal = terminal_output(&events);
    assert!(terminal.contains("token=[secret DEPLOY_TOKEN]") && terminal.contains("tests pass"), "{terminal}");
    assert!(matches!(
        events.last().unwrap().event,
        RunEvent::Run(RunStatus::RunFinished { state: RunState::Succeeded, .. })
    ));
    // Resuming after an event number gives exactly the rest.
    assert_eq!(service.events(&t.id, &id, 3, 1000).await.unwrap(), events[3..].to_vec());

    // Nothing the server keeps holds the secret or the code in the clear; the bundle is gone.
    assert!(!bundle_dir.join("bundle").exists(), "the bundle is collected when the run ends");
    assert!(files_containing(dir.path(), canary.as_bytes()).is_empty(), "the secret canary is nowhere at rest");
    assert!(files_containing(&s.objects, b"$1 + $2").is_empty());
    let left = run_dirs_left(&dir);
    assert_eq!(left, vec![std::ffi::OsString::from("snapshots")], "the run's directory is removed");

    // Collected on request: events, result and row.
    service.delete(&t.id, &id).await.unwrap();
    assert!(matches!(service.get(&t.id, &id).await, Err(Error::NotFound(_))));
    assert!(walk(&s.objects).is_empty());
}

#[tokio::test]
async fn a_cancel_reaches_a_running_command_within_seconds() {
    let dir = TempDir::new();
    let repo = buggy_repo(&dir);
    let marker = "touched-after-sleep";
    let conversation = vec![
        Answer::Calls(vec![(
            "run_terminal_cmd".into(),
            json!({"command": format!("sleep 30; touch {marker}"), "timeout_s": 60}),
        )]),
        Answer::Text("done".into()),
    ];
    let (_up, gateway) = scripted_gateway(conversation).await;
    let s =
        setup(&dir, Some(gateway), RunSettings { lease_ttl: Duration::from_secs(1), ..RunSettings::default() }).await;
    let service = s.service.clone();
    let t = tenant("acme");
    let mut req = git_run("wait", RunClass::Interactive);
    req.repo = RepoSource::Git { url: format!("file://{}", repo.display()), git_ref: None };
    let id = service.submit(&t, req).await.unwrap().id;
    let (_drain, drained) = tokio::sync::watch::channel(false);
    let w = tokio::spawn(worker(&service, &dir, 1).run(drained));
    // Wait until the command runs, then cancel.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let events = service.events(&t.id, &id, 0, 1000).await.unwrap();
        if events.iter().any(|e| matches!(&e.event, RunEvent::Agent(Event::ToolCallBegin { .. }))) {
            break;
        }
        assert!(Instant::now() < until, "the command never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let asked = Instant::now();
    let info = service.cancel(&t.id, &id).await.unwrap();
    assert!(info.cancel_requested);
    let info = wait_for(&service, &t, &id, Duration::from_secs(10)).await;
    assert_eq!(info.state, RunState::Cancelled);
    assert!(asked.elapsed() < Duration::from_secs(5), "cancelled in {:?}", asked.elapsed());
    w.await.unwrap().unwrap();
    assert!(files_containing(&dir.join("work"), marker.as_bytes()).is_empty());
    assert!(walk(&dir.join("work")).iter().all(|p| !p.ends_with(marker)), "the command was killed");
}

#[tokio::test]
async fn a_run_whose_worker_died_is_finished_by_another_worker() {
    let dir = TempDir::new();
    let repo = buggy_repo(&dir);
    let conversation = vec![Answer::Text("nothing to do".into())];
    let (_up, gateway) = scripted_gateway(conversation).await;
    let settings = RunSettings { lease_ttl: Duration::from_millis(500), ..RunSettings::default() };
    let service = setup(&dir, Some(gateway), settings).await.service;
    let t = tenant("acme");
    let mut req = git_run("look around", RunClass::Batch);
    req.repo = RepoSource::Git { url: format!("file://{}", repo.display()), git_ref: None };
    let id = service.submit(&t, req).await.unwrap().id;
    // A worker leases it and dies (never heartbeats nor completes).
    let dead = service.lease(&lease_req("dead-worker")).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (_drain, drained) = tokio::sync::watch::channel(false);
    worker(&service, &dir, 1).run(drained).await.unwrap();
    let info = service.get(&t.id, &id).await.unwrap();
    assert_eq!((info.state, info.attempt), (RunState::Succeeded, 2), "{info:?}");
    let events = service.events(&t.id, &id, 0, 1000).await.unwrap();
    let lost: Vec<_> = events
        .iter()
        .filter(|e| matches!(&e.event, RunEvent::Run(RunStatus::AttemptLost { attempt: 1, .. })))
        .collect();
    assert_eq!(lost.len(), 1);
    // The dead worker's late report changes nothing.
    let late =
        Completion { lease: dead.lease, state: RunState::Failed, reason: None, retry: false, result: None, docs: None };
    assert!(matches!(service.complete(late).await, Err(Error::Fenced(_))));
    assert_eq!(service.get(&t.id, &id).await.unwrap().state, RunState::Succeeded);
}

#[tokio::test]
async fn bad_submissions_are_refused_with_a_reason() {
    let dir = TempDir::new();
    let s = setup(&dir, None, RunSettings::default()).await.service;
    let t = tenant("t");
    let refused = |r: Result<caret_protocol::runs::RunInfo, Error>| match r {
        Err(Error::BadRequest(m)) => m,
        other => panic!("not refused: {other:?}"),
    };
    let mut req = git_run(" ", RunClass::Interactive);
    assert!(refused(s.submit(&t, req.clone()).await).contains("task"));
    req.task = "x".into();
    req.repo = RepoSource::Git { url: "ext::sh -c evil".into(), git_ref: None };
    assert!(refused(s.submit(&t, req.clone()).await).contains("file://"));
    req.repo = RepoSource::Bundle { bundle: "bm90IGEgYnVuZGxl".into(), head: "abcdef1".into(), patch: String::new() };
    assert!(refused(s.submit(&t, req.clone()).await).contains("not a git bundle"));
    req.repo = RepoSource::Bundle { bundle: "%%%".into(), head: "abcdef1".into(), patch: String::new() };
    assert!(refused(s.submit(&t, req.clone()).await).contains("base64"));
    req.repo = RepoSource::Git { url: "file:///r".into(), git_ref: None };
    req.environment.secrets = vec!["MISSING".into()];
    assert!(refused(s.submit(&t, req.clone()).await).contains("no secret named"));
    req.environment.secrets = vec!["BAD NAME".into()];
    assert!(refused(s.submit(&t, req.clone()).await).contains("not a valid"));
    req.environment.secrets = Vec::new();
    req.environment.hosts = vec!["pypi.org".into(), "https://evil.example/x".into()];
    assert!(refused(s.submit(&t, req.clone()).await).contains("a host name, not a URL"));
    assert!(s.list(&t.id, 10).await.unwrap().is_empty(), "nothing was queued");
}

/// A team server's queue (a guarded egress policy): the whole network only where the operator
/// allows it; hosts written as internal addresses refused at submission, in every spelling,
/// unless the operator opened them; names pass (the worker's proxy checks what they resolve to).
#[tokio::test]
async fn a_team_queue_refuses_the_whole_network_and_internal_hosts() {
    let dir = TempDir::new();
    let settings = RunSettings {
        egress: caret_sandbox::egress::Egress::guarded(&["10.1.2.0/24", "docs.intranet"]).unwrap(),
        whole_network: false,
        ..RunSettings::default()
    };
    let s = setup(&dir, None, settings).await.service;
    let t = tenant("t");
    let refused = |r: Result<caret_protocol::runs::RunInfo, Error>| match r {
        Err(Error::BadRequest(m)) => m,
        other => panic!("not refused: {other:?}"),
    };
    let mut req = git_run("x", RunClass::Interactive);
    req.repo = RepoSource::Git { url: "file:///r".into(), git_ref: None };
    req.environment.network = true;
    assert!(refused(s.submit(&t, req.clone()).await).contains("runs_network"));
    req.environment.network = false;
    for host in ["127.0.0.1", "169.254.169.254:80", "[::ffff:127.0.0.1]:8080", "10.9.0.1:443", "[fd00:ec2::254]:80"] {
        req.environment.hosts = vec!["pypi.org".into(), host.into()];
        let why = refused(s.submit(&t, req.clone()).await);
        assert!(why.contains("egress policy refuses") && why.contains("egress_allow"), "{host}: {why}");
    }
    assert!(s.list(&t.id, 10).await.unwrap().is_empty(), "nothing was queued");
    req.environment.hosts = vec!["10.1.2.7:8080".into(), "docs.intranet".into(), "localhost".into()];
    assert!(s.submit(&t, req.clone()).await.is_ok(), "opened ranges and names pass");
}

#[tokio::test]
async fn a_run_whose_worker_dies_continues_from_its_last_checkpoint() {
    let dir = TempDir::new();
    let repo = buggy_repo(&dir);
    // Read, fix, then a long command during which the worker dies; the next attempt is
    // answered with the conversation's next step (the scripted model counts the assistant
    // messages it is sent), so it only finishes if the conversation was carried over.
    let conversation = vec![
        Answer::Calls(vec![("read_file".into(), serde_json::json!({"path": "add.sh"}))]),
        fix_add(),
        Answer::Calls(vec![("run_terminal_cmd".into(), serde_json::json!({"command": "sleep 60"}))]),
        Answer::Text("add.sh adds now.".into()),
    ];
    let (up, gateway) = scripted_gateway(conversation).await;
    let settings = RunSettings { lease_ttl: Duration::from_secs(1), ..RunSettings::default() };
    let service = setup(&dir, Some(gateway), settings).await.service;
    let t = tenant("acme");
    let mut req = git_run("make add.sh add", RunClass::Batch);
    req.repo = RepoSource::Git { url: format!("file://{}", repo.display()), git_ref: None };
    let id = service.submit(&t, req).await.unwrap().id;

    let mut config = WorkerConfig::new("doomed", 1, dir.join("work-doomed"));
    config.poll = Duration::from_millis(50);
    let (_keep, drain) = tokio::sync::watch::channel(false);
    // Its own runtime: shutting that down stops every task of the worker at once, as a killed
    // process would (no heartbeat, no report).
    let doomed = tokio::runtime::Runtime::new().unwrap();
    doomed.spawn(Worker::new(Arc::new(InProcess(service.clone())), config).run(drain));
    // Once the fix is in a checkpoint, the worker dies (no drain, no hand-back).
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let saved = service.saved_checkpoint(&id).await.unwrap();
        if saved.as_ref().is_some_and(|c| c.patch.contains("+echo $(( $1 + $2 ))")) {
            break;
        }
        assert!(Instant::now() < until, "no checkpoint with the fix: {saved:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    doomed.shutdown_background();

    // Once the lost lease expires (a heartbeat in flight at the kill may have renewed it a
    // moment later), a new worker takes the run; one that finds nothing yet exits when idle
    // and the next one asks again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (_drain, drained) = tokio::sync::watch::channel(false);
    let until = Instant::now() + Duration::from_secs(30);
    let info = loop {
        worker(&service, &dir, 1).run(drained.clone()).await.unwrap();
        let info = service.get(&t.id, &id).await.unwrap();
        if info.state.is_final() || Instant::now() > until {
            break info;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!((info.state, info.attempt), (RunState::Succeeded, 2), "{info:?}");
    let result = service.result(&t.id, &id).await.unwrap();
    assert!(result.patch.contains("+echo $(( $1 + $2 ))"), "the first attempt's fix is in the result: {result:?}");
    assert_eq!(result.test.as_ref().and_then(|t| t.exit_code), Some(0), "{result:?}");
    let events = service.events(&t.id, &id, 0, 1000).await.unwrap();
    assert!(
        events.iter().any(|e| matches!(&e.event, RunEvent::Run(RunStatus::Resumed { files: 1, conversation: true }))),
        "{events:?}"
    );
    // The second attempt went on with the conversation: told why, the killed call answered.
    let last = up.chats().last().cloned().unwrap();
    let text = last.to_string();
    assert!(text.contains("moved to another machine part-way through"), "{text}");
    assert!(text.contains("interrupted: the run moved"), "{text}");
    assert_eq!(up.chats().len(), 4, "three model calls, then one that finished: no step was redone");
    // The checkpoints went with the run's end.
    assert!(service.saved_checkpoint(&id).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_runs_of_an_environment_start_from_its_snapshot_and_leave_it_untouched() {
    // Overlays where this machine can mount them, and copies everywhere.
    let probe = TempDir::new();
    let overlay = caret_anyrun::snapshot::Snapshots::new(probe.join("s"), 1).method();
    let mut methods = vec![caret_anyrun::snapshot::Method::Copy];
    if overlay == caret_anyrun::snapshot::Method::Overlay {
        methods.push(overlay);
    } else {
        caret_test_support::skip("overlay mounts are not possible here (not root, or no overlayfs): copies only");
    }
    for method in methods {
        warm_starts(method).await;
    }
}

async fn warm_starts(method: caret_anyrun::snapshot::Method) {
    let dir = TempDir::new();
    let repo = buggy_repo(&dir);
    // The install leaves an ignored output; each run's agent counts its lines, then adds one.
    std::fs::write(
        repo.join(".caret/environment.toml"),
        "install = \"mkdir -p deps && echo installed >> deps/log\"\ninstall_inputs = [\"add.sh\"]\ntest = \"sh test.sh\"\n",
    )
    .unwrap();
    std::fs::write(repo.join(".gitignore"), "deps/\n").unwrap();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git").args(args).current_dir(&repo).status().unwrap().success();
        assert!(ok, "git {args:?}");
    };
    git(&["add", "-A"]);
    git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "environment"]);
    let conversation = vec![
        Answer::Calls(vec![(
            "run_terminal_cmd".into(),
            json!({"command": "echo lines=$(wc -l < deps/log); echo run >> deps/log"}),
        )]),
        Answer::Text("counted".into()),
    ];
    let (_up, gateway) = scripted_gateway(conversation).await;
    let service = setup(&dir, Some(gateway), RunSettings::default()).await.service;
    let t = tenant("acme");
    let mut ids = Vec::new();
    for _ in 0..3 {
        let mut req = git_run("count", RunClass::Interactive);
        req.repo = RepoSource::Git { url: format!("file://{}", repo.display()), git_ref: None };
        ids.push(service.submit(&t, req).await.unwrap().id);
    }
    let (_drain, drained) = tokio::sync::watch::channel(false);
    let mut config = WorkerConfig::new("test-worker", 1, dir.join("work"));
    config.poll = Duration::from_millis(50);
    config.exit_when_idle = Some(Duration::from_millis(300));
    let snapshots = caret_anyrun::snapshot::Snapshots::new(dir.join("work/snapshots"), 8);
    config.snapshots = Some(Arc::new(snapshots.with_method(method)));
    Worker::new(Arc::new(InProcess(service.clone())), config).run(drained).await.unwrap();
    let mut seen = Vec::new();
    for id in &ids {
        let info = service.get(&t.id, id).await.unwrap();
        assert_eq!(info.state, RunState::Succeeded, "{info:?}");
        let events = service.events(&t.id, id, 0, 1000).await.unwrap();
        let installs = events
            .iter()
            .filter(|e| matches!(&e.event, RunEvent::Run(RunStatus::SetupStep { command, .. }) if command.contains("deps/log")))
            .count();
        let snapshot = events.iter().find_map(|e| match &e.event {
            RunEvent::Run(RunStatus::Snapshot { saved, method, .. }) => Some((*saved, method.clone())),
            _ => None,
        });
        let counted =
            terminal_output(&events).lines().find(|l| l.starts_with("lines=")).map(str::to_owned).unwrap_or_default();
        let result = service.result(&t.id, id).await.unwrap();
        seen.push((
            installs,
            snapshot.as_ref().map(|(saved, _)| *saved),
            counted,
            result.timings.warm,
            result.files.is_empty(),
        ));
        if let Some((false, used)) = snapshot {
            assert_eq!(used, method.name());
        }
    }
    let first = (1, Some(true), "lines=1".to_owned(), false, true);
    let warm = (0, Some(false), "lines=1".to_owned(), true, true);
    assert_eq!(seen, vec![first, warm.clone(), warm], "install once; later runs see its output, never another run's");
    let left = run_dirs_left(&dir);
    assert_eq!(left, vec![std::ffi::OsString::from("snapshots")], "runs' directories (and mounts) are gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_in_gvisor_fixes_the_bug_like_one_in_bubblewrap() {
    if !["/usr/bin/runsc", "/usr/local/bin/runsc"].iter().any(|p| std::path::Path::new(p).exists()) {
        caret_test_support::skip("runsc is not installed: the gVisor backend's absence is checked in caret-sandbox");
        return;
    }
    let dir = TempDir::new();
    let repo = buggy_repo(&dir);
    let conversation = vec![
        fix_add(),
        Answer::Calls(vec![(
            "run_terminal_cmd".into(),
            json!({"command": "sh test.sh; grep CapEff /proc/self/status"}),
        )]),
        Answer::Text("fixed".into()),
    ];
    let (_up, gateway) = scripted_gateway(conversation).await;
    let service = setup(&dir, Some(gateway), RunSettings::default()).await.service;
    let t = tenant("acme");
    let mut req = git_run("make add.sh add", RunClass::Interactive);
    req.repo = RepoSource::Git { url: format!("file://{}", repo.display()), git_ref: None };
    let id = service.submit(&t, req).await.unwrap().id;
    let mut config = WorkerConfig::new("gvisor-worker", 1, dir.join("work"));
    config.poll = Duration::from_millis(50);
    config.exit_when_idle = Some(Duration::from_millis(300));
    config.sandbox = caret_anyrun::worker::SandboxKind::Gvisor;
    let (_drain, drained) = tokio::sync::watch::channel(false);
    Worker::new(Arc::new(InProcess(service.clone())), config).run(drained).await.unwrap();
    let info = service.get(&t.id, &id).await.unwrap();
    assert_eq!(info.state, RunState::Succeeded, "{info:?}");
    let result = service.result(&t.id, &id).await.unwrap();
    assert_eq!(result.test.as_ref().and_then(|t| t.exit_code), Some(0), "{result:?}");
    assert!(result.patch.contains("+echo $(( $1 + $2 ))"));
    let events = service.events(&t.id, &id, 0, 1000).await.unwrap();
    let terminal = terminal_output(&events);
    assert!(terminal.contains("tests pass") && terminal.contains("CapEff:\t0000000000000000"), "{terminal}");
}

#[tokio::test]
async fn a_run_pushes_its_changes_as_a_branch_when_asked() {
    let dir = TempDir::new();
    let repo = buggy_repo(&dir);
    let conversation = vec![fix_add(), Answer::Text("fixed".into())];
    let (_up, gateway) = scripted_gateway(conversation).await;
    let service = setup(&dir, Some(gateway), RunSettings::default()).await.service;
    let t = tenant("acme");
    let mut req = git_run("Make add.sh add\n\nIt subtracted.", RunClass::Interactive);
    req.repo = RepoSource::Git { url: format!("file://{}", repo.display()), git_ref: None };
    req.push = Some(caret_protocol::runs::PushTarget { url: None, branch: Some("-f".into()) });
    let refused = service.submit(&t, req.clone()).await.unwrap_err().to_string();
    assert!(refused.contains("not a usable branch name"), "{refused}");
    req.push = Some(caret_protocol::runs::PushTarget::default());
    let id = service.submit(&t, req).await.unwrap().id;
    let (_drain, drained) = tokio::sync::watch::channel(false);
    worker(&service, &dir, 1).run(drained).await.unwrap();
    let info = service.get(&t.id, &id).await.unwrap();
    assert_eq!(info.state, RunState::Succeeded, "{info:?}");
    let pushed = service.result(&t.id, &id).await.unwrap().push.unwrap();
    assert_eq!((pushed.branch.as_str(), pushed.error.as_deref()), (format!("caret/{id}").as_str(), None));
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git").args(args).current_dir(&repo).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let branch = format!("caret/{id}");
    assert_eq!(git(&["rev-parse", &branch]), pushed.commit.unwrap());
    assert_eq!(git(&["show", &format!("{branch}:add.sh")]), "echo $(( $1 + $2 ))");
    assert_eq!(git(&["log", "-1", "--format=%s", &branch]), "Make add.sh add");
    // One commit on the code's head: the empty starting point was dropped.
    assert_eq!(git(&["rev-parse", &format!("{branch}~1")]), git(&["rev-parse", "main"]));
}

#[tokio::test]
async fn a_run_that_fills_its_disk_is_stopped_with_the_reason() {
    let dir = TempDir::new();
    let repo = buggy_repo(&dir);
    let conversation = vec![
        Answer::Calls(vec![(
            "run_terminal_cmd".into(),
            json!({"command": "head -c 40000000 /dev/urandom > big.bin; sleep 20; echo never"}),
        )]),
        Answer::Text("done".into()),
    ];
    let (_up, gateway) = scripted_gateway(conversation).await;
    let service = setup(&dir, Some(gateway), RunSettings::default()).await.service;
    let t = tenant("acme");
    let mut req = git_run("fill the disk", RunClass::Interactive);
    req.repo = RepoSource::Git { url: format!("file://{}", repo.display()), git_ref: None };
    req.limits.disk_bytes = 20 << 20;
    let id = service.submit(&t, req).await.unwrap().id;
    let (_drain, drained) = tokio::sync::watch::channel(false);
    worker(&service, &dir, 1).run(drained).await.unwrap();
    let info = service.get(&t.id, &id).await.unwrap();
    assert_eq!(info.state, RunState::Failed, "{info:?}");
    assert!(info.reason.as_deref().unwrap_or_default().contains("disk limit"), "{info:?}");
    let events = service.events(&t.id, &id, 0, 1000).await.unwrap();
    assert!(
        !events.iter().any(|e| matches!(&e.event, RunEvent::Agent(Event::ToolCallEnd { .. }))),
        "the command was stopped, not left to finish: {events:?}"
    );
    assert_eq!(run_dirs_left(&dir), vec![std::ffi::OsString::from("snapshots")]);
}

/// A worker told to exit when idle also exits when its coordinator stops answering (a server
/// gone, a local one's storage deleted) rather than asking forever.
#[tokio::test]
async fn an_idle_worker_whose_coordinator_is_gone_exits() {
    let dir = TempDir::new();
    // A port nobody listens on: every lease fails.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let remote = caret_anyrun::remote::Remote::new(&url, "operator-token", reqwest::Client::new());
    let mut config = WorkerConfig::new("orphan", 2, dir.join("work"));
    config.poll = Duration::from_millis(50);
    config.exit_when_idle = Some(Duration::from_millis(300));
    let (_drain, drained) = tokio::sync::watch::channel(false);
    let summary = tokio::time::timeout(Duration::from_secs(20), Worker::new(Arc::new(remote), config).run(drained))
        .await
        .expect("the worker did not exit")
        .unwrap();
    assert_eq!((summary.completed, summary.abandoned), (0, 0));
}
