//! The VS Code extension (`editors/vscode`): installed from its lock file, type-checked,
//! its logic tested with Node's test runner, and packaged as a `.vsix` whose contents are
//! checked; then run in a real VS Code (code-server) driven by headless Chromium.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use caret_test_support::TempDir;
use caret_test_support::scripted::{Answer, Behaviour, ScriptedUpstream};
use serde_json::json;

#[path = "common/browser.rs"]
mod browser;
use browser::{Browser, GHOST};

fn npm(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("npm").args(args).current_dir(dir).output().unwrap_or_else(|e| {
        panic!("npm {args:?}: {e} (the extension's test needs Node.js and npm; .ci/run installs them)")
    });
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "npm {args:?} failed:\n{text}");
    text
}

#[test]
fn the_vscode_extension_type_checks_passes_its_tests_and_packages() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../editors/vscode");
    npm(&dir, &["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]);
    npm(&dir, &["run", "check"]);
    let tests = npm(&dir, &["test"]);
    assert!(tests.contains("# fail 0") && !tests.contains("# pass 0"), "{tests}");
    npm(&dir, &["run", "package"]);
    let vsix = std::fs::File::open(dir.join("caret.vsix")).unwrap();
    let mut zip = zip::ZipArchive::new(vsix).unwrap();
    let names: Vec<String> = zip.file_names().map(str::to_owned).collect();
    for want in [
        "extension/package.json",
        "extension/dist/extension.js",
        "extension/media/panel.js",
        "extension/media/panel.css",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in the package: {names:?}");
    }
    assert!(
        !names.iter().any(|n| n.contains("node_modules") || n.contains("/src/")),
        "sources or packages shipped: {names:?}"
    );
    let mut manifest = String::new();
    zip.by_name("extension/package.json").unwrap().read_to_string(&mut manifest).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(manifest["main"], "./dist/extension.js");
    let commands: Vec<&str> = manifest["contributes"]["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["command"].as_str().unwrap())
        .collect();
    assert_eq!(
        commands,
        [
            "caret.openAgent",
            "caret.searchCodebase",
            "caret.grep",
            "caret.restartServer",
            "caret.signIn",
            "caret.nextEdit",
            "caret.dismissNextEdit"
        ]
    );
    // The extension reuses the page's panel component rather than a copy of it.
    let mut panel = String::new();
    zip.by_name("extension/media/panel.js").unwrap().read_to_string(&mut panel).unwrap();
    assert!(panel.contains("Restore checkpoint"), "the webview bundles web/src/agent-panel.js");
    in_code_server(&dir.join("caret.vsix"));
}

/// code-server (VS Code in the browser, from the npm registry; `.ci/run` installs it under
/// `editors/vscode/e2e/`), or `CARET_TEST_CODE_SERVER`.
fn code_server() -> Option<PathBuf> {
    let given = std::env::var_os("CARET_TEST_CODE_SERVER").map(PathBuf::from);
    let installed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../editors/vscode/e2e/node_modules/.bin/code-server");
    given.or(Some(installed)).filter(|p| p.exists())
}

fn shot(browser: &Browser, name: &str) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("vscode-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.png"));
    browser.screenshot(&path);
    println!("screenshot: {}", path.display());
}

/// The packaged extension in a real VS Code (code-server) driven by headless Chromium: Tab's
/// suggestion from a scripted model shows as ghost text (not in the completion list) and Tab
/// accepts it; a rename's next edit is offered, Tab jumps to it and Tab again applies it.
fn in_code_server(vsix: &Path) {
    let Some(code_server) = code_server() else {
        caret_test_support::skip("code-server is not installed (editors/vscode/e2e; .ci/run installs it)");
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("vscode-model"));
    up.set(Behaviour { answer: Some("urn a + b\n".to_owned()), ..Behaviour::default() });
    let home = TempDir::new();
    home.write(
        "caret/config.toml",
        &format!(
            "[[models]]\nalias = \"tab\"\ndeployments = [{{ provider = \"openai\", url = \"{0}\", model = \"qwen2.5-coder-1.5b\" }}]\n\
             [[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{0}\", model = \"m\" }}]\n",
            up.url
        ),
    );
    let settings = json!({
        "caret.path": env!("CARGO_BIN_EXE_caret"),
        "workbench.startupEditor": "none",
        "security.workspace.trust.enabled": false,
        "telemetry.telemetryLevel": "off",
        "extensions.ignoreRecommendations": true,
        "workbench.tips.enabled": false,
        "editor.inlineSuggest.enabled": true,
        "editor.quickSuggestions": {"other": false, "comments": false, "strings": false},
    });
    home.write("data/User/settings.json", &settings.to_string());
    let ws = TempDir::new();
    ws.write("app.py", "def add(a, b):\n    \n");
    ws.write("stats.py", "def mean(values):\n    total = sum(values)\n    return total / len(values)\n");
    ws.write("lib.py", "VALUE = 1\n");
    ws.write("report.py", "from stats import mean\nprint(mean([1, 2]))\n");
    ws.write(".claude/commands/bump.md", "---\ndescription: Bump a value\n---\nBump the value in $1.\n");
    let install = Command::new(&code_server)
        .args(["--extensions-dir"])
        .arg(home.join("ext"))
        .arg("--user-data-dir")
        .arg(home.join("data"))
        .arg("--install-extension")
        .arg(vsix)
        .output()
        .unwrap();
    assert!(install.status.success(), "{}", String::from_utf8_lossy(&install.stderr));
    let port = caret_test_support::free_port();
    let _server = caret_test_support::ChildGuard::listening(
        Command::new(&code_server)
            .args(["--auth", "none", "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust"])
            .arg("--bind-addr")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--extensions-dir")
            .arg(home.join("ext"))
            .arg("--user-data-dir")
            .arg(home.join("data"))
            .arg(ws.path())
            .env("CARET_HOME", home.join("caret"))
            .env_remove("CARET_SERVER")
            .env_remove("CARET_CONFIG"),
        port,
    );
    let browser = Browser::start();
    browser.open(&format!("http://127.0.0.1:{port}/?folder={}", ws.path().display()));
    browser.wait_for(
        "the workbench",
        60,
        "return document.querySelector('.monaco-workbench .explorer-folders-view') !== null",
    );
    let quick_open =
        "return document.querySelector('.quick-input-widget:not([style*=\"display: none\"]) input') !== null";
    let open = |name: &str| {
        let tab = format!(
            "return [...document.querySelectorAll('.tab.active')].some((t) => t.textContent.trim() === '{name}')"
        );
        browser.keys("\u{E009}p");
        browser.wait_for("quick open", 20, quick_open);
        std::thread::sleep(Duration::from_millis(300));
        browser.keys(name);
        // Enter until it opens: a key pressed while the list is still filling does nothing.
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(700));
            if browser.eval(&tab) == true {
                break;
            }
            browser.keys("\u{E007}");
        }
        browser.wait_for(name, 20, &tab);
        std::thread::sleep(Duration::from_millis(500));
    };
    let lines = "return [...document.querySelectorAll('.editor-instance .view-line')].map((l) => l.textContent.replace(/\\u00a0/g, ' ')).join('\\n')";

    // Tab: type in the function's empty body; ghost text comes from the model; Tab takes it.
    open("app.py");
    browser.keys("\u{E009}\u{E010}"); // Ctrl+End, ↑, End: the end of the empty body line
    browser.keys("\u{E013}\u{E010}");
    browser.keys("ret");
    let ghost = browser.wait_for("ghost text", 60, GHOST);
    shot(&browser, "1-ghost-text");
    assert_eq!(ghost, "urn a + b", "an inline suggestion, as ghost text");
    assert_eq!(
        browser.eval("return document.querySelector('.suggest-widget.visible') !== null"),
        false,
        "not the completion list"
    );
    // Word by word (Ctrl+→), then the rest with Tab.
    browser.keys("\u{E009}\u{E014}");
    browser.wait_for(
        "one word accepted",
        20,
        &format!("{lines}.includes('    return') && !{lines}.includes('return a')"),
    );
    let rest = browser.wait_for("the rest as ghost text", 20, GHOST);
    assert_eq!(rest, " a + b");
    browser.keys("\u{E004}");
    browser.wait_for("the suggestion accepted", 20, &format!("{lines}.includes('return a + b')"));
    shot(&browser, "2-accepted");

    // Next edit: rename `values` in the signature; the next use is offered; Tab, Tab. (The
    // model suggests nothing now: ghost text would take Tab first, as it should.)
    up.set(Behaviour { answer: Some(String::new()), ..Behaviour::default() });
    // Renames the word `right` places into stats.py's first line to `to`, as a user does.
    let rename = |right: usize, to: &str, typed: &str| {
        open("stats.py");
        browser.keys("\u{E009}\u{E011}"); // Ctrl+Home
        for _ in 0..right {
            browser.keys("\u{E014}"); // → into the word
        }
        browser.keys("\u{E009}d"); // Ctrl+D selects the word
        browser.keys(to);
        browser.wait_for("the rename typed", 20, &format!("{lines}.includes('{typed}')"));
    };
    // Whether a mark after the text says `what`.
    let mark = |what: &str| {
        format!(
            "return [...document.querySelectorAll('.view-lines span')].some((s) => getComputedStyle(s, '::after').content.includes('{what}'))"
        )
    };
    rename(10, "xs", "def mean(xs):");
    // After a pause the next use is marked, with what it becomes after it.
    browser.wait_for("the next edit marked", 20, &mark("⇥ xs"));
    shot(&browser, "3-next-edit-offered");
    let at_line = |n: u32| format!("return document.querySelector('.statusbar').textContent.includes('Ln {n},')");
    assert_eq!(browser.eval(&at_line(1)), true);
    browser.keys("\u{E004}"); // Tab: to the next use
    browser.wait_for("the cursor at the next use", 20, &at_line(2));
    assert_eq!(browser.eval(&format!("{lines}.includes('sum(values)')")), true, "not applied yet");
    browser.keys("\u{E004}"); // Tab: apply it
    browser.wait_for("the next edit applied", 20, &format!("{lines}.includes('total = sum(xs)')"));
    shot(&browser, "4-next-edit-applied");
    std::thread::sleep(Duration::from_millis(1500));
    browser.keys("\u{E004}");
    std::thread::sleep(Duration::from_millis(300));
    browser.keys("\u{E004}");
    browser.wait_for("the last use renamed", 20, &format!("{lines}.includes('len(xs)')"));
    // Nothing is left to predict (the model answers nothing: no edit, not a deleted region).
    std::thread::sleep(Duration::from_millis(2000));
    shot(&browser, "5-rename-done");
    let any_mark = mark("⇥");
    assert_eq!(browser.eval(&any_mark), false, "nothing marked once every use is renamed");

    // A rename carried into another open file: report.py open, `mean` renamed in stats.py;
    // the mark says where, Tab opens report.py at the use, Tab renames it there.
    open("report.py");
    rename(5, "average", "def average(xs):");
    browser.wait_for("the next edit in report.py marked", 20, &mark("⇥ report.py:1 average"));
    shot(&browser, "5b-next-edit-other-file");
    browser.keys("\u{E004}"); // Tab: report.py at the use
    let report_active = "return [...document.querySelectorAll('.tab.active')].some((t) => t.textContent.trim().startsWith('report.py'))";
    browser.wait_for("report.py opened", 20, report_active);
    browser.wait_for("its use marked", 20, &mark("⇥ average"));
    browser.keys("\u{E004}"); // Tab: apply
    browser.wait_for("renamed in report.py", 20, &format!("{lines}.includes('from stats import average')"));

    // Grep from the command palette: the extension's quick pick over its `caret ui`; a hit
    // opens at its line.
    // Runs the palette's command `Caret: TITLE`.
    let command = |title: &str| {
        browser.keys("\u{E031}"); // F1
        browser.wait_for("the command palette", 20, quick_open);
        std::thread::sleep(Duration::from_millis(300));
        browser.keys(&format!("Caret: {title}"));
        let listed = format!(
            "return document.querySelector('.quick-input-list .monaco-list-row')?.textContent.includes('{title}')"
        );
        browser.wait_for("the command listed", 20, &listed);
        browser.keys("\u{E007}");
    };
    command("Grep the Workspace");
    browser.wait_for(
        "the grep quick pick",
        20,
        "return document.querySelector('.quick-input-widget input')?.placeholder?.includes('Grep')",
    );
    browser.keys("return a");
    let hit = "return [...document.querySelectorAll('.quick-input-list .monaco-list-row')].map((r) => r.textContent).join('|')";
    let hits =
        browser.wait_for("grep hits", 30, &format!("const t = {}; return t.includes('app.py') ? t : ''", &hit[7..]));
    shot(&browser, "6-grep");
    assert!(hits.as_str().unwrap().contains("line 2"), "{hits}");
    browser.keys("\u{E007}");
    browser.wait_for("app.py at the hit", 20, "return document.querySelector('.statusbar').textContent.includes('Ln 2,') && [...document.querySelectorAll('.tab.active')].some((t) => t.textContent.trim() === 'app.py')");

    // The agent panel (a webview: the page's own panel in two frames): a turn changes two
    // files; one is shown in VS Code's diff editor, then rejected, the other accepted.
    up.queue([
        Answer::Calls(vec![
            ("write_file".into(), json!({"path": "lib.py", "content": "VALUE = 2\n"})),
            ("write_file".into(), json!({"path": "notes.md", "content": "# Notes\n\nAdded by the agent.\n"})),
        ]),
        Answer::Text("Changed both files.".into()),
    ]);
    command("Open the Agent Panel");
    browser.wait_for("the panel's frame", 30, "return document.querySelector('iframe.webview.ready') !== null");
    let into_panel = || {
        browser.leave_frames();
        browser.enter_frame("iframe.webview.ready");
        browser.wait_for(
            "the panel's inner frame",
            30,
            "return document.querySelector('iframe#active-frame') !== null",
        );
        browser.enter_frame("iframe#active-frame");
    };
    into_panel();
    browser.wait_for("the panel", 30, "return document.querySelector('[data-role=input]') !== null");
    browser.eval("const i = document.querySelector('[data-role=input]'); i.value = 'Update lib.py and add notes'; document.querySelector('[data-role=send]').click();");
    browser.wait_for("the turn's end", 60, "return document.querySelector('#agent').dataset.busy === 'no' && document.querySelectorAll('.changes .changed').length === 2");
    let said =
        browser.eval("return [...document.querySelectorAll('.entry.assistant')].map((e) => e.textContent).join('')");
    assert_eq!(said, "Changed both files.");
    browser.eval("document.querySelector('.changes .changed[data-path=\"lib.py\"] a').click()");
    browser.leave_frames();
    let diff_tab =
        "return [...document.querySelectorAll('.tab')].some((t) => t.textContent.includes(\"the agent's change\"))";
    browser.wait_for("VS Code's diff of the change", 30, diff_tab);
    browser.wait_for(
        "both sides",
        30,
        "const t = [...document.querySelectorAll('.monaco-diff-editor .view-line')].map((l) => l.textContent.replace(/\\u00a0/g, ' ')).join('|'); return t.includes('VALUE = 1') && t.includes('VALUE = 2')",
    );
    shot(&browser, "7-agent-diff");
    into_panel();
    browser.eval("document.querySelector('.changes .changed[data-path=\"lib.py\"] .reject').click()");
    browser.eval("document.querySelector('.changes .changed[data-path=\"notes.md\"] .accept').click()");
    browser.wait_for("the review emptied", 20, "return document.querySelectorAll('.changes .changed').length === 0");
    browser.leave_frames();
    shot(&browser, "8-agent-reviewed");
    let read = |rel: &str| std::fs::read_to_string(ws.path().join(rel)).unwrap_or_default();
    assert_eq!(read("lib.py"), "VALUE = 1\n", "rejected: restored");
    assert_eq!(read("notes.md"), "# Notes\n\nAdded by the agent.\n", "accepted: kept");

    // In the panel too: `/` completes the repository's command; Plan mode plans it with
    // read-only tools; the plan approved is built.
    into_panel();
    let type_in = |text: &str| browser.fill("[data-role=input]", text);
    type_in("/b");
    let offered = browser.wait_for(
        "the command offered",
        20,
        "return document.querySelector('.mentions:not([hidden]) li[data-command=bump]')?.textContent",
    );
    assert_eq!(offered, "/bump — Bump a value");
    browser.eval("document.querySelector('li[data-command=bump]').click()");
    type_in("/bump lib.py");
    let plan = json!({"summary": "Bump VALUE", "steps": [{"title": "Set VALUE to 3", "files": ["lib.py"]}]});
    up.queue([Answer::Calls(vec![("submit_plan".into(), plan)])]);
    browser.eval("document.querySelector('[data-role=plan-mode]').click()");
    browser.wait_for("plan mode", 20, "return document.querySelector('#agent').dataset.mode === 'plan'");
    browser.eval("document.querySelector('[data-role=send]').click()");
    let steps = browser.wait_for("the plan", 30, "return document.querySelector('[data-role=plan] ol')?.textContent");
    assert_eq!(steps, "Set VALUE to 3 (lib.py)");
    let planned = up.chats().last().unwrap().clone();
    assert!(planned["messages"].to_string().contains("Bump the value in lib.py."), "the command expanded");
    assert!(!planned["tools"].to_string().contains("\"write_file\""), "read-only tools while planning");
    up.queue([
        Answer::Calls(vec![("write_file".into(), json!({"path": "lib.py", "content": "VALUE = 3\n"}))]),
        Answer::Text("Bumped.".into()),
    ]);
    browser.eval("document.querySelector('[data-role=approve-plan]').click()");
    browser.wait_for(
        "the build",
        30,
        "return document.querySelector('#agent').dataset.mode === 'build' && document.querySelector('#agent').dataset.busy === 'no' && document.querySelector('.todos')?.textContent.includes('Set VALUE to 3')",
    );
    browser.leave_frames();
    assert_eq!(read("lib.py"), "VALUE = 3\n", "the plan built");
}
