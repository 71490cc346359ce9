//! Applying each edit format to a 10,000-line file: parse + locate + splice + render, median
//! and worst of 200 runs. `cargo bench -p caret-apply --bench apply [-- LINES]`.
#![allow(clippy::expect_used)]

use std::time::{Duration, Instant};

use caret_apply::{Format, Text};

/// A Rust-like file of `n` lines: many small functions with similar bodies, so anchors must
/// be told apart by their names.
fn file(n: usize) -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.lines().count() < n {
        s.push_str(&format!(
            "/// Step {i}.\nfn step_{i}(state: &mut State) -> Result<(), Error> {{\n    let n = state.next()?;\n    state.total += n * {i};\n    Ok(())\n}}\n\n"
        ));
        i += 1;
    }
    s
}

fn time(text: &Text, edit: &str, format: Format) -> (Duration, Duration) {
    let mut runs: Vec<Duration> = (0..200)
        .map(|_| {
            let start = Instant::now();
            let (out, _) = caret_apply::apply(text, edit, Some(format), None).expect("the edit applies");
            std::hint::black_box(out.render());
            start.elapsed()
        })
        .collect();
    runs.sort();
    (runs[runs.len() / 2], runs[runs.len() - 1])
}

fn main() {
    let lines: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let src = file(lines);
    let text = Text::new(&src);
    let k = text.lines.len() / 7 - 3; // a function near the end
    let body = |i: usize| format!("    state.total += n * {i};");
    let edits = [
        (
            Format::SearchReplace,
            format!(
                "<<<<<<< SEARCH\nfn step_{k}(state: &mut State) -> Result<(), Error> {{\n    let n = state.next()?;\n{}\n=======\nfn step_{k}(state: &mut State) -> Result<(), Error> {{\n    let n = state.next()?.max(1);\n{}\n>>>>>>> REPLACE\n",
                body(k),
                body(k)
            ),
        ),
        (
            Format::Udiff,
            format!(
                "--- a/f.rs\n+++ b/f.rs\n@@ -1,4 +1,4 @@\n fn step_{k}(state: &mut State) -> Result<(), Error> {{\n-    let n = state.next()?;\n+    let n = state.next()?.max(1);\n {}\n",
                body(k)
            ),
        ),
        (
            Format::Lazy,
            format!(
                "// ... existing code ...\nfn step_{k}(state: &mut State) -> Result<(), Error> {{\n    let n = state.next()?.max(1);\n{}\n    Ok(())\n}}\n// ... existing code ...\n",
                body(k)
            ),
        ),
    ];
    println!(
        "{} lines, {} KiB; median / worst of 200 (parse, locate, splice, render):",
        text.lines.len(),
        src.len() / 1024
    );
    for (format, edit) in &edits {
        let (p50, max) = time(&text, edit, *format);
        println!("  {:<15} {:>8.3} ms / {:>8.3} ms", format.name(), p50.as_secs_f64() * 1e3, max.as_secs_f64() * 1e3);
    }
}
