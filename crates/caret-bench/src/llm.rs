//! `caret bench llm`: a local GGUF model in-process — prompt reading and generation speed, time
//! to first token cold and with the prompt's prefix reused — next to llama.cpp's own
//! `llama-bench` on the same file when one is given.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use caret_llama::{LlamaProvider, LlamaSettings};
use caret_models::{Event, Provider as _};
use caret_protocol::llm::CompletionRequest;
use futures::StreamExt as _;

use caret_host::config::Config;
use caret_host::runtime::runtime;

/// What `caret bench llm` was asked.
pub struct LlmBench {
    /// The model (an alias, a catalog name or a path).
    pub model: String,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Tokens to generate.
    pub tokens: u32,
    /// Repetitions.
    pub runs: usize,
    /// Threads for the model (default: all cores).
    pub threads: Option<usize>,
    /// llama.cpp's own `llama-bench`, run on the same file for comparison.
    pub llama_bench: Option<PathBuf>,
}

/// One timed completion.
struct Timed {
    ttft: Duration,
    total: Duration,
    prompt_tokens: u32,
    generated: u32,
    reused: u64,
}

/// A code-like prompt of about `tokens` tokens (a tokenizer makes ~1 token of 4 bytes of code);
/// `salt` changes its first line so that runs do not share a prefix.
fn prompt_of(tokens: usize, salt: usize) -> String {
    let mut p = format!("// benchmark run {salt}\n");
    let mut i = 0;
    while p.len() < tokens * 4 {
        p.push_str(&format!(
            "fn step_{i}(state: &mut State, input: &[u8]) -> Result<usize, Error> {{\n    let n = input.len().min(state.limit);\n    state.total += n;\n    Ok(n)\n}}\n\n"
        ));
        i += 1;
    }
    p.push_str("fn main() {\n");
    p
}

async fn timed(model: &LlamaProvider, prompt: String, tokens: u32) -> anyhow::Result<Timed> {
    let before = model.stats();
    let req = CompletionRequest::greedy(String::new(), prompt, tokens);
    let start = Instant::now();
    let mut stream = model.complete(req).await?;
    let (mut ttft, mut usage) = (None, None);
    while let Some(event) = stream.next().await {
        match event? {
            Event::Text(_) if ttft.is_none() => ttft = Some(start.elapsed()),
            Event::Usage(u) => usage = Some(u),
            _ => {}
        }
    }
    let total = start.elapsed();
    let usage = usage.context("the model reported no usage")?;
    Ok(Timed {
        ttft: ttft.unwrap_or(total),
        total,
        prompt_tokens: usage.prompt_tokens,
        generated: usage.completion_tokens,
        reused: model.stats().reused_tokens - before.reused_tokens,
    })
}

fn median_by(v: &[Timed], f: impl Fn(&Timed) -> f64) -> f64 {
    let mut xs: Vec<f64> = v.iter().map(f).collect();
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs this benchmark and prints its figures.
pub fn run(config: &Config, args: LlmBench) -> anyhow::Result<ExitCode> {
    let path = config.local_llm_path(&args.model);
    let file = if path.is_dir() { path.join("model.gguf") } else { path.clone() };
    let size = std::fs::metadata(&file)
        .with_context(|| format!("{} (pull it with `caret models pull`)", file.display()))?
        .len();
    let context = u32::try_from(args.prompt_tokens * 2 + args.tokens as usize + 256).unwrap_or(u32::MAX);
    let settings = LlamaSettings { context_tokens: context, threads: args.threads, ..LlamaSettings::default() };
    let started = Instant::now();
    let model = LlamaProvider::load(&path, settings)?;
    let load = started.elapsed();
    let info = model.info().clone();
    println!(
        "model {} ({}), {} threads, context {} tokens, {}, loaded in {:.0} ms",
        file.display(),
        caret_host::units::human_bytes(size),
        info.threads,
        info.context_tokens,
        info.attention(),
        ms(load)
    );

    let rt = runtime()?;
    let runs = args.runs.max(1);
    let (cold, warm) = rt.block_on(async {
        // Warm-up: page the weights in.
        timed(&model, prompt_of(32, usize::MAX), 4).await?;
        let mut cold = Vec::new();
        let mut warm = Vec::new();
        for r in 0..runs {
            let prompt = prompt_of(args.prompt_tokens, r);
            cold.push(timed(&model, prompt.clone(), args.tokens).await?);
            // The same file a moment later, a line longer: only the new part is read.
            warm.push(timed(&model, format!("{prompt}    let state = State::default();\n"), args.tokens).await?);
        }
        anyhow::Ok((cold, warm))
    })?;

    let prompt_rate = median_by(&cold, |t| f64::from(t.prompt_tokens) / t.ttft.as_secs_f64());
    let gen_rate =
        median_by(&cold, |t| f64::from(t.generated.saturating_sub(1)) / (t.total - t.ttft).as_secs_f64().max(1e-9));
    let generated = median_by(&cold, |t| f64::from(t.generated));
    println!("\nin-process (caret, llama.cpp via llama-cpp-2), median of {runs} runs:");
    println!("  prompt reading     {prompt_rate:>8.1} tokens/s  ({} tokens)", cold[0].prompt_tokens);
    println!("  generation         {gen_rate:>8.1} tokens/s  ({generated:.0} tokens after the prompt, greedy)");
    println!("  first token, cold  {:>8.1} ms", median_by(&cold, |t| ms(t.ttft)));
    println!(
        "  first token, warm  {:>8.1} ms  (prefix reused: {:.0} of {} tokens)",
        median_by(&warm, |t| ms(t.ttft)),
        median_by(&warm, |t| t.reused as f64),
        warm[0].prompt_tokens
    );

    if let Some(tool) = &args.llama_bench {
        let prompt = cold[0].prompt_tokens.to_string();
        println!("\nllama.cpp's llama-bench on the same file ({} threads, {runs} runs):", info.threads);
        llama_bench(tool, &file, &["-p", &prompt, "-n", "0"], info.threads, runs)?;
        // Generation right after the prompt, as above: at a depth of the prompt's length.
        let tokens = args.tokens.to_string();
        llama_bench(tool, &file, &["-p", "0", "-n", &tokens, "-d", &prompt], info.threads, runs)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs llama.cpp's `llama-bench` on the same file with the same threads and prints its rows.
fn llama_bench(tool: &Path, file: &Path, sizes: &[&str], threads: usize, runs: usize) -> anyhow::Result<()> {
    let out = std::process::Command::new(tool)
        .arg("-m")
        .arg(file)
        .args(sizes)
        .args(["-t", &threads.to_string(), "-r", &runs.to_string(), "-o", "json"])
        .output()
        .with_context(|| format!("running {}", tool.display()))?;
    anyhow::ensure!(out.status.success(), "{} failed: {}", tool.display(), String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).context("reading llama-bench's JSON")?;
    for row in rows {
        let (p, n) = (row["n_prompt"].as_u64().unwrap_or(0), row["n_gen"].as_u64().unwrap_or(0));
        let depth = row["n_depth"].as_u64().unwrap_or(0);
        let what =
            if p > 0 { format!("prompt reading ({p} tokens)") } else { format!("generation ({n} after {depth})") };
        println!(
            "  {what:<28} {:>8.1} ± {:.1} tokens/s",
            row["avg_ts"].as_f64().unwrap_or(f64::NAN),
            row["stddev_ts"].as_f64().unwrap_or(f64::NAN)
        );
    }
    Ok(())
}
