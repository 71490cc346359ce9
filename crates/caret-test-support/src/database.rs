//! Scratch metadata databases for tests and benchmarks: a new schema on the PostgreSQL that
//! an environment variable names (CI starts one), else a SQLite file in a directory.

use std::path::Path;

use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// A SQLite file: the embedded default.
    Sqlite,
    /// A new schema on the PostgreSQL an environment variable names.
    Postgres,
}

impl Which {
    /// Both, for tests of what must hold on each.
    pub const ALL: [Which; 2] = [Which::Sqlite, Which::Postgres];
}

/// A fresh database of the kind asked for: SQLite in `dir`, or a new schema on the
/// PostgreSQL at `$env_var` — `None` (said through [`crate::skip`]) when it is not set.
pub async fn scratch_on(dir: &Path, which: Which, env_var: &str) -> Option<AnyPool> {
    sqlx::any::install_default_drivers();
    match which {
        Which::Sqlite => {
            let url = format!("sqlite://{}?mode=rwc", dir.join("caret.db").display());
            Some(AnyPoolOptions::new().max_connections(1).connect(&url).await.expect("opening SQLite"))
        }
        Which::Postgres => match std::env::var(env_var).ok().filter(|u| !u.is_empty()) {
            Some(url) => Some(postgres_schema(&url).await),
            None => {
                crate::skip(&format!("the PostgreSQL half ({env_var} is not set)"));
                None
            }
        },
    }
}

/// A pool on a new schema of the PostgreSQL at `url` (every connection's `search_path` set
/// to it).
async fn postgres_schema(url: &str) -> AnyPool {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let schema = format!("scratch_{}_{}_{n}", std::process::id(), t.subsec_nanos());
    let admin = AnyPoolOptions::new().max_connections(1).connect(url).await.expect("connecting to PostgreSQL");
    sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await.expect("creating a schema");
    let set = format!("SET search_path TO {schema}");
    AnyPoolOptions::new()
        .max_connections(8)
        .after_connect(move |conn, _| {
            let set = set.clone();
            Box::pin(async move {
                sqlx::Executor::execute(conn, set.as_str()).await?;
                Ok(())
            })
        })
        .connect(url)
        .await
        .expect("connecting to PostgreSQL")
}

/// A fresh database: a new schema on the PostgreSQL at `$env_var` when it is set (every
/// connection's `search_path` set to it), else `caret.db` in `dir`. The flag says which.
pub async fn scratch(dir: &Path, env_var: &str) -> (AnyPool, bool) {
    sqlx::any::install_default_drivers();
    if let Some(url) = std::env::var(env_var).ok().filter(|u| !u.is_empty()) {
        return (postgres_schema(&url).await, true);
    }
    if env_var.starts_with("CARET_TEST") {
        crate::skip(&format!("PostgreSQL ({env_var} is not set): SQLite only"));
    }
    let url = format!("sqlite://{}?mode=rwc", dir.join("caret.db").display());
    (AnyPoolOptions::new().max_connections(1).connect(&url).await.expect("opening SQLite"), false)
}
