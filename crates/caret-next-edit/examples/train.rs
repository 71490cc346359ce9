//! Trains the next-edit ranker: `train OUT SET... [--eval SET...]` reads history cases (JSON
//! lines, as `scripts/next-edit-data.py build` writes them), fits the weights, writes them to
//! OUT and prints how often the best place is right on each `--eval` set. Run by
//! `scripts/next-edit-data.py train`.

use std::time::Instant;

use caret_next_edit::{cases, train};

fn examples(set: &str) -> Result<(usize, Vec<train::Example>), String> {
    let text = std::fs::read_to_string(set).map_err(|e| format!("{set}: {e}"))?;
    let cases = cases::parse(&text).map_err(|e| format!("{set}: {e}"))?;
    Ok((cases.len(), cases.iter().filter_map(train::example).collect()))
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (out, rest) = args.split_first().ok_or("usage: train OUT SET... [--eval SET...]")?;
    let split = rest.iter().position(|a| a == "--eval").unwrap_or(rest.len());
    let (sets, evals) = (&rest[..split], rest.get(split + 1..).unwrap_or_default());
    let started = Instant::now();
    let mut all = Vec::new();
    for set in sets {
        let (n, e) = examples(set)?;
        eprintln!("{set}: {n} cases, {} with the next hunk among the candidates", e.len());
        all.extend(e);
    }
    let ranker = train::fit(&all, 1e-3, 400);
    eprintln!(
        "{} examples: loss {:.3}, best place right {:.3}, {:.1} s",
        all.len(),
        train::mean_loss(&ranker, &all),
        train::top1(&ranker, &all),
        started.elapsed().as_secs_f64()
    );
    for set in evals {
        let (n, e) = examples(set)?;
        // Over all cases: one whose next hunk is out of the candidates' reach counts as missed.
        eprintln!(
            "{set}: best place right {:.3} of {n} cases",
            train::top1(&ranker, &e) * e.len() as f64 / n.max(1) as f64
        );
    }
    let head = "# Next edit's ranker: one weight a feature (crates/caret-next-edit/src/features.rs).\n\
                # Written by scripts/next-edit-data.py train; do not edit by hand.\n";
    std::fs::write(out, format!("{head}{}", ranker.to_text())).map_err(|e| format!("{out}: {e}"))
}
