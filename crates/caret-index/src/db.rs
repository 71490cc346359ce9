//! The metadata database: tenants, API and operator tokens, workspaces and their roots (and,
//! in tables of its own, the run queue of `caret-anyrun`). Index data is on object storage.
//! One code path for SQLite and PostgreSQL through sqlx's `Any` driver with `$N` placeholders
//! and portable types (TEXT, BIGINT).

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{AnyPool, Row as _};

use crate::{Error, Result};

/// Schema versions, applied in order, each once. Portable SQL only.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE tenants (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        created_at BIGINT NOT NULL
    );
    CREATE TABLE api_tokens (
        id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL REFERENCES tenants(id),
        token_hash TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        revoked_at BIGINT
    );
    CREATE TABLE workspaces (
        tenant_id TEXT NOT NULL REFERENCES tenants(id),
        id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        root_hash TEXT NOT NULL,
        files BIGINT NOT NULL,
        chunks BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        PRIMARY KEY (tenant_id, id)
    )",
    ),
    (
        2,
        // One row (id 1) while the model gateway admits tenants gradually after an incident.
        "CREATE TABLE gateway_recovery (
        id BIGINT PRIMARY KEY,
        started_at BIGINT NOT NULL,
        from_permille BIGINT NOT NULL,
        ramp_s BIGINT NOT NULL
    )",
    ),
    (
        3,
        // Operators' tokens: workers and the fleet dashboard (not a tenant's).
        "CREATE TABLE operator_tokens (
        id TEXT PRIMARY KEY,
        token_hash TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        revoked_at BIGINT
    )",
    ),
    (
        4,
        // Replicas of one service (see `cluster`): who is alive and where, what lives in
        // which replica's memory, the rate-limit buckets they share, the secret of their hops.
        "CREATE TABLE replicas (
        id TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        started_at BIGINT NOT NULL,
        seen_at BIGINT NOT NULL
    );
    CREATE TABLE placements (
        kind TEXT NOT NULL,
        id TEXT NOT NULL,
        replica_id TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        PRIMARY KEY (kind, id)
    );
    CREATE TABLE rate_buckets (
        key TEXT PRIMARY KEY,
        micro_tokens BIGINT NOT NULL,
        updated_ms BIGINT NOT NULL
    );
    CREATE TABLE cluster_secret (
        id BIGINT PRIMARY KEY,
        secret TEXT NOT NULL
    )",
    ),
    (
        5,
        // Feature flags and kill switches (see `flags`).
        "CREATE TABLE flags (
        name TEXT NOT NULL,
        tenant TEXT NOT NULL,
        state TEXT NOT NULL,
        percent BIGINT NOT NULL,
        reason TEXT NOT NULL,
        updated_at BIGINT NOT NULL,
        PRIMARY KEY (name, tenant)
    )",
    ),
    (
        6,
        // The last log object a replica appended to each workspace's namespace: a reader whose
        // loaded copy is that far along skips listing the log (0: unknown, always list).
        "ALTER TABLE workspaces ADD COLUMN log_seq BIGINT NOT NULL DEFAULT 0",
    ),
];

/// Recovery admission as an operator started it (`caret admin recovery start`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryRow {
    /// When it started (Unix seconds).
    pub started_at: i64,
    /// Share of tenants admitted at once, in thousandths.
    pub from_permille: i64,
    /// Seconds until every tenant is admitted.
    pub ramp_s: i64,
}

/// A tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Opaque id (used in object-store prefixes; never a name).
    pub id: String,
    /// Human name.
    pub name: String,
}

/// A tenant's API token as listed (never the token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantToken {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// When made, Unix seconds.
    pub created_at: i64,
    /// When revoked, Unix seconds.
    pub revoked_at: Option<i64>,
}

/// A workspace row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceRow {
    /// Client-chosen id.
    pub id: String,
    /// The public id of its key.
    pub key_id: String,
    /// Root hash after the last commit.
    pub root_hash: String,
    /// Files after the last commit.
    pub files: i64,
    /// Chunks after the last commit.
    pub chunks: i64,
    /// The last log object appended to its namespace (0: unknown).
    pub log_seq: i64,
}

impl WorkspaceRow {
    /// Whether a loaded copy at log number `seq` has every appended object (a row written
    /// before the number was kept never says so).
    pub fn log_within(&self, seq: u64) -> bool {
        u64::try_from(self.log_seq).is_ok_and(|known| known != 0 && known <= seq)
    }
}

/// The metadata database.
#[derive(Debug, Clone)]
pub struct Db {
    pub(crate) pool: AnyPool,
    pub(crate) dialect: caret_db::Dialect,
}

pub(crate) fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Db {
    /// Connects (creating a SQLite file if needed) and brings the schema up to date.
    pub async fn connect(url: &str) -> Result<Db> {
        install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(if url.starts_with("sqlite:") { 1 } else { 8 })
            .connect(url)
            .await
            .map_err(Error::Connect)?;
        let db = Db { pool, dialect: caret_db::Dialect::of_url(url) };
        db.migrate().await?;
        Ok(db)
    }

    async fn migrate(&self) -> Result<()> {
        let schema = caret_db::Schema { table: "caret_schema", steps: MIGRATIONS };
        caret_db::migrate(&self.pool, self.dialect, schema).await?;
        Ok(())
    }

    /// Starts (or restarts) recovery admission for every replica.
    pub async fn start_recovery(&self, from_permille: i64, ramp_s: i64) -> Result<RecoveryRow> {
        let row = RecoveryRow { started_at: now(), from_permille: from_permille.clamp(0, 1000), ramp_s: ramp_s.max(0) };
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM gateway_recovery").execute(&mut *tx).await?;
        sqlx::query("INSERT INTO gateway_recovery (id, started_at, from_permille, ramp_s) VALUES (1, $1, $2, $3)")
            .bind(row.started_at)
            .bind(row.from_permille)
            .bind(row.ramp_s)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Ends recovery admission.
    pub async fn stop_recovery(&self) -> Result<()> {
        sqlx::query("DELETE FROM gateway_recovery").execute(&self.pool).await?;
        Ok(())
    }

    /// Recovery admission in force, if any.
    pub async fn recovery(&self) -> Result<Option<RecoveryRow>> {
        Ok(sqlx::query("SELECT started_at, from_permille, ramp_s FROM gateway_recovery WHERE id = 1")
            .fetch_optional(&self.pool)
            .await?
            .map(|r| RecoveryRow { started_at: r.get(0), from_permille: r.get(1), ramp_s: r.get(2) }))
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// The database's size on disk in bytes (PostgreSQL: the database's; SQLite: the file's
    /// pages), for sizing figures.
    pub async fn size_bytes(&self) -> Result<u64> {
        let bytes: i64 = match self.dialect {
            caret_db::Dialect::Postgres => {
                sqlx::query("SELECT pg_database_size(current_database())").fetch_one(&self.pool).await?.get(0)
            }
            caret_db::Dialect::Sqlite => {
                let pages: i64 = sqlx::query("PRAGMA page_count").fetch_one(&self.pool).await?.get(0);
                let size: i64 = sqlx::query("PRAGMA page_size").fetch_one(&self.pool).await?.get(0);
                pages * size
            }
        };
        Ok(u64::try_from(bytes).unwrap_or(0))
    }

    /// Creates a tenant; fails if the name is taken.
    pub async fn create_tenant(&self, name: &str) -> Result<Tenant> {
        let id = caret_crypto::random_id().map_err(|source| Error::Crypto { what: "making an id", source })?;
        sqlx::query("INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3)")
            .bind(&id)
            .bind(name)
            .bind(now())
            .execute(&self.pool)
            .await
            .map_err(|e| match e {
                sqlx::Error::Database(d) if d.is_unique_violation() => Error::Conflict(format!("tenant {name} exists")),
                e => e.into(),
            })?;
        Ok(Tenant { id, name: name.to_owned() })
    }

    /// A tenant by name.
    pub async fn tenant_by_name(&self, name: &str) -> Result<Option<Tenant>> {
        Ok(sqlx::query("SELECT id, name FROM tenants WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| Tenant { id: r.get(0), name: r.get(1) }))
    }

    /// All tenants.
    pub async fn tenants(&self) -> Result<Vec<Tenant>> {
        Ok(sqlx::query("SELECT id, name FROM tenants ORDER BY name")
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .map(|r| Tenant { id: r.get(0), name: r.get(1) })
            .collect())
    }

    /// Creates an API token for a tenant; returns the token, which is not stored.
    pub async fn create_token(&self, tenant: &Tenant, name: &str) -> Result<String> {
        let token =
            caret_crypto::new_api_token().map_err(|source| Error::Crypto { what: "making an API token", source })?;
        let id = caret_crypto::random_id().map_err(|source| Error::Crypto { what: "making an id", source })?;
        sqlx::query("INSERT INTO api_tokens (id, tenant_id, token_hash, name, created_at) VALUES ($1, $2, $3, $4, $5)")
            .bind(&id)
            .bind(&tenant.id)
            .bind(caret_crypto::hash_api_token(&token))
            .bind(name)
            .bind(now())
            .execute(&self.pool)
            .await?;
        Ok(token)
    }

    /// Deletes a tenant's tokens of this name (a local daemon replacing its own on start);
    /// returns how many there were.
    pub async fn delete_tokens_named(&self, tenant: &Tenant, name: &str) -> Result<u64> {
        Ok(sqlx::query("DELETE FROM api_tokens WHERE tenant_id = $1 AND name = $2")
            .bind(&tenant.id)
            .bind(name)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    /// The tenant and token id a token belongs to, if it is valid and not revoked.
    pub async fn authenticate(&self, token: &str) -> Result<Option<(Tenant, String)>> {
        Ok(sqlx::query(
            "SELECT t.id, t.name, k.id FROM api_tokens k JOIN tenants t ON t.id = k.tenant_id \
             WHERE k.token_hash = $1 AND k.revoked_at IS NULL",
        )
        .bind(caret_crypto::hash_api_token(token))
        .fetch_optional(&self.pool)
        .await?
        .map(|r| (Tenant { id: r.get(0), name: r.get(1) }, r.get(2))))
    }

    /// Creates an operator token (for workers and the fleet dashboard); returns the token,
    /// which is not stored.
    pub async fn create_operator_token(&self, name: &str) -> Result<String> {
        let token =
            caret_crypto::new_api_token().map_err(|source| Error::Crypto { what: "making an API token", source })?;
        let id = caret_crypto::random_id().map_err(|source| Error::Crypto { what: "making an id", source })?;
        sqlx::query("INSERT INTO operator_tokens (id, token_hash, name, created_at) VALUES ($1, $2, $3, $4)")
            .bind(&id)
            .bind(caret_crypto::hash_api_token(&token))
            .bind(name)
            .bind(now())
            .execute(&self.pool)
            .await?;
        Ok(token)
    }

    /// The name of the operator token, if it is valid and not revoked.
    pub async fn authenticate_operator(&self, token: &str) -> Result<Option<String>> {
        Ok(sqlx::query("SELECT name FROM operator_tokens WHERE token_hash = $1 AND revoked_at IS NULL")
            .bind(caret_crypto::hash_api_token(token))
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.get(0)))
    }

    /// The connection pool (other crates keep their tables in the same database).
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// The database's SQL dialect.
    pub fn dialect(&self) -> caret_db::Dialect {
        self.dialect
    }

    /// The tenant with this id.
    pub async fn tenant(&self, id: &str) -> Result<Option<Tenant>> {
        Ok(sqlx::query("SELECT id, name FROM tenants WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| Tenant { id: r.get(0), name: r.get(1) }))
    }

    /// A tenant's API tokens made before people existed: id, name, made and revoked (Unix s).
    pub async fn tenant_tokens(&self, tenant: &str) -> Result<Vec<TenantToken>> {
        Ok(sqlx::query(
            "SELECT id, name, created_at, revoked_at FROM api_tokens WHERE tenant_id = $1 ORDER BY created_at DESC, id",
        )
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .map(|r| TenantToken { id: r.get(0), name: r.get(1), created_at: r.get(2), revoked_at: r.get(3) })
        .collect())
    }

    /// Revokes a tenant's API token; whether it was live.
    pub async fn revoke_tenant_token(&self, tenant: &str, id: &str) -> Result<bool> {
        Ok(sqlx::query("UPDATE api_tokens SET revoked_at = $1 WHERE tenant_id = $2 AND id = $3 AND revoked_at IS NULL")
            .bind(now())
            .bind(tenant)
            .bind(id)
            .execute(&self.pool)
            .await?
            .rows_affected()
            > 0)
    }

    /// A tenant's workspace.
    pub async fn workspace(&self, tenant: &Tenant, id: &str) -> Result<Option<WorkspaceRow>> {
        Ok(sqlx::query(
            "SELECT id, key_id, root_hash, files, chunks, log_seq FROM workspaces WHERE tenant_id = $1 AND id = $2",
        )
        .bind(&tenant.id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        .map(row_to_workspace))
    }

    /// A tenant's workspaces.
    pub async fn workspaces(&self, tenant: &Tenant) -> Result<Vec<WorkspaceRow>> {
        Ok(sqlx::query(
            "SELECT id, key_id, root_hash, files, chunks, log_seq FROM workspaces WHERE tenant_id = $1 ORDER BY id",
        )
        .bind(&tenant.id)
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .map(row_to_workspace)
        .collect())
    }

    /// Creates a workspace if it does not exist (a concurrent creation is not an error).
    pub async fn create_workspace(&self, tenant: &Tenant, id: &str, key_id: &str, empty_root: &str) -> Result<()> {
        let result = sqlx::query(
            "INSERT INTO workspaces (tenant_id, id, key_id, root_hash, files, chunks, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, 0, 0, $5, $5)",
        )
        .bind(&tenant.id)
        .bind(id)
        .bind(key_id)
        .bind(empty_root)
        .bind(now())
        .execute(&self.pool)
        .await;
        match result {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(d)) if d.is_unique_violation() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Records a workspace's root after a commit.
    pub async fn update_root(&self, tenant: &Tenant, id: &str, root: &str, files: u64, chunks: u64) -> Result<()> {
        sqlx::query("UPDATE workspaces SET root_hash = $1, files = $2, chunks = $3, updated_at = $4 WHERE tenant_id = $5 AND id = $6")
            .bind(root)
            .bind(i64::try_from(files).unwrap_or(i64::MAX))
            .bind(i64::try_from(chunks).unwrap_or(i64::MAX))
            .bind(now())
            .bind(&tenant.id)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Records that the workspace's log reaches `seq` (never moving it back).
    pub async fn note_log_seq(&self, tenant: &Tenant, id: &str, seq: u64) -> Result<()> {
        sqlx::query("UPDATE workspaces SET log_seq = $1 WHERE tenant_id = $2 AND id = $3 AND log_seq < $1")
            .bind(i64::try_from(seq).unwrap_or(i64::MAX))
            .bind(&tenant.id)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Deletes a workspace row.
    pub async fn delete_workspace(&self, tenant: &Tenant, id: &str) -> Result<bool> {
        let r = sqlx::query("DELETE FROM workspaces WHERE tenant_id = $1 AND id = $2")
            .bind(&tenant.id)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }
}

fn row_to_workspace(r: sqlx::any::AnyRow) -> WorkspaceRow {
    WorkspaceRow {
        id: r.get(0),
        key_id: r.get(1),
        root_hash: r.get(2),
        files: r.get(3),
        chunks: r.get(4),
        log_seq: r.get(5),
    }
}
