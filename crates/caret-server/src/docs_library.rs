//! What the docs routes ask of a documentation library ([`DocsLibrary`]): crawling and
//! indexing live above this crate (the binary hands one to the server).

use caret_index::db::Tenant;
use caret_protocol::docs::{AddDocsSource, DocsHit, DocsSearch, DocsSource};

use crate::Error;

/// What a docs library refuses, and why.
#[derive(Debug, thiserror::Error)]
pub enum DocsError {
    /// No such source for this tenant.
    #[error("docs source {0}")]
    NotFound(String),
    /// A malformed source or search.
    #[error("{0}")]
    BadRequest(String),
    /// A source of that name exists, or one is being updated.
    #[error("{0}")]
    Conflict(String),
    /// The server's own failure (its storage, its index).
    #[error("{0}")]
    Internal(String),
}

impl From<DocsError> for Error {
    fn from(e: DocsError) -> Error {
        match e {
            DocsError::NotFound(name) => Error::NotFound(format!("docs source {name}")),
            DocsError::BadRequest(m) => Error::BadRequest(m),
            DocsError::Conflict(m) => Error::Conflict(m),
            DocsError::Internal(m) => Error::Internal(m),
        }
    }
}

/// A tenant's documentation sources: kept, crawled, indexed and searched by the server.
#[async_trait::async_trait]
pub trait DocsLibrary: Send + Sync + std::fmt::Debug {
    /// The least role that may add and remove sources (`[server] docs_sources`; members by
    /// default).
    fn managed_by(&self) -> caret_identity::Role {
        caret_identity::Role::Member
    }
    /// Adds a source and queues its first crawl.
    async fn add(&self, tenant: &Tenant, req: AddDocsSource) -> Result<DocsSource, DocsError>;
    /// The tenant's sources, by name.
    async fn list(&self, tenant: &Tenant) -> Result<Vec<DocsSource>, DocsError>;
    /// Removes a source: its pages leave the index, what was kept of it goes.
    async fn remove(&self, tenant: &Tenant, name: &str) -> Result<(), DocsError>;
    /// Queues a crawl of a source again (unchanged pages cost one request and no embedding).
    async fn refresh(&self, tenant: &Tenant, name: &str) -> Result<DocsSource, DocsError>;
    /// The best hits for a query among the sources named (none: all), best first.
    async fn search(&self, tenant: &Tenant, req: &DocsSearch) -> Result<Vec<DocsHit>, DocsError>;
}
