//! What the Anyrun benches share: a committed repository and a scripted agent model (a test
//! double) behind a gateway alias `agent`.

use std::path::Path;
use std::sync::Arc;

use caret_models::openai::OpenAiProvider;
use caret_models::{Deployment, DeploymentLimits, Gateway, GatewaySettings};
use caret_test_support::scripted::{Answer, Behaviour, ScriptedUpstream};

/// Makes `repo` (already holding its files) a git repository with one commit.
pub fn commit_all(repo: &Path) {
    for args in
        [&["init", "-q"][..], &["add", "-A"], &["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "i"]]
    {
        assert!(std::process::Command::new("git").args(args).current_dir(repo).status().unwrap().success());
    }
}

/// A scripted model whose every attempt runs `command` in the terminal, then says "done";
/// served as alias `agent` with room for many calls at once.
pub async fn scripted_agent(command: &str) -> (ScriptedUpstream, Gateway) {
    let up = ScriptedUpstream::start("bench-model").await;
    up.set(Behaviour {
        conversation: vec![
            Answer::Calls(vec![("run_terminal_cmd".into(), serde_json::json!({ "command": command }))]),
            Answer::Text("done".into()),
        ],
        ..Behaviour::default()
    });
    let provider = Arc::new(OpenAiProvider::new(&up.url, None).unwrap());
    let mut g = Gateway::new(GatewaySettings::default());
    let limits = DeploymentLimits { max_concurrency: 1024, max_queue: 4096, ..DeploymentLimits::default() };
    g.add_alias("agent", vec![Deployment::new("scripted", provider, "m", 0, 1, limits)]);
    (up, g)
}
