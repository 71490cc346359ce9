//! `caret bench …`: measurements that print figures — throughput, p50/p99 latency, peak
//! memory — with a baseline in the same run where there is one (`docs/benchmarks.md` lists
//! them all). They never assert a timing and are never run by the tests; their data
//! (`src/data/`) is embedded. Each bench is a module: [`capacity`], [`docs`], [`llm`], [`mcp`], [`merge`], [`search`],
//! [`soak`], [`sync`], [`tab`], [`team`]; `scan`, `embed` and `vectors` live here.

pub mod capacity;
mod commands;
pub mod docs;
pub mod llm;
pub mod mcp;
pub mod merge;
pub mod next_edit;
mod process;
pub mod search;
pub mod soak;
pub mod sources;
pub mod sync;
pub mod tab;
mod tab_session;
pub mod team;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use caret_workspace::scan::{Depth, ScanReport, Scanner};
use caret_workspace::statcache::StatCache;

use caret_host::config::Config;
use caret_host::units::{human_bytes, thousands};

/// A duration such as `10m` or `90s`.
fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    caret_host::config::parse_duration(s).map_err(|e| e.to_string())
}

/// `--key-cache f16|q8_0`.
fn key_cache(name: &str) -> Result<caret_llama::KeyCache, String> {
    caret_llama::KeyCache::from_name(name).ok_or_else(|| format!("f16 or q8_0, not {name:?}"))
}

#[derive(Debug, clap::Subcommand)]
/// `caret bench`'s subcommands.
pub enum BenchCommand {
    /// Cold and warm scans of a tree, raw hashing speed, and `git status` on the same tree.
    Scan {
        /// The tree to scan (a large real one, e.g. ~/.cargo/registry/src).
        path: PathBuf,
        /// Repetitions of each warm measurement (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Leave out the `caret sync` rows (they first sync the whole tree into a scratch
        /// embedded server).
        #[arg(long)]
        no_sync: bool,
    },
    /// Embedding throughput of the local model on real chunks of PATH: batched with length
    /// bucketing vs a naive one-at-a-time loop.
    Embed {
        /// A tree to take chunks from.
        path: PathBuf,
        /// Chunks to embed.
        #[arg(long, default_value_t = 1000)]
        chunks: usize,
        /// Threads for the model.
        #[arg(long)]
        threads: Option<usize>,
        /// Write the texts and their vectors as JSON here, for scripts/embed-reference.py.
        #[arg(long)]
        dump: Option<PathBuf>,
        /// The model: a name under `$CARET_HOME/models` or a directory (default: `[embed] model`).
        #[arg(long)]
        model: Option<String>,
    },
    /// A local GGUF model in-process: prompt reading and generation tokens/s, time to first
    /// token cold and with the prompt's prefix reused; with --llama-bench, llama.cpp's own
    /// figures for the same file next to them.
    Llm {
        /// The model: a name under `$CARET_HOME/models`, a directory or a `.gguf` file.
        #[arg(long, default_value = "qwen2.5-coder-1.5b-instruct-q4")]
        model: String,
        /// Prompt length in tokens.
        #[arg(long, default_value_t = 512)]
        prompt_tokens: usize,
        /// Tokens to generate.
        #[arg(long, default_value_t = 128)]
        tokens: u32,
        /// Runs (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// llama.cpp threads (default: the cores this process may use).
        #[arg(long)]
        threads: Option<usize>,
        /// A `llama-bench` binary built from llama.cpp, to run on the same file.
        #[arg(long)]
        llama_bench: Option<PathBuf>,
    },
    /// Tab completion: a typing session replayed against a local model (latency per
    /// keystroke, cache share, prefilled tokens with KV reuse, acceptance proxies).
    Tab {
        /// The model: a name under `$CARET_HOME/models`, a directory or a `.gguf` file.
        #[arg(long, default_value = "qwen2.5-coder-1.5b-instruct-q4")]
        model: String,
        /// The file (default: a built-in 61-line Python module).
        #[arg(long)]
        file: Option<PathBuf>,
        /// Lines typed back, 1-based and inclusive: `FIRST-LAST`.
        #[arg(long)]
        lines: Option<String>,
        /// Threads for llama.cpp (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Context budget in tokens.
        #[arg(long, default_value_t = 1536)]
        budget: usize,
        /// Share of the budget for the suffix beyond the cursor's line (default: the engine's).
        #[arg(long)]
        suffix_share: Option<f32>,
        /// A custom fill-in-the-middle prompt with `{prefix}`, `{suffix}` (and `{context}`)
        /// instead of the model family's (e.g. suffix first).
        #[arg(long)]
        template: Option<String>,
        /// Instead of the typing replay, the first suggestion in a cold file: the file is
        /// opened with the cursor on a line, the user pauses this many seconds and types the
        /// line's first character; each of 5 lines is tried with the warm-up of an editor that
        /// sends its cursor (`caret/focus`), with that of a plain LSP client (warmed for the
        /// file's end), and without one.
        #[arg(long, value_name = "PAUSE_SECONDS")]
        cold: Option<f64>,
        /// With --cold: a plain LSP client's session instead (no `caret/focus`, as Neovim or
        /// Helix): the 16 source files of this folder of 20–150 lines (first by path) opened
        /// one after another and kept open, each asked at its middle line PAUSE after opening.
        #[arg(long, value_name = "DIR", requires = "cold")]
        session: Option<PathBuf>,
        /// A next-edit request after each keystroke, as an editor's pause asks for one (a
        /// keystroke aborts the one in flight, as `caret lsp` does): `none` (Tab alone),
        /// `default` (the gate as configured by default for a model on this CPU: the ranker
        /// answers, the model is never asked), `model` (the model asked every time).
        #[arg(long, value_enum, default_value = "none")]
        next_edits: crate::tab::NextEdits,
    },
    /// Model merge of a lazy edit into a ~300-line file with the same local model, plain
    /// decoding vs speculative edits (the file as the draft): tokens/s, speed-up, draft
    /// acceptance, and whether the answers are identical.
    Merge {
        /// The model: a name under `$CARET_HOME/models`, a directory or a `.gguf` file.
        #[arg(long, default_value = "qwen2.5-coder-1.5b-instruct-q4")]
        model: String,
        /// The file (default: a built-in 311-line Rust module).
        #[arg(long, requires = "edit")]
        file: Option<PathBuf>,
        /// A lazy edit of --file.
        #[arg(long)]
        edit: Option<PathBuf>,
        /// The file the edit should give (default: what the matcher makes of it).
        #[arg(long, requires = "file")]
        expected: Option<PathBuf>,
        /// llama.cpp threads (default: the cores this process may use).
        #[arg(long)]
        threads: Option<usize>,
        /// Weights kept in their file layout, so batches and single tokens use the same
        /// kernels (run with `GGML_CPU_TILED_MM=0` too): identical answers, slower batches.
        #[arg(long)]
        exact: bool,
        /// llama.cpp's flash attention: true/on or false/off (default: a local deployment's, off).
        #[arg(long, value_parser = clap::builder::BoolishValueParser::new())]
        flash_attention: Option<bool>,
        /// The attention keys' cache type, f16 or q8_0 (default: a local deployment's, q8_0).
        #[arg(long, value_parser = key_cache)]
        key_cache: Option<caret_llama::KeyCache>,
    },
    /// Vector search on synthetic embeddings: exact scan vs the ANN index, with recall@10.
    Vectors {
        /// Vectors in the namespace.
        #[arg(long, default_value_t = 100_000)]
        n: usize,
        /// Dimension.
        #[arg(long, default_value_t = 384)]
        dim: usize,
        /// Queries timed.
        #[arg(long, default_value_t = 200)]
        queries: usize,
        /// HNSW candidates per search (recall against latency).
        #[arg(long, default_value_t = 96)]
        ef: usize,
    },
    /// Bytes on the wire and time for first sync and its embedding, no-change sync, one changed
    /// file and its embedding, and a 1,000-file change, against a `caret serve` on loopback
    /// (over a copy of the tree), and the first index's bytes against the source's.
    Sync {
        /// The tree to copy and sync.
        path: PathBuf,
        /// Files changed in the large-change step.
        #[arg(long, default_value_t = 1000)]
        changes: usize,
        /// Skip the embedding after the first sync and after the one-file change (its bytes
        /// are part of what a first index costs; its time is the model's).
        #[arg(long)]
        no_embed: bool,
    },
    /// Many clients syncing, searching and chatting against one `caret serve` on loopback:
    /// p50/p99 per operation, errors, and the server's memory growth after warm-up.
    Soak {
        /// How long (e.g. 10m, 90s).
        #[arg(long, default_value = "10m", value_parser = parse_duration_arg)]
        duration: Duration,
        /// Simulated clients.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// The chat model (a name under `$CARET_HOME/models` or a directory).
        #[arg(long, default_value = "smollm2-135m-instruct-q4")]
        model: String,
    },
    /// What one replica carries: simulated developers, each with a workspace copied from real
    /// trees, doing an hour's syncs, searches, Tab and chat calls and queued runs against
    /// `caret serve` (models: a double with a fixed latency), ramped until an objective breaks;
    /// server CPU per developer-hour by operation, memory and bucket and database bytes per
    /// workspace, for each workspace size.
    Capacity {
        /// Real trees the workspaces are copied from (their files in order).
        #[arg(required = true)]
        trees: Vec<PathBuf>,
        /// Workspace sizes in files (the first is ramped).
        #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
        sizes: Vec<usize>,
        /// Active developers at each step of the ramp.
        #[arg(long, value_delimiter = ',', default_value = "50,100,200,400,800,1200,1600,2000,2400,3200,4000")]
        ramp: Vec<usize>,
        /// Distinct workspaces at the first size (developers beyond share them).
        #[arg(long, default_value_t = 64)]
        workspaces: usize,
        /// Length of a ramp step (e.g. 30s).
        #[arg(long, default_value = "30s", value_parser = parse_duration_arg)]
        step: Duration,
        /// The model double's latency per call, in ms.
        #[arg(long, default_value_t = 30)]
        latency_ms: u64,
        /// PostgreSQL for the server (default: the embedded SQLite).
        #[arg(long)]
        database_url: Option<String>,
        /// The server's bucket, e.g. s3://caret-bench (default: a local directory).
        #[arg(long)]
        object_store: Option<String>,
        /// The operations of a developer's hour the ramp makes (sync, search, tab, chat, run;
        /// default: all), to tell which one another's figure depends on.
        #[arg(long, value_delimiter = ',')]
        ops: Vec<String>,
    },
    /// What running Caret for a team costs: the server's own cost per chat call (direct vs
    /// through `caret serve`, and where it goes by the server's spans), tracing's CPU cost per
    /// sync and search (two servers side by side), and a kill switch's time to take effect.
    Team {
        /// Chat calls per path.
        #[arg(long, default_value_t = 500)]
        requests: usize,
        /// Rounds of one sync and four searches per server.
        #[arg(long, default_value_t = 100)]
        rounds: usize,
    },
    /// @Docs over a real docs site served from loopback: a crawl of N pages to lexical search,
    /// embedding throughput, a refresh of the unchanged site, search latency through the warm
    /// daemon, and quality on the kept question set (page-level R@1, R@5, MRR@10).
    Docs {
        /// The site (default: SQLite's documentation, Debian's sqlite3-doc).
        #[arg(long, default_value = "/usr/share/doc/sqlite3")]
        site: PathBuf,
        /// Pages of the timed crawl.
        #[arg(long, default_value_t = 500)]
        pages: usize,
        /// Requests a second the crawls may make (`caret docs add`'s default: 20).
        #[arg(long, default_value_t = 20.0)]
        rate: f64,
        /// Searches for the latency figures.
        #[arg(long, default_value_t = 100)]
        searches: usize,
        /// A question set for the site (JSON lines of `{"q", "pages"}`, pages relative to the
        /// site's root, e.g. eval/docs/celery-5.2.6.jsonl); default: SQLite's, kept in the binary.
        #[arg(long)]
        questions: Option<PathBuf>,
    },
    /// Next-edit prediction on real history (registry packages' releases in Python, TypeScript,
    /// Rust and Go; this repository's commits), each language apart: how often the predicted
    /// edit is in place and exact, for the naive baseline, the rules, the ranker, and a model.
    NextEdit {
        /// The model alias (default: `next-edit`, `tab`, the installed default, else the first).
        #[arg(long)]
        model: Option<String>,
        /// Cases of each set asked of the model too (slow on a CPU; 0: none).
        #[arg(long, default_value_t = 0)]
        model_cases: usize,
    },
    /// MCP servers over stdio (`mcp-server-time` from PyPI): start and tool listing, a tool
    /// call's round trip, and what taking the tools costs a session while servers start.
    Mcp {
        /// A Python with `mcp-server-time` installed.
        #[arg(long, default_value = "python3")]
        python: String,
        /// Tool calls to time.
        #[arg(long, default_value_t = 300)]
        calls: usize,
    },
    /// Index a real project with the embedded server and model (time to lexical-ready and to
    /// fully embedded), then answer a question set: R@5 and MRR@10 for BM25, vectors and the
    /// fusion, and hybrid search latency p50/p99.
    Search {
        /// The project to index (it is only read); not with --sets.
        #[arg(required_unless_present = "sets")]
        path: Option<PathBuf>,
        /// A question set (e.g. eval/search/pytest-8.3.4.json).
        #[arg(long)]
        questions: Option<PathBuf>,
        /// Question sets (files, or folders of them, e.g. eval/search) whose projects are
        /// fetched from their registries, indexed, measured and shown in one table.
        #[arg(long, value_delimiter = ',', conflicts_with_all = ["path", "questions", "keep"])]
        sets: Vec<PathBuf>,
        /// With --sets: rebuild the kept indexes.
        #[arg(long, requires = "sets")]
        fresh: bool,
        /// Extra passes over the questions for the latency figures.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Keep the index in DIR (and reuse it on the next run) instead of a scratch directory.
        #[arg(long)]
        keep: Option<PathBuf>,
        /// Chunks of the project for the embedding throughput comparison (0: skip it).
        #[arg(long, default_value_t = 300)]
        embed_chunks: usize,
        /// Sizes of synthetic namespaces for ANN vs exact search (e.g. 100000,1000000; 0: skip).
        #[arg(long, value_delimiter = ',', default_value = "100000")]
        synthetic: Vec<usize>,
    },
}

/// Runs the benchmark asked for and prints its figures.
pub fn run(config: &Config, cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Scan { path, runs, no_sync } => bench_scan(config, &path, runs.max(1), !no_sync),
        BenchCommand::Sync { path, changes, no_embed } => crate::sync::run(config, &path, changes, !no_embed),
        BenchCommand::Soak { duration, clients, model } => {
            crate::soak::run(config, crate::soak::SoakBench { duration, clients: clients.max(1), model })
        }
        BenchCommand::Docs { site, pages, rate, searches, questions } => {
            crate::docs::run(config, crate::docs::DocsBench { site, pages, rate, searches, questions })
        }
        BenchCommand::NextEdit { model, model_cases } => {
            crate::next_edit::run(config, crate::next_edit::NextEditBench { model, model_cases })
        }
        BenchCommand::Mcp { python, calls } => crate::mcp::run(crate::mcp::McpBench { python, calls }),
        BenchCommand::Capacity {
            trees,
            sizes,
            ramp,
            workspaces,
            step,
            latency_ms,
            database_url,
            object_store,
            ops,
        } => crate::capacity::run(
            config,
            crate::capacity::CapacityBench {
                trees,
                sizes: sizes.into_iter().filter(|n| *n > 0).collect(),
                ramp: ramp.into_iter().filter(|n| *n > 0).collect(),
                workspaces,
                step,
                latency: Duration::from_millis(latency_ms),
                database_url,
                object_store,
                ops,
            },
        ),
        BenchCommand::Team { requests, rounds } => {
            crate::team::run(config, crate::team::TeamBench { requests: requests.max(1), rounds: rounds.max(1) })
        }
        BenchCommand::Search { path, questions, sets, fresh, runs, keep, embed_chunks, synthetic } => {
            let Some(path) = path else { return crate::search::run_sets(config, &sets, runs, fresh) };
            // Everything the search capability is measured by, printed in one run.
            if embed_chunks > 0 {
                bench_embed(config, &path, embed_chunks, None, None)?;
            }
            let code = crate::search::run(config, &path, questions, runs, keep)?;
            for n in synthetic.into_iter().filter(|n| *n > 0) {
                bench_vectors(n, 384, 200, 96)?;
            }
            Ok(code)
        }
        BenchCommand::Embed { path, chunks, threads, dump, model } => {
            let mut config = config.clone();
            if let Some(m) = model {
                config.embed.model = m;
            }
            bench_embed(&config, &path, chunks, threads, dump.as_deref())
        }
        BenchCommand::Tab {
            model,
            file,
            lines,
            threads,
            budget,
            suffix_share,
            template,
            cold,
            session,
            next_edits,
        } => {
            let lines = match lines {
                Some(l) => {
                    let (a, b) = l.split_once('-').with_context(|| format!("--lines FIRST-LAST, not {l:?}"))?;
                    Some((a.trim().parse()?, b.trim().parse()?))
                }
                None => None,
            };
            anyhow::ensure!(
                file.is_none() || lines.is_some() || cold.is_some(),
                "--file needs --lines (the lines typed back), or --cold"
            );
            let cold = cold.map(std::time::Duration::from_secs_f64);
            let bench = crate::tab::TabBench {
                model,
                file,
                lines,
                threads,
                budget,
                suffix_share,
                template,
                cold,
                session,
                next_edits,
            };
            crate::tab::run(config, bench)
        }
        BenchCommand::Merge { model, file, edit, expected, threads, exact, flash_attention, key_cache } => {
            let bench =
                crate::merge::MergeBench { model, file, edit, expected, threads, exact, flash_attention, key_cache };
            crate::merge::run(config, bench)
        }
        BenchCommand::Vectors { n, dim, queries, ef } => bench_vectors(n, dim, queries, ef),
        BenchCommand::Llm { model, prompt_tokens, tokens, runs, threads, llama_bench } => {
            crate::llm::run(config, crate::llm::LlmBench { model, prompt_tokens, tokens, runs, threads, llama_bench })
        }
    }
}

/// Peak resident memory since the last reset, in bytes (Linux).
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resets the peak resident memory counter to the current size (Linux 4.0+).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    percentile(&v, 0.5)
}

struct Row {
    name: String,
    time: Duration,
    files: usize,
    bytes: u64,
    peak: Option<u64>,
    note: String,
}

fn print_rows(rows: &[Row]) {
    println!(
        "{:<30} {:>10} {:>12} {:>12} {:>11} {:>10}  note",
        "measurement", "time", "files/s", "MB/s", "files", "peak RSS"
    );
    for r in rows {
        let secs = r.time.as_secs_f64().max(1e-9);
        let fps = if r.files > 0 { thousands((r.files as f64 / secs) as u64) } else { "-".to_owned() };
        let mbs = if r.bytes > 0 { format!("{:.1}", r.bytes as f64 / secs / 1e6) } else { "-".to_owned() };
        println!(
            "{:<30} {:>8.1}ms {:>12} {:>12} {:>11} {:>10}  {}",
            r.name,
            secs * 1000.0,
            fps,
            mbs,
            thousands(r.files as u64),
            r.peak.map(human_bytes).unwrap_or_else(|| "-".to_owned()),
            r.note
        );
    }
}

fn bench_scan(config: &Config, path: &Path, runs: usize, sync: bool) -> anyhow::Result<ExitCode> {
    let root = std::fs::canonicalize(path).with_context(|| format!("opening {}", path.display()))?;
    let full = Scanner::new(config.walk_config(), config.chunker()?, Depth::Full);
    let hash_only = Scanner::new(config.walk_config(), config.chunker()?, Depth::Hash);
    println!("caret bench scan {}", root.display());
    println!(
        "threads: {}; chunker: {:?}; page cache warmed by a first pass; 'cold' = empty stat cache",
        rayon::current_num_threads(),
        full.chunker()
    );
    let mut rows = Vec::new();
    let measure = |name: &str, scanner: &Scanner, cache: &mut StatCache| -> anyhow::Result<(Row, ScanReport)> {
        reset_peak_rss();
        let t = Instant::now();
        let report = scanner.scan(&root, cache)?;
        let time = t.elapsed();
        let row = Row {
            name: name.to_owned(),
            time,
            files: report.files.len() + report.skipped.len(),
            bytes: report.stats.bytes_read,
            peak: peak_rss(),
            note: format!(
                "{} read, {} cached",
                thousands(report.stats.files_read as u64),
                thousands(report.stats.cache_hits as u64)
            ),
        };
        Ok((row, report))
    };

    // Warm the page cache so "cold" measures our work, not the disk.
    hash_only.scan(&root, &mut StatCache::default())?;

    let (row, _) = measure("cold scan, hash only", &hash_only, &mut StatCache::default())?;
    rows.push(row);
    let mut cache = StatCache::default();
    let (row, report) = measure("cold scan, hash+chunk+secrets", &full, &mut cache)?;
    rows.push(row);

    // Warm: what `caret scan` does with nothing changed: load the stat cache from disk
    // (overlapping the walk), stat every file, rebuild the tree.
    let state = tempfile_dir(config)?;
    let cache_path = state.join("scan-cache.bin");
    cache.save(&cache_path)?;
    let mut warm_times = Vec::new();
    let mut warm_peak = None;
    let mut warm_note = String::new();
    for _ in 0..runs {
        reset_peak_rss();
        let t = Instant::now();
        let (r, _) = full.scan_loading(&root, || StatCache::load(&cache_path))?;
        warm_times.push(t.elapsed());
        warm_peak = peak_rss().max(warm_peak);
        warm_note = format!(
            "median of {runs}; cache loaded from disk; {} read, {} cached",
            thousands(r.stats.files_read as u64),
            thousands(r.stats.cache_hits as u64)
        );
    }
    rows.push(Row {
        name: "warm scan (no change)".to_owned(),
        time: median(warm_times),
        files: report.files.len() + report.skipped.len(),
        bytes: 0,
        peak: warm_peak,
        note: warm_note,
    });

    rows.push(hash_large_files(&root, &report)?);

    if root.join(".git").exists() {
        let mut times = Vec::new();
        git_status(&root)?; // first run refreshes git's own index stat data
        for _ in 0..runs {
            let t = Instant::now();
            git_status(&root)?;
            times.push(t.elapsed());
        }
        let files = report.files.len();
        rows.push(Row {
            name: "git status --porcelain".to_owned(),
            time: median(times),
            files: 0,
            bytes: 0,
            peak: None,
            note: format!(
                "median of {runs}; a process; same tree ({} files indexed by caret)",
                thousands(files as u64)
            ),
        });
    } else {
        println!("(not a git repository: no git status comparison)");
    }
    // The commands as a developer runs them, on a scratch home.
    let commands = crate::commands::rows(&state, &root, runs, sync, &config.local_model_dir());
    let _ = std::fs::remove_dir_all(&state);
    for t in commands? {
        rows.push(Row {
            name: t.name,
            time: t.median,
            files: 0,
            bytes: 0,
            peak: None,
            note: format!(
                "median of {runs} ({:.1}–{:.1} ms); {}",
                t.min.as_secs_f64() * 1000.0,
                t.max.as_secs_f64() * 1000.0,
                t.note
            ),
        });
    }
    print_rows(&rows);
    println!(
        "peak RSS: the process high-water mark since the row began; memory the allocator kept from \
         earlier rows counts, so later rows over-state it (for one scan alone: /usr/bin/time -v caret scan PATH)"
    );
    println!(
        "tree: {} files indexed, {}, {} chunks, root {}",
        thousands(report.files.len() as u64),
        human_bytes(report.bytes()),
        thousands(report.chunks()),
        report.root_hash()
    );
    Ok(ExitCode::SUCCESS)
}

/// A scratch directory under the data directory for the benchmark's stat cache.
fn tempfile_dir(config: &Config) -> anyhow::Result<PathBuf> {
    let dir = config.home.join("bench").join(format!("scan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Reads and hashes the largest indexed files on one thread: BLAKE3 throughput on one core.
fn hash_large_files(root: &Path, report: &ScanReport) -> anyhow::Result<Row> {
    let mut large: Vec<_> = report.files.iter().filter(|f| f.size >= 64 * 1024).collect();
    large.sort_by_key(|f| std::cmp::Reverse(f.size));
    large.truncate(200);
    let mut buf = Vec::new();
    reset_peak_rss();
    let t = Instant::now();
    let mut bytes = 0;
    for f in &large {
        buf.clear();
        std::fs::File::open(f.path.under(root))?.read_to_end(&mut buf)?;
        let hash = blake3::hash(&buf);
        std::hint::black_box(hash);
        bytes += buf.len() as u64;
    }
    Ok(Row {
        name: "hash large files, 1 thread".to_owned(),
        time: t.elapsed(),
        files: large.len(),
        bytes,
        peak: peak_rss(),
        note: "files >= 64 KiB, read + BLAKE3".to_owned(),
    })
}

fn git_status(root: &Path) -> anyhow::Result<()> {
    let status = Command::new("git")
        .args(["status", "--porcelain"])
        .current_dir(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running git status")?;
    anyhow::ensure!(status.success(), "git status failed in {}", root.display());
    Ok(())
}

/// Embedding throughput on real chunks: batched with length bucketing vs one at a time.
pub fn bench_embed(
    config: &Config,
    path: &Path,
    n: usize,
    threads: Option<usize>,
    dump: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    use caret_embed::{Embedder as _, LocalBert};
    use caret_workspace::tokens::TokenCounter as _;
    let dir = config.local_model_dir();
    anyhow::ensure!(
        caret_embed::is_local_model(&dir),
        "no embedding model in {} (`caret models pull`, or `--model NAME|DIR`)",
        dir.display()
    );
    let mut settings = config.local_embedding_settings()?;
    if let Some(t) = threads {
        settings.threads = t;
    }
    let window = settings.max_tokens;
    let model = LocalBert::load(&dir, settings)?;
    // Real chunks: walk and chunk the tree until there are enough.
    let chunker = config.chunker()?;
    let root = std::fs::canonicalize(path).with_context(|| format!("opening {}", path.display()))?;
    let walked = caret_workspace::walk::walk(&root, &config.walk_config())?;
    let mut texts = Vec::new();
    for f in &walked.files {
        let Ok(text) = std::fs::read_to_string(f.path.under(&root)) else { continue };
        for c in chunker.chunk(&f.path, &text) {
            texts.push(c.embedding_input(&text));
        }
        if texts.len() >= n {
            break;
        }
    }
    texts.truncate(n);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let tokens: usize = refs.iter().map(|t| model.tokenizer().count(t).min(window - 2) + 2).sum();
    println!(
        "caret bench embed: {} chunks, {} tokens, {} threads, window {window}, model {}",
        refs.len(),
        thousands(tokens as u64),
        settings.threads,
        model.model_id()
    );
    let t = Instant::now();
    let batched = model.embed(&refs)?;
    let batched_time = t.elapsed();
    if let Some(out) = dump {
        let json = serde_json::json!({ "model": model.model_id(), "texts": refs, "vectors": batched });
        std::fs::write(out, serde_json::to_vec(&json)?).with_context(|| format!("writing {}", out.display()))?;
    }
    let sample = refs.len().min(200);
    let t = Instant::now();
    let single = model.embed_unbatched(&refs[..sample])?;
    let single_time = t.elapsed();
    let max_diff = batched
        .iter()
        .zip(&single)
        .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
        .fold(0.0f32, f32::max);
    let sample_tokens: usize = refs[..sample].iter().map(|t| model.tokenizer().count(t).min(window - 2) + 2).sum();
    let per_s = |count: usize, d: Duration| count as f64 / d.as_secs_f64().max(1e-9);
    println!("{:<34} {:>10} {:>12} {:>10}", "mode", "chunks/s", "tokens/s", "time");
    println!(
        "{:<34} {:>10.1} {:>12.0} {:>9.2}s",
        "batched, length-bucketed",
        per_s(refs.len(), batched_time),
        per_s(tokens, batched_time),
        batched_time.as_secs_f64()
    );
    println!(
        "{:<34} {:>10.1} {:>12.0} {:>9.2}s",
        format!("one at a time ({sample} chunks)"),
        per_s(sample, single_time),
        per_s(sample_tokens, single_time),
        single_time.as_secs_f64()
    );
    println!("largest difference between the two on the shared chunks: {max_diff:.2e}");
    Ok(ExitCode::SUCCESS)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Exact vs HNSW search on synthetic vectors: recall and latency.
pub fn bench_vectors(n: usize, dim: usize, queries: usize, ef: usize) -> anyhow::Result<ExitCode> {
    use caret_store::ann::{AnnIndex, AnnParams, synthetic_embeddings};
    use caret_store::rank::exact_top_k;
    anyhow::ensure!(n > 0 && dim > 0 && queries > 0, "--n, --dim and --queries must be positive");
    println!(
        "caret bench vectors: {} synthetic embeddings × {dim} dims (32-d latent structure, like real ones), {queries} queries, k = 10, ef {ef}",
        thousands(n as u64)
    );
    let t = Instant::now();
    let vectors = synthetic_embeddings(n, dim, 1);
    let qs = synthetic_embeddings(queries, dim, 2);
    println!("generated in {:.1}s ({})", t.elapsed().as_secs_f64(), human_bytes((vectors.len() * 4) as u64));
    let t = Instant::now();
    let ann = AnnIndex::build(&vectors, dim, AnnParams { expansion_search: ef, ..AnnParams::default() })?;
    let build = t.elapsed();
    let (mut exact_times, mut ann_times) = (Vec::new(), Vec::new());
    let mut found = 0;
    for q in qs.chunks_exact(dim) {
        let t = Instant::now();
        let exact = exact_top_k(&vectors, dim, q, 10);
        exact_times.push(t.elapsed());
        let t = Instant::now();
        let approx = ann.search(q, 10, &vectors)?;
        ann_times.push(t.elapsed());
        found += approx.iter().filter(|h| exact.iter().any(|e| e.0 == h.0)).count();
    }
    exact_times.sort();
    ann_times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("{:<26} {:>10} {:>10}", "search (one query, 1 thread)", "p50", "p99");
    println!(
        "{:<26} {:>8.2}ms {:>8.2}ms",
        "exact scan",
        ms(percentile(&exact_times, 0.5)),
        ms(percentile(&exact_times, 0.99))
    );
    println!(
        "{:<26} {:>8.2}ms {:>8.2}ms",
        "ANN (HNSW, usearch)",
        ms(percentile(&ann_times, 0.5)),
        ms(percentile(&ann_times, 0.99))
    );
    println!(
        "ANN build: {:.1}s; recall@10 against exact: {:.4}; the graph holds {} ({} a vector, its vectors quantised to 8 bits; the block itself {} a vector)",
        build.as_secs_f64(),
        found as f64 / (10 * queries) as f64,
        human_bytes(ann.memory_bytes() as u64),
        thousands((ann.memory_bytes() / n) as u64),
        thousands((dim * 4) as u64)
    );
    // What a compaction pays for its graph when the tail adds a twentieth (when one is due):
    // a graph built anew over everything, or the old one copied and extended with the tail.
    let more = (n / 20).max(1);
    let mut all = vectors;
    all.extend(synthetic_embeddings(more, dim, 3));
    let params = AnnParams { expansion_search: ef, ..AnnParams::default() };
    let t = Instant::now();
    let anew = AnnIndex::build(&all, dim, params)?;
    let anew_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let extended = AnnIndex::from_bytes(&ann.to_bytes()?, dim, params)?;
    extended.add_rows(&all, n)?;
    let extended_s = t.elapsed().as_secs_f64();
    let recall = |index: &AnnIndex| -> anyhow::Result<f64> {
        let mut found = 0;
        for q in qs.chunks_exact(dim) {
            let exact = exact_top_k(&all, dim, q, 10);
            found += index.search(q, 10, &all)?.iter().filter(|h| exact.iter().any(|e| e.0 == h.0)).count();
        }
        Ok(found as f64 / (10 * queries) as f64)
    };
    println!("a compaction's graph, the tail adding {} vectors (a twentieth):", thousands(more as u64));
    println!("  built anew over all:               {anew_s:>7.2}s; recall@10 {:.4}", recall(&anew)?);
    println!("  the old graph copied and extended: {extended_s:>7.2}s; recall@10 {:.4}", recall(&extended)?);
    Ok(ExitCode::SUCCESS)
}
