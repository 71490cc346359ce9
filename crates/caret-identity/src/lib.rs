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
pub mod budgets;
pub mod cache;
pub mod db;
pub mod error;
pub mod export;
pub mod invitations;
pub mod jwt;
pub mod ldap;
pub mod model;
pub mod oidc;
pub mod owners;
pub mod people;
pub mod scim;
pub mod settings;
pub mod signins;
pub mod tokens;

pub use db::Identity;
pub use error::{Error, Result};
pub use model::{CredentialKind, Principal, Role, Scope, Scopes, UserState};

/// Whether `a` equals `b`, in time that depends on their lengths only.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
