//! Fuzz targets: one function per parser that reads input from outside the process, each
//! asserting the invariants that matter for it (beyond "no panic"). `fuzz/` runs them under
//! libFuzzer (`cargo +nightly fuzz run NAME`); the test suite runs each for a few seconds
//! with [`mutate`], starting from the seed corpus in `fuzz/corpus/NAME/`.
//!
//! A target takes raw bytes and shapes them itself (a selector byte, a split point): the
//! same bytes always mean the same case, so any failure replays from its file.

pub mod http;
pub mod mutate;

use std::sync::Arc;

use caret_workspace::RelPath;
use caret_workspace::chunk::{ChunkConfig, Chunker, top_level_names};
use caret_workspace::tokens::{Estimate, TokenCounter as _, WordPiece};

/// A fuzz target: its name (the corpus directory, the libFuzzer binary) and body.
pub struct Target {
    /// Name, as in `fuzz/fuzz_targets/NAME.rs`.
    pub name: &'static str,
    /// Runs one input; panics on a broken invariant.
    pub run: fn(&[u8]),
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target { name: "chunker", run: chunker },
    Target { name: "secrets", run: secrets },
    Target { name: "edit_formats", run: edit_formats },
    Target { name: "search_replace_one_place", run: search_replace_one_place },
    Target { name: "tokenizer", run: tokenizer },
    Target { name: "tokenizer_json", run: tokenizer_json },
    Target { name: "ignore_files", run: ignore_files },
    Target { name: "stat_cache", run: stat_cache },
    Target { name: "log_object", run: log_object },
    Target { name: "segment", run: segment },
    Target { name: "stored_indexes", run: stored_indexes },
    Target { name: "model_streams", run: model_streams },
    Target { name: "local_tool_calls", run: local_tool_calls },
    Target { name: "http_api", run: http::http_api },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The first byte chooses among `n` cases; the rest is the input. `None` for no bytes.
fn select(data: &[u8], n: usize) -> Option<(usize, &[u8])> {
    let (&first, rest) = data.split_first()?;
    Some((usize::from(first) % n, rest))
}

/// Splits at the first `sep` byte (everything is the first part when there is none).
fn split_at_byte(data: &[u8], sep: u8) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == sep) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// File names that reach every language the chunker knows, and plain text.
const CHUNK_PATHS: &[&str] = &[
    "src/lib.rs",
    "pkg/mod.py",
    "web/app.js",
    "web/app.ts",
    "web/view.tsx",
    "cmd/main.go",
    "src/Main.java",
    "src/main.c",
    "src/main.cpp",
    "src/Program.cs",
    "lib/task.rb",
    "www/index.php",
    "README.md",
    "notes.txt",
    "tests/test_mod.py",
    "locale/de.po",
];

/// The chunker on any text in any language: chunks are within budget, ordered, disjoint, on
/// character boundaries, cover every non-blank line, and name only what they hold.
pub fn chunker(data: &[u8]) {
    let Some((which, rest)) = select(data, CHUNK_PATHS.len()) else { return };
    let text = String::from_utf8_lossy(rest);
    let path = RelPath::from_bytes(CHUNK_PATHS[which]);
    let max_tokens = 48;
    let chunker = Chunker::new(ChunkConfig { max_tokens, min_tokens: 8 }, Arc::new(Estimate));
    let chunks = chunker.chunk(&path, &text);
    let mut covered = vec![false; text.lines().count()];
    let mut prev_end = 0;
    for c in &chunks {
        assert!(c.bytes.start >= prev_end && c.bytes.end <= text.len(), "out of order or out of the text: {c:?}");
        assert!(text.is_char_boundary(c.bytes.start) && text.is_char_boundary(c.bytes.end), "splits a character");
        assert!(c.tokens as usize <= max_tokens, "over budget: {c:?}");
        assert!(!c.text(&text).trim().is_empty(), "an empty chunk: {c:?}");
        assert!(c.start_line <= c.end_line, "{c:?}");
        for name in &c.defines {
            assert!(c.text(&text).contains(name.as_str()), "names {name:?}, which it does not hold");
        }
        for line in c.start_line..=c.end_line.min(covered.len() as u32) {
            covered[line as usize - 1] = true;
        }
        prev_end = c.bytes.end;
    }
    for (i, line) in text.lines().enumerate() {
        assert!(covered[i] || line.trim().is_empty(), "line {} is in no chunk", i + 1);
    }
    for (name, line) in top_level_names(&path, &text) {
        assert!(!name.is_empty() && text.contains(name.as_str()) && line >= 1);
    }
}

/// The secret scanner: findings lie inside the text, on character boundaries, on the line
/// they say, without overlapping.
pub fn secrets(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    static SCANNER: std::sync::OnceLock<caret_workspace::secrets::SecretScanner> = std::sync::OnceLock::new();
    let findings = SCANNER.get_or_init(caret_workspace::secrets::SecretScanner::new).scan(&text);
    for (i, f) in findings.iter().enumerate() {
        assert!(f.span.start < f.span.end && f.span.end <= text.len(), "{f:?}");
        assert!(text.is_char_boundary(f.span.start) && text.is_char_boundary(f.span.end), "{f:?}");
        let line = text[..f.span.start].matches('\n').count() + 1;
        assert_eq!(line as u32, f.line, "{f:?}");
        for g in &findings[i + 1..] {
            assert!(f.span.end <= g.span.start || g.span.end <= f.span.start, "overlapping findings");
        }
    }
}

const FORMATS: &[Option<caret_apply::Format>] = &[
    None,
    Some(caret_apply::Format::SearchReplace),
    Some(caret_apply::Format::Udiff),
    Some(caret_apply::Format::Lazy),
    Some(caret_apply::Format::Patch),
];

/// Every edit format (or detection) on any file and edit: an answer or an error, and an
/// applied edit yields a text that renders and parses back to itself.
pub fn edit_formats(data: &[u8]) {
    let Some((which, rest)) = select(data, FORMATS.len()) else { return };
    let (file, edit) = split_at_byte(rest, 0);
    let Ok(text) = caret_apply::Text::parse(file) else { return };
    let edit = String::from_utf8_lossy(edit);
    if let Ok((out, _)) = caret_apply::apply(&text, &edit, FORMATS[which], Some("src/a.rs")) {
        // Text in, text out, read back as written. (Not checked where a carriage return is in
        // the output: a line's own CR before the newline reads as a CRLF ending.)
        let rendered = out.render();
        let again =
            caret_apply::Text::parse(rendered.as_bytes()).unwrap_or_else(|e| panic!("output does not parse: {e}"));
        if !rendered.contains('\r') {
            assert_eq!(again.render(), rendered, "output does not round-trip");
        }
    }
    // A patch envelope changes a tree: only paths inside it, and text stays text.
    if let Ok(ops) = caret_apply::patch::parse(&edit) {
        let read = |path: &str| Ok((path == "src/a.rs").then(|| file.to_vec()));
        for change in caret_apply::patch::plan(&ops, &read).unwrap_or_default() {
            let (path, bytes) = match &change {
                caret_apply::patch::Change::Write { path, bytes } => (path, Some(bytes)),
                caret_apply::patch::Change::Delete { path } => (path, None),
            };
            let p = std::path::Path::new(path);
            assert!(
                p.components().all(|c| matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir)),
                "a change outside the tree: {path:?}"
            );
            assert!(!bytes.is_some_and(|b| b.contains(&0)), "{path}: text became binary");
        }
    }
}

/// One SEARCH/REPLACE block: where its lines occur exactly once in the file, the result is the
/// file with that one place replaced; where they occur at two places or more, it is refused.
pub fn search_replace_one_place(data: &[u8]) {
    let (file, rest) = split_at_byte(data, 0);
    let (search, replace) = split_at_byte(rest, 0);
    let (Ok(file), Ok(search), Ok(replace)) =
        (std::str::from_utf8(file), std::str::from_utf8(search), std::str::from_utf8(replace))
    else {
        return;
    };
    if replace.contains('\0') {
        return;
    }
    // Whole lines only, no markers inside — nor lines the parser takes for markers, which it
    // reads leniently (five or more `<`, `=` or `>`, as models write them) — and no carriage
    // returns (the matcher normalises them).
    let marker_like = |l: &str| {
        let t = l.trim();
        ['<', '=', '>'].iter().any(|c| t.chars().take_while(|x| x == c).count() >= 5)
    };
    let clean = |s: &str| {
        !s.contains('\r')
            && !["<<<<<<<", "=======", ">>>>>>>"].iter().any(|m| s.contains(m))
            && !s.lines().any(marker_like)
    };
    if !clean(file) || !clean(search) || !clean(replace) || search.trim().is_empty() {
        return;
    }
    let file = if file.is_empty() || file.ends_with('\n') { file.to_owned() } else { format!("{file}\n") };
    let search = search.trim_end_matches('\n');
    let replace = replace.trim_end_matches('\n');
    let replacement = if replace.is_empty() { String::new() } else { format!("{replace}\n") };
    let edit = format!("<<<<<<< SEARCH\n{search}\n=======\n{replacement}>>>>>>> REPLACE\n");
    let lines: Vec<&str> = file.lines().collect();
    let wanted: Vec<&str> = search.lines().collect();
    let places: Vec<usize> = (0..lines.len().saturating_sub(wanted.len() - 1))
        .filter(|&i| lines.get(i..i + wanted.len()) == Some(&wanted[..]))
        .collect();
    let text = caret_apply::Text::new(&file);
    let result = caret_apply::apply(&text, &edit, Some(caret_apply::Format::SearchReplace), None);
    match places.as_slice() {
        [at] => {
            let (out, _) = result.unwrap_or_else(|e| panic!("one exact place, yet refused: {e}"));
            let mut expected: Vec<&str> = lines[..*at].to_vec();
            if !replace.is_empty() {
                expected.extend(replace.lines());
            }
            expected.extend(&lines[at + wanted.len()..]);
            let expected = if expected.is_empty() { String::new() } else { expected.join("\n") + "\n" };
            assert_eq!(out.render(), expected, "replaced somewhere else");
        }
        [] => {}
        _ => assert!(result.is_err(), "{} exact places, yet applied", places.len()),
    }
}

/// WordPiece with any vocabulary on any text: an input is `[CLS]`, the pieces, `[SEP]`;
/// counting agrees with encoding (the chunker's budgets rely on it); truncation holds.
pub fn tokenizer(data: &[u8]) {
    let (vocab, text) = split_at_byte(data, 0xff);
    let vocab = String::from_utf8_lossy(vocab);
    let text = String::from_utf8_lossy(text);
    let mut pieces: Vec<&str> = vec!["[PAD]", "[UNK]", "[CLS]", "[SEP]"];
    pieces.extend(vocab.lines());
    for lowercase in [true, false] {
        let wp = WordPiece::new(pieces.iter().copied(), "##", lowercase);
        let all = wp.encode(&text, usize::MAX);
        assert_eq!(all.len(), wp.count(&text) + 2, "count disagrees with encode");
        let s = wp.specials();
        assert_eq!((all.first(), all.last()), (Some(&s.cls), Some(&s.sep)));
        for max in [2, 3, 7] {
            let cut = wp.encode(&text, max);
            assert!(cut.len() <= max, "{} ids for at most {max}", cut.len());
            assert_eq!(&cut[..cut.len() - 1], &all[..cut.len() - 1], "truncation is a prefix");
        }
    }
}

/// A `tokenizer.json` from anywhere: loaded or refused with an error.
pub fn tokenizer_json(data: &[u8]) {
    let dir = scratch();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, data).unwrap_or_else(|e| panic!("writing the input: {e}"));
    if let Ok(wp) = WordPiece::from_tokenizer_json(&path) {
        let ids = wp.encode("fn main() { println!(\"héllo\"); }", 64);
        assert!(ids.len() <= 64);
    }
}

/// A fresh scratch directory.
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("a scratch directory: {e}"))
}

const IGNORE_FILES: &[&str] = &[".gitignore", ".cursorignore", ".caretignore", "sub/.gitignore"];

/// Ignore files with any content over a small tree: the walk answers, every file it lists
/// exists, and the ignore files' own rules are honoured for plain names.
pub fn ignore_files(data: &[u8]) {
    let Some((which, rules)) = select(data, IGNORE_FILES.len()) else { return };
    let dir = scratch();
    let root = dir.path();
    let files = ["a.rs", "b.py", "sub/c.txt", "sub/deep/d.md", "node_modules/e.js", ".hidden/f"];
    for f in files {
        let p = root.join(f);
        std::fs::create_dir_all(p.parent().unwrap_or(root)).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&p, "x\n").unwrap_or_else(|e| panic!("{e}"));
    }
    let ignore = root.join(IGNORE_FILES[which]);
    std::fs::write(&ignore, rules).unwrap_or_else(|e| panic!("{e}"));
    let config = caret_workspace::walk::WalkConfig { global_excludes: None, ..Default::default() };
    let Ok(out) = caret_workspace::walk::walk(root, &config) else { return };
    for f in &out.files {
        assert!(f.path.under(root).is_file(), "lists {:?}, which is not a file", f.path);
    }
    // A rule that is a plain existing name on a line of its own ignores that file.
    if which < 3 {
        let text = String::from_utf8_lossy(rules);
        for f in ["a.rs", "b.py"] {
            if text.lines().any(|l| l == f) && !text.lines().any(|l| l.starts_with('!')) {
                assert!(!out.files.iter().any(|w| w.path.as_bytes() == f.as_bytes()), "{f} is listed though ignored");
            }
        }
    }
}

/// A stat cache file (the checksum is computed here, so the decoder itself is exercised):
/// loaded or started afresh; a loaded one saves and loads back equal.
pub fn stat_cache(data: &[u8]) {
    let dir = scratch();
    let path = dir.path().join("stat-cache");
    let mut bytes = data.to_vec();
    bytes.extend_from_slice(blake3::hash(data).as_bytes());
    std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("{e}"));
    let cache = caret_workspace::statcache::StatCache::load(&path);
    cache.save(&path).unwrap_or_else(|e| panic!("saving: {e}"));
    assert_eq!(caret_workspace::statcache::StatCache::load(&path), cache, "does not round-trip");
}

/// A log object's body: decoded or refused; decoded records apply and the state searches.
pub fn log_object(data: &[u8]) {
    caret_store::fuzzing::log_object(data);
}

/// A segment's body: decoded or refused; an inconsistent one is never built.
pub fn segment(data: &[u8]) {
    caret_store::fuzzing::segment(data);
}

/// A stored BM25 index or HNSW graph, as stored (checksum included): read or refused, never an
/// unbounded allocation (their readers, tantivy's and usearch's, trust what is behind the
/// checksum).
pub fn stored_indexes(data: &[u8]) {
    let Some((which, rest)) = select(data, 2) else { return };
    match which {
        0 => caret_store::fuzzing::bm25(rest),
        _ => {
            let (dim, rest) = rest.split_first().map_or((1, rest), |(d, r)| (usize::from(*d % 16) + 1, r));
            caret_store::fuzzing::ann(rest, dim);
        }
    }
}

/// A model server's streamed answer, in pieces cut anywhere: read to the end or to an error;
/// tool calls are collected by index without making room for absurd ones.
pub fn model_streams(data: &[u8]) {
    let Some((which, rest)) = select(data, 2) else { return };
    let (cuts, body) = rest.split_first().map_or((1, rest), |(c, b)| (usize::from(*c % 7) + 1, b));
    let step = body.len() / cuts + 1;
    let pieces: Vec<Vec<u8>> = body.chunks(step).map(<[u8]>::to_vec).collect();
    let result = match which {
        0 => caret_models::fuzzing::openai_chat(pieces),
        _ => caret_models::fuzzing::anthropic_messages(pieces),
    };
    if let Ok(collected) = result {
        assert!(collected.message.tool_calls.len() <= caret_models::MAX_TOOL_CALLS as usize);
    }
}

/// A local engine's text, in pieces: the same text and calls wherever it was cut.
pub fn local_tool_calls(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mid = text.char_indices().nth(text.chars().count() / 2).map_or(text.len(), |(i, _)| i);
    let pieces = [&text[..mid], &text[mid..]];
    let names = vec!["read_file".to_owned(), "grep".to_owned(), "ls".to_owned()];
    let events = caret_llama::fuzzing::tool_calls(&pieces, names.clone());
    let whole = caret_llama::fuzzing::tool_calls(&[&text], names);
    assert_eq!(flatten(&events), flatten(&whole), "the answer depends on where it was cut");
}

/// Events as what they add up to: the text, and each call's name and arguments (ids are
/// made up fresh for each call).
fn flatten(events: &[caret_models::Event]) -> (String, Vec<(u32, String, String)>) {
    let mut text = String::new();
    let mut calls: Vec<(u32, String, String)> = Vec::new();
    for e in events {
        match e {
            caret_models::Event::Text(t) => text.push_str(t),
            caret_models::Event::ToolCall { index, name, arguments, .. } => {
                if !calls.iter().any(|c| c.0 == *index) {
                    calls.push((*index, String::new(), String::new()));
                }
                if let Some(c) = calls.iter_mut().find(|c| c.0 == *index) {
                    c.1.push_str(name.as_deref().unwrap_or_default());
                    c.2.push_str(arguments);
                }
            }
            _ => {}
        }
    }
    (text, calls)
}
