//! Hybrid search over a state: BM25 over keyed terms and nearest neighbours over rotated
//! vectors, each over the segment and the tail, fused by reciprocal rank, then expanded to
//! every place a chunk occurs and weighted by the kind of file.

use std::collections::HashMap;
use std::sync::Arc;

use crate::base::{Location, kind_of, locate_all};
use crate::bm25::Stats;
use crate::layered::Layered;
use crate::rank::{self, Bm25, Corpus, Hit, LexicalIndex};
use crate::{FileRecord, State};

/// Fusion weights and boosts by file kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    /// Weight of the BM25 ranking in the fusion.
    pub lexical: f32,
    /// Weight of the vector ranking in the fusion.
    pub vector: f32,
    /// The reciprocal-rank constant (larger flattens the head of each list).
    pub rrf_c: f32,
    /// Multiplier for chunks of source files.
    pub code: f32,
    /// Multiplier for chunks of tests.
    pub test: f32,
    /// Multiplier for chunks of documentation.
    pub docs: f32,
    /// Multiplier for chunks of configuration files and bulk data.
    pub config: f32,
    /// How much a source chunk gains when the names it defines cover the query's words (at
    /// most this share of its score, for the best-covering chunk).
    pub definition: f32,
    /// How much a hit gains from the other hits of its file (a share of their scores): a file
    /// with several matching chunks rises.
    pub file: f32,
    /// How much a chunk that defines a symbol the query names whole (`steal_into`) gains, as
    /// a share of its score: the definition before its uses. Tests are left out.
    pub symbol: f32,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            lexical: 1.0,
            vector: 1.0,
            rrf_c: 60.0,
            code: 1.0,
            // Tests and docs describe a feature in the words of a question as often as the code
            // that implements it; at 0.5 the code comes first more often on every question set
            // (docs/search.md).
            test: 0.5,
            docs: 0.5,
            config: 0.7,
            // Measured to lower R@1 on every question set so far (the names a question's
            // words hit are often not what it asks for): off until it pays.
            definition: 0.0,
            file: 0.15,
            symbol: 1.0,
        }
    }
}

impl Weights {
    fn boost(&self, kind: &str) -> f32 {
        match kind {
            "code" => self.code,
            "test" => self.test,
            "docs" => self.docs,
            "config" | "data" => self.config,
            _ => 1.0,
        }
    }
}

/// A query, already keyed: term hashes and a rotated vector.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Keyed hashes of the query's terms.
    pub terms: Vec<u64>,
    /// Keyed hashes of the query's terms as defined names (see
    /// [`crate::lexical::definition_term`]).
    pub definitions: Vec<u64>,
    /// Keyed hashes of the symbols the query names whole (see [`crate::lexical::symbols`]),
    /// as defined names.
    pub symbols: Vec<u64>,
    /// The model and the rotated query vector, when an embedder is available.
    pub vector: Option<(String, Vec<f32>)>,
    /// Hits wanted.
    pub k: usize,
    /// Candidates taken from each ranking before fusion.
    pub candidates: usize,
    /// Fusion weights.
    pub weights: Weights,
}

/// A hit: a chunk at one place in one file.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchHit {
    /// Obfuscated path.
    pub path: String,
    /// First line, 1-based.
    pub start_line: u32,
    /// Last line, 1-based, inclusive.
    pub end_line: u32,
    /// Keyed chunk id.
    pub id: [u8; 32],
    /// File kind.
    pub kind: String,
    /// Fused score (higher is better).
    pub score: f32,
    /// Rank in the BM25 list (0 is best), if there.
    pub lexical_rank: Option<u32>,
    /// Rank in the vector list (0 is best), if there.
    pub vector_rank: Option<u32>,
}

/// Where each stored chunk occurs: shared with the base, each state's changes beside it.
pub(crate) type Locations = Layered<[u8; 32], Vec<Location>>;

/// Merges ranked `(id, score)` lists by score, keeping each live id once, best first.
fn merge(lists: Vec<Vec<([u8; 32], f32)>>, live: &Locations, n: usize) -> Vec<([u8; 32], f32)> {
    let mut all: Vec<([u8; 32], f32)> = lists.into_iter().flatten().filter(|(id, _)| live.contains_key(id)).collect();
    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut seen = std::collections::HashSet::new();
    all.retain(|(id, _)| seen.insert(*id));
    all.truncate(n);
    all
}

impl State {
    /// Where every stored chunk occurs in current files (cached, then kept with each change):
    /// the base's places, with the files this state changed over it placed again.
    fn locations(&mut self) -> Arc<Locations> {
        if let Some(l) = &self.locations {
            return l.clone();
        }
        let Some(base) = self.base.clone() else {
            let map = locate_all(self.files.values(), |id| self.chunks.contains_key(id));
            let map = Arc::new(Layered::over(Arc::new(map)));
            self.locations = Some(map.clone());
            return map;
        };
        self.locations = Some(Arc::new(Layered::over(base.locations())));
        // Files changed over the base, and the base's files that lacked a chunk (one stored
        // since places them whole).
        let changed: std::collections::BTreeSet<String> =
            self.files.own_keys().chain(base.incomplete.iter()).cloned().collect();
        for path in changed {
            if let Some(f) = base.files.get(&path) {
                self.unlocate(f);
            }
            if let Some(f) = self.files.get(&path).cloned() {
                self.locate(&f);
            }
        }
        self.locations.clone().unwrap_or_default()
    }

    /// Adds a file's stored chunks to the cached locations, if any (a file record applied).
    pub(crate) fn locate(&mut self, f: &FileRecord) {
        let Some(map) = self.locations.as_mut() else { return };
        let map = Arc::make_mut(map);
        let path: Arc<str> = Arc::from(f.path.as_str());
        for c in f.chunks.iter().filter(|c| self.chunks.contains_key(&c.id)) {
            let at = map.or_default(c.id);
            at.push(Location {
                path: path.clone(),
                start_line: c.start_line,
                end_line: c.end_line,
                kind: kind_of(&c.kind),
            });
            // In file order, as a rebuild lists them.
            at.sort_by(|a, b| a.path.cmp(&b.path));
        }
    }

    /// Removes a replaced or deleted file's chunks from the cached locations, if any.
    pub(crate) fn unlocate(&mut self, f: &FileRecord) {
        let Some(map) = self.locations.as_mut() else { return };
        let map = Arc::make_mut(map);
        for c in &f.chunks {
            if let Some(at) = map.get_mut(&c.id) {
                at.retain(|l| *l.path != *f.path);
                if at.is_empty() {
                    map.remove(&c.id);
                }
            }
        }
    }

    fn tail_lexical(&mut self) -> Arc<(Vec<[u8; 32]>, LexicalIndex)> {
        if let Some(t) = &self.tail_lexical {
            return t.clone();
        }
        let ids = self.tail.chunks.iter().map(|(_, c)| c.id).collect();
        let index = LexicalIndex::build(self.tail.chunks.iter().map(|(_, c)| (c.terms.as_slice(), c.length)));
        let t = Arc::new((ids, index));
        self.tail_lexical = Some(t.clone());
        t
    }

    fn lexical_candidates(&mut self, terms: &[u64], n: usize, live: &Locations) -> Vec<([u8; 32], f32)> {
        if terms.is_empty() {
            return Vec::new();
        }
        let params = Bm25::default();
        let tail = self.tail_lexical();
        // Statistics of the whole namespace, so segment and tail scores compare.
        let tail_corpus = Corpus::of(&[&tail.1], terms);
        let mut stats = Stats {
            docs: tail.1.len() as u64,
            tokens: tail_corpus.total_tokens(),
            df: terms.iter().map(|t| (*t, tail_corpus.df(*t))).collect(),
        };
        if let Some(seg) = &self.segment {
            stats.docs += seg.bm25.docs();
            stats.tokens += seg.bm25.tokens();
            for (t, df) in stats.df.iter_mut() {
                *df += seg.bm25.doc_freq(*t);
            }
        }
        let corpus = Corpus::new(stats.docs, stats.tokens, stats.df.clone());
        let mut lists = Vec::new();
        if let Some(seg) = &self.segment {
            let hits = seg.bm25.search(terms, n * 2, &stats).unwrap_or_else(|e| {
                tracing::error!("segment BM25 search failed: {e}");
                Vec::new()
            });
            lists.push(hits.into_iter().filter_map(|(i, s)| seg.ids.get(i).map(|id| (*id, s))).collect());
        }
        let hits = tail.1.search_with(terms, n * 2, params, &corpus);
        lists.push(hits.into_iter().map(|(i, s)| (tail.0[i], s)).collect());
        merge(lists, live, n)
    }

    fn vector_candidates(&self, model: &str, query: &[f32], n: usize, live: &Locations) -> Vec<([u8; 32], f32)> {
        let Some((m, dim)) = &self.model else { return Vec::new() };
        if m != model || query.len() != *dim {
            return Vec::new();
        }
        let mut lists = Vec::new();
        if let Some(seg) = self.segment.as_ref().filter(|s| s.model.as_deref() == Some(model) && s.dim == *dim) {
            let hits: Vec<Hit> = match &seg.ann {
                Some(ann) => ann.search(query, n * 2, &seg.vectors).unwrap_or_else(|e| {
                    tracing::error!("ANN search failed ({e}); scanning exactly");
                    rank::exact_top_k(&seg.vectors, seg.dim, query, n * 2)
                }),
                None => rank::exact_top_k(&seg.vectors, seg.dim, query, n * 2),
            };
            lists.push(hits.into_iter().filter_map(|(i, s)| seg.vector_ids.get(i).map(|id| (*id, s))).collect());
        }
        let tail = rank::exact_top_k(&self.tail.vectors, *dim, query, n * 2);
        lists.push(tail.into_iter().map(|(i, s)| (self.tail.vector_ids[i].1, s)).collect());
        merge(lists, live, n)
    }

    /// The best `q.k` places for a query, best first.
    pub fn search(&mut self, q: &Query) -> Vec<SearchHit> {
        let live = self.locations();
        let n = q.candidates.max(q.k).max(1);
        let lexical = self.lexical_candidates(&q.terms, n, &live);
        let vector = match &q.vector {
            Some((model, v)) => self.vector_candidates(model, v, n, &live),
            None => Vec::new(),
        };
        let definitions = self.lexical_candidates(&q.definitions, n, &live);
        let w = q.weights;
        // How well each chunk's defined names cover the query (BM25 over those names, as a
        // share of the best): a boost for chunks the other rankings found, never a reason to
        // find one — a name like `write_file` says little alone.
        let best = definitions.first().map_or(0.0, |(_, s)| *s);
        let defines: HashMap<[u8; 32], f32> =
            definitions.iter().map(|(id, s)| (*id, if best > 0.0 { s / best } else { 0.0 })).collect();
        // Chunks that define a symbol the query names whole.
        let defines_symbol: std::collections::HashSet<[u8; 32]> = if q.symbols.is_empty() || w.symbol <= 0.0 {
            Default::default()
        } else {
            self.lexical_candidates(&q.symbols, n, &live).into_iter().map(|(id, _)| id).collect()
        };
        let mut fused: HashMap<[u8; 32], (f32, Option<u32>, Option<u32>)> = HashMap::new();
        for (rank, (id, _)) in lexical.iter().enumerate() {
            let e = fused.entry(*id).or_default();
            e.0 += w.lexical / (w.rrf_c + rank as f32 + 1.0);
            e.1 = Some(u32::try_from(rank).unwrap_or(u32::MAX));
        }
        for (rank, (id, _)) in vector.iter().enumerate() {
            let e = fused.entry(*id).or_default();
            e.0 += w.vector / (w.rrf_c + rank as f32 + 1.0);
            e.2 = Some(u32::try_from(rank).unwrap_or(u32::MAX));
        }
        let mut hits: Vec<SearchHit> = fused
            .into_iter()
            .flat_map(|(id, (score, lr, vr))| {
                let defined = defines.get(&id).copied().unwrap_or(0.0);
                let names_symbol = defines_symbol.contains(&id);
                live.get(&id).into_iter().flatten().map(move |loc| {
                    // In source files only: tests and docs define helpers and cases named
                    // after the feature they exercise, not the feature.
                    let mut score = if &*loc.kind == "code" { score * (1.0 + w.definition * defined) } else { score };
                    if names_symbol && &*loc.kind != "test" {
                        score *= 1.0 + w.symbol;
                    }
                    SearchHit {
                        path: loc.path.to_string(),
                        start_line: loc.start_line,
                        end_line: loc.end_line,
                        id,
                        kind: loc.kind.to_string(),
                        score: score * w.boost(&loc.kind),
                        lexical_rank: lr,
                        vector_rank: vr,
                    }
                })
            })
            .collect();
        aggregate_files(&mut hits, w.file);
        hits.sort_by(|a, b| {
            b.score.total_cmp(&a.score).then_with(|| (&a.path, a.start_line).cmp(&(&b.path, b.start_line)))
        });
        hits.truncate(q.k);
        hits
    }
}

/// Adds to each hit `share` of the best score among the other hits of its file: a file where
/// a second chunk matches too rises above one where a single chunk does, without a long file
/// winning by its many weak matches.
fn aggregate_files(hits: &mut [SearchHit], share: f32) {
    if share <= 0.0 {
        return;
    }
    // The two best scores per file.
    let mut best: HashMap<&str, (f32, f32)> = HashMap::new();
    for h in hits.iter() {
        let e = best.entry(h.path.as_str()).or_insert((0.0, 0.0));
        if h.score > e.0 {
            *e = (h.score, e.0);
        } else if h.score > e.1 {
            e.1 = h.score;
        }
    }
    // The best other hit: the second best for the file's best hit, else the best.
    let gains: Vec<f32> = hits
        .iter()
        .map(|h| {
            let (first, second) = best.get(h.path.as_str()).copied().unwrap_or_default();
            share * if h.score >= first { second } else { first }
        })
        .collect();
    for (h, gain) in hits.iter_mut().zip(gains) {
        h.score += gain;
    }
}
