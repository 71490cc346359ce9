//! `caret ui` in a real headless Chromium (Debian's `chromium` and `chromium-driver`, over
//! WebDriver) against a scripted model server: open a file, type, see and accept Tab's ghost
//! text; save; a file changed on disk reloads, or shows the conflict when the tab has unsaved
//! edits; an agent turn changes two files, one is rejected and one accepted from the panel
//! and the files on disk match; requests without the launch token, from another origin or
//! for another host are refused. Screenshots go to `$CARGO_TARGET_TMPDIR/ui-screenshots`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use caret_test_support::TempDir;
use caret_test_support::scripted::{Answer, Behaviour, ScriptedUpstream};
use serde_json::{Value, json};

#[path = "common/browser.rs"]
mod browser;
#[path = "common/ui.rs"]
mod ui;
use browser::{Browser, GHOST};
use ui::Ui;

const CARET: &str = env!("CARGO_BIN_EXE_caret");

fn start_ui(home: &Path, workspace: &Path) -> Ui {
    ui::start(CARET, home, workspace)
}

fn read(ws: &TempDir, rel: &str) -> String {
    std::fs::read_to_string(ws.path().join(rel)).unwrap()
}

/// A config whose `agent` model is the scripted server at `url`.
fn agent_config(url: &str) -> String {
    format!(
        "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{url}\", model = \"m\" }}]\n"
    )
}

/// A git repository holding `files`, committed.
fn committed_repo(files: &[(&str, &str)]) -> TempDir {
    let repo = TempDir::new();
    for (path, text) in files {
        repo.write(path, text);
    }
    repo.git_init();
    repo.git(&["add", "-A"]);
    repo.git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init"]);
    repo
}

fn http() -> reqwest::blocking::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn shot(browser: &Browser, name: &str) {
    let path = screenshots().join(format!("{name}.png"));
    browser.screenshot(&path);
    println!("screenshot: {}", path.display());
}

#[test]
fn the_workspace_page_edits_completes_reloads_and_reviews_the_agents_changes() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("ui-model"));
    // Completions continue whatever was typed with this; chat answers come from the queue.
    up.set(Behaviour { answer: Some("urn a + b\n".to_owned()), ..Behaviour::default() });
    let home = TempDir::new();
    home.write(
        "config.toml",
        &format!(
            "[[models]]\nalias = \"tab\"\ndeployments = [{{ provider = \"openai\", url = \"{0}\", model = \"qwen2.5-coder-1.5b\" }}]\n\
             [[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{0}\", model = \"m\" }}]\n",
            up.url
        ),
    );
    let ws = TempDir::new();
    ws.write(".gitignore", "ignored.txt\n");
    ws.write("ignored.txt", "not listed\n");
    ws.write("app.py", "def add(a, b):\n    \n");
    ws.write("lib/other.py", "VALUE = 1\n");
    ws.write("notes.md", "# Notes\n");
    ws.git_init();
    let ui = start_ui(home.path(), ws.path());
    let c = http();

    // Security: the token, the host and the origin.
    let tree = |token: Option<&str>, origin: Option<&str>, host: Option<&str>| {
        let mut r = c.get(format!("{}/api/tree", ui.base));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        if let Some(h) = host {
            r = r.header("host", h);
        }
        r.send().unwrap()
    };
    assert_eq!(tree(None, None, None).status(), 401);
    assert_eq!(tree(Some("0".repeat(64).as_str()), None, None).status(), 401);
    assert_eq!(tree(Some(&ui.token), Some("http://evil.example"), None).status(), 403);
    assert_eq!(tree(Some(&ui.token), None, Some("evil.example")).status(), 403, "DNS rebinding");
    let listed: Value = tree(Some(&ui.token), Some(&ui.base), None).json().unwrap();
    assert_eq!(listed["files"], json!([".gitignore", "app.py", "lib/other.py", "notes.md"]), "{listed}");
    let opts = c
        .request(reqwest::Method::OPTIONS, format!("{}/api/tree", ui.base))
        .header("origin", "http://evil.example")
        .send()
        .unwrap();
    assert!(opts.headers().get("access-control-allow-origin").is_none(), "no CORS");
    let escape = c.get(format!("{}/api/file?path=../etc/passwd", ui.base)).bearer_auth(&ui.token).send().unwrap();
    assert_eq!(escape.status(), 400);

    let browser = Browser::start();
    let started = Instant::now();
    browser.open(&format!("{}/?open=app.py#token={}", ui.base, ui.token));
    browser.wait_for("the file open in the editor", 30, "return window.caret?.editor?.getModel()?.getValue()");
    println!("page load to an editable file: {} ms", started.elapsed().as_millis());
    assert_eq!(browser.eval("return location.hash"), "", "the token leaves the address bar");
    let tree_rows = browser.eval("return [...document.querySelectorAll('#tree li.file')].map((li) => li.dataset.path)");
    assert_eq!(
        tree_rows,
        json!(["lib/other.py", ".gitignore", "app.py", "notes.md"]),
        "directories first; ignored files not shown"
    );

    // Type on the empty line of the body; the ghost text appears and Tab accepts it.
    browser.eval("caret.editor.setPosition({lineNumber: 2, column: 5}); caret.editor.focus();");
    browser.keys("ret");
    let ghost = browser.wait_for("ghost text", 20, GHOST);
    assert_eq!(ghost, "urn a + b", "the model's continuation, cut at the line's end");
    shot(&browser, "1-ghost-text");
    // Tab accepts. (On a loaded machine a key press can land while Monaco is re-showing the
    // same suggestion and do nothing: it is pressed again while the ghost text is there.)
    let accepted = "return caret.editor.getModel().getValue().includes('return')";
    for _ in 0..3 {
        browser.keys("\u{E004}");
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until && browser.eval(accepted) != true {
            std::thread::sleep(Duration::from_millis(50));
        }
        if browser.eval(accepted) == true || browser.eval(GHOST) != "urn a + b" {
            break;
        }
    }
    assert_eq!(browser.eval("return caret.editor.getModel().getValue()"), "def add(a, b):\n    return a + b\n");
    let metrics = c.get(format!("{}/metrics", ui.base)).bearer_auth(&ui.token).send().unwrap().text().unwrap();
    // One suggestion accepted; on a slow machine the one for "re" may have shown too.
    let figure = |name: &str| -> f64 {
        let line = metrics.lines().find(|l| l.starts_with(&format!("{name}{{model=\"tab\"}} "))).unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (shown, accepted, partial) = (
        figure("caret_tab_shown_total"),
        figure("caret_tab_accepted_total"),
        figure("caret_tab_partially_accepted_total"),
    );
    assert!(
        accepted == 1.0 && partial == 0.0 && (1.0..=3.0).contains(&shown),
        "{metrics}\n{}",
        browser.eval("return JSON.stringify(caret.feedbackLog, null, 1)")
    );
    assert_eq!(figure("caret_tab_accept_rate"), accepted / shown, "{metrics}");
    let asked = up.last_request().unwrap().1;
    assert!(asked["prompt"].as_str().unwrap().contains("def add(a, b):"), "the page's text reached the model: {asked}");

    // Save (Ctrl-S) writes the file.
    browser.keys("\u{E009}s");
    browser.wait_for("saved", 10, "return !document.querySelector('#tabs .tab.dirty')");
    assert_eq!(read(&ws, "app.py"), "def add(a, b):\n    return a + b\n");

    // Changed on disk with no unsaved edits: reloads.
    std::fs::write(ws.path().join("app.py"), "def add(a, b):\n    return b + a\n").unwrap();
    browser.wait_for("the reload", 15, "return caret.editor.getModel().getValue().includes('b + a')");

    // Changed on disk with unsaved edits: the edits stay, the conflict shows, nothing lost.
    browser.eval("caret.editor.setPosition({lineNumber: 2, column: 17}); caret.editor.focus();");
    browser.keys("  # mine");
    std::fs::write(ws.path().join("app.py"), "def add(a, b):\n    return theirs\n").unwrap();
    browser.wait_for("the conflict", 15, "return !document.querySelector('#conflict').hidden");
    assert!(browser.eval("return caret.editor.getModel().getValue()").as_str().unwrap().contains("# mine"));
    shot(&browser, "2-conflict");
    browser.eval("document.querySelector('#conflict-mine').click()");
    browser.wait_for("mine saved", 10, "return document.querySelector('#conflict').hidden");
    assert!(read(&ws, "app.py").contains("# mine"), "{}", read(&ws, "app.py"));

    // Tab requests from the typing above settle first: the queued answers are the agent's.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = up.requests();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(700));
        let now = up.requests();
        if now == seen || std::time::Instant::now() > until {
            break;
        }
        seen = now;
    }
    // An agent turn changes two files; reject one, accept the other.
    up.queue([
        Answer::Calls(vec![
            ("write_file".into(), json!({"path": "lib/other.py", "content": "VALUE = 2\n"})),
            ("write_file".into(), json!({"path": "notes.md", "content": "# Notes\n\nAdded by the agent.\n"})),
        ]),
        Answer::Text("Changed both files.".into()),
    ]);
    browser.eval("const i = document.querySelector('[data-role=input]'); i.value = 'Update @lib/other.py and @notes.md'; document.querySelector('[data-role=send]').click();");
    browser.wait_for("the turn's end", 30, "return document.querySelector('#agent').dataset.busy === 'no' && document.querySelectorAll('.changes .changed').length === 2");
    let tools = browser.eval("return [...document.querySelectorAll('.entry.tool.ok')].map((e) => e.dataset.tool)");
    assert_eq!(tools, json!(["write_file", "write_file"]));
    let said =
        browser.eval("return [...document.querySelectorAll('.entry.assistant')].map((e) => e.textContent).join('')");
    assert_eq!(said, "Changed both files.");
    let attached = up.chats().into_iter().find(|c| c.get("messages").is_some()).unwrap();
    assert!(attached.to_string().contains("VALUE = 1"), "@lib/other.py was attached: {attached}");
    browser.eval("document.querySelector('.changes .changed[data-path=\"lib/other.py\"] a').click()");
    browser.wait_for(
        "the diff",
        10,
        "return !document.querySelector('#diff').hidden && caret.diffEditor.getModel()?.modified.getValue()",
    );
    assert_eq!(browser.eval("return caret.diffEditor.getModel().original.getValue()"), "VALUE = 1\n");
    assert_eq!(browser.eval("return caret.diffEditor.getModel().modified.getValue()"), "VALUE = 2\n");
    shot(&browser, "3-agent-diff");
    browser.eval("document.querySelector('.changes .changed[data-path=\"lib/other.py\"] .reject').click()");
    browser.eval("document.querySelector('.changes .changed[data-path=\"notes.md\"] .accept').click()");
    browser.wait_for("the review emptied", 10, "return document.querySelectorAll('.changes .changed').length === 0");
    assert_eq!(read(&ws, "lib/other.py"), "VALUE = 1\n", "rejected: restored");
    assert_eq!(read(&ws, "notes.md"), "# Notes\n\nAdded by the agent.\n", "accepted: kept");
    shot(&browser, "4-after-review");

    // A risky command waits for an approval in place: denied, it does not run. Then
    // "Restore checkpoint" on that turn's message rolls back what the turn wrote.
    up.queue([
        Answer::Calls(vec![("write_file".into(), json!({"path": "lib/other.py", "content": "VALUE = 3\n"}))]),
        Answer::Calls(vec![("run_terminal_cmd".into(), json!({"command": "rm notes.md"}))]),
        Answer::Text("Left the notes.".into()),
    ]);
    browser.eval("const i = document.querySelector('[data-role=input]'); i.value = 'Bump the value, drop the notes'; document.querySelector('[data-role=send]').click();");
    browser.wait_for("the approval", 30, "return !!document.querySelector('.entry.approval button')");
    assert_eq!(browser.eval("return document.querySelector('.entry.approval pre').textContent"), "rm notes.md");
    shot(&browser, "4b-approval");
    browser
        .eval("[...document.querySelectorAll('.entry.approval button')].find((b) => b.textContent === 'Deny').click()");
    browser.wait_for("the turn's end", 30, "return document.querySelector('#agent').dataset.busy === 'no' && document.querySelectorAll('.changes .changed').length === 1");
    assert_eq!(browser.eval("return document.querySelector('.entry.approval').dataset.decided"), "deny");
    assert!(ws.path().join("notes.md").exists(), "a denied command does not run");
    assert_eq!(read(&ws, "lib/other.py"), "VALUE = 3\n");
    browser.eval("window.confirm = () => true; [...document.querySelectorAll('.entry.user')].pop().querySelector('.restore').click()");
    let until = Instant::now() + Duration::from_secs(10);
    while read(&ws, "lib/other.py") != "VALUE = 1\n" {
        assert!(Instant::now() < until, "not restored: {}", read(&ws, "lib/other.py"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(read(&ws, "notes.md"), "# Notes\n\nAdded by the agent.\n", "files the turn did not change stay");

    // Cmd-K in the page: select a line, Ctrl-K, the instruction; the rewrite shows as a diff
    // and, accepted, lands in the buffer (unsaved).
    up.queue([Answer::Text("```python\n    return a + b  # the sum\n```\n".into())]);
    browser.eval("document.querySelector('#tabs .tab[data-path=\"app.py\"] span').click()");
    browser.eval("caret.editor.setValue('def add(a, b):\\n    return a + b\\n'); caret.editor.setSelection({startLineNumber: 2, startColumn: 1, endLineNumber: 2, endColumn: 10}); caret.editor.focus();");
    browser.keys("\u{E009}k");
    browser.wait_for(
        "the instruction box",
        10,
        "return !document.querySelector('#cmdk').hidden && document.activeElement.id === 'cmdk-input'",
    );
    browser.keys("comment it\u{E007}");
    browser.wait_for("the proposed edit", 30, "return !document.querySelector('#diff').hidden && caret.diffEditor.getModel()?.modified.getValue().includes('# the sum')");
    shot(&browser, "4c-cmd-k");
    browser.eval("document.querySelector('#review-accept').click()");
    assert_eq!(
        browser.eval("return caret.editor.getModel().getValue()"),
        "def add(a, b):\n    return a + b  # the sum\n"
    );

    // Search by meaning in the page (words only here: no embedding model), a hit opens its
    // file at its line.
    browser.eval("document.querySelector('.side-tabs button[data-side=search]').click(); document.querySelector('#search-q').value = 'added by the agent'; document.querySelector('#search-form').requestSubmit();");
    browser.wait_for("the hits", 60, "return document.querySelectorAll('#search-hits li').length > 0");
    assert_eq!(browser.eval("return document.querySelector('#search-hits li').dataset.path"), "notes.md");
    browser.eval("document.querySelector('#search-hits li').click()");
    let line =
        browser.eval("return document.querySelector('#search-hits li').textContent.match(/notes\\.md:(\\d+)/)[1]");
    browser.wait_for(
        "the hit opened at its line",
        10,
        &format!("return caret.editor.getModel()?.getValue().startsWith('# Notes') && caret.editor.getPosition().lineNumber === {}", line.as_str().unwrap()),
    );

    // Cmd-K through the API, on a selection within a line; the project's rule for Python
    // files goes with it.
    ws.write(".caret/rules/python.md", "---\nglobs: \"*.py\"\n---\nEvery comment ends with a full stop.\n");
    up.queue([Answer::Text("Here:\n```python\n    return a + b  # the sum\n```\n".into())]);
    let text = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n";
    let edited: Value = c
        .post(format!("{}/api/edit", ui.base))
        .bearer_auth(&ui.token)
        .json(&json!({"path": "app.py", "text": text, "start": 20, "end": 24, "instruction": "comment it"}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(edited["text"], "def add(a, b):\n    return a + b  # the sum\n\nprint(add(1, 2))\n", "{edited}");
    assert_eq!(edited["format"], "search-replace");
    // The edit's own request (the page may have asked the model for something since).
    let chats = up.chats();
    let sent = chats.iter().rev().find(|c| c["messages"].to_string().contains("comment it"));
    let system = sent.map(|c| c["messages"][0]["content"].as_str().unwrap_or_default()).unwrap_or_default();
    assert!(system.contains("Every comment ends with a full stop."), "{chats:?}");
    // Grep, a hit at its line.
    let found: Value = c
        .get(format!("{}/api/search?mode=grep&q=Added%20by", ui.base))
        .bearer_auth(&ui.token)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        found["hits"],
        json!([{"path": "notes.md", "line": 3, "end_line": 3, "snippet": "Added by the agent."}])
    );
    assert!(up.violations().is_empty(), "{:?}", up.violations());
}

#[test]
fn a_background_run_started_from_the_page_is_reviewed_and_applied() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("run-model"));
    up.set(Behaviour { conversation: caret_test_support::scripted::fix_add_conversation(), ..Behaviour::default() });
    let home = TempDir::new();
    home.write("config.toml", &agent_config(&up.url));
    let repo = committed_repo(&[("add.sh", "echo $(( $1 - $2 ))\n")]);
    let ui = start_ui(home.path(), repo.path());
    let browser = Browser::start();
    browser.open(&format!("{}/#token={}", ui.base, ui.token));
    browser.wait_for("the page", 30, "return window.caret?.ready");
    browser.eval("document.querySelector('.side-tabs button[data-side=runs]').click()");
    browser.eval("document.querySelector('#run-task').value = 'make add.sh add'; document.querySelector('#run-form button').click();");
    browser.wait_for("the run to succeed", 120, "const li = document.querySelector('#run-list li'); return li && (li.className === 'failed' ? 'failed: ' + li.textContent : li.className === 'succeeded')");
    assert_eq!(browser.eval("return document.querySelector('#run-list li').className"), "succeeded");
    browser.eval("document.querySelector('#run-list li').click()");
    browser.wait_for(
        "the run's patch",
        20,
        "return [...document.querySelectorAll('#run-list li a')].map((a) => a.textContent).join(',')",
    );
    browser.eval("document.querySelector('#run-list li a').click()");
    browser.wait_for(
        "the patch's diff",
        10,
        "return !document.querySelector('#diff').hidden && caret.diffEditor.getModel()?.modified.getValue()",
    );
    assert_eq!(browser.eval("return caret.diffEditor.getModel().modified.getValue()"), "echo $(( $1 + $2 ))\n");
    shot(&browser, "5-run-patch");
    assert_eq!(read(&repo, "add.sh"), "echo $(( $1 - $2 ))\n", "nothing applied before asked");
    browser.eval(
        "[...document.querySelectorAll('#run-list li button')].find((b) => b.textContent.startsWith('Apply')).click()",
    );
    let until = Instant::now() + Duration::from_secs(20);
    while read(&repo, "add.sh") != "echo $(( $1 + $2 ))\n" {
        assert!(Instant::now() < until, "the patch was not applied: {}", read(&repo, "add.sh"));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A project's MCP server waits for the user's trust on the page: the agent panel shows what
/// it would run; Trust remembers it (as `caret mcp trust` does), the panel shows the server
/// starting and ready, and the chat then calls its tool, shown with its server.
#[test]
fn a_project_mcp_server_is_trusted_from_the_page_and_its_tool_called() {
    let Some(python) = caret_test_support::mcp::python() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("mcp-model"));
    up.set(Behaviour {
        conversation: vec![
            Answer::Calls(vec![("mcp__probe__echo".into(), json!({"text": "from the page"}))]),
            Answer::Text("It echoed.".into()),
        ],
        ..Behaviour::default()
    });
    let home = TempDir::new();
    home.write("config.toml", &agent_config(&up.url));
    let ws = TempDir::new();
    ws.write("probe.py", caret_test_support::mcp::PROBE);
    ws.write(
        ".caret/mcp.json",
        &json!({"mcpServers": {"probe": {"command": python, "args": ["probe.py"]}}}).to_string(),
    );
    let ui = start_ui(home.path(), ws.path());
    let browser = Browser::start();
    browser.open(&format!("{}/#token={}", ui.base, ui.token));
    browser.wait_for("the page", 30, "return window.caret?.ready");
    let asked = browser.wait_for(
        "the trust notice",
        20,
        "return document.querySelector('[data-role=mcp-trust][data-server=probe]')?.textContent",
    );
    let asked = asked.as_str().unwrap();
    assert!(asked.contains(".caret/mcp.json declares the MCP server probe") && asked.contains("probe.py"), "{asked}");
    shot(&browser, "6-mcp-trust");
    assert!(!home.join("mcp-trust.json").exists(), "nothing trusted before the click");
    browser.eval("document.querySelector('[data-role=mcp-trust][data-server=probe] [data-role=trust]').click()");
    browser.wait_for(
        "the trust",
        20,
        "return document.querySelector('[data-role=mcp-trust]')?.dataset.trusted === 'yes'",
    );
    assert!(read_home(&home, "mcp-trust.json").contains("probe.py"));
    let ready = browser.wait_for(
        "the server ready",
        60,
        "const l = document.querySelector('[data-role=mcp-servers]'); return l?.dataset.ready === 'probe' && l.textContent",
    );
    assert!(ready.as_str().unwrap().contains("probe ready (6 tools, MCP 2026-07-28)"), "{ready}");
    browser.eval("const i = document.querySelector('[data-role=input]'); i.value = 'Echo something'; document.querySelector('[data-role=send]').click();");
    browser.wait_for("the turn's end", 30, "return document.querySelector('#agent').dataset.busy === 'no' && document.querySelector('.entry.assistant')?.textContent");
    let call = browser.eval(
        "const e = document.querySelector('.entry.tool[data-tool=mcp__probe__echo]'); return [e.className, e.querySelector('.tool-server').textContent, e.querySelector('.output').textContent]",
    );
    assert_eq!(call[0], "entry tool ok", "{call}");
    assert_eq!(call[1], "MCP server probe");
    assert!(call[2].as_str().unwrap().contains("from the page"), "{call}");
    shot(&browser, "7-mcp-call");
    assert!(up.violations().is_empty(), "{:?}", up.violations());
}

fn read_home(home: &TempDir, rel: &str) -> String {
    std::fs::read_to_string(home.path().join(rel)).unwrap()
}

/// Documentation on the page: the search pane's docs mode finds a section of an added source
/// (title, heading, source and URL shown); the agent panel offers `@Docs NAME` among its
/// mentions, and a request naming it carries that source's best sections to the model.
#[test]
fn added_documentation_is_searched_and_mentioned_from_the_page() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("docs-model"));
    up.set(Behaviour { conversation: vec![Answer::Text("With backoff.".into())], ..Behaviour::default() });
    let home = TempDir::new();
    home.write("config.toml", &agent_config(&up.url));
    let docs = TempDir::new();
    docs.write("guide/retry.md", "# Retries\n\n## Backoff\n\nFailed calls are retried with exponential backoff.\n");
    docs.write("index.md", "# mylib\n\nA client library.\n");
    let added = std::process::Command::new(CARET)
        .args(["docs", "add", docs.path().to_str().unwrap(), "--name", "mylib", "--no-embed"])
        .env("CARET_HOME", home.path())
        .env_remove("CARET_SERVER")
        .output()
        .unwrap();
    assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stderr));
    let ws = TempDir::new();
    ws.write("README.md", "# a project\n");
    let ui = start_ui(home.path(), ws.path());
    let browser = Browser::start();
    browser.open(&format!("{}/#token={}", ui.base, ui.token));
    browser.wait_for("the page", 30, "return window.caret?.ready");
    browser.eval("document.querySelector('.side-tabs button[data-side=search]').click()");
    browser.eval("document.querySelector('#search-form input[value=docs]').click(); document.querySelector('#search-q').value = 'exponential backoff'; document.querySelector('#search-form').requestSubmit();");
    let hit = browser.wait_for(
        "a docs hit",
        30,
        "const li = document.querySelector('#search-hits li[data-url]'); return li && [li.querySelector('.where').textContent, li.querySelector('.source').textContent, li.querySelector('pre').textContent]",
    );
    assert_eq!(hit[0], "Retries", "{hit}");
    assert!(hit[1].as_str().unwrap().starts_with("mylib · file://"), "{hit}");
    assert!(hit[2].as_str().unwrap().contains("exponential backoff"), "{hit}");
    shot(&browser, "8-docs-search");

    browser.eval("const i = document.querySelector('[data-role=input]'); i.value = 'How are calls retried? @Do'; i.selectionStart = i.value.length; i.dispatchEvent(new Event('input'));");
    let offered = browser.wait_for(
        "the @Docs mention",
        10,
        "return [...document.querySelectorAll('.mentions li')].map((li) => li.dataset.mention).join(',')",
    );
    assert_eq!(offered, "Docs mylib");
    browser.eval("document.querySelector('.mentions li').click(); document.querySelector('[data-role=send]').click();");
    browser.wait_for("the answer", 30, "return document.querySelector('.entry.assistant')?.textContent");
    let asked = up.chats().into_iter().find(|c| c.get("messages").is_some()).unwrap();
    let request = asked["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(request.starts_with("How are calls retried? @Docs mylib"), "{request}");
    assert!(request.contains("[@Docs mylib: ") && request.contains("exponential backoff"), "{request}");
    assert!(up.violations().is_empty(), "{:?}", up.violations());
}

/// Next edit in the page, with no model at all: a rename typed in the signature is followed
/// by the next use marked (what it becomes after it); Tab jumps there, Tab applies it, and
/// the last use is offered next; Esc dismisses one.
#[test]
fn the_page_offers_a_renames_next_edit_and_tab_applies_it() {
    let home = TempDir::new();
    let ws = TempDir::new();
    ws.write("stats.py", "def mean(values):\n    total = sum(values)\n    return total / len(values)\n");
    let ui = start_ui(home.path(), ws.path());
    let browser = Browser::start();
    browser.open(&format!("{}/?open=stats.py#token={}", ui.base, ui.token));
    browser.wait_for("the file open in the editor", 30, "return window.caret?.editor?.getModel()?.getValue()");
    // `values` → `xs` in the signature, as typing does (select the word, type over it).
    browser.eval("caret.editor.setSelection({startLineNumber: 1, startColumn: 10, endLineNumber: 1, endColumn: 16}); caret.editor.focus();");
    browser.keys("xs");
    let offered = browser.wait_for("the next edit", 20, "return window.caret.nextEdit");
    assert_eq!((offered["text"].as_str(), offered["line"].as_u64()), (Some("xs"), Some(2)), "{offered}");
    let marked = "return [...document.querySelectorAll('.caret-next-edit-text')].map((e) => e.textContent).join('').replace(/\\u00a0/g, ' ')";
    assert_eq!(browser.wait_for("the mark", 10, marked), " ⇥ xs");
    shot(&browser, "next-edit-offered");
    // Monaco's word suggestions may be up for the word just typed (under load they come
    // late): they take Tab and Esc first, so Esc closes them and leaves the next edit.
    let suggesting = "return document.querySelector('.suggest-widget.visible') !== null";
    std::thread::sleep(Duration::from_millis(500));
    if browser.eval(suggesting) == true {
        browser.keys("\u{E00C}");
        browser.wait_for("the suggestions closed", 10, &format!("return !({})", &suggesting[7..]));
        assert_eq!(browser.wait_for("the mark kept", 5, marked), " ⇥ xs");
    }
    let value = "return caret.editor.getModel().getValue()";
    browser.keys("\u{E004}"); // Tab: to it
    browser.wait_for("the cursor at the next use", 10, "return caret.editor.getPosition().lineNumber === 2");
    assert!(browser.eval(value).as_str().unwrap().contains("sum(values)"), "not applied yet");
    browser.keys("\u{E004}"); // Tab: apply
    browser.wait_for("applied", 10, &format!("{value}.includes('sum(xs)')"));
    // The last use is offered next; Esc dismisses it.
    browser.wait_for("the last use offered", 20, "return window.caret.nextEdit?.line === 3");
    browser.wait_for("its mark", 10, marked);
    browser.keys("\u{E00C}"); // Esc
    browser.wait_for("dismissed", 10, &format!("{marked} === ''"));
    assert!(browser.eval(value).as_str().unwrap().contains("len(values)"), "Esc applies nothing");
    // Counted on /metrics: one applied, the others shown dismissed (the rest of the rename,
    // and any shown for `x` alone when a pause under load came between the keys).
    let c = http();
    let figure = |name: &str| -> String {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let metrics = c.get(format!("{}/metrics", ui.base)).bearer_auth(&ui.token).send().unwrap().text().unwrap();
            let value = metrics.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap().to_owned();
            if value != "0" || Instant::now() > until {
                return value;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let [shown, accepted, rejected, rate] = ["shown_total", "accepted_total", "rejected_total", "accept_rate"]
        .map(|f| figure(&format!("caret_next_edit_{f}")).parse::<f64>().unwrap());
    assert!(
        accepted == 1.0 && shown >= 2.0 && rejected == shown - 1.0 && rate == 1.0 / shown,
        "{shown} {accepted} {rejected} {rate}"
    );
}

/// With no model configured or installed, the page offers the default one (its name and
/// size); a download that cannot reach the package index says why and offers a retry, and
/// installs nothing. (The model is 1 GB: the download itself is `caret models pull`'s, tested
/// with the catalog's archives in `caret-weights`.)
#[test]
fn a_page_without_a_model_offers_the_default_one() {
    let home = TempDir::new();
    let ws = TempDir::new();
    ws.write("app.py", "def add(a, b):\n    \n");
    // A package index that has nothing.
    let empty = TempDir::new();
    let port = caret_test_support::free_port();
    let _index = caret_test_support::ChildGuard::listening(
        std::process::Command::new("python3")
            .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1", "--directory"])
            .arg(empty.path()),
        port,
    );
    let index = format!("http://127.0.0.1:{port}");
    let ui = ui::start_env(CARET, home.path(), ws.path(), &[("CARET_PYPI_URL", &index)]);
    let offer: Value =
        http().get(format!("{}/api/models/default", ui.base)).bearer_auth(&ui.token).send().unwrap().json().unwrap();
    assert_eq!(
        (&offer["needed"], &offer["model"]),
        (&json!(true), &json!("qwen2.5-coder-1.5b-instruct-q4")),
        "{offer}"
    );
    assert!(offer["size"].as_u64().unwrap() > 900_000_000, "{offer}");
    let browser = Browser::start();
    browser.open(&format!("{}/#token={}", ui.base, ui.token));
    browser.wait_for("the page", 30, "return window.caret?.ready");
    let said =
        browser.wait_for("the offer", 20, "return document.querySelector('#model-offer:not([hidden])')?.textContent");
    assert!(
        said.as_str().unwrap().contains("qwen2.5-coder-1.5b-instruct-q4 (1.0 GiB, runs on this machine's CPU)"),
        "{said}"
    );
    shot(&browser, "model-offer");
    assert_eq!(browser.eval("return document.querySelector('#model-offer button').textContent"), "Download");
    browser.eval("document.querySelector('#model-offer button').click()");
    let failed = browser.wait_for(
        "the download's failure",
        60,
        "const o = document.querySelector('#model-offer'); return o.dataset.state === 'failed' && o.textContent",
    );
    assert!(failed.as_str().unwrap().contains("The download failed"), "{failed}");
    assert_eq!(browser.eval("return document.querySelector('#model-offer button').textContent"), "Retry");
    assert!(!home.join("models/qwen2.5-coder-1.5b-instruct-q4").exists(), "nothing installed");
}

/// A rename whose file has no use left goes on in another open file: the page says which, Tab
/// opens it at the use, Tab again renames it there.
#[test]
fn the_page_carries_a_rename_into_another_open_file() {
    let home = TempDir::new();
    let ws = TempDir::new();
    ws.write("report.py", "from stats import mean\nprint(mean([1, 2]))\n");
    ws.write("stats.py", "def mean(values):\n    return sum(values) / len(values)\n");
    ws.write("tools/other.py", "from stats import mean\n");
    let ui = start_ui(home.path(), ws.path());
    let browser = Browser::start();
    browser.open(&format!("{}/?open=report.py#token={}", ui.base, ui.token));
    browser.wait_for("report.py open", 30, "return window.caret?.editor?.getModel()?.getValue()?.includes('mean')");
    browser.eval("document.querySelector('#tree li.file[data-path=\"stats.py\"]').click()");
    let on_stats = "return caret.editor.getModel().getValue().startsWith('def mean')";
    browser.wait_for("stats.py open", 20, on_stats);
    // `mean` → `average` in the definition.
    browser.eval("caret.editor.setSelection({startLineNumber: 1, startColumn: 5, endLineNumber: 1, endColumn: 9}); caret.editor.focus();");
    browser.keys("average");
    let offered = browser.wait_for(
        "the next edit in report.py",
        20,
        "return window.caret.nextEdit?.path === 'report.py' && window.caret.nextEdit",
    );
    assert_eq!((offered["text"].as_str(), offered["line"].as_u64()), (Some("average"), Some(1)), "{offered}");
    let marked = "return [...document.querySelectorAll('.caret-next-edit-text')].map((e) => e.textContent).join('').replace(/\\u00a0/g, ' ')";
    assert_eq!(browser.wait_for("the mark", 10, marked), " ⇥ report.py:1 average");
    shot(&browser, "next-edit-other-file");
    let suggesting = "return document.querySelector('.suggest-widget.visible') !== null";
    std::thread::sleep(Duration::from_millis(500));
    if browser.eval(suggesting) == true {
        browser.keys("\u{E00C}");
        browser.wait_for("the suggestions closed", 10, &format!("return !({})", &suggesting[7..]));
    }
    browser.keys("\u{E004}"); // Tab: report.py, at the use
    let value = "return caret.editor.getModel().getValue()";
    browser.wait_for("report.py shown", 20, &format!("{value}.startsWith('from stats')"));
    browser.wait_for("its use marked", 10, &format!("{marked} === ' ⇥ average'"));
    browser.keys("\u{E004}"); // Tab: apply
    browser.wait_for("renamed there", 10, &format!("{value}.startsWith('from stats import average')"));
    // Its second use in the same file, then a workspace file that is not open.
    browser.wait_for("the second use", 20, "return window.caret.nextEdit?.line === 2 && !window.caret.nextEdit.path");
    browser.keys("\u{E004}");
    browser.wait_for("at it", 10, "return caret.editor.getPosition().lineNumber === 2");
    browser.keys("\u{E004}");
    browser.wait_for("renamed", 10, &format!("{value}.includes('print(average(')"));
    let closed = browser.wait_for(
        "a use in a file not open",
        20,
        "return window.caret.nextEdit?.path === 'tools/other.py' && window.caret.nextEdit",
    );
    assert_eq!(closed["line"], 1, "{closed}");
}

/// The conventions from the page: `/` completes the repository's custom commands; Plan mode
/// runs the command as a read-only turn whose plan is shown, edited and approved, then built;
/// "Run N" tries a task in two git worktrees at once, shows the diffs side by side, applies the
/// chosen one and removes the worktrees.
#[test]
fn the_page_completes_commands_plans_then_builds_and_runs_attempts_in_worktrees() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("page-model"));
    let home = TempDir::new();
    home.write("config.toml", &agent_config(&up.url));
    let repo = committed_repo(&[
        ("add.sh", "echo $(( $1 - $2 ))\n"),
        (
            ".claude/commands/fix.md",
            "---\ndescription: Fix a bug\nargument-hint: [what]\n---\nFix the bug in $ARGUMENTS, with a test.\n",
        ),
    ]);
    let ui = start_ui(home.path(), repo.path());
    let browser = Browser::start();
    browser.open(&format!("{}/#token={}", ui.base, ui.token));
    browser.wait_for("the page", 30, "return window.caret?.ready");

    // `/f` offers the command with its hint and description; picking it fills the input.
    let type_in = |text: &str| browser.fill("[data-role=input]", text);
    type_in("/f");
    let offered = browser.wait_for(
        "the command offered",
        20,
        "return document.querySelector('.mentions:not([hidden]) li[data-command=fix]')?.textContent",
    );
    assert_eq!(offered, "/fix [what] — Fix a bug");
    browser.eval("document.querySelector('li[data-command=fix]').click()");
    assert_eq!(browser.eval("return document.querySelector('[data-role=input]').value"), "/fix ");
    type_in("/fix add.sh");

    // Plan mode: the command's prompt goes out with read-only tools; the plan comes back.
    let plan = json!({"summary": "Fix add.sh", "steps": [{"title": "Use + in add.sh", "files": ["add.sh"]}], "risks": ["none"]});
    up.queue([Answer::Calls(vec![("submit_plan".into(), plan)])]);
    browser.eval("document.querySelector('[data-role=plan-mode]').click()");
    browser.wait_for("plan mode", 20, "return document.querySelector('#agent').dataset.mode === 'plan'");
    browser.eval("document.querySelector('[data-role=send]').click()");
    let steps = browser.wait_for("the plan", 30, "return document.querySelector('[data-role=plan] ol')?.textContent");
    assert_eq!(steps, "Use + in add.sh (add.sh)");
    shot(&browser, "9-plan-proposed");
    let asked = up.chats()[0].clone();
    let tools: Vec<&str> =
        asked["tools"].as_array().unwrap().iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    assert!(tools.contains(&"submit_plan") && !tools.contains(&"edit_file"), "{tools:?}");
    assert!(asked["messages"].to_string().contains("Fix the bug in add.sh, with a test."), "the command expanded");
    assert_eq!(read(&repo, "add.sh"), "echo $(( $1 - $2 ))\n", "nothing built while planning");

    // The plan edited, then approved: built in build mode, the edited plan as the todo list.
    up.queue(caret_test_support::scripted::fix_add_conversation().into_iter().skip(1));
    browser.eval(
        "const t = document.querySelector('[data-role=plan-text]'); t.value = t.value.replace('Use + in add.sh', 'Add with + in add.sh'); document.querySelector('[data-role=approve-plan]').click();",
    );
    browser.wait_for(
        "the build",
        30,
        "return document.querySelector('#agent').dataset.mode === 'build' && document.querySelector('#agent').dataset.busy === 'no' && document.querySelector('.todos')?.textContent.includes('Add with + in add.sh')",
    );
    shot(&browser, "10-plan-built");
    let until = Instant::now() + Duration::from_secs(20);
    while read(&repo, "add.sh") != "echo $(( $1 + $2 ))\n" {
        assert!(Instant::now() < until, "the plan was not built: {}", read(&repo, "add.sh"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let build = up.chats().iter().find(|c| c["messages"].to_string().contains("Add with + in add.sh")).cloned();
    assert!(build.is_some(), "the edited plan went to the model");

    // Run N: the checkout back at HEAD; two attempts, each in its own worktree.
    repo.git(&["checkout", "--", "add.sh"]);
    up.set(Behaviour { conversation: caret_test_support::scripted::fix_add_conversation(), ..Behaviour::default() });
    type_in("make add.sh add");
    browser.eval("document.querySelector('[data-role=run-n]').value = '2'; document.querySelector('[data-role=run-parallel]').click();");
    let heads = browser.wait_for(
        "the attempts side by side",
        120,
        "const h = [...document.querySelectorAll('.attempts .attempt-head')].map((h) => h.textContent); return h.length ? h : null",
    );
    assert_eq!(heads, json!(["Attempt 1 · agent · done", "Attempt 2 · agent · done"]));
    let diffs = browser.eval("return [...document.querySelectorAll('.attempts .diff .add')].map((l) => l.textContent)");
    assert_eq!(diffs, json!(["+echo $(( $1 + $2 ))", "+echo $(( $1 + $2 ))"]));
    shot(&browser, "11-attempts");
    let worktrees = || {
        let out =
            std::process::Command::new("git").arg("-C").arg(repo.path()).args(["worktree", "list"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    assert_eq!(worktrees(), 3, "the main checkout and the two attempts'");
    assert_eq!(read(&repo, "add.sh"), "echo $(( $1 - $2 ))\n", "nothing applied before asked");
    browser.eval("document.querySelector('.attempt[data-attempt=\"2\"] [data-role=apply-attempt]').click()");
    browser.wait_for(
        "applied",
        30,
        "return !document.querySelector('.attempts') && [...document.querySelectorAll('.entry')].some((e) => e.textContent === 'applied attempt 2')",
    );
    assert_eq!(read(&repo, "add.sh"), "echo $(( $1 + $2 ))\n");
    assert_eq!(worktrees(), 1, "the worktrees are removed");
    assert!(up.violations().is_empty(), "{:?}", up.violations());
}
