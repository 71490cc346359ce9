//! A `PreToolUse` hook's round trip as a session pays it: start the hook's process, write the
//! call's JSON to its stdin, read its JSON answer, decide — for a bash hook and a Python hook
//! (each run 200 times, then one with three hooks of the event at once). Prints p50 and p95.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use caret_agent::hooks::{Dialect, Hooks, LocalShell, Moment, files};
use serde_json::json;

fn quantiles(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    (at(0.5), at(0.95))
}

fn main() {
    let dir = std::env::temp_dir().join(format!("caret-hooks-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The interpreter itself, not a version manager's shim in front of it (pyenv's costs ~90 ms).
    let interpreter = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "python3".into());
    let python = format!(
        r#"{interpreter} -c 'import json,sys; e=json.load(sys.stdin); print(json.dumps({{"hookSpecificOutput": {{"hookEventName": "PreToolUse", "permissionDecision": "allow"}}}}))'"#
    );
    let bash = r#"input=$(cat); case "$input" in *'rm -rf'*) echo no >&2; exit 2;; esac; echo '{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow"}}'"#;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let input = json!({"command": "cargo test --workspace", "timeout_s": 120});
    let moment = Moment::PreToolUse { tool: "run_terminal_cmd", id: "c1", input: &input };
    println!(
        "PreToolUse hook round trip (spawn + JSON in + JSON out), {} CPUs:",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for (what, commands) in
        [("bash", vec![bash]), ("python3", vec![python.as_str()]), ("3 bash hooks at once", vec![bash, bash, bash])]
    {
        let hooks: Vec<_> = commands.iter().map(|c| json!({"type": "command", "command": c})).collect();
        let text = json!({"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": hooks}]}}).to_string();
        let (parsed, problems) = files::parse_claude(&text, "bench", Dialect::Claude);
        assert!(problems.is_empty());
        let hooks = Hooks::new(parsed, &dir, Arc::new(LocalShell));
        let mut took = Vec::new();
        for i in 0..210 {
            let started = Instant::now();
            let (verdict, runs) = rt.block_on(hooks.run(&moment));
            assert_eq!(runs.len(), commands.len());
            assert_eq!(verdict.decision, caret_agent::hooks::Decision::Allow);
            // The first few warm the page cache.
            if i >= 10 {
                took.push(started.elapsed());
            }
        }
        let (p50, p95) = quantiles(took);
        println!("  {what:<22} p50 {p50:6.2} ms   p95 {p95:6.2} ms   (200 runs)");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
