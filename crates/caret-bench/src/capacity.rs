//! `caret bench capacity`: what one replica carries. Simulated developers, each with a
//! workspace of their own (a real tree, copied and varied), do an hour's work against one
//! `caret serve` — a sync every three minutes with two files changed, searches, Tab requests
//! and chat calls through the gateway, background runs queued — at the rate that many
//! developers make, ramped until an objective breaks. The models are a double on loopback
//! with a fixed latency (Tab, chat, and embeddings: deterministic vectors), so that only
//! Caret's own cost is measured; what the embedded local model would add is measured apart.
//!
//! Printed per workspace size: server CPU per operation and per developer-hour, memory per
//! workspace, bytes per workspace in the bucket and in the database, and (for the first size)
//! the ramp: active developers per server core at the break.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use caret_client::state::WorkspaceState;
use caret_client::sync::{SyncEngine, SyncOptions};
use caret_client::transport::HttpTransport;
use caret_host::config::Config;
use caret_protocol::SearchMode;
use caret_workspace::scan::{Depth, Scanner};

mod priority;
mod trees;

use priority::{idle_scan_pool, load_runtime};
use trees::{comment, copy_base, edit, make_base};

use crate::process::{Child, caret, start_serve};
use crate::search::percentile;
use crate::soak::rss_kib;

/// What to run.
#[derive(Debug, Clone)]
pub struct CapacityBench {
    /// Real trees the workspaces are made of (their files in order, until a workspace is full).
    pub trees: Vec<PathBuf>,
    /// Workspace sizes in files; the first is the one ramped.
    pub sizes: Vec<usize>,
    /// Active developers at each step of the ramp.
    pub ramp: Vec<usize>,
    /// Distinct workspaces at the first size (developers beyond share them round-robin); at
    /// the larger sizes, fewer (one per 250,000 files of this budget, at least one).
    pub workspaces: usize,
    /// Length of a ramp step.
    pub step: Duration,
    /// The model double's latency per call.
    pub latency: Duration,
    /// PostgreSQL's URL (default: the embedded SQLite).
    pub database_url: Option<String>,
    /// The bucket, e.g. `s3://caret-bench` (default: a local directory).
    pub object_store: Option<String>,
    /// The operations the ramp makes, by name (empty: all of a developer's hour).
    pub ops: Vec<String>,
}

/// The operations of a developer's hour, and how many of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Sync,
    Search,
    Tab,
    Chat,
    Run,
}

const HOUR: [(Op, u32, &str); 5] = [
    (Op::Sync, 20, "sync"),
    (Op::Search, 20, "search"),
    (Op::Tab, 600, "tab"),
    (Op::Chat, 30, "chat"),
    (Op::Run, 2, "run"),
];

/// Files changed before each sync.
const CHANGED_PER_SYNC: usize = 2;

fn name(op: Op) -> &'static str {
    HOUR.iter().find(|(o, _, _)| *o == op).map_or("?", |(_, _, n)| n)
}

/// The model double: `/v1/completions` and `/v1/chat/completions` answer after a fixed
/// latency (streamed or not); `/v1/embeddings` answers at once with a vector derived from each
/// text's hash (384 wide), so that equal texts get equal vectors.
fn model_double(latency: Duration, counts: &Counts) -> anyhow::Result<String> {
    async fn completions(
        axum::extract::State((latency, calls, held)): axum::extract::State<(Duration, Arc<AtomicU64>, Held)>,
        body: Bytes,
    ) -> axum::response::Response {
        use axum::response::IntoResponse as _;
        let arrived = Instant::now();
        calls.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(latency).await;
        let request = serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default();
        if let Some(n) = request["prompt"].as_str().and_then(tab_number) {
            held.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(n, arrived.elapsed().as_secs_f64() * 1e3);
        }
        let stream = request["stream"] == true;
        let usage = serde_json::json!({"prompt_tokens": 100, "completion_tokens": 4, "total_tokens": 104});
        if !stream {
            let answer = serde_json::json!({"id": "c1", "object": "text_completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "text": " + 1", "finish_reason": "stop"}], "usage": usage});
            return axum::Json(answer).into_response();
        }
        let text = format!(
            "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
            serde_json::json!({"id": "c1", "object": "text_completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "text": " + 1", "finish_reason": "stop"}]}),
            serde_json::json!({"id": "c1", "object": "text_completion", "created": 0, "model": "m",
                "choices": [], "usage": usage}),
        );
        ([("content-type", "text/event-stream")], text).into_response()
    }
    async fn chat(
        axum::extract::State((latency, calls, _)): axum::extract::State<(Duration, Arc<AtomicU64>, Held)>,
        body: Bytes,
    ) -> axum::response::Response {
        use axum::response::IntoResponse as _;
        calls.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(latency).await;
        let stream = serde_json::from_slice::<serde_json::Value>(&body).is_ok_and(|v| v["stream"] == true);
        let usage = serde_json::json!({"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22});
        if !stream {
            let answer = serde_json::json!({"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": usage});
            return axum::Json(answer).into_response();
        }
        let text = format!(
            "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
            serde_json::json!({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}),
            serde_json::json!({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                "choices": [], "usage": usage}),
        );
        ([("content-type", "text/event-stream")], text).into_response()
    }
    async fn embeddings(
        axum::extract::State(embedded): axum::extract::State<Arc<AtomicU64>>,
        body: Bytes,
    ) -> axum::response::Response {
        use axum::response::IntoResponse as _;
        let inputs: Vec<String> = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| serde_json::from_value(v["input"].clone()).ok())
            .unwrap_or_default();
        embedded.fetch_add(inputs.len() as u64, Ordering::Relaxed);
        let data: Vec<serde_json::Value> = inputs
            .iter()
            .enumerate()
            .map(|(i, text)| serde_json::json!({"object": "embedding", "index": i, "embedding": hashed_vector(text)}))
            .collect();
        axum::Json(serde_json::json!({"object": "list", "data": data, "model": "double"})).into_response()
    }
    let app = axum::Router::new()
        .route("/v1/completions", axum::routing::post(completions))
        .route("/v1/chat/completions", axum::routing::post(chat))
        .with_state((latency, counts.calls.clone(), counts.held.clone()))
        .merge(
            axum::Router::new()
                .route("/v1/embeddings", axum::routing::post(embeddings))
                .with_state(counts.embedded.clone()),
        );
    // On a runtime of its own: the load's tasks must not delay the double's answers (its
    // time counts as the model's, the rest as the server's).
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let url = format!("http://{}", listener.local_addr()?);
    // (It stands for a model server on machines of its own: its thread asks for short slices
    // of the cores, as the server's own do, so that its answers do not wait out the load's.)
    let own = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("model-double")
        .on_thread_start(caret_host::runtime::ask_short_slice)
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        own.block_on(async move {
            if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                let _ = axum::serve(listener, app).await;
            }
        });
    });
    Ok(url)
}

/// 384 values in [-1, 1) from the text's BLAKE3 output stream.
fn hashed_vector(text: &str) -> Vec<f32> {
    let mut bytes = [0u8; 768];
    blake3::Hasher::new().update(text.as_bytes()).finalize_xof().fill(&mut bytes);
    bytes.chunks_exact(2).map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0).collect()
}

/// CPU time of a process so far in ms, its ended threads' included (`/proc/PID/stat`, in
/// clock ticks of 10 ms: the windows measured here are seconds long).
fn cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 * 10.0)
}

/// Cores the whole machine kept busy between two readings of [`machine_jiffies`].
fn machine_cores(from: (u64, u64), to: (u64, u64)) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    (to.0 - from.0) as f64 / (to.1 - from.1).max(1) as f64 * cores
}

/// Busy and total jiffies of the whole machine, from `/proc/stat`.
/// Waits until background work the server started (compactions of new logs) is done: three
/// quiet windows of two seconds in a row, ten minutes at most. Quiet is the server under 100 ms
/// of CPU and the whole machine under a quarter of a core: a compaction first reads the old
/// segment from the bucket, and while the bucket's server works the Caret server itself is
/// idle. Returns the seconds waited.
fn settle(pid: u32) -> f64 {
    let settled = Instant::now();
    let (mut last, mut machine) = (cpu_ms(pid).unwrap_or(0.0), machine_jiffies());
    let mut quiet = 0;
    while settled.elapsed() < Duration::from_secs(600) && quiet < 3 {
        std::thread::sleep(Duration::from_secs(2));
        let (now, machine_now) = (cpu_ms(pid).unwrap_or(0.0), machine_jiffies());
        let quiet_now = now - last < 100.0 && machine_cores(machine, machine_now) < 0.25;
        quiet = if quiet_now { quiet + 1 } else { 0 };
        (last, machine) = (now, machine_now);
    }
    settled.elapsed().as_secs_f64()
}

fn machine_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> =
        stat.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// What the double was asked: model calls, and texts embedded.
#[derive(Default)]
struct Counts {
    calls: Arc<AtomicU64>,
    embedded: Arc<AtomicU64>,
    /// How long the double held each Tab request, by the number in its prompt (ms).
    held: Held,
}

type Held = Arc<std::sync::Mutex<std::collections::HashMap<u64, f64>>>;

/// The number a Tab request's text ends with (`… tab request N`).
fn tab_number(prompt: &str) -> Option<u64> {
    let at = prompt.rfind("tab request ")? + "tab request ".len();
    prompt[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Requests at once each of the double's deployments takes (and as many waiting).
const DOUBLE_CONCURRENCY: usize = 1024;

/// A `caret serve` with the double as its models and embedding service.
struct Server {
    child: Child,
    url: String,
    token: String,
}

fn start_server(args: &CapacityBench, dir: &Path, double: &str, tenant: &str) -> anyhow::Result<Server> {
    let exe = std::env::current_exe()?;
    let (home, data) = (dir.join("home"), dir.join("srv"));
    std::fs::create_dir_all(&home)?;
    let mut config = String::from("[server]\n");
    if let Some(url) = &args.database_url {
        config += &format!("database_url = {url:?}\n");
    }
    if let Some(store) = &args.object_store {
        config += &format!("object_store = {store:?}\n");
    }
    config += &format!("\n[embed]\nurl = {double:?}\nmodel = \"double\"\ndim = 384\n");
    // The double stands for a fleet that answers every request in its latency: without a
    // bound of its own above the load's (a deployment's default is 16 at once), requests
    // would queue in the gateway for the model's capacity, and that wait is not the server's.
    for alias in ["tab", "chat", "agent"] {
        config += &format!(
            "\n[[models]]\nalias = \"{alias}\"\ndeployments = [{{ provider = \"openai\", url = {double:?}, model = \"qwen2.5-coder-1.5b\", max_concurrency = {DOUBLE_CONCURRENCY}, max_queue = {DOUBLE_CONCURRENCY} }}]\n"
        );
    }
    std::fs::write(home.join("config.toml"), config)?;
    caret(&data, &home, &["admin", "tenant", "create", tenant])?;
    let token = caret(&data, &home, &["admin", "token", "create", "--tenant", tenant])?;
    let (child, url) = start_serve(
        Command::new(&exe)
            .args(["serve", "--addr", "127.0.0.1:0", "--rate-limit", "1000000", "--rate-limit-burst", "1000000"])
            .args(["--ip-rate-limit", "1000000", "--ip-rate-limit-burst", "1000000", "--data-dir"])
            .arg(&data)
            .env("CARET_HOME", &home)
            .env("RUST_LOG", std::env::var("CARET_BENCH_SERVER_LOG").unwrap_or_else(|_| "warn".into()))
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("server.log"))?),
    )?;
    Ok(Server { child, url, token })
}

/// Bytes of every object under the bucket (or local directory) now.
async fn bucket_bytes(store: &dyn object_store::ObjectStore) -> anyhow::Result<u64> {
    use futures::TryStreamExt as _;
    let mut total = 0;
    let mut list = store.list(None);
    while let Some(meta) = list.try_next().await? {
        total += meta.size;
    }
    Ok(total)
}

/// One simulated developer's workspace on disk and on the server.
struct Workspace {
    dir: PathBuf,
    state: WorkspaceState,
    transport: HttpTransport,
    /// The next edit's number.
    edits: tokio::sync::Mutex<u64>,
}

/// What one operation did.
struct Done {
    op: Op,
    ms: f64,
    error: Option<String>,
    /// A Tab request's time beyond the model's: as the client saw it, and inside the server.
    overhead: Option<(f64, f64)>,
    /// A sync's time with the client's scan of the workspace (which `ms` leaves out).
    with_scan: Option<f64>,
}

/// Everything the operations share.
struct Load {
    workspaces: Vec<Workspace>,
    /// Every workspace's files (relative): where edits go.
    files: Vec<PathBuf>,
    scanner: Arc<Scanner>,
    engine: SyncEngine,
    http: reqwest::Client,
    url: String,
    token: String,
    queries: Vec<String>,
    tab_texts: Vec<(String, String)>,
    /// Tab requests' numbers, and how long the double held each.
    tabs: AtomicU64,
    held: Held,
}

impl Load {
    async fn run(&self, op: Op, dev: usize, n: u64) -> Done {
        let ws = &self.workspaces[dev % self.workspaces.len()];
        let started = Instant::now();
        let result: anyhow::Result<()> = match op {
            Op::Sync => {
                // One developer syncs at a time per workspace; the wait is not the server's.
                let mut edits = ws.edits.lock().await;
                let started_sync = Instant::now();
                let mut outcome = Ok(());
                for k in 0..CHANGED_PER_SYNC {
                    *edits += 1;
                    let rel = &self.files[(dev * 7 + *edits as usize * 13 + k) % self.files.len()];
                    if let Err(e) = edit(&ws.dir, rel, &format!("developer {dev} edit {}", *edits)) {
                        outcome = Err(e);
                    }
                }
                let outcome = match outcome {
                    Ok(()) => self.sync(ws).await,
                    Err(e) => Err(e),
                };
                // The scan of the workspace's files runs on the developer's machine (and the
                // daemon's watcher skips it): the objective is the rest, the requests.
                let whole = started_sync.elapsed().as_secs_f64() * 1e3;
                let (ms, error) = match outcome {
                    Ok(scan) => (whole - scan * 1e3, None),
                    Err(e) => (whole, Some(format!("{e:#}"))),
                };
                return Done { op, ms, error, overhead: None, with_scan: Some(whole) };
            }
            Op::Search => {
                // The server's answer, as the client asks for it (the reading and reranking
                // that follow happen on the developer's machine).
                use caret_client::transport::Transport as _;
                let query = self.queries[(dev + n as usize) % self.queries.len()].clone();
                let req = caret_protocol::SearchRequest { query, k: 50, mode: SearchMode::Hybrid };
                ws.transport
                    .search(&ws.state.id, &ws.state.key.server_key(), &req)
                    .await
                    .map(|_| ())
                    .map_err(anyhow::Error::from)
            }
            Op::Tab => {
                let (path, text) = &self.tab_texts[(dev + n as usize) % self.tab_texts.len()];
                let number = self.tabs.fetch_add(1, Ordering::Relaxed);
                let text = format!("{text}\n{} tab request {number}\n", comment(Path::new(path)));
                let body = serde_json::json!({"text": text, "cursor": text.len(), "path": path});
                let answer = self.post("/v1/complete", &body).await;
                let ms = started.elapsed().as_secs_f64() * 1e3;
                let held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&number);
                return match (answer, held) {
                    (Ok(answer), Some(held)) => {
                        let inside = answer["total_ms"].as_f64().unwrap_or(f64::NAN) - held;
                        Done { op, ms, error: None, overhead: Some((ms - held, inside)), with_scan: None }
                    }
                    (Ok(_), None) => {
                        Done { op, ms, error: Some("the model was not asked".into()), overhead: None, with_scan: None }
                    }
                    (Err(e), _) => Done { op, ms, error: Some(format!("{e:#}")), overhead: None, with_scan: None },
                };
            }
            Op::Chat => {
                let body = serde_json::json!({"model": "chat", "max_tokens": 16,
                    "messages": [{"role": "user", "content": format!("Developer {dev}: what does this do? {n}")}]});
                self.post("/v1/chat/completions", &body).await.map(|_| ())
            }
            Op::Run => {
                let body = serde_json::json!({"repo": {"kind": "git", "url": "file:///srv/caret-capacity/repo.git"},
                    "task": format!("Developer {dev}'s background task {n}")});
                self.post("/v1/runs", &body).await.map(|_| ())
            }
        };
        Done {
            op,
            ms: started.elapsed().as_secs_f64() * 1e3,
            error: result.err().map(|e| format!("{e:#}")),
            overhead: None,
            with_scan: None,
        }
    }

    /// Syncs and embeds; the seconds the client's scan took.
    async fn sync(&self, ws: &Workspace) -> anyhow::Result<f64> {
        let report = self.engine.sync(&ws.state, &ws.transport).await?;
        caret_client::index::embed_missing(self.scanner.clone(), &ws.state, &ws.transport, |_| {}).await?;
        Ok(report.scan_seconds)
    }

    async fn post(&self, path: &str, body: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let r = self.http.post(format!("{}{path}", self.url)).bearer_auth(&self.token).json(body).send().await?;
        let status = r.status();
        let text = r.bytes().await?;
        anyhow::ensure!(
            status.is_success(),
            "{path}: {status}: {}",
            String::from_utf8_lossy(&text[..text.len().min(200)])
        );
        Ok(serde_json::from_slice(&text).unwrap_or_default())
    }
}

/// Latencies and errors of a batch of operations, by operation.
struct Tally {
    ms: [Vec<f64>; 5],
    /// Tab overheads, client-seen and inside the server, sorted.
    overhead: [Vec<f64>; 2],
    /// Syncs with the client's scan, sorted.
    with_scan: Vec<f64>,
    errors: [u64; 5],
    first_error: Option<String>,
}

fn index(op: Op) -> usize {
    HOUR.iter().position(|(o, _, _)| *o == op).unwrap_or(0)
}

fn tally(done: Vec<Done>) -> Tally {
    let mut t = Tally {
        ms: Default::default(),
        overhead: Default::default(),
        with_scan: Vec::new(),
        errors: [0; 5],
        first_error: None,
    };
    for d in done {
        let i = index(d.op);
        t.with_scan.extend(d.with_scan);
        if let Some((client, server)) = d.overhead {
            t.overhead[0].push(client);
            t.overhead[1].push(server);
        }
        t.ms[i].push(d.ms);
        if let Some(e) = d.error {
            t.errors[i] += 1;
            t.first_error.get_or_insert_with(|| format!("{}: {e}", name(d.op)));
        }
    }
    for v in t.ms.iter_mut().chain(t.overhead.iter_mut()).chain([&mut t.with_scan]) {
        v.sort_by(f64::total_cmp);
    }
    t
}

/// Whether the ramp makes the operation named `name`.
fn ramped(args: &CapacityBench, name: &str) -> bool {
    args.ops.is_empty() || args.ops.iter().any(|o| o == name)
}

/// Runs this benchmark and prints its figures.
pub fn run(config: &Config, args: CapacityBench) -> anyhow::Result<ExitCode> {
    let scratch = config.home.join("bench").join(format!("capacity-{}", std::process::id()));
    let result = bench(config, &args, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn bench(config: &Config, args: &CapacityBench, scratch: &Path) -> anyhow::Result<ExitCode> {
    if let Some(bad) = args.ops.iter().find(|o| !HOUR.iter().any(|(_, _, n)| n == o)) {
        let names: Vec<&str> = HOUR.iter().map(|(_, _, n)| *n).collect();
        anyhow::bail!("--ops: no operation is named {bad:?} (they are {})", names.join(", "));
    }
    idle_scan_pool()?;
    let rt = load_runtime()?;
    let counts = Counts::default();
    let double = model_double(args.latency, &counts)?;
    let backends = format!(
        "{} and {}",
        args.database_url.as_deref().map_or("SQLite (embedded)", |_| "PostgreSQL"),
        args.object_store.as_deref().unwrap_or("a local directory")
    );
    let hour: Vec<String> = HOUR.iter().map(|(_, n, name)| format!("{n} {name}")).collect();
    println!(
        "caret bench capacity: caret serve on {backends}; models: a double on loopback answering in {} ms\n\
         a developer's hour: {} (each sync changes {CHANGED_PER_SYNC} files; runs are queued, not executed)",
        args.latency.as_millis(),
        hour.join(", ")
    );
    for (k, &size) in args.sizes.iter().enumerate() {
        let workspaces = if k == 0 {
            args.workspaces.max(1)
        } else {
            (args.workspaces.max(1) * 1000 / size).clamp(1, args.workspaces)
        };
        let ramp = if k == 0 { args.ramp.as_slice() } else { &[] };
        size_run(config, args, &rt, &scratch.join(format!("size-{size}")), &double, &counts, size, workspaces, ramp)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The server's loaded workspaces and its estimate of their bytes, from its metrics.
async fn loaded_estimate(url: &str) -> Option<(u64, u64)> {
    let text = reqwest::get(format!("{url}/metrics")).await.ok()?.text().await.ok()?;
    let gauge =
        |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<u64>().ok());
    Some((gauge("caret_workspaces_loaded")?, gauge("caret_workspaces_loaded_bytes")?))
}

#[allow(clippy::too_many_arguments)]
fn size_run(
    config: &Config,
    args: &CapacityBench,
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    double: &str,
    counts: &Counts,
    size: usize,
    workspaces: usize,
    ramp: &[usize],
) -> anyhow::Result<()> {
    let tenant = format!("capacity-{}-{size}", std::process::id());
    let server = start_server(args, dir, double, &tenant)?;
    let pid = server.child.0.id();
    let store_url = args.object_store.clone().unwrap_or_else(|| dir.join("srv").join("objects").display().to_string());
    let store = caret_index::open_object_store(&store_url)?;
    let db_url =
        args.database_url.clone().unwrap_or_else(|| format!("sqlite://{}", dir.join("srv").join("caret.db").display()));
    let base = dir.join("base");
    let files = make_base(config, &args.trees, size, &base)?;
    let scanner = Arc::new(Scanner::new(config.walk_config(), config.chunker()?, Depth::Hash));

    // Workspaces: the first syncs and embeds everything; the others share its key (a team's
    // imported key), so each starts on the server as a copy of it and sends only its varied
    // file.
    let started = Instant::now();
    // The server's memory (KiB), the bucket's bytes and the database's bytes now.
    let footprint = || {
        rt.block_on(async {
            let db = match caret_index::db::Db::connect(&db_url).await {
                Ok(db) => db.size_bytes().await.unwrap_or(0),
                Err(_) => 0,
            };
            (rss_kib(pid).unwrap_or(0), bucket_bytes(store.as_ref()).await.unwrap_or(0), db)
        })
    };
    let (rss0, bucket0, db0) = footprint();
    let keys = dir.join("keys");
    let engine = SyncEngine::new(scanner.clone(), SyncOptions::default());
    let mut made = Vec::with_capacity(workspaces);
    let mut chunks = 0u64;
    let mut first_sync_s = 0.0;
    let mut marks = Vec::new();
    for w in 0..workspaces {
        let wdir = dir.join("ws").join(w.to_string());
        copy_base(&base, &files, &wdir, w)?;
        let mut state = WorkspaceState::open(&wdir, &dir.join("state").join(w.to_string()), &keys)?;
        if let Some(first) = made.first() {
            let first: &Workspace = first;
            state.replace_key(first.state.key.clone())?;
        }
        let transport = HttpTransport::new(&server.url, &server.token, None)?;
        let ws = Workspace { dir: wdir, state, transport, edits: tokio::sync::Mutex::new(0) };
        let t = Instant::now();
        let report = rt.block_on(async {
            engine.sync(&ws.state, &ws.transport).await?;
            caret_client::index::embed_missing(scanner.clone(), &ws.state, &ws.transport, |_| {}).await
        })?;
        if w == 0 {
            first_sync_s = t.elapsed().as_secs_f64();
            chunks = report.progress.total;
        }
        made.push(ws);
        if (w == 0 && workspaces > 1) || (w == 1 && workspaces > 2) {
            // The first workspace's index alone, once its background work is done: the
            // others start as copies of it (same key, the same tree but for a file). The
            // first copy folds the source's log into its segment before copying it (a
            // compaction's buffers, kept by the allocator): the copies after it show what a
            // copy itself keeps.
            settle(pid);
            marks.push(footprint());
        }
    }
    let setup_s = started.elapsed().as_secs_f64();
    let settle_s = settle(pid);
    let (rss1, bucket1, db1) = footprint();
    let per_ws = |a: u64, b: u64| b.saturating_sub(a) as f64 / workspaces as f64;
    println!(
        "\nworkspaces of {size} files ({chunks} chunks each): {workspaces} set up in {setup_s:.1} s (the first, synced and embedded from nothing: {first_sync_s:.1} s; the background work it started: {settle_s:.0} s more)"
    );
    println!(
        "  server memory: {:.2} MiB per workspace (RSS {:.0} → {:.0} MiB)",
        per_ws(rss0, rss1) / 1024.0,
        rss0 as f64 / 1024.0,
        rss1 as f64 / 1024.0
    );
    if let Some((loaded, bytes)) = rt.block_on(loaded_estimate(&server.url)) {
        println!(
            "  the server's estimate of its loaded indexes (what it unloads by): {:.1} MiB for {loaded} workspaces, against {:.1} MiB of RSS grown",
            bytes as f64 / 1048576.0,
            rss1.saturating_sub(rss0) as f64 / 1024.0
        );
    }
    // What each developer's copy adds beyond the first workspace's index.
    let copy_kib = marks.first().copied().map(|(rss_first, bucket_first, _)| {
        let (from, copies) = match marks.get(1) {
            Some(after_one) => {
                println!(
                    "  the first workspace's index {:.1} MiB; the first copy {:.1} MiB more (it folds the source's log into its segment first)",
                    rss_first.saturating_sub(rss0) as f64 / 1024.0,
                    after_one.0.saturating_sub(rss_first) as f64 / 1024.0
                );
                (*after_one, (workspaces - 2) as f64)
            }
            None => {
                println!("  the first workspace's index {:.1} MiB", rss_first.saturating_sub(rss0) as f64 / 1024.0);
                ((rss_first, bucket_first, 0), (workspaces - 1) as f64)
            }
        };
        let mem = rss1.saturating_sub(from.0) as f64 / copies;
        let bucket = bucket1.saturating_sub(from.1) as f64 / copies;
        println!(
            "  each copy started from it: {:.3} MiB more in memory, {:.1} MiB in the bucket: memory per developer",
            mem / 1024.0,
            bucket / 1048576.0
        );
        (rss_first, mem)
    });
    let mem_total_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    match copy_kib {
        Some((rss_first, copy)) if copy > 0.0 => println!(
            "  → the machine's {:.0} GiB hold, beside the first workspace's index, {:.0} developers' copies of it",
            mem_total_kib / 1048576.0,
            (mem_total_kib - rss_first as f64) / copy
        ),
        _ if per_ws(rss0, rss1) > 0.0 => println!(
            "  → the machine's {:.0} GiB hold the loaded indexes of {:.0} such workspaces (one per active developer)",
            mem_total_kib / 1048576.0,
            (mem_total_kib - rss0 as f64) / per_ws(rss0, rss1)
        ),
        _ => {}
    }
    let bucket_ws = per_ws(bucket0, bucket1);
    println!(
        "  bucket: {:.2} MiB per workspace, {:.1} KiB per 1,000 chunks; database: {:.1} KiB per workspace",
        bucket_ws / 1048576.0,
        bucket_ws / 1024.0 / (chunks.max(1) as f64 / 1000.0),
        per_ws(db0, db1) / 1024.0
    );

    // Queries and Tab contexts from the tree itself.
    let mut queries = Vec::new();
    let mut tab_texts = Vec::new();
    for rel in files.iter().step_by((files.len() / 40).max(1)) {
        let Ok(text) = std::fs::read_to_string(base.join(rel)) else { continue };
        let stem = rel.file_stem().map(|s| s.to_string_lossy().replace(['_', '-', '.'], " ")).unwrap_or_default();
        if !stem.trim().is_empty() {
            queries.push(format!("where is {stem} handled"));
        }
        let cut = text.char_indices().map(|(i, _)| i).find(|i| *i >= text.len() / 2).unwrap_or(text.len());
        let start = text[..cut].char_indices().map(|(i, _)| i).find(|i| *i + 4096 >= cut).unwrap_or(0);
        tab_texts.push((rel.display().to_string(), text[start..cut].to_owned()));
    }
    anyhow::ensure!(!queries.is_empty() && !tab_texts.is_empty(), "the tree gave no text to ask with");
    let load = Arc::new(Load {
        workspaces: made,
        files,
        scanner: scanner.clone(),
        engine,
        http: reqwest::Client::new(),
        url: server.url.clone(),
        token: server.token.clone(),
        queries,
        tab_texts,
        tabs: AtomicU64::new(0),
        held: counts.held.clone(),
    });

    // Each workspace searched once first: a server that has been up has each active
    // workspace's search caches built (they then follow each change).
    rt.block_on(async {
        for (i, _) in load.workspaces.iter().enumerate() {
            let _ = load.run(Op::Search, i, 0).await;
        }
    });

    // Each operation alone: the server's CPU per operation.
    println!("  server CPU by operation, each alone (4 at a time):");
    println!("    op       per dev-hour   CPU-ms each   CPU-ms per dev-hour    p50 ms    p99 ms");
    let mut per_hour_total = 0.0;
    let mut model_calls_per_tab = 0.0;
    let mut embedded_per_hour = 0.0;
    for (op, per_hour, op_name) in HOUR {
        let n = match op {
            Op::Tab => 400,
            Op::Sync => 40,
            Op::Run => 20,
            _ => 80,
        };
        let (calls_before, embedded_before) =
            (counts.calls.load(Ordering::Relaxed), counts.embedded.load(Ordering::Relaxed));
        let before = cpu_ms(pid).unwrap_or(0.0);
        let done = rt.block_on(async {
            let next = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::new();
            for lane in 0..4 {
                let (load, next) = (load.clone(), next.clone());
                tasks.push(tokio::spawn(async move {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        done.push(load.run(op, lane + 4 * i as usize, i).await);
                    }
                    done
                }));
            }
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await?);
            }
            anyhow::Ok(all)
        })?;
        let cpu = (cpu_ms(pid).unwrap_or(0.0) - before) / n as f64;
        let embedded = (counts.embedded.load(Ordering::Relaxed) - embedded_before) as f64 / n as f64;
        match op {
            Op::Tab => model_calls_per_tab = (counts.calls.load(Ordering::Relaxed) - calls_before) as f64 / n as f64,
            Op::Sync | Op::Search => embedded_per_hour += embedded * f64::from(per_hour),
            _ => {}
        }
        let t = tally(done);
        let i = index(op);
        per_hour_total += cpu * f64::from(per_hour);
        println!(
            "    {op_name:<8} {per_hour:>12} {cpu:>13.2} {:>21.0} {:>9.1} {:>9.1}",
            cpu * f64::from(per_hour),
            percentile(&t.ms[i], 0.5),
            percentile(&t.ms[i], 0.99)
        );
        if op == Op::Sync {
            println!(
                "      with the client's scan of the workspace (on the developer's machine; the daemon's watcher skips it): p50 {:.1} / p99 {:.1} ms",
                percentile(&t.with_scan, 0.5),
                percentile(&t.with_scan, 0.99)
            );
        }
        if op == Op::Search {
            let mut whole = Vec::new();
            for (i, q) in load.queries.iter().take(20).enumerate() {
                let ws = &load.workspaces[i % load.workspaces.len()];
                let started = Instant::now();
                let rerank = caret_client::index::Rerank::default();
                let found = caret_client::index::search(
                    scanner.clone(),
                    &ws.state,
                    &ws.transport,
                    q,
                    10,
                    SearchMode::Hybrid,
                    rerank,
                );
                rt.block_on(found)?;
                whole.push(started.elapsed().as_secs_f64() * 1e3);
            }
            whole.sort_by(f64::total_cmp);
            println!(
                "      with the client's reading and reranking (on the developer's machine), one at a time: p50 {:.1} ms",
                percentile(&whole, 0.5)
            );
        }
        if op == Op::Tab {
            println!(
                "      beyond the model's time: p50 {:.2} / p99 {:.2} ms inside the server, {:.2} / {:.2} ms as the client saw it",
                percentile(&t.overhead[1], 0.5),
                percentile(&t.overhead[1], 0.99),
                percentile(&t.overhead[0], 0.5),
                percentile(&t.overhead[0], 0.99)
            );
        }
        if let Some(e) = t.first_error {
            println!("      {} errors; first: {e}", t.errors[i]);
        }
    }
    let per_core = 3_600_000.0 / per_hour_total;
    println!(
        "  a developer-hour: {per_hour_total:.0} CPU-ms of the server → {per_core:.0} developers per core at full use \
         ({:.0} per 2-core replica); {model_calls_per_tab:.2} model calls per Tab request",
        per_core * 2.0
    );
    match local_embedding_cost(config, &load.tab_texts, &load.queries) {
        Ok(Some(ms)) => println!(
            "  with the local embedding model in the server instead of an embedding service: {embedded_per_hour:.0} \
             texts a developer-hour (changed chunks and queries) at {ms:.1} CPU-ms each = {:.0} CPU-ms more \
             ({:.0} developers per core)",
            embedded_per_hour * ms,
            3_600_000.0 / (per_hour_total + embedded_per_hour * ms)
        ),
        Ok(None) => println!("  (no local embedding model installed: its cost is not measured)"),
        Err(e) => println!("  (the local embedding model's cost could not be measured: {e:#})"),
    }
    if ramp.is_empty() {
        return Ok(());
    }

    // The ramp: each step runs its developers' share of an hour's operations, spread at
    // random over the step, for as long as the objectives hold.
    println!(
        "  ramp, {} s a step{} (objectives: p99 search ≤ 150 ms, p99 sync ≤ 1 s, gateway overhead p99 ≤ 2 ms, no errors):",
        args.step.as_secs(),
        if args.ops.is_empty() { String::new() } else { format!(", {} only", args.ops.join(" and ")) }
    );
    println!(
        "    devs   ops/s  server cores  machine cores  sync p99  search p99  tab overhead p50/p99: server  client  chat p99  errors  RSS MiB"
    );
    let mut last_good: Option<(usize, f64)> = None;
    let mut broke = None;
    for &devs in ramp {
        let mut rng = fastrand::Rng::with_seed(devs as u64);
        let step_s = args.step.as_secs_f64();
        let mut schedule: Vec<(f64, Op, usize, u64)> = Vec::new();
        for (op, per_hour, _) in HOUR.into_iter().filter(|(_, _, name)| ramped(args, name)) {
            let n = (devs as f64 * f64::from(per_hour) * step_s / 3600.0).round() as u64;
            for i in 0..n {
                schedule.push((rng.f64() * step_s, op, rng.usize(0..devs), i));
            }
        }
        let ops = schedule.len();
        let (cpu0, jiffies0) = (cpu_ms(pid).unwrap_or(0.0), machine_jiffies());
        let started = Instant::now();
        let done = rt.block_on(async {
            let mut tasks = Vec::with_capacity(ops);
            for (at, op, dev, i) in schedule {
                let load = load.clone();
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(started + Duration::from_secs_f64(at)))
                        .await;
                    tokio::time::timeout(Duration::from_secs(60), load.run(op, dev, i)).await.unwrap_or(Done {
                        op,
                        ms: 60_000.0,
                        error: Some("no answer in 60 s".into()),
                        overhead: None,
                        with_scan: None,
                    })
                }));
            }
            let mut all = Vec::with_capacity(ops);
            for t in tasks {
                all.push(t.await?);
            }
            anyhow::Ok(all)
        })?;
        let wall = started.elapsed().as_secs_f64();
        let server_cores = (cpu_ms(pid).unwrap_or(0.0) - cpu0) / 1e3 / wall;
        let machine_cores = machine_cores(jiffies0, machine_jiffies());
        let t = tally(done);
        let p99 = |op: Op| percentile(&t.ms[index(op)], 0.99);
        let overhead = |k: usize, q: f64| percentile(&t.overhead[k], q);
        let errors: u64 = t.errors.iter().sum();
        println!(
            "    {devs:>4} {:>7.1} {server_cores:>13.2} {machine_cores:>14.2} {:>9.0} {:>11.1} {:>20.2}/{:<5.2} {:>6.2}/{:<6.2} {:>8.1} {errors:>7} {:>8.0}",
            ops as f64 / step_s,
            p99(Op::Sync),
            p99(Op::Search),
            overhead(1, 0.5),
            overhead(1, 0.99),
            overhead(0, 0.5),
            overhead(0, 0.99),
            p99(Op::Chat),
            rss_kib(pid).unwrap_or(0) as f64 / 1024.0
        );
        let mut broken = Vec::new();
        if p99(Op::Search) > 150.0 {
            broken.push("p99 search > 150 ms".to_owned());
        }
        if p99(Op::Sync) > 1000.0 {
            broken.push("p99 sync > 1 s".to_owned());
        }
        if overhead(1, 0.99) > 2.0 {
            broken.push("gateway overhead p99 > 2 ms".to_owned());
        }
        if errors > 0 {
            broken.push(format!("{errors} errors (first: {})", t.first_error.unwrap_or_default()));
        }
        if !broken.is_empty() {
            broke = Some((devs, broken.join("; ")));
            break;
        }
        last_good = Some((devs, server_cores));
    }
    match (last_good, broke) {
        (Some((devs, cores)), broke) => {
            let why =
                broke.map_or_else(|| "the ramp ended first".to_owned(), |(n, why)| format!("broke at {n}: {why}"));
            println!(
                "  within the objectives at {devs} active developers on {cores:.2} server cores → {:.0} developers per server core ({why})",
                devs as f64 / cores.max(1e-3)
            );
        }
        (None, Some((n, why))) => println!("  the first step ({n} developers) already broke: {why}"),
        (None, None) => {}
    }
    Ok(())
}

/// CPU-ms per text of the local embedding model, the mean over texts like a changed chunk
/// (one at a time, as a sync's few changes and a query are embedded); `None` without a model.
fn local_embedding_cost(
    config: &Config,
    texts: &[(String, String)],
    queries: &[String],
) -> anyhow::Result<Option<f64>> {
    use caret_embed::Embedder as _;
    let dir = config.local_model_dir();
    if !caret_embed::is_local_model(&dir) {
        return Ok(None);
    }
    let model = caret_embed::LocalBert::load(&dir, config.local_embedding_settings()?)?;
    let own = std::process::id();
    let chunks = texts.iter().map(|(_, t)| t.lines().rev().take(30).collect::<Vec<_>>().join("\n"));
    let all: Vec<String> = chunks.chain(queries.iter().cloned()).take(60).collect();
    model.embed(&[all[0].as_str()])?;
    // The mean over all of them: the CPU clock ticks in 10 ms, about one text's time.
    let before = cpu_ms(own).unwrap_or(0.0);
    for text in &all {
        model.embed(&[text.as_str()])?;
    }
    Ok(Some((cpu_ms(own).unwrap_or(0.0) - before) / all.len().max(1) as f64))
}
