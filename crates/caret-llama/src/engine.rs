//! The engine thread: owns the model and one context, takes jobs in order, reuses the KV
//! cache's tokens shared with the previous prompt, decodes (with speculative drafts from a
//! predicted output), samples, and streams events back; warm-ups run in small batches that
//! any real request pre-empts.

use caret_models::{Error, Event, Result};
use caret_protocol::llm::{CompletionTokensDetails, FinishReason, TokenLogprob, Usage};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::vocab::LlamaVocab;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::draft::{DraftLengths, Drafter};
use crate::output::{StopScan, ToolCallParser, Utf8Joiner};
use crate::prompt::{ChatFormat, Piece};
use crate::{COMPUTE, Counters, Input, Job, KeyCache, LlamaSettings, ModelInfo, WARM_CHUNK, Waiting, backend};

/// The engine thread: loads the model, answers `ready`, then serves jobs until the provider
/// is dropped.
pub(crate) fn run(
    file: &PathBuf,
    settings: &LlamaSettings,
    ready: &std::sync::mpsc::Sender<std::result::Result<ModelInfo, String>>,
    queue: &std::sync::mpsc::Receiver<Job>,
    counters: &Counters,
    waiting: &Waiting,
) {
    let loaded = (|| {
        let backend = backend()?;
        let mut model_params = std::pin::pin!(LlamaModelParams::default());
        if settings.exact_kernels {
            // Every tensor in the plain CPU buffer: no repacking.
            model_params.as_mut().add_cpu_buft_override(c".");
        }
        let model = LlamaModel::load_from_file(backend, file, &model_params)
            .map_err(|e| format!("loading {}: {e} (is it a GGUF file?)", file.display()))?;
        Ok::<_, String>((backend, model))
    })();
    let (backend, model) = match loaded {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let context_tokens = settings.context_tokens.clamp(256, model.n_ctx_train().max(256));
    let threads = settings
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get))
        .max(1);
    let batch_tokens = settings.batch_tokens.clamp(16, context_tokens);
    let threads_i32 = i32::try_from(threads).unwrap_or(i32::MAX);
    let flash_attention = match std::env::var("CARET_FLASH_ATTN").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => settings.flash_attention,
    };
    let mut key_cache =
        std::env::var("CARET_KEY_CACHE").ok().and_then(|v| KeyCache::from_name(&v)).unwrap_or(settings.key_cache);
    let key_length = key_length(&model);
    if !key_cache.fits(key_length) {
        tracing::info!(key_length, "attention keys are not a multiple of 32 values long: cached as f16");
        key_cache = KeyCache::F16;
    }
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(context_tokens))
        .with_n_batch(batch_tokens)
        .with_n_ubatch(batch_tokens)
        // Two sequences in one window: the active context and a spare (see `Engine::choose`).
        .with_n_seq_max(2)
        .with_kv_unified(true)
        .with_n_threads(threads_i32)
        .with_n_threads_batch(threads_i32)
        .with_flash_attention_policy(i32::from(flash_attention))
        .with_type_k(match key_cache {
            KeyCache::F16 => KvCacheType::F16,
            KeyCache::Q8_0 => KvCacheType::Q8_0,
        });
    let mut ctx = match model.new_context(backend, params) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(format!("creating a context of {context_tokens} tokens: {e}")));
            return;
        }
    };
    let template = model.chat_template(None).ok().and_then(|t| t.to_string().ok());
    let vocab = model.vocab();
    let fim = [vocab.fim_pre(), vocab.fim_suf(), vocab.fim_mid()].iter().all(|t| t.0 >= 0);
    let info = ModelInfo {
        context_tokens,
        threads,
        chat: ChatFormat::from_template(template.as_deref()),
        fim,
        flash_attention,
        key_cache,
    };
    tracing::info!(
        model = %file.display(), context_tokens, threads, fim, flash_attention, key_cache = key_cache.name(),
        "local model loaded"
    );
    if ready.send(Ok(info)).is_err() {
        return;
    }
    let step = batch_tokens as usize;
    let mut engine = Engine {
        model: &model,
        active: 0,
        cached: Vec::new(),
        exact: 0,
        spare: Vec::new(),
        spare_exact: 0,
        batch: LlamaBatch::new(step, 1),
        step,
        lengths: draft_lengths(),
    };
    while let Ok(job) = queue.recv() {
        match job.warm {
            Some(n) => {
                if !waiting.supersedes(n)
                    && let Err(e) = engine.warm(&mut ctx, &job, waiting, n, counters)
                {
                    tracing::debug!(error = %e, "warm-up failed");
                    ctx.clear_kv_cache();
                    engine.forget();
                }
                continue;
            }
            None => {
                waiting.requests.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let events = job.events.clone();
        if let Err(e) = engine.serve(&mut ctx, job, counters) {
            if !events.is_closed() {
                tracing::warn!(error = %e, "local model request failed");
            }
            // The cache may hold half a batch: start clean next time (a request refused
            // before it was read touched nothing).
            if !matches!(e, Error::BadRequest(_)) {
                ctx.clear_kv_cache();
                engine.forget();
            }
            let _ = events.blocking_send(Err(e));
        }
    }
}

pub(crate) struct Engine<'m> {
    model: &'m LlamaModel,
    /// The KV cache's sequence requests read and write (0 or 1).
    active: i32,
    /// The tokens whose keys and values are in the active sequence, in order from position 0.
    cached: Vec<LlamaToken>,
    /// How many of them were read in whole [`EXACT_CHUNK`]s from position 0, as a seeded
    /// request reads its prompt.
    exact: usize,
    /// The other sequence's tokens: the context kept aside when a prompt unlike it came.
    spare: Vec<LlamaToken>,
    /// The other sequence's `exact`.
    spare_exact: usize,
    batch: LlamaBatch<'static>,
    /// The batch's capacity.
    step: usize,
    /// How many drafted tokens to verify per pass.
    lengths: DraftLengths,
}

/// Tokens a prompt must share more with the spare context to switch to it, or discard of
/// the active one to keep that one aside.
const SWITCH_MIN: usize = 32;

/// The batch a seeded request reads its prompt in, from a multiple of it. A batch's rounding
/// depends on its size and its start, so a seeded prompt is read in the same batches whatever
/// the cache held before (reusing only what earlier seeded requests read so): its answer is
/// the same on a fresh engine as on a busy one.
pub(crate) const EXACT_CHUNK: usize = 64;

/// Draft lengths of prompt lookup: short (a completion is a few lines; a missed draft costs a
/// wider pass).
pub(crate) const LOOKUP_LENGTHS: DraftLengths = DraftLengths { start: 4, min: 2, max: 16 };

/// Values in one attention head's key: the file's `<arch>.attention.key_length`, else the
/// embedding split over the heads.
pub(crate) fn key_length(model: &LlamaModel) -> u32 {
    let declared = model
        .meta_val_str("general.architecture")
        .ok()
        .and_then(|arch| model.meta_val_str(&format!("{arch}.attention.key_length")).ok())
        .and_then(|v| v.trim().parse().ok());
    declared.unwrap_or_else(|| u32::try_from(model.n_embd()).unwrap_or(0) / model.n_head().max(1))
}

/// Draft lengths, `CARET_DRAFT_LENGTHS=start,min,max` overriding the defaults (for tuning
/// with `caret bench merge`).
pub(crate) fn draft_lengths() -> DraftLengths {
    let parsed = std::env::var("CARET_DRAFT_LENGTHS").ok().and_then(|v| {
        let n: Vec<usize> = v.split(',').map(|x| x.trim().parse().ok()).collect::<Option<_>>()?;
        match n[..] {
            [start, min, max] if min >= 1 && min <= start && start <= max => Some(DraftLengths { start, min, max }),
            _ => None,
        }
    });
    parsed.unwrap_or_default()
}

pub(crate) fn failed(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Upstream { upstream: "local model".to_owned(), status: None, message: format!("{what}: {e}") }
}

/// Logit lead under which a greedy pick made in a verification batch is made again alone:
/// batch and single-token evaluation differ by small rounding, which decides only near-ties;
/// each such position costs one single-token step.
pub(crate) const TIE_MARGIN: f32 = 0.25;

/// Whether the two best logits are within [`TIE_MARGIN`].
pub(crate) fn near_tie(logits: &[f32]) -> bool {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &l in logits {
        if l > first {
            second = first;
            first = l;
        } else if l > second {
            second = l;
        }
    }
    first - second < TIE_MARGIN
}

/// The log probability of `token` under the sampling distribution of `logits` (softmax at
/// `temperature`; greedy picks are scored at temperature 1). Top-p truncation is not applied.
pub(crate) fn logprob(logits: &[f32], token: LlamaToken, temperature: f32) -> f32 {
    let t = if temperature > 0.0 { temperature } else { 1.0 };
    let Some(&picked) = usize::try_from(token.0).ok().and_then(|i| logits.get(i)) else {
        return f32::NEG_INFINITY;
    };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max) / t).exp()).sum();
    ((picked - max) / t) - sum.ln() as f32
}

/// Runs one llama.cpp computation under the process-wide lock.
pub(crate) fn decode(ctx: &mut LlamaContext<'_>, batch: &mut LlamaBatch<'_>) -> Result<()> {
    let _turn = COMPUTE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    ctx.decode(batch).map_err(|e| failed("decoding", e))
}

impl Engine<'_> {
    fn tokens(&self, input: &Input) -> Result<Vec<LlamaToken>> {
        let vocab = self.model.vocab();
        Ok(match input {
            Input::Text(text) => vocab.tokenize(text.as_bytes(), true, true),
            Input::Pieces(pieces) => {
                let n_vocab = u32::try_from(self.model.n_vocab()).unwrap_or(0);
                let mut t: Vec<LlamaToken> = Vec::new();
                for (i, piece) in pieces.iter().enumerate() {
                    match piece {
                        Piece::Text(text) => t.extend(vocab.tokenize(text.as_bytes(), i == 0, true)),
                        Piece::Sampled(ids) => {
                            if let Some(bad) = ids.iter().find(|&&id| id >= n_vocab) {
                                return Err(Error::BadRequest(format!(
                                    "token id {bad} on an assistant message is not in this model's vocabulary \
                                     ({n_vocab} tokens)"
                                )));
                            }
                            t.extend(ids.iter().map(|&id| LlamaToken(i32::try_from(id).unwrap_or(0))));
                        }
                        Piece::EndOfTurn(marker) => {
                            if !t.last().is_some_and(|&last| vocab.is_eog(last)) {
                                t.extend(vocab.tokenize(marker.as_bytes(), false, true));
                            }
                        }
                    }
                }
                t
            }
            Input::Fim { prefix, suffix } => {
                let mut t = Vec::new();
                if vocab.should_add_bos() {
                    t.push(vocab.bos());
                }
                t.push(vocab.fim_pre());
                t.extend(vocab.tokenize(prefix.as_bytes(), false, false));
                t.push(vocab.fim_suf());
                t.extend(vocab.tokenize(suffix.as_bytes(), false, false));
                t.push(vocab.fim_mid());
                t
            }
        })
    }

    /// Forgets both sequences (after the whole cache was cleared).
    fn forget(&mut self) {
        self.active = 0;
        self.cached.clear();
        self.exact = 0;
        self.spare.clear();
        self.spare_exact = 0;
    }

    /// Picks the sequence a prompt of `tokens` (then up to `room` generated) is read into. Two
    /// contexts are kept — Tab's file and a next edit's prompt, a chat and a completion — so
    /// that one does not cost the other its cache: a prompt that shares more with the spare
    /// context switches to it; one that would discard much of the active context starts on the
    /// other sequence (the shared prefix copied, no tokens read twice) and keeps the active one
    /// aside — when both fit in the window; else the spare is dropped.
    fn choose(&mut self, ctx: &mut LlamaContext<'_>, tokens: &[LlamaToken], room: usize) {
        if self.model.is_recurrent() {
            return;
        }
        let common = |c: &[LlamaToken]| c.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        let (here, there) = (common(&self.cached), common(&self.spare));
        let other = 1 - self.active;
        let window = ctx.n_ctx() as usize;
        if there > here + SWITCH_MIN {
            self.active = other;
            std::mem::swap(&mut self.cached, &mut self.spare);
            std::mem::swap(&mut self.exact, &mut self.spare_exact);
            return;
        }
        let fits = |kept: usize| kept + tokens.len().saturating_sub(here) + room <= window;
        if self.cached.len() - here >= SWITCH_MIN && fits(self.cached.len()) {
            let _ = ctx.clear_kv_cache_seq(Some(other as u32), None, None);
            if here > 0 && ctx.copy_kv_cache_seq(self.active, other, None, Some(here as u32)).is_err() {
                return;
            }
            self.spare = std::mem::replace(&mut self.cached, tokens[..here].to_vec());
            self.spare_exact = self.exact;
            self.exact = self.exact.min(here);
            self.active = other;
        } else if !self.spare.is_empty() && !fits(self.spare.len() + here) {
            let _ = ctx.clear_kv_cache_seq(Some(other as u32), None, None);
            self.spare.clear();
            self.spare_exact = 0;
        }
    }

    /// Makes the KV cache hold exactly `tokens` and leaves the last one's logits ready.
    /// Returns how many tokens were reused.
    fn prefill(&mut self, ctx: &mut LlamaContext<'_>, tokens: &[LlamaToken], job: &Job) -> Result<usize> {
        self.read(ctx, tokens, job, None).map(|(kept, _)| kept)
    }

    /// A warm-up: reads `job`'s prompt into the cache in [`WARM_CHUNK`]s until it is read
    /// or `waiting` says to stop. (The last token is left for the request, which needs its
    /// logits computed anyway.)
    fn warm(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        job: &Job,
        waiting: &Waiting,
        n: u64,
        counters: &Counters,
    ) -> Result<()> {
        let tokens = self.tokens(&job.input)?;
        if tokens.len() < 2 || tokens.len() >= ctx.n_ctx() as usize {
            return Ok(());
        }
        let started = std::time::Instant::now();
        counters.warmups.fetch_add(1, Ordering::Relaxed);
        let (kept, read) = self.read(ctx, &tokens[..tokens.len() - 1], job, Some((waiting, n)))?;
        counters.warmed_tokens.fetch_add(read as u64, Ordering::Relaxed);
        tracing::debug!(
            prompt = tokens.len(),
            kept,
            read,
            ms = started.elapsed().as_secs_f64() * 1e3,
            stopped = kept + read + 1 < tokens.len(),
            "warm-up"
        );
        Ok(())
    }

    /// Makes the KV cache hold `tokens` (or, for a warm-up told to stop, a prefix of them),
    /// leaving the last one's logits ready. Returns how many tokens were reused and how many
    /// read.
    fn read(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        tokens: &[LlamaToken],
        job: &Job,
        warm: Option<(&Waiting, u64)>,
    ) -> Result<(usize, usize)> {
        if job.seed.is_none() {
            self.choose(ctx, tokens, job.max_tokens.map_or(512, |m| m as usize));
        } else if self.active != 0 || !self.spare.is_empty() {
            // A seeded answer must not depend on what the cache held: with one sequence at
            // position 0 of the cells, as on a fresh engine (two sequences lay the cells out
            // otherwise, and attention sums them in another order).
            ctx.clear_kv_cache();
            self.forget();
        }
        // At least the last token is evaluated, for its logits.
        let mut keep =
            self.cached.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(tokens.len().saturating_sub(1));
        let seeded = job.seed.is_some();
        let chunk = if seeded {
            keep = keep.min(self.exact);
            keep -= keep % EXACT_CHUNK;
            EXACT_CHUNK.min(self.step)
        } else if warm.is_some() {
            WARM_CHUNK.min(self.step)
        } else {
            self.step
        };
        if keep < self.cached.len() {
            let from = u32::try_from(keep).unwrap_or(u32::MAX);
            if !ctx.clear_kv_cache_seq(Some(self.active as u32), Some(from), None).unwrap_or(false) {
                ctx.clear_kv_cache();
                self.spare.clear();
                self.spare_exact = 0;
                keep = 0;
            }
            self.cached.truncate(keep);
        }
        self.exact = if seeded { keep + (tokens.len() - keep) / chunk * chunk } else { self.exact.min(keep) };
        let mut read = 0;
        for chunk in tokens[keep..].chunks(chunk) {
            match warm {
                Some((waiting, n)) if waiting.supersedes(n) => break,
                Some(_) => {}
                // The caller went away: what was read stays valid (the request sees it).
                None if job.events.is_closed() => break,
                None => {}
            }
            read += chunk.len();
            self.batch.clear();
            for &t in chunk {
                let pos = self.cached.len();
                let last = pos + 1 == tokens.len();
                self.batch
                    .add(t, i32::try_from(pos).unwrap_or(i32::MAX), &[self.active], last)
                    .map_err(|e| failed("batching", e))?;
                self.cached.push(t);
            }
            decode(ctx, &mut self.batch)?;
        }
        Ok((keep, read))
    }

    /// Serves one job: prefill, then sample until an end token, a stop sequence or the limit.
    fn serve(&mut self, ctx: &mut LlamaContext<'_>, job: Job, counters: &Counters) -> Result<()> {
        let tokens = self.tokens(&job.input)?;
        let window = ctx.n_ctx() as usize;
        if tokens.is_empty() {
            return Err(Error::BadRequest("the prompt is empty".to_owned()));
        }
        if tokens.len() >= window {
            return Err(Error::BadRequest(format!(
                "the prompt is {} tokens; this model's context holds {window}",
                tokens.len()
            )));
        }
        let limit = (window - tokens.len()).min(job.max_tokens.map_or(usize::MAX, |m| m as usize));
        let reused = self.prefill(ctx, &tokens, &job)?;
        if job.events.is_closed() {
            // Gone while its prompt was read (maybe not whole): nothing to answer.
            return Ok(());
        }
        if job.token_ids {
            let ids = tokens.iter().map(|t| u32::try_from(t.0).unwrap_or(0)).collect();
            let _ = job.events.blocking_send(Ok(Event::PromptTokens(ids)));
        }
        counters.requests.fetch_add(1, Ordering::Relaxed);
        counters.prompt_tokens.fetch_add(tokens.len() as u64, Ordering::Relaxed);
        counters.reused_tokens.fetch_add(reused as u64, Ordering::Relaxed);

        let mut sampler = if job.temperature <= 0.0 {
            LlamaSampler::greedy()
        } else {
            // The sampler takes 32 bits: both halves of the seed count (a rollout puts the
            // task in the high half).
            let seed = job.seed.map_or_else(|| fastrand::u32(..), |s| (s ^ (s >> 32)) as u32);
            LlamaSampler::chain_simple([
                LlamaSampler::top_p(job.top_p, 1),
                LlamaSampler::temp(job.temperature),
                LlamaSampler::dist(seed),
            ])
        };
        let vocab = self.model.vocab();
        let mut drafter = match job.draft.as_deref().filter(|d| !d.is_empty()) {
            _ if self.model.is_recurrent() => None,
            Some(d) => Some(Drafter::new(vocab.tokenize(d.as_bytes(), false, false), tokens.clone(), self.lengths)),
            None if job.lookup => Some(Drafter::new(Vec::new(), tokens.clone(), LOOKUP_LENGTHS)),
            None => None,
        };
        let greedy = job.temperature <= 0.0;
        let mut out = Output::new(&job, limit);
        let (mut accepted_total, mut rejected_total, mut redecided) = (0usize, 0usize, 0usize);
        // The sampling log probability of a token picked from the logits at `index`.
        let logprob_of = |ctx: &LlamaContext<'_>, index: i32, token: LlamaToken| {
            if job.logprobs { logprob(ctx.get_logits_ith(index), token, job.temperature) } else { 0.0 }
        };
        let first = self.batch.n_tokens() - 1;
        let mut next = sampler.sample(ctx, first);
        let mut next_logprob = logprob_of(ctx, first, next);
        // Each pass: emit `next`, evaluate it with the drafted tokens after it, and take the
        // drafted tokens as long as they are what the sampler picks at their positions — so
        // the answer is what plain decoding would give (up to batch rounding; see `near_tie`).
        let finish = 'passes: loop {
            match out.push(&vocab, next, next_logprob) {
                Flow::More => {}
                Flow::Done(f) => break f,
                Flow::Gone => break FinishReason::Stop,
            }
            let base = self.cached.len();
            let room = window.saturating_sub(base + 1).min(self.step - 1);
            let proposal: Vec<LlamaToken> = match &mut drafter {
                Some(d) => {
                    d.advance(next);
                    d.propose(room).to_vec()
                }
                None => Vec::new(),
            };
            self.batch.clear();
            for (i, &t) in std::iter::once(&next).chain(&proposal).enumerate() {
                let pos = i32::try_from(base + i).unwrap_or(i32::MAX);
                self.batch.add(t, pos, &[self.active], true).map_err(|e| failed("batching", e))?;
            }
            decode(ctx, &mut self.batch)?;
            self.cached.push(next);
            let mut accepted = 0;
            let mut stopped = None;
            loop {
                // A greedy pick that a batch decides by a hair is decided again alone: batch
                // and single-token kernels round differently, and plain decoding — what the
                // answer must equal — evaluates one token at a time.
                if greedy && !proposal.is_empty() && near_tie(ctx.get_logits_ith(i32::try_from(accepted).unwrap_or(0)))
                {
                    let at = base + accepted;
                    let from = u32::try_from(at).unwrap_or(u32::MAX);
                    if !ctx.clear_kv_cache_seq(Some(self.active as u32), Some(from), None).unwrap_or(false) {
                        return Err(failed("speculative decoding", "the cache cannot drop rejected draft tokens"));
                    }
                    self.batch.clear();
                    let token = self.cached[at];
                    self.batch
                        .add(token, i32::try_from(at).unwrap_or(i32::MAX), &[self.active], true)
                        .map_err(|e| failed("batching", e))?;
                    decode(ctx, &mut self.batch)?;
                    redecided += 1;
                    next = sampler.sample(ctx, 0);
                    next_logprob = logprob_of(ctx, 0, next);
                    break;
                }
                let index = i32::try_from(accepted).unwrap_or(i32::MAX);
                next = sampler.sample(ctx, index);
                next_logprob = logprob_of(ctx, index, next);
                if accepted == proposal.len() || next != proposal[accepted] {
                    break;
                }
                self.cached.push(next);
                accepted += 1;
                match out.push(&vocab, next, next_logprob) {
                    Flow::More => {}
                    Flow::Done(f) => {
                        stopped = Some(f);
                        break;
                    }
                    Flow::Gone => {
                        stopped = Some(FinishReason::Stop);
                        break;
                    }
                }
                if let Some(d) = &mut drafter {
                    d.advance(next);
                }
            }
            if self.cached.len() < base + 1 + proposal.len() {
                // Drop what was drafted past the accepted tokens.
                let from = u32::try_from(self.cached.len()).unwrap_or(u32::MAX);
                if !ctx.clear_kv_cache_seq(Some(self.active as u32), Some(from), None).unwrap_or(false) {
                    return Err(failed("speculative decoding", "the cache cannot drop rejected draft tokens"));
                }
            }
            accepted_total += accepted;
            rejected_total += proposal.len() - accepted;
            if let Some(d) = &mut drafter {
                d.feedback(accepted, proposal.len());
            }
            if let Some(f) = stopped {
                break 'passes f;
            }
            // The drafted tokens just accepted were followed by the drafter already; `next`
            // is followed at the top of the next pass.
        };
        let generated = out.generated;
        counters.generated_tokens.fetch_add(generated as u64, Ordering::Relaxed);
        counters.accepted_tokens.fetch_add(accepted_total as u64, Ordering::Relaxed);
        counters.rejected_tokens.fetch_add(rejected_total as u64, Ordering::Relaxed);
        counters.redecided_tokens.fetch_add(redecided as u64, Ordering::Relaxed);
        if out.gone {
            // The caller went away; what is cached stays valid.
            return Ok(());
        }
        let mut usage = Usage::new(tokens.len() as u32, generated as u32);
        // Details answer a prediction; prompt lookup shows in the model's counters only.
        if drafter.is_some() && job.draft.is_some() {
            usage.completion_tokens_details = Some(CompletionTokensDetails {
                accepted_prediction_tokens: accepted_total as u32,
                rejected_prediction_tokens: rejected_total as u32,
            });
        }
        out.finish(&vocab, finish, usage);
        Ok(())
    }
}

/// What to do after a token was emitted.
pub(crate) enum Flow {
    More,
    Done(FinishReason),
    /// The caller went away.
    Gone,
}

/// Turns generated tokens into events: text pieces joined into whole characters, stop
/// sequences held back and cut, tool calls parsed.
pub(crate) struct Output<'j> {
    job: &'j Job,
    limit: usize,
    generated: usize,
    joiner: Utf8Joiner,
    stops: StopScan,
    parser: Option<ToolCallParser>,
    gone: bool,
    /// The sampled tokens and their log probabilities (when the job wants either).
    sampled: Vec<(LlamaToken, f32)>,
}

impl<'j> Output<'j> {
    fn new(job: &'j Job, limit: usize) -> Self {
        Output {
            job,
            limit,
            generated: 0,
            joiner: Utf8Joiner::default(),
            stops: StopScan::new(job.stops.clone()),
            parser: (!job.tools.is_empty()).then(|| ToolCallParser::new(job.tools.clone())),
            gone: false,
            sampled: Vec::new(),
        }
    }

    fn record(&mut self, token: LlamaToken, logprob: f32) {
        if self.job.token_ids || self.job.logprobs {
            self.sampled.push((token, logprob));
        }
    }

    fn send(&mut self, events: Vec<Event>) -> bool {
        self.gone = self.gone || !events.into_iter().all(|e| self.job.events.blocking_send(Ok(e)).is_ok());
        !self.gone
    }

    fn events(&mut self, text: String) -> Vec<Event> {
        match &mut self.parser {
            Some(p) => p.push(&text),
            None if text.is_empty() => Vec::new(),
            None => vec![Event::Text(text)],
        }
    }

    fn push(&mut self, vocab: &LlamaVocab<'_>, token: LlamaToken, logprob: f32) -> Flow {
        if self.generated >= self.limit {
            return Flow::Done(FinishReason::Length);
        }
        if vocab.is_eog(token) {
            // Sampled too: the turn's end is part of what the model wrote.
            self.record(token, logprob);
            return Flow::Done(FinishReason::Stop);
        }
        self.generated += 1;
        self.record(token, logprob);
        let (text, hit) = self.stops.push(&self.joiner.push(&vocab.token_to_piece(token, true, None)));
        let events = self.events(text);
        if !self.send(events) {
            return Flow::Gone;
        }
        if hit {
            Flow::Done(FinishReason::Stop)
        } else if self.generated == self.limit {
            Flow::Done(FinishReason::Length)
        } else {
            Flow::More
        }
    }

    fn finish(mut self, vocab: &LlamaVocab<'_>, mut finish: FinishReason, usage: Usage) {
        let (tail, _) = self.stops.push(&self.joiner.finish());
        let tail = tail + &self.stops.finish();
        let mut events = self.events(tail);
        if let Some(p) = &mut self.parser {
            events.extend(p.finish());
            if p.calls() > 0 {
                finish = FinishReason::ToolCalls;
            }
        }
        if !self.sampled.is_empty() {
            let ids = if self.job.token_ids {
                self.sampled.iter().map(|(t, _)| u32::try_from(t.0).unwrap_or(0)).collect()
            } else {
                Vec::new()
            };
            let logprobs = if self.job.logprobs {
                self.sampled
                    .iter()
                    .map(|&(t, logprob)| {
                        let bytes = vocab.token_to_piece(t, true, None);
                        TokenLogprob {
                            token: String::from_utf8_lossy(&bytes).into_owned(),
                            logprob,
                            bytes: Some(bytes),
                            top_logprobs: Vec::new(),
                        }
                    })
                    .collect()
            } else {
                Vec::new()
            };
            events.push(Event::Tokens { ids, logprobs });
        }
        events.push(Event::Finish(finish));
        events.push(Event::Usage(usage));
        self.send(events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_near_tie_is_a_lead_under_the_margin_between_the_two_best_logits() {
        assert!(near_tie(&[0.0, 5.0, 4.9, -1.0]));
        assert!(!near_tie(&[0.0, 5.0, 4.0, -1.0]));
        // The best twice is a tie; order does not matter.
        assert!(near_tie(&[3.0, 1.0, 3.0]));
        assert!(!near_tie(&[1.0, 9.0, 2.0]));
    }

    #[test]
    fn log_probabilities_are_a_softmax_at_the_sampling_temperature() {
        let logits = [0.0f32, 1.0, 2.0];
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((logprob(&logits, LlamaToken(2), 1.0) - (2.0f32.exp() / z).ln()).abs() < 1e-5);
        // Greedy is scored at temperature 1.
        assert_eq!(logprob(&logits, LlamaToken(2), 0.0), logprob(&logits, LlamaToken(2), 1.0));
        let z2: f32 = logits.iter().map(|l| (l / 0.5).exp()).sum();
        assert!((logprob(&logits, LlamaToken(0), 0.5) - (1.0 / z2).ln()).abs() < 1e-5);
        let total: f32 = (0..3).map(|i| logprob(&logits, LlamaToken(i), 0.7).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        assert_eq!(logprob(&logits, LlamaToken(5), 1.0), f32::NEG_INFINITY);
    }
}
