//! A short run of every fuzz target (seconds each): its seed corpus from `fuzz/corpus/NAME/`,
//! then mutations. `CARET_FUZZ_SECONDS` (default 2) sets the time per target and
//! `CARET_FUZZ_SEED` the seed — by default a new one each run, so that every run of the suite
//! tries other inputs; the seed is printed with the result and in a failure's message, and
//! `CARET_FUZZ_SEED=N` replays that run. A failing input is also written under the target
//! directory and its path printed, to replay with `cargo +nightly fuzz run NAME FILE`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn corpus(name: &str) -> Vec<Vec<u8>> {
    let dir = repo().join("fuzz/corpus").join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the seed corpus {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let inputs: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(!inputs.is_empty(), "the seed corpus {} is empty", dir.display());
    inputs
}

fn short_run(name: &str) {
    let target = caret_fuzz::target(name).unwrap_or_else(|| panic!("no target {name}"));
    let seconds: f64 = std::env::var("CARET_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let seed: u64 =
        std::env::var("CARET_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| fastrand::u64(..));
    let corpus = corpus(name);
    // Printed first too: an abort (an allocation failure, say) ends the process before a result.
    eprintln!("{name}: seed {seed}");
    match caret_fuzz::mutate::run(target, &corpus, Duration::from_secs_f64(seconds), 200, seed) {
        Ok(runs) => eprintln!("{name}: {runs} inputs, no failure (seed {seed}: CARET_FUZZ_SEED={seed} replays it)"),
        Err(failure) => {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join(format!("{name}-{}", &blake3::hash(&failure.input).to_hex()[..16]));
            std::fs::write(&file, &failure.input).unwrap();
            panic!(
                "{name} (seed {seed}: CARET_FUZZ_SEED={seed} replays it): {}\ninput ({} bytes) written to {}\n{:?}",
                failure.message,
                failure.input.len(),
                file.display(),
                String::from_utf8_lossy(&failure.input[..failure.input.len().min(2000)])
            );
        }
    }
}

macro_rules! short_runs {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { short_run(stringify!($name)); })*

        /// Every target has a test here, a seed corpus and a libFuzzer binary in fuzz/.
        #[test]
        fn every_target_is_run_here_and_by_libfuzzer() {
            let here = [$(stringify!($name)),*];
            let manifest = std::fs::read_to_string(repo().join("fuzz/Cargo.toml")).unwrap();
            for t in caret_fuzz::TARGETS {
                assert!(here.contains(&t.name), "{} has no short run", t.name);
                let bin = repo().join("fuzz/fuzz_targets").join(format!("{}.rs", t.name));
                let source = std::fs::read_to_string(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
                assert!(source.contains(&format!("\"{}\"", t.name)), "{} runs another target", bin.display());
                assert!(manifest.contains(&format!("name = \"{}\"", t.name)), "fuzz/Cargo.toml lacks {}", t.name);
            }
            assert_eq!(here.len(), caret_fuzz::TARGETS.len());
        }
    };
}

short_runs!(
    chunker,
    secrets,
    edit_formats,
    search_replace_one_place,
    tokenizer,
    tokenizer_json,
    ignore_files,
    stat_cache,
    log_object,
    segment,
    stored_indexes,
    model_streams,
    local_tool_calls,
    http_api,
);
