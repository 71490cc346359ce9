//! The gVisor backend: each command in its own gVisor sandbox (`runsc`, Debian's `runsc`
//! package), an application kernel between the command and the host's.
//!
//! A command gets an OCI bundle made from the [`Policy`]: the host's root read-only, the
//! workspace bound read-write, an empty `/tmp`, the hidden directories (the user's home) as
//! empty ones, the exposed toolchains bound back read-only, no capabilities, its own PID, IPC,
//! UTS, mount and network namespaces — no network at all (`--network=none`) unless the policy
//! allows it (then the host's, `--network=host`). Allowed hosts without the network go through
//! the allow-list proxy (see [`crate::netproxy`]): its socket and the helper program (the
//! forwarder) are bound in, and runsc may open host sockets (`--host-uds=open`). The policy's limits become the container's
//! cgroup limits. Seccomp and Landlock are not applied: the system calls a command makes are
//! served by gVisor's own kernel, which is the boundary here.
//!
//! Its live commands' use comes from `runsc events --stats` (the containers' cgroups as
//! gVisor counts them), not from `/proc`.
//!
//! `runsc` needs root on the host; where it is missing or cannot start a sandbox,
//! [`Gvisor::new`] says so.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::json;

use crate::{Error, Output, Policy, Result, Sandbox, Spec, finish, installed, working_directory};

/// The gVisor backend.
#[derive(Debug)]
pub struct Gvisor {
    policy: Policy,
    program: PathBuf,
    /// `runsc --root`: the containers' state, and their bundles.
    state: PathBuf,
    /// Containers running now.
    live: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// The allow-list proxy, when the policy allows hosts.
    proxy: Option<std::sync::Arc<crate::netproxy::Proxy>>,
}

/// Names containers apart.
static CONTAINERS: AtomicU64 = AtomicU64::new(0);

impl Gvisor {
    /// A sandbox with `policy`, if `runsc` is installed and starts a sandbox here (checked by
    /// running `true` in one).
    pub fn new(policy: Policy) -> Result<Gvisor> {
        let program =
            installed(&["/usr/bin/runsc", "/usr/local/bin/runsc", "/usr/sbin/runsc"], "gVisor (runsc)", "runsc")?;
        // runsc starts its sandboxes as root; /proc/self belongs to the effective user.
        let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self")?) == 0;
        if !root {
            return Err(Error::Unavailable("gVisor (runsc) needs root to start sandboxes".into()));
        }
        // Each sandbox its own state (another in this process may end while this one runs).
        let n = CONTAINERS.fetch_add(1, Ordering::Relaxed);
        let state = std::env::temp_dir().join(format!("caret-runsc-{}-{n}", std::process::id()));
        std::fs::create_dir_all(state.join("bundles"))?;
        let proxy = crate::proxy_for(&policy)?;
        let g = Gvisor { policy, program, state, live: std::sync::Mutex::default(), proxy };
        // The probe: `true` in a sandbox as commands will run.
        let id = format!("caret-probe-{}-{}", std::process::id(), CONTAINERS.fetch_add(1, Ordering::Relaxed));
        let bundle = g.state.join("bundles").join(&id);
        std::fs::create_dir_all(&bundle)?;
        let spec = Spec::new("true", g.policy.workspace.clone());
        std::fs::write(bundle.join("config.json"), g.config(&spec, &g.policy.workspace).to_string())?;
        let probe = std::process::Command::new(&g.program)
            .arg("--root")
            .arg(&g.state)
            .args(["--network=none"])
            .args(g.proxy.as_ref().map(|_| "--host-uds=open"))
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .output()?;
        let _ = std::fs::remove_dir_all(&bundle);
        if !probe.status.success() {
            let why = String::from_utf8_lossy(&probe.stderr);
            return Err(Error::Unavailable(format!(
                "runsc cannot start a sandbox here: {}",
                why.trim().lines().last().unwrap_or_default()
            )));
        }
        Ok(g)
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The OCI configuration of one command.
    fn config(&self, spec: &Spec, cwd: &std::path::Path) -> serde_json::Value {
        let env: Vec<String> =
            self.policy.command_env(&spec.env).into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut mounts = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc"}),
            json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}),
        ];
        for h in &self.policy.hidden {
            if h.exists() && !h.starts_with(&self.policy.workspace) {
                mounts.push(json!({"destination": h, "type": "tmpfs", "source": "tmpfs"}));
            }
        }
        for d in self.policy.exposed.iter().filter(|d| d.exists()) {
            mounts.push(json!({"destination": d, "type": "bind", "source": d, "options": ["rbind", "ro"]}));
        }
        let ws = &self.policy.workspace;
        mounts.push(json!({"destination": ws, "type": "bind", "source": ws, "options": ["rbind", "rw"]}));
        let mut args = vec!["bash".to_owned(), "-c".to_owned(), spec.command.clone()];
        if let (Some(proxy), Some(helper)) = (&self.proxy, &self.policy.landlock) {
            mounts.push(json!({"destination": crate::HELPER_INSIDE, "type": "bind", "source": helper, "options": ["bind", "ro"]}));
            mounts.push(json!({"destination": crate::netproxy::SOCKET_INSIDE, "type": "bind", "source": proxy.socket(), "options": ["bind"]}));
            let rules = crate::landlock::Rules {
                forward: Some(crate::netproxy::SOCKET_INSIDE.into()),
                no_landlock: true,
                ..crate::landlock::Rules::default()
            };
            args = std::iter::once(crate::HELPER_INSIDE.to_owned()).chain(rules.arguments(&args)).collect();
        }
        let mut resources = serde_json::Map::new();
        if let Some(m) = self.policy.limits.memory_bytes {
            resources.insert("memory".into(), json!({"limit": m}));
        }
        if let Some(p) = self.policy.limits.pids {
            resources.insert("pids".into(), json!({"limit": p}));
        }
        if let Some(c) = self.policy.limits.cpus {
            let period = 100_000u64;
            resources.insert(
                "cpu".into(),
                json!({"quota": ((c.max(0.01) * period as f64) as u64).max(1000), "period": period}),
            );
        }
        // With the network allowed, the host's stack is used (no namespace of its own).
        let mut namespaces =
            vec![json!({"type": "pid"}), json!({"type": "ipc"}), json!({"type": "uts"}), json!({"type": "mount"})];
        if !self.policy.network {
            namespaces.push(json!({"type": "network"}));
        }
        json!({
            "ociVersion": "1.0.0",
            "process": {
                "terminal": false,
                "user": {"uid": 0, "gid": 0},
                "args": args,
                "env": env,
                "cwd": cwd,
                "noNewPrivileges": true,
                "capabilities": {"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []}
            },
            "root": {"path": "/", "readonly": true},
            "hostname": "sandbox",
            "mounts": mounts,
            "linux": {"namespaces": namespaces, "resources": resources}
        })
    }

    fn runsc(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.program);
        c.arg("--root").arg(&self.state);
        c
    }

    /// Stops and removes a container (best effort: it may be gone already).
    async fn remove(&self, id: &str) {
        for args in [&["kill", id, "KILL"][..], &["delete", "--force", id]] {
            let _ = self.runsc().args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().await;
        }
    }
}

impl Drop for Gvisor {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

#[async_trait::async_trait]
impl Sandbox for Gvisor {
    fn name(&self) -> &'static str {
        "gvisor"
    }

    /// The containers' own figures (`runsc events --stats`): CPU, memory, processes.
    async fn usage(&self) -> Option<crate::usage::Usage> {
        let ids: Vec<String> =
            self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().cloned().collect();
        let mut total = crate::usage::Usage::default();
        for id in ids {
            let Ok(out) = self.runsc().args(["events", "--stats", &id]).stderr(Stdio::null()).output().await else {
                continue;
            };
            let Ok(stats) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else { continue };
            let data = &stats["data"];
            total.cpu_ms += data["cpu"]["usage"]["total"].as_u64().unwrap_or(0) / 1_000_000;
            total.memory_bytes += data["memory"]["usage"]["usage"].as_u64().unwrap_or(0);
            total.processes += u32::try_from(data["pids"]["current"].as_u64().unwrap_or(0)).unwrap_or(u32::MAX);
        }
        Some(total)
    }

    async fn run(&self, spec: &Spec) -> Result<Output> {
        let cwd = working_directory(&self.policy, spec)?;
        let id = format!("caret-{}-{}", std::process::id(), CONTAINERS.fetch_add(1, Ordering::Relaxed));
        let bundle = self.state.join("bundles").join(&id);
        std::fs::create_dir_all(&bundle)?;
        std::fs::write(bundle.join("config.json"), self.config(spec, &cwd).to_string())?;
        let network = if self.policy.network { "--network=host" } else { "--network=none" };
        let started = Instant::now();
        let child = self
            .runsc()
            .arg(network)
            .args(self.proxy.as_ref().map(|_| "--host-uds=open"))
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id.clone());
        // At the deadline the container goes, and every process in it.
        let done = finish(child, spec, self.remove(&id)).await;
        self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
        // `runsc run` deletes its container when the command ends, and the deadline removes it;
        // only a wait that failed can leave one behind.
        if done.is_err() {
            self.remove(&id).await;
        }
        let _ = std::fs::remove_dir_all(&bundle);
        Ok(done?.output(false, started))
    }
}
