//! Prometheus metrics in the text exposition format. Labels are route templates and status
//! codes only: never paths, ids or content.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Request count and total seconds by (method, route template, status).
type RequestStats = BTreeMap<(String, String, u16), (u64, f64)>;

/// The server's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<RequestStats>,
    /// Request body bytes received.
    pub bytes_in: AtomicU64,
    /// Chunks stored.
    pub chunks_stored: AtomicU64,
    /// Files committed.
    pub files_committed: AtomicU64,
}

impl Metrics {
    /// Records one request.
    pub fn request(&self, method: &str, route: &str, status: u16, seconds: f64) {
        let mut m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.entry((method.to_owned(), route.to_owned(), status)).or_default();
        e.0 += 1;
        e.1 += seconds;
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP caret_http_requests_total HTTP requests by method, route and status.\n");
        out.push_str("# TYPE caret_http_requests_total counter\n");
        let m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        for ((method, route, status), (count, _)) in m.iter() {
            let _ = writeln!(
                out,
                "caret_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {count}"
            );
        }
        out.push_str("# HELP caret_http_request_seconds_sum Total time spent in requests.\n");
        out.push_str("# TYPE caret_http_request_seconds_sum counter\n");
        for ((method, route, status), (_, secs)) in m.iter() {
            let _ = writeln!(
                out,
                "caret_http_request_seconds_sum{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {secs:.6}"
            );
        }
        for (name, help, v) in [
            ("caret_http_request_bytes_total", "Request body bytes received.", &self.bytes_in),
            ("caret_chunks_stored_total", "Chunks stored.", &self.chunks_stored),
            ("caret_files_committed_total", "Files committed.", &self.files_committed),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Ordering::Relaxed));
        }
        out
    }
}
