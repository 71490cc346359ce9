//! Lines moved: an edit that inserts whole lines found elsewhere in reach as a run of the same
//! lines (in any order, at any indentation) predicts that run deleted — an import moved into
//! its sorted place, a statement moved up a block, a group of lines re-sorted. A line of the
//! insertion found once elsewhere, the rest of it new (a statement moved with a comment
//! written above it, one import of two moved), predicts that line deleted. A deletion takes
//! the blank lines the insertion carried at its edges where they stand beside the old lines,
//! and the blank line above a group it empties (a blank line above, a blank line or a closing
//! bracket below), so no double blank line is left.

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
/// reach of the lines the edit inserted, deleted; else each line of them found once elsewhere.
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
    let blank = |l: &str| l.trim().is_empty();
    let edges = (block.iter().take_while(|l| blank(l)).count(), block.iter().rev().take_while(|l| blank(l)).count());
    let Window { starts, first, lo, hi, .. } = Window::of(last, text);
    let (top, bottom) = (first + lead, first + lead + block.len() - 1);
    let n = want.len();
    let line = |i: usize| text[starts[i]..starts.get(i + 1).copied().unwrap_or(text.len())].trim_end_matches('\n');
    let outside = |i: usize| i < top || i > bottom;
    let deleted = |from: usize, to: usize| {
        let (from, to) = widened(from, to, edges, &line, starts.len());
        Prediction {
            path: path.to_owned(),
            start: starts[from],
            end: starts.get(to).copied().unwrap_or(text.len()),
            replacement: String::new(),
            why: Why::Moved,
        }
    };
    let mut out = Vec::new();
    let mut i = lo;
    while i + n <= hi + 1 {
        // Not the inserted lines themselves, nor a run overlapping them.
        if i + n > top && i <= bottom {
            i += 1;
            continue;
        }
        let run = (i..i + n).map(line);
        if run.clone().all(|l| !blank(l)) && key(run) == want {
            out.push(deleted(i, i + n));
            i += n;
        } else {
            i += 1;
        }
    }
    if out.is_empty() && n > 1 {
        // Part of the insertion moved: each of its lines of two words or more that stands
        // exactly once elsewhere in reach (a line found twice is a pattern, not a move).
        for want_line in want.iter().filter(|l| words(l) >= 2) {
            let mut found = (lo..=hi).filter(|&i| outside(i) && line(i).trim() == *want_line);
            if let (Some(i), None) = (found.next(), found.next()) {
                out.push(deleted(i, i + 1));
            }
        }
    }
    out
}

/// Lines `from..to` to delete, widened by the blank lines the insertion had at its edges
/// (`edges`: above, below) where they stand beside the run, else by the blank line above a
/// group the deletion empties.
fn widened<'a>(
    from: usize,
    to: usize,
    edges: (usize, usize),
    line: &impl Fn(usize) -> &'a str,
    count: usize,
) -> (usize, usize) {
    let blank = |i: usize| line(i).trim().is_empty();
    if edges != (0, 0) {
        let above = (0..from).rev().take(edges.0).take_while(|&i| blank(i)).count();
        let below = (to..count).take(edges.1).take_while(|&i| blank(i)).count();
        return (from - above, to + below);
    }
    let closes = |i: usize| i >= count || blank(i) || line(i).trim_start().starts_with([')', '}', ']']);
    let above = usize::from(from > 0 && blank(from - 1) && closes(to));
    (from - above, to)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(before: &str, after: &str) -> Edit {
        caret_complete::next_edit::diff("a.py", before, after).unwrap()
    }

    #[test]
    fn lines_inserted_that_are_elsewhere_already_go_from_there() {
        // Imports put in order above: the old ones below, in another order, go (with the
        // blank line that set their group apart).
        let before = "import os\n\nimport sys\nimport json\n\nprint(sys, json)\n";
        let after = "import os\nimport json\nimport sys\n\nimport sys\nimport json\n\nprint(sys, json)\n";
        let p = predictions(&edit(before, after), "a.py", after);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].why, Why::Moved);
        assert_eq!(p[0].apply(after), "import os\nimport json\nimport sys\n\nprint(sys, json)\n");
        // A statement moved out of a block: its old copy, deeper, goes.
        let before = "def f():\n    if x:\n        y = compute(x)\n        use(y)\n";
        let after = "def f():\n    y = compute(x)\n    if x:\n        y = compute(x)\n        use(y)\n";
        let p = predictions(&edit(before, after), "a.py", after);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].apply(after), "def f():\n    y = compute(x)\n    if x:\n        use(y)\n");
    }

    #[test]
    fn a_line_of_the_insertion_found_once_elsewhere_goes_from_there() {
        // A statement moved up with a comment written above it: the old copy goes.
        let before = "def f(key):\n    start(key)\n    run(key)\n    self.running.add(key)\n";
        let after = "def f(key):\n    # Before run: it may fail.\n    self.running.add(key)\n    start(key)\n    run(key)\n    self.running.add(key)\n";
        let p = predictions(&edit(before, after), "a.py", after);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(
            p[0].apply(after),
            "def f(key):\n    # Before run: it may fail.\n    self.running.add(key)\n    start(key)\n    run(key)\n"
        );
        // One import of two moved into place; the other is new.
        let before = "import os\nimport re\nfrom urllib.parse import quote\n\nx = 1\n";
        let after = "from collections import deque\nfrom urllib.parse import quote\nimport os\nimport re\nfrom urllib.parse import quote\n\nx = 1\n";
        let p = predictions(&edit(before, after), "a.py", after);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(
            p[0].apply(after),
            "from collections import deque\nfrom urllib.parse import quote\nimport os\nimport re\n\nx = 1\n"
        );
        // A line found twice elsewhere is a pattern, not a move.
        let before = "a = f(x)\nlog(a)\nb = g(x)\nlog(a)\n";
        let after = "# first\nlog(a)\na = f(x)\nlog(a)\nb = g(x)\nlog(a)\n";
        assert!(predictions(&edit(before, after), "a.py", after).is_empty());
    }

    #[test]
    fn a_moved_line_takes_the_blank_lines_that_went_with_it() {
        // The only import of its group: the blank line above it goes too.
        let before = "import os\nimport re\n\nfrom html import escape\n\n\ndef f():\n    pass\n";
        let after =
            "from html import escape\nimport os\nimport re\n\nfrom html import escape\n\n\ndef f():\n    pass\n";
        let p = predictions(&edit(before, after), "a.py", after);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].apply(after), "from html import escape\nimport os\nimport re\n\n\ndef f():\n    pass\n");
        // The last statement of a block after a blank line: the blank line goes with it.
        let before = "fn f() {\n    a();\n\n    self.cancel(true);\n}\n";
        let after = "fn f() {\n    self.cancel(true);\n    a();\n\n    self.cancel(true);\n}\n";
        let p = predictions(&edit(before, after), "a.rs", after);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].apply(after), "fn f() {\n    self.cancel(true);\n    a();\n}\n");
        // Within a group, lines around it stay.
        let before = "import os\nimport re\nimport sys\n";
        let after = "import re\nimport os\nimport re\nimport sys\n";
        let p = predictions(&edit(before, after), "a.py", after);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].apply(after), "import re\nimport os\nimport sys\n");
        // A blank line the insertion carried below it goes where one stands below the old copy.
        let before = "package a\n\n// Code generated. DO NOT EDIT.\n\n// Tables.\nvar x = 1\n";
        let after = "// Code generated. DO NOT EDIT.\n\npackage a\n\n// Code generated. DO NOT EDIT.\n\n// Tables.\nvar x = 1\n";
        let p = predictions(&edit(before, after), "a.go", after);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].apply(after), "// Code generated. DO NOT EDIT.\n\npackage a\n\n// Tables.\nvar x = 1\n");
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
