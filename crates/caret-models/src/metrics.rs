//! Gateway metrics in the Prometheus text format. Labels: alias, deployment, class, error
//! kind — never prompt text, tenants or tokens.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Histogram bucket bounds in seconds.
const BOUNDS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

#[derive(Debug, Clone, Default)]
struct Histogram {
    counts: [u64; BOUNDS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        for (c, b) in self.counts.iter_mut().zip(BOUNDS) {
            if s <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += s;
    }
}

#[derive(Debug, Clone, Default)]
struct Stats {
    requests: u64,
    ttft: Histogram,
    total: Histogram,
    prompt_tokens: u64,
    completion_tokens: u64,
    errors: BTreeMap<&'static str, u64>,
}

/// Counters and histograms by (deployment, class); gauges are passed in at render time.
#[derive(Debug, Default)]
pub struct GatewayMetrics {
    stats: Mutex<BTreeMap<(String, &'static str), Stats>>,
    shed: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl GatewayMetrics {
    fn with(&self, deployment: &str, class: &'static str, f: impl FnOnce(&mut Stats)) {
        let mut m = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        f(m.entry((deployment.to_owned(), class)).or_default());
    }

    /// A request reached the deployment and its first token (or answer) came after `ttft`.
    pub(crate) fn first_token(&self, deployment: &str, class: &'static str, ttft: Duration) {
        self.with(deployment, class, |s| {
            s.requests += 1;
            s.ttft.observe(ttft);
        });
    }

    /// A request to the deployment ended after `total` (successfully or not).
    pub(crate) fn finished(&self, deployment: &str, class: &'static str, total: Duration, usage: Option<(u32, u32)>) {
        self.with(deployment, class, |s| {
            s.total.observe(total);
            if let Some((p, c)) = usage {
                s.prompt_tokens += u64::from(p);
                s.completion_tokens += u64::from(c);
            }
        });
    }

    /// A call to the deployment failed.
    pub(crate) fn error(&self, deployment: &str, class: &'static str, kind: &'static str) {
        self.with(deployment, class, |s| *s.errors.entry(kind).or_default() += 1);
    }

    /// A request was shed (deployment `-` when before any deployment was chosen).
    pub(crate) fn shed(&self, deployment: &str, class: &'static str) {
        let mut m = self.shed.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((deployment.to_owned(), class)).or_default() += 1;
    }

    /// Requests shed so far, all deployments and classes (for benchmarks and tests).
    pub fn shed_total(&self) -> u64 {
        self.shed.lock().unwrap_or_else(|p| p.into_inner()).values().sum()
    }

    /// The exposition text, with per-deployment gauges `(deployment, queue depth, in flight,
    /// breaker state 0/1/2)`.
    pub fn render(&self, gauges: &[(String, usize, usize, u8)]) -> String {
        let mut out = String::new();
        let stats = self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let head = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        head(&mut out, "caret_model_requests_total", "counter", "Requests that reached a deployment.");
        for ((d, c), s) in &stats {
            let _ = writeln!(out, "caret_model_requests_total{{deployment=\"{d}\",class=\"{c}\"}} {}", s.requests);
        }
        for (name, help, pick) in [
            ("caret_model_ttft_seconds", "Time to the first token.", (|s: &Stats| &s.ttft) as fn(&Stats) -> &Histogram),
            ("caret_model_request_seconds", "Time to the end of the answer.", |s: &Stats| &s.total),
        ] {
            head(&mut out, name, "histogram", help);
            for ((d, c), s) in &stats {
                let h = pick(s);
                for (b, n) in BOUNDS.iter().zip(h.counts) {
                    let _ = writeln!(out, "{name}_bucket{{deployment=\"{d}\",class=\"{c}\",le=\"{b}\"}} {n}");
                }
                let _ = writeln!(out, "{name}_bucket{{deployment=\"{d}\",class=\"{c}\",le=\"+Inf\"}} {}", h.count);
                let _ = writeln!(out, "{name}_sum{{deployment=\"{d}\",class=\"{c}\"}} {:.6}", h.sum);
                let _ = writeln!(out, "{name}_count{{deployment=\"{d}\",class=\"{c}\"}} {}", h.count);
            }
        }
        head(&mut out, "caret_model_tokens_total", "counter", "Tokens by direction.");
        for ((d, c), s) in &stats {
            let _ = writeln!(
                out,
                "caret_model_tokens_total{{deployment=\"{d}\",class=\"{c}\",direction=\"prompt\"}} {}",
                s.prompt_tokens
            );
            let _ = writeln!(
                out,
                "caret_model_tokens_total{{deployment=\"{d}\",class=\"{c}\",direction=\"completion\"}} {}",
                s.completion_tokens
            );
        }
        head(&mut out, "caret_model_errors_total", "counter", "Failed calls by kind.");
        for ((d, c), s) in &stats {
            for (kind, n) in &s.errors {
                let _ =
                    writeln!(out, "caret_model_errors_total{{deployment=\"{d}\",class=\"{c}\",kind=\"{kind}\"}} {n}");
            }
        }
        head(&mut out, "caret_model_shed_total", "counter", "Requests shed to protect higher classes.");
        for ((d, c), n) in self.shed.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(out, "caret_model_shed_total{{deployment=\"{d}\",class=\"{c}\"}} {n}");
        }
        head(&mut out, "caret_model_queue_depth", "gauge", "Requests waiting for a deployment.");
        for (d, q, _, _) in gauges {
            let _ = writeln!(out, "caret_model_queue_depth{{deployment=\"{d}\"}} {q}");
        }
        head(&mut out, "caret_model_in_flight", "gauge", "Requests running on a deployment.");
        for (d, _, f, _) in gauges {
            let _ = writeln!(out, "caret_model_in_flight{{deployment=\"{d}\"}} {f}");
        }
        head(&mut out, "caret_model_breaker_state", "gauge", "Circuit breaker: 0 closed, 1 half-open, 2 open.");
        for (d, _, _, b) in gauges {
            let _ = writeln!(out, "caret_model_breaker_state{{deployment=\"{d}\"}} {b}");
        }
        out
    }
}
