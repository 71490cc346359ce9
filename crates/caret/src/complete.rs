//! Tab completion at a cursor: `caret complete FILE --line L --column C`, and the
//! [`Completer`] that `caret lsp` and the server's `/v1/complete` share.
//!
//! A keystroke's suggestion: the typed-ahead cache first (no request at all); else the
//! context within the budget, the family's fill-in-the-middle prompt, and the model's stream
//! cut by the stop rules — the stream is dropped the moment the suggestion is complete, which
//! stops generation (the local engine checks for a closed stream between tokens).

use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use caret_complete::context::{Budget, Snippet, approx_tokens, assemble};
use caret_complete::post::{Mode, Stopper, mode};
use caret_complete::{Cache, Family};
use caret_models::Event;
use caret_protocol::llm::CompletionRequest;
use futures::StreamExt as _;

use crate::chat::Backend;
use crate::config::Config;
use crate::server::runtime;

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

/// One suggestion.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Suggestion {
    /// The text to insert at the cursor.
    pub text: String,
    /// Single-line or multi-line.
    pub multiline: bool,
    /// Served by the typed-ahead cache, without a request.
    pub cached: bool,
    /// From the call to the first streamed text (0 when cached).
    pub first_text_ms: f64,
    /// From the call to the suggestion.
    pub total_ms: f64,
    /// Tokens the model generated before it was stopped.
    pub generated_chunks: usize,
}

/// Suggestions for one model, with the typed-ahead cache.
pub struct Completer {
    backend: Backend,
    model: String,
    family: Option<Family>,
    budget: Budget,
    cache: Mutex<Cache>,
    /// Most tokens a single-line / multi-line suggestion may take.
    max_tokens: (u32, u32),
}

impl Completer {
    /// A completer for `model` on `backend`; `family`: the FIM format (`None`: the model only
    /// continues the prefix).
    pub fn new(backend: Backend, model: String, family: Option<Family>, budget: Budget) -> Completer {
        Completer { backend, model, family, budget, cache: Mutex::new(Cache::default()), max_tokens: (48, 160) }
    }

    /// The model alias.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The suggestion for a cursor at byte `cursor` of document `doc` (whose text is `text`).
    pub async fn suggest(
        &self,
        doc: &str,
        text: &str,
        cursor: usize,
        path: Option<&str>,
        snippets: &[Snippet],
    ) -> caret_models::Result<Suggestion> {
        let started = Instant::now();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut cursor = cursor.min(text.len());
        while !text.is_char_boundary(cursor) {
            cursor -= 1;
        }
        let (before, after) = text.split_at(cursor);
        let m = mode(before, after);
        let cached = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(doc, before, after);
        if let Some(rest) = cached {
            return Ok(Suggestion {
                text: rest,
                multiline: m == Mode::MultiLine,
                cached: true,
                first_text_ms: 0.0,
                total_ms: ms(started.elapsed()),
                generated_chunks: 0,
            });
        }
        let ctx = assemble(text, cursor, path, snippets, self.budget, &approx_tokens);
        let (prompt, stops) = match &self.family {
            Some(f) => (f.render(&ctx), f.stop()),
            None => (ctx.prefix.clone(), Vec::new()),
        };
        let max_tokens = if m == Mode::MultiLine { self.max_tokens.1 } else { self.max_tokens.0 };
        let req = CompletionRequest::greedy(self.model.clone(), prompt, max_tokens);
        let mut stopper = Stopper::new(m, &ctx.prefix, &ctx.suffix, stops);
        let mut stream = self.backend.complete(req).await?;
        let (mut first, mut chunks) = (None, 0);
        while let Some(event) = stream.next().await {
            if let Event::Text(t) = event? {
                first.get_or_insert_with(|| started.elapsed());
                chunks += 1;
                if stopper.push(&t) {
                    break;
                }
            }
        }
        // Dropping the stream here stops the model when the suggestion ended early.
        drop(stream);
        let text = stopper.finish();
        self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).put(doc, before, after, &text);
        let total = started.elapsed();
        Ok(Suggestion {
            text,
            multiline: m == Mode::MultiLine,
            cached: false,
            first_text_ms: ms(first.unwrap_or(total)),
            total_ms: ms(total),
            generated_chunks: chunks,
        })
    }
}

/// The family named by `--family`, or guessed from the alias and its deployments' models.
pub fn family(config: &Config, model: &str, named: Option<&str>) -> anyhow::Result<Option<Family>> {
    if let Some(name) = named {
        return match name {
            "none" => Ok(None),
            other => serde_json::from_value(serde_json::Value::String(other.to_owned())).map(Some).with_context(|| {
                format!("--family: qwen-coder, star-coder2, deep-seek-coder, code-llama or none, not {other:?}")
            }),
        };
    }
    let deployments = config.models.iter().filter(|m| m.alias == model).flat_map(|m| &m.deployments);
    Ok(Family::guess(model).or_else(|| deployments.filter_map(|d| Family::guess(&d.model)).next()))
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
    let (backend, model) = Backend::connect(
        config,
        args.server.as_deref(),
        args.token.as_deref(),
        args.model.as_deref(),
        &["tab"],
        "tab",
    )?
    .context(
        "no models are configured: add [[models]] to the config (a `tab` alias is used first; for a local \
                 model, `caret models pull qwen2.5-coder-1.5b-instruct-q4`), or use --server",
    )?;
    let family = family(config, &model, args.family.as_deref())?;
    let budget = Budget { tokens: args.budget, ..Budget::default() };
    let completer = Completer::new(backend, model, family, budget);
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
