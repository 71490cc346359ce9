//! `caret bench team`: what running Caret for a team costs, side by side in one run.
//!
//! - The server's own cost per request: a chat call to an OpenAI-compatible upstream on
//!   loopback, direct and through `caret serve` (p50/p99 and the difference), and where it
//!   goes, from the server's own spans (`request` ⊃ `gateway.chat` ⊃ `model.call`). The
//!   upstream is this bench's fixed-answer responder, so that only Caret is measured.
//! - Tracing's CPU cost: two servers, one exporting its spans, the other not, syncing and
//!   searching the same workload in alternating rounds; CPU time per operation from `/proc`.
//! - A kill switch set with `caret admin flags`: time until the server answers 503.

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use caret_client::state::WorkspaceState;
use caret_client::sync::{SyncEngine, SyncOptions};
use caret_client::transport::HttpTransport;
use caret_host::config::Config;
use caret_host::runtime::runtime;
use caret_protocol::SearchMode;
use caret_workspace::scan::{Depth, Scanner};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;

use crate::search::percentile;

/// What to run.
#[derive(Debug, Clone)]
pub struct TeamBench {
    /// Chat calls per path (direct, through the server, through the traced server).
    pub requests: usize,
    /// Rounds of the sync and search workload per server.
    pub rounds: usize,
}

/// A span as the sink kept it: name, trace, parent, and its duration in ms.
#[derive(Debug, Clone)]
struct Timed {
    name: String,
    trace: Vec<u8>,
    span: Vec<u8>,
    parent: Vec<u8>,
    ms: f64,
}

/// The fixed-answer upstream: `/v1/chat/completions`, streamed or not.
async fn upstream() -> anyhow::Result<String> {
    async fn chat(body: Bytes) -> axum::response::Response {
        use axum::response::IntoResponse as _;
        let stream = serde_json::from_slice::<serde_json::Value>(&body).is_ok_and(|v| v["stream"] == true);
        if !stream {
            let answer = serde_json::json!({"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}});
            return axum::Json(answer).into_response();
        }
        let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
            serde_json::json!({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let usage = serde_json::json!({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}});
        let text = format!(
            "data: {}\n\ndata: {}\n\ndata: {usage}\n\ndata: [DONE]\n\n",
            chunk(serde_json::json!({"role": "assistant", "content": "ok"}), serde_json::Value::Null),
            chunk(serde_json::json!({}), serde_json::json!("stop")),
        );
        ([("content-type", "text/event-stream")], text).into_response()
    }
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(chat));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

/// An OTLP/HTTP receiver keeping each span's name, ids and duration.
async fn sink(spans: Arc<Mutex<Vec<Timed>>>) -> anyhow::Result<String> {
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(
                |axum::extract::State(spans): axum::extract::State<Arc<Mutex<Vec<Timed>>>>, body: Bytes| async move {
                    if let Ok(req) = ExportTraceServiceRequest::decode(body.as_ref()) {
                        let mut kept = spans.lock().unwrap_or_else(PoisonError::into_inner);
                        for s in req.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans) {
                            kept.push(Timed {
                                name: s.name.clone(),
                                trace: s.trace_id.clone(),
                                span: s.span_id.clone(),
                                parent: s.parent_span_id.clone(),
                                ms: s.end_time_unix_nano.saturating_sub(s.start_time_unix_nano) as f64 / 1e6,
                            });
                        }
                    }
                    axum::http::StatusCode::OK
                },
            ),
        )
        .with_state(spans);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

/// CPU time of a process's threads so far, in ms: each thread's time on a CPU from
/// `/proc/PID/task/*/schedstat` (nanoseconds, where `/proc/PID/stat` counts 10 ms ticks, too
/// coarse for a window of a few searches). A thread that ended takes its time with it: the
/// windows measured here are short and the servers' threads live on.
fn cpu_ms(pid: u32) -> Option<f64> {
    let mut ns: u64 = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
            ns += stat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    Some(ns as f64 / 1e6)
}

/// A `caret serve` on its own data directory with the `chat` alias on `upstream`, and a
/// tenant's token.
struct Served {
    child: crate::process::Child,
    url: String,
    token: String,
    data: std::path::PathBuf,
    home: std::path::PathBuf,
}

fn serve(config: &Config, dir: &Path, upstream: &str, otlp: Option<&str>) -> anyhow::Result<Served> {
    let exe = std::env::current_exe()?;
    let (home, data) = (dir.join("home"), dir.join("srv"));
    std::fs::create_dir_all(&home)?;
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[[models]]\nalias = \"chat\"\ndeployments = [{{ provider = \"openai\", url = \"{upstream}\", model = \"m\" }}]\n"
        ),
    )?;
    let admin = |args: &[&str]| crate::process::caret(&data, &home, args);
    admin(&["admin", "tenant", "create", "bench"])?;
    let token = admin(&["admin", "token", "create", "--tenant", "bench"])?;
    let mut cmd = Command::new(&exe);
    cmd.args(["serve", "--addr", "127.0.0.1:0", "--rate-limit", "100000", "--rate-limit-burst", "100000"])
        .args(["--ip-rate-limit", "100000", "--ip-rate-limit-burst", "100000", "--data-dir"])
        .arg(&data)
        .env("CARET_HOME", &home)
        .env("CARET_EMBED_MODEL", config.local_model_dir())
        .env("RUST_LOG", "warn")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("server.log"))?);
    if let Some(endpoint) = otlp {
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
    }
    let (child, url) = crate::process::start_serve(&mut cmd)?;
    Ok(Served { child, url, token, data, home })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Sorts `v` and gives its quantile `q` (0.5: the median).
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(v, q)
}

fn median(v: &mut [f64]) -> f64 {
    quantile(v, 0.5)
}

/// Runs this benchmark and prints its figures.
pub fn run(config: &Config, args: TeamBench) -> anyhow::Result<ExitCode> {
    let scratch = config.home.join("bench").join(format!("team-{}", std::process::id()));
    let result = bench(config, &args, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn bench(config: &Config, args: &TeamBench, scratch: &Path) -> anyhow::Result<ExitCode> {
    let rt = runtime()?;
    let spans = Arc::new(Mutex::new(Vec::new()));
    let (up, otlp) = rt.block_on(async { anyhow::Ok((upstream().await?, sink(spans.clone()).await?)) })?;
    let plain = serve(config, &scratch.join("plain"), &up, None)?;
    let traced = serve(config, &scratch.join("traced"), &up, Some(&otlp))?;
    println!("caret bench team: upstream {up}; servers {} (no traces) and {} (spans to {otlp})", plain.url, traced.url);

    // 1. The server's own cost per chat call.
    let http = reqwest::Client::new();
    let body = serde_json::json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]});
    let direct = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let mut lat: [Vec<f64>; 3] = Default::default();
    rt.block_on(async {
        for i in 0..args.requests + 50 {
            for (k, (url, token, body)) in [
                (up.as_str(), None, &direct),
                (plain.url.as_str(), Some(plain.token.as_str()), &body),
                (traced.url.as_str(), Some(traced.token.as_str()), &body),
            ]
            .into_iter()
            .enumerate()
            {
                let mut req = http.post(format!("{url}/v1/chat/completions")).json(body);
                if let Some(t) = token {
                    req = req.bearer_auth(t);
                }
                let started = Instant::now();
                let r = req.send().await?;
                anyhow::ensure!(r.status().is_success(), "{url}: {}", r.status());
                r.bytes().await?;
                if i >= 50 {
                    lat[k].push(ms(started.elapsed()));
                }
            }
        }
        anyhow::Ok(())
    })?;
    let [mut d, mut p, mut t] = lat;
    let (d50, p50, t50) = (median(&mut d), median(&mut p), median(&mut t));
    println!("\nchat call, {} requests each, interleaved (ms)         p50     p99", args.requests);
    println!("  upstream directly                                  {d50:7.3} {:7.3}", quantile(&mut d, 0.99));
    println!("  through caret serve                                {p50:7.3} {:7.3}", quantile(&mut p, 0.99));
    println!("  through caret serve, spans exported                {t50:7.3} {:7.3}", quantile(&mut t, 0.99));
    println!("  the server's own cost (p50 difference)             {:7.3}", p50 - d50);
    // Where it goes, from the traced server's spans.
    std::thread::sleep(Duration::from_secs(6));
    let kept = spans.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let (mut outer, mut gateway, mut upstream_ms) = (Vec::new(), Vec::new(), Vec::new());
    for r in kept.iter().filter(|s| s.name == "request") {
        let child = |name: &str, parent: &[u8]| {
            kept.iter().find(|s| s.name == name && s.parent == parent && s.trace == r.trace)
        };
        let Some(g) = child("gateway.chat", &r.span) else { continue };
        let Some(m) = child("model.call", &g.span) else { continue };
        outer.push(r.ms - g.ms);
        gateway.push(g.ms - m.ms);
        upstream_ms.push(m.ms);
    }
    if outer.is_empty() {
        let names: std::collections::BTreeSet<&str> = kept.iter().map(|s| s.name.as_str()).collect();
        println!("  ({} spans received, none a whole request: {names:?})", kept.len());
    } else {
        println!("  from {} traced requests' spans (p50, ms):", outer.len());
        println!("    request minus gateway (auth, limits, flags, JSON) {:7.3}", median(&mut outer));
        println!("    gateway minus model call (admission, choice)      {:7.3}", median(&mut gateway));
        println!("    model call (upstream round trip, stream)          {:7.3}", median(&mut upstream_ms));
    }

    // 2. Tracing's CPU cost per sync and per search.
    let scanner = Arc::new(Scanner::new(config.walk_config(), config.chunker()?, Depth::Hash));
    let mut cpu = [[0.0f64; 2]; 2]; // [server][sync, search]
    let mut counts = [0usize; 2];
    for (k, s) in [&plain, &traced].into_iter().enumerate() {
        let dir = scratch.join(format!("ws{k}"));
        crate::soak::project_for(&dir, k)?;
        let ws = WorkspaceState::open(&dir, &scratch.join(format!("state{k}")), &scratch.join("keys"))?;
        let transport = HttpTransport::new(&s.url, &s.token, None)?;
        rt.block_on(SyncEngine::new(scanner.clone(), SyncOptions::default()).sync(&ws, &transport))?;
    }
    for round in 0..args.rounds {
        for (k, s) in [&plain, &traced].into_iter().enumerate() {
            let dir = scratch.join(format!("ws{k}"));
            let ws = WorkspaceState::open(&dir, &scratch.join(format!("state{k}")), &scratch.join("keys"))?;
            let transport = HttpTransport::new(&s.url, &s.token, None)?;
            let engine = SyncEngine::new(scanner.clone(), SyncOptions::default());
            let pid = s.child.0.id();
            std::fs::write(dir.join("src/m0.rs"), format!("pub fn changed_{round}() -> u64 {{ {round} }}\n"))?;
            let before = cpu_ms(pid).unwrap_or(0.0);
            rt.block_on(engine.sync(&ws, &transport))?;
            let mid = cpu_ms(pid).unwrap_or(0.0);
            for q in ["handle request", "render page", "widget props", "changed"] {
                rt.block_on(caret_client::index::search(
                    scanner.clone(),
                    &ws,
                    &transport,
                    q,
                    10,
                    SearchMode::Hybrid,
                    caret_client::index::Rerank::default(),
                ))?;
            }
            let after = cpu_ms(pid).unwrap_or(0.0);
            cpu[k][0] += mid - before;
            cpu[k][1] += after - mid;
            counts[k] += 1;
        }
    }
    let per = |k: usize, op: usize, n: usize| cpu[k][op] / n.max(1) as f64;
    let (syncs, searches) = (args.rounds, args.rounds * 4);
    println!("\nserver CPU per operation, {syncs} syncs and {searches} searches each, alternating (ms)");
    println!("                      no traces   spans exported   difference");
    for (op, name, n) in [(0, "sync  ", syncs), (1, "search", searches)] {
        let (a, b) = (per(0, op, n), per(1, op, n));
        let diff = if a > 0.0 { (b - a) / a * 100.0 } else { 0.0 };
        println!("  {name}              {a:9.2}   {b:14.2}   {diff:+9.1}%");
    }

    // 3. A kill switch, set by an operator's command: until the server answers 503.
    let exe = std::env::current_exe()?;
    let probe = serde_json::json!({"text": "a\n", "edit": "<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n"});
    let flip = |state: &str| -> anyhow::Result<Instant> {
        let mut cmd = Command::new(&exe);
        cmd.args(["admin", "flags"]);
        if state == "off" {
            cmd.args(["set", "apply", "off"]);
        } else {
            cmd.args(["clear", "apply"]);
        }
        let out = cmd.arg("--data-dir").arg(&plain.data).env("CARET_HOME", &plain.home).output()?;
        anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        Ok(Instant::now())
    };
    let set = flip("off")?;
    let honoured = rt.block_on(async {
        loop {
            let r = http.post(format!("{}/v1/apply", plain.url)).bearer_auth(&plain.token).json(&probe).send().await?;
            if r.status() == 503 {
                return anyhow::Ok(set.elapsed());
            }
            anyhow::ensure!(set.elapsed() < Duration::from_secs(30), "the switch was not honoured in 30 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })?;
    flip("on")?;
    println!(
        "\nkill switch: `caret admin flags set apply off` honoured {:.0} ms after the command returned",
        ms(honoured)
    );
    drop(traced);
    drop(plain);

    // 4. Usage telemetry: what recording an event costs a request, and what a flush writes.
    let objects = scratch.join("usage-objects");
    std::fs::create_dir_all(&objects)?;
    let usage = caret_usage::Recorder::new(
        caret_index::open_object_store(&objects.display().to_string())?,
        caret_usage::Settings::default(),
    );
    let tenants: Vec<String> = (0..8).map(|i| format!("tenant-{i}")).collect();
    let labels = ["hybrid", "lexical", "semantic"];
    let events = 1_000_000usize;
    let started = Instant::now();
    for i in 0..events {
        usage.record(&tenants[i % 8], None, "search", labels[i % 3], Some((i % 500) as f64), true);
    }
    let per_event = started.elapsed().as_secs_f64() * 1e9 / events as f64;
    let started = Instant::now();
    let files = rt.block_on(usage.flush())?;
    let flushed = started.elapsed();
    let bytes: u64 = walkdir_size(&objects);
    println!(
        "
usage telemetry: {per_event:.0} ns to record an event; a flush of {files} tenants' hour: {:.1} ms, {bytes} bytes",
        ms(flushed)
    );
    Ok(ExitCode::SUCCESS)
}

/// The bytes of every file under `dir`.
fn walkdir_size(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        total += if path.is_dir() { walkdir_size(&path) } else { entry.metadata().map_or(0, |m| m.len()) };
    }
    total
}
