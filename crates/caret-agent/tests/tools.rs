//! The workspace tools on a real directory, and the executor's batching.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caret_agent::batch::{Call, run_calls};
use caret_agent::tools::{Ctx, Registry, Spec, Tool, ToolResult};
use caret_test_support::TempDir;
use serde_json::{Value, json};

fn workspace() -> TempDir {
    let dir = TempDir::new();
    dir.write(
        "src/lib.rs",
        "pub fn add(a: u32, b: u32) -> u32 {\n    a + b\n}\n\npub fn sub(a: u32, b: u32) -> u32 {\n    a - b\n}\n",
    );
    dir.write("src/main.rs", "fn main() {\n    println!(\"{}\", mylib::add(1, 2));\n}\n");
    dir.write(".gitignore", "target/\n");
    dir.write("target/debug/out.rs", "pub fn add_generated() {}\n");
    dir.write(".caretignore", "secret.txt\n");
    dir.write("secret.txt", "pub fn add_secret() {}\n");
    dir.write_bytes("logo.png", &[0x89, b'P', b'N', b'G', 0, 0, 1, 2]);
    let long: String = (1..=1000).map(|i| format!("line {i}\n")).collect();
    dir.write("docs/long.txt", &long);
    dir
}

async fn call(ctx: &Ctx, name: &str, args: Value) -> ToolResult {
    Registry::read_only().get(name).unwrap().call(args, ctx).await
}

#[tokio::test]
async fn read_file_numbers_lines_reads_ranges_and_refuses_what_it_should() {
    let dir = workspace();
    let ctx = Ctx::new(dir.path()).unwrap();
    let out = call(&ctx, "read_file", json!({"path": "src/lib.rs"})).await.unwrap();
    assert!(out.starts_with("1| pub fn add(a: u32, b: u32) -> u32 {\n2|     a + b\n"), "{out}");
    let out = call(&ctx, "read_file", json!({"path": "docs/long.txt"})).await.unwrap();
    assert!(out.contains("400| line 400\n") && !out.contains("line 401\n"));
    assert!(out.contains("[lines 1-400 of 1000; read on with start_line=401]"), "{out}");
    let out = call(&ctx, "read_file", json!({"path": "docs/long.txt", "start_line": 998, "end_line": 2000})).await;
    assert_eq!(out.unwrap(), " 998| line 998\n 999| line 999\n1000| line 1000\n");
    let err = |r: ToolResult| r.unwrap_err().to_string();
    assert!(err(call(&ctx, "read_file", json!({"path": "logo.png"})).await).contains("binary"));
    assert!(err(call(&ctx, "read_file", json!({"path": "../outside.txt"})).await).contains("outside the workspace"));
    assert!(err(call(&ctx, "read_file", json!({"path": "/etc/passwd"})).await).contains("outside the workspace"));
    assert!(err(call(&ctx, "read_file", json!({"path": "nope.rs"})).await).contains("nope.rs"));
    assert!(err(call(&ctx, "read_file", json!({"path": "src"})).await).contains("directory"));
    assert!(err(call(&ctx, "read_file", json!({})).await).contains("`path`"));
    assert!(err(call(&ctx, "read_file", json!({"path": "src/lib.rs", "start_line": 50})).await).contains("past"));
    // A link that points out of the workspace is refused too.
    let outside = TempDir::new();
    outside.write("key", "secret\n");
    dir.symlink(outside.join("key"), "link");
    assert!(err(call(&ctx, "read_file", json!({"path": "link"})).await).contains("outside the workspace"));
}

#[tokio::test]
async fn big_outputs_are_cut_with_a_note() {
    let dir = workspace();
    let mut ctx = Ctx::new(dir.path()).unwrap();
    ctx.max_output_bytes = 200;
    let out = call(&ctx, "read_file", json!({"path": "docs/long.txt"})).await.unwrap();
    assert!(out.len() < 320, "{}", out.len());
    assert!(out.contains("[output truncated: ") && out.contains("ask for a smaller line range"), "{out}");
}

#[tokio::test]
async fn list_glob_and_grep_honour_ignore_rules() {
    let dir = workspace();
    let ctx = Ctx::new(dir.path()).unwrap();
    let out = call(&ctx, "list_dir", json!({})).await.unwrap();
    assert!(out.starts_with("docs/\nsrc/\n"), "{out}");
    assert!(out.contains("logo.png  (8 bytes)") && !out.contains("target") && !out.contains("secret.txt"), "{out}");
    let out = call(&ctx, "glob", json!({"pattern": "**/*.rs"})).await.unwrap();
    assert_eq!(out, "src/lib.rs\nsrc/main.rs\n");
    assert_eq!(call(&ctx, "glob", json!({"pattern": "*.rs"})).await.unwrap(), "no files match *.rs\n");
    let out = call(&ctx, "grep", json!({"pattern": r"fn add\w*"})).await.unwrap();
    assert_eq!(out, "src/lib.rs:1: pub fn add(a: u32, b: u32) -> u32 {\n");
    let out = call(&ctx, "grep", json!({"pattern": "ADD", "case_insensitive": true, "glob": "main.rs"})).await.unwrap();
    assert_eq!(out, "src/main.rs:2:     println!(\"{}\", mylib::add(1, 2));\n");
    let out = call(&ctx, "grep", json!({"pattern": "line", "path": "docs", "max_matches": 2})).await.unwrap();
    assert!(out.ends_with("[998 more matching lines not shown; narrow with path or glob]\n"), "{out}");
    assert!(call(&ctx, "grep", json!({"pattern": "("})).await.unwrap_err().to_string().contains("bad pattern"));
}

/// A test double: sleeps, and records when it ran.
struct Sleeper {
    spec: Spec,
    log: Arc<Mutex<Vec<String>>>,
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl Tool for Sleeper {
    fn spec(&self) -> &Spec {
        &self.spec
    }

    async fn call(&self, args: Value, _ctx: &Ctx) -> ToolResult {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        self.log.lock().unwrap().push(format!("start {}", args["tag"].as_str().unwrap()));
        tokio::time::sleep(Duration::from_millis(args["ms"].as_u64().unwrap())).await;
        self.log.lock().unwrap().push(format!("end {}", args["tag"].as_str().unwrap()));
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(args["tag"].as_str().unwrap().to_owned())
    }
}

#[tokio::test]
async fn reads_run_together_writes_alone_and_results_keep_call_order() {
    let dir = workspace();
    let ctx = Arc::new(Ctx::new(dir.path()).unwrap());
    let (log, running, most) = (Arc::default(), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tools = Registry::read_only();
    for (name, read_only) in [("look", true), ("write", false)] {
        let spec = Spec { name, description: "test double", parameters: json!({}), read_only };
        tools.add(Arc::new(Sleeper { spec, log: Arc::clone(&log), running: running.clone(), most: most.clone() }));
    }
    let c = |id: &str, name: &str, tag: &str, ms: u64| Call {
        id: id.into(),
        name: name.into(),
        arguments: json!({"tag": tag, "ms": ms}),
    };
    // Ten reads of 200 ms each, one slower: about the slowest, not the sum.
    let mut reads: Vec<Call> = (0..9).map(|i| c(&format!("r{i}"), "look", &format!("r{i}"), 200)).collect();
    reads.insert(3, c("slow", "look", "slow", 300));
    let started = Instant::now();
    let outs = run_calls(&tools, &reads, &ctx, &|_| {}, &|_| {}).await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1_000), "{took:?}");
    assert_eq!(most.load(Ordering::SeqCst), 10);
    let ids: Vec<&str> = outs.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, reads.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), "results in call order");
    assert_eq!(outs[3].output, "slow");

    // A write waits for the reads before it, and the reads after it wait for it.
    log.lock().unwrap().clear();
    let calls = vec![
        c("a", "look", "a", 100),
        c("b", "look", "b", 50),
        c("w", "write", "w", 50),
        c("x", "read_file", "x", 0),
        c("d", "look", "d", 10),
        c("z", "missing_tool", "z", 0),
    ];
    let started_ids = Mutex::new(Vec::new());
    let outs =
        run_calls(&tools, &calls, &ctx, &|call| started_ids.lock().unwrap().push(call.id.clone()), &|_| {}).await;
    let log = log.lock().unwrap().clone();
    let at = |e: &str| log.iter().position(|l| l == e).unwrap();
    assert!(at("end a") < at("start w") && at("end b") < at("start w"), "{log:?}");
    assert!(at("end w") < at("start d"), "{log:?}");
    assert_eq!(started_ids.lock().unwrap().len(), 6);
    assert!(!outs[3].ok && outs[3].output.contains("`path`"), "{:?}", outs[3]);
    assert!(!outs[5].ok && outs[5].output.contains("no tool named"), "{:?}", outs[5]);
    assert_eq!(outs.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), ["a", "b", "w", "x", "d", "z"]);
    assert!(!outs[5].output.contains("already failed"), "{:?}", outs[5]);

    // The same failing call again is told so; a changed one is not.
    let again = vec![c("z2", "missing_tool", "z", 0), c("z3", "missing_tool", "other", 0)];
    let outs = run_calls(&tools, &again, &ctx, &|_| {}, &|_| {}).await;
    assert!(outs[0].output.ends_with(caret_agent::batch::REPEATED), "{:?}", outs[0]);
    assert!(!outs[1].output.contains("already failed"), "{:?}", outs[1]);
}

#[tokio::test]
async fn edits_writes_and_deletes_are_recorded_with_diffs() {
    use caret_protocol::agent::{ChangeKind, TodoStatus};
    let dir = workspace();
    dir.write("crlf.txt", "one\r\ntwo\r\nthree\r\n");
    let ctx = Ctx::new(dir.path()).unwrap();
    let tools = Registry::workspace();
    let run = |name: &str, args: Value| {
        let tool = tools.get(name).unwrap().clone();
        let ctx = ctx.clone();
        async move { tool.call(args, &ctx).await }
    };
    let edit = "<<<<<<< SEARCH\n    a - b\n=======\n    a.saturating_sub(b)\n>>>>>>> REPLACE\n";
    let out = run("edit_file", json!({"path": "src/lib.rs", "edit": edit})).await.unwrap();
    assert_eq!(out, "edited src/lib.rs (search-replace, +1 -1 lines)");
    assert!(std::fs::read_to_string(dir.join("src/lib.rs")).unwrap().contains("    a.saturating_sub(b)\n"));
    // An edit that does not fit writes nothing and says why.
    let before = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap();
    let bad = "<<<<<<< SEARCH\n    a * b\n=======\n    b\n>>>>>>> REPLACE\n";
    let err = run("edit_file", json!({"path": "src/lib.rs", "edit": bad})).await.unwrap_err();
    assert!(err.to_string().contains("no place"), "{err}");
    assert_eq!(std::fs::read_to_string(dir.join("src/lib.rs")).unwrap(), before);
    // Line endings are kept.
    let crlf = "<<<<<<< SEARCH\ntwo\n=======\n2\n>>>>>>> REPLACE\n";
    run("edit_file", json!({"path": "crlf.txt", "edit": crlf})).await.unwrap();
    assert_eq!(std::fs::read(dir.join("crlf.txt")).unwrap(), b"one\r\n2\r\nthree\r\n");

    assert_eq!(
        run("write_file", json!({"path": "tests/t.rs", "content": "#[test]\nfn t() {}\n"})).await.unwrap(),
        "created tests/t.rs (+2 -0 lines)"
    );
    run("delete_file", json!({"path": "src/main.rs"})).await.unwrap();
    assert!(!dir.join("src/main.rs").exists());
    let err = run("write_file", json!({"path": "../escape.txt", "content": "x"})).await.unwrap_err();
    assert!(err.to_string().contains("outside the workspace"));
    assert!(run("delete_file", json!({"path": "src"})).await.unwrap_err().to_string().contains("directory"));

    let changes = ctx.take_changes();
    let kinds: Vec<(&str, ChangeKind)> = changes.iter().map(|c| (c.path.as_str(), c.kind)).collect();
    assert_eq!(
        kinds,
        [
            ("src/lib.rs", ChangeKind::Update),
            ("crlf.txt", ChangeKind::Update),
            ("tests/t.rs", ChangeKind::Add),
            ("src/main.rs", ChangeKind::Delete)
        ]
    );
    assert!(changes[0].diff.contains("--- a/src/lib.rs\n+++ b/src/lib.rs\n"), "{}", changes[0].diff);
    assert!(changes[0].diff.contains("\n-    a - b\n+    a.saturating_sub(b)\n"), "{}", changes[0].diff);
    assert!(ctx.take_changes().is_empty());

    // Replacing a file the agent never read is refused (it would drop what the file holds), and
    // the refusal shows the content, which counts as reading it; a long file shows its start
    // only and stays unread until read_file.
    std::fs::write(dir.join("notes.md"), "keep me\n").unwrap();
    let err = run("write_file", json!({"path": "notes.md", "content": "new\n"})).await.unwrap_err();
    assert!(err.to_string().contains("had not read it, so nothing was written"), "{err}");
    assert!(err.to_string().contains("```\nkeep me\n```"), "{err}");
    assert_eq!(std::fs::read_to_string(dir.join("notes.md")).unwrap(), "keep me\n");
    run("write_file", json!({"path": "notes.md", "content": "new\n"})).await.unwrap();
    // A whole-file write that drops definitions is refused once, saying which; the same call
    // again is taken as meant. One that keeps them goes through at once.
    std::fs::write(dir.join("calc.py"), "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n")
        .unwrap();
    run("read_file", json!({"path": "calc.py"})).await.unwrap();
    let fragment = json!({"path": "calc.py", "content": "def mul(a, b):\n    return a * b\n"});
    let err = run("write_file", fragment.clone()).await.unwrap_err().to_string();
    assert!(err.contains("drops def add, def sub from calc.py"), "{err}");
    assert!(std::fs::read_to_string(dir.join("calc.py")).unwrap().contains("def sub"));
    let same = "<<<<<<< SEARCH\n    return a + b\n=======\n    return a + b\n>>>>>>> REPLACE\n";
    let err = run("edit_file", json!({"path": "calc.py", "edit": same})).await.unwrap_err().to_string();
    assert!(err.contains("changes nothing in calc.py"), "{err}");
    let whole = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n";
    run("write_file", json!({"path": "calc.py", "content": whole})).await.unwrap();
    let err = run("write_file", json!({"path": "calc.py", "content": whole})).await.unwrap_err().to_string();
    assert!(err.contains("already has exactly this content"), "{err}");
    run("write_file", fragment.clone()).await.unwrap_err();
    run("write_file", fragment).await.unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("calc.py")).unwrap(), "def mul(a, b):\n    return a * b\n");
    let long: String = (1..=500).map(|n| format!("line {n}\n")).collect();
    std::fs::write(dir.join("long.txt"), &long).unwrap();
    for _ in 0..2 {
        let err = run("write_file", json!({"path": "long.txt", "content": "x\n"})).await.unwrap_err();
        assert!(err.to_string().contains("line 200\n[first 200 of 500 lines"), "{err}");
        assert!(!err.to_string().contains("line 201"), "{err}");
    }
    assert_eq!(std::fs::read_to_string(dir.join("long.txt")).unwrap(), long);
    run("read_file", json!({"path": "long.txt"})).await.unwrap();
    run("write_file", json!({"path": "long.txt", "content": "x\n"})).await.unwrap();
    let replaced = json!({"path": "tests/t.rs", "content": "// replaced\n"});
    assert!(run("write_file", replaced.clone()).await.unwrap_err().to_string().contains("drops fn "));
    run("write_file", replaced).await.unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("tests/t.rs")).unwrap(), "// replaced\n");

    let todos = json!({"todos": [
        {"id": "1", "content": "read the code", "status": "completed"},
        {"id": "2", "content": "write the test", "status": "in_progress"}]});
    assert_eq!(run("todo_write", todos).await.unwrap(), "todo list: 2 items, 1 completed");
    assert_eq!(ctx.todos.lock().unwrap()[1].status, TodoStatus::InProgress);
    assert!(run("todo_write", json!({"todos": [{"id": 1}]})).await.is_err());
}

#[tokio::test]
async fn terminal_commands_run_in_the_sandbox() {
    use caret_agent::tools::terminal::RunTerminalCmd;
    use caret_sandbox::{Bwrap, Policy};
    let dir = workspace();
    let ctx = Ctx::new(dir.path()).unwrap();
    let sandbox = Bwrap::new(Policy::new(dir.path()).unwrap()).expect("bubblewrap (Debian: bubblewrap)");
    let tool = RunTerminalCmd::new(Arc::new(sandbox));
    let out =
        tool.call(json!({"command": "wc -l < src/lib.rs && touch made && echo oops >&2; exit 3"}), &ctx).await.unwrap();
    assert!(out.starts_with("exit code 3 ("), "{out}");
    assert!(out.contains("stdout:\n7\n") && out.contains("stderr:\noops\n"), "{out}");
    assert!(dir.join("made").exists());
    let out = tool.call(json!({"command": "pwd", "cwd": "src"}), &ctx).await.unwrap();
    assert!(out.trim_end().ends_with("/src"), "{out}");
    let out = tool.call(json!({"command": "sleep 5", "timeout_s": 1}), &ctx).await.unwrap();
    assert!(out.starts_with("killed after 1 s (timeout)"), "{out}");
    assert!(
        tool.call(json!({"command": "ls", "cwd": "../.."}), &ctx).await.unwrap_err().to_string().contains("outside")
    );
}

#[tokio::test]
async fn lints_come_from_the_projects_own_linters_in_the_sandbox() {
    use caret_agent::tools::lints::ReadLints;
    use caret_sandbox::{Bwrap, Policy};
    let dir = TempDir::new();
    dir.write("Cargo.toml", "[package]\nname = \"linted\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n");
    dir.write("src/lib.rs", "pub fn f() -> u32 {\n    let unused = 1;\n    2\n}\n");
    dir.write("tools/gen.py", "def g(:\n    pass\n");
    dir.write("ok.py", "print('fine')\n");
    let ctx = Ctx::new(dir.path()).unwrap();
    // The toolchain lives in the home, which the sandbox hides: exposed read-only.
    let sandbox = Bwrap::new(Policy::new(dir.path()).unwrap().with_toolchains()).unwrap();
    let tool = ReadLints::new(Arc::new(sandbox));
    let out = tool.call(json!({}), &ctx).await.unwrap();
    assert!(out.contains("src/lib.rs:2:9: warning: unused variable: `unused`"), "{out}");
    assert!(out.contains("tools/gen.py:1:7: error:"), "{out}");
    assert!(!out.contains("ok.py"), "{out}");
    // Only some paths.
    let out = tool.call(json!({"paths": ["tools"]}), &ctx).await.unwrap();
    assert!(out.contains("tools/gen.py") && !out.contains("src/lib.rs"), "{out}");
    assert!(tool.call(json!({"paths": ["../x"]}), &ctx).await.is_err());
    // A broken manifest: the linter's own words.
    dir.write("Cargo.toml", "[package\n");
    let out = tool.call(json!({"paths": ["src"]}), &ctx).await.unwrap();
    assert!(out.contains("without diagnostics") && out.contains("Cargo.toml"), "{out}");
}

#[tokio::test]
async fn background_commands_are_watched_and_stopped() {
    use caret_agent::tools::terminal::RunTerminalCmd;
    use caret_sandbox::{Bwrap, Policy};
    let dir = workspace();
    let ctx = Ctx::new(dir.path()).unwrap();
    let tool = RunTerminalCmd::new(Arc::new(Bwrap::new(Policy::new(dir.path()).unwrap()).unwrap()));
    let out =
        tool.call(json!({"command": "echo serving; sleep 2; touch late", "background": true}), &ctx).await.unwrap();
    assert!(out.starts_with("started background job 1 "), "{out}");
    let look = |args: Value| {
        let (tool, ctx) = (&tool, &ctx);
        async move { tool.call(args, ctx).await.unwrap() }
    };
    // Its output shows while it runs.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = look(json!({"job": 1})).await;
    while !out.contains("serving\n") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        out = look(json!({"job": 1})).await;
    }
    assert!(out.contains("running for") && out.contains("serving\n"), "{out}");
    let out = look(json!({"job": 1, "kill": true})).await;
    assert!(out.contains("stopped (killed on request)"), "{out}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!dir.join("late").exists(), "the killed job's processes died with it");
    assert!(look(json!({"job": 1})).await.contains("stopped"));

    // A job that ends by itself says how.
    let out = tool.call(json!({"command": "echo done; exit 4", "background": true}), &ctx).await.unwrap();
    assert!(out.starts_with("started background job 2 "), "{out}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = look(json!({"job": 2})).await;
    while out.contains("running") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        out = look(json!({"job": 2})).await;
    }
    assert!(out.contains("ended: exit code 4") && out.contains("done\n"), "{out}");
    assert!(look(json!({"job": 2})).await.contains("ended: exit code 4"), "asked again");
    assert!(tool.call(json!({"job": 9}), &ctx).await.unwrap_err().to_string().contains("no background job 9"));
}
