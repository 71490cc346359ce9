//! Landlock inside the sandbox: a second, kernel-enforced fence around what a command may
//! write, under the mount namespace that already decides what exists.
//!
//! Landlock restricts the calling process and its future children, and a restricted process
//! may no longer change mounts — so it cannot be set before bubblewrap builds the sandbox, and
//! this crate forbids `unsafe` (no `pre_exec`). Instead a helper program runs as the sandbox's
//! first command: [`helper_main`], entered by any binary that calls it when its first argument
//! is [`HELPER_ARG`] (the `caret` binary does; so does this crate's `caret-landlock`). It
//! restricts itself, then `exec`s the real command:
//!
//! ```text
//! HELPER __caret-landlock --write DIR... [--no-net] [--forward SOCKET] [--no-landlock] -- bash -c COMMAND
//! ```
//!
//! With `--forward SOCKET` it first starts the network forwarder of an allow-listed sandbox
//! (see [`crate::netproxy`]): a child process listening on `127.0.0.1:`[`crate::netproxy::PORT`]
//! that passes each connection to the proxy's Unix socket; the command may then connect to that
//! port and no other. `--no-landlock` forwards without restricting (a kernel without Landlock).
//!
//! What it enforces: reading and executing anywhere the sandbox shows; writing, creating,
//! removing, renaming and truncating only beneath the `--write` directories (the workspace,
//! `/tmp`, `/dev`, the empty home); with `--no-net`, no TCP bind or connect (ABI 4); no
//! connecting to abstract Unix sockets or signalling processes outside the command (ABI 6).
//! Rights a kernel lacks are dropped (best effort); a kernel without Landlock at all makes
//! the helper fail with [`UNAVAILABLE_EXIT`], which [`crate::Bwrap::new`] sees when it
//! probes, and then runs without it (and says why).

use std::ffi::OsString;
use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope, path_beneath_rules,
};

/// The first argument that makes a binary the helper.
pub const HELPER_ARG: &str = "__caret-landlock";

/// The first argument that makes a binary the network forwarder (started by the helper).
const FORWARD_ARG: &str = "__caret-forward";

/// The helper's exit code when the kernel enforces no Landlock rule.
pub const UNAVAILABLE_EXIT: i32 = 125;

/// The helper's exit code for bad arguments or a failed `exec`.
const FAILED_EXIT: i32 = 126;

/// What the helper is told.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rules {
    /// Directories writable beneath.
    pub writable: Vec<PathBuf>,
    /// Refuse TCP bind and connect.
    pub no_network: bool,
    /// The allow-list proxy's socket: forward `127.0.0.1:PORT` to it (and allow connecting there).
    pub forward: Option<PathBuf>,
    /// Forward only; restrict nothing.
    pub no_landlock: bool,
}

impl Rules {
    /// The helper's arguments for these rules and `command` (program first).
    pub fn arguments(&self, command: &[String]) -> Vec<String> {
        let mut a = vec![HELPER_ARG.to_owned()];
        for w in &self.writable {
            a.extend(["--write".to_owned(), w.display().to_string()]);
        }
        if self.no_network {
            a.push("--no-net".to_owned());
        }
        if let Some(socket) = &self.forward {
            a.extend(["--forward".to_owned(), socket.display().to_string()]);
        }
        if self.no_landlock {
            a.push("--no-landlock".to_owned());
        }
        a.push("--".to_owned());
        a.extend(command.iter().cloned());
        a
    }

    /// Reads the helper's arguments (after [`HELPER_ARG`]): the rules and the command.
    pub fn parse(args: &[OsString]) -> Result<(Rules, Vec<OsString>), String> {
        let mut rules = Rules::default();
        let mut i = 0;
        while i < args.len() {
            match args[i].to_str() {
                Some("--write") => {
                    let dir = args.get(i + 1).ok_or("--write needs a directory")?;
                    rules.writable.push(PathBuf::from(dir));
                    i += 2;
                }
                Some("--no-net") => {
                    rules.no_network = true;
                    i += 1;
                }
                Some("--forward") => {
                    let socket = args.get(i + 1).ok_or("--forward needs a socket")?;
                    rules.forward = Some(PathBuf::from(socket));
                    i += 2;
                }
                Some("--no-landlock") => {
                    rules.no_landlock = true;
                    i += 1;
                }
                Some("--") => {
                    let command = args[i + 1..].to_vec();
                    if command.is_empty() {
                        return Err("no command after --".to_owned());
                    }
                    return Ok((rules, command));
                }
                _ => return Err(format!("unexpected argument {:?}", args[i])),
            }
        }
        Err("no -- before the command".to_owned())
    }

    /// Restricts the calling thread (and what it starts). `Ok(false)`: the kernel enforces
    /// nothing of it.
    pub fn restrict_self(&self) -> Result<bool, landlock::RulesetError> {
        // The newest rights this code was written and tested against; older kernels get what
        // they have.
        let abi = ABI::V6;
        let mut ruleset = Ruleset::default().set_compatibility(CompatLevel::BestEffort);
        ruleset = ruleset.handle_access(AccessFs::from_all(abi))?;
        if self.no_network {
            ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
        }
        ruleset = ruleset.scope(Scope::from_all(abi))?;
        let mut created = ruleset
            .create()?
            .add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi)))?
            .add_rules(path_beneath_rules(&self.writable, AccessFs::from_all(abi)))?;
        if self.no_network && self.forward.is_some() {
            created = created.add_rule(NetPort::new(crate::netproxy::PORT, AccessNet::ConnectTcp))?;
        }
        let status = created.restrict_self()?;
        Ok(status.ruleset != RulesetStatus::NotEnforced)
    }
}

/// The helper: restricts itself as its arguments say, then becomes the command. Never
/// returns: exits with [`UNAVAILABLE_EXIT`] when the kernel enforces no Landlock, 126 on bad
/// arguments or a failed `exec`.
pub fn helper_main() -> ! {
    use std::os::unix::process::CommandExt as _;
    let args: Vec<OsString> = std::env::args_os().skip(2).collect();
    let (rules, command) = match Rules::parse(&args) {
        Ok(parsed) => parsed,
        Err(why) => {
            eprintln!("caret-landlock: {why}");
            std::process::exit(FAILED_EXIT);
        }
    };
    if let Some(socket) = &rules.forward
        && let Err(e) = start_forwarder(socket)
    {
        eprintln!("caret-landlock: starting the network forwarder: {e}");
        std::process::exit(FAILED_EXIT);
    }
    match if rules.no_landlock { Ok(true) } else { rules.restrict_self() } {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("caret-landlock: this kernel enforces no Landlock rules");
            std::process::exit(UNAVAILABLE_EXIT);
        }
        Err(e) => {
            eprintln!("caret-landlock: {e}");
            std::process::exit(UNAVAILABLE_EXIT);
        }
    }
    let err = std::process::Command::new(&command[0]).args(&command[1..]).exec();
    eprintln!("caret-landlock: running {:?}: {err}", command[0]);
    std::process::exit(FAILED_EXIT);
}

/// Becomes the helper when the process's first argument is [`HELPER_ARG`] (or the forwarder it
/// starts); else returns. Call first thing in `main`.
pub fn enter_helper_if_asked() {
    match std::env::args_os().nth(1) {
        Some(a) if a == HELPER_ARG => helper_main(),
        Some(a) if a == FORWARD_ARG => forwarder_main(),
        _ => {}
    }
}

/// Listens on the forwarder's port here, then starts this binary again as the forwarder with
/// the listening socket as its standard input (so the port is open before the command runs).
fn start_forwarder(socket: &std::path::Path) -> std::io::Result<()> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", crate::netproxy::PORT))?;
    std::process::Command::new(std::env::current_exe()?)
        .arg(FORWARD_ARG)
        .arg(socket)
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(listener)))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    Ok(())
}

/// The forwarder: each connection to the listening socket on its standard input goes to the
/// proxy's Unix socket. It lives as long as the sandbox (its PID namespace ends it).
fn forwarder_main() -> ! {
    use std::os::fd::AsFd as _;
    let socket = std::env::args_os().nth(2).map(PathBuf::from).unwrap_or_default();
    let listener = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => std::net::TcpListener::from(fd),
        Err(_) => std::process::exit(FAILED_EXIT),
    };
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let socket = socket.clone();
        std::thread::spawn(move || {
            if let Ok(proxy) = std::os::unix::net::UnixStream::connect(&socket) {
                crate::netproxy::splice(conn, proxy);
            }
        });
    }
    std::process::exit(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_round_trip() {
        let rules = Rules { writable: vec!["/ws".into(), "/tmp".into()], no_network: true, ..Rules::default() };
        let args = rules.arguments(&["bash".into(), "-c".into(), "echo --write".into()]);
        assert_eq!(args[0], HELPER_ARG);
        let os: Vec<OsString> = args[1..].iter().map(OsString::from).collect();
        let (parsed, command) = Rules::parse(&os).unwrap();
        assert_eq!(parsed, rules);
        assert_eq!(command, ["bash", "-c", "echo --write"]);
        for bad in [&["--write"][..], &["--"][..], &["--bogus", "--", "x"][..], &["x"][..]] {
            let os: Vec<OsString> = bad.iter().map(OsString::from).collect();
            assert!(Rules::parse(&os).is_err(), "{bad:?}");
        }
    }
}
