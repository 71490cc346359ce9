//! Namespaces on an in-memory object store: logs, compaction, search, concurrent writers, damage.

use std::sync::Arc;

use object_store::memory::InMemory;

use super::*;

fn file(path: &str, leaf: u8, chunk: u8) -> Record {
    Record::File(FileRecord {
        path: path.to_owned(),
        leaf: [leaf; 32],
        chunks: vec![ChunkRef {
            id: [chunk; 32],
            start_line: 1,
            end_line: 2,
            language: "rust".into(),
            kind: "code".into(),
        }],
    })
}

fn chunk(id: u8) -> Record {
    Record::Chunk(ChunkRecord { id: [id; 32], length: 3, terms: vec![(1, 2)] })
}

#[tokio::test]
async fn appends_replay_in_order_and_deletes_subtrees() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store.clone(), "t/w");
    let mut state = ns.load().await.unwrap();
    ns.append(&mut state, vec![chunk(1), file("a/x", 1, 1), file("a/y", 2, 1), file("b", 3, 1)]).await.unwrap();
    ns.append(&mut state, vec![file("b", 4, 1), Record::Delete("a".into())]).await.unwrap();
    let mut loaded = Namespace::new(store, "t/w").load().await.unwrap();
    assert_eq!(loaded.seq, 2);
    assert_eq!(loaded.files.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["b"]);
    assert_eq!(loaded.files.get("b").unwrap().leaf, [4; 32]);
    assert_eq!(loaded.chunks.len(), 1);
    assert_eq!(loaded.tree().root_hash(), state.tree().root_hash());
}

#[tokio::test]
async fn concurrent_writers_never_share_a_sequence_number() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store.clone(), "t/w");
    let mut a = ns.load().await.unwrap();
    let mut b = ns.load().await.unwrap();
    let sa = ns.append(&mut a, vec![file("from-a", 1, 1)]).await.unwrap();
    // b's view is stale; its append must catch up and take the next number.
    let sb = ns.append(&mut b, vec![file("from-b", 2, 1)]).await.unwrap();
    assert_eq!((sa, sb), (1, 2));
    assert_eq!(b.files.len(), 2, "b caught up with a's commit");
    let loaded = ns.load().await.unwrap();
    assert_eq!(loaded.files.len(), 2);
}

/// A toy keyed hash for fixtures.
fn h(t: &str) -> u64 {
    t.bytes().fold(1469598103934665603u64, |h, b| (h ^ u64::from(b)).wrapping_mul(1099511628211))
}

/// A chunk record with the terms of `text`.
fn text_chunk(id: u8, text: &str) -> Record {
    let (terms, length) = lexical::hashed_terms(text, h);
    Record::Chunk(ChunkRecord { id: [id; 32], length, terms })
}

/// A unit vector in 4 dimensions pointing mostly along `axis`.
fn unit(axis: usize, tilt: f32) -> Vec<f32> {
    let mut v = [tilt; 4];
    v[axis] = 1.0;
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

fn vectors(rows: &[(u8, Vec<f32>)]) -> Record {
    Record::Vectors(VectorBatch {
        model: "m".into(),
        dim: 4,
        ids: rows.iter().map(|(id, _)| [*id; 32]).collect(),
        data: rows.iter().flat_map(|(_, v)| v.clone()).collect(),
    })
}

fn query(text: &str, vector: Option<Vec<f32>>, k: usize) -> Query {
    let mut terms = Vec::new();
    lexical::terms(text, |t| terms.push(h(t)));
    Query {
        terms,
        vector: vector.map(|v| ("m".to_owned(), v)),
        k,
        candidates: 50,
        weights: Weights::default(),
        ..Query::default()
    }
}

/// The same hits in the same order with nearly the same scores: a segment's BM25 (tantivy)
/// stores lengths in one byte, so its scores differ from the tail's exact ones in the third
/// digit.
#[track_caller]
fn same(a: &[SearchHit], b: &[SearchHit]) {
    let key = |h: &[SearchHit]| h.iter().map(|x| (x.path.clone(), x.id, x.start_line)).collect::<Vec<_>>();
    assert_eq!(key(a), key(b));
    for (x, y) in a.iter().zip(b) {
        assert!((x.score - y.score).abs() <= 0.05 * x.score.abs().max(y.score.abs()), "{x:?} vs {y:?}");
    }
}

fn paths(hits: &[SearchHit]) -> Vec<&str> {
    hits.iter().map(|h| h.path.as_str()).collect()
}

/// Six files about different things, with vectors on four axes.
async fn corpus(ns: &Namespace) -> State {
    let mut state = ns.load().await.unwrap();
    let docs = [
        (1, "upload", "fn retry_upload(attempts) { for attempt in attempts { send_chunk(); backoff(attempt) } }", 0),
        (2, "parse", "fn parse_config(text) { toml::from_str(text) }", 1),
        (3, "render", "fn render_table(rows) { for row in rows { print_cell(row) } }", 2),
        (4, "auth", "fn check_token(token) { verify_signature(token) }", 3),
        (5, "readme", "Uploads are retried with exponential backoff when they fail.", 0),
        (6, "cache", "fn evict_oldest(cache) { cache.pop_lru() }", 1),
    ];
    for (id, path, text, axis) in docs {
        let mut f = file(path, id, id);
        if let Record::File(f) = &mut f {
            f.chunks[0].kind = if path == "readme" { "docs".into() } else { "code".into() };
        }
        ns.append(&mut state, vec![text_chunk(id, text), f]).await.unwrap();
        ns.append(&mut state, vec![vectors(&[(id, unit(axis, 0.1 * f32::from(id)))])]).await.unwrap();
    }
    state
}

#[tokio::test]
async fn hybrid_search_fuses_terms_and_vectors() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store, "t/w");
    let mut state = corpus(&ns).await;
    // Lexical only: the rare term decides.
    assert_eq!(paths(&state.search(&query("parse_config", None, 1))), ["parse"]);
    // Vector only (no shared terms): nearest on axis 3.
    assert_eq!(paths(&state.search(&query("zzz", Some(unit(3, 0.0)), 1))), ["auth"]);
    // Both agree on "upload": code ranks over the docs that say the same.
    let both = state.search(&query("retry upload backoff", Some(unit(0, 0.0)), 3));
    assert_eq!(paths(&both)[..2], ["upload", "readme"]);
    assert!(both[0].lexical_rank.is_some() && both[0].vector_rank.is_some());
    // Deleted files never come back, even though their chunk is still stored.
    ns.append(&mut state, vec![Record::Delete("upload".into())]).await.unwrap();
    let after = state.search(&query("retry upload backoff", Some(unit(0, 0.0)), 6));
    assert!(!paths(&after).contains(&"upload"));
    assert_eq!(after[0].path, "readme");
}

#[tokio::test]
async fn compaction_keeps_answers_and_survives_corruption() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store.clone(), "t/w");
    let mut state = corpus(&ns).await;
    let q = query("retry upload render table token", Some(unit(2, 0.0)), 6);
    let before = state.search(&q);
    let segment = ns.compact(state.compaction_plan()).await.unwrap().unwrap();
    assert_eq!((segment.seq(), segment.chunks(), segment.vectors()), (12, 6, 6));
    state.install(segment);
    same(&state.search(&q), &before);

    // More writes after the segment: a loaded state is segment + tail.
    ns.append(&mut state, vec![text_chunk(7, "fn render_chart() {}"), file("chart", 7, 7)]).await.unwrap();
    let q2 = query("render", None, 2);
    let expected = state.search(&q2);
    let mut loaded = ns.load().await.unwrap();
    assert_eq!(loaded.segment().map(|s| s.seq()), Some(12));
    same(&loaded.search(&q2), &expected);
    assert_eq!(loaded.tree().root_hash(), state.tree().root_hash());

    // A corrupt segment: logged, and the state rebuilt from the log alone.
    let mut segs: Vec<String> =
        store.list(Some(&ObjPath::from("t/w/seg"))).map_ok(|m| m.location.to_string()).try_collect().await.unwrap();
    segs.sort();
    assert_eq!(segs.len(), 2, "segment and BM25 index, no ANN graph below the threshold: {segs:?}");
    assert!(segs[1].ends_with(".bm25"), "{segs:?}");
    // A corrupt BM25 index alone: rebuilt from the chunk table, same answers.
    store.put(&ObjPath::from(segs[1].as_str()), PutPayload::from_static(b"garbage")).await.unwrap();
    let mut reindexed = ns.load().await.unwrap();
    assert!(reindexed.segment().is_some());
    same(&reindexed.search(&q2), &expected);
    // … and stored again, sealed, so the next load reads it.
    let mended = store.get(&ObjPath::from(segs[1].as_str())).await.unwrap().bytes().await.unwrap();
    assert!(mended.len() > 32 && mended.as_ref() != b"garbage", "the rebuilt index is stored again");
    let (body, sum) = mended.split_at(mended.len() - 32);
    assert_eq!(blake3::hash(body).as_bytes(), sum, "sealed");
    same(&ns.load().await.unwrap().search(&q2), &expected);
    store.put(&ObjPath::from(segs[0].as_str()), PutPayload::from_static(b"garbage")).await.unwrap();
    let mut rebuilt = ns.load().await.unwrap();
    assert!(rebuilt.segment().is_none());
    same(&rebuilt.search(&q2), &expected);
    same(&rebuilt.search(&q), &state.search(&q));
}

/// A fork starts from its source's segment: copied inside the bucket, held once in memory,
/// with only its own changes beside it; it keeps its copy when the source compacts again and
/// collects the generation it was forked from, and another process loads it from that copy.
#[tokio::test]
async fn a_fork_shares_its_sources_segment_and_outlives_the_sources_collection() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let bases = Arc::new(Bases::new());
    let a = Namespace::new(store.clone(), "t/a").with_bases(bases.clone());
    let b = Namespace::new(store.clone(), "t/b").with_bases(bases.clone());
    let mut sa = corpus(&a).await;
    assert_eq!(b.fork_from(&a).await.unwrap(), None, "no segment yet: nothing to start from");
    let base = a.compact(sa.compaction_plan()).await.unwrap().unwrap();
    let forked_from = base.segment().name.clone();
    sa.install(base);
    let seq = b.fork_from(&a).await.unwrap().expect("an empty namespace forks");
    assert_eq!(seq, sa.seq);
    let mut sb = b.load().await.unwrap();
    assert_eq!(sb.seq, seq);
    assert!(Arc::ptr_eq(sb.base().unwrap(), sa.base().unwrap()), "one copy in memory");
    assert_eq!(bases.held(), (1, 2));
    assert_eq!(sb.own_entries(), 0);
    let q = query("retry upload render table token", Some(unit(2, 0.0)), 6);
    same(&sb.search(&q), &sa.search(&q));

    // The fork changes one file and deletes another: only those are its own.
    let chart =
        vec![text_chunk(40, "fn plot_histogram(points) {}"), file("render", 40, 40), Record::Delete("cache".into())];
    b.append(&mut sb, chart).await.unwrap();
    assert_eq!(sb.file_count(), 5);
    assert!(sb.own_entries() <= 12, "a change costs its own entries, not the workspace's: {}", sb.own_entries());
    let chart = query("plot_histogram", None, 3);
    assert_eq!(paths(&sb.search(&chart)), ["render"]);
    assert!(sa.search(&chart).is_empty(), "the source is untouched");
    assert_eq!(paths(&sa.search(&query("evict_oldest", None, 3))), ["cache"]);
    assert!(sb.search(&query("evict_oldest", None, 3)).is_empty());

    // The source compacts twice: the generation the fork came from is collected there.
    for round in 0..2u8 {
        a.append(
            &mut sa,
            vec![text_chunk(50 + round, "fn extra() {}"), file(&format!("x{round}"), 50 + round, 50 + round)],
        )
        .await
        .unwrap();
        let base = a.compact(sa.compaction_plan()).await.unwrap().unwrap();
        sa.install(base);
    }
    assert!(a.get(&a.seg(&forked_from)).await.is_err(), "collected in the source");
    // Another process, holding nothing, loads the fork from its own copy.
    let mut elsewhere = Namespace::new(store.clone(), "t/b").load().await.unwrap();
    assert!(!Arc::ptr_eq(elsewhere.base().unwrap(), sb.base().unwrap()));
    same(&elsewhere.search(&q), &sb.search(&q));
    assert_eq!(elsewhere.tree().root_hash(), sb.tree().root_hash());
}

/// A delta folds the log since the segment into one object beside it: a fresh process loads
/// the same state from segment + delta, the segment object is kept while the log and older
/// deltas go, a fork carries the delta, and a damaged delta falls back to the generation
/// before it and the log it kept.
#[tokio::test]
async fn a_delta_folds_the_log_beside_the_segment_it_keeps() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store.clone(), "t/w");
    let mut state = corpus(&ns).await;
    let base = ns.compact(state.compaction_plan()).await.unwrap().unwrap();
    let segment = base.segment().name.clone();
    state.install(base);
    let q = query("retry upload render table token plot_histogram", Some(unit(2, 0.0)), 6);
    for round in 0..3u8 {
        let records = vec![
            text_chunk(60 + round, "fn plot_histogram(bins) {}"),
            file(&format!("plot{round}"), 60 + round, 60 + round),
            Record::Delete(["cache", "auth", "parse"][usize::from(round)].into()),
            vectors(&[(60 + round, unit(usize::from(round), 0.3))]),
        ];
        ns.append(&mut state, records).await.unwrap();
        let seq = ns.compact_delta(state.delta_plan().unwrap()).await.unwrap().unwrap();
        state.delta_folded(seq);
        assert_eq!(state.tail_size(), (0, 0));
    }
    let mut loaded = Namespace::new(store.clone(), "t/w").load().await.unwrap();
    same(&loaded.search(&q), &state.search(&q));
    assert_eq!(loaded.tree().root_hash(), state.tree().root_hash());
    assert_eq!(loaded.file_count(), 6);
    assert_eq!(loaded.vector_progress("m"), state.vector_progress("m"));
    assert_eq!(loaded.segment().map(|s| s.name.clone()), Some(segment.clone()), "the segment is kept");
    let count = |dir: &'static str| {
        let store = store.clone();
        async move { store.list(Some(&ObjPath::from(dir))).try_collect::<Vec<_>>().await.unwrap().len() }
    };
    assert_eq!(count("t/w/delta").await, 2, "the deltas of the two kept generations");
    assert_eq!(count("t/w/seg").await, 2, "one segment with its BM25 index");
    assert_eq!(count("t/w/wal").await, 1, "the log after the previous generation");

    let fork = Namespace::new(store.clone(), "t/f");
    fork.fork_from(&ns).await.unwrap().unwrap();
    let mut forked = fork.load().await.unwrap();
    same(&forked.search(&q), &state.search(&q));
    assert_eq!(forked.tree().root_hash(), state.tree().root_hash());

    let m = ns.list_manifests().await.unwrap();
    let newest = open_manifest(&ns.get(&m[0].1).await.unwrap()).unwrap();
    store.put(&ns.delta(newest.delta.as_deref().unwrap()), PutPayload::from_static(b"garbage")).await.unwrap();
    let mut fallback = Namespace::new(store.clone(), "t/w").load().await.unwrap();
    same(&fallback.search(&q), &state.search(&q));
    assert_eq!(fallback.tree().root_hash(), state.tree().root_hash());
}

#[tokio::test]
async fn a_compaction_that_dies_before_its_manifest_changes_nothing() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store.clone(), "t/w");
    let mut state = corpus(&ns).await;
    let q = query("retry upload", Some(unit(0, 0.0)), 6);
    let before = state.search(&q);
    ns.compact(state.compaction_plan()).await.unwrap().unwrap();
    // Simulate the crash: the segment was written, the manifest never was.
    store.delete(&ObjPath::from("t/w/manifest/00000000000000000001")).await.unwrap();
    let mut loaded = ns.load().await.unwrap();
    assert!(loaded.segment().is_none(), "an orphan segment is ignored");
    same(&loaded.search(&q), &before);
}

#[tokio::test]
async fn racing_compactors_one_wins_and_queries_never_wait() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store.clone(), "t/w");
    let state = Arc::new(tokio::sync::Mutex::new(corpus(&ns).await));
    let q = query("retry upload render", Some(unit(0, 0.0)), 6);
    let expected = state.lock().await.search(&q);
    let plan = state.lock().await.compaction_plan();
    let (a, b) = (ns.clone(), ns.clone());
    let (pa, pb) = (plan.clone(), plan);
    let ca = tokio::spawn(async move { a.compact(pa).await });
    let cb = tokio::spawn(async move { b.compact(pb).await });
    // Queries run while the compactions do, and see the same answers.
    for _ in 0..20 {
        same(&state.lock().await.search(&q), &expected);
        tokio::task::yield_now().await;
    }
    let (ra, rb) = (ca.await.unwrap().unwrap(), cb.await.unwrap().unwrap());
    assert_eq!(usize::from(ra.is_some()) + usize::from(rb.is_some()), 1, "exactly one manifest is written");
    let winner = ra.or(rb).unwrap();
    state.lock().await.install(winner);
    same(&state.lock().await.search(&q), &expected);
    let segs: Vec<_> = store.list(Some(&ObjPath::from("t/w/seg"))).try_collect().await.unwrap();
    assert_eq!(segs.len(), 2, "the loser deleted its segment and BM25 index");
}

#[tokio::test]
async fn files_with_unstored_chunks_get_a_leaf_no_client_has() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store.clone(), "t/w");
    let mut state = ns.load().await.unwrap();
    ns.append(&mut state, vec![chunk(1), file("a", 1, 1)]).await.unwrap();
    let good = state.tree().root_hash();
    // A log object the chunk was in is lost: the file must look changed to its client.
    store.put(&ObjPath::from("t/w/wal/00000000000000000001"), PutPayload::from_static(b"garbage!")).await.unwrap();
    ns.append(&mut state, vec![file("a", 1, 1)]).await.unwrap();
    let mut loaded = ns.load().await.unwrap();
    assert_eq!(loaded.files.len(), 1);
    assert_ne!(loaded.tree().root_hash(), good);
    let missing = loaded.missing_vectors("m", 10);
    assert_eq!((missing.chunks.len(), missing.total), (1, 1));
}

#[test]
fn ann_graphs_round_trip_through_bytes() {
    let dim = 16;
    let data = ann::synthetic_embeddings(500, dim, 7);
    let index = AnnIndex::build(&data, dim, AnnParams::default()).unwrap();
    let bytes = index.to_bytes().unwrap();
    let back = AnnIndex::from_bytes(&bytes, dim, AnnParams::default()).unwrap();
    let q = &data[dim * 3..dim * 4];
    assert_eq!(back.search(q, 5, &data).unwrap(), index.search(q, 5, &data).unwrap());
    assert!(AnnIndex::from_bytes(&bytes, dim + 1, AnnParams::default()).is_err());
}

#[tokio::test]
async fn works_on_the_local_file_system() {
    let dir = caret_test_support::TempDir::new();
    let store: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let ns = Namespace::new(store.clone(), "t/w");
    let mut a = ns.load().await.unwrap();
    let mut b = ns.load().await.unwrap();
    ns.append(&mut a, vec![file("x", 1, 1)]).await.unwrap();
    ns.append(&mut b, vec![file("y", 1, 1)]).await.unwrap();
    assert_eq!(ns.load().await.unwrap().files.len(), 2, "create-if-absent holds on a local directory");
    ns.destroy().await.unwrap();
    assert!(ns.load().await.unwrap().files.len() == 0);
}

#[tokio::test]
async fn old_generations_are_collected_and_stale_readers_reload() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store.clone(), "t/w");
    let mut state = corpus(&ns).await;
    let mut stale = ns.load().await.unwrap();
    let q = query("retry upload render", Some(unit(0, 0.0)), 6);
    for round in 0..3u8 {
        ns.append(
            &mut state,
            vec![text_chunk(20 + round, "fn extra() {}"), file(&format!("x{round}"), 20 + round, 20 + round)],
        )
        .await
        .unwrap();
        let seg = ns.compact(state.compaction_plan()).await.unwrap().unwrap();
        state.install(seg);
    }
    let count = |dir: &'static str| {
        let store = store.clone();
        async move { store.list(Some(&ObjPath::from(dir))).try_collect::<Vec<_>>().await.unwrap().len() }
    };
    assert_eq!(count("t/w/manifest").await, 2, "two generations are kept");
    assert_eq!(count("t/w/seg").await, 4, "two segments with their BM25 indexes");
    // The log the previous generation covers is gone; the rest is kept.
    assert_eq!(count("t/w/wal").await, 1);
    let mut loaded = ns.load().await.unwrap();
    same(&loaded.search(&q), &state.search(&q));
    assert_eq!(loaded.files.len(), state.files.len());
    // A reader that slept through the compactions is told to reload.
    assert!(matches!(ns.refresh(&mut stale).await, Err(Error::Gap(_))));
    // With the current segment corrupt, the previous one plus the kept log still answer.
    let m = ns.list_manifests().await.unwrap();
    let newest = open_manifest(&ns.get(&m[0].1).await.unwrap()).unwrap();
    store.put(&ns.seg(&newest.segment), PutPayload::from_static(b"garbage")).await.unwrap();
    let mut fallback = ns.load().await.unwrap();
    assert_eq!(fallback.files.len(), state.files.len());
    same(&fallback.search(&q), &state.search(&q));
}

/// Chunk 1: `fn steal_into`, its name indexed as a defined name.
fn defines_steal_into() -> Record {
    let (mut terms, length) = lexical::hashed_terms("fn steal_into(&self, dst) { move_half(dst) }", h);
    lexical::defined_terms(&["steal_into".to_owned()], |t| terms.push((h(t), 1)));
    terms.sort_unstable();
    Record::Chunk(ChunkRecord { id: [1; 32], length, terms })
}

/// A query that names a symbol whole finds the chunk that defines it before chunks that use
/// it more often; a prose question names no symbol and ranks as before.
#[tokio::test]
async fn a_named_symbol_ranks_its_definition_first() {
    assert_eq!(lexical::symbols("where is steal_into called"), ["steal_into"]);
    assert_eq!(lexical::symbols("JoinSet and mem::take_while, HashMap"), ["joinset", "take_while", "hashmap"]);
    assert!(lexical::symbols("Steal tasks from a worker's queue _private").is_empty());
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store, "t/w");
    let mut state = ns.load().await.unwrap();
    let defining = defines_steal_into();
    let caller = text_chunk(2, "steal_into(a); steal_into(b); steal_into(c); steal into");
    ns.append(&mut state, vec![defining, caller, file("queue", 1, 1), file("worker", 2, 2)]).await.unwrap();
    let mut q = query("steal_into", None, 2);
    assert_eq!(paths(&state.search(&q)), ["worker", "queue"], "without the symbol, the uses win");
    q.symbols = lexical::symbols("steal_into").iter().map(|s| h(&lexical::definition_term(s))).collect();
    assert_eq!(paths(&state.search(&q)), ["queue", "worker"], "the definition first");
    q.weights.symbol = 0.0;
    assert_eq!(paths(&state.search(&q)), ["worker", "queue"], "the weight turns it off");
}

/// With the definitions weight on, a chunk that defines what the query names outranks chunks
/// that only use it, however often; and a file where several chunks match rises above a file
/// with one.
#[tokio::test]
async fn definitions_and_files_with_several_matches_rank_first() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store, "t/w");
    let mut state = ns.load().await.unwrap();
    let defining = defines_steal_into();
    let caller = text_chunk(2, "if idle { steal steal steal: queue.steal_into(other); steal_into(x); steal }");
    ns.append(&mut state, vec![defining, caller, file("queue", 1, 1), file("worker", 2, 2)]).await.unwrap();
    let mut q = query("steal tasks", None, 2);
    q.weights.definition = 0.5;
    assert_eq!(paths(&state.search(&q)), ["worker", "queue"], "without the defined names, uses win");
    lexical::terms("steal tasks", |t| q.definitions.push(h(&lexical::definition_term(t))));
    assert_eq!(paths(&state.search(&q)), ["queue", "worker"], "the definition first");

    // Two files each with one chunk as good as the other; a third chunk matching in the
    // second file lifts it.
    let mut state = ns.load().await.unwrap();
    let two = |path: &str, ids: [u8; 2]| {
        Record::File(FileRecord {
            path: path.to_owned(),
            leaf: [ids[0]; 32],
            chunks: ids
                .iter()
                .enumerate()
                .map(|(i, id)| ChunkRef {
                    id: [*id; 32],
                    start_line: 1 + 10 * i as u32,
                    end_line: 9 + 10 * i as u32,
                    language: "rust".into(),
                    kind: "code".into(),
                })
                .collect(),
        })
    };
    ns.append(
        &mut state,
        vec![
            text_chunk(10, "evict the oldest entry of the cache"),
            text_chunk(11, "unrelated words only"),
            text_chunk(12, "evict the oldest entry of the cache"),
            text_chunk(13, "when the cache is full, evict"),
            two("a", [10, 11]),
            two("b", [12, 13]),
        ],
    )
    .await
    .unwrap();
    let q = query("evict oldest cache", None, 4);
    let hits = state.search(&q);
    assert_eq!(hits[0].path, "b", "{hits:?}");
    let mut flat = q.clone();
    flat.weights.file = 0.0;
    let hits = state.search(&flat);
    assert_eq!(hits.iter().filter(|h| h.id == [10; 32] || h.id == [12; 32]).count(), 2);
}

/// Chunks are listed for embedding stage by stage — code, then tests, then the rest — a chunk
/// shared by code and a test counting as code, each stage counted; bulk data never.
#[tokio::test]
async fn missing_vectors_come_code_first() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store, "t/w");
    let mut state = ns.load().await.unwrap();
    let of_kind = |path: &str, leaf: u8, chunk: u8, kind: &str| {
        let mut f = file(path, leaf, chunk);
        if let Record::File(f) = &mut f {
            f.chunks[0].kind = kind.into();
        }
        f
    };
    ns.append(
        &mut state,
        vec![
            chunk(1),
            chunk(2),
            chunk(3),
            chunk(4),
            of_kind("readme", 4, 4, "docs"),
            of_kind("test_a", 3, 3, "test"),
            of_kind("lib", 1, 1, "code"),
            of_kind("conf", 2, 2, "config"),
            of_kind("test_shared", 9, 1, "test"),
            chunk(5),
            of_kind("messages.po", 5, 5, "data"),
        ],
    )
    .await
    .unwrap();
    let m = state.missing_vectors("m", 10);
    let order: Vec<u8> = m.chunks.iter().map(|(id, _)| id[0]).collect();
    assert_eq!(order[0], 1, "code first: {order:?}");
    assert_eq!(order[1], 3, "then tests: {order:?}");
    assert_eq!(m.total, 4, "bulk data is not embedded");
    assert_eq!(state.vector_progress("m"), (4, 0));
    let counts: Vec<(u64, u64)> = m.stages.iter().map(|s| (s.total, s.missing)).collect();
    assert_eq!(counts, [(1, 1), (1, 1), (2, 2)]);
    ns.append(&mut state, vec![vectors(&[(1, unit(0, 0.0))])]).await.unwrap();
    let m = state.missing_vectors("m", 1);
    assert_eq!((m.chunks.len(), m.chunks[0].0[0], m.total), (1, 3, 3));
    assert_eq!(m.stages[0].missing, 0, "the code stage is done");
}

#[test]
fn chunks_that_count_more_tokens_than_a_chunk_holds_are_refused() {
    let sound = ChunkRecord { id: [1; 32], length: 3, terms: vec![(1, 2), (2, 1)] };
    let absurd = ChunkRecord { id: [2; 32], length: 3, terms: vec![(1, u32::MAX)] };
    // Each term within bounds, too many in all.
    let many = ChunkRecord { id: [3; 32], length: 3, terms: (0..8).map(|t| (t, 1 << 20)).collect() };
    assert!(sound.is_sound() && !absurd.is_sound() && !many.is_sound());

    // A log object holding one is read as corrupt (indexing it would allocate without bound).
    let batch = |c: &ChunkRecord| Batch { version: FORMAT, records: vec![Record::Chunk(c.clone())] };
    assert!(batch(&sound).is_sound() && !batch(&absurd).is_sound());

    // A segment holding one is inconsistent, and is not built.
    let data = |c: &ChunkRecord| segment::SegmentData {
        version: FORMAT,
        seq: 1,
        files: vec![],
        chunks: vec![c.clone()],
        model: None,
        dim: 0,
        vector_ids: vec![],
        vectors: vec![],
    };
    assert!(data(&sound).check().is_ok());
    let err = data(&absurd).check().unwrap_err().to_string();
    assert!(err.contains("more tokens than a chunk can hold"), "{err}");
    assert!(segment::Segment::from_data("s".into(), &data(&many), segment::Stored::default()).is_err());
}

#[tokio::test]
async fn a_log_object_with_an_impossible_chunk_is_skipped_and_the_rest_replays() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store.clone(), "t/w");
    let mut state = ns.load().await.unwrap();
    ns.append(&mut state, vec![chunk(1), file("a", 1, 1)]).await.unwrap();
    let absurd = ChunkRecord { id: [2; 32], length: 3, terms: vec![(1, u32::MAX)] };
    ns.append(&mut state, vec![Record::Chunk(absurd), file("b", 2, 2)]).await.unwrap();
    ns.append(&mut state, vec![chunk(3), file("c", 3, 3)]).await.unwrap();
    let loaded = ns.load().await.unwrap();
    let paths: Vec<&str> = loaded.files.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(paths, ["a", "c"], "the damaged object is skipped, the others replay");
}

/// The caches a search builds (where chunks are, the tail's term index) follow each change
/// as a fresh load of the same log would answer: files replaced and deleted, a chunk in two
/// files, new chunks after the first search.
#[tokio::test]
async fn cached_indexes_follow_changes_as_a_fresh_load_does() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store, "t/w");
    let mut state = corpus(&ns).await;
    let questions = ["retry upload backoff", "parse_config toml", "render rows cell", "check token signature", "lru"];
    let ask = |s: &mut State| -> Vec<Vec<SearchHit>> {
        questions.iter().map(|q| s.search(&query(q, Some(unit(0, 0.0)), 6))).collect()
    };
    ask(&mut state);
    let steps: Vec<Vec<Record>> = vec![
        // The parser rewritten: a new chunk, the old one no longer located.
        vec![text_chunk(7, "fn parse_config(text) { serde_yaml::from_str(text) } // toml too"), file("parse", 7, 7)],
        // A second file holding the renderer's chunk.
        vec![file("copy/render", 8, 3)],
        // The copy's folder deleted, then the cache file deleted.
        vec![Record::Delete("copy".into())],
        vec![
            Record::Delete("cache".into()),
            text_chunk(9, "fn lru_cache(size) { evict lru entries }"),
            file("lru", 9, 9),
        ],
    ];
    for records in steps {
        ns.append(&mut state, records).await.unwrap();
        let mut fresh = ns.load().await.unwrap();
        for (cached, loaded) in ask(&mut state).iter().zip(ask(&mut fresh)) {
            same(cached, &loaded);
        }
    }
    let hits = state.search(&query("render rows cell", None, 6));
    assert_eq!(paths(&hits), ["render"], "the deleted copy is not found");
    assert_eq!(paths(&state.search(&query("serde_yaml", None, 6))), ["parse"]);
}

/// Every live hit of a search that asks for them all, as a set: where each chunk is found.
fn all_hits(state: &mut State) -> Vec<(String, [u8; 32], u32)> {
    let q =
        Query { terms: vec![1], vector: Some(("m".into(), unit(0, 0.1))), k: 500, candidates: 500, ..Query::default() };
    let mut hits: Vec<_> = state.search(&q).into_iter().map(|h| (h.path, h.id, h.start_line)).collect();
    hits.sort();
    hits
}

/// What follows each record in place — the Merkle tree, what lacks a vector and in which
/// order, each stage's counts, the files waiting for a chunk, where each chunk is found —
/// equals what is derived anew from the same files, chunks and vectors, over random changes:
/// files of every kind replaced and deleted, folders deleted, a file that is also a folder's
/// name, a chunk held by several files, chunks arriving after the files that need them,
/// vectors arriving; with compactions between them (the state then its new segment's shared
/// tables plus the changes since), and for a fork of the namespace that takes the same changes
/// over the segment it shares.
#[tokio::test]
async fn bookkeeping_kept_in_place_equals_one_derived_anew() {
    let mut rng = fastrand::Rng::with_seed(51);
    let kinds = ["code", "test", "docs", "config", "data"];
    for round in 0..12 {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let bases = Arc::new(Bases::new());
        let ns = Namespace::new(store.clone(), "t/w").with_bases(bases.clone());
        let fork_ns = Namespace::new(store, "t/fork").with_bases(bases.clone());
        let mut state = ns.load().await.unwrap();
        let mut fork: Option<State> = None;
        for step in 0..30 {
            let mut records = Vec::new();
            for _ in 0..rng.usize(1..5) {
                let depth = rng.usize(1..4);
                let path: Vec<String> = (0..depth).map(|_| ["a", "b", "c"][rng.usize(0..3)].to_owned()).collect();
                let path = path.join("/");
                match rng.u8(0..10) {
                    0 => records.push(Record::Delete(path)),
                    1 => records.push(vectors(&[(rng.u8(1..24), unit(rng.usize(0..4), 0.1))])),
                    _ => {
                        let chunks: Vec<ChunkRef> = (0..rng.usize(1..4))
                            .map(|_| {
                                let id = rng.u8(1..24);
                                // Most chunks come with their file, a few only later.
                                if rng.u8(0..5) > 0 {
                                    records.push(chunk(id));
                                }
                                ChunkRef {
                                    id: [id; 32],
                                    start_line: 1,
                                    end_line: 2,
                                    language: "rust".into(),
                                    kind: kinds[rng.usize(0..kinds.len())].into(),
                                }
                            })
                            .collect();
                        records.push(Record::File(FileRecord { path, leaf: [rng.u8(1..255); 32], chunks }));
                    }
                }
            }
            // Chunks first, as a commit writes them.
            records.sort_by_key(|r| !matches!(r, Record::Chunk(_)));
            state.tree();
            if let Some(fork) = fork.as_mut() {
                fork.tree();
                fork_ns.append(fork, records.clone()).await.unwrap();
            }
            ns.append(&mut state, records).await.unwrap();
            let at = format!("round {round}, step {step}");
            if step % 10 == 9
                && let Some(base) = ns.compact(state.compaction_plan()).await.unwrap()
            {
                state.install(base);
            }
            if step % 10 == 4 || step % 10 == 7 {
                // The log since the segment folded into a delta beside it; the fork too.
                if let Some(plan) = state.delta_plan() {
                    let seq = ns.compact_delta(plan).await.unwrap().expect("nothing raced it");
                    state.delta_folded(seq);
                    assert_eq!(state.tail_size(), (0, 0), "{at}: all folded");
                }
                if let Some(fork) = fork.as_mut()
                    && let Some(plan) = fork.delta_plan()
                {
                    let seq = fork_ns.compact_delta(plan).await.unwrap().expect("nothing raced it");
                    fork.delta_folded(seq);
                }
            }
            if step == 14 {
                if let Some(base) = ns.compact(state.compaction_plan()).await.unwrap() {
                    state.install(base);
                }
                let seq = fork_ns.fork_from(&ns).await.unwrap().expect("an empty namespace forks");
                let forked = fork_ns.load().await.unwrap();
                assert_eq!(forked.seq, seq);
                let shared = forked.base().expect("loaded from the copied segment");
                assert!(Arc::ptr_eq(shared, state.base().expect("compacted")), "{at}: one base in memory");
                assert!(
                    fork_ns.fork_from(&ns).await.unwrap().is_none(),
                    "{at}: a namespace that holds something does not fork"
                );
                fork = Some(forked);
            }
            let mut anew = ns.load().await.unwrap();
            anew.reindex();
            assert_eq!(state.tree(), anew.tree(), "{at}: the tree");
            assert_eq!(*state.tree(), state.tree_anew(), "{at}: the tree, built from the files");
            assert_eq!(state.incomplete, anew.incomplete, "{at}: files waiting for a chunk");
            let (kept, derived) = (state.missing_vectors("m", 100), anew.missing_vectors("m", 100));
            assert_eq!((kept.chunks, kept.total, kept.stages), (derived.chunks, derived.total, derived.stages), "{at}");
            assert_eq!(state.vector_progress("m"), anew.vector_progress("m"), "{at}");
            assert_eq!(state.vector_progress("other"), anew.vector_progress("other"), "{at}");
            let ids: std::collections::HashSet<[u8; 32]> = (1..24).map(|i| [i; 32]).collect();
            assert_eq!(state.stages_of(&ids), anew.stages_of(&ids), "{at}");
            assert_eq!(all_hits(&mut state), all_hits(&mut anew), "{at}: where chunks are found");
            if let Some(fork) = fork.as_mut() {
                // The fork against itself loaded anew: the source's compactions since drop
                // chunks no file holds from its segment, which the fork's older one keeps.
                let mut anew = fork_ns.load().await.unwrap();
                anew.reindex();
                assert_eq!(fork.tree(), anew.tree(), "{at}: the fork's tree");
                assert_eq!(*fork.tree(), fork.tree_anew(), "{at}: the fork's tree, built from the files");
                assert_eq!(fork.incomplete, anew.incomplete, "{at}");
                let (kept, derived) = (fork.missing_vectors("m", 100), anew.missing_vectors("m", 100));
                assert_eq!(
                    (kept.chunks, kept.total, kept.stages),
                    (derived.chunks, derived.total, derived.stages),
                    "{at}"
                );
                assert_eq!(fork.vector_progress("m"), anew.vector_progress("m"), "{at}");
                assert_eq!(fork.stages_of(&ids), anew.stages_of(&ids), "{at}");
                assert_eq!(all_hits(fork), all_hits(&mut anew), "{at}: where the fork's chunks are found");
                if step < 19 {
                    assert_eq!(fork.tree().root_hash(), state.tree().root_hash(), "{at}: the same files as the source");
                    assert_eq!(all_hits(fork), all_hits(&mut state), "{at}: the fork finds what the source finds");
                }
            }
        }
    }
}

/// A compaction keeps the old vector block whole while few of its vectors are dead, and
/// extends the old graph with the tail's rows instead of building one; past a quarter dead
/// it rewrites the block without them, and the segment builds its own graph.
#[test]
fn a_compaction_extends_the_old_graph_while_few_of_its_vectors_are_dead() {
    let (n, dim) = (400usize, 16usize);
    let data = ann::synthetic_embeddings(n + 50, dim, 9);
    let id = |i: usize| -> [u8; 32] {
        let mut id = [0u8; 32];
        id[..8].copy_from_slice(&(i as u64).to_le_bytes());
        id
    };
    let file_of = |i: usize| FileRecord {
        path: format!("f{i}"),
        leaf: id(i),
        chunks: vec![ChunkRef { id: id(i), start_line: 1, end_line: 2, language: "rust".into(), kind: "code".into() }],
    };
    let chunk_of = |i: usize| ChunkRecord { id: id(i), length: 1, terms: vec![(i as u64, 1)] };
    let old_data = SegmentData {
        version: FORMAT,
        seq: 1,
        files: (0..n).map(file_of).collect(),
        chunks: (0..n).map(chunk_of).collect(),
        model: Some("m".into()),
        dim: dim as u32,
        vector_ids: (0..n).map(id).collect(),
        vectors: data[..n * dim].to_vec(),
    };
    let graph = AnnIndex::build(&old_data.vectors, dim, AnnParams::default()).unwrap();
    let old = Arc::new(Segment::from_data("old".into(), &old_data, Stored { ann: Some(graph), bm25: None }).unwrap());
    // `dead` of the old files gone, 50 new ones with vectors in the tail.
    let plan = |dead: usize| CompactionPlan {
        seq: 2,
        files: (dead..n + 50).map(file_of).collect(),
        old: Some(old.clone()),
        tail_chunks: (n..n + 50).map(chunk_of).collect(),
        model: Some(("m".into(), dim)),
        tail_vector_ids: (n..n + 50).map(id).collect(),
        tail_vectors: data[n * dim..].to_vec(),
    };
    let (folded, kept) = plan(n / 4).fold(old_data.chunks.clone());
    assert_eq!(kept, n, "a quarter dead: the block is kept whole");
    assert_eq!(folded.vector_ids.len(), n + 50);
    assert_eq!(folded.vector_ids[..n], old_data.vector_ids[..], "the old rows first, in order");
    assert_eq!(folded.chunks.len(), n - n / 4 + 50, "dead chunks leave the chunk table");
    let grown = segment::extended_graph(Some(&old), &folded, kept, 0).unwrap().expect("the graph is extended");
    assert_eq!((grown.len(), old.ann.as_ref().unwrap().len()), (n + 50, n), "the old graph is untouched");
    for row in n..n + 50 {
        assert_eq!(grown.search(&folded.vectors[row * dim..(row + 1) * dim], 1, &folded.vectors).unwrap()[0].0, row);
    }
    assert!(segment::extended_graph(Some(&old), &folded, kept, n + 51).unwrap().is_none(), "too small for a graph");
    let segment = Segment::from_data("new".into(), &folded, Stored { ann: Some(grown), bm25: None }).unwrap();
    assert!(segment.has_ann());

    let (folded, kept) = plan(n / 4 + 1).fold(old_data.chunks.clone());
    assert_eq!(kept, 0, "over a quarter dead: rewritten");
    assert_eq!(folded.vector_ids.len(), n - n / 4 - 1 + 50);
    assert!(folded.vector_ids.iter().all(|v| folded.chunks.iter().any(|c| c.id == *v)), "no dead vector");
    assert!(segment::extended_graph(Some(&old), &folded, kept, 0).unwrap().is_none());
}
