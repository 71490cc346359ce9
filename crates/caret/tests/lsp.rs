//! `caret lsp` driven by a scripted client over stdio: initialize, open, edit, request,
//! supersede, cancel, shut down.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use caret_test_support::TempDir;
use serde_json::{Value, json};

struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Messages read while waiting for another.
    seen: Vec<Value>,
}

impl Client {
    fn start(home: &TempDir) -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_caret"))
            .arg("lsp")
            .env("CARET_HOME", home.join("caret-home"))
            .env("HOME", home.path())
            .env_remove("CARET_CONFIG")
            .env_remove("CARET_SERVER")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting caret lsp");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Client { child, stdin, stdout, seen: Vec::new() }
    }

    fn send(&mut self, msg: Value) {
        let body = msg.to_string();
        write!(self.stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        self.stdin.flush().unwrap();
    }

    fn request(&mut self, id: u64, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    fn read(&mut self) -> Value {
        let mut length = 0;
        loop {
            let mut line = String::new();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "the server closed its output");
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some(v) = line.strip_prefix("Content-Length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        self.stdout.read_exact(&mut body).unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    /// `textDocument/didOpen` of a Python file.
    fn open(&mut self, uri: &str, text: &str) {
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}}),
        );
    }

    /// `textDocument/didChange`: `text` over line `line`'s characters `from..to`.
    fn change(&mut self, uri: &str, version: u64, (line, from, to): (u64, u64, u64), text: &str) {
        self.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": [{
                "range": {"start": {"line": line, "character": from}, "end": {"line": line, "character": to}},
                "text": text}]}),
        );
    }

    /// `shutdown` (as request `id`), `exit`, and a clean end.
    fn finish(mut self, id: u64) {
        self.request(id, "shutdown", Value::Null);
        assert!(self.answer(id)["result"].is_null());
        self.notify("exit", Value::Null);
        assert!(self.child.wait().unwrap().success());
    }

    /// The answer to request `id` (other messages are kept in `seen`).
    fn answer(&mut self, id: u64) -> Value {
        if let Some(i) = self.seen.iter().position(|m| m["id"] == id) {
            return self.seen.remove(i);
        }
        loop {
            let m = self.read();
            if m["id"] == id && m.get("method").is_none() {
                return m;
            }
            self.seen.push(m);
        }
    }
}

fn position(line: u64, character: u64, uri: &str) -> Value {
    json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": character}})
}

#[test]
fn a_scripted_editor_session() {
    let home = TempDir::new();
    let uri = "file:///w/calc.py";
    let model = caret_test_support::models::TestModel::SmallLlm.dir();
    if let Some(m) = &model {
        home.write(
            "caret-home/config.toml",
            &format!(
                "[[models]]\nalias = \"tab\"\ndeployments = [{{ provider = \"local\", model = {:?}, context_tokens = 1024 }}]\n",
                m.to_string_lossy()
            ),
        );
    } else {
        caret_test_support::skip(
            "the small chat model is not installed (CARET_TEST_LLM_DIR): the session runs without a model",
        );
    }
    let mut c = Client::start(&home);
    c.request(1, "initialize", json!({"capabilities": {}, "initializationOptions": {"debounce_ms": 0}}));
    let init = c.answer(1);
    let caps = &init["result"]["capabilities"];
    assert_eq!(caps["textDocumentSync"]["change"], 2, "{init}");
    assert!(caps.get("inlineCompletionProvider").is_some() && caps.get("completionProvider").is_some());
    c.notify("initialized", json!({}));
    c.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "python", "version": 1,
        "text": "def add(a, b):\n    return a + b\n\ntotal = \n"}}),
    );
    // Incremental edit: `total = ` becomes `total = add(`.
    c.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri, "version": 2}, "contentChanges": [
        {"range": {"start": {"line": 3, "character": 8}, "end": {"line": 3, "character": 8}}, "text": "add("}]}),
    );
    // An unknown method is an error, not a crash.
    c.request(2, "workspace/unknownThing", json!({}));
    assert_eq!(c.answer(2)["error"]["code"], -32601);

    c.request(3, "textDocument/inlineCompletion", position(3, 12, uri));
    let a = c.answer(3);
    let items = a["result"]["items"].as_array().unwrap_or_else(|| panic!("{a}"));
    if model.is_some() {
        // A suggestion for the rest of the line, placed at the cursor.
        let item = &items[0];
        assert!(!item["insertText"].as_str().unwrap().contains('\n'), "{a}");
        assert_eq!(item["range"]["start"], json!({"line": 3, "character": 12}));
        // The fallback completion item carries the same text as an edit.
        c.request(4, "textDocument/completion", position(3, 12, uri));
        let b = c.answer(4);
        assert_eq!(b["result"]["items"][0]["textEdit"]["newText"], item["insertText"], "{b}");
        // A second request for the document supersedes the first; a cancelled one is
        // answered as cancelled.
        c.request(5, "textDocument/inlineCompletion", position(1, 4, uri));
        // (Neither is in the typed-ahead cache, so both wait for the model.)
        c.request(6, "textDocument/inlineCompletion", position(1, 10, uri));
        c.notify("$/cancelRequest", json!({"id": 6}));
        let five = c.answer(5);
        assert_eq!(five["error"]["code"], -32800, "{five}");
        assert_eq!(c.answer(6)["error"]["code"], -32800);
    } else {
        assert!(items.is_empty());
        assert!(c.seen.iter().any(|m| m["method"] == "window/showMessage"), "{:?}", c.seen);
    }
    c.request(7, "shutdown", Value::Null);
    assert!(c.answer(7)["result"].is_null());
    c.notify("exit", Value::Null);
    let status = c.child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// `workspace/executeCommand`: `caret.apply` turns an edit into a `workspace/applyEdit` of the
/// changed lines only (a file that is not open is read from disk); `caret.search` searches the
/// synced workspace and answers with URIs the editor can open.
#[test]
fn commands_apply_edits_and_search_the_workspace() {
    let home = TempDir::new();
    home.write(
        "ws/src/shapes.py",
        "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n",
    );
    home.write("ws/notes.md", "# shapes\n\nAreas and perimeters of rectangles.\n");
    let ws = std::fs::canonicalize(home.join("ws")).unwrap();
    let synced = Command::new(env!("CARGO_BIN_EXE_caret"))
        .arg("sync")
        .arg(&ws)
        .env("CARET_HOME", home.join("caret-home"))
        .env("HOME", home.path())
        .env_remove("CARET_CONFIG")
        .env_remove("CARET_SERVER")
        .output()
        .unwrap();
    assert!(synced.status.success(), "{}", String::from_utf8_lossy(&synced.stderr));

    let mut c = Client::start(&home);
    let root = format!("file://{}", ws.display());
    c.request(1, "initialize", json!({"capabilities": {}, "workspaceFolders": [{"uri": root, "name": "ws"}]}));
    let init = c.answer(1);
    assert_eq!(
        init["result"]["capabilities"]["executeCommandProvider"]["commands"],
        json!(["caret.search", "caret.apply", "caret.tabAccepted", "caret.nextEditAccepted"]),
        "{init}"
    );
    let uri = format!("{root}/src/shapes.py");
    let edit = "<<<<<<< SEARCH\n    return 2 * (w + h)\n=======\n    return 2 * w + 2 * h\n>>>>>>> REPLACE\n";
    c.request(
        2,
        "workspace/executeCommand",
        json!({"command": "caret.apply", "arguments": [{"uri": uri, "edit": edit}]}),
    );
    let ask = loop {
        let m = c.read();
        if m["method"] == "workspace/applyEdit" {
            break m;
        }
        c.seen.push(m);
    };
    let change = &ask["params"]["edit"]["changes"][&uri][0];
    assert_eq!(
        change["range"],
        json!({"start": {"line": 5, "character": 0}, "end": {"line": 6, "character": 0}}),
        "{ask}"
    );
    assert_eq!(change["newText"], "    return 2 * w + 2 * h\n");
    c.send(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"applied": true}}));
    let done = c.answer(2);
    assert_eq!(
        (done["result"]["changed"].as_bool(), done["result"]["format"].as_str()),
        (Some(true), Some("search-replace"))
    );
    // The client's answer to the server's request is not mistaken for a request.
    assert!(!c.seen.iter().any(|m| m["error"]["code"] == -32601), "{:?}", c.seen);

    // An edit that does not fit says so, and nothing is sent to apply.
    let stray = "<<<<<<< SEARCH\n    return w / h\n=======\n    return h\n>>>>>>> REPLACE\n";
    c.request(
        3,
        "workspace/executeCommand",
        json!({"command": "caret.apply", "arguments": [{"uri": uri, "edit": stray}]}),
    );
    let refused = c.answer(3);
    assert!(refused["error"]["message"].as_str().unwrap().contains("no place in the file matches"), "{refused}");

    c.request(
        4,
        "workspace/executeCommand",
        json!({"command": "caret.search", "arguments": [{"query": "perimeter of a rectangle", "k": 5}]}),
    );
    let found = c.answer(4);
    let hits = found["result"]["hits"].as_array().unwrap_or_else(|| panic!("{found}"));
    let hit = hits.iter().find(|h| h["path"] == "src/shapes.py").unwrap_or_else(|| panic!("{found}"));
    assert_eq!(hit["uri"], uri);
    assert!(hit["snippet"].as_str().unwrap().contains("def perimeter"), "{hit}");

    c.request(5, "workspace/executeCommand", json!({"command": "caret.nope"}));
    assert!(c.answer(5)["error"]["message"].as_str().unwrap().contains("unknown command"));
    c.finish(6);
}

/// `caret/nextEdit`: after a rename typed keystroke by keystroke (incremental changes), the
/// next use of the old name below the cursor is the predicted edit; applied, the one after;
/// with nothing left (or nothing changed) the answer is null. Needs no model.
#[test]
fn next_edit_predicts_the_rest_of_a_rename() {
    let home = TempDir::new();
    let mut c = Client::start(&home);
    c.request(1, "initialize", json!({"capabilities": {}}));
    let init = c.answer(1);
    assert_eq!(init["result"]["capabilities"]["experimental"]["caretNextEdit"], true, "{init}");
    let uri = "file:///w/stats.py";
    let text = "def mean(values):\n    total = sum(values)\n    return total / len(values)\n";
    c.open(uri, text);
    c.request(2, "caret/nextEdit", position(0, 0, uri));
    assert_eq!(c.answer(2)["result"], Value::Null, "nothing edited yet");
    // `values` → `xs` in the signature: delete the word, then type the new one.
    let change = |start: u64, end: u64, text: &str, version: u64| {
        json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": [{
            "range": {"start": {"line": 0, "character": start}, "end": {"line": 0, "character": end}}, "text": text}]})
    };
    c.notify("textDocument/didChange", change(9, 15, "", 2));
    c.notify("textDocument/didChange", change(9, 9, "x", 3));
    c.notify("textDocument/didChange", change(10, 10, "s", 4));
    c.request(3, "caret/nextEdit", position(0, 11, uri));
    let next = c.answer(3)["result"].clone();
    assert_eq!(next["newText"], "xs", "{next}");
    assert_eq!(next["reason"], "repeat");
    assert_eq!(next["range"], json!({"start": {"line": 1, "character": 16}, "end": {"line": 1, "character": 22}}));
    // The editor applies it (Tab, Tab): the next one is the last use.
    c.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri, "version": 5}, "contentChanges": [{"range": next["range"], "text": "xs"}]}),
    );
    c.request(4, "caret/nextEdit", position(1, 18, uri));
    let next = c.answer(4)["result"].clone();
    assert_eq!(next["range"]["start"], json!({"line": 2, "character": 23}), "{next}");
    c.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri, "version": 6}, "contentChanges": [{"range": next["range"], "text": "xs"}]}),
    );
    c.request(5, "caret/nextEdit", position(2, 25, uri));
    assert_eq!(c.answer(5)["result"], Value::Null, "every use renamed");
    c.finish(6);
}

/// With a model served as `next-edit`, it ranks the rules' candidates: the use its rewrite
/// changes comes first, not the nearest; it is asked, not Tab's model.
#[test]
fn a_next_edit_model_ranks_the_candidates() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("ranking-model"));
    up.set(Behaviour {
        answer: Some("def mean(xs):\n    total = sum(values)\n    return total / len(xs)\n".to_owned()),
        ..Behaviour::default()
    });
    let home = TempDir::new();
    home.write(
        "caret-home/config.toml",
        &format!(
            "[[models]]\nalias = \"tab\"\ndeployments = [{{ provider = \"openai\", url = \"{0}\", model = \"fim\" }}]\n\
             [[models]]\nalias = \"next-edit\"\ndeployments = [{{ provider = \"openai\", url = \"{0}\", model = \"zeta\" }}]\n",
            up.url
        ),
    );
    let mut c = Client::start(&home);
    c.request(1, "initialize", json!({"capabilities": {}, "initializationOptions": {"debounce_ms": 0}}));
    c.answer(1);
    let uri = "file:///w/stats.py";
    let text = "def mean(values):\n    total = sum(values)\n    return total / len(values)\n";
    c.open(uri, text);
    c.change(uri, 2, (0, 9, 15), "xs");
    c.request(2, "caret/nextEdit", position(0, 11, uri));
    let next = c.answer(2)["result"].clone();
    assert_eq!((next["reason"].as_str(), next["newText"].as_str()), (Some("repeat"), Some("xs")), "{next}");
    assert_eq!(
        next["range"]["start"],
        json!({"line": 2, "character": 23}),
        "the model's pick, not the nearest: {next}"
    );
    let asked = up.chats();
    let zeta = up.last_request().map(|(_, b)| b["model"].clone());
    assert_eq!(zeta, Some(json!("zeta")), "the next-edit model ranked them ({} chats)", asked.len());
    c.finish(3);
}

/// A rename whose file has no use left goes on in another open file: the next edit names
/// that file.
#[test]
fn a_rename_goes_on_in_another_open_file() {
    let home = TempDir::new();
    let mut c = Client::start(&home);
    c.request(1, "initialize", json!({"capabilities": {}}));
    c.answer(1);
    let report = "file:///w/report.py";
    c.open(report, "from stats import mean\nprint(mean([1, 2]))\n");
    let uri = "file:///w/stats.py";
    c.open(uri, "def mean(values):\n    return sum(values) / len(values)\n");
    c.change(uri, 2, (0, 4, 8), "average");
    c.request(2, "caret/nextEdit", position(0, 11, uri));
    let next = c.answer(2)["result"].clone();
    assert_eq!(next["textDocument"]["uri"], report, "{next}");
    assert_eq!((next["newText"].as_str(), next["reason"].as_str()), (Some("average"), Some("repeat")));
    assert_eq!(next["range"], json!({"start": {"line": 0, "character": 18}, "end": {"line": 0, "character": 22}}));
    c.finish(3);
}

/// A rename with no use left in the open files goes on in the workspace: the first file on
/// disk that has one (walked as indexing walks, ignore files honoured).
#[test]
fn a_rename_goes_on_in_a_workspace_file_not_open() {
    let home = TempDir::new();
    let ws = TempDir::new();
    ws.write("stats.py", "def mean(values):\n    return sum(values) / len(values)\n");
    ws.write("app/report.py", "from stats import mean\nprint(mean([1, 2]))\n");
    ws.write("a/old.py", "mean = 1\n");
    ws.write(".gitignore", "a/\n");
    ws.git_init();
    let root = std::fs::canonicalize(ws.path()).unwrap();
    let mut c = Client::start(&home);
    let folder = format!("file://{}", root.display());
    c.request(1, "initialize", json!({"capabilities": {}, "workspaceFolders": [{"uri": folder, "name": "w"}]}));
    c.answer(1);
    let uri = format!("{folder}/stats.py");
    c.open(&uri, "def mean(values):\n    return sum(values) / len(values)\n");
    c.change(&uri, 2, (0, 4, 8), "average");
    c.request(2, "caret/nextEdit", position(0, 11, &uri));
    let next = c.answer(2)["result"].clone();
    assert_eq!(
        next["textDocument"]["uri"],
        format!("{folder}/app/report.py"),
        "not the ignored a/ (first by path): {next}"
    );
    assert_eq!(next["range"], json!({"start": {"line": 0, "character": 18}, "end": {"line": 0, "character": 22}}));
    assert_eq!(next["newText"], "average");
    c.finish(3);
}

/// A parameter added at the end of a definition's list goes to its calls: the next edit
/// inserts its name before each call's closing parenthesis.
#[test]
fn a_new_parameter_goes_to_the_calls() {
    let home = TempDir::new();
    let mut c = Client::start(&home);
    c.request(1, "initialize", json!({"capabilities": {}}));
    c.answer(1);
    let uri = "file:///w/geo.py";
    c.open(uri, "def area(w, h):\n    return w * h\n\nprint(area(3, 4))\n");
    c.change(uri, 2, (0, 13, 13), ", unit");
    c.request(2, "caret/nextEdit", position(0, 19, uri));
    let next = c.answer(2)["result"].clone();
    assert_eq!((next["newText"].as_str(), next["reason"].as_str()), (Some(", unit"), Some("insert")), "{next}");
    assert_eq!(next["range"], json!({"start": {"line": 3, "character": 15}, "end": {"line": 3, "character": 15}}));
    c.finish(3);
}

/// A name the edit brought in that the file does not import, imported by another open file:
/// the same import is the next edit, after the file's imports.
#[test]
fn a_new_names_import_is_the_next_edit() {
    let home = TempDir::new();
    let mut c = Client::start(&home);
    c.request(1, "initialize", json!({"capabilities": {}}));
    c.answer(1);
    c.open("file:///w/b.py", "import sys\nimport json\n\nprint(json.dumps({}))\n");
    let uri = "file:///w/a.py";
    c.open(uri, "import os\n\ndef load(p):\n    return open(p).read()\n");
    c.change(uri, 2, (3, 11, 25), "json.loads(open(p).read())");
    c.request(2, "caret/nextEdit", position(3, 37, uri));
    let next = c.answer(2)["result"].clone();
    assert_eq!(next["reason"], "import", "{next}");
    assert_eq!(next["newText"], "import json\n");
    assert_eq!(next["range"], json!({"start": {"line": 1, "character": 0}, "end": {"line": 1, "character": 0}}));
    c.finish(3);
}

/// An editor that knows only inline completion: when the next edit lies at the cursor, the
/// inline completion request gets it (its range and new text); elsewhere, nothing (no model
/// here). Typed keystroke by keystroke, the rename stays one edit.
#[test]
fn the_next_edit_at_the_cursor_is_an_inline_completion() {
    let home = TempDir::new();
    let mut c = Client::start(&home);
    c.request(1, "initialize", json!({"capabilities": {}}));
    c.answer(1);
    let uri = "file:///w/stats.py";
    let text = "def mean(values):\n    total = sum(values)\n    return total / len(values)\n";
    c.open(uri, text);
    let change = |line: u64, start: u64, end: u64, text: &str, version: u64| {
        json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": [{
            "range": {"start": {"line": line, "character": start}, "end": {"line": line, "character": end}}, "text": text}]})
    };
    let inline = |line: u64, character: u64| {
        let mut p = position(line, character, uri);
        p["context"] = json!({"triggerKind": 2});
        p
    };
    // Each keystroke asks for inline completions, as editors do.
    c.notify("textDocument/didChange", change(0, 9, 15, "", 2));
    c.request(2, "textDocument/inlineCompletion", inline(0, 9));
    c.notify("textDocument/didChange", change(0, 9, 9, "x", 3));
    c.request(3, "textDocument/inlineCompletion", inline(0, 10));
    c.notify("textDocument/didChange", change(0, 10, 10, "s", 4));
    c.request(4, "textDocument/inlineCompletion", inline(0, 11));
    for id in 2..=4 {
        assert_eq!(c.answer(id)["result"]["items"], json!([]), "the cursor is not at another use");
    }
    // The cursor moves onto the next use: Tab there renames it.
    c.request(5, "textDocument/inlineCompletion", inline(1, 18));
    let items = c.answer(5)["result"]["items"].clone();
    assert_eq!(
        items,
        json!([{"insertText": "xs", "range": {"start": {"line": 1, "character": 16}, "end": {"line": 1, "character": 22}}}])
    );
    // Off the use (the start of the line): nothing.
    c.request(6, "textDocument/inlineCompletion", inline(1, 0));
    assert_eq!(c.answer(6)["result"]["items"], json!([]));
    c.finish(7);
}

/// A language server whose Tab model is the scripted upstream at `url` (`extra`: more of the
/// config), initialized, with `a = 1\nb = 2\n` open as a Python file; the file's URI.
fn with_tab_model(home: &TempDir, url: &str, extra: &str) -> (Client, String) {
    home.write(
        "caret-home/config.toml",
        &format!("{extra}[[models]]\nalias = \"tab\"\ndeployments = [{{ provider = \"openai\", url = \"{url}\", model = \"m\" }}]\n"),
    );
    let mut c = Client::start(home);
    c.request(1, "initialize", json!({"capabilities": {}}));
    c.answer(1);
    let uri = "file:///w/n.py";
    c.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": "a = 1\nb = 2\n"}}),
    );
    (c, uri.to_owned())
}

/// Tab's model is asked for a next edit only under a budget: never with a zero budget, and
/// with one its calls exceed, once to measure and then not again (the editor gets the learned
/// ranker's place at once instead of waiting for a guess).
#[test]
fn next_edit_asks_the_model_only_under_a_budget() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("next-edit-model"));
    up.set(Behaviour {
        answer: Some("a = 10\nb = 20\n".to_owned()),
        delay: std::time::Duration::from_millis(400),
        ..Behaviour::default()
    });
    let ask = |budget: &str, rounds: u64| -> Vec<Value> {
        let home = TempDir::new();
        let (mut c, uri) = with_tab_model(&home, &up.url, &format!("[tab]\nnext_edit_budget_ms = {budget}\n"));
        let uri = uri.as_str();
        let mut answers = Vec::new();
        for round in 0..rounds {
            let v = 2 + round;
            // Each round types one more digit after `a = 1`, so there is a new edit to predict from.
            c.change(uri, v, (0, 5 + round, 5 + round), "0");
            c.request(v, "caret/nextEdit", position(0, 6 + round, uri));
            answers.push(c.answer(v)["result"].clone());
        }
        c.finish(100);
        answers
    };
    let before = up.requests();
    let never = ask("0", 2);
    let reasons = |answers: &[Value]| answers.iter().map(|a| a["reason"].clone()).collect::<Vec<_>>();
    assert_eq!(reasons(&never), [json!("jump"), json!("jump")], "{never:?}");
    assert_eq!(never[0]["newText"], "", "a place alone: {never:?}");
    assert_eq!(up.requests(), before, "a zero budget: no call to the model");

    let over = ask("50", 3);
    assert_eq!(over[0]["reason"], "model", "the first call measures: {over:?}");
    assert_eq!(up.requests(), before + 1, "400 ms against 50: no second call");
    assert_eq!(reasons(&over[1..]), [json!("jump"), json!("jump")], "{over:?}");

    let under = ask("5000", 2);
    assert_eq!(under[0]["reason"], "model", "{under:?}");
    assert_eq!(up.requests(), before + 3, "under budget: every call made");
}

/// With no deterministic candidate, `caret/nextEdit` asks Tab's model to rewrite the region
/// around the cursor (a Zeta-shaped prompt, the response begun at the region's marker) and
/// answers the difference as the predicted edit.
#[test]
fn next_edit_asks_the_model_when_no_candidate_fits() {
    use caret_test_support::scripted::{Behaviour, ScriptedUpstream};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("next-edit-model"));
    // The region rewritten: the model carries the change of `a` over to `b`.
    up.set(Behaviour { answer: Some("a = 10\nb = 20\n".to_owned()), ..Behaviour::default() });
    let home = TempDir::new();
    let (mut c, uri) = with_tab_model(&home, &up.url, "");
    let uri = uri.as_str();
    c.change(uri, 2, (0, 5, 5), "0");
    c.request(2, "caret/nextEdit", position(0, 6, uri));
    let next = c.answer(2)["result"].clone();
    assert_eq!(next["reason"], "model", "{next}");
    assert_eq!(next["newText"], "20");
    assert_eq!(next["range"], json!({"start": {"line": 1, "character": 4}, "end": {"line": 1, "character": 5}}));
    let (_, body) = up.last_request().unwrap();
    let prompt = body["prompt"].as_str().unwrap_or_default().to_owned();
    assert!(prompt.contains("User edited \"") && prompt.contains("-a = 1\n+a = 10\n"), "{prompt}");
    assert!(prompt.ends_with("<|editable_region_start|>\n"), "{prompt}");

    // The next keystroke cancels a prediction still being written: answered as superseded,
    // never as an edit to apply.
    up.set(Behaviour {
        answer: Some("a = 100\nb = 200\n".to_owned()),
        delay: std::time::Duration::from_secs(3),
        ..Behaviour::default()
    });
    c.change(uri, 3, (0, 6, 6), "0");
    c.request(3, "caret/nextEdit", position(0, 7, uri));
    std::thread::sleep(std::time::Duration::from_millis(300));
    c.change(uri, 4, (0, 7, 7), "0");
    c.request(4, "textDocument/inlineCompletion", position(0, 8, uri));
    let cancelled = c.answer(3);
    assert_eq!(cancelled["error"]["code"], -32800, "{cancelled}");
    assert!(cancelled.get("result").is_none(), "{cancelled}");
    c.finish(5);
}
