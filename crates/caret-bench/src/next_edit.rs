//! `caret bench next-edit`: next-edit prediction on real history. Each case of the kept set
//! (`data/next-edit/caret-history.jsonl`, built by `scripts/next-edit-set.py` from this
//! repository's commits) is a file excerpt, the first small hunk of a commit (applied as the
//! user's recent edit) and the next hunk (what they did next). The prediction is right in
//! place when it lands within 2 lines of the next hunk, and exact when applying it gives the
//! text the next hunk gives. Reported for the deterministic candidates alone, for a model
//! alone (a Zeta-shaped prompt; `--model`, or the configured/installed default), and for
//! both as Tab serves them (a candidate when there is one, else the model), with the time
//! each prediction took.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use caret_complete::next_edit::{self, History, Prediction};
use caret_host::config::Config;
use caret_host::runtime::runtime;
use serde::Deserialize;

use crate::search::percentile;

/// The kept set.
const SET: &str = include_str!("data/next-edit/caret-history.jsonl");

#[derive(Debug, Deserialize)]
struct Hunk {
    /// 1-based line of the excerpt where it starts (an insertion goes before it).
    line: usize,
    old: Vec<String>,
    new: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Case {
    /// Where it comes from (kept for reading the set).
    #[allow(dead_code)]
    commit: String,
    path: String,
    text: String,
    first: Hunk,
    next: Hunk,
}

/// What `caret bench next-edit` measures.
#[derive(Debug, Clone)]
pub struct NextEditBench {
    /// The model alias (none: the configured `next-edit`, `tab` or first alias, if any).
    pub model: Option<String>,
    /// Cases the model is asked about (it is slow on a CPU; the candidates see every case).
    pub model_cases: usize,
}

/// `text` with `hunk` applied at line `line` (lines of `text`; 1-based); the byte where the
/// new lines end.
fn apply(text: &str, line: usize, hunk: &Hunk) -> Option<(String, usize)> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let at = line.checked_sub(1)?;
    if at > lines.len() || at + hunk.old.len() > lines.len() {
        return None;
    }
    let there: Vec<&str> = lines[at..at + hunk.old.len()].iter().map(|l| l.trim_end_matches('\n')).collect();
    if there != hunk.old {
        return None;
    }
    let mut out: String = lines[..at].concat();
    for l in &hunk.new {
        out.push_str(l);
        out.push('\n');
    }
    let end = out.len();
    out.push_str(&lines[at + hunk.old.len()..].concat());
    Some((out, end))
}

fn line_of(text: &str, byte: usize) -> usize {
    text[..byte.min(text.len())].matches('\n').count() + 1
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
    fn add(&mut self, p: Option<&Prediction>, text: &str, target_line: usize, truth: &str, ms: f64) {
        self.asked += 1;
        self.ms.push(ms);
        let Some(p) = p else { return };
        self.predicted += 1;
        self.placed += usize::from(line_of(text, p.start).abs_diff(target_line) <= 2);
        self.exact += usize::from(p.apply(text) == truth);
    }

    fn print(&mut self, label: &str) {
        self.ms.sort_by(f64::total_cmp);
        let n = self.asked.max(1) as f64;
        println!(
            "{label:<28} {:>4} cases: predicted {:>5.1}%  right place {:>5.1}%  exact {:>5.1}%  p50 {:.2} ms  p99 {:.2} ms",
            self.asked,
            100.0 * self.predicted as f64 / n,
            100.0 * self.placed as f64 / n,
            100.0 * self.exact as f64 / n,
            percentile(&self.ms, 0.5),
            percentile(&self.ms, 0.99)
        );
    }
}

/// Runs the benchmark and prints its figures.
pub fn run(config: &Config, bench: NextEditBench) -> anyhow::Result<ExitCode> {
    let cases: Vec<Case> = SET
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("the next-edit set")?;
    let backend = caret_host::backend::Backend::connect(
        config,
        None,
        None,
        bench.model.as_deref(),
        &["next-edit", "tab", caret_host::config::DEFAULT_CODE_ALIAS],
        "tab",
    )?;
    let (mut alone, mut model, mut both) = (Score::default(), Score::default(), Score::default());
    let mut skipped = 0;
    runtime()?.block_on(async {
        for (i, c) in cases.iter().enumerate() {
            let Some((text, cursor)) = apply(&c.text, c.first.line, &c.first) else {
                skipped += 1;
                continue;
            };
            let shift = c.first.new.len() as isize - c.first.old.len() as isize;
            let target = usize::try_from(c.next.line as isize + shift).unwrap_or(1);
            let Some((truth, _)) = apply(&text, target, &c.next) else {
                skipped += 1;
                continue;
            };
            let mut history = History::default();
            history.open(&c.path, &c.text);
            let t = Instant::now();
            let found = history
                .settle(&c.path, &text)
                .map(|last| next_edit::candidates(last, &c.path, &text, cursor))
                .unwrap_or_default();
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            alone.add(found.first(), &text, target, &truth, ms);
            let Some((backend, alias)) = &backend else { continue };
            if i >= bench.model_cases {
                continue;
            }
            let t = Instant::now();
            let region = next_edit::region(&text, cursor, 3, 12);
            let prompt = next_edit::prompt(history.edits(), &c.path, &text, cursor, region, 8);
            let mut req = caret_protocol::llm::CompletionRequest::greedy(alias.clone(), prompt, 400);
            req.stop = Some(caret_protocol::llm::Stop::One(next_edit::REGION_END.to_owned()));
            let (mut answer, ended) = backend.complete_text(req).await?;
            // The stop sequence ends the stream without itself; a region cut at the token
            // limit is no prediction.
            if ended {
                answer.push_str(next_edit::REGION_END);
            }
            let predicted = next_edit::parse(&answer)
                .and_then(|rewritten| next_edit::region_edit(&c.path, &text, region, &rewritten));
            let model_ms = t.elapsed().as_secs_f64() * 1000.0;
            model.add(predicted.as_ref(), &text, target, &truth, model_ms);
            match found.first() {
                Some(p) => both.add(Some(p), &text, target, &truth, ms),
                None => both.add(predicted.as_ref(), &text, target, &truth, ms + model_ms),
            }
        }
        anyhow::Ok(())
    })?;
    println!("next-edit on real history: {} cases ({skipped} whose hunks did not apply skipped)", cases.len());
    alone.print("deterministic candidates");
    match &backend {
        Some((_, alias)) => {
            model.print(&format!("model {alias}"));
            both.print("candidates, else the model");
        }
        None => println!("no model configured or installed: the model's rows are left out"),
    }
    Ok(ExitCode::SUCCESS)
}
