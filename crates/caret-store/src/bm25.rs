//! A segment's BM25 index: tantivy over keyed-hash tokens (each term hash as 16 hex digits),
//! built at compaction, stored beside the segment as its index files, and searched with the
//! statistics of the whole namespace (segment plus tail), so scores match the tail's.

use std::collections::HashMap;
use std::path::PathBuf;

use tantivy::collector::TopDocs;
use tantivy::directory::RamDirectory;
use tantivy::query::{Bm25StatisticsProvider, BooleanQuery};
use tantivy::schema::{FAST, Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions};
use tantivy::tokenizer::{PreTokenizedString, Token};
use tantivy::{Directory as _, Index, IndexReader, ReloadPolicy, TantivyDocument, Term};

use crate::ChunkRecord;
use crate::rank::Hit;

fn err(e: impl std::fmt::Display) -> crate::Error {
    crate::Error::Encode(format!("bm25 index: {e}"))
}

fn term_text(hash: u64) -> String {
    format!("{hash:016x}")
}

/// A tantivy index over a segment's chunk table; document `i` is row `i`.
pub struct Bm25Index {
    index: Index,
    reader: IndexReader,
    terms: Field,
    docs: u64,
    tokens: u64,
    /// Bytes its files take (they live in memory).
    bytes: u64,
}

impl std::fmt::Debug for Bm25Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bm25Index").field("docs", &self.docs).field("tokens", &self.tokens).finish()
    }
}

/// Namespace-wide statistics for the terms of one query.
pub struct Stats {
    /// Documents in the namespace.
    pub docs: u64,
    /// Tokens in the namespace.
    pub tokens: u64,
    /// Document frequency by term hash.
    pub df: HashMap<u64, u64>,
}

struct Provider<'a>(&'a Stats);

impl Bm25StatisticsProvider for Provider<'_> {
    fn total_num_tokens(&self, _field: Field) -> tantivy::Result<u64> {
        Ok(self.0.tokens)
    }
    fn total_num_docs(&self) -> tantivy::Result<u64> {
        Ok(self.0.docs.max(1))
    }
    fn doc_freq(&self, term: &Term) -> tantivy::Result<u64> {
        let hash = term.value().as_str().and_then(|s| u64::from_str_radix(s, 16).ok());
        Ok(hash.and_then(|h| self.0.df.get(&h).copied()).unwrap_or(0))
    }
}

fn schema() -> (Schema, Field, Field) {
    let mut builder = Schema::builder();
    let indexing = TextFieldIndexing::default().set_index_option(IndexRecordOption::WithFreqs);
    let terms = builder.add_text_field("t", TextOptions::default().set_indexing_options(indexing));
    let row = builder.add_u64_field("row", FAST);
    (builder.build(), terms, row)
}

impl Bm25Index {
    /// Indexes the chunk table, row by row.
    pub fn build(chunks: &[ChunkRecord]) -> crate::Result<Self> {
        let (schema, terms, row) = schema();
        let index = Index::create_in_ram(schema);
        {
            let mut writer = index.writer_with_num_threads::<TantivyDocument>(1, 64 << 20).map_err(err)?;
            for (i, c) in chunks.iter().enumerate() {
                let mut tokens = Vec::new();
                for (hash, tf) in &c.terms {
                    let text = term_text(*hash);
                    for _ in 0..*tf {
                        let position = tokens.len();
                        tokens.push(Token {
                            offset_from: 0,
                            offset_to: 0,
                            position,
                            text: text.clone(),
                            position_length: 1,
                        });
                    }
                }
                let mut doc = TantivyDocument::default();
                doc.add_pre_tokenized_text(terms, PreTokenizedString { text: String::new(), tokens });
                doc.add_u64(row, i as u64);
                writer.add_document(doc).map_err(err)?;
            }
            writer.commit().map_err(err)?;
            writer.wait_merging_threads().map_err(err)?;
        }
        Self::open(index, terms)
    }

    fn open(index: Index, terms: Field) -> crate::Result<Self> {
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into().map_err(err)?;
        let searcher = reader.searcher();
        let docs = searcher.num_docs();
        let tokens = searcher.total_num_tokens(terms).map_err(err)?;
        let bytes = searcher.space_usage().map_err(err)?.total().get_bytes();
        Ok(Bm25Index { index, reader, terms, docs, tokens, bytes })
    }

    /// The index files as one blob, to store beside the segment.
    pub fn to_bytes(&self) -> crate::Result<Vec<u8>> {
        let dir = self.index.directory();
        let mut paths: Vec<PathBuf> = dir.list_managed_files().into_iter().collect();
        paths.push(PathBuf::from("meta.json"));
        paths.sort();
        paths.dedup();
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        for p in paths {
            // Listed files a segment does not use (no deletes, say) do not exist: skip them.
            if let Ok(bytes) = dir.atomic_read(p.as_path()) {
                files.push((p.to_string_lossy().into_owned(), bytes));
            }
        }
        postcard::to_stdvec(&files).map_err(err)
    }

    /// An index stored by [`Bm25Index::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> crate::Result<Self> {
        let files: Vec<(String, Vec<u8>)> = postcard::from_bytes(bytes).map_err(err)?;
        let dir = RamDirectory::create();
        for (path, data) in files {
            dir.atomic_write(std::path::Path::new(&path), &data).map_err(err)?;
        }
        let index = Index::open(dir).map_err(err)?;
        // tantivy trusts the lengths in its files (a damaged one can make it allocate without
        // bound): every file's own checksum must hold before a reader opens them.
        let damaged = index.validate_checksum().map_err(err)?;
        if !damaged.is_empty() {
            return Err(crate::Error::Inconsistent(format!("{} damaged files in a BM25 index", damaged.len())));
        }
        let terms = index.schema().get_field("t").map_err(err)?;
        Self::open(index, terms)
    }

    /// Documents indexed.
    pub fn docs(&self) -> u64 {
        self.docs
    }

    /// Bytes the index's files take in memory.
    pub fn memory_bytes(&self) -> u64 {
        self.bytes
    }

    /// Tokens indexed.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Documents holding the term.
    pub fn doc_freq(&self, hash: u64) -> u64 {
        let term = Term::from_field_text(self.terms, &term_text(hash));
        self.reader.searcher().doc_freq(&term).unwrap_or(0)
    }

    /// The `n` best rows for the query terms, scored by BM25 with namespace-wide `stats`.
    pub fn search(&self, query: &[u64], n: usize, stats: &Stats) -> crate::Result<Vec<Hit>> {
        let mut hashes = query.to_vec();
        hashes.sort_unstable();
        hashes.dedup();
        let terms: Vec<Term> = hashes.iter().map(|h| Term::from_field_text(self.terms, &term_text(*h))).collect();
        if terms.is_empty() || n == 0 {
            return Ok(Vec::new());
        }
        let query = BooleanQuery::new_multiterms_query(terms);
        let searcher = self.reader.searcher();
        let top = searcher
            .search_with_statistics_provider(&query, &TopDocs::with_limit(n).order_by_score(), &Provider(stats))
            .map_err(err)?;
        let mut hits = Vec::with_capacity(top.len());
        for (score, addr) in top {
            let rows = searcher.segment_reader(addr.segment_ord).fast_fields().u64("row").map_err(err)?;
            if let Some(row) = rows.first(addr.doc_id) {
                hits.push((row as usize, score));
            }
        }
        Ok(hits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::{Bm25, Corpus, LexicalIndex};

    fn chunk(i: u8, text: &str) -> ChunkRecord {
        let (terms, length) = crate::lexical::hashed_terms(text, |t| {
            t.bytes().fold(1469598103934665603u64, |h, b| (h ^ u64::from(b)).wrapping_mul(1099511628211))
        });
        ChunkRecord { id: [i; 32], length, terms }
    }

    #[test]
    fn tantivy_ranks_like_our_bm25_and_round_trips() {
        let texts = [
            "retry the upload with backoff after a failed upload",
            "render a table of rows",
            "upload a file once",
            "parse the configuration file and retry on error",
            "the table has rows and columns and a header row",
        ];
        let chunks: Vec<ChunkRecord> = texts.iter().enumerate().map(|(i, t)| chunk(i as u8, t)).collect();
        let index = Bm25Index::build(&chunks).unwrap();
        let ours = LexicalIndex::build(chunks.iter().map(|c| (c.terms.as_slice(), c.length)));
        let query: Vec<u64> = chunk(0, "retry upload table").terms.iter().map(|(t, _)| *t).collect();
        let corpus = Corpus::of(&[&ours], &query);
        let stats = Stats {
            docs: index.docs(),
            tokens: index.tokens(),
            df: query.iter().map(|t| (*t, index.doc_freq(*t))).collect(),
        };
        assert_eq!(stats.tokens, corpus.total_tokens());
        let theirs = index.search(&query, 5, &stats).unwrap();
        let mine = ours.search_with(&query, 5, Bm25::default(), &corpus);
        let rows = |h: &[Hit]| h.iter().map(|(r, _)| *r).collect::<Vec<_>>();
        assert_eq!(rows(&theirs), rows(&mine));
        for ((_, a), (_, b)) in theirs.iter().zip(&mine) {
            assert!((a - b).abs() < 0.05 * b, "tantivy {a} vs ours {b}");
        }
        let back = Bm25Index::from_bytes(&index.to_bytes().unwrap()).unwrap();
        assert_eq!(back.search(&query, 5, &stats).unwrap(), theirs);
        assert!(Bm25Index::from_bytes(b"garbage").is_err());
    }
}
