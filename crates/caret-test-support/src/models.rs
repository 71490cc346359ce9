//! The real models tests run, found where `caret models pull` installs them
//! (`$CARET_HOME/models/NAME`, by default the platform data directory's `caret/models/NAME`,
//! which is where `./scripts/setup.sh` puts them), or in the directory an environment
//! variable names (CI points these at its cache). A test that finds none skips through
//! [`crate::skip`].

use std::path::{Path, PathBuf};

/// A model the tests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestModel {
    /// The default embedding model: all-MiniLM-L6-v2, int8, ONNX Runtime
    /// (`CARET_TEST_MODEL_DIR`).
    Embedding,
    /// The same model in f32 on candle (`CARET_TEST_F32_MODEL_DIR`).
    EmbeddingF32,
    /// SmolLM2-135M-Instruct, the small chat model (`CARET_TEST_LLM_DIR`).
    SmallLlm,
    /// Qwen2.5-Coder-1.5B-Instruct, for the slow `#[ignore]`d tests
    /// (`CARET_TEST_CODE_MODEL_DIR`).
    CodeLlm,
}

impl TestModel {
    /// The environment variable that names its directory.
    pub fn var(self) -> &'static str {
        match self {
            TestModel::Embedding => "CARET_TEST_MODEL_DIR",
            TestModel::EmbeddingF32 => "CARET_TEST_F32_MODEL_DIR",
            TestModel::SmallLlm => "CARET_TEST_LLM_DIR",
            TestModel::CodeLlm => "CARET_TEST_CODE_MODEL_DIR",
        }
    }

    /// Its name in `caret models`' catalog.
    pub fn name(self) -> &'static str {
        match self {
            TestModel::Embedding => "all-minilm-l6-v2-int8",
            TestModel::EmbeddingF32 => "all-minilm-l6-v2",
            TestModel::SmallLlm => "smollm2-135m-instruct-q4",
            TestModel::CodeLlm => "qwen2.5-coder-1.5b-instruct-q4",
        }
    }

    /// The directory: the variable's when set, else the installed one when it holds the
    /// model's weights.
    pub fn dir(self) -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os(self.var()).filter(|d| !d.is_empty()) {
            return Some(PathBuf::from(dir));
        }
        let data = || {
            std::env::var_os("XDG_DATA_HOME")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/share")))
        };
        let home = std::env::var_os("CARET_HOME").map(PathBuf::from).or_else(|| data().map(|d| d.join("caret")))?;
        let dir = home.join("models").join(self.name());
        self.installed(&dir).then_some(dir)
    }

    /// The directory, or `None` after saying through [`crate::skip`] that `what` does not run
    /// without it.
    pub fn dir_or_skip(self, what: &str) -> Option<PathBuf> {
        let dir = self.dir();
        if dir.is_none() {
            crate::skip(&format!(
                "{what}: no {} (`caret models pull {}`, or {} naming its directory)",
                self.name(),
                self.name(),
                self.var()
            ));
        }
        dir
    }

    fn installed(self, dir: &Path) -> bool {
        let has = |f: &str| dir.join(f).is_file();
        match self {
            TestModel::Embedding => has("model.onnx") && has("tokenizer.json"),
            TestModel::EmbeddingF32 => has("model.safetensors") && has("tokenizer.json"),
            TestModel::SmallLlm | TestModel::CodeLlm => std::fs::read_dir(dir)
                .map(|entries| entries.flatten().any(|e| e.path().extension().is_some_and(|x| x == "gguf")))
                .unwrap_or(false),
        }
    }
}
