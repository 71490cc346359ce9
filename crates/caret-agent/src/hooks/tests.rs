//! Hooks run for real: bash and Python scripts that log what they are given and decide.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;

struct Repo {
    dir: caret_test_support::TempDir,
}

impl Repo {
    fn new() -> Repo {
        let dir = caret_test_support::TempDir::new();
        dir.write("src/lib.rs", "pub fn a() {}\n");
        Repo { dir }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Hooks from a file of `dialect` written as `text` (problems refused).
    fn hooks(&self, dialect: Dialect, text: &str) -> Hooks {
        let (hooks, problems) = match dialect {
            Dialect::Cursor => files::parse_cursor(text, "hooks.json"),
            _ => files::parse_claude(text, "settings.json", dialect),
        };
        assert!(problems.is_empty(), "{problems:?}");
        let mut h = Hooks::new(hooks, self.root(), Arc::new(LocalShell));
        h.session = "s-1".into();
        h
    }

    fn script(&self, name: &str, body: &str) -> String {
        self.dir.write(name, body);
        let path = self.root().join(name);
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    }

    fn log(&self) -> Vec<Value> {
        std::fs::read_to_string(self.root().join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn claude(event: &str, matcher: &str, command: &str) -> String {
    json!({"hooks": {event: [{"matcher": matcher, "hooks": [{"type": "command", "command": command, "timeout": 5}]}]}})
        .to_string()
}

fn bash_call() -> Value {
    json!({"command": "rm -rf build", "timeout_s": 30})
}

#[tokio::test]
async fn a_claude_code_hook_blocks_a_command_by_its_exit_code_and_sees_claudes_names() {
    let repo = Repo::new();
    // Claude Code's documented example shape: read the payload, refuse `rm -rf`.
    let guard = repo.script(
        "guard.sh",
        "#!/bin/bash\ninput=$(cat)\necho \"$input\" >> \"$CLAUDE_PROJECT_DIR/calls.log\"\n\
         if echo \"$input\" | grep -q 'rm -rf'; then echo 'no recursive deletes here' >&2; exit 2; fi\n",
    );
    let hooks = repo.hooks(Dialect::Claude, &claude("PreToolUse", "Bash", &guard));
    let input = bash_call();
    let (verdict, runs) = hooks.run(&Moment::PreToolUse { tool: "run_terminal_cmd", id: "c1", input: &input }).await;
    assert_eq!(verdict.decision, Decision::Block("no recursive deletes here".into()));
    assert_eq!((runs.len(), runs[0].decision.as_str()), (1, "block"));
    let seen = &repo.log()[0];
    assert_eq!(seen["hook_event_name"], "PreToolUse");
    assert_eq!(seen["tool_name"], "Bash");
    assert_eq!(seen["tool_input"], json!({"command": "rm -rf build", "timeout": 30000}));
    assert_eq!((seen["session_id"].as_str(), seen["tool_use_id"].as_str()), (Some("s-1"), Some("c1")));
    // Not its tool: it does not run.
    let read = json!({"path": "src/lib.rs"});
    let (verdict, runs) = hooks.run(&Moment::PreToolUse { tool: "read_file", id: "c2", input: &read }).await;
    assert_eq!((verdict.decision, runs.len()), (Decision::Pass, 0));
}

#[tokio::test]
async fn a_python_hook_answers_in_json_allowing_denying_or_changing_the_input() {
    let repo = Repo::new();
    let decide = repo.script(
        "decide.py",
        r#"#!/usr/bin/env python3
import json, sys
event = json.load(sys.stdin)
command = event["tool_input"].get("command", "")
if command.startswith("curl"):
    out = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
           "permissionDecisionReason": "no network from the agent"}}
elif command.startswith("npm"):
    out = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow",
           "updatedInput": {"command": "pnpm" + command[3:], "timeout": 5000}}}
elif command.startswith("git push"):
    out = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "ask",
           "permissionDecisionReason": "pushes are checked"}, "systemMessage": "asked about a push"}
else:
    out = {}
print(json.dumps(out))
"#,
    );
    let hooks = repo.hooks(Dialect::Claude, &claude("PreToolUse", "Bash", &format!("python3 {decide}")));
    let run = |command: &str| {
        let input = json!({"command": command});
        let hooks = &hooks;
        async move { hooks.run(&Moment::PreToolUse { tool: "run_terminal_cmd", id: "c", input: &input }).await.0 }
    };
    assert_eq!(run("curl https://x.example").await.decision, Decision::Block("no network from the agent".into()));
    let npm = run("npm test").await;
    assert_eq!(npm.decision, Decision::Allow);
    assert_eq!(npm.input, Some(json!({"command": "pnpm test", "timeout_s": 5})), "back in Caret's arguments");
    let push = run("git push").await;
    assert_eq!(
        (push.decision, push.notes),
        (Decision::Ask("pushes are checked".into()), vec!["asked about a push".into()])
    );
    assert_eq!(run("ls").await.decision, Decision::Pass);
}

#[tokio::test]
async fn hooks_that_hang_flood_or_die_decide_nothing_and_say_why() {
    let repo = Repo::new();
    let text = json!({"hooks": {"PreToolUse": [{"hooks": [
        {"type": "command", "command": "sleep 30", "timeout": 0.3},
        {"type": "command", "command": "head -c 10485760 /dev/zero | tr '\\0' x; exit 0"},
        {"type": "command", "command": "kill -9 $$"},
        {"type": "command", "command": "echo broken >&2; exit 1"},
        {"type": "command", "command": "/no/such/hook"}
    ]}]}})
    .to_string();
    let hooks = repo.hooks(Dialect::Caret, &text);
    let input = bash_call();
    let started = std::time::Instant::now();
    let (verdict, runs) = hooks.run(&Moment::PreToolUse { tool: "run_terminal_cmd", id: "c", input: &input }).await;
    assert!(started.elapsed() < Duration::from_secs(10), "the hung hook held things up: {:?}", started.elapsed());
    assert_eq!(verdict.decision, Decision::Pass);
    let said: Vec<String> =
        runs.iter().map(|r| format!("{} {}", r.decision, r.message.clone().unwrap_or_default())).collect();
    assert!(said[0].starts_with("error still running after 0.3 s"), "{said:?}");
    assert!(said[1].contains("was cut"), "{said:?}");
    assert!(said[2].starts_with("error killed by signal 9"), "{said:?}");
    assert!(said[3].starts_with("error exited with 1: broken"), "{said:?}");
    assert!(said[4].starts_with("error exited with 127"), "{said:?}");
}

#[tokio::test]
async fn prompt_stop_and_post_tool_hooks_add_context_refuse_or_go_on() {
    let repo = Repo::new();
    let text = json!({"hooks": {
        "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "cat > /dev/null; echo 'The team uses pnpm.'"}]}],
        "PostToolUse": [{"matcher": "Edit|Write", "hooks": [{"type": "command",
            "command": "cat > /dev/null; echo '{\"decision\": \"block\", \"reason\": \"run the formatter\", \"hookSpecificOutput\": {\"hookEventName\": \"PostToolUse\", \"additionalContext\": \"formatted with rustfmt\"}}'"}]}],
        "Stop": [{"hooks": [{"type": "command",
            "command": "python3 -c \"import json,sys; e=json.load(sys.stdin); print(json.dumps({} if e['stop_hook_active'] else {'decision': 'block', 'reason': 'the tests were not run'}))\""}]}]
    }})
    .to_string();
    let hooks = repo.hooks(Dialect::Claude, &text);
    let (v, _) = hooks.run(&Moment::UserPromptSubmit("add a test")).await;
    assert_eq!((v.decision, v.context), (Decision::Pass, vec!["The team uses pnpm.".to_owned()]));
    let input = json!({"path": "a.md", "content": "x"});
    let post = Moment::PostToolUse {
        tool: "write_file",
        id: "c",
        input: &input,
        output: "wrote",
        ok: true,
        duration: Duration::ZERO,
    };
    let (v, _) = hooks.run(&post).await;
    assert_eq!(v.decision, Decision::Block("run the formatter".into()));
    assert_eq!(v.context, vec!["formatted with rustfmt".to_owned()]);
    let (first, _) = hooks.run(&Moment::Stop { active: false, loops: 0 }).await;
    assert_eq!(first.decision, Decision::Block("the tests were not run".into()));
    let (again, _) = hooks.run(&Moment::Stop { active: true, loops: 1 }).await;
    assert_eq!(again.decision, Decision::Pass);
}

#[tokio::test]
async fn a_cursor_hook_gets_cursors_payload_and_its_permission_counts() {
    let repo = Repo::new();
    let guard = repo.script(
        "cursor-guard.sh",
        "#!/bin/bash\ninput=$(cat)\necho \"$input\" >> \"$CURSOR_PROJECT_DIR/calls.log\"\n\
         echo '{\"permission\": \"deny\", \"user_message\": \"blocked\", \"agent_message\": \"use the make target\"}'\n",
    );
    let text = json!({"version": 1, "hooks": {"beforeShellExecution": [{"command": guard}],
        "beforeReadFile": [{"command": format!("{guard} >/dev/null; echo '{{\"permission\": \"allow\"}}'")}]}})
    .to_string();
    let hooks = repo.hooks(Dialect::Cursor, &text);
    let input = bash_call();
    let (v, _) = hooks.run(&Moment::PreToolUse { tool: "run_terminal_cmd", id: "c", input: &input }).await;
    assert_eq!(v.decision, Decision::Block("use the make target".into()));
    assert_eq!(v.notes, vec!["blocked".to_owned()]);
    let read = json!({"path": "src/lib.rs"});
    let (v, _) = hooks.run(&Moment::PreToolUse { tool: "read_file", id: "c", input: &read }).await;
    assert_eq!(v.decision, Decision::Allow);
    let log = repo.log();
    assert_eq!(log[0]["hook_event_name"], "beforeShellExecution");
    assert_eq!(log[0]["command"], "rm -rf build");
    assert_eq!(log[0]["workspace_roots"][0], repo.root().display().to_string());
    assert_eq!(log[1]["hook_event_name"], "beforeReadFile");
    assert_eq!(log[1]["content"], "pub fn a() {}\n", "Cursor's hook sees the file");
}
