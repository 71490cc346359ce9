//! Engine overhead per keystroke (everything but the model): context assembly on a large
//! file, the prompt, the cache lookup, and stop/trim over a streamed suggestion.
//! `cargo bench -p caret-complete --bench engine`

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Instant;

use caret_complete::context::{Budget, Snippet, approx_tokens, assemble};
use caret_complete::post::{Stopper, mode};
use caret_complete::{Cache, Family};

fn main() {
    let body: String = (0..10_000).map(|i| format!("        let value_{i} = compute({i}, &mut state);\n")).collect();
    let text = format!("impl Engine {{\n    fn run(&mut self) {{\n{body}    }}\n}}\n");
    let snippets: Vec<Snippet> = (0..8)
        .map(|f| Snippet {
            path: format!("src/module_{f}.rs"),
            text: (0..60).map(|i| format!("pub fn helper_{f}_{i}(x: u32) -> u32 {{ x + {i} }}\n")).collect(),
        })
        .collect();
    let family = Family::QwenCoder;
    let mut cache = Cache::default();
    let stream = ["compute(", "5000, ", "&mut ", "state);", "\n", "        let next = 1;\n"];
    let mut times = Vec::new();
    for k in 0..400 {
        let cursor = text.find("let value_5000").unwrap() + 4 + (k % 8);
        let t = Instant::now();
        let ctx = assemble(&text, cursor, Some("src/engine.rs"), &snippets, Budget::default(), &approx_tokens);
        let hit = cache.get("src/engine.rs", &ctx.prefix, &ctx.suffix);
        let prompt = family.render(&ctx);
        let mut stop = Stopper::new(mode(&ctx.prefix, &ctx.suffix), &ctx.prefix, &ctx.suffix, family.stop());
        for c in stream {
            if stop.push(c) {
                break;
            }
        }
        let out = stop.finish();
        cache.put("src/engine.rs", &ctx.prefix, &ctx.suffix, &out);
        times.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box((hit, prompt));
    }
    times.sort_by(f64::total_cmp);
    println!(
        "engine overhead, {} lines ({} KiB), budget {} tokens, {} snippets; median / p99 / worst of {}:",
        text.lines().count(),
        text.len() / 1024,
        Budget::default().tokens,
        snippets.len(),
        times.len()
    );
    println!(
        "  assemble + cache + prompt + stop/trim  {:.3} ms / {:.3} ms / {:.3} ms",
        times[times.len() / 2],
        times[times.len() * 99 / 100],
        times[times.len() - 1]
    );
}
