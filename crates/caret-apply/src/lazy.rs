//! Lazy snippets: the new code with unchanged stretches elided by marker comments —
//! `// ... existing code ...`, `# ...`, `/* ... */`, `<!-- ... -->` — in the file's syntax.
//!
//! The snippet is cut at its markers into segments. Each segment is placed in the file by
//! an anchor: its first line worth anchoring on (distinctive, not a lone keyword) that the
//! file holds. Every place holding that line is scored by aligning the segment with the file
//! around it ([`crate::align`]: agreeing lines score, the segment's first and last lines —
//! its context — double; inserted and dropped lines cost, in blocks); the best place wins,
//! and two places scoring the same are ambiguous. The segment then replaces the file's lines
//! it covers, widened over changed lines at either end (a renamed signature above the first
//! agreeing line, say) when the file's lines there look like them. What markers elide is
//! kept. Segments are placed in order, each after the previous one. What is not elided is
//! not there: a snippet without a closing marker ends the file, unless so much follows that a
//! forgotten marker is likelier (see [`reaches_edge`]).

use std::collections::HashMap;

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
    /// Whether the snippet ends with a marker (the file goes on after its last segment).
    pub open_end: bool,
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
    let open_end = lines.iter().rev().find(|l| !l.trim().is_empty()).is_some_and(|l| is_marker(l));
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
    Ok(Snippet { segments, open_end })
}

fn same(a: &str, b: &str) -> bool {
    a.trim() == b.trim()
}

/// A line that is evidence of a place when it agrees: not blank, not only brackets and
/// punctuation.
fn distinctive(line: &str) -> bool {
    line.chars().filter(|c| c.is_alphanumeric()).count() >= 3
}

/// A line worth anchoring a segment on: distinctive, and not a lone keyword (`else:`,
/// `try {`, `return;`, `finally:`) that recurs all over a file.
fn anchorable(line: &str) -> bool {
    let w = words(line);
    distinctive(line) && (w.len() >= 2 || w.iter().any(|w| w.len() >= 9))
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

/// The segment's anchor: its first line worth anchoring on that the file holds (a lone
/// keyword only if no other line is found), with the file lines holding it (at most
/// [`MAX_CANDIDATES`], those starting the longest runs of agreeing lines).
fn head_anchor(seg: &[&str], file: &[&str], from: usize) -> Result<(usize, Vec<usize>)> {
    let order = (0..seg.len())
        .filter(|&a| anchorable(seg[a]))
        .chain((0..seg.len()).filter(|&a| distinctive(seg[a]) && !anchorable(seg[a])));
    for a in order {
        let mut found: Vec<(usize, usize)> =
            (from..file.len()).filter(|&j| same(seg[a], file[j])).map(|j| (run(seg, a, file, j), j)).collect();
        if found.is_empty() {
            continue;
        }
        if found.len() > MAX_CANDIDATES {
            found.sort_by_key(|&(r, j)| (std::cmp::Reverse(r), j));
            found.truncate(MAX_CANDIDATES);
            found.sort_by_key(|&(_, j)| j);
        }
        return Ok((a, found.into_iter().map(|(_, j)| j).collect()));
    }
    Err(Error::NoMatch { anchor: crate::error::excerpt(seg) })
}

/// Places of an anchor line scored in full; a line repeated more often than this is judged
/// by the runs of lines agreeing after it first.
const MAX_CANDIDATES: usize = 32;

/// What agreeing on line `i` of a segment is worth: distinctive lines are evidence, blank
/// lines and braces little; the first and last [`EDGE`] lines count double, as a snippet's
/// context sits there (what lies between is new code that may look like code elsewhere).
fn weight(seg: &[&str], i: usize) -> i32 {
    let base = if distinctive(seg[i]) { 300 } else { 50 };
    if i < EDGE || i + EDGE >= seg.len() { 2 * base } else { base }
}

/// Lines at each end of a segment taken for its context.
const EDGE: usize = 3;

/// A snippet without a closing marker reaches the file's end when at most this many lines
/// (or the segment's length, if longer) follow its last segment, and they are at most a
/// quarter of the file; more are kept (a forgotten marker must not delete the rest of a file).
const EDGE_REACH: usize = 12;

/// Whether the last segment of a snippet without a closing marker takes the `beyond` lines
/// after it away.
fn reaches_edge(beyond: usize, total: usize, seg_len: usize) -> bool {
    beyond <= EDGE_REACH.max(seg_len) && beyond * 4 <= total
}

/// The file's lines with ids for comparison (equal ids = equal but for trailing whitespace).
struct FileLines<'a> {
    lines: &'a [&'a str],
    ids: Vec<u32>,
    index: HashMap<&'a str, u32>,
}

impl<'a> FileLines<'a> {
    fn new(lines: &'a [&'a str]) -> FileLines<'a> {
        let mut index = HashMap::new();
        let ids = lines
            .iter()
            .map(|l| {
                let next = index.len() as u32;
                *index.entry(l.trim_end()).or_insert(next)
            })
            .collect();
        FileLines { lines, ids, index }
    }

    /// A snippet line's id; one found nowhere in the file agrees with nothing.
    fn id(&self, line: &str) -> u32 {
        self.index.get(line.trim_end()).copied().unwrap_or(u32::MAX)
    }
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

/// Places one segment after file line `from`: the best scoring of its anchor's places; two
/// different places scoring the same are ambiguous.
fn place(seg: &[&str], file: &FileLines<'_>, from: usize) -> Result<Placement> {
    let (a, candidates) = head_anchor(seg, file.lines, from)?;
    let mut placed: Vec<Placement> = candidates.into_iter().map(|pos| align(seg, file, from, a, pos)).collect();
    let top = placed.iter().map(|p| p.score).max();
    placed.retain(|p| Some(p.score) == top);
    placed.sort_by_key(|p| (p.start, p.end));
    placed.dedup_by_key(|p| (p.start, p.end));
    if placed.len() == 1 {
        return Ok(placed.remove(0));
    }
    Err(Error::Ambiguous {
        anchor: crate::error::excerpt(&seg[a..]),
        lines: placed.iter().map(|p| p.anchor + 1).collect(),
    })
}

/// Whether `new` lines are each a changed version of the `old` line in their place.
fn changed_versions(new: &[&str], old: Option<&[&str]>) -> bool {
    old.is_some_and(|old| !new.is_empty() && new.iter().zip(old).all(|(n, o)| similar(n, o) && !same(n, o)))
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
    /// How well the segment agrees with the file there ([`crate::align`]).
    score: i32,
}

/// Aligns the segment with the file around anchor `seg[a]` = `file[pos]`: the lines after
/// it forward, the lines before it backward (no higher than `from`).
fn align(seg: &[&str], file: &FileLines<'_>, from: usize, a: usize, pos: usize) -> Placement {
    let lines = file.lines;
    // Lines agree only with the anchor's indentation change applied, so a closing brace
    // matches the brace at its own depth.
    let shift = shift_of(lines[pos], seg[a]);
    let prepare = |part: std::ops::Range<usize>| -> (Vec<u32>, Vec<i32>) {
        (seg[part.clone()].iter().map(|l| file.id(&shift.apply(l))).collect(), part.map(|i| weight(seg, i)).collect())
    };
    // Dropping file lines pays for itself only against agreeing lines after them, so the
    // window needs to reach no further than the segment's weight allows.
    let reach = |n: usize| 2 * n + 800;
    let (ids, weights) = prepare(a + 1..seg.len());
    let window = (pos + 1 + reach(ids.len())).min(lines.len());
    let after = crate::align::align(&ids, &weights, &file.ids[pos + 1..window]);
    let (mut ids, mut weights) = prepare(0..a);
    ids.reverse();
    weights.reverse();
    let top = pos.saturating_sub(reach(ids.len())).max(from);
    let above: Vec<u32> = file.ids[top..pos].iter().rev().copied().collect();
    let before = crate::align::align(&ids, &weights, &above);

    // New lines after the last one laid over the file replace the file's lines there when
    // each looks like the file line in its place (changed last lines); otherwise they are
    // inserted (a new method shaped like the next one must not replace it).
    let mut end = pos + 1 + after.end;
    let tail = &seg[seg.len() - after.trailing..];
    if changed_versions(tail, lines.get(end..end + tail.len())) {
        end += tail.len();
    } else if !tail.is_empty() && end > pos + 1 && lines[end - 1].trim().is_empty() {
        // New lines after a blank line the file shares: the file's blank line is kept after
        // them too (a method appended after another stays separated from the next one).
        end -= 1;
    }
    // Likewise above the first (a renamed signature, a method added before).
    let mut start = pos - before.end;
    let head = &seg[..before.trailing];
    if start >= from + head.len() && changed_versions(head, lines.get(start - head.len()..start)) {
        start -= head.len();
    } else if !head.is_empty() && start < pos && lines[start].trim().is_empty() {
        start += 1;
    }
    Placement { anchor: pos, start, end, shift, score: after.score + before.score + weight(seg, a) }
}

/// Applies a snippet to a file.
pub fn apply(text: &Text, snippet: &Snippet) -> Result<Text> {
    let refs = text.line_refs();
    let file = FileLines::new(&refs);
    let mut regions = Vec::new();
    let mut from = 0;
    for (n, seg) in snippet.segments.iter().enumerate() {
        let seg: Vec<&str> = seg.iter().map(String::as_str).collect();
        let Placement { start, mut end, shift, .. } = place(&seg, &file, from)?;
        // What is not elided is not there: without a closing marker the last segment runs to
        // the file's end, unless so much follows that a forgotten marker is likelier. (Not so
        // at the start: snippets that begin without a marker are common, and an import block
        // deleted silently is worse than a header left in place.)
        if n + 1 == snippet.segments.len() && !snippet.open_end && reaches_edge(refs.len() - end, refs.len(), seg.len())
        {
            end = refs.len();
        }
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
    fn a_snippet_without_a_closing_marker_ends_the_file_when_little_follows() {
        // The last method and the impl's brace are the file's end: `stop` goes.
        let edit =
            "// ...\n    fn start(&self) {\n        println!(\"start\");\n        listen(self.port);\n    }\n}\n";
        let out = lazy(FILE, edit).unwrap();
        assert!(!out.contains("fn stop"), "{out}");
        assert!(out.ends_with("        listen(self.port);\n    }\n}\n"), "{out}");
        // Three lines of a long file followed by a short tail: the tail goes.
        let long: String = (0..40).map(|i| format!("line {i}\n")).collect();
        let out = lazy(&long, "# ...\nline 30\nline 31 changed\nline 32\n").unwrap();
        assert_eq!(out.lines().count(), 33, "{out}");
        assert!(out.ends_with("line 31 changed\nline 32\n"));
    }

    #[test]
    fn a_new_method_at_a_segments_end_does_not_swallow_the_next_one() {
        // The new method's closing brace must not be matched to `start`'s.
        let edit = "// ...\n    fn new(port: u16) -> Self {\n        Server { port }\n    }\n\n    fn restart(&self) {\n        self.stop();\n    }\n// ...\n";
        let out = lazy(FILE, edit).unwrap();
        let expected = FILE.replace(
            "        Server { port }\n    }\n",
            "        Server { port }\n    }\n\n    fn restart(&self) {\n        self.stop();\n    }\n",
        );
        assert_eq!(out, expected);
    }

    #[test]
    fn inserted_code_that_looks_like_the_code_after_it_is_inserted_before_it() {
        // The new call repeats the shape of the next one; the segment's last lines (its
        // context) place its end, so nothing after the insertion is dropped.
        let file = "def check():\n    assert_raises(\n        2.0,\n        1.0,\n        [\n            \"failed\",\n        ],\n    )\n\n\ndef other():\n    pass\n";
        let edit = "# ...\ndef check():\n    assert_raises(\n        True,\n        False,\n        [\n            \"mismatch\",\n        ],\n    )\n    assert_raises(\n        2.0,\n        1.0,\n# ...\n";
        let out = lazy(file, edit).unwrap();
        let expected = file.replace(
            "def check():\n",
            "def check():\n    assert_raises(\n        True,\n        False,\n        [\n            \"mismatch\",\n        ],\n    )\n",
        );
        assert_eq!(out, expected);
    }

    #[test]
    fn a_lone_keyword_is_not_an_anchor_when_better_lines_are_found() {
        // `else:` recurs; the segment is placed by `second(x)`, its context, not by it.
        let file = "if a:\n    first(x)\nelse:\n    pass\n\nif b:\n    second(x)\nelse:\n    pass\n";
        let edit = "# ...\nelse:\n    second(x)\n    third(x)\n# ...\n";
        let out = lazy(file, "# ...\n    second(x)\n    third(x)\nelse:\n# ...\n").unwrap();
        assert_eq!(out, file.replace("    second(x)\n", "    second(x)\n    third(x)\n"));
        assert!(lazy(file, edit).is_ok());
    }

    #[test]
    fn nothing_to_anchor_on_or_two_places_are_errors() {
        assert!(matches!(lazy(FILE, "// ...\nfn brand_new() {}\n// ...\n"), Err(Error::NoMatch { .. })));
        let twice = "fn a() {\n    work();\n}\nfn b() {\n    work();\n}\n";
        assert!(matches!(lazy(twice, "// ...\n    work();\n    more();\n// ...\n"), Err(Error::Ambiguous { .. })));
        assert!(matches!(parse("// ...\n\n// ...\n"), Err(Error::Malformed(_))));
    }
}
