//! The history cases the ranker is trained and measured on: a file's text, the first of two
//! nearby hunks of a real change (applied as the user's edit) and the second (what they did
//! next), as `scripts/next-edit-data.py` and `scripts/next-edit-set.py` write them.

use caret_complete::next_edit::{Edit, History, Prediction};
use serde::Deserialize;

/// One hunk: lines `old` of the text, from 1-based line `line`, became `new` (an insertion
/// goes before `line`).
#[derive(Debug, Clone, Deserialize)]
pub struct Hunk {
    /// Where it starts.
    pub line: usize,
    /// The lines it replaced.
    pub old: Vec<String>,
    /// The lines it put there.
    pub new: Vec<String>,
}

/// One case.
#[derive(Debug, Clone, Deserialize)]
pub struct Case {
    /// Where it comes from: a package and its two versions, or a commit.
    #[serde(default, alias = "commit")]
    pub source: String,
    /// The file's path in its package.
    pub path: String,
    /// The file's text (an excerpt) before both hunks.
    pub text: String,
    /// The user's edit.
    pub first: Hunk,
    /// The edit that came next.
    pub next: Hunk,
    /// The file it is in, when not this one: one of `others`.
    #[serde(default)]
    pub next_path: Option<String>,
    /// Files open beside this one (excerpts).
    #[serde(default)]
    pub others: Vec<Open>,
}

/// A file open beside the edited one.
#[derive(Debug, Clone, Deserialize)]
pub struct Open {
    /// Its path in its package.
    pub path: String,
    /// Its text (an excerpt).
    pub text: String,
}

/// A case made ready: the first hunk applied and settled as the last edit.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The text after the first hunk.
    pub text: String,
    /// Where the cursor is: the end of the first hunk's new lines.
    pub cursor: usize,
    /// The file the next hunk is in: the edited one's path or an open one's.
    pub next_path: String,
    /// The 1-based line of that file where the next hunk starts.
    pub target: usize,
    /// That file's text with the next hunk applied.
    pub truth: String,
    /// That file's text before it (`text`, for the edited file).
    pub next_text: String,
    /// The first hunk as the editor's history records it.
    pub last: Edit,
}

impl Setup {
    /// Whether a prediction lands in the next hunk's file, within 2 lines of it.
    pub fn placed(&self, p: &Prediction) -> bool {
        p.path == self.next_path && line_of(&self.next_text, p.start).abs_diff(self.target) <= 2
    }

    /// Whether applying a prediction gives what the next hunk gives.
    pub fn exact(&self, p: &Prediction) -> bool {
        p.path == self.next_path && p.apply(&self.next_text) == self.truth
    }
}

/// Parses a JSON-lines set; a line that is not a case is an error naming it.
pub fn parse(set: &str) -> Result<Vec<Case>, String> {
    set.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

impl Case {
    /// The case made ready, or `None` when its hunks do not apply to its text.
    pub fn setup(&self) -> Option<Setup> {
        let (text, cursor) = apply(&self.text, self.first.line, &self.first)?;
        let (next_path, next_text, target) = match self.next_path.as_deref().filter(|p| *p != self.path) {
            Some(other) => {
                let open = self.others.iter().find(|o| o.path == other)?;
                (other.to_owned(), open.text.clone(), self.next.line.max(1))
            }
            None => {
                let shift = self.first.new.len() as isize - self.first.old.len() as isize;
                (self.path.clone(), text.clone(), usize::try_from(self.next.line as isize + shift).ok()?.max(1))
            }
        };
        let (truth, _) = apply(&next_text, target, &self.next)?;
        let mut history = History::default();
        history.open(&self.path, &self.text);
        let last = history.settle(&self.path, &text)?.clone();
        Some(Setup { text, cursor, next_path, target, truth, next_text, last })
    }

    /// The files open beside the edited one, as the rules and the ranker take them.
    pub fn open(&self) -> Vec<(&str, &str)> {
        self.others.iter().map(|o| (o.path.as_str(), o.text.as_str())).collect()
    }
}

/// `text` with `hunk` applied at 1-based line `line`; the byte where the new lines end.
pub fn apply(text: &str, line: usize, hunk: &Hunk) -> Option<(String, usize)> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let at = line.checked_sub(1)?;
    if at > lines.len() || at + hunk.old.len() > lines.len() {
        return None;
    }
    let there = lines[at..at + hunk.old.len()].iter().map(|l| l.trim_end_matches('\n'));
    if !there.eq(hunk.old.iter().map(String::as_str)) {
        return None;
    }
    let mut out: String = lines[..at].concat();
    for l in &hunk.new {
        out.push_str(l);
        out.push('\n');
    }
    let end = out.len();
    out.push_str(&lines[at + hunk.old.len()..].concat());
    Some((out, end))
}

/// The 1-based line of byte `byte`.
pub fn line_of(text: &str, byte: usize) -> usize {
    text.as_bytes()[..byte.min(text.len())].iter().filter(|b| **b == b'\n').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_sets_up_with_its_next_hunk_shifted_by_the_first() {
        let line = r#"{"source":"t","path":"a.py","text":"a = 1\nb = 2\nc = 3\nd = 4\n","first":{"line":1,"old":["a = 1"],"new":["a = 1","x = 0"]},"next":{"line":3,"old":["c = 3"],"new":["c = 30"]}}"#;
        let cases = parse(line).unwrap();
        let s = cases[0].setup().unwrap();
        assert_eq!(s.text, "a = 1\nx = 0\nb = 2\nc = 3\nd = 4\n");
        assert_eq!(s.target, 4);
        assert_eq!(s.truth, "a = 1\nx = 0\nb = 2\nc = 30\nd = 4\n");
        assert_eq!(&s.text[..s.cursor], "a = 1\nx = 0\n");
        assert_eq!(s.last.new, "x = 0\n");
        // A hunk that does not match its text is no case.
        let bad = line.replace(r#""old":["c = 3"]"#, r#""old":["c = 4"]"#);
        assert!(parse(&bad).unwrap()[0].setup().is_none());
        assert!(parse("{").unwrap_err().starts_with("line 1:"));
    }
}
