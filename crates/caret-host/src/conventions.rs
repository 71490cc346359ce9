//! Where a session finds the skills, custom commands and subagents developers bring from other
//! agents:
//! the project's folders first (Caret's, Claude Code's, Cursor's, the open `.agents`), then
//! the user's (`$CARET_HOME`, `~/.claude`). Hooks, which run commands and so need trust, are in
//! [`crate::hooks`].

use std::path::{Path, PathBuf};

use caret_agent::{commands, skills, subagents};

use crate::config::Config;

fn places(config: &Config, root: &Path, project: &[&str], user: &[&str], caret: &str) -> Vec<(PathBuf, String)> {
    let mut out: Vec<(PathBuf, String)> = project.iter().map(|p| (root.join(p), (*p).to_owned())).collect();
    out.push((config.home.join(caret), format!("$CARET_HOME/{caret}")));
    if let Some(home) = dirs::home_dir() {
        out.extend(user.iter().map(|p| (home.join(p), format!("~/{p}"))));
    }
    out
}

/// The skills of a session in the workspace `root`, and the skill folders left out (why).
pub fn skills(config: &Config, root: &Path) -> (Vec<skills::Skill>, Vec<skills::Skipped>) {
    skills::discover(&places(
        config,
        root,
        &[".caret/skills", ".claude/skills", ".agents/skills"],
        &[".claude/skills"],
        "skills",
    ))
}

/// The custom commands of a session in the workspace `root`, and the files left out (why).
pub fn commands(config: &Config, root: &Path) -> (Vec<commands::Command>, Vec<commands::Skipped>) {
    let project = [".caret/commands", ".claude/commands", ".cursor/commands"];
    commands::discover(&places(config, root, &project, &[".claude/commands"], "commands"))
}

/// The subagents of a session in the workspace `root` (the explorer first), and the files left
/// out (why).
pub fn subagents(config: &Config, root: &Path) -> (Vec<subagents::AgentDef>, Vec<(PathBuf, String)>) {
    subagents::discover(&places(config, root, &[".caret/agents", ".claude/agents"], &[".claude/agents"], "agents"))
}
