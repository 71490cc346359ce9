//! Reading usage files back, and summing them per tenant, event and label (and person).

use std::collections::BTreeMap;
use std::io::Read as _;

use futures::TryStreamExt as _;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

use crate::time::parse_hour;
use crate::{Histogram, PREFIX, Result, Row};

/// What [`read()`] found.
#[derive(Debug, Default)]
pub struct Read {
    /// Every line of every file read.
    pub rows: Vec<Row>,
    /// Files read.
    pub files: usize,
    /// Files or lines that could not be read, and why (the rest are still counted).
    pub skipped: Vec<String>,
}

/// Reads the usage files of `tenant` (an id; `None`: every tenant) for hours from
/// `since_hour` on. A damaged file or line is skipped and named in [`Read::skipped`].
pub async fn read(store: &dyn ObjectStore, tenant: Option<&str>, since_hour: i64) -> Result<Read> {
    let prefix = match tenant {
        Some(t) => ObjectPath::from(format!("{PREFIX}/{t}")),
        None => ObjectPath::from(PREFIX),
    };
    let mut files: Vec<ObjectPath> = store
        .list(Some(&prefix))
        .try_filter_map(|meta| async move {
            let hour = meta.location.parts().nth(2).and_then(|p| parse_hour(p.as_ref()));
            Ok(hour.filter(|h| *h >= since_hour).map(|_| meta.location))
        })
        .try_collect()
        .await?;
    files.sort();
    let mut out = Read::default();
    for file in files {
        let body = match store.get(&file).await {
            Ok(got) => got.bytes().await?,
            // Swept meanwhile.
            Err(object_store::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut text = String::new();
        if let Err(e) = flate2::read::GzDecoder::new(&body[..]).read_to_string(&mut text) {
            out.skipped.push(format!("{file}: not a gzip-compressed text file ({e})"));
            continue;
        }
        out.files += 1;
        for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            match serde_json::from_str::<Row>(line) {
                Ok(row) => out.rows.push(row),
                Err(e) => out.skipped.push(format!("{file} line {}: {e}", n + 1)),
            }
        }
    }
    Ok(out)
}

/// An event's figures for one tenant and label (and person, when summed by person) over the
/// hours read.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Summary {
    /// The tenant's id.
    pub tenant: String,
    /// The person's user id (empty: summed over people, or no person).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// The event.
    pub event: String,
    /// Its label (empty for events without one).
    pub label: String,
    /// How many.
    pub count: u64,
    /// How many failed.
    pub failed: u64,
    /// The median latency (ms), when the event has latencies.
    pub p50_ms: Option<f64>,
    /// The 95th percentile latency (ms).
    pub p95_ms: Option<f64>,
    /// The first and last hours with any.
    pub first_hour: String,
    /// See `first_hour`.
    pub last_hour: String,
}

/// One (tenant, event, label)'s sums so far.
struct Sums<'a> {
    count: u64,
    failed: u64,
    ms: Histogram,
    first: &'a str,
    last: &'a str,
}

/// Sums rows (every writer, every hour) per tenant, event and label — and, `by_user`, per
/// person — sorted so (a tenant's people in the order of their ids).
pub fn summarise(rows: &[Row], by_user: bool) -> Vec<Summary> {
    let mut sums: BTreeMap<(&str, &str, &str, &str), Sums<'_>> = BTreeMap::new();
    for row in rows {
        let hour = row.hour.as_str();
        let user = if by_user { row.user.as_str() } else { "" };
        let e = sums.entry((&row.tenant, user, &row.event, &row.label)).or_insert_with(|| Sums {
            count: 0,
            failed: 0,
            ms: Histogram::default(),
            first: hour,
            last: hour,
        });
        e.count += row.count;
        e.failed += row.failed;
        e.ms.merge(&row.ms);
        e.first = e.first.min(hour);
        e.last = e.last.max(hour);
    }
    sums.into_iter()
        .map(|((tenant, user, event, label), s)| Summary {
            tenant: tenant.to_owned(),
            user: user.to_owned(),
            event: event.to_owned(),
            label: label.to_owned(),
            count: s.count,
            failed: s.failed,
            p50_ms: s.ms.quantile(0.5),
            p95_ms: s.ms.quantile(0.95),
            first_hour: s.first.to_owned(),
            last_hour: s.last.to_owned(),
        })
        .collect()
}
