//! The WordPiece tokenizer against ids produced by the reference implementation (Hugging Face
//! `tokenizers`, padding and truncation off) for the default model's `tokenizer.json`.
//!
//! Needs the real model: set `CARET_TEST_MODEL_DIR` to an installed all-minilm-l6-v2
//! (`caret models pull`; CI does). Without it the test says so and checks nothing else.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use caret_workspace::tokens::{TokenCounter as _, WordPiece};

#[test]
fn matches_the_reference_tokenizer_id_for_id() {
    let Some(dir) =
        caret_test_support::models::TestModel::Embedding.dir_or_skip("the comparison with the reference tokenizer")
    else {
        return;
    };
    let wp = WordPiece::from_model_dir(std::path::Path::new(&dir)).unwrap();
    let cases: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/minilm-tokenizer-reference.json")).unwrap();
    for case in cases.as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(wp.encode(text, 100_000), want, "{text:?}");
        assert_eq!(wp.count(text), want.len() - 2, "{text:?}");
    }
}
