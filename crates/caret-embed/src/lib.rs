//! Embedders: text in, unit vectors out.
//!
//! [`LocalBert`] runs a BERT-family sentence-embedding model (the Hugging Face layout:
//! `config.json`, `tokenizer.json`, and `model.onnx` for ONNX Runtime or `model.safetensors`
//! for candle) on the CPU: mean pooling
//! over the attention mask, L2 normalisation, batches formed by length so little is padded,
//! and a thread pool of its own so it does not oversubscribe the machine.
//! [`OpenAiEmbedder`] calls an OpenAI-compatible `/v1/embeddings` endpoint (TEI, vLLM,
//! llama.cpp server, OpenAI).
//!
//! This crate knows nothing about storage; callers cache by chunk id.

mod local;
mod onnx;
mod remote;

pub use local::{LocalBert, LocalBertConfig};
pub use onnx::RUNTIME_LIBRARY;
pub use remote::OpenAiEmbedder;

/// Errors of embedders.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model files could not be loaded.
    #[error("loading the embedding model from {dir}: {reason}")]
    Load {
        /// The model directory.
        dir: String,
        /// Why.
        reason: String,
    },
    /// Running the model failed.
    #[error("running the embedding model: {0}")]
    Model(String),
    /// A remote embedding server failed.
    #[error("embedding server {url}: {reason}")]
    Remote {
        /// The endpoint.
        url: String,
        /// Why.
        reason: String,
    },
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Model(e.to_string())
    }
}

/// Whether `dir` holds a model [`LocalBert`] can load (`model.onnx` or `model.safetensors`).
pub fn is_local_model(dir: &std::path::Path) -> bool {
    dir.join("model.onnx").is_file() || dir.join("model.safetensors").is_file()
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turns texts into unit-length vectors.
pub trait Embedder: Send + Sync {
    /// A stable id of the model (part of cache keys).
    fn model_id(&self) -> &str;
    /// Vector dimension.
    fn dim(&self) -> usize;
    /// Embeds texts; the result has one vector per text, in order. Blocking: call from a
    /// blocking thread.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>>;
    /// Embeds texts by their first `max_tokens` word pieces at most (special tokens
    /// included): a shorter window than the model's own, for text whose start says what it is.
    /// Models that cannot cut their input embed it whole.
    fn embed_window(&self, texts: &[&str], max_tokens: usize) -> Result<Vec<Vec<f32>>> {
        let _ = max_tokens;
        self.embed(texts)
    }
}

/// L2-normalises a vector in place (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// Cosine similarity of two unit vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
