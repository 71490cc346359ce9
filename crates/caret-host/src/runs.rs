//! Background runs for a front end: the run service of the embedded queue (with a local
//! worker started on demand, stopping when the queue has been empty a while) or a server's
//! over HTTP, behind one client ([`Runs`]); a checkout as a bundle of HEAD plus its
//! uncommitted changes; a run's patch applied back.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use base64::Engine as _;
use caret_anyrun::runs::{RunService, TenantRef};
use caret_anyrun::worker::{InProcess, Worker, WorkerConfig};
use caret_protocol::runs::{CreateRun, NumberedEvent, PutSecret, RepoSource, RunInfo, RunList, RunResult, SecretList};

use crate::config::Config;
use crate::remote::{Api, Remote};

/// The run service of the embedded queue (or a server's, in `caret serve`).
pub async fn open_service(
    config: &Config,
    service: &caret_index::service::Service,
    gateway: Option<Arc<caret_models::Gateway>>,
    reach: Reach,
) -> anyhow::Result<RunService> {
    let key = data_dir(config).join("runs.key");
    let mut settings = config.runs.settings()?;
    if reach == Reach::Team {
        settings.egress = config.server.egress()?;
        settings.whole_network = config.server.runs_network;
    }
    caret_server::open_runs(service, &config.storage(), &key, gateway, settings).await.context("opening the run queue")
}

/// Whose runs a queue or worker serves, which decides what they may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// One user's, on their machine: anything (their own localhost included).
    Local,
    /// A team server's tenants': no internal address unless `[server] egress_allow` opens it,
    /// the whole network only with `[server] runs_network`.
    Team,
}

/// `w` for a team server's runs (see [`Reach::Team`]).
pub fn for_team(mut w: WorkerConfig, config: &Config) -> anyhow::Result<WorkerConfig> {
    w.egress = config.server.egress()?;
    w.whole_network = config.server.runs_network;
    Ok(w)
}

pub(crate) fn data_dir(config: &Config) -> PathBuf {
    config.server.data_dir.clone().unwrap_or_else(|| config.home.join("server"))
}

/// Expires lost leases every few seconds and deletes runs past their retention hourly.
pub fn spawn_upkeep(runs: Arc<RunService>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let every = (runs.settings().lease_ttl / 3).max(Duration::from_millis(200));
        let mut last_collect = std::time::Instant::now();
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = runs.expire().await {
                tracing::warn!("expiring leases: {e}");
            }
            let reaped = runs.reap_episodes().await;
            if reaped > 0 {
                tracing::info!(episodes = reaped, "idle episodes closed");
            }
            if last_collect.elapsed() > Duration::from_secs(3600) {
                last_collect = std::time::Instant::now();
                match runs.collect_expired().await {
                    Ok(n) if n > 0 => tracing::info!(runs = n, "runs past their retention deleted"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!("deleting old runs: {e}"),
                }
            }
        }
    })
}

/// A worker in this process for the service (`caret serve --workers`).
pub fn local_worker(config: &Config, runs: Arc<RunService>, slots: u32, reach: Reach) -> anyhow::Result<Worker> {
    let w = worker_config(config, slots, None, None);
    let w = if reach == Reach::Team { for_team(w, config)? } else { w };
    Ok(Worker::new(Arc::new(InProcess(runs)), w))
}

/// A worker's configuration: this host and process, the agent's rules and limits.
pub fn worker_config(config: &Config, slots: u32, idle: Option<Duration>, work_dir: Option<PathBuf>) -> WorkerConfig {
    let name = format!("{}-{}", hostname(), std::process::id());
    let work = work_dir.unwrap_or_else(|| config.home.join("runs").join("work"));
    let mut w = WorkerConfig::new(name, slots, work);
    w.exit_when_idle = idle;
    w.rules = config.agent.rules();
    w.limits = config.agent.limits();
    w.landlock_helper = std::env::current_exe().ok();
    if let Some(window) = config.context_window("agent") {
        w.context_window = window;
    }
    w.image_models = config.models.iter().filter(|m| config.takes_images(&m.alias)).map(|m| m.alias.clone()).collect();
    w
}

/// Keeps at most `keep` prepared environments (none: every run installs).
pub fn with_snapshots(mut w: WorkerConfig, keep: usize) -> WorkerConfig {
    w.snapshots =
        (keep > 0).then(|| Arc::new(caret_anyrun::snapshot::Snapshots::new(w.work_dir.join("snapshots"), keep)));
    w
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "host".into())
}

/// A run service client: a service in this process (the embedded queue, whose worker starts
/// on demand, or a server's own, whose workers it has), or a server over HTTP.
pub enum Runs {
    /// The embedded queue's (or this server's own) run service in this process.
    #[allow(missing_docs)]
    Local { service: Arc<RunService>, tenant: TenantRef, config: Box<Config>, start_worker: bool },
    /// A server over HTTP.
    Remote(Api),
}

impl Runs {
    /// The server `target` names, else the embedded queue (its run service in this process).
    pub async fn open(config: &Config, target: &Remote) -> anyhow::Result<Runs> {
        if let Some(api) = Api::open(target)? {
            return Ok(Runs::Remote(api));
        }
        let service = caret_index::open(&config.storage()).await.context("opening the embedded server's storage")?;
        let tenant = match service.db().tenant_by_name("local").await? {
            Some(t) => t,
            None => service.db().create_tenant("local").await?,
        };
        let runs = open_service(config, &service, None, Reach::Local).await?;
        Ok(Runs::Local {
            service: Arc::new(runs),
            tenant: TenantRef { id: tenant.id, name: tenant.name },
            config: Box::new(config.clone()),
            start_worker: true,
        })
    }

    /// A server's own service, for `tenant`'s calls from the page it serves.
    pub fn served(config: &Config, service: Arc<RunService>, tenant: TenantRef) -> Runs {
        Runs::Local { service, tenant, config: Box::new(config.clone()), start_worker: false }
    }

    /// Sends a request to the server and reads its JSON answer (an error body as the error).
    pub async fn call<T: serde::de::DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> anyhow::Result<T> {
        let Runs::Remote(api) = self else { bail!("not a server") };
        api.call(req).await
    }

    /// The server URL for an API path.
    pub fn url(&self, path: &str) -> String {
        match self {
            Runs::Remote(api) => api.url(path),
            Runs::Local { .. } => path.to_owned(),
        }
    }

    /// Queues a run.
    pub async fn submit(&self, req: CreateRun) -> anyhow::Result<RunInfo> {
        match self {
            Runs::Local { service, tenant, config, start_worker } => {
                let mut req = req;
                req.model = Some(default_alias(config, req.model.as_deref())?);
                let info = service.submit(tenant, req).await?;
                if *start_worker {
                    ensure_local_worker(config)?;
                }
                Ok(info)
            }
            Runs::Remote(Api { client, .. }) => self.call(client.post(self.url("/v1/runs")).json(&req)).await,
        }
    }

    /// The newest runs, at most `limit`.
    pub async fn list(&self, limit: u32) -> anyhow::Result<Vec<RunInfo>> {
        match self {
            Runs::Local { service, tenant, .. } => Ok(service.list(&tenant.id, limit).await?),
            Runs::Remote(Api { client, .. }) => {
                let l: RunList = self.call(client.get(self.url(&format!("/v1/runs?limit={limit}")))).await?;
                Ok(l.runs)
            }
        }
    }

    /// A run.
    pub async fn get(&self, id: &str) -> anyhow::Result<RunInfo> {
        match self {
            Runs::Local { service, tenant, .. } => Ok(service.get(&tenant.id, id).await?),
            Runs::Remote(Api { client, .. }) => self.call(client.get(self.url(&format!("/v1/runs/{id}")))).await,
        }
    }

    /// Cancels a run.
    pub async fn cancel(&self, id: &str) -> anyhow::Result<RunInfo> {
        match self {
            Runs::Local { service, tenant, .. } => Ok(service.cancel(&tenant.id, id).await?),
            Runs::Remote(Api { client, .. }) => {
                self.call(client.post(self.url(&format!("/v1/runs/{id}/cancel")))).await
            }
        }
    }

    /// Shares a run of the caller's with the organisation (or no longer): a team server's.
    pub async fn share(&self, id: &str, shared: bool) -> anyhow::Result<RunInfo> {
        match self {
            Runs::Local { .. } => anyhow::bail!("runs are shared on a team server (--server URL); here they are yours"),
            Runs::Remote(Api { client, .. }) => {
                let body = caret_protocol::runs::ShareRun { shared };
                self.call(client.post(self.url(&format!("/v1/runs/{id}/share"))).json(&body)).await
            }
        }
    }

    /// Deletes a finished run and what is kept of it.
    pub async fn delete(&self, id: &str) -> anyhow::Result<()> {
        match self {
            Runs::Local { service, tenant, .. } => Ok(service.delete(&tenant.id, id).await?),
            Runs::Remote(Api { client, .. }) => self.call(client.delete(self.url(&format!("/v1/runs/{id}")))).await,
        }
    }

    /// A finished run's result.
    pub async fn result(&self, id: &str) -> anyhow::Result<RunResult> {
        match self {
            Runs::Local { service, tenant, .. } => Ok(service.result(&tenant.id, id).await?),
            Runs::Remote(Api { client, .. }) => self.call(client.get(self.url(&format!("/v1/runs/{id}/result")))).await,
        }
    }

    /// A run's events after number `after`.
    pub async fn events(&self, id: &str, after: u64) -> anyhow::Result<Vec<NumberedEvent>> {
        match self {
            Runs::Local { service, tenant, .. } => Ok(service.events(&tenant.id, id, after, 1000).await?),
            Runs::Remote(Api { client, .. }) => {
                let url = self.url(&format!("/v1/runs/{id}/events?follow=false&after={after}"));
                self.call(client.get(url)).await
            }
        }
    }

    /// Stores a secret for runs.
    pub async fn put_secret(&self, name: &str, value: String) -> anyhow::Result<()> {
        match self {
            Runs::Local { service, tenant, .. } => Ok(service.put_secret(&tenant.id, name, &value).await?),
            Runs::Remote(Api { client, .. }) => {
                self.call(client.put(self.url(&format!("/v1/secrets/{name}"))).json(&PutSecret { value })).await
            }
        }
    }

    /// The names of the stored secrets.
    pub async fn secrets(&self) -> anyhow::Result<Vec<String>> {
        match self {
            Runs::Local { service, tenant, .. } => Ok(service.secret_names(&tenant.id).await?),
            Runs::Remote(Api { client, .. }) => {
                let l: SecretList = self.call(client.get(self.url("/v1/secrets"))).await?;
                Ok(l.names)
            }
        }
    }

    /// Deletes a secret.
    pub async fn delete_secret(&self, name: &str) -> anyhow::Result<()> {
        match self {
            Runs::Local { service, tenant, .. } => Ok(service.delete_secret(&tenant.id, name).await?),
            Runs::Remote(Api { client, .. }) => {
                self.call(client.delete(self.url(&format!("/v1/secrets/{name}")))).await
            }
        }
    }
}

/// The model alias for an embedded run (the submitting process does not load models).
pub fn default_alias(config: &Config, asked: Option<&str>) -> anyhow::Result<String> {
    let aliases: Vec<&str> = config.models.iter().map(|m| m.alias.as_str()).collect();
    match asked {
        Some(m) if aliases.contains(&m) => Ok(m.to_owned()),
        Some(m) => bail!("unknown model alias {m:?} (configured: {})", aliases.join(", ")),
        None => aliases.iter().find(|a| **a == "agent").or(aliases.first()).map(|a| (*a).to_owned()).context(
            "no models are configured: `caret models pull qwen2.5-coder-1.5b-instruct-q4` (the local code model, \
             used as soon as it is installed), or add [[models]] to the config (an `agent` alias is used first), \
             or use --server",
        ),
    }
}

/// Starts a local worker for the embedded queue unless one is running: it runs detached
/// (its log in `$CARET_HOME/runs/worker.log`) and stops when the queue has been empty a while.
pub fn ensure_local_worker(config: &Config) -> anyhow::Result<()> {
    let dir = config.home.join("runs");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let pid_file = dir.join("worker.pid");
    if let Ok(pid) = std::fs::read_to_string(&pid_file)
        && let Ok(pid) = pid.trim().parse::<u32>()
        && Path::new(&format!("/proc/{pid}")).exists()
    {
        return Ok(());
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("worker.log"))
        .with_context(|| format!("opening {}", dir.join("worker.log").display()))?;
    let exe = std::env::current_exe().context("finding the caret binary")?;
    use std::os::unix::process::CommandExt as _;
    // How long it waits for more runs once the queue is empty (CARET_LOCAL_WORKER_IDLE).
    let idle = std::env::var("CARET_LOCAL_WORKER_IDLE").unwrap_or_else(|_| "60s".into());
    let child = std::process::Command::new(exe)
        .args(["worker", "--exit-when-idle", &idle])
        .env_remove("CARET_SERVER")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting a local worker")?;
    std::fs::write(&pid_file, child.id().to_string())?;
    Ok(())
}

/// The checkout as a bundle of HEAD plus its uncommitted changes (untracked files included,
/// ignored ones not), without touching the user's index.
pub fn bundle_checkout(path: &Path) -> anyhow::Result<RepoSource> {
    let git = |args: &[&str], index: Option<&Path>| -> anyhow::Result<Vec<u8>> {
        let mut c = std::process::Command::new("git");
        c.args(args).current_dir(path);
        if let Some(i) = index {
            c.env("GIT_INDEX_FILE", i);
        }
        let out = c.output().context("running git")?;
        if !out.status.success() {
            bail!("git {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(out.stdout)
    };
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).trim().to_owned();
    let head = text(
        git(&["rev-parse", "HEAD"], None)
            .with_context(|| format!("{} is not a git checkout with a commit (or give --repo URL)", path.display()))?,
    );
    let tmp = tempdir()?;
    let bundle = tmp.join("code.bundle");
    git(&["bundle", "create", "-q", &bundle.display().to_string(), "HEAD"], None)?;
    // A copy of the index, so that `add -A` sees untracked files without changing the real one.
    let index = tmp.join("index");
    let real = text(git(&["rev-parse", "--git-path", "index"], None)?);
    let real = if Path::new(&real).is_absolute() { PathBuf::from(real) } else { path.join(real) };
    if real.exists() {
        std::fs::copy(&real, &index).context("copying the git index")?;
    }
    git(&["add", "-A"], Some(&index))?;
    let patch = String::from_utf8(git(&["diff", "--cached", "--binary", "HEAD"], Some(&index))?)
        .context("the uncommitted changes are not text")?;
    let bytes = std::fs::read(&bundle)?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(RepoSource::Bundle { bundle: base64::engine::general_purpose::STANDARD.encode(bytes), head, patch })
}

/// The checkout's `origin` URL.
pub fn origin_url(path: &Path) -> anyhow::Result<String> {
    let out = std::process::Command::new("git").args(["remote", "get-url", "origin"]).current_dir(path).output()?;
    anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn tempdir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("caret-run-{}-{:08x}", std::process::id(), fastrand_u32()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn fastrand_u32() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos())
}

/// Applies a run's patch with `git apply --3way`, refusing when a file it changes has
/// uncommitted changes (unless forced): the user's work is never mixed into silently.
pub fn apply_patch(path: &Path, result: &RunResult, force: bool) -> anyhow::Result<()> {
    if result.patch.is_empty() {
        bail!("the run changed nothing");
    }
    let status = std::process::Command::new("git")
        .args(["status", "--porcelain", "-z"])
        .current_dir(path)
        .output()
        .context("running git status")?;
    anyhow::ensure!(status.status.success(), "{} is not a git checkout", path.display());
    let dirty: Vec<String> = String::from_utf8_lossy(&status.stdout)
        .split('\0')
        .filter(|e| e.len() > 3)
        .map(|e| e[3..].to_owned())
        .collect();
    let touched: Vec<&String> = result.files.iter().filter(|f| dirty.contains(f)).collect();
    if !touched.is_empty() && !force {
        bail!(
            "uncommitted changes in {} which the run also changes: commit or stash them, or use --force",
            touched.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    let tmp = tempdir()?;
    let file = tmp.join("run.patch");
    std::fs::write(&file, &result.patch)?;
    let out = std::process::Command::new("git")
        .args(["apply", "--3way", "--whitespace=nowarn"])
        .arg(&file)
        .current_dir(path)
        .output()
        .context("running git apply")?;
    let _ = std::fs::remove_dir_all(&tmp);
    if !out.status.success() {
        bail!("git apply --3way failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
