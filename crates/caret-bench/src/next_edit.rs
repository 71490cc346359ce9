//! `caret bench next-edit`: next-edit prediction on real history, each language apart. Each
//! case is a file's text, the first of two nearby hunks of a real change (applied as the
//! user's recent edit) and the next hunk (what they did next); the sets are the evaluation
//! halves that `scripts/next-edit-data.py` made from registry packages (Python, TypeScript,
//! Rust, Go) and this repository's history, the older set of this repository's commits with
//! short excerpts (`scripts/next-edit-set.py`), and a set a language with another file open
//! beside the edited one, the next hunk in either. A prediction is in place when it lands in
//! the next hunk's file within 2 lines of it, and exact when applying it gives the text the
//! next hunk gives. Rows, without any model call:
//! - two naive baselines: the last edit's substitution at the next place that holds what it
//!   replaced; a jump to the line below the edit;
//! - the rules alone (`caret_complete`: repeat, insert, call sites, import), nearest first;
//! - the ranker (`caret_next_edit`): its best place, with the rules' rewrite on its line when
//!   one applies, else a jump;
//! - the bound on exact: the share of cases where any rule's rewrite is exact.
//!
//! With `--model-cases N` (and a model configured or installed), the first N cases of each set
//! also go to the model (a Zeta-shaped prompt), alone and as Tab serves it behind the rules.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use caret_complete::next_edit::{self, History, Prediction, Why};
use caret_host::config::Config;
use caret_host::runtime::runtime;
use caret_next_edit::cases::{self, Case, Setup};
use caret_next_edit::{Ranker, predict, rules};

use crate::search::percentile;

/// The sets: a label and the cases.
const SETS: &[(&str, &str)] = &[
    ("python", include_str!("data/next-edit/python.jsonl")),
    ("typescript", include_str!("data/next-edit/typescript.jsonl")),
    ("rust", include_str!("data/next-edit/rust.jsonl")),
    ("go", include_str!("data/next-edit/go.jsonl")),
    ("caret commits, short excerpts", include_str!("data/next-edit/caret-history.jsonl")),
    ("python, another file open", include_str!("data/next-edit/python-open.jsonl")),
    ("typescript, another file open", include_str!("data/next-edit/typescript-open.jsonl")),
    ("rust, another file open", include_str!("data/next-edit/rust-open.jsonl")),
    ("go, another file open", include_str!("data/next-edit/go-open.jsonl")),
];

/// What `caret bench next-edit` measures.
#[derive(Debug, Clone)]
pub struct NextEditBench {
    /// The model alias (none: the configured `next-edit`, `tab` or first alias, if any).
    pub model: Option<String>,
    /// Cases of each set asked of the model (it is slow on a CPU; 0: no model rows).
    pub model_cases: usize,
}

#[derive(Default)]
struct Score {
    asked: usize,
    predicted: usize,
    placed: usize,
    exact: usize,
    ms: Vec<f64>,
}

impl Score {
    fn add(&mut self, p: Option<&Prediction>, s: &Setup, ms: f64) {
        self.asked += 1;
        self.ms.push(ms);
        let Some(p) = p else { return };
        self.predicted += 1;
        self.placed += usize::from(s.placed(p));
        self.exact += usize::from(s.exact(p));
    }

    fn print(&mut self, label: &str) {
        self.ms.sort_by(f64::total_cmp);
        let n = self.asked.max(1) as f64;
        println!(
            "  {label:<30} {:>4} cases: predicted {:>5.1}%  in place {:>5.1}%  exact {:>5.1}%  p50 {:.2} ms  p99 {:.2} ms",
            self.asked,
            100.0 * self.predicted as f64 / n,
            100.0 * self.placed as f64 / n,
            100.0 * self.exact as f64 / n,
            percentile(&self.ms, 0.5),
            percentile(&self.ms, 0.99)
        );
    }
}

/// The naive baseline: the last edit's `old` → `new` at its next occurrence below the edit,
/// else above it (none: no prediction).
fn naive(s: &Setup, path: &str) -> Option<Prediction> {
    let last = &s.last;
    let after_edit = last.start + last.new.len();
    if !last.old.is_empty() {
        let below = s.text[after_edit..].find(&last.old).map(|i| after_edit + i);
        let above = s.text[..last.start].rfind(&last.old);
        if let Some(at) = below.or(above) {
            return Some(Prediction {
                path: path.to_owned(),
                start: at,
                end: at + last.old.len(),
                replacement: last.new.clone(),
                why: Why::Repeat,
            });
        }
    }
    None
}

/// The place baseline: a jump to the line below the edit.
fn line_below(s: &Setup, path: &str) -> Prediction {
    let after_edit = s.last.start + s.last.new.len();
    let next_line = s.text[after_edit..].find('\n').map_or(s.text.len(), |i| after_edit + i + 1);
    Prediction { path: path.to_owned(), start: next_line, end: next_line, replacement: String::new(), why: Why::Jump }
}

/// Runs the benchmark and prints its figures.
pub fn run(config: &Config, bench: NextEditBench) -> anyhow::Result<ExitCode> {
    let backend = if bench.model_cases == 0 {
        None
    } else {
        caret_host::backend::Backend::connect(
            config,
            None,
            None,
            bench.model.as_deref(),
            &["next-edit", "tab", caret_host::config::DEFAULT_CODE_ALIAS],
            "tab",
        )?
    };
    let ranker = Ranker::shipped();
    println!(
        "next edit on real history (in place: within 2 lines of the next hunk; no row calls a model but the model's)"
    );
    for (label, set) in SETS {
        let cases = cases::parse(set).map_err(anyhow::Error::msg).with_context(|| format!("the {label} set"))?;
        let ready: Vec<(&Case, Setup)> = cases.iter().filter_map(|c| Some((c, c.setup()?))).collect();
        let elsewhere = ready.iter().filter(|(c, s)| s.next_path != c.path).count();
        println!(
            "{label}: {} cases ({} whose hunks did not apply left out{})",
            ready.len(),
            cases.len() - ready.len(),
            if elsewhere > 0 { format!("; {elsewhere} whose next hunk is in the open file") } else { String::new() }
        );
        let [mut base, mut below, mut alone, mut ranked, mut repeat_first, mut served, mut model, mut both, mut own] =
            std::array::from_fn(|_| Score::default());
        let mut bound = 0;
        for (c, s) in &ready {
            let t = Instant::now();
            let p = naive(s, &c.path);
            base.add(p.as_ref(), s, t.elapsed().as_secs_f64() * 1e3);
            let open = c.open();
            let t = Instant::now();
            let found = rules(&s.last, &c.path, &s.text, s.cursor, &open);
            let rules_ms = t.elapsed().as_secs_f64() * 1e3;
            alone.add(found.first(), s, rules_ms);
            let t = Instant::now();
            let p = predict(ranker, &s.last, &c.path, &s.text, &open, &found);
            ranked.add(p.as_ref(), s, rules_ms + t.elapsed().as_secs_f64() * 1e3);
            // As Tab served it before: a repeat of the edit (a rename's next use) nearest first,
            // else the ranker.
            let t = Instant::now();
            let repeat = next_edit::candidates(&s.last, &c.path, &s.text, s.cursor).into_iter().next();
            let p = repeat.or_else(|| predict(ranker, &s.last, &c.path, &s.text, &open, &found));
            repeat_first.add(p.as_ref(), s, rules_ms + t.elapsed().as_secs_f64() * 1e3);
            // As Tab serves it with no model: the ranker, a repeat's place the nearest repeat.
            let t = Instant::now();
            let repeats = next_edit::candidates(&s.last, &c.path, &s.text, s.cursor);
            let p = caret_next_edit::served(&s.last, &c.path, &s.text, &open, repeats);
            served.add(p.as_ref(), s, t.elapsed().as_secs_f64() * 1e3);
            below.add(Some(&line_below(s, &c.path)), s, 0.0);
            if !open.is_empty() {
                // The ranker blind to the open file: what reaching into it adds.
                let t = Instant::now();
                let found = rules(&s.last, &c.path, &s.text, s.cursor, &[]);
                own.add(
                    predict(ranker, &s.last, &c.path, &s.text, &[], &found).as_ref(),
                    s,
                    t.elapsed().as_secs_f64() * 1e3,
                );
            }
            bound += usize::from(found.iter().any(|p| s.exact(p)));
        }
        base.print("naive: its substitution again");
        below.print("naive: the line below");
        alone.print("rules alone, nearest first");
        ranked.print("ranker (+ rules' rewrite)");
        repeat_first.print("a repeat nearest, else ranker");
        served.print("as served (repeats in order)");
        if own.asked > 0 {
            own.print("ranker, the edited file alone");
        }
        println!(
            "  {:<30} {:>4} cases: a rule's rewrite somewhere is exact in {:.1}% (the bound on exact without a model)",
            "",
            ready.len(),
            100.0 * bound as f64 / ready.len().max(1) as f64
        );
        let Some((backend, alias)) = &backend else { continue };
        runtime()?.block_on(async {
            for (c, s) in ready.iter().take(bench.model_cases) {
                let mut history = History::default();
                history.open(&c.path, &c.text);
                history.settle(&c.path, &s.text);
                let t = Instant::now();
                let region = next_edit::region(&s.text, s.cursor, 3, 12);
                let prompt = next_edit::prompt(history.edits(), &c.path, &s.text, s.cursor, region, 8);
                let mut req = caret_protocol::llm::CompletionRequest::greedy(alias.clone(), prompt, 400);
                req.stop = Some(caret_protocol::llm::Stop::One(next_edit::REGION_END.to_owned()));
                let (mut answer, ended) = backend.complete_text(req).await?;
                // The stop sequence ends the stream without itself; a region cut at the token
                // limit is no prediction.
                if ended {
                    answer.push_str(next_edit::REGION_END);
                }
                let predicted = next_edit::parse(&answer)
                    .and_then(|rewritten| next_edit::region_edit(&c.path, &s.text, region, &rewritten));
                let ms = t.elapsed().as_secs_f64() * 1e3;
                model.add(predicted.as_ref(), s, ms);
                let found = rules(&s.last, &c.path, &s.text, s.cursor, &c.open());
                match found.first() {
                    Some(p) => both.add(Some(p), s, 0.0),
                    None => both.add(predicted.as_ref(), s, ms),
                }
            }
            anyhow::Ok(())
        })?;
        model.print(&format!("model {alias}"));
        both.print("rules, else the model");
    }
    if bench.model_cases > 0 && backend.is_none() {
        println!("no model configured or installed: the model's rows are left out");
    }
    Ok(ExitCode::SUCCESS)
}
