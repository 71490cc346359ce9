//! @Docs sources as indexes. What names a source and where it comes from ([`source`]); a
//! source's pages kept in step with an index, synced and embedded like a workspace, and a
//! search hit mapped back to its page ([`index`]); and the team server's library of its
//! tenants' sources ([`team`]: crawled by its workers, sealed on its object store, searched by
//! every member), which `caret-server` serves through its `DocsLibrary` trait.
//!
//! A machine's own sources (`$CARET_HOME/docs`) use [`source`] and [`index`] from
//! `caret-host`. Never crawls (`caret-docs` and the workers do) and never serves HTTP.

pub mod index;
pub mod source;
pub mod team;
