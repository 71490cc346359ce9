//! Next edit's learned ranker: where the edit after the user's last one goes, without a model
//! call ("Tab to jump").
//!
//! - [`features`]: the candidate places (the lines around the edit) and their features.
//! - [`Ranker`]: a linear score over those features (a conditional logit: a softmax over one
//!   edit's candidates), its weights the file `src/weights.txt`, trained by the `train`
//!   example (`scripts/next-edit-data.py train`) on real history.
//! - [`predict`]: the best place, with the rules' rewrite there when one applies
//!   (`caret_complete::next_edit`, `calls`, `imports`), else the place alone ([`Why::Jump`]).
//! - [`analogous`]: rewrites of the ranker's own: an edit's changes within its lines carried
//!   to other lines, a deleted line's likes deleted.
//! - [`template`]: the edit again where its lines recur with other names.
//! - [`cases`]: the history cases both the training and `caret bench next-edit` read.
//! - [`train`]: the fitting, for the example and its test.
//!
//! Pure functions of their input: no model, no I/O.

mod aligned;
pub mod analogous;
pub mod cases;
pub mod features;
pub mod moves;
pub mod template;
mod tokens;
pub mod train;

use std::sync::OnceLock;

use caret_complete::next_edit::{Edit, Prediction, Why};

pub use features::{COUNT, NAMES};

/// The least share of the softmax over the candidates a jump needs (on the evaluation sets it
/// leaves 0–1.5% of pauses unanswered).
pub const JUMP_MIN: f32 = 0.1;

/// Lines from the best place within which a rule's rewrite is taken when the best line has
/// none (the place counts as found within 2 lines); among the best `REWRITE_AMONG` places.
const REWRITE_NEAR: usize = 2;
const REWRITE_AMONG: usize = 8;

/// The shipped weights.
const WEIGHTS: &str = include_str!("weights.txt");

/// Scores candidate places: the dot product of their features with its weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranker {
    weights: [f32; COUNT],
}

impl Ranker {
    /// The ranker with the weights this build ships.
    pub fn shipped() -> &'static Ranker {
        static SHIPPED: OnceLock<Ranker> = OnceLock::new();
        // The file is checked by a test; were it broken, every place would score alike.
        SHIPPED.get_or_init(|| Ranker::parse(WEIGHTS).unwrap_or(Ranker { weights: [0.0; COUNT] }))
    }

    /// A ranker with these weights (in the order of [`NAMES`]).
    pub fn new(weights: [f32; COUNT]) -> Ranker {
        Ranker { weights }
    }

    /// Reads a weights file: `name value` a line, `#` comments. A feature it does not name
    /// weighs nothing; a name that is no feature, or a value that is no number, is an error.
    pub fn parse(text: &str) -> Result<Ranker, String> {
        let mut weights = [0.0; COUNT];
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (name, value) = line.split_once(char::is_whitespace).ok_or(format!("line {}: no value", n + 1))?;
            let at =
                NAMES.iter().position(|x| *x == name).ok_or(format!("line {}: no feature is named {name}", n + 1))?;
            weights[at] = value.trim().parse().map_err(|e| format!("line {}: {e}", n + 1))?;
        }
        Ok(Ranker { weights })
    }

    /// The weights file for these weights.
    pub fn to_text(&self) -> String {
        NAMES.iter().zip(self.weights).map(|(n, w)| format!("{n} {w:.6}\n")).collect()
    }

    /// The weights, in the order of [`NAMES`].
    pub fn weights(&self) -> &[f32; COUNT] {
        &self.weights
    }

    /// A candidate's score.
    pub fn score(&self, features: &[f32; COUNT]) -> f32 {
        self.weights.iter().zip(features).map(|(w, x)| w * x).sum()
    }

    /// The candidate places after `last` in `text` and in the files open beside it
    /// (`others`: path and text; `Candidate::file` 1 is the first), best first, with their
    /// scores.
    pub fn places(
        &self,
        last: &Edit,
        path: &str,
        text: &str,
        others: &[(&str, &str)],
        rules: &[Prediction],
    ) -> Vec<(features::Candidate, f32)> {
        let all = features::candidates_everywhere(last, path, text, others, rules);
        let mut scored: Vec<_> = all.into_iter().map(|c| (self.score(&c.features), c)).collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.file.cmp(&b.1.file)).then(a.1.line.cmp(&b.1.line)));
        scored.into_iter().map(|(s, c)| (c, s)).collect()
    }
}

/// The next edit after `last` in `path` (now `text`), with `others` open beside it: the
/// ranker's best place, as the rules' prediction that starts on its line when there is one
/// (`rules`, nearest first; lines moved before the others), else as a jump to the place's
/// first non-blank byte.
pub fn predict(
    ranker: &Ranker,
    last: &Edit,
    path: &str,
    text: &str,
    others: &[(&str, &str)],
    rules: &[Prediction],
) -> Option<Prediction> {
    let places = ranker.places(last, path, text, others, rules);
    let (best, top) = places.first()?;
    let file = |c: &features::Candidate| if c.file == 0 { (path, text) } else { others[c.file - 1] };
    // The rules' rewrite on a line: its bytes, the newline included (as `cases::line_of`
    // counts).
    let on = |c: &features::Candidate| {
        let (path, text) = file(c);
        let from = text[..c.at].rfind('\n').map_or(0, |i| i + 1);
        let to = text[c.at..].find('\n').map_or(text.len(), |i| c.at + i);
        // Lines moved first (an import's old half deleted rather than the edit's lines
        // inserted again beside it: on the ranker's best lines of the training sets that hold
        // both, the lines moved were exact 11 times, the other rule never), else the first
        // found (`min_by_key` keeps the first of equals).
        rules.iter().filter(|p| p.path == path && (from..=to).contains(&p.start)).min_by_key(|p| p.why != Why::Moved)
    };
    // The best line's rewrite, else the best-scored rewrite within `REWRITE_NEAR` lines of
    // it in its file: as near the place, and written out.
    let rewrite = on(best).or_else(|| {
        places
            .iter()
            .take(REWRITE_AMONG)
            .filter(|(c, _)| {
                c.file == best.file && c.line.abs_diff(best.line) <= REWRITE_NEAR && c.features[features::INSIDE] == 0.0
            })
            .find_map(|(c, _)| on(c))
    });
    if rewrite.is_none() {
        // A jump needs the softmax's confidence, and somewhere to go: not the edit's own lines.
        let share = 1.0 / places.iter().map(|(_, s)| (s - top).exp()).sum::<f32>();
        if share < JUMP_MIN || best.features[features::INSIDE] > 0.0 {
            return None;
        }
    }
    Some(rewrite.cloned().unwrap_or_else(|| Prediction {
        path: file(best).0.to_owned(),
        start: best.at,
        end: best.at,
        replacement: String::new(),
        why: Why::Jump,
    }))
}

/// The rules' predictions after `last` in `path` (now `text`): the last edit repeated (`next_edit::candidates`), the
/// call sites of a changed signature, the import a new name needs, the other half of an import
/// moved (`imports::superseded`), the uses of a name an import no longer binds
/// (`imports::rebound`), then the edit again where
/// its lines recur with other names ([`template`]), lines moved ([`moves`]) and the analogous
/// rewrites and deletions within the candidates' reach ([`analogous`]).
/// In the files open beside it (`others`), a renamed name's uses and a changed signature's
/// calls.
pub fn rules(last: &Edit, path: &str, text: &str, cursor: usize, others: &[(&str, &str)]) -> Vec<Prediction> {
    let mut out = caret_complete::next_edit::candidates(last, path, text, cursor);
    out.extend(beyond_repeats(last, path, text, others));
    out
}

/// [`rules`] but the repeats of the edit.
fn beyond_repeats(last: &Edit, path: &str, text: &str, others: &[(&str, &str)]) -> Vec<Prediction> {
    use caret_complete::{calls, imports, next_edit};
    let mut out = calls::call_sites(last, path, text, others);
    out.extend(imports::missing_import(last, path, text, &[]));
    out.extend(imports::superseded(last, path, text));
    out.extend(imports::rebound(last, path, text));
    out.extend(template::predictions(last, path, text));
    out.extend(moves::predictions(last, path, text));
    out.extend(analogous::predictions(last, path, text));
    out.extend(next_edit::elsewhere(last, others));
    out
}

/// The ranker's answer with the shipped weights over all the rules, in the file and those open
/// beside it (`others`): what an editor shows when no repeat of the edit, other file's rule or
/// model answers.
pub fn guess(last: &Edit, path: &str, text: &str, cursor: usize, others: &[(&str, &str)]) -> Option<Prediction> {
    predict(Ranker::shipped(), last, path, text, others, &rules(last, path, text, cursor, others))
}

/// What an editor is offered after `last` without a model trained for next edits, given the
/// edit's `repeats` (`next_edit::candidates`, nearest first, as the editor found them): a
/// rename's nearest remaining use, so that Tab, Tab goes through them in order; else the
/// ranker's place over every rule ([`guess`]), the nearest repeat where that place is one.
pub fn served(
    last: &Edit,
    path: &str,
    text: &str,
    others: &[(&str, &str)],
    repeats: Vec<Prediction>,
) -> Option<Prediction> {
    served_by(Ranker::shipped(), last, path, text, others, repeats)
}

/// [`served`] with these weights (for their training and its measures).
pub fn served_by(
    ranker: &Ranker,
    last: &Edit,
    path: &str,
    text: &str,
    others: &[(&str, &str)],
    repeats: Vec<Prediction>,
) -> Option<Prediction> {
    let nearest = repeats.first().cloned();
    if caret_complete::next_edit::renamed(last).is_some() && nearest.is_some() {
        return nearest;
    }
    let mut rules = repeats;
    rules.extend(beyond_repeats(last, path, text, others));
    let placed = predict(ranker, last, path, text, others, &rules)?;
    match nearest {
        Some(nearest) if placed.why == Why::Repeat && placed.path == path => Some(nearest),
        _ => Some(placed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_weights_parse_and_name_every_feature() {
        let r = Ranker::shipped();
        let again = Ranker::parse(&r.to_text()).unwrap();
        for (a, b) in r.weights().iter().zip(again.weights()) {
            assert!((a - b).abs() < 1e-5);
        }
        for name in NAMES {
            assert!(WEIGHTS.lines().any(|l| l.split_whitespace().next() == Some(name)), "{name} has no weight");
        }
        assert_eq!(NAMES[features::INSIDE], "inside");
        assert!(Ranker::parse("nonsense 1").unwrap_err().contains("no feature is named nonsense"));
        assert!(Ranker::parse("near3 x").unwrap_err().starts_with("line 1:"));
    }

    #[test]
    fn an_open_files_lines_with_the_edits_names_are_places_too() {
        let before = "def area(w, h):\n    return w * h\n";
        let after = before.replace("area(w, h)", "surface(w, h)");
        let last = caret_complete::next_edit::diff("a.py", before, &after).unwrap();
        let other = "import a\n\nx = 1\ny = a.area(2, 3)\nz = 2\n";
        let open = [("b.py", other)];
        // Only the line that holds a name the edit touched (`area`) is a place in b.py.
        let there = features::candidates_open(&last, "b.py", other, &[]);
        assert_eq!(there.iter().map(|c| c.line).collect::<Vec<_>>(), [4]);
        assert_eq!(there[0].features[NAMES.iter().position(|n| *n == "other_file").unwrap()], 1.0);
        // The rename's use there is a rule's prediction; weighing only open files, it is the
        // answer, in b.py.
        let found = rules(&last, "a.py", &after, after.len(), &open);
        let mut w = [0.0; COUNT];
        w[NAMES.iter().position(|n| *n == "other_file").unwrap()] = 5.0;
        let p = predict(&Ranker::new(w), &last, "a.py", &after, &open, &found).unwrap();
        assert_eq!(p.path, "b.py");
        assert_eq!(p.apply(other), other.replace("a.area(", "a.surface("));
        // With no rule there, a jump to the line's text.
        let p = predict(&Ranker::new(w), &last, "a.py", &after, &open, &[]).unwrap();
        assert_eq!((p.path.as_str(), p.why, p.start), ("b.py", Why::Jump, other.find("y = ").unwrap()));
        // An open file with none of the edit's names gives no place.
        assert!(features::candidates_open(&last, "c.py", "x = 1\n", &[]).is_empty());
    }

    #[test]
    fn a_place_alone_is_a_jump_and_a_rules_place_its_rewrite() {
        let before = "fn a() {\n    let count = 1;\n    use_it(count);\n}\n\nfn b() {\n    other();\n}\n";
        let after = before.replacen("let count", "let total", 1);
        let last = caret_complete::next_edit::diff("a.rs", before, &after).unwrap();
        let cursor = after.find("total").unwrap() + 5;
        let rules = rules(&last, "a.rs", &after, cursor, &[]);
        assert!(!rules.is_empty(), "the rename's other use is a rule's prediction");
        // Weighs only the rules' first prediction: it is the choice, with its rewrite.
        let mut w = [0.0; COUNT];
        w[NAMES.iter().position(|n| *n == "rule_first").unwrap()] = 1.0;
        let p = predict(&Ranker::new(w), &last, "a.rs", &after, &[], &rules).unwrap();
        assert_eq!(p, rules[0]);
        assert!(p.apply(&after).contains("use_it(total)"));
        // Weighs only definitions: the jump goes to `fn b` (after `fn a`, the tie broken by
        // the earlier line... which is the edit's own definition, line 1).
        let mut w = [0.0; COUNT];
        w[NAMES.iter().position(|n| *n == "kind_def").unwrap()] = 1.0;
        w[NAMES.iter().position(|n| *n == "below").unwrap()] = 0.5;
        let p = predict(&Ranker::new(w), &last, "a.rs", &after, &[], &rules).unwrap();
        assert_eq!(p.why, Why::Jump);
        assert_eq!(
            (p.start, p.end, p.replacement.as_str()),
            (after.find("fn b").unwrap(), after.find("fn b").unwrap(), "")
        );
    }

    #[test]
    fn a_line_that_holds_a_moved_line_offers_that_before_the_edit_again() {
        // Names added to an import list, one of which the list already holds further down:
        // that line is both where the inserted lines would go again (after a like of the line
        // below them) and the old half of a name moved up (deleted).
        let before = "import {\n    type Selector,\n    SelectorType,\n    type AttributeSelector,\n    type Traversal,\n} from \"./types.js\";\n";
        let after = before.replacen("import {\n", "import {\n    AttributeAction,\n    type AttributeSelector,\n", 1);
        let last = caret_complete::next_edit::diff("parse.ts", before, &after).unwrap();
        let rules = rules(&last, "parse.ts", &after, last.start + last.new.len(), &[]);
        let old_half = after.rfind("    type AttributeSelector,").unwrap();
        let on_it: Vec<Why> = rules.iter().filter(|p| p.start == old_half).map(|p| p.why).collect();
        assert_eq!(on_it[..2], [Why::Again, Why::Moved], "{rules:?}");
        // Weighs only the first rule on a line being the edit again: that line is the place.
        let mut w = [0.0; COUNT];
        w[NAMES.iter().position(|n| *n == "rule_again").unwrap()] = 1.0;
        let p = predict(&Ranker::new(w), &last, "parse.ts", &after, &[], &rules).unwrap();
        assert_eq!(p.why, Why::Moved);
        assert_eq!(p.apply(&after).matches("type AttributeSelector,").count(), 1);
    }
}
