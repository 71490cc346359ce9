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
    assert_eq!(loaded.files.keys().collect::<Vec<_>>(), ["b"]);
    assert_eq!(loaded.files["b"].leaf, [4; 32]);
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

#[tokio::test]
async fn snapshots_bound_replay_and_corruption_is_survived() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ns = Namespace::new(store.clone(), "t/w");
    let mut state = ns.load().await.unwrap();
    for i in 0..70u8 {
        ns.append(&mut state, vec![chunk(i), file(&format!("f{i}"), i, i)]).await.unwrap();
    }
    let snaps: Vec<_> = store.list(Some(&ObjPath::from("t/w/snap"))).try_collect().await.unwrap();
    assert_eq!(snaps.len(), 1, "one snapshot after 64 log objects");
    let loaded = ns.load().await.unwrap();
    assert_eq!((loaded.seq, loaded.files.len(), loaded.chunks.len()), (70, 70, 70));

    // A corrupt snapshot: ignored, the log replayed from the start.
    store.put(&snaps[0].location, PutPayload::from_static(b"garbage")).await.unwrap();
    let from_log = ns.load().await.unwrap();
    assert_eq!((from_log.seq, from_log.files.len()), (70, 70));

    // A corrupt log object: skipped, the rest applied.
    store.put(&ObjPath::from("t/w/wal/00000000000000000070"), PutPayload::from_static(b"garbage!")).await.unwrap();
    let partial = ns.load().await.unwrap();
    assert_eq!(partial.seq, 70);
    assert_eq!(partial.files.len(), 69, "the corrupt object's file is missing, to be synced again");
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
    assert!(ns.load().await.unwrap().files.is_empty());
}
