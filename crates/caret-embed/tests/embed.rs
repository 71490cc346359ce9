//! Embedders end to end. The local model tests run on the real models where `caret models
//! pull` installed them (all-minilm-l6-v2-int8 on ONNX Runtime, all-minilm-l6-v2 on candle), or
//! in the directories `CARET_TEST_MODEL_DIR` and `CARET_TEST_F32_MODEL_DIR` name; each test
//! runs on every model there is and says so for each one that is not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::PathBuf;

use caret_embed::{Embedder, LocalBert, LocalBertConfig, OpenAiEmbedder, cosine};
use caret_test_support::models::TestModel;

/// Every embedding model there is to test: the int8 one on ONNX Runtime and the f32 one on
/// candle, each skipped (and said so) when it is not installed.
fn model_dirs() -> Vec<PathBuf> {
    [TestModel::Embedding, TestModel::EmbeddingF32]
        .into_iter()
        .filter_map(|m| m.dir_or_skip("this local model test on that model"))
        .collect()
}

fn models() -> Vec<LocalBert> {
    model_dirs()
        .iter()
        .map(|dir| LocalBert::load(dir, LocalBertConfig { threads: 2, ..LocalBertConfig::default() }).unwrap())
        .collect()
}

#[test]
fn local_model_gives_unit_vectors_that_rank_by_meaning() {
    for m in models() {
        assert_eq!(m.dim(), 384);
        let texts = [
            "retry failed uploads with exponential backoff",
            "fn upload_with_retry(&self, attempts: u32) { for i in 0..attempts { if self.put().is_ok() { return; } sleep(backoff(i)); } }",
            "the cat sat on the warm windowsill in the sun",
            "def parse_config(path): return toml.load(open(path))",
        ];
        let v = m.embed(&texts).unwrap();
        for x in &v {
            assert_eq!(x.len(), 384);
            assert!((x.iter().map(|a| a * a).sum::<f32>() - 1.0).abs() < 1e-4);
        }
        let q = &v[0];
        assert!(cosine(q, &v[1]) > cosine(q, &v[2]), "code about retries is closer than a cat");
        assert!(cosine(q, &v[1]) > cosine(q, &v[3]), "and closer than config parsing");
    }
}

#[test]
fn batching_and_padding_do_not_change_vectors() {
    for m in models() {
        let long = "token ".repeat(400);
        let texts = ["short", "a somewhat longer sentence about parsing files", long.as_str(), "fn main() {}", "short"];
        let batched = m.embed(&texts).unwrap();
        let single = m.embed_unbatched(&texts).unwrap();
        for (b, s) in batched.iter().zip(&single) {
            let diff = b.iter().zip(s).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(diff < 1e-4, "max difference {diff}");
        }
        assert_eq!(batched[0], batched[4], "same text, same vector");
    }
}

#[test]
fn int8_onnx_and_f32_candle_agree() {
    let models = models();
    let [int8, f32] = models.as_slice() else {
        caret_test_support::skip("the comparison needs both the int8 and the f32 model");
        return;
    };
    assert_ne!(int8.model_id(), f32.model_id(), "vectors of the two are never mixed");
    let long = "fn retry(attempts: u32) -> Result<()> { backoff(attempts) }\n".repeat(30);
    let texts = ["where do we retry failed uploads", "def parse_config(path): ...", long.as_str(), "x"];
    let (a, b) = (int8.embed(&texts).unwrap(), f32.embed(&texts).unwrap());
    for (text, (x, y)) in texts.iter().zip(a.iter().zip(&b)) {
        let c = cosine(x, y);
        assert!(c > 0.99, "cosine {c} for {text:?}");
    }
}

#[test]
fn onnx_model_problems_are_clear_errors() {
    let Some(real) = TestModel::Embedding.dir_or_skip("the ONNX model's error cases") else {
        return;
    };
    if !real.join(caret_embed::RUNTIME_LIBRARY).exists() {
        caret_test_support::skip("CARET_TEST_MODEL_DIR is not an ONNX model: skipping");
        return;
    }
    let dir = std::env::temp_dir().join(format!("caret-bad-onnx-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(real.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("model.onnx"), b"not a model").unwrap();
    if std::env::var_os("ORT_DYLIB_PATH").is_none() {
        let err = LocalBert::load(&dir, LocalBertConfig::default()).unwrap_err().to_string();
        assert!(err.contains("no ONNX Runtime library"), "{err}");
    }
    std::fs::copy(real.join(caret_embed::RUNTIME_LIBRARY), dir.join(caret_embed::RUNTIME_LIBRARY)).unwrap();
    let err = LocalBert::load(&dir, LocalBertConfig::default()).unwrap_err().to_string();
    assert!(err.contains("model.onnx"), "a corrupt model names its file: {err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_model_files_are_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("caret-no-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let err = LocalBert::load(&dir, LocalBertConfig::default()).unwrap_err().to_string();
    assert!(err.contains("loading the embedding model") && err.contains("config.json"), "{err}");
}

/// A scripted OpenAI-compatible server (a test double): answers one request with `body`.
fn scripted_server(body: String) -> (String, std::thread::JoinHandle<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut len = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut request = vec![0; len];
        reader.read_exact(&mut request).unwrap();
        let mut stream = stream;
        write!(stream, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).unwrap();
        String::from_utf8(request).unwrap()
    });
    (url, handle)
}

#[test]
fn openai_compatible_client_orders_and_normalises() {
    let (url, server) = scripted_server(
        r#"{"data":[{"index":1,"embedding":[0.0,2.0]},{"index":0,"embedding":[3.0,4.0]}],"model":"m"}"#.to_owned(),
    );
    let e = OpenAiEmbedder::new(&url, Some("k".into()), "m", 2).unwrap();
    let v = e.embed(&["a", "b"]).unwrap();
    assert_eq!(v, vec![vec![0.6, 0.8], vec![0.0, 1.0]]);
    let request: serde_json::Value = serde_json::from_str(&server.join().unwrap()).unwrap();
    assert_eq!(request, serde_json::json!({"model": "m", "input": ["a", "b"]}));

    let (url, _server) = scripted_server(r#"{"data":[{"index":0,"embedding":[1.0]}]}"#.to_owned());
    let err = OpenAiEmbedder::new(&url, None, "m", 2).unwrap().embed(&["a"]).unwrap_err().to_string();
    assert!(err.contains("dimension 1 instead of 2"), "{err}");
}
