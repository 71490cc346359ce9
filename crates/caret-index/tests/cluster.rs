//! What replicas share through the metadata database, on SQLite and on the PostgreSQL CI
//! starts, through `Db`'s public API with two connections standing for two replicas: one rate
//! limit for all, flags, placements of what lives in one replica's memory, the hop secret.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use caret_index::Db;
use caret_index::cluster::{Replica, Spent};
use caret_index::flags::{Rule, State};

/// Two handles on one fresh database (two replicas), or none when PostgreSQL is wanted and
/// not set up (said through `skip`).
async fn two(dir: &std::path::Path, postgres: bool) -> Option<(Db, Db)> {
    let url = if postgres {
        let Some(base) = std::env::var("CARET_TEST_DATABASE_URL").ok().filter(|s| !s.is_empty()) else {
            caret_test_support::skip("the PostgreSQL half (CARET_TEST_DATABASE_URL is not set)");
            return None;
        };
        let name = format!("cluster_{}", fastrand::u64(..));
        sqlx::any::install_default_drivers();
        let admin = sqlx::any::AnyPoolOptions::new().max_connections(1).connect(&base).await.expect("PostgreSQL");
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.expect("a database");
        admin.close().await;
        format!("{}/{name}", base.rsplit_once('/').expect("a database in the URL").0)
    } else {
        format!("sqlite://{}?mode=rwc", dir.join("caret.db").display())
    };
    let (a, b) = tokio::join!(Db::connect(&url), Db::connect(&url));
    Some((a.expect("replica a"), b.expect("replica b")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_shared_bucket_admits_its_burst_across_replicas_and_no_more() {
    for postgres in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some((a, b)) = two(dir.path(), postgres).await else { continue };
        // 8 callers on two replicas take 1 token at a time, 10 times each, from a bucket of
        // 20 that refills at 0.001/s: exactly 20 are admitted.
        let mut tasks = Vec::new();
        for i in 0..8 {
            let db = if i % 2 == 0 { a.clone() } else { b.clone() };
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..10 {
                    if db.take("token:t1", 1.0, 0.001, 20.0).await.expect("take").admitted {
                        admitted += 1;
                    }
                }
                admitted
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.expect("joined");
        }
        assert_eq!(total, 20, "postgres={postgres}");
        // Refused takings keep the bucket from going deeper than its burst into debt.
        let taken = a.take("token:t1", 1.0, 0.001, 20.0).await.expect("take");
        assert!(!taken.admitted && taken.level < 0.01 && taken.level > -20.1, "{taken:?}");
        // A taking that carries requests admitted alone takes those even when it refuses its own.
        let t = b.take("token:t2", 5.0, 0.001, 3.0).await.expect("take");
        assert!(!t.admitted && (t.level - -1.0).abs() < 0.01, "3 - 4 admitted alone = -1: {t:?}");
        // Settling: each replica's takings since the last settlement come off the bucket.
        let spent = |key: &str, tokens: f64| Spent { key: key.into(), tokens, per_second: 0.001, burst: 100.0 };
        assert_eq!(a.settle(&[spent("ip:x", 30.0)]).await.expect("settle").len(), 1);
        let levels = b.settle(&[spent("ip:x", 30.0), spent("ip:y", 0.0)]).await.expect("settle");
        assert!((levels[0] - 40.0).abs() < 0.1 && (levels[1] - 100.0).abs() < 0.1, "{levels:?}");
        let levels = a.settle(&[spent("ip:x", 200.0)]).await.expect("settle");
        assert!((levels[0] - -100.0).abs() < 0.1, "debt stops at one burst: {levels:?}");
    }
}

#[tokio::test]
async fn flags_set_on_one_replica_are_read_by_the_other() {
    for postgres in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some((a, b)) = two(dir.path(), postgres).await else { continue };
        let rule = |name: &str, tenant: Option<&str>, state, percent| Rule {
            name: name.into(),
            tenant: tenant.map(Into::into),
            state,
            percent,
            reason: "because".into(),
        };
        a.set_flag(&rule("tab", None, State::Off, 100)).await.expect("set");
        a.set_flag(&rule("tab", Some("t1"), State::On, 100)).await.expect("set");
        a.set_flag(&rule("tab", None, State::Off, 100)).await.expect("set again replaces");
        let flags = b.flags().await.expect("flags");
        assert_eq!(flags.rules().len(), 2, "{flags:?}");
        assert!(!flags.allows("tab", Some("t2")) && flags.allows("tab", Some("t1")));
        assert!(a.set_flag(&rule("tabs", None, State::Off, 100)).await.is_err(), "unknown names are refused");
        assert!(a.set_flag(&rule("tab", None, State::Off, 101)).await.is_err());
        assert!(b.clear_flag("tab", None).await.expect("clear"));
        assert!(!b.clear_flag("tab", None).await.expect("clear"), "nothing left to clear");
        assert!(a.flags().await.expect("flags").allows("tab", Some("t2")));
    }
}

#[tokio::test]
async fn placements_lead_to_live_replicas_only() {
    for postgres in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some((a, b)) = two(dir.path(), postgres).await else { continue };
        let (ra, rb) = (
            Replica { id: "ra".into(), url: "http://10.0.0.1:8080".into() },
            Replica { id: "rb".into(), url: "http://10.0.0.2:8080".into() },
        );
        a.heartbeat(&ra).await.expect("beat");
        b.heartbeat(&rb).await.expect("beat");
        a.heartbeat(&ra).await.expect("beats again");
        assert_eq!(b.replicas(60_000).await.expect("replicas").len(), 2);
        a.place("session", "s1", "ra").await.expect("place");
        assert!(a.place("session", "s1", "rb").await.is_err(), "one place each");
        assert_eq!(b.placement("session", "s1", 60_000).await.expect("find"), Some(ra.clone()));
        assert_eq!(b.placement("session", "s2", 60_000).await.expect("find"), None);
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        assert_eq!(b.placement("session", "s1", 10).await.expect("find"), None, "a silent replica is gone");
        a.leave("ra").await.expect("leave");
        assert_eq!(b.placement("session", "s1", 60_000).await.expect("find"), None);
        assert_eq!(b.replicas(60_000).await.expect("replicas"), vec![rb]);
        // Every replica gets the same hop secret, even asking at once.
        let (x, y) = tokio::join!(a.cluster_secret(), b.cluster_secret());
        let (x, y) = (x.expect("secret"), y.expect("secret"));
        assert_eq!(x, y);
        assert!(x.len() >= 32);
    }
}
