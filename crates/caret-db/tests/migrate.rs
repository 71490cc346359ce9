//! Migrations through the public API, on SQLite and on the PostgreSQL CI starts: many callers
//! at once on a fresh database (as replicas and workers starting together are), a failing step
//! that leaves the schema where it was, and a later version added to a migrated schema.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use caret_db::{Dialect, Schema, migrate};
use caret_test_support::database::{Which, scratch_on};
use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;

const STEPS: &[(i64, &str)] = &[
    (1, "CREATE TABLE things (id TEXT PRIMARY KEY, n BIGINT NOT NULL); CREATE TABLE others (id TEXT PRIMARY KEY)"),
    (2, "CREATE TABLE more_things (id TEXT PRIMARY KEY)"),
];

/// `n` pools on one fresh database: separate SQLite connections to one file, or one
/// PostgreSQL pool whose connections are separate sessions.
async fn pools(dir: &std::path::Path, which: Which, n: usize) -> Option<(Vec<AnyPool>, Dialect)> {
    let first = scratch_on(dir, which, "CARET_TEST_DATABASE_URL").await?;
    match which {
        Which::Postgres => Some((vec![first; n], Dialect::Postgres)),
        Which::Sqlite => {
            let url = format!("sqlite://{}?mode=rwc", dir.join("caret.db").display());
            let mut all = vec![first];
            for _ in 1..n {
                all.push(AnyPoolOptions::new().max_connections(1).connect(&url).await.expect("opening SQLite"));
            }
            Some((all, Dialect::Sqlite))
        }
    }
}

async fn versions(pool: &AnyPool, table: &str) -> Vec<i64> {
    let mut v: Vec<i64> =
        sqlx::query_scalar(&format!("SELECT version FROM {table}")).fetch_all(pool).await.expect("reading versions");
    v.sort_unstable();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_callers_at_once_apply_each_step_once() {
    for which in Which::ALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some((pools, dialect)) = pools(dir.path(), which, 8).await else { continue };
        let schema = Schema { table: "test_schema", steps: STEPS };
        let runs = pools.iter().map(|p| {
            let p = p.clone();
            tokio::spawn(async move { migrate(&p, dialect, schema).await })
        });
        let mut applied = Vec::new();
        for run in runs.collect::<Vec<_>>() {
            let done = run.await.expect("joined").unwrap_or_else(|e| panic!("{which:?}: a caller failed: {e:?}"));
            applied.extend(done);
        }
        applied.sort_unstable();
        assert_eq!(applied, vec![1, 2], "{which:?}: each step applied by exactly one caller");
        assert_eq!(versions(&pools[0], "test_schema").await, vec![1, 2]);
        sqlx::query("INSERT INTO things (id, n) VALUES ($1, $2)")
            .bind("a")
            .bind(1_i64)
            .execute(&pools[0])
            .await
            .expect("the table exists");
        assert_eq!(migrate(&pools[0], dialect, schema).await.expect("again"), Vec::<i64>::new(), "nothing left to do");
    }
}

#[tokio::test]
async fn a_failing_step_leaves_the_schema_where_it_was_and_a_later_version_applies() {
    for which in Which::ALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some((pools, dialect)) = pools(dir.path(), which, 1).await else { continue };
        let pool = &pools[0];
        let first = Schema { table: "test_schema", steps: &STEPS[..1] };
        assert_eq!(migrate(pool, dialect, first).await.expect("version 1"), vec![1]);

        let broken = [STEPS[0], (2, "CREATE TABLE half (id TEXT PRIMARY KEY); CREATE TABLE things (id TEXT)")];
        let err = migrate(pool, dialect, Schema { table: "test_schema", steps: &broken })
            .await
            .expect_err("a duplicate table fails");
        assert!(matches!(err, caret_db::Error::Step { version: 2, .. }), "{which:?}: {err:?}");
        assert_eq!(versions(pool, "test_schema").await, vec![1], "{which:?}: version 2 not recorded");
        let half = sqlx::query("SELECT 1 FROM half").fetch_optional(pool).await;
        assert!(half.is_err(), "{which:?}: the failed step's first statement rolled back");

        // The lock was given back: the next caller is not stuck behind it.
        let fixed = Schema { table: "test_schema", steps: STEPS };
        let done = tokio::time::timeout(std::time::Duration::from_secs(20), migrate(pool, dialect, fixed))
            .await
            .expect("not blocked by a lock left behind")
            .expect("version 2 fixed");
        assert_eq!(done, vec![2]);
        assert_eq!(versions(pool, "test_schema").await, vec![1, 2]);
    }
}
