//! A repository's own description of its environment: `.caret/environment.toml`, committed
//! with the code (the shape of Cursor's `environment.json`).
//!
//! ```toml
//! install = ["pip install -e .", "npm ci"]   # idempotent; prepares the tree (kept as a snapshot)
//! install_inputs = ["package-lock.json"]     # files whose change means installing again
//! start = "redis-server --daemonize yes"     # every run, after install
//! test = "pytest -q"                         # after the agent; its output is in the result
//! network = false                            # commands may use the whole network
//! hosts = ["pypi.org", "*.pythonhosted.org"] # or only these (80/443 unless a :port is given)
//! [env]
//! RUST_BACKTRACE = "1"
//! [mcp_servers.docs]                         # MCP servers whose tools the agent gets
//! command = "python3"                        # run in the sandbox, under its network rules
//! args = ["-m", "docs_server"]
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use caret_protocol::runs::{RunEnvironment, RunMcpServer};
use serde::Deserialize;

use crate::{Error, Result};

/// Where the file lives in a repository.
pub const FILE: &str = ".caret/environment.toml";

/// One command or several.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Commands {
    /// None.
    #[default]
    None,
    /// One.
    One(String),
    /// Several, in order.
    Many(Vec<String>),
}

impl Commands {
    fn list(&self) -> Vec<String> {
        match self {
            Commands::None => Vec::new(),
            Commands::One(c) => vec![c.clone()],
            Commands::Many(v) => v.clone(),
        }
    }
}

/// The file's contents.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct EnvironmentFile {
    /// Idempotent preparation (dependencies); its outputs are kept as a snapshot.
    pub install: Commands,
    /// Files (repository paths) the install depends on besides its commands: a change to one
    /// means a new snapshot.
    pub install_inputs: Vec<String>,
    /// Run every time, after `install`.
    pub start: Commands,
    /// Run after the agent; output kept in the result.
    pub test: Option<String>,
    /// Whether commands may use the network.
    pub network: bool,
    /// Hosts commands may reach without the network (through the worker's proxy).
    pub hosts: Vec<String>,
    /// Environment variables.
    pub env: BTreeMap<String, String>,
    /// MCP servers, by name.
    pub mcp_servers: BTreeMap<String, RunMcpServer>,
}

/// What a run prepares, in order: the repository's install steps (skipped when a snapshot of
/// their outputs is ready), its start steps, then the request's own setup; variables and
/// network from both (the request wins).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prepared {
    /// The install steps.
    pub install: Vec<String>,
    /// Files the install depends on.
    pub install_inputs: Vec<String>,
    /// Commands before the agent, every run.
    pub setup: Vec<String>,
    /// The test command.
    pub test: Option<String>,
    /// Environment variables (secrets not included).
    pub env: BTreeMap<String, String>,
    /// Network allowed.
    pub network: bool,
    /// Hosts allowed without the network (both lists).
    pub hosts: Vec<String>,
    /// MCP servers, by name (the request's win).
    pub mcp_servers: BTreeMap<String, RunMcpServer>,
}

/// Reads the repository's file (if any) and merges the request's environment into it.
pub fn prepare(repo: &Path, request: &RunEnvironment) -> Result<Prepared> {
    let path = repo.join(FILE);
    let file = match std::fs::read_to_string(&path) {
        Ok(text) => {
            let file = parse(&text)?;
            check_hosts(&file.hosts).map_err(|e| Error::BadRequest(format!("{FILE}: {e}")))?;
            file
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => EnvironmentFile::default(),
        Err(e) => return Err(Error::BadRequest(format!("reading {FILE}: {e}"))),
    };
    Ok(merge(file, request))
}

/// Parses the file's text.
pub fn parse(text: &str) -> Result<EnvironmentFile> {
    toml::from_str(text).map_err(|e| Error::BadRequest(format!("{FILE}: {e}")))
}

/// Whether allowed hosts are well formed (the first bad one is the error).
pub fn check_hosts(hosts: &[String]) -> std::result::Result<(), String> {
    caret_sandbox::netproxy::AllowList::parse(hosts).map(drop)
}

/// The file's steps and the request's, merged.
pub fn merge(file: EnvironmentFile, request: &RunEnvironment) -> Prepared {
    let mut setup = file.start.list();
    setup.extend(request.setup.iter().cloned());
    let mut env = file.env;
    env.extend(request.env.clone());
    let mut mcp_servers = file.mcp_servers;
    mcp_servers.extend(request.mcp_servers.clone());
    Prepared {
        install: file.install.list(),
        install_inputs: file.install_inputs,
        setup,
        test: request.test.clone().or(file.test),
        env,
        network: file.network || request.network,
        hosts: {
            let mut hosts = file.hosts;
            hosts.extend(request.hosts.iter().filter(|h| !hosts.contains(h)).cloned().collect::<Vec<_>>());
            hosts
        },
        mcp_servers,
    }
}

/// Refuses the whole network where the operator does not allow it (`whole_network`), and
/// hosts written as internal addresses that `egress` refuses (names are checked where they
/// resolve, by the worker's proxy).
pub fn check_reach(
    env: &caret_protocol::runs::RunEnvironment,
    egress: &caret_sandbox::egress::Egress,
    whole_network: bool,
) -> Result<(), String> {
    if env.network && !whole_network {
        return Err("this server's operator does not allow runs the whole network ([server] runs_network): \
                    name the hosts the run needs instead"
            .into());
    }
    for host in &env.hosts {
        let (name, ports) = caret_sandbox::netproxy::host_and_ports(host);
        let checks: Vec<_> = ports.iter().map(|p| egress.check_literal(&name, *p)).collect();
        if let Some(Err(e)) = checks.iter().find(|c| c.is_err()).filter(|_| checks.iter().all(Result::is_err)) {
            return Err(format!("hosts: {e}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_file_and_the_request_merge_in_order() {
        let file = parse(
            "install = [\"make deps\", \"make gen\"]\nstart = \"./serve &\"\ntest = \"make test\"\n[env]\nA = \"1\"\nB = \"2\"\n\
             [mcp_servers.a]\ncommand = \"a-server\"\n[mcp_servers.b]\nurl = \"https://b.example/mcp\"\n",
        )
        .unwrap();
        let request_b = RunMcpServer { command: Some("b-server".into()), ..RunMcpServer::default() };
        let request = RunEnvironment {
            setup: vec!["echo ready".into()],
            env: BTreeMap::from([("B".into(), "3".into())]),
            mcp_servers: BTreeMap::from([("b".into(), request_b.clone())]),
            ..RunEnvironment::default()
        };
        assert_eq!(
            merge(file, &request),
            Prepared {
                install: vec!["make deps".into(), "make gen".into()],
                install_inputs: Vec::new(),
                setup: vec!["./serve &".into(), "echo ready".into()],
                test: Some("make test".into()),
                env: BTreeMap::from([("A".into(), "1".into()), ("B".into(), "3".into())]),
                network: false,
                hosts: Vec::new(),
                mcp_servers: BTreeMap::from([
                    ("a".into(), RunMcpServer { command: Some("a-server".into()), ..RunMcpServer::default() }),
                    ("b".into(), request_b),
                ]),
            }
        );
        let err = parse("instal = \"x\"").unwrap_err().to_string();
        assert!(err.contains("environment.toml") && err.contains("instal"), "{err}");
    }
}
