//! A run's MCP servers: those of the repository (`.caret/mcp.json`, `.cursor/mcp.json`), of
//! its `.caret/environment.toml` and of the request (a name in a later one wins). A stdio
//! server runs inside the run's sandbox ([`SandboxLauncher`]), so it has exactly what the
//! run's commands have: the checkout, the run's variables and secrets, its network rules. A
//! remote server is reached by the worker through a proxy with the run's allowed hosts (the
//! same checks commands get, under the worker's egress policy),
//! or directly when the run has the whole network; its host must be allowed, and its bearer
//! token comes from one of the run's variables or secrets (`bearer_token_env`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use caret_protocol::runs::{RunMcpServer, RunStatus};

use crate::environment::Prepared;

/// Every server the run declares: the repository's `mcp.json` files first, then
/// `prepared`'s (the environment file's and the request's, merged).
pub(crate) fn declared(repo: &Path, prepared: &Prepared) -> BTreeMap<String, RunMcpServer> {
    let mut all = BTreeMap::new();
    for file in caret_mcp::project::FILES.iter().rev() {
        let Ok(text) = std::fs::read_to_string(repo.join(file)) else { continue };
        match caret_mcp::project::parse(file, &text) {
            Ok(found) => all.extend(found.into_iter().map(|(name, d)| (name, from_project(d)))),
            Err(e) => tracing::warn!("{e}: its MCP servers are not used in the run"),
        }
    }
    all.extend(prepared.mcp_servers.clone());
    all
}

fn from_project(d: caret_mcp::project::Declared) -> RunMcpServer {
    match d {
        caret_mcp::project::Declared::Stdio { command, args, env } => {
            RunMcpServer { command: Some(command), args, env, ..RunMcpServer::default() }
        }
        caret_mcp::project::Declared::Http { url, headers } => {
            RunMcpServer { url: Some(url), headers, ..RunMcpServer::default() }
        }
    }
}

/// The servers to start, and those that cannot be (name, why): a remote server whose host
/// the run does not allow, or whose token variable it lacks. `variables` are the run's
/// variables and secrets; `repo` is the stdio servers' working directory.
pub(crate) fn configs(
    declared: BTreeMap<String, RunMcpServer>,
    prepared: &Prepared,
    variables: &BTreeMap<String, String>,
    repo: &Path,
) -> (Vec<caret_mcp::ServerConfig>, Vec<(String, String)>) {
    let (mut ok, mut refused) = (Vec::new(), Vec::new());
    for (name, s) in declared {
        let transport = match (&s.command, &s.url) {
            (Some(command), None) => Ok(caret_mcp::Transport::Stdio {
                command: command.clone(),
                args: s.args.clone(),
                env: s.env.clone(),
                cwd: Some(repo.to_path_buf()),
            }),
            (None, Some(url)) => remote(url, &s, prepared, variables),
            (Some(_), Some(_)) => Err("it has both `command` and `url`".to_owned()),
            (None, None) => Err("it has neither `command` nor `url`".to_owned()),
        };
        match transport {
            Ok(transport) => ok.push(caret_mcp::ServerConfig {
                name,
                transport,
                approval: caret_mcp::Approval::Always,
                tool_timeout: Duration::from_secs(s.tool_timeout_s.unwrap_or(60).max(1)),
                tools: BTreeMap::new(),
            }),
            Err(why) => refused.push((name, why)),
        }
    }
    (ok, refused)
}

/// A remote server's transport, when the run may reach it.
fn remote(
    url: &str,
    s: &RunMcpServer,
    prepared: &Prepared,
    variables: &BTreeMap<String, String>,
) -> Result<caret_mcp::Transport, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("its url {url:?}: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("its url is http:// or https://, not {url:?}"));
    }
    let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
        return Err(format!("its url {url:?} names no host"));
    };
    if !prepared.network {
        let allowed = caret_sandbox::netproxy::AllowList::parse(&prepared.hosts)?;
        if !allowed.allows(host, port) {
            return Err(format!("{host}:{port} is not among the run's allowed hosts (`hosts`)"));
        }
    }
    let bearer = match &s.bearer_token_env {
        Some(var) => match variables.get(var) {
            Some(token) => Some(caret_mcp::Bearer::Token(token.clone())),
            None => return Err(format!("its token's variable {var} is not among the run's variables or secrets")),
        },
        None => None,
    };
    Ok(caret_mcp::Transport::Http { url: url.to_owned(), headers: s.headers.clone(), bearer })
}

/// A run's servers, started; they stop when this is dropped.
pub(crate) struct RunServers {
    /// Their tools, for the session.
    pub(crate) hub: Arc<caret_mcp::Hub>,
    _gate: Option<caret_sandbox::netproxy::Gate>,
}

/// How long servers have to answer before the run reports them as still starting.
pub(crate) const SETTLE: Duration = Duration::from_secs(30);

/// Starts the run's servers in the background (none: it declares none), reporting at once
/// those that cannot start and, once they settle (at most [`SETTLE`]), how each of the others
/// did.
pub(crate) fn start(
    repo: &Path,
    prepared: &Prepared,
    variables: &BTreeMap<String, String>,
    egress: &caret_sandbox::egress::Egress,
    sandbox: Arc<dyn caret_sandbox::Sandbox>,
    report: impl Fn(RunStatus) + Send + 'static,
) -> Option<RunServers> {
    let declared = declared(repo, prepared);
    if declared.is_empty() {
        return None;
    }
    let (configs, refused) = configs(declared, prepared, variables, repo);
    for (name, why) in refused {
        report(RunStatus::McpServer { name, ready: false, status: format!("not started: {why}") });
    }
    let gate = match configs.iter().any(|c| matches!(c.transport, caret_mcp::Transport::Http { .. })) {
        true => gate(prepared, egress).unwrap_or_else(|e| {
            tracing::warn!("{e}");
            None
        }),
        false => None,
    };
    let launcher = caret_mcp::sandboxed::SandboxLauncher::new(sandbox, repo);
    let place = caret_mcp::Place {
        launcher: Some(Arc::new(launcher)),
        proxy: gate.as_ref().map(caret_sandbox::netproxy::Gate::url),
    };
    let hub = caret_mcp::Hub::placed(configs, &place);
    hub.start();
    let watched = Arc::downgrade(&hub);
    tokio::spawn(async move {
        let Some(hub) = watched.upgrade() else { return };
        hub.settled(SETTLE).await;
        for (name, status) in hub.status() {
            let text = match &status {
                caret_mcp::Status::Starting => format!("still starting after {} s", SETTLE.as_secs()),
                other => other.to_string(),
            };
            report(RunStatus::McpServer { name, ready: status.is_ready(), status: text });
        }
    });
    Some(RunServers { hub, _gate: gate })
}

/// What a run's remote servers go through: a proxy with the run's allowed hosts under the
/// worker's egress policy; none when the run has the whole network (or no hosts).
fn gate(
    prepared: &Prepared,
    egress: &caret_sandbox::egress::Egress,
) -> Result<Option<caret_sandbox::netproxy::Gate>, String> {
    if prepared.network || prepared.hosts.is_empty() {
        return Ok(None);
    }
    let allowed = caret_sandbox::netproxy::AllowList::parse(&prepared.hosts)?.under(egress.clone());
    caret_sandbox::netproxy::Gate::open(allowed).map(Some).map_err(|e| format!("starting the MCP proxy: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(network: bool, hosts: &[&str]) -> Prepared {
        Prepared { network, hosts: hosts.iter().map(|h| (*h).to_owned()).collect(), ..Prepared::default() }
    }

    #[test]
    fn remote_servers_need_an_allowed_host_and_their_token_variable() {
        let vars = BTreeMap::from([("TOKEN".to_owned(), "s3cret".to_owned())]);
        let server = |url: &str, var: Option<&str>| RunMcpServer {
            url: Some(url.to_owned()),
            bearer_token_env: var.map(str::to_owned),
            ..RunMcpServer::default()
        };
        let declared = BTreeMap::from([
            ("allowed".to_owned(), server("https://mcp.example.com/mcp", Some("TOKEN"))),
            ("port".to_owned(), server("http://127.0.0.1:8123/mcp", None)),
            ("elsewhere".to_owned(), server("https://other.example.org/mcp", None)),
            ("tokenless".to_owned(), server("https://mcp.example.com/x", Some("MISSING"))),
            ("local".to_owned(), RunMcpServer { command: Some("srv".into()), ..RunMcpServer::default() }),
            (
                "both".to_owned(),
                RunMcpServer { command: Some("a".into()), url: Some("https://b".into()), ..RunMcpServer::default() },
            ),
            ("ftp".to_owned(), server("ftp://mcp.example.com/", None)),
        ]);
        let p = prepared(false, &["mcp.example.com", "127.0.0.1:8123"]);
        let (ok, refused) = configs(declared.clone(), &p, &vars, Path::new("/w"));
        let names: Vec<&str> = ok.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["allowed", "local", "port"]);
        assert!(
            matches!(&ok[0].transport, caret_mcp::Transport::Http { bearer: Some(caret_mcp::Bearer::Token(t)), .. } if t == "s3cret")
        );
        assert!(matches!(&ok[1].transport, caret_mcp::Transport::Stdio { cwd: Some(d), .. } if d == Path::new("/w")));
        let why: BTreeMap<String, String> = refused.into_iter().collect();
        assert_eq!(why.keys().collect::<Vec<_>>(), ["both", "elsewhere", "ftp", "tokenless"]);
        assert!(why["elsewhere"].contains("other.example.org:443 is not among the run's allowed hosts"), "{why:?}");
        assert!(why["tokenless"].contains("MISSING"), "{why:?}");
        // The whole network: every well-formed remote server.
        let (ok, _) = configs(declared, &prepared(true, &[]), &vars, Path::new("/w"));
        assert_eq!(ok.len(), 4);
    }
}
