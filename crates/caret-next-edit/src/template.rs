//! The edit again where its lines recur with other names: the last edit's old lines as a
//! template of tokens; a run of as many lines elsewhere whose tokens are the same but for
//! names, numbers and string literals that differ consistently (`err` is `cErr` wherever it
//! is) is rewritten as the edit's new lines with those tokens put in. One line or several,
//! a line deleted or added with it: `enc.Encoder(ctx, err, w)` + `return` → `return err`
//! makes `enc.Encoder(ctx, cErr, w)` + `return` → `return cErr`; `func String(s string) …`
//! with a comment added above makes the same comment above `func Int(i int) …`.

use std::collections::HashMap;

use caret_complete::next_edit::{Edit, Prediction, Why};

use crate::features::{Window, line_end};

/// Lines a template may span (more is new code, not a pattern).
const MAX_LINES: usize = 3;
/// Tokens a template may hold.
const MAX_TOKENS: usize = 200;
/// Distinct tokens that may differ between the template and a place (more is another line
/// that happens to share the punctuation).
const MAX_RENAMED: usize = 4;

/// What a token is, for telling which may stand for which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Name,
    Number,
    Text,
    Other,
}

/// Tokens of `s` with their byte spans: a quoted literal on one line (`"…"`, `'…'`, `` `…` ``,
/// escapes honoured), a run of word characters, or one other character; white space is no
/// token. A quote with no closing one on its line is a character of its own (a Rust
/// lifetime's `'a`).
fn tokens(s: &str) -> Vec<(usize, usize, Kind)> {
    let b = s.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if matches!(c, b'"' | b'\'' | b'`') {
            let mut j = i + 1;
            while j < b.len() && b[j] != c && b[j] != b'\n' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            if j < b.len() && b[j] == c {
                out.push((i, j + 1, Kind::Text));
                i = j + 1;
                continue;
            }
        }
        if word(c) {
            let mut j = i;
            while j < b.len() && word(b[j]) {
                j += 1;
            }
            let kind = if c.is_ascii_digit() { Kind::Number } else { Kind::Name };
            out.push((i, j, kind));
            i = j;
            continue;
        }
        // One character, however many bytes (`word` took every byte of 0x80 and up).
        out.push((i, i + 1, Kind::Other));
        i += 1;
    }
    out
}

/// The tokens of `template` that stand for other tokens in `place`, when `place` is the
/// template but for names, numbers and literals that differ consistently (none differing is
/// the same lines); `None` otherwise.
fn renames<'a>(template: &'a str, place: &'a str) -> Option<HashMap<&'a str, &'a str>> {
    let (a, b) = (tokens(template), tokens(place));
    if a.len() != b.len() {
        return None;
    }
    let mut map: HashMap<&str, &str> = HashMap::new();
    for (&(s1, e1, k1), &(s2, e2, k2)) in a.iter().zip(&b) {
        let (x, y) = (&template[s1..e1], &place[s2..e2]);
        if k1 != k2 || (k1 == Kind::Other && x != y) {
            return None;
        }
        if *map.entry(x).or_insert(y) != y {
            return None;
        }
    }
    map.retain(|x, y| x != y);
    // A token that stands for another may not also stand for itself: `a, b` → `b, c` would
    // put `c` where the template's `b` stays `b`.
    if map.values().any(|y| map.contains_key(y)) || map.len() > MAX_RENAMED {
        return None;
    }
    Some(map)
}

/// `text` with each whole token that `map` names replaced.
fn put_in(text: &str, map: &HashMap<&str, &str>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (s, e, _) in tokens(text) {
        if let Some(to) = map.get(&text[s..e]) {
            out.push_str(&text[at..s]);
            out.push_str(to);
            at = e;
        }
    }
    out.push_str(&text[at..]);
    out
}

fn indent(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// The predictions after `last` in `path` (now `text`): each run of lines in the candidates'
/// reach, other than the edit's own, that matches the edit's old lines, rewritten.
pub fn predictions(last: &Edit, path: &str, text: &str) -> Vec<Prediction> {
    // The lines without the newline that ends the last (a place's span ends before its own).
    let lines = |s: &'_ str| s.strip_suffix('\n').unwrap_or(s).to_owned();
    let (old, new) = (lines(&last.old_lines), lines(&last.new_lines));
    let (old, new) = (old.as_str(), new.as_str());
    let k = old.lines().count();
    // Lines inserted have no lines of their own to match; a template that is one short
    // token (`}`, `return`) matches too much to mean anything.
    let template = tokens(old);
    if (last.old.is_empty() && last.new.contains('\n'))
        || old.trim().is_empty()
        || k > MAX_LINES
        || new.lines().count() > MAX_LINES + 3
        || template.len() < 3
        || template.len() > MAX_TOKENS
        || old == new
    {
        return Vec::new();
    }
    let old_indent = indent(old);
    let Window { starts, first, end, lo, hi } = Window::of(last, text);
    let mut out = Vec::new();
    for i in lo..=hi.saturating_sub(k - 1) {
        let last_line = i + k - 1;
        // Not the edit's own lines, nor a run that overlaps them.
        if i <= end && last_line >= first {
            continue;
        }
        let (start, stop) = (starts[i], line_end(&starts, text, last_line));
        let place = &text[start..stop];
        let Some(map) = renames(old, place) else { continue };
        let rewritten = put_in(new, &map);
        // The place's own indentation where it differs from the edit's.
        let place_indent = indent(place);
        let rewritten = if place_indent == old_indent {
            rewritten
        } else {
            let lines: Vec<String> = rewritten
                .split('\n')
                .map(|l| match l.strip_prefix(old_indent) {
                    Some(rest) if !l.trim().is_empty() => format!("{place_indent}{rest}"),
                    _ => l.to_owned(),
                })
                .collect();
            lines.join("\n")
        };
        if rewritten != place {
            out.push(Prediction { path: path.to_owned(), start, end: stop, replacement: rewritten, why: Why::Analogous });
        }
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
        assert_eq!(p[0].why, Why::Analogous);
        assert_eq!(
            p[0].apply(&text),
            "func a() {\n\t\treturn err\n}\nfunc b() {\n\tif x {\n\t\treturn cErr\n\t}\n}\n"
        );
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
        assert!(renames("f(a)", "f(1)").is_none());
    }

    #[test]
    fn literals_and_lifetimes_tokenise_as_expected() {
        let t = |s: &str| tokens(s).into_iter().map(|(a, b, _)| s[a..b].to_owned()).collect::<Vec<_>>();
        assert_eq!(t(r#"f("a \" b", x)"#), ["f", "(", r#""a \" b""#, ",", "x", ")"]);
        assert_eq!(t("&'a str"), ["&", "'", "a", "str"]);
        assert_eq!(t("é = 1"), ["é", "=", "1"]);
    }
}
