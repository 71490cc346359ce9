//! Chooses the training's weight on exact rewrites without looking at the evaluation sets:
//! `cross_validate WEIGHTS SET...` (`WEIGHTS` comma-separated, e.g. `0.3,1`) fits the ranker on
//! the training cases of seven packages in ten (by a hash of the package's name) with each
//! weight, and prints how often the answer as served is in place and exact on the other three.
//! The sets are the training halves `scripts/next-edit-data.py build` writes.

use caret_complete::next_edit;
use caret_next_edit::{cases, served_by, train};

/// Whether a case's package is among the three in ten held out (FNV-1a of its name).
fn held_out(source: &str) -> bool {
    let package = source.split('@').next().unwrap_or("");
    let hash = package.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    hash % 10 < 3
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (weights, sets) = args.split_first().ok_or("usage: cross_validate WEIGHTS SET...")?;
    let weights: Vec<f64> =
        weights.split(',').map(|w| w.parse().map_err(|e| format!("{w}: {e}"))).collect::<Result<_, _>>()?;
    let mut fitting = Vec::new();
    let mut held = Vec::new();
    for set in sets {
        let text = std::fs::read_to_string(set).map_err(|e| format!("{set}: {e}"))?;
        let (out, kept): (Vec<_>, Vec<_>) =
            cases::parse(&text).map_err(|e| format!("{set}: {e}"))?.into_iter().partition(|c| held_out(&c.source));
        fitting.extend(kept.iter().filter_map(train::example));
        held.push((set.rsplit('/').next().unwrap_or(set).to_owned(), out));
    }
    eprintln!("{} examples fitted", fitting.len());
    for weight in weights {
        let ranker = train::fit_weighing_exact(&fitting, 1e-3, 400, weight);
        for (name, cases) in &held {
            let (mut n, mut placed, mut exact) = (0, 0, 0);
            for c in cases {
                let Some(s) = c.setup() else { continue };
                let open = c.open();
                let repeats = next_edit::candidates(&s.last, &c.path, &s.text, s.cursor);
                let p = served_by(&ranker, &s.last, &c.path, &s.text, &open, repeats);
                n += 1;
                placed += usize::from(p.as_ref().is_some_and(|p| s.placed(p)));
                exact += usize::from(p.as_ref().is_some_and(|p| s.exact(p)));
            }
            let pct = |k: usize| 100.0 * k as f64 / n.max(1) as f64;
            println!(
                "exact weight {weight:.2}  {name:<28} {n:>5} cases: in place {:.1}%  exact {:.1}%",
                pct(placed),
                pct(exact)
            );
        }
    }
    Ok(())
}
