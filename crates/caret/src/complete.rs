//! Tab completion at a cursor: `caret complete FILE --line L --column C`, and the
//! [`Completer`] that `caret lsp` and the server's `/v1/complete` share.
//!
//! A keystroke's suggestion: the typed-ahead cache first (no request at all); else the
//! context within the budget, the family's fill-in-the-middle prompt, and the model's stream
//! cut by the stop rules — the stream is dropped the moment the suggestion is complete, which
//! stops generation (the local engine checks for a closed stream between tokens).

use std::process::ExitCode;

use anyhow::Context as _;
use caret_complete::context::Budget;

use caret_host::config::Config;
use caret_host::runtime::runtime;

#[derive(Debug, clap::Args)]
pub struct CompleteArgs {
    /// The file.
    file: std::path::PathBuf,
    /// Cursor line, 1-based.
    #[arg(long)]
    line: usize,
    /// Cursor column, 1-based, in characters (default: the end of the line).
    #[arg(long)]
    column: Option<usize>,
    /// Model alias (default: `tab`, else the first configured).
    #[arg(long, short)]
    model: Option<String>,
    /// Fill-in-the-middle format: qwen-coder, star-coder2, deep-seek-coder, code-llama, or
    /// none (prefix only); default: guessed from the model's name.
    #[arg(long)]
    family: Option<String>,
    /// Context budget in tokens.
    #[arg(long, default_value_t = Budget::default().tokens)]
    budget: usize,
    /// Print JSON (suggestion, mode, timings).
    #[arg(long)]
    json: bool,
    /// Use this server's gateway instead of the embedded one (env CARET_SERVER).
    #[arg(long, env = "CARET_SERVER")]
    server: Option<String>,
    /// API token for --server (env CARET_TOKEN).
    #[arg(long, env = "CARET_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// Byte offset of a 1-based line and character column (clamped to the line).
fn offset_of(text: &str, line: usize, column: Option<usize>) -> anyhow::Result<usize> {
    let mut start = 0;
    for _ in 1..line.max(1) {
        let nl = text[start..].find('\n').with_context(|| format!("the file has fewer than {line} lines"))?;
        start += nl + 1;
    }
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line_text = text[start..end].trim_end_matches('\r');
    Ok(match column {
        Some(c) => start + line_text.char_indices().nth(c.saturating_sub(1)).map_or(line_text.len(), |(i, _)| i),
        None => start + line_text.len(),
    })
}

pub fn run(config: &Config, args: CompleteArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let cursor = offset_of(&text, args.line, args.column)?;
    let budget = Budget { tokens: args.budget, ..Budget::default() };
    let completer = caret_host::completer::connect(
        config,
        args.server.as_deref(),
        args.token.as_deref(),
        args.model.as_deref(),
        args.family.as_deref(),
        budget,
    )?
    .context(
        "no models are configured: add [[models]] to the config (a `tab` alias is used first; for a local \
                 model, `caret models pull qwen2.5-coder-1.5b-instruct-q4`), or use --server",
    )?;
    let path = args.file.file_name().and_then(|n| n.to_str()).map(str::to_owned);
    let doc = args.file.display().to_string();
    let s = runtime()?
        .block_on(completer.suggest(&doc, &text, cursor, path.as_deref(), &[]))
        .with_context(|| format!("completing with model {}", completer.model()))?;
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!("{}", s.text);
        eprintln!(
            "{} ({}), first text {:.0} ms, done {:.0} ms",
            completer.model(),
            if s.multiline { "multi-line" } else { "single line" },
            s.first_text_ms,
            s.total_ms
        );
    }
    Ok(ExitCode::SUCCESS)
}
