//! The local daemon: the embedded server kept warm between commands.
//!
//! On the embedded server every `caret search` would open the database, load the workspace's
//! index and the embedding model, then answer: about a second on a 65k-chunk project, of
//! which the search itself is ~15 ms. The daemon does the loading once and answers over
//! loopback HTTP with the API of `caret serve`, for the `local` tenant only. It is started
//! on demand by whatever searches (the CLI, the LSP, the agent, `caret ui`), announces itself
//! in `$CARET_HOME/local/daemon.json` (mode 0600: its address, a token of its own and the
//! identity of the binary and settings it serves), and stops when idle, when that file no
//! longer names it (its home was deleted, or a caller with another build or other settings
//! retired it), or on SIGTERM. One per home: it holds `daemon.lock` while it runs.
//!
//! Commands that write (sync, index) still open the embedded server in-process; the daemon
//! sees their commits on its next request like any replica would (the service refreshes a
//! loaded namespace from the store on every use).
//!
//! It also watches the workspaces that `caret scan` and `caret sync` ask about (its own
//! route, `POST /v1/local/watch`, its token only; see [`crate::watch`]), so those commands
//! answer without walking a tree in which nothing changed.

use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::Context as _;
use caret_client::transport::HttpTransport;
use serde::{Deserialize, Serialize};

use crate::config::{Config, parse_duration};
use crate::remote::embedded_service;
use crate::runtime::{runtime, shutdown_signal};

/// The announcement: where the running daemon listens and how to call it.
const ANNOUNCE: &str = "daemon.json";
/// Held by the running daemon.
const LOCK: &str = "daemon.lock";
/// The daemon's stderr.
const LOG: &str = "daemon.log";
/// Its API token's name in the embedded server's database (replaced on every start).
const TOKEN_NAME: &str = "local daemon";
/// How long a caller waits for a daemon it started to announce itself.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The log is started afresh beyond this size.
const LOG_LIMIT: u64 = 1 << 20;

#[derive(Debug, Serialize, Deserialize)]
struct Announce {
    pid: u32,
    addr: SocketAddr,
    token: String,
    /// See [`identity`].
    identity: String,
}

/// What a daemon must share with a caller to answer for it: the same binary, home, embedding
/// settings, model files and search weights. A caller whose identity differs retires the
/// daemon and starts its own — so a model installed (or replaced) after a daemon started
/// without it is used by the next search, not 15 idle minutes later.
fn identity(config: &Config) -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("finding the caret binary")?;
    let meta = std::fs::metadata(&exe).with_context(|| format!("reading {}", exe.display()))?;
    let model = config.local_model_dir();
    let text = format!(
        "{}|{}|{}|{}|{:?}|{:?}|{}|{}",
        exe.display(),
        meta.len(),
        mtime_nanos(&meta),
        config.home.display(),
        config.embed,
        config.search_weights()?,
        model.display(),
        files_stamp(&model)
    );
    Ok(caret_workspace::ContentHash::of(text.as_bytes()).to_hex()[..32].to_owned())
}

fn mtime_nanos(meta: &std::fs::Metadata) -> u128 {
    meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos())
}

/// The names, sizes and modification times of a directory's files (links followed), sorted;
/// empty when it does not exist.
fn files_stamp(dir: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir) else { return String::new() };
    let mut files: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let meta = std::fs::metadata(e.path()).ok()?;
            Some(format!("{}:{}:{}", e.file_name().to_string_lossy(), meta.len(), mtime_nanos(&meta)))
        })
        .collect();
    files.sort_unstable();
    files.join(",")
}

fn dir(config: &Config) -> PathBuf {
    config.home.join("local")
}

fn read_announce(dir: &Path) -> Option<Announce> {
    serde_json::from_slice(&std::fs::read(dir.join(ANNOUNCE)).ok()?).ok()
}

/// Written whole (temporary file, then rename), readable by the owner only: it holds a token.
fn write_announce(dir: &Path, a: &Announce) -> anyhow::Result<()> {
    let tmp = dir.join(format!(".{ANNOUNCE}.{}", a.pid));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(&serde_json::to_vec(a)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(ANNOUNCE)).with_context(|| format!("announcing in {}", dir.display()))?;
    Ok(())
}

/// Whether something accepts connections at `addr` (a dead daemon's port refuses at once).
fn answers(addr: SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Whether the announced process still runs: a dead daemon's port may already be another
/// process's (ports are reused), so an answer there is not enough.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_owned)))
        .is_some_and(|state| state != "Z" && state != "X")
}

fn transport_to(a: &Announce) -> anyhow::Result<HttpTransport> {
    Ok(HttpTransport::new(&format!("http://{}", a.addr), &a.token, None)?
        .labelled(&format!("the local daemon ({})", a.addr))
        .without_reconnects())
}

/// A transport to this home's daemon, starting one if none answers; `None` when the daemon
/// is turned off (`[daemon] enabled`, `CARET_DAEMON`) or could not start, in which case the
/// caller works in-process (the reason is logged).
pub async fn connect(config: &Config) -> Option<HttpTransport> {
    if !config.daemon.enabled {
        return None;
    }
    match connect_or_start(config).await {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!("the local daemon is not available, working in-process: {e:#}");
            None
        }
    }
}

/// A transport to this home's daemon if one of this build and these settings runs; none is
/// started (for commands that only profit from a warm daemon, like a scan asking its watcher).
pub fn running(config: &Config) -> Option<HttpTransport> {
    if !config.daemon.enabled {
        return None;
    }
    let a = read_announce(&dir(config))?;
    let identity = identity(config).ok()?;
    if a.identity != identity || !alive(a.pid) {
        return None;
    }
    transport_to(&a).ok()
}

/// Asks this home's running daemon about `root`; `None` when no daemon of this build and
/// these settings runs, or it cannot watch the root (the reason is logged). Also hands back
/// the transport to the daemon, for a command that has more to ask it.
pub async fn ask_watcher(
    config: &Config,
    root: &Path,
    ignored: Vec<String>,
) -> Option<(crate::watch::WatchReply, HttpTransport)> {
    ask_watcher_of(running(config)?, root, ignored).await
}

/// [`ask_watcher`], of the daemon behind `transport`.
pub async fn ask_watcher_of(
    transport: HttpTransport,
    root: &Path,
    ignored: Vec<String>,
) -> Option<(crate::watch::WatchReply, HttpTransport)> {
    let req = crate::watch::WatchRequest { root: root.to_path_buf(), ignored };
    match transport.post::<_, crate::watch::WatchReply>(crate::watch::ROUTE, &req).await {
        Ok(reply) => Some((reply, transport)),
        Err(e) => {
            tracing::debug!("the daemon's watcher is not available: {e}");
            None
        }
    }
}

async fn connect_or_start(config: &Config) -> anyhow::Result<HttpTransport> {
    let dir = dir(config);
    let identity = identity(config)?;
    match read_announce(&dir) {
        Some(a) if a.identity == identity && alive(a.pid) && answers(a.addr) => return transport_to(&a),
        // Another build or other settings: retire it (it stops when the file no longer names
        // it). A dead one's file is simply replaced.
        Some(a) if a.identity != identity => {
            let _ = std::fs::remove_file(dir.join(ANNOUNCE));
        }
        _ => {}
    }
    let mut child = spawn(config, &dir)?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(a) = read_announce(&dir).filter(|a| a.identity == identity && alive(a.pid) && answers(a.addr)) {
            // Reap it when it ends, if this process outlives it (the LSP does).
            std::thread::spawn(move || child.wait());
            return transport_to(&a);
        }
        if let Some(status) = child.try_wait()? {
            // It stops at once when another daemon holds the lock: wait for that one's
            // announcement instead, until the deadline.
            if !status.success() {
                anyhow::bail!("the daemon exited with {status}; see {}", dir.join(LOG).display());
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no daemon announced itself in {} within {START_TIMEOUT:?}; see {}",
            dir.display(),
            dir.join(LOG).display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts `caret daemon` for this home, detached from the caller's terminal and process group.
fn spawn(config: &Config, dir: &Path) -> anyhow::Result<std::process::Child> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let log_path = dir.join(LOG);
    if std::fs::metadata(&log_path).is_ok_and(|m| m.len() > LOG_LIMIT) {
        let _ = std::fs::remove_file(&log_path);
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let mut cmd = std::process::Command::new(std::env::current_exe().context("finding the caret binary")?);
    if let Some(file) = &config.file {
        cmd.arg("--config").arg(file);
    }
    cmd.arg("daemon")
        .env("CARET_HOME", &config.home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0);
    cmd.spawn().context("starting the local daemon")
}

/// Requests in flight and when the last one ended.
struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity { started: Instant::now(), in_flight: AtomicUsize::new(0), last_ms: AtomicU64::new(0) }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(self.now_ms().saturating_sub(self.last_ms.load(Ordering::Acquire)))
    }
}

async fn track(
    axum::extract::State(activity): axum::extract::State<Arc<Activity>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    activity.in_flight.fetch_add(1, Ordering::AcqRel);
    let response = next.run(request).await;
    activity.last_ms.store(activity.now_ms(), Ordering::Release);
    activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    response
}

/// Resolves, with the reason, when the daemon should stop: idle too long, or no longer
/// announced as this process.
async fn retired(dir: &Path, pid: u32, idle: Duration, activity: &Activity) -> &'static str {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if read_announce(dir).is_none_or(|a| a.pid != pid) {
            return "its announcement is gone or names another daemon";
        }
        if activity.idle_for() >= idle {
            return "idle";
        }
    }
}

/// The watcher route's state: the watched roots and the daemon's token, which it checks.
struct WatchRoute {
    watches: crate::watch::Watches,
    token: String,
}

/// `POST /v1/local/watch`: the daemon's own token only (its callers are this user's
/// commands); the answer or a 400 saying why the root cannot be watched.
async fn watch(
    axum::extract::State(route): axum::extract::State<Arc<WatchRoute>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<axum::Json<crate::watch::WatchReply>, caret_server::Error> {
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    // Compared by digest: the time taken says nothing of the token.
    let hash = |t: &str| caret_workspace::ContentHash::of(t.as_bytes());
    if hash(given) != hash(&route.token) {
        return Err(caret_server::Error::Unauthorized);
    }
    let req: crate::watch::WatchRequest = serde_json::from_slice(&body)
        .map_err(|e| caret_server::Error::BadRequest(format!("malformed request: {e}")))?;
    let route = route.clone();
    match tokio::task::spawn_blocking(move || route.watches.ask(&req)).await {
        Ok(answer) => answer.map(axum::Json).map_err(caret_server::Error::BadRequest),
        Err(e) => Err(caret_server::Error::Internal(e.to_string())),
    }
}

/// How often a running daemon looks for documentation sources due a refresh.
const DOCS_REFRESH_CHECK: Duration = Duration::from_secs(15 * 60);

/// `caret daemon`: serves the embedded server on loopback until idle (`idle`, else `[daemon]
/// idle`) or retired; `log` takes the lines of its log (its standard error).
pub fn serve(config: &Config, idle: Option<&str>, log: fn(String)) -> anyhow::Result<()> {
    let idle = parse_duration(idle.unwrap_or(&config.daemon.idle)).context("--idle")?;
    let dir = dir(config);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let lock_path = dir.join(LOCK);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    // A daemon being retired lets go within a second or so.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match lock.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                log(format!("caret daemon: another daemon holds {}", lock_path.display()));
                return Ok(());
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", lock_path.display()));
            }
        }
    }
    let identity = identity(config)?;
    let pid = std::process::id();
    runtime()?.block_on(async {
        let (service, tenant) = embedded_service(config).await?;
        // The lock is held: no other daemon's token is in use.
        service.db().delete_tokens_named(&tenant, TOKEN_NAME).await?;
        let token = service.db().create_token(&tenant, TOKEN_NAME).await?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("listening on loopback")?;
        let addr = listener.local_addr()?;
        // Its callers are this user's own commands: no rate limits worth the name.
        let unlimited = caret_server::limit::RateLimit { per_second: 100_000.0, burst: 100_000 };
        let serve = caret_server::ServeConfig {
            addr,
            tls: None,
            allow_insecure_http: false,
            rate_limit: unlimited,
            ip_rate_limit: unlimited,
            body_limit: usize::try_from(config.server.body_limit.0).unwrap_or(usize::MAX),
            gateway: None,
            agent: caret_server::sessions::AgentSettings::default(),
            runs: None,
            docs: None,
            pages: None,
            replicas: caret_server::Replicas::Alone,
            usage: caret_usage::Recorder::off(),
            identity: None,
            sign_in: None,
        };
        serve.check()?;
        let activity = Arc::new(Activity::new());
        let watches =
            Arc::new(WatchRoute { watches: crate::watch::Watches::new(dir.join("watch")), token: token.clone() });
        let app = caret_server::app(service.clone(), &serve)
            .merge(axum::Router::new().route(crate::watch::ROUTE, axum::routing::post(watch)).with_state(watches))
            .layer(axum::middleware::from_fn_with_state(activity.clone(), track));
        write_announce(&dir, &Announce { pid, addr, token, identity })?;
        log(format!("caret daemon {pid}: serving {} on http://{addr} (stops after {idle:?} idle)", dir.display()));
        // Documentation sources whose refresh interval passed are refreshed while it runs (the
        // refresh finds which are due, and exits at once when none is).
        let docs = config.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(DOCS_REFRESH_CHECK);
            loop {
                tick.tick().await;
                if docs.home.join("docs").is_dir() {
                    crate::docs_refresh::spawn(&docs);
                }
            }
        });
        // Load the model while the first caller's request is on its way.
        let warm = service.clone();
        tokio::spawn(async move {
            if let Err(e) = warm.warm_embedding().await {
                tracing::warn!("loading the embedding model: {e}");
            }
        });
        let listener = tokio::net::TcpListener::from_std({
            listener.set_nonblocking(true)?;
            listener
        })?;
        let (stopped_tx, mut stopped) = tokio::sync::watch::channel(false);
        let dir2 = dir.clone();
        let stop = async move {
            let why = tokio::select! {
                () = shutdown_signal() => "signal",
                why = retired(&dir2, pid, idle, &activity) => why,
            };
            log(format!("caret daemon {pid}: stopping ({why})"));
            let _ = stopped_tx.send(true);
        };
        let serving =
            axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).with_graceful_shutdown(stop);
        // Requests in flight get a few seconds once it stops; idle keep-alive connections none.
        let drained = async move {
            let _ = stopped.wait_for(|s| *s).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        };
        tokio::select! {
            served = serving => served.context("serving")?,
            () = drained => {}
        }
        if read_announce(&dir).is_some_and(|a| a.pid == pid) {
            let _ = std::fs::remove_file(dir.join(ANNOUNCE));
        }
        if let Err(e) = service.db().delete_tokens_named(&tenant, TOKEN_NAME).await {
            tracing::warn!("removing the daemon's token: {e}");
        }
        anyhow::Ok(())
    })?;
    drop(lock);
    Ok(())
}
