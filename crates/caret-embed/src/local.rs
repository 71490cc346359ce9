use std::path::Path;

use candle_core::{D, DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use caret_workspace::tokens::WordPiece;

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
            batch_tokens: 2048,
        }
    }
}

/// A BERT-family sentence-embedding model on the CPU.
pub struct LocalBert {
    model: BertModel,
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
        let weights =
            std::fs::read(dir.join("model.safetensors")).map_err(|e| fail(format!("model.safetensors: {e}")))?;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)
            .map_err(|e| fail(e.to_string()))?;
        let model = BertModel::load(vb, &bert).map_err(|e| fail(e.to_string()))?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.threads.max(1))
            .thread_name(|i| format!("caret-embed-{i}"))
            .build()
            .map_err(|e| fail(format!("starting the thread pool: {e}")))?;
        let name = dir.file_name().map_or_else(|| "bert".to_owned(), |n| n.to_string_lossy().into_owned());
        Ok(LocalBert { model, tokenizer, dim, config, pool, model_id: format!("local:{name}") })
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
        let device = Device::Cpu;
        let shape = (batch.len(), len);
        let input = Tensor::from_vec(ids, shape, &device)?;
        let mask = Tensor::from_vec(mask, shape, &device)?;
        let types = input.zeros_like()?;
        let hidden = self.model.forward(&input, &types, Some(&mask))?;
        // Mean over the real tokens: sum(hidden × mask) / sum(mask).
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(D::Minus1)?;
        let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
        let counts = mask.sum(1)?;
        let mean = summed.broadcast_div(&counts)?;
        let mut out = mean.to_vec2::<f32>()?;
        out.iter_mut().for_each(|v| normalize(v));
        Ok(out)
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
        let encoded: Vec<Vec<u32>> = texts.iter().map(|t| self.tokenizer.encode(t, self.config.max_tokens)).collect();
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
