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
use caret_complete::context::{Budget, Snippet};
use caret_complete::engine::{family, run_plan};
use caret_complete::plan::window;
use caret_complete::post::{Mode, mode};
use caret_complete::{Cache, Family, Limits};
use caret_protocol::complete::{CompleteRequest, CompleteResponse, TabSnippet};

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

/// Where suggestions come from.
pub enum Source {
    /// A model on a gateway (the embedded one, or a server's `/v1/completions`), with the
    /// engine here.
    Model {
        /// The gateway.
        backend: Backend,
        /// The fill-in-the-middle format (`None`: the model only continues the prefix).
        family: Option<Family>,
    },
    /// A server's `/v1/complete`: its engine and models; this end sends the document's window
    /// around the cursor.
    Remote {
        /// HTTP client.
        client: reqwest::Client,
        /// The server's base URL.
        url: String,
        /// API token.
        token: String,
        /// The family asked for, when set.
        family: Option<String>,
    },
}

/// Suggestions for one model, with the typed-ahead cache.
pub struct Completer {
    source: Source,
    model: String,
    budget: Budget,
    cache: Mutex<Cache>,
    /// The model runs in this process (see [`Completer::warm`]).
    local: bool,
}

impl Completer {
    /// A completer for `model` from `source`.
    pub fn new(source: Source, model: String, budget: Budget) -> Completer {
        Completer { source, model, budget, cache: Mutex::new(Cache::default()), local: false }
    }

    /// Says whether the model runs in this process, where [`Completer::warm`] helps.
    pub fn set_local(&mut self, local: bool) {
        self.local = local;
    }

    /// Warms the model's cache for a cursor at byte `cursor` of `text`: the prompt a
    /// suggestion there would read is sent as a warm-up (`max_tokens: 0`), which the local
    /// engine reads in the background in small batches and any real request pre-empts — so
    /// the first suggestion in a file opened a moment ago costs only what changed since.
    /// Nothing for a model elsewhere (a server's, or a remote upstream's). Returns whether a
    /// warm-up was sent.
    pub async fn warm(&self, text: &str, cursor: usize, path: Option<&str>, snippets: &[Snippet]) -> bool {
        let Source::Model { backend, family } = &self.source else { return false };
        if !self.local {
            return false;
        }
        let cursor = caret_complete::plan::floor_boundary(text, cursor);
        let plan = |text: &str, cursor| {
            caret_complete::plan(text, cursor, path, snippets, self.budget, family.as_ref(), Limits::default()).prompt
        };
        // On a blank line the request comes after the first character is typed, and then the
        // line starts the middle (see `caret_complete::plan`): warm that prompt, without the
        // character.
        let line = &text[text[..cursor].rfind('\n').map_or(0, |i| i + 1)..cursor];
        let prompt = if line.trim().is_empty() {
            let typed = format!("{}{TYPED}{}", &text[..cursor], &text[cursor..]);
            match plan(&typed, cursor + TYPED.len()).strip_suffix(TYPED) {
                Some(p) => p.to_owned(),
                None => plan(text, cursor),
            }
        } else {
            plan(text, cursor)
        };
        let req = caret_protocol::llm::CompletionRequest::greedy(self.model.clone(), prompt, 0);
        match backend.complete(req).await {
            Ok(stream) => {
                drop(stream);
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "warm-up not taken");
                false
            }
        }
    }

    /// Uses a custom fill-in-the-middle template (the engine here only: a server's engine
    /// uses its own).
    pub fn set_template(&mut self, template: caret_complete::Template) -> anyhow::Result<()> {
        match &mut self.source {
            Source::Model { family, .. } => {
                *family = Some(Family::Custom(template));
                Ok(())
            }
            Source::Remote { .. } => anyhow::bail!("a custom template needs the embedded engine (not --server)"),
        }
    }

    /// The model alias.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The typed-ahead cache's suggestion for a cursor at byte `cursor` of document `doc`, if
    /// it has one.
    pub fn cached(&self, doc: &str, text: &str, cursor: usize) -> Option<Suggestion> {
        let started = Instant::now();
        let cursor = caret_complete::plan::floor_boundary(text, cursor);
        let (before, after) = text.split_at(cursor);
        let rest = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(doc, before, after)?;
        Some(Suggestion {
            text: rest,
            multiline: mode(before, after) == Mode::MultiLine,
            cached: true,
            first_text_ms: 0.0,
            total_ms: ms(started.elapsed()),
            generated_chunks: 0,
        })
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
        if let Some(hit) = self.cached(doc, text, cursor) {
            return Ok(hit);
        }
        let cursor = caret_complete::plan::floor_boundary(text, cursor);
        let (before, after) = text.split_at(cursor);
        let (text_out, multiline, first, chunks) = match &self.source {
            Source::Model { backend, family } => {
                let plan =
                    caret_complete::plan(text, cursor, path, snippets, self.budget, family.as_ref(), Limits::default());
                let multiline = plan.mode == Mode::MultiLine;
                let out = run_plan(plan, family.as_ref(), &self.model, started, |req| backend.complete(req)).await?;
                (out.text, multiline, out.first, out.chunks)
            }
            Source::Remote { client, url, token, family } => {
                let w = window(text, cursor, self.budget);
                let req = CompleteRequest {
                    text: text[w.clone()].to_owned(),
                    cursor: cursor - w.start,
                    path: path.map(str::to_owned),
                    snippets: snippets
                        .iter()
                        .map(|s| TabSnippet { path: s.path.clone(), text: s.text.clone() })
                        .collect(),
                    model: Some(self.model.clone()),
                    family: family.clone(),
                    budget: Some(self.budget.tokens),
                };
                let r = remote(client, url, token, &req).await?;
                let first = Duration::from_secs_f64(r.first_text_ms / 1e3);
                (r.text, r.multiline, Some(first), r.generated_chunks)
            }
        };
        self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).put(doc, before, after, &text_out);
        let total = started.elapsed();
        Ok(Suggestion {
            text: text_out,
            multiline,
            cached: false,
            first_text_ms: ms(first.unwrap_or(total)),
            total_ms: ms(total),
            generated_chunks: chunks,
        })
    }
}

/// The character a warm-up supposes typed on a blank line.
const TYPED: &str = "x";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `POST /v1/complete` on a server. Dropping the future closes the connection, which drops
/// the server's handler and with it the model's stream.
async fn remote(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    req: &CompleteRequest,
) -> caret_models::Result<CompleteResponse> {
    use caret_models::Error;
    let endpoint = format!("{}/v1/complete", url.trim_end_matches('/'));
    let io = |e: reqwest::Error| Error::Upstream { upstream: endpoint.clone(), status: None, message: e.to_string() };
    let resp = client.post(&endpoint).bearer_auth(token).json(req).send().await.map_err(io)?;
    let status = resp.status();
    let body = resp.text().await.map_err(io)?;
    if !status.is_success() {
        let message = serde_json::from_str::<caret_protocol::ErrorBody>(&body).map_or(body, |b| b.error.message);
        let status = status.as_u16();
        return Err(match status {
            429 => Error::RateLimited { upstream: endpoint, retry_after: None },
            400..=499 => Error::Rejected { upstream: endpoint, status, message },
            _ => Error::Upstream { upstream: endpoint, status: Some(status), message },
        });
    }
    serde_json::from_str(&body).map_err(|e| Error::Upstream {
        upstream: endpoint,
        status: Some(status.as_u16()),
        message: format!("a malformed answer: {e}"),
    })
}

/// Where `caret complete` and `caret lsp` get suggestions: a server's `/v1/complete` when
/// `server` is given, else the embedded gateway; `None` without models.
pub fn connect(
    config: &Config,
    server: Option<&str>,
    token: Option<&str>,
    model: Option<&str>,
    family_name: Option<&str>,
    budget: Budget,
) -> anyhow::Result<Option<Completer>> {
    if let Some(url) = server {
        let token = token.context("--server needs an API token: --token or CARET_TOKEN")?;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .context("building the HTTP client")?;
        let source = Source::Remote {
            client,
            url: url.to_owned(),
            token: token.to_owned(),
            family: family_name.map(str::to_owned),
        };
        return Ok(Some(Completer::new(source, model.unwrap_or("tab").to_owned(), budget)));
    }
    let Some((backend, model)) = Backend::connect(config, None, None, model, &["tab"], "tab")? else { return Ok(None) };
    with_backend(config, backend, model, family_name, budget).map(Some)
}

/// A completer on `backend` (a gateway in this process, configured by `config`) for alias
/// `model`.
pub(crate) fn with_backend(
    config: &Config,
    backend: Backend,
    model: String,
    family_name: Option<&str>,
    budget: Budget,
) -> anyhow::Result<Completer> {
    let models: Vec<String> = config
        .models
        .iter()
        .filter(|m| m.alias == model)
        .flat_map(|m| &m.deployments)
        .map(|d| d.model.clone())
        .collect();
    let family = family(family_name, &model, &models).map_err(|e| anyhow::anyhow!("--{e}"))?;
    let kinds: Vec<_> =
        config.models.iter().filter(|m| m.alias == model).flat_map(|m| &m.deployments).map(|d| d.provider).collect();
    let local = !kinds.is_empty() && kinds.iter().all(|k| *k == crate::config::ProviderKind::Local);
    let mut completer = Completer::new(Source::Model { backend, family }, model, budget);
    completer.set_local(local);
    Ok(completer)
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
    let completer = connect(
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
