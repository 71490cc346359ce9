//! Stdio servers started in a [`caret_sandbox::Sandbox`] rather than as Caret's children
//! (a background run's, a server-side session's): the server gets exactly what the
//! sandbox's commands get — the workspace, the sandbox's variables, its network rules. And
//! the [`remote_gate`] remote servers of a team server's sessions are reached through.

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

/// The proxy a team server's session reaches its remote servers through: their hosts, each
/// connection checked against `egress` (none: no remote server among `servers`).
pub fn remote_gate(
    servers: &[crate::ServerConfig],
    egress: &caret_sandbox::egress::Egress,
) -> Result<Option<caret_sandbox::netproxy::Gate>, String> {
    let hosts: Vec<String> = servers
        .iter()
        .filter_map(|c| match &c.transport {
            crate::Transport::Http { url, .. } => reqwest13::Url::parse(url).ok(),
            crate::Transport::Stdio { .. } => None,
        })
        .filter_map(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)))
        .collect();
    if hosts.is_empty() {
        return Ok(None);
    }
    let allow = caret_sandbox::netproxy::AllowList::parse(&hosts)?;
    caret_sandbox::netproxy::Gate::open(allow.under(egress.clone()))
        .map(Some)
        .map_err(|e| format!("starting the MCP servers' proxy: {e}"))
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
