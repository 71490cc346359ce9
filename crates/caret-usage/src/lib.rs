//! Opt-in usage telemetry: how much each capability is used and how fast it answers, per
//! tenant, person and hour — never code, paths, queries, prompts, names or emails.
//!
//! What can be recorded is fixed here, in [`EVENTS`]: an event name, a label from a closed
//! vocabulary (a search mode, a run's ending, a tool or model alias name; anything else is
//! recorded as `other`), the person's opaque user id where a person made the call (none for
//! service accounts and tenant tokens), whether it succeeded, and its latency. The
//! [`Recorder`] adds them up in memory per tenant, hour, event, label and person (a count,
//! failures, a latency histogram) and
//! writes each hour's sums for each tenant to the object store as one gzip-compressed JSON
//! lines file, `usage/<tenant id>/<YYYY-MM-DDTHH>/<writer>.jsonl.gz` (UTC). A writer is one
//! server process: it rewrites its own file for the hour as the sums grow, so replicas never
//! write the same object and a crash loses at most the last flush interval. Files older than
//! the retention are deleted by every writer's hourly sweep. [`read()`] and [`summarise`] turn
//! the files back into figures for `caret admin usage`.

mod read;
mod recorder;
mod time;

pub use read::{Read, Summary, read, summarise};
pub use recorder::{Recorder, Settings};
pub use time::{hour_name, parse_hour, parse_since, rfc3339};

use std::collections::BTreeMap;

/// The object-store prefix every usage file lives under.
pub const PREFIX: &str = "usage";

/// Errors reading or writing usage files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object store failed.
    #[error("usage files: {0}")]
    Store(#[from] object_store::Error),
    /// Writing a file failed (compression).
    #[error("usage files: {0}")]
    Io(#[from] std::io::Error),
}

/// A `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// What an event's label may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Labels {
    /// No label.
    None,
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// A name the operator or the code chose (a model alias, a tool): lower-case letters,
    /// digits, `.`, `_` and `-`, at most 40 characters.
    Name,
}

/// An event that can be recorded.
#[derive(Debug, Clone, Copy)]
pub struct EventKind {
    /// Its name.
    pub name: &'static str,
    /// What its label may be.
    pub labels: Labels,
    /// Whether editors may report it (`POST /v1/usage`); the others are recorded by the server.
    pub from_clients: bool,
    /// What it counts, and what its latency measures (for the docs and `--help`).
    pub what: &'static str,
}

/// Everything that can be recorded.
pub const EVENTS: &[EventKind] = &[
    EventKind {
        name: "tab.shown",
        labels: Labels::None,
        from_clients: true,
        what: "a Tab suggestion shown in an editor; latency: from the request to the answer",
    },
    EventKind {
        name: "tab.accepted",
        labels: Labels::None,
        from_clients: true,
        what: "a Tab suggestion accepted in an editor; no latency",
    },
    EventKind {
        name: "next_edit.shown",
        labels: Labels::None,
        from_clients: true,
        what: "a next edit (Tab, Tab) offered in an editor; latency: from the request to the answer",
    },
    EventKind {
        name: "next_edit.accepted",
        labels: Labels::None,
        from_clients: true,
        what: "a next edit applied with Tab in an editor; no latency",
    },
    EventKind {
        name: "tab",
        labels: Labels::None,
        from_clients: false,
        what: "a Tab request the server answered; latency: the whole answer",
    },
    EventKind {
        name: "search",
        labels: Labels::OneOf(&["hybrid", "lexical", "semantic"]),
        from_clients: false,
        what: "a codebase search; label: its mode; latency: the server's answer",
    },
    EventKind {
        name: "chat",
        labels: Labels::Name,
        from_clients: false,
        what: "a chat call to the gateway (`/v1/chat/completions`); label: the model alias; latency: until the answer starts",
    },
    EventKind {
        name: "agent.turn",
        labels: Labels::OneOf(&["done", "interrupted", "step_limit", "failed"]),
        from_clients: false,
        what: "an agent session's turn; label: how it ended; latency: the turn",
    },
    EventKind {
        name: "agent.tool",
        labels: Labels::Name,
        from_clients: false,
        what: "an agent's tool call; label: the tool's name; latency: the call",
    },
    EventKind {
        name: "run",
        labels: Labels::OneOf(&["succeeded", "failed", "cancelled"]),
        from_clients: false,
        what: "a background run that ended; label: how; latency: from its last start to its end",
    },
];

/// The event named `name`.
pub fn event(name: &str) -> Option<&'static EventKind> {
    EVENTS.iter().find(|e| e.name == name)
}

/// The label recorded for `label` under `kind`: itself when the vocabulary allows it,
/// `other` when not, empty for events without labels.
pub fn label_for(kind: &EventKind, label: &str) -> String {
    match kind.labels {
        Labels::None => String::new(),
        Labels::OneOf(words) => {
            if words.contains(&label) {
                label.to_owned()
            } else {
                "other".to_owned()
            }
        }
        Labels::Name => {
            let ok = !label.is_empty()
                && label.len() <= 40
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
            if ok { label.to_owned() } else { "other".to_owned() }
        }
    }
}

/// Whether `user` can be recorded as a person's id: what identity ids are (lower-case letters,
/// digits, `-` and `_`, at most 64); anything else is recorded as no one.
pub fn user_for(user: Option<&str>) -> String {
    match user {
        Some(u)
            if !u.is_empty()
                && u.len() <= 64
                && u.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_".contains(&b)) =>
        {
            u.to_owned()
        }
        _ => String::new(),
    }
}

/// One file line: an event's sums for one tenant, hour, label and person, from one writer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// The hour (`YYYY-MM-DDTHH`, UTC).
    pub hour: String,
    /// The tenant's id.
    pub tenant: String,
    /// The event's name.
    pub event: String,
    /// Its label (empty for events without one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub label: String,
    /// The person's user id (empty: no person, or files written before people were counted).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// How many.
    pub count: u64,
    /// How many failed.
    #[serde(default)]
    pub failed: u64,
    /// The latencies, as a histogram.
    #[serde(default, skip_serializing_if = "Histogram::is_empty")]
    pub ms: Histogram,
}

/// Latencies in milliseconds, in buckets a quarter of a power of two wide (bucket `i` holds
/// `2^((i-1)/4) < ms <= 2^(i/4)`; bucket 0 everything up to 1 ms): quantiles within ±9 %.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Histogram(BTreeMap<u16, u64>);

/// The last bucket (2^30 ms, about 12 days): longer latencies are counted in it.
const TOP_BUCKET: u16 = 120;

impl Histogram {
    /// Adds one latency.
    pub fn add(&mut self, ms: f64) {
        let bucket =
            if ms.is_nan() || ms <= 1.0 { 0 } else { (ms.log2() * 4.0).ceil().min(f64::from(TOP_BUCKET)) as u16 };
        *self.0.entry(bucket).or_default() += 1;
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Histogram) {
        for (b, n) in &other.0 {
            *self.0.entry((*b).min(TOP_BUCKET)).or_default() += n;
        }
    }

    /// How many latencies.
    pub fn count(&self) -> u64 {
        self.0.values().sum()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `q` quantile (0 to 1), as its bucket's geometric middle; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, n) in &self.0 {
            seen += n;
            if seen >= rank {
                return Some(if *b == 0 { 1.0 } else { 2f64.powf((f64::from(*b) - 0.5) / 4.0) });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_outside_the_vocabulary_are_recorded_as_other() {
        let search = event("search").unwrap();
        assert_eq!(label_for(search, "hybrid"), "hybrid");
        assert_eq!(label_for(search, "def secret_function"), "other");
        let tool = event("agent.tool").unwrap();
        assert_eq!(label_for(tool, "read_file"), "read_file");
        assert_eq!(label_for(tool, "/home/alice/src/main.rs"), "other");
        assert_eq!(label_for(tool, "Read File"), "other");
        assert_eq!(label_for(tool, &"x".repeat(41)), "other");
        assert_eq!(label_for(event("tab.shown").unwrap(), "anything"), "");
        assert!(event("keystrokes").is_none());
        assert_eq!(user_for(Some("3f2a9c0d1e")), "3f2a9c0d1e");
        assert_eq!(user_for(Some("alice@example.com")), "");
        assert_eq!(user_for(None), "");
    }

    #[test]
    fn quantiles_land_within_a_bucket_of_the_truth() {
        let mut h = Histogram::default();
        for ms in 1..=1000 {
            h.add(f64::from(ms));
        }
        let p50 = h.quantile(0.5).unwrap();
        assert!((500.0 * 0.84..=500.0 * 1.19).contains(&p50), "p50 {p50}");
        let p95 = h.quantile(0.95).unwrap();
        assert!((950.0 * 0.84..=950.0 * 1.19).contains(&p95), "p95 {p95}");
        assert_eq!(h.count(), 1000);
        let mut other = Histogram::default();
        other.add(0.2);
        other.add(f64::NAN);
        other.add(1e12);
        h.merge(&other);
        assert_eq!(h.count(), 1003);
        assert_eq!(Histogram::default().quantile(0.5), None);
        let text = serde_json::to_string(&other).unwrap();
        assert_eq!(serde_json::from_str::<Histogram>(&text).unwrap(), other);
    }
}
