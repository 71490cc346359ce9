//! `caret bench tab`: a typing session replayed against a local model. Lines of a real file
//! are taken out and typed back one character at a time (a newline brings the next line's
//! indentation, as an editor's auto-indent does); after each keystroke the suggestion is
//! asked for and waited on. Prints keystroke-to-suggestion p50/p99 (model calls and all),
//! the share of keystrokes the typed-ahead cache served, tokens prefilled per model call
//! with KV reuse against the whole prompt (what a cache-less server prefills), and
//! acceptance proxies: suggestions that the next typed text starts with.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use caret_complete::Family;
use caret_complete::context::Budget;
use caret_models::local::{LocalProvider, LocalSettings};
use caret_models::{Deployment, DeploymentLimits, Gateway, GatewaySettings, Provider};

use crate::chat::Backend;
use crate::complete::{Completer, Source};
use crate::config::Config;
use crate::server::runtime;

/// The default file: a 61-line Python module.
const FILE: &str = include_str!("bench_data/tab/inventory.py.txt");
/// The default lines typed back (1-based, inclusive): `low_stock` and `by_tag`.
const LINES: (usize, usize) = (45, 49);

/// What `caret bench tab` was asked.
pub struct TabBench {
    pub model: String,
    pub file: Option<PathBuf>,
    /// 1-based inclusive line range typed back.
    pub lines: Option<(usize, usize)>,
    pub threads: Option<usize>,
    pub budget: usize,
    pub suffix_share: Option<f32>,
    /// A custom FIM prompt.
    pub template: Option<String>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn run(config: &Config, args: TabBench) -> anyhow::Result<ExitCode> {
    let (name, text) = match &args.file {
        Some(p) => {
            (p.display().to_string(), std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => ("inventory.py".to_owned(), FILE.to_owned()),
    };
    let (first, last) = args.lines.unwrap_or(LINES);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    anyhow::ensure!(
        first >= 1 && first <= last && last <= lines.len(),
        "--lines {first}-{last} is not within the file"
    );
    let before: String = lines[..first - 1].concat();
    let typed: String = lines[first - 1..last].concat();
    let after: String = lines[last..].concat();

    let path = config.local_llm_path(&args.model);
    let settings = LocalSettings { context_tokens: 4096, threads: args.threads, ..LocalSettings::default() };
    let local = Arc::new(LocalProvider::load(&path, settings)?);
    let provider: Arc<dyn Provider> = local.clone();
    let mut gateway = Gateway::new(GatewaySettings::default());
    gateway.add_alias("tab", vec![Deployment::new("local", provider, "local", 0, 1, DeploymentLimits::default())]);
    let family = match &args.template {
        Some(prompt) => {
            let stop = Family::guess(&path.to_string_lossy()).map(|f| f.stop()).unwrap_or_default();
            Some(Family::Custom(caret_complete::Template { prompt: prompt.clone(), stop }))
        }
        None => Family::guess(&path.to_string_lossy()),
    };
    let mut budget = Budget { tokens: args.budget, ..Budget::default() };
    if let Some(share) = args.suffix_share {
        budget.suffix_share = share.clamp(0.0, 0.9);
    }
    let source = Source::Model { backend: Backend::Embedded(Arc::new(gateway)), family: family.clone() };
    let completer = Completer::new(source, "tab".to_owned(), budget);
    println!(
        "model {} ({:?} template), {} threads, {}; {name}: typing lines {first}–{last} back ({} characters), \
         budget {} tokens",
        path.display(),
        family,
        local.info().threads,
        local.info().attention(),
        typed.chars().count(),
        args.budget
    );

    // Keystrokes: one character each, a newline together with the next line's indentation.
    let mut keystrokes: Vec<usize> = Vec::new();
    let mut i = 0;
    let chars: Vec<(usize, char)> = typed.char_indices().collect();
    while i < chars.len() {
        let (_, c) = chars[i];
        i += 1;
        if c == '\n' {
            while i < chars.len() && (chars[i].1 == ' ' || chars[i].1 == '\t') {
                i += 1;
            }
        }
        keystrokes.push(chars.get(i).map_or(typed.len(), |&(b, _)| b));
    }

    let rt = runtime()?;
    let (mut all, mut model_ms, mut single, mut multi, mut first_text) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut cached, mut accepted_proxy, mut useful_chars) = (0usize, 0usize, 0usize);
    let (mut calls, mut prompt, mut reused) = (0u64, 0u64, 0u64);
    rt.block_on(async {
        for &k in &keystrokes {
            let doc = format!("{before}{}{after}", &typed[..k]);
            let cursor = before.len() + k;
            let stats = local.stats();
            let s = completer.suggest(&name, &doc, cursor, Some(&name), &[]).await?;
            let now = local.stats();
            all.push(s.total_ms);
            if s.cached {
                cached += 1;
            } else {
                model_ms.push(s.total_ms);
                first_text.push(s.first_text_ms);
                if s.multiline {
                    multi.push(s.total_ms)
                } else {
                    single.push(s.total_ms)
                }
                calls += now.requests - stats.requests;
                prompt += now.prompt_tokens - stats.prompt_tokens;
                reused += now.reused_tokens - stats.reused_tokens;
            }
            // What the typist types next on this line (and beyond, for multi-line).
            let rest = &typed[k..];
            if !s.text.is_empty() && rest.starts_with(s.text.as_str()) {
                accepted_proxy += 1;
                useful_chars += s.text.chars().count();
            }
        }
        anyhow::Ok(())
    })?;
    for v in [&mut all, &mut model_ms, &mut single, &mut multi, &mut first_text] {
        v.sort_by(f64::total_cmp);
    }
    let n = keystrokes.len();
    println!("  keystrokes                   {n}");
    println!(
        "  keystroke → suggestion       p50 {:.0} ms, p99 {:.0} ms (all); model calls p50 {:.0} ms, p99 {:.0} ms",
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        percentile(&model_ms, 0.5),
        percentile(&model_ms, 0.99)
    );
    println!(
        "  model calls                  {} single-line p50 {:.0} ms; {} multi-line p50 {:.0} ms; first text p50 {:.0} ms",
        single.len(),
        percentile(&single, 0.5),
        multi.len(),
        percentile(&multi, 0.5),
        percentile(&first_text, 0.5)
    );
    println!("  served by the cache          {cached} ({:.0}%)", 100.0 * cached as f64 / n.max(1) as f64);
    let per = |t: u64| t as f64 / calls.max(1) as f64;
    println!(
        "  prompt tokens per model call {:.0} whole; {:.0} prefilled with KV reuse ({:.0}% reused)",
        per(prompt),
        per(prompt - reused),
        100.0 * reused as f64 / prompt.max(1) as f64
    );
    println!(
        "  suggestions the typist then typed: {accepted_proxy} of {n} keystrokes ({:.0}%), {useful_chars} characters",
        100.0 * accepted_proxy as f64 / n.max(1) as f64
    );
    Ok(ExitCode::SUCCESS)
}
