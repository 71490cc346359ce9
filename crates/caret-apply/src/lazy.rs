//! Lazy snippets: the new code with unchanged stretches elided by marker comments —
//! `// ... existing code ...`, `# ...`, `/* ... */`, `<!-- ... -->` — in the file's syntax.
//!
//! The snippet is cut at its markers into segments. Each segment is placed in the file by
//! its anchors: lines it shares with the file, in order. The first distinctive line found
//! (one place only, or the longest run of following lines decides) fixes where the segment
//! starts; from there the segment is aligned with the file line by line, resynchronising
//! after inserted or removed lines. The segment then replaces the file's lines from its first
//! to its last anchor, widened over changed lines at either end (a renamed signature above
//! the first anchor, say) when the file's lines there look like them. What markers elide is
//! kept. Segments are placed in order, each after the previous one.

use crate::matcher::Shift;
use crate::text::edit_lines;
use crate::{Error, Result, Text};

/// Whether a line is an elision marker: a comment whose text has `...` or `…`.
pub fn is_marker(line: &str) -> bool {
    let t = line.trim();
    let body = ["//", "#", "--", "/*", "<!--", ";", "{/*", "*"].iter().find_map(|open| t.strip_prefix(open));
    let Some(body) = body else { return false };
    let body = body.trim().trim_end_matches("*/}").trim_end_matches("*/").trim_end_matches("-->").trim();
    (body.contains("...") || body.contains('…')) && body.len() < 80
}

/// Whether text looks like a lazy snippet.
pub fn detect(edit: &str) -> bool {
    edit.lines().any(is_marker)
}

/// A lazy snippet cut at its markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snippet {
    /// The runs of concrete lines between markers.
    pub segments: Vec<Vec<String>>,
}

/// Cuts a snippet at its markers (a code fence around it is dropped).
pub fn parse(edit: &str) -> Result<Snippet> {
    let mut lines = edit_lines(edit);
    if lines.first().is_some_and(|l| l.trim_start().starts_with("```")) {
        lines.remove(0);
        if let Some(end) = lines.iter().rposition(|l| l.trim() == "```") {
            lines.truncate(end);
        }
    }
    let mut segments = vec![Vec::new()];
    for l in lines {
        if is_marker(l) {
            segments.push(Vec::new());
        } else if let Some(seg) = segments.last_mut() {
            seg.push(l.to_owned());
        }
    }
    for seg in &mut segments {
        while seg.first().is_some_and(|l| l.trim().is_empty()) {
            seg.remove(0);
        }
        while seg.last().is_some_and(|l| l.trim().is_empty()) {
            seg.pop();
        }
    }
    segments.retain(|s| !s.is_empty());
    if segments.is_empty() {
        return Err(Error::Malformed("the snippet has no code besides its markers".to_owned()));
    }
    Ok(Snippet { segments })
}

fn same(a: &str, b: &str) -> bool {
    a.trim() == b.trim()
}

/// A line worth anchoring on: not blank, not only brackets and punctuation.
fn distinctive(line: &str) -> bool {
    line.chars().filter(|c| c.is_alphanumeric()).count() >= 3
}

/// How many lines from `seg[i..]` and `file[j..]` agree in a row.
fn run(seg: &[&str], i: usize, file: &[&str], j: usize) -> usize {
    seg[i..].iter().zip(&file[j.min(file.len())..]).take_while(|(a, b)| same(a, b)).count()
}

/// Words of a line, for "looks like" comparisons.
fn words(line: &str) -> Vec<&str> {
    line.split(|c: char| !c.is_alphanumeric() && c != '_').filter(|w| !w.is_empty()).collect()
}

/// Whether two lines look like versions of each other (half their words shared).
fn similar(a: &str, b: &str) -> bool {
    let (wa, wb) = (words(a), words(b));
    if wa.is_empty() || wb.is_empty() {
        return a.trim() == b.trim();
    }
    let shared = wa.iter().filter(|w| wb.contains(w)).count();
    shared * 2 >= wa.len().max(wb.len())
}

/// The segment's first anchor: its index in the segment and the file lines where it starts
/// the longest run of agreeing lines (several when tied).
fn head_anchor(seg: &[&str], file: &[&str], from: usize) -> Result<(usize, Vec<usize>)> {
    for a in (0..seg.len()).filter(|&a| distinctive(seg[a])) {
        let mut best: Vec<usize> = Vec::new();
        let mut best_run = 0;
        for j in (from..file.len()).filter(|&j| same(seg[a], file[j])) {
            let r = run(seg, a, file, j);
            if r > best_run {
                best = vec![j];
                best_run = r;
            } else if r == best_run {
                best.push(j);
            }
        }
        if !best.is_empty() {
            return Ok((a, best));
        }
    }
    Err(Error::NoMatch { anchor: crate::error::excerpt(seg) })
}

/// The indentation change from a segment's line to the file's.
fn shift_of(file_line: &str, seg_line: &str) -> Shift {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let (f, s) = (&file_line[..indent(file_line)], &seg_line[..indent(seg_line)]);
    if let Some(extra) = f.strip_suffix(s).filter(|e| !e.is_empty()) {
        Shift::Add(extra.to_owned())
    } else if let Some(less) = s.strip_suffix(f).filter(|l| !l.is_empty()) {
        Shift::Remove(less.to_owned())
    } else {
        Shift::None
    }
}

/// Places one segment: the file range `[start, end)` it replaces, and the indentation change
/// to apply to its lines.
fn place(seg: &[&str], file: &[&str], from: usize) -> Result<(usize, usize, Shift)> {
    let (a, candidates) = head_anchor(seg, file, from)?;
    if let [pos] = candidates.as_slice() {
        let p = align(seg, file, from, a, *pos);
        return Ok((p.start, p.end, p.shift));
    }
    // Tied: the place where more of the segment lines up, skipping fewer of the file's lines,
    // wins; a tie there is ambiguous.
    let placed: Vec<Placement> = candidates.iter().map(|&pos| align(seg, file, from, a, pos)).collect();
    let key = |p: &Placement| (p.matched, std::cmp::Reverse(p.skipped));
    let top = placed.iter().map(key).max();
    let best: Vec<&Placement> = placed.iter().filter(|p| Some(key(p)) == top).collect();
    match best.as_slice() {
        [p] => Ok((p.start, p.end, p.shift.clone())),
        many => Err(Error::Ambiguous {
            anchor: crate::error::excerpt(&seg[a..]),
            lines: many.iter().map(|p| p.anchor + 1).collect(),
        }),
    }
}

/// A segment laid over the file from one anchor.
struct Placement {
    /// The anchor's file line.
    anchor: usize,
    /// The file range replaced.
    start: usize,
    end: usize,
    /// Indentation change for the segment's lines.
    shift: Shift,
    /// Segment lines that agreed with file lines.
    matched: usize,
    /// File lines skipped between agreeing stretches (removed by the segment).
    skipped: usize,
}

/// Aligns the segment with the file from anchor `seg[a]` = `file[pos]`.
fn align(seg: &[&str], file: &[&str], from: usize, a: usize, pos: usize) -> Placement {
    // From the anchor on, lines agree only with the anchor's indentation change applied, so a
    // closing brace matches the brace at its own depth.
    let shift = shift_of(file[pos], seg[a]);
    let same = |s: &str, f: &str| shift.apply(s).trim_end() == f.trim_end();
    let run =
        |i: usize, j: usize| seg[i..].iter().zip(&file[j.min(file.len())..]).take_while(|(a, b)| same(a, b)).count();
    let r = run(a, pos).max(1);
    let (mut i, mut j) = (a + r, pos + r);
    let mut end = j;
    let (mut matched, mut skipped) = (r, 0);
    'align: while i < seg.len() {
        if j < file.len() && same(seg[i], file[j]) {
            i += 1;
            j += 1;
            end = j;
            matched += 1;
            continue;
        }
        // Resynchronise: the cheapest skip (lines inserted by the segment, lines removed from
        // the file) after which the two agree again. A removed line costs two inserted ones:
        // snippets add code more often than they drop it, and a far jump in the file is how a
        // wrong resynchronisation on look-alike lines happens.
        for cost in 1..=800 {
            for di in 0..=cost.min(seg.len() - i) {
                if (cost - di) % 2 != 0 {
                    continue;
                }
                let dj = (cost - di) / 2;
                let (ni, nj) = (i + di, j + dj);
                if ni >= seg.len() || nj >= file.len() || !same(seg[ni], file[nj]) {
                    continue;
                }
                let agree = run(ni, nj);
                // Two lines in a row, or the segment's last line(s) (a closing brace that ends
                // it: the nearest one, as the fewest skipped lines come first).
                if agree >= 2 || ni + agree == seg.len() {
                    i = ni + agree;
                    j = nj + agree;
                    end = j;
                    matched += agree;
                    skipped += dj;
                    continue 'align;
                }
            }
        }
        break;
    }
    // Changed lines after the last anchor replace the file's lines there that look like them.
    let tail = seg.len() - i;
    while end < file.len() && end - j.min(end) < tail {
        let k = i + (end - j.min(end));
        if k < seg.len() && similar(seg[k], file[end]) && !same(seg[k], file[end]) {
            end += 1;
        } else {
            break;
        }
    }
    // Changed lines before the first anchor, likewise, looking upward.
    let mut start = pos;
    let mut k = a;
    while k > 0 && start > from && similar(seg[k - 1], file[start - 1]) {
        k -= 1;
        start -= 1;
    }
    Placement { anchor: pos, start, end, shift, matched, skipped }
}

/// Applies a snippet to a file.
pub fn apply(text: &Text, snippet: &Snippet) -> Result<Text> {
    let file = text.line_refs();
    let mut regions = Vec::new();
    let mut from = 0;
    for seg in &snippet.segments {
        let seg: Vec<&str> = seg.iter().map(String::as_str).collect();
        let (start, end, shift) = place(&seg, &file, from)?;
        regions.push((start, end, seg.iter().map(|l| shift.apply(l)).collect::<Vec<_>>()));
        from = end;
    }
    let mut out = text.clone();
    for (start, end, lines) in regions.into_iter().rev() {
        out.lines.splice(start..end, lines);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "use std::io;\n\nstruct Server {\n    port: u16,\n}\n\nimpl Server {\n    fn new(port: u16) -> Self {\n        Server { port }\n    }\n\n    fn start(&self) {\n        println!(\"start\");\n        listen(self.port);\n    }\n\n    fn stop(&self) {\n        println!(\"stop\");\n    }\n}\n";

    fn lazy(file: &str, edit: &str) -> Result<String> {
        apply(&Text::new(file), &parse(edit)?).map(|t| t.render())
    }

    #[test]
    fn markers_in_any_comment_syntax() {
        for m in [
            "// ... existing code ...",
            "# ...",
            "    /* … rest of the file … */",
            "<!-- ... -->",
            "-- ...",
            "{/* ... */}",
        ] {
            assert!(is_marker(m), "{m}");
        }
        for m in ["...", "x = 1  # ...", "// a real comment", "println!(\"...\");"] {
            assert!(!is_marker(m), "{m}");
        }
    }

    #[test]
    fn a_method_body_changes_between_markers() {
        let edit = "// ... existing code ...\n    fn start(&self) {\n        println!(\"starting on {}\", self.port);\n        listen(self.port);\n    }\n// ... existing code ...\n";
        let out = lazy(FILE, edit).unwrap();
        assert_eq!(out, FILE.replace("println!(\"start\");", "println!(\"starting on {}\", self.port);"));
    }

    #[test]
    fn a_renamed_signature_above_the_first_anchor_replaces_the_old_one() {
        let edit = "    // ...\n    fn stop(&self, reason: &str) {\n        println!(\"stop\");\n        log(reason);\n    }\n    // ...\n";
        let out = lazy(FILE, edit).unwrap();
        let expected = FILE.replace(
            "    fn stop(&self) {\n        println!(\"stop\");\n    }",
            "    fn stop(&self, reason: &str) {\n        println!(\"stop\");\n        log(reason);\n    }",
        );
        assert_eq!(out, expected);
    }

    #[test]
    fn insertions_deletions_and_unindented_quotes() {
        // A field added; the snippet quotes the struct without markers inside.
        let out = lazy(FILE, "struct Server {\n    port: u16,\n    host: String,\n}\n// ...\n").unwrap();
        assert!(out.contains("    port: u16,\n    host: String,\n}"), "{out}");
        assert_eq!(out.lines().count(), FILE.lines().count() + 1);
        // Two segments; a method removed by quoting its neighbours together.
        let edit =
            "// ...\n    fn start(&self) {\n        println!(\"start\");\n        listen(self.port);\n    }\n}\n";
        let out = lazy(FILE, edit).unwrap();
        let expected = FILE.replace("\n    fn stop(&self) {\n        println!(\"stop\");\n    }\n", "");
        assert_eq!(out, expected.replace("    }\n\n}", "    }\n}"));
        // Quoted without the impl's indentation: carried over.
        let edit = "// ...\nfn new(port: u16) -> Self {\n    Server { port: port.max(1) }\n}\n// ...\n";
        let out = lazy(FILE, edit).unwrap();
        assert!(
            out.contains("    fn new(port: u16) -> Self {\n        Server { port: port.max(1) }\n    }\n"),
            "{out}"
        );
    }

    #[test]
    fn a_snippet_without_a_closing_marker_does_not_delete_the_rest_of_the_file() {
        // The model forgot the trailing marker: what follows `new` stays (see ARCHITECTURE).
        let edit = "// ...\n    fn new(port: u16) -> Self {\n        Server { port: 80 }\n    }\n";
        let out = lazy(FILE, edit).unwrap();
        assert_eq!(out, FILE.replace("Server { port }", "Server { port: 80 }"));
    }

    #[test]
    fn nothing_to_anchor_on_or_two_places_are_errors() {
        assert!(matches!(lazy(FILE, "// ...\nfn brand_new() {}\n// ...\n"), Err(Error::NoMatch { .. })));
        let twice = "fn a() {\n    work();\n}\nfn b() {\n    work();\n}\n";
        assert!(matches!(lazy(twice, "// ...\n    work();\n    more();\n// ...\n"), Err(Error::Ambiguous { .. })));
        assert!(matches!(parse("// ...\n\n// ...\n"), Err(Error::Malformed(_))));
    }
}
