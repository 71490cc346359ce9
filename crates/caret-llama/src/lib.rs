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
mod engine;
mod output;
mod prompt;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use caret_protocol::llm::{ChatRequest, CompletionRequest, FinishReason, Usage};
use llama_cpp_2::llama_backend::LlamaBackend;

pub use self::prompt::{ChatFormat, Piece, chat_pieces, chat_prompt};
use caret_models::{Error, Event, EventStream, Provider, Result};

/// How to run a local model.
#[derive(Debug, Clone)]
pub struct LlamaSettings {
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

impl Default for LlamaSettings {
    fn default() -> Self {
        LlamaSettings {
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
pub struct LlamaStats {
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
pub struct LlamaProvider {
    name: String,
    info: ModelInfo,
    jobs: std::sync::mpsc::Sender<Job>,
    alive: Arc<AtomicBool>,
    counters: Arc<Counters>,
    /// Who is waiting for the engine (see [`Waiting`]).
    waiting: Arc<Waiting>,
    /// Completions are drafted from their prompt (see [`LlamaSettings::prompt_lookup`]).
    prompt_lookup: bool,
    /// The engine thread, joined on drop: it must not be computing while the process exits
    /// (llama.cpp's global teardown under a running decode crashes).
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LlamaProvider {
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

impl std::fmt::Debug for LlamaProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaProvider").field("name", &self.name).field("info", &self.info).finish()
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

impl LlamaProvider {
    /// Loads a GGUF file (a model directory holding `model.gguf` works too) and starts its
    /// engine thread.
    pub fn load(path: &Path, settings: LlamaSettings) -> Result<LlamaProvider> {
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
                engine::run(&file, &settings, &ready_tx, &queue, &thread_counters, &thread_waiting);
                thread_alive.store(false, Ordering::SeqCst);
            })
            .map_err(|e| load_error(format!("starting the engine thread: {e}")))?;
        let info = ready
            .recv()
            .map_err(|_| load_error("the engine thread ended while loading".to_owned()))?
            .map_err(load_error)?;
        Ok(LlamaProvider { name, info, jobs, alive, counters, waiting, prompt_lookup, thread: Some(thread) })
    }

    /// What the engine found in the model file.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Counters since the model was loaded.
    pub fn stats(&self) -> LlamaStats {
        let c = &self.counters;
        LlamaStats {
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
impl Provider for LlamaProvider {
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
