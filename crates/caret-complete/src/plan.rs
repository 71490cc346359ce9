//! One request from cursor to prompt: the context, the prompt in the family's format, the
//! mode, how many tokens to ask for, and the [`Stopper`] to feed the stream to. `caret lsp`
//! (embedded), `caret complete` and the server's `POST /v1/complete` all plan with this, so an
//! editor gets the same suggestion whichever end runs the model.

use std::ops::Range;

use crate::context::{Budget, Context, Snippet, approx_tokens, assemble};
use crate::post::{Mode, Stopper, mode};
use crate::template::Family;

/// Most tokens a suggestion may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A single-line suggestion.
    pub single_line: u32,
    /// A multi-line one.
    pub multi_line: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { single_line: 48, multi_line: 160 }
    }
}

/// What to send the model and how to read its answer.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The context the prompt was made from.
    pub context: Context,
    /// The prompt.
    pub prompt: String,
    /// Single-line or multi-line.
    pub mode: Mode,
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// Cuts the streamed text where the suggestion ends.
    pub stopper: Stopper,
}

/// Plans a suggestion at byte `cursor` of `text` (clamped to a character boundary).
/// `family`: the fill-in-the-middle format (`None`: the prefix alone, for models without one).
pub fn plan(
    text: &str,
    cursor: usize,
    path: Option<&str>,
    snippets: &[Snippet],
    budget: Budget,
    family: Option<&Family>,
    limits: Limits,
) -> Plan {
    let cursor = floor_boundary(text, cursor);
    let (before, after) = text.split_at(cursor);
    let m = mode(before, after);
    let mut context = assemble(text, cursor, path, snippets, budget, &approx_tokens);
    // Spaces after code (`x = |`) end the prompt badly: code models tokenise a space with the
    // word after it, so the model would write a second one. They are left out of the prompt
    // and taken off the suggestion (indentation alone on a line stays).
    let line = before.rsplit('\n').next().unwrap_or("");
    let lead = &line[line.trim_end_matches([' ', '\t']).len()..];
    let lead = if line.trim().is_empty() { "" } else { lead };
    let kept = context.prefix.len() - lead.len();
    context.prefix.truncate(kept);
    let whole_prefix = context.prefix.clone();
    // The cursor's line goes after the middle sentinel when the format allows it: the prompt
    // up to there then stays the same while the user types along a line, so KV reuse
    // prefills only the characters typed, not the whole suffix after every keystroke (in
    // prefix-suffix-middle order everything after the first changed character is read
    // again). A blank line stays in the prefix: a middle of spaces alone would end the prompt
    // on a whitespace token that code tokenisers never produce before a word.
    if family.is_some_and(Family::starts_middle) {
        let at = context.prefix.rfind('\n').map_or(0, |i| i + 1);
        if !context.prefix[at..].trim().is_empty() {
            context.middle = context.prefix.split_off(at);
        }
    }
    let (prompt, stops) = match family {
        Some(f) => (f.render(&context), f.stop()),
        None => (context.prefix.clone(), Vec::new()),
    };
    let max_tokens = if m == Mode::MultiLine { limits.multi_line } else { limits.single_line };
    let stopper = Stopper::new(m, &whole_prefix, &context.suffix, stops).lead(lead);
    Plan { context, prompt, mode: m, max_tokens, stopper }
}

impl Plan {
    /// The same request with the cursor's line back in the prefix, when it started the middle:
    /// asked when the split one came back empty (a model sometimes closes a middle it was
    /// handed at once, where the whole prefix gets a suggestion).
    pub fn unsplit(&self, family: Option<&Family>) -> Option<Plan> {
        let family = family?;
        if self.context.middle.is_empty() {
            return None;
        }
        let mut plan = self.clone();
        let middle = std::mem::take(&mut plan.context.middle);
        plan.context.prefix.push_str(&middle);
        plan.prompt = family.render(&plan.context);
        Some(plan)
    }
}

/// The largest character boundary of `text` at or before `at`.
pub fn floor_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The part of `text` around byte `cursor` that a remote engine needs, cut at line
/// boundaries: four times what the budget could take either side (the enclosing scope's head
/// may lie above the prefix kept). A short file is all of it.
pub fn window(text: &str, cursor: usize, budget: Budget) -> Range<usize> {
    let cursor = floor_boundary(text, cursor);
    let reach = budget.tokens.saturating_mul(3).saturating_mul(4);
    let start = floor_boundary(text, cursor.saturating_sub(reach));
    let start = if start == 0 { 0 } else { text[start..cursor].find('\n').map_or(start, |i| start + i + 1) };
    let end = floor_boundary(text, cursor.saturating_add(reach));
    let end =
        if end == text.len() { end } else { text[..end].rfind('\n').filter(|&i| i >= cursor).map_or(end, |i| i + 1) };
    start..end
}
