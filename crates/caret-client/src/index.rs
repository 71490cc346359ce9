//! Embedding and searching from the client side.
//!
//! [`embed_missing`] asks the server which chunks of current files lack vectors, reads and
//! chunks those files again (the server keeps no text), and sends the texts in batches,
//! reporting progress. [`search`] sends the query, then maps the obfuscated hits back to real
//! paths with the client's path map, re-chunks each file to check the chunk is still there
//! (a stale hit is dropped, never shown with wrong lines), and returns current snippets.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use caret_crypto::ServerKey;
use caret_protocol::{ChunkText, EmbedRequest, MissingVector, SearchMode, SearchRequest};
use caret_workspace::scan::{Scanner, chunk_is_withheld};
use caret_workspace::{ContentHash, RelPath};
use rayon::prelude::*;
use serde::Serialize;

use crate::state::WorkspaceState;
use crate::transport::Transport;
use crate::{Error, Result};

/// A chunk of a file as it is on disk now.
#[derive(Debug, Clone)]
pub struct CurrentChunk {
    /// Keyed chunk id (hex).
    pub id: String,
    /// First line, 1-based.
    pub start_line: u32,
    /// Last line, 1-based, inclusive.
    pub end_line: u32,
    /// Context lines and text, as sent for indexing.
    pub text: ChunkText,
}

/// Reads and chunks a file, keying each chunk id; chunks with secrets are left out. `None`
/// when the file cannot be read as text now.
pub fn current_chunks(
    scanner: &Scanner,
    root: &std::path::Path,
    real: &RelPath,
    key: &ServerKey,
) -> Option<Vec<CurrentChunk>> {
    let bytes = std::fs::read(real.under(root)).ok()?;
    let text = std::str::from_utf8(&bytes).ok()?;
    Some(current_chunks_of(scanner, real, text, key))
}

/// Chunks `text` (the contents of `real`) and keys each chunk id; chunks with secrets are
/// left out.
pub fn current_chunks_of(scanner: &Scanner, real: &RelPath, text: &str, key: &ServerKey) -> Vec<CurrentChunk> {
    let ids = key.chunk_ids();
    let (chunks, findings) = scanner.chunk_text(real, text);
    chunks
        .iter()
        .filter(|c| !chunk_is_withheld(c, &findings))
        .map(|c| {
            let id = ContentHash(ids.id(&c.hash.0)).to_hex();
            CurrentChunk {
                id: id.clone(),
                start_line: c.start_line,
                end_line: c.end_line,
                text: ChunkText {
                    id,
                    context: c.context.clone(),
                    text: c.text(text).to_owned(),
                    defines: c.defines.clone(),
                },
            }
        })
        .collect()
}

/// A file read for a search: its text, its keyed leaf, and its chunks once needed.
struct OnDisk {
    text: String,
    leaf: String,
    chunks: Option<Vec<CurrentChunk>>,
    /// Its top-level definitions and their lines, when the reranking needs them.
    names: Vec<(String, u32)>,
}

impl OnDisk {
    /// `None` when the file cannot be read as text now.
    fn read(root: &std::path::Path, real: &RelPath, leaves: &caret_crypto::LeafKey, fingerprint: &str) -> Option<Self> {
        let bytes = std::fs::read(real.under(root)).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        let leaf = ContentHash(leaves.leaf(&ContentHash::of(text.as_bytes()).0, fingerprint)).to_hex();
        Some(OnDisk { text, leaf, chunks: None, names: Vec::new() })
    }
}

/// Lines `start..=end` (1-based) of `text`, without the final newline.
fn lines(text: &str, start: u32, end: u32) -> String {
    let skip = start.saturating_sub(1) as usize;
    let take = (end.saturating_sub(start) + 1) as usize;
    text.lines().skip(skip).take(take).collect::<Vec<_>>().join("\n")
}

/// Progress of [`embed_missing`].
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct EmbedProgress {
    /// Distinct chunks of current files.
    pub total: u64,
    /// Chunks with vectors.
    pub done: u64,
    /// Chunks embedded by this run.
    pub embedded: u64,
    /// Chunks that could not be sent (their file changed or vanished since the sync).
    pub stale: u64,
    /// Per stage (`caret_store::STAGES`: code, tests, the rest, embedded in that order):
    /// distinct chunks, and those with vectors.
    pub stages: [(u64, u64); 3],
}

impl EmbedProgress {
    /// The stages whose chunks all have vectors, in order, while later ones may not.
    pub fn stages_done(&self) -> impl Iterator<Item = &'static str> + '_ {
        caret_store::STAGES.iter().zip(self.stages).filter(|(_, (total, with))| with >= total).map(|(n, _)| *n)
    }

    /// Counts one embedded chunk in the first stage that still lacks vectors (chunks come in
    /// stage order).
    fn count_embedded(&mut self, n: u64) {
        let mut n = n;
        for (total, with) in &mut self.stages {
            let take = n.min(total.saturating_sub(*with));
            *with += take;
            n -= take;
        }
    }
}

/// What [`embed_missing`] did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EmbedReport {
    /// The server's model (`None`: it has none; search is lexical only).
    pub model: Option<String>,
    /// The final progress.
    pub progress: EmbedProgress,
    /// Seconds spent.
    pub seconds: f64,
}

/// Chunks per embed request: a few seconds of work for a CPU model.
pub const EMBED_BATCH: usize = 64;

/// Has every chunk that lacks a vector embedded, in batches, calling `progress` after each:
/// chunks whose texts the server still holds from their commit are asked for by count
/// (nothing sent), the rest (and those it no longer holds) are read from disk and sent.
pub async fn embed_missing(
    scanner: Arc<Scanner>,
    ws: &WorkspaceState,
    transport: &dyn Transport,
    mut progress: impl FnMut(&EmbedProgress),
) -> Result<EmbedReport> {
    let started = std::time::Instant::now();
    let key = ws.key.server_key();
    let paths: HashMap<String, RelPath> = ws.load_path_map()?.into_iter().collect();
    let mut report = EmbedReport::default();
    let mut tried: HashSet<String> = HashSet::new();
    loop {
        let missing = transport.missing_vectors(&ws.id, 2_000).await?;
        report.model = missing.model.clone();
        report.progress.total = missing.total;
        report.progress.done = missing.total - missing.missing_total;
        for (slot, stage) in report.progress.stages.iter_mut().zip(&missing.stages) {
            *slot = (stage.total, stage.total - stage.missing);
        }
        progress(&report.progress);
        if missing.model.is_none() {
            break;
        }
        // The server lists them stage by stage (code, tests, the rest): each one's stage from
        // its place in the list, so that a stage is embedded whole before the next begins.
        let ends: Vec<u64> = missing
            .stages
            .iter()
            .scan(0u64, |end, s| {
                *end += s.missing;
                Some(*end)
            })
            .collect();
        let stage_at = |i: usize| ends.iter().position(|end| (i as u64) < *end).unwrap_or(ends.len());
        let stage_of: HashMap<String, usize> =
            missing.missing.iter().enumerate().map(|(i, m)| (m.id.clone(), stage_at(i))).collect();
        let fresh: Vec<_> = missing.missing.into_iter().filter(|m| !tried.contains(&m.id)).collect();
        if fresh.is_empty() {
            break;
        }
        tried.extend(fresh.iter().map(|m| m.id.clone()));
        // Chunks whose texts the server still holds from their commit: asked for by count,
        // nothing sent. If it embeds none (it restarted, or another replica answered), the
        // rest of them are sent after all.
        let (held, mut fresh): (Vec<MissingVector>, Vec<MissingVector>) = fresh.into_iter().partition(|m| m.held);
        let mut asked = 0;
        while asked < held.len() {
            let n = (held.len() - asked).min(EMBED_BATCH);
            let held_next = u32::try_from(n).unwrap_or(u32::MAX);
            let r = transport.embed(&ws.id, &key, EmbedRequest { chunks: Vec::new(), held_next }).await?;
            report.progress.embedded += r.embedded;
            report.progress.done += r.embedded;
            report.progress.count_embedded(r.embedded);
            progress(&report.progress);
            if r.embedded == 0 {
                break;
            }
            asked += n;
        }
        if asked < held.len() {
            // Not necessarily those it did not embed: the next listing says which are left.
            tried.retain(|id| !held.iter().any(|m| &m.id == id));
            if asked == 0 {
                fresh.extend(held);
            } else {
                continue;
            }
        }
        if fresh.is_empty() {
            continue;
        }
        // Read and chunk the files that hold them, in parallel off the runtime.
        let wanted: HashSet<String> = fresh.iter().map(|m| m.id.clone()).collect();
        let mut files: Vec<RelPath> = fresh.iter().filter_map(|m| paths.get(&m.path).cloned()).collect();
        files.sort();
        files.dedup();
        let (root, scanner2, key2, wanted2) = (ws.root.clone(), scanner.clone(), key.clone(), wanted.clone());
        let mut texts: Vec<ChunkText> = tokio::task::spawn_blocking(move || {
            let mut seen = HashSet::new();
            files
                .par_iter()
                .filter_map(|real| current_chunks(&scanner2, &root, real, &key2))
                .collect::<Vec<_>>()
                .into_iter()
                .flatten()
                .filter(|c| wanted2.contains(&c.id) && seen.insert(c.id.clone()))
                .map(|c| c.text)
                .collect()
        })
        .await
        .map_err(|e| Error::Internal(format!("chunking task: {e}")))?;
        report.progress.stale += (wanted.len() - texts.len()) as u64;
        // By stage, then similar lengths together: the server pads each batch to its longest.
        texts.sort_by_key(|t| {
            (stage_of.get(&t.id).copied().unwrap_or(0), t.text.len() + t.context.iter().map(String::len).sum::<usize>())
        });
        while !texts.is_empty() {
            let rest = texts.split_off(texts.len().min(EMBED_BATCH));
            let batch = std::mem::replace(&mut texts, rest);
            let r = transport.embed(&ws.id, &key, EmbedRequest { chunks: batch, held_next: 0 }).await?;
            report.progress.embedded += r.embedded;
            report.progress.done += r.embedded;
            report.progress.count_embedded(r.embedded);
            progress(&report.progress);
        }
    }
    transport.settle(&ws.id).await?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// A search hit on the client: real path and current text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hit {
    /// Path relative to the workspace root, `/`-separated.
    pub path: String,
    /// First line, 1-based.
    pub start_line: u32,
    /// Last line, 1-based, inclusive.
    pub end_line: u32,
    /// Fused score, higher is better.
    pub score: f32,
    /// The chunk's current text.
    pub snippet: String,
}

/// What a search found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SearchOutcome {
    /// Hits, best first.
    pub hits: Vec<Hit>,
    /// Whether vectors took part.
    pub semantic: bool,
    /// Distinct chunks of current files on the server.
    pub embeddable: u64,
    /// How many have vectors.
    pub embedded: u64,
    /// Hits dropped because the file changed since the last sync.
    pub stale: u64,
}

/// What the client adds to the server's ranking, knowing what the server must not: the real
/// paths and code.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rerank {
    /// A hit's score grows by this share for each of the query's words its path holds
    /// (`read_to_string.rs` for "read a file into a string").
    pub path: f32,
    /// A file whose hit defines a name that a better hit uses gains this share of a score
    /// (see [`credit_definers`]).
    pub uses: f32,
    /// Above zero, path words meet inflections (`compressed` and `compression.go`); else
    /// only plurals are folded.
    pub stem: f32,
    /// A long file's hits lose this much per natural log of its length past
    /// [`LONG_FILE_LINES`] (see [`discount_long_files`]); 0: none.
    pub size: f32,
    /// A hit whose lines meeting the query's words are comments (a long explanation rather
    /// than the code) is divided by `1 + comments × share` (see
    /// [`discount_comment_matches`]); 0: none.
    pub comments: f32,
}

impl Default for Rerank {
    fn default() -> Self {
        Rerank { path: 0.15, uses: 0.2, stem: 1.0, size: 0.0, comments: 0.0 }
    }
}

/// How many of the best hits take part in crediting definers.
const USES_WINDOW: usize = 20;

/// Shortest name that links a use to its definition: shorter ones (`get`, `Q`, `run`) are
/// defined in too many places to say which one a chunk means.
const USES_MIN_NAME: usize = 4;

/// A definition outranks its uses: among the best [`USES_WINDOW`] hits, a hit whose code
/// uses a name that another hit defines at its file's top level (a class, a function, a
/// type — what other files import) lends that file's hits `weight` × the lesser of its own
/// score and the defining file's best. So the module that merely calls the answer no longer
/// beats it by a hair. Only a definition that is itself a hit counts (a name the question
/// matches, not every helper the user calls: pytest's plugins all use its cache and config,
/// and the plugin is still the answer), and the lesser score bounds the gain so a hub that
/// matches poorly stays down. A name the using file defines itself is its own, not a use;
/// hits whose file changed since it was indexed take no part.
fn credit_definers(
    hits: &mut [caret_protocol::SearchHit],
    files: &HashMap<String, (RelPath, Option<OnDisk>)>,
    weight: f32,
) {
    let top = hits.len().min(USES_WINDOW);
    let mut definers: HashMap<&str, Vec<&RelPath>> = HashMap::new();
    for (obfuscated, (real, file)) in files {
        let Some(file) = file else { continue };
        let ranges: Vec<(u32, u32)> = hits[..top]
            .iter()
            .filter(|h| h.path == *obfuscated && h.leaf == file.leaf)
            .map(|h| (h.start_line, h.end_line))
            .collect();
        for (name, line) in &file.names {
            let in_hit = ranges.iter().any(|(a, b)| (a..=b).contains(&line));
            if in_hit && name.chars().count() >= USES_MIN_NAME {
                definers.entry(name.as_str()).or_default().push(real);
            }
        }
    }
    let mut credit: HashMap<&RelPath, f32> = HashMap::new();
    for h in &hits[..top] {
        let Some((real, Some(file))) = files.get(&h.path) else { continue };
        if file.leaf != h.leaf {
            continue;
        }
        let own: HashSet<&str> = file.names.iter().map(|(n, _)| n.as_str()).collect();
        let text = lines(&file.text, h.start_line, h.end_line);
        let used: HashSet<&str> =
            text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$')).filter(|w| !w.is_empty()).collect();
        for name in used.into_iter().filter(|n| !own.contains(n)) {
            for definer in definers.get(name).into_iter().flatten().filter(|d| **d != real) {
                let best = credit.entry(definer).or_insert(0.0);
                *best = best.max(h.score);
            }
        }
    }
    // A file's own best score bounds what it gains: a hub that many hits use but that
    // matches the question poorly stays where it is.
    let mut own_best: HashMap<&str, f32> = HashMap::new();
    for h in hits.iter() {
        let best = own_best.entry(h.path.as_str()).or_insert(0.0);
        *best = best.max(h.score);
    }
    let gains: HashMap<String, f32> = files
        .iter()
        .filter_map(|(obfuscated, (real, _))| {
            let own = own_best.get(obfuscated.as_str()).copied().unwrap_or(0.0);
            Some((obfuscated.clone(), weight * credit.get(real)?.min(own)))
        })
        .collect();
    for h in hits.iter_mut() {
        h.score += gains.get(&h.path).copied().unwrap_or(0.0);
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
}

/// Files longer than this many lines are discounted by [`Rerank::size`].
const LONG_FILE_LINES: f32 = 300.0;

/// A file is not the answer just for being long: among the hits whose file was read, each
/// is divided by `1 + weight × ln(lines / LONG_FILE_LINES)` when its file is longer than
/// that. A hub that mentions everything (a 3,000-line model) no longer outranks the small
/// module that implements the one thing asked. A file named after one of the query's `words`
/// (`Parser.java` for a question on parsing) is spared: it is long because the thing asked is.
fn discount_long_files(
    hits: &mut [caret_protocol::SearchHit],
    files: &HashMap<String, (RelPath, Option<OnDisk>)>,
    words: &[String],
    inflections: bool,
    weight: f32,
) {
    for h in hits.iter_mut() {
        let Some((real, Some(file))) = files.get(&h.path) else { continue };
        let real = String::from_utf8_lossy(real.as_bytes());
        let name = real.rsplit('/').next().unwrap_or(&real);
        if path_matches(words, name, inflections) > 0 {
            continue;
        }
        let lines = file.text.lines().count() as f32;
        if lines > LONG_FILE_LINES {
            h.score /= 1.0 + weight * (lines / LONG_FILE_LINES).ln();
        }
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
}

/// A chunk is not the answer for explaining it: among the best [`USES_WINDOW`] hits whose
/// file was read (and has not changed since it was indexed), each is divided by
/// `1 + weight × share` when most of its lines are comments (doc comments, block comments,
/// docstrings), where `share` is the part of the query's words met in the chunk that stand on
/// comment lines. Documented code and a hit that matches only in code keep their score; an
/// explanation that matches only in its prose loses the most.
fn discount_comment_matches(
    hits: &mut [caret_protocol::SearchHit],
    files: &HashMap<String, (RelPath, Option<OnDisk>)>,
    words: &[String],
    inflections: bool,
    weight: f32,
) {
    let top = hits.len().min(USES_WINDOW);
    let mut masks: HashMap<String, Option<Vec<bool>>> = HashMap::new();
    for h in hits[..top].iter_mut() {
        let Some((real, Some(file))) = files.get(&h.path) else { continue };
        if file.leaf != h.leaf {
            continue;
        }
        let mask = masks
            .entry(h.path.clone())
            .or_insert_with(|| crate::comments::comment_lines(&String::from_utf8_lossy(real.as_bytes()), &file.text));
        let Some(mask) = mask else { continue };
        let (mut code, mut comment) = (0usize, 0usize);
        let first = h.start_line.saturating_sub(1) as usize;
        let count = (h.end_line.saturating_sub(h.start_line) + 1) as usize;
        // Documented code (a doc comment over its function) is code: only a chunk that is
        // mostly prose counts as an explanation.
        let prose = mask.iter().skip(first).take(count).filter(|c| **c).count();
        if prose * 2 <= count {
            continue;
        }
        for (i, line) in file.text.lines().enumerate().skip(first).take(count) {
            let mut met = 0;
            caret_store::lexical::terms(line, |t| met += usize::from(words.contains(&stem(t, inflections))));
            if mask.get(i).copied().unwrap_or(false) {
                comment += met;
            } else {
                code += met;
            }
        }
        if comment > 0 {
            h.score /= 1.0 + weight * comment as f32 / (code + comment) as f32;
        }
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
}

/// Words too common in questions to say anything about a path.
const STOPWORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "each", "for", "from", "how", "if", "in",
    "into", "is", "it", "its", "of", "on", "one", "or", "that", "the", "their", "them", "then", "there", "this", "to",
    "what", "when", "where", "which", "with", "without",
];

/// A word as compared with path words: lowercase, and inflections off so that a question's
/// word meets a file named after the same concept (`compressed`, `compression` and
/// `compress.rs`; `reducers.rs` and `reduce`; `parser.rs` and `parsing`). Both sides are cut the
/// same way, so the cut need not be a word; a stem keeps at least three letters.
fn stem(word: &str, inflections: bool) -> String {
    let mut w = word.to_lowercase();
    for suffix in ["ies", "s"] {
        if let Some(rest) = w.strip_suffix(suffix)
            && rest.len() >= 3
            && !rest.ends_with('s')
        {
            w = if suffix == "ies" { format!("{rest}y") } else { rest.to_owned() };
            break;
        }
    }
    if !inflections {
        return w;
    }
    for suffix in ["ation", "ition", "ion", "ing", "er", "ed", "e"] {
        if let Some(rest) = w.strip_suffix(suffix)
            && rest.chars().count() >= 3
        {
            w = rest.to_owned();
            break;
        }
    }
    w
}

/// The query's words worth looking for in paths.
fn path_words_of_query(query: &str, inflections: bool) -> Vec<String> {
    let mut words = Vec::new();
    caret_store::lexical::terms(query, |t| {
        if t.len() >= 2 && !STOPWORDS.contains(&t) {
            let s = stem(t, inflections);
            if !words.contains(&s) {
                words.push(s);
            }
        }
    });
    words
}

/// How many of `words` the path's directories and file name hold.
fn path_matches(words: &[String], path: &str, inflections: bool) -> usize {
    let mut parts = std::collections::HashSet::new();
    let without_ext = path.rsplit_once('.').map_or(path, |(stem, ext)| if ext.contains('/') { path } else { stem });
    caret_store::lexical::terms(without_ext, |t| {
        parts.insert(stem(t, inflections));
    });
    words.iter().filter(|w| parts.contains(*w)).count()
}

/// Searches the workspace and maps the hits back to current code, reranked by what only the
/// client knows (`rerank`: the real paths).
#[tracing::instrument(name = "search", skip_all, fields(k, mode = ?mode))]
pub async fn search(
    scanner: Arc<Scanner>,
    ws: &WorkspaceState,
    transport: &dyn Transport,
    query: &str,
    k: usize,
    mode: SearchMode,
    rerank: Rerank,
) -> Result<SearchOutcome> {
    let key = ws.key.server_key();
    // Ask for more than k: some hits may be stale, and the reranking may lift later ones.
    let asked = u32::try_from((k * 2 + 10).clamp(50, 1000)).unwrap_or(1000);
    let mut response =
        transport.search(&ws.id, &key, &SearchRequest { query: query.to_owned(), k: asked, mode }).await?;
    let paths: HashMap<String, RelPath> = ws.load_path_map()?.into_iter().collect();
    let inflections = rerank.stem > 0.0;
    let words = path_words_of_query(query, inflections);
    if rerank.path > 0.0 {
        for h in &mut response.hits {
            if let Some(real) = paths.get(&h.path) {
                let matched = path_matches(&words, &String::from_utf8_lossy(real.as_bytes()), inflections);
                h.score *= 1.0 + rerank.path * matched as f32;
            }
        }
        response.hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    }
    let mut outcome = SearchOutcome {
        semantic: response.semantic,
        embeddable: response.embeddable,
        embedded: response.embedded,
        ..SearchOutcome::default()
    };
    let root = ws.root.clone();
    let leaves = ws.key.leaves();
    let (hits, stale) = tokio::task::spawn_blocking(move || {
        let fingerprint = scanner.content_fingerprint();
        // Files by obfuscated path: the real one and its text.
        let mut files: HashMap<String, (RelPath, Option<OnDisk>)> = HashMap::new();
        if rerank.uses > 0.0 || rerank.size > 0.0 || rerank.comments > 0.0 {
            let mut wanted: Vec<(String, RelPath)> = Vec::new();
            for h in response.hits.iter().take(USES_WINDOW) {
                if let Some(real) = paths.get(&h.path)
                    && !wanted.iter().any(|(o, _)| *o == h.path)
                {
                    wanted.push((h.path.clone(), real.clone()));
                }
            }
            let read: Vec<_> = wanted
                .into_par_iter()
                .map(|(obfuscated, real)| {
                    let file = OnDisk::read(&root, &real, &leaves, &fingerprint).map(|mut f| {
                        f.names = caret_workspace::chunk::top_level_names(&real, &f.text);
                        f
                    });
                    (obfuscated, (real, file))
                })
                .collect();
            files.extend(read);
            if rerank.size > 0.0 {
                discount_long_files(&mut response.hits, &files, &words, inflections, rerank.size);
            }
            if rerank.comments > 0.0 {
                discount_comment_matches(&mut response.hits, &files, &words, inflections, rerank.comments);
            }
            if rerank.uses > 0.0 {
                credit_definers(&mut response.hits, &files, rerank.uses);
            }
        }
        let mut out = Vec::new();
        let mut stale = 0u64;
        for h in response.hits {
            if out.len() == k {
                break;
            }
            let Some(real) = paths.get(&h.path) else {
                stale += 1;
                continue;
            };
            let (_, file) = files
                .entry(h.path.clone())
                .or_insert_with(|| (real.clone(), OnDisk::read(&root, real, &leaves, &fingerprint)));
            let Some(file) = file.as_mut() else {
                stale += 1;
                continue;
            };
            let found = if file.leaf == h.leaf {
                // The file is exactly as indexed: the server's lines are right.
                Some((h.start_line, h.end_line, lines(&file.text, h.start_line, h.end_line)))
            } else {
                // It changed since the sync: keep the hit only if the chunk is still there.
                let text = &file.text;
                let chunks = file.chunks.get_or_insert_with(|| current_chunks_of(&scanner, real, text, &key));
                chunks
                    .iter()
                    .find(|c| c.id == h.id && c.start_line == h.start_line)
                    .or_else(|| chunks.iter().find(|c| c.id == h.id))
                    .map(|c| (c.start_line, c.end_line, c.text.text.clone()))
            };
            match found {
                Some((start_line, end_line, snippet)) => out.push(Hit {
                    path: String::from_utf8_lossy(real.as_bytes()).into_owned(),
                    start_line,
                    end_line,
                    score: h.score,
                    snippet,
                }),
                None => stale += 1,
            }
        }
        (out, stale)
    })
    .await
    .map_err(|e| Error::Internal(format!("search task: {e}")))?;
    outcome.hits = hits;
    outcome.stale = stale;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_chunks_fill_the_stages_in_order() {
        let mut p = EmbedProgress { stages: [(3, 1), (2, 0), (4, 0)], ..EmbedProgress::default() };
        assert_eq!(p.stages_done().count(), 0);
        p.count_embedded(3);
        assert_eq!(p.stages, [(3, 3), (2, 1), (4, 0)]);
        assert_eq!(p.stages_done().collect::<Vec<_>>(), ["code"]);
        p.count_embedded(10);
        assert_eq!(p.stages, [(3, 3), (2, 2), (4, 4)], "never past a stage's total");
        assert_eq!(p.stages_done().count(), 3);
    }

    #[test]
    fn paths_are_matched_on_the_questions_words() {
        let words = path_words_of_query("Read a whole file into a String asynchronously", true);
        assert_eq!(words, ["read", "whol", "fil", "str", "asynchronously"], "stems, not words");
        assert_eq!(path_matches(&words, "src/fs/read_to_string.rs", true), 2);
        assert_eq!(path_matches(&words, "src/io/util/read_line.rs", true), 1);
        assert_eq!(path_matches(&words, "src/net/udp.rs", true), 0);
        // Plurals meet singulars; the extension is not a word of the path.
        let words = path_words_of_query("where are tokens checked", true);
        assert_eq!(path_matches(&words, "server/token.py", true), 1);
        assert_eq!(path_matches(&words, "server/checked.py", true), 1);
        assert_eq!(path_matches(&path_words_of_query("python files", true), "a/b.py", true), 0);
        // Inflections meet the file named after the concept.
        let words = path_words_of_query("reduce values after parsing compressed data", true);
        assert_eq!(path_matches(&words, "src/math/reducers.rs", true), 1);
        assert_eq!(path_matches(&words, "src/parser.rs", true), 1);
        assert_eq!(path_matches(&words, "lib/compression.go", true), 1);
        assert_eq!(path_matches(&words, "src/user.rs", true), 0, "a stem keeps three letters: `use`, not `us`");
    }

    fn hit(path: &str, lines: (u32, u32), score: f32) -> caret_protocol::SearchHit {
        caret_protocol::SearchHit {
            path: path.to_owned(),
            start_line: lines.0,
            end_line: lines.1,
            id: String::new(),
            leaf: format!("leaf-{path}"),
            kind: "code".to_owned(),
            score,
            lexical_rank: None,
            vector_rank: None,
        }
    }

    fn on_disk(path: &str, text: &str) -> (String, (RelPath, Option<OnDisk>)) {
        let real = RelPath::from_bytes(path);
        let names = caret_workspace::chunk::top_level_names(&real, text);
        let file = OnDisk { text: text.to_owned(), leaf: format!("leaf-{path}"), chunks: None, names };
        (path.to_owned(), (real, Some(file)))
    }

    fn ranked(
        mut hits: Vec<caret_protocol::SearchHit>,
        files: &HashMap<String, (RelPath, Option<OnDisk>)>,
    ) -> Vec<String> {
        credit_definers(&mut hits, files, 0.2);
        hits.into_iter().map(|h| format!("{}:{}", h.path, h.start_line)).collect()
    }

    #[test]
    fn a_definition_that_is_a_hit_outranks_the_code_that_uses_it() {
        let views = "from pager import Paginator\n\ndef list_view(items):\n    return Paginator(items).page(1)\n";
        let pager = "class Paginator:\n    def page(self, n):\n        return n\n\ndef helper():\n    pass\n";
        let files: HashMap<_, _> = [on_disk("views.py", views), on_disk("pager.py", pager)].into_iter().collect();
        // The user first by a hair, the class that it uses a hit too: the definer comes first.
        let hits = vec![hit("views.py", (3, 4), 1.0), hit("pager.py", (1, 3), 0.9), hit("pager.py", (5, 6), 0.5)];
        assert_eq!(ranked(hits, &files), ["pager.py:1", "views.py:3", "pager.py:5"]);
        // By more than the share: the order stays.
        let hits = vec![hit("views.py", (3, 4), 1.0), hit("pager.py", (1, 3), 0.7)];
        assert_eq!(ranked(hits, &files), ["views.py:3", "pager.py:1"]);
        // The definition is not a hit (only another part of its file is): no credit.
        let hits = vec![hit("views.py", (3, 4), 1.0), hit("pager.py", (5, 6), 0.9)];
        assert_eq!(ranked(hits, &files), ["views.py:3", "pager.py:5"]);
        // The user changed since it was indexed: it lends nothing.
        let mut stale = hit("views.py", (3, 4), 1.0);
        stale.leaf = "another".to_owned();
        assert_eq!(ranked(vec![stale, hit("pager.py", (1, 3), 0.9)], &files), ["views.py:3", "pager.py:1"]);
    }

    #[test]
    fn own_and_short_names_are_not_uses() {
        // `views.py` defines its own `Paginator` and calls `run`: neither is a use of `pager.py`.
        let views = "class Paginator:\n    pass\n\ndef list_view(items):\n    return Paginator(items), run()\n";
        let pager = "class Paginator:\n    pass\n\ndef run():\n    pass\n";
        let files: HashMap<_, _> = [on_disk("views.py", views), on_disk("pager.py", pager)].into_iter().collect();
        let hits = vec![hit("views.py", (4, 5), 1.0), hit("pager.py", (1, 5), 0.9)];
        assert_eq!(ranked(hits, &files), ["views.py:4", "pager.py:1"]);
    }

    #[test]
    fn a_chunk_that_only_explains_loses_to_the_one_that_implements() {
        let guide =
            "/// Retries a request with backoff.\n/// Each retry waits twice as long as the last.\nfn other() {}\n";
        let code = "fn retry_with_backoff(request: Request) {\n    let wait = backoff.next();\n}\n";
        let files: HashMap<_, _> = [on_disk("guide.rs", guide), on_disk("retry.rs", code)].into_iter().collect();
        let words = path_words_of_query("retry a request with backoff", true);
        let mut hits = vec![hit("guide.rs", (1, 3), 1.0), hit("retry.rs", (1, 3), 0.9), hit("notes.md", (1, 2), 0.8)];
        discount_comment_matches(&mut hits, &files, &words, true, 0.5);
        let order: Vec<&str> = hits.iter().map(|h| h.path.as_str()).collect();
        assert_eq!(order, ["retry.rs", "notes.md", "guide.rs"], "{hits:?}");
        assert_eq!(hits[0].score, 0.9, "matches in code only: unchanged");
        assert!((hits[2].score - 1.0 / 1.5).abs() < 1e-6, "matches in comments only: divided by 1.5");
    }

    #[test]
    fn a_long_file_does_not_win_for_its_length() {
        let hub: String = (0..3000).map(|i| format!("line {i}\n")).collect();
        let module: String = (0..120).map(|i| format!("line {i}\n")).collect();
        let files: HashMap<_, _> = [on_disk("model.go", &hub), on_disk("cache.go", &module)].into_iter().collect();
        let mut hits =
            vec![hit("model.go", (1, 40), 1.0), hit("cache.go", (1, 40), 0.9), hit("unread.go", (1, 9), 0.8)];
        let words = path_words_of_query("how is the cache filled", true);
        let mut named = hits.clone();
        discount_long_files(&mut hits, &files, &words, true, 0.1);
        let order: Vec<&str> = hits.iter().map(|h| h.path.as_str()).collect();
        assert_eq!(order, ["cache.go", "model.go", "unread.go"], "3,000 lines: divided by 1 + 0.1 × ln 10");
        assert!((hits[1].score - 1.0 / (1.0 + 0.1 * 10f32.ln())).abs() < 1e-6);
        assert_eq!(hits[0].score, 0.9, "short files keep their score");
        // A long file named after the question's subject keeps its score.
        let words = path_words_of_query("where is the model loaded", true);
        discount_long_files(&mut named, &files, &words, true, 0.1);
        assert_eq!(named[0].path, "model.go");
        assert_eq!(named[0].score, 1.0);
    }
}
