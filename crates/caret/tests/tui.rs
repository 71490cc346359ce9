//! The agent's terminal UI (`caret agent`) in a real terminal: tmux, keys sent as a person
//! types them, the screen read back. Against a scripted model server (test double): `/`
//! completes a repository's custom command, Shift-Tab switches to plan mode, the command's
//! plan is shown, Ctrl-Y approves it and the agent builds it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use caret_test_support::TempDir;
use caret_test_support::scripted::{Answer, ScriptedUpstream};
use serde_json::json;

/// A tmux server of the test's own (its socket in `dir`), killed when dropped.
struct Tmux {
    socket: std::path::PathBuf,
}

impl Tmux {
    fn start(dir: &Path, command: &str) -> Option<Tmux> {
        let t = Tmux { socket: dir.join("tmux.sock") };
        match t.run(&["new-session", "-d", "-s", "caret", "-x", "110", "-y", "36", command]) {
            Some(true) => Some(t),
            Some(false) => panic!("tmux could not start the session"),
            None => None,
        }
    }

    fn run(&self, args: &[&str]) -> Option<bool> {
        let out = Command::new("tmux").arg("-S").arg(&self.socket).args(args).output().ok()?;
        Some(out.status.success())
    }

    fn keys(&self, keys: &[&str]) {
        assert_eq!(self.run(&[&["send-keys", "-t", "caret"][..], keys].concat()), Some(true));
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux").arg("-S").arg(&self.socket).args(["capture-pane", "-p", "-t", "caret"]).output();
        String::from_utf8_lossy(&out.unwrap().stdout).into_owned()
    }

    /// Waits until the screen shows `what`.
    fn wait_for(&self, what: &str) -> String {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let screen = self.screen();
            if screen.contains(what) {
                return screen;
            }
            assert!(Instant::now() < until, "waited 30 s for {what:?}; the screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[test]
fn the_tui_completes_a_command_plans_it_and_builds_the_approved_plan() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(ScriptedUpstream::start("tui-model"));
    let home = TempDir::new();
    home.write(
        "caret-home/config.toml",
        &format!(
            "[[models]]\nalias = \"agent\"\ndeployments = [{{ provider = \"openai\", url = \"{}\", model = \"m\" }}]\n",
            up.url
        ),
    );
    home.write("ws/add.sh", "echo $(( $1 - $2 ))\n");
    home.write("ws/.claude/commands/fix.md", "---\ndescription: Fix a bug\n---\nFix the bug in $ARGUMENTS.\n");
    let ws = home.join("ws");
    let command = format!(
        "env -u CARET_CONFIG -u RUST_LOG CARET_HOME={} HOME={} TERM=xterm-256color {} agent -C {} --approval never",
        home.join("caret-home").display(),
        home.path().display(),
        env!("CARGO_BIN_EXE_caret"),
        ws.display()
    );
    let Some(tmux) = Tmux::start(home.path(), &command) else {
        caret_test_support::skip("tmux is not installed (.ci/run installs it)");
        return;
    };
    tmux.wait_for("Ctrl-C quits");

    // `/f` and Tab: the command completes.
    tmux.keys(&["/f"]);
    tmux.wait_for("/fix");
    tmux.keys(&["Tab"]);
    tmux.keys(&["add.sh"]);
    tmux.wait_for("/fix add.sh");

    // Shift-Tab: plan mode; Enter: the command planned with read-only tools.
    let plan = json!({"summary": "Fix add.sh", "steps": [{"title": "Use + in add.sh", "files": ["add.sh"]}]});
    up.queue([Answer::Calls(vec![("submit_plan".into(), plan)])]);
    tmux.keys(&["BTab"]);
    tmux.wait_for("plan mode");
    tmux.keys(&["Enter"]);
    // The plan shows, then (when the agent's turn ends) how to approve it.
    tmux.wait_for("Use + in add.sh");
    let screen = tmux.wait_for("Ctrl-Y");
    assert!(screen.contains("Use + in add.sh"), "the plan stays on the screen:\n{screen}");
    let planned = up.chats()[0].clone();
    assert!(planned["messages"].to_string().contains("Fix the bug in add.sh."), "the command expanded");
    assert!(!planned["tools"].to_string().contains("\"edit_file\""), "read-only tools while planning");
    assert_eq!(std::fs::read_to_string(ws.join("add.sh")).unwrap(), "echo $(( $1 - $2 ))\n");

    // Ctrl-Y: approved and built.
    up.queue(caret_test_support::scripted::fix_add_conversation().into_iter().skip(1));
    tmux.keys(&["C-y"]);
    tmux.wait_for("add.sh adds now.");
    let until = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(ws.join("add.sh")).unwrap() != "echo $(( $1 + $2 ))\n" {
        assert!(Instant::now() < until, "the plan was not built:\n{}", tmux.screen());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(up.violations().is_empty(), "{:?}", up.violations());
}
