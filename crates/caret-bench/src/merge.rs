//! `caret bench merge`: a model merges a lazy edit into a file, once with plain decoding and
//! once with the file's region as the speculative draft, in one run and with the same local
//! model; prints tokens/s of both, the speed-up, how much of the draft was accepted, and
//! whether the two answers are identical (they must be: drafted tokens are only kept when they
//! are what the model picks).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use caret_apply::Text;
use caret_llama::{LlamaProvider, LlamaSettings};
use caret_models::Provider as _;

use caret_host::config::Config;
use caret_host::merge::{Answer, collect};
use caret_host::runtime::runtime;

/// The default file: a 311-line Rust module (a snapshot of caret's own stat cache).
const FILE: &str = include_str!("data/merge/statcache.rs.txt");
/// The default edit: a new enum variant and its encoding (11 lines added, 1 changed: 3.9% of
/// the file). Its first segment is a changed line alone, which the matcher cannot place.
const EDIT: &str = include_str!("data/merge/statcache.edit.txt");
/// The file the default edit should give.
const EXPECTED: &str = include_str!("data/merge/statcache.new.rs.txt");

/// What `caret bench merge` was asked.
pub struct MergeBench {
    /// The model (an alias, a catalog name or a path).
    pub model: String,
    /// The file to use instead of the built-in one.
    pub file: Option<PathBuf>,
    /// The edit to merge instead of the built-in one.
    pub edit: Option<PathBuf>,
    /// The expected result of the merge.
    pub expected: Option<PathBuf>,
    /// Threads for the model (default: all cores).
    pub threads: Option<usize>,
    /// Require the merged file to equal the expected one.
    pub exact: bool,
    /// `None`: the local default.
    pub flash_attention: Option<bool>,
    /// `None`: the local default.
    pub key_cache: Option<caret_llama::KeyCache>,
}

fn row(name: &str, a: &Answer) {
    let u = a.usage.unwrap_or_default();
    println!(
        "  {name:<12} {:>6} tokens  {:>8.1} tokens/s  first text {:>7.0} ms  total {:>8.0} ms",
        u.completion_tokens,
        a.decode_rate(),
        a.first_text.as_secs_f64() * 1e3,
        a.total.as_secs_f64() * 1e3
    );
}

/// Runs this benchmark and prints its figures.
pub fn run(config: &Config, args: MergeBench) -> anyhow::Result<ExitCode> {
    let (file_name, file) = match &args.file {
        Some(p) => (p.display().to_string(), std::fs::read(p).with_context(|| format!("reading {}", p.display()))?),
        None => ("statcache.rs".to_owned(), FILE.as_bytes().to_vec()),
    };
    let edit = match &args.edit {
        Some(p) => std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        None => EDIT.to_owned(),
    };
    let text = Text::parse(&file)?;
    let plan = caret_apply::merge::plan(&text, &edit, Some(&file_name))?;
    let expected = match (&args.expected, &args.file) {
        (Some(p), _) => Some(Text::parse(&std::fs::read(p).with_context(|| format!("reading {}", p.display()))?)?),
        (None, None) => Some(Text::new(EXPECTED)),
        // Without an expected file: what the matcher makes of the edit, if it can place it.
        (None, Some(_)) => caret_apply::lazy::parse(&edit).and_then(|s| caret_apply::lazy::apply(&text, &s)).ok(),
    };
    let touched = expected.as_ref().map(|e| {
        let (a, r) = caret_apply::line_counts(&text.lines, &e.lines);
        a.max(r)
    });

    let path = config.local_llm_path(&args.model);
    // Room for the prompt and an answer as long as the region (code has ~3 bytes a token), and
    // no more: a larger context makes each step attend over more (empty) cache.
    let context = (plan.system.len() + plan.user.len() + 2 * plan.prediction.len()) / 3 + 1024;
    let context = std::env::var("CARET_BENCH_CTX").ok().and_then(|v| v.parse().ok()).unwrap_or(context);
    let defaults = LlamaSettings::default();
    let settings = LlamaSettings {
        context_tokens: u32::try_from(context).unwrap_or(u32::MAX),
        threads: args.threads,
        exact_kernels: args.exact,
        flash_attention: args.flash_attention.unwrap_or(defaults.flash_attention),
        key_cache: args.key_cache.unwrap_or(defaults.key_cache),
        ..defaults
    };
    if args.exact && std::env::var("GGML_CPU_TILED_MM").as_deref() != Ok("0") {
        eprintln!("note: --exact without GGML_CPU_TILED_MM=0 leaves llama.cpp's tiled batch kernel on");
    }
    let model = LlamaProvider::load(&path, settings)?;
    println!(
        "model {}, {} threads{}, {}; {file_name}: {} lines, region {}–{}, edit touches {} lines",
        path.display(),
        model.info().threads,
        if args.exact { ", exact kernels" } else { "" },
        model.info().attention(),
        text.lines.len(),
        plan.start + 1,
        plan.end,
        touched.map_or_else(|| "?".to_owned(), |t| t.to_string())
    );
    let rt = runtime()?;
    let (plain, spec) = rt.block_on(async {
        // Read the prompt once first, so both runs find it cached and differ only in decoding.
        let mut warm = plan.request("local", false);
        warm.max_tokens = Some(1);
        collect(model.chat(warm).await?, Instant::now()).await?;
        let started = Instant::now();
        let plain = collect(model.chat(plan.request("local", false)).await?, started).await?;
        let started = Instant::now();
        let spec = collect(model.chat(plan.request("local", true)).await?, started).await?;
        anyhow::Ok((plain, spec))
    })?;
    println!("\ndecoding (tokens/s after the first token):");
    row("plain", &plain);
    row("speculative", &spec);
    let details = spec.usage.and_then(|u| u.completion_tokens_details).unwrap_or_default();
    let drafted = details.accepted_prediction_tokens + details.rejected_prediction_tokens;
    println!(
        "  speed-up     {:.2}x   draft tokens accepted {} of {} evaluated ({:.1}%)",
        spec.decode_rate() / plain.decode_rate(),
        details.accepted_prediction_tokens,
        drafted,
        100.0 * f64::from(details.accepted_prediction_tokens) / f64::from(drafted.max(1))
    );
    println!(
        "  near-ties in verification batches decided again by a single-token step: {}",
        model.stats().redecided_tokens
    );
    println!("  identical answers: {}", if plain.text == spec.text { "yes" } else { "NO" });
    let merged = caret_apply::merge::splice(&text, &plan, &spec.text).map(|t| t.render());
    match (&merged, &expected) {
        (Ok(m), Some(e)) => {
            println!("  merged file equals the expected one: {}", if *m == e.render() { "yes" } else { "no" })
        }
        (Err(e), _) => println!("  the answer could not be spliced in: {e}"),
        _ => {}
    }
    Ok(if plain.text == spec.text { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
