//! Stdio servers started in a [`caret_sandbox::Sandbox`] rather than as Caret's children
//! (a background run's, a server-side session's): the server gets exactly what the
//! sandbox's commands get — the workspace, the sandbox's variables, its network rules.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Starts stdio servers in a sandbox.
pub struct SandboxLauncher {
    sandbox: Arc<dyn caret_sandbox::Sandbox>,
    /// A server's working directory unless its configuration names one.
    workspace: PathBuf,
}

impl SandboxLauncher {
    /// Servers in `sandbox`, working in `workspace` by default.
    pub fn new(sandbox: Arc<dyn caret_sandbox::Sandbox>, workspace: &Path) -> SandboxLauncher {
        SandboxLauncher { sandbox, workspace: workspace.to_path_buf() }
    }
}

#[async_trait::async_trait]
impl crate::Launcher for SandboxLauncher {
    async fn launch(
        &self,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        cwd: Option<&Path>,
    ) -> Result<crate::Launched, String> {
        let line = std::iter::once(command).chain(args.iter().map(String::as_str)).map(quoted).collect::<Vec<_>>();
        let mut spec = caret_sandbox::Spec::new(line.join(" "), cwd.unwrap_or(&self.workspace));
        spec.env = env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let p = self.sandbox.spawn(&spec).await.map_err(|e| format!("starting it in the sandbox: {e}"))?;
        Ok(crate::Launched {
            input: Box::new(p.stdin),
            output: Box::new(p.stdout),
            diagnostics: Box::new(p.stderr),
            alive: Box::new(p.alive),
        })
    }
}

/// `s` as one shell word.
fn quoted(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:@%+,".contains(&b)) {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_single_shell_words() {
        assert_eq!(quoted("-m"), "-m");
        assert_eq!(quoted("a b"), "'a b'");
        assert_eq!(quoted("it's"), r"'it'\''s'");
        assert_eq!(quoted(""), "''");
    }
}
