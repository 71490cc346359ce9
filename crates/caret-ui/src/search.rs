//! The page's search — natural language over the synced index, or exact grep over the files
//! — and Cmd-K: an instruction applied to the selected lines through the apply engine.

use std::path::Path;

use anyhow::Context as _;
use caret_protocol::llm::{ChatMessage, ChatRequest, Role};
use futures::StreamExt as _;
use serde_json::{Value, json};

use caret_host::config::Config;

/// `{hits: [{path, line, end_line, snippet}], note?}` for lines matching `pattern` (a regular
/// expression, or the text itself when it is not one; case-insensitive unless it has a
/// capital), at most `limit`.
pub fn grep(root: &Path, pattern: &str, limit: usize) -> anyhow::Result<Value> {
    let insensitive = !pattern.chars().any(char::is_uppercase);
    let build = |p: &str| regex::RegexBuilder::new(p).case_insensitive(insensitive).size_limit(1 << 20).build();
    let re = build(pattern).or_else(|_| build(&regex::escape(pattern))).context("the pattern")?;
    let walked = caret_workspace::walk::walk(root, &caret_workspace::walk::WalkConfig::default())?;
    let mut hits = Vec::new();
    let mut files = 0;
    'files: for f in walked.files {
        let Ok(rel) = std::str::from_utf8(f.path.as_bytes()) else { continue };
        let Ok(text) = std::fs::read_to_string(root.join(rel)) else { continue };
        let mut found = false;
        for (i, line) in text.lines().enumerate() {
            if re.is_match(line) {
                found = true;
                let snippet: String = line.trim().chars().take(200).collect();
                hits.push(json!({"path": rel, "line": i + 1, "end_line": i + 1, "snippet": snippet}));
                if hits.len() >= limit {
                    files += 1;
                    break 'files;
                }
            }
        }
        files += usize::from(found);
    }
    let note = format!(
        "{} matching lines in {files} files{}",
        hits.len(),
        if hits.len() >= limit { " (the first)" } else { "" }
    );
    Ok(json!({"hits": hits, "note": note}))
}

/// How long a sync for the page's search stays fresh enough (a sync of an unchanged
/// workspace compares file stats only).
const SYNC_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The workspace index's hybrid search (what `caret search` does), hits with their code read
/// from disk. The workspace is synced first (lexical terms: seconds even for a large project)
/// when `synced` is older than [`SYNC_EVERY`], so a workspace nobody indexed is searchable
/// and edits since count; vectors come from `caret index` or `caret sync --watch`.
pub async fn semantic(
    config: &Config,
    root: &Path,
    query: &str,
    k: usize,
    synced: &tokio::sync::Mutex<Option<std::time::Instant>>,
) -> anyhow::Result<Value> {
    let remote = caret_host::remote::Remote { server: None, token: None };
    {
        let mut last = synced.lock().await;
        if last.is_none_or(|t| t.elapsed() > SYNC_EVERY) {
            let ws = caret_host::remote::open_workspace(config, root)?;
            let engine = caret_host::remote::engine(config)?;
            let transport = caret_host::remote::transport(config, &remote).await?;
            engine.sync(&ws, transport.as_ref()).await.context("syncing the workspace for search")?;
            *last = Some(std::time::Instant::now());
        }
    }
    let outcome =
        caret_host::search::search_workspace(config, root, &remote, query, k, caret_protocol::SearchMode::Hybrid)
            .await?;
    let hits: Vec<Value> = outcome
        .hits
        .iter()
        .map(|h| {
            json!({"path": h.path, "line": h.start_line, "end_line": h.end_line, "score": h.score, "snippet": h.snippet})
        })
        .collect();
    let note = if outcome.semantic {
        format!("{} hits ({} of {} chunks embedded)", hits.len(), outcome.embedded, outcome.embeddable)
    } else {
        format!("{} hits by words only: the workspace has no vectors yet (run `caret index`)", hits.len())
    };
    Ok(json!({"hits": hits, "note": note, "semantic": outcome.semantic}))
}

/// The first fenced block of `answer`, else all of it.
fn fenced(answer: &str) -> String {
    let mut lines = answer.lines();
    for line in lines.by_ref() {
        if line.trim_start().starts_with("```") {
            let body: Vec<&str> = lines.take_while(|l| !l.trim_start().starts_with("```")).collect();
            return body.join("\n");
        }
    }
    answer.trim_matches('\n').to_owned()
}

/// Cmd-K: the lines of `text` that bytes `start..end` touch, rewritten by the model as
/// `instruction` says, applied as a search/replace edit. Returns the new text and the format.
pub async fn edit(
    backend: &caret_host::backend::Backend,
    model: &str,
    path: &str,
    text: &str,
    (start, end): (usize, usize),
    instruction: &str,
    rules: &str,
) -> anyhow::Result<(String, &'static str)> {
    anyhow::ensure!(!instruction.trim().is_empty(), "say what should change");
    let (start, end) = (start.min(end).min(text.len()), end.max(start).min(text.len()));
    // Whole lines.
    let from = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let to = if end > from && text[..end].ends_with('\n') {
        end
    } else {
        text[end..].find('\n').map_or(text.len(), |i| end + i + 1)
    };
    let selected = &text[from..to];
    anyhow::ensure!(!selected.trim().is_empty(), "select the code to edit");
    let before: String =
        text[..from].lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    let after: String = text[to..].lines().take(20).collect::<Vec<_>>().join("\n");
    let mut system = "You rewrite code. You get lines of a file and an instruction. Answer with the rewritten lines \
                      only, in one fenced code block, keeping the indentation of the lines around them. No explanation."
        .to_owned();
    if !rules.trim().is_empty() {
        system.push_str("\n\n");
        system.push_str(rules.trim_end());
    }
    let user = format!(
        "File {path}, the lines before:\n```\n{before}\n```\nThe lines to rewrite:\n```\n{}\n```\nThe lines after:\n```\n{after}\n```\nInstruction: {instruction}",
        selected.trim_end_matches('\n')
    );
    let mut req = ChatRequest::new(
        model.to_owned(),
        vec![ChatMessage::text(Role::System, system), ChatMessage::text(Role::User, user)],
    );
    req.max_tokens = Some(2048);
    req.temperature = Some(0.0);
    let mut events = backend.chat(req).await?;
    let mut answer = String::new();
    while let Some(e) = events.next().await {
        if let caret_models::Event::Text(t) = e? {
            answer.push_str(&t);
        }
    }
    let mut replacement = fenced(&answer);
    if selected.ends_with('\n') && !replacement.ends_with('\n') {
        replacement.push('\n');
    }
    let edit = format!("<<<<<<< SEARCH\n{selected}=======\n{replacement}>>>>>>> REPLACE\n");
    let (new, format) =
        caret_apply::apply(&caret_apply::Text::new(text), &edit, Some(caret_apply::Format::SearchReplace), Some(path))
            .context("applying the model's rewrite")?;
    Ok((new.render(), format.name()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn grep_finds_lines_and_takes_text_that_is_not_a_pattern() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.py"), "def total(x):\n    return sum(x)\n").unwrap();
        std::fs::write(dir.path().join("b.py"), "print(total([1]))\n").unwrap();
        let r = grep(dir.path(), "total(", 10).unwrap();
        let hits: Vec<(String, u64)> = r["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h["path"].as_str().unwrap().to_owned(), h["line"].as_u64().unwrap()))
            .collect();
        assert_eq!(hits, [("a.py".to_owned(), 1), ("b.py".to_owned(), 1)]);
        let r = grep(dir.path(), "RETURN", 10).unwrap();
        assert_eq!(r["hits"].as_array().unwrap().len(), 0, "a capital makes it case-sensitive");
        let r = grep(dir.path(), "ret.*sum", 10).unwrap();
        assert_eq!(r["hits"][0]["line"], 2);
    }

    #[test]
    fn answers_are_read_from_their_fence() {
        assert_eq!(fenced("Sure:\n```python\nx = 1\ny = 2\n```\nDone."), "x = 1\ny = 2");
        assert_eq!(fenced("x = 1\n"), "x = 1");
    }
}
