//! Rewrites the ranker can offer beyond the rules of `caret_complete`: the last edit's
//! changes *within* its lines carried to other lines, and a deleted line's likes deleted.
//!
//! - **Analogous**: the edited lines before and after are compared token by token; each
//!   change (`foo(a)` → `foo(a, b)`: `, b` inserted after `a`; `self.x` → `self.y`) becomes a
//!   substitution of the text it covered — widened by a token on each side when it covered
//!   no name, so that `a)` → `a, b)` is anchored — applied at whole-token boundaries to every
//!   other line in reach; a line any substitution changes is a prediction (all of them applied
//!   at once, as the first line had them). The rules' repeat finds one span per edit; this
//!   finds several, and ones whose span does not recur whole. Lines rewritten in a row are
//!   also one prediction of the whole run, before the first line's own.
//! - **Spacing**: when the edit changed only white space between tokens (`; )` → `;)`, a
//!   comment's `//     x` → `//\tx`, `\r\n` → `\n`), each changed gap becomes a pattern — the
//!   token before it, the gap, and the token after it (any name, where that was a name) — and
//!   the lines with such a gap are respaced alike.
//! - **Deletion**: when the last edit deleted whole lines, a line of the same shape (names as
//!   `a`, numbers as `0`) that shares a name with a deleted one is predicted deleted.

use caret_complete::next_edit::{Edit, Prediction, Why};

use crate::features::{Window, line_end};

/// Substitutions kept from one edit (more is a rewrite, not a pattern).
const MAX_CHANGES: usize = 4;
/// Common tokens an anchor may take leftwards, past the first, to reach a name.
const ANCHOR_REACH: usize = 2;
/// Edited lines compared (more is new code, not a pattern).
const MAX_LINES: usize = 3;

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Tokens of `s` with their byte spans: runs of word characters, and single other
/// characters; white space is no token.
fn tokens(s: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut it = s.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        if c.is_whitespace() {
            continue;
        }
        let mut end = i + c.len_utf8();
        if is_word(c) {
            while let Some(&(j, d)) = it.peek() {
                if !is_word(d) {
                    break;
                }
                end = j + d.len_utf8();
                it.next();
            }
        }
        out.push((i, end));
    }
    out
}

/// The changed runs between two token lists (by longest common subsequence): `(old range,
/// new range)` of token indices.
pub(crate) fn changes(a: &[&str], b: &[&str]) -> Vec<((usize, usize), (usize, usize))> {
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0u16; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    let mut open: Option<(usize, usize)> = None;
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            if let Some((si, sj)) = open.take() {
                out.push(((si, i), (sj, j)));
            }
            i += 1;
            j += 1;
        } else {
            open.get_or_insert((i, j));
            if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
                j += 1;
            } else {
                i += 1;
            }
        }
    }
    if let Some((si, sj)) = open {
        out.push(((si, n), (sj, m)));
    }
    out
}

/// The substitutions one edit of whole lines makes: `(old text, new text)` pairs.
pub fn substitutions(old: &str, new: &str) -> Vec<(String, String)> {
    if old.trim().is_empty()
        || new.trim().is_empty()
        || old.lines().count() > MAX_LINES
        || new.lines().count() > MAX_LINES
    {
        return Vec::new();
    }
    let (ta, tb) = (tokens(old), tokens(new));
    if ta.len() > 200 || tb.len() > 200 {
        return Vec::new();
    }
    let a: Vec<&str> = ta.iter().map(|&(s, e)| &old[s..e]).collect();
    let b: Vec<&str> = tb.iter().map(|&(s, e)| &new[s..e]).collect();
    let found = changes(&a, &b);
    if found.is_empty() || found.len() > MAX_CHANGES {
        return Vec::new();
    }
    let mut out = Vec::new();
    for ((mut i1, mut i2), (mut j1, mut j2)) in found {
        let named = |i1: usize, i2: usize| a[i1..i2].iter().any(|t| t.chars().any(is_word));
        if !named(i1, i2) {
            // Anchor on the tokens around it (the same on both sides: they are common).
            if i1 > 0 && j1 > 0 {
                i1 -= 1;
                j1 -= 1;
            }
            if i2 < a.len() && j2 < b.len() {
                i2 += 1;
                j2 += 1;
            }
            // Then leftwards, a common token at a time, to the nearest name (`]` appended to
            // after `attr-defined]` anchors on `defined]`).
            for _ in 0..ANCHOR_REACH {
                if named(i1, i2) || i1 == 0 || j1 == 0 || a[i1 - 1] != b[j1 - 1] {
                    break;
                }
                i1 -= 1;
                j1 -= 1;
            }
            if !named(i1, i2) {
                continue;
            }
        }
        let from = &old[ta[i1].0..ta[i2 - 1].1];
        let to = if j1 == j2 { String::new() } else { new[tb[j1].0..tb[j2 - 1].1].to_owned() };
        out.push((from.to_owned(), to));
    }
    out
}

/// What follows a respaced gap.
#[derive(Debug, Clone, PartialEq)]
enum After {
    /// Any name.
    Name,
    /// This token.
    Token(String),
}

/// A change of white space between two tokens: `before` + `old` + what `after` matches
/// becomes `before` + `new` + it.
#[derive(Debug, Clone, PartialEq)]
struct Gap {
    before: String,
    old: String,
    new: String,
    after: After,
}

/// How an edit that changed only white space respaced its lines.
#[derive(Debug, Default, PartialEq)]
pub struct Spacing {
    /// The gaps between tokens it changed.
    gaps: Vec<Gap>,
    /// A line's carriage return before its newline: added (`true`) or dropped (`false`).
    carriage_return: Option<bool>,
}

impl Spacing {
    /// Whether it respaces nothing.
    pub fn is_empty(&self) -> bool {
        self.gaps.is_empty() && self.carriage_return.is_none()
    }
}

/// Spacing patterns kept from one edit.
const MAX_SPACINGS: usize = 8;

/// Whether two runs of white space differ by a carriage return alone: `Some(true)` when the new
/// one has it, `Some(false)` when the old one had it.
fn carriage_return(old: &str, new: &str) -> Option<bool> {
    (old != new && old.replace('\r', "") == new.replace('\r', "")).then(|| new.contains('\r'))
}

/// The spacing of an edit that changed only white space within its lines (empty when a token
/// changed, or a line was joined or split).
pub fn spacings(old: &str, new: &str) -> Spacing {
    let none = Spacing::default();
    if old == new || old.lines().count() > MAX_LINES || old.lines().count() != new.lines().count() {
        return none;
    }
    let (ta, tb) = (tokens(old), tokens(new));
    if ta.len() != tb.len() || ta.len() > 200 || ta.iter().zip(&tb).any(|(&(s, e), &(t, f))| old[s..e] != new[t..f]) {
        return none;
    }
    let mut out = Spacing::default();
    for k in 0..ta.len().saturating_sub(1) {
        let (gap_old, gap_new) = (&old[ta[k].1..ta[k + 1].0], &new[tb[k].1..tb[k + 1].0]);
        if gap_old == gap_new {
            continue;
        }
        if gap_old.contains('\n') || gap_new.contains('\n') {
            // Across lines, only a carriage return dropped or added before the newline.
            match carriage_return(gap_old, gap_new) {
                Some(cr) => out.carriage_return = Some(cr),
                None => return none,
            }
            continue;
        }
        let next = &old[ta[k + 1].0..ta[k + 1].1];
        let after = if next.starts_with(is_word) { After::Name } else { After::Token(next.to_owned()) };
        let gap =
            Gap { before: old[ta[k].0..ta[k].1].to_owned(), old: gap_old.to_owned(), new: gap_new.to_owned(), after };
        if !out.gaps.contains(&gap) {
            out.gaps.push(gap);
        }
    }
    // A line ending's carriage return after the last token.
    if let (Some(a), Some(b)) = (ta.last(), tb.last())
        && let Some(cr) = carriage_return(&old[a.1..], &new[b.1..])
    {
        out.carriage_return = Some(cr);
    }
    if out.gaps.len() + usize::from(out.carriage_return.is_some()) > MAX_SPACINGS { none } else { out }
}

/// `line` respaced as `spacing` says, when that changes it.
fn respace(line: &str, spacing: &Spacing) -> Option<String> {
    if spacing.is_empty() {
        return None;
    }
    let mut out = line.to_owned();
    match spacing.carriage_return {
        Some(false) if out.ends_with('\r') => drop(out.pop()),
        Some(true) if !out.ends_with('\r') && !out.trim().is_empty() => out.push('\r'),
        _ => {}
    }
    let t = tokens(&out);
    let mut respaced = String::with_capacity(out.len());
    let mut copied = 0;
    for k in 0..t.len().saturating_sub(1) {
        let (tok, gap, next) = (&out[t[k].0..t[k].1], &out[t[k].1..t[k + 1].0], &out[t[k + 1].0..t[k + 1].1]);
        let fits = |g: &&Gap| {
            g.before == tok
                && g.old == gap
                && match &g.after {
                    After::Name => next.starts_with(is_word),
                    After::Token(x) => x == next,
                }
        };
        if let Some(g) = spacing.gaps.iter().find(fits) {
            respaced.push_str(&out[copied..t[k].1]);
            respaced.push_str(&g.new);
            copied = t[k + 1].0;
        }
    }
    respaced.push_str(&out[copied..]);
    (respaced != line).then_some(respaced)
}

/// `line` with every substitution applied at whole-token boundaries, when any applies: all at
/// once, left to right (the longest where two start at one place), so that a swap or a chain
/// (`new_x` → `x`, `x` → `base_x`) rewrites each name once, as the edit did.
fn substitute(line: &str, subs: &[(String, String)]) -> Option<String> {
    let mut out = String::with_capacity(line.len());
    let (mut at, mut copied, mut changed) = (0, 0, false);
    while at < line.len() {
        let here = &line[at..];
        let found = subs
            .iter()
            .filter(|(from, _)| {
                !from.is_empty()
                    && here.starts_with(from.as_str())
                    && (!from.starts_with(is_word) || !line[..at].ends_with(is_word))
                    && (!from.ends_with(is_word) || !line[at + from.len()..].starts_with(is_word))
            })
            .max_by_key(|(from, _)| from.len());
        match found {
            Some((from, to)) => {
                out.push_str(&line[copied..at]);
                out.push_str(to);
                at += from.len();
                copied = at;
                changed = true;
            }
            None => at += here.chars().next().map_or(1, char::len_utf8),
        }
    }
    out.push_str(&line[copied..]);
    (changed && out != line).then_some(out)
}

/// The predictions after `last` in `path` (now `text`), on the candidates' lines other than
/// the edit's own.
pub fn predictions(last: &Edit, path: &str, text: &str) -> Vec<Prediction> {
    let Window { starts, first, end, lo, hi } = Window::of(last, text);
    let mut out = Vec::new();
    let subs = substitutions(&last.old_lines, &last.new_lines);
    let spacing = spacings(&last.old_lines, &last.new_lines);
    let deleted: Vec<&str> = if last.new.trim().is_empty() && last.old.contains('\n') {
        last.old.lines().map(str::trim).filter(|l| l.len() >= 3).collect()
    } else {
        Vec::new()
    };
    if subs.is_empty() && spacing.is_empty() && deleted.is_empty() {
        return out;
    }
    let deleted_shapes: Vec<String> = deleted.iter().map(|l| crate::features::shape(l)).collect();
    // The rewritten lines since the last line that was not (their predictions' places in `out`).
    let mut run: Vec<usize> = Vec::new();
    for i in (lo..=hi).filter(|i| !(first..=end).contains(i)) {
        if i == end + 1 {
            // The edit's lines end a run.
            block(&mut out, &mut run, text);
        }
        let (start, stop) = (starts[i], line_end(&starts, text, i));
        let line = &text[start..stop];
        if let Some(rewritten) = substitute(line, &subs).or_else(|| respace(line, &spacing)) {
            let why = Why::Analogous;
            out.push(Prediction { path: path.to_owned(), start, end: stop, replacement: rewritten, why });
            run.push(out.len() - 1);
            continue;
        }
        block(&mut out, &mut run, text);
        let trimmed = line.trim();
        if !trimmed.is_empty()
            && deleted_shapes.contains(&crate::features::shape(trimmed))
            && deleted
                .iter()
                .any(|d| crate::features::idents(d).any(|w| crate::features::idents(trimmed).any(|x| x == w)))
        {
            let next = starts.get(i + 1).copied().unwrap_or(text.len());
            out.push(Prediction {
                path: path.to_owned(),
                start,
                end: next,
                replacement: String::new(),
                why: Why::Delete,
            });
        }
    }
    block(&mut out, &mut run, text);
    out
}

/// Consecutive lines rewritten alike (`run`, their predictions in `out`) are one prediction
/// too, of the whole run, put before its first line's own: a block of like lines is mostly
/// changed together.
fn block(out: &mut Vec<Prediction>, run: &mut Vec<usize>, text: &str) {
    if run.len() >= 2 {
        let (first, last) = (&out[run[0]], &out[run[run.len() - 1]]);
        let mut replacement = String::new();
        for (n, &k) in run.iter().enumerate() {
            if n > 0 {
                replacement.push_str(&text[out[run[n - 1]].end..out[k].start]);
            }
            replacement.push_str(&out[k].replacement);
        }
        let whole = Prediction { end: last.end, replacement, ..first.clone() };
        out.insert(run[0], whole);
    }
    run.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(before: &str, from: &str, to: &str) -> (Edit, String) {
        let after = before.replacen(from, to, 1);
        (caret_complete::next_edit::diff("a.py", before, &after).unwrap(), after)
    }

    #[test]
    fn changes_within_a_line_go_to_the_lines_that_have_them() {
        // Two changes on one line: an argument added and a name changed.
        let before = "x = load(path)\ny = 2\nz = load(other)\nw = unload(path)\n";
        let (last, text) = after(before, "x = load(path)", "x = load(path, strict=True)");
        let subs = substitutions(&last.old_lines, &last.new_lines);
        assert_eq!(subs, [("path)".to_owned(), "path, strict=True)".to_owned())]);
        let p = predictions(&last, "a.py", &text);
        // `unload(path)` has `path)`; `load(other)` does not (the anchor is the name before).
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].apply(&text), text.replace("unload(path)", "unload(path, strict=True)"));
        // A rename within a longer line, and a second change elsewhere on it.
        let before = "a = self.width * 2\nb = self.width + self.height * 2\nc = width\n";
        let (last, text) = after(before, "a = self.width * 2", "a = self.size * 3");
        let p = predictions(&last, "a.py", &text);
        assert_eq!(p.len(), 3, "{p:?}");
        assert_eq!(p[1].replacement, "b = self.size + self.height * 3");
        assert_eq!(p[2].replacement, "c = size");
        assert_eq!(p[0].why, Why::Analogous);
        // The two lines rewritten in a row are one prediction too, before the first's own.
        assert_eq!(p[0].apply(&text), "a = self.size * 3\nb = self.size + self.height * 3\nc = size\n");
        // Whole tokens only: `widths` and `2x` are other tokens.
        let p = predictions(&last, "a.py", "a = self.size * 3\nb = widths + 2x\n");
        assert!(p.is_empty(), "{p:?}");
        // A chain of renames (`new_styled` → `styled`, `styled` → `base_styled`) rewrites each
        // name once, as the edit did.
        let before = "import styled\nnew_styled = styled.bind(None)\nnew_styled.x = new_styled(1)\n";
        let (last, text) = after(before, "new_styled = styled.bind", "styled = base_styled.bind");
        let p = predictions(&last, "a.py", &text);
        let line = p.iter().find(|p| p.replacement.contains(".x =")).unwrap();
        assert_eq!(line.replacement, "styled.x = styled(1)");
        // The lines above and below the edit are no run.
        assert_eq!(p.len(), 2, "{p:?}");
    }

    #[test]
    fn a_change_of_spacing_goes_to_the_lines_spaced_alike() {
        let before = "for (; i < n; ) {\n  x(i);\n}\nfor (let j = 0; j < m; ) {\n  y(j);\n}\n";
        let (last, text) = after(before, "for (; i < n; ) {", "for (; i < n;) {");
        let p = predictions(&last, "a.ts", &text);
        // `; )` closes up; `; j` keeps its space (the pattern's next token is `)`).
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].replacement, "for (let j = 0; j < m;) {");
        // A comment's indentation after `//`, whatever name follows.
        let before = "//     a := 1\n//     b := 2\nc := 3\n";
        let (last, text) = after(before, "//     a", "//\ta");
        let p = predictions(&last, "a.go", &text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].replacement, "//\tb := 2");
        // Carriage returns dropped.
        let before = "x = 1\r\ny = 2\r\n";
        let (last, text) = after(before, "x = 1\r\n", "x = 1\n");
        let p = predictions(&last, "a.py", &text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].apply(&text), "x = 1\ny = 2\n");
        // A token changed too: not a spacing.
        assert!(spacings("f(a )", "g(a)").is_empty());
    }

    #[test]
    fn a_deleted_lines_likes_are_predicted_deleted() {
        let before = "import os\nprint(debug_a)\nx = 1\nprint(debug_b)\nprint(x)\n";
        let (last, text) = after(before, "print(debug_a)\n", "");
        let p = predictions(&last, "a.py", &text);
        // `print(debug_b)` has the shape and a name (`print`); `print(x)` too: both offered.
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(p[0].apply(&text), "import os\nx = 1\nprint(x)\n");
        assert!(p.iter().all(|p| p.why == Why::Delete && p.replacement.is_empty()));
    }

    #[test]
    fn token_changes_are_the_runs_between_common_tokens() {
        assert_eq!(changes(&["a", "(", "b", ")"], &["a", "(", "b", ",", "c", ")"]), [((3, 3), (3, 5))]);
        assert_eq!(changes(&["x"], &["y"]), [((0, 1), (0, 1))]);
        assert!(substitutions("a = 1", "").is_empty());
        assert!(substitutions("f(a)\n", "f(a)\n").is_empty());
    }
}
