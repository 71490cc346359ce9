//! Caret run for a team. Replicas of `caret serve` on one PostgreSQL and one bucket (moto),
//! behind a plain round-robin balancer that knows nothing of Caret, act as one service: they
//! start together on a fresh database, every route works through whichever replica a request
//! reaches (sync, search, Tab, an agent session's event stream, a run, an environment
//! episode), a tenant's rate limit holds across them, a flag set once is honoured by all, and
//! a rolling restart under load fails no request that a client retries as the README says
//! (these need the services CI starts: `CARET_TEST_DATABASE_URL`, `CARET_TEST_OBJECT_STORE`).
//! Traces of a sync, a search and a chat call reach an OTLP receiver with their parents
//! linked across processes, and nothing of the code, paths, queries or prompts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caret_test_support::TempDir;
use caret_test_support::proxy::RoundRobin;
use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
use serde_json::{Value, json};

#[path = "common/server.rs"]
mod harness;
use harness::{Client, Server, buggy_repo, http};

/// A fresh database on the test PostgreSQL and a fresh prefix in the test bucket, as storage
/// flags; none (said through `skip`) without them.
fn fresh_storage(rt: &tokio::runtime::Runtime) -> Option<Vec<String>> {
    let db = std::env::var("CARET_TEST_DATABASE_URL").ok().filter(|s| !s.is_empty());
    let store = std::env::var("CARET_TEST_OBJECT_STORE").ok().filter(|s| !s.is_empty());
    let (Some(db), Some(store)) = (db, store) else {
        caret_test_support::skip("replicas need CARET_TEST_DATABASE_URL and CARET_TEST_OBJECT_STORE");
        return None;
    };
    let name = format!("replicas_{}", fastrand::u64(..));
    rt.block_on(async {
        sqlx::any::install_default_drivers();
        let admin = sqlx::any::AnyPoolOptions::new().max_connections(1).connect(&db).await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.unwrap();
        admin.close().await;
    });
    let (base, _) = db.rsplit_once('/').unwrap();
    Some(vec![
        "--database-url".into(),
        format!("{base}/{name}"),
        "--object-store".into(),
        format!("{store}/{}", fastrand::u64(..)),
    ])
}

/// Replicas of one service and the balancer in front of them.
struct Fleet {
    servers: Vec<Server>,
    lb: RoundRobin,
    storage: Vec<String>,
    config: String,
    extra: Vec<String>,
    runs_key: String,
}

impl Fleet {
    /// `n` replicas launched at the same moment (each on its own data directory, as on its
    /// own machine), then the balancer.
    fn start(rt: &tokio::runtime::Runtime, n: usize, storage: Vec<String>, config: &str, extra: &[&str]) -> Fleet {
        // Every replica shares the runs' key (as the deployment docs say).
        let keys = Client::new();
        let out = keys.run(&["key", "export", keys.home.path().to_str().unwrap()], &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let runs_key = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut fleet = Fleet {
            servers: Vec::new(),
            lb: rt.block_on(RoundRobin::start(Vec::new())),
            storage,
            config: config.to_owned(),
            extra,
            runs_key,
        };
        let launched: Vec<(std::process::Child, TempDir)> = (0..n).map(|_| fleet.launch()).collect();
        for (child, data) in launched {
            fleet.servers.push(Server::started(child, data, &fleet.storage));
        }
        fleet.lb.set_upstreams(fleet.urls());
        fleet
    }

    fn launch(&self) -> (std::process::Child, TempDir) {
        let data = TempDir::new();
        data.write("home/config.toml", &self.config);
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let child = Server::launch(&data, &self.storage, &extra, &[("CARET_RUNS_KEY", self.runs_key.as_str())]);
        (child, data)
    }

    fn urls(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.url.clone()).collect()
    }

    /// Replica `i` stopped (SIGTERM: it drains) and a new one started in its place.
    fn replace(&mut self, i: usize) {
        let (child, data) = self.launch();
        let fresh = Server::started(child, data, &self.storage);
        let mut urls = self.urls();
        urls[i] = fresh.url.clone();
        let old = std::mem::replace(&mut self.servers[i], fresh);
        old.stop();
        self.lb.set_upstreams(urls);
    }
}

/// A config whose model `alias` is the OpenAI-compatible server at `url`.
fn one_model(alias: &str, url: &str) -> String {
    format!(
        "[[models]]\nalias = \"{alias}\"\ndeployments = [{{ provider = \"openai\", url = \"{url}\", model = \"m\" }}]\n"
    )
}

/// Events of an agent session's stream until one of type `until`.
fn watch(url: &str, token: &str, until: &str) -> Vec<Value> {
    harness::events_until(http().get(url).bearer_auth(token).send().unwrap(), until)
}

#[test]
fn replicas_on_one_database_act_as_one_service() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(storage) = fresh_storage(&rt) else { return };
    let fixer = rt.block_on(ScriptedUpstream::start("agent-model"));
    fixer.set(Behaviour { conversation: caret_test_support::scripted::fix_add_conversation(), ..Behaviour::default() });
    let reader = rt.block_on(ScriptedUpstream::start("chat-model"));
    reader.set(Behaviour {
        tool_call: Some("read_file".into()),
        tool_arguments: Some(r#"{"path": "notes.txt"}"#.into()),
        ..Behaviour::default()
    });
    let fim = rt.block_on(ScriptedUpstream::start("fim"));
    fim.set(Behaviour { answer: Some("a + b)\n".to_owned()), ..Behaviour::default() });
    let agent_ws = TempDir::new();
    agent_ws.write("notes.txt", "the notes\n");
    let deployment = |url: &str| format!("[{{ provider = \"openai\", url = \"{url}\", model = \"m\" }}]");
    let config = format!(
        "[[models]]\nalias = \"agent\"\ndeployments = {}\n\n[[models]]\nalias = \"chat\"\ndeployments = {}\n\n\
         [[models]]\nalias = \"tab\"\ndeployments = {}\n\n[server.agent_workspaces]\ndemo = \"{}\"\n",
        deployment(&fixer.url),
        deployment(&reader.url),
        deployment(&fim.url),
        agent_ws.path().display()
    );
    // Three replicas started at the same moment on a database nobody has set up: all come up.
    let fleet = Fleet::start(&rt, 3, storage, &config, &["--workers", "1"]);
    let lb = fleet.lb.url.clone();
    let token = fleet.servers[0].tenant("team");
    let c = http();
    let post = |path: &str, body: Value| c.post(format!("{lb}{path}")).bearer_auth(&token).json(&body).send().unwrap();
    let get = |path: &str| c.get(format!("{lb}{path}")).bearer_auth(&token).send().unwrap();

    // Sync and search through the balancer.
    let client = Client::new();
    let dir = TempDir::new();
    dir.write("src/upload.rs", "/// Retries failed uploads with backoff.\npub fn upload_with_retries() {}\n");
    dir.write("src/parse.rs", "/// Parses the configuration file.\npub fn parse_configuration() {}\n");
    let remote = ["--server", lb.as_str(), "--token", token.as_str()];
    let out = client.run(&[&["sync", dir.path().to_str().unwrap(), "--json"][..], &remote[..]].concat(), &[]);
    assert!(out.status.success(), "sync: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((report["added"].as_u64(), report["in_step"].as_bool()), (Some(2), Some(true)), "{report}");
    for _ in 0..3 {
        let q = ["search", "-C", dir.path().to_str().unwrap(), "--json", "-k", "2", "upload_with_retries"];
        let out = client.run(&[&q[..], &remote[..]].concat(), &[]);
        assert!(out.status.success(), "search: {}", String::from_utf8_lossy(&out.stderr));
        let hits: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(hits[0]["path"].as_str().unwrap().ends_with("upload.rs"), "{hits}");
    }

    // Tab through each replica in turn.
    let text = "def add(a, b):\n    total = int()\n    return total\n";
    let tab = json!({"text": text, "cursor": text.find("int(").unwrap() + 4, "path": "m.py"});
    for _ in 0..3 {
        let r = post("/v1/complete", tab.clone());
        assert_eq!(r.status(), 200);
        assert_eq!(r.json::<Value>().unwrap()["text"], "a + b");
    }

    // An agent session lives on one replica; its ops and event stream reach it from any.
    let r = post("/v1/agent/sessions", json!({"workspace": "demo", "model": "chat", "max_steps": 2}));
    assert_eq!(r.status(), 201);
    let id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        post(&format!("/v1/agent/sessions/{id}/ops"), json!({"type": "user_input", "text": "read"})).status(),
        202
    );
    let events_url = format!("{lb}/v1/agent/sessions/{id}/events");
    let first = watch(&events_url, &token, "turn_end");
    assert!(first.iter().any(|e| e["type"] == "tool_call_end" && e["ok"] == true), "{first:?}");
    for _ in 0..3 {
        assert_eq!(watch(&events_url, &token, "turn_end"), first, "every replica streams the same story");
    }
    // Another tenant's session is a missing one, wherever it is asked.
    let other = fleet.servers[1].tenant("other");
    for _ in 0..3 {
        let r = c.get(&events_url).bearer_auth(&other).send().unwrap();
        assert_eq!(r.status(), 404);
    }

    // A run: queued through one replica, leased by one worker of three, done once.
    let repo = buggy_repo();
    let run = json!({"repo": {"kind": "git", "url": format!("file://{}", repo.path().display())},
                     "task": "make add.sh add", "environment": {"test": "sh test.sh"}});
    let r = post("/v1/runs", run);
    assert_eq!(r.status(), 201);
    let run_id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(180);
    let info = loop {
        let info: Value = get(&format!("/v1/runs/{run_id}")).json().unwrap();
        if ["succeeded", "failed", "cancelled"].contains(&info["state"].as_str().unwrap_or("")) {
            break info;
        }
        assert!(Instant::now() < deadline, "the run did not end: {info}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!((info["state"].as_str(), info["attempt"].as_u64()), (Some("succeeded"), Some(1)), "{info}");
    let events: Value = get(&format!("/v1/runs/{run_id}/events?follow=false")).json().unwrap();
    let text = events.to_string();
    assert_eq!(text.matches("\"succeeded\"").count(), 1, "one ending, once: {text}");

    // An environment episode lives on one replica; the worker's model calls (from whichever
    // replica's worker leased its run) and the policy's steps reach it from any.
    let task = json!({"repo": {"kind": "git", "url": format!("file://{}", repo.path().display())},
                      "prompt": "make add.sh add", "grader": {"command": "sh test.sh", "timeout_s": 60}});
    let r = post("/v1/envs", task);
    assert_eq!(r.status(), 201);
    let obs: Value = r.json().unwrap();
    let env = obs["episode"].as_str().unwrap().to_owned();
    let call = |id: &str, name: &str, args: Value| {
        json!({"message": {"role": "assistant", "tool_calls": [{"id": id, "type": "function",
            "function": {"name": name, "arguments": args.to_string()}}]}})
    };
    let r = post(&format!("/v1/envs/{env}/step"), call("c1", "run_terminal_cmd", json!({"command": "cat add.sh"})));
    assert_eq!(r.status(), 200);
    let obs: Value = r.json().unwrap();
    assert!(obs["messages"][0]["content"].as_str().unwrap().contains("$1 - $2"), "{obs}");
    let edit = "<<<<<<< SEARCH\necho $(( $1 - $2 ))\n=======\necho $(( $1 + $2 ))\n>>>>>>> REPLACE";
    let r = post(&format!("/v1/envs/{env}/step"), call("c2", "edit_file", json!({"path": "add.sh", "edit": edit})));
    assert_eq!(r.status(), 200);
    let r = post(&format!("/v1/envs/{env}/grade"), json!({}));
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().unwrap()["reward"].as_f64(), Some(1.0));

    // A kill switch set once is honoured by every replica within seconds, without a restart.
    fleet.servers[2].admin(&["admin", "flags", "set", "tab", "off", "--reason", "testing the switch"]);
    let flipped = Instant::now();
    for server in &fleet.servers {
        loop {
            let r = c.post(format!("{}/v1/complete", server.url)).bearer_auth(&token).json(&tab).send().unwrap();
            if r.status() == 503 {
                let body: Value = r.json().unwrap();
                assert_eq!(body["error"]["code"], "disabled", "{body}");
                assert!(body["error"]["message"].as_str().unwrap().contains("tab is switched off"), "{body}");
                break;
            }
            assert!(flipped.elapsed() < Duration::from_secs(20), "{} still serves Tab", server.url);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    eprintln!("a kill switch was honoured by all 3 replicas {:?} after it was set", flipped.elapsed());
    fleet.servers[0].admin(&["admin", "flags", "clear", "tab"]);
    let cleared = Instant::now();
    while post("/v1/complete", tab.clone()).status() != 200
        || post("/v1/complete", tab.clone()).status() != 200
        || post("/v1/complete", tab.clone()).status() != 200
    {
        assert!(cleared.elapsed() < Duration::from_secs(20), "Tab did not come back");
        std::thread::sleep(Duration::from_millis(50));
    }
    let served = fleet.lb.served();
    assert!(served.len() == 3 && served.iter().all(|(_, n)| *n > 5), "every replica answered: {served:?}");
}

#[test]
fn a_tenants_rate_limit_holds_across_replicas() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(storage) = fresh_storage(&rt) else { return };
    let limits =
        ["--rate-limit", "1", "--rate-limit-burst", "12", "--ip-rate-limit", "10000", "--ip-rate-limit-burst", "10000"];
    let fleet = Fleet::start(&rt, 3, storage, "", &limits);
    let token = fleet.servers[0].tenant("limited");
    let c = http();
    // Replicas started at once learn of each other at their first heartbeat; until then the
    // first decides alone.
    let joined = Instant::now();
    for server in &fleet.servers {
        while !c
            .get(format!("{}/metrics", server.url))
            .send()
            .unwrap()
            .text()
            .unwrap()
            .contains("caret_replicas_live 3")
        {
            assert!(joined.elapsed() < Duration::from_secs(20), "{} never saw the other replicas", server.url);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let started = Instant::now();
    let (mut ok, mut limited) = (0, 0);
    for _ in 0..60 {
        let r = c.get(format!("{}/v1/workspaces", fleet.lb.url)).bearer_auth(&token).send().unwrap();
        match r.status().as_u16() {
            200 => ok += 1,
            429 => {
                assert!(r.headers().contains_key("retry-after"));
                limited += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!("60 requests in {elapsed:.2} s through 3 replicas: {ok} admitted, {limited} limited (burst 12, 1/s)");
    // Per replica, three buckets would have admitted 36 at least; one shared bucket admits
    // its burst, its refill, and what replicas admit alone while it is plentiful (at most half
    // of it).
    assert!(ok >= 12, "the burst is admitted: {ok}");
    assert!(f64::from(ok) <= 12.0 + elapsed + 6.0, "the limit holds across replicas: {ok} in {elapsed:.2} s");
}

/// A token revoked and a person deactivated through one replica are refused by every replica
/// within 5 s, though each had just checked and kept them.
#[test]
fn revocation_and_deactivation_reach_every_replica_within_seconds() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(storage) = fresh_storage(&rt) else { return };
    let fleet = Fleet::start(&rt, 3, storage, "", &[]);
    let owner = fleet.servers[0].owner("replicated");
    let me: Value =
        http().get(format!("{}/v1/me", fleet.servers[0].url)).bearer_auth(&owner).send().unwrap().json().unwrap();
    let org = me["organisation_name"].as_str().unwrap().to_owned();
    let second =
        fleet.servers[0].admin(&["admin", "bootstrap", "--organisation", &org, "--email", "second@replicated.example"]);
    let c = http();
    let post = |path: &str, body: Value| {
        let r = c.post(format!("{}{path}", fleet.servers[1].url)).bearer_auth(&owner).json(&body).send().unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json::<Value>().unwrap()
    };
    let ci = post("/v1/admin/tokens", json!({"name": "ci", "scopes": ["runs"]}));
    let ci_token = ci["token"].as_str().unwrap().to_owned();
    let status =
        |url: &str, token: &str| c.get(format!("{url}/v1/me")).bearer_auth(token).send().unwrap().status().as_u16();
    // Every replica checks (and keeps) both credentials.
    for s in &fleet.servers {
        assert_eq!((status(&s.url, &ci_token), status(&s.url, &second)), (200, 200));
    }
    let refused_everywhere = |token: &str| {
        let started = Instant::now();
        let mut last = Duration::ZERO;
        for s in &fleet.servers {
            while status(&s.url, token) != 401 {
                assert!(started.elapsed() < Duration::from_secs(10), "{} still takes it", s.url);
                std::thread::sleep(Duration::from_millis(50));
            }
            last = last.max(started.elapsed());
        }
        last
    };
    let r = c.delete(format!("{}/v1/admin/tokens/{}", fleet.servers[0].url, ci["info"]["id"].as_str().unwrap()));
    assert_eq!(r.bearer_auth(&owner).send().unwrap().status(), 204);
    let revoked = refused_everywhere(&ci_token);
    let people: Value =
        c.get(format!("{}/v1/admin/users", fleet.servers[2].url)).bearer_auth(&owner).send().unwrap().json().unwrap();
    let id =
        people.as_array().unwrap().iter().find(|p| p["email"] == "second@replicated.example").unwrap()["id"].clone();
    let r = c.patch(format!("{}/v1/admin/users/{}", fleet.servers[0].url, id.as_str().unwrap()));
    assert_eq!(r.bearer_auth(&owner).json(&json!({"state": "deactivated"})).send().unwrap().status(), 200);
    let deactivated = refused_everywhere(&second);
    eprintln!("refused on all 3 replicas: revoked token after {revoked:?}, deactivated person after {deactivated:?}");
    assert!(revoked <= Duration::from_secs(5) && deactivated <= Duration::from_secs(5));
}

#[test]
fn a_tenants_model_quota_holds_across_replicas() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(storage) = fresh_storage(&rt) else { return };
    let up = rt.block_on(ScriptedUpstream::start("chat-model"));
    up.set(Behaviour { answer: Some("fine".to_owned()), ..Behaviour::default() });
    let config = format!("[gateway]\ntenant_rpm = 6\n\n{}", one_model("chat", &up.url));
    let fleet = Fleet::start(&rt, 3, storage, &config, &[]);
    let token = fleet.servers[0].tenant("metered");
    let c = http();
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..12 {
        let r = c
            .post(format!("{}/v1/chat/completions", fleet.lb.url))
            .bearer_auth(&token)
            .json(&json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .unwrap();
        match r.status().as_u16() {
            200 => ok += 1,
            429 => {
                assert!(r.headers().contains_key("retry-after"));
                refused += 1;
            }
            other => panic!("unexpected {other}: {}", r.text().unwrap_or_default()),
        }
    }
    // Per replica, three gateways would have let all 12 through (6 a minute each).
    assert_eq!((ok, refused), (6, 6), "6 a minute for the tenant, whichever replica answers");
    assert_eq!(up.requests(), 6);
}

#[test]
fn a_rolling_restart_under_load_fails_no_request() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(storage) = fresh_storage(&rt) else { return };
    let fim = rt.block_on(ScriptedUpstream::start("fim"));
    fim.set(Behaviour { answer: Some("a + b)\n".to_owned()), ..Behaviour::default() });
    let config = one_model("tab", &fim.url);
    let mut fleet = Fleet::start(&rt, 2, storage, &config, &[]);
    let token = fleet.servers[0].tenant("steady");
    let client = Arc::new(Client::new());
    let dir = Arc::new(TempDir::new());
    dir.write("src/lib.rs", "/// Adds two numbers.\npub fn add_numbers(a: u32, b: u32) -> u32 {\n    a + b\n}\n");
    let lb = fleet.lb.url.clone();
    let remote = vec!["--server".to_owned(), lb.clone(), "--token".to_owned(), token.clone()];
    let first: Vec<&str> =
        ["sync", dir.path().to_str().unwrap()].into_iter().chain(remote.iter().map(String::as_str)).collect();
    let out = client.run(&first, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Load: searches and syncs (the CLI, which retries as the README says) and Tab requests
    // retried the same way, until the restart is over.
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::<String>::new())));
    let mut load = Vec::new();
    for worker in 0..2 {
        let (stop, done, failed, client, dir, remote) =
            (stop.clone(), done.clone(), failed.clone(), client.clone(), dir.clone(), remote.clone());
        load.push(std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let root = dir.path().to_str().unwrap().to_owned();
                let args: Vec<String> = if (n + worker) % 3 == 0 {
                    vec!["sync".into(), root]
                } else {
                    vec!["search".into(), "-C".into(), root, "--json".into(), "add_numbers".into()]
                };
                let all: Vec<&str> = args.iter().map(String::as_str).chain(remote.iter().map(String::as_str)).collect();
                let out = client.run(&all, &[]);
                if out.status.success() {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.lock().unwrap().push(String::from_utf8_lossy(&out.stderr).into_owned());
                }
                n += 1;
            }
        }));
    }
    {
        let (stop, done, failed, lb, token) = (stop.clone(), done.clone(), failed.clone(), lb.clone(), token.clone());
        load.push(std::thread::spawn(move || {
            let c = http();
            let text = "def add(a, b):\n    total = int()\n";
            let body = json!({"text": text, "cursor": text.find("int(").unwrap() + 4, "path": "m.py"});
            while !stop.load(Ordering::Relaxed) {
                match retried(|| c.post(format!("{lb}/v1/complete")).bearer_auth(&token).json(&body).send()) {
                    Ok(200) => done.fetch_add(1, Ordering::Relaxed),
                    other => {
                        failed.lock().unwrap().push(format!("tab: {other:?}"));
                        0
                    }
                };
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(2));
    for i in 0..fleet.servers.len() {
        fleet.replace(i);
        std::thread::sleep(Duration::from_secs(2));
    }
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.join().unwrap();
    }
    let failed = failed.lock().unwrap();
    eprintln!("rolling restart of 2 replicas: {} requests done, {} failed", done.load(Ordering::Relaxed), failed.len());
    assert!(failed.is_empty(), "requests failed through the restart: {failed:#?}");
    assert!(done.load(Ordering::Relaxed) > 20, "the load ran");
}

/// A sync, a search and a chat call, each traced across the client, the server, the gateway
/// and the upstream model, received by an OTLP receiver (decoded with the official protobuf
/// definitions); canaries in the code, a file name, the query and the prompt appear nowhere in
/// what was exported.
#[test]
fn a_sync_a_search_and_a_chat_call_are_traced_end_to_end_without_code() {
    const CANARY: &str = "zqtracecanary4471";
    let rt = tokio::runtime::Runtime::new().unwrap();
    let receiver = rt.block_on(caret_test_support::otlp::Receiver::start());
    let up = rt.block_on(ScriptedUpstream::start("chat-model"));
    up.set(Behaviour { answer: Some("fine".to_owned()), ..Behaviour::default() });
    let data = TempDir::new();
    data.write(
        "home/config.toml",
        &format!(
            "[[models]]\nalias = \"chat\"\ndeployments = [{{ provider = \"openai\", url = \"{}\", model = \"m\" }}]\n",
            up.url
        ),
    );
    let otel = [("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.as_str())];
    let server = Server::spawn_env(data, &[], &[], &otel);
    let token = server.tenant("traced");
    let client = Client::new();
    let dir = TempDir::new();
    dir.write(format!("src/{CANARY}_module.rs"), &format!("/// {CANARY} helper.\npub fn {CANARY}_fn() {{}}\n"));
    dir.write("src/other.rs", "pub fn other() {}\n");
    let remote = ["--server", server.url.as_str(), "--token", token.as_str()];
    let out = client.run(&[&["sync", dir.path().to_str().unwrap()][..], &remote[..]].concat(), &otel);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let query = format!("where is {CANARY}_fn");
    let out = client.run(&[&["search", "-C", dir.path().to_str().unwrap(), &query][..], &remote[..]].concat(), &otel);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A chat call from an outside client that sends its own trace context.
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let r = http()
        .post(format!("{}/v1/chat/completions", server.url))
        .bearer_auth(&token)
        .header("traceparent", format!("00-{trace}-{parent}-01"))
        .json(&json!({"model": "chat", "messages": [{"role": "user", "content": format!("explain {CANARY}")}]}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let (headers, _) = up.last_request().unwrap();
    let upstream = headers.get("traceparent").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(upstream.starts_with(&format!("00-{trace}-")), "the upstream continues the caller's trace: {upstream:?}");
    // Stopping flushes the server's last spans.
    server.stop();
    let deadline = Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let spans = receiver.spans();
        let named = |n: &str| spans.iter().any(|s| s.name == n);
        if ["sync", "search", "index.commit", "index.search", "gateway.chat", "model.call"].iter().all(|n| named(n)) {
            break spans;
        }
        assert!(Instant::now() < deadline, "spans missing: {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(receiver.refused(), 0);
    let by_id = |id: &str| spans.iter().find(|s| s.span_id == id);
    // Each client span is the parent of a server request span in its trace, and the index's
    // work is a child of that request.
    for (client_span, work) in [("sync", "index.commit"), ("search", "index.search")] {
        let c = spans.iter().find(|s| s.name == client_span && s.service == "caret-client").unwrap();
        let requests: Vec<_> = spans
            .iter()
            .filter(|s| s.name == "request" && s.parent_id == c.span_id && s.service == "caret-server")
            .collect();
        assert!(!requests.is_empty(), "no server request under the client's {client_span}: {spans:#?}");
        assert!(requests.iter().all(|r| r.trace_id == c.trace_id));
        assert!(requests.iter().all(|r| r.attribute("http.route").unwrap().starts_with("/v1/workspaces")));
        let w = spans.iter().find(|s| s.name == work && s.trace_id == c.trace_id).unwrap();
        let mut ancestor = by_id(&w.parent_id);
        while let Some(p) = ancestor {
            if p.name == "request" {
                break;
            }
            ancestor = by_id(&p.parent_id);
        }
        let ancestor = ancestor.unwrap_or_else(|| panic!("{work} descends from no request"));
        assert!(
            requests.iter().any(|r| r.span_id == ancestor.span_id),
            "{work} descends from a request of the client's"
        );
    }
    // The chat call: the caller's span is the request's parent; the gateway's spans follow.
    let request = spans.iter().find(|s| s.name == "request" && s.parent_id == parent).unwrap();
    assert_eq!((request.trace_id.as_str(), request.attribute("http.route")), (trace, Some("/v1/chat/completions")));
    let call = spans.iter().find(|s| s.name == "model.call" && s.trace_id == trace).unwrap();
    assert!(call.attribute("ttft_ms").is_some() && call.attribute("outcome") == Some("ok"), "{call:?}");
    assert!(upstream.contains(&call.span_id), "the upstream's parent is the attempt's span");
    // Nothing of the code, the file names, the query or the prompt, anywhere in what was sent.
    let contains = |body: &[u8], needle: &str| body.windows(needle.len()).any(|w| w == needle.as_bytes());
    for body in receiver.bodies() {
        assert!(!contains(&body, CANARY), "a canary was exported");
        assert!(!contains(&body, "other.rs") && !contains(&body, dir.path().to_str().unwrap()), "a path was exported");
    }
}

/// A failure on the server's side (its object store broken under it) is reported once, to the
/// log and to a Sentry-protocol receiver, with the route, the tenant, the status and the
/// release — and nothing of the code that was being stored.
#[test]
fn a_server_failure_is_reported_once_with_its_context_and_without_code() {
    const CANARY: &str = "zqreportcanary8812";
    let rt = tokio::runtime::Runtime::new().unwrap();
    let receiver = rt.block_on(caret_test_support::sentry::Receiver::start());
    let server = Server::spawn_env(TempDir::new(), &[], &[], &[("SENTRY_DSN", receiver.dsn.as_str())]);
    let token = server.tenant("failing");
    let client = Client::new();
    let dir = TempDir::new();
    dir.write("src/lib.rs", &format!("pub fn {CANARY}() {{}}\n"));
    let remote = ["--server", server.url.as_str(), "--token", token.as_str()];
    let out = client.run(&[&["sync", dir.path().to_str().unwrap()][..], &remote[..]].concat(), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A table vanishes from under the server (an operator's mistake): the next sync, with new
    // code, cannot be answered.
    rt.block_on(async {
        sqlx::any::install_default_drivers();
        let url = format!("sqlite://{}", server.data.join("srv/caret.db").display());
        let db = sqlx::any::AnyPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
        sqlx::query("DROP TABLE workspaces").execute(&db).await.unwrap();
        db.close().await;
    });
    dir.write("src/more.rs", &format!("pub fn more_{CANARY}() {{}}\n"));
    let out = client.run(&[&["sync", dir.path().to_str().unwrap()][..], &remote[..]].concat(), &[]);
    assert!(!out.status.success(), "the sync cannot succeed");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("internal error"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while receiver.events().is_empty() {
        assert!(Instant::now() < deadline, "no report arrived");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_data, log) = server.stop();
    let events = receiver.events();
    let logged = std::fs::read_to_string(&log).unwrap();
    let failures = logged.lines().filter(|l| l.contains("request failed")).count();
    assert_eq!(events.len(), failures, "each failure reported once, and logged once: {events:#?}");
    let e = &events[0];
    // Sentry's protocol leaves out the level when it is "error", its default.
    assert_eq!(e["level"].as_str().unwrap_or("error"), "error", "{e}");
    assert!(e["message"].as_str().unwrap().contains("internal"), "{e}");
    assert!(e["release"].as_str().unwrap().starts_with("caret@"), "{e}");
    assert_eq!(e["tags"]["status"], "500");
    assert_eq!(e["tags"]["code"], "internal");
    assert!(e["tags"]["route"].as_str().unwrap().starts_with("/v1/workspaces/{id}"), "{e}");
    assert!(!e["tags"]["tenant"].as_str().unwrap_or("").is_empty(), "the tenant's id: {e}");
    assert!(receiver.auth().iter().all(|a| a.contains("sentry_key=publickey")));
    let contains = |body: &[u8], needle: &str| body.windows(needle.len()).any(|w| w == needle.as_bytes());
    for body in receiver.bodies() {
        assert!(
            !contains(&body, CANARY) && !contains(&body, dir.path().to_str().unwrap()),
            "code or a path was reported"
        );
    }
}

/// The deployment files: the Kustomize overlay renders (Debian's `kubectl`) and its manifests
/// validate strictly against the Kubernetes schemas (`kubernetes-validate` from PyPI); every
/// flag and variable the files set — the manifests, the Helm chart, `compose.yaml`, the
/// Dockerfile — exists in `caret serve --help`, `caret worker --help` or docs/config.md.
/// (Helm itself is on no registry reachable here: the chart is checked for its settings only.)
#[test]
fn the_deployment_files_render_validate_and_set_only_real_settings() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let files: Vec<std::path::PathBuf> = [
        "Dockerfile",
        "compose.yaml",
        "deploy/compose/nginx.conf",
        "deploy/kubernetes/base/server.yaml",
        "deploy/kubernetes/base/worker.yaml",
        "deploy/kubernetes/overlays/example/kustomization.yaml",
        "deploy/helm/caret/values.yaml",
        "deploy/helm/caret/templates/server.yaml",
        "deploy/helm/caret/templates/worker.yaml",
        "deploy/helm/caret/templates/secret.yaml",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect();
    let help = |cmd: &str| {
        let out = std::process::Command::new(harness::CARET).args([cmd, "--help"]).output().unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let (serve, worker) = (help("serve"), help("worker"));
    let config = std::fs::read_to_string(root.join("docs/config.md")).unwrap();
    let mut checked = (0, 0);
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for line in text.lines() {
            // Flags of `caret serve` / `caret worker` command lines, in any of the formats.
            let command =
                line.contains("\"serve\"") || line.contains("\"worker\"") || line.trim_start().starts_with("- --");
            if command && !line.trim_start().starts_with('#') {
                let of = if line.contains("\"worker\"") { &worker } else { &serve };
                for flag in
                    line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).filter(|w| w.starts_with("--"))
                {
                    assert!(
                        of.contains(&format!("{flag} ")) || of.contains(&format!("{flag}\n")),
                        "{}: {flag} is no flag of caret",
                        file.display()
                    );
                    checked.0 += 1;
                }
            }
            for var in line.split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')) {
                if ["CARET_", "AWS_", "OTEL_", "SENTRY_"].iter().any(|p| var.starts_with(p)) {
                    assert!(
                        config.contains(var) || serve.contains(var) || worker.contains(var),
                        "{}: {var} is documented nowhere",
                        file.display()
                    );
                    checked.1 += 1;
                }
            }
        }
    }
    assert!(checked.0 >= 8 && checked.1 >= 20, "the files were read: {checked:?}");

    let kubectl = std::process::Command::new("kubectl")
        .args(["kustomize", root.join("deploy/kubernetes/overlays/example").to_str().unwrap()])
        .output();
    let Ok(rendered) = kubectl else {
        caret_test_support::skip("kubectl (Debian's kubernetes-client) is not installed");
        return;
    };
    assert!(rendered.status.success(), "{}", String::from_utf8_lossy(&rendered.stderr));
    let manifests = TempDir::new();
    let path = manifests.write("rendered.yaml", std::str::from_utf8(&rendered.stdout).unwrap());
    let kinds: Vec<&str> =
        std::str::from_utf8(&rendered.stdout).unwrap().lines().filter_map(|l| l.strip_prefix("kind: ")).collect();
    for kind in ["Deployment", "Service", "PodDisruptionBudget", "Secret"] {
        assert!(kinds.contains(&kind), "{kind} rendered: {kinds:?}");
    }
    let validated = std::process::Command::new("kubernetes-validate").arg("--strict").arg(&path).output();
    let Ok(validated) = validated else {
        caret_test_support::skip("kubernetes-validate is not installed (pip install kubernetes-validate)");
        return;
    };
    let said = String::from_utf8_lossy(&validated.stdout).into_owned() + &String::from_utf8_lossy(&validated.stderr);
    assert!(validated.status.success(), "{said}");
    assert_eq!(said.matches("passed").count(), kinds.len(), "{said}");
}

/// A request retried as the README tells clients to: a refused or cut connection, 502, 504,
/// 429, and 503 with Retry-After, a few times with a short wait.
fn retried(send: impl Fn() -> reqwest::Result<reqwest::blocking::Response>) -> Result<u16, String> {
    let mut last = String::new();
    for attempt in 0..6 {
        match send() {
            Ok(r) => {
                let status = r.status().as_u16();
                let retry =
                    matches!(status, 429 | 502 | 504) || status == 503 && r.headers().contains_key("retry-after");
                if !retry {
                    return Ok(status);
                }
                last = format!("{status}");
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(100 << attempt));
    }
    Err(last)
}
