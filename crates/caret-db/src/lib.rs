//! The metadata database's shared plumbing, for the services that keep tables in it
//! (`caret-index`, `caret-anyrun`): which SQL dialect a URL speaks, and schema migrations
//! applied once each under a lock, so that any number of replicas and workers starting at
//! the same moment on one fresh database end on one schema (PostgreSQL creates a table's
//! row type in its catalogue: two `CREATE TABLE IF NOT EXISTS` at once fail the second one).
//! It never holds a service's tables or queries.

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyPool, Row as _};

/// The SQL dialect of a metadata database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite: one writer at a time, no row locks needed.
    Sqlite,
    /// PostgreSQL: row locks, advisory locks.
    Postgres,
}

impl Dialect {
    /// The dialect of a database URL.
    pub fn of_url(url: &str) -> Dialect {
        if url.starts_with("postgres") { Dialect::Postgres } else { Dialect::Sqlite }
    }
}

/// What went wrong while bringing a schema up to date.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The lock that serialises migrations could not be taken or given back.
    #[error("{what} the migration lock of {table}")]
    Lock {
        /// Taking or giving back.
        what: &'static str,
        /// The schema's version table.
        table: String,
        /// Why.
        #[source]
        source: sqlx::Error,
    },
    /// A step failed (rolled back: the schema stays at the version before it).
    #[error("migrating {table} to version {version}")]
    Step {
        /// The schema's version table.
        table: String,
        /// The step.
        version: i64,
        /// Why.
        #[source]
        source: sqlx::Error,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A schema: its version table and its steps, applied in order, each once. A step is
/// portable SQL, statements separated by `;`.
#[derive(Debug, Clone, Copy)]
pub struct Schema<'a> {
    /// The table recording applied versions (one schema, one table).
    pub table: &'a str,
    /// Versions and their SQL.
    pub steps: &'a [(i64, &'a str)],
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Brings `schema` up to date on `pool` under a lock held for the whole migration (a
/// PostgreSQL advisory lock per schema and version table; on SQLite an immediate transaction,
/// which takes the file's write lock), so concurrent callers wait for one another instead of
/// racing. Returns the versions this call applied.
pub async fn migrate(pool: &AnyPool, dialect: Dialect, schema: Schema<'_>) -> Result<Vec<i64>> {
    let lock_err = |what| move |source| Error::Lock { what, table: schema.table.to_owned(), source };
    let mut conn = pool.acquire().await.map_err(lock_err("taking"))?;
    match dialect {
        Dialect::Postgres => {
            // Keyed by the current schema too: tests (and tenants of one server) may keep
            // several Caret schemas in one database.
            let key = format!(".{}", schema.table);
            sqlx::query("SELECT count(*) FROM (SELECT pg_advisory_lock(hashtext(current_schema() || $1))) AS l")
                .bind(&key)
                .fetch_one(&mut *conn)
                .await
                .map_err(lock_err("taking"))?;
            let applied = steps(&mut conn, schema, false).await;
            let unlocked =
                sqlx::query("SELECT count(*) FROM (SELECT pg_advisory_unlock(hashtext(current_schema() || $1))) AS l")
                    .bind(&key)
                    .fetch_one(&mut *conn)
                    .await;
            if let Err(source) = unlocked {
                // A connection that may still hold the lock must not go back to the pool:
                // closing it gives the lock back.
                conn.close_on_drop();
                applied?;
                return Err(Error::Lock { what: "giving back", table: schema.table.to_owned(), source });
            }
            applied
        }
        Dialect::Sqlite => {
            sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await.map_err(lock_err("taking"))?;
            let applied = steps(&mut conn, schema, true).await;
            let end = if applied.is_ok() { "COMMIT" } else { "ROLLBACK" };
            if let Err(source) = sqlx::query(end).execute(&mut *conn).await {
                conn.close_on_drop();
                applied?;
                return Err(Error::Step { table: schema.table.to_owned(), version: 0, source });
            }
            applied
        }
    }
}

/// The steps not yet applied, in order; on PostgreSQL each in its own transaction (inside
/// SQLite's one immediate transaction, `in_transaction`, statements run as they are).
async fn steps(conn: &mut PoolConnection<Any>, schema: Schema<'_>, in_transaction: bool) -> Result<Vec<i64>> {
    let table = schema.table;
    let step_err = |version| move |source| Error::Step { table: table.to_owned(), version, source };
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)"
    ))
    .execute(&mut **conn)
    .await
    .map_err(step_err(0))?;
    let done: Vec<i64> = sqlx::query(&format!("SELECT version FROM {table}"))
        .fetch_all(&mut **conn)
        .await
        .map_err(step_err(0))?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<std::result::Result<_, _>>()
        .map_err(step_err(0))?;
    let mut applied = Vec::new();
    for &(version, sql) in schema.steps.iter().filter(|(v, _)| !done.contains(v)) {
        if !in_transaction {
            sqlx::query("BEGIN").execute(&mut **conn).await.map_err(step_err(version))?;
        }
        let result = async {
            for statement in sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
                sqlx::query(statement).execute(&mut **conn).await?;
            }
            sqlx::query(&format!("INSERT INTO {table} (version, applied_at) VALUES ($1, $2)"))
                .bind(version)
                .bind(now())
                .execute(&mut **conn)
                .await
        }
        .await;
        if !in_transaction {
            let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
            sqlx::query(end).execute(&mut **conn).await.map_err(step_err(version))?;
        }
        result.map_err(step_err(version))?;
        applied.push(version);
    }
    Ok(applied)
}
