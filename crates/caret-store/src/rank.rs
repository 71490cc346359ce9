//! Ranking, as pure functions of data: BM25 over keyed term hashes, exact top-k by dot
//! product of unit vectors, and reciprocal-rank fusion of the two. Storage and transport live
//! elsewhere; these are what a query runs once candidates are in memory.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// A ranked hit: a document index and its score, best first in result lists.
pub type Hit = (usize, f32);

/// BM25 parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bm25 {
    /// Term-frequency saturation.
    pub k1: f32,
    /// Length normalisation.
    pub b: f32,
}

impl Default for Bm25 {
    fn default() -> Self {
        Bm25 { k1: 1.2, b: 0.75 }
    }
}

/// An in-memory inverted index over documents given as `(term hash, frequency)` lists.
#[derive(Debug, Default, Clone)]
pub struct LexicalIndex {
    postings: HashMap<u64, Vec<(u32, u32)>>,
    lengths: Vec<u32>,
    avg_len: f32,
}

impl LexicalIndex {
    /// Indexes documents `0..n`, each given by its terms and length in terms.
    pub fn build<'a>(docs: impl IntoIterator<Item = (&'a [(u64, u32)], u32)>) -> Self {
        let mut postings: HashMap<u64, Vec<(u32, u32)>> = HashMap::new();
        let mut lengths = Vec::new();
        for (i, (terms, len)) in docs.into_iter().enumerate() {
            let doc = u32::try_from(i).unwrap_or(u32::MAX);
            for (term, tf) in terms {
                postings.entry(*term).or_default().push((doc, *tf));
            }
            lengths.push(len);
        }
        let avg_len = if lengths.is_empty() {
            0.0
        } else {
            lengths.iter().map(|l| *l as f32).sum::<f32>() / lengths.len() as f32
        };
        LexicalIndex { postings, lengths, avg_len }
    }

    /// Adds document `len()` (a chunk appended to the tail), as [`build`](Self::build) would.
    pub fn push(&mut self, terms: &[(u64, u32)], len: u32) {
        let doc = u32::try_from(self.lengths.len()).unwrap_or(u32::MAX);
        for (term, tf) in terms {
            self.postings.entry(*term).or_default().push((doc, *tf));
        }
        let n = self.lengths.len() as f32;
        self.avg_len = (self.avg_len * n + len as f32) / (n + 1.0);
        self.lengths.push(len);
    }

    /// The `k` best documents for the query terms (repeats count once), by BM25.
    pub fn search(&self, query: &[u64], k: usize, p: Bm25) -> Vec<Hit> {
        self.search_with(query, k, p, &Corpus::of(&[self], query))
    }

    /// Documents in the index.
    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    /// Like [`LexicalIndex::search`], with document frequencies and lengths of a corpus this
    /// index is one part of, so scores from the parts are comparable.
    pub fn search_with(&self, query: &[u64], k: usize, p: Bm25, corpus: &Corpus) -> Vec<Hit> {
        let mut terms = query.to_vec();
        terms.sort_unstable();
        terms.dedup();
        let mut scores: HashMap<u32, f32> = HashMap::new();
        for t in terms {
            let Some(list) = self.postings.get(&t) else { continue };
            let df = corpus.df.get(&t).copied().unwrap_or(list.len()) as f32;
            let idf = ((corpus.docs - df + 0.5) / (df + 0.5) + 1.0).ln();
            for (doc, tf) in list {
                let len = self.lengths[*doc as usize] as f32;
                let tf = *tf as f32;
                let norm = tf * (p.k1 + 1.0) / (tf + p.k1 * (1.0 - p.b + p.b * len / corpus.avg_len.max(1.0)));
                *scores.entry(*doc).or_default() += idf * norm;
            }
        }
        top_k(scores.into_iter().map(|(d, s)| (d as usize, s)), k)
    }
}

/// Statistics of a corpus split over several indexes, for the terms of one query.
#[derive(Debug, Clone, Default)]
pub struct Corpus {
    docs: f32,
    avg_len: f32,
    df: HashMap<u64, usize>,
}

impl Corpus {
    /// Statistics given directly: documents, tokens, and document frequency by term.
    pub fn new(docs: u64, tokens: u64, df: HashMap<u64, u64>) -> Self {
        let avg_len = if docs == 0 { 0.0 } else { tokens as f32 / docs as f32 };
        Corpus { docs: docs as f32, avg_len, df: df.into_iter().map(|(t, d)| (t, d as usize)).collect() }
    }

    /// Tokens in the corpus.
    pub fn total_tokens(&self) -> u64 {
        (self.avg_len * self.docs).round() as u64
    }

    /// Documents holding `term` (0 if the term was not asked about).
    pub fn df(&self, term: u64) -> u64 {
        self.df.get(&term).copied().unwrap_or(0) as u64
    }

    /// The statistics of `parts` together, for `query`'s terms.
    pub fn of(parts: &[&LexicalIndex], query: &[u64]) -> Self {
        let docs: usize = parts.iter().map(|p| p.lengths.len()).sum();
        let total: f32 = parts.iter().map(|p| p.avg_len * p.lengths.len() as f32).sum();
        let mut df = HashMap::new();
        for t in query {
            df.entry(*t).or_insert_with(|| parts.iter().filter_map(|p| p.postings.get(t)).map(Vec::len).sum());
        }
        Corpus { docs: docs as f32, avg_len: if docs == 0 { 0.0 } else { total / docs as f32 }, df }
    }
}

/// Keeps the `k` highest-scoring hits, best first; ties go to the lower index.
pub fn top_k(hits: impl IntoIterator<Item = Hit>, k: usize) -> Vec<Hit> {
    #[derive(PartialEq)]
    struct Worst(Hit);
    impl Eq for Worst {}
    impl PartialOrd for Worst {
        fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Worst {
        // The heap's top is the worst kept hit: lowest score, then highest index.
        fn cmp(&self, other: &Self) -> Ordering {
            other.0.1.total_cmp(&self.0.1).then(self.0.0.cmp(&other.0.0))
        }
    }
    if k == 0 {
        return Vec::new();
    }
    let mut heap = BinaryHeap::with_capacity(k + 1);
    for h in hits {
        heap.push(Worst(h));
        if heap.len() > k {
            heap.pop();
        }
    }
    let mut out: Vec<Hit> = heap.into_iter().map(|w| w.0).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    out
}

/// Exact nearest neighbours: the `k` rows of `vectors` (row-major, `dim` wide) with the highest
/// dot product with `query` (cosine, for unit vectors).
pub fn exact_top_k(vectors: &[f32], dim: usize, query: &[f32], k: usize) -> Vec<Hit> {
    if dim == 0 || query.len() != dim {
        return Vec::new();
    }
    top_k(vectors.chunks_exact(dim).enumerate().map(|(i, row)| (i, dot(row, query))), k)
}

/// Dot product with eight independent accumulators, so the compiler can use SIMD lanes (a
/// plain sum is one dependency chain: float addition is not associative).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Reciprocal-rank fusion: each list adds `weight / (c + rank)` (rank from 1) to a document's
/// score; the fused list is best first.
pub fn rrf(lists: &[(&[Hit], f32)], c: f32, k: usize) -> Vec<Hit> {
    let mut scores: HashMap<usize, f32> = HashMap::new();
    for (list, weight) in lists {
        for (rank, (doc, _)) in list.iter().enumerate() {
            *scores.entry(*doc).or_default() += weight / (c + rank as f32 + 1.0);
        }
    }
    top_k(scores, k)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Terms of a text as (hash, tf) with a toy hash, for fixtures.
    fn doc(text: &str) -> (Vec<(u64, u32)>, u32) {
        let mut counts: HashMap<u64, u32> = HashMap::new();
        let mut len = 0;
        crate::lexical::terms(text, |t| {
            *counts.entry(hash(t)).or_default() += 1;
            len += 1;
        });
        let mut v: Vec<_> = counts.into_iter().collect();
        v.sort_unstable();
        (v, len)
    }

    fn hash(t: &str) -> u64 {
        t.bytes().fold(1469598103934665603u64, |h, b| (h ^ u64::from(b)).wrapping_mul(1099511628211))
    }

    fn query(text: &str) -> Vec<u64> {
        let mut q = Vec::new();
        crate::lexical::terms(text, |t| q.push(hash(t)));
        q
    }

    const CORPUS: &[&str] = &[
        "fn retry_upload(attempts: u32) { for i in 0..attempts { upload(); sleep(backoff(i)); } }",
        "# Uploads\n\nUploads are retried. Uploads may fail. Uploads uploads uploads.",
        "fn parse_config(path: &Path) -> Config { toml::from_str(&read(path)) }",
        "fn backoff(attempt: u32) -> Duration { Duration::from_millis(100 << attempt) }",
        "struct Cache { entries: HashMap<String, String> }",
    ];

    #[test]
    fn bm25_prefers_rare_terms_and_saturates_repeats() {
        let docs: Vec<_> = CORPUS.iter().map(|t| doc(t)).collect();
        let index = LexicalIndex::build(docs.iter().map(|(t, l)| (t.as_slice(), *l)));
        let hits = index.search(&query("retry backoff"), 3, Bm25::default());
        assert_eq!(
            hits.iter().map(|h| h.0).collect::<Vec<_>>(),
            [0, 3],
            "only documents with the terms; both terms first"
        );
        let hits = index.search(&query("parse config"), 5, Bm25::default());
        assert_eq!(hits[0].0, 2);
        assert!(index.search(&query("nonexistent"), 5, Bm25::default()).is_empty());
        assert!(LexicalIndex::build(std::iter::empty()).search(&query("x"), 5, Bm25::default()).is_empty());
    }

    #[test]
    fn bm25_saturates_term_frequency() {
        // Ten repeats in a long chunk against one mention in a short one: far less than 10x.
        let long = format!("{} {}", "uploads ".repeat(10), "other words here ".repeat(15));
        let docs = [doc(&long), doc("uploads retry"), doc("nothing relevant at all")];
        let index = LexicalIndex::build(docs.iter().map(|(t, l)| (t.as_slice(), *l)));
        let hits = index.search(&query("uploads"), 3, Bm25::default());
        assert_eq!(hits.len(), 2);
        let (a, b) = (hits.iter().find(|h| h.0 == 0).unwrap().1, hits.iter().find(|h| h.0 == 1).unwrap().1);
        assert!(a / b < 2.0, "ten repeats score {a}, one mention {b}");
    }

    #[test]
    fn exact_top_k_matches_a_full_sort() {
        let dim = 8;
        let mut state = 7u64;
        let mut rand = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) % 1000) as f32 / 500.0 - 1.0
        };
        let vectors: Vec<f32> = (0..dim * 500).map(|_| rand()).collect();
        let q: Vec<f32> = (0..dim).map(|_| rand()).collect();
        let mut all: Vec<Hit> = vectors
            .chunks_exact(dim)
            .enumerate()
            .map(|(i, r)| (i, r.iter().zip(&q).map(|(a, b)| a * b).sum()))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        assert_eq!(exact_top_k(&vectors, dim, &q, 10), all[..10].to_vec());
        assert!(exact_top_k(&vectors, dim, &q[..3], 10).is_empty(), "a query of the wrong dimension finds nothing");
    }

    #[test]
    fn rrf_rewards_agreement_and_keeps_single_list_hits() {
        let lexical: Vec<Hit> = vec![(1, 9.0), (2, 5.0), (3, 1.0)];
        let vector: Vec<Hit> = vec![(2, 0.9), (4, 0.8), (1, 0.1)];
        let fused = rrf(&[(&lexical, 1.0), (&vector, 1.0)], 60.0, 10);
        assert_eq!(fused.iter().map(|h| h.0).collect::<Vec<_>>(), [2, 1, 4, 3], "in both lists first, then by rank");
        let weighted = rrf(&[(&lexical, 1.0), (&vector, 3.0)], 60.0, 2);
        assert_eq!(weighted[0].0, 2);
        assert_eq!(weighted.len(), 2);
    }

    #[test]
    fn top_k_is_stable_on_ties() {
        assert_eq!(top_k([(3, 1.0), (1, 1.0), (2, 2.0)], 2), vec![(2, 2.0), (1, 1.0)]);
        assert!(top_k([(1, 1.0)], 0).is_empty());
    }
}
