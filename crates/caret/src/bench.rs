//! `caret bench …`: measurements that print figures. They never assert a timing.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use caret_workspace::scan::{Depth, ScanReport, Scanner};
use caret_workspace::statcache::StatCache;

use crate::config::Config;
use crate::scan::{human_bytes, thousands};

#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Cold and warm scans of a tree, raw hashing speed, and `git status` on the same tree.
    Scan {
        /// The tree to scan (a large real one, e.g. ~/.cargo/registry/src).
        path: PathBuf,
        /// Repetitions of each warm measurement (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// Bytes on the wire and time for first sync, no-change sync, one changed file and a
    /// 1,000-file change, against a `caret serve` on loopback (over a copy of the tree).
    Sync {
        /// The tree to copy and sync.
        path: PathBuf,
        /// Files changed in the large-change step.
        #[arg(long, default_value_t = 1000)]
        changes: usize,
    },
}

pub fn run(config: &Config, cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Scan { path, runs } => bench_scan(config, &path, runs.max(1)),
        BenchCommand::Sync { path, changes } => crate::bench_sync::run(config, &path, changes),
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
    v[v.len() / 2]
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

fn bench_scan(config: &Config, path: &Path, runs: usize) -> anyhow::Result<ExitCode> {
    let root = std::fs::canonicalize(path).with_context(|| format!("opening {}", path.display()))?;
    let full = Scanner::new(config.walk_config(), config.chunker()?, Depth::Full);
    let hash_only = Scanner::new(config.walk_config(), config.chunker()?, Depth::HashOnly);
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
    let _ = std::fs::remove_dir_all(&state);
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
            note: format!("median of {runs}; same tree ({} files indexed by caret)", thousands(files as u64)),
        });
    } else {
        println!("(not a git repository: no git status comparison)");
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
        report.tree.root_hash()
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
