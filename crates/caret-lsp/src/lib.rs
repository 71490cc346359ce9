//! `caret lsp`: a language server over stdio that gives any editor Tab completions.
//!
//! JSON-RPC with `Content-Length` framing on stdin/stdout (logs go to stderr). Documents are
//! kept from `didOpen` / `didChange` (full and incremental sync; positions in UTF-16 code
//! units, as the protocol defaults to). `textDocument/inlineCompletion` (LSP 3.18) answers
//! with ghost text; `textDocument/completion` answers the same suggestion as one item, for
//! clients without inline completion. A newer request for a document cancels the one in
//! flight for it, and `$/cancelRequest` cancels by id — either way the task is aborted, which
//! drops the model's stream and stops generation. Settings come in `initializationOptions`:
//! `model`, `family`, `template` (a custom fill-in-the-middle prompt), `budget`,
//! `suffix_share`, `debounce_ms` (the debounce's floor).
//!
//! A document that goes quiet a moment after `didOpen` (warmed for its end), `didChange`
//! (for where the change ended) or a `caret/focus` notification (`{textDocument, position}`:
//! the cursor moved; sent by Caret's own editor extensions) has its prompt read into a local
//! model's cache ahead of the request — a warm-up that any request pre-empts.
//!
//! `caret/nextEdit` (`{textDocument, position}`) answers the edit likely next after the user's
//! recent ones, possibly away from the cursor (`{textDocument, range, newText, reason}` or
//! `null`): the edits since the document last settled are diffed into one, and
//! `caret_complete::next_edit` finds where it repeats. An editor shows it as a jump target
//! (Tab jumps there, Tab again applies `newText` to `range`, Esc dismisses). A document's
//! changes settle into one recent edit when it goes quiet (or when `caret/nextEdit` asks);
//! when the next edit lies at the cursor, an inline completion request gets it as its item
//! (`range` + `insertText`), so editors that know only inline completion have it as Tab.
//!
//! This crate owns the protocol side only: suggestions come from `caret_host::completer`,
//! documents from `caret_host::documents`, search from `caret_host::search`. It never
//! reaches into another front end.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{Value, json};
use tokio::sync::{Mutex, mpsc};

use caret_host::completer::Completer;
use caret_host::config::Config;
use caret_host::documents::{Docs, offset_at, path_to_uri, relative, uri_to_path};
use caret_host::remote::Remote;
use caret_host::runtime::runtime;

mod usage;

#[derive(Debug, clap::Args)]
/// `caret lsp`'s arguments.
pub struct LspArgs {
    /// Use this server's gateway instead of the embedded one (env CARET_SERVER).
    #[arg(long, env = "CARET_SERVER")]
    server: Option<String>,
    /// API token for --server (env CARET_TOKEN).
    #[arg(long, env = "CARET_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Accepted for clients that pass it; stdio is the only transport.
    #[arg(long, hide = true)]
    stdio: bool,
}

/// Reads one framed message; `None` at the end of input.
fn read_message(input: &mut impl std::io::BufRead) -> anyhow::Result<Option<Value>> {
    let mut length = None;
    loop {
        let mut line = String::new();
        if input.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = Some(value.trim().parse::<usize>().context("a bad Content-Length")?);
        }
    }
    let length = length.context("a message without Content-Length")?;
    anyhow::ensure!(length <= 64 << 20, "a message of {length} bytes (most: 64 MiB)");
    let mut body = vec![0; length];
    input.read_exact(&mut body)?;
    Ok(Some(serde_json::from_slice(&body).unwrap_or_else(|e| json!({ "__parse_error": e.to_string() }))))
}

fn write_message(out: &mut impl std::io::Write, msg: &Value) -> std::io::Result<()> {
    let body = msg.to_string();
    write!(out, "Content-Length: {}\r\n\r\n{body}", body.len())?;
    out.flush()
}

/// Applies one `contentChanges` entry: a range replaced, or the whole text. Returns the byte
/// offset just after the new text (where a typing user's cursor is).
fn apply_change(text: &mut String, change: &Value) -> usize {
    let new = change["text"].as_str().unwrap_or("");
    match change.get("range") {
        Some(r) if !r.is_null() => {
            let pos =
                |p: &Value| offset_at(text, p["line"].as_u64().unwrap_or(0), p["character"].as_u64().unwrap_or(0));
            let (a, b) = (pos(&r["start"]), pos(&r["end"]));
            let (a, b) = (a.min(b), a.max(b));
            text.replace_range(a..b, new);
            a + new.len()
        }
        _ => {
            *text = new.to_owned();
            text.len()
        }
    }
}

/// How long a document must stay quiet (no change, no request) before it is warmed.
const WARM_QUIET: Duration = Duration::from_millis(250);

/// Warms the model for a cursor at byte `at` of document `uri` once it has been quiet for
/// `quiet` (see [`Completer::warm`]); a later change, focus or request for the document
/// replaces or cancels it.
async fn warm_later(server: &Arc<Server>, uri: &str, at: usize, quiet: Duration) {
    let Some(completer) = server.completer.lock().await.clone() else { return };
    let srv = server.clone();
    let doc = uri.to_owned();
    let mut warming = server.warming.lock().await;
    let task = tokio::spawn(async move {
        tokio::time::sleep(quiet).await;
        let root = srv.root.lock().await.clone();
        let found = srv.docs.lock().await.prepare(&doc, root.as_deref());
        {
            let mut warming = srv.warming.lock().await;
            if warming.get(&doc).is_some_and(|h| h.id() == tokio::task::id()) {
                warming.remove(&doc);
            }
        }
        if let Some((text, snippets, _)) = found {
            let path = relative(&doc, root.as_deref());
            completer.warm(&text, at.min(text.len()), Some(&path), &snippets).await;
        }
    });
    if let Some(old) = warming.insert(uri.to_owned(), task.abort_handle()) {
        old.abort();
    }
}

/// How long a document must stay quiet before its changes settle into one recent edit (for
/// editors that never ask `caret/nextEdit`, which settles them itself): a word typed with
/// shorter pauses stays one edit.
const SETTLE_QUIET: Duration = Duration::from_millis(750);

/// Settles document `uri`'s changes into the recent edits once it has been quiet for
/// [`SETTLE_QUIET`]; a later change replaces it.
async fn settle_later(server: &Arc<Server>, uri: &str) {
    let (srv, doc) = (server.clone(), uri.to_owned());
    let mut settling = server.settling.lock().await;
    let task = tokio::spawn(async move {
        tokio::time::sleep(SETTLE_QUIET).await;
        let text = srv.docs.lock().await.open.get(&doc).map(|d| d.text.clone());
        if let Some(text) = text {
            srv.history.lock().await.settle(&doc, &text);
        }
        let mut settling = srv.settling.lock().await;
        if settling.get(&doc).is_some_and(|h| h.id() == tokio::task::id()) {
            settling.remove(&doc);
        }
    });
    if let Some(old) = settling.insert(uri.to_owned(), task.abort_handle()) {
        old.abort();
    }
}

struct Server {
    config: Config,
    /// Where `caret.search` syncs and searches (`--server`, else the embedded one).
    remote: Remote,
    /// The workspace root, from `initialize`.
    root: Mutex<Option<PathBuf>>,
    /// Ids of the requests this server sends the client.
    next_request: std::sync::atomic::AtomicU64,
    docs: Mutex<Docs>,
    /// Requests in flight: id → (document, task).
    flight: Mutex<HashMap<String, (String, tokio::task::AbortHandle)>>,
    /// Warm-ups waiting for a quiet moment: document → task.
    warming: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    /// Recent edits waiting for a quiet moment to settle: document → task.
    settling: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    completer: Mutex<Option<Arc<Completer>>>,
    /// The open documents' recent edits, for `caret/nextEdit`.
    history: Mutex<caret_complete::next_edit::History>,
    debounce: Mutex<Duration>,
    /// Whether the user was told that the server switched Tab off (once a session).
    told_switched_off: std::sync::atomic::AtomicBool,
    /// Tab usage reported to the team's server, when the user shares it.
    usage: Option<Arc<usage::Reporter>>,
    out: mpsc::UnboundedSender<Value>,
}

/// Serves the language server on stdin and stdout until the editor exits.
pub fn run(config: &Config, args: LspArgs) -> anyhow::Result<ExitCode> {
    let rt = runtime()?;
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Value>();
    let writer = std::thread::spawn(move || {
        let mut stdout = std::io::stdout().lock();
        while let Some(msg) = out_rx.blocking_recv() {
            if write_message(&mut stdout, &msg).is_err() {
                break;
            }
        }
    });
    let (in_tx, mut in_rx) = mpsc::unbounded_channel::<Value>();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        loop {
            match read_message(&mut stdin) {
                Ok(Some(msg)) => {
                    if in_tx.send(msg).is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("lsp: {e:#}");
                    break;
                }
            }
        }
    });
    let server = Arc::new(Server {
        config: config.clone(),
        remote: Remote { server: args.server.clone(), token: args.token.clone() },
        root: Mutex::new(None),
        next_request: std::sync::atomic::AtomicU64::new(1),
        docs: Mutex::new(Docs::default()),
        flight: Mutex::new(HashMap::new()),
        warming: Mutex::new(HashMap::new()),
        settling: Mutex::new(HashMap::new()),
        completer: Mutex::new(None),
        history: Mutex::default(),
        debounce: Mutex::new(Duration::from_millis(25)),
        told_switched_off: std::sync::atomic::AtomicBool::new(false),
        usage: usage::Reporter::from_config(config, args.server.as_deref(), args.token.as_deref()),
        out: out_tx,
    });
    let reporting = server.usage.as_ref().map(|r| {
        let _entered = rt.enter();
        r.spawn()
    });
    let code = rt.block_on(async {
        let mut shutdown = false;
        while let Some(msg) = in_rx.recv().await {
            let method = msg["method"].as_str().unwrap_or("").to_owned();
            let id = msg.get("id").cloned();
            if msg.get("__parse_error").is_some() {
                let _ = server.out.send(json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "parse error"}}));
                continue;
            }
            match method.as_str() {
                "initialize" => {
                    let opts = &msg["params"]["initializationOptions"];
                    *server.root.lock().await = root_of(&msg["params"]);
                    let reply = match connect(config, &args, opts) {
                        Ok(c) => {
                            if let Some(ms) = opts["debounce_ms"].as_u64() {
                                *server.debounce.lock().await = Duration::from_millis(ms.min(1000));
                            }
                            let model = c.as_ref().map(|c| c.model().to_owned());
                            *server.completer.lock().await = c.map(Arc::new);
                            json!({"capabilities": {
                                "positionEncoding": "utf-16",
                                "textDocumentSync": {"openClose": true, "change": 2},
                                "inlineCompletionProvider": {},
                                "completionProvider": {"resolveProvider": false},
                                "executeCommandProvider": {"commands": ["caret.search", "caret.apply", "caret.tabAccepted", "caret.nextEditAccepted"]},
                                "experimental": {"caretNextEdit": true},
                            }, "serverInfo": {"name": "caret", "version": env!("CARGO_PKG_VERSION"), "model": model}})
                        }
                        Err(e) => {
                            let _ = server.out.send(json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32002, "message": format!("{e:#}")}}));
                            continue;
                        }
                    };
                    let _ = server.out.send(json!({"jsonrpc": "2.0", "id": id, "result": reply}));
                }
                "initialized" => {
                    if server.completer.lock().await.is_none() {
                        let _ = server.out.send(json!({"jsonrpc": "2.0", "method": "window/showMessage", "params": {
                            "type": 2,
                            "message": "caret: no models are configured, so there are no suggestions: add [[models]] to caret's config (a `tab` alias is used first)",
                        }}));
                    }
                }
                "textDocument/didOpen" => {
                    let d = &msg["params"]["textDocument"];
                    if let (Some(uri), Some(text)) = (d["uri"].as_str(), d["text"].as_str()) {
                        server.docs.lock().await.open(uri, text, *server.debounce.lock().await);
                        server.history.lock().await.open(uri, text);
                        // Where the user will type is not known yet: the end, whose prompt
                        // holds the most of the file.
                        warm_later(&server, uri, text.len(), WARM_QUIET).await;
                    }
                }
                "textDocument/didChange" => {
                    let uri = msg["params"]["textDocument"]["uri"].as_str().unwrap_or("").to_owned();
                    let mut docs = server.docs.lock().await;
                    let mut cursor = None;
                    if let Some(doc) = docs.open.get_mut(&uri) {
                        for change in msg["params"]["contentChanges"].as_array().into_iter().flatten() {
                            cursor = Some(apply_change(&mut doc.text, change));
                        }
                        doc.edited = Instant::now();
                        doc.rhythm.keystroke(doc.edited);
                    }
                    drop(docs);
                    if let Some(at) = cursor {
                        warm_later(&server, &uri, at, WARM_QUIET).await;
                        settle_later(&server, &uri).await;
                    }
                }
                // The editor's cursor moved (sent by Caret's own extensions): a suggestion
                // there is likely next.
                "caret/focus" => {
                    let p = &msg["params"];
                    let uri = p["textDocument"]["uri"].as_str().unwrap_or("").to_owned();
                    let (line, character) =
                        (p["position"]["line"].as_u64().unwrap_or(0), p["position"]["character"].as_u64().unwrap_or(0));
                    let at = server.docs.lock().await.open.get(&uri).map(|d| offset_at(&d.text, line, character));
                    if let Some(at) = at {
                        warm_later(&server, &uri, at, WARM_QUIET).await;
                    }
                }
                "textDocument/didClose" => {
                    if let Some(uri) = msg["params"]["textDocument"]["uri"].as_str() {
                        server.docs.lock().await.close(uri);
                        server.history.lock().await.close(uri);
                    }
                }
                "textDocument/inlineCompletion" | "textDocument/completion" => {
                    let Some(id) = id else { continue };
                    suggest(&server, id, method == "textDocument/inlineCompletion", &msg["params"]).await;
                }
                // The edit likely next after the recent ones (Tab, Tab), anywhere in the file.
                "caret/nextEdit" => {
                    let Some(id) = id else { continue };
                    next_edit(&server, id, &msg["params"]).await;
                }
                "workspace/executeCommand" => {
                    let Some(id) = id else { continue };
                    let srv = server.clone();
                    tokio::spawn(async move {
                        let reply = match execute(&srv, &msg["params"]).await {
                            Ok(v) => json!({"jsonrpc": "2.0", "id": id, "result": v}),
                            Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": format!("{e:#}")}}),
                        };
                        let _ = srv.out.send(reply);
                    });
                }
                // The client's answer to a request of ours (`workspace/applyEdit`).
                "" if msg.get("method").is_none() => {}
                "$/cancelRequest" => {
                    let key = msg["params"]["id"].to_string();
                    if let Some((_, task)) = server.flight.lock().await.remove(&key) {
                        task.abort();
                        let _ = server.out.send(json!({"jsonrpc": "2.0", "id": msg["params"]["id"], "error": {"code": -32800, "message": "cancelled"}}));
                    }
                }
                "shutdown" => {
                    shutdown = true;
                    for (_, (_, task)) in server.flight.lock().await.drain() {
                        task.abort();
                    }
                    let _ = server.out.send(json!({"jsonrpc": "2.0", "id": id, "result": null}));
                }
                "exit" => return if shutdown { ExitCode::SUCCESS } else { ExitCode::from(1) },
                _ => {
                    if let Some(id) = id {
                        let _ = server.out.send(json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": format!("unknown method {method:?}")}}));
                    }
                }
            }
        }
        if shutdown { ExitCode::SUCCESS } else { ExitCode::from(1) }
    });
    // What is left of the usage goes before the editor is gone for good.
    if let Some(r) = &server.usage {
        if let Some(task) = reporting {
            task.abort();
        }
        rt.block_on(r.send());
    }
    // The completer (and a local model's engine) goes before the writer is waited for.
    drop(server);
    drop(rt);
    let _ = writer.join();
    Ok(code)
}

/// The completer from the config and `initializationOptions`; `None` without models.
fn connect(config: &Config, args: &LspArgs, opts: &Value) -> anyhow::Result<Option<Completer>> {
    let mut budget =
        caret_complete::engine::budget(opts["budget"].as_u64().map(|t| usize::try_from(t).unwrap_or(usize::MAX)));
    if let Some(share) = opts["suffix_share"].as_f64() {
        budget.suffix_share = (share as f32).clamp(0.0, 0.9);
    }
    let completer = caret_host::completer::connect(
        config,
        args.server.as_deref(),
        args.token.as_deref(),
        opts["model"].as_str(),
        opts["family"].as_str(),
        budget,
    )?;
    match (completer, opts.get("template")) {
        (Some(mut c), Some(t)) if !t.is_null() => {
            let template: caret_complete::Template = serde_json::from_value(t.clone())
                .context("initializationOptions.template: {\"prompt\": \"…{prefix}…{suffix}…\", \"stop\": […]}")?;
            c.set_template(template)?;
            Ok(Some(c))
        }
        (c, _) => Ok(c),
    }
}

/// Answers a completion request in its own task, cancelling the document's older one.
async fn suggest(server: &Arc<Server>, id: Value, inline: bool, params: &Value) {
    let asked = Instant::now();
    let uri = params["textDocument"]["uri"].as_str().unwrap_or("").to_owned();
    let (line, character) =
        (params["position"]["line"].as_u64().unwrap_or(0), params["position"]["character"].as_u64().unwrap_or(0));
    let empty = if inline { json!({"items": []}) } else { json!({"isIncomplete": true, "items": []}) };
    if inline && let Some(item) = next_edit_at(server, &uri, line, character).await {
        let _ = server.out.send(json!({"jsonrpc": "2.0", "id": id, "result": {"items": [item]}}));
        return;
    }
    let root = server.root.lock().await.clone();
    let found = server.docs.lock().await.prepare(&uri, root.as_deref());
    let completer = server.completer.lock().await.clone();
    let (Some((text, snippets, debounce)), Some(completer)) = (found, completer) else {
        let _ = server.out.send(json!({"jsonrpc": "2.0", "id": id, "result": empty}));
        return;
    };
    if let Some(warm) = server.warming.lock().await.remove(&uri) {
        warm.abort(); // the request reads the prompt itself
    }
    let key = id.to_string();
    {
        // A newer keystroke's request makes the document's older one stale.
        let mut flight = server.flight.lock().await;
        let stale: Vec<String> = flight.iter().filter(|(_, (doc, _))| *doc == uri).map(|(k, _)| k.clone()).collect();
        for k in stale {
            if let Some((_, task)) = flight.remove(&k) {
                task.abort();
                let stale_id: Value = serde_json::from_str(&k).unwrap_or(Value::Null);
                let _ = server.out.send(json!({"jsonrpc": "2.0", "id": stale_id, "error": {"code": -32800, "message": "superseded by a newer request"}}));
            }
        }
    }
    let srv = server.clone();
    let task_key = key.clone();
    let path = Some(relative(&uri, root.as_deref()));
    let doc = uri.clone();
    // The flight table is held while the task starts and is entered, so that a task done at
    // once (a cached suggestion) finds itself there.
    let mut flight = server.flight.lock().await;
    let task = tokio::spawn(async move {
        let cursor = offset_at(&text, line, character);
        let result = match completer.cached(&uri, &text, cursor) {
            Some(hit) => Ok(hit),
            None => {
                // Keystrokes typed within the debounce supersede this request before it
                // costs anything.
                if !debounce.is_zero() {
                    tokio::time::sleep(debounce).await;
                }
                completer.suggest(&uri, &text, cursor, path.as_deref(), &snippets).await
            }
        };
        if srv.flight.lock().await.remove(&task_key).is_none() {
            return; // cancelled meanwhile: the answer was sent by the canceller
        }
        let reply = match result {
            Ok(s) if s.text.is_empty() => json!({"jsonrpc": "2.0", "id": id, "result": empty}),
            Ok(s) => {
                let end = json!({"line": line, "character": character});
                // With usage shared, the editor says when it accepts the suggestion.
                let accepted = srv.usage.as_ref().map(|r| {
                    r.shown(asked.elapsed().as_secs_f64() * 1e3);
                    json!({"title": "suggestion accepted", "command": "caret.tabAccepted"})
                });
                let mut result = if inline {
                    json!({"items": [{"insertText": s.text, "range": {"start": end, "end": end}}]})
                } else {
                    let label = s.text.lines().next().unwrap_or("").trim().to_owned();
                    json!({"isIncomplete": true, "items": [{
                        "label": label,
                        "kind": 1,
                        "detail": "caret",
                        "insertTextFormat": 1,
                        "textEdit": {"range": {"start": end, "end": end}, "newText": s.text},
                        "sortText": "0",
                    }]})
                };
                if let Some(command) = accepted {
                    result["items"][0]["command"] = command;
                }
                json!({"jsonrpc": "2.0", "id": id, "result": result})
            }
            Err(e) => {
                tracing::warn!(error = %e, "no suggestion: the model failed");
                // An operator's kill switch (503 `disabled`): said once, plainly, in the editor.
                let message = e.to_string();
                if message.contains("is switched off")
                    && !srv.told_switched_off.swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    let _ = srv.out.send(json!({"jsonrpc": "2.0", "method": "window/showMessage", "params": {
                        "type": 2, "message": "Caret: Tab is switched off on the server for now (an operator's switch); suggestions resume when it is on again.",
                    }}));
                }
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": message}})
            }
        };
        let _ = srv.out.send(reply);
    });
    flight.insert(key, (doc, task.abort_handle()));
}

/// The workspace root an `initialize` names: the first workspace folder, else `rootUri`, else
/// `rootPath`.
fn root_of(params: &Value) -> Option<PathBuf> {
    let uri = params["workspaceFolders"][0]["uri"].as_str().or_else(|| params["rootUri"].as_str());
    match uri {
        Some(u) => uri_to_path(u),
        None => params["rootPath"].as_str().map(PathBuf::from),
    }
}

/// `caret/nextEdit` (`{textDocument, position}`): the document's edits since it last settled
/// become one recent edit, and the nearest place that edit repeats at answers
/// `{textDocument, range, newText, reason}` (a model served as `next-edit` ranks them). With
/// none, a rename's uses and a signature's calls in other open files and the workspace; then,
/// when Tab's model may be asked (its next-edit budget), the model rewrites the region around
/// the cursor (a Zeta-shaped prompt) — as a request in flight for the document, so the next
/// keystroke's request or a `$/cancelRequest` aborts it; else, or when it predicts nothing, the
/// learned ranker's best place (`caret_next_edit`): a rule's rewrite there, or the place alone
/// (`reason: "jump"`, an empty range and text). `null` when nothing is predicted.
async fn next_edit(server: &Arc<Server>, id: Value, params: &Value) {
    let asked = Instant::now();
    let uri = params["textDocument"]["uri"].as_str().unwrap_or("").to_owned();
    let send = move |srv: &Server, id: &Value, result: Value| {
        if let Some(r) = srv.usage.as_ref().filter(|_| !result.is_null()) {
            r.next_edit_shown(asked.elapsed().as_secs_f64() * 1e3);
        }
        let _ = srv.out.send(json!({"jsonrpc": "2.0", "id": id, "result": result}));
    };
    let Some(text) = server.docs.lock().await.open.get(&uri).map(|d| d.text.clone()) else {
        return send(server, &id, Value::Null);
    };
    let (line, character) =
        (params["position"]["line"].as_u64().unwrap_or(0), params["position"]["character"].as_u64().unwrap_or(0));
    let cursor = offset_at(&text, line, character);
    let tab = server.completer.lock().await.clone();
    // A model trained for next edits, when the gateway serves one: it ranks the candidates.
    let ranker = tab.as_ref().and_then(|c| c.next_edit_model()).map(Arc::new);
    let (last, edits, found) = {
        let mut history = server.history.lock().await;
        history.settle(&uri, &text);
        let Some(last) = history.last() else { return send(server, &id, Value::Null) };
        let found = caret_complete::next_edit::candidates(last, &uri, &text, cursor);
        // A lone repeat of the edit (a rename's next use) for a model trained for next edits.
        if found.len() == 1 && ranker.is_some() {
            return send(server, &id, prediction_json(&uri, &text, &found[0]));
        }
        (last.clone(), history.edits().cloned().collect::<Vec<_>>(), found)
    };
    // The files open beside this one, by URI.
    let opened: Vec<(String, String)> = {
        let docs = server.docs.lock().await;
        let mut v: Vec<_> =
            docs.open.iter().filter(|(u, _)| **u != uri).map(|(u, d)| (u.clone(), d.text.clone())).collect();
        v.sort_unstable();
        v
    };
    // Without such a model, the learned ranker weighs the repeats' places with every other
    // (it finds the place more often than the nearest repeat does: docs/tab.md).
    if !found.is_empty() && ranker.is_none() {
        let placed = caret_next_edit::served(&last, &uri, &text, &borrowed(&opened), found);
        return send(server, &id, placed.map_or(Value::Null, |p| answer_json(&uri, &text, &opened, &p)));
    }
    if found.is_empty() {
        // A rename's uses in other open files; else the import a new name needs, as another
        // open file has it.
        let other = {
            let others = borrowed(&opened);
            // A rename's other uses, else a new parameter's calls, else a new name's import.
            let carried = caret_complete::next_edit::elsewhere(&last, &others)
                .into_iter()
                .chain(caret_complete::calls::call_sites(&last, &uri, &text, &others))
                .next();
            match carried {
                Some(p) => Some(answer_json(&uri, &text, &opened, &p)),
                None => caret_complete::imports::missing_import(&last, &uri, &text, &others)
                    .map(|p| prediction_json(&uri, &text, &p)),
            }
        };
        if let Some(p) = other {
            return send(server, &id, p);
        }
        // A rename with no use left in the open files: the first workspace file that has one.
        let root = server.root.lock().await.clone();
        if let (Some(name), Some(root)) = (caret_complete::next_edit::renamed(&last), root) {
            let open: Vec<String> = server.docs.lock().await.open.keys().map(|u| relative(u, Some(&root))).collect();
            let (walk, name, dir) = (server.config.walk_config(), name.to_owned(), root.clone());
            let found = tokio::task::spawn_blocking(move || {
                caret_host::documents::workspace_uses(&walk, &dir, &name, &open, 1)
            })
            .await
            .unwrap_or_default();
            for (rel, there) in found {
                let other = path_to_uri(&root.join(&rel));
                if let Some(p) = caret_complete::next_edit::elsewhere(&last, &[(&other, &there)]).into_iter().next() {
                    return send(server, &id, prediction_json(&other, &there, &p));
                }
            }
        }
    }
    // The model's turn: to rank the candidates, or (none fits) to predict, when there is one;
    // else, or when it predicts nothing, the learned ranker's best place (a rule's rewrite
    // there, or a jump).
    let Some(model) = ranker.or(tab) else {
        let placed = caret_next_edit::guess(&last, &uri, &text, cursor, &borrowed(&opened));
        return send(server, &id, placed.map_or(Value::Null, |p| answer_json(&uri, &text, &opened, &p)));
    };
    let path = relative(&uri, server.root.lock().await.as_deref());
    let (srv, key, doc) = (server.clone(), id.to_string(), uri.clone());
    let flight_key = key.clone();
    // The flight table is held while the task starts, so that it finds itself there.
    let mut flight = server.flight.lock().await;
    let task = tokio::spawn(async move {
        let guess = match model.next_edit(edits.iter(), &uri, &path, &text, cursor).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("next edit: {e:#}");
                None
            }
        };
        let predicted = match guess {
            Some(g) if !found.is_empty() => caret_complete::next_edit::rank(found, &g, &text).into_iter().next(),
            guess if found.is_empty() => {
                guess.or_else(|| caret_next_edit::guess(&last, &uri, &text, cursor, &borrowed(&opened)))
            }
            _ => found.into_iter().next(),
        };
        srv.flight.lock().await.remove(&key);
        send(&srv, &id, predicted.as_ref().map_or(Value::Null, |p| answer_json(&uri, &text, &opened, p)));
    });
    flight.insert(flight_key, (doc, task.abort_handle()));
}

/// The next edit, as an inline completion item, when it is at the cursor (its range on the
/// cursor's line and around it): an editor that knows no `caret/nextEdit` gets it as Tab.
/// Deterministic candidates only; the edits are peeked, not settled.
async fn next_edit_at(server: &Server, uri: &str, line: u64, character: u64) -> Option<Value> {
    let text = server.docs.lock().await.open.get(uri).map(|d| d.text.clone())?;
    let cursor = offset_at(&text, line, character);
    let last = server.history.lock().await.peek(uri, &text)?;
    let line_start = text[..cursor].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[cursor..].find('\n').map_or(text.len(), |i| cursor + i);
    let p = caret_complete::next_edit::candidates(&last, uri, &text, cursor)
        .into_iter()
        .find(|p| p.start >= line_start && p.end <= line_end && p.start <= cursor && cursor <= p.end)?;
    Some(json!({
        "insertText": p.replacement,
        "range": {"start": position_of(&text, p.start), "end": position_of(&text, p.end)},
    }))
}

/// A predicted edit as `caret/nextEdit` answers it.
/// Owned (path, text) pairs as the pairs of borrowed strings the rules take.
fn borrowed(files: &[(String, String)]) -> Vec<(&str, &str)> {
    files.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect()
}

/// A prediction as `caret/nextEdit` answers it: in this document (`uri`, `text`) or in one of
/// those open beside it (`opened`).
fn answer_json(uri: &str, text: &str, opened: &[(String, String)], p: &caret_complete::next_edit::Prediction) -> Value {
    match opened.iter().find(|(u, _)| *u == p.path) {
        Some((other, there)) if p.path != uri => prediction_json(other, there, p),
        _ => prediction_json(uri, text, p),
    }
}

fn prediction_json(uri: &str, text: &str, p: &caret_complete::next_edit::Prediction) -> Value {
    json!({
        "textDocument": {"uri": uri},
        "range": {"start": position_of(text, p.start), "end": position_of(text, p.end)},
        "newText": p.replacement,
        "reason": p.why.as_str(),
    })
}

/// The LSP position (line, UTF-16 column) of byte `at` of `text`.
fn position_of(text: &str, at: usize) -> Value {
    let before = &text[..at];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let character: usize = before[line_start..].chars().map(char::len_utf16).sum();
    json!({"line": before.matches('\n').count(), "character": character})
}

/// The smallest whole-line edit turning `old` into `new`: `(start byte, end byte in old, new
/// text)`.
fn line_edit<'a>(old: &str, new: &'a str) -> (usize, usize, &'a str) {
    let common = old.bytes().zip(new.bytes()).take_while(|(a, b)| a == b).count();
    let start = old[..common].rfind('\n').map_or(0, |i| i + 1);
    let max_tail = (old.len() - start).min(new.len() - start);
    let tail = old.bytes().rev().zip(new.bytes().rev()).take(max_tail).take_while(|(a, b)| a == b).count();
    // The kept tail starts at a line start (or is empty).
    let mut keep = tail;
    while keep > 0 && old.as_bytes()[old.len() - keep - 1] != b'\n' {
        keep -= 1;
    }
    (start, old.len() - keep, &new[start..new.len() - keep])
}

/// `workspace/executeCommand`: `caret.search` (`{query, k}`: the workspace index, hybrid) and
/// `caret.apply` (`{uri, edit, format}`: the edit applied to the document, sent back to the
/// client as `workspace/applyEdit`).
async fn execute(server: &Server, params: &Value) -> anyhow::Result<Value> {
    let arg = params["arguments"].get(0).cloned().unwrap_or(Value::Null);
    match params["command"].as_str().unwrap_or("") {
        // The editor accepted a suggestion (the command each one carries when usage is shared).
        "caret.tabAccepted" => {
            if let Some(r) = &server.usage {
                r.accepted();
            }
            Ok(Value::Null)
        }
        // The editor applied a next edit.
        "caret.nextEditAccepted" => {
            if let Some(r) = &server.usage {
                r.next_edit_accepted();
            }
            Ok(Value::Null)
        }
        "caret.search" => {
            let query = arg["query"].as_str().context("caret.search takes {\"query\": …, \"k\": …}")?;
            let k = usize::try_from(arg["k"].as_u64().unwrap_or(10).clamp(1, 200)).unwrap_or(10);
            let root =
                server.root.lock().await.clone().context("caret.search: the client named no workspace folder")?;
            let mode = caret_protocol::SearchMode::Hybrid;
            let outcome =
                caret_host::search::search_workspace(&server.config, &root, &server.remote, query, k, mode).await?;
            // Hit paths are relative to the workspace's real root (links resolved).
            let root = std::fs::canonicalize(&root).unwrap_or(root);
            let hits: Vec<Value> = outcome
                .hits
                .iter()
                .map(|h| {
                    json!({
                        "path": h.path,
                        "uri": path_to_uri(&root.join(&h.path)),
                        "range": {"start": {"line": h.start_line.saturating_sub(1), "character": 0},
                                  "end": {"line": h.end_line, "character": 0}},
                        "score": h.score,
                        "snippet": h.snippet,
                    })
                })
                .collect();
            Ok(json!({"hits": hits, "semantic": outcome.semantic}))
        }
        "caret.apply" => {
            let (Some(uri), Some(edit)) = (arg["uri"].as_str(), arg["edit"].as_str()) else {
                anyhow::bail!("caret.apply takes {{\"uri\": …, \"edit\": …, \"format\": …}}");
            };
            let format = match arg["format"].as_str() {
                None | Some("auto") => None,
                Some(name) => Some(caret_apply::Format::parse(name)?),
            };
            let open = server.docs.lock().await.open.get(uri).map(|d| d.text.clone());
            let text = match open {
                Some(t) => t,
                None => {
                    let path = uri_to_path(uri).with_context(|| format!("{uri} is neither open nor a file"))?;
                    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?
                }
            };
            let name = uri.rsplit('/').next();
            let (new, format) = caret_apply::apply(&caret_apply::Text::new(&text), edit, format, name)?;
            let new = new.render();
            if new == text {
                return Ok(json!({"changed": false, "format": format.name()}));
            }
            let (start, end, replacement) = line_edit(&text, &new);
            let range = json!({"start": position_of(&text, start), "end": position_of(&text, end)});
            let id = format!("caret-{}", server.next_request.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            let _ = server.out.send(json!({"jsonrpc": "2.0", "id": id, "method": "workspace/applyEdit", "params": {
                "label": "caret apply",
                "edit": {"changes": {uri: [{"range": range, "newText": replacement}]}},
            }}));
            Ok(json!({"changed": true, "format": format.name(), "range": range}))
        }
        other => anyhow::bail!("unknown command {other:?}: caret.search or caret.apply"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn positions_are_utf16_and_changes_apply() {
        let text = "a😀b\nsecond\n";
        // Positions themselves: caret-host's tests (`offset_at` lives there).
        let mut t = text.to_owned();
        apply_change(
            &mut t,
            &json!({"range": {"start": {"line": 1, "character": 0}, "end": {"line": 1, "character": 6}}, "text": "2nd"}),
        );
        assert_eq!(t, "a😀b\n2nd\n");
        apply_change(&mut t, &json!({"text": "whole"}));
        assert_eq!(t, "whole");
    }

    #[test]
    fn line_edits_are_minimal_and_uris_round_trip() {
        let old = "a\nb\nc\nd\n";
        assert_eq!(line_edit(old, "a\nB\nc\nd\n"), (2, 4, "B\n"));
        assert_eq!(line_edit(old, "a\nb\nc\nd\ne\n"), (8, 8, "e\n"));
        assert_eq!(line_edit(old, "a\nd\n"), (2, 6, ""));
        assert_eq!(line_edit("x\ny", "x\nz"), (2, 3, "z"), "a last line without a newline");
        let (s, e, r) = line_edit("aa\naa\n", "aa\naa\naa\n");
        assert_eq!((s, e, r), (6, 6, "aa\n"), "repeated lines: the insertion at the end");
        assert_eq!(position_of("a😀\nxy", 7), json!({"line": 1, "character": 1}));
        assert_eq!(position_of("a😀b", 5), json!({"line": 0, "character": 3}));
        // URIs themselves: caret-host's tests (`path_to_uri` lives there).
        let init = json!({"rootUri": "file:///r", "workspaceFolders": [{"uri": "file:///w", "name": "w"}]});
        assert_eq!(root_of(&init), Some(PathBuf::from("/w")));
    }

    #[test]
    fn framing_round_trips() {
        let mut buf = Vec::new();
        write_message(&mut buf, &json!({"a": "é"})).unwrap();
        let mut input = std::io::BufReader::new(&buf[..]);
        assert_eq!(read_message(&mut input).unwrap(), Some(json!({"a": "é"})));
        assert_eq!(read_message(&mut input).unwrap(), None);
        let mut bad = std::io::BufReader::new(&b"Content-Length: 3\r\n\r\n{x}"[..]);
        assert!(read_message(&mut bad).unwrap().unwrap().get("__parse_error").is_some());
    }
}
