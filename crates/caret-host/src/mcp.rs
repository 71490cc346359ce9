//! `[mcp_servers.NAME]`: the MCP servers whose tools the agent gets, as `caret_mcp` takes
//! them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use serde::Deserialize;

/// One server (`[mcp_servers.NAME]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSection {
    /// The program of a server spoken to over stdio.
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment added to Caret's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its working directory.
    pub cwd: Option<PathBuf>,
    /// A remote server's URL (Streamable HTTP).
    pub url: Option<String>,
    /// `ask`, `always` (the default: run without asking) or `never`.
    #[serde(default)]
    pub approval: caret_mcp::Approval,
    /// How long a call may take ("60s").
    pub tool_timeout: Option<String>,
    /// Off: not started.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Per-tool settings (`[mcp_servers.NAME.tools.TOOL]`).
    #[serde(default)]
    pub tools: BTreeMap<String, McpToolSection>,
}

/// One tool's settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolSection {
    /// Overrides the server's approval.
    pub approval: Option<caret_mcp::Approval>,
    /// Off: not offered to the model.
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn yes() -> bool {
    true
}

/// The servers to start, in name order; an error names a server that cannot be used.
pub fn servers(sections: &BTreeMap<String, McpServerSection>) -> anyhow::Result<Vec<caret_mcp::ServerConfig>> {
    let mut out = Vec::new();
    for (name, s) in sections.iter().filter(|(_, s)| s.enabled) {
        let command = match (&s.command, &s.url) {
            (Some(c), None) => c.clone(),
            (None, Some(_)) => anyhow::bail!(
                "[mcp_servers.{name}]: remote servers (url) are not supported yet; run it over stdio with `command`"
            ),
            _ => anyhow::bail!("[mcp_servers.{name}] needs `command` (a program speaking MCP over stdio)"),
        };
        let tool_timeout = match &s.tool_timeout {
            Some(t) => crate::units::parse_duration(t).with_context(|| format!("[mcp_servers.{name}] tool_timeout"))?,
            None => std::time::Duration::from_secs(60),
        };
        let tools = s
            .tools
            .iter()
            .map(|(t, ts)| (t.clone(), caret_mcp::ToolSettings { approval: ts.approval, enabled: ts.enabled }))
            .collect();
        out.push(caret_mcp::ServerConfig {
            name: name.clone(),
            command,
            args: s.args.clone(),
            env: s.env.clone(),
            cwd: s.cwd.clone(),
            approval: s.approval,
            tool_timeout,
            tools,
        });
    }
    Ok(out)
}
