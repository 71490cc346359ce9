//! What to do with the model's text: how much to ask for, when to stop, what to cut.
//!
//! [`mode`] picks single-line or multi-line from the cursor's situation. A [`Stopper`] is fed
//! the stream and says when the suggestion is complete — at the end of the line (single
//! line), when the code falls back out of the block being written or after two blank lines
//! (multi-line), at a closing bracket that closes something opened before the cursor, or at
//! a stop string — so generation is cancelled as soon as the rest would be thrown away. Its
//! [`Stopper::finish`] trims what the suffix already has (the `)` after the cursor, or the
//! lines after it regenerated).

/// How much a suggestion may span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The rest of the current line.
    SingleLine,
    /// A block: the body after an opener, or the next statements on an empty line.
    MultiLine,
}

const OPENERS: [&str; 6] = [":", "{", "(", "[", "=>", "->"];
const CLOSERS: &str = ")]}";

/// Whether a line (trimmed) opens a block whose body comes on the next lines.
fn opens_block(line: &str) -> bool {
    let t = line.trim_end();
    let t = t.split(" //").next().unwrap_or(t).split(" #").next().unwrap_or(t).trim_end();
    OPENERS.iter().any(|o| t.ends_with(o)) || t.ends_with(" do") || t.ends_with(" then")
}

/// The mode for a cursor between `prefix` and `suffix`: single-line in the middle of a line
/// (text other than closing brackets and punctuation follows); multi-line on an empty line
/// after a block opener, or at the end of a line that opens one; single-line otherwise.
pub fn mode(prefix: &str, suffix: &str) -> Mode {
    let rest_of_line = suffix.split('\n').next().unwrap_or("");
    if rest_of_line.trim().chars().any(|c| !(CLOSERS.contains(c) || ";,'\"`".contains(c))) {
        return Mode::SingleLine;
    }
    let line = prefix.rsplit('\n').next().unwrap_or("");
    if line.trim().is_empty() {
        let previous = prefix.rsplit('\n').skip(1).find(|l| !l.trim().is_empty());
        if previous.is_some_and(opens_block) {
            return Mode::MultiLine;
        }
        // An empty line with an empty line before it: new statements follow.
        return if prefix.trim_end_matches([' ', '\t']).ends_with("\n\n") { Mode::MultiLine } else { Mode::SingleLine };
    }
    if rest_of_line.trim().is_empty() && opens_block(line) { Mode::MultiLine } else { Mode::SingleLine }
}

/// Cuts a streamed suggestion where it should end.
#[derive(Debug, Clone)]
pub struct Stopper {
    mode: Mode,
    stops: Vec<String>,
    /// The cursor line's text before the cursor.
    line_before: String,
    /// The suffix as sent.
    suffix: String,
    /// Most lines a multi-line suggestion may have.
    max_lines: usize,
    text: String,
    /// Where the suggestion ends in `text`, once known.
    end: Option<usize>,
    /// Whitespace the cursor's line ended with, left out of the prompt: the model writes it
    /// again before its first word, and it is taken off.
    lead: String,
}

impl Stopper {
    /// A stopper for a suggestion at the cursor between `prefix` and `suffix`.
    pub fn new(mode: Mode, prefix: &str, suffix: &str, stops: Vec<String>) -> Stopper {
        Stopper {
            mode,
            stops,
            line_before: prefix.rsplit('\n').next().unwrap_or("").to_owned(),
            suffix: suffix.to_owned(),
            max_lines: 16,
            text: String::new(),
            end: None,
            lead: String::new(),
        }
    }

    /// Says that the prompt's prefix left out `ws`, the whitespace before the cursor: a
    /// suggestion that starts with it loses it.
    pub fn lead(mut self, ws: &str) -> Stopper {
        ws.clone_into(&mut self.lead);
        self
    }

    /// Sets the most lines a multi-line suggestion may have (default 16).
    pub fn max_lines(mut self, n: usize) -> Stopper {
        self.max_lines = n.max(1);
        self
    }

    /// Feeds streamed text; `true` once the suggestion is complete (stop generating).
    pub fn push(&mut self, chunk: &str) -> bool {
        if self.end.is_some() {
            return true;
        }
        self.text.push_str(chunk);
        self.end = self.find_end();
        self.end.is_some()
    }

    /// Whether the suggestion is complete.
    pub fn done(&self) -> bool {
        self.end.is_some()
    }

    /// The suggestion so far (cut where it ends, untrimmed), for streaming to the editor.
    pub fn partial(&self) -> &str {
        &self.text[..self.end.unwrap_or(self.text.len())]
    }

    /// The final suggestion: cut where it ends, trailing whitespace and what the suffix
    /// already has removed.
    pub fn finish(self) -> String {
        let end = self.end.unwrap_or(self.text.len());
        let mut out = self.text[..end].to_owned();
        if !self.lead.is_empty() && out.starts_with(&self.lead) {
            out.drain(..self.lead.len());
        }
        if self.mode == Mode::MultiLine || out.contains('\n') {
            trim_repeated_lines(&mut out, &self.suffix);
            let kept = out.trim_end().len();
            out.truncate(kept);
        } else {
            let kept = out.trim_end_matches(['\n', '\r']).len();
            out.truncate(kept);
        }
        trim_suffix_overlap(&mut out, &self.suffix);
        out
    }

    fn find_end(&self) -> Option<usize> {
        let t = &self.text;
        let mut end = self.stops.iter().filter_map(|s| t.find(s.as_str())).min();
        // A closing bracket that closes something opened before the cursor, which the suffix
        // already closes: the suggestion ends before it.
        if let Some(b) = unbalanced_close(t)
            && self.suffix.trim_start().starts_with(&t[b..b + 1])
        {
            end = Some(end.map_or(b, |e| e.min(b)));
        }
        let scan = &t[..end.unwrap_or(t.len())];
        match self.mode {
            Mode::SingleLine => {
                // The first line, unless the cursor is at a line's end and the model starts
                // a fresh line: then nothing (single-line never starts a new line).
                if let Some(nl) = scan.find('\n') {
                    return Some(nl);
                }
            }
            Mode::MultiLine => {
                if let Some(e) = self.block_end(scan) {
                    return Some(e);
                }
            }
        }
        end
    }

    /// Where a multi-line suggestion leaves its block: the start of the first complete line
    /// (after the first) indented less than the block's body, of the line after two blank
    /// lines, or of the line past `max_lines`.
    fn block_end(&self, t: &str) -> Option<usize> {
        let indent = |l: &str| l.len() - l.trim_start().len();
        // The body's indentation: the cursor line's, or, when the cursor sits at the end of a
        // line that opens a block, that of the first line the model writes below it.
        let opener_end = !self.line_before.trim().is_empty();
        let mut body: Option<usize> = if opener_end { None } else { Some(self.line_before.len()) };
        let mut offset = 0;
        let mut blanks = 0;
        let mut lines = 0;
        for (n, line) in t.split_inclusive('\n').enumerate() {
            let complete = line.ends_with('\n');
            let start = offset;
            offset += line.len();
            if n == 0 {
                // The rest of the cursor's line.
                if !complete {
                    return None;
                }
                continue;
            }
            if !complete {
                return None;
            }
            if line.trim().is_empty() {
                blanks += 1;
                if blanks >= 2 {
                    return Some(start);
                }
                continue;
            }
            blanks = 0;
            lines += 1;
            let body_indent = *body.get_or_insert(indent(line));
            if indent(line) < body_indent || (opener_end && indent(line) <= indent(&self.line_before)) {
                return Some(start);
            }
            if lines >= self.max_lines {
                return Some(offset);
            }
        }
        None
    }
}

/// Byte offset of the first closing bracket in `t` with no opening one before it (strings on
/// a line skipped).
pub(crate) fn unbalanced_close(t: &str) -> Option<usize> {
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in t.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q || c == '\n' {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth < 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Removes the end of `out` that the suffix's current line starts with, when that is the
/// whole rest of the line or only closing brackets and punctuation (`foo)` before `)`).
fn trim_suffix_overlap(out: &mut String, suffix: &str) {
    let rest = suffix.split('\n').next().unwrap_or("").trim_end();
    if rest.trim().is_empty() {
        return;
    }
    let rest = rest.trim_start();
    for k in (1..=rest.len().min(out.len())).rev() {
        if !rest.is_char_boundary(k) {
            continue;
        }
        let overlap = &rest[..k];
        let closing = overlap.chars().all(|c| CLOSERS.contains(c) || ";,:'\"` ".contains(c));
        if (k == rest.len() || closing) && out.ends_with(overlap) {
            let keep = out.len() - k;
            out.truncate(keep);
            let kept = out.trim_end_matches([' ', '\t']).len();
            if k == rest.len() {
                out.truncate(kept);
            }
            return;
        }
    }
}

/// Removes the last lines of a multi-line suggestion that repeat the suffix's first
/// non-blank lines (the model wrote the code after the cursor again).
fn trim_repeated_lines(out: &mut String, suffix: &str) {
    let after: Vec<&str> = suffix.lines().skip(1).filter(|l| !l.trim().is_empty()).take(8).collect();
    if after.is_empty() {
        return;
    }
    let lines: Vec<&str> = out.split_inclusive('\n').collect();
    // The longest run of the suggestion's lines equal to the suffix's first lines, ending it.
    for start in 1..lines.len() {
        let tail: Vec<&str> = lines[start..].iter().map(|l| l.trim()).filter(|l| !l.is_empty()).collect();
        if !tail.is_empty() && tail.len() <= after.len() && tail.iter().zip(&after).all(|(a, b)| *a == b.trim()) {
            let keep: usize = lines[..start].iter().map(|l| l.len()).sum();
            out.truncate(keep);
            return;
        }
    }
}
