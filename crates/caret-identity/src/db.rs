//! The identity tables in the metadata database, and the epoch replicas watch.

use sqlx::{AnyPool, Row as _};

use crate::error::{Error, Result};

/// The identity schema's steps.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE users (
        id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL,
        email TEXT NOT NULL,
        name TEXT NOT NULL,
        role TEXT NOT NULL,
        state TEXT NOT NULL,
        source TEXT NOT NULL,
        external_id TEXT,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        UNIQUE (tenant_id, email)
    );
    CREATE TABLE user_groups (
        id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL,
        name TEXT NOT NULL,
        source TEXT NOT NULL,
        external_id TEXT,
        created_at BIGINT NOT NULL,
        UNIQUE (tenant_id, name)
    );
    CREATE TABLE group_members (
        group_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        PRIMARY KEY (group_id, user_id)
    );
    CREATE TABLE credentials (
        id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL,
        user_id TEXT,
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        role TEXT NOT NULL,
        token_hash TEXT NOT NULL UNIQUE,
        scopes TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT,
        last_used_at BIGINT,
        revoked_at BIGINT
    );
    CREATE INDEX credentials_of_user ON credentials (user_id);
    CREATE TABLE identity_epoch (
        id BIGINT PRIMARY KEY,
        epoch BIGINT NOT NULL
    );
    INSERT INTO identity_epoch (id, epoch) VALUES (1, 0);
    CREATE TABLE audit_log (
        seq BIGINT PRIMARY KEY,
        tenant_id TEXT NOT NULL,
        at_ms BIGINT NOT NULL,
        actor TEXT NOT NULL,
        address TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        outcome TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL
    );
    CREATE INDEX audit_of_tenant ON audit_log (tenant_id, seq)",
    ),
    (
        2,
        "CREATE TABLE invitations (
        id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL,
        email TEXT NOT NULL,
        role TEXT NOT NULL,
        code_hash TEXT NOT NULL UNIQUE,
        created_by TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        used_at BIGINT
    )",
    ),
    (3, "ALTER TABLE user_groups ADD COLUMN models TEXT"),
    (
        4,
        "CREATE TABLE owners (
        tenant_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        shared BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        PRIMARY KEY (tenant_id, kind, id)
    )",
    ),
    (
        5,
        "CREATE TABLE sign_ins (
        state_hash TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL,
        purpose TEXT NOT NULL,
        target TEXT NOT NULL,
        nonce TEXT NOT NULL,
        verifier TEXT NOT NULL,
        expires_at BIGINT NOT NULL
    );
    CREATE TABLE grants (
        code_hash TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        tenant_id TEXT NOT NULL,
        user_id TEXT,
        user_code TEXT UNIQUE,
        challenge TEXT,
        redirect TEXT,
        state TEXT NOT NULL,
        family TEXT,
        expires_at BIGINT NOT NULL,
        polled_at BIGINT
    );
    ALTER TABLE credentials ADD COLUMN family TEXT;
    CREATE INDEX credentials_of_family ON credentials (family)",
    ),
    (
        6,
        "ALTER TABLE users ADD COLUMN user_name TEXT;
    ALTER TABLE users ADD COLUMN emails TEXT;
    ALTER TABLE user_groups ADD COLUMN updated_at BIGINT",
    ),
    (
        7,
        "ALTER TABLE user_groups ADD COLUMN daily_tokens BIGINT;
    CREATE TABLE token_usage (
        tenant_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        day BIGINT NOT NULL,
        model TEXT NOT NULL,
        tokens BIGINT NOT NULL,
        requests BIGINT NOT NULL,
        PRIMARY KEY (tenant_id, user_id, day, model)
    )",
    ),
    (
        8,
        "CREATE TABLE org_settings (
        tenant_id TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        updated_at BIGINT NOT NULL,
        PRIMARY KEY (tenant_id, key)
    )",
    ),
];

/// The identity store: people, groups, credentials and the audit trail of every organisation.
#[derive(Debug, Clone)]
pub struct Identity {
    pub(crate) pool: AnyPool,
}

/// Now, Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

pub(crate) fn new_id() -> Result<String> {
    caret_crypto::random_id().map_err(|source| Error::Crypto { what: "making an id", source })
}

impl Identity {
    /// The store on `pool` (the metadata database), its schema brought up to date.
    pub async fn open(pool: AnyPool, dialect: caret_db::Dialect) -> Result<Identity> {
        caret_db::migrate(&pool, dialect, caret_db::Schema { table: "identity_schema", steps: MIGRATIONS }).await?;
        Ok(Identity { pool })
    }

    /// The connection pool (the metadata database's).
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// The epoch: it moves whenever a credential stops working before its time (revoked,
    /// its person deactivated or their role lowered), so replicas drop what they cached.
    pub async fn epoch(&self) -> Result<i64> {
        Ok(sqlx::query("SELECT epoch FROM identity_epoch WHERE id = 1").fetch_one(&self.pool).await?.get(0))
    }

    /// Moves the epoch: a credential kept elsewhere (a tenant's API token) stopped working.
    pub async fn moved(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        Identity::bump(&mut conn).await
    }

    /// Moves the epoch (in the transaction of the change that needs it).
    pub(crate) async fn bump(conn: &mut sqlx::AnyConnection) -> Result<()> {
        sqlx::query("UPDATE identity_epoch SET epoch = epoch + 1 WHERE id = 1").execute(conn).await?;
        Ok(())
    }
}
