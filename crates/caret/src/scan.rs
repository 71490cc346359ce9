//! `caret scan`: what would be indexed, and why the rest would not.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use caret_workspace::scan::{Depth, ScanReport, Scanner};
use caret_workspace::statcache::StatCache;
use serde_json::json;

use caret_host::config::{Config, Size, parse_size};
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
    let scanner = Scanner::new(config.walk_config(), config.chunker()?, Depth::Full);
    let cache_path = config.workspace_state_dir(&root).join("scan-cache.bin");
    let load = || if args.no_cache { StatCache::default() } else { StatCache::load(&cache_path) };
    let (report, cache) = scanner.scan_loading(&root, load).with_context(|| format!("scanning {}", root.display()))?;
    if !args.no_cache && report.stats.cache_changed {
        cache.save(&cache_path).with_context(|| format!("saving the stat cache for {}", root.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&report, args.explain))?);
    } else {
        print_human(&report, args.explain);
    }
    Ok(ExitCode::SUCCESS)
}

/// Skipped counts by category, secrets included.
fn skipped_counts(report: &ScanReport) -> BTreeMap<&'static str, usize> {
    let mut counts: BTreeMap<&'static str, usize> =
        ["ignored", "too-large", "binary", "secret", "symlink", "unreadable"].into_iter().map(|k| (k, 0)).collect();
    for s in &report.skipped {
        *counts.entry(s.reason.category()).or_default() += 1;
    }
    counts.insert("secret", report.files_with_secrets());
    counts
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

fn to_json(report: &ScanReport, explain: bool) -> serde_json::Value {
    let mut v = json!({
        "root": report.root.display().to_string(),
        "root_hash": report.tree.root_hash().to_hex(),
        "files": report.files.len(),
        "bytes": report.bytes(),
        "chunks": report.chunks(),
        "withheld_chunks": report.withheld(),
        "skipped": skipped_counts(report),
        "changes": report.changes.as_ref().map(|c| json!({
            "added": c.added.len(), "modified": c.modified.len(), "deleted": c.deleted.len(),
        })),
        "cache": { "hits": report.stats.cache_hits, "read": report.stats.files_read },
        "elapsed_ms": report.stats.elapsed.as_secs_f64() * 1000.0,
    });
    if explain {
        v["explain"] = json!({
            "skipped": report.skipped.iter().map(|s| json!({
                "path": s.path, "dir": s.is_dir, "reason": s.reason.category(), "detail": s.reason.to_string(),
            })).collect::<Vec<_>>(),
            "secrets": report.files.iter().flat_map(|f| f.findings.iter().map(move |(rule, line)| json!({
                "path": f.path, "line": line, "rule": rule,
            }))).collect::<Vec<_>>(),
            "lexical_only": data_files(report).0.iter().map(|f| json!({
                "path": f.path, "chunks": f.chunks,
            })).collect::<Vec<_>>(),
        });
    }
    v
}

fn print_human(report: &ScanReport, explain: bool) {
    println!("caret scan {}", report.root.display());
    println!(
        "  indexed    {} files, {}, {} chunks",
        thousands(report.files.len() as u64),
        human_bytes(report.bytes()),
        thousands(report.chunks())
    );
    println!("  root hash  {}", report.tree.root_hash());
    let counts = skipped_counts(report);
    let mut parts: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{} {}", thousands(*n as u64), k.replace('-', " ")))
        .collect();
    if report.withheld() > 0
        && let Some(p) = parts.iter_mut().find(|p| p.ends_with(" secret"))
    {
        p.push_str(&format!(" ({} chunks withheld)", report.withheld()));
    }
    println!("  skipped    {}", if parts.is_empty() { "nothing".to_owned() } else { parts.join(", ") });
    match &report.changes {
        Some(c) => {
            println!("  changes    +{} ~{} -{} since the last scan", c.added.len(), c.modified.len(), c.deleted.len())
        }
        None => println!("  changes    first scan"),
    }
    println!(
        "  time       {:.3} s ({} files read, {} from the stat cache)",
        report.stats.elapsed.as_secs_f64(),
        thousands(report.stats.files_read as u64),
        thousands(report.stats.cache_hits as u64)
    );
    if explain {
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
