//! Embedders end to end. The local model tests need the real model: set
//! `CARET_TEST_MODEL_DIR` to an installed all-minilm-l6-v2 (`caret models pull`; CI does).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};

use caret_embed::{Embedder, LocalBert, LocalBertConfig, OpenAiEmbedder, cosine};

fn model() -> Option<LocalBert> {
    let Some(dir) = std::env::var_os("CARET_TEST_MODEL_DIR") else {
        eprintln!("CARET_TEST_MODEL_DIR is not set: skipping the local model test");
        return None;
    };
    Some(
        LocalBert::load(std::path::Path::new(&dir), LocalBertConfig { threads: 2, ..LocalBertConfig::default() })
            .unwrap(),
    )
}

#[test]
fn local_model_gives_unit_vectors_that_rank_by_meaning() {
    let Some(m) = model() else { return };
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

#[test]
fn batching_and_padding_do_not_change_vectors() {
    let Some(m) = model() else { return };
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
