//! Links `caret` as a position-dependent executable on Linux unless `CARET_PIE=1`.
//!
//! A position-independent image of this size (tree-sitter grammars, llama.cpp, ONNX Runtime)
//! carries ~120,000 relative relocations over 2 MB of pointers: the loader rewrites them, and
//! the kernel copies ~500 pages, on every start — a quarter of a `caret scan` that the daemon
//! answers (docs/indexing.md). What is given up is the randomised address of the binary's own
//! image (its libraries, stack and heap stay randomised); an operator who wants it back for a
//! server builds with `CARET_PIE=1`.

fn main() {
    println!("cargo:rerun-if-env-changed=CARET_PIE");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let pie = std::env::var("CARET_PIE").is_ok_and(|v| v == "1");
    if os == "linux" && env == "gnu" && !pie {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}
