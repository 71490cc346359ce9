//! Whose a resource is: a run (or another of a tenant's resources, by kind) made by a person
//! is theirs — members see their own and those shared with the organisation, admins all.
//! Resources made by service accounts, tenant tokens or the server itself have no owner and
//! are the organisation's.

use std::collections::HashMap;

use sqlx::Row as _;

use crate::db::{Identity, now_ms};
use crate::error::{Error, Result};

/// A resource's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The person's id.
    pub user: String,
    /// Whether the organisation may see it too.
    pub shared: bool,
}

impl Identity {
    /// Records that `user` made `tenant`'s resource `id` of `kind` (`run`…).
    pub async fn own(&self, tenant: &str, kind: &str, id: &str, user: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO owners (tenant_id, kind, id, user_id, shared, created_at) VALUES ($1, $2, $3, $4, 0, $5)",
        )
        .bind(tenant)
        .bind(kind)
        .bind(id)
        .bind(user)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The owner of `tenant`'s resource, if a person made it.
    pub async fn owner(&self, tenant: &str, kind: &str, id: &str) -> Result<Option<Owner>> {
        Ok(sqlx::query("SELECT user_id, shared FROM owners WHERE tenant_id = $1 AND kind = $2 AND id = $3")
            .bind(tenant)
            .bind(kind)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| Owner { user: r.get(0), shared: r.get::<i64, _>(1) != 0 }))
    }

    /// The owners of those of `ids` (resources of `kind` of `tenant`) that have one, by id.
    pub async fn owners(&self, tenant: &str, kind: &str, ids: &[String]) -> Result<HashMap<String, Owner>> {
        let mut out = HashMap::new();
        for chunk in ids.chunks(200) {
            let marks: Vec<String> = (0..chunk.len()).map(|i| format!("${}", i + 3)).collect();
            let sql = format!(
                "SELECT id, user_id, shared FROM owners WHERE tenant_id = $1 AND kind = $2 AND id IN ({})",
                marks.join(", ")
            );
            let mut q = sqlx::query(&sql).bind(tenant).bind(kind);
            for id in chunk {
                q = q.bind(id);
            }
            for r in q.fetch_all(&self.pool).await? {
                out.insert(r.get(0), Owner { user: r.get(1), shared: r.get::<i64, _>(2) != 0 });
            }
        }
        Ok(out)
    }

    /// Shares `tenant`'s resource with the organisation (or stops sharing it).
    pub async fn share(&self, tenant: &str, kind: &str, id: &str, shared: bool) -> Result<()> {
        let n = sqlx::query("UPDATE owners SET shared = $1 WHERE tenant_id = $2 AND kind = $3 AND id = $4")
            .bind(i64::from(shared))
            .bind(tenant)
            .bind(kind)
            .bind(id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        if n == 0 {
            return Err(Error::NotFound(format!("{kind} {id} (only a person's own can be shared)")));
        }
        Ok(())
    }

    /// Forgets whose `tenant`'s resource `id` of `kind` was (it is gone).
    pub async fn disown(&self, tenant: &str, kind: &str, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM owners WHERE tenant_id = $1 AND kind = $2 AND id = $3")
            .bind(tenant)
            .bind(kind)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
