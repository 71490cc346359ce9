//! The documents an editor has open (and those it closed recently), as Tab sees them: their
//! text, when each last changed, the user's typing rhythm in each, and the snippets of the
//! others that resemble the code at the cursor. Shared by the language server and the
//! workspace page.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use caret_complete::{Debounce, Neighbour, Picking, Snippet};

/// Byte offset of an LSP position (line, UTF-16 column), clamped to the line.
pub fn offset_at(text: &str, line: u64, character: u64) -> usize {
    let mut start = 0;
    for _ in 0..line {
        match text[start..].find('\n') {
            Some(i) => start += i + 1,
            None => return text.len(),
        }
    }
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let mut units = 0u64;
    for (i, c) in text[start..end].char_indices() {
        if units >= character {
            return start + i;
        }
        units += c.len_utf16() as u64;
    }
    end
}

/// An open document.
pub struct Doc {
    /// Its text now.
    pub text: String,
    /// Its last change.
    pub edited: Instant,
    /// The user's typing rhythm in it.
    pub rhythm: Debounce,
    /// Neighbour snippets picked for it, and what they were picked for.
    snippets: Option<(SnippetKey, Vec<Snippet>)>,
}

/// What neighbour snippets depend on: the other documents (each one's URI, length and last
/// change) and the cursor's region (16-line bands). Picking again only when it changes keeps
/// the prompt's head stable between keystrokes, so KV reuse still prefills only what changed.
/// How much a document may grow or shrink before its snippets are picked again.
pub const REPICK_BYTES: usize = 4096;

type SnippetKey = (Vec<(String, usize, Instant)>, usize);

/// Documents open, and those closed recently (their last text still a source of snippets).
#[derive(Default)]
pub struct Docs {
    /// Open documents by URI.
    pub open: HashMap<String, Doc>,
    /// Newest last; at most [`RECENT`].
    closed: Vec<(String, String, Instant)>,
}

/// Closed documents kept as snippet sources.
const RECENT: usize = 8;

impl Docs {
    /// Opens (or reopens) `uri` with `text`; `floor` is the least debounce.
    pub fn open(&mut self, uri: &str, text: &str, floor: Duration) {
        self.closed.retain(|(u, _, _)| u != uri);
        let doc = Doc {
            text: text.to_owned(),
            edited: Instant::now(),
            rhythm: Debounce::new(floor, Duration::from_millis(150).max(floor)),
            snippets: None,
        };
        self.open.insert(uri.to_owned(), doc);
    }

    /// Closes `uri`, keeping its last text as a snippet source.
    pub fn close(&mut self, uri: &str) {
        if let Some(doc) = self.open.remove(uri) {
            if self.closed.len() == RECENT {
                self.closed.remove(0);
            }
            self.closed.push((uri.to_owned(), doc.text, doc.edited));
        }
    }

    /// The document's text, its neighbour snippets, and the debounce. The snippets are picked
    /// for the file, not the cursor (see `caret_complete::neighbours`), and kept until another
    /// document changes or this one grows or shrinks by [`REPICK_BYTES`]: a prompt's head stays
    /// put while the user moves and types.
    pub fn prepare(&mut self, uri: &str, root: Option<&Path>) -> Option<(String, Vec<Snippet>, Duration)> {
        // Other documents, most recently changed first.
        let mut others: Vec<(&str, &str, Instant)> = self
            .open
            .iter()
            .filter(|(u, _)| *u != uri)
            .map(|(u, d)| (u.as_str(), d.text.as_str(), d.edited))
            .chain(self.closed.iter().map(|(u, t, e)| (u.as_str(), t.as_str(), *e)))
            .collect();
        others.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(b.0)));
        let doc = self.open.get(uri)?;
        let key: SnippetKey =
            (others.iter().map(|(u, t, e)| ((*u).to_owned(), t.len(), *e)).collect(), doc.text.len() / REPICK_BYTES);
        let snippets = match &doc.snippets {
            Some((k, s)) if *k == key => s.clone(),
            _ => {
                let paths: Vec<String> = others.iter().map(|(u, _, _)| relative(u, root)).collect();
                let neighbours: Vec<Neighbour<'_>> =
                    others.iter().zip(&paths).map(|((_, text, _), path)| Neighbour { path, text }).collect();
                caret_complete::neighbours::pick(&doc.text, &neighbours, Picking::default())
            }
        };
        let doc = self.open.get_mut(uri)?;
        doc.snippets = Some((key, snippets.clone()));
        Some((doc.text.clone(), snippets, doc.rhythm.delay()))
    }
}

/// A document's path for the prompt: relative to the workspace root when under it, else its
/// file name.
pub fn relative(uri: &str, root: Option<&Path>) -> String {
    let path = uri_to_path(uri);
    if let (Some(p), Some(r)) = (&path, root)
        && let Ok(rel) = p.strip_prefix(r)
    {
        return rel.to_string_lossy().into_owned();
    }
    uri.rsplit('/').next().unwrap_or(uri).to_owned()
}

/// The path of a `file://` URI (percent-decoded); `None` for other schemes.
pub fn uri_to_path(uri: &str) -> Option<PathBuf> {
    let rest = uri.strip_prefix("file://")?;
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    let bytes = rest.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (bytes.get(i + 1).and_then(|&b| hex(b)), bytes.get(i + 2).and_then(|&b| hex(b)))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(PathBuf::from(String::from_utf8(out).ok()?))
}

/// The `file://` URI of an absolute path (characters other than unreserved ones and `/`
/// percent-encoded).
pub fn path_to_uri(path: &Path) -> String {
    let mut out = String::from("file://");
    for b in path.to_string_lossy().bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Files of the workspace at `root` (walked as indexing walks it: ignore files honoured)
/// where `name` stands as a whole identifier, as (path relative to `root`, text), first by
/// path, at most `limit`, leaving out `skip` (relative paths: the open files, looked at
/// already). Files over 1 MiB or not UTF-8 are passed over. For a rename carried past the
/// open files (blocking: a walk and reads).
pub fn workspace_uses(
    walk: &caret_workspace::walk::WalkConfig,
    root: &Path,
    name: &str,
    skip: &[String],
    limit: usize,
) -> Vec<(String, String)> {
    let Ok(walked) = caret_workspace::walk::walk(root, walk) else { return Vec::new() };
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for f in walked.files {
        if out.len() >= limit {
            break;
        }
        let rel = f.path.as_path().to_string_lossy().into_owned();
        if f.stat.size > 1 << 20 || skip.contains(&rel) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(f.path.under(root)) else { continue };
        let whole = text.match_indices(name).any(|(at, _)| {
            !text[..at].chars().next_back().is_some_and(is_word)
                && !text[at + name.len()..].chars().next().is_some_and(is_word)
        });
        if whole {
            out.push((rel, text));
        }
    }
    out
}
