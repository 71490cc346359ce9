//! `caret scan`: what would be indexed, and why the rest would not; answered from the last
//! scan's summary when the local daemon's watcher saw no change since (see `caret_host::watch`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use caret_workspace::scan::{Depth, ScanReport, Scanner};
use caret_workspace::statcache::StatCache;
use serde_json::json;

use caret_host::config::{Config, Size, parse_size};
use caret_host::unchanged::{self, ScanSummary};
use caret_host::units::{human_bytes, thousands};

#[derive(Debug, clap::Args)]
pub struct ScanArgs {
    /// The workspace to scan.
    #[arg(default_value = ".")]
    path: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// List every skipped path with its reason, and every secret finding.
    #[arg(long)]
    explain: bool,
    /// Skip files larger than this (bytes, or with a K/M/G suffix).
    #[arg(long, value_parser = parse_size)]
    max_file_size: Option<u64>,
    /// Do not read or write the stat cache (everything is hashed).
    #[arg(long)]
    no_cache: bool,
}

pub fn run(config: &Config, args: ScanArgs) -> anyhow::Result<ExitCode> {
    let mut config = config.clone();
    if let Some(size) = args.max_file_size {
        config.scan.max_file_size = Size(size);
    }
    let root =
        std::fs::canonicalize(&args.path).with_context(|| format!("opening workspace {}", args.path.display()))?;
    let state_dir = config.workspace_state_dir(&root);
    let cache_path = state_dir.join("scan-cache.bin");
    let record_path = state_dir.join("scan-summary.json");
    // The daemon's watcher, when one runs: unchanged since the last scan began, that scan's
    // summary is the answer. A listing (--explain) or an uncached scan always walks.
    let started = Instant::now();
    let watched =
        if args.no_cache || args.explain { None } else { unchanged::ask_blocking(&config, &root, Vec::new()) };
    // Only with a watcher to record under: the stamp costs a `stat` per ignore file.
    let stamp = watched
        .as_ref()
        .map(|_| caret_host::watch::stamp(&caret_host::watch::settings(&config, "scan"), &root, &config.walk_config()));
    if let (Some((at, _)), Some(stamp)) = (&watched, &stamp)
        && let Some(mut summary) = caret_host::watch::load::<ScanSummary>(&record_path, at, stamp)
    {
        summary.unchanged(started.elapsed());
        print_summary(&summary, args.json);
        return Ok(ExitCode::SUCCESS);
    }
    let scanner = Scanner::new(config.walk_config(), config.chunker()?, Depth::Full);
    let load = || if args.no_cache { StatCache::default() } else { StatCache::load(&cache_path) };
    let (report, cache) = scanner.scan_loading(&root, load).with_context(|| format!("scanning {}", root.display()))?;
    if !args.no_cache && report.stats.cache_changed {
        cache.save(&cache_path).with_context(|| format!("saving the stat cache for {}", root.display()))?;
    }
    let summary = ScanSummary::of(&report);
    if let (Some((at, _)), Some(stamp)) = (&watched, &stamp) {
        let _ = std::fs::create_dir_all(&state_dir);
        if let Err(e) = caret_host::watch::save(&record_path, at, stamp, &summary) {
            tracing::debug!("keeping the scan's summary: {e}");
        }
        // From now on the watcher leaves out what this walk ignored.
        let _ = unchanged::ask_blocking(&config, &root, unchanged::ignored_dirs(&report));
    } else if !args.no_cache {
        caret_host::watch::forget(&record_path);
    }
    if args.json {
        let mut v = serde_json::to_value(&summary)?;
        if args.explain {
            v["explain"] = explain_json(&report);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_summary(&summary, false);
        if args.explain {
            print_explain(&report);
        }
    }
    // The process ends next: its exit frees the report's and the cache's tens of thousands of
    // paths at once, where dropping them one by one costs ~2 ms of a 60 ms scan.
    std::mem::forget((report, cache, scanner));
    Ok(ExitCode::SUCCESS)
}

/// Files of bulk data (translation catalogs, tables): indexed for words, never embedded.
fn data_files(report: &ScanReport) -> (Vec<&caret_workspace::scan::ScannedFile>, u64) {
    use caret_workspace::chunk::{FileKind, Language};
    let files: Vec<_> = report
        .files
        .iter()
        .filter(|f| FileKind::detect(&f.path, Language::detect(&f.path)) == FileKind::Data)
        .collect();
    let chunks = files.iter().map(|f| u64::from(f.chunks)).sum();
    (files, chunks)
}

fn explain_json(report: &ScanReport) -> serde_json::Value {
    json!({
        "skipped": report.skipped.iter().map(|s| json!({
            "path": s.path, "dir": s.is_dir, "reason": s.reason.category(), "detail": s.reason.to_string(),
        })).collect::<Vec<_>>(),
        "secrets": report.files.iter().flat_map(|f| f.findings.iter().map(move |(rule, line)| json!({
            "path": f.path, "line": line, "rule": rule,
        }))).collect::<Vec<_>>(),
        "lexical_only": data_files(report).0.iter().map(|f| json!({
            "path": f.path, "chunks": f.chunks,
        })).collect::<Vec<_>>(),
    })
}

fn print_summary(s: &ScanSummary, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(s).unwrap_or_default());
        return;
    }
    println!("caret scan {}", s.root);
    println!(
        "  indexed    {} files, {}, {} chunks",
        thousands(s.files as u64),
        human_bytes(s.bytes),
        thousands(s.chunks)
    );
    println!("  root hash  {}", s.root_hash);
    let mut parts: Vec<String> = s
        .skipped
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{} {}", thousands(*n as u64), k.replace('-', " ")))
        .collect();
    if s.withheld_chunks > 0
        && let Some(p) = parts.iter_mut().find(|p| p.ends_with(" secret"))
    {
        p.push_str(&format!(" ({} chunks withheld)", s.withheld_chunks));
    }
    println!("  skipped    {}", if parts.is_empty() { "nothing".to_owned() } else { parts.join(", ") });
    match &s.changes {
        Some(c) => println!("  changes    +{} ~{} -{} since the last scan", c.added, c.modified, c.deleted),
        None => println!("  changes    first scan"),
    }
    if s.watcher {
        println!(
            "  time       {:.3} s (the daemon's watcher saw no change since the last scan)",
            s.elapsed_ms / 1000.0
        );
    } else {
        println!(
            "  time       {:.3} s ({} files read, {} from the stat cache)",
            s.elapsed_ms / 1000.0,
            thousands(s.cache.read as u64),
            thousands(s.cache.hits as u64)
        );
    }
}

fn print_explain(report: &ScanReport) {
    {
        if !report.skipped.is_empty() {
            println!("\nskipped:");
            for s in &report.skipped {
                let path = format!("{}{}", s.path, if s.is_dir { "/" } else { "" });
                println!("  {path:<48} {}", s.reason);
            }
        }
        let (data, data_chunks) = data_files(report);
        if !data.is_empty() {
            println!(
                "\nlexical only ({} files, {} chunks of bulk data — translation catalogs, tables: searched by \
                 their words, not embedded):",
                thousands(data.len() as u64),
                thousands(data_chunks)
            );
            for f in data.iter().take(20) {
                println!("  {:<48} {} chunks", f.path.to_string(), f.chunks);
            }
            if data.len() > 20 {
                println!("  … and {} more", thousands(data.len() as u64 - 20));
            }
        }
        let findings: Vec<_> =
            report.files.iter().flat_map(|f| f.findings.iter().map(move |(rule, line)| (f, rule, line))).collect();
        if !findings.is_empty() {
            println!("\nsecrets (the chunks holding them are not indexed; values are never shown):");
            for (f, rule, line) in findings {
                println!("  {:<48} {rule}", format!("{}:{line}", f.path));
            }
        }
    }
}
