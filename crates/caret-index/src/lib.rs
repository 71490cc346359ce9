//! The index service: tenants and their API tokens, workspaces and their Merkle state, sync
//! plans and commits, embedding what lacks vectors, and search over each workspace's
//! namespace — everything `caret serve`'s sync and search routes and the embedded server's
//! in-process transport both call, so the two share one code path.
//!
//! It owns the metadata database ([`db`]: SQLite or PostgreSQL through `sqlx`) and opens the
//! object store that [`caret_store`] keeps namespaces on. It never speaks HTTP (the routes
//! live in `caret-server`), and never writes plaintext code, real file names or queries
//! anywhere: it receives obfuscated paths, keyed hashes and, for chunks it lacks, texts it
//! holds in memory while computing their keyed terms and, until the client asks for them
//! ([`held`]), their vectors.

pub mod cluster;
pub mod db;
pub mod flags;
pub mod held;
pub mod service;

mod error;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use error::{Error, Result, database_unavailable};
use object_store::ObjectStore;

pub use crate::db::{Db, Tenant, TenantToken};
pub use crate::service::Service;

/// Where the index keeps its data.
#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// `sqlite://…` or `postgres://…`.
    pub database_url: String,
    /// A local directory, `s3://bucket/prefix`, or `memory://`.
    pub object_store: String,
}

impl StorageConfig {
    /// The embedded default under a data directory: a SQLite file and a local object store.
    pub fn local(data_dir: &Path) -> Self {
        StorageConfig {
            database_url: format!("sqlite://{}?mode=rwc", data_dir.join("caret.db").display()),
            object_store: data_dir.join("objects").display().to_string(),
        }
    }
}

/// Opens the object store named by a URL or path.
pub fn open_object_store(spec: &str) -> Result<Arc<dyn ObjectStore>> {
    if spec == "memory://" {
        return Ok(Arc::new(object_store::memory::InMemory::new()));
    }
    if let Some(rest) = spec.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        // Endpoint, region and credentials come from the environment (AWS_ENDPOINT,
        // AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP).
        let s3 = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| Error::Store(caret_store::Error::from(e)))?;
        let store: Arc<dyn ObjectStore> =
            if prefix.is_empty() { Arc::new(s3) } else { Arc::new(object_store::prefix::PrefixStore::new(s3, prefix)) };
        return Ok(store);
    }
    let dir = PathBuf::from(spec.strip_prefix("file://").unwrap_or(spec));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io { what: "creating", path: dir.clone(), source })?;
    let local = object_store::local::LocalFileSystem::new_with_prefix(&dir)
        .map_err(|e| Error::Store(caret_store::Error::from(e)))?;
    Ok(Arc::new(local))
}

/// Opens the database and object store and returns the service.
pub async fn open(storage: &StorageConfig) -> Result<Service> {
    if let Some(path) = storage.database_url.strip_prefix("sqlite://") {
        let file = path.split('?').next().unwrap_or(path);
        if let Some(dir) = Path::new(file).parent() {
            std::fs::create_dir_all(dir).map_err(|source| Error::Io {
                what: "creating",
                path: dir.to_owned(),
                source,
            })?;
        }
    }
    let db = Db::connect(&storage.database_url).await?;
    Ok(Service::new(db, open_object_store(&storage.object_store)?))
}
