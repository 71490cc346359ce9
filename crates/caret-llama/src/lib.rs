//! In-process llama.cpp for GGUF models (chat with tools, completion, fill-in-the-middle).
//!
//! One engine thread owns the model and one context; requests queue for it (the gateway in
//! front keeps the queue short and ordered by priority — give a local deployment
//! `max_concurrency = 1`). Between requests the engine keeps the tokens whose keys and values
//! are in the KV cache: a request that shares a prefix with the previous one (the same system
//! prompt and conversation so far, the same file around a completion) evaluates only what
//! differs. Decoding takes a process-wide lock, so two local models never run their thread
//! pools at once and the machine is not oversubscribed.
//!
//! It implements the gateway's [`Provider`] trait and nothing else: routing, limits and
//! retries stay in `caret-models`. Only what runs a local model links this crate (and so
//! llama.cpp); it never reaches the network.

mod draft;
mod output;
mod prompt;

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use caret_protocol::llm::{ChatRequest, CompletionRequest, CompletionTokensDetails, FinishReason, TokenLogprob, Usage};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::vocab::LlamaVocab;

use self::draft::{DraftLengths, Drafter};
use self::output::{StopScan, ToolCallParser, Utf8Joiner};
pub use self::prompt::{ChatFormat, Piece, chat_pieces, chat_prompt};
use caret_models::{Error, Event, EventStream, Provider, Result};

/// How to run a local model.
#[derive(Debug, Clone)]
pub struct LocalSettings {
    /// Context window in tokens (capped at what the model was trained for).
    pub context_tokens: u32,
    /// Threads for llama.cpp; `None`: the cores this process may use.
    pub threads: Option<usize>,
    /// Tokens evaluated per step while reading a prompt.
    pub batch_tokens: u32,
    /// Keeps the weights in their file layout, so that a batch of tokens is multiplied by the
    /// same kernel as a single token (llama.cpp repacks some quantised weights for faster batch
    /// kernels, whose float sums run in another order). With `GGML_CPU_TILED_MM=0` in the
    /// environment as well (llama.cpp's tiled batch kernel, read once per process), a
    /// speculative answer is then bit for bit the plain one on long answers too; batches run
    /// slower. Off by default.
    pub exact_kernels: bool,
    /// Speculative drafts for completions (fill-in-the-middle included) from the prompt
    /// itself: after the answer's last tokens, what followed them where they occur in the
    /// prompt is verified in the same pass. `CARET_PROMPT_LOOKUP=0|1` overrides.
    pub prompt_lookup: bool,
    /// llama.cpp's flash attention. Off by default: on a CPU it attends each token of a batch
    /// to the cache on its own, so verification batches (speculative edits) gain nothing from
    /// being batches, and with it on a batch rounds differently from a single token (answers
    /// drift from plain decoding's); with keys cached as `q8_0` plain decoding is faster
    /// without it too (docs/apply.md). `CARET_FLASH_ATTN=0|1` overrides.
    pub flash_attention: bool,
    /// How attention keys are cached (values stay `f16`: llama.cpp quantises them only with
    /// flash attention). `q8_0` by default: half the memory, and the key products run on
    /// integer dot-product kernels. `CARET_KEY_CACHE=f16|q8_0` overrides.
    pub key_cache: KeyCache,
}

/// The type attention keys are cached in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyCache {
    /// Half-precision floats (llama.cpp's default).
    F16,
    /// 8-bit integers in blocks of 32 with a scale each.
    #[default]
    Q8_0,
}

impl KeyCache {
    /// Whether keys of `length` values can be cached so: `q8_0` rows are blocks of 32 values
    /// (llama.cpp would abort on another length; such a model's keys stay `f16`).
    pub fn fits(self, length: u32) -> bool {
        match self {
            KeyCache::F16 => true,
            KeyCache::Q8_0 => length > 0 && length.is_multiple_of(32),
        }
    }

    /// The name configuration files use.
    pub fn name(self) -> &'static str {
        match self {
            KeyCache::F16 => "f16",
            KeyCache::Q8_0 => "q8_0",
        }
    }

    /// The type of that name.
    pub fn from_name(name: &str) -> Option<KeyCache> {
        [KeyCache::F16, KeyCache::Q8_0].into_iter().find(|k| k.name() == name)
    }
}

impl Default for LocalSettings {
    fn default() -> Self {
        LocalSettings {
            context_tokens: 8192,
            threads: None,
            batch_tokens: 512,
            exact_kernels: false,
            prompt_lookup: false,
            flash_attention: false,
            key_cache: KeyCache::default(),
        }
    }
}

/// What the engine found in the model file.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The context window in use.
    pub context_tokens: u32,
    /// Threads in use.
    pub threads: usize,
    /// The chat format, or why the model cannot chat.
    pub chat: std::result::Result<ChatFormat, String>,
    /// Whether the model has fill-in-the-middle tokens.
    pub fim: bool,
    /// Flash attention in use (the setting, or `CARET_FLASH_ATTN`).
    pub flash_attention: bool,
    /// The key cache's type in use (the setting, or `CARET_KEY_CACHE`).
    pub key_cache: KeyCache,
}

impl ModelInfo {
    /// How attention runs, as benchmarks print it: `flash attention off, keys cached as q8_0`.
    pub fn attention(&self) -> String {
        format!(
            "flash attention {}, keys cached as {}",
            if self.flash_attention { "on" } else { "off" },
            self.key_cache.name()
        )
    }
}

/// Counters of a local model since it was loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LocalStats {
    /// Requests served.
    pub requests: u64,
    /// Prompt tokens of those requests.
    pub prompt_tokens: u64,
    /// Prompt tokens whose keys and values were reused from the previous request.
    pub reused_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Drafted tokens (from predictions) that were accepted.
    pub accepted_tokens: u64,
    /// Drafted tokens that were evaluated and rejected.
    pub rejected_tokens: u64,
    /// Greedy picks a verification batch made by a hair, made again by a single-token step.
    pub redecided_tokens: u64,
    /// Warm-ups taken up (not skipped as superseded).
    pub warmups: u64,
    /// Prompt tokens warm-ups read into the cache.
    pub warmed_tokens: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    prompt_tokens: AtomicU64,
    reused_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    accepted_tokens: AtomicU64,
    rejected_tokens: AtomicU64,
    redecided_tokens: AtomicU64,
    warmups: AtomicU64,
    warmed_tokens: AtomicU64,
}

/// A GGUF model run in this process by llama.cpp.
pub struct LocalProvider {
    name: String,
    info: ModelInfo,
    jobs: std::sync::mpsc::Sender<Job>,
    alive: Arc<AtomicBool>,
    counters: Arc<Counters>,
    /// Who is waiting for the engine (see [`Waiting`]).
    waiting: Arc<Waiting>,
    /// Completions are drafted from their prompt (see [`LocalSettings::prompt_lookup`]).
    prompt_lookup: bool,
    /// The engine thread, joined on drop: it must not be computing while the process exits
    /// (llama.cpp's global teardown under a running decode crashes).
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LocalProvider {
    fn drop(&mut self) {
        // Closing the job queue ends the engine's loop once the job in hand is done; a job
        // whose stream is gone stops at its next token.
        let (closed, _) = std::sync::mpsc::channel();
        drop(std::mem::replace(&mut self.jobs, closed));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for LocalProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalProvider").field("name", &self.name).field("info", &self.info).finish()
    }
}

enum Input {
    /// A prompt whose special tokens (`<|im_start|>`) are parsed.
    Text(String),
    /// A chat prompt: text, and ids sampled earlier read back as they are.
    Pieces(Vec<Piece>),
    /// Fill in between a prefix and a suffix.
    Fim { prefix: String, suffix: String },
}

struct Job {
    input: Input,
    /// A warm-up: read the prompt into the cache and answer nothing; stop for any other job
    /// (see [`Waiting`]). The number is the warm-up's, newest highest.
    warm: Option<u64>,
    max_tokens: Option<u32>,
    temperature: f32,
    top_p: f32,
    seed: Option<u64>,
    stops: Vec<String>,
    /// Names of the tools offered (none: no tool-call parsing).
    tools: Vec<String>,
    /// Text the answer is expected to repeat, verified as a speculative draft.
    draft: Option<String>,
    /// Without a draft: propose what followed the answer's last tokens where they occur in
    /// the prompt (prompt lookup; completions repeat names and lines of their context).
    lookup: bool,
    /// Send the prompt's and the answer's token ids.
    token_ids: bool,
    /// Send each sampled token's log probability.
    logprobs: bool,
    events: tokio::sync::mpsc::Sender<Result<Event>>,
}

/// Who waits for the engine: real requests submitted and not yet taken up, and the newest
/// warm-up. A warm-up reads its prompt in small batches and stops between two when a real
/// request waits or a newer warm-up exists; what it read stays in the cache (a prefix of the
/// prompt), so the request that pre-empted it reuses that much.
#[derive(Default)]
struct Waiting {
    requests: AtomicU64,
    newest_warm: AtomicU64,
}

impl Waiting {
    /// Whether warm-up `n` should stop.
    fn supersedes(&self, n: u64) -> bool {
        self.requests.load(Ordering::SeqCst) > 0 || self.newest_warm.load(Ordering::SeqCst) != n
    }
}

/// Tokens a warm-up reads per batch: small, so that a request that pre-empts it waits for
/// at most one such batch (~0.3 s of a 1.5B model on 2 cores).
const WARM_CHUNK: usize = 16;

/// Warm-ups numbered across the process.
static WARMUPS: AtomicU64 = AtomicU64::new(0);

/// The llama.cpp backend, initialised once per process.
fn backend() -> std::result::Result<&'static LlamaBackend, String> {
    static BACKEND: OnceLock<std::result::Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            // llama.cpp's own log lines go to tracing, not stderr.
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| format!("starting llama.cpp: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Held while llama.cpp computes, so local models take turns with all cores instead of
/// fighting over them.
static COMPUTE: Mutex<()> = Mutex::new(());

impl LocalProvider {
    /// Loads a GGUF file (a model directory holding `model.gguf` works too) and starts its
    /// engine thread.
    pub fn load(path: &Path, settings: LocalSettings) -> Result<LocalProvider> {
        let prompt_lookup = match std::env::var("CARET_PROMPT_LOOKUP").as_deref() {
            Ok("1") => true,
            Ok("0") => false,
            _ => settings.prompt_lookup,
        };
        let file = if path.is_dir() { path.join("model.gguf") } else { path.to_path_buf() };
        let name = file
            .parent()
            .filter(|_| path.is_dir())
            .and_then(Path::file_name)
            .or_else(|| file.file_name())
            .map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned());
        let load_error = |message: String| Error::Upstream { upstream: format!("local {name}"), status: None, message };
        if !file.is_file() {
            return Err(load_error(format!(
                "{} is not a file (pull a model with `caret models pull`)",
                file.display()
            )));
        }
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let alive = Arc::new(AtomicBool::new(true));
        let counters = Arc::new(Counters::default());
        let waiting = Arc::new(Waiting::default());
        let (thread_alive, thread_counters, thread_waiting) = (alive.clone(), counters.clone(), waiting.clone());
        let thread = std::thread::Builder::new()
            .name(format!("llama {name}"))
            .spawn(move || {
                engine(&file, &settings, &ready_tx, &queue, &thread_counters, &thread_waiting);
                thread_alive.store(false, Ordering::SeqCst);
            })
            .map_err(|e| load_error(format!("starting the engine thread: {e}")))?;
        let info = ready
            .recv()
            .map_err(|_| load_error("the engine thread ended while loading".to_owned()))?
            .map_err(load_error)?;
        Ok(LocalProvider { name, info, jobs, alive, counters, waiting, prompt_lookup, thread: Some(thread) })
    }

    /// What the engine found in the model file.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Counters since the model was loaded.
    pub fn stats(&self) -> LocalStats {
        let c = &self.counters;
        LocalStats {
            requests: c.requests.load(Ordering::Relaxed),
            prompt_tokens: c.prompt_tokens.load(Ordering::Relaxed),
            reused_tokens: c.reused_tokens.load(Ordering::Relaxed),
            generated_tokens: c.generated_tokens.load(Ordering::Relaxed),
            accepted_tokens: c.accepted_tokens.load(Ordering::Relaxed),
            rejected_tokens: c.rejected_tokens.load(Ordering::Relaxed),
            redecided_tokens: c.redecided_tokens.load(Ordering::Relaxed),
            warmups: c.warmups.load(Ordering::Relaxed),
            warmed_tokens: c.warmed_tokens.load(Ordering::Relaxed),
        }
    }

    fn upstream(&self) -> String {
        format!("local {}", self.name)
    }

    fn submit(&self, job: impl FnOnce(tokio::sync::mpsc::Sender<Result<Event>>) -> Job) -> Result<EventStream> {
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let job = job(tx);
        match job.warm {
            Some(n) => self.waiting.newest_warm.store(n, Ordering::SeqCst),
            None => {
                self.waiting.requests.fetch_add(1, Ordering::SeqCst);
            }
        }
        let warm = job.warm.is_some();
        if self.jobs.send(job).is_err() {
            if !warm {
                self.waiting.requests.fetch_sub(1, Ordering::SeqCst);
            }
            return Err(Error::Upstream {
                upstream: self.upstream(),
                status: None,
                message: "the engine thread has stopped".to_owned(),
            });
        }
        if warm {
            // Nobody waits for a warm-up: it answers at once that it was taken.
            drop(rx);
            let events = vec![Ok(Event::Finish(FinishReason::Length)), Ok(Event::Usage(Usage::default()))];
            return Ok(Box::pin(futures::stream::iter(events)));
        }
        Ok(Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx))))
    }
}

fn sampling(temperature: Option<f32>, top_p: Option<f32>) -> (f32, f32) {
    (temperature.unwrap_or(1.0).max(0.0), top_p.unwrap_or(1.0).clamp(0.0, 1.0))
}

#[async_trait::async_trait]
impl Provider for LocalProvider {
    fn describe(&self) -> String {
        self.upstream()
    }

    async fn chat(&self, req: ChatRequest) -> Result<EventStream> {
        let format = self.info.chat.clone().map_err(Error::Unsupported)?;
        let prompt = chat_pieces(&format, &req);
        let (temperature, top_p) = sampling(req.temperature, req.top_p);
        let offered = req.tool_choice.as_ref().is_none_or(|c| c != "none");
        let tools = if offered { req.tools.iter().map(|t| t.function.name.clone()).collect() } else { Vec::new() };
        let mut stops = req.stop.as_ref().map(|s| s.to_vec()).unwrap_or_default();
        // A model that opens another turn has ended its own (small models write the marker
        // out instead of ending with `<|im_end|>`).
        match format {
            ChatFormat::ChatMl { .. } => stops.push("<|im_start|>".to_owned()),
        }
        self.submit(|events| Job {
            input: Input::Pieces(prompt),
            warm: None,
            max_tokens: req.max_tokens,
            temperature,
            top_p,
            seed: req.seed,
            stops,
            tools,
            draft: req.prediction.as_ref().map(|p| p.content.text()),
            lookup: false,
            token_ids: req.return_token_ids == Some(true),
            logprobs: req.logprobs == Some(true),
            events,
        })
    }

    async fn complete(&self, req: CompletionRequest) -> Result<EventStream> {
        let input = match req.suffix {
            Some(suffix) if self.info.fim => Input::Fim { prefix: req.prompt.text().to_owned(), suffix },
            Some(_) => {
                return Err(Error::Unsupported(format!(
                    "{} has no fill-in-the-middle tokens (drop `suffix`, or use a code model)",
                    self.upstream()
                )));
            }
            None => Input::Text(req.prompt.text().to_owned()),
        };
        let (temperature, top_p) = sampling(req.temperature, req.top_p);
        // `max_tokens: 0` asks for a warm-up (see [`Waiting`]).
        let warm = (req.max_tokens == Some(0)).then(|| WARMUPS.fetch_add(1, Ordering::SeqCst) + 1);
        self.submit(|events| Job {
            input,
            warm,
            max_tokens: req.max_tokens,
            temperature,
            top_p,
            seed: req.seed,
            stops: req.stop.as_ref().map(|s| s.to_vec()).unwrap_or_default(),
            tools: Vec::new(),
            draft: None,
            lookup: self.prompt_lookup,
            token_ids: false,
            logprobs: false,
            events,
        })
    }

    async fn health(&self) -> Result<()> {
        if self.alive.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(Error::Upstream {
                upstream: self.upstream(),
                status: None,
                message: "the engine has stopped".to_owned(),
            })
        }
    }
}

/// The engine thread: loads the model, answers `ready`, then serves jobs until the provider
/// is dropped.
fn engine(
    file: &PathBuf,
    settings: &LocalSettings,
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
        .with_n_seq_max(1)
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
        cached: Vec::new(),
        exact: 0,
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
                    engine.cached.clear();
                    engine.exact = 0;
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
            // The cache may hold half a batch: start clean next time.
            ctx.clear_kv_cache();
            engine.cached.clear();
            engine.exact = 0;
            let _ = events.blocking_send(Err(e));
        }
    }
}

struct Engine<'m> {
    model: &'m LlamaModel,
    /// The tokens whose keys and values are in the KV cache, in order from position 0.
    cached: Vec<LlamaToken>,
    /// How many of them were read in whole [`EXACT_CHUNK`]s from position 0, as a seeded
    /// request reads its prompt.
    exact: usize,
    batch: LlamaBatch<'static>,
    /// The batch's capacity.
    step: usize,
    /// How many drafted tokens to verify per pass.
    lengths: DraftLengths,
}

/// The batch a seeded request reads its prompt in, from a multiple of it. A batch's rounding
/// depends on its size and its start, so a seeded prompt is read in the same batches whatever
/// the cache held before (reusing only what earlier seeded requests read so): its answer is
/// the same on a fresh engine as on a busy one.
const EXACT_CHUNK: usize = 64;

/// Draft lengths of prompt lookup: short (a completion is a few lines; a missed draft costs a
/// wider pass).
const LOOKUP_LENGTHS: DraftLengths = DraftLengths { start: 4, min: 2, max: 16 };

/// Values in one attention head's key: the file's `<arch>.attention.key_length`, else the
/// embedding split over the heads.
fn key_length(model: &LlamaModel) -> u32 {
    let declared = model
        .meta_val_str("general.architecture")
        .ok()
        .and_then(|arch| model.meta_val_str(&format!("{arch}.attention.key_length")).ok())
        .and_then(|v| v.trim().parse().ok());
    declared.unwrap_or_else(|| u32::try_from(model.n_embd()).unwrap_or(0) / model.n_head().max(1))
}

/// Draft lengths, `CARET_DRAFT_LENGTHS=start,min,max` overriding the defaults (for tuning
/// with `caret bench merge`).
fn draft_lengths() -> DraftLengths {
    let parsed = std::env::var("CARET_DRAFT_LENGTHS").ok().and_then(|v| {
        let n: Vec<usize> = v.split(',').map(|x| x.trim().parse().ok()).collect::<Option<_>>()?;
        match n[..] {
            [start, min, max] if min >= 1 && min <= start && start <= max => Some(DraftLengths { start, min, max }),
            _ => None,
        }
    });
    parsed.unwrap_or_default()
}

fn failed(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Upstream { upstream: "local model".to_owned(), status: None, message: format!("{what}: {e}") }
}

/// Logit lead under which a greedy pick made in a verification batch is made again alone:
/// batch and single-token evaluation differ by small rounding, which decides only near-ties;
/// each such position costs one single-token step.
const TIE_MARGIN: f32 = 0.25;

/// Whether the two best logits are within [`TIE_MARGIN`].
fn near_tie(logits: &[f32]) -> bool {
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
fn logprob(logits: &[f32], token: LlamaToken, temperature: f32) -> f32 {
    let t = if temperature > 0.0 { temperature } else { 1.0 };
    let Some(&picked) = usize::try_from(token.0).ok().and_then(|i| logits.get(i)) else {
        return f32::NEG_INFINITY;
    };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max) / t).exp()).sum();
    ((picked - max) / t) - sum.ln() as f32
}

/// Runs one llama.cpp computation under the process-wide lock.
fn decode(ctx: &mut LlamaContext<'_>, batch: &mut LlamaBatch<'_>) -> Result<()> {
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
            if !ctx.clear_kv_cache_seq(Some(0), Some(from), None).unwrap_or(false) {
                ctx.clear_kv_cache();
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
                None if job.events.is_closed() => return Err(failed("reading the prompt", "the caller went away")),
                None => {}
            }
            read += chunk.len();
            self.batch.clear();
            for &t in chunk {
                let pos = self.cached.len();
                let last = pos + 1 == tokens.len();
                self.batch
                    .add(t, i32::try_from(pos).unwrap_or(i32::MAX), &[0], last)
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
                self.batch.add(t, pos, &[0], true).map_err(|e| failed("batching", e))?;
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
                    if !ctx.clear_kv_cache_seq(Some(0), Some(from), None).unwrap_or(false) {
                        return Err(failed("speculative decoding", "the cache cannot drop rejected draft tokens"));
                    }
                    self.batch.clear();
                    let token = self.cached[at];
                    self.batch
                        .add(token, i32::try_from(at).unwrap_or(i32::MAX), &[0], true)
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
                if !ctx.clear_kv_cache_seq(Some(0), Some(from), None).unwrap_or(false) {
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
enum Flow {
    More,
    Done(FinishReason),
    /// The caller went away.
    Gone,
}

/// Turns generated tokens into events: text pieces joined into whole characters, stop
/// sequences held back and cut, tool calls parsed.
struct Output<'j> {
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

/// Entry points for the fuzz targets (`crates/caret-fuzz`): the reader of what the engine
/// generates, fed from memory. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    /// Generated text, arriving in `pieces`, read for tool calls of `names`.
    pub fn tool_calls(pieces: &[&str], names: Vec<String>) -> Vec<caret_models::Event> {
        let mut parser = crate::output::ToolCallParser::new(names);
        let mut events: Vec<caret_models::Event> = pieces.iter().flat_map(|p| parser.push(p)).collect();
        events.extend(parser.finish());
        events
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

    #[test]
    fn key_cache_types_are_named_as_configuration_files_write_them() {
        for k in [KeyCache::F16, KeyCache::Q8_0] {
            assert_eq!(serde_json::from_value::<KeyCache>(serde_json::json!(k.name())).unwrap(), k);
            assert_eq!(KeyCache::from_name(k.name()), Some(k));
        }
        assert_eq!(KeyCache::from_name("q4_0"), None);
        assert!(serde_json::from_value::<KeyCache>(serde_json::json!("q4_0")).is_err());
    }

    #[test]
    fn keys_cached_as_q8_0_must_be_whole_blocks_of_32() {
        assert!(KeyCache::Q8_0.fits(64) && KeyCache::Q8_0.fits(128));
        assert!(!KeyCache::Q8_0.fits(80) && !KeyCache::Q8_0.fits(0));
        assert!(KeyCache::F16.fits(80));
    }
}
