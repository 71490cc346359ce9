//! Storage faults under a real server over HTTP: an object store that fails, throttles,
//! times out, fills up or returns half an object, and a database that goes away. The server
//! answers 503 with Retry-After (never 500, never a corrupt namespace), the client waits and
//! resumes, `/readyz` says when storage is failing, and once the faults pass the index is
//! the client's tree.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use caret_client::state::WorkspaceState;
use caret_client::sync::{SyncEngine, SyncOptions};
use caret_client::transport::HttpTransport;
use caret_index::db::Db;
use caret_index::service::Service;
use caret_protocol::SearchMode;
use caret_test_support::TempDir;
use caret_test_support::faulty::{Fault, Faults, FaultyStore};
use caret_workspace::chunk::{ChunkConfig, Chunker};
use caret_workspace::scan::{Depth, Scanner};
use caret_workspace::tokens::Estimate;
use caret_workspace::walk::WalkConfig;

struct Server {
    url: String,
    token: String,
    statuses: Arc<Mutex<Vec<u16>>>,
}

/// Serves `service` on loopback, recording every answer's status.
async fn serve(service: Arc<Service>) -> Server {
    let tenant = match service.db().tenant_by_name("local").await.unwrap() {
        Some(t) => t,
        None => service.db().create_tenant("local").await.unwrap(),
    };
    let token = service.db().create_token(&tenant, "faults").await.unwrap();
    let config = caret_server::ServeConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        tls: None,
        allow_insecure_http: false,
        rate_limit: caret_server::limit::RateLimit { per_second: 1e6, burst: 1_000_000 },
        ip_rate_limit: caret_server::limit::RateLimit { per_second: 1e6, burst: 1_000_000 },
        body_limit: 64 << 20,
        gateway: None,
        agent: caret_server::sessions::AgentSettings::default(),
        runs: None,
        docs: None,
        pages: None,
        replicas: caret_server::Replicas::Join(None),
        usage: caret_usage::Recorder::off(),
        identity: None,
        sign_in: None,
    };
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let seen = statuses.clone();
    let app = caret_server::app(service, &config).layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let seen = seen.clone();
            async move {
                let resp = next.run(req).await;
                if resp.status().is_server_error() {
                    assert!(
                        resp.headers().contains_key("retry-after") || resp.status() != 503,
                        "a 503 without Retry-After"
                    );
                }
                seen.lock().unwrap().push(resp.status().as_u16());
                resp
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>()).await
    });
    Server { url, token, statuses }
}

fn engine() -> SyncEngine {
    let walk = WalkConfig { global_excludes: None, ..WalkConfig::default() };
    let scanner = Scanner::new(walk, Chunker::new(ChunkConfig::default(), Arc::new(Estimate)), Depth::Hash);
    SyncEngine::new(Arc::new(scanner), SyncOptions::default())
}

fn project() -> TempDir {
    let dir = TempDir::new();
    for i in 0..40 {
        dir.write(
            format!("src/mod{i}.rs"),
            &format!("/// Module {i}.\npub fn handler_{i}(x: u32) -> u32 {{\n    x * {i} + {}\n}}\n", i * 7),
        );
    }
    dir.write("src/upload.rs", "/// Retry failed uploads with exponential backoff.\npub fn upload_with_retries() {}\n");
    dir.backdate(10);
    dir
}

async fn search(ws: &WorkspaceState, t: &HttpTransport) -> caret_client::Result<caret_client::index::SearchOutcome> {
    let walk = WalkConfig { global_excludes: None, ..WalkConfig::default() };
    let scanner = Arc::new(Scanner::new(walk, Chunker::new(ChunkConfig::default(), Arc::new(Estimate)), Depth::Hash));
    let rerank = caret_client::index::Rerank::default();
    caret_client::index::search(scanner, ws, t, "retry failed uploads", 3, SearchMode::Lexical, rerank).await
}

async fn readyz(url: &str) -> u16 {
    reqwest::get(format!("{url}/readyz")).await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_faults_answer_503_and_the_index_converges_when_they_pass() {
    let data = TempDir::new();
    let objects = std::fs::create_dir_all(data.join("objects")).map(|()| data.join("objects")).unwrap();
    let inner: Arc<dyn object_store::ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&objects).unwrap());
    let store = FaultyStore::new(inner);
    let db_url = format!("sqlite://{}?mode=rwc", data.join("caret.db").display());
    let service = Arc::new(Service::new(Db::connect(&db_url).await.unwrap(), store.clone()));
    let server = serve(service).await;
    let transport = HttpTransport::new(&server.url, &server.token, None).unwrap();
    let (dir, state) = (project(), TempDir::new());
    let ws = WorkspaceState::open(dir.path(), &state.join("ws"), &state.join("keys")).unwrap();
    let engine = engine();
    assert_eq!(readyz(&server.url).await, 200);

    // One operation in four fails, each way a store fails: syncs retry through it (or give up
    // with a 503 and the next one carries on) and converge. A sync of a change touches the
    // store a few times only (a copy the database says is current lists nothing), so each
    // way is tried over eight changes.
    for fault in [Fault::Error, Fault::Throttle, Fault::DiskFull, Fault::Timeout] {
        store.set(Faults { fail_one_in: 4, fault, delay: Duration::from_millis(50), ..Faults::default() });
        for change in 0..8 {
            dir.write(
                "src/upload.rs",
                &format!("/// Retry failed uploads ({fault:?}, {change}).\npub fn upload_with_retries() {{}}\n"),
            );
            dir.backdate(10);
            let mut converged = false;
            for _ in 0..10 {
                match engine.sync(&ws, &transport).await {
                    Ok(report) => {
                        converged = report.server_root == report.local_root;
                        break;
                    }
                    Err(caret_client::Error::Server { status, .. }) => assert_eq!(status, 503, "{fault:?}"),
                    Err(e) => panic!("{fault:?}: {e}"),
                }
            }
            assert!(converged, "{fault:?}, change {change}: sync did not converge");
        }
    }
    assert!(store.injected() > 10, "faults were injected: {}", store.injected());
    let statuses = server.statuses.lock().unwrap().clone();
    assert!(statuses.contains(&503), "the faults reached the client as 503s: {statuses:?}");
    assert!(!statuses.contains(&500), "no 500 for a storage fault: {statuses:?}");

    // Everything failing: /readyz says so, a sync fails with 503 and changes nothing.
    store.set(Faults { fail_one_in: 1, fault: Fault::DiskFull, ..Faults::default() });
    assert_eq!(readyz(&server.url).await, 503);
    dir.write("src/extra.rs", "pub fn extra() {}\n");
    dir.backdate(10);
    let failed = engine.sync(&ws, &transport).await.unwrap_err();
    assert!(matches!(failed, caret_client::Error::Server { status: 503, .. }), "{failed}");
    store.set(Faults::default());
    assert_eq!(readyz(&server.url).await, 200);
    let report = engine.sync(&ws, &transport).await.unwrap();
    assert_eq!((report.added, report.server_root == report.local_root), (1, true), "{report:?}");

    // A server starting afresh while reads come back truncated answers 503, never from a
    // half-read log; once reads are whole it answers, with the whole index.
    let service = Arc::new(Service::new(Db::connect(&db_url).await.unwrap(), store.clone()));
    let fresh = serve(service).await;
    let fresh_transport = HttpTransport::new(&fresh.url, &fresh.token, None).unwrap();
    store.set(Faults { truncate_one_in: 1, ..Faults::default() });
    let during = search(&ws, &fresh_transport).await;
    assert!(
        matches!(during, Err(caret_client::Error::Server { status: 503, .. })),
        "a truncated read is a storage fault: {:?}",
        during.map(|o| o.hits.len())
    );
    store.set(Faults::default());
    let after = search(&ws, &fresh_transport).await.unwrap();
    assert_eq!(after.hits[0].path, "src/upload.rs", "{:?}", after.hits);
    let report = engine.sync(&ws, &fresh_transport).await.unwrap();
    assert_eq!((report.added, report.modified, report.deleted), (0, 0, 0), "nothing lost: {report:?}");
    assert_eq!(report.server_root, report.local_root);
    assert!(!fresh.statuses.lock().unwrap().contains(&500));
}

/// PostgreSQL refusing connections and dropping the ones it had, then coming back: requests in
/// between get 503 with Retry-After (`/readyz` too), and the client's next sync converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_going_away_and_coming_back() {
    let Some(url) = std::env::var("CARET_TEST_DATABASE_URL").ok().filter(|u| !u.is_empty()) else {
        caret_test_support::skip("PostgreSQL going away: CARET_TEST_DATABASE_URL is not set");
        return;
    };
    // A database of its own, so that cutting it off touches no other test.
    sqlx::any::install_default_drivers();
    let admin = sqlx::AnyPool::connect(&url).await.unwrap();
    let name = format!("caret_faults_{}", std::process::id());
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name}")).execute(&admin).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.unwrap();
    let (base, _) = url.rsplit_once('/').unwrap();
    let db_url = format!("{base}/{name}");
    let data = TempDir::new();
    let store = caret_index::open_object_store(&data.join("objects").display().to_string()).unwrap();
    let service = Arc::new(Service::new(Db::connect(&db_url).await.unwrap(), store));
    let server = serve(service).await;
    let transport = HttpTransport::new(&server.url, &server.token, None).unwrap();
    let (dir, state) = (project(), TempDir::new());
    let ws = WorkspaceState::open(dir.path(), &state.join("ws"), &state.join("keys")).unwrap();
    let engine = engine();
    engine.sync(&ws, &transport).await.unwrap();

    let cut = |allow: bool| {
        let admin = admin.clone();
        let name = name.clone();
        async move {
            sqlx::query(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS {allow}")).execute(&admin).await.unwrap();
            if !allow {
                let kill = format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'");
                sqlx::query(&kill).execute(&admin).await.unwrap();
            }
        }
    };
    cut(false).await;
    assert_eq!(readyz(&server.url).await, 503);
    dir.write("src/extra.rs", "pub fn extra() {}\n");
    dir.backdate(10);
    let failed = engine.sync(&ws, &transport).await.unwrap_err();
    assert!(matches!(failed, caret_client::Error::Server { status: 503, .. }), "{failed}");
    cut(true).await;
    assert_eq!(readyz(&server.url).await, 200);
    let report = engine.sync(&ws, &transport).await.unwrap();
    assert_eq!((report.added, report.server_root == report.local_root), (1, true), "{report:?}");
    let statuses = server.statuses.lock().unwrap().clone();
    assert!(statuses.contains(&503) && !statuses.contains(&500), "{statuses:?}");
    drop(server);
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&admin).await.ok();
}
