//! Error reports: a failed request (a 5xx) or a panic is reported once, with its context
//! (route, tenant id, trace id, release), to the log and, when `SENTRY_DSN` is set, to any
//! receiver that speaks Sentry's protocol (Sentry, GlitchTip, a relay), through the `sentry`
//! crate and a transport of our own on the workspace's HTTP client. A report carries what
//! failed and where in Caret's code: never code, paths or prompts (a panic's message, which
//! could hold anything, stays in the local log; the report has its location).

use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sentry::protocol::{Event, Level};
use sentry::{Envelope, Transport};

/// The variable naming the receiver.
pub const DSN_VAR: &str = "SENTRY_DSN";

/// Reports go out while this lives; what is pending is sent when it is dropped.
pub struct Reports {
    _guard: sentry::ClientInitGuard,
}

impl std::fmt::Debug for Reports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reports")
    }
}

/// Sends reports to `SENTRY_DSN` as `service` when it is set (`Ok(None)` when it is not),
/// and reports panics (always to the log).
pub fn init(service: &'static str) -> Result<Option<Reports>, String> {
    install_panic_hook();
    let Some(dsn) = std::env::var(DSN_VAR).ok().filter(|d| !d.trim().is_empty()) else { return Ok(None) };
    let dsn: sentry::types::Dsn = dsn.trim().parse().map_err(|e| format!("{DSN_VAR} is not a DSN: {e}"))?;
    let transport = Arc::new(Sender::start(&dsn));
    let mut options = sentry::ClientOptions::default();
    options.dsn = Some(dsn);
    options.release = Some(format!("caret@{}", env!("CARGO_PKG_VERSION")).into());
    options.environment = std::env::var("SENTRY_ENVIRONMENT").ok().map(Into::into);
    options.server_name = Some(service.into());
    options.send_default_pii = false;
    options.default_integrations = false;
    options.transport = Some(Arc::new(transport));
    let guard = sentry::init(options);
    sentry::configure_scope(|scope| scope.set_tag("service", service));
    Ok(Some(Reports { _guard: guard }))
}

/// A request that failed on the server's side.
#[derive(Debug, Clone)]
pub struct Failure<'a> {
    /// The method.
    pub method: &'a str,
    /// The route's template (never the path).
    pub route: &'a str,
    /// The status answered.
    pub status: u16,
    /// The stable error code answered.
    pub code: &'a str,
    /// The tenant's opaque id, when known.
    pub tenant: Option<&'a str>,
    /// The trace, when traces are exported.
    pub trace_id: Option<String>,
    /// What went wrong: the error and its causes (the server's errors never hold code).
    pub detail: &'a str,
}

/// Reports a failed request once: to the log, and to the receiver when there is one.
pub fn failure(f: &Failure<'_>) {
    tracing::error!(
        method = f.method,
        route = f.route,
        status = f.status,
        code = f.code,
        tenant = f.tenant.unwrap_or("-"),
        trace_id = f.trace_id.as_deref().unwrap_or("-"),
        error = f.detail,
        "request failed"
    );
    let mut event = Event {
        message: Some(format!("{} {}: {} ({})", f.method, f.route, f.code, f.detail)),
        level: Level::Error,
        ..Event::default()
    };
    event.tags.insert("route".into(), f.route.to_owned());
    event.tags.insert("method".into(), f.method.to_owned());
    event.tags.insert("status".into(), f.status.to_string());
    event.tags.insert("code".into(), f.code.to_owned());
    if let Some(t) = f.tenant {
        event.tags.insert("tenant".into(), t.to_owned());
    }
    if let Some(t) = &f.trace_id {
        event.tags.insert("trace_id".into(), t.clone());
    }
    sentry::capture_event(event);
}

/// What a panic is reported as: where it happened, never its message.
pub fn panic_event(file: &str, line: u32, thread: &str) -> Event<'static> {
    let mut event = Event {
        message: Some(format!("panic at {file}:{line} (thread {thread})")),
        level: Level::Fatal,
        ..Event::default()
    };
    event.tags.insert("panic.location".into(), format!("{file}:{line}"));
    event
}

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let (file, line) = info.location().map_or(("?", 0), |l| (l.file(), l.line()));
            let thread = std::thread::current().name().unwrap_or("unnamed").to_owned();
            tracing::error!(location = %format!("{file}:{line}"), thread, "panic");
            sentry::capture_event(panic_event(file, line, &thread));
            if let Some(client) = sentry::Hub::current().client() {
                client.flush(Some(Duration::from_secs(2)));
            }
            previous(info);
        }));
    });
}

/// Envelopes sent one after another from a thread of their own (blocking HTTP, off any
/// async runtime); flushing waits for the queue to drain.
struct Sender {
    queue: Mutex<mpsc::Sender<Job>>,
}

enum Job {
    Send(Box<Envelope>),
    Flush(mpsc::Sender<()>),
}

impl Sender {
    fn start(dsn: &sentry::types::Dsn) -> Sender {
        let (tx, rx) = mpsc::channel::<Job>();
        let url = dsn.envelope_api_url().to_string();
        let auth = dsn.to_auth(Some(concat!("caret/", env!("CARGO_PKG_VERSION")))).to_string();
        let spawned = std::thread::Builder::new().name("error-reports".into()).spawn(move || {
            let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().ok();
            for job in rx {
                match job {
                    Job::Send(envelope) => {
                        let mut body = Vec::new();
                        if envelope.to_writer(&mut body).is_err() {
                            continue;
                        }
                        let Some(client) = &client else { continue };
                        let sent = client
                            .post(&url)
                            .header("X-Sentry-Auth", &auth)
                            .header("Content-Type", "application/x-sentry-envelope")
                            .body(body)
                            .send();
                        if let Err(e) = sent {
                            tracing::warn!(error = %e, "sending an error report");
                        }
                    }
                    Job::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "starting the error reports' thread");
        }
        Sender { queue: Mutex::new(tx) }
    }
}

impl Transport for Sender {
    fn send_envelope(&self, envelope: Envelope) {
        let _ = self.queue.lock().unwrap_or_else(PoisonError::into_inner).send(Job::Send(Box::new(envelope)));
    }

    fn flush(&self, timeout: Duration) -> bool {
        let (tx, rx) = mpsc::channel();
        if self.queue.lock().unwrap_or_else(PoisonError::into_inner).send(Job::Flush(tx)).is_err() {
            return false;
        }
        rx.recv_timeout(timeout).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_reported_by_its_place_not_its_message() {
        let e = panic_event("crates/caret-server/src/http.rs", 42, "tokio-runtime-worker");
        assert_eq!(
            e.message.as_deref(),
            Some("panic at crates/caret-server/src/http.rs:42 (thread tokio-runtime-worker)")
        );
        assert_eq!(e.level, Level::Fatal);
    }
}
