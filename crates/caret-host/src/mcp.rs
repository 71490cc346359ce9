//! The MCP servers whose tools the agent gets, as `caret_mcp` takes them: the user's
//! `[mcp_servers.NAME]`, and those a project declares in `.caret/mcp.json` or
//! `.cursor/mcp.json` (`{"mcpServers": {NAME: {"command", "args", "env"} or {"url",
//! "headers"}}}`, the format Cursor and Claude use). A project's server starts only once the
//! user trusted it for that project and that exact command line or URL (`caret mcp trust
//! NAME`), remembered in `$CARET_HOME/mcp-trust.json`; a server of the same name in the
//! user's config wins.

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
    /// Headers sent to a remote server with every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The environment variable holding a remote server's bearer token.
    pub bearer_token_env: Option<String>,
    /// `ask`, `always` (the default: run without asking) or `never`.
    #[serde(default)]
    pub approval: caret_mcp::Approval,
    /// How long a call may take ("60s").
    pub tool_timeout: Option<String>,
    /// How long a session's first model request waits for it to start ("10s"): a server
    /// slower than that is left out of it (and named), its tools coming later.
    pub startup_timeout: Option<String>,
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

/// The servers to start, in name order (a remote one's OAuth tokens, from `caret mcp login`,
/// kept under `home`); an error names a server that cannot be used.
pub fn servers(
    sections: &BTreeMap<String, McpServerSection>,
    home: &std::path::Path,
) -> anyhow::Result<Vec<caret_mcp::ServerConfig>> {
    let mut out = Vec::new();
    for (name, s) in sections.iter().filter(|(_, s)| s.enabled) {
        let transport = match (&s.command, &s.url) {
            (Some(command), None) => {
                anyhow::ensure!(
                    s.headers.is_empty() && s.bearer_token_env.is_none(),
                    "[mcp_servers.{name}]: `headers` and `bearer_token_env` are for remote servers (`url`)"
                );
                caret_mcp::Transport::Stdio {
                    command: command.clone(),
                    args: s.args.clone(),
                    env: s.env.clone(),
                    cwd: s.cwd.clone(),
                }
            }
            (None, Some(url)) => {
                anyhow::ensure!(
                    s.args.is_empty() && s.env.is_empty() && s.cwd.is_none(),
                    "[mcp_servers.{name}]: `args`, `env` and `cwd` are for servers run over stdio (`command`)"
                );
                http_transport(home, name, url, s.headers.clone(), s.bearer_token_env.clone())?
            }
            (Some(_), Some(_)) => anyhow::bail!("[mcp_servers.{name}] has both `command` and `url`: keep one"),
            (None, None) => anyhow::bail!(
                "[mcp_servers.{name}] needs `command` (a program speaking MCP over stdio) or `url` (a remote server)"
            ),
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
        out.push(caret_mcp::ServerConfig { name: name.clone(), transport, approval: s.approval, tool_timeout, tools });
    }
    Ok(out)
}

/// A remote server's transport: its token from `bearer_token_env`, else the OAuth tokens
/// `caret mcp login` stored under `home`, if any; an error for a URL that is not http(s).
fn http_transport(
    home: &std::path::Path,
    name: &str,
    url: &str,
    headers: BTreeMap<String, String>,
    bearer_token_env: Option<String>,
) -> anyhow::Result<caret_mcp::Transport> {
    anyhow::ensure!(
        url.starts_with("https://") || url.starts_with("http://"),
        "MCP server {name}: its url is http:// or https://, not {url:?}"
    );
    let tokens = crate::mcp_tokens::TokenStore::new(home, name, url);
    let bearer = match bearer_token_env {
        Some(var) => Some(caret_mcp::Bearer::Env(var)),
        None if tokens.exists() => Some(caret_mcp::Bearer::OAuth(std::sync::Arc::new(tokens))),
        None => None,
    };
    Ok(caret_mcp::Transport::Http { url: url.to_owned(), headers, bearer })
}

/// A remote server's URL by its name: the user's `[mcp_servers.NAME]`, else the project's at
/// `root`.
pub fn remote_url(
    sections: &BTreeMap<String, McpServerSection>,
    root: &std::path::Path,
    name: &str,
) -> anyhow::Result<String> {
    if let Some(s) = sections.get(name) {
        return s.url.clone().with_context(|| format!("[mcp_servers.{name}] is not a remote server (no url)"));
    }
    match project_servers(root).into_iter().find(|p| p.name == name) {
        Some(p) if p.remote => Ok(p.command_line[0].clone()),
        Some(_) => anyhow::bail!("the project's MCP server {name} is not a remote server"),
        None => anyhow::bail!("no MCP server {name} in the config or the project"),
    }
}

/// A configured server as a background run takes it (`caret run --mcp NAME`); its
/// `bearer_token_env` names one of the run's variables or secrets there.
pub fn run_server(name: &str, s: &McpServerSection) -> anyhow::Result<caret_protocol::runs::RunMcpServer> {
    anyhow::ensure!(s.command.is_some() != s.url.is_some(), "[mcp_servers.{name}] needs one of `command` and `url`");
    anyhow::ensure!(s.cwd.is_none(), "[mcp_servers.{name}]: a run's servers run in its checkout (no `cwd`)");
    let tool_timeout_s = match &s.tool_timeout {
        Some(t) => Some(
            crate::units::parse_duration(t).with_context(|| format!("[mcp_servers.{name}] tool_timeout"))?.as_secs(),
        ),
        None => None,
    };
    Ok(caret_protocol::runs::RunMcpServer {
        command: s.command.clone(),
        args: s.args.clone(),
        env: s.env.clone(),
        url: s.url.clone(),
        headers: s.headers.clone(),
        bearer_token_env: s.bearer_token_env.clone(),
        tool_timeout_s,
    })
}

/// A URL's `host:port`, as an allowed host names it.
pub fn url_host(url: &str) -> Option<String> {
    let parsed = reqwest::Url::parse(url).ok()?;
    Some(format!("{}:{}", parsed.host_str()?, parsed.port_or_known_default()?))
}

/// A server a project declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectServer {
    /// Its name.
    pub name: String,
    /// The file that declares it (relative to the project's root).
    pub file: String,
    /// The program and its arguments, or a remote server's URL alone: what trust is given to.
    pub command_line: Vec<String>,
    /// A stdio server's environment, or a remote one's headers.
    pub env: BTreeMap<String, String>,
    /// Whether it is a remote server (its URL is the `command_line`).
    pub remote: bool,
}

/// The servers `root` declares (`.caret/mcp.json` first: it wins over `.cursor/mcp.json` for
/// a name both declare). A file that cannot be read as such is skipped with a warning.
pub fn project_servers(root: &std::path::Path) -> Vec<ProjectServer> {
    let mut out: Vec<ProjectServer> = Vec::new();
    for file in caret_mcp::project::FILES {
        let Ok(text) = std::fs::read_to_string(root.join(file)) else { continue };
        let declared = match caret_mcp::project::parse(file, &text) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("{e}: its MCP servers are not used");
                continue;
            }
        };
        for (name, d) in declared {
            if out.iter().any(|p| p.name == name) {
                continue;
            }
            let (command_line, env, remote) = match d {
                caret_mcp::project::Declared::Stdio { command, args, env } => {
                    (std::iter::once(command).chain(args).collect(), env, false)
                }
                caret_mcp::project::Declared::Http { url, headers } => (vec![url], headers, true),
            };
            out.push(ProjectServer { name, file: file.to_owned(), command_line, env, remote });
        }
    }
    out
}

/// How long a session's first request waits for its servers: the longest `startup_timeout`
/// of the configured ones (10 s each unless set).
pub fn startup_timeout(servers: &BTreeMap<String, McpServerSection>) -> anyhow::Result<std::time::Duration> {
    let mut longest = std::time::Duration::from_secs(10);
    for (name, s) in servers.iter().filter(|(_, s)| s.enabled) {
        if let Some(t) = &s.startup_timeout {
            let t = crate::units::parse_duration(t).with_context(|| format!("[mcp_servers.{name}] startup_timeout"))?;
            longest = longest.max(t);
        }
    }
    Ok(longest)
}

/// One trusted project server.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
struct Trusted {
    project: PathBuf,
    name: String,
    command_line: Vec<String>,
}

fn trust_file(home: &std::path::Path) -> PathBuf {
    home.join("mcp-trust.json")
}

fn trusted_list(home: &std::path::Path) -> Vec<Trusted> {
    std::fs::read(trust_file(home)).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

/// Whether the user trusted `server` of the project at `root` (its exact command line).
pub fn is_trusted(home: &std::path::Path, root: &std::path::Path, server: &ProjectServer) -> bool {
    trusted_list(home)
        .iter()
        .any(|t| t.project == root && t.name == server.name && t.command_line == server.command_line)
}

/// Trusts `server` of the project at `root` from now on (written atomically).
pub fn trust(home: &std::path::Path, root: &std::path::Path, server: &ProjectServer) -> anyhow::Result<()> {
    let mut list = trusted_list(home);
    list.retain(|t| !(t.project == root && t.name == server.name));
    list.push(Trusted {
        project: root.to_path_buf(),
        name: server.name.clone(),
        command_line: server.command_line.clone(),
    });
    std::fs::create_dir_all(home)?;
    let tmp = trust_file(home).with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&list)?)?;
    std::fs::rename(&tmp, trust_file(home)).context("saving the MCP trust list")?;
    Ok(())
}

/// Every server a session in the project at `root` starts: the user's (`sections`), then the
/// project's ones trusted in `home` (a name the user configured is the user's); and the
/// project's untrusted ones, which do not start.
pub fn session_servers(
    sections: &BTreeMap<String, McpServerSection>,
    home: &std::path::Path,
    root: &std::path::Path,
) -> anyhow::Result<(Vec<caret_mcp::ServerConfig>, Vec<ProjectServer>)> {
    let mut servers = servers(sections, home)?;
    let mut untrusted = Vec::new();
    for p in project_servers(root) {
        if sections.contains_key(&p.name) {
            continue;
        }
        if !is_trusted(home, root, &p) {
            untrusted.push(p);
            continue;
        }
        let transport = if p.remote {
            http_transport(home, &p.name, &p.command_line[0], p.env.clone(), None)?
        } else {
            caret_mcp::Transport::Stdio {
                command: p.command_line[0].clone(),
                args: p.command_line[1..].to_vec(),
                env: p.env.clone(),
                cwd: Some(root.to_path_buf()),
            }
        };
        servers.push(caret_mcp::ServerConfig {
            name: p.name.clone(),
            transport,
            approval: caret_mcp::Approval::Always,
            tool_timeout: std::time::Duration::from_secs(60),
            tools: BTreeMap::new(),
        });
    }
    Ok((servers, untrusted))
}

/// A server `caret mcp add` writes.
#[derive(Debug, Clone, Copy)]
pub enum NewServer<'a> {
    /// Run over stdio.
    Stdio {
        /// The program and its arguments.
        command_line: &'a [String],
        /// Environment for it.
        env: &'a [(String, String)],
    },
    /// A remote server.
    Http {
        /// Its URL.
        url: &'a str,
        /// The variable holding its bearer token.
        bearer_token_env: Option<&'a str>,
        /// Headers sent with every request.
        headers: &'a [(String, String)],
    },
}

/// Asks, on `output`, whether to trust each of the project's `untrusted` servers, reading
/// `y`/`yes` (anything else: no) from `input`; trusts those said yes to (for `root`, under
/// `home`). The names trusted.
pub fn ask_trust(
    home: &std::path::Path,
    root: &std::path::Path,
    untrusted: &[ProjectServer],
    input: &mut dyn std::io::BufRead,
    output: &mut dyn std::io::Write,
) -> anyhow::Result<Vec<String>> {
    let mut trusted = Vec::new();
    for p in untrusted {
        let what = if p.remote { "connects to" } else { "runs" };
        write!(
            output,
            "The project declares an MCP server, {} ({}); it {what}: {}\nTrust it for this project and start it? [y/N] ",
            p.name,
            p.file,
            p.command_line.join(" ")
        )?;
        output.flush()?;
        let mut line = String::new();
        input.read_line(&mut line)?;
        if matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            trust(home, root, p)?;
            trusted.push(p.name.clone());
        }
    }
    Ok(trusted)
}

/// Adds `[mcp_servers.NAME]` for `server` to the config file at `path` (created when absent),
/// as text appended to it: the rest of the file — its comments and layout — stays as it was.
/// Refuses a name already configured or not a bare TOML key, and writes nothing unless the
/// result still parses.
pub fn add_to_config(path: &std::path::Path, name: &str, server: NewServer<'_>) -> anyhow::Result<()> {
    anyhow::ensure!(
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
        "an MCP server's name is letters, digits, `_` and `-`, not {name:?}"
    );
    let old = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let table: toml::Table = toml::from_str(&old).with_context(|| format!("{} is not valid TOML", path.display()))?;
    let taken = table.get("mcp_servers").and_then(|s| s.get(name)).is_some();
    anyhow::ensure!(!taken, "[mcp_servers.{name}] is already in {}: `caret mcp rm {name}` first", path.display());
    let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
    let inline = |pairs: &[(String, String)]| -> String {
        let pairs: Vec<String> = pairs.iter().map(|(k, v)| format!("{} = {}", quote(k), quote(v))).collect();
        format!("{{ {} }}", pairs.join(", "))
    };
    let mut block = format!("\n[mcp_servers.{name}]\n");
    match server {
        NewServer::Stdio { command_line, env } => {
            let (command, args) = command_line.split_first().context("give the server's command after `--`")?;
            block.push_str(&format!("command = {}\n", quote(command)));
            if !args.is_empty() {
                let list: Vec<String> = args.iter().map(|a| quote(a)).collect();
                block.push_str(&format!("args = [{}]\n", list.join(", ")));
            }
            if !env.is_empty() {
                block.push_str(&format!("env = {}\n", inline(env)));
            }
        }
        NewServer::Http { url, bearer_token_env, headers } => {
            anyhow::ensure!(
                url.starts_with("https://") || url.starts_with("http://"),
                "MCP server {name}: its url is http:// or https://, not {url:?}"
            );
            block.push_str(&format!("url = {}\n", quote(url)));
            if let Some(var) = bearer_token_env {
                block.push_str(&format!("bearer_token_env = {}\n", quote(var)));
            }
            if !headers.is_empty() {
                block.push_str(&format!("headers = {}\n", inline(headers)));
            }
        }
    }
    let mut new = old.clone();
    if !new.is_empty() && !new.ends_with('\n') {
        new.push('\n');
    }
    new.push_str(&block);
    write_checked(path, &new)
}

/// Removes `[mcp_servers.NAME]` (and its `[mcp_servers.NAME.tools.…]` tables) from the config
/// file at `path`, leaving every other line as it was. Whether it was there.
pub fn remove_from_config(path: &std::path::Path, name: &str) -> anyhow::Result<bool> {
    let old = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let own = |header: &str| {
        let h = header.trim().trim_start_matches('[').trim_end_matches(']').trim();
        h == format!("mcp_servers.{name}") || h.starts_with(&format!("mcp_servers.{name}."))
    };
    let mut kept = Vec::new();
    let (mut skipping, mut found) = (false, false);
    for line in old.split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with('[') {
            skipping = own(t.split('#').next().unwrap_or(t));
            found |= skipping;
        }
        if !skipping {
            kept.push(line);
        }
    }
    if found {
        write_checked(path, &kept.concat())?;
    }
    Ok(found)
}

/// Writes `text` to `path` through a file renamed over it, once it parses as TOML.
fn write_checked(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    toml::from_str::<toml::Table>(text).context("the edited configuration would not parse: nothing written")?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_is_asked_per_server_and_only_yes_trusts() {
        let home = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let server = |name: &str| ProjectServer {
            name: name.to_owned(),
            file: ".cursor/mcp.json".into(),
            command_line: vec!["npx".into(), name.to_owned()],
            env: BTreeMap::new(),
            remote: false,
        };
        let (a, b, c) = (server("a"), server("b"), server("c"));
        let mut said = Vec::new();
        let trusted = ask_trust(
            home.path(),
            root.path(),
            &[a.clone(), b.clone(), c.clone()],
            &mut &b"y\nno\nYES\n"[..],
            &mut said,
        )
        .unwrap();
        assert_eq!(trusted, ["a", "c"]);
        let said = String::from_utf8(said).unwrap();
        assert!(said.contains("MCP server, b (.cursor/mcp.json); it runs: npx b\nTrust it"), "{said}");
        assert!(is_trusted(home.path(), root.path(), &a) && !is_trusted(home.path(), root.path(), &b));
        // No answer at all (end of input) is a no.
        assert!(
            ask_trust(home.path(), root.path(), &[server("d")], &mut &b""[..], &mut Vec::new()).unwrap().is_empty()
        );
    }
}
