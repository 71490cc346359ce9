//! Writes the seed corpus of the binary-format fuzz targets with the real encoders (the text
//! targets' seeds come from `fuzz/seeds/text_seeds.py`). Run after a format changes:
//! `cargo test -p caret-fuzz --test seeds -- --ignored`. Seeds are bodies without their
//! checksum: the targets add it, so that the decoders behind it are what gets fuzzed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use caret_store::{ChunkRecord, ChunkRef, FileRecord, Namespace, Record, State, VectorBatch};
use caret_workspace::statcache::{Entry, Outcome, PathMap, StatCache};
use caret_workspace::walk::FileStat;
use caret_workspace::{ContentHash, RelPath};
use object_store::local::LocalFileSystem;

fn corpus(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn without_checksum(bytes: &[u8]) -> &[u8] {
    &bytes[..bytes.len() - 32]
}

fn id(n: u8) -> [u8; 32] {
    [n; 32]
}

fn records(n: u8, dim: u32) -> Vec<Record> {
    let chunk = |i: u8| ChunkRecord { id: id(i), length: u32::from(i) + 3, terms: vec![(u64::from(i), 1), (7, 2)] };
    let reference =
        |i: u8| ChunkRef { id: id(i), start_line: 1, end_line: 3, language: "rust".into(), kind: "code".into() };
    let mut out: Vec<Record> = (1..=n).map(|i| Record::Chunk(chunk(i))).collect();
    out.push(Record::File(FileRecord {
        path: "aa/bb".into(),
        leaf: id(200),
        chunks: (1..=n).map(reference).collect(),
    }));
    out.push(Record::Vectors(VectorBatch {
        model: "local:m".into(),
        dim,
        ids: (1..=n).map(id).collect(),
        data: (0..u32::from(n) * dim).map(|x| x as f32 / 10.0).collect(),
    }));
    out.push(Record::Delete("cc".into()));
    out
}

#[tokio::test]
#[ignore = "writes the seed corpus; run by hand after a format changes"]
async fn write_binary_seeds() {
    // Log objects and a segment with its BM25 index, from a real namespace.
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let ns = Namespace::new(store.clone(), "t/w");
    let mut state = State::default();
    ns.append(&mut state, records(3, 4)).await.unwrap();
    ns.append(&mut state, vec![Record::Delete("aa".into())]).await.unwrap();
    ns.append(&mut state, records(5, 4)).await.unwrap();
    let plan = state.compaction_plan();
    ns.compact(plan).await.unwrap().expect("a segment");
    let mut objects: Vec<(String, Vec<u8>)> = Vec::new();
    for path in walk(dir.path()) {
        let rel = path.strip_prefix(dir.path()).unwrap().to_string_lossy().into_owned();
        objects.push((rel, std::fs::read(&path).unwrap()));
    }
    objects.sort();
    let (mut logs, mut segments, mut bm25) = (0, 0, 0);
    for (rel, bytes) in &objects {
        let (target, body): (&str, &[u8]) = if rel.contains("/wal/") {
            logs += 1;
            ("log_object", without_checksum(bytes))
        } else if rel.ends_with(".bm25") {
            bm25 += 1;
            ("stored_indexes", without_checksum(bytes))
        } else if rel.contains("/seg/") && !rel.ends_with(".ann") {
            segments += 1;
            ("segment", without_checksum(bytes))
        } else {
            continue;
        };
        let prefix: &[u8] = if target == "stored_indexes" { &[0] } else { &[] };
        let name = rel.replace('/', "-");
        std::fs::write(corpus(target).join(format!("seed-{name}")), [prefix, body].concat()).unwrap();
    }
    assert!(logs >= 3 && segments >= 1 && bm25 >= 1, "{objects:?}");
    drop(store);
    // A stored HNSW graph reaches its reader (usearch's) only with a valid checksum, which
    // random bytes never have: the target checks that envelope, from a small hand-made start.
    std::fs::write(corpus("stored_indexes").join("seed-ann"), [1u8, 3, 0, 0, 0, 0]).unwrap();

    // A stat cache with each outcome.
    let mut entries = PathMap::default();
    let stat = FileStat { size: 10, mtime_ns: 1_000, ctime_ns: 2_000, ino: 3, dev: 4, mode: 0o100644 };
    let indexed = Outcome::Indexed {
        hash: ContentHash::of(b"x"),
        chunks: 3,
        withheld: 1,
        findings: vec![("aws-access-key-id".into(), 2)],
    };
    entries.insert(RelPath::from_bytes("src/a.rs"), Entry { stat, read_at_ns: 9, outcome: indexed });
    entries.insert(
        RelPath::from_bytes("b.bin"),
        Entry { stat, read_at_ns: 9, outcome: Outcome::Binary { detail: "nul".into() } },
    );
    entries.insert(
        RelPath::from_bytes("c.pb.go"),
        Entry { stat, read_at_ns: 9, outcome: Outcome::Generated { marker: "DO NOT EDIT".into() } },
    );
    let cache = StatCache { fingerprint: "chunker-v2/x".into(), entries, root: Some(ContentHash::of(b"r")) };
    let file = dir.path().join("cache");
    cache.save(&file).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(corpus("stat_cache").join("seed-00"), without_checksum(&bytes)).unwrap();
    std::fs::write(
        corpus("stat_cache").join("seed-01"),
        without_checksum(&{
            let empty = dir.path().join("empty");
            StatCache::default().save(&empty).unwrap();
            std::fs::read(&empty).unwrap()
        }),
    )
    .unwrap();
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
