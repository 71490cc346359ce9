//! `OpenAiEmbedder`: embeddings from an OpenAI-compatible `/v1/embeddings` server.

use serde::Deserialize;

use crate::{Embedder, Error, Result, normalize};

/// An OpenAI-compatible `/v1/embeddings` endpoint.
#[derive(Debug)]
pub struct OpenAiEmbedder {
    url: String,
    api_key: Option<String>,
    model: String,
    dim: usize,
    model_id: String,
    client: reqwest::blocking::Client,
}

#[derive(Deserialize)]
struct Response {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    index: usize,
    embedding: Vec<f32>,
}

impl OpenAiEmbedder {
    /// A client for `base_url` (e.g. `http://tei:8080`), model `model` of dimension `dim`.
    pub fn new(base_url: &str, api_key: Option<String>, model: &str, dim: usize) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let url = format!("{}/v1/embeddings", base_url.trim_end_matches('/'));
        let client = reqwest::blocking::Client::builder()
            .timeout(std::time::Duration::from_secs(120))
            .build()
            .map_err(|e| Error::Remote { url: url.clone(), reason: e.to_string() })?;
        Ok(OpenAiEmbedder { model_id: format!("openai:{model}"), url, api_key, model: model.to_owned(), dim, client })
    }
}

impl Embedder for OpenAiEmbedder {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let fail = |reason: String| Error::Remote { url: self.url.clone(), reason };
        let mut req = self.client.post(&self.url).json(&serde_json::json!({"model": self.model, "input": texts}));
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let resp = req.send().map_err(|e| fail(e.to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().unwrap_or_default();
            return Err(fail(format!("HTTP {status}: {}", body.chars().take(300).collect::<String>())));
        }
        let mut body: Response = resp.json().map_err(|e| fail(format!("unexpected response: {e}")))?;
        if body.data.len() != texts.len() {
            return Err(fail(format!("{} embeddings for {} inputs", body.data.len(), texts.len())));
        }
        body.data.sort_by_key(|d| d.index);
        body.data
            .into_iter()
            .map(|mut d| {
                if d.embedding.len() != self.dim {
                    return Err(fail(format!("dimension {} instead of {}", d.embedding.len(), self.dim)));
                }
                normalize(&mut d.embedding);
                Ok(d.embedding)
            })
            .collect()
    }
}
