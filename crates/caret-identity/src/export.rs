//! The audit trail on the object store: every closed hour's records as JSON lines
//! (`audit/2026-11-27T13.jsonl`), written once by whichever replica gets there first (the
//! same bytes from any of them), and checked against the database by
//! [`Identity::verify_exports`] — so a record deleted or a chain rewritten in the database
//! after its hour was exported is found, the last record of an hour too.

use std::collections::{BTreeMap, BTreeSet};

use futures::TryStreamExt as _;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use sqlx::Row as _;

use crate::audit::{Filter, Record};
use crate::db::{Identity, now_ms};
use crate::error::{Error, Result};

const HOUR_MS: i64 = 3_600_000;
const PREFIX: &str = "audit";

fn object(hour: i64) -> ObjectPath {
    ObjectPath::from(format!("{PREFIX}/{}.jsonl", caret_usage::hour_name(hour)))
}

fn store_error(what: &str, e: object_store::Error) -> Error {
    Error::Store(format!("{what}: {e}"))
}

/// The hours exported so far.
async fn exported(store: &dyn ObjectStore) -> Result<BTreeMap<i64, ObjectPath>> {
    let listed: Vec<_> = store
        .list(Some(&ObjectPath::from(PREFIX)))
        .try_collect()
        .await
        .map_err(|e| store_error("listing the audit exports", e))?;
    Ok(listed
        .into_iter()
        .filter_map(|m| {
            let name = m.location.filename()?.strip_suffix(".jsonl")?.to_owned();
            Some((caret_usage::parse_hour(&name)?, m.location))
        })
        .collect())
}

impl Identity {
    /// Writes every closed hour with records that is not on `store` yet; returns how many.
    pub async fn export_audit(&self, store: &dyn ObjectStore) -> Result<usize> {
        let this_hour = now_ms().div_euclid(HOUR_MS);
        let hours: BTreeSet<i64> = sqlx::query("SELECT DISTINCT at_ms / 3600000 FROM audit_log WHERE at_ms < $1")
            .bind(this_hour * HOUR_MS)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| r.get::<i64, _>(0))
            .collect();
        let done = exported(store).await?;
        let mut written = 0;
        for hour in hours.into_iter().filter(|h| !done.contains_key(h)) {
            let records = self.hour(hour).await?;
            let mut body = Vec::new();
            for r in &records {
                serde_json::to_writer(&mut body, r).map_err(|e| Error::Store(e.to_string()))?;
                body.push(b'\n');
            }
            store.put(&object(hour), body.into()).await.map_err(|e| store_error("writing an audit export", e))?;
            written += 1;
        }
        Ok(written)
    }

    /// Every record of `hour`, oldest first.
    async fn hour(&self, hour: i64) -> Result<Vec<Record>> {
        let filter = Filter { since_ms: Some(hour * HOUR_MS), limit: 10_000, ..Filter::default() };
        let mut out: Vec<Record> = Vec::new();
        loop {
            let after = Filter { after_seq: out.last().map(|r| r.seq), ..filter.clone() };
            let page = self.audit_records(&after).await?;
            let done = page.len() < 10_000 || page.last().is_some_and(|r| r.at_ms >= (hour + 1) * HOUR_MS);
            out.extend(page.into_iter().filter(|r| r.at_ms < (hour + 1) * HOUR_MS));
            if done {
                return Ok(out);
            }
        }
    }

    /// Compares every exported record with the database's: one missing or different there
    /// is a problem.
    pub async fn verify_exports(&self, store: &dyn ObjectStore) -> Result<Vec<String>> {
        let mut problems = Vec::new();
        for (hour, location) in exported(store).await? {
            let bytes = store
                .get(&location)
                .await
                .map_err(|e| store_error("reading an audit export", e))?
                .bytes()
                .await
                .map_err(|e| store_error("reading an audit export", e))?;
            let held: BTreeMap<i64, String> = self.hour(hour).await?.into_iter().map(|r| (r.seq, r.hash)).collect();
            for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let Ok(r) = serde_json::from_slice::<Record>(line) else {
                    problems.push(format!(
                        "the export of {} holds a line that is not a record",
                        caret_usage::hour_name(hour)
                    ));
                    continue;
                };
                match held.get(&r.seq) {
                    None => problems.push(format!("record {} (exported) is missing from the database", r.seq)),
                    Some(h) if *h != r.hash => problems.push(format!("record {} differs from its export", r.seq)),
                    Some(_) => {}
                }
            }
        }
        Ok(problems)
    }
}
