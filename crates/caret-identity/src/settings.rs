//! An organisation's own settings, changed by its admins through the admin API (each change
//! audited by the server): who may add @Docs sources, and the longest life of a personal
//! access token. Unset, the server's defaults hold.

use serde::{Deserialize, Serialize};
use sqlx::Row as _;

use crate::db::{Identity, now_ms};
use crate::error::{Error, Result};

/// The settings; `None` is the server's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrgSettings {
    /// Who may add and remove @Docs sources: `members` or `admins`.
    pub docs_sources: Option<String>,
    /// The longest a personal access token may live, days (1 to 366).
    pub token_max_days: Option<u32>,
}

/// What a change sets: a value, or back to the server's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<T> {
    /// This value.
    Set(T),
    /// The server's default.
    Default,
}

impl Identity {
    /// `tenant`'s settings.
    pub async fn settings(&self, tenant: &str) -> Result<OrgSettings> {
        let rows = sqlx::query("SELECT key, value FROM org_settings WHERE tenant_id = $1")
            .bind(tenant)
            .fetch_all(&self.pool)
            .await?;
        let mut s = OrgSettings::default();
        for r in &rows {
            let (key, value): (String, String) = (r.get(0), r.get(1));
            match key.as_str() {
                "docs_sources" => s.docs_sources = Some(value),
                "token_max_days" => s.token_max_days = value.parse().ok(),
                _ => {}
            }
        }
        Ok(s)
    }

    /// Changes `tenant`'s `docs_sources` and `token_max_days` (none: left as they are);
    /// answers the names of the settings changed.
    pub async fn change_settings(
        &self,
        tenant: &str,
        docs_sources: Option<Change<String>>,
        token_max_days: Option<Change<u32>>,
    ) -> Result<Vec<&'static str>> {
        if let Some(Change::Set(v)) = &docs_sources
            && !matches!(v.as_str(), "members" | "admins")
        {
            return Err(Error::BadRequest(format!("docs_sources is members or admins, not {v:?}")));
        }
        if let Some(Change::Set(d)) = &token_max_days
            && !(1..=366).contains(d)
        {
            return Err(Error::BadRequest(format!("token_max_days is 1 to 366, not {d}")));
        }
        let changes: Vec<(&'static str, Option<String>)> = [
            docs_sources.map(|c| {
                (
                    "docs_sources",
                    match c {
                        Change::Set(v) => Some(v),
                        Change::Default => None,
                    },
                )
            }),
            token_max_days.map(|c| {
                (
                    "token_max_days",
                    match c {
                        Change::Set(v) => Some(v.to_string()),
                        Change::Default => None,
                    },
                )
            }),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut tx = self.pool.begin().await?;
        for (key, value) in &changes {
            sqlx::query("DELETE FROM org_settings WHERE tenant_id = $1 AND key = $2")
                .bind(tenant)
                .bind(*key)
                .execute(&mut *tx)
                .await?;
            if let Some(v) = value {
                sqlx::query("INSERT INTO org_settings (tenant_id, key, value, updated_at) VALUES ($1, $2, $3, $4)")
                    .bind(tenant)
                    .bind(*key)
                    .bind(v)
                    .bind(now_ms())
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(changes.into_iter().map(|(k, _)| k).collect())
    }
}
