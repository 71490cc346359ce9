//! `caret bench search`: index a real project, then measure answer quality on a question set
//! (R@1, R@5, R@10 and MRR@10 at file level, for BM25 alone, vectors alone and the fusion) and
//! search latency, in one run; with `--sets`, every set's project fetched from its registry
//! and one table over all of them.

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
    /// The project's language, for the table.
    #[serde(default)]
    language: Option<String>,
    /// Where the project comes from (sets without one are measured on a PATH given).
    #[serde(default)]
    source: Option<crate::sources::Source>,
    questions: Vec<Question>,
}

impl QuestionSet {
    fn read(path: &Path) -> anyhow::Result<QuestionSet> {
        serde_json::from_slice(&std::fs::read(path).with_context(|| format!("reading {}", path.display()))?)
            .with_context(|| format!("parsing {}", path.display()))
    }
}

/// The rows of a set in the table: [`Figures::modes`] in order.
const MODES: [&str; 4] = ["lexical", "semantic", "hybrid", "bound"];

/// Quality of one mode on one set.
#[derive(Debug, Clone, Copy, Default)]
struct Quality {
    r1: f64,
    r5: f64,
    r10: f64,
    mrr: f64,
}

/// What one set measured: lexical, semantic and hybrid quality, hybrid latency, the index.
#[derive(Debug, Clone, Default)]
struct Figures {
    files: u64,
    chunks: u64,
    /// Lexical, semantic, hybrid, and the bound of any fusion of the first two.
    modes: [Quality; 4],
    p50_ms: f64,
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
    let set = questions.as_deref().map(QuestionSet::read).transpose()?;
    // A kept index is reused (the next run only embeds what changed); a scratch one is removed.
    let scratch = keep.is_none();
    let dir = keep.unwrap_or_else(|| config.home.join("bench").join(format!("search-{}", std::process::id())));
    let result = bench(config, path, set.as_ref(), runs.max(1), &dir, true);
    if scratch {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result.map(|_| ExitCode::SUCCESS)
}

/// Every set in `sets` (files, or folders of them) that names its source: the project
/// fetched from its registry (once, under `$CARET_HOME/bench/sources`), indexed (kept under
/// `$CARET_HOME/bench/indexes`, so a rerun only searches; `fresh` rebuilds), measured, and
/// one table printed over all of them.
pub fn run_sets(config: &Config, sets: &[PathBuf], runs: usize, fresh: bool) -> anyhow::Result<ExitCode> {
    let mut files = Vec::new();
    for p in sets {
        if p.is_dir() {
            let mut inside: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "json"))
                .collect();
            inside.sort();
            files.extend(inside);
        } else {
            files.push(p.clone());
        }
    }
    let mut rows = Vec::new();
    for file in files {
        let set = QuestionSet::read(&file)?;
        let name = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let Some(source) = &set.source else {
            println!("{name}: no source named in the set (measure it with a PATH); skipped");
            continue;
        };
        let tree =
            crate::sources::fetch(&config.home.join("bench").join("sources"), &name, source, &config.model_store())?;
        let index = config.home.join("bench").join("indexes").join(&name);
        if fresh {
            let _ = std::fs::remove_dir_all(&index);
        }
        println!("\n=== {name}");
        let figures = bench(config, &tree, Some(&set), runs.max(1), &index, false)?;
        rows.push((name, set.language.clone().unwrap_or_default(), set.questions.len(), figures));
    }
    println!(
        "\n{:<22} {:<10} {:>5} {:>6} {:>7}  {:<9} {:>5} {:>5} {:>5} {:>6}  {:>6}",
        "set", "language", "qs", "files", "chunks", "mode", "R@1", "R@5", "R@10", "MRR@10", "p50 ms"
    );
    for (name, language, questions, f) in &rows {
        for (i, mode) in MODES.iter().enumerate() {
            let q = f.modes[i];
            let (n, l, qs, fi, ch) = if i == 0 {
                (name.as_str(), language.as_str(), questions.to_string(), thousands(f.files), thousands(f.chunks))
            } else {
                ("", "", String::new(), String::new(), String::new())
            };
            let p50 = if i == 2 { format!("{:.1}", f.p50_ms) } else { String::new() };
            println!(
                "{n:<22} {l:<10} {qs:>5} {fi:>6} {ch:>7}  {mode:<9} {:>5.2} {:>5.2} {:>5.2} {:>6.3}  {p50:>6}",
                q.r1, q.r5, q.r10, q.mrr
            );
        }
    }
    if !rows.is_empty() {
        let n = rows.len() as f64;
        for (i, mode) in MODES.iter().enumerate() {
            let mean = |get: fn(&Quality) -> f64| rows.iter().map(|(_, _, _, f)| get(&f.modes[i])).sum::<f64>() / n;
            println!(
                "{:<22} {:<10} {:>5} {:>6} {:>7}  {mode:<9} {:>5.2} {:>5.2} {:>5.2} {:>6.3}",
                if i == 0 { "mean over the sets" } else { "" },
                "",
                "",
                "",
                "",
                mean(|q| q.r1),
                mean(|q| q.r5),
                mean(|q| q.r10),
                mean(|q| q.mrr)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The value at quantile `p` of ascending values (0 for none).
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Indexes `path` in `scratch` and answers `set`'s questions (printing as it goes); with
/// `processes`, also `caret search` processes through the daemon.
fn bench(
    config: &Config,
    path: &Path,
    set: Option<&QuestionSet>,
    runs: usize,
    scratch: &Path,
    processes: bool,
) -> anyhow::Result<Figures> {
    let mut figures = Figures::default();
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
        figures.files = files;
        figures.chunks = embed.progress.stages.iter().map(|(total, _)| *total).sum::<u64>();
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
        println!("{:<10} {:>6} {:>6} {:>6} {:>8} {:>8}", "mode", "R@1", "R@5", "R@10", "MRR@10", "not 1st");
        let mut latencies = Vec::new();
        // Each question's files in the lexical and the vector ranking, for the fusion's bound.
        let mut lists: [Vec<Vec<String>>; 2] = [Vec::new(), Vec::new()];
        let modes = [("lexical", SearchMode::Lexical), ("semantic", SearchMode::Semantic), ("hybrid", SearchMode::Hybrid)];
        for (i, (name, mode)) in modes.into_iter().enumerate() {
            let (mut hits1, mut hits5, mut hits10, mut rr, mut misses) = (0usize, 0usize, 0usize, 0.0f64, Vec::new());
            for q in &set.questions {
                let t = Instant::now();
                let outcome = search(scanner.clone(), &ws, &transport, &q.q, 30, mode, rerank).await?;
                if mode == SearchMode::Hybrid {
                    latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                let paths: Vec<String> = outcome.hits.iter().map(|h| h.path.clone()).collect();
                if let Some(list) = lists.get_mut(i) {
                    let mut seen = HashSet::new();
                    list.push(paths.iter().filter(|p| seen.insert(p.as_str())).cloned().collect());
                }
                let rank = answer_rank(&paths, &q.answers);
                hits1 += usize::from(rank == Some(1));
                if rank.is_some_and(|r| r <= 5) {
                    hits5 += 1;
                }
                hits10 += usize::from(rank.is_some());
                if rank != Some(1) {
                    let mut seen = HashSet::new();
                    let top: Vec<&str> = paths.iter().filter(|p| seen.insert(p.as_str())).take(3).map(String::as_str).collect();
                    misses.push(format!("  {name} miss (rank {rank:?}): {:?} → {:?}", q.q, top));
                }
                rr += rank.map_or(0.0, |r| 1.0 / r as f64);
            }
            let n = set.questions.len().max(1) as f64;
            let q = Quality { r1: hits1 as f64 / n, r5: hits5 as f64 / n, r10: hits10 as f64 / n, mrr: rr / n };
            figures.modes[i] = q;
            println!("{name:<10} {:>6.3} {:>6.3} {:>6.3} {:>8.3} {:>8}", q.r1, q.r5, q.r10, q.mrr, misses.len());
            if mode == SearchMode::Hybrid {
                for m in misses {
                    println!("{m}");
                }
            }
        }
        let bound = fusion_bound(set, &lists[0], &lists[1]);
        figures.modes[3] = bound;
        println!(
            "{:<10} {:>6.3} {:>6.3} {:>6.3} {:>8.3}   (the best any fusion of the two rankings reaches)",
            "bound", bound.r1, bound.r5, bound.r10, bound.mrr
        );
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
        figures.p50_ms = percentile(&latencies, 0.5);
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
        if processes { cli_latency(&home, &ws.root, set, runs) } else { Ok(()) }
    })?;
    Ok(figures)
}

/// How far any fusion of the lexical and the vector ranking could go: a file can be fused
/// above another only if it beats it in at least one of them, so an answer that N files beat
/// in both stays at rank N + 1 or below whatever the weights (a file missing from a ranking
/// counts as below every file in it). Per question, the best answer's count; the figures
/// assume the best weights for each question separately.
fn fusion_bound(set: &QuestionSet, lexical: &[Vec<String>], semantic: &[Vec<String>]) -> Quality {
    let (mut r1, mut r5, mut r10, mut rr) = (0usize, 0usize, 0usize, 0.0f64);
    for ((q, lex), sem) in set.questions.iter().zip(lexical).zip(semantic) {
        let rank_in = |list: &[String], file: &str| list.iter().position(|p| p == file).unwrap_or(usize::MAX);
        let beaten_by = |answer: &str| {
            let (la, sa) = (rank_in(lex, answer), rank_in(sem, answer));
            if la == usize::MAX && sa == usize::MAX {
                return usize::MAX;
            }
            let mut others: HashSet<&str> = lex.iter().chain(sem).map(String::as_str).collect();
            others.retain(|f| !q.answers.iter().any(|a| a == f));
            others.into_iter().filter(|f| rank_in(lex, f) < la && rank_in(sem, f) < sa).count()
        };
        let best = q.answers.iter().map(|a| beaten_by(a)).min().unwrap_or(usize::MAX);
        if best == usize::MAX {
            continue;
        }
        let rank = best + 1;
        r1 += usize::from(rank == 1);
        r5 += usize::from(rank <= 5);
        r10 += usize::from(rank <= 10);
        if rank <= 10 {
            rr += 1.0 / rank as f64;
        }
    }
    let n = set.questions.len().max(1) as f64;
    Quality { r1: r1 as f64 / n, r5: r5 as f64 / n, r10: r10 as f64 / n, mrr: rr / n }
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
