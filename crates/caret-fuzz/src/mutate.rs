//! A small mutation fuzzer for the test suite: no coverage feedback (that is libFuzzer's job
//! in `fuzz/`), but seeded from the corpus, mutated with byte edits, splices and the formats'
//! own tokens, and deterministic for a seed, so a short run finds shallow breakage on every
//! `cargo test` and replays exactly.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use crate::Target;

/// Tokens of the formats the targets read, spliced into inputs.
const DICTIONARY: &[&[u8]] = &[
    b"\n",
    b"\n\n",
    b"\r\n",
    b"\t",
    b"    ",
    b"<<<<<<< SEARCH\n",
    b"=======\n",
    b">>>>>>> REPLACE\n",
    b"--- a/src/a.rs\n+++ b/src/a.rs\n",
    b"@@ -1,3 +1,3 @@\n",
    b"@@ -0,0 +1 @@\n",
    b"*** Begin Patch\n",
    b"*** Update File: src/a.rs\n",
    b"*** Add File: b.txt\n",
    b"*** End Patch\n",
    b"// ... existing code ...\n",
    b"# ... existing code ...\n",
    b"data: ",
    b"event: ",
    b"[DONE]",
    b"{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":",
    b"{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"ls\"}}",
    b"<tool_call>",
    b"</tool_call>",
    b"{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}",
    b"```json\n",
    b"def ",
    b"class ",
    b"fn ",
    b"impl ",
    b"func ",
    b"function ",
    b"#include ",
    b"/*",
    b"*/",
    b"\"\"\"",
    b"{",
    b"}",
    b"(",
    b")",
    b"\"",
    b"'",
    b"\\",
    b"!",
    b"*",
    b"**/",
    b"/",
    b"[",
    b"]",
    b"AKIAIOSFODNN7EXAMPLE",
    b"-----BEGIN RSA PRIVATE KEY-----\n",
    b"ghp_",
    b"password = \"",
    b"\xff",
    b"\x00",
    b"\x7f",
    b"\xc3\xa9",
    b"\xe2\x80\x8b",
    b"\xf0\x9f\x98\x80",
];

/// Largest input made.
const MAX_LEN: usize = 16 * 1024;

/// Mutates `input` in place with one to eight edits, drawing splices from `corpus`.
pub fn mutate(rng: &mut fastrand::Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    for _ in 0..rng.usize(1..=8) {
        let len = input.len();
        match rng.u8(0..10) {
            0 if len > 0 => {
                let i = rng.usize(..len);
                input[i] ^= 1 << rng.u8(0..8);
            }
            1 if len > 0 => {
                let i = rng.usize(..len);
                input[i] = rng.u8(..);
            }
            2 => {
                let at = rng.usize(..=len);
                let bytes: Vec<u8> = (0..rng.usize(1..=8)).map(|_| rng.u8(..)).collect();
                input.splice(at..at, bytes);
            }
            3 if len > 0 => {
                let start = rng.usize(..len);
                let end = (start + rng.usize(1..=len.min(64))).min(len);
                input.drain(start..end);
            }
            4 if len > 0 => {
                let start = rng.usize(..len);
                let end = (start + rng.usize(1..=len.min(64))).min(len);
                let copy = input[start..end].to_vec();
                let at = rng.usize(..=len);
                input.splice(at..at, copy);
            }
            5 | 6 => {
                let token = DICTIONARY[rng.usize(..DICTIONARY.len())];
                let at = rng.usize(..=len);
                input.splice(at..at, token.iter().copied());
            }
            7 if !corpus.is_empty() => {
                let other = &corpus[rng.usize(..corpus.len())];
                if !other.is_empty() {
                    let from = rng.usize(..other.len());
                    let at = rng.usize(..=len);
                    input.truncate(at);
                    input.extend_from_slice(&other[from..]);
                }
            }
            8 if len > 0 => input.truncate(rng.usize(..len)),
            _ => {
                let at = rng.usize(..=len);
                let byte = [0u8, 0xff, 0x7f, b'\n', b'{', b'"', b'<', b'-', b'0', b'9'][rng.usize(..10)];
                input.insert(at, byte);
            }
        }
    }
    input.truncate(MAX_LEN);
}

/// A broken invariant (or a panic): the input that did it, and the message.
#[derive(Debug)]
pub struct Failure {
    /// The input.
    pub input: Vec<u8>,
    /// The panic's message.
    pub message: String,
}

/// Runs one input, catching a panic.
pub fn run_one(target: &Target, input: &[u8]) -> Result<(), Failure> {
    catch_unwind(AssertUnwindSafe(|| (target.run)(input))).map_err(|payload| Failure {
        input: input.to_vec(),
        message: payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic without a message".to_owned()),
    })
}

/// Runs every corpus input, then mutations of them until `budget` is spent (at least
/// `min_runs` mutations). Returns the number of inputs run, or the first failure.
pub fn run(target: &Target, corpus: &[Vec<u8>], budget: Duration, min_runs: u64, seed: u64) -> Result<u64, Failure> {
    let started = Instant::now();
    let mut runs = 0u64;
    for input in corpus {
        run_one(target, input)?;
        runs += 1;
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut mutations = 0u64;
    while mutations < min_runs || started.elapsed() < budget {
        let mut input = if corpus.is_empty() { Vec::new() } else { corpus[rng.usize(..corpus.len())].clone() };
        mutate(&mut rng, &mut input, corpus);
        run_one(target, &input)?;
        runs += 1;
        mutations += 1;
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_deterministic_and_bounded() {
        let corpus = vec![b"hello world\n".to_vec(), vec![0; MAX_LEN]];
        let made = |seed| {
            let mut rng = fastrand::Rng::with_seed(seed);
            (0..200)
                .map(|i| {
                    let mut input = corpus[i % 2].clone();
                    mutate(&mut rng, &mut input, &corpus);
                    assert!(input.len() <= MAX_LEN);
                    input
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(made(7), made(7));
        assert_ne!(made(7), made(8));
        assert!(made(7).iter().any(|m| m.len() < 12), "some shrink");
        assert!(made(7).iter().any(|m| m.len() > 12 && m.len() < 100), "some grow");
    }

    #[test]
    fn a_panicking_target_is_reported_with_its_input() {
        fn picky(data: &[u8]) {
            assert!(!data.contains(&b'!'), "found a bang");
        }
        let target = Target { name: "picky", run: picky };
        let failure = run(&target, &[b"abc".to_vec()], Duration::ZERO, 10_000, 1).unwrap_err();
        assert!(failure.input.contains(&b'!'), "{failure:?}");
        assert_eq!(failure.message, "found a bang");
        assert_eq!(run(&target, &[b"abc".to_vec()], Duration::ZERO, 0, 1).unwrap(), 1);
    }
}
