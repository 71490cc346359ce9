//! `caret bench search`: index a real project, then measure answer quality on a question set
//! (R@5 and MRR@10 at file level, for BM25 alone, vectors alone and the fusion) and search
//! latency, in one run.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use caret_client::index::{embed_missing, search};
use caret_client::state::WorkspaceState;
use caret_client::sync::{SyncEngine, SyncOptions};
use caret_client::transport::InProcessTransport;
use caret_protocol::SearchMode;
use caret_workspace::scan::{Depth, Scanner};
use serde::Deserialize;

use caret_host::config::Config;
use caret_host::runtime::runtime;
use caret_host::units::thousands;

/// A question set: questions and the files that answer them (paths relative to the tree).
#[derive(Debug, Deserialize)]
struct QuestionSet {
    project: String,
    questions: Vec<Question>,
}

#[derive(Debug, Deserialize)]
struct Question {
    q: String,
    answers: Vec<String>,
}

/// File-level rank (1-based) of the first answer among the distinct files of `paths`, within
/// the first 10.
fn answer_rank(paths: &[String], answers: &[String]) -> Option<usize> {
    let mut seen = HashSet::new();
    paths.iter().filter(|p| seen.insert(p.as_str())).take(10).position(|p| answers.contains(p)).map(|i| i + 1)
}

/// Runs this benchmark and prints its figures.
pub fn run(
    config: &Config,
    path: &Path,
    questions: Option<PathBuf>,
    runs: usize,
    keep: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    if let Some(dir) = keep {
        // A kept index is reused: the next run only embeds what changed.
        return bench(config, path, questions.as_deref(), runs.max(1), &dir);
    }
    let scratch = config.home.join("bench").join(format!("search-{}", std::process::id()));
    let result = bench(config, path, questions.as_deref(), runs.max(1), &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// The value at quantile `p` of ascending values (0 for none).
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn bench(
    config: &Config,
    path: &Path,
    questions: Option<&Path>,
    runs: usize,
    scratch: &Path,
) -> anyhow::Result<ExitCode> {
    let set: Option<QuestionSet> = match questions {
        Some(q) => Some(
            serde_json::from_slice(&std::fs::read(q).with_context(|| format!("reading {}", q.display()))?)
                .with_context(|| format!("parsing {}", q.display()))?,
        ),
        None => None,
    };
    // The scratch directory is laid out as a Caret home (embedded server in `local/`, keys,
    // client state) so that `caret search` processes can be timed on the same index.
    let mut home = config.clone();
    home.home = scratch.to_path_buf();
    home.embed.model = config.local_model_dir().to_string_lossy().into_owned();
    let model_id =
        config.embedding_model()?.context("no embedding model installed: run `caret models pull`")?.id().to_owned();
    let scanner = Arc::new(Scanner::new(config.walk_config(), config.chunker()?, Depth::Hash));
    let engine = SyncEngine::new(scanner.clone(), SyncOptions::default());
    let root = std::fs::canonicalize(path).with_context(|| format!("opening {}", path.display()))?;
    let ws = WorkspaceState::open(&root, &home.workspace_state_dir(&root), &scratch.join("keys"))?;
    println!("caret bench search {} (model {model_id})", ws.root.display());
    runtime()?.block_on(async {
        let (service, tenant) = caret_host::remote::embedded_service(&home).await?;
        let transport = InProcessTransport::new(service.clone(), tenant, "embedded");

        let started = Instant::now();
        let sync = engine.sync(&ws, &transport).await?;
        let sync_secs = started.elapsed().as_secs_f64();
        // When each stage (code, tests, the rest) had all its vectors.
        let mut stage_secs: [Option<f64>; 3] = [None; 3];
        let embed = embed_missing(scanner.clone(), &ws, &transport, |p| {
            for (i, (total, with)) in p.stages.iter().enumerate() {
                if with >= total && stage_secs[i].is_none() {
                    stage_secs[i] = Some(started.elapsed().as_secs_f64());
                }
            }
        })
        .await?;
        let total_secs = started.elapsed().as_secs_f64();
        let files = sync.added + sync.modified + sync.unchanged;
        println!(
            "index: {} files, {} chunks sent; sync (lexical ready) {:.1} s; embedding {} chunks {:.1} s ({:.1} chunks/s); total {:.1} s",
            thousands(files),
            thousands(sync.chunks_sent),
            sync_secs,
            thousands(embed.progress.embedded),
            embed.seconds,
            embed.progress.embedded as f64 / embed.seconds.max(1e-9),
            total_secs
        );
        let stages: Vec<String> = caret_store::STAGES
            .iter()
            .zip(stage_secs)
            .zip(embed.progress.stages)
            .map(|((name, secs), (total, _))| {
                format!("{name} ({} chunks) {}", thousands(total), secs.map_or("—".to_owned(), |s| format!("{s:.1} s")))
            })
            .collect();
        println!("  embedded by stage (from the start of the sync): {}", stages.join("; "));

        let Some(set) = set else { return anyhow::Ok(()) };
        let rerank = config.search_rerank()?;
        println!("questions: {} on {}", set.questions.len(), set.project);
        println!("{:<10} {:>6} {:>6} {:>8} {:>8}", "mode", "R@1", "R@5", "MRR@10", "not 1st");
        let mut latencies = Vec::new();
        for (name, mode) in [("lexical", SearchMode::Lexical), ("semantic", SearchMode::Semantic), ("hybrid", SearchMode::Hybrid)] {
            let (mut hits1, mut hits5, mut rr, mut misses) = (0usize, 0usize, 0.0f64, Vec::new());
            for q in &set.questions {
                let t = Instant::now();
                let outcome = search(scanner.clone(), &ws, &transport, &q.q, 30, mode, rerank).await?;
                if mode == SearchMode::Hybrid {
                    latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                let paths: Vec<String> = outcome.hits.iter().map(|h| h.path.clone()).collect();
                let rank = answer_rank(&paths, &q.answers);
                hits1 += usize::from(rank == Some(1));
                if rank.is_some_and(|r| r <= 5) {
                    hits5 += 1;
                }
                if rank != Some(1) {
                    let mut seen = HashSet::new();
                    let top: Vec<&str> = paths.iter().filter(|p| seen.insert(p.as_str())).take(3).map(String::as_str).collect();
                    misses.push(format!("  {name} miss (rank {rank:?}): {:?} → {:?}", q.q, top));
                }
                rr += rank.map_or(0.0, |r| 1.0 / r as f64);
            }
            let n = set.questions.len().max(1) as f64;
            println!("{name:<10} {:>6.3} {:>6.3} {:>8.3} {:>8}", hits1 as f64 / n, hits5 as f64 / n, rr / n, misses.len());
            if mode == SearchMode::Hybrid {
                for m in misses {
                    println!("{m}");
                }
            }
        }
        let mut server = Vec::new();
        let key = ws.key.server_key();
        for _ in 1..runs {
            for q in &set.questions {
                let t = Instant::now();
                search(scanner.clone(), &ws, &transport, &q.q, 10, SearchMode::Hybrid, rerank).await?;
                latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                // The server's part alone (query embedding, BM25, vectors, fusion).
                let req = caret_protocol::SearchRequest { query: q.q.clone(), k: 30, mode: SearchMode::Hybrid };
                let t = Instant::now();
                caret_client::transport::Transport::search(&transport, &ws.id, &key, &req).await?;
                server.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
        server.sort_by(f64::total_cmp);
        latencies.sort_by(f64::total_cmp);
        println!(
            "search latency (hybrid, query embedding + server search + client check, {} queries): p50 {:.1} ms, p99 {:.1} ms",
            latencies.len(),
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99)
        );
        if !server.is_empty() {
            println!(
                "  of which the server (query embedding + BM25 + vectors + fusion): p50 {:.1} ms, p99 {:.1} ms",
                percentile(&server, 0.5),
                percentile(&server, 0.99)
            );
        }
        cli_latency(&home, &ws.root, &set, runs)
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `caret search` processes end to end on the bench's index: the first starts the local
/// daemon; the rest are timed through it; a few run with the daemon off, for comparison.
fn cli_latency(home: &Config, root: &Path, set: &QuestionSet, runs: usize) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding the caret binary")?;
    let search = |query: &str, daemon: bool| -> anyhow::Result<f64> {
        let mut cmd = std::process::Command::new(&exe);
        if let Some(file) = &home.file {
            cmd.arg("--config").arg(file);
        }
        cmd.args(["search", "-k", "10", "--json", "-C"])
            .arg(root)
            .arg(query)
            .env("CARET_HOME", &home.home)
            .env("CARET_EMBED_MODEL", &home.embed.model)
            .env("CARET_DAEMON", if daemon { "on" } else { "off" })
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let t = Instant::now();
        let out = cmd.output().context("running caret search")?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        anyhow::ensure!(out.status.success(), "caret search {query:?}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(ms)
    };
    let Some(first) = set.questions.first() else { return Ok(()) };
    let start = search(&first.q, true)?;
    let mut warm = Vec::new();
    for _ in 0..runs {
        for q in &set.questions {
            warm.push(search(&q.q, true)?);
        }
    }
    // The daemon goes when its announcement does.
    let _ = std::fs::remove_file(home.home.join("local").join("daemon.json"));
    let mut cold = Vec::new();
    for q in set.questions.iter().take(5) {
        cold.push(search(&q.q, false)?);
    }
    warm.sort_by(f64::total_cmp);
    cold.sort_by(f64::total_cmp);
    println!(
        "caret search (a process each, end to end, {} queries): through the warm daemon p50 {:.0} ms, p99 {:.0} ms; \
         the first (starting the daemon) {start:.0} ms; in-process without it p50 {:.0} ms ({} queries)",
        warm.len(),
        percentile(&warm, 0.5),
        percentile(&warm, 0.99),
        percentile(&cold, 0.5),
        cold.len()
    );
    Ok(())
}
