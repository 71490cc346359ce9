//! `caret bench tab --cold PAUSE --session DIR`: the first suggestion in each file of a plain
//! LSP client's session. A client that sends no `caret/focus` (Neovim, Helix) opens files one
//! after another; each is warmed for its end a moment after it opens (what `caret lsp` does
//! on `didOpen`), the user reads for PAUSE seconds, then types the first character of a line
//! in the file's middle and waits for the suggestion. The files stay open, so each one's
//! prompt carries snippets of the others (picked as `caret lsp` picks them).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use caret_host::completer::Completer;
use caret_host::documents::{Docs, path_to_uri};
use caret_host::runtime::runtime;
use caret_llama::LlamaProvider;
use caret_models::Provider as _;

use crate::search::percentile;

/// Files in a session.
const FILES: usize = 16;
/// Lines a session's file has, at least and at most.
const LINES: (usize, usize) = (20, 150);
/// What `caret lsp` waits after an open before warming (its `WARM_QUIET`).
const QUIET: Duration = Duration::from_millis(250);

/// The session's files: source files under `dir` of [`LINES`] lines, first [`FILES`] by path.
fn files(dir: &Path) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                if !name.starts_with('.') && !["target", "node_modules"].contains(&name) {
                    stack.push(path);
                }
            } else if ["rs", "py", "ts", "js", "go"].contains(&path.extension().and_then(|e| e.to_str()).unwrap_or(""))
            {
                found.push(path);
            }
        }
    }
    found.sort();
    let mut out = Vec::new();
    for path in found {
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        if (LINES.0..=LINES.1).contains(&text.lines().count()) {
            out.push((path, text));
            if out.len() == FILES {
                break;
            }
        }
    }
    anyhow::ensure!(!out.is_empty(), "no source files of {}–{} lines under {}", LINES.0, LINES.1, dir.display());
    Ok(out)
}

/// Runs the session and prints each file's first suggestion and the p50.
pub(crate) fn session(
    completer: &Completer,
    local: &LlamaProvider,
    dir: &Path,
    pause: Duration,
) -> anyhow::Result<ExitCode> {
    let dir = std::fs::canonicalize(dir)?;
    let files = files(&dir)?;
    println!(
        "plain LSP client session: {} files of {}–{} lines under {}, each asked at its middle line {:.1} s after opening",
        files.len(),
        LINES.0,
        LINES.1,
        dir.display(),
        pause.as_secs_f64()
    );
    let rt = runtime()?;
    let (mut ms, mut read_total, mut snippets_total) = (Vec::new(), 0u64, 0usize);
    rt.block_on(async {
        flush(local).await?;
        let mut docs = Docs::default();
        for (path, text) in &files {
            let rel = path.strip_prefix(&dir).unwrap_or(path).to_string_lossy().into_owned();
            let uri = path_to_uri(path);
            // The middle line with text: the cursor at its indentation, the line's text taken
            // out (a line about to be written), its first character typed after the pause.
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            let mut n = lines.len() / 2;
            while n < lines.len() && lines[n].trim().is_empty() {
                n += 1;
            }
            let Some(line) = lines.get(n) else { continue };
            let start: usize = lines[..n].iter().map(|l| l.len()).sum();
            let cursor = start + (line.len() - line.trim_start().len());
            let end = start + line.trim_end_matches(['\n', '\r']).len();
            let opened = format!("{}{}", &text[..cursor], &text[end..]);
            let first = line.trim_start().chars().next().unwrap_or('x');
            let typed = format!("{}{first}{}", &text[..cursor], &text[end..]);
            docs.open(&uri, &opened, Duration::ZERO);
            tokio::time::sleep(QUIET).await;
            let Some((now, snippets, _)) = docs.prepare(&uri, Some(&dir)) else { continue };
            completer.warm(&now, now.len(), Some(&rel), &snippets).await;
            tokio::time::sleep(pause.saturating_sub(QUIET)).await;
            if let Some(doc) = docs.open.get_mut(&uri) {
                doc.text.clone_from(&typed);
            }
            let Some((now, snippets, _)) = docs.prepare(&uri, Some(&dir)) else { continue };
            let before = local.stats();
            let s = completer.suggest(&uri, &now, cursor + first.len_utf8(), Some(&rel), &snippets).await?;
            let after = local.stats();
            let read = (after.prompt_tokens - before.prompt_tokens) - (after.reused_tokens - before.reused_tokens);
            println!(
                "  {rel:<48} line {:>3}: first suggestion {:>6.0} ms, prompt tokens read then {read:>4}, {} snippets",
                n + 1,
                s.total_ms,
                snippets.len()
            );
            ms.push(s.total_ms);
            read_total += read;
            snippets_total += snippets.len();
        }
        anyhow::Ok(())
    })?;
    ms.sort_by(f64::total_cmp);
    let n = ms.len().max(1);
    println!(
        "  first suggestion per file: p50 {:.0} ms, p90 {:.0} ms, max {:.0} ms; prompt tokens read at the request {:.0} on average; {:.1} snippets on average",
        percentile(&ms, 0.5),
        percentile(&ms, 0.9),
        percentile(&ms, 1.0),
        read_total as f64 / n as f64,
        snippets_total as f64 / n as f64
    );
    Ok(ExitCode::SUCCESS)
}

/// A one-token request for an unrelated prompt: the cache then holds none of the file.
pub(crate) async fn flush(local: &LlamaProvider) -> anyhow::Result<()> {
    use futures::StreamExt as _;
    let req = caret_protocol::llm::CompletionRequest::greedy("local", "# scratch\n".to_owned(), 1);
    let mut events = local.complete(req).await?;
    while let Some(e) = events.next().await {
        e?;
    }
    Ok(())
}
