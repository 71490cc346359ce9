//! The context sent with a completion request, within a token budget.
//!
//! The prefix and suffix are cut at line boundaries (a half line confuses a model more than a
//! missing one), nearest lines first; the line the cursor is on is always whole. When the
//! enclosing scope's head (the nearest line above at a lower indentation: a signature, a
//! class, a `match`) falls outside the prefix kept, it is sent as a snippet of the same file,
//! as what the completion sits in matters more than lines further up. Snippets from other
//! files (recently edited, open, search hits) fill their share in the order given.

use serde::{Deserialize, Serialize};

/// A piece of another file (or of this one, out of the prefix's reach).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snippet {
    /// Workspace-relative path.
    pub path: String,
    /// The text.
    pub text: String,
}

/// What goes into a prompt.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    /// Text before the cursor.
    pub prefix: String,
    /// Text after the cursor.
    pub suffix: String,
    /// The start of the middle, written after the middle sentinel: the cursor's line up to
    /// the cursor, for families whose format allows it (see [`crate::plan::plan`]). Empty
    /// when the whole prefix goes before the suffix.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub middle: String,
    /// The file's workspace-relative path, when known.
    pub path: Option<String>,
    /// The repository's name, for families trained with one.
    pub repo: Option<String>,
    /// Other context, most useful first.
    pub snippets: Vec<Snippet>,
}

/// How many tokens a context may take, and how they are shared.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// All of it.
    pub tokens: usize,
    /// Share for the suffix (of what snippets leave).
    pub suffix_share: f32,
    /// Most that snippets may take.
    pub snippet_share: f32,
}

impl Default for Budget {
    /// 1,536 tokens: a 2-core CPU prefills that in about a second with the 1.5B model, and KV
    /// reuse makes later keystrokes prefill only what changed. The suffix gets 5% beyond the
    /// cursor's line (a few lines): in prefix-suffix-middle order each keystroke re-reads the
    /// whole suffix, and a quarter of the budget there tripled the tokens prefilled per
    /// keystroke for no gain in suggestions typed (`caret bench tab`).
    fn default() -> Budget {
        Budget { tokens: 1536, suffix_share: 0.05, snippet_share: 0.25 }
    }
}

/// Lines a cut prefix starts at a multiple of.
pub const ALIGN: usize = 16;

/// A token count without a tokenizer: code runs about 3 to 4 bytes a token in the BPE
/// vocabularies of code models; 3 errs on the side of fitting.
pub fn approx_tokens(text: &str) -> usize {
    text.len().div_ceil(3)
}

/// Builds the context for a cursor at byte `cursor` of `text` (clamped to a character
/// boundary), within `budget` as counted by `count`.
pub fn assemble(
    text: &str,
    cursor: usize,
    path: Option<&str>,
    snippets: &[Snippet],
    budget: Budget,
    count: &dyn Fn(&str) -> usize,
) -> Context {
    let mut cursor = cursor.min(text.len());
    while !text.is_char_boundary(cursor) {
        cursor -= 1;
    }
    let (before, after) = text.split_at(cursor);
    // The cursor's line, whole.
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line_end = after.find('\n').map_or(after.len(), |i| i + 1);
    let current = count(&before[line_start..]) + count(&after[..line_end]);

    let snippet_cap = (budget.tokens as f32 * budget.snippet_share) as usize;
    let mut kept = Vec::new();
    let mut snippet_used = 0;
    let mut add = |s: Snippet, used: &mut usize| {
        // A snippet's path and separator line count too.
        let header = count(&s.path) + 2;
        let fitted = take_lines_forward(&s.text, snippet_cap.saturating_sub(*used + header), count).to_owned();
        if !fitted.trim().is_empty() {
            *used += count(&fitted) + header;
            kept.push(Snippet { path: s.path, text: fitted });
        }
    };

    let rest = budget.tokens.saturating_sub(current);
    let suffix_budget = (rest as f32 * budget.suffix_share) as usize;
    let prefix_budget = rest.saturating_sub(suffix_budget).saturating_sub(snippet_cap.min(rest / 2));
    let above = &before[..line_start];
    let mut prefix_head = take_lines_back(above, prefix_budget, count);
    // The prefix starts on a multiple of ALIGN lines, so that it stays put while the user
    // types (and a new line moves it only every ALIGN lines): a prompt whose start moved is
    // prefilled again from scratch, whatever the KV cache holds.
    if prefix_head.len() < above.len() {
        let dropped = above[..above.len() - prefix_head.len()].matches('\n').count();
        let more = dropped.next_multiple_of(ALIGN) - dropped;
        for _ in 0..more {
            match prefix_head.find('\n') {
                Some(i) => prefix_head = &prefix_head[i + 1..],
                None => prefix_head = "",
            }
        }
    }
    let prefix_start = line_start - prefix_head.len();
    // The enclosing scope's head, when the prefix does not reach it: its share first, its
    // place last — the other files' snippets are the same for every cursor in the file (see
    // `crate::neighbours`), so before it they make a prompt head that stays cached.
    let mut scope = false;
    if let Some(head) = scope_head(before, line_start)
        && head.0 < prefix_start
    {
        add(Snippet { path: path.unwrap_or("untitled").to_owned(), text: head.1.to_owned() }, &mut snippet_used);
        scope = snippet_used > 0;
    }
    for s in snippets {
        add(s.clone(), &mut snippet_used);
    }
    if scope {
        kept.rotate_left(1);
    }
    let suffix_tail = take_lines_forward(&after[line_end..], suffix_budget, count);
    Context {
        prefix: before[prefix_start..].to_owned(),
        suffix: after[..line_end + suffix_tail.len()].to_owned(),
        middle: String::new(),
        path: path.map(str::to_owned),
        repo: None,
        snippets: kept,
    }
}

/// The last whole lines of `text` within `budget`.
fn take_lines_back<'a>(text: &'a str, budget: usize, count: &dyn Fn(&str) -> usize) -> &'a str {
    let mut used = 0;
    let mut start = text.len();
    for line in text.split_inclusive('\n').rev() {
        used += count(line);
        if used > budget {
            break;
        }
        start -= line.len();
    }
    &text[start..]
}

/// The first whole lines of `text` within `budget`.
fn take_lines_forward<'a>(text: &'a str, budget: usize, count: &dyn Fn(&str) -> usize) -> &'a str {
    let mut used = 0;
    let mut end = 0;
    for line in text.split_inclusive('\n') {
        used += count(line);
        if used > budget {
            break;
        }
        end += line.len();
    }
    &text[..end]
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The nearest non-blank line above the cursor's line with less indentation than the first
/// non-blank line at or above the cursor: `(byte offset, line)`.
fn scope_head(before: &str, line_start: usize) -> Option<(usize, &str)> {
    let mut depth = None;
    let mut end = line_start;
    let mut starts = before[..line_start].match_indices('\n').map(|(i, _)| i + 1).collect::<Vec<_>>();
    starts.insert(0, 0);
    // The cursor's own line first (its text before the cursor), then the lines above.
    let cursor_line = &before[line_start..];
    if !cursor_line.trim().is_empty() {
        depth = Some(indent(cursor_line));
    }
    for &s in starts.iter().rev() {
        if s >= line_start {
            continue;
        }
        let line = before[s..end].trim_end_matches('\n');
        end = s;
        if line.trim().is_empty() {
            continue;
        }
        match depth {
            None => depth = Some(indent(line)),
            Some(d) if indent(line) < d => return Some((s, line)),
            Some(_) => {}
        }
    }
    None
}
