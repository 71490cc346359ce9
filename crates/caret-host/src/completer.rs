//! Tab suggestions for a front end: the typed-ahead cache first (no request at all); else the
//! context within the budget, the family's fill-in-the-middle prompt, and the model's stream
//! cut by the stop rules (`caret_complete::engine`) — or a server's `/v1/complete`, which runs
//! the same engine next to its models.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use caret_complete::context::{Budget, Snippet};
use caret_complete::engine::{family, run_plan};
use caret_complete::plan::window;
use caret_complete::post::{Mode, mode};
use caret_complete::{Cache, Family, Limits};
use caret_protocol::complete::{CompleteRequest, CompleteResponse, TabSnippet};

use crate::backend::Backend;
use crate::config::Config;

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

/// The alias a model trained for next edits is served under.
pub const NEXT_EDIT_ALIAS: &str = "next-edit";

/// Tab's model served elsewhere is asked for next edits while its calls take at most this
/// long (unless `[tab] next_edit_budget_ms` says otherwise).
pub const REMOTE_NEXT_EDIT_BUDGET: Duration = Duration::from_secs(3);

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
    /// When the model may be asked for a next edit.
    next_edits: NextEditGate,
}

/// When a model may be asked for a next edit: always (one trained for it, the `next-edit`
/// alias), never, or while the median of its last calls on this machine stays under a budget
/// (`[tab] next_edit_budget_ms`). Over it, one call again every [`NextEditGate::REPROBE`]:
/// the machine may be idle by then.
#[derive(Debug)]
pub struct NextEditGate {
    rule: Rule,
    recent: Mutex<std::collections::VecDeque<Duration>>,
    probed: Mutex<Option<Instant>>,
}

#[derive(Debug, Clone, Copy)]
enum Rule {
    Always,
    Never,
    Under(Duration),
}

impl NextEditGate {
    /// How often a model over budget is tried again.
    pub const REPROBE: Duration = Duration::from_secs(600);
    /// Calls the median is taken over.
    const KEPT: usize = 8;

    /// Always open.
    pub fn always() -> NextEditGate {
        NextEditGate { rule: Rule::Always, recent: Mutex::default(), probed: Mutex::new(None) }
    }

    /// Open under `budget` (`None` or zero: never).
    pub fn under(budget: Option<Duration>) -> NextEditGate {
        let rule = budget.filter(|b| !b.is_zero()).map_or(Rule::Never, Rule::Under);
        NextEditGate { rule, ..NextEditGate::always() }
    }

    /// Whether a call may be made now (a probe over budget counts as made).
    pub fn open(&self) -> bool {
        let budget = match self.rule {
            Rule::Always => return true,
            Rule::Never => return false,
            Rule::Under(b) => b,
        };
        let mut recent: Vec<Duration> =
            self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().copied().collect();
        recent.sort_unstable();
        let mut probed = self.probed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let within = recent.get(recent.len() / 2).is_none_or(|median| *median <= budget);
        if !within && probed.is_some_and(|at| at.elapsed() < Self::REPROBE) {
            return false;
        }
        // Every call let through is the last probe: over budget, the next one waits.
        *probed = Some(Instant::now());
        true
    }

    /// A call that finished, and how long it took.
    pub fn record(&self, took: Duration) {
        let mut recent = self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if recent.len() == Self::KEPT {
            recent.pop_front();
        }
        recent.push_back(took);
    }
}

impl Completer {
    /// A completer for `model` from `source`, asked for next edits whenever a caller wants.
    pub fn new(source: Source, model: String, budget: Budget) -> Completer {
        Completer {
            source,
            model,
            budget,
            cache: Mutex::new(Cache::default()),
            local: false,
            next_edits: NextEditGate::always(),
        }
    }

    /// Sets when the model may be asked for next edits.
    pub fn set_next_edits(&mut self, gate: NextEditGate) {
        self.next_edits = gate;
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

    /// A greedy text completion of `prompt` by Tab's model, up to `stop` (next-edit prompts),
    /// and whether it ended there (or naturally) rather than at the token limit; `None` when
    /// the model is a server's `/v1/complete`, which takes no free prompt.
    pub async fn continue_prompt(
        &self,
        prompt: String,
        max_tokens: u32,
        stop: &str,
    ) -> Option<anyhow::Result<(String, bool)>> {
        let Source::Model { backend, .. } = &self.source else { return None };
        let mut req = caret_protocol::llm::CompletionRequest::greedy(self.model.clone(), prompt, max_tokens);
        req.stop = Some(caret_protocol::llm::Stop::One(stop.to_owned()));
        Some(backend.complete_text(req).await.map_err(anyhow::Error::from))
    }

    /// A completer on the same gateway for its [`NEXT_EDIT_ALIAS`] model, when it has one (a
    /// model trained for next edits, served anywhere): next edits go there, and it ranks the
    /// rules' candidates, instead of Tab's model.
    pub fn next_edit_model(&self) -> Option<Completer> {
        let Source::Model { backend: Backend::Embedded { gateway, tenant }, family } = &self.source else {
            return None;
        };
        if self.model == NEXT_EDIT_ALIAS || !gateway.aliases().iter().any(|a| a == NEXT_EDIT_ALIAS) {
            return None;
        }
        let backend = Backend::Embedded { gateway: gateway.clone(), tenant: tenant.clone() };
        Some(Completer::new(Source::Model { backend, family: family.clone() }, NEXT_EDIT_ALIAS.to_owned(), self.budget))
    }

    /// The model's turn at the next edit: the region around byte `cursor` of `text` rewritten
    /// after the recent `edits` (a Zeta-shaped prompt, see `caret_complete::next_edit`), the
    /// difference as the predicted edit of document `doc` (`path`: its name in the prompt).
    /// `None` when the model predicts nothing, stops at its token limit (a cut rewrite would
    /// delete the region's rest) or takes no free prompt (a server's `/v1/complete`).
    pub async fn next_edit<'a>(
        &self,
        edits: impl Iterator<Item = &'a caret_complete::next_edit::Edit>,
        doc: &str,
        path: &str,
        text: &str,
        cursor: usize,
    ) -> anyhow::Result<Option<caret_complete::next_edit::Prediction>> {
        use caret_complete::next_edit as ne;
        if !self.next_edits.open() {
            return Ok(None);
        }
        let region = ne::region(text, cursor, 3, 12);
        let prompt = ne::prompt(edits, path, text, cursor, region, 8);
        let started = Instant::now();
        let answer = self.continue_prompt(prompt, 400, ne::REGION_END).await;
        if matches!(answer, Some(Ok(_))) {
            self.next_edits.record(started.elapsed());
        }
        match answer {
            Some(Ok((mut out, true))) => {
                out.push_str(ne::REGION_END);
                Ok(ne::parse(&out).and_then(|rewritten| ne::region_edit(doc, text, region, &rewritten)))
            }
            Some(Err(e)) => Err(e),
            _ => Ok(None),
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
    #[tracing::instrument(name = "tab", skip_all)]
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
pub fn with_backend(
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
    // A model in this process runs on this machine's CPU: seconds of every core for a guess
    // it was not trained to make, unless the user set a budget.
    let budget = match config.tab.next_edit_budget_ms {
        Some(ms) => Some(Duration::from_millis(ms)),
        None if local => None,
        None => Some(REMOTE_NEXT_EDIT_BUDGET),
    };
    completer.set_next_edits(NextEditGate::under(budget));
    Ok(completer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_next_edit_gate_opens_under_its_budget_only() {
        assert!(NextEditGate::always().open());
        assert!(!NextEditGate::under(None).open(), "no budget: never");
        assert!(!NextEditGate::under(Some(Duration::ZERO)).open(), "zero: never");

        let gate = NextEditGate::under(Some(Duration::from_millis(500)));
        assert!(gate.open(), "nothing measured yet: the first call measures");
        gate.record(Duration::from_millis(200));
        assert!(gate.open() && gate.open(), "under budget: open");
        for _ in 0..NextEditGate::KEPT {
            gate.record(Duration::from_secs(18));
        }
        assert!(!gate.open(), "over budget: closed until the next probe is due");
        assert!(!gate.open());
        // Faster again (the probe measured it): the median comes back under the budget.
        for _ in 0..NextEditGate::KEPT / 2 + 1 {
            gate.record(Duration::from_millis(100));
        }
        assert!(gate.open());
    }
}
