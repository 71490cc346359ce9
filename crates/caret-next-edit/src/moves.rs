//! Lines moved: an edit that inserts whole lines found elsewhere in reach as a run of the same
//! lines (in any order, at any indentation) predicts that run deleted — an import moved into
//! its sorted place, a statement moved up a block, a group of lines re-sorted.

use caret_complete::next_edit::{Edit, Prediction, Why};

use crate::features::Window;
use crate::template::middle;
use crate::tokens::{Kind, tokens};

/// The run's lines without their indentation, blank ones left out, in order.
fn key<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = lines.map(str::trim).filter(|l| !l.is_empty()).collect();
    out.sort_unstable();
    out
}

/// The predictions after `last` in `path` (now `text`): each other run in the candidates'
/// reach of the lines the edit inserted, deleted.
pub fn predictions(last: &Edit, path: &str, text: &str) -> Vec<Prediction> {
    let lines = |s: &'_ str| s.strip_suffix('\n').unwrap_or(s).to_owned();
    let (old, new) = (lines(&last.old_lines), lines(&last.new_lines));
    // At most a few lines (`middle`'s bound): more is a new block that happens to repeat lines.
    let Some((block, lead)) = middle(&new, &old) else { return Vec::new() };
    let want = key(block.iter().copied());
    // A line of fewer than two words (`*,`, `)`, `else:`) recurs anywhere: no move of it
    // means anything.
    let words = |l: &str| tokens(l).iter().filter(|(_, _, k)| *k == Kind::Name).count();
    if want.is_empty() || want.iter().all(|l| words(l) < 2) {
        return Vec::new();
    }
    let Window { starts, first, lo, hi, .. } = Window::of(last, text);
    let (top, bottom) = (first + lead, first + lead + block.len() - 1);
    let n = want.len();
    let line = |i: usize| text[starts[i]..starts.get(i + 1).copied().unwrap_or(text.len())].trim_end_matches('\n');
    let mut out = Vec::new();
    let mut i = lo;
    while i + n <= hi + 1 {
        // Not the inserted lines themselves, nor a run overlapping them.
        if i + n > top && i <= bottom {
            i += 1;
            continue;
        }
        let run = (i..i + n).map(line);
        if run.clone().all(|l| !l.trim().is_empty()) && key(run) == want {
            let end = starts.get(i + n).copied().unwrap_or(text.len());
            out.push(Prediction {
                path: path.to_owned(),
                start: starts[i],
                end,
                replacement: String::new(),
                why: Why::Moved,
            });
            i += n;
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(before: &str, after: &str) -> Edit {
        caret_complete::next_edit::diff("a.py", before, after).unwrap()
    }

    #[test]
    fn lines_inserted_that_are_elsewhere_already_go_from_there() {
        // Imports put in order above: the old ones below, in another order, go.
        let before = "import os\n\nimport sys\nimport json\n\nprint(sys, json)\n";
        let after = "import os\nimport json\nimport sys\n\nimport sys\nimport json\n\nprint(sys, json)\n";
        let p = predictions(&edit(before, after), "a.py", after);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].why, Why::Moved);
        assert_eq!(p[0].apply(after), "import os\nimport json\nimport sys\n\n\nprint(sys, json)\n");
        // A statement moved out of a block: its old copy, deeper, goes.
        let before = "def f():\n    if x:\n        y = compute(x)\n        use(y)\n";
        let after = "def f():\n    y = compute(x)\n    if x:\n        y = compute(x)\n        use(y)\n";
        let p = predictions(&edit(before, after), "a.py", after);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].apply(after), "def f():\n    y = compute(x)\n    if x:\n        use(y)\n");
    }

    #[test]
    fn a_line_found_nowhere_else_or_too_plain_to_mean_a_move_predicts_nothing() {
        let before = "def f(\n    a,\n):\n    pass\n";
        let after = "def f(\n    *,\n    a,\n):\n    pass\n";
        assert!(predictions(&edit(before, after), "a.py", after).is_empty(), "`*,` is too plain");
        let before = "x = 1\ny = 2\n";
        let after = "x = 1\nz = 3\ny = 2\n";
        assert!(predictions(&edit(before, after), "a.py", after).is_empty());
        // A line that also stays where it was (a copy, not a move) is still offered: the
        // ranker weighs it.
        let before = "a = load(1)\nb = load(2)\n";
        let after = "b = load(2)\na = load(1)\nb = load(2)\n";
        assert_eq!(predictions(&edit(before, after), "a.py", after).len(), 1);
    }
}
