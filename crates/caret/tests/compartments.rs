//! Compartments: the heavy capabilities' floods leave the light ones alone. In a test binary
//! of its own, so that no other test's work shares the two cores while latencies are
//! measured.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use caret_test_support::TempDir;
use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
use serde_json::json;

#[path = "common/server.rs"]
mod harness;
use harness::{Client, Server, http};

/// Compartments: while a large index is embedded (the embedding compartment's threads busy)
/// and a flood of chat calls waits on a slow model (the models compartment full), token
/// checks, sync, search and Tab stay near their p99 when idle. Measured here (2 cores, debug
/// build): without compartments login 5x, sync 4x, Tab 6x and search 46x; with them 0.8-2.4x
/// mostly, but single runs up to 4-8x for the probes that share the one SQLite connection or
/// the test process with the floods — so the test holds search, which compartments decide,
/// to 3x and 5 ms, and the others to 6x and 10 ms: a starved or queued capability (hundreds of
/// milliseconds, or a timeout) fails it; the two cores' own noise does not
/// (docs/operations.md has the figures; the target is 1.5x).
#[test]
fn floods_of_embedding_and_chat_leave_login_sync_search_and_tab_alone() {
    let Some(_) = caret_test_support::models::TestModel::Embedding.dir() else {
        caret_test_support::skip("the embedding model is not installed: no embedding flood to make");
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fim = rt.block_on(ScriptedUpstream::start("fim"));
    fim.set(Behaviour { answer: Some("a + b)\n".to_owned()), ..Behaviour::default() });
    let slow = rt.block_on(ScriptedUpstream::start("slow-model"));
    slow.set(Behaviour { answer: Some("later".to_owned()), delay: Duration::from_secs(3), ..Behaviour::default() });
    let deployment = |url: &str| format!("[{{ provider = \"openai\", url = \"{url}\", model = \"m\" }}]");
    let data = TempDir::new();
    data.write(
        "home/config.toml",
        &format!(
            "[[models]]\nalias = \"tab\"\ndeployments = {}\n\n[[models]]\nalias = \"chat\"\ndeployments = {}\n",
            deployment(&fim.url),
            deployment(&slow.url)
        ),
    );
    let limits = [
        "--rate-limit",
        "100000",
        "--rate-limit-burst",
        "100000",
        "--ip-rate-limit",
        "100000",
        "--ip-rate-limit-burst",
        "100000",
    ];
    let server = Server::spawn_env(data, &[], &limits, &[]);
    let token = server.tenant("steady");
    // A small workspace to probe with, synced and indexed; a large one to flood with.
    let client = Client::new();
    let small = TempDir::new();
    small.write("src/lib.rs", "/// Adds two numbers.\npub fn add_numbers(a: u32, b: u32) -> u32 {\n    a + b\n}\n");
    let remote = ["--server", server.url.as_str(), "--token", token.as_str()];
    let out = client.run(&[&["index", small.path().to_str().unwrap()][..], &remote[..]].concat(), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ws = client.workspace_id(small.path());
    let out = client.run(&["key", "export", small.path().to_str().unwrap()], &[]);
    let key = caret_crypto::WorkspaceKey::import(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    let server_key = key.server_key().encode();
    let text = "def add(a, b):\n    total = int()\n";
    let tab = json!({"text": text, "cursor": text.find("int(").unwrap() + 4, "path": "m.py"});
    let c = http();
    let probe = |rounds: usize| -> [f64; 4] {
        let mut lat: [Vec<f64>; 4] = Default::default();
        for _ in 0..rounds {
            let requests = [
                c.get(format!("{}/v1/workspaces", server.url)),
                c.post(format!("{}/v1/workspaces/{ws}/tree", server.url)).json(&json!({"dirs": [""]})),
                c.post(format!("{}/v1/workspaces/{ws}/search", server.url))
                    .header("x-caret-server-key", &server_key)
                    .json(&json!({"query": "add two numbers", "k": 5})),
                c.post(format!("{}/v1/complete", server.url)).json(&tab),
            ];
            for (k, r) in requests.into_iter().enumerate() {
                let started = Instant::now();
                let r = r.bearer_auth(&token).send().unwrap();
                assert_eq!(r.status(), 200, "probe {k}");
                let _ = r.bytes();
                lat[k].push(started.elapsed().as_secs_f64() * 1e3);
            }
        }
        lat.map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[((v.len() - 1) as f64 * 0.99).round() as usize]
        })
    };
    // A large workspace, synced (not embedded) before anything is measured: the flood is its
    // embedding alone.
    let big = TempDir::new();
    for i in 0..3000 {
        big.write(
            format!("src/m{i}.rs"),
            &format!("/// Handles request {i}: parses, validates and stores it.\npub fn handle_{i}(input: &str) -> usize {{\n    input.len() * {i} + {}\n}}\n", i * 7),
        );
    }
    let out = client.run(&[&["sync", big.path().to_str().unwrap()][..], &remote[..]].concat(), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    probe(20);
    let idle = probe(100);
    // The floods: the large index embedded (its client niced: the client's own CPU is not the
    // server's), and 60 chat calls holding the models compartment for 3 s each, again and again.
    let stop = Arc::new(AtomicBool::new(false));
    let mut indexer = std::process::Command::new("nice")
        .args(["-n", "19", harness::CARET, "index", big.path().to_str().unwrap()])
        .args(remote)
        .env("CARET_HOME", client.home.join("home"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut chats = Vec::new();
    for _ in 0..60 {
        let (stop, url, token) = (stop.clone(), server.url.clone(), token.clone());
        chats.push(std::thread::spawn(move || {
            let c = http();
            while !stop.load(Ordering::Relaxed) {
                let _ = c
                    .post(format!("{url}/v1/chat/completions"))
                    .bearer_auth(&token)
                    .json(&json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
                    .send();
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(4));
    // Two rounds of probes under the floods, each probe's better p99 kept: on two shared
    // cores one round's p99 can catch a scheduling hiccup; a probe that is not isolated is
    // slow in both.
    let (first, second) = (probe(100), probe(100));
    let busy: [f64; 4] = std::array::from_fn(|k| first[k].min(second[k]));
    let embedding = indexer.try_wait().unwrap().is_none();
    stop.store(true, Ordering::Relaxed);
    let _ = indexer.kill();
    let _ = indexer.wait();
    for t in chats {
        t.join().unwrap();
    }
    let names = ["login", "sync", "search", "tab"];
    let ratios: Vec<String> = (0..4)
        .map(|k| format!("{} {:.1} → {:.1} ms ({:.2}x)", names[k], idle[k], busy[k], busy[k] / idle[k]))
        .collect();
    eprintln!("p99 idle → under the floods: {}", ratios.join(", "));
    assert!(embedding, "the embedding flood lasted through the probes");
    for k in 0..4 {
        // Slack: on two shared cores, p99s of a few milliseconds move by that much on their own.
        let (times, slack) = if names[k] == "search" { (3.0, 5.0) } else { (6.0, 10.0) };
        assert!(busy[k] <= idle[k] * times + slack, "{} is not isolated: {}", names[k], ratios.join(", "));
    }
}
