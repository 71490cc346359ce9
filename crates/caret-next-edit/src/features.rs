//! The candidate places after an edit and what the ranker knows of each.
//!
//! A candidate is a line of the edited file within [`BEFORE`] lines above the edit and
//! [`AFTER`] below it. Its features ([`NAMES`], in order) say how far it is, which names it
//! shares with the edit (those the edit removed, added or kept, weighted by how rare they are
//! in the file), whether it has the edited line's shape or indentation, its syntax (the
//! tree-sitter node that starts the line, in a few classes, and whether it is in the edit's
//! enclosing definition), and whether one of the rules (`caret_complete`) predicts an edit
//! there. A few are crossed with the edit's kind (an insertion, a deletion) since a softmax
//! over one edit's candidates cannot use a feature that is the same for all of them.

use std::collections::HashMap;

use caret_complete::next_edit::{Edit, Prediction, Why};
use caret_workspace::RelPath;
use caret_workspace::chunk::Language;

/// Lines above the edit that are candidates.
pub const BEFORE: usize = 100;
/// Lines below the edit that are candidates.
pub const AFTER: usize = 150;

/// Lines longer than this have no shape (minified code, data): comparing them costs more
/// than it tells.
const LONG_LINE: usize = 1_000;
/// The most bytes of the window parsed for syntax.
const MAX_PARSED: usize = 256 * 1024;

/// The features' names, as the weights file names them.
pub const NAMES: &[&str] = &[
    "dist_log",
    "below",
    "near3",
    "near10",
    "near30",
    "below_near10",
    "inside",
    "blank",
    "comment",
    "same_indent",
    "indent_less",
    "indent_more",
    "line_len",
    "shares_removed",
    "shares_added",
    "shares_kept",
    "jaccard",
    "rare_shared",
    "has_old_word",
    "shape_same",
    "shape_sim",
    "kind_def",
    "kind_import",
    "kind_return",
    "kind_control",
    "kind_bind",
    "kind_expr",
    "kind_comment",
    "same_kind",
    "same_scope",
    "def_touched",
    "call_of_touched",
    "import_needed",
    "rule_repeat",
    "rule_insert",
    "rule_import",
    "rule_first",
    "rule_analogous",
    "rule_delete",
    "rule_again",
    "rule_moved",
    "ins_near3",
    "del_near3",
    "ins_shape",
    "del_shape",
    "ins_blank",
    "first_after",
    "below_1",
    "below_2",
    "below_3",
    "below_4_5",
    "below_6_8",
    "below_9_12",
    "below_13_20",
    "below_21_40",
    "above_1_3",
    "above_4_10",
    "above_11_30",
    "blank_below_near",
    "prev_blank",
    "next_blank",
    "opens_block",
    "closes_block",
    "same_indent_below_near",
    "shape_below_near",
    "other_file",
];

/// The index of the feature that marks the edit's own lines.
pub const INSIDE: usize = 6;

/// How many features a candidate has.
pub const COUNT: usize = NAMES.len();

/// A candidate place: a line of the text.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Its file: 0 the edited one, `n` the `n`-th open beside it.
    pub file: usize,
    /// Its 1-based line.
    pub line: usize,
    /// The byte where its text starts (after the indentation).
    pub at: usize,
    /// Its features, in the order of [`NAMES`].
    pub features: [f32; COUNT],
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Def,
    Import,
    Return,
    Control,
    Bind,
    Expr,
    Comment,
    Other,
}

struct LineInfo {
    kind: Kind,
    /// The start byte of the innermost definition around the line (`usize::MAX`: none).
    scope: usize,
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80
}

/// The identifiers of `s` (runs of word characters that do not start with a digit).
pub(crate) fn idents(s: &str) -> impl Iterator<Item = &str> {
    s.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| w.chars().next().is_some_and(|c| !c.is_ascii_digit()))
}

/// A line's shape: identifiers become `a`, numbers `0`, spaces go.
pub(crate) fn shape(line: &str) -> String {
    let b = line.trim().as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if is_word(c) {
            let digit = c.is_ascii_digit();
            while i < b.len() && is_word(b[i]) {
                i += 1;
            }
            out.push(if digit { '0' } else { 'a' });
            continue;
        }
        if !c.is_ascii_whitespace() {
            out.push(c as char);
        }
        i += 1;
    }
    out
}

/// Dice similarity of two strings' byte bigrams.
fn dice(a: &str, b: &str) -> f32 {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() < 2 || b.len() < 2 {
        return f32::from(u8::from(a == b));
    }
    let mut grams: Vec<[u8; 2]> = a.windows(2).map(|w| [w[0], w[1]]).collect();
    grams.sort_unstable();
    let mut used = vec![false; grams.len()];
    let mut common = 0;
    for w in b.windows(2) {
        let g = [w[0], w[1]];
        let mut i = grams.partition_point(|x| *x < g);
        while i < grams.len() && grams[i] == g && used[i] {
            i += 1;
        }
        if i < grams.len() && grams[i] == g {
            used[i] = true;
            common += 1;
        }
    }
    2.0 * common as f32 / (a.len() + b.len() - 2) as f32
}

fn indent(line: &str) -> usize {
    line.bytes().take_while(|b| *b == b' ' || *b == b'\t').map(|b| if b == b'\t' { 4 } else { 1 }).sum()
}

fn kind_of(kind: &str, definitions: &[&str]) -> Kind {
    if kind.contains("comment") {
        Kind::Comment
    } else if kind.contains("import")
        || kind == "use_declaration"
        || kind == "package_clause"
        || kind == "extern_crate_declaration"
    {
        Kind::Import
    } else if definitions.contains(&kind)
        || kind.contains("function")
        || kind.contains("class")
        || kind.contains("method")
    {
        Kind::Def
    } else if kind.contains("return") {
        Kind::Return
    } else if ["if", "for", "while", "match", "loop", "switch", "try", "with", "else", "except", "case"]
        .iter()
        .any(|k| kind.starts_with(k))
    {
        Kind::Control
    } else if kind.contains("assign")
        || kind.starts_with("let")
        || kind.contains("declaration")
        || kind.contains("var_")
    {
        Kind::Bind
    } else if kind.contains("call") || kind.contains("expression") || kind.contains("macro_invocation") {
        Kind::Expr
    } else {
        Kind::Other
    }
}

/// Node kinds that hold statements: a line's node stops below them.
fn container(kind: &str) -> bool {
    kind.ends_with("block")
        || kind.ends_with("body")
        || kind.ends_with("_list") && kind != "expression_list"
        || matches!(kind, "module" | "program" | "source_file" | "compound_statement")
}

/// Each line's syntax class and enclosing definition, from one tree-sitter parse (`None`: the
/// language has no grammar, or the parse failed).
fn syntax(path: &str, text: &str, starts: &[usize]) -> Option<Vec<LineInfo>> {
    let language = Language::detect(&RelPath::from_bytes(path.as_bytes()));
    let mut parser = tree_sitter::Parser::new();
    parser.set_language(&language.grammar()?).ok()?;
    let tree = parser.parse(text, None)?;
    let root = tree.root_node();
    let definitions = language.definitions();
    let mut out = Vec::with_capacity(starts.len());
    for (i, &start) in starts.iter().enumerate() {
        let end = starts.get(i + 1).map_or(text.len(), |e| e.saturating_sub(1));
        let first = text[start..end].bytes().position(|b| !b.is_ascii_whitespace()).map(|p| start + p);
        let Some(first) = first else {
            out.push(LineInfo { kind: Kind::Other, scope: usize::MAX });
            continue;
        };
        let mut node = root.descendant_for_byte_range(first, first).unwrap_or(root);
        // Up to the statement the line starts (not the block a first statement starts too).
        while let Some(parent) = node.parent().filter(|p| p.start_byte() == node.start_byte() && !container(p.kind())) {
            node = parent;
        }
        let mut named = node;
        if named.kind() == "expression_statement"
            && let Some(child) = named.named_child(0)
        {
            named = child;
        }
        let kind = kind_of(named.kind(), definitions);
        let mut scope = usize::MAX;
        let mut up = node.parent();
        while let Some(n) = up {
            if definitions.contains(&n.kind()) && n.kind() != "export_statement" {
                scope = n.start_byte();
                break;
            }
            up = n.parent();
        }
        out.push(LineInfo { kind, scope });
    }
    Some(out)
}

/// A text's lines and the edit's place among them (0-based lines, inclusive ranges).
pub(crate) struct Window {
    /// Where each line starts (a final newline starts no line).
    pub starts: Vec<usize>,
    /// The edit's first and last lines in the text after it.
    pub first: usize,
    pub end: usize,
    /// The candidates' lines: [`BEFORE`] above the edit to [`AFTER`] below it.
    pub lo: usize,
    pub hi: usize,
}

impl Window {
    pub fn of(last: &Edit, text: &str) -> Window {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1).filter(|i| *i < text.len()));
        let first = last.line.saturating_sub(1).min(starts.len() - 1);
        let span = last.new_lines.matches('\n').count().max(1);
        let end = (first + span - 1).min(starts.len() - 1);
        let (lo, hi) = (first.saturating_sub(BEFORE), (end + AFTER).min(starts.len() - 1));
        Window { starts, first, end, lo, hi }
    }
}

/// The byte where line `i` ends (its newline, or the text's end).
pub(crate) fn line_end(starts: &[usize], text: &str, i: usize) -> usize {
    starts.get(i + 1).map_or(text.len() - usize::from(text.ends_with('\n')), |e| e - 1)
}

/// The candidates after `last` (the newest edit of `path`, whose text is now `text`), with
/// the rules' predictions `rules` for the file marked where they start.
pub fn candidates(last: &Edit, path: &str, text: &str, rules: &[Prediction]) -> Vec<Candidate> {
    lines(last, path, text, rules, false)
}

/// The candidates in a file open beside the edited one (`path`, now `text`): its lines that
/// hold a name the edit added or removed, or where one of `rules` predicts an edit, at most
/// [`MAX_OPEN`]; their features are a line of the edited file's but for distance (as far as
/// the window's edge), the edit's own syntax (unknown here) and `other_file`, set.
pub fn candidates_open(last: &Edit, path: &str, text: &str, rules: &[Prediction]) -> Vec<Candidate> {
    lines(last, path, text, rules, true)
}

/// The candidates in the edited file and in each file open beside it (`others`, whose
/// candidates carry their place among them, from 1; the edited file's own path is passed
/// over there).
pub fn candidates_everywhere(
    last: &Edit,
    path: &str,
    text: &str,
    others: &[(&str, &str)],
    rules: &[Prediction],
) -> Vec<Candidate> {
    let mut all = candidates(last, path, text, rules);
    for (n, (p, t)) in others.iter().enumerate().filter(|(_, (p, _))| *p != path) {
        all.extend(candidates_open(last, p, t, rules).into_iter().map(|c| Candidate { file: n + 1, ..c }));
    }
    all
}

/// The most candidates one open file gives.
pub const MAX_OPEN: usize = 200;

fn lines(last: &Edit, path: &str, text: &str, rules: &[Prediction], open: bool) -> Vec<Candidate> {
    if text.is_empty() {
        return Vec::new();
    }
    let Window { starts, first, end, lo, hi } = if open {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1).filter(|i| *i < text.len()));
        let hi = starts.len() - 1;
        Window { starts, first: usize::MAX, end: usize::MAX, lo: 0, hi }
    } else {
        Window::of(last, text)
    };
    let line_text = |i: usize| &text[starts[i]..line_end(&starts, text, i)];

    let old_ids: Vec<&str> = idents(&last.old_lines).collect();
    let new_ids: Vec<&str> = idents(&last.new_lines).collect();
    let removed: Vec<&str> = old_ids.iter().copied().filter(|w| !new_ids.contains(w)).collect();
    let added: Vec<&str> = new_ids.iter().copied().filter(|w| !old_ids.contains(w)).collect();
    let touched: Vec<&str> = removed.iter().chain(&added).copied().collect();
    // An open file with none of the edit's names and no rule's prediction is neither counted
    // nor parsed.
    if open && !rules.iter().any(|p| p.path == path) && !touched.iter().any(|w| text.contains(w)) {
        return Vec::new();
    }
    let mut counts: HashMap<&str, u32> = HashMap::new();
    for w in idents(text) {
        *counts.entry(w).or_default() += 1;
    }
    // Names the edit added that the file has nowhere else: likely wanting an import.
    let unknown = added
        .iter()
        .any(|w| counts.get(w).copied().unwrap_or(0) as usize <= new_ids.iter().filter(|x| *x == w).count());
    let old_word = (!last.old.is_empty() && last.old.bytes().all(is_word)).then_some(last.old.as_str());
    let edit_shapes: Vec<String> = last
        .old_lines
        .lines()
        .chain(last.new_lines.lines())
        .filter(|l| l.len() <= LONG_LINE)
        .map(shape)
        .filter(|s| !s.is_empty())
        .collect();
    let edit_indent =
        last.new_lines.lines().chain(last.old_lines.lines()).find(|l| !l.trim().is_empty()).map_or(0, indent);
    let (ins, del) = (last.old.trim().is_empty(), last.new.trim().is_empty());

    // Only the candidates' lines are parsed (a long file costs no more than a short one).
    let (from, to) = (starts[lo], starts.get(hi + 1).map_or(text.len(), |e| *e));
    let window: Vec<usize> = starts[lo..=hi].iter().map(|s| s - from).collect();
    // (A minified file's window can be megabytes: no syntax for it.)
    let info = if to - from <= MAX_PARSED { syntax(path, &text[from..to], &window) } else { None };
    let edit_info = if open { None } else { info.as_ref().map(|i| &i[first - lo]) };
    let first_after = if open { None } else { (end + 1..=hi).find(|&i| !line_text(i).trim().is_empty()) };

    let mut rule_at: HashMap<usize, (Why, bool)> = HashMap::new();
    for (n, p) in rules.iter().enumerate().filter(|(_, p)| p.path == path) {
        let line = starts.partition_point(|s| *s <= p.start) - 1;
        rule_at.entry(line).or_insert((p.why, n == 0));
    }

    let mut out = Vec::with_capacity(hi - lo + 1);
    for i in lo..=hi {
        let line = line_text(i);
        let trimmed = line.trim();
        if open && (out.len() == MAX_OPEN || !(rule_at.contains_key(&i) || idents(line).any(|w| touched.contains(&w))))
        {
            continue;
        }
        let d: isize = if open {
            (BEFORE + AFTER) as isize
        } else if i < first {
            i as isize - first as isize
        } else if i > end {
            (i - end) as isize
        } else {
            0
        };
        let ad = d.unsigned_abs();
        let ids: Vec<&str> = idents(line).collect();
        let mut uniq = ids.clone();
        uniq.sort_unstable();
        uniq.dedup();
        let inter_new = uniq.iter().filter(|w| new_ids.contains(w)).count();
        let union = uniq.len() + new_ids.len() - inter_new;
        let rare: f32 = uniq
            .iter()
            .filter(|w| new_ids.contains(w) || removed.contains(w))
            .map(|w| 1.0 / counts.get(*w).copied().unwrap_or(1) as f32)
            .sum();
        // A line longer than any code line (minified, data) has no shape to compare.
        let s = if line.len() <= LONG_LINE { shape(line) } else { String::new() };
        let shape_same = !s.is_empty() && edit_shapes.contains(&s);
        let shape_sim = edit_shapes.iter().map(|e| dice(&s, e)).fold(0.0f32, f32::max);
        let li = info.as_ref().map(|v| &v[i - lo]);
        let kind = li.map_or(Kind::Other, |l| l.kind);
        let blank = trimmed.is_empty();
        let comment = trimmed.starts_with('#')
            || trimmed.starts_with("//")
            || trimmed.starts_with("/*")
            || trimmed.starts_with('*');
        let ind = indent(line);
        let (rule, rule_first) = match rule_at.get(&i) {
            Some((why, first)) => (Some(*why), *first),
            None => (None, false),
        };
        let has_old = old_word.is_some_and(|w| ids.contains(&w));
        let call = touched.iter().any(|w| line.contains(&format!("{w}(")));
        let b = |x: bool| f32::from(u8::from(x));
        let f = [
            (1.0 + ad as f32).ln(),
            b(!open && d > 0),
            b(ad <= 3),
            b(ad <= 10),
            b(ad <= 30),
            b(d > 0 && ad <= 10),
            b(d == 0),
            b(blank),
            b(comment),
            b(!blank && ind == edit_indent),
            b(!blank && ind < edit_indent),
            b(!blank && ind > edit_indent),
            (1.0 + trimmed.len() as f32).ln(),
            b(uniq.iter().any(|w| removed.contains(w))),
            b(uniq.iter().any(|w| added.contains(w))),
            b(uniq.iter().any(|w| new_ids.contains(w) && !added.contains(w))),
            if union == 0 { 0.0 } else { inter_new as f32 / union as f32 },
            rare.min(3.0),
            b(has_old),
            b(shape_same),
            shape_sim,
            b(kind == Kind::Def),
            b(kind == Kind::Import),
            b(kind == Kind::Return),
            b(kind == Kind::Control),
            b(kind == Kind::Bind),
            b(kind == Kind::Expr),
            b(kind == Kind::Comment),
            b(!blank && edit_info.is_some_and(|e| e.kind == kind)),
            b(edit_info.zip(li).is_some_and(|(e, l)| e.scope != usize::MAX && e.scope == l.scope)),
            b(kind == Kind::Def && uniq.iter().any(|w| touched.contains(w))),
            b(call),
            b(unknown && kind == Kind::Import),
            b(rule == Some(Why::Repeat)),
            b(rule == Some(Why::Insert)),
            b(rule == Some(Why::Import)),
            b(rule_first),
            b(rule == Some(Why::Analogous)),
            b(rule == Some(Why::Delete)),
            b(rule == Some(Why::Again)),
            b(rule == Some(Why::Moved)),
            b(ins && ad <= 3),
            b(del && ad <= 3),
            b(ins && shape_same),
            b(del && shape_same),
            b(ins && blank),
            b(first_after == Some(i)),
            b(d == 1),
            b(d == 2),
            b(d == 3),
            b((4..=5).contains(&d)),
            b((6..=8).contains(&d)),
            b((9..=12).contains(&d)),
            b((13..=20).contains(&d)),
            b((21..=40).contains(&d)),
            b((-3..=-1).contains(&d)),
            b((-10..=-4).contains(&d)),
            b((-30..=-11).contains(&d)),
            b(blank && d > 0 && ad <= 10),
            b(i > 0 && line_text(i - 1).trim().is_empty()),
            b(i + 1 < starts.len() && line_text(i + 1).trim().is_empty()),
            b(trimmed.ends_with(['{', ':', '(', '['])),
            b(trimmed.starts_with(['}', ')', ']'])),
            b(!blank && ind == edit_indent && d > 0 && ad <= 10),
            b(shape_same && d > 0 && ad <= 20),
            b(open),
        ];
        let at = starts[i] + (line.len() - line.trim_start().len());
        out.push(Candidate { file: 0, line: i + 1, at, features: f });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feature(c: &Candidate, name: &str) -> f32 {
        c.features[NAMES.iter().position(|n| *n == name).unwrap()]
    }

    #[test]
    fn features_say_what_a_line_shares_with_the_edit() {
        let before = "import os\n\ndef area(w, h):\n    return w * h\n\ndef total(xs):\n    n = 0\n    for x in xs:\n        n += area(x, x)\n    return n\n";
        let after = before.replace("def area(w, h):", "def area(w, h, unit):");
        let last = caret_complete::next_edit::diff("a.py", before, &after).unwrap();
        let cands = candidates(&last, "a.py", &after, &[]);
        assert_eq!(NAMES.len(), cands[0].features.len());
        let at = |line: usize| cands.iter().find(|c| c.line == line).unwrap();
        // The call of the changed function, seven lines below, shares its name and is a call.
        assert_eq!(feature(at(9), "call_of_touched"), 0.0, "area is kept, not touched");
        assert_eq!(feature(at(9), "shares_kept"), 1.0);
        assert_eq!(feature(at(9), "below"), 1.0);
        assert_eq!(feature(at(1), "kind_import"), 1.0);
        assert_eq!(feature(at(6), "kind_def"), 1.0);
        assert_eq!(feature(at(6), "same_kind"), 1.0);
        assert_eq!(feature(at(4), "same_scope"), 0.0, "the edit's line is the definition itself");
        assert_eq!(feature(at(7), "kind_bind"), 1.0);
        assert_eq!(feature(at(8), "kind_control"), 1.0);
        assert_eq!(feature(at(10), "kind_return"), 1.0);
        assert_eq!(feature(at(3), "inside"), 1.0);
        assert_eq!(feature(at(4), "first_after"), 1.0);
        assert_eq!(feature(at(2), "blank"), 1.0);
        // The new parameter is a name the file has nowhere else: imports are where it may go.
        assert_eq!(feature(at(1), "import_needed"), 1.0);
    }

    #[test]
    fn a_minified_line_is_a_candidate_without_shape_or_syntax() {
        let long: String = (0..100_000).map(|i| format!("f{i}(a);")).collect();
        let before = format!("x = 1\n{long}\ny = 2\n");
        let after = before.replacen("x = 1", "x = 2", 1);
        let last = caret_complete::next_edit::diff("a.js", &before, &after).unwrap();
        let cands = candidates(&last, "a.js", &after, &[]);
        assert_eq!(cands.len(), 3);
        assert_eq!(feature(&cands[1], "shape_sim"), 0.0);
        assert_eq!(feature(&cands[1], "kind_expr"), 0.0, "no parse of a window this long");
        // The short line after it still has its shape.
        assert_eq!(feature(&cands[2], "shape_same"), 1.0);
        let p = crate::predict(crate::Ranker::shipped(), &last, "a.js", &after, &[], &[]);
        assert!(p.is_none_or(|p| p.start <= after.len()));
    }

    #[test]
    fn shapes_and_similarity() {
        assert_eq!(shape("    let x = foo(1, y);"), "aa=a(0,a);");
        assert_eq!(shape("self.a_b += 42"), "a.a+=0");
        assert!((dice("abc", "abc") - 1.0).abs() < 1e-6);
        assert_eq!(dice("ab", "cd"), 0.0);
        assert!(dice("a=a(0,a);", "a=a(0);") > 0.6);
    }
}
