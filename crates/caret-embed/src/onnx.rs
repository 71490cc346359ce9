//! A BERT-family encoder exported to ONNX (`model.onnx`, int8 or f32), run with ONNX Runtime.
//!
//! The runtime is a shared library loaded at run time: `libonnxruntime.so` in the model
//! directory (`caret models pull` installs it from the `onnxruntime` wheel), else the file
//! `ORT_DYLIB_PATH` names. One runtime environment serves the whole process.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::Tensor;

/// The runtime library's file name inside a model directory.
pub const RUNTIME_LIBRARY: &str = "libonnxruntime.so";

/// Most sessions one model keeps (each holds a copy of the weights).
const MAX_SESSIONS: usize = 8;

/// The process's ONNX Runtime environment, created with the first library found.
static ENVIRONMENT: OnceLock<std::result::Result<Environment, String>> = OnceLock::new();

fn environment(library: &Path) -> std::result::Result<Environment, String> {
    ENVIRONMENT
        .get_or_init(|| {
            let builder = ort::init_from(library).map_err(|e| format!("loading ONNX Runtime: {e}"))?;
            builder.with_name("caret").build().map_err(|e| format!("starting ONNX Runtime: {e}"))
        })
        .clone()
}

/// Where the runtime library is for a model in `dir`.
fn runtime_library(dir: &Path) -> std::result::Result<PathBuf, String> {
    let beside = dir.join(RUNTIME_LIBRARY);
    if beside.exists() {
        return Ok(beside);
    }
    match std::env::var_os("ORT_DYLIB_PATH") {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => Err(format!(
            "no ONNX Runtime library: neither {} nor ORT_DYLIB_PATH (a catalog model installs it: `caret models pull`)",
            beside.display()
        )),
    }
}

/// An ONNX encoder: token ids and attention mask in, the last hidden state out.
pub(crate) struct OnnxEncoder {
    /// Sessions of one model; batches running side by side each take their own.
    sessions: Vec<Mutex<Session>>,
    /// Whether the graph takes `token_type_ids` (exports differ).
    token_types: bool,
}

impl OnnxEncoder {
    /// Loads `dir/model.onnx` for `threads` threads in all: up to [`MAX_SESSIONS`] sessions
    /// (one per batch run side by side), the threads shared out among them, and one more for
    /// callers outside the pool (a search's query), so that they never wait behind a batch.
    pub(crate) fn load(dir: &Path, threads: usize) -> std::result::Result<Self, String> {
        let env = environment(&runtime_library(dir)?)?;
        let model = dir.join("model.onnx");
        let pooled = threads.clamp(1, MAX_SESSIONS);
        let intra = (threads / pooled).max(1);
        let sessions = pooled + 1;
        let open = || -> ort::Result<Session> {
            Session::builder(&env)?
                .with_optimization_level(GraphOptimizationLevel::All)?
                .with_intra_threads(intra)?
                .with_inter_threads(1)?
                .commit_from_file(&model)
        };
        let sessions: Vec<Mutex<Session>> = (0..sessions)
            .map(|_| open().map(Mutex::new).map_err(|e| format!("{}: {e}", model.display())))
            .collect::<std::result::Result<_, _>>()?;
        let names: Vec<String> = sessions
            .first()
            .and_then(|s| s.lock().ok().map(|s| s.inputs().iter().map(|i| i.name().to_owned()).collect()))
            .unwrap_or_default();
        for needed in ["input_ids", "attention_mask"] {
            if !names.iter().any(|n| n == needed) {
                return Err(format!("{} has no input {needed:?} (inputs: {names:?})", model.display()));
            }
        }
        let token_types = names.iter().any(|n| n == "token_type_ids");
        Ok(OnnxEncoder { sessions, token_types })
    }

    /// The last hidden state, `rows × len × dim` row-major, for `ids` and `mask` (each
    /// `rows × len`).
    pub(crate) fn hidden(
        &self,
        ids: &[u32],
        mask: &[u32],
        rows: usize,
        len: usize,
        dim: usize,
    ) -> std::result::Result<Vec<f32>, String> {
        let as_i64 = |v: &[u32]| v.iter().map(|x| i64::from(*x)).collect::<Vec<i64>>();
        let shape = [rows, len];
        let tensor = |v: Vec<i64>| Tensor::from_array((shape, v)).map_err(|e| e.to_string());
        let mut inputs: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = vec![
            ("input_ids".into(), tensor(as_i64(ids))?.into()),
            ("attention_mask".into(), tensor(as_i64(mask))?.into()),
        ];
        if self.token_types {
            inputs.push(("token_type_ids".into(), tensor(vec![0; rows * len])?.into()));
        }
        // A worker of the embedder's pool takes the session of its index: no contention; a
        // caller outside the pool takes the last one, kept for it.
        let pooled = self.sessions.len().saturating_sub(1).max(1);
        let slot = rayon::current_thread_index().map_or(self.sessions.len() - 1, |i| i % pooled);
        let mut session = self.sessions[slot].lock().map_err(|_| "an ONNX session panicked".to_owned())?;
        let outputs = session.run(inputs).map_err(|e| e.to_string())?;
        let (out_shape, values) = outputs[0].try_extract_tensor::<f32>().map_err(|e| e.to_string())?;
        let expected = [rows as i64, len as i64, dim as i64];
        if **out_shape != expected {
            return Err(format!("the model's first output has shape {out_shape:?}, expected {expected:?}"));
        }
        Ok(values.to_vec())
    }
}
