//! Model merge: when the matcher cannot place a lazy snippet, a model rewrites the affected
//! region of the file with the edit worked in.
//!
//! [`plan`] picks the region (the whole file when it is short; otherwise the lines between the
//! first and last places the snippet's lines occur, with some context) and writes the prompt
//! and the *prediction*: the region as it is now, which the answer mostly repeats. A local
//! model verifies the prediction as a speculative draft (many tokens per forward pass); an
//! OpenAI-compatible server gets it as a predicted output. [`splice`] puts the answer back in
//! place, keeping the file's line endings, final newline and byte-order mark.

use caret_protocol::llm::{ChatMessage, ChatRequest, Prediction, Role};

use crate::{Error, Result, Text};

/// A region of a file to rewrite, and what to ask a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergePlan {
    /// First line of the region (0-based).
    pub start: usize,
    /// One past its last line.
    pub end: usize,
    /// The system prompt.
    pub system: String,
    /// The user message.
    pub user: String,
    /// The answer expected if nothing changed: the region in the answer's fence.
    pub prediction: String,
}

impl MergePlan {
    /// The chat request that asks `model` to carry out the plan, greedily; `predict`: send
    /// the region as a predicted output (the speculative draft).
    pub fn request(&self, model: &str, predict: bool) -> ChatRequest {
        // The answer is about as long as the region: room for growth, not for rambling.
        let budget = u32::try_from(self.prediction.len() / 2 + self.user.len() / 8 + 256).unwrap_or(u32::MAX);
        let mut req = ChatRequest::new(
            model,
            vec![ChatMessage::text(Role::System, &self.system), ChatMessage::text(Role::User, &self.user)],
        );
        req.max_tokens = Some(budget);
        req.temperature = Some(0.0);
        req.prediction = predict.then(|| Prediction::content(self.prediction.clone()));
        req
    }
}

/// Files at most this long are rewritten whole.
pub const WHOLE_FILE_LINES: usize = 400;
/// Lines of context kept around the snippet's places in a longer file.
const CONTEXT_LINES: usize = 20;

const SYSTEM: &str = "You merge a proposed edit into existing code. The edit shows the new code; comments such as \
`... existing code ...` stand for unchanged code it leaves out. Answer with the complete updated code in one fenced \
code block and nothing else. Copy every line the edit does not change exactly as it is, including blank lines, \
comments and indentation.";

/// The fence's language tag for a path.
fn language(path: Option<&str>) -> &'static str {
    let ext = path.and_then(|p| p.rsplit_once('.')).map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "rs" => "rust",
        "py" | "pyi" => "python",
        "js" | "mjs" | "cjs" | "jsx" => "javascript",
        "ts" | "tsx" => "typescript",
        "go" => "go",
        "java" => "java",
        "c" | "h" => "c",
        "cc" | "cpp" | "cxx" | "hpp" => "cpp",
        "rb" => "ruby",
        "sh" | "bash" => "bash",
        "toml" => "toml",
        "json" => "json",
        "yaml" | "yml" => "yaml",
        "md" => "markdown",
        "html" => "html",
        "css" => "css",
        _ => "",
    }
}

/// Chooses the region to rewrite and writes the prompt for merging `snippet` into it.
pub fn plan(text: &Text, snippet: &str, path: Option<&str>) -> Result<MergePlan> {
    let snippet = snippet.trim_end_matches(['\n', '\r']);
    if snippet.trim().is_empty() {
        return Err(Error::Malformed("the edit is empty".to_owned()));
    }
    let (start, end) = region(text, snippet);
    let lang = language(path);
    let body = text.lines[start..end].join("\n");
    let name = path.unwrap_or("the file");
    let whole = start == 0 && end == text.lines.len();
    let place = if whole { String::new() } else { format!(" (lines {}–{} of the file)", start + 1, end) };
    let user = format!(
        "The code of {name}{place}:\n```{lang}\n{body}\n```\n\nThe edit:\n```{lang}\n{snippet}\n```\n\n\
         Write the updated code{place}."
    );
    let prediction = format!("```{lang}\n{body}\n```");
    Ok(MergePlan { start, end, system: SYSTEM.to_owned(), user, prediction })
}

/// The lines a snippet is about: all of a short file; in a longer one, from the first to the
/// last line that also occurs in the snippet (lines of a few characters do not count), with
/// context; all of it when no line occurs.
fn region(text: &Text, snippet: &str) -> (usize, usize) {
    let n = text.lines.len();
    if n <= WHOLE_FILE_LINES {
        return (0, n);
    }
    let wanted: std::collections::HashSet<&str> =
        snippet.lines().map(str::trim).filter(|l| l.len() >= 8 && !crate::lazy::is_marker(l)).collect();
    let hits: Vec<usize> = (0..n).filter(|&i| wanted.contains(text.lines[i].trim())).collect();
    match (hits.first(), hits.last()) {
        (Some(&a), Some(&b)) => (a.saturating_sub(CONTEXT_LINES), (b + CONTEXT_LINES + 1).min(n)),
        _ => (0, n),
    }
}

/// The code of a model's answer: the first fenced block (to its closing fence, or the end of
/// the answer when it was cut off), or the whole answer when it has no fence.
pub fn answer_code(answer: &str) -> Result<&str> {
    let Some(open) = answer.find("```") else {
        return Ok(answer.trim_matches('\n'));
    };
    let after = &answer[open..];
    let Some(body_at) = after.find('\n') else {
        return Err(Error::Malformed("the model's answer has an empty code block".to_owned()));
    };
    let body = &after[body_at + 1..];
    let close = if body.starts_with("```") { 0 } else { body.find("\n```").map_or(body.len(), |i| i + 1) };
    Ok(body[..close].trim_end_matches('\n'))
}

/// Replaces the planned region with the code of the model's answer.
pub fn splice(text: &Text, plan: &MergePlan, answer: &str) -> Result<Text> {
    let code = answer_code(answer)?;
    if code.trim().is_empty() && plan.end > plan.start {
        return Err(Error::Malformed("the model answered with no code".to_owned()));
    }
    let mut out = text.clone();
    let lines = Text::new(code).lines;
    out.lines.splice(plan.start..plan.end.min(text.lines.len()), lines);
    if text.lines.is_empty() {
        out.final_newline = true;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_file_is_rewritten_whole_and_predicted_as_it_is() {
        let text = Text::new("def f():\n    return 1\n");
        let p = plan(&text, "def f():\n    # ... existing code ...\n    return 2\n", Some("m.py")).unwrap();
        assert_eq!((p.start, p.end), (0, 2));
        assert_eq!(p.prediction, "```python\ndef f():\n    return 1\n```");
        assert!(p.user.contains("```python\ndef f():\n    return 1\n```"), "{}", p.user);
        assert!(p.user.contains("return 2"));
    }

    #[test]
    fn a_long_file_is_cut_to_the_snippets_places_with_context() {
        let lines: Vec<String> = (0..1000).map(|i| format!("line number {i}")).collect();
        let text = Text::new(&(lines.join("\n") + "\n"));
        let p = plan(&text, "line number 500\nnew line\n// ...\nline number 540\n", None).unwrap();
        assert_eq!((p.start, p.end), (480, 561));
        assert!(p.user.contains("lines 481–561"), "{}", p.user);
        let none = plan(&text, "nothing like it\n", None).unwrap();
        assert_eq!((none.start, none.end), (0, 1000));
    }

    #[test]
    fn the_answer_goes_back_in_place_with_the_files_line_endings() {
        let text = Text::new("a\r\nb\r\nc\r\nd\r\n");
        let p = MergePlan { start: 1, end: 3, system: String::new(), user: String::new(), prediction: String::new() };
        let out = splice(&text, &p, "Here it is:\n```text\nB\nnew\nC\n```\nDone.").unwrap();
        assert_eq!(out.render(), "a\r\nB\r\nnew\r\nC\r\nd\r\n");
        // No fence: the answer is the code. A cut-off fence keeps what came.
        assert_eq!(splice(&text, &p, "X\n").unwrap().render(), "a\r\nX\r\nd\r\n");
        assert_eq!(splice(&text, &p, "```\nY\nZ").unwrap().render(), "a\r\nY\r\nZ\r\nd\r\n");
        assert!(splice(&text, &p, "```\n```").is_err(), "no code is not an answer");
    }
}
