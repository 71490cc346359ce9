//! Snippets from the user's other files: the open ones and those edited recently.
//!
//! What the user is writing usually resembles something in a file they have open (the
//! function being called, the test beside the code, the sibling module). Each candidate file
//! is cut into overlapping windows of lines; a window scores the similarity of its
//! identifiers with the current file's (their overlap over the geometric mean of the two
//! sets' sizes); each file gives its best window, and the best files' windows are the
//! snippets, most similar first.
//!
//! The query is the whole file, not the lines around the cursor: the snippets open the prompt,
//! so picked per cursor they would change the prompt's head wherever the cursor goes, and no
//! cached prompt (a warm-up's, the last suggestion's) would serve a cursor elsewhere in the
//! file. Picked per file, one warm-up serves every cursor in it.

use std::collections::HashSet;

use crate::context::Snippet;

/// Another file the user has (had) open.
#[derive(Debug, Clone, Copy)]
pub struct Neighbour<'a> {
    /// Workspace-relative path (or name).
    pub path: &'a str,
    /// Its text.
    pub text: &'a str,
}

/// How snippets are picked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Picking {
    /// Lines per window.
    pub window: usize,
    /// Lines between window starts.
    pub step: usize,
    /// Least similarity worth sending.
    pub threshold: f32,
    /// Most snippets.
    pub max: usize,
}

impl Default for Picking {
    fn default() -> Picking {
        Picking { window: 20, step: 10, threshold: 0.2, max: 3 }
    }
}

/// The identifiers (ASCII letters, digits, `_`; at least 2 characters, not all digits) of
/// `text`.
fn identifiers(text: &str) -> HashSet<&str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.len() >= 2 && !w.bytes().all(|b| b.is_ascii_digit()))
        .collect()
}

/// The overlap of two sets over the geometric mean of their sizes (Ochiai): a window the file
/// shares most of its names with scores high however large the file is.
fn similarity(a: &HashSet<&str>, b: &HashSet<&str>) -> f32 {
    let inter = a.iter().filter(|w| b.contains(*w)).count();
    let norm = ((a.len() * b.len()) as f32).sqrt();
    if norm == 0.0 { 0.0 } else { inter as f32 / norm }
}

/// The snippets for the file `text` (the same wherever the cursor is in it), from
/// `neighbours` (the current file excluded by the caller), best first.
pub fn pick(text: &str, neighbours: &[Neighbour<'_>], how: Picking) -> Vec<Snippet> {
    let query = identifiers(text);
    if query.is_empty() {
        return Vec::new();
    }
    let mut scored: Vec<(f32, usize, Snippet)> = Vec::new();
    for (rank, n) in neighbours.iter().enumerate() {
        let lines: Vec<&str> = n.text.split_inclusive('\n').collect();
        let mut best: Option<(f32, usize)> = None;
        let mut at = 0;
        while at < lines.len() {
            let end = (at + how.window).min(lines.len());
            let score = similarity(&query, &identifiers(&lines[at..end].concat()));
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, at));
            }
            if end == lines.len() {
                break;
            }
            at += how.step.max(1);
        }
        if let Some((score, at)) = best
            && score >= how.threshold
        {
            let end = (at + how.window).min(lines.len());
            scored.push((score, rank, Snippet { path: n.path.to_owned(), text: lines[at..end].concat() }));
        }
    }
    // Most similar first; among equals, the neighbour listed first (the most recent).
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().take(how.max).map(|(_, _, s)| s).collect()
}
