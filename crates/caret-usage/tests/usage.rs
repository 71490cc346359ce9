//! The recorder's files on a real (local directory) object store: written per tenant and
//! hour, rewritten as sums grow, read back and summarised, swept past the retention, and
//! damaged ones skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use caret_usage::{Recorder, Settings, hour_name, read, summarise};
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;

fn store(dir: &tempfile::TempDir) -> Arc<dyn ObjectStore> {
    Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap())
}

/// Every file under the directory, relative to it.
fn files(dir: &tempfile::TempDir) -> Vec<String> {
    fn walk(root: &std::path::Path, dir: &std::path::Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir.path(), dir.path(), &mut out);
    out.sort();
    out
}

fn now_hour() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64 / 3600
}

#[tokio::test]
async fn sums_are_written_per_tenant_and_hour_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::new(store(&dir), Settings::default());
    for (ms, user) in [(10.0, "u-1"), (20.0, "u-2"), (30.0, "u-1"), (40.0, "Alice@Example.com")] {
        assert!(recorder.record("t-one", Some(user), "search", "hybrid", Some(ms), true));
    }
    recorder.record("t-one", None, "search", "SELECT secret FROM canary", Some(5.0), false);
    recorder.record("t-one", None, "tab.shown", "", Some(120.0), true);
    recorder.record("t-one", None, "tab.accepted", "", None, true);
    recorder.record("t-two", None, "agent.tool", "read_file", Some(3.0), true);
    assert!(!recorder.record("t-two", None, "keystroke", "a", None, true), "an unknown event is refused");
    assert_eq!(recorder.flush().await.unwrap(), 2, "one file per tenant");
    assert_eq!(recorder.flush().await.unwrap(), 0, "nothing changed, nothing written");
    let hour = now_hour();
    let written = files(&dir);
    assert_eq!(written.len(), 2, "{written:?}");
    assert!(written[0].starts_with(&format!("usage/t-one/{}/", hour_name(hour))), "{written:?}");
    assert!(written[0].ends_with(".jsonl.gz"));
    assert!(written[1].starts_with(&format!("usage/t-two/{}/", hour_name(hour))));
    // The files hold no label outside the vocabulary.
    for f in &written {
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(&std::fs::read(dir.path().join(f)).unwrap()[..]),
            &mut text,
        )
        .unwrap();
        assert!(!text.contains("canary") && !text.contains("SELECT") && !text.contains("Alice"), "{text}");
    }

    // More of the same hour rewrites the writer's one file.
    recorder.record("t-one", None, "search", "hybrid", Some(50.0), true);
    assert_eq!(recorder.flush().await.unwrap(), 1);
    assert_eq!(files(&dir).len(), 2);

    let got = read(store(&dir).as_ref(), None, hour).await.unwrap();
    assert_eq!((got.files, got.skipped.len()), (2, 0));
    let summary = summarise(&got.rows, false);
    let line = |tenant: &str, event: &str, label: &str| {
        summary.iter().find(|s| s.tenant == tenant && s.event == event && s.label == label).cloned()
    };
    let hybrid = line("t-one", "search", "hybrid").unwrap();
    assert_eq!((hybrid.count, hybrid.failed), (5, 0));
    let p50 = hybrid.p50_ms.unwrap();
    assert!((30.0 * 0.84..=30.0 * 1.19).contains(&p50), "p50 {p50}");
    let other = line("t-one", "search", "other").unwrap();
    assert_eq!((other.count, other.failed), (1, 1));
    assert_eq!(line("t-one", "tab.accepted", "").unwrap().p50_ms, None, "no latencies");
    assert_eq!(line("t-two", "agent.tool", "read_file").unwrap().count, 1);
    assert_eq!(hybrid.first_hour, hour_name(hour));
    // By person: each person's id, no one for calls without a person (or an id that is not
    // one); the sums over people are the same.
    let people = summarise(&got.rows, true);
    let of = |user: &str| {
        people.iter().find(|s| s.event == "search" && s.label == "hybrid" && s.user == user).map(|s| s.count)
    };
    assert_eq!((of("u-1"), of("u-2"), of("")), (Some(2), Some(1), Some(2)));
    assert_eq!(people.iter().map(|s| s.count).sum::<u64>(), summary.iter().map(|s| s.count).sum::<u64>());

    // One tenant only; and nothing before --since.
    let one = read(store(&dir).as_ref(), Some("t-two"), hour).await.unwrap();
    assert!(one.rows.iter().all(|r| r.tenant == "t-two") && !one.rows.is_empty());
    assert!(read(store(&dir).as_ref(), None, hour + 1).await.unwrap().rows.is_empty());
}

#[tokio::test]
async fn two_writers_never_share_a_file_and_their_sums_add_up() {
    let dir = tempfile::tempdir().unwrap();
    let a = Recorder::new(store(&dir), Settings::default());
    std::thread::sleep(Duration::from_millis(2));
    let b = Recorder::new(store(&dir), Settings::default());
    a.record("t", None, "run", "succeeded", Some(1000.0), true);
    b.record("t", None, "run", "succeeded", Some(2000.0), true);
    b.record("t", None, "run", "failed", Some(10.0), false);
    a.flush().await.unwrap();
    b.flush().await.unwrap();
    assert_eq!(files(&dir).len(), 2);
    let summary = summarise(&read(store(&dir).as_ref(), None, 0).await.unwrap().rows, false);
    let counts: Vec<(String, u64, u64)> = summary.iter().map(|s| (s.label.clone(), s.count, s.failed)).collect();
    assert_eq!(counts, vec![("failed".to_owned(), 1, 1), ("succeeded".to_owned(), 2, 0)]);
}

#[tokio::test]
async fn files_past_the_retention_are_swept_and_damaged_ones_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir);
    let settings = Settings { retention: Duration::from_secs(7 * 86_400), ..Settings::default() };
    let recorder = Recorder::new(s.clone(), settings);
    recorder.record("t", None, "chat", "gpt-small", Some(800.0), true);
    recorder.flush().await.unwrap();
    let now = now_hour() * 3600;
    let old = format!("usage/t/{}/w.jsonl.gz", hour_name(now / 3600 - 8 * 24));
    let recent = format!("usage/t/{}/w.jsonl.gz", hour_name(now / 3600 - 6 * 24));
    s.put(&old.as_str().into(), b"old".to_vec().into()).await.unwrap();
    s.put(&recent.as_str().into(), b"not gzip at all".to_vec().into()).await.unwrap();
    s.put(&"usage/t/not-an-hour/w.jsonl.gz".into(), b"kept: not ours to judge".to_vec().into()).await.unwrap();

    assert_eq!(recorder.sweep(now).await.unwrap(), 1);
    let left = files(&dir);
    assert!(!left.contains(&old), "{left:?}");
    assert!(left.contains(&recent) && left.len() == 3, "{left:?}");

    let got = read(s.as_ref(), None, 0).await.unwrap();
    assert_eq!(got.skipped.len(), 1, "{:?}", got.skipped);
    assert!(got.skipped[0].contains(&recent) && got.skipped[0].contains("gzip"), "{:?}", got.skipped);
    assert_eq!(got.rows.len(), 1, "the good file still counts");
}

#[tokio::test]
async fn a_recorder_that_is_off_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let off = Recorder::off();
    assert!(!off.is_on());
    assert!(off.record("t", None, "search", "hybrid", Some(1.0), true));
    assert_eq!(off.flush().await.unwrap(), 0);
    assert_eq!(off.sweep(0).await.unwrap(), 0);
    assert!(off.spawn().is_none());
    assert!(files(&dir).is_empty());
}

#[tokio::test]
async fn the_spawned_task_flushes_on_its_interval() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings { flush_every: Duration::from_millis(50), ..Settings::default() };
    let recorder = Recorder::new(store(&dir), settings);
    let task = recorder.spawn().unwrap();
    recorder.record("t", None, "tab", "", Some(90.0), true);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while files(&dir).is_empty() {
        assert!(std::time::Instant::now() < deadline, "no file within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
}
