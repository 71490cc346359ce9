//! The edit again where its lines recur with other names: the last edit's old lines as a
//! template of tokens; a run of as many lines elsewhere whose tokens are the same but for
//! names, numbers and string literals that differ consistently (`err` is `cErr` wherever it
//! is) is rewritten as the edit's new lines with those tokens put in. One line or several,
//! a line deleted or added with it: `enc.Encoder(ctx, err, w)` + `return` → `return err`
//! makes `enc.Encoder(ctx, cErr, w)` + `return` → `return cErr`; `func String(s string) …`
//! with a comment added above makes the same comment above `func Int(i int) …`. A run that
//! is like the edit's lines in part takes the edit's changes where their tokens are there
//! (`crate::aligned`).

use std::collections::HashMap;

use caret_complete::next_edit::{Edit, Prediction, Why};

use crate::features::{Window, line_end};
use crate::tokens::{Kind, put_in, tokens};

/// Lines a template may span (more is new code, not a pattern).
const MAX_LINES: usize = 3;
/// Tokens a template may hold.
const MAX_TOKENS: usize = 200;
/// Distinct tokens that may differ between the template and a place (more is another line
/// that happens to share the punctuation).
const MAX_RENAMED: usize = 4;

/// The tokens of `template` that stand for other tokens in `place`, when `place` is the
/// template but for names, numbers and literals that differ consistently (none differing is
/// the same lines), at most half of its tokens differing and a word among those that stay;
/// `None` otherwise.
fn renames<'a>(template: &'a str, place: &'a str) -> Option<HashMap<&'a str, &'a str>> {
    let (a, b) = (tokens(template), tokens(place));
    if a.len() != b.len() {
        return None;
    }
    let mut map: HashMap<&str, &str> = HashMap::new();
    let (mut differ, mut kept_words) = (0, 0);
    for (&(s1, e1, k1), &(s2, e2, k2)) in a.iter().zip(&b) {
        let (x, y) = (&template[s1..e1], &place[s2..e2]);
        if k1 != k2 || (k1 == Kind::Other && x != y) {
            return None;
        }
        if *map.entry(x).or_insert(y) != y {
            return None;
        }
        differ += usize::from(x != y);
        kept_words += usize::from(x == y && k1 != Kind::Other);
    }
    // Most of it the same, a word among what is: `b = 2` is no `a = 1` with other names.
    if 2 * differ > a.len() || kept_words == 0 {
        return None;
    }
    map.retain(|x, y| x != y);
    // A token that stands for another may not also stand for itself: `a, b` → `b, c` would
    // put `c` where the template's `b` stays `b`.
    if map.values().any(|y| map.contains_key(y)) || map.len() > MAX_RENAMED {
        return None;
    }
    Some(map)
}

fn indent(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// The predictions after `last` in `path` (now `text`): each run of lines in the candidates'
/// reach, other than the edit's own, that matches the edit's old lines, rewritten; when the
/// edit changed each of several lines apart (as many lines after as before), each changed
/// line is a template of its own too, at the places the whole edit's template left. Lines
/// inserted go beside the likes of their neighbours instead (`insertions`); lines deleted
/// also go where they recur (`deletions`).
pub fn predictions(last: &Edit, path: &str, text: &str) -> Vec<Prediction> {
    // The lines without the newline that ends the last (a place's span ends before its own).
    let lines = |s: &'_ str| s.strip_suffix('\n').unwrap_or(s).to_owned();
    let (old, new) = (lines(&last.old_lines), lines(&last.new_lines));
    let window = Window::of(last, text);
    // Lines inserted have no lines of their own to match: they go again beside the likes of
    // the lines around them.
    if last.old.is_empty() && last.new.contains('\n') {
        return insertions(&old, &new, &window, text, path);
    }
    // Lines deleted go where they recur (and, below, as a template with the lines around).
    let mut out = if last.new.is_empty() && last.old.contains('\n') {
        deletions(&old, &new, &window, text, path)
    } else {
        Vec::new()
    };
    if old.lines().count() > MAX_LINES || new.lines().count() > MAX_LINES + 3 {
        return out;
    }
    let mut taken: Vec<usize> = out.iter().map(|p| text[..p.start].matches('\n').count()).collect();
    at_places(&old, &new, &window, text, path, &mut taken, &mut out);
    if old.lines().count() > 1 && old.lines().count() == new.lines().count() {
        for (o, n) in old.lines().zip(new.lines()) {
            at_places(o, n, &window, text, path, &mut taken, &mut out);
        }
    }
    out
}

/// The places in `window` that match template `old` (its lines), as predictions of `new`;
/// a place whose first line `taken` holds already is passed over.
fn at_places(
    old: &str,
    new: &str,
    window: &Window,
    text: &str,
    path: &str,
    taken: &mut Vec<usize>,
    out: &mut Vec<Prediction>,
) {
    let Window { starts, first, end, lo, hi } = window;
    let k = old.lines().count();
    // A template that is one short token (`}`, `return`) matches too much to mean anything.
    let template = tokens(old);
    if old.trim().is_empty() || template.len() < 3 || template.len() > MAX_TOKENS || old == new {
        return;
    }
    let old_indent = indent(old);
    // The edit's changes, found once, to carry to places like its lines in part.
    let carrier = crate::aligned::Carrier::new(old, new);
    for i in *lo..=hi.saturating_sub(k - 1) {
        let last_line = i + k - 1;
        // Not the edit's own lines, nor a run that overlaps them.
        if (i <= *end && last_line >= *first) || taken.contains(&i) {
            continue;
        }
        let (start, stop) = (starts[i], line_end(starts, text, last_line));
        let place = &text[start..stop];
        // At the place's own indentation where it differs from the edit's; else, where the
        // place is like the edit's lines in part, its changes carried over.
        let rewritten = match renames(old, place) {
            Some(map) => moved(new, &map, old_indent, indent(place)),
            None if !new.trim().is_empty() => {
                let Some(carried) = carrier.as_ref().and_then(|c| c.carry(place)) else { continue };
                carried
            }
            None => continue,
        };
        if rewritten != place {
            taken.push(i);
            out.push(Prediction { path: path.to_owned(), start, end: stop, replacement: rewritten, why: Why::Again });
        }
    }
}

/// `block` with the names of `map` put in and its lines moved from indentation `from` to
/// `to`.
fn moved(block: &str, map: &HashMap<&str, &str>, from: &str, to: &str) -> String {
    let block = put_in(block, map);
    if from == to {
        return block;
    }
    let lines: Vec<String> = block
        .split('\n')
        .map(|l| match l.strip_prefix(from) {
            Some(rest) if !l.trim().is_empty() => format!("{to}{rest}"),
            _ => l.to_owned(),
        })
        .collect();
    lines.join("\n")
}

/// The lines in the middle of `a` that `b` lacks, when `b` is `a` without them (a whole
/// line's deletion, its lines before and after as the diff widened them), with the number
/// of lines before them.
pub(crate) fn middle<'a>(a: &'a str, b: &str) -> Option<(Vec<&'a str>, usize)> {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let lead = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let trail = a[lead..].iter().rev().zip(b[lead..].iter().rev()).take_while(|(x, y)| x == y).count();
    let block = a[lead..a.len() - trail].to_vec();
    (lead + trail == b.len() && !block.is_empty() && block.len() <= MAX_LINES + 3).then_some((block, lead))
}

/// Whole lines deleted: where the same lines recur in reach with other names, deleted too
/// (a guard's three lines removed from one function go from the next).
fn deletions(old: &str, new: &str, window: &Window, text: &str, path: &str) -> Vec<Prediction> {
    let Some((block, _)) = middle(old, new) else { return Vec::new() };
    let block = block.join("\n");
    if tokens(&block).len() < 3 {
        return Vec::new();
    }
    let k = block.lines().count();
    let Window { starts, lo, hi, .. } = window;
    let mut out = Vec::new();
    for i in *lo..=hi.saturating_sub(k - 1) {
        if renames(&block, &text[starts[i]..line_end(starts, text, i + k - 1)]).is_none() {
            continue;
        }
        let end = starts.get(i + k).copied().unwrap_or(text.len());
        out.push(Prediction {
            path: path.to_owned(),
            start: starts[i],
            end,
            replacement: String::new(),
            why: Why::Again,
        });
    }
    out
}

/// Whole lines inserted (the edit's `old` and `new` lines differ only by lines in the
/// middle): the same lines inserted after each line in reach that is the line above them
/// with other names (a guard added after one `func …(f1, f2 os.FileInfo) bool {` goes after
/// the next), else before each that is the line below them with other names; its names put
/// in, at its indentation; not where they are already.
fn insertions(old: &str, new: &str, window: &Window, text: &str, path: &str) -> Vec<Prediction> {
    let Some((block, lead)) = middle(new, old) else { return Vec::new() };
    if block.iter().all(|l| l.trim().is_empty()) {
        return Vec::new();
    }
    let Window { starts, first, lo, hi, .. } = window;
    let (top, bottom) = (first + lead, first + lead + block.len() - 1);
    let line = |i: usize| &text[starts[i]..line_end(starts, text, i)];
    let (above, below) = (top.checked_sub(1).map(line), (bottom + 1 < starts.len()).then(|| line(bottom + 1)));
    let block_text = block.join("\n");
    let plain = |l: &str| l.trim().is_empty() || tokens(l).len() < 3;
    let mut out = Vec::new();
    for i in *lo..=*hi {
        if (top.saturating_sub(1)..=bottom + 1).contains(&i) {
            continue;
        }
        let here = line(i);
        // After a like of the line above, else before a like of the line below.
        let (at, map, from) = if let Some(map) = above.filter(|a| !plain(a)).and_then(|a| renames(a, here)) {
            let Some(&next) = starts.get(i + 1) else { continue };
            (next, map, indent(above.unwrap_or("")))
        } else if let Some(map) = below.filter(|b| !plain(b)).and_then(|b| renames(b, here)) {
            (starts[i], map, indent(below.unwrap_or("")))
        } else {
            continue;
        };
        let lines = moved(&block_text, &map, from, indent(here)) + "\n";
        // Not where the lines are already (above the place or below it), nor twice at one
        // place (after one like and before the other).
        if text[at..].starts_with(&lines)
            || text[..at].ends_with(&lines)
            || out.iter().any(|p: &Prediction| p.start == at)
        {
            continue;
        }
        out.push(Prediction { path: path.to_owned(), start: at, end: at, replacement: lines, why: Why::Again });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(before: &str, from: &str, to: &str) -> (Edit, String) {
        let after = before.replacen(from, to, 1);
        (caret_complete::next_edit::diff("a.go", before, &after).unwrap(), after)
    }

    #[test]
    fn the_edit_goes_again_where_its_lines_recur_with_other_names() {
        // Two lines become one; the place has `cErr` where the edit had `err`.
        let before = "func a() {\n\t\tenc.Encoder(ctx, err, w)\n\t\treturn\n}\nfunc b() {\n\tif x {\n\t\tenc.Encoder(ctx, cErr, w)\n\t\treturn\n\t}\n}\n";
        let (last, text) = after(before, "enc.Encoder(ctx, err, w)\n\t\treturn\n", "return err\n");
        let p = predictions(&last, "a.go", &text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].why, Why::Again);
        assert_eq!(p[0].apply(&text), "func a() {\n\t\treturn err\n}\nfunc b() {\n\tif x {\n\t\treturn cErr\n\t}\n}\n");
        // A line added above, at the place's own indentation, and names and literals put in.
        let before = "func String(s string) *string { return &s }\n\nfunc Int(i int) *int { return &i }\n";
        let (last, text) = after(
            before,
            "func String(s string) *string { return &s }",
            "// Deprecated: use \"Ptr\".\nfunc String(s string) *string { return Ptr(s) }",
        );
        let p = predictions(&last, "a.go", &text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].replacement, "// Deprecated: use \"Ptr\".\nfunc Int(i int) *int { return Ptr(i) }");
        let (last, text) =
            after("    x.style(\"a {v}\", active)\n        y.style(\"b\", inactive)\n", "active)", "active.get())");
        let p = predictions(&last, "a.go", &text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].replacement, "        y.style(\"b\", inactive.get())");
    }

    #[test]
    fn lines_inserted_go_again_beside_the_likes_of_their_neighbours() {
        let guard = "\tif f1 == nil || f2 == nil {\n\t\treturn f2 == nil\n\t}\n";
        let before = "func SizeSort(f1, f2 os.FileInfo) bool {\n\treturn f1.Size() < f2.Size()\n}\n\nfunc NameSort(f1, f2 os.FileInfo) bool {\n\treturn f1.Name() < f2.Name()\n}\n";
        let at = before.find("\treturn").unwrap();
        let text = format!("{}{guard}{}", &before[..at], &before[at..]);
        let last = caret_complete::next_edit::diff("a.go", before, &text).unwrap();
        let p = predictions(&last, "a.go", &text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].why, Why::Again);
        let want = text.replace(
            "NameSort(f1, f2 os.FileInfo) bool {\n",
            &format!("NameSort(f1, f2 os.FileInfo) bool {{\n{guard}"),
        );
        assert_eq!(p[0].apply(&text), want);
        // Where the lines are already, nothing.
        let done = want.clone();
        let again = caret_complete::next_edit::diff("a.go", before, &text).unwrap();
        assert!(predictions(&again, "a.go", &done).is_empty());
        // The line below them when the line above is too plain (a blank line); names put in.
        let before = "\n\tif doc.Schemas == nil {\n\t\tx()\n\t}\n\n\tif doc.Params == nil {\n\t\ty()\n\t}\n";
        let text = before.replacen("\n\tif doc.Schemas", "\n\tlog(\"Schemas\", doc.Schemas)\n\tif doc.Schemas", 1);
        let last = caret_complete::next_edit::diff("a.go", before, &text).unwrap();
        let p = predictions(&last, "a.go", &text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].replacement, "\tlog(\"Schemas\", doc.Params)\n");
        assert_eq!(&text[p[0].start..], "\tif doc.Params == nil {\n\t\ty()\n\t}\n");
    }

    #[test]
    fn lines_deleted_go_where_they_recur_with_other_names() {
        let before = "def a(self):\n    if not self.flip():\n        return None\n    x()\n\ndef b(self):\n    if not self.flop():\n        return None\n    y()\n";
        let (last, text) = after(before, "    if not self.flip():\n        return None\n", "");
        let p = predictions(&last, "a.py", &text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].why, Why::Again);
        assert_eq!(p[0].apply(&text), "def a(self):\n    x()\n\ndef b(self):\n    y()\n");
    }

    #[test]
    fn other_punctuation_or_inconsistent_names_are_no_place() {
        // `f(a, a)` cannot be `f(b, c)`: `a` would stand for two names.
        let (last, text) = after("f(a, a)\ng(x)\nf(b, c)\nf(b)\n", "f(a, a)", "f(a, a, 0)");
        assert!(predictions(&last, "a.go", &text).is_empty());
        // A one-token template is too plain to mean anything; an insertion has no template.
        let (last, text) = after("return\nx = 1\nreturn\n", "return\nx", "return 0\nx");
        assert!(predictions(&last, "a.go", &text).is_empty());
        let (last, text) = after("a = 1\nb = 2\n", "a = 1\n", "a = 1\nz = 3\n");
        assert!(predictions(&last, "a.go", &text).is_empty());
        // Swapped names are no renaming.
        assert!(renames("f(a, b)", "f(b, a)").is_none());
        assert_eq!(renames("f(a, 'x')", "f(b, 'y')").unwrap().len(), 2);
        assert!(renames("f(a)", "f[a]").is_none());
        assert!(renames("a = 1", "b = 2").is_none(), "no word in common");
        assert!(renames("x.y(a, b)", "z.w(c, d)").is_none(), "more differs than stays");
        assert!(renames("f(a)", "f(1)").is_none());
    }

    #[test]
    fn a_run_like_the_edits_lines_in_part_takes_its_changes() {
        // Another list's length: no renaming of the whole line, but the wrapping carries.
        let before = "def a():\n    v = [(x1, y1), (x2, y2)]\n\ndef b():\n    if ok:\n        v = [(x, y)]\n";
        let (last, text) = after(before, "v = [(x1, y1), (x2, y2)]", "v = deque([(x1, y1), (x2, y2)])");
        let p = predictions(&last, "a.py", &text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].why, Why::Again);
        assert!(p[0].apply(&text).ends_with("    if ok:\n        v = deque([(x, y)])\n"), "{}", p[0].apply(&text));
    }

    #[test]
    fn literals_and_lifetimes_tokenise_as_expected() {
        let t = |s: &str| tokens(s).into_iter().map(|(a, b, _)| s[a..b].to_owned()).collect::<Vec<_>>();
        assert_eq!(t(r#"f("a \" b", x)"#), ["f", "(", r#""a \" b""#, ",", "x", ")"]);
        assert_eq!(t("&'a str"), ["&", "'", "a", "str"]);
        assert_eq!(t("é = 1"), ["é", "=", "1"]);
    }
}
