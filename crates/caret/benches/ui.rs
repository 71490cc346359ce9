//! `cargo bench -p caret --bench ui`: the workspace page against `caret lsp`, side by side,
//! with the same local model on the same machine. Lines of a real file are typed back one
//! character at a time — in headless Chromium into the page's Monaco editor (`caret ui`), and
//! as `didChange` + `textDocument/inlineCompletion` to `caret lsp` — each keystroke waiting
//! for its suggestion. Prints keystroke → suggestion p50/p90 of the suggestions the model
//! served (the typed-ahead caches answer the rest at once), the page's load time to an
//! editable file, and the bundle's size.
//!
//! Needs Chromium with chromium-driver and the default code model:
//! `CARET_HOME` holding `models/qwen2.5-coder-1.5b-instruct-q4` (or `CARET_BENCH_MODEL` naming
//! the model's directory). `-- LINES` types other lines of the built-in file (default 45-46).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "../tests/common/browser.rs"]
mod browser;
#[path = "../tests/common/ui.rs"]
mod ui;

const CARET: &str = env!("CARGO_BIN_EXE_caret");
const FILE: &str = include_str!("../../caret-bench/src/data/tab/inventory.py.txt");

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[((v.len() - 1) as f64 * p).round() as usize] }
}

/// The keystrokes typing `typed`, one per character (the page's auto-indent and
/// auto-closing are off, so both sides hold the same text): (bytes typed so far, the key).
fn keystrokes(typed: &str) -> Vec<(usize, String)> {
    typed
        .char_indices()
        .map(|(i, c)| (i + c.len_utf8(), if c == '\n' { "\u{E007}".to_owned() } else { c.to_string() }))
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let (first, last): (usize, usize) = args
        .first()
        .and_then(|l| l.split_once('-'))
        .map_or((45, 46), |(a, b)| (a.parse().unwrap(), b.parse().unwrap()));
    let model = std::env::var_os("CARET_BENCH_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("CARET_HOME").map(PathBuf::from).expect("set CARET_HOME or CARET_BENCH_MODEL");
        home.join("models/qwen2.5-coder-1.5b-instruct-q4")
    });
    assert!(model.join("model.gguf").is_file(), "no model at {}", model.display());
    let lines: Vec<&str> = FILE.split_inclusive('\n').collect();
    let before: String = lines[..first - 1].concat();
    let typed: String = lines[first - 1..last].concat();
    let after: String = lines[last..].concat();
    let dir = tempfile::tempdir().unwrap();
    let (home, ws) = (dir.path().join("home"), dir.path().join("ws"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[[models]]\nalias = \"tab\"\ndeployments = [{{ provider = \"local\", model = {:?}, context_tokens = 4096 }}]\n",
            model.display().to_string()
        ),
    )
    .unwrap();
    // The file as the user finds it: the lines to type are not there yet (a blank line is).
    std::fs::write(ws.join("inventory.py"), format!("{before}\n{after}")).unwrap();
    let keys = keystrokes(&typed);
    println!("typing lines {first}–{last} of inventory.py back: {} keystrokes, model {}", keys.len(), model.display());

    // The page is opened first and stays open (idle) while `caret lsp` is measured, so both
    // sides share the machine with the same browser.
    let page = Page::open(&home, &ws, before.lines().count() + 1);
    let lsp = lsp_side(&home, &ws, &before, &after, &typed, &keys);
    let page = page.type_keys(&keys);
    for (name, per_key) in [("caret lsp", &lsp), ("page     ", &page)] {
        let mut v: Vec<f64> = per_key.iter().flatten().copied().collect();
        let n = v.len();
        println!(
            "  {name}: keystroke → suggestion from the model p50 {:.0} ms, p90 {:.0} ms ({n} of {} answers; the rest from the typed-ahead caches or empty)",
            percentile(&mut v, 0.5),
            percentile(&mut v, 0.9),
            per_key.len()
        );
    }
    // The same request on both sides: the keystrokes both answered from the model.
    let pairs: Vec<(f64, f64)> = lsp.iter().zip(&page).filter_map(|(a, b)| Some(((*a)?, (*b)?))).collect();
    let (mut l, mut p): (Vec<f64>, Vec<f64>) = pairs.iter().copied().unzip();
    let mut diff: Vec<f64> = pairs.iter().map(|(a, b)| b - a).collect();
    println!(
        "  the same keystrokes ({} answered from the model on both sides): caret lsp p50 {:.0} ms, page p50 {:.0} ms; page − lsp per keystroke: p50 {:+.0} ms, p90 {:+.0} ms",
        pairs.len(),
        percentile(&mut l, 0.5),
        percentile(&mut p, 0.5),
        percentile(&mut diff, 0.5),
        percentile(&mut diff, 0.9)
    );
}

/// `caret lsp` typing: per keystroke, the latency in ms when the model served it.
fn lsp_side(
    home: &Path,
    ws: &Path,
    before: &str,
    after: &str,
    typed: &str,
    keys: &[(usize, String)],
) -> Vec<Option<f64>> {
    let mut child = Command::new(CARET)
        .arg("lsp")
        .env("CARET_HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut send = |msg: Value| {
        let body = msg.to_string();
        write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        stdin.flush().unwrap();
    };
    let mut recv = |id: u64| -> Value {
        loop {
            let mut len = 0;
            loop {
                let mut line = String::new();
                out.read_line(&mut line).unwrap();
                let line = line.trim();
                if line.is_empty() {
                    break;
                }
                if let Some(v) = line.strip_prefix("Content-Length:") {
                    len = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; len];
            out.read_exact(&mut body).unwrap();
            let v: Value = serde_json::from_slice(&body).unwrap();
            if v["id"] == id {
                return v;
            }
        }
    };
    let uri = format!("file://{}", ws.join("inventory.py").display());
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"rootUri": format!("file://{}", ws.display()), "capabilities": {}}}),
    );
    recv(1);
    send(json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}));
    send(
        json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": format!("{before}\n{after}")}}}),
    );
    // As the page does: the file opened, a moment to read it, then typing.
    std::thread::sleep(Duration::from_secs(8));
    let mut served = Vec::new();
    let mut id = 10;
    for (n, (k, _)) in keys.iter().enumerate() {
        let text = format!("{before}{}\n{after}", &typed[..*k]);
        let cursor = before.len() + k;
        let line = text[..cursor].matches('\n').count();
        let character: usize = text[..cursor].rsplit('\n').next().unwrap().chars().map(char::len_utf16).sum();
        send(
            json!({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {"textDocument": {"uri": uri, "version": n + 2}, "contentChanges": [{"text": text}]}}),
        );
        id += 1;
        let started = Instant::now();
        send(
            json!({"jsonrpc": "2.0", "id": id, "method": "textDocument/inlineCompletion", "params": {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}, "context": {"triggerKind": 2}}}),
        );
        let r = recv(id);
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let text = r["result"]["items"][0]["insertText"].as_str().unwrap_or("");
        // The typed-ahead cache answers in well under a millisecond; a model call cannot.
        served.push((!text.is_empty() && ms > 5.0).then_some(ms));
    }
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}));
    send(json!({"jsonrpc": "2.0", "method": "exit"}));
    let _ = child.wait();
    served
}

/// `caret ui` with the file open in Chromium.
struct Page {
    ui: ui::Ui,
    browser: browser::Browser,
}

impl Page {
    fn open(home: &Path, ws: &Path, blank: usize) -> Page {
        let ui = ui::start(CARET, home, ws);
        let (base, token) = (&ui.base, &ui.token);
        let browser = browser::Browser::start();
        let started = Instant::now();
        browser.open(&format!("{base}/?open=inventory.py#token={token}"));
        browser.wait_for("the file", 30, "return window.caret?.openedAt");
        let wall = started.elapsed().as_secs_f64() * 1e3;
        let in_page = browser.eval("return window.caret.openedAt").as_f64().unwrap();
        println!(
            "  page load to an editable file: {in_page:.0} ms in the page (navigation start → file in the editor), {wall:.0} ms as WebDriver saw it"
        );
        let info = browser.eval("return fetch('/api/info', {headers: {authorization: 'Bearer ' + sessionStorage.getItem('caret-token')}}).then((r) => r.json())");
        println!(
            "  the page's bundle: {} files, {:.2} MiB",
            info["bundle"]["files"],
            info["bundle"]["bytes"].as_f64().unwrap_or(0.0) / 1048576.0
        );
        // The cursor on the blank line where the typed lines go; the editor's own typing aids off.
        browser.eval(&format!(
            "caret.editor.updateOptions({{autoClosingBrackets: 'never', autoClosingQuotes: 'never', autoIndent: 'none', autoSurround: 'never'}}); \
             caret.editor.setPosition({{lineNumber: {blank}, column: 1}}); caret.editor.focus();"
        ));
        Page { ui, browser }
    }

    /// Types the keys: per keystroke, the latency in ms when the model served it.
    fn type_keys(self, keys: &[(usize, String)]) -> Vec<Option<f64>> {
        let browser = &self.browser;
        std::thread::sleep(Duration::from_secs(8));

        // Waiting happens in the page, woken by the answer itself: no polling, over WebDriver or
        // by a timer, takes CPU from the model meanwhile.
        const WAIT: &str = "const [seen, done] = arguments; if (caret.tabLog.length > seen) { done(caret.tabLog.length); return; } \
        const t = setTimeout(() => done(null), 10000); caret.tabWaiters.push((n) => { clearTimeout(t); done(n); });";
        for (_, key) in keys {
            let seen = browser.eval("return caret.tabLog.length");
            browser.keys(key);
            browser.eval_async(WAIT, json!([seen]));
        }
        let log = browser.eval("return caret.tabLog");
        let entries = log.as_array().unwrap();
        let count = |f: &dyn Fn(&Value) -> bool| entries.iter().filter(|e| f(e)).count();
        println!(
            "  page: {} provider answers: {} cancelled or failed, {} from the typed-ahead cache, {} empty, {} from the model",
            entries.len(),
            count(&|e| e["ms"].is_null()),
            count(&|e| e["cached"] == true),
            count(&|e| e["cached"] == false && e["text"] == ""),
            count(&|e| e["cached"] == false && e["text"].as_str().is_some_and(|t| !t.is_empty())),
        );
        // One answer per keystroke (each waited for its own).
        let served: Vec<Option<f64>> = entries
            .iter()
            .map(|e| {
                let model = e["cached"] == false && e["text"].as_str().is_some_and(|t| !t.is_empty());
                if model { e["ms"].as_f64() } else { None }
            })
            .collect();
        drop(self.ui);
        served
    }
}
