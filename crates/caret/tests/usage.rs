//! Opt-in usage telemetry end to end: a server that collects writes per-tenant hourly files
//! to its object store (searches, Tab, chat, and an editor's Tab suggestions shown and
//! accepted, reported by `caret lsp`), `caret admin usage` sums them, nothing of the code,
//! paths, queries or prompts is in them — and with collection off there are no files and the
//! editor stops reporting.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use caret_test_support::TempDir;
use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
use serde_json::{Value, json};

#[path = "common/server.rs"]
mod harness;
use harness::{Client, Server, http};

const CANARY: &str = "zqusagecanary9182";

/// Every file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// An editor session against `server`: one Tab suggestion, accepted; then shutdown and exit.
/// Returns the suggestion item.
fn editor_accepts_a_suggestion(server: &Server, token: &str, home: &Path) -> Value {
    let mut lsp = Command::new(env!("CARGO_BIN_EXE_caret"))
        .args(["lsp", "--server", &server.url, "--token", token])
        .env("CARET_HOME", home)
        .env("CARET_USAGE_SHARE", "on")
        .env_remove("CARET_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = lsp.stdin.take().unwrap();
    let mut stdout = BufReader::new(lsp.stdout.take().unwrap());
    let mut send = |msg: Value| {
        let body = msg.to_string();
        write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        stdin.flush().unwrap();
    };
    let mut answer = |id: u64| loop {
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
        let m: Value = serde_json::from_slice(&body).unwrap();
        if m["id"] == id && m.get("method").is_none() {
            return m;
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"initializationOptions": {"debounce_ms": 0}}}),
    );
    let init = answer(1);
    let commands = &init["result"]["capabilities"]["executeCommandProvider"]["commands"];
    assert!(commands.as_array().unwrap().contains(&json!("caret.tabAccepted")), "{init}");
    let uri = format!("file:///w/{CANARY}.py");
    let text = format!("def {CANARY}(a, b):\n    total = int()\n    return total\n");
    send(
        json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}}}),
    );
    send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "textDocument/inlineCompletion", "params": {"textDocument": {"uri": uri}, "position": {"line": 1, "character": 16}, "context": {"triggerKind": 2}}}),
    );
    let item = answer(2)["result"]["items"][0].clone();
    assert_eq!(item["insertText"], "a + b", "{item}");
    // The editor runs the item's command when the user accepts it.
    send(json!({"jsonrpc": "2.0", "id": 3, "method": "workspace/executeCommand", "params": item["command"].clone()}));
    assert!(answer(3)["result"].is_null());
    // A rename's next edit offered, then applied (the editor runs `caret.nextEditAccepted`).
    send(json!({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {
        "textDocument": {"uri": uri, "version": 2},
        "contentChanges": [{"range": {"start": {"line": 1, "character": 4}, "end": {"line": 1, "character": 9}}, "text": "t"}]}}));
    send(
        json!({"jsonrpc": "2.0", "id": 4, "method": "caret/nextEdit", "params": {"textDocument": {"uri": uri}, "position": {"line": 1, "character": 5}}}),
    );
    let next = answer(4)["result"].clone();
    assert_eq!((next["newText"].as_str(), next["range"]["start"]["line"].as_u64()), (Some("t"), Some(2)), "{next}");
    send(
        json!({"jsonrpc": "2.0", "id": 5, "method": "workspace/executeCommand", "params": {"command": "caret.nextEditAccepted"}}),
    );
    assert!(answer(5)["result"].is_null());
    send(json!({"jsonrpc": "2.0", "id": 6, "method": "shutdown"}));
    assert!(answer(6)["result"].is_null());
    send(json!({"jsonrpc": "2.0", "method": "exit"}));
    assert!(lsp.wait().unwrap().success());
    item
}

/// `caret admin usage` on a stopped server's data.
fn admin_usage(data: &TempDir, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_caret"))
        .args(["admin", "usage", "--data-dir", data.join("srv").to_str().unwrap()])
        .args(args)
        .env("CARET_HOME", data.join("home"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A sync, two searches, a chat call, a Tab request and an editor's accepted suggestion.
fn use_everything(server: &Server, token: &str, up: &ScriptedUpstream) {
    let client = Client::new();
    let dir = TempDir::new();
    dir.write(format!("src/{CANARY}_module.rs"), &format!("/// {CANARY} helper.\npub fn {CANARY}_fn() {{}}\n"));
    client.sync(dir.path(), server, token);
    for _ in 0..2 {
        let q = format!("where is {CANARY}_fn");
        let out = client
            .run(&["search", "-C", dir.path().to_str().unwrap(), &q, "--server", &server.url, "--token", token], &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let r = http()
        .post(format!("{}/v1/chat/completions", server.url))
        .bearer_auth(token)
        .json(&json!({"model": "chat", "messages": [{"role": "user", "content": format!("explain {CANARY}")}]}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = format!("def {CANARY}(a, b):\n    total = int()\n");
    let r = http()
        .post(format!("{}/v1/complete", server.url))
        .bearer_auth(token)
        .json(&json!({"text": text, "cursor": text.find("int(").unwrap() + 4, "path": "m.py"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    up.set(Behaviour { answer: Some("a + b".to_owned()), ..Behaviour::default() });
    editor_accepts_a_suggestion(server, token, &server.data.join("lsp-home"));
}

#[test]
fn usage_is_written_per_tenant_and_hour_summarised_and_absent_when_off() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("m"));
    up.set(Behaviour { answer: Some("a + b".to_owned()), ..Behaviour::default() });
    let config = format!(
        "[[models]]\nalias = \"chat\"\ndeployments = [{{ provider = \"openai\", url = \"{0}\", model = \"m\" }}]\n\
         [[models]]\nalias = \"tab\"\ndeployments = [{{ provider = \"openai\", url = \"{0}\", model = \"m\" }}]\n",
        up.url
    );

    // Collected.
    let data = TempDir::new();
    data.write("home/config.toml", &config);
    let server = Server::spawn_env(data, &[], &[], &[("CARET_USAGE_COLLECT", "on")]);
    let token = server.tenant("usage");
    // A report of events editors may not send is refused whole.
    let bad = http()
        .post(format!("{}/v1/usage", server.url))
        .bearer_auth(&token)
        .json(&json!({"events": [{"event": "tab.shown", "ms": 5.0}, {"event": "search"}]}))
        .send()
        .unwrap();
    assert_eq!(bad.status(), 400);
    let unauthenticated = http().post(format!("{}/v1/usage", server.url)).json(&json!({"events": []})).send().unwrap();
    assert_eq!(unauthenticated.status(), 401);
    use_everything(&server, &token, &up);
    // A person of an organisation: their events are counted as theirs (by their opaque id).
    let ada = server.admin(&["admin", "bootstrap", "--organisation", "people", "--email", "ada@people.example"]);
    for _ in 0..2 {
        let hi = json!({"model": "chat", "messages": [{"role": "user", "content": format!("explain {CANARY}")}]});
        let r = http().post(format!("{}/v1/chat/completions", server.url)).bearer_auth(&ada).json(&hi).send().unwrap();
        assert_eq!(r.status(), 200);
    }
    // Stopping writes the last sums.
    let (data, _) = server.stop();
    let files = files_under(&data.join("srv/objects/usage"));
    assert!(!files.is_empty(), "no usage files");
    for f in &files {
        let name = f.strip_prefix(data.join("srv/objects")).unwrap().to_str().unwrap().to_owned();
        let parts: Vec<&str> = name.split('/').collect();
        assert!(parts.len() == 4 && parts[3].ends_with(".jsonl.gz"), "{name}");
        assert!(caret_usage::parse_hour(parts[2]).is_some(), "an hour in {name}");
        let mut text = String::new();
        flate2::read::GzDecoder::new(&std::fs::read(f).unwrap()[..]).read_to_string(&mut text).unwrap();
        assert!(!text.contains(CANARY) && !text.contains("src/") && !text.contains(".py"), "{text}");
        assert!(!text.contains("ada@"), "a person is their id, never their email: {text}");
    }
    let report: Value = serde_json::from_str(&admin_usage(&data, &["--json", "--since", "2h"])).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let count_of = |tenant: &str, event: &str| -> u64 {
        let of = |r: &&Value| r["event"] == event && r["tenant"].as_str().unwrap().starts_with(tenant);
        rows.iter().filter(of).map(|r| r["count"].as_u64().unwrap()).sum()
    };
    let count = |event: &str| count_of("usage-", event);
    assert_eq!(count("search"), 2, "{report:#}");
    assert_eq!(count("chat"), 1, "{report:#}");
    assert_eq!(count_of("people", "chat"), 2, "the organisation's own: {report:#}");
    assert!(count("tab") >= 2, "the Tab request and the editor's: {report:#}");
    assert_eq!((count("tab.shown"), count("tab.accepted")), (1, 1), "{report:#}");
    assert_eq!((count("next_edit.shown"), count("next_edit.accepted")), (1, 1), "{report:#}");
    // The `usage-…` tenant's chat row, found by the tenant's name (the organisation's own
    // chats are another row, in either order).
    let chat = rows
        .iter()
        .find(|r| r["event"] == "chat" && r["tenant"].as_str().is_some_and(|t| t.starts_with("usage-")))
        .unwrap_or_else(|| panic!("tenants by name: no chat row of the usage tenant: {report:#}"));
    assert_eq!(chat["label"], "chat");
    assert!(chat["p50_ms"].as_f64().unwrap() > 0.0);
    for kind in ["tab_acceptance", "next_edit_acceptance"] {
        let acceptance = report[kind].as_object().unwrap();
        assert_eq!(acceptance.values().next().unwrap()["rate"], 1.0, "{kind}: {report:#}");
    }
    let table = admin_usage(&data, &[]);
    assert!(table.contains("Tab suggestions accepted 1 of 1 shown (100.0%)"), "{table}");
    let out = Command::new(env!("CARGO_BIN_EXE_caret"))
        .args(["admin", "usage", "--since", "last week", "--data-dir", data.join("srv").to_str().unwrap()])
        .env("CARET_HOME", data.join("home"))
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--since"));
    // The organisation's admin sees what each person did (counts only), by email.
    let server = Server::spawn_env(data, &[], &[], &[("CARET_USAGE_COLLECT", "on")]);
    let report: Value =
        http().get(format!("{}/v1/admin/usage", server.url)).bearer_auth(&ada).send().unwrap().json().unwrap();
    let activity = report["activity"].as_array().unwrap();
    let chats: Vec<&Value> = activity.iter().filter(|a| a["event"] == "chat").collect();
    assert_eq!(chats.len(), 1, "{report:#}");
    assert_eq!((chats[0]["email"].as_str(), chats[0]["count"].as_u64()), (Some("ada@people.example"), Some(2)));
    assert!(activity.iter().all(|a| a["email"] == "ada@people.example"), "another tenant's usage: {report:#}");
    drop(server);

    // Not collected: no files, and the editor is told so.
    let off = TempDir::new();
    off.write("home/config.toml", &config);
    let server = Server::spawn_env(off, &[], &[], &[("CARET_USAGE_COLLECT", "off")]);
    let token = server.tenant("quiet");
    let r = http()
        .post(format!("{}/v1/usage", server.url))
        .bearer_auth(&token)
        .json(&json!({"events": [{"event": "tab.accepted"}]}))
        .send()
        .unwrap();
    assert_eq!(r.json::<Value>().unwrap(), json!({"recorded": 0, "collecting": false}));
    use_everything(&server, &token, &up);
    let (off, _) = server.stop();
    assert!(files_under(&off.join("srv/objects/usage")).is_empty());
    assert!(admin_usage(&off, &[]).contains("no usage since"));
}
