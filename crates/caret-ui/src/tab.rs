//! Tab in the page: the same [`Completer`] as `caret lsp` (typed-ahead cache, the context and
//! neighbour snippets of other open files, the adaptive debounce), a request superseded by a
//! newer one for the same file aborted (dropping the model's stream), warm-ups when a file is
//! opened or the cursor rests, and the suggestions shown, accepted and rejected per model for
//! `/metrics`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use caret_host::completer::{Completer, Suggestion};
use caret_host::documents::{Docs, path_to_uri, relative};

/// How the suggestions of one model fared.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub requested: u64,
    pub shown: u64,
    pub accepted: u64,
    pub partial: u64,
    pub rejected: u64,
}

/// Tab's state in `caret ui`.
pub struct Tab {
    root: PathBuf,
    /// How the workspace is walked (its ignore files), for a rename carried past the open files.
    walk: caret_workspace::walk::WalkConfig,
    /// Tab's model (none: none configured or installed yet; set once a pull installs one).
    completer: std::sync::RwLock<Option<Arc<Completer>>>,
    docs: Mutex<Docs>,
    /// Requests in flight: document → task.
    flight: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    counts: std::sync::Mutex<BTreeMap<String, Counts>>,
    /// Next edits shown, applied (Tab, Tab) and dropped (a keystroke or Esc): no model label,
    /// as most come from the deterministic candidates.
    next_edits: std::sync::Mutex<Counts>,
    /// The open files' recent edits, for the next edit.
    history: Mutex<caret_complete::next_edit::History>,
}

/// A predicted next edit in the page's terms: UTF-16 offsets of the text it was asked with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NextEdit {
    /// Where the replaced text starts.
    pub start: usize,
    /// Where it ends.
    pub end: usize,
    /// What replaces it.
    pub text: String,
    /// Why it was predicted (`repeat`, `insert`, `import`, `model`).
    pub reason: &'static str,
    /// Its 1-based line.
    pub line: usize,
    /// Another open file it is in (`start` and `end` are then of that file's text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

impl NextEdit {
    fn of(text: &str, p: caret_complete::next_edit::Prediction) -> NextEdit {
        NextEdit {
            start: units(text, p.start),
            end: units(text, p.end),
            line: text[..p.start].matches('\n').count() + 1,
            text: p.replacement,
            reason: p.why.as_str(),
            path: None,
        }
    }

    /// A prediction in file `path` (`text`) or in one open beside it (`opened`: paths
    /// relative to the root, and texts), marked with that file when it is another.
    fn shown(
        path: &str,
        text: &str,
        opened: &[(String, String)],
        p: caret_complete::next_edit::Prediction,
    ) -> NextEdit {
        match opened.iter().find(|(o, _)| *o == p.path) {
            Some((other, there)) if p.path != path => {
                let other = other.clone();
                NextEdit { path: Some(other), ..NextEdit::of(there, p) }
            }
            _ => NextEdit::of(text, p),
        }
    }
}

/// Owned (path, text) pairs as the pairs of borrowed strings the rules take.
fn pairs(files: &[(String, String)]) -> Vec<(&str, &str)> {
    files.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect()
}

/// UTF-16 offset of byte `at` of `text`.
fn units(text: &str, at: usize) -> usize {
    text[..at].encode_utf16().count()
}

/// What came of a request.
pub enum Outcome {
    Suggestion(Suggestion),
    /// A newer request for the same file replaced it.
    Superseded,
    Failed(String),
}

/// Aborts the task when the request that waits for it goes away (the page cancelled it).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Byte offset of UTF-16 offset `units` in `text` (Monaco's offsets), clamped.
pub fn byte_offset(text: &str, units: usize) -> usize {
    let mut seen = 0;
    for (i, c) in text.char_indices() {
        if seen >= units {
            return i;
        }
        seen += c.len_utf16();
    }
    text.len()
}

impl Tab {
    pub fn new(root: PathBuf, completer: Option<Completer>, walk: caret_workspace::walk::WalkConfig) -> Tab {
        Tab {
            root,
            walk,
            completer: std::sync::RwLock::new(completer.map(Arc::new)),
            docs: Mutex::new(Docs::default()),
            flight: Mutex::new(HashMap::new()),
            counts: std::sync::Mutex::new(BTreeMap::new()),
            next_edits: std::sync::Mutex::default(),
            history: Mutex::default(),
        }
    }

    /// Starts following the edits of `path` at `text` (the file as opened).
    pub async fn follow(&self, path: &str, text: &str) {
        self.history.lock().await.open(path, text);
        // Open, it is a source of imports (and of Tab's snippets) for the other files.
        self.update(&path_to_uri(&self.root.join(path)), text).await;
    }

    /// The edit likely next in `path` after the recent ones, as `caret lsp` answers it: the
    /// edits since the file last settled become one, and the nearest place it repeats at
    /// answers; with none, the other open files' and the workspace's, then Tab's model under
    /// its budget, else the learned ranker's best place (a rule's rewrite there, or a jump). A
    /// newer request for the file aborts an older one's model call.
    pub async fn next_edit(&self, path: &str, text: &str, cursor: usize) -> Option<NextEdit> {
        let cursor = byte_offset(text, cursor);
        // The file as it is now, for the other files' predictions and snippets.
        self.update(&path_to_uri(&self.root.join(path)), text).await;
        let tab = self.completer();
        // A model trained for next edits, when the gateway serves one: it ranks the candidates.
        let ranker = tab.as_ref().and_then(|c| c.next_edit_model()).map(Arc::new);
        let (last, edits, found) = {
            let mut history = self.history.lock().await;
            history.settle(path, text);
            let last = history.last()?;
            let found = caret_complete::next_edit::candidates(last, path, text, cursor);
            // A lone repeat of the edit (a rename's next use) for a model trained for next edits.
            if found.len() == 1 && ranker.is_some() {
                return found.into_iter().next().map(|p| NextEdit::of(text, p));
            }
            (last.clone(), history.edits().cloned().collect::<Vec<_>>(), found)
        };
        // The files open beside this one (paths relative to the root), by path.
        let opened: Vec<(String, String)> = {
            let docs = self.docs.lock().await;
            let uri = path_to_uri(&self.root.join(path));
            let mut v: Vec<_> = docs
                .open
                .iter()
                .filter(|(u, _)| **u != uri)
                .map(|(u, d)| (relative(u, Some(&self.root)), d.text.clone()))
                .collect();
            v.sort_unstable();
            v
        };
        // Without such a model, the learned ranker weighs the repeats' places with every other
        // (it finds the place more often than the nearest repeat does: docs/tab.md).
        if !found.is_empty() && ranker.is_none() {
            let placed = caret_next_edit::served(&last, path, text, &pairs(&opened), found);
            return placed.map(|p| NextEdit::shown(path, text, &opened, p));
        }
        if found.is_empty() {
            // A rename's uses in another open file; else the import a new name needs, as
            // another open file has it.
            let others = pairs(&opened);
            // A rename's other uses, else a new parameter's calls (here or in another file).
            let carried = caret_complete::next_edit::elsewhere(&last, &others)
                .into_iter()
                .chain(caret_complete::calls::call_sites(&last, path, text, &others))
                .next();
            if let Some(p) = carried {
                if p.path == path {
                    return Some(NextEdit::of(text, p));
                }
                let there = others.iter().find(|(o, _)| *o == p.path).map_or("", |(_, t)| *t);
                let file = p.path.clone();
                return Some(NextEdit { path: Some(file), ..NextEdit::of(there, p) });
            }
            if let Some(p) = caret_complete::imports::missing_import(&last, path, text, &others) {
                return Some(NextEdit::of(text, p));
            }
            // A rename with no use left in the open files: the first workspace file with one.
            if let Some(name) = caret_complete::next_edit::renamed(&last) {
                let mut open: Vec<String> = others.iter().map(|(p, _)| (*p).to_owned()).collect();
                open.push(path.to_owned());
                let (walk, name, root) = (self.walk.clone(), name.to_owned(), self.root.clone());
                let found = tokio::task::spawn_blocking(move || {
                    caret_host::documents::workspace_uses(&walk, &root, &name, &open, 1)
                })
                .await
                .unwrap_or_default();
                for (rel, there) in found {
                    if let Some(p) = caret_complete::next_edit::elsewhere(&last, &[(&rel, &there)]).into_iter().next() {
                        return Some(NextEdit { path: Some(rel.clone()), ..NextEdit::of(&there, p) });
                    }
                }
            }
        }
        // The model's turn: to rank the candidates, or (none fits) to predict; the ranker's
        // place when there is no model, or it predicts nothing (its places reach into the
        // open files too).
        let Some(completer) = ranker.or(tab) else {
            let placed = caret_next_edit::guess(&last, path, text, cursor, &pairs(&opened));
            return placed.map(|p| NextEdit::shown(path, text, &opened, p));
        };
        let (owned_path, owned_text, open_texts) = (path.to_owned(), text.to_owned(), opened.clone());
        let result = self
            .in_flight(format!("next-edit {path}"), async move {
                let guess = match completer.next_edit(edits.iter(), &owned_path, &owned_path, &owned_text, cursor).await
                {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::warn!("next edit: {e:#}");
                        None
                    }
                };
                match guess {
                    Some(g) if !found.is_empty() => {
                        caret_complete::next_edit::rank(found, &g, &owned_text).into_iter().next()
                    }
                    guess if found.is_empty() => guess.or_else(|| {
                        caret_next_edit::guess(&last, &owned_path, &owned_text, cursor, &pairs(&open_texts))
                    }),
                    _ => found.into_iter().next(),
                }
            })
            .await;
        result.ok().flatten().map(|p| NextEdit::shown(path, text, &opened, p))
    }

    /// Runs `work` as the request in flight under `key` (a newer one under the same key aborts
    /// it; so does the caller going away).
    async fn in_flight<T: Send + 'static>(
        &self,
        key: String,
        work: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T, tokio::task::JoinError> {
        let task = {
            let mut flight = self.flight.lock().await;
            let task = tokio::spawn(work);
            if let Some(old) = flight.insert(key.clone(), task.abort_handle()) {
                old.abort();
            }
            task
        };
        let guard = AbortOnDrop(task.abort_handle());
        let result = task.await;
        drop(guard);
        let mut flight = self.flight.lock().await;
        if flight.get(&key).is_some_and(|h| h.is_finished()) {
            flight.remove(&key);
        }
        result
    }

    /// Tab's model, when there is one.
    fn completer(&self) -> Option<Arc<Completer>> {
        self.completer.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Uses `completer` from now on (a model installed while the page is open).
    pub fn set_completer(&self, completer: Completer) {
        *self.completer.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(completer));
    }

    /// The model alias, when there is one.
    pub fn model(&self) -> Option<String> {
        self.completer().map(|c| c.model().to_owned())
    }

    /// Keeps the page's text of `path` as the language server keeps an open document's.
    async fn update(&self, uri: &str, text: &str) {
        let mut docs = self.docs.lock().await;
        match docs.open.get_mut(uri) {
            Some(doc) if doc.text == text => {}
            Some(doc) => {
                doc.text = text.to_owned();
                doc.edited = Instant::now();
                doc.rhythm.keystroke(doc.edited);
            }
            None => docs.open(uri, text, Duration::from_millis(25)),
        }
    }

    /// The suggestion at UTF-16 offset `cursor` of `text` (the page's buffer of `path`).
    pub async fn complete(&self, path: &str, text: String, cursor: usize) -> Outcome {
        let Some(completer) = self.completer() else {
            return Outcome::Failed(
                "no Tab model: `caret models pull qwen2.5-coder-1.5b-instruct-q4` (used as soon as it is installed)"
                    .to_owned(),
            );
        };
        let model = completer.model().to_owned();
        self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entry(model).or_default().requested += 1;
        let uri = path_to_uri(&self.root.join(path));
        let cursor = byte_offset(&text, cursor);
        self.update(&uri, &text).await;
        let Some((text, snippets, debounce)) = self.docs.lock().await.prepare(&uri, Some(&self.root)) else {
            return Outcome::Failed("the document is gone".to_owned());
        };
        let rel = relative(&uri, Some(&self.root));
        let doc = uri.clone();
        let result = self
            .in_flight(uri, async move {
                if let Some(hit) = completer.cached(&doc, &text, cursor) {
                    return Ok(hit);
                }
                // A keystroke within the debounce supersedes this before it costs anything.
                if !debounce.is_zero() {
                    tokio::time::sleep(debounce).await;
                }
                completer.suggest(&doc, &text, cursor, Some(&rel), &snippets).await
            })
            .await;
        match result {
            Ok(Ok(s)) => Outcome::Suggestion(s),
            Ok(Err(e)) => Outcome::Failed(e.to_string()),
            Err(e) if e.is_cancelled() => Outcome::Superseded,
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }

    /// The file `path` was opened, or its cursor rests at UTF-16 offset `cursor`: warms the
    /// model for a suggestion there, unless a request is in flight (which reads the prompt
    /// itself). Returns whether a warm-up was sent.
    pub async fn warm(&self, path: &str, text: String, cursor: usize) -> bool {
        let Some(completer) = self.completer() else { return false };
        if self.flight.lock().await.values().any(|h| !h.is_finished()) {
            return false;
        }
        let uri = path_to_uri(&self.root.join(path));
        let cursor = byte_offset(&text, cursor);
        self.update(&uri, &text).await;
        let Some((text, snippets, _)) = self.docs.lock().await.prepare(&uri, Some(&self.root)) else {
            return false;
        };
        let rel = relative(&uri, Some(&self.root));
        completer.warm(&text, cursor, Some(&rel), &snippets).await
    }

    /// The page's report on a suggestion: shown, accepted, partial (accepted word by word) or
    /// rejected (shown, then typed over or dismissed).
    pub fn feedback(&self, model: &str, event: &str) -> Result<(), String> {
        if let Some(what) = event.strip_prefix("next_edit_") {
            let mut c = self.next_edits.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match what {
                "shown" => c.shown += 1,
                "accepted" => c.accepted += 1,
                "rejected" => c.rejected += 1,
                other => return Err(format!("unknown next-edit event {other:?}: shown, accepted or rejected")),
            }
            return Ok(());
        }
        let ours = self.model();
        let model = if model.is_empty() { ours.as_deref().unwrap_or("none") } else { model };
        let mut counts = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Only models this page uses get a series (a page cannot mint labels).
        if Some(model) != ours.as_deref() {
            return Err(format!("unknown model {model:?}"));
        }
        let c = counts.entry(model.to_owned()).or_default();
        match event {
            "shown" => c.shown += 1,
            "accepted" => c.accepted += 1,
            "partial" => c.partial += 1,
            "rejected" => c.rejected += 1,
            other => return Err(format!("unknown event {other:?}: shown, accepted, partial or rejected")),
        }
        Ok(())
    }

    /// Prometheus text of the counts.
    pub fn metrics(&self) -> String {
        use std::fmt::Write as _;
        let counts = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = String::new();
        for (name, help, get) in [
            ("caret_tab_requests_total", "Tab suggestions asked for", (|c: &Counts| c.requested) as fn(&Counts) -> u64),
            ("caret_tab_shown_total", "Tab suggestions shown as ghost text", |c| c.shown),
            ("caret_tab_accepted_total", "Tab suggestions accepted whole (Tab)", |c| c.accepted),
            ("caret_tab_partially_accepted_total", "Tab suggestions accepted word by word", |c| c.partial),
            ("caret_tab_rejected_total", "Tab suggestions shown and not accepted", |c| c.rejected),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
            for (model, c) in counts.iter() {
                let _ = writeln!(out, "{name}{{model=\"{model}\"}} {}", get(c));
            }
        }
        let _ = writeln!(
            out,
            "# HELP caret_tab_accept_rate Suggestions accepted (whole or in part) per suggestion shown.\n# TYPE caret_tab_accept_rate gauge"
        );
        for (model, c) in counts.iter() {
            let rate = if c.shown == 0 { 0.0 } else { (c.accepted + c.partial) as f64 / c.shown as f64 };
            let _ = writeln!(out, "caret_tab_accept_rate{{model=\"{model}\"}} {rate}");
        }
        let n = *self.next_edits.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (name, help, value) in [
            ("caret_next_edit_shown_total", "Next edits shown (marked where they would go)", n.shown),
            ("caret_next_edit_accepted_total", "Next edits applied with Tab", n.accepted),
            ("caret_next_edit_rejected_total", "Next edits shown and dropped (typed over or Esc)", n.rejected),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter\n{name} {value}");
        }
        let rate = if n.shown == 0 { 0.0 } else { n.accepted as f64 / n.shown as f64 };
        let _ = writeln!(
            out,
            "# HELP caret_next_edit_accept_rate Next edits applied per next edit shown.\n# TYPE caret_next_edit_accept_rate gauge\ncaret_next_edit_accept_rate {rate}"
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_offsets_become_byte_offsets() {
        let t = "a😀b\né";
        assert_eq!(byte_offset(t, 0), 0);
        assert_eq!(byte_offset(t, 1), 1);
        assert_eq!(byte_offset(t, 3), 5, "the emoji is two UTF-16 units");
        assert_eq!(byte_offset(t, 5), 7);
        assert_eq!(byte_offset(t, 6), 9);
        assert_eq!(byte_offset(t, 99), t.len());
    }
}
