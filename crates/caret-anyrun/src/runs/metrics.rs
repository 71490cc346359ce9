//! The run service's figures: Prometheus counters by class and tenant, and (opt-in) usage
//! telemetry of the runs that end.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use caret_protocol::runs::{RunClass, RunState};

/// A series of [`RunMetrics`]: (metric, class, tenant name).
type SeriesKey = (&'static str, &'static str, String);

/// Counters and sums for `/metrics`, by class and tenant name.
#[derive(Debug, Default)]
pub struct RunMetrics {
    /// Each series' count and sum of seconds.
    series: Mutex<BTreeMap<SeriesKey, (u64, f64)>>,
    /// Usage telemetry (off unless the server sets it).
    usage: std::sync::OnceLock<caret_usage::Recorder>,
}

impl RunMetrics {
    /// Records ended runs in `usage` (once; later calls are ignored).
    pub fn set_usage(&self, usage: caret_usage::Recorder) {
        let _ = self.usage.set(usage);
    }

    /// A run of `tenant` (its id) ended in `state`, `ms` after its last start.
    pub(super) fn ended(&self, tenant: &str, state: RunState, ms: Option<f64>) {
        if let Some(usage) = self.usage.get() {
            usage.record(tenant, None, "run", state.as_str(), ms, state == RunState::Succeeded);
        }
    }

    pub(super) fn observe(&self, metric: &'static str, class: RunClass, tenant: &str, seconds: f64) {
        let mut s = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        let e = s.entry((metric, class.as_str(), tenant.to_owned())).or_default();
        e.0 += 1;
        e.1 += seconds;
    }

    /// Prometheus text: `caret_run_*` counters (`_count`, `_sum` for timings).
    pub fn render(&self) -> String {
        let s = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = String::new();
        let mut last = "";
        for ((metric, class, tenant), (count, sum)) in s.iter() {
            if *metric != last {
                out.push_str(&format!("# TYPE caret_run_{metric} summary\n"));
                last = metric;
            }
            let labels = format!("class=\"{class}\",tenant=\"{}\"", tenant.replace(['"', '\\', '\n'], "_"));
            out.push_str(&format!("caret_run_{metric}_count{{{labels}}} {count}\n"));
            out.push_str(&format!("caret_run_{metric}_sum{{{labels}}} {sum:.6}\n"));
        }
        out
    }
}
