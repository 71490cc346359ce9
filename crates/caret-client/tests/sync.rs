//! End-to-end sync through the embedded server (the same service the HTTP routes call).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use caret_client::state::WorkspaceState;
use caret_client::sync::{SyncEngine, SyncOptions};
use caret_client::transport::InProcessTransport;
use caret_index::StorageConfig;
use caret_test_support::TempDir;
use caret_workspace::chunk::{ChunkConfig, Chunker};
use caret_workspace::scan::{Depth, Scanner};
use caret_workspace::tokens::Estimate;
use caret_workspace::walk::WalkConfig;

struct Fixture {
    _server_dir: TempDir,
    state: TempDir,
    transport: InProcessTransport,
    engine: SyncEngine,
}

async fn fixture(options: SyncOptions) -> Fixture {
    let server_dir = TempDir::new();
    let service = Arc::new(caret_index::open(&StorageConfig::local(server_dir.path())).await.unwrap());
    let tenant = service.db().create_tenant("local").await.unwrap();
    let transport = InProcessTransport::new(service, tenant, "embedded");
    let walk = WalkConfig { global_excludes: None, ..WalkConfig::default() };
    let scanner = Scanner::new(walk, Chunker::new(ChunkConfig::default(), Arc::new(Estimate)), Depth::Hash);
    Fixture {
        _server_dir: server_dir,
        state: TempDir::new(),
        transport,
        engine: SyncEngine::new(Arc::new(scanner), options),
    }
}

fn workspace() -> TempDir {
    let dir = TempDir::new();
    dir.write("src/lib.rs", "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n");
    dir.write("src/util/strings.rs", "pub fn shout(s: &str) -> String {\n    s.to_uppercase()\n}\n");
    dir.write("docs/guide.md", "# Guide\n\nHow to use it.\n");
    dir.write("README.md", "# Demo\n");
    dir.backdate(10);
    dir
}

impl Fixture {
    fn open(&self, dir: &TempDir) -> WorkspaceState {
        WorkspaceState::open(dir.path(), &self.state.join("ws"), &self.state.join("keys")).unwrap()
    }
}

#[tokio::test]
async fn sync_converges_and_sends_only_changes() {
    let f = fixture(SyncOptions::default()).await;
    let dir = workspace();
    let ws = f.open(&dir);

    let first = f.engine.sync(&ws, &f.transport).await.unwrap();
    assert_eq!((first.added, first.modified, first.deleted, first.unchanged), (4, 0, 0, 0));
    assert_eq!(first.server_root, first.local_root, "converged");
    assert!(first.chunks_sent >= 4);

    let again = f.engine.sync(&ws, &f.transport).await.unwrap();
    assert_eq!((again.added, again.modified, again.deleted, again.unchanged, again.chunks_sent), (0, 0, 0, 4, 0));
    assert_eq!(again.requests, 2, "create + one tree request whose root matches");
    let tree_only = again.bytes_sent + again.bytes_received;
    assert!(tree_only < 1024, "a no-change sync costs a few hundred bytes, whatever the tree: {tree_only}");

    dir.write("src/lib.rs", "pub fn add(a: i64, b: i64) -> i64 {\n    a + b\n}\n");
    dir.remove("docs/guide.md");
    dir.write("src/util/more.rs", "pub fn shout(s: &str) -> String {\n    s.to_uppercase()\n}\n");
    dir.backdate(10);
    let third = f.engine.sync(&ws, &f.transport).await.unwrap();
    assert_eq!((third.added, third.modified, third.deleted), (1, 1, 1));
    assert_eq!(third.chunks_reused, 1, "more.rs has the same chunk as strings.rs");
    assert_eq!(third.chunks_sent, 1, "only the changed chunk of lib.rs");
    assert_eq!(third.server_root, third.local_root);

    let map = ws.load_path_map().unwrap();
    assert_eq!(map.len(), 4);
    assert!(map.iter().any(|(_, real)| real.to_string() == "src/util/more.rs"));
    // No real name in an obfuscated path (whose random segments may hold any three letters).
    let real = ["src", "util", "lib.rs", "more.rs", "strings.rs"];
    assert!(map.iter().all(|(obf, _)| obf.split('/').all(|seg| !real.contains(&seg) && !seg.ends_with(".rs"))));
}

#[tokio::test]
async fn small_batches_and_secrets() {
    let f = fixture(SyncOptions { batch_bytes: 10, batch_files: 2, tree_batch: 1 }).await;
    let dir = workspace();
    dir.write("src/keys.py", "def k():\n    return \"AKIAQ3MZ7K2N4PVW5XYT\"\n");
    for i in 0..9 {
        dir.write(format!("gen/f{i}.rs"), &format!("pub fn f{i}() -> u32 {{ {i} }}\n"));
    }
    dir.backdate(10);
    let ws = f.open(&dir);
    let r = f.engine.sync(&ws, &f.transport).await.unwrap();
    assert_eq!(r.added, 14);
    assert_eq!(r.chunks_withheld, 1);
    assert_eq!(r.server_root, r.local_root);
    assert!(r.requests > 7, "many small commits: {}", r.requests);
}

/// Records every request body, then forwards it: to `inner`, or embed requests to
/// `embeds_to` (a second replica behind the same balancer) when there is one.
struct Recording {
    inner: InProcessTransport,
    sent: std::sync::Mutex<Vec<String>>,
    embeds_to: Option<InProcessTransport>,
}

#[async_trait::async_trait]
impl caret_client::transport::Transport for Recording {
    async fn create_workspace(
        &self,
        id: &str,
        req: &caret_protocol::CreateWorkspace,
    ) -> caret_client::Result<caret_protocol::WorkspaceInfo> {
        self.sent.lock().unwrap().push(serde_json::to_string(req).unwrap());
        self.inner.create_workspace(id, req).await
    }
    async fn workspace(&self, id: &str) -> caret_client::Result<caret_protocol::WorkspaceInfo> {
        self.inner.workspace(id).await
    }
    async fn tree(
        &self,
        id: &str,
        req: &caret_protocol::TreeRequest,
    ) -> caret_client::Result<caret_protocol::TreeResponse> {
        self.sent.lock().unwrap().push(serde_json::to_string(req).unwrap());
        self.inner.tree(id, req).await
    }
    async fn plan(
        &self,
        id: &str,
        req: &caret_protocol::PlanRequest,
    ) -> caret_client::Result<caret_protocol::PlanResponse> {
        self.sent.lock().unwrap().push(serde_json::to_string(req).unwrap());
        self.inner.plan(id, req).await
    }
    async fn commit(
        &self,
        id: &str,
        key: &caret_crypto::ServerKey,
        req: caret_protocol::CommitRequest,
    ) -> caret_client::Result<caret_protocol::CommitResponse> {
        self.sent.lock().unwrap().push(serde_json::to_string(&req).unwrap());
        self.inner.commit(id, key, req).await
    }
    async fn missing_vectors(&self, id: &str, limit: usize) -> caret_client::Result<caret_protocol::MissingVectors> {
        self.inner.missing_vectors(id, limit).await
    }
    async fn embed(
        &self,
        id: &str,
        key: &caret_crypto::ServerKey,
        req: caret_protocol::EmbedRequest,
    ) -> caret_client::Result<caret_protocol::EmbedResponse> {
        self.sent.lock().unwrap().push(serde_json::to_string(&req).unwrap());
        self.embeds_to.as_ref().unwrap_or(&self.inner).embed(id, key, req).await
    }
    async fn search(
        &self,
        id: &str,
        key: &caret_crypto::ServerKey,
        req: &caret_protocol::SearchRequest,
    ) -> caret_client::Result<caret_protocol::SearchResponse> {
        self.sent.lock().unwrap().push(serde_json::to_string(req).unwrap());
        self.inner.search(id, key, req).await
    }
    async fn settle(&self, id: &str) -> caret_client::Result<()> {
        self.inner.settle(id).await
    }
    fn wire(&self) -> &caret_client::transport::WireCounter {
        self.inner.wire()
    }
    fn describe(&self) -> String {
        "recording".into()
    }
}

#[tokio::test]
async fn secrets_and_real_names_are_never_sent() {
    let f = fixture(SyncOptions::default()).await;
    let dir = workspace();
    dir.write("deploy/settings_prod.py", "import os\n\nAWS = \"AKIAQ3MZ7K2N4PVW5XYT\"\n");
    dir.write("deploy/notes.md", "# Deploy\n\ntoken: ghp_R4nd0mT0k3nV4lu3AbCdEfGhIjKlMnOpQrSt\n\nThe rest is fine.\n");
    dir.backdate(10);
    let ws = f.open(&dir);
    let recording = Recording { inner: f.transport, sent: std::sync::Mutex::new(Vec::new()), embeds_to: None };
    let r = f.engine.sync(&ws, &recording).await.unwrap();
    assert_eq!(r.chunks_withheld, 2);
    assert_eq!(r.server_root, r.local_root);
    let sent = recording.sent.lock().unwrap().join("\n");
    assert!(sent.contains("pub fn add"), "chunk texts of ordinary code are sent");
    for never in ["AKIAQ3MZ7K2N4PVW5XYT", "ghp_R4nd0mT0k3nV4lu3", "settings_prod", "deploy", "strings.rs", "guide.md"] {
        assert!(!sent.contains(never), "{never:?} was sent to the server");
    }
}

/// A test double of an embedding model: records the window each text was embedded with and
/// returns a vector derived from the text's length.
struct RecordingEmbedder {
    seen: std::sync::Mutex<Vec<(Option<usize>, String)>>,
}

impl RecordingEmbedder {
    fn vectors(texts: &[&str]) -> Vec<Vec<f32>> {
        texts.iter().map(|t| vec![1.0, t.len() as f32, 0.5, 0.25]).collect()
    }
}

impl caret_embed::Embedder for RecordingEmbedder {
    fn model_id(&self) -> &str {
        "test:recording"
    }
    fn dim(&self) -> usize {
        4
    }
    fn embed(&self, texts: &[&str]) -> caret_embed::Result<Vec<Vec<f32>>> {
        self.seen.lock().unwrap().extend(texts.iter().map(|t| (None, (*t).to_owned())));
        Ok(Self::vectors(texts))
    }
    fn embed_window(&self, texts: &[&str], max_tokens: usize) -> caret_embed::Result<Vec<Vec<f32>>> {
        self.seen.lock().unwrap().extend(texts.iter().map(|t| (Some(max_tokens), (*t).to_owned())));
        Ok(Self::vectors(texts))
    }
}

/// Each stage's chunks are embedded with that stage's window: tests and docs by their start
/// when the server is told so, code with the model's own window.
#[tokio::test]
async fn each_stage_is_embedded_with_its_window() {
    let server_dir = TempDir::new();
    let recorder = Arc::new(RecordingEmbedder { seen: std::sync::Mutex::new(Vec::new()) });
    let model = caret_index::service::EmbeddingModel::ready(recorder.clone());
    let service = caret_index::open(&StorageConfig::local(server_dir.path()))
        .await
        .unwrap()
        .with_embedding(model)
        .with_stage_windows([None, Some(24), Some(40)]);
    let service = Arc::new(service);
    let tenant = service.db().create_tenant("local").await.unwrap();
    let transport = InProcessTransport::new(service, tenant, "embedded");
    let walk = WalkConfig { global_excludes: None, ..WalkConfig::default() };
    let scanner = Arc::new(Scanner::new(walk, Chunker::new(ChunkConfig::default(), Arc::new(Estimate)), Depth::Hash));
    let engine = SyncEngine::new(scanner.clone(), SyncOptions::default());
    let dir = workspace();
    dir.write("tests/adding.rs", "#[test]\nfn adds_two_numbers() {\n    assert_eq!(demo::add(2, 2), 4);\n}\n");
    dir.backdate(10);
    let state = TempDir::new();
    let ws = WorkspaceState::open(dir.path(), &state.join("ws"), &state.join("keys")).unwrap();
    engine.sync(&ws, &transport).await.unwrap();
    let report = caret_client::index::embed_missing(scanner, &ws, &transport, |_| {}).await.unwrap();
    assert_eq!(report.progress.done, report.progress.total);
    let seen = recorder.seen.lock().unwrap().clone();
    let window_of = |needle: &str| -> Vec<Option<usize>> {
        seen.iter().filter(|(_, t)| t.contains(needle)).map(|(w, _)| *w).collect()
    };
    assert_eq!(window_of("pub fn add("), [None], "code: the model's window; {seen:?}");
    assert_eq!(window_of("pub fn shout("), [None], "{seen:?}");
    assert_eq!(window_of("fn adds_two_numbers"), [Some(24)], "a test: the tests' window; {seen:?}");
    assert_eq!(window_of("How to use it."), [Some(40)], "docs: the other window; {seen:?}");
}

async fn embedding_service(dir: &TempDir, held_budget: usize) -> (Arc<caret_index::Service>, Arc<RecordingEmbedder>) {
    let recorder = Arc::new(RecordingEmbedder { seen: std::sync::Mutex::new(Vec::new()) });
    let model = caret_index::service::EmbeddingModel::ready(recorder.clone());
    let service = caret_index::open(&StorageConfig::local(dir.path()))
        .await
        .unwrap()
        .with_embedding(model)
        .with_held_budget(held_budget);
    (Arc::new(service), recorder)
}

fn scanner() -> Arc<Scanner> {
    let walk = WalkConfig { global_excludes: None, ..WalkConfig::default() };
    Arc::new(Scanner::new(walk, Chunker::new(ChunkConfig::default(), Arc::new(Estimate)), Depth::Hash))
}

/// A chunk's text crosses the wire once: committed, held in the server's memory, and named
/// by id when the client asks for its vector. With nothing held, the texts are sent again.
#[tokio::test]
async fn each_text_is_sent_once_when_the_server_holds_it() {
    for (budget, texts_in_embeds) in [(caret_index::held::DEFAULT_BUDGET, false), (0, true)] {
        let server_dir = TempDir::new();
        let (service, recorder) = embedding_service(&server_dir, budget).await;
        let tenant = service.db().create_tenant("local").await.unwrap();
        let recording = Recording {
            inner: InProcessTransport::new(service.clone(), tenant, "embedded"),
            sent: std::sync::Mutex::new(Vec::new()),
            embeds_to: None,
        };
        let scanner = scanner();
        let dir = workspace();
        let state = TempDir::new();
        let ws = WorkspaceState::open(dir.path(), &state.join("ws"), &state.join("keys")).unwrap();
        SyncEngine::new(scanner.clone(), SyncOptions::default()).sync(&ws, &recording).await.unwrap();
        let commits = recording.sent.lock().unwrap().len();
        let report = caret_client::index::embed_missing(scanner, &ws, &recording, |_| {}).await.unwrap();
        assert_eq!(report.progress.done, report.progress.total, "budget {budget}");
        assert!(report.progress.total >= 4);
        let sent = recording.sent.lock().unwrap();
        let embeds = sent[commits..].join("\n");
        assert!(sent[..commits].join("\n").contains("pub fn add"), "committed with its text");
        assert_eq!(embeds.contains("pub fn add"), texts_in_embeds, "budget {budget}: {embeds}");
        assert_eq!(embeds.contains("\"held_next\""), !texts_in_embeds, "budget {budget}: {embeds}");
        if !texts_in_embeds {
            assert!(!embeds.contains("\"id\""), "not even the ids are sent again: {embeds}");
        }
        // The model saw every chunk once, from memory or from the request.
        let seen = recorder.seen.lock().unwrap();
        assert_eq!(seen.iter().filter(|(_, t)| t.contains("pub fn add(")).count(), 1, "{seen:?}");
        assert_eq!(service.held_usage(), (0, 0), "embedded texts are not kept");
    }
}

#[tokio::test]
async fn a_replica_without_the_held_texts_gets_them_sent() {
    let server_dir = TempDir::new();
    let (committer, _) = embedding_service(&server_dir, caret_index::held::DEFAULT_BUDGET).await;
    let tenant = committer.db().create_tenant("local").await.unwrap();
    let (other, recorder) = embedding_service(&server_dir, caret_index::held::DEFAULT_BUDGET).await;
    // Two replicas behind a balancer: the listing comes from the one that took the commit
    // (it holds the texts), the embed requests reach the other (it does not): it embeds none
    // of them, and the client sends their texts.
    let two = Recording {
        inner: InProcessTransport::new(committer.clone(), tenant.clone(), "a"),
        sent: std::sync::Mutex::new(Vec::new()),
        embeds_to: Some(InProcessTransport::new(other.clone(), tenant.clone(), "b")),
    };
    let scanner = scanner();
    let dir = workspace();
    let state = TempDir::new();
    let ws = WorkspaceState::open(dir.path(), &state.join("ws"), &state.join("keys")).unwrap();
    SyncEngine::new(scanner.clone(), SyncOptions::default()).sync(&ws, &two).await.unwrap();
    let synced = two.sent.lock().unwrap().len();
    caret_client::index::embed_missing(scanner, &ws, &two, |_| {}).await.unwrap();
    let sent = two.sent.lock().unwrap()[synced..].join("\n");
    assert!(sent.contains("\"held_next\""), "asked for first: {sent}");
    assert!(sent.contains("pub fn add"), "then sent, as the other replica lacked it: {sent}");
    assert!(recorder.seen.lock().unwrap().iter().any(|(_, t)| t.contains("pub fn add(")));
    let left = other.missing_vectors(&tenant, &ws.id, 100).await.unwrap();
    assert_eq!(left.missing_total, 0, "every chunk has its vector: {left:?}");
}

/// A held text is checked against the embed request's key as a sent one is: another key's
/// request naming it is refused, and the text stays for the right key.
#[tokio::test]
async fn a_held_text_is_not_embedded_under_another_key() {
    let server_dir = TempDir::new();
    let (service, _) = embedding_service(&server_dir, caret_index::held::DEFAULT_BUDGET).await;
    let tenant = service.db().create_tenant("local").await.unwrap();
    let transport = InProcessTransport::new(service.clone(), tenant.clone(), "embedded");
    let dir = workspace();
    let state = TempDir::new();
    let ws = WorkspaceState::open(dir.path(), &state.join("ws"), &state.join("keys")).unwrap();
    SyncEngine::new(scanner(), SyncOptions::default()).sync(&ws, &transport).await.unwrap();
    let missing = service.missing_vectors(&tenant, &ws.id, 100).await.unwrap();
    assert!(missing.missing.iter().all(|m| m.held), "{missing:?}");
    let stranger = TempDir::new();
    let other = WorkspaceState::open(stranger.path(), &stranger.join("ws"), &stranger.join("keys")).unwrap();
    let named = caret_protocol::EmbedRequest { chunks: Vec::new(), held_next: 100 };
    let refused = service.embed(&tenant, &ws.id, &other.key.server_key(), named.clone()).await;
    assert!(matches!(refused, Err(caret_index::Error::BadRequest(_))), "{refused:?}");
    let done = service.embed(&tenant, &ws.id, &ws.key.server_key(), named).await.unwrap();
    assert_eq!(done.embedded as usize, missing.missing.len());
}

/// A text sent without its id is stored under the id its text and the request's key give: a
/// file naming the id under another key finds its chunk missing, so no text can be filed
/// under an id it does not hash to.
#[tokio::test]
async fn a_text_without_its_id_is_filed_under_its_own() {
    let server_dir = TempDir::new();
    let service = Arc::new(caret_index::open(&StorageConfig::local(server_dir.path())).await.unwrap());
    let tenant = service.db().create_tenant("local").await.unwrap();
    let (mine, theirs) = (TempDir::new(), TempDir::new());
    let a = WorkspaceState::open(mine.path(), &mine.join("ws"), &mine.join("keys")).unwrap();
    let b = WorkspaceState::open(theirs.path(), &theirs.join("ws"), &theirs.join("keys")).unwrap();
    let key_id = caret_protocol::CreateWorkspace { key_id: a.key.key_id(), sketch: Vec::new() };
    service.create_workspace(&tenant, &a.id, &key_id).await.unwrap();
    let text = "pub fn add(a: i32, b: i32) -> i32 { a + b }";
    let id_under = |ws: &WorkspaceState| {
        let hash = caret_crypto::chunk_content_hash::<&str>(&[], text);
        caret_workspace::ContentHash(ws.key.server_key().chunk_ids().id(&hash)).to_hex()
    };
    let commit = |id: String| caret_protocol::CommitRequest {
        files: vec![caret_protocol::FileMeta {
            path: "abc".into(),
            leaf: "ab".repeat(32),
            chunks: vec![caret_protocol::ChunkMeta {
                id,
                start_line: 1,
                end_line: 1,
                language: "rust".into(),
                kind: "code".into(),
            }],
        }],
        deletes: Vec::new(),
        chunks: vec![caret_protocol::ChunkText {
            id: String::new(),
            context: Vec::new(),
            text: text.into(),
            defines: Vec::new(),
        }],
    };
    // Named under the other key's id, sent with this key: the chunk the file names is missing.
    let refused = service.commit(&tenant, &a.id, &a.key.server_key(), commit(id_under(&b))).await;
    assert!(matches!(refused, Err(caret_index::Error::MissingChunks(_))), "{refused:?}");
    let stored = service.commit(&tenant, &a.id, &a.key.server_key(), commit(id_under(&a))).await.unwrap();
    assert_eq!(stored.chunks_stored, 1);
}

/// Two replicas on one database and bucket, each with the workspace loaded: what one commits
/// the other sees on its next request (the row's log number says its copy is behind), and a
/// copy the row says is current appends without losing anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_see_each_others_commits_through_the_row() {
    let server_dir = TempDir::new();
    let a = Arc::new(caret_index::open(&StorageConfig::local(server_dir.path())).await.unwrap());
    let b = Arc::new(caret_index::open(&StorageConfig::local(server_dir.path())).await.unwrap());
    let tenant = a.db().create_tenant("local").await.unwrap();
    let (to_a, to_b) = (
        InProcessTransport::new(a.clone(), tenant.clone(), "a"),
        InProcessTransport::new(b.clone(), tenant.clone(), "b"),
    );
    let engine = SyncEngine::new(scanner(), SyncOptions::default());
    let dir = workspace();
    let state = TempDir::new();
    let ws = WorkspaceState::open(dir.path(), &state.join("ws"), &state.join("keys")).unwrap();
    engine.sync(&ws, &to_a).await.unwrap();
    let through_b = engine.sync(&ws, &to_b).await.unwrap();
    assert_eq!((through_b.chunks_sent, through_b.unchanged), (0, 4), "b loaded a's commit");
    for (round, (writer, reader)) in [(&to_b, &to_a), (&to_a, &to_b), (&to_b, &to_a)].into_iter().enumerate() {
        dir.write("src/lib.rs", &format!("pub fn add_{round}(a: i32, b: i32) -> i32 {{\n    a + b + {round}\n}}\n"));
        dir.backdate(10);
        let wrote = engine.sync(&ws, writer).await.unwrap();
        assert_eq!((wrote.modified, wrote.chunks_sent), (1, 1), "round {round}");
        let read = engine.sync(&ws, reader).await.unwrap();
        assert_eq!((read.modified, read.chunks_sent), (0, 0), "round {round}: the other replica is in step");
        assert_eq!(read.server_root, wrote.local_root, "round {round}");
        let hits = caret_client::index::search(
            scanner(),
            &ws,
            reader,
            &format!("add_{round}"),
            3,
            caret_protocol::SearchMode::Lexical,
            caret_client::index::Rerank::default(),
        )
        .await
        .unwrap();
        assert_eq!(hits.hits.first().map(|h| h.path.as_str()), Some("src/lib.rs"), "round {round}");
    }
    let row = a.db().workspace(&tenant, &ws.id).await.unwrap().unwrap();
    let logs = std::fs::read_dir(
        server_dir.path().join("objects").join("t").join(&tenant.id).join("w").join(&ws.id).join("wal"),
    )
    .unwrap()
    .count();
    assert_eq!(row.log_seq, i64::try_from(logs).unwrap(), "the row names the last log object");
}

/// A copy that shares the key gets its vectors from the first: the texts its commit left
/// held for the model are let go then, not kept until the budget pushes them out. (The copy
/// was synced empty first, so it does not start as a copy of the first on the server.)
#[tokio::test]
async fn texts_of_vectors_copied_from_a_workspace_sharing_the_key_are_not_kept() {
    let server_dir = TempDir::new();
    let (service, recorder) = embedding_service(&server_dir, caret_index::held::DEFAULT_BUDGET).await;
    let tenant = service.db().create_tenant("local").await.unwrap();
    let transport = InProcessTransport::new(service.clone(), tenant.clone(), "embedded");
    let (a, b) = (workspace(), TempDir::new());
    let state = TempDir::new();
    let first = WorkspaceState::open(a.path(), &state.join("a"), &state.join("keys")).unwrap();
    let mut second = WorkspaceState::open(b.path(), &state.join("b"), &state.join("keys")).unwrap();
    second.replace_key(first.key.clone()).unwrap();
    let engine = SyncEngine::new(scanner(), SyncOptions::default());
    engine.sync(&second, &transport).await.unwrap();
    for rel in ["src/lib.rs", "src/util/strings.rs", "docs/guide.md", "README.md"] {
        b.write(rel, &std::fs::read_to_string(a.join(rel)).unwrap());
    }
    b.backdate(10);
    engine.sync(&first, &transport).await.unwrap();
    caret_client::index::embed_missing(scanner(), &first, &transport, |_| {}).await.unwrap();
    assert_eq!(service.held_usage().0, 0, "embedded: nothing held");
    let embedded = recorder.seen.lock().unwrap().len();
    engine.sync(&second, &transport).await.unwrap();
    assert!(service.held_usage().0 > 0, "the copy's texts held for the model at its commit");
    let report = caret_client::index::embed_missing(scanner(), &second, &transport, |_| {}).await.unwrap();
    assert_eq!((report.progress.done, report.progress.embedded), (report.progress.total, 0), "{report:?}");
    assert_eq!(recorder.seen.lock().unwrap().len(), embedded, "copied, not embedded again");
    assert_eq!(service.held_usage(), (0, 0), "and their texts let go");
}

/// A teammate's checkout under the same key (a clone, a branch) starts on the server as a copy
/// of the workspace it mostly matches: its first sync sends only the files that differ, it
/// embeds only their chunks, the two share one copy of the index in memory, and each finds
/// its own version of a file.
#[tokio::test]
async fn a_checkout_under_the_same_key_starts_as_a_copy_and_sends_only_what_differs() {
    let server_dir = TempDir::new();
    let (service, recorder) = embedding_service(&server_dir, caret_index::held::DEFAULT_BUDGET).await;
    let tenant = service.db().create_tenant("local").await.unwrap();
    let transport = InProcessTransport::new(service.clone(), tenant.clone(), "embedded");
    let (a, b) = (workspace(), workspace());
    for dir in [&a, &b] {
        write_modules(dir, 12);
        dir.backdate(10);
    }
    // The teammate changed one file and added one.
    b.write("src/lib.rs", "pub fn add_checked(a: i32, b: i32) -> Option<i32> {\n    a.checked_add(b)\n}\n");
    b.write("src/extra.rs", "pub fn teammate_helper() -> &'static str {\n    \"mine\"\n}\n");
    b.backdate(5);
    let state = TempDir::new();
    let first = WorkspaceState::open(a.path(), &state.join("a"), &state.join("keys")).unwrap();
    let mut second = WorkspaceState::open(b.path(), &state.join("b"), &state.join("keys")).unwrap();
    second.replace_key(first.key.clone()).unwrap();
    let engine = SyncEngine::new(scanner(), SyncOptions::default());
    let whole = engine.sync(&first, &transport).await.unwrap();
    caret_client::index::embed_missing(scanner(), &first, &transport, |_| {}).await.unwrap();
    let embedded = recorder.seen.lock().unwrap().len();

    let copy = engine.sync(&second, &transport).await.unwrap();
    // One index in memory for both (the in-process server then folds each workspace's log
    // into its own segment once embedding settles; a served one keeps sharing until a
    // workspace's own changes are worth a segment).
    assert_eq!(service.shared_bases(), (1, 2), "one index in memory for both");
    assert_eq!((copy.added, copy.modified, copy.deleted), (1, 1, 0), "{copy:?}");
    assert_eq!(copy.unchanged, whole.added - 1);
    assert_eq!(copy.local_root, copy.server_root, "{copy:?}");
    let report = caret_client::index::embed_missing(scanner(), &second, &transport, |_| {}).await.unwrap();
    assert_eq!(report.progress.done, report.progress.total);
    let texts: Vec<String> = recorder.seen.lock().unwrap()[embedded..].iter().map(|(_, t)| t.clone()).collect();
    assert!(
        !texts.is_empty() && texts.iter().all(|t| t.contains("checked_add") || t.contains("teammate_helper")),
        "{texts:?}"
    );

    let info = |id: &str| {
        let (service, tenant, id) = (service.clone(), tenant.clone(), id.to_owned());
        async move { service.workspace_info(&tenant, &id).await.unwrap() }
    };
    let (ia, ib) = (info(&first.id).await, info(&second.id).await);
    assert_eq!(ib.files, ia.files + 1);
    assert_ne!(ia.root_hash, ib.root_hash);
    // By keyed terms alone: a hit is a chunk holding the words.
    let find = async |ws: &WorkspaceState, q: &str| lexical_paths(ws, &transport, q).await;
    assert_eq!(find(&second, "checked").await.first().map(String::as_str), Some("src/lib.rs"));
    assert!(find(&first, "checked").await.is_empty(), "the first workspace never had it");
    assert_eq!(find(&second, "teammate").await.first().map(String::as_str), Some("src/extra.rs"));
    assert!(find(&first, "teammate").await.is_empty());
    assert_eq!(find(&first, "module_7").await.first().map(String::as_str), Some("src/gen/m7.rs"));
    assert_eq!(find(&second, "module_7").await.first().map(String::as_str), Some("src/gen/m7.rs"));
}

/// `n` small generated modules under `src/gen/` (`module_0` … in `m0.rs` …).
fn write_modules(dir: &TempDir, n: usize) {
    for i in 0..n {
        dir.write(format!("src/gen/m{i}.rs"), &format!("pub fn module_{i}(x: u32) -> u32 {{\n    x * {i}\n}}\n"));
    }
}

/// The paths of a lexical search's hits (keyed terms alone: a hit is a chunk holding the
/// words), best first.
async fn lexical_paths(ws: &WorkspaceState, transport: &InProcessTransport, q: &str) -> Vec<String> {
    let (mode, rerank) = (caret_protocol::SearchMode::Lexical, Default::default());
    let found = caret_client::index::search(scanner(), ws, transport, q, 5, mode, rerank).await.unwrap();
    found.hits.into_iter().map(|h| h.path).collect()
}

/// Two workspaces under their own keys: the sample one and one of a single file
/// (`unrelated_helper` in `src/other.rs`); the directories live as long as the first value.
fn two_workspaces() -> ([TempDir; 3], WorkspaceState, WorkspaceState) {
    let (a, b) = (workspace(), TempDir::new());
    b.write("src/other.rs", "pub fn unrelated_helper() -> u8 {\n    7\n}\n");
    b.backdate(10);
    let state = TempDir::new();
    let first = WorkspaceState::open(a.path(), &state.join("a"), &state.join("keys-a")).unwrap();
    let second = WorkspaceState::open(b.path(), &state.join("b"), &state.join("keys-b")).unwrap();
    ([a, b, state], first, second)
}

/// A server keeps at most so many workspaces loaded and unloads those nobody used for a
/// while; an unloaded one loads again from the bucket when asked for, whole.
#[tokio::test]
async fn unused_workspaces_are_unloaded_and_load_again_when_asked_for() {
    let server_dir = TempDir::new();
    let residency = caret_index::service::Residency {
        max_loaded: 1,
        idle: std::time::Duration::from_secs(3600),
        ..Default::default()
    };
    let service = caret_index::open(&StorageConfig::local(server_dir.path())).await.unwrap().with_residency(residency);
    let service = Arc::new(service);
    let tenant = service.db().create_tenant("local").await.unwrap();
    let transport = InProcessTransport::new(service.clone(), tenant.clone(), "embedded");
    let (_dirs, first, second) = two_workspaces();
    let engine = SyncEngine::new(scanner(), SyncOptions::default());
    engine.sync(&first, &transport).await.unwrap();
    assert_eq!(service.loaded_count(), 1);
    engine.sync(&second, &transport).await.unwrap();
    assert_eq!(service.loaded_count(), 1, "the first was unloaded when the second loaded");
    let find = async |ws: &WorkspaceState, q: &str| lexical_paths(ws, &transport, q).await;
    assert_eq!(find(&first, "shout").await.first().map(String::as_str), Some("src/util/strings.rs"));
    assert_eq!(service.loaded_count(), 1, "loaded again in the second's place");
    assert_eq!(service.unload_idle(), 0, "used just now");
    let info = service.workspace_info(&tenant, &second.id).await.unwrap();
    assert_eq!(info.files, 1, "the second, loaded again, holds its file");
    // Nothing changed while unloaded: a sync finds both trees equal.
    let again = engine.sync(&first, &transport).await.unwrap();
    assert_eq!((again.added, again.modified, again.deleted), (0, 0, 0), "{again:?}");
    assert_eq!(again.local_root, again.server_root);
}

/// Memory alone unloads the least recently used: two workspaces that together hold more
/// than the server's bytes are not both kept, and the one unloaded loads again when asked for.
#[tokio::test]
async fn workspaces_beyond_the_servers_bytes_are_unloaded() {
    let server_dir = TempDir::new();
    let (_dirs, first, second) = two_workspaces();
    let engine = SyncEngine::new(scanner(), SyncOptions::default());
    // Without a limit: both stay, and their bytes add up.
    let both = {
        let service = Arc::new(caret_index::open(&StorageConfig::local(server_dir.path())).await.unwrap());
        let tenant = service.db().create_tenant("local").await.unwrap();
        let transport = InProcessTransport::new(service.clone(), tenant.clone(), "embedded");
        engine.sync(&first, &transport).await.unwrap();
        let one = service.loaded_bytes();
        engine.sync(&second, &transport).await.unwrap();
        assert_eq!(service.loaded_count(), 2);
        let both = service.loaded_bytes();
        assert!(one > 0 && both > one, "{one} then {both}");
        both
    };
    // A server allowed a byte less than both: loading the second unloads the first.
    let residency = caret_index::service::Residency { max_bytes: both - 1, ..Default::default() };
    let service = caret_index::open(&StorageConfig::local(server_dir.path())).await.unwrap().with_residency(residency);
    let service = Arc::new(service);
    let tenant = service.db().tenant_by_name("local").await.unwrap().unwrap();
    let transport = InProcessTransport::new(service.clone(), tenant.clone(), "embedded");
    let find = async |ws: &WorkspaceState, q: &str| lexical_paths(ws, &transport, q).await;
    assert_eq!(find(&first, "shout").await.first().map(String::as_str), Some("src/util/strings.rs"));
    assert_eq!(service.loaded_count(), 1);
    assert_eq!(find(&second, "unrelated_helper").await.first().map(String::as_str), Some("src/other.rs"));
    assert_eq!(service.loaded_count(), 1, "the first unloaded for the second's bytes");
    assert!(service.workspace_memory(&tenant, &first.id).is_none());
    assert!(service.loaded_bytes() < both);
    assert_eq!(find(&first, "shout").await.first().map(String::as_str), Some("src/util/strings.rs"), "loaded again");
}

/// Idle time alone unloads a workspace (the server sweeps every minute).
#[tokio::test]
async fn a_workspace_idle_past_its_time_is_unloaded() {
    let server_dir = TempDir::new();
    let residency =
        caret_index::service::Residency { max_loaded: 10, idle: std::time::Duration::ZERO, ..Default::default() };
    let service = caret_index::open(&StorageConfig::local(server_dir.path())).await.unwrap().with_residency(residency);
    let service = Arc::new(service);
    let tenant = service.db().create_tenant("local").await.unwrap();
    let transport = InProcessTransport::new(service.clone(), tenant.clone(), "embedded");
    let a = workspace();
    let state = TempDir::new();
    let ws = WorkspaceState::open(a.path(), &state.join("a"), &state.join("keys")).unwrap();
    SyncEngine::new(scanner(), SyncOptions::default()).sync(&ws, &transport).await.unwrap();
    assert_eq!(service.loaded_count(), 1);
    assert_eq!(service.unload_idle(), 1);
    assert_eq!(service.loaded_count(), 0);
    let info = service.workspace_info(&tenant, &ws.id).await.unwrap();
    assert_eq!(info.files, 4, "loaded again from the bucket");
}

/// A third checkout that matches a teammate's changed copy best, but the source its copies
/// share nearly as well, starts from the source: no fold, no new segment, one index in
/// memory for all three.
#[tokio::test]
async fn a_new_checkout_starts_from_the_segment_its_siblings_share() {
    let server_dir = TempDir::new();
    let (service, _recorder) = embedding_service(&server_dir, caret_index::held::DEFAULT_BUDGET).await;
    let tenant = service.db().create_tenant("local").await.unwrap();
    let transport = InProcessTransport::new(service.clone(), tenant.clone(), "embedded");
    let (a, b, c) = (workspace(), workspace(), workspace());
    for dir in [&a, &b, &c] {
        write_modules(dir, 12);
    }
    // The teammate's copy: lib.rs changed, a file added; the third checkout has both and a
    // change of its own.
    for dir in [&b, &c] {
        dir.write("src/lib.rs", "pub fn add_checked(a: i32, b: i32) -> Option<i32> {\n    a.checked_add(b)\n}\n");
        dir.write("src/extra.rs", "pub fn teammate_helper() -> &'static str {\n    \"mine\"\n}\n");
    }
    c.write("src/gen/m3.rs", "pub fn module_three_of_mine() -> u32 {\n    3\n}\n");
    for dir in [&a, &b, &c] {
        dir.backdate(10);
    }
    let state = TempDir::new();
    let open = |dir: &TempDir, name: &str| WorkspaceState::open(dir.path(), &state.join(name), &state.join("keys"));
    let first = open(&a, "a").unwrap();
    let (mut second, mut third) = (open(&b, "b").unwrap(), open(&c, "c").unwrap());
    second.replace_key(first.key.clone()).unwrap();
    third.replace_key(first.key.clone()).unwrap();
    let engine = SyncEngine::new(scanner(), SyncOptions::default());
    engine.sync(&first, &transport).await.unwrap();
    caret_client::index::embed_missing(scanner(), &first, &transport, |_| {}).await.unwrap();
    service.compact_into_segment(&tenant, &first.id).await.unwrap();
    let copy = engine.sync(&second, &transport).await.unwrap();
    assert_eq!((copy.added, copy.modified), (1, 1), "{copy:?}");
    assert_eq!(service.shared_bases(), (1, 2));
    // The teammate's copy changes on: its log holds what its segment does not.
    b.write("src/extra.rs", "pub fn teammate_helper() -> &'static str {\n    \"still mine\"\n}\n");
    b.backdate(5);
    engine.sync(&second, &transport).await.unwrap();

    // The third matches the teammate's copy on 15 of its 17 files and the source on 14:
    // the source, its segment alone, is chosen, and nothing is folded.
    let third_sync = engine.sync(&third, &transport).await.unwrap();
    assert_eq!(service.shared_bases(), (1, 3), "one index in memory for all three");
    assert_eq!((third_sync.added, third_sync.modified), (1, 2), "against the source: {third_sync:?}");
    assert_eq!(third_sync.local_root, third_sync.server_root);
    let (mode, rerank) = (caret_protocol::SearchMode::Lexical, Default::default());
    let found = caret_client::index::search(scanner(), &third, &transport, "module_three_of_mine", 5, mode, rerank);
    let hits: Vec<String> = found.await.unwrap().hits.into_iter().map(|h| h.path).collect();
    assert_eq!(hits.first().map(String::as_str), Some("src/gen/m3.rs"));
}

/// The segments' names in a local bucket (`seg/NAME`, its indexes left out), over every
/// workspace's prefix.
fn segment_names(dir: &std::path::Path) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.parent().is_some_and(|p| p.ends_with("seg")) {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.contains('.') {
                    out.insert(name);
                }
            }
        }
    }
    out
}

/// A new checkout of a workspace whose changes since its segment are a small delta starts
/// from that segment and a copy of the delta: no new segment is written for it, and the
/// copy holds the changes.
#[tokio::test]
async fn a_checkout_of_a_workspace_with_a_small_delta_shares_its_segment() {
    let server_dir = TempDir::new();
    let (service, _recorder) = embedding_service(&server_dir, caret_index::held::DEFAULT_BUDGET).await;
    let tenant = service.db().create_tenant("local").await.unwrap();
    let transport = InProcessTransport::new(service.clone(), tenant.clone(), "embedded");
    let (a, b) = (workspace(), workspace());
    for dir in [&a, &b] {
        write_modules(dir, 100);
        dir.backdate(10);
    }
    let state = TempDir::new();
    let first = WorkspaceState::open(a.path(), &state.join("a"), &state.join("keys")).unwrap();
    let mut second = WorkspaceState::open(b.path(), &state.join("b"), &state.join("keys")).unwrap();
    second.replace_key(first.key.clone()).unwrap();
    let engine = SyncEngine::new(scanner(), SyncOptions::default());
    engine.sync(&first, &transport).await.unwrap();
    caret_client::index::embed_missing(scanner(), &first, &transport, |_| {}).await.unwrap();
    service.compact_into_segment(&tenant, &first.id).await.unwrap();
    let segments = segment_names(server_dir.path());
    assert_eq!(segments.len(), 1, "{segments:?}");
    // The first changes two files: folded into a delta beside its segment; one more after
    // that stays in its log.
    for (dir, i) in [(&a, 7), (&a, 8)] {
        dir.write(format!("src/gen/m{i}.rs"), &format!("pub fn changed_module_{i}() -> u32 {{\n    {i}\n}}\n"));
    }
    a.backdate(5);
    engine.sync(&first, &transport).await.unwrap();
    caret_client::index::embed_missing(scanner(), &first, &transport, |_| {}).await.unwrap();
    service.compact(&tenant, &first.id, 0).await.unwrap();
    a.write("src/gen/m9.rs", "pub fn latest_module_change() -> u32 {\n    9\n}\n");
    a.backdate(3);
    engine.sync(&first, &transport).await.unwrap();
    assert_eq!(segment_names(server_dir.path()), segments, "a delta, not a new segment");

    // A checkout of the same tree as the first: a copy of its segment and delta, its log
    // folded into the delta; still the one segment, shared in memory.
    for (dir, i) in [(&b, 7), (&b, 8)] {
        dir.write(format!("src/gen/m{i}.rs"), &format!("pub fn changed_module_{i}() -> u32 {{\n    {i}\n}}\n"));
    }
    b.write("src/gen/m9.rs", "pub fn latest_module_change() -> u32 {\n    9\n}\n");
    b.backdate(3);
    let copy = engine.sync(&second, &transport).await.unwrap();
    assert_eq!((copy.added, copy.modified, copy.deleted), (0, 0, 0), "all came with the copy: {copy:?}");
    assert_eq!(copy.local_root, copy.server_root);
    assert_eq!(segment_names(server_dir.path()), segments, "no segment written for the copy");
    assert_eq!(service.shared_bases(), (1, 2), "one segment in memory for both");
    // In bytes: the copy holds its changes; the segment counts once for both.
    let (mine, theirs) =
        (service.workspace_memory(&tenant, &first.id).unwrap(), service.workspace_memory(&tenant, &second.id).unwrap());
    let (segment, bytes) = theirs.shared.clone().unwrap();
    assert_eq!(mine.shared, Some((segment, bytes)), "the same segment under both");
    assert!(theirs.own * 4 < bytes, "the copy's own {} bytes against the segment's {bytes}", theirs.own);
    assert_eq!(service.loaded_bytes(), mine.own + theirs.own + bytes);
    let (mode, rerank) = (caret_protocol::SearchMode::Lexical, Default::default());
    for q in ["changed_module_8", "latest_module_change"] {
        let found = caret_client::index::search(scanner(), &second, &transport, q, 5, mode, rerank).await.unwrap();
        assert!(!found.hits.is_empty(), "{q} is in the copy");
    }
}
