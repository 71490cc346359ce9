//! Approximate nearest neighbours for large namespaces: an HNSW graph (usearch) over unit
//! vectors, scored by inner product. Small namespaces use [`crate::rank::exact_top_k`].
//!
//! The graph keeps its own copy of each vector, quantised to 8 bits (384 bytes for a
//! 384-wide vector rather than 1,536): it only steers the walk. The candidates it finds are
//! scored exactly against the segment's vector block, which the segment holds anyway.

use crate::rank::Hit;

/// HNSW parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnnParams {
    /// Links per node.
    pub connectivity: usize,
    /// Candidates considered while inserting.
    pub expansion_add: usize,
    /// Candidates considered while searching (recall against latency).
    pub expansion_search: usize,
}

impl Default for AnnParams {
    fn default() -> Self {
        AnnParams { connectivity: 16, expansion_add: 128, expansion_search: 96 }
    }
}

/// An ANN index over rows `0..n` of a vector block.
pub struct AnnIndex {
    index: usearch::Index,
    dim: usize,
}

impl std::fmt::Debug for AnnIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnnIndex").field("dim", &self.dim).field("len", &self.index.size()).finish()
    }
}

fn err(e: impl std::fmt::Display) -> crate::Error {
    crate::Error::Ann(e.to_string())
}

fn options(dim: usize, params: AnnParams) -> usearch::IndexOptions {
    usearch::IndexOptions {
        dimensions: dim,
        metric: usearch::MetricKind::IP,
        quantization: usearch::ScalarKind::I8,
        connectivity: params.connectivity,
        expansion_add: params.expansion_add,
        expansion_search: params.expansion_search,
        multi: false,
    }
}

impl AnnIndex {
    /// Builds the index over `vectors` (row-major, `dim` wide), inserting in parallel.
    pub fn build(vectors: &[f32], dim: usize, params: AnnParams) -> crate::Result<Self> {
        use rayon::prelude::*;
        let index = usearch::Index::new(&options(dim, params)).map_err(err)?;
        let rows = vectors.len() / dim.max(1);
        index.reserve_capacity_and_threads(rows, rayon::current_num_threads()).map_err(err)?;
        vectors
            .par_chunks_exact(dim.max(1))
            .enumerate()
            .try_for_each(|(i, row)| index.add(i as u64, row).map_err(err))?;
        Ok(AnnIndex { index, dim })
    }

    /// Adds rows `from..` of `vectors` (row-major, the index's width) to the graph, in
    /// parallel: a graph over a block that grew at its end need not be built anew.
    pub fn add_rows(&self, vectors: &[f32], from: usize) -> crate::Result<()> {
        use rayon::prelude::*;
        let dim = self.dim.max(1);
        let rows = vectors.len() / dim;
        if from >= rows {
            return Ok(());
        }
        self.index.reserve_capacity_and_threads(rows, rayon::current_num_threads()).map_err(err)?;
        vectors[from * dim..rows * dim]
            .par_chunks_exact(dim)
            .enumerate()
            .try_for_each(|(i, row)| self.index.add((from + i) as u64, row).map_err(err))
    }

    /// The `k` approximately nearest rows to `query`, best first, scored by their exact inner
    /// product with `query` in `block` (the vectors the graph was built over, row-major): the
    /// graph's quantised order picks twice as many candidates as asked, the block orders them.
    pub fn search(&self, query: &[f32], k: usize, block: &[f32]) -> crate::Result<Vec<Hit>> {
        if query.len() != self.dim || k == 0 {
            return Ok(Vec::new());
        }
        let found = self.index.search(query, (2 * k).max(k + 16)).map_err(err)?;
        let scored = found.keys.iter().filter_map(|key| {
            let row = usize::try_from(*key).ok()?;
            Some((row, crate::rank::dot(block.get(row * self.dim..(row + 1) * self.dim)?, query)))
        });
        Ok(crate::rank::top_k(scored, k))
    }

    /// The bytes the graph holds in memory (its links and its quantised vectors).
    pub fn memory_bytes(&self) -> usize {
        self.index.memory_usage()
    }

    /// The graph as bytes, to store beside a segment.
    pub fn to_bytes(&self) -> crate::Result<Vec<u8>> {
        let mut buf = vec![0u8; self.index.serialized_length()];
        self.index.save_to_buffer(&mut buf).map_err(err)?;
        Ok(buf)
    }

    /// A graph saved by [`AnnIndex::to_bytes`] over `dim`-wide vectors.
    pub fn from_bytes(bytes: &[u8], dim: usize, params: AnnParams) -> crate::Result<Self> {
        let index = usearch::Index::new(&options(dim, params)).map_err(err)?;
        index.load_from_buffer(bytes).map_err(err)?;
        if index.dimensions() != dim {
            return Err(crate::Error::Ann(format!("stored graph is {} wide, expected {dim}", index.dimensions())));
        }
        Ok(AnnIndex { index, dim })
    }

    /// Number of indexed rows.
    pub fn len(&self) -> usize {
        self.index.size()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Synthetic unit vectors shaped like real sentence embeddings, for benchmarks and tests:
/// a random 32-dimensional latent code (clustered around 256 centres) mapped linearly into
/// `dim` dimensions, plus a little isotropic noise, then normalised. Real embeddings have a low
/// intrinsic dimension; uniformly random vectors in 384 dimensions would make every neighbour
/// nearly equidistant, which is neither realistic nor a meaningful recall test. Deterministic.
pub fn synthetic_embeddings(n: usize, dim: usize, seed: u64) -> Vec<f32> {
    const LATENT: usize = 32;
    // The map and the centres come from a fixed seed, so every call shares one "model"; the
    // points come from `seed`.
    let stream = |mut s: u64| {
        move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        }
    };
    let mut fixed = stream(0x5eed);
    let map: Vec<f32> = (0..dim * LATENT).map(|_| fixed()).collect();
    let centres: Vec<f32> = (0..256 * LATENT).map(|_| fixed()).collect();
    let mut rand = stream(seed);
    let mut out = Vec::with_capacity(n * dim);
    let mut z = [0.0f32; LATENT];
    for _ in 0..n {
        let c = ((rand() + 1.0) * 128.0) as usize % 256;
        for (j, zj) in z.iter_mut().enumerate() {
            *zj = centres[c * LATENT + j] + 0.5 * rand();
        }
        let mut v: Vec<f32> = (0..dim)
            .map(|i| map[i * LATENT..(i + 1) * LATENT].iter().zip(&z).map(|(a, b)| a * b).sum::<f32>() + 0.05 * rand())
            .collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
        v.iter_mut().for_each(|x| *x /= norm);
        out.extend(v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::exact_top_k;

    #[test]
    fn ann_recall_against_exact_is_high() {
        let (n, dim) = (5000, 64);
        let vectors = synthetic_embeddings(n, dim, 1);
        let index = AnnIndex::build(&vectors, dim, AnnParams::default()).unwrap();
        assert_eq!(index.len(), n);
        let queries = synthetic_embeddings(50, dim, 2);
        let mut found = 0;
        for q in queries.chunks_exact(dim) {
            let exact_hits = exact_top_k(&vectors, dim, q, 10);
            let exact: Vec<usize> = exact_hits.iter().map(|h| h.0).collect();
            let ann = index.search(q, 10, &vectors).unwrap();
            for (row, score) in &ann {
                if let Some(e) = exact_hits.iter().find(|e| e.0 == *row) {
                    assert!((e.1 - score).abs() < 1e-3, "row {row}: ANN scores {score}, exact {}", e.1);
                }
            }
            found += ann.iter().filter(|h| exact.contains(&h.0)).count();
        }
        let recall = found as f64 / 500.0;
        assert!(recall >= 0.95, "recall@10 {recall}");
        assert!(index.search(&[0.0; 3], 10, &vectors).unwrap().is_empty(), "wrong dimension");
    }

    #[test]
    fn a_graph_stored_with_full_width_vectors_still_loads_and_finds() {
        // Graphs stored before the graph's vectors were quantised hold 32-bit floats.
        let (n, dim) = (2000, 32);
        let vectors = synthetic_embeddings(n, dim, 5);
        let old = usearch::Index::new(&usearch::IndexOptions {
            quantization: usearch::ScalarKind::F32,
            ..options(dim, AnnParams::default())
        })
        .unwrap();
        old.reserve(n).unwrap();
        for (i, row) in vectors.chunks_exact(dim).enumerate() {
            old.add(i as u64, row).unwrap();
        }
        let mut bytes = vec![0u8; old.serialized_length()];
        old.save_to_buffer(&mut bytes).unwrap();
        let loaded = AnnIndex::from_bytes(&bytes, dim, AnnParams::default()).unwrap();
        assert_eq!(loaded.len(), n);
        for row in (0..n).step_by(101) {
            let hits = loaded.search(&vectors[row * dim..(row + 1) * dim], 3, &vectors).unwrap();
            assert_eq!(hits[0].0, row, "a stored row is its own nearest");
            assert!((hits[0].1 - 1.0).abs() < 1e-4, "scored exactly: {}", hits[0].1);
        }
    }

    #[test]
    fn quantised_graph_is_smaller_than_its_vectors() {
        let (n, dim) = (3000, 384);
        let vectors = synthetic_embeddings(n, dim, 6);
        let index = AnnIndex::build(&vectors, dim, AnnParams::default()).unwrap();
        let per_row = index.to_bytes().unwrap().len() / n;
        // 384 one-byte components and the links, well under the 1,536 bytes of the floats.
        assert!(per_row < 700, "{per_row} bytes a row");
    }

    #[test]
    fn a_graph_extended_with_new_rows_finds_them_as_one_built_whole_does() {
        let (n, more, dim) = (3000, 2000, 64);
        let vectors = synthetic_embeddings(n + more, dim, 3);
        let first = AnnIndex::build(&vectors[..n * dim], dim, AnnParams::default()).unwrap();
        // A copy, as a compaction takes the live segment's graph.
        let grown = AnnIndex::from_bytes(&first.to_bytes().unwrap(), dim, AnnParams::default()).unwrap();
        grown.add_rows(&vectors, n).unwrap();
        assert_eq!((first.len(), grown.len()), (n, n + more), "the original is untouched");
        grown.add_rows(&vectors, n + more).unwrap();
        assert_eq!(grown.len(), n + more, "nothing past the end");
        let queries = synthetic_embeddings(50, dim, 4);
        let mut found = 0;
        for q in queries.chunks_exact(dim) {
            let exact: Vec<usize> = exact_top_k(&vectors, dim, q, 10).iter().map(|h| h.0).collect();
            found += grown.search(q, 10, &vectors).unwrap().iter().filter(|h| exact.contains(&h.0)).count();
        }
        let recall = found as f64 / 500.0;
        assert!(recall >= 0.95, "recall@10 {recall}");
        // Each new row is its own nearest neighbour.
        for row in (n..n + more).step_by(97) {
            let hits = grown.search(&vectors[row * dim..(row + 1) * dim], 1, &vectors).unwrap();
            assert_eq!(hits[0].0, row);
        }
    }
}
