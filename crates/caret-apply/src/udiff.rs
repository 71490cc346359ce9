//! Unified diffs, as `diff -u` and `git diff` write them — and as models write them: line
//! numbers that are wrong or missing (`@@ ... @@`), context that drifted a little.
//!
//! Each hunk's old side (context and removed lines) is located with the [`matcher`], at or
//! after the previous hunk, the stated line number breaking ties; if it is nowhere, up to two
//! context lines are dropped from each end (like `patch`'s fuzz) before giving up.
//!
//! [`matcher`]: crate::matcher

use crate::matcher::{Found, Level, Shift, find_near};
use crate::text::edit_lines;
use crate::{Error, Result, Text};

/// One line of a hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// Unchanged.
    Context(String),
    /// Removed.
    Remove(String),
    /// Added.
    Add(String),
}

/// One hunk.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hunk {
    /// The old side's first line as stated (1-based), if any.
    pub old_start: Option<usize>,
    /// The lines.
    pub lines: Vec<Line>,
    /// `\ No newline at end of file` after the new side's last line.
    pub new_no_final_newline: bool,
    /// The same after the old side's last line.
    pub old_no_final_newline: bool,
}

/// The hunks for one file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FileDiff {
    /// Path on the old side (`a/` stripped), `None` for `/dev/null`.
    pub old_path: Option<String>,
    /// Path on the new side.
    pub new_path: Option<String>,
    /// The hunks, in file order.
    pub hunks: Vec<Hunk>,
}

/// Whether text looks like a unified diff.
pub fn detect(edit: &str) -> bool {
    let lines: Vec<&str> = edit.lines().collect();
    lines.iter().any(|l| l.starts_with("@@")) && lines.iter().any(|l| l.starts_with("-") || l.starts_with("+"))
}

fn path_of(header: &str) -> Option<String> {
    let p = header.split('\t').next().unwrap_or("").trim();
    if p == "/dev/null" || p.is_empty() {
        return None;
    }
    Some(p.strip_prefix("a/").or_else(|| p.strip_prefix("b/")).unwrap_or(p).to_owned())
}

/// `@@ -12,5 +12,6 @@` → 12 (the old start); anything unparsable → `None`.
fn old_start(header: &str) -> Option<usize> {
    let minus = header.split_whitespace().find(|w| w.starts_with('-'))?;
    minus[1..].split(',').next()?.parse().ok()
}

/// Parses a diff of one or more files. Text before the first `---`/`@@` (prose, fences) is
/// ignored.
pub fn parse(edit: &str) -> Result<Vec<FileDiff>> {
    let mut files: Vec<FileDiff> = Vec::new();
    let mut hunk: Option<Hunk> = None;
    let lines = edit_lines(edit);
    let mut i = 0;
    let flush = |files: &mut Vec<FileDiff>, hunk: &mut Option<Hunk>| {
        if let Some(h) = hunk.take().filter(|h| !h.lines.is_empty()) {
            if files.is_empty() {
                files.push(FileDiff::default());
            }
            if let Some(f) = files.last_mut() {
                f.hunks.push(h);
            }
        }
    };
    while i < lines.len() {
        let l = lines[i];
        if l.starts_with("--- ") && lines.get(i + 1).is_some_and(|n| n.starts_with("+++ ")) {
            flush(&mut files, &mut hunk);
            files.push(FileDiff {
                old_path: path_of(&l[4..]),
                new_path: path_of(&lines[i + 1][4..]),
                hunks: Vec::new(),
            });
            i += 2;
            continue;
        }
        if l.starts_with("@@") {
            flush(&mut files, &mut hunk);
            hunk = Some(Hunk { old_start: old_start(l), ..Hunk::default() });
        } else if let Some(h) = &mut hunk {
            if let Some(rest) = l.strip_prefix('\\') {
                if rest.contains("No newline") {
                    match h.lines.last() {
                        Some(Line::Add(_)) => h.new_no_final_newline = true,
                        Some(Line::Remove(_)) => h.old_no_final_newline = true,
                        Some(Line::Context(_)) => {
                            h.new_no_final_newline = true;
                            h.old_no_final_newline = true;
                        }
                        None => {}
                    }
                }
            } else if let Some(t) = l.strip_prefix('+') {
                h.lines.push(Line::Add(t.to_owned()));
            } else if let Some(t) = l.strip_prefix('-') {
                h.lines.push(Line::Remove(t.to_owned()));
            } else if let Some(t) = l.strip_prefix(' ') {
                h.lines.push(Line::Context(t.to_owned()));
            } else if l.is_empty() {
                // Editors and models drop the space of an empty context line.
                h.lines.push(Line::Context(String::new()));
            } else if l.starts_with("```") || l.starts_with("diff ") || l.starts_with("index ") {
                flush(&mut files, &mut hunk);
            } else {
                return Err(Error::Malformed(format!("line {} of the diff is not part of a hunk: {l:?}", i + 1)));
            }
        }
        i += 1;
    }
    flush(&mut files, &mut hunk);
    // Trailing empty "context" lines are usually the end of the text, not the file.
    for f in &mut files {
        for h in &mut f.hunks {
            while matches!(h.lines.last(), Some(Line::Context(t)) if t.is_empty()) {
                h.lines.pop();
            }
        }
    }
    if files.iter().all(|f| f.hunks.is_empty()) {
        return Err(Error::Malformed("no @@ hunk in the diff".to_owned()));
    }
    Ok(files)
}

/// The hunk's old and new sides with `fuzz` context lines dropped from each end.
fn sides(h: &Hunk, fuzz: usize) -> (Vec<&str>, Vec<&str>) {
    let lead = h.lines.iter().take_while(|l| matches!(l, Line::Context(_))).count().min(fuzz);
    let rest = &h.lines[lead..];
    let trail = rest.iter().rev().take_while(|l| matches!(l, Line::Context(_))).count().min(fuzz);
    let body = &rest[..rest.len() - trail];
    let old = body
        .iter()
        .filter_map(|l| match l {
            Line::Context(t) | Line::Remove(t) => Some(t.as_str()),
            Line::Add(_) => None,
        })
        .collect();
    let new = body
        .iter()
        .filter_map(|l| match l {
            Line::Context(t) | Line::Add(t) => Some(t.as_str()),
            Line::Remove(_) => None,
        })
        .collect();
    (old, new)
}

/// Where a hunk's old side is in the file (fuzzing the context if need be), and the new
/// side to put there.
fn locate<'h>(out: &Text, h: &'h Hunk, from: usize, hint: Option<usize>) -> Result<(Vec<&'h str>, Found)> {
    let (old, new) = sides(h, 0);
    if old.is_empty() {
        // A pure addition: at the stated line, or at the end (a new file).
        let at = hint.unwrap_or(out.lines.len()).min(out.lines.len());
        return Ok((new, Found { start: at, len: 0, level: Level::Exact, shift: Shift::None }));
    }
    let file = out.line_refs();
    let first = find_near(&file, &old, from, hint);
    if !matches!(first, Err(Error::NoMatch { .. })) {
        return first.map(|f| (new, f));
    }
    for fuzz in 1..=2 {
        let (o, n) = sides(h, fuzz);
        if o.is_empty() {
            break;
        }
        if let Ok(f) = find_near(&file, &o, from, hint) {
            return Ok((n, f));
        }
    }
    first.map(|f| (new, f))
}

/// Applies one file's hunks.
pub fn apply(text: &Text, diff: &FileDiff) -> Result<Text> {
    let mut out = text.clone();
    // Where the next hunk may start, and how far the file has moved from its stated numbers.
    let (mut from, mut offset) = (0usize, 0isize);
    for h in &diff.hunks {
        let hint = h.old_start.map(|s| (s.saturating_sub(1) as isize + offset).max(0) as usize);
        let (new, found) = locate(&out, h, from, hint)?;
        let replacement: Vec<String> = new.iter().map(|l| found.shift.apply(l)).collect();
        let added = replacement.len();
        out.lines.splice(found.start..found.start + found.len, replacement);
        offset += added as isize - found.len as isize;
        from = found.start + added;
        if h.new_no_final_newline && from == out.lines.len() {
            out.final_newline = false;
        } else if h.old_no_final_newline && from == out.lines.len() {
            out.final_newline = true;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "a\nb\nc\nd\ne\nf\ng\nh\n";

    #[test]
    fn git_diffs_apply_even_with_wrong_line_numbers() {
        let diff = "diff --git a/x b/x\nindex 1..2 100644\n--- a/x\n+++ b/x\n@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n@@ -60,3 +60,4 @@ fn\n f\n g\n+g2\n h\n";
        assert!(detect(diff));
        let files = parse(diff).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].old_path.as_deref(), Some("x"));
        let out = apply(&Text::new(OLD), &files[0]).unwrap().render();
        assert_eq!(out, "a\nb\nC\nd\ne\nf\ng\ng2\nh\n");
    }

    #[test]
    fn drifted_context_is_fuzzed_and_final_newlines_follow_the_markers() {
        // The first context line is wrong ("B"); dropping it finds the place.
        let diff = "@@ -1,4 +1,4 @@\n B\n c\n-d\n+D\n e\n";
        let out = apply(&Text::new(OLD), &parse(diff).unwrap()[0]).unwrap().render();
        assert_eq!(out, "a\nb\nc\nD\ne\nf\ng\nh\n");
        let diff = "@@ -7,2 +7,2 @@\n g\n-h\n+H\n\\ No newline at end of file\n";
        let out = apply(&Text::new(OLD), &parse(diff).unwrap()[0]).unwrap().render();
        assert_eq!(out, "a\nb\nc\nd\ne\nf\ng\nH");
    }

    #[test]
    fn a_repeated_context_uses_the_line_number_and_unknown_context_fails() {
        let old = Text::new("x\ny\nx\ny\n");
        let out = apply(&old, &parse("@@ -3,2 +3,2 @@\n x\n-y\n+z\n").unwrap()[0]).unwrap().render();
        assert_eq!(out, "x\ny\nx\nz\n");
        let err = apply(&old, &parse("@@ -1 +1 @@\n-nope\n+yes\n").unwrap()[0]).unwrap_err();
        assert!(matches!(err, Error::NoMatch { .. }), "{err}");
        assert!(matches!(parse("just text"), Err(Error::Malformed(_))));
    }
}
