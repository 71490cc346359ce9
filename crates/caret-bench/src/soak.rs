//! `caret bench soak`: many clients syncing, searching and chatting against one `caret serve`
//! on loopback for minutes; latencies per operation, errors, and the server's memory over
//! time (growth after warm-up is what a leak looks like).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caret_client::state::WorkspaceState;
use caret_client::sync::{SyncEngine, SyncOptions};
use caret_client::transport::HttpTransport;
use caret_protocol::SearchMode;
use caret_workspace::scan::{Depth, Scanner};

use crate::search::percentile;
use caret_host::config::Config;
use caret_host::runtime::runtime;

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakBench {
    /// How long.
    pub duration: Duration,
    /// Simulated clients, each with its own workspace.
    pub clients: usize,
    /// The chat model (a name under `$CARET_HOME/models` or a directory); chat is left out
    /// when it is not installed.
    pub model: String,
}

const OPS: [&str; 3] = ["sync", "search", "chat"];

/// Latencies (ms) and errors of one operation; answers telling the client to slow down (429:
/// the gateway shedding load it cannot serve in time) are counted apart from errors.
#[derive(Default)]
struct Tally {
    ms: Vec<f64>,
    errors: u64,
    throttled: u64,
    first_error: Option<String>,
}

/// Runs this benchmark and prints its figures.
pub fn run(config: &Config, args: SoakBench) -> anyhow::Result<ExitCode> {
    let scratch = config.home.join("bench").join(format!("soak-{}", std::process::id()));
    let result = bench(config, &args, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// A project of 60 small files in three languages for one client.
pub(crate) fn project_for(dir: &Path, client: usize) -> anyhow::Result<()> {
    for i in 0..60 {
        let (path, text) = match i % 3 {
            0 => (
                format!("src/m{i}.rs"),
                format!(
                    "/// Handles request {i} of client {client}.\npub fn handle_{i}(x: u64) -> u64 {{\n    x * {i}\n}}\n"
                ),
            ),
            1 => (
                format!("app/v{i}.py"),
                format!("def view_{i}(request):\n    \"\"\"Render page {i}.\"\"\"\n    return {i}\n"),
            ),
            _ => {
                (format!("web/c{i}.js"), format!("export function widget{i}(props) {{\n  return props.n + {i};\n}}\n"))
            }
        };
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap_or(dir))?;
        std::fs::write(&p, text)?;
        backdate(&p)?;
    }
    Ok(())
}

/// Files written within the last seconds are re-read on every scan (the racy-clean guard).
fn backdate(path: &Path) -> anyhow::Result<()> {
    let when = std::time::SystemTime::now() - Duration::from_secs(30);
    std::fs::File::options().write(true).open(path)?.set_modified(when)?;
    Ok(())
}

/// Resident memory of a process, in KiB.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn bench(config: &Config, args: &SoakBench, scratch: &Path) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe()?;
    let home = scratch.join("home");
    let data = scratch.join("srv");
    std::fs::create_dir_all(&home)?;
    let model = config.model_path(&args.model);
    let chat = model.exists();
    if chat {
        std::fs::write(
            home.join("config.toml"),
            format!(
                "[[models]]\nalias = \"chat\"\ndeployments = [{{ provider = \"local\", model = {:?}, context_tokens = 1024 }}]\n",
                model.display().to_string()
            ),
        )?;
    } else {
        println!("no chat model at {} (caret models pull {}): chat is left out", model.display(), args.model);
    }
    let admin = |cmd: &[&str]| crate::process::caret(&data, &home, cmd);
    // Each client is a user of its own team: its own tenant and token, as in real use (the
    // server's per-token and per-tenant limits would otherwise be what is measured).
    let mut tokens = Vec::with_capacity(args.clients);
    for c in 0..args.clients {
        let tenant = format!("soak-{c}");
        admin(&["admin", "tenant", "create", &tenant])?;
        tokens.push(admin(&["admin", "token", "create", "--tenant", &tenant])?);
    }
    let (server, url) = crate::process::start_serve(
        Command::new(&exe)
            .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .env("CARET_HOME", &home)
            .env("CARET_EMBED_MODEL", config.local_model_dir())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(scratch.join("server.log"))?),
    )?;
    let pid = server.0.id();
    println!(
        "caret bench soak: {} clients, {} s, against caret serve (pid {pid}) at {url}; chat {}",
        args.clients,
        args.duration.as_secs(),
        if chat { "on" } else { "off" }
    );

    let scanner = Arc::new(Scanner::new(config.walk_config(), config.chunker()?, Depth::Hash));
    let tallies: Arc<Mutex<[Tally; 3]>> = Arc::new(Mutex::new(Default::default()));
    let samples: Arc<Mutex<Vec<(f64, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let rt = runtime()?;
    let started = Instant::now();
    let deadline = started + args.duration;
    let in_step = rt.block_on(async {
        let sampler = {
            let samples = samples.clone();
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    if let Some(kib) = rss_kib(pid) {
                        samples.lock().unwrap_or_else(|p| p.into_inner()).push((started.elapsed().as_secs_f64(), kib));
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            })
        };
        let http = reqwest::Client::new();
        let mut tasks = Vec::new();
        for (c, token) in tokens.clone().into_iter().enumerate().take(args.clients) {
            let dir: PathBuf = scratch.join("clients").join(c.to_string());
            project_for(&dir, c)?;
            let ws = WorkspaceState::open(&dir, &scratch.join("state").join(c.to_string()), &scratch.join("keys"))?;
            let transport = HttpTransport::new(&url, &token, None)?;
            let (engine, scanner) = (SyncEngine::new(scanner.clone(), SyncOptions::default()), scanner.clone());
            let (tallies, http, url) = (tallies.clone(), http.clone(), url.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(c as u64);
                let mut round = 0u64;
                // The first sync creates the workspace on the server.
                engine.sync(&ws, &transport).await?;
                while Instant::now() < deadline {
                    round += 1;
                    let op = match rng.u8(0..10) {
                        0..=2 => 0,
                        3..=7 => 1,
                        _ if chat => 2,
                        _ => 1,
                    };
                    let t = Instant::now();
                    let result: anyhow::Result<()> = match op {
                        0 => {
                            // Edit a file or two, then sync.
                            for _ in 0..rng.usize(1..=2) {
                                let i = rng.usize(0..60) / 3 * 3;
                                let p = dir.join(format!("src/m{i}.rs"));
                                let text = format!("/// Handles request {i}, edit {round}.\npub fn handle_{i}(x: u64) -> u64 {{\n    x * {round}\n}}\n");
                                if std::fs::write(&p, text).is_ok() {
                                    let _ = backdate(&p);
                                }
                            }
                            engine.sync(&ws, &transport).await.map(|_| ()).map_err(anyhow::Error::from)
                        }
                        1 => {
                            let q = ["render page", "handles request", "widget props", "view_12", "handle_33"][rng.usize(0..5)];
                            caret_client::index::search(scanner.clone(), &ws, &transport, q, 10, SearchMode::Hybrid, Default::default())
                                .await
                                .map(|_| ())
                                .map_err(anyhow::Error::from)
                        }
                        _ => {
                            let body = serde_json::json!({
                                "model": "chat",
                                "messages": [{"role": "user", "content": format!("Say hello to client {c}.")}],
                                "max_tokens": 8,
                            });
                            match http.post(format!("{url}/v1/chat/completions")).bearer_auth(&token).json(&body).send().await {
                                Ok(r) if r.status().is_success() => r.bytes().await.map(|_| ()).map_err(anyhow::Error::from),
                                Ok(r) => Err(anyhow::anyhow!("chat: {}", r.status())),
                                Err(e) => Err(e.into()),
                            }
                        }
                    };
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    let mut all = tallies.lock().unwrap_or_else(|p| p.into_inner());
                    let tally = &mut all[op];
                    tally.ms.push(ms);
                    if let Err(e) = result {
                        let e = format!("{e:#}");
                        if e.contains("429") {
                            tally.throttled += 1;
                        } else {
                            tally.errors += 1;
                            tally.first_error.get_or_insert(e);
                        }
                    }
                }
                // One last sync: every client ends in step with the server.
                let last = engine.sync(&ws, &transport).await?;
                anyhow::Ok(last.local_root == last.server_root)
            }));
        }
        let mut in_step = true;
        for t in tasks {
            in_step &= t.await??;
        }
        let _ = sampler.await;
        anyhow::Ok(in_step)
    })?;

    let tallies = tallies.lock().unwrap_or_else(|p| p.into_inner());
    println!(
        "{:<8} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9}",
        "op", "count", "errors", "throttled", "p50 ms", "p99 ms", "max ms"
    );
    for (name, t) in OPS.iter().zip(tallies.iter()) {
        let mut ms = t.ms.clone();
        ms.sort_by(f64::total_cmp);
        println!(
            "{:<8} {:>8} {:>7} {:>10} {:>9.1} {:>9.1} {:>9.1}",
            name,
            ms.len(),
            t.errors,
            t.throttled,
            percentile(&ms, 0.5),
            percentile(&ms, 0.99),
            ms.last().copied().unwrap_or(0.0)
        );
        if let Some(e) = &t.first_error {
            println!("  first {name} error: {e}");
        }
    }
    // Memory: the mean over the 10 % after a fifth of the run (warm) against the last 10 %.
    let samples = samples.lock().unwrap_or_else(|p| p.into_inner());
    let total = args.duration.as_secs_f64();
    let mean = |from: f64, to: f64| -> Option<f64> {
        let v: Vec<f64> = samples.iter().filter(|(t, _)| *t >= from && *t <= to).map(|(_, k)| *k as f64).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    match (mean(total * 0.2, total * 0.3), mean(total * 0.9, total)) {
        (Some(warm), Some(end)) => println!(
            "server memory (RSS): {:.0} MiB after warm-up, {:.0} MiB at the end: growth {:+.1} %; peak {:.0} MiB ({} samples)",
            warm / 1024.0,
            end / 1024.0,
            (end - warm) / warm * 100.0,
            samples.iter().map(|(_, k)| *k).max().unwrap_or(0) as f64 / 1024.0,
            samples.len()
        ),
        _ => println!("server memory: too few samples for a growth figure ({})", samples.len()),
    }
    println!("every client ended in step with the server: {in_step}");
    Ok(ExitCode::SUCCESS)
}
