//! A receiver of error reports in Sentry's envelope protocol (`POST /api/{project}/envelope/`,
//! newline-separated headers and items), as Sentry, GlitchTip or a relay take them: the
//! events are kept as JSON, with the raw bodies and the auth headers, for tests to inspect.

use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;

#[derive(Default)]
struct Received {
    events: Vec<Value>,
    bodies: Vec<Vec<u8>>,
    auth: Vec<String>,
}

/// The receiver, on loopback.
pub struct Receiver {
    /// A DSN pointing at it (project 42).
    pub dsn: String,
    received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
}

/// The items of an envelope of type `event`, parsed: each item header may give its payload's
/// length, else the payload runs to the end of its line.
fn events(body: &[u8]) -> Option<Vec<Value>> {
    let mut rest = body;
    let line = |rest: &mut &[u8]| -> Option<Vec<u8>> {
        if rest.is_empty() {
            return None;
        }
        let end = rest.iter().position(|b| *b == b'\n').unwrap_or(rest.len());
        let out = rest[..end].to_vec();
        *rest = &rest[(end + 1).min(rest.len())..];
        Some(out)
    };
    let _envelope: Value = serde_json::from_slice(&line(&mut rest)?).ok()?;
    let mut out = Vec::new();
    while let Some(header) = line(&mut rest) {
        if header.is_empty() {
            continue;
        }
        let header: Value = serde_json::from_slice(&header).ok()?;
        let payload = match header["length"].as_u64() {
            Some(n) => {
                let n = usize::try_from(n).ok()?.min(rest.len());
                let p = rest[..n].to_vec();
                rest = &rest[n..];
                if rest.first() == Some(&b'\n') {
                    rest = &rest[1..];
                }
                p
            }
            None => line(&mut rest).unwrap_or_default(),
        };
        if header["type"] == "event" {
            out.push(serde_json::from_slice(&payload).ok()?);
        }
    }
    Some(out)
}

async fn envelope(State(received): State<Arc<Mutex<Received>>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let Some(parsed) = events(&body) else { return StatusCode::BAD_REQUEST };
    let mut r = received.lock().unwrap_or_else(PoisonError::into_inner);
    r.events.extend(parsed);
    r.bodies.push(body.to_vec());
    if let Some(a) = headers.get("x-sentry-auth").and_then(|v| v.to_str().ok()) {
        r.auth.push(a.to_owned());
    }
    StatusCode::OK
}

impl Receiver {
    /// Starts one.
    pub async fn start() -> Receiver {
        let received = Arc::new(Mutex::new(Received::default()));
        let app = axum::Router::new()
            .route("/api/{project}/envelope/", axum::routing::post(envelope))
            .with_state(received.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding the receiver");
        let addr = listener.local_addr().expect("its address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { dsn: format!("http://publickey@{addr}/42"), received, task }
    }

    /// Events received so far.
    pub fn events(&self) -> Vec<Value> {
        self.received.lock().unwrap_or_else(PoisonError::into_inner).events.clone()
    }

    /// Raw bodies received so far.
    pub fn bodies(&self) -> Vec<Vec<u8>> {
        self.received.lock().unwrap_or_else(PoisonError::into_inner).bodies.clone()
    }

    /// `X-Sentry-Auth` headers received.
    pub fn auth(&self) -> Vec<String> {
        self.received.lock().unwrap_or_else(PoisonError::into_inner).auth.clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
