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
use std::time::Duration;

use anyhow::Context as _;
use caret_complete::Family;
use caret_complete::context::Budget;
use caret_llama::{LlamaProvider, LlamaSettings};
use caret_models::{Deployment, DeploymentLimits, Gateway, GatewaySettings, Provider};

use caret_host::backend::Backend;
use caret_host::completer::{Completer, Source};
use caret_host::config::Config;
use caret_host::runtime::runtime;

/// The default file: a 61-line Python module.
const FILE: &str = include_str!("data/tab/inventory.py.txt");
/// The default lines typed back (1-based, inclusive): `low_stock` and `by_tag`.
const LINES: (usize, usize) = (45, 49);

/// What `caret bench tab` was asked.
pub struct TabBench {
    /// The model (an alias, a catalog name or a path).
    pub model: String,
    /// The file to use instead of the built-in one.
    pub file: Option<PathBuf>,
    /// 1-based inclusive line range typed back.
    pub lines: Option<(usize, usize)>,
    /// Threads for the model (default: all cores).
    pub threads: Option<usize>,
    /// Context budget in tokens.
    pub budget: usize,
    /// Share of the budget given to the suffix.
    pub suffix_share: Option<f32>,
    /// A custom FIM prompt.
    pub template: Option<String>,
    /// The cold-file case with this pause instead of the typing replay.
    pub cold: Option<Duration>,
    /// With `cold`: a plain client's session over this folder's files instead.
    pub session: Option<PathBuf>,
    /// Next-edit requests during the replay.
    pub next_edits: NextEdits,
}

/// Next-edit requests during the typing replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NextEdits {
    /// None: Tab alone.
    None,
    /// After each keystroke, with the gate as it is by default for a model on this CPU.
    Default,
    /// After each keystroke, the model asked every time.
    Model,
}

use crate::search::percentile;

/// Runs this benchmark and prints its figures.
pub fn run(config: &Config, args: TabBench) -> anyhow::Result<ExitCode> {
    let (name, text) = match &args.file {
        Some(p) => {
            (p.display().to_string(), std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => ("inventory.py".to_owned(), FILE.to_owned()),
    };
    // (The cold-file case types no lines back.)
    let (first, last) = if args.cold.is_some() { (1, 1) } else { args.lines.unwrap_or(LINES) };
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    anyhow::ensure!(
        first >= 1 && first <= last && last <= lines.len(),
        "--lines {first}-{last} is not within the file"
    );
    let before: String = lines[..first - 1].concat();
    let typed: String = lines[first - 1..last].concat();
    let after: String = lines[last..].concat();

    let path = config.local_llm_path(&args.model);
    let settings = LlamaSettings { context_tokens: 4096, threads: args.threads, ..LlamaSettings::default() };
    let local = Arc::new(LlamaProvider::load(&path, settings)?);
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
    let source = Source::Model {
        backend: Backend::Embedded { gateway: Arc::new(gateway), tenant: "local".to_owned() },
        family: family.clone(),
    };
    let mut completer = Completer::new(source, "tab".to_owned(), budget);
    completer.set_local(true);
    completer.set_next_edits(match args.next_edits {
        NextEdits::Model => caret_host::completer::NextEditGate::always(),
        _ => caret_host::completer::NextEditGate::under(None),
    });
    if let (Some(pause), Some(dir)) = (args.cold, &args.session) {
        return crate::tab_session::session(&completer, &local, dir, pause);
    }
    if let Some(pause) = args.cold {
        return cold(&completer, &local, &name, &text, pause, args.budget);
    }
    let completer = Arc::new(completer);
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
    let mut history = caret_complete::next_edit::History::default();
    history.open(&name, &format!("{before}{after}"));
    let (mut next_edit_asked, mut next_edit_ms) = (0usize, Vec::new());
    let requests_at_start = local.stats().requests;
    rt.block_on(async {
        let mut in_flight: Option<tokio::task::JoinHandle<f64>> = None;
        for &k in &keystrokes {
            let doc = format!("{before}{}{after}", &typed[..k]);
            let cursor = before.len() + k;
            // A keystroke aborts the next edit in flight.
            if let Some(task) = in_flight.take() {
                task.abort();
                if let Ok(ms) = task.await {
                    next_edit_ms.push(ms);
                }
            }
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
            if args.next_edits != NextEdits::None
                && let Some(last) = history.settle(&name, &doc).cloned()
            {
                next_edit_asked += 1;
                let (c, n, d, edits) =
                    (completer.clone(), name.clone(), doc.clone(), history.edits().cloned().collect::<Vec<_>>());
                in_flight = Some(tokio::spawn(async move {
                    let t = std::time::Instant::now();
                    let guess = c.next_edit(edits.iter(), &n, &n, &d, cursor).await.ok().flatten();
                    std::hint::black_box(guess.or_else(|| caret_next_edit::guess(&last, &n, &d, cursor, &[])));
                    t.elapsed().as_secs_f64() * 1e3
                }));
            }
            // What the typist types next on this line (and beyond, for multi-line).
            let rest = &typed[k..];
            if !s.text.is_empty() && rest.starts_with(s.text.as_str()) {
                accepted_proxy += 1;
                useful_chars += s.text.chars().count();
            }
        }
        if let Some(task) = in_flight.take()
            && let Ok(ms) = task.await
        {
            next_edit_ms.push(ms);
        }
        anyhow::Ok(())
    })?;
    for v in [&mut all, &mut model_ms, &mut single, &mut multi, &mut first_text, &mut next_edit_ms] {
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
    if args.next_edits != NextEdits::None {
        println!(
            "  next edits ({:?})       {next_edit_asked} asked, {} answered before the next keystroke (p50 {:.1} ms), \
             model requests in all {} (Tab's {calls})",
            args.next_edits,
            next_edit_ms.len(),
            percentile(&next_edit_ms, 0.5),
            local.stats().requests - requests_at_start
        );
    }
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

/// Lines of the cold-file case: these fractions of the file's lines.
const COLD_LINES: [f64; 5] = [0.2, 0.35, 0.5, 0.65, 0.8];

/// The cold-file case: for each of [`COLD_LINES`], the file is opened (the line's text after
/// its indentation taken out, the cursor there: a line about to be written), `pause` passes,
/// the line's first character is typed and the suggestion is waited for — with the warm-up of
/// an editor that says where its cursor is (`caret/focus`: warmed there), with the warm-up of
/// a plain LSP client (Neovim, Helix: `didOpen` only, so warmed for the file's end), and
/// without any. The engine's cache is emptied of the file before each try.
fn cold(
    completer: &Completer,
    local: &LlamaProvider,
    name: &str,
    text: &str,
    pause: Duration,
    budget: usize,
) -> anyhow::Result<ExitCode> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    anyhow::ensure!(lines.len() >= 10, "--cold needs a file of at least 10 lines");
    println!("cold file: {name}, pause {:.1} s after opening, budget {budget} tokens", pause.as_secs_f64());
    let rt = runtime()?;
    let (mut warm_ms, mut cold_ms, mut plain_ms) = (Vec::new(), Vec::new(), Vec::new());
    let (mut warm_read, mut cold_read, mut plain_read) = (0u64, 0u64, 0u64);
    rt.block_on(async {
        for fraction in COLD_LINES {
            // The nearest line at or after the fraction with text to type.
            let mut n = ((lines.len() as f64) * fraction) as usize;
            while n < lines.len() && lines[n].trim().is_empty() {
                n += 1;
            }
            let Some(line) = lines.get(n) else { continue };
            let start: usize = lines[..n].iter().map(|l| l.len()).sum();
            let indent = line.len() - line.trim_start().len();
            let cursor = start + indent;
            let end = start + line.trim_end_matches(['\n', '\r']).len();
            let opened = format!("{}{}", &text[..cursor], &text[end..]);
            let first = line.trim_start().chars().next().unwrap_or('x');
            let typed = format!("{}{first}{}", &text[..cursor], &text[end..]);
            for how in [Warm::Focus, Warm::End, Warm::None] {
                // Another file's request empties the cache of this one.
                crate::tab_session::flush(local).await?;
                let doc = format!("{name}#{n}#{how:?}");
                match how {
                    Warm::Focus => {
                        completer.warm(&opened, cursor, Some(name), &[]).await;
                    }
                    Warm::End => {
                        completer.warm(&opened, opened.len(), Some(name), &[]).await;
                    }
                    Warm::None => {}
                }
                tokio::time::sleep(pause).await;
                let before = local.stats();
                let s = completer.suggest(&doc, &typed, cursor + first.len_utf8(), Some(name), &[]).await?;
                let after = local.stats();
                let read = (after.prompt_tokens - before.prompt_tokens) - (after.reused_tokens - before.reused_tokens);
                let label = match how {
                    Warm::Focus => "focus",
                    Warm::End => "no focus",
                    Warm::None => "no warm",
                };
                println!(
                    "  line {:>3} {label:<8} first suggestion {:>6.0} ms, prompt tokens read then {read}",
                    n + 1,
                    s.total_ms
                );
                let (ms, total) = match how {
                    Warm::Focus => (&mut warm_ms, &mut warm_read),
                    Warm::End => (&mut plain_ms, &mut plain_read),
                    Warm::None => (&mut cold_ms, &mut cold_read),
                };
                ms.push(s.total_ms);
                *total += read;
            }
        }
        anyhow::Ok(())
    })?;
    for v in [&mut warm_ms, &mut cold_ms, &mut plain_ms] {
        v.sort_by(f64::total_cmp);
    }
    let n = warm_ms.len().max(1) as u64;
    println!(
        "  first suggestion, warmed on open: p50 {:.0} ms, max {:.0} ms, prompt tokens read at the request {:.0} on average",
        percentile(&warm_ms, 0.5),
        percentile(&warm_ms, 1.0),
        warm_read as f64 / n as f64
    );
    println!(
        "  first suggestion, plain LSP client (warmed for the end): p50 {:.0} ms, max {:.0} ms, prompt tokens read at the request {:.0} on average",
        percentile(&plain_ms, 0.5),
        percentile(&plain_ms, 1.0),
        plain_read as f64 / n as f64
    );
    println!(
        "  first suggestion, not warmed:     p50 {:.0} ms, max {:.0} ms, prompt tokens read at the request {:.0} on average",
        percentile(&cold_ms, 0.5),
        percentile(&cold_ms, 1.0),
        cold_read as f64 / n as f64
    );
    Ok(ExitCode::SUCCESS)
}

/// Which warm-up a cold-file try gets.
#[derive(Debug, Clone, Copy)]
enum Warm {
    /// At the cursor (`caret/focus`).
    Focus,
    /// For the file's end (`didOpen` alone).
    End,
    /// None.
    None,
}
