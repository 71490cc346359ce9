//! Who may use a team server: organisations (a tenant is one), their people with roles
//! (`owner`, `admin`, `member`), groups, credentials (personal access tokens, service
//! accounts, sign-in sessions) with scopes, expiry, last use and revocation, and the audit
//! trail, each record chained to the one before by a hash. Everything lives in the metadata
//! database beside the index's tables ([`Identity`]); a replica keeps checked credentials in
//! a [`cache::Cache`] that an epoch bumped by every revocation empties on every replica.
//!
//! It never speaks HTTP or knows a route, never stores a token (only its SHA-256), and never
//! records code, queries or prompts in the audit trail.

pub mod audit;
pub mod cache;
pub mod db;
pub mod error;
pub mod export;
pub mod invitations;
pub mod model;
pub mod owners;
pub mod people;
pub mod tokens;

pub use db::Identity;
pub use error::{Error, Result};
pub use model::{CredentialKind, Principal, Role, Scope, Scopes, UserState};
