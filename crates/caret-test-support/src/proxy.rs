//! A plain round-robin HTTP load balancer, for tests of replicas behind one address: each
//! request goes to the next upstream in turn, whatever it is (no stickiness, no knowledge of
//! Caret); an upstream that refuses the connection is passed over for the next one, as
//! nginx's default `proxy_next_upstream error` does. Upstreams can be replaced while it runs
//! (a rolling restart). Bodies are streamed back, so event streams pass through.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Default)]
struct Shared {
    upstreams: Mutex<Vec<String>>,
    next: AtomicUsize,
    /// Requests sent to each upstream URL, in order of first use.
    served: Mutex<Vec<(String, usize)>>,
}

/// The balancer, listening on loopback.
pub struct RoundRobin {
    /// Its base URL.
    pub url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl RoundRobin {
    /// Starts in front of `upstreams` (base URLs).
    pub async fn start(upstreams: Vec<String>) -> RoundRobin {
        let shared = Arc::new(Shared { upstreams: Mutex::new(upstreams), ..Shared::default() });
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(2))
            .build()
            .expect("an HTTP client");
        let app = axum::Router::new().fallback(forward).with_state((shared.clone(), client));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding the balancer");
        let addr: SocketAddr = listener.local_addr().expect("its address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        RoundRobin { url: format!("http://{addr}"), shared, task }
    }

    /// Replaces the upstreams.
    pub fn set_upstreams(&self, upstreams: Vec<String>) {
        *self.shared.upstreams.lock().unwrap_or_else(PoisonError::into_inner) = upstreams;
    }

    /// How many requests each upstream answered.
    pub fn served(&self) -> Vec<(String, usize)> {
        self.shared.served.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(State((shared, client)): State<(Arc<Shared>, reqwest::Client)>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 64 << 20).await else {
        return (StatusCode::BAD_REQUEST, "unreadable body").into_response();
    };
    let upstreams = shared.upstreams.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    for _ in 0..upstreams.len() {
        let n = shared.next.fetch_add(1, Ordering::Relaxed) % upstreams.len().max(1);
        let base = &upstreams[n];
        let mut headers = parts.headers.clone();
        headers.remove("host");
        let sent = client
            .request(parts.method.clone(), format!("{base}{path}"))
            .headers(headers)
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(answer) => {
                {
                    let mut served = shared.served.lock().unwrap_or_else(PoisonError::into_inner);
                    match served.iter_mut().find(|(u, _)| u == base) {
                        Some((_, n)) => *n += 1,
                        None => served.push((base.clone(), 1)),
                    }
                }
                let mut response = Response::builder().status(answer.status());
                if let Some(h) = response.headers_mut() {
                    for (name, value) in answer.headers() {
                        if !matches!(name.as_str(), "connection" | "transfer-encoding") {
                            h.append(name.clone(), value.clone());
                        }
                    }
                }
                return response
                    .body(Body::from_stream(answer.bytes_stream()))
                    .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response());
            }
            // Refused: the next upstream (the request never reached this one).
            Err(e) if e.is_connect() => continue,
            Err(_) => return (StatusCode::BAD_GATEWAY, "the upstream failed").into_response(),
        }
    }
    (StatusCode::BAD_GATEWAY, "no upstream answered").into_response()
}
