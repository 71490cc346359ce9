//! `LocalBert`: a BERT-family sentence model on the CPU — WordPiece ids, length-bucketed
//! batches on a thread pool, mean pooling and L2 normalisation — over ONNX Runtime or candle.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use caret_workspace::tokens::WordPiece;

use crate::onnx::OnnxEncoder;
use crate::{Embedder, Error, Result, normalize};

/// Settings of the local model.
#[derive(Debug, Clone, Copy)]
pub struct LocalBertConfig {
    /// Threads for the model's matrix work (default: the machine's cores).
    pub threads: usize,
    /// Longest input in tokens, special tokens included (the model's window).
    pub max_tokens: usize,
    /// Padded tokens per forward pass (batch size × longest input in the batch).
    pub batch_tokens: usize,
}

impl Default for LocalBertConfig {
    fn default() -> Self {
        LocalBertConfig {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            max_tokens: 256,
            batch_tokens: 512,
        }
    }
}

/// What runs the encoder.
enum Runtime {
    /// `model.safetensors` (f32) with candle.
    Candle(Box<BertModel>),
    /// `model.onnx` with ONNX Runtime.
    Onnx(OnnxEncoder),
}

/// A BERT-family sentence-embedding model on the CPU: a Hugging Face directory with
/// `model.onnx` runs on ONNX Runtime, one with `model.safetensors` on candle.
pub struct LocalBert {
    runtime: Runtime,
    tokenizer: WordPiece,
    dim: usize,
    config: LocalBertConfig,
    pool: rayon::ThreadPool,
    model_id: String,
}

impl std::fmt::Debug for LocalBert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBert")
            .field("model", &self.model_id)
            .field("dim", &self.dim)
            .field("config", &self.config)
            .finish()
    }
}

impl LocalBert {
    /// Loads a model directory in the Hugging Face layout.
    pub fn load(dir: &Path, config: LocalBertConfig) -> Result<Self> {
        let fail = |reason: String| Error::Load { dir: dir.display().to_string(), reason };
        let text = std::fs::read_to_string(dir.join("config.json")).map_err(|e| fail(format!("config.json: {e}")))?;
        let bert: Config = serde_json::from_str(&text).map_err(|e| fail(format!("config.json: {e}")))?;
        let dim: usize = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["hidden_size"].as_u64())
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| fail("config.json has no hidden_size".to_owned()))?;
        let tokenizer = WordPiece::from_model_dir(dir).map_err(|e| fail(e.to_string()))?;
        let runtime = if dir.join("model.onnx").exists() {
            Runtime::Onnx(OnnxEncoder::load(dir, config.threads.max(1)).map_err(fail)?)
        } else {
            let weights =
                std::fs::read(dir.join("model.safetensors")).map_err(|e| fail(format!("model.safetensors: {e}")))?;
            let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)
                .map_err(|e| fail(e.to_string()))?;
            Runtime::Candle(Box::new(BertModel::load(vb, &bert).map_err(|e| fail(e.to_string()))?))
        };
        // Batches (an index being embedded) are background work: under contention the pool's
        // threads yield to everything else (a search's query runs on its caller's thread).
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.threads.max(1))
            .thread_name(|i| format!("caret-embed-{i}"))
            .start_handler(|_| {
                let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19);
            })
            .build()
            .map_err(|e| fail(format!("starting the thread pool: {e}")))?;
        let name = dir.file_name().map_or_else(|| "bert".to_owned(), |n| n.to_string_lossy().into_owned());
        Ok(LocalBert { runtime, tokenizer, dim, config, pool, model_id: format!("local:{name}") })
    }

    /// Runs one padded batch; returns unit vectors in batch order.
    fn forward(&self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let len = batch.iter().map(|ids| ids.len()).max().unwrap_or(0);
        let pad = self.tokenizer.specials().pad;
        let mut ids = Vec::with_capacity(batch.len() * len);
        let mut mask = Vec::with_capacity(batch.len() * len);
        for seq in batch {
            ids.extend_from_slice(seq);
            ids.extend(std::iter::repeat_n(pad, len - seq.len()));
            mask.extend(std::iter::repeat_n(1u32, seq.len()));
            mask.extend(std::iter::repeat_n(0u32, len - seq.len()));
        }
        let rows = batch.len();
        if len == 0 {
            return Ok(vec![vec![0.0; self.dim]; rows]);
        }
        let hidden = match &self.runtime {
            Runtime::Candle(model) => {
                let shape = (rows, len);
                let input = Tensor::from_vec(ids, shape, &Device::Cpu)?;
                let types = input.zeros_like()?;
                let mask = Tensor::from_vec(mask.clone(), shape, &Device::Cpu)?;
                model.forward(&input, &types, Some(&mask))?.flatten_all()?.to_vec1::<f32>()?
            }
            Runtime::Onnx(encoder) => encoder.hidden(&ids, &mask, rows, len, self.dim).map_err(Error::Model)?,
        };
        Ok(mean_pool(&hidden, &mask, len, self.dim))
    }

    /// Embeds texts one at a time, no batching: the baseline the benchmark compares with.
    pub fn embed_unbatched(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.pool.install(|| {
            texts
                .iter()
                .map(|t| {
                    let ids = self.tokenizer.encode(t, self.config.max_tokens);
                    Ok(self.forward(&[&ids])?.remove(0))
                })
                .collect()
        })
    }

    /// The tokenizer (for counting).
    pub fn tokenizer(&self) -> &WordPiece {
        &self.tokenizer
    }
}

impl Embedder for LocalBert {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.embed_window(texts, self.config.max_tokens)
    }

    fn embed_window(&self, texts: &[&str], max_tokens: usize) -> Result<Vec<Vec<f32>>> {
        // [CLS] and [SEP] always fit.
        let window = max_tokens.clamp(3, self.config.max_tokens);
        let encoded: Vec<Vec<u32>> = texts.iter().map(|t| self.tokenizer.encode(t, window)).collect();
        // Length bucketing: similar lengths share a batch, so little compute goes to padding.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|i| encoded[*i].len());
        let mut batches: Vec<&[usize]> = Vec::new();
        let mut start = 0;
        while start < order.len() {
            // Sorted ascending, so the last member of a batch is its longest.
            let mut end = start + 1;
            while end < order.len() && (end + 1 - start) * encoded[order[end]].len() <= self.config.batch_tokens {
                end += 1;
            }
            batches.push(&order[start..end]);
            start = end;
        }
        // A query (one small batch) runs here, on the caller's thread and its own session: it
        // never waits in the pool behind an index's batches.
        if let [only] = batches.as_slice()
            && only.len() <= QUERY_TEXTS
        {
            let batch: Vec<&[u32]> = only.iter().map(|i| encoded[*i].as_slice()).collect();
            let vectors = self.forward(&batch)?;
            let mut out: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
            for (slot, v) in only.iter().zip(vectors) {
                out[*slot] = v;
            }
            return Ok(out);
        }
        // Batches run side by side: much of a forward pass (softmax, GELU, layer norm) is
        // single-threaded in candle, so one batch at a time leaves cores idle.
        let results: Vec<Vec<Vec<f32>>> = self.pool.install(|| {
            use rayon::prelude::*;
            batches
                .par_iter()
                .map(|members| {
                    let batch: Vec<&[u32]> = members.iter().map(|i| encoded[*i].as_slice()).collect();
                    self.forward(&batch)
                })
                .collect::<Result<_>>()
        })?;
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        for (members, vectors) in batches.iter().zip(results) {
            for (slot, v) in members.iter().zip(vectors) {
                out[*slot] = v;
            }
        }
        Ok(out)
    }
}

/// Texts few enough to embed on the caller's thread (a search's query and its variants).
const QUERY_TEXTS: usize = 4;

/// Unit-length means of the hidden states (`rows × len × dim`) over the real tokens of each
/// row (`mask`, `rows × len`).
fn mean_pool(hidden: &[f32], mask: &[u32], len: usize, dim: usize) -> Vec<Vec<f32>> {
    hidden
        .chunks_exact(len * dim)
        .zip(mask.chunks_exact(len))
        .map(|(states, row_mask)| {
            let mut sum = vec![0f32; dim];
            for (state, _) in states.chunks_exact(dim).zip(row_mask).filter(|(_, m)| **m != 0) {
                sum.iter_mut().zip(state).for_each(|(s, x)| *s += x);
            }
            // The norm is what counts: dividing by the token count would not change the direction.
            normalize(&mut sum);
            sum
        })
        .collect()
}
