//! The recorder: sums in memory, one file per tenant and hour per writer, a retention sweep.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::TryStreamExt as _;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

use crate::time::{hour_name, now_hour, now_s, parse_hour};
use crate::{Histogram, PREFIX, Result, Row, event, label_for, user_for};

/// How a recorder writes.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Files whose hour is older than this are deleted.
    pub retention: Duration,
    /// How often the sums are written.
    pub flush_every: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { retention: Duration::from_secs(90 * 86_400), flush_every: Duration::from_secs(60) }
    }
}

/// The most distinct (event, label, person) cells kept for one tenant and hour; further ones
/// are counted as `other` for no one (a bound on memory whatever the labels and people).
const MAX_CELLS: usize = 8192;

/// Records usage, or (off, the default) nothing. Cheap to clone; recording takes a lock and
/// a map update, never I/O.
#[derive(Clone, Default)]
pub struct Recorder {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("on", &self.is_on()).finish()
    }
}

struct Inner {
    store: Arc<dyn ObjectStore>,
    /// This process's name in file keys.
    writer: String,
    settings: Settings,
    sums: Mutex<HashMap<(String, i64), Hour>>,
}

/// One tenant's sums for one hour.
#[derive(Default)]
struct Hour {
    cells: HashMap<(&'static str, String, String), Cell>,
    /// Changed since it was last written.
    dirty: bool,
}

#[derive(Default, Clone)]
struct Cell {
    count: u64,
    failed: u64,
    ms: Histogram,
}

impl Recorder {
    /// A recorder that records nothing.
    pub fn off() -> Recorder {
        Recorder::default()
    }

    /// A recorder writing to `store` under `usage/`.
    pub fn new(store: Arc<dyn ObjectStore>, settings: Settings) -> Recorder {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let writer = format!("{:x}-{:x}", std::process::id(), nanos as u64);
        Recorder { inner: Some(Arc::new(Inner { store, writer, settings, sums: Mutex::new(HashMap::new()) })) }
    }

    /// Whether it records.
    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// Records one `event` for `tenant` (its id) and `user` (a person's id; none: no person):
    /// `label` within the event's vocabulary (else `other`), whether it succeeded, and its
    /// latency when it has one. Returns false (and records nothing) for an event that is not in
    /// [`crate::EVENTS`].
    pub fn record(
        &self,
        tenant: &str,
        user: Option<&str>,
        event_name: &str,
        label: &str,
        ms: Option<f64>,
        ok: bool,
    ) -> bool {
        let Some(kind) = event(event_name) else { return false };
        let Some(inner) = &self.inner else { return true };
        let mut key = (kind.name, label_for(kind, label), user_for(user));
        let mut sums = inner.sums.lock().unwrap_or_else(PoisonError::into_inner);
        let hour = sums.entry((tenant.to_owned(), now_hour())).or_default();
        if hour.cells.len() >= MAX_CELLS && !hour.cells.contains_key(&key) {
            key = (kind.name, "other".to_owned(), String::new());
        }
        let cell = hour.cells.entry(key).or_default();
        cell.count += 1;
        if !ok {
            cell.failed += 1;
        }
        if let Some(ms) = ms {
            cell.ms.add(ms);
        }
        hour.dirty = true;
        true
    }

    /// Writes every tenant's changed hours (each as its whole file), then forgets past hours
    /// that are written. Returns the files written.
    pub async fn flush(&self) -> Result<usize> {
        let Some(inner) = &self.inner else { return Ok(0) };
        let pending: Vec<((String, i64), Vec<Row>)> = {
            let mut sums = inner.sums.lock().unwrap_or_else(PoisonError::into_inner);
            sums.iter_mut()
                .filter(|(_, h)| h.dirty)
                .map(|((tenant, hour), h)| {
                    h.dirty = false;
                    ((tenant.clone(), *hour), rows(tenant, *hour, h))
                })
                .collect()
        };
        let mut written = 0;
        let mut failure = None;
        for ((tenant, hour), rows) in pending {
            match write(inner, &tenant, hour, &rows).await {
                Ok(()) => written += 1,
                Err(e) => {
                    // Written again at the next flush.
                    if let Some(h) = inner.sums.lock().unwrap_or_else(PoisonError::into_inner).get_mut(&(tenant, hour))
                    {
                        h.dirty = true;
                    }
                    failure = Some(e);
                }
            }
        }
        let current = now_hour();
        inner.sums.lock().unwrap_or_else(PoisonError::into_inner).retain(|(_, hour), h| *hour >= current || h.dirty);
        match failure {
            Some(e) if written == 0 => Err(e),
            Some(e) => {
                tracing::warn!("usage: some files were not written (retried at the next flush): {e}");
                Ok(written)
            }
            None => Ok(written),
        }
    }

    /// Deletes the files of hours older than the retention, `now_s` being the time now (Unix
    /// seconds). Returns the files deleted.
    pub async fn sweep(&self, now_s: i64) -> Result<usize> {
        let Some(inner) = &self.inner else { return Ok(0) };
        let oldest = (now_s - inner.settings.retention.as_secs() as i64).div_euclid(3600);
        let prefix = ObjectPath::from(PREFIX);
        let files: Vec<ObjectPath> = inner
            .store
            .list(Some(&prefix))
            .try_filter_map(|meta| async move {
                let hour = meta.location.parts().nth(2).and_then(|p| parse_hour(p.as_ref()));
                Ok(hour.filter(|h| *h < oldest).map(|_| meta.location))
            })
            .try_collect()
            .await?;
        for file in &files {
            match inner.store.delete(file).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(files.len())
    }

    /// Flushes every flush interval and sweeps every hour (the first sweep at once), until
    /// the returned task is aborted; `None` when off. Call [`Recorder::flush`] once more at
    /// shutdown.
    pub fn spawn(&self) -> Option<tokio::task::JoinHandle<()>> {
        let inner = self.inner.as_ref()?;
        let every = inner.settings.flush_every.max(Duration::from_millis(10));
        let this = self.clone();
        Some(tokio::spawn(async move {
            let mut last_sweep: Option<std::time::Instant> = None;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if last_sweep.is_none_or(|t| t.elapsed() >= Duration::from_secs(3600)) {
                    last_sweep = Some(std::time::Instant::now());
                    match this.sweep(now_s()).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(files = n, "usage: deleted files past the retention"),
                        Err(e) => tracing::warn!("usage: the retention sweep failed: {e}"),
                    }
                }
                if let Err(e) = this.flush().await {
                    tracing::warn!("usage: writing the sums failed (retried at the next flush): {e}");
                }
            }
        }))
    }
}

/// An hour's sums as file lines, sorted.
fn rows(tenant: &str, hour: i64, h: &Hour) -> Vec<Row> {
    let name = hour_name(hour);
    let mut rows: Vec<Row> = h
        .cells
        .iter()
        .map(|((event, label, user), c)| Row {
            hour: name.clone(),
            tenant: tenant.to_owned(),
            event: (*event).to_owned(),
            label: label.clone(),
            user: user.clone(),
            count: c.count,
            failed: c.failed,
            ms: c.ms.clone(),
        })
        .collect();
    rows.sort_by(|a, b| (&a.event, &a.label, &a.user).cmp(&(&b.event, &b.label, &b.user)));
    rows
}

/// The key of a writer's file for a tenant and hour.
pub(crate) fn key(tenant: &str, hour: i64, writer: &str) -> ObjectPath {
    ObjectPath::from(format!("{PREFIX}/{tenant}/{}/{writer}.jsonl.gz", hour_name(hour)))
}

async fn write(inner: &Inner, tenant: &str, hour: i64, rows: &[Row]) -> Result<()> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for row in rows {
        serde_json::to_writer(&mut gz, row).map_err(std::io::Error::from)?;
        gz.write_all(b"\n")?;
    }
    let body = gz.finish()?;
    inner.store.put(&key(tenant, hour, &inner.writer), bytes::Bytes::from(body).into()).await?;
    Ok(())
}
