//! Next-edit prediction ("Tab, Tab"): after the user changes something, the edit that likely
//! comes next — the same rename further down, the same change at the next place that looks
//! like the one just edited — possibly away from the cursor.
//!
//! - [`History`]: a document's recent edits as small diffs, in order. Keystrokes are folded
//!   into one edit until the user pauses or moves elsewhere ([`History::settle`] diffs the
//!   text against its last settled version).
//! - [`candidates`]: the deterministic predictions, nearest to the cursor first: the last
//!   edit's replacement at the next place that holds what it replaced (a renamed identifier's
//!   other uses, a changed call's other call sites), or its insertion where the same context
//!   recurs (an argument added to every call).
//! - [`elsewhere`]: a rename's uses in other open files, once the current one has none.
//! - [`prompt`] and [`parse`]: a model's turn, in the shape Zeta's published format uses
//!   (the recent edits as diffs, an excerpt with an editable region and the cursor marked; the
//!   model rewrites the region), so a next-edit model served by any OpenAI-compatible
//!   deployment works; [`region_edit`] turns the rewritten region into one edit.
//!
//! Pure functions of their input: no model, no I/O.

use std::collections::VecDeque;

/// One edit: `old` (at byte `start` of the text before it) became `new`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// The file, as the editor names it.
    pub path: String,
    /// Where the change begins, in bytes of the text before it.
    pub start: usize,
    /// What was there.
    pub old: String,
    /// What is there now.
    pub new: String,
    /// The 1-based line of `start`.
    pub line: usize,
    /// The whole lines the change touched, before it.
    pub old_lines: String,
    /// The same lines after it.
    pub new_lines: String,
}

/// A predicted edit: the bytes `start..end` of the current text become `replacement`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prediction {
    /// The file.
    pub path: String,
    /// First byte replaced.
    pub start: usize,
    /// End of the bytes replaced (exclusive).
    pub end: usize,
    /// What goes there.
    pub replacement: String,
    /// Why it was predicted.
    pub why: Why,
}

/// Where a prediction came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The last edit's replacement where what it replaced recurs.
    Repeat,
    /// The last edit's insertion where its context recurs.
    Insert,
    /// The import a name the last edit brought in needs (see [`crate::imports`]).
    Import,
    /// A model's rewrite of the region around the cursor.
    Model,
    /// A place alone (nothing replaced, nothing inserted): the editor moves the cursor there.
    Jump,
    /// The last edit's changes within its lines, carried to another line (or a name an import
    /// no longer binds, renamed in a use: [`crate::imports::rebound`]).
    Analogous,
    /// A line like one the last edit deleted, deleted.
    Delete,
    /// The last edit again where its lines recur with other names (or, for lines inserted,
    /// beside the likes of their neighbours).
    Again,
    /// Lines the last edit inserted, deleted where they were (a move's other half); or a name
    /// an import line now binds, taken out of the other import of it ([`crate::imports`]).
    Moved,
}

impl Why {
    /// Its name on the wire (`repeat`, `insert`, `import`, `model`, `jump`, `analogous`,
    /// `delete`, `again`, `moved`).
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Repeat => "repeat",
            Why::Insert => "insert",
            Why::Import => "import",
            Why::Model => "model",
            Why::Jump => "jump",
            Why::Analogous => "analogous",
            Why::Delete => "delete",
            Why::Again => "again",
            Why::Moved => "moved",
        }
    }
}

impl Prediction {
    /// The text with the prediction applied.
    pub fn apply(&self, text: &str) -> String {
        format!("{}{}{}", &text[..self.start], self.replacement, &text[self.end..])
    }
}

/// The recent edits of the open documents (at most [`History::KEEP`]), and each document's
/// last settled text.
#[derive(Debug, Default, Clone)]
pub struct History {
    edits: VecDeque<Edit>,
    settled: std::collections::HashMap<String, String>,
}

impl History {
    /// Edits kept.
    pub const KEEP: usize = 8;

    /// Starts following a document at `text` (an open).
    pub fn open(&mut self, path: &str, text: &str) {
        self.settled.insert(path.to_owned(), text.to_owned());
    }

    /// Stops following a document.
    pub fn close(&mut self, path: &str) {
        self.settled.remove(path);
    }

    /// Records what changed in `path` since it last settled (one edit: the span between the
    /// common prefix and suffix) and settles it at `text`; nothing when nothing changed.
    pub fn settle(&mut self, path: &str, text: &str) -> Option<&Edit> {
        let before = self.settled.insert(path.to_owned(), text.to_owned())?;
        let edit = diff(path, &before, text)?;
        if self.edits.len() == Self::KEEP {
            self.edits.pop_front();
        }
        self.edits.push_back(edit);
        self.edits.back()
    }

    /// The edits, oldest first.
    pub fn edits(&self) -> impl Iterator<Item = &Edit> {
        self.edits.iter()
    }

    /// The newest edit.
    pub fn last(&self) -> Option<&Edit> {
        self.edits.back()
    }

    /// The edit a [`History::settle`] now would record, without recording it (so that asking
    /// often, as inline completion does on every keystroke, does not cut a word's edit into
    /// its keystrokes); the last recorded one when the text is as settled.
    pub fn peek(&self, path: &str, text: &str) -> Option<Edit> {
        match self.settled.get(path).and_then(|before| diff(path, before, text)) {
            Some(edit) => Some(edit),
            None => self.last().cloned(),
        }
    }
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The one edit that turns `before` into `after` (common prefix and suffix kept, widened to
/// whole words so that a renamed identifier is the edit), or `None` when they are equal.
pub fn diff(path: &str, before: &str, after: &str) -> Option<Edit> {
    if before == after {
        return None;
    }
    let prefix = before
        .char_indices()
        .zip(after.chars())
        .find(|((_, a), b)| a != b)
        .map_or(before.len().min(after.len()), |((i, _), _)| i);
    let prefix = floor_boundary(after, prefix.min(after.len()));
    let max_suffix = before.len().min(after.len()) - prefix;
    let suffix = before.bytes().rev().zip(after.bytes().rev()).take(max_suffix).take_while(|(a, b)| a == b).count();
    let (mut start, mut old_end, mut new_end) = (prefix, before.len() - suffix, after.len() - suffix);
    while !before.is_char_boundary(old_end) || !after.is_char_boundary(new_end) {
        old_end += 1;
        new_end += 1;
    }
    // Whole words: `count` → `total`, not `c` → `t` with `ount`/`otal` around it; a change
    // that begins (ends) inside a word takes the word's start (end) with it.
    let starts_word = |s: &str| s.chars().next().is_some_and(is_word);
    let ends_word = |s: &str| s.chars().next_back().is_some_and(is_word);
    if starts_word(&before[start..old_end]) || starts_word(&after[start..new_end]) {
        while let Some(c) = before[..start].chars().next_back().filter(|c| is_word(*c)) {
            start -= c.len_utf8();
        }
    }
    if ends_word(&before[start..old_end]) || ends_word(&after[start..new_end]) {
        while let Some(c) = before[old_end..].chars().next().filter(|c| is_word(*c)) {
            if !after[new_end..].starts_with(c) {
                break;
            }
            old_end += c.len_utf8();
            new_end += c.len_utf8();
        }
    }
    let line_start = before[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = |s: &str, from: usize| s[from..].find('\n').map_or(s.len(), |i| from + i + 1);
    Some(Edit {
        path: path.to_owned(),
        start,
        old: before[start..old_end].to_owned(),
        new: after[start..new_end].to_owned(),
        line: before[..start].matches('\n').count() + 1,
        old_lines: before[line_start..line_end(before, old_end.max(start))].to_owned(),
        new_lines: after[line_start..line_end(after, new_end.max(start))].to_owned(),
    })
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Whether `text[at..at + len]` stands as a whole token (no word character glued to an end
/// that is itself a word character).
fn whole(text: &str, at: usize, len: usize) -> bool {
    let piece = &text[at..at + len];
    let glued_before = piece.chars().next().is_some_and(is_word) && text[..at].chars().next_back().is_some_and(is_word);
    let glued_after =
        piece.chars().next_back().is_some_and(is_word) && text[at + len..].chars().next().is_some_and(is_word);
    !glued_before && !glued_after
}

/// The deterministic predictions for `text` (the current text of `path`) after `last`, the
/// newest edit, nearest to `cursor` first (those after it before those above it):
/// - a replacement where what it replaced recurs as a whole token (an edit of punctuation
///   only takes the word beside it along, so that `&format!` → `format!` repeats at the other
///   `&format!`s, not at every `&`);
/// - an insertion where the words before it recur (an argument added to other calls), or, for
///   one at the start of a line's text, at the start of the next lines of the same indent
///   (`pub ` before the other fields).
///
/// Edits over 200 bytes or over more than one line, and edits of whitespace only, predict
/// nothing: a new line of code is not a pattern.
pub fn candidates(last: &Edit, path: &str, text: &str, cursor: usize) -> Vec<Prediction> {
    let mut out = Vec::new();
    if last.path != path || last.old.trim().is_empty() && last.new.trim().is_empty() {
        return out;
    }
    if last.old.len() > 200 || last.new.len() > 200 || last.old.contains('\n') || last.new.contains('\n') {
        return out;
    }
    // Where the edit's own result sits now (not a place to repeat it).
    let own = last.start..=last.start + last.new.len();
    let (old, new, lead) = anchored(last, text);
    if !old.trim().is_empty() {
        for (at, _) in text.match_indices(old.as_str()) {
            let at_edit = at + lead;
            if own.contains(&at_edit) || !whole(text, at, old.len()) {
                continue;
            }
            out.push(Prediction {
                path: path.to_owned(),
                start: at,
                end: at + old.len(),
                replacement: new.clone(),
                why: Why::Repeat,
            });
        }
    } else if let Some(before) = context_before(text, last.start) {
        // An insertion: where the words before it recur and it is not there yet.
        for (at, _) in text.match_indices(before) {
            let end = at + before.len();
            if own.contains(&end) || text[end..].starts_with(last.new.as_str()) {
                continue;
            }
            out.push(Prediction {
                path: path.to_owned(),
                start: end,
                end,
                replacement: last.new.clone(),
                why: Why::Insert,
            });
        }
    } else {
        out.extend(at_line_starts(last, path, text));
    }
    out.sort_by_key(|p| if p.start >= cursor { (0, p.start - cursor) } else { (1, cursor - p.start) });
    like_the_edit_first(last, text, &mut out);
    out
}

/// Orders each line's predictions (adjacent in `out`) by how much of the edit's own line
/// stands around them: the text before the edit on its line (indentation aside) against the
/// text before each, from the end, and the text after against the text after, from the start (`dest_dir=dest_dir,`
/// after `dest_dir,` → `dest,` repeats at the second `dest_dir`, followed by `,` as the edit
/// was). Ties keep their order.
fn like_the_edit_first(last: &Edit, text: &str, out: &mut [Prediction]) {
    const REACH: usize = 40;
    let line_of = |at: usize| {
        let at = at.min(text.len());
        let from = text[..at].rfind('\n').map_or(0, |i| i + 1);
        (from, text[at..].find('\n').map_or(text.len(), |i| at + i))
    };
    let end = (last.start + last.new.len()).min(text.len());
    let (from, to) = line_of(last.start);
    // (Indentation is no context: lines of any depth compare alike.)
    let (before, after) = (text[from..last.start.min(text.len())].trim_start(), &text[end.max(from)..to.max(end)]);
    let likeness = |p: &Prediction| {
        let (from, to) = line_of(p.start);
        let (b, a) = (text[from..p.start].trim_start(), &text[p.end.min(to)..to]);
        let back = before.bytes().rev().zip(b.bytes().rev()).take(REACH).take_while(|(x, y)| x == y).count();
        let ahead = after.bytes().zip(a.bytes()).take(REACH).take_while(|(x, y)| x == y).count();
        back + ahead
    };
    let mut i = 0;
    while i < out.len() {
        let line = line_of(out[i].start).0;
        let run = out[i..].iter().take_while(|p| line_of(p.start).0 == line).count();
        if run > 1 {
            out[i..i + run].sort_by_key(|p| std::cmp::Reverse(likeness(p)));
        }
        i += run;
    }
}

/// The last edit's rename carried into other open files (`others`: path and text): where a
/// name it replaced (a whole identifier, not punctuation or an insertion) stands as a whole
/// token, in the order of `others`, top to bottom. For when the current file has no use left.
pub fn elsewhere(last: &Edit, others: &[(&str, &str)]) -> Vec<Prediction> {
    let Some(old) = renamed(last) else { return Vec::new() };
    let mut out = Vec::new();
    for (path, text) in others.iter().filter(|(p, _)| *p != last.path) {
        for (at, _) in text.match_indices(old).filter(|(at, _)| whole(text, *at, old.len())) {
            out.push(Prediction {
                path: (*path).to_owned(),
                start: at,
                end: at + old.len(),
                replacement: last.new.clone(),
                why: Why::Repeat,
            });
        }
    }
    out
}

/// The edit that turns `before` into `after` in `path`, as a history settles it (tests).
#[cfg(test)]
pub(crate) fn edit_of(path: &str, before: &str, after: &str) -> Edit {
    let mut h = History::default();
    h.open(path, before);
    h.settle(path, after).cloned().expect("an edit")
}

/// The name `last` renamed, when it is a rename: one whole identifier replaced by another.
pub fn renamed(last: &Edit) -> Option<&str> {
    let ident = |t: &str| !t.is_empty() && t.len() <= 200 && t.chars().all(is_word);
    (ident(&last.old) && ident(&last.new)).then_some(last.old.as_str())
}

/// `candidates` with the one a model's `guess` lands on (within 2 lines) first: a next-edit
/// model ranks what the rules found. Unchanged when the guess is near none of them.
pub fn rank(mut candidates: Vec<Prediction>, guess: &Prediction, text: &str) -> Vec<Prediction> {
    let line = |at: usize| text[..at.min(text.len())].matches('\n').count();
    let target = line(guess.start);
    let nearest = candidates
        .iter()
        .enumerate()
        .map(|(i, p)| (line(p.start).abs_diff(target), i))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, i)| i);
    if let Some(i) = nearest {
        let chosen = candidates.remove(i);
        candidates.insert(0, chosen);
    }
    candidates
}

/// The edit as a pattern to look for: its old and new text, and when the old one holds no
/// word character, both with the word right after (else before) the edit taken along; the
/// bytes of context before the edit in the pattern.
fn anchored(last: &Edit, text: &str) -> (String, String, usize) {
    if last.old.chars().any(is_word) || last.old.is_empty() {
        return (last.old.clone(), last.new.clone(), 0);
    }
    let after = &text[(last.start + last.new.len()).min(text.len())..];
    let word: String = after.chars().take_while(|c| is_word(*c)).collect();
    if !word.is_empty() {
        return (format!("{}{word}", last.old), format!("{}{word}", last.new), 0);
    }
    let before = &text[..last.start.min(text.len())];
    let word: String = before.chars().rev().take_while(|c| is_word(*c)).collect::<Vec<_>>().into_iter().rev().collect();
    (format!("{word}{}", last.old), format!("{word}{}", last.new), word.len())
}

/// An insertion at the start of a line's text, repeated at the start of the following lines
/// (then the ones above) that have the same indent, begin with a word and lack it.
fn at_line_starts(last: &Edit, path: &str, text: &str) -> Vec<Prediction> {
    let line_start = text[..last.start.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
    let indent = &text[line_start..last.start.min(text.len())];
    if !indent.chars().all(|c| c == ' ' || c == '\t') {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let here = at;
        at += line.len();
        if here == line_start {
            continue;
        }
        let Some(rest) = line.strip_prefix(indent) else { continue };
        if rest.starts_with(|c: char| c.is_whitespace())
            || !rest.starts_with(is_word)
            || rest.starts_with(last.new.as_str())
        {
            continue;
        }
        let start = here + indent.len();
        out.push(Prediction {
            path: path.to_owned(),
            start,
            end: start,
            replacement: last.new.clone(),
            why: Why::Insert,
        });
    }
    out
}

/// The text right before an insertion that identifies its place: back to the start of the
/// line's last word run before it, with what follows the word (a `(`, `, `), 3 to 40 bytes.
fn context_before(text: &str, at: usize) -> Option<&str> {
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = &text[line_start..at];
    let trimmed = line.trim_start();
    let mut from = line.len() - trimmed.len();
    // The last identifier and what follows it: `foo(a` in `    let x = foo(a|`.
    if let Some(word) = line.rfind(|c: char| !(is_word(c) || "(,. ".contains(c))) {
        from = from.max(word + 1);
    }
    let piece = &line[from..];
    (3..=40).contains(&piece.trim().len()).then_some(piece.trim_start()).map(|p| &text[at - p.len()..at])
}

/// The editable region around `cursor`: whole lines, `before` lines above the cursor's and
/// `after` below it. Byte range.
pub fn region(text: &str, cursor: usize, before: usize, after: usize) -> (usize, usize) {
    let line_start = text[..cursor].rfind('\n').map_or(0, |i| i + 1);
    let mut start = line_start;
    for _ in 0..before {
        match text[..start.saturating_sub(1)].rfind('\n') {
            Some(i) if start > 0 => start = i + 1,
            _ => {
                start = 0;
                break;
            }
        }
    }
    let mut end = text[cursor..].find('\n').map_or(text.len(), |i| cursor + i + 1);
    for _ in 0..after {
        match text[end..].find('\n') {
            Some(i) => end += i + 1,
            None => {
                end = text.len();
                break;
            }
        }
    }
    (start, end)
}

/// Markers of the prompt's excerpt.
pub const REGION_START: &str = "<|editable_region_start|>";
/// The end of the editable region.
pub const REGION_END: &str = "<|editable_region_end|>";
/// Where the cursor is.
pub const CURSOR: &str = "<|user_cursor_is_here|>";

/// A next-edit prompt: the recent edits as unified-diff-like hunks, then the excerpt of
/// `path` (`context` lines around the editable region `region`) with the region and the
/// cursor marked; the response is begun up to the region's start marker, so that the model
/// goes on with the region rewritten and ends it with [`REGION_END`] (see [`parse`]).
pub fn prompt<'a>(
    edits: impl Iterator<Item = &'a Edit>,
    path: &str,
    text: &str,
    cursor: usize,
    region: (usize, usize),
    context: usize,
) -> String {
    let mut events = String::new();
    for e in edits {
        events.push_str(&format!("User edited \"{}\":\n```diff\n@@ -{} +{} @@\n", e.path, e.line, e.line));
        for l in e.old_lines.lines() {
            events.push_str(&format!("-{l}\n"));
        }
        for l in e.new_lines.lines() {
            events.push_str(&format!("+{l}\n"));
        }
        events.push_str("```\n\n");
    }
    let (above, _) = self::region(text, region.0, context, 0);
    let (_, below) = self::region(text, region.1.saturating_sub(1).max(region.0), 0, context);
    let excerpt = format!(
        "```{path}\n{}{REGION_START}\n{}{CURSOR}{}{REGION_END}\n{}```",
        &text[above..region.0],
        &text[region.0..cursor],
        &text[cursor..region.1],
        &text[region.1..below.max(region.1)],
    );
    format!(
        "### Instruction:\nYou are a code completion assistant and your task is to analyze user edits and then \
         rewrite an excerpt that the user provides, suggesting the appropriate edits within the excerpt, taking \
         into account the cursor location.\n\n### User Edits:\n\n{events}### User Excerpt:\n\n{excerpt}\n\n\
         ### Response:\n```{path}\n{REGION_START}\n"
    )
}

/// The rewritten region in a model's continuation of a [`prompt`] (up to [`REGION_END`], the
/// cursor marker dropped); `None` when the region was not finished (cut short).
pub fn parse(continuation: &str) -> Option<String> {
    let end = continuation.find(REGION_END)?;
    Some(continuation[..end].replace(CURSOR, ""))
}

/// The edit that a rewritten region makes to `text` (the region being `region` of it), or
/// `None` when it changes nothing — or takes away more than three lines, or all of a region
/// that held something: an empty or cut answer is not an edit.
pub fn region_edit(path: &str, text: &str, region: (usize, usize), rewritten: &str) -> Option<Prediction> {
    let original = &text[region.0..region.1];
    if rewritten.trim().is_empty() && !original.trim().is_empty() {
        return None;
    }
    let e = diff(path, original, rewritten)?;
    if e.old.matches('\n').count() > e.new.matches('\n').count() + 3 {
        return None;
    }
    Some(Prediction {
        path: path.to_owned(),
        start: region.0 + e.start,
        end: region.0 + e.start + e.old.len(),
        replacement: e.new,
        why: Why::Model,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keystrokes_fold_into_one_word_edit() {
        let mut h = History::default();
        h.open("a.rs", "let count = 1;\nprint(count);\n");
        let e = h.settle("a.rs", "let total = 1;\nprint(count);\n").unwrap().clone();
        assert_eq!((e.old.as_str(), e.new.as_str(), e.start, e.line), ("count", "total", 4, 1));
        assert!(h.settle("a.rs", "let total = 1;\nprint(count);\n").is_none(), "nothing new");
        let e = diff("a.rs", "x = foo(a)\n", "x = foo(a, b)\n").unwrap();
        assert_eq!((e.old.as_str(), e.new.as_str()), ("", ", b"));
        let e = diff("a.rs", "héllo wörld", "héllo wörlds").unwrap();
        assert_eq!((e.old.as_str(), e.new.as_str()), ("wörld", "wörlds"));
    }

    #[test]
    fn a_rename_predicts_the_other_uses_nearest_below_first() {
        let before = "fn f(count: u32) -> u32 {\n    let y = count + 1;\n    recount(count)\n}\n";
        let after = before.replacen("count:", "total:", 1);
        let e = diff("a.rs", before, &after).unwrap();
        let c = candidates(&e, "a.rs", &after, e.start + 5);
        let places: Vec<&str> = c.iter().map(|p| &after[p.start..p.end]).collect();
        assert_eq!(places, ["count", "count"], "`recount` is another word");
        assert_eq!(c[0].why, Why::Repeat);
        let once = c[0].apply(&after);
        assert!(once.contains("let y = total + 1;") && once.contains("recount(count)"), "{once}");
        assert!(candidates(&e, "b.rs", &after, 0).is_empty(), "another file");
    }

    #[test]
    fn of_two_repeats_on_a_line_the_one_that_stands_as_the_edit_did_goes_first() {
        let before = "def f(\n    dest_dir,\n):\n    g(\n        dest_dir=dest_dir,\n    )\n";
        let after = before.replacen("    dest_dir,", "    dest,", 1);
        let e = diff("a.py", before, &after).unwrap();
        assert_eq!((e.old.as_str(), e.new.as_str()), ("dest_dir", "dest"));
        let c = candidates(&e, "a.py", &after, e.start + 4);
        assert_eq!(c.len(), 2);
        // The second `dest_dir` is followed by `,`, as the edited one was.
        assert_eq!(c[0].apply(&after), after.replace("dest_dir=dest_dir,", "dest_dir=dest,"));
        assert_eq!(c[1].apply(&after), after.replace("dest_dir=dest_dir,", "dest=dest_dir,"));
        // On lines of their own, nearest first still.
        let before = "x = old\ny = old\nz = old\n";
        let after = before.replacen("x = old", "x = new", 1);
        let e = diff("a.py", before, &after).unwrap();
        let c = candidates(&e, "a.py", &after, e.start + 3);
        assert_eq!(c.iter().map(|p| p.start).collect::<Vec<_>>(), [12, 20]);
    }

    #[test]
    fn an_added_argument_is_predicted_at_the_other_calls() {
        let before = "a = area(w\nb = area(h\nc = other(w\n";
        let after = "a = area(w, unit\nb = area(h\nc = other(w\n";
        let e = diff("m.py", before, after).unwrap();
        assert_eq!(e.new, ", unit");
        let c = candidates(&e, "m.py", after, 0);
        assert!(c.is_empty() || c.iter().all(|p| p.why == Why::Insert));
        // Same context (`area(w`) again further down:
        let after2 = "a = area(w, unit\nb = area(w\n";
        let e2 = diff("m.py", "a = area(w\nb = area(w\n", after2).unwrap();
        let c2 = candidates(&e2, "m.py", after2, 0);
        assert_eq!(c2.len(), 1);
        assert_eq!(c2[0].apply(after2), "a = area(w, unit\nb = area(w, unit\n");
    }

    #[test]
    fn the_prompt_marks_the_region_and_cursor_and_the_answer_becomes_an_edit() {
        let text = "one\ntwo\nthree\nfour\nfive\n";
        let cursor = text.find("three").unwrap() + 2;
        let r = region(text, cursor, 1, 1);
        assert_eq!(&text[r.0..r.1], "two\nthree\nfour\n");
        let e = diff("n.txt", "one\n", "one!\n").unwrap();
        let p = prompt(std::iter::once(&e), "n.txt", text, cursor, r, 5);
        assert!(p.contains("User edited \"n.txt\"") && p.contains("-one\n+one!\n"), "{p}");
        assert!(p.contains(&format!("one\n{REGION_START}\ntwo\nth{CURSOR}ree\nfour\n{REGION_END}\nfive\n")), "{p}");
        assert!(p.ends_with(&format!("### Response:\n```n.txt\n{REGION_START}\n")), "{p}");
        let rewritten = parse(&format!("two\nth{CURSOR}ree!\nfour\n{REGION_END}\n```")).unwrap();
        let edit = region_edit("n.txt", text, r, &rewritten).unwrap();
        assert_eq!(edit.apply(text), "one\ntwo\nthree!\nfour\nfive\n");
        assert!(region_edit("n.txt", text, r, "two\nthree\nfour\n").is_none());
        assert!(region_edit("n.txt", text, r, "").is_none(), "an empty answer deletes nothing");
        let big = "a\nb\nc\nd\ne\nf\n";
        assert!(region_edit("n.txt", big, (0, big.len()), "a\nf\n").is_none(), "nor does one that drops four lines");
        assert!(region_edit("n.txt", big, (0, big.len()), "a\nc\nd\ne\nf\n").is_some(), "one line may go");
        assert!(parse("no markers").is_none());
    }
}
