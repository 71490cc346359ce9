//! `caret index` and `caret search`.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use caret_client::index::{EmbedProgress, embed_missing};
use caret_workspace::scan::{Depth, Scanner};
use serde_json::json;

use caret_host::config::Config;
use caret_host::remote::{engine, open_workspace, transport};
use caret_host::runtime::runtime;
use caret_host::search::search_workspace;
use caret_host::units::thousands;

use crate::sync::{RemoteArgs, Target};

#[derive(Debug, clap::Args)]
pub struct IndexArgs {
    #[command(flatten)]
    target: Target,
}

#[derive(Debug, clap::Args)]
pub struct SearchArgs {
    /// What to look for: a question or keywords.
    query: String,
    /// Hits to show.
    #[arg(short, default_value_t = 10)]
    k: usize,
    /// The workspace.
    #[arg(long, short = 'C', default_value = ".")]
    path: PathBuf,
    #[command(flatten)]
    remote: RemoteArgs,
    /// Which rankings to use.
    #[arg(long, value_enum, default_value = "hybrid")]
    mode: Mode,
    /// Print JSON: an array of {path, start_line, end_line, score, snippet}, best first.
    #[arg(long)]
    json: bool,
}

/// A one-line progress bar on a terminal; nothing otherwise.
struct Bar {
    tty: bool,
    started: std::time::Instant,
}

impl Bar {
    fn new() -> Self {
        Bar { tty: std::io::stderr().is_terminal(), started: std::time::Instant::now() }
    }

    fn show(&self, p: &EmbedProgress) {
        if !self.tty || p.total == 0 {
            return;
        }
        let frac = p.done as f64 / p.total as f64;
        let width = 30;
        let filled = ((frac * width as f64) as usize).min(width);
        let secs = self.started.elapsed().as_secs_f64();
        let rate = p.embedded as f64 / secs.max(1e-3);
        let eta = if rate > 0.0 { format!(", {:.0} s left", (p.total - p.done) as f64 / rate) } else { String::new() };
        // Code is embedded first, then tests, then the rest: say which are complete.
        let done: Vec<&str> = p.stages_done().collect();
        let stages = if done.is_empty() { String::new() } else { format!("; {} done", done.join(", ")) };
        eprint!(
            "\rembedding [{}{}] {}/{} chunks ({rate:.0}/s{eta}{stages})   ",
            "#".repeat(filled),
            "-".repeat(width - filled),
            thousands(p.done),
            thousands(p.total)
        );
        let _ = std::io::stderr().flush();
    }

    fn done(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

pub fn index(config: &Config, IndexArgs { target }: IndexArgs) -> anyhow::Result<ExitCode> {
    let ws = open_workspace(config, &target.path)?;
    let engine = engine(config)?;
    let scanner = Arc::new(Scanner::new(config.walk_config(), config.chunker()?, Depth::Hash));
    runtime()?.block_on(async {
        let transport = transport(config, &target.remote.remote()).await?;
        let to = transport.describe();
        let sync = engine
            .sync(&ws, transport.as_ref())
            .await
            .with_context(|| format!("syncing {} with {to}", ws.root.display()))?;
        if !target.json {
            println!(
                "synced {} files (+{} ~{} -{}) in {:.1} s: lexical search is ready",
                thousands(sync.added + sync.modified + sync.unchanged),
                sync.added,
                sync.modified,
                sync.deleted,
                sync.seconds
            );
        }
        let bar = Bar::new();
        let report = embed_missing(scanner, &ws, transport.as_ref(), |p| bar.show(p))
            .await
            .with_context(|| format!("embedding {} on {to}", ws.root.display()))?;
        bar.done();
        let p = report.progress;
        if target.json {
            println!("{}", json!({ "workspace": ws.id, "server": to, "sync": sync, "embed": report }));
        } else {
            match &report.model {
                Some(model) => println!(
                    "embedded {} chunks in {:.1} s ({model}); {} of {} chunks have vectors{}",
                    thousands(p.embedded),
                    report.seconds,
                    thousands(p.done),
                    thousands(p.total),
                    if p.stale > 0 {
                        format!("; {} changed since the sync (run again)", p.stale)
                    } else {
                        String::new()
                    }
                ),
                None => println!("the server has no embedding model: search is lexical only"),
            }
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

pub fn run_search(config: &Config, args: SearchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!((1..=200).contains(&args.k), "-k must be 1-200");
    let outcome = runtime()?.block_on(search_workspace(
        config,
        &args.path,
        &args.remote.remote(),
        &args.query,
        args.k,
        args.mode.into(),
    ))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome.hits)?);
    } else {
        if !outcome.semantic {
            eprintln!("caret: lexical results only (no vectors yet: run `caret index`)");
        } else if outcome.embedded < outcome.embeddable {
            eprintln!(
                "caret: {} of {} chunks have vectors; run `caret index` for the rest",
                thousands(outcome.embedded),
                thousands(outcome.embeddable)
            );
        }
        for h in &outcome.hits {
            println!("{}:{}-{}  ({:.4})", h.path, h.start_line, h.end_line, h.score);
            for line in h.snippet.lines().take(8) {
                println!("    {line}");
            }
            if h.snippet.lines().count() > 8 {
                println!("    …");
            }
            println!();
        }
        if outcome.hits.is_empty() {
            println!("no results");
        }
    }
    Ok(if outcome.hits.is_empty() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// `--mode`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Mode {
    /// BM25 and vectors, fused.
    Hybrid,
    /// BM25 only.
    Lexical,
    /// Vectors only.
    Semantic,
}

impl From<Mode> for caret_protocol::SearchMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Hybrid => caret_protocol::SearchMode::Hybrid,
            Mode::Lexical => caret_protocol::SearchMode::Lexical,
            Mode::Semantic => caret_protocol::SearchMode::Semantic,
        }
    }
}
