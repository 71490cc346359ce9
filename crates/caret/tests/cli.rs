//! End-to-end tests of the `caret` binary on temporary repositories.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use caret_test_support::TempDir;
use serde_json::Value;

/// `caret ARGS` with an isolated home, git configuration and global excludes.
fn caret_command(home: &TempDir, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_caret"));
    cmd.args(args)
        .env("CARET_HOME", home.join("caret-home"))
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env_remove("GIT_CONFIG_GLOBAL")
        .env_remove("CARET_CONFIG")
        .env_remove("RUST_LOG");
    cmd
}

/// Runs `caret` with an isolated home, git configuration and global excludes.
fn caret(home: &TempDir, args: &[&str]) -> Output {
    caret_command(home, args).output().expect("running caret")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const KEY: &str = "AKIAQ3MZ7K2N4PVW5XYT";

fn repo() -> TempDir {
    let dir = TempDir::new();
    dir.git_init();
    dir.write(".gitignore", "build/\n*.log\n");
    dir.write(".caretignore", "private/\n");
    dir.write("src/main.rs", "fn main() {\n    println!(\"hello\");\n}\n");
    dir.write("src/util.py", "def double(x):\n    return 2 * x\n");
    dir.write("src/keys.py", &format!("AWS_KEY = \"{KEY}\"\n"));
    dir.write("docs/guide.md", "# Guide\n\nUse it.\n");
    dir.write("build/out.js", "x");
    dir.write("app.log", "x");
    dir.write("private/notes.txt", "x");
    dir.write(".env", "TOKEN=x\n");
    dir.write("big.txt", &"y".repeat(3000));
    dir.write_bytes("image.bin2", b"\x89PNG\x00\x00");
    dir.backdate(10);
    dir
}

#[test]
fn scan_json_reports_counts_hash_and_skips() {
    let home = TempDir::new();
    let dir = repo();
    let out = caret(&home, &["scan", dir.path().to_str().unwrap(), "--json", "--max-file-size", "2K"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["files"], 6, "{v:#}");
    assert_eq!(
        v["skipped"],
        serde_json::json!({"ignored": 5, "too-large": 1, "binary": 1, "secret": 1, "symlink": 0, "unreadable": 0}),
        "{v:#}"
    );
    assert_eq!(v["withheld_chunks"], 1);
    assert_eq!(v["root_hash"].as_str().unwrap().len(), 64);
    assert_eq!(v["changes"], Value::Null, "first scan");
    assert!(v.get("explain").is_none());
}

#[test]
fn explain_lists_reasons_and_secret_locations_but_never_the_secret() {
    let home = TempDir::new();
    let dir = repo();
    let out = caret(&home, &["scan", dir.path().to_str().unwrap(), "--explain", "--max-file-size", "2K"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for expected in [
        "build/",
        "ignored by .gitignore: build/",
        "app.log",
        "ignored by .gitignore: *.log",
        "private/",
        "ignored by .caretignore: private/",
        ".env",
        "default exclude (sensitive)",
        ".git/",
        "default exclude (vcs)",
        "big.txt",
        "too large: 3000 bytes > 2048",
        "image.bin2",
        "binary: NUL byte",
        "src/keys.py:1",
        "aws-access-key-id",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert!(!text.contains(KEY), "the secret itself must never be printed");
    let json = caret(&home, &["scan", dir.path().to_str().unwrap(), "--explain", "--json"]);
    let v: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        v["explain"]["secrets"],
        serde_json::json!([{"path": "src/keys.py", "line": 1, "rule": "aws-access-key-id"}])
    );
    assert!(!stdout(&json).contains(KEY));
}

#[test]
fn second_scan_uses_the_stat_cache_and_reports_changes() {
    let home = TempDir::new();
    let dir = repo();
    let path = dir.path().to_str().unwrap();
    let first: Value = serde_json::from_slice(&caret(&home, &["scan", path, "--json"]).stdout).unwrap();
    let second: Value = serde_json::from_slice(&caret(&home, &["scan", path, "--json"]).stdout).unwrap();
    assert_eq!(second["cache"]["read"], 0, "{second:#}");
    assert_eq!(second["root_hash"], first["root_hash"]);
    assert_eq!(second["changes"], serde_json::json!({"added": 0, "modified": 0, "deleted": 0}));

    dir.write("src/util.py", "def triple(x):\n    return 3 * x\n");
    dir.write("src/new.rs", "fn new() {}\n");
    dir.remove("docs/guide.md");
    let third: Value = serde_json::from_slice(&caret(&home, &["scan", path, "--json"]).stdout).unwrap();
    assert_eq!(third["changes"], serde_json::json!({"added": 1, "modified": 1, "deleted": 1}));
    assert_ne!(third["root_hash"], first["root_hash"]);
}

#[test]
fn global_git_excludes_are_found_like_git_finds_them() {
    let home = TempDir::new();
    home.write(".config/git/ignore", "*.orig\n");
    let dir = repo();
    dir.write("src/main.rs.orig", "x");
    let out = caret(&home, &["scan", dir.path().to_str().unwrap(), "--explain"]);
    assert!(stdout(&out).contains("main.rs.orig"), "{}", stdout(&out));
    assert!(stdout(&out).contains("*.orig"), "{}", stdout(&out));
}

#[test]
fn errors_are_one_line_with_exit_codes() {
    let home = TempDir::new();
    let missing = caret(&home, &["scan", "/definitely/not/here"]);
    assert_eq!(missing.status.code(), Some(1));
    let err = stderr(&missing);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.starts_with("caret: error: opening workspace /definitely/not/here"), "{err}");

    let usage = caret(&home, &["scan", "--no-such-flag"]);
    assert_eq!(usage.status.code(), Some(2));
    let bad_size = caret(&home, &["scan", ".", "--max-file-size", "12 parsecs"]);
    assert_eq!(bad_size.status.code(), Some(2));

    let config = home.write("bad.toml", "[scan]\nmax_file_size = true\n");
    let bad_config = caret(&home, &["--config", config.to_str().unwrap(), "scan", "."]);
    assert_eq!(bad_config.status.code(), Some(1));
    assert!(stderr(&bad_config).contains("parsing config"), "{}", stderr(&bad_config));
}

#[test]
fn config_file_sets_the_size_cap() {
    let home = TempDir::new();
    let dir = repo();
    let config = home.write("caret.toml", "[scan]\nmax_file_size = \"100K\"\n[chunk]\nmax_tokens = 128\n");
    let out = caret(&home, &["--config", config.to_str().unwrap(), "scan", dir.path().to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["skipped"]["too-large"], 0, "big.txt fits under 100K");
    assert_eq!(v["files"], 7);
}

#[test]
fn bench_scan_prints_figures() {
    let home = TempDir::new();
    let dir = repo();
    let out = caret(&home, &["bench", "scan", dir.path().to_str().unwrap(), "--runs", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for row in [
        "cold scan, hash only",
        "cold scan, hash+chunk+secrets",
        "warm scan (no change)",
        "hash large files",
        "git status --porcelain",
        "caret scan, no daemon",
        "caret sync, no daemon",
        "caret scan, daemon's watcher",
        "caret sync, daemon's watcher",
    ] {
        assert!(text.contains(row), "missing {row:?} in:\n{text}");
    }
}

#[test]
fn key_export_and_import_share_a_key_between_clones() {
    let home = TempDir::new();
    let a = repo();
    let b = repo();
    let export = caret(&home, &["key", "export", a.path().to_str().unwrap()]);
    assert!(export.status.success(), "{}", stderr(&export));
    let key = stdout(&export).trim().to_owned();
    assert!(key.starts_with("caret-key-v1-"), "{key}");

    let refused = caret(&home, &["key", "import", b.path().to_str().unwrap(), "--key", &key]);
    assert_eq!(refused.status.code(), Some(1), "b has its own key already");
    assert!(stderr(&refused).contains("--force"), "{}", stderr(&refused));
    let imported = caret(&home, &["key", "import", b.path().to_str().unwrap(), "--key", &key, "--force"]);
    assert!(imported.status.success(), "{}", stderr(&imported));
    let again = caret(&home, &["key", "export", b.path().to_str().unwrap()]);
    assert_eq!(stdout(&again).trim(), key);
    let bad = caret(&home, &["key", "import", b.path().to_str().unwrap(), "--key", "caret-key-v1-nonsense"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("invalid workspace key"), "{}", stderr(&bad));

    // Same key, same tree: the same obfuscated root on both clones.
    let ra: Value =
        serde_json::from_slice(&caret(&home, &["status", a.path().to_str().unwrap(), "--json"]).stdout).unwrap();
    let rb: Value =
        serde_json::from_slice(&caret(&home, &["status", b.path().to_str().unwrap(), "--json"]).stdout).unwrap();
    assert_eq!(ra["local_root"], rb["local_root"]);
    assert_ne!(ra["workspace"], rb["workspace"], "each clone is its own workspace");
}

#[test]
fn sync_watch_syncs_again_when_a_file_changes() {
    use std::io::{BufRead as _, BufReader};
    let home = TempDir::new();
    let dir = repo();
    /// Kills the watcher even when an assertion fails.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_caret"))
            .args(["sync", dir.path().to_str().unwrap(), "--watch", "--interval", "1h", "--json"])
            .env("CARET_HOME", home.join("caret-home"))
            .env("HOME", home.path())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["added"], 7, "{first}");
    // Give the watcher a moment, then change a file; the next report comes well before 1 h.
    std::thread::sleep(std::time::Duration::from_millis(500));
    dir.write("src/new_module.rs", "pub fn fresh() {}\n");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(lines.next().map(|l| l.unwrap()));
    });
    let second = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("a second sync after the change");
    drop(child);
    let second: Value = serde_json::from_str(&second.unwrap()).unwrap();
    assert_eq!(second["added"], 1, "{second}");
    assert_eq!(second["in_step"], true);
}

/// A small project with distinct responsibilities, for search.
fn search_repo() -> TempDir {
    let dir = TempDir::new();
    dir.write(
        "src/upload.py",
        "import time\n\n\ndef upload_with_retries(client, blob, attempts=5):\n    \"\"\"Send a blob, retrying failed uploads with exponential backoff.\"\"\"\n    for attempt in range(attempts):\n        try:\n            return client.put(blob)\n        except ConnectionError:\n            time.sleep(2 ** attempt)\n    raise RuntimeError(\"upload failed\")\n",
    );
    dir.write(
        "src/table.py",
        "def render_table(rows, widths):\n    \"\"\"Draw rows as an ASCII table with padded columns.\"\"\"\n    lines = []\n    for row in rows:\n        cells = [str(c).ljust(w) for c, w in zip(row, widths)]\n        lines.append(\" | \".join(cells))\n    return \"\\n\".join(lines)\n",
    );
    dir.write(
        "src/auth.py",
        "import hmac\n\n\ndef verify_session_token(token, secret):\n    \"\"\"Check the signature of a login session token.\"\"\"\n    body, sig = token.rsplit(\".\", 1)\n    expected = hmac.new(secret, body.encode(), \"sha256\").hexdigest()\n    return hmac.compare_digest(sig, expected)\n",
    );
    dir.write("docs/overview.md", "# Overview\n\nThis project uploads files and renders reports.\n");
    dir.backdate(10);
    dir
}

/// Runs caret with the test model (when CARET_TEST_MODEL_DIR names one) as the embedding model.
fn caret_model(home: &TempDir, args: &[&str]) -> Output {
    caret_model_env(home, args, &[])
}

#[test]
fn index_then_search_finds_the_right_function_and_drops_stale_hits() {
    let home = TempDir::new();
    let dir = search_repo();
    let root = dir.path().to_str().unwrap();
    let semantic = caret_test_support::models::TestModel::Embedding.dir().is_some();
    if !semantic {
        caret_test_support::skip(
            "the semantic half: the embedding model is not installed (CARET_TEST_MODEL_DIR) (lexical search only)",
        );
    }

    // Before indexing: a clear error, not an empty answer.
    let out = caret_model(&home, &["search", "-C", root, "retry"]);
    assert!(!out.status.success());

    let out = caret_model(&home, &["index", root, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["sync"]["added"], 4, "{report}");
    if semantic {
        assert_eq!(report["embed"]["progress"]["done"], report["embed"]["progress"]["total"], "{report}");
        assert!(report["embed"]["progress"]["embedded"].as_u64().unwrap() >= 4, "{report}");
    }

    // A question in words the code does not use (semantic), and keywords (lexical).
    let queries: &[(&str, &str)] = if semantic {
        &[
            ("where do we try sending again after a network error", "src/upload.py"),
            ("check that a login is authentic", "src/auth.py"),
            ("render_table", "src/table.py"),
        ]
    } else {
        &[("render_table", "src/table.py"), ("retrying failed uploads", "src/upload.py")]
    };
    for (query, want) in queries {
        let out = caret_model(&home, &["search", "-C", root, "-k", "3", "--json", query]);
        assert!(out.status.success(), "{query}: {}", stderr(&out));
        let hits: Value = serde_json::from_slice(&out.stdout).unwrap();
        let hits = hits.as_array().unwrap();
        assert!(!hits.is_empty() && hits.len() <= 3, "{query}: {hits:?}");
        assert_eq!(hits[0]["path"], *want, "{query}: {hits:?}");
        for h in hits {
            assert!(h["start_line"].as_u64().unwrap() <= h["end_line"].as_u64().unwrap());
            assert!(h["snippet"].as_str().is_some_and(|s| !s.is_empty()));
        }
        let scores: Vec<f64> = hits.iter().map(|h| h["score"].as_f64().unwrap()).collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "best first: {scores:?}");
    }
    let out = caret_model(&home, &["search", "-C", root, "-k", "1", "--json", "render_table"]);
    let hits: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(hits[0]["snippet"].as_str().unwrap().contains("def render_table(rows, widths):"), "{hits}");

    // The file changes and is not synced: its old chunk is not shown with wrong text.
    dir.write("src/table.py", "def draw_grid():\n    pass\n");
    let out = caret_model(&home, &["search", "-C", root, "--json", "render_table"]);
    let hits: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert!(
        hits.as_array().is_none_or(|h| h.iter().all(|h| h["path"] != "src/table.py")),
        "a stale hit was shown: {hits}"
    );

    // Status reports vector progress.
    let out = caret_model(&home, &["status", root, "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    if semantic {
        assert_eq!(status["vectors"]["embedded"], status["vectors"]["embeddable"], "{status}");
        // Stage by stage, in embedding order: the code (three files, one changed since) first.
        let stages = status["vectors"]["stages"].as_array().unwrap();
        let names: Vec<&str> = stages.iter().map(|s| s["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["code", "tests", "docs and other"], "{status}");
        assert!(stages[0]["total"].as_u64().unwrap() >= 2, "{status}");
        assert!(stages.iter().all(|s| s["missing"] == 0), "{status}");
        let out = caret_model(&home, &["status", root]);
        assert!(stdout(&out).contains("stages     code done, docs and other done"), "{}", stdout(&out));
    } else {
        assert!(status["vectors"]["model"].is_null(), "{status}");
    }
}

/// `caret_model` with more environment.
fn caret_model_env(home: &TempDir, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_caret"));
    cmd.args(args)
        .env("CARET_HOME", home.join("caret-home"))
        .env("HOME", home.path())
        .env_remove("CARET_CONFIG")
        .env_remove("RUST_LOG");
    match caret_test_support::models::TestModel::Embedding.dir() {
        Some(dir) => cmd.env("CARET_EMBED_MODEL", dir),
        None => cmd.env("CARET_EMBED_MODEL", home.join("no-model")),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running caret")
}

/// Whether a process is running (not gone, not a zombie awaiting its reaper).
fn running(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')))
}

fn wait_until(secs: u64, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !ok() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Searches on the embedded server go through a local daemon started on demand: it answers
/// what the in-process path answers, sees later syncs, checks its token, is replaced when
/// killed or when the settings change, and stops when idle or when its home goes away.
#[test]
fn searches_go_through_a_warm_local_daemon() {
    let home = TempDir::new();
    let dir = search_repo();
    let root = dir.path().to_str().unwrap();
    let announce = home.join("caret-home").join("local").join("daemon.json");
    let read_announce = || -> Value { serde_json::from_slice(&std::fs::read(&announce).unwrap()).unwrap() };
    let search = |query: &str, env: &[(&str, &str)]| -> Value {
        let out = caret_model_env(&home, &["search", "-C", root, "-k", "3", "--json", query], env);
        assert!(out.status.success(), "{query}: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let out = caret_model(&home, &["index", root, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!announce.exists(), "indexing runs in-process and starts no daemon");

    // The first search starts the daemon; it answers what the in-process path answers.
    let warm = search("retrying failed uploads", &[]);
    let first = read_announce();
    let pid = first["pid"].as_u64().unwrap();
    assert!(running(pid), "{first}");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&announce).unwrap().permissions().mode() & 0o777, 0o600, "it holds a token");
    let cold = search("retrying failed uploads", &[("CARET_DAEMON", "off")]);
    assert_eq!(warm, cold);
    assert_eq!(warm[0]["path"], "src/upload.py", "{warm}");
    assert_eq!(search("render_table", &[]), search("render_table", &[("CARET_DAEMON", "off")]));
    assert_eq!(read_announce()["pid"], pid, "later searches reuse the daemon");

    // It checks its token like any server, and serves only loopback.
    let addr = first["addr"].as_str().unwrap().to_owned();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let client = reqwest::blocking::Client::new();
    let url = format!("http://{addr}/v1/workspaces/nope");
    assert_eq!(client.get(&url).send().unwrap().status(), 401);
    assert_eq!(client.get(&url).bearer_auth("caret_not-a-token").send().unwrap().status(), 401);
    let own = client.get(&url).bearer_auth(first["token"].as_str().unwrap()).send().unwrap().status();
    assert_ne!(own, 401);

    // A sync in another process is seen by the warm daemon's next answer.
    dir.write(
        "src/invoice.py",
        "def compute_invoice_total(lines):\n    \"\"\"Sum the invoice lines with tax.\"\"\"\n    return sum(l.price * l.qty for l in lines)\n",
    );
    let out = caret_model(&home, &["sync", root]);
    assert!(out.status.success(), "{}", stderr(&out));
    let hits = search("compute_invoice_total", &[]);
    assert_eq!(hits[0]["path"], "src/invoice.py", "{hits}");
    assert_eq!(read_announce()["pid"], pid);

    // Killed: the next search starts another and answers.
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    wait_until(10, "the killed daemon to go", || !running(pid));
    assert_eq!(search("render_table", &[])[0]["path"], "src/table.py");
    let second = read_announce()["pid"].as_u64().unwrap();
    assert_ne!(second, pid);

    // Other settings: the old daemon is retired and a new one answers with them.
    let hits = search("render_table", &[("CARET_SEARCH_WEIGHTS", "file=0.25")]);
    assert_eq!(hits[0]["path"], "src/table.py");
    let third = read_announce()["pid"].as_u64().unwrap();
    assert_ne!(third, second);
    wait_until(15, "the retired daemon to stop", || !running(second));

    // Idle: a daemon told to stop after a second of quiet does, and says so.
    search("render_table", &[("CARET_DAEMON_IDLE", "1s")]);
    let fourth = read_announce()["pid"].as_u64().unwrap();
    wait_until(15, "the retired daemon to stop", || !running(third));
    wait_until(15, "the idle daemon to stop", || !running(fourth));
    assert!(!announce.exists(), "a stopped daemon takes its announcement with it");
    let log = std::fs::read_to_string(home.join("caret-home").join("local").join("daemon.log")).unwrap();
    assert!(log.contains(&format!("caret daemon {fourth}: stopping (idle)")), "{log}");

    // A model installed after a daemon started without one is used by the next search.
    if let Some(model) = caret_test_support::models::TestModel::Embedding.dir() {
        // The same directory name: the model's id, which the index's vectors carry.
        let name = std::path::Path::new(&model).file_name().unwrap();
        std::fs::create_dir_all(home.join("late")).unwrap();
        let late = home.join("late").join(name);
        let late = late.to_str().unwrap();
        let env = [("CARET_EMBED_MODEL", late)];
        let before = caret_model_env(&home, &["search", "-C", root, "--mode", "semantic", "uploads"], &env);
        assert!(stderr(&before).contains("no vectors"), "{}", stderr(&before));
        let lexical_only = read_announce()["pid"].as_u64().unwrap();
        std::os::unix::fs::symlink(&model, late).unwrap();
        let hits = search("retrying failed uploads", &env);
        assert_eq!(hits, warm, "answered with the model now installed");
        assert_ne!(read_announce()["pid"].as_u64().unwrap(), lexical_only);
        wait_until(15, "the daemon without the model to stop", || !running(lexical_only));
    } else {
        caret_test_support::skip(
            "skipped (a model installed late): the embedding model is not installed (CARET_TEST_MODEL_DIR)",
        );
    }

    // Its home deleted: it stops.
    search("render_table", &[]);
    let fifth = read_announce()["pid"].as_u64().unwrap();
    std::fs::remove_dir_all(home.join("caret-home")).unwrap();
    wait_until(15, "the daemon of a deleted home to stop", || !running(fifth));
}

/// With the local daemon running, a scan and a sync in a tree where nothing changed answer
/// from its watcher without walking; a change made just before the command, other settings,
/// a changed ignore file the watcher cannot see, or no daemon all mean a full scan.
#[test]
fn scans_and_syncs_answer_from_the_daemons_watcher() {
    let home = TempDir::new();
    let dir = repo();
    let root = dir.path().to_str().unwrap();
    let announce = home.join("caret-home").join("local").join("daemon.json");
    let mut daemon =
        caret_command(&home, &["daemon", "--idle", "5m"]).stderr(std::process::Stdio::null()).spawn().unwrap();
    wait_until(60, "the daemon to announce itself", || announce.exists());
    // Its watcher route takes its own token only.
    let addr = serde_json::from_slice::<Value>(&std::fs::read(&announce).unwrap()).unwrap()["addr"].clone();
    let url = format!("http://{}/v1/local/watch", addr.as_str().unwrap());
    let asked = reqwest::blocking::Client::new()
        .post(&url)
        .bearer_auth("caret_not-a-token")
        .json(&serde_json::json!({"root": root}))
        .send();
    assert_eq!(asked.unwrap().status(), 401);
    let json = |args: &[&str]| -> Value {
        let out = caret(&home, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let scan = || json(&["scan", root, "--json"]);

    let first = scan();
    assert_eq!(first["watcher"], false, "{first}");
    let second = scan();
    assert_eq!(second["watcher"], true, "nothing changed: {second}");
    for field in ["root_hash", "files", "bytes", "chunks", "withheld_chunks", "skipped"] {
        assert_eq!(second[field], first[field], "{field}");
    }
    assert_eq!(second["cache"]["read"], 0);
    assert_eq!(second["changes"], serde_json::json!({"added": 0, "modified": 0, "deleted": 0}));
    let human = stdout(&caret(&home, &["scan", root]));
    assert!(human.contains("the daemon's watcher saw no change"), "{human}");

    // A change made just before the command is seen.
    dir.write("src/util.py", "def double(x):\n    return x + x\n");
    let third = scan();
    assert_eq!(third["watcher"], false, "{third}");
    assert_eq!(third["changes"]["modified"], 1, "{third}");
    assert_ne!(third["root_hash"], first["root_hash"]);
    assert_eq!(scan()["root_hash"], third["root_hash"]);
    assert_eq!(scan()["watcher"], true);

    // Writes inside an ignored directory and git's own do not make it walk.
    dir.write("build/more.js", "y");
    assert!(Command::new("git").args(["-C", root, "add", "-A"]).status().unwrap().success());
    assert_eq!(scan()["watcher"], true, "an ignored directory and .git/ do not count");

    // Other settings, an ignore file the watcher cannot see, --explain: a full scan.
    let other = json(&["scan", root, "--json", "--max-file-size", "2K"]);
    assert_eq!(other["watcher"], false);
    assert_eq!(json(&["scan", root, "--json", "--max-file-size", "2K"])["watcher"], true);
    std::fs::write(dir.path().join(".git").join("info").join("exclude"), "docs/\n").unwrap();
    let excluded = scan();
    assert_eq!(excluded["watcher"], false, "a changed .git/info/exclude: {excluded}");
    assert_eq!(excluded["files"].as_u64().unwrap() + 1, third["files"].as_u64().unwrap(), "docs/guide.md left out");
    assert_eq!(json(&["scan", root, "--json", "--explain"])["watcher"], false);

    // Sync: the first scans and ends in step; the next only asks the server.
    let sync = || json(&["sync", root, "--json"]);
    let synced = sync();
    assert_eq!((synced["watcher"].clone(), synced["in_step"].clone()), (false.into(), true.into()), "{synced}");
    let quick = sync();
    assert_eq!(quick["watcher"], true, "{quick}");
    assert_eq!(quick["in_step"], true);
    assert_eq!(quick["local_root"], synced["local_root"]);
    assert_eq!(quick["unchanged"], synced["added"], "every file counted: {quick}");
    assert_eq!(quick["requests"], 1, "one request to the server: {quick}");
    dir.write("src/new.py", "def triple(x):\n    return 3 * x\n");
    let changed = sync();
    assert_eq!((changed["watcher"].clone(), changed["added"].clone()), (false.into(), 1.into()), "{changed}");
    assert_eq!(sync()["watcher"], true);

    // No daemon: every command walks, and finds the same.
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let without = scan();
    assert_eq!(without["watcher"], false);
    assert_eq!(without["root_hash"], scan()["root_hash"]);
    assert_eq!(sync()["watcher"], false);
}

/// The embedding cache: a clone that shares the key reuses the first clone's vectors.
#[test]
fn clones_sharing_a_key_embed_each_chunk_once() {
    let Some(_) = caret_test_support::models::TestModel::Embedding.dir() else {
        caret_test_support::skip("skipped: the embedding model is not installed (CARET_TEST_MODEL_DIR)");
        return;
    };
    let home = TempDir::new();
    let (a, b) = (search_repo(), search_repo());
    let (ra, rb) = (a.path().to_str().unwrap(), b.path().to_str().unwrap());
    let key = stdout(&caret_model(&home, &["key", "export", ra])).trim().to_owned();
    let out = caret_model(&home, &["key", "import", rb, "--key", &key, "--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let first: Value = serde_json::from_slice(&caret_model(&home, &["index", ra, "--json"]).stdout).unwrap();
    let embedded = first["embed"]["progress"]["embedded"].as_u64().unwrap();
    assert!(embedded >= 4, "{first}");
    let second: Value = serde_json::from_slice(&caret_model(&home, &["index", rb, "--json"]).stdout).unwrap();
    assert_eq!(second["embed"]["progress"]["embedded"], 0, "reused, not embedded again: {second}");
    assert_eq!(second["embed"]["progress"]["done"], second["embed"]["progress"]["total"], "{second}");
    let out = caret_model(
        &home,
        &["search", "-C", rb, "-k", "1", "--json", "--mode", "semantic", "check that a login is authentic"],
    );
    let hits: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(hits[0]["path"], "src/auth.py", "{hits}");
}

#[test]
fn chat_talks_to_a_configured_model_and_fails_over() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (down, up) =
        rt.block_on(async { (ScriptedUpstream::start("down").await, ScriptedUpstream::start("up").await) });
    down.set(Behaviour { status: Some(500), ..Behaviour::default() });
    let home = TempDir::new();
    let out = caret(&home, &["chat", "hi"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no models are configured"), "{}", stderr(&out));
    home.write(
        "caret-home/config.toml",
        &format!(
            "[[models]]\nalias = \"code\"\ndeployments = [\n  {{ provider = \"openai\", url = \"{}\", model = \"m\" }},\n  {{ provider = \"openai\", url = \"{}\", model = \"m\", order = 1 }},\n]\n",
            down.url, up.url
        ),
    );
    let out = caret(&home, &["chat", "hi"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "hello from up");
    let out = caret(&home, &["chat", "--model", "nope", "hi"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no model \"nope\""), "{}", stderr(&out));
}

/// `caret chat` with a GGUF model run in-process (`CARET_TEST_LLM_DIR`: an installed
/// smollm2-135m-instruct-q4; CI sets it), through the gateway like any other deployment.
#[test]
fn chat_runs_a_local_model_in_process() {
    let Some(model) = caret_test_support::models::TestModel::SmallLlm.dir() else {
        caret_test_support::skip(
            "the small chat model is not installed (CARET_TEST_LLM_DIR): skipping the local model test",
        );
        return;
    };
    let home = TempDir::new();
    home.write(
        "caret-home/config.toml",
        &format!(
            "[[models]]\nalias = \"small\"\ndeployments = [{{ provider = \"local\", model = {:?}, context_tokens = 1024 }}]\n",
            model.to_string_lossy()
        ),
    );
    let out = caret(
        &home,
        &["chat", "--model", "small", "--temperature", "0", "What is the capital of France? Answer in one word."],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("Paris"), "{}", stdout(&out));

    // A model that is not installed is named in the error, with how to get it.
    home.write(
        "caret-home/config.toml",
        "[[models]]\nalias = \"code\"\ndeployments = [{ provider = \"local\", model = \"qwen2.5-coder-1.5b-instruct-q4\" }]\n",
    );
    let out = caret(&home, &["chat", "hi"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("caret models pull"), "{}", stderr(&out));
}

/// `caret apply` writes the new file atomically, keeping line endings and mode; ambiguous
/// edits change nothing and say where the candidates are; `--dry-run` writes nothing.
#[test]
fn apply_writes_the_new_file_or_explains_why_not() {
    use std::os::unix::fs::PermissionsExt as _;
    let home = TempDir::new();
    home.write("w/run.sh", "#!/bin/sh\r\necho one\r\necho two\r\necho one\r\n");
    let script = home.join("w/run.sh");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = script.to_str().unwrap();

    home.write("sr.txt", "<<<<<<< SEARCH\necho two\n=======\necho 2\necho 3\n>>>>>>> REPLACE\n");
    let out = caret(&home, &["apply", file, "--edit", home.join("sr.txt").to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["format"], "search-replace");
    assert_eq!((report["lines_added"].as_u64(), report["lines_removed"].as_u64()), (Some(2), Some(1)));
    assert_eq!(std::fs::read_to_string(&script).unwrap(), "#!/bin/sh\r\necho one\r\necho 2\r\necho 3\r\necho one\r\n");
    assert_eq!(std::fs::metadata(&script).unwrap().permissions().mode() & 0o777, 0o755);

    // "echo one" is on lines 2 and 5: nothing is guessed, nothing written.
    home.write("amb.txt", "<<<<<<< SEARCH\necho one\n=======\necho uno\n>>>>>>> REPLACE\n");
    let before = std::fs::read(&script).unwrap();
    let out = caret(&home, &["apply", file, "--edit", home.join("amb.txt").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("lines 2, 5"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&script).unwrap(), before);

    // A unified diff with a wrong line number, dry run: reported, not written.
    home.write("d.diff", "--- a/run.sh\n+++ b/run.sh\n@@ -40,2 +40,2 @@\n echo 3\n-echo one\n+echo uno\n");
    let out = caret(&home, &["apply", file, "--edit", home.join("d.diff").to_str().unwrap(), "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("would change (udiff): +1 -1"), "{}", stdout(&out));
    assert_eq!(std::fs::read(&script).unwrap(), before);
    let out = caret(&home, &["apply", file, "--edit", home.join("d.diff").to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&script).unwrap().ends_with("echo 3\r\necho uno\r\n"));

    // Not an edit at all.
    home.write("prose.txt", "please make it better\n");
    let out = caret(&home, &["apply", file, "--edit", home.join("prose.txt").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--format"), "{}", stderr(&out));
}

/// A patch envelope applies to a directory: all of it, or (when one part does not fit) none.
#[test]
fn apply_a_multi_file_patch_all_or_nothing() {
    let home = TempDir::new();
    home.write("ws/src/lib.rs", "pub fn a() -> u32 {\n    1\n}\n");
    home.write("ws/old.txt", "old\n");
    let ws = home.join("ws");
    let root = ws.to_str().unwrap();
    // The second file's hunk does not fit: nothing may change, not even the first file.
    home.write(
        "bad.patch",
        "*** Begin Patch\n*** Update File: src/lib.rs\n-    1\n+    2\n*** Update File: old.txt\n-missing\n+x\n*** End Patch\n",
    );
    let out = caret(&home, &["apply", root, "--edit", home.join("bad.patch").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("nothing was written"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(ws.join("src/lib.rs")).unwrap(), "pub fn a() -> u32 {\n    1\n}\n");

    home.write(
        "good.patch",
        "Here you go:\n*** Begin Patch\n*** Add File: src/b.rs\n+pub fn b() {}\n*** Update File: src/lib.rs\n*** Move to: src/a.rs\n@@ pub fn a() -> u32 {\n-    1\n+    2\n*** Delete File: old.txt\n*** End Patch\n",
    );
    let out = caret(&home, &["apply", root, "--edit", home.join("good.patch").to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["changes"].as_array().unwrap().len(), 4, "{report}");
    assert_eq!(std::fs::read_to_string(ws.join("src/b.rs")).unwrap(), "pub fn b() {}\n");
    assert_eq!(std::fs::read_to_string(ws.join("src/a.rs")).unwrap(), "pub fn a() -> u32 {\n    2\n}\n");
    assert!(!ws.join("src/lib.rs").exists() && !ws.join("old.txt").exists());
}

/// `caret apply` hands a lazy snippet the matcher cannot place to a model (here SmolLM2 run
/// in-process, `CARET_TEST_LLM_DIR`): the file is rewritten from the model's answer with the
/// file's region as the speculative draft, and the report says so. Without a model it is an
/// error that says how to configure one, and nothing is written.
#[test]
fn apply_merges_with_a_local_model_what_the_matcher_cannot_place() {
    let home = TempDir::new();
    let original = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return 2 * (width + height)\n";
    home.write("w/shapes.py", original);
    let file = home.join("w/shapes.py");
    let file = file.to_str().unwrap();
    // Nothing of the snippet is in the file.
    home.write("edit.txt", "# ... existing code ...\ndef volume(w, h, d):\n    return w * h * d\n");
    let edit = home.join("edit.txt");
    let edit = edit.to_str().unwrap();
    let out = caret(&home, &["apply", file, "--edit", edit, "--json"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no model is configured to merge"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(home.join("w/shapes.py")).unwrap(), original);

    let Some(model) = caret_test_support::models::TestModel::SmallLlm.dir() else {
        caret_test_support::skip(
            "the small chat model is not installed (CARET_TEST_LLM_DIR): skipping the model merge",
        );
        return;
    };
    home.write(
        "caret-home/config.toml",
        &format!(
            "[[models]]\nalias = \"apply\"\ndeployments = [{{ provider = \"local\", model = {:?}, context_tokens = 1024, \
             flash_attention = true, key_cache = \"f16\" }}]\n",
            model.to_string_lossy()
        ),
    );
    let out = caret(&home, &["apply", file, "--edit", edit, "--json", "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["method"], "model", "{report}");
    assert_eq!(report["merge"]["model"], "apply");
    assert_eq!(report["merge"]["region"], serde_json::json!([1, 6]));
    assert!(report["merge"]["reason"].as_str().unwrap().contains("no place"), "{report}");
    let generated = report["merge"]["generated_tokens"].as_u64().unwrap();
    let accepted = report["merge"]["accepted_prediction_tokens"].as_u64().unwrap();
    assert!(generated > 0 && accepted > 0 && accepted <= generated, "{report}");
    assert_eq!(std::fs::read_to_string(home.join("w/shapes.py")).unwrap(), original, "a dry run writes nothing");

    // --merge never: the matcher's error, with the candidates' text.
    let out = caret(&home, &["apply", file, "--edit", edit, "--merge", "never"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no place in the file matches"), "{}", stderr(&out));

    // Written for real: the file is what the model answered, in place of the region.
    let out = caret(&home, &["apply", file, "--edit", edit, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let written = std::fs::read_to_string(home.join("w/shapes.py")).unwrap();
    assert_eq!(report["changed"].as_bool().unwrap(), written != original, "{report}");
}

/// The code model, with its fill-in-the-middle template.
#[test]
#[ignore = "slow: a 1.5B model (CARET_TEST_CODE_MODEL_DIR); cargo test -- --ignored"]
fn complete_fills_in_the_middle_with_the_code_model() {
    let code = caret_test_support::models::TestModel::CodeLlm
        .dir()
        .expect("CARET_TEST_CODE_MODEL_DIR names the code model, or it is installed");
    let home = TempDir::new();
    home.write("w/calc.py", "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    \n\nprint(add(1, 2))\n");
    let file = home.join("w/calc.py");
    let file = file.to_str().unwrap();
    home.write(
        "caret-home/config.toml",
        &format!(
            "[[models]]\nalias = \"tab\"\ndeployments = [{{ provider = \"local\", model = {:?}, context_tokens = 2048 }}]\n",
            code.to_string_lossy()
        ),
    );
    let out = caret(&home, &["complete", file, "--line", "6", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let s: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(s["multiline"], true, "{s}");
    assert!(s["text"].as_str().unwrap().contains("a * b"), "{s}");
    // Middle of a line: the rest of it, without the `)` the suffix has.
    home.write("w/call.py", "def add(a, b):\n    return a + b\n\n\ntotal = add(1, )\n");
    let call = home.join("w/call.py");
    let out = caret(&home, &["complete", call.to_str().unwrap(), "--line", "5", "--column", "16", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let s: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let text = s["text"].as_str().unwrap();
    assert!(!text.contains('\n') && !text.ends_with(')') && !text.is_empty(), "{s}");
}

#[test]
fn complete_suggests_at_a_cursor_with_a_local_model() {
    let home = TempDir::new();
    home.write("w/calc.py", "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    \n\nprint(add(1, 2))\n");
    let file = home.join("w/calc.py");
    let file = file.to_str().unwrap();
    let out = caret(&home, &["complete", file, "--line", "6"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no models are configured"), "{}", stderr(&out));
    let out = caret(&home, &["complete", file, "--line", "60"]);
    assert!(!out.status.success());

    // The small test model has no fill-in-the-middle tokens: it continues the prefix.
    let Some(model) = caret_test_support::models::TestModel::SmallLlm.dir() else {
        caret_test_support::skip("the small chat model is not installed (CARET_TEST_LLM_DIR): skipping the completion");
        return;
    };
    home.write(
        "caret-home/config.toml",
        &format!(
            "[[models]]\nalias = \"tab\"\ndeployments = [{{ provider = \"local\", model = {:?}, context_tokens = 1024 }}]\n",
            model.to_string_lossy()
        ),
    );
    let out = caret(&home, &["complete", file, "--line", "2", "--column", "12", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let s: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(s["multiline"], false, "{s}");
    assert_eq!(s["cached"], false);
    assert!(!s["text"].as_str().unwrap().contains('\n'), "single line: {s}");
    assert!(s["generated_chunks"].as_u64().unwrap() > 0, "{s}");
    let out = caret(&home, &["complete", file, "--line", "6", "--family", "bogus"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--family"), "{}", stderr(&out));
}

/// `caret exec` drives the agent through a gateway model (a scripted OpenAI-compatible
/// server, test double) and prints its events as JSON lines: a model that keeps calling
/// `read_file` reaches the step limit (exit 1); one that answers ends the turn (exit 0).
/// A config whose `agent` model alias is the OpenAI-compatible server at `url`.
fn agent_config(url: &str) -> String {
    format!(
        "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{url}\", model = \"m\" }}]\n"
    )
}

/// The repository's rules files reach `caret exec`'s model, the run says which applied, and
/// `caret rules` explains them for a path.
#[test]
fn exec_follows_the_projects_rules_files_and_caret_rules_explains_them() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent"));
    let home = TempDir::new();
    home.write("ws/src/lib.rs", "pub fn answer() -> u32 {\n    42\n}\n");
    home.write("ws/AGENTS.md", "Run the tests with `make check`, never cargo test directly.\n");
    home.write(
        "ws/.cursor/rules/rust.mdc",
        "---\ndescription: Rust style\nglobs: \"*.rs\"\n---\nNo unwrap outside tests.\n",
    );
    home.write("caret-home/AGENTS.md", "Answer briefly.\n");
    home.write("caret-home/config.toml", &agent_config(&up.url));
    let ws = home.join("ws");
    let ws = ws.to_str().unwrap();
    up.set(Behaviour { answer: Some("Done.".into()), ..Behaviour::default() });
    let o = caret(&home, &["exec", "run the tests", "-C", ws]);
    assert!(o.status.success(), "{}", stderr(&o));
    let events: Vec<Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let applied = events.iter().find(|e| e["type"] == "rules_applied").unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(applied["rules"], serde_json::json!(["~/AGENTS.md", "AGENTS.md"]));
    let (_, sent) = up.last_request().unwrap();
    let system = sent["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("make check") && system.find("Answer briefly") < system.find("make check"), "{system}");
    assert!(!system.contains("No unwrap"), "a glob rule waits for a matching file: {system}");

    let o = caret(&home, &["rules", "src/lib.rs", "-C", ws]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("~/AGENTS.md  (the user's own rules, first"), "{out}");
    assert!(out.contains("AGENTS.md  (on the way from the repository root"), "{out}");
    assert!(out.contains(".cursor/rules/rust.mdc  (src/lib.rs matches *.rs"), "{out}");
    let o = caret(&home, &["rules", "README.md", "-C", ws]);
    assert!(!stdout(&o).contains("rust.mdc"), "{}", stdout(&o));
}

/// `caret exec` with an MCP server configured (`mcp-server-time` from PyPI, over stdio): the
/// model sees its tools as `mcp__time__…`, a call reaches the server and its answer the
/// model; the call shows in the JSON events with its server's name.
#[test]
fn exec_calls_a_configured_mcp_servers_tool() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let Some(python) = mcp_python() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent"));
    let home = TempDir::new();
    home.write("ws/README.md", "# a project\n");
    home.write(
        "caret-home/config.toml",
        &format!(
            "{}\n[mcp_servers.time]\ncommand = {python:?}\nargs = [\"-m\", \"mcp_server_time\", \"--local-timezone\", \"UTC\"]\n\
             tool_timeout = \"20s\"\n",
            agent_config(&up.url)
        ),
    );
    // The first model call waits (within the start-up timeout) for the server to start, so
    // that its tools are offered from the first request on.
    up.set(Behaviour {
        tool_call: Some("mcp__time__get_current_time".into()),
        tool_arguments: Some(r#"{"timezone": "Asia/Tokyo"}"#.into()),
        ..Behaviour::default()
    });
    let ws = home.join("ws");
    let o = caret(&home, &["exec", "what time is it in Tokyo?", "-C", ws.to_str().unwrap(), "--max-steps", "2"]);
    let events: Vec<Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let end =
        events.iter().find(|e| e["type"] == "tool_call_end").unwrap_or_else(|| panic!("{events:?}\n{}", stderr(&o)));
    assert_eq!(end["name"], "mcp__time__get_current_time");
    assert_eq!(end["ok"], true, "{end}");
    let begin = events.iter().find(|e| e["type"] == "tool_call_begin").unwrap();
    assert_eq!(begin["server"], "time", "each call says its server: {begin}");
    assert!(end["output"].as_str().unwrap().contains("Asia/Tokyo"), "{end}");
    let (_, sent) = up.last_request().unwrap();
    let tools: Vec<&str> =
        sent["tools"].as_array().unwrap().iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    assert!(tools.contains(&"mcp__time__get_current_time") && tools.contains(&"read_file"), "{tools:?}");
    let first: Vec<String> = up.chats()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect();
    assert!(first.iter().any(|t| t == "mcp__time__get_current_time"), "the first request lacks the server: {first:?}");
    let described = sent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "mcp__time__get_current_time")
        .unwrap();
    assert!(described["function"]["description"].as_str().unwrap().starts_with("[MCP server time]"));
    let messages = sent["messages"].as_array().unwrap();
    assert!(messages.iter().any(|m| m["role"] == "tool" && m["content"].as_str().unwrap_or("").contains("Asia/Tokyo")));

    // `caret mcp ls` starts them and says what they offer.
    let o = caret(&home, &["mcp", "ls"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("time  ready (2 tools, MCP 2026-07-28)")
            && out.contains("  mcp__time__convert_time  [MCP server time]"),
        "{out}"
    );
}

/// `caret exec --plan`: the agent plans with read-only tools (the edit tools are not offered)
/// and the plan is printed as JSON; `caret skills` and `caret commands` list what a session has.
#[test]
fn exec_plan_prints_the_plan_and_skills_and_commands_are_listed() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent"));
    let home = TempDir::new();
    home.write("caret-home/config.toml", &agent_config(&up.url));
    home.write("ws/add.sh", "echo $(( $1 - $2 ))\n");
    home.write(
        "ws/.claude/skills/shell-style/SKILL.md",
        "---\nname: shell-style\ndescription: House style for shell scripts.\n---\nQuote every variable.\n",
    );
    home.write(
        "ws/.cursor/commands/fix.md",
        "---\ndescription: Fix a bug\nargument-hint: [what]\n---\nFix $ARGUMENTS.\n",
    );
    let plan =
        r#"{"summary": "Fix add.sh", "steps": [{"title": "Use + in add.sh", "files": ["add.sh"]}], "risks": ["none"]}"#;
    up.set(Behaviour {
        tool_call: Some("submit_plan".into()),
        tool_arguments: Some(plan.into()),
        ..Behaviour::default()
    });
    let ws = home.join("ws");
    let ws_s = ws.to_str().unwrap();
    let o = caret(&home, &["exec", "--plan", "/fix the subtraction", "-C", ws_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    let printed: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(printed["steps"][0]["title"], "Use + in add.sh", "{printed}");
    let sent = &up.chats()[0];
    let tools: Vec<&str> =
        sent["tools"].as_array().unwrap().iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    assert!(
        tools.contains(&"submit_plan") && tools.contains(&"load_skill") && !tools.contains(&"edit_file"),
        "{tools:?}"
    );
    let asked = sent["messages"].to_string();
    assert!(asked.contains("Fix the subtraction.") && asked.contains("- shell-style: House style"), "{asked}");
    let skills = stdout(&caret(&home, &["skills", "-C", ws_s]));
    assert!(skills.contains("shell-style  (.claude/skills)"), "{skills}");
    let commands = stdout(&caret(&home, &["commands", "-C", ws_s]));
    assert!(commands.contains("/fix [what]  (.cursor/commands)\n  Fix a bug"), "{commands}");
}

/// `caret agent --parallel 2`: two attempts, each in a git worktree set up by the repository's
/// `.cursor/worktrees.json` (in the sandbox), their diffs printed, the chosen one applied to the
/// main checkout, and the worktrees gone afterwards.
#[test]
fn parallel_attempts_work_in_worktrees_and_the_chosen_one_is_applied() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent"));
    let home = TempDir::new();
    home.write("caret-home/config.toml", &agent_config(&up.url));
    home.write("ws/add.sh", "echo $(( $1 - $2 ))\n");
    home.write("ws/.gitignore", "set-up-here\n");
    // The setup fails unless it runs in the new worktree, beside the main checkout.
    home.write(
        "ws/.cursor/worktrees.json",
        r#"{"setup-worktree": ["test -f add.sh && test -d \"$ROOT_WORKTREE_PATH/.git\" && touch set-up-here"]}"#,
    );
    let ws = home.join("ws");
    for args in [
        &["init", "-q"][..],
        &["add", "-A"],
        &["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "start"],
    ] {
        assert!(Command::new("git").arg("-C").arg(&ws).args(args).status().unwrap().success());
    }
    let edit = serde_json::json!({"path": "add.sh", "edit": "<<<<<<< SEARCH\necho $(( $1 - $2 ))\n=======\necho $(( $1 + $2 ))\n>>>>>>> REPLACE\n"});
    up.set(Behaviour {
        tool_call: Some("edit_file".into()),
        tool_arguments: Some(edit.to_string()),
        ..Behaviour::default()
    });
    let ws_s = ws.to_str().unwrap();
    let o = caret(
        &home,
        &[
            "agent",
            "--parallel",
            "2",
            "fix add.sh",
            "-C",
            ws_s,
            "--model",
            "agent,agent",
            "--approval",
            "never",
            "--max-steps",
            "2",
            "--apply",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("attempt 1 (agent): step_limit — add.sh +1 -1"), "{out}");
    assert!(out.contains("=== attempt 2 (agent) ===") && out.contains("+echo $(( $1 + $2 ))"), "{out}");
    assert!(!out.contains("set-up-here"), "the setup's ignored file is not a change: {out}");
    assert!(out.contains("applied attempt 2"), "{out}");
    assert_eq!(std::fs::read_to_string(ws.join("add.sh")).unwrap(), "echo $(( $1 + $2 ))\n");
    let listed = Command::new("git").arg("-C").arg(&ws).args(["worktree", "list"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&listed.stdout).lines().count(), 1, "the worktrees are removed");
}

/// A repository's Claude Code hook (`.claude/settings.json`, as Claude Code writes it) runs
/// under `caret exec` once trusted: a real bash script sees Claude Code's payload (`Bash`,
/// `tool_input.command`) and blocks a command with exit code 2, which then never runs; before
/// the user trusts the file, it runs nothing and the session says so.
#[test]
fn a_projects_claude_code_hook_blocks_a_command_once_trusted() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent"));
    let home = TempDir::new();
    home.write("caret-home/config.toml", &agent_config(&up.url));
    home.write("ws/data/keep.txt", "precious\n");
    home.write(
        "ws/.claude/hooks/guard.sh",
        "#!/bin/bash\ninput=$(cat)\necho \"$input\" >> \"$CLAUDE_PROJECT_DIR/hook-calls.log\"\n\
         if echo \"$input\" | grep -q 'rm -rf'; then echo 'deleting data is not allowed here' >&2; exit 2; fi\n",
    );
    let ws = home.join("ws");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(ws.join(".claude/hooks/guard.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let settings = serde_json::json!({"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [
        {"type": "command", "command": "\"$CLAUDE_PROJECT_DIR\"/.claude/hooks/guard.sh"}]}]}});
    home.write("ws/.claude/settings.json", &serde_json::to_string_pretty(&settings).unwrap());
    up.set(Behaviour {
        tool_call: Some("run_terminal_cmd".into()),
        tool_arguments: Some(r#"{"command": "rm -rf data"}"#.into()),
        ..Behaviour::default()
    });
    let ws_s = ws.to_str().unwrap();
    let exec = || {
        let o = caret(&home, &["exec", "clean up", "-C", ws_s, "--max-steps", "2", "--approval", "never"]);
        stdout(&o).lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).collect::<Vec<Value>>()
    };
    // Not trusted: no hook runs, and the session says why.
    let ls = stdout(&caret(&home, &["hooks", "ls", "-C", ws_s]));
    assert!(ls.contains(".claude/settings.json  (not trusted"), "{ls}");
    home.write("ws/data/keep.txt", "precious\n");
    let events = exec();
    assert!(
        events.iter().any(|e| e["type"] == "notice" && e["message"].as_str().unwrap().contains("caret hooks trust"))
    );
    assert!(!ws.join("hook-calls.log").exists(), "an untrusted hook ran");
    // Trusted: the hook sees Claude Code's payload and blocks the command.
    home.write("ws/data/keep.txt", "precious\n");
    assert!(caret(&home, &["hooks", "trust", "-C", ws_s]).status.success());
    let events = exec();
    let end = events.iter().find(|e| e["type"] == "tool_call_end").unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(end["ok"], false, "{end}");
    assert!(end["output"].as_str().unwrap().contains("deleting data is not allowed here"), "{end}");
    assert!(ws.join("data/keep.txt").exists(), "a blocked command ran");
    let run = events.iter().find(|e| e["type"] == "hook_run").unwrap();
    assert_eq!((run["event"].as_str(), run["decision"].as_str()), (Some("PreToolUse"), Some("block")), "{run}");
    let logged: Value =
        serde_json::from_str(std::fs::read_to_string(ws.join("hook-calls.log")).unwrap().lines().next().unwrap())
            .unwrap();
    assert_eq!(
        (logged["tool_name"].as_str(), logged["tool_input"]["command"].as_str()),
        (Some("Bash"), Some("rm -rf data"))
    );
    // The model was told why.
    let told = up.chats().last().unwrap()["messages"].to_string();
    assert!(told.contains("refused by a hook: deleting data is not allowed here"), "{told}");
}

/// The agent answers from added documentation: with a docs source, `docs_search` is offered
/// (its description naming the sources) and a call of it returns the page's section with its
/// URL; without one, it is not offered. `@Docs NAME` in a request attaches that source's best
/// sections to it.
#[test]
fn exec_searches_added_documentation_with_docs_search() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent"));
    let home = TempDir::new();
    home.write("ws/README.md", "# a project\n");
    home.write("caret-home/config.toml", &agent_config(&up.url));
    up.set(Behaviour {
        tool_call: Some("docs_search".into()),
        tool_arguments: Some(r#"{"query": "how are failed calls retried", "source": "mylib"}"#.into()),
        ..Behaviour::default()
    });
    let ws = home.join("ws");
    let run = || caret(&home, &["exec", "how does mylib retry?", "-C", ws.to_str().unwrap(), "--max-steps", "2"]);
    let offered = |sent: &Value| -> Vec<String> {
        sent["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
            .collect()
    };
    run();
    assert!(!offered(&up.last_request().unwrap().1).contains(&"docs_search".to_owned()), "no sources, no tool");

    home.write(
        "mylib-docs/guide/retry.md",
        "# Retries\n\nFailed calls are retried with exponential backoff, 5 times.\n",
    );
    home.write("mylib-docs/index.md", "# mylib\n\nA client library.\n");
    let added =
        caret(&home, &["docs", "add", home.join("mylib-docs").to_str().unwrap(), "--name", "mylib", "--no-embed"]);
    assert!(added.status.success(), "{}", stderr(&added));
    let o = run();
    let events: Vec<Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let end = events.iter().find(|e| e["type"] == "tool_call_end").unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!((end["name"].as_str(), end["ok"].as_bool()), (Some("docs_search"), Some(true)), "{end}");
    let output = end["output"].as_str().unwrap();
    assert!(output.starts_with("Retries — file://") && output.contains("/mylib-docs/guide/retry.md"), "{output}");
    assert!(output.contains("exponential backoff, 5 times"), "{output}");
    let sent = up.last_request().unwrap().1;
    let tool = sent["tools"].as_array().unwrap().iter().find(|t| t["function"]["name"] == "docs_search").unwrap();
    assert!(tool["function"]["description"].as_str().unwrap().contains("(mylib)"), "{tool}");
    assert_eq!(tool["function"]["parameters"]["properties"]["source"]["enum"], serde_json::json!(["mylib"]));

    // `@Docs mylib` in the request: its best sections come with it.
    caret(&home, &["exec", "How are calls retried? @Docs mylib", "-C", ws.to_str().unwrap(), "--max-steps", "1"]);
    let first = up.chats().into_iter().rev().find(|c| c["messages"].as_array().is_some_and(|m| m.len() == 2)).unwrap();
    let asked = first["messages"][1]["content"].as_str().unwrap();
    assert!(asked.starts_with("How are calls retried? @Docs mylib\n\n[@Docs mylib: "), "{asked}");
    assert!(asked.contains("Retries — file://") && asked.contains("exponential backoff, 5 times"), "{asked}");
}

/// A Python with `mcp-server-time`, or `None` (said as a skip).
fn mcp_python() -> Option<String> {
    caret_test_support::mcp::python()
}

/// `caret mcp serve` driven by the official Python MCP client (`mcp` from PyPI) over stdio:
/// its tools listed with schemas, `grep`, `codebase_search` (on a workspace never indexed:
/// indexed by the first search, code read from disk) and `docs_search` (a documentation source) answered, bad arguments a tool error.
#[test]
fn caret_serves_its_workspace_over_mcp_to_the_python_client() {
    let Some(python) = mcp_python() else { return };
    let home = TempDir::new();
    home.write("ws/src/lib.rs", "/// Adds two numbers.\npub fn add_numbers(a: u32, b: u32) -> u32 {\n    a + b\n}\n");
    home.write("ws/notes.md", "# Notes\n");
    // Never indexed: the first search indexes it.
    let ws = home.join("ws");
    // A documentation source (a local folder): `docs_search` comes with it.
    home.write("mylib-docs/retry.md", "# Retries\n\n## Backoff\n\nCalls are retried with exponential backoff.\n");
    let added =
        caret(&home, &["docs", "add", home.join("mylib-docs").to_str().unwrap(), "--name", "mylib", "--no-embed"]);
    assert!(added.status.success(), "{}", stderr(&added));
    let client = home.write(
        "client.py",
        r#"
import asyncio, json, sys, os
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main():
    params = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:], env=dict(os.environ))
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            tools = await s.list_tools()
            out = {"tools": {t.name: t.input_schema for t in tools.tools}}
            for name, args in [("grep", {"pattern": "add_numbers"}),
                               ("codebase_search", {"query": "add_numbers", "k": 3}),
                               ("codebase_search", {"nope": 1}),
                               ("docs_search", {"query": "exponential backoff", "source": "mylib"})]:
                res = await s.call_tool(name, args)
                out.setdefault("calls", []).append({"error": res.is_error, "text": res.content[0].text})
            print(json.dumps(out))

asyncio.run(main())
"#,
    );
    let out = Command::new(&python)
        .arg(&client)
        .args([env!("CARGO_BIN_EXE_caret"), "mcp", "serve", "-C", ws.to_str().unwrap()])
        .env("CARET_HOME", home.join("caret-home"))
        .env("HOME", home.path())
        .env_remove("CARET_CONFIG")
        .env_remove("CARET_SERVER")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["tools"]["codebase_search"]["required"], serde_json::json!(["query"]), "{got}");
    assert_eq!(got["tools"]["grep"]["properties"]["pattern"]["type"], "string", "{got}");
    let calls = &got["calls"];
    assert_eq!(calls[0]["error"], false);
    assert!(calls[0]["text"].as_str().unwrap().contains("src/lib.rs:2: pub fn add_numbers"), "{got}");
    assert_eq!(calls[1]["error"], false);
    assert!(calls[1]["text"].as_str().unwrap().starts_with("src/lib.rs:1-4\n/// Adds two numbers."), "{got}");
    assert!(calls[1]["text"].as_str().unwrap().contains("(indexed just now: 2 files added"), "{got}");
    assert_eq!(calls[2]["error"], true);
    assert!(calls[2]["text"].as_str().unwrap().contains("unknown field `nope`"), "{got}");
    assert_eq!(got["tools"]["docs_search"]["required"], serde_json::json!(["query"]), "{got}");
    assert_eq!(calls[3]["error"], false);
    let docs = calls[3]["text"].as_str().unwrap();
    assert!(docs.starts_with("Retries — file://") && docs.contains("retry.md\n# Retries"), "{got}");
    assert!(docs.contains("exponential backoff"), "{got}");
}

/// `caret mcp add` and `rm` edit the config file and leave the rest of it as it was.
#[test]
fn mcp_add_and_rm_edit_the_config_and_keep_the_rest() {
    let Some(python) = mcp_python() else { return };
    let home = TempDir::new();
    home.write("caret-home/config.toml", "# my settings\n[sync]\ninterval = \"5m\" # kept\n");
    let o = caret(&home, &["mcp", "add", "clock", "--env", "TZ=UTC", "--", &python, "-m", "mcp_server_time"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(home.join("caret-home/config.toml")).unwrap();
    assert!(text.starts_with("# my settings\n[sync]\ninterval = \"5m\" # kept\n"), "{text}");
    assert!(
        text.contains("[mcp_servers.clock]\ncommand = ") && text.contains("args = [\"-m\", \"mcp_server_time\"]"),
        "{text}"
    );
    let ls = stdout(&caret(&home, &["mcp", "ls", "-C", home.path().to_str().unwrap()]));
    assert!(ls.contains("clock  ready (2 tools, MCP 2026-07-28)"), "{ls}");
    // A second of the same name, a bad name, a URL that is not http(s), a remote server with a
    // command, a stdio one with a header: refused; nothing changes.
    assert!(!caret(&home, &["mcp", "add", "clock", "--", "x"]).status.success());
    assert!(!caret(&home, &["mcp", "add", "a b", "--", "x"]).status.success());
    assert!(!caret(&home, &["mcp", "add", "far", "--url", "ftp://example.com/mcp"]).status.success());
    assert!(!caret(&home, &["mcp", "add", "far", "--url", "https://example.com/mcp", "--", "x"]).status.success());
    assert!(!caret(&home, &["mcp", "add", "far", "--header", "A: b", "--", "x"]).status.success());
    assert_eq!(std::fs::read_to_string(home.join("caret-home/config.toml")).unwrap(), text);
    // A remote one: its URL, the variable with its token, a header.
    let o = caret(
        &home,
        &[
            "mcp",
            "add",
            "far",
            "--url",
            "https://mcp.example.com/mcp",
            "--bearer-token-env",
            "FAR_TOKEN",
            "--header",
            "X-Team: caret",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let with_far = std::fs::read_to_string(home.join("caret-home/config.toml")).unwrap();
    assert!(
        with_far.ends_with(
            "[mcp_servers.far]\nurl = \"https://mcp.example.com/mcp\"\nbearer_token_env = \"FAR_TOKEN\"\nheaders = { \"X-Team\" = \"caret\" }\n"
        ),
        "{with_far}"
    );
    let ls = stdout(&caret(&home, &["mcp", "ls", "-C", home.path().to_str().unwrap()]));
    assert!(
        ls.contains("far  not running: it did not start: its bearer token's variable FAR_TOKEN is not set"),
        "{ls}"
    );
    for name in ["far", "clock"] {
        let o = caret(&home, &["mcp", "rm", name]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let after = std::fs::read_to_string(home.join("caret-home/config.toml")).unwrap();
    assert_eq!(after.trim_end(), "# my settings\n[sync]\ninterval = \"5m\" # kept");
    assert!(!caret(&home, &["mcp", "rm", "clock"]).status.success());
}

/// A server the project declares (`.cursor/mcp.json`) does not start until the user trusts it
/// for that project and command line; then `caret exec` has its tools.
#[test]
fn a_projects_mcp_server_starts_only_once_trusted() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let Some(python) = mcp_python() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent"));
    let home = TempDir::new();
    let declare = |tz: &str| {
        let script = format!("touch started-marker; exec {python} -m mcp_server_time --local-timezone {tz}");
        home.write(
            "ws/.cursor/mcp.json",
            &serde_json::json!({"mcpServers": {"clock": {"command": "sh", "args": ["-c", script]}}}).to_string(),
        );
    };
    declare("UTC");
    home.write("caret-home/config.toml", &agent_config(&up.url));
    up.set(Behaviour {
        tool_call: Some("mcp__clock__get_current_time".into()),
        tool_arguments: Some(r#"{"timezone": "UTC"}"#.into()),
        ..Behaviour::default()
    });
    let ws = home.join("ws");
    let ws_s = ws.to_str().unwrap();
    let exec = || {
        let o = caret(&home, &["exec", "what time is it?", "-C", ws_s, "--max-steps", "1"]);
        let end = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|e| e["type"] == "tool_call_end")
            .unwrap_or_else(|| panic!("{}{}", stdout(&o), stderr(&o)));
        (end, stderr(&o))
    };
    let (end, said) = exec();
    assert_eq!(end["ok"], false, "{end}");
    assert!(said.contains("caret mcp trust clock"), "{said}");
    assert!(!ws.join("started-marker").exists(), "an untrusted server was started");
    let ls = stdout(&caret(&home, &["mcp", "ls", "-C", ws_s]));
    assert!(ls.contains("clock  not started: declared by the project (.cursor/mcp.json)"), "{ls}");

    let o = caret(&home, &["mcp", "trust", "clock", "-C", ws_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (end, _) = exec();
    assert_eq!(end["ok"], true, "{end}");
    assert!(ws.join("started-marker").exists());

    // Another command line is another server: trusted again or not at all.
    declare("Europe/Paris");
    let ls = stdout(&caret(&home, &["mcp", "ls", "-C", ws_s]));
    assert!(ls.contains("clock  not started"), "{ls}");
    assert!(!caret(&home, &["mcp", "trust", "nothing", "-C", ws_s]).status.success());
}

#[test]
fn exec_runs_the_agent_and_prints_json_events() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent"));
    let home = TempDir::new();
    home.write("ws/src/lib.rs", "pub fn answer() -> u32 {\n    42\n}\n");
    home.write("caret-home/config.toml", &agent_config(&up.url));
    let ws = home.join("ws");
    let ws = ws.to_str().unwrap();
    up.set(Behaviour { tool_call: Some("read_file".into()), ..Behaviour::default() });
    let o = caret(&home, &["exec", "what does answer return?", "-C", ws, "--max-steps", "2"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let events: Vec<Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[..2], ["session_configured", "turn_begin"]);
    assert_eq!(kinds.iter().filter(|k| **k == "tool_call_end").count(), 2, "{kinds:?}");
    let end = events.iter().find(|e| e["type"] == "tool_call_end").unwrap();
    assert_eq!(end["name"], "read_file");
    assert_eq!(end["ok"], true);
    assert!(end["output"].as_str().unwrap().contains("2|     42"), "{end}");
    assert_eq!(events.last().unwrap()["reason"], "step_limit");
    // The model was told what the tool returned.
    let (_, sent) = up.last_request().unwrap();
    let messages = sent["messages"].as_array().unwrap();
    assert!(messages.iter().any(|m| m["role"] == "tool" && m["content"].as_str().unwrap().contains("42")));
    assert!(sent["tools"].as_array().unwrap().iter().any(|t| t["function"]["name"] == "edit_file"));

    // codebase_search reads the synced index.
    let synced = caret(&home, &["sync", ws]);
    assert!(synced.status.success(), "{}", stderr(&synced));
    up.set(Behaviour {
        tool_call: Some("codebase_search".into()),
        tool_arguments: Some(r#"{"query": "answer function", "k": 3}"#.into()),
        ..Behaviour::default()
    });
    let o = caret(&home, &["exec", "find answer", "-C", ws, "--max-steps", "1"]);
    let end = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["type"] == "tool_call_end")
        .unwrap_or_else(|| panic!("{}{}", stdout(&o), stderr(&o)));
    assert_eq!((end["name"].as_str(), end["ok"].as_bool()), (Some("codebase_search"), Some(true)), "{end}");
    assert!(end["output"].as_str().unwrap().contains("src/lib.rs:1-3"), "{end}");
    assert!(end["output"].as_str().unwrap().contains("pub fn answer()"), "{end}");

    up.set(Behaviour { answer: Some("It returns 42.".into()), ..Behaviour::default() });
    let o = caret(&home, &["exec", "what does answer return?", "-C", ws]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text: String = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "text_delta")
        .map(|e| e["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "It returns 42.");

    // The session was saved: resuming it sends the model the earlier conversation.
    let id = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["type"] == "session_configured")
        .map(|e| e["session_id"].as_str().unwrap().to_owned())
        .unwrap();
    up.set(Behaviour { answer: Some("84.".into()), ..Behaviour::default() });
    let o = caret(&home, &["exec", "and twice that?", "-C", ws, "--resume", &id]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (_, sent) = up.last_request().unwrap();
    let said: Vec<(String, String)> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_owned(), m["content"].as_str().unwrap_or("").to_owned()))
        .collect();
    let at = |role: &str, text: &str| said.iter().position(|(r, t)| r == role && t == text);
    assert!(at("user", "what does answer return?") < at("assistant", "It returns 42."), "{said:?}");
    assert!(
        at("assistant", "It returns 42.") < at("user", "and twice that?") && at("user", "and twice that?").is_some()
    );
    let o = caret(&home, &["exec", "x", "-C", ws, "--resume", "no-such-session"]);
    assert!(!o.status.success() && stderr(&o).contains("resuming session no-such-session"), "{}", stderr(&o));
}

/// The `[agent]` section reaches `caret exec`: a denied prefix is refused, an allowed risky
/// command runs with nobody to approve it, the memory limit kills a command over it. The
/// model is a scripted server (test double) that checks each request's tool messages.
#[test]
fn exec_follows_the_configured_command_rules_and_limits() {
    use caret_test_support::scripted::{Answer, ScriptedUpstream};
    use serde_json::json;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("agent"));
    let home = TempDir::new();
    home.write("ws/stale.txt", "old\n");
    home.write(
        "caret-home/config.toml",
        &format!(
            "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{}\", model = \"m\" }}]\n\n\
             [agent]\nallow = [\"rm stale.txt\", \"kill -0\"]\ndeny = [\"touch\"]\nmemory = \"64M\"\n",
            up.url
        ),
    );
    let run = |command: &str| Answer::Calls(vec![("run_terminal_cmd".to_owned(), json!({ "command": command }))]);
    up.queue([
        run("touch made.txt"),
        run("rm stale.txt"),
        run("rm -f other.txt"),
        run("python3 -c 'b = bytearray(256 << 20); print(len(b))'"),
        run("kill -0 1 && echo signalled"),
        Answer::Text("done".into()),
    ]);
    let ws = home.join("ws");
    let o = caret(&home, &["exec", "tidy up", "-C", ws.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ends: Vec<String> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "tool_call_end")
        .map(|e| e["output"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ends.len(), 5, "{ends:?}");
    assert!(ends[0].contains("refused by policy"), "{ends:?}");
    assert!(!ws.join("made.txt").exists());
    assert!(!ws.join("stale.txt").exists(), "allowed by a rule: ran without approval: {ends:?}");
    assert!(ends[2].contains("refused"), "risky and not allowed: nobody to approve it: {ends:?}");
    assert!(ends[3].contains("memory limit"), "{ends:?}");
    // `caret` is its sandbox's Landlock helper: where the kernel has Landlock, a command cannot
    // signal the sandbox's init (outside its domain).
    let helper = Command::new(env!("CARGO_BIN_EXE_caret")).args(["__caret-landlock", "--", "true"]).status().unwrap();
    if helper.code() != Some(125) {
        assert!(helper.success());
        assert!(!ends[4].contains("signalled") && ends[4].contains("not permitted"), "{ends:?}");
    }
    assert_eq!(up.violations(), Vec::<String>::new());

    // A rule that would match everything is a configuration error.
    home.write("caret-home/config.toml", "[agent]\nallow = [\" \"]\n");
    let o = caret(&home, &["exec", "x", "-C", ws.to_str().unwrap()]);
    assert!(!o.status.success() && stderr(&o).contains("empty command prefix"), "{}", stderr(&o));
}

/// An MCP server behind OAuth 2.1, built with the official Python SDK's authorization
/// support (`MCPServer` as its own authorization server: metadata, dynamic client
/// registration, PKCE, refresh). Its `authorize` approves at once (the user's consent page
/// is not what is tested); access tokens live 2 s, so a later connection must refresh.
/// `python3 SCRIPT PORT`.
const OAUTH_SERVER: &str = r#"
import secrets, sys, time
from mcp.server.mcpserver import MCPServer
from mcp.server.auth.provider import AccessToken, AuthorizationCode, RefreshToken, construct_redirect_uri
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.shared.auth import OAuthToken

port = int(sys.argv[1])
base = f"http://127.0.0.1:{port}"

class Provider:
    def __init__(self):
        self.clients, self.codes, self.access, self.refresh = {}, {}, {}, {}
        self.refreshed = 0
    async def get_client(self, client_id):
        return self.clients.get(client_id)
    async def register_client(self, info):
        self.clients[info.client_id] = info
    async def authorize(self, client, params):
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code, scopes=params.scopes or [], expires_at=time.time() + 300, client_id=client.client_id,
            code_challenge=params.code_challenge, redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly, resource=params.resource)
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)
    async def load_authorization_code(self, client, code):
        return self.codes.get(code)
    def issue(self, client_id, scopes, resource):
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        self.access[access] = AccessToken(token=access, client_id=client_id, scopes=scopes,
                                          expires_at=int(time.time()) + 2, resource=resource)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        return OAuthToken(access_token=access, expires_in=2, refresh_token=refresh, scope=" ".join(scopes) or None)
    async def exchange_authorization_code(self, client, code):
        del self.codes[code.code]
        return self.issue(client.client_id, code.scopes, code.resource)
    async def load_refresh_token(self, client, token):
        return self.refresh.get(token)
    async def exchange_refresh_token(self, client, token, scopes):
        del self.refresh[token.token]
        self.refreshed += 1
        return self.issue(client.client_id, scopes or token.scopes, token.resource)
    async def load_access_token(self, token):
        found = self.access.get(token)
        return found if found and found.expires_at > time.time() else None
    async def revoke_token(self, token):
        pass

provider = Provider()
server = MCPServer("guarded", auth_server_provider=provider, auth=AuthSettings(
    issuer_url=base, resource_server_url=f"{base}/mcp",
    client_registration_options=ClientRegistrationOptions(enabled=True)))

@server.tool()
def refreshes() -> str:
    """How many times a token was refreshed."""
    return f"refreshed {provider.refreshed} times"

server.run("streamable-http", host="127.0.0.1", port=port)
"#;

/// `caret mcp login` against a server behind OAuth: before it, the server is down asking for
/// authorization; the login registers Caret, the "browser" (this test) follows the page and
/// comes back to Caret's loopback listener, the tokens are kept sealed; then the server's
/// tools answer, also after the access token expired (refreshed); `logout` forgets them.
#[test]
fn mcp_login_authorizes_with_an_oauth_server_and_refreshes() {
    let Some(python) = mcp_python() else { return };
    let home = TempDir::new();
    let script = home.write("oauth_server.py", OAUTH_SERVER);
    let port = caret_test_support::free_port();
    let _server =
        caret_test_support::ChildGuard::listening(Command::new(&python).arg(&script).arg(port.to_string()), port);
    let url = format!("http://127.0.0.1:{port}/mcp");
    assert!(caret(&home, &["mcp", "add", "guarded", "--url", &url]).status.success());
    let ws = home.path().to_str().unwrap();
    let ls = stdout(&caret(&home, &["mcp", "ls", "-C", ws]));
    assert!(ls.contains("guarded  not running") && ls.contains("`caret mcp login guarded`"), "{ls}");

    let mut login = Command::new(env!("CARGO_BIN_EXE_caret"))
        .args(["mcp", "login", "guarded", "-C", ws])
        .env("CARET_HOME", home.join("caret-home"))
        .env("HOME", home.path())
        .env_remove("CARET_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(login.stdout.take().unwrap()));
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("Open this page to authorize Caret with guarded"), "{first}");
    let page = lines.next().unwrap().unwrap();
    assert!(
        page.starts_with(&format!("http://127.0.0.1:{port}/authorize?")) && page.contains("code_challenge="),
        "{page}"
    );
    // The browser: the page redirects to Caret's listener on loopback, which says it is done.
    let done = reqwest::blocking::get(&page).unwrap();
    assert!(done.url().as_str().starts_with("http://127.0.0.1:") && done.url().path() == "/callback");
    assert!(done.text().unwrap().contains("Caret is authorized"));
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = login.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut login.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    assert!(rest.concat().contains("logged in to guarded"), "{rest:?}");
    let sealed = std::fs::read(home.join("caret-home/mcp-oauth/guarded.sealed")).unwrap();
    assert!(!String::from_utf8_lossy(&sealed).contains("access_token"), "kept encrypted");

    let ls = stdout(&caret(&home, &["mcp", "ls", "-C", ws]));
    assert!(ls.contains("guarded  ready (1 tools") && ls.contains("mcp__guarded__refreshes"), "{ls}");
    // Past the access token's life: the next connection refreshes it and goes on.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let called = caret(&home, &["mcp", "call", "guarded", "refreshes", "-C", ws]);
    assert!(called.status.success(), "{}", stderr(&called));
    assert_eq!(stdout(&called).trim(), "refreshed 1 times", "after expiry");
    let wrong = caret(&home, &["mcp", "call", "guarded", "nope", "-C", ws]);
    assert!(!wrong.status.success() && stderr(&wrong).contains("guarded has no tool nope"), "{}", stderr(&wrong));

    assert!(caret(&home, &["mcp", "logout", "guarded"]).status.success());
    let ls = stdout(&caret(&home, &["mcp", "ls", "-C", ws]));
    assert!(ls.contains("`caret mcp login guarded`"), "{ls}");
}

fn sqlite_docs() -> Option<std::path::PathBuf> {
    caret_test_support::sqlite_docs()
}

/// @Docs from the command line over a real docs site (SQLite's) served on loopback: added
/// (crawled, indexed, embedded), listed, searched (hits with URL and anchor, heading, text,
/// score, source), refreshed (every page unchanged: nothing written or embedded again) and
/// removed.
#[test]
fn docs_are_added_searched_refreshed_and_removed() {
    let Some(site) = sqlite_docs() else { return };
    let home = TempDir::new();
    let port = caret_test_support::free_port();
    let _server = caret_test_support::ChildGuard::listening(
        Command::new("python3")
            .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1", "--directory"])
            .arg(&site),
        port,
    );
    let url = format!("http://127.0.0.1:{port}/lang.html");
    let out = caret_model(&home, &["docs", "add", &url, "--name", "sqlite", "--depth", "1"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let said = stdout(&out);
    assert!(said.starts_with("sqlite: ") && said.contains(" pages fetched in "), "{said}");
    let semantic = caret_test_support::models::TestModel::Embedding.dir().is_some();
    if semantic {
        assert!(said.contains("sqlite: embedded "), "{said}");
    }
    let ls: Value = serde_json::from_slice(&caret(&home, &["docs", "ls", "--json"]).stdout).unwrap();
    assert_eq!(ls[0]["source"]["name"], "sqlite");
    // The start page and what it links to, one level down.
    let pages = ls[0]["pages"].as_u64().unwrap();
    assert!(pages > 40 && said.contains(&format!("{pages} written")), "{ls}\n{said}");
    assert_eq!(ls[0]["source"]["origin"]["prefix"], format!("http://127.0.0.1:{port}/"));

    let search = |q: &str| -> Value {
        let out = caret_model(&home, &["docs", "search", q, "--json", "-k", "3"]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let hits = search("how do I limit the number of rows a query returns");
    let want = format!("http://127.0.0.1:{port}/lang_select.html#the_limit_clause");
    let best =
        hits.as_array().unwrap().iter().find(|h| h["url"] == want.as_str()).unwrap_or_else(|| panic!("{hits:#}"));
    assert_eq!((best["title"].as_str(), best["source"].as_str()), (Some("SELECT"), Some("sqlite")));
    assert!(best["heading"].as_str().unwrap().contains("The LIMIT clause"), "{best}");
    assert!(best["text"].as_str().unwrap().contains("upper bound on the number of rows"), "{best}");
    assert!(best["score"].as_f64().unwrap() > 0.0);

    // A refresh of the unchanged site: conditional requests, nothing written, nothing embedded.
    let out = caret_model(&home, &["docs", "refresh", "sqlite"]);
    let said = stdout(&out);
    assert!(out.status.success(), "{said}{}", stderr(&out));
    assert!(
        said.contains(&format!("0 written, {pages} unchanged, 0 removed")) && said.contains("(+0 ~0 -0)"),
        "{said}"
    );
    if semantic {
        assert!(said.contains("sqlite: embedded 0 chunks"), "{said}");
    }

    // A site that does not answer: a clear error, and no source left behind.
    let out = caret(&home, &["docs", "add", "http://127.0.0.1:9/docs/", "--name", "gone", "--no-embed"]);
    assert!(!out.status.success() && stderr(&out).contains("fetching http://127.0.0.1:9/docs/"), "{}", stderr(&out));
    assert!(!stdout(&caret(&home, &["docs", "ls"])).contains("gone"));

    let out = caret(&home, &["docs", "rm", "sqlite"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&caret(&home, &["docs", "ls"])).contains("no docs sources"));
    let out = caret_model(&home, &["docs", "search", "LIMIT", "--name", "sqlite"]);
    assert!(!out.status.success() && stderr(&out).contains("no docs source sqlite"), "{}", stderr(&out));
}
