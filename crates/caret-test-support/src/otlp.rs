//! A receiver of OpenTelemetry trace exports over OTLP/HTTP (protobuf), as a collector is:
//! each body is decoded with the official protobuf definitions (`opentelemetry-proto`) and
//! its spans kept, with the raw bodies, for tests to inspect (parents, attributes, canaries).

use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message as _;

/// A span as received.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// `service.name` of the process that sent it.
    pub service: String,
    /// Its name.
    pub name: String,
    /// Trace id, hex.
    pub trace_id: String,
    /// Span id, hex.
    pub span_id: String,
    /// Parent span id, hex (empty: a root).
    pub parent_id: String,
    /// Attributes, values as text.
    pub attributes: Vec<(String, String)>,
    /// Names of its events.
    pub events: Vec<String>,
}

impl Span {
    /// An attribute's value.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    bodies: Vec<Vec<u8>>,
    refused: usize,
}

/// The receiver, on loopback; its URL is what `OTEL_EXPORTER_OTLP_ENDPOINT` takes.
pub struct Receiver {
    /// Its base URL (spans are posted to `/v1/traces`).
    pub url: String,
    received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(v: Option<&Any>) -> String {
    match v {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

async fn traces(State(received): State<Arc<Mutex<Received>>>, body: Bytes) -> StatusCode {
    let Ok(request) = ExportTraceServiceRequest::decode(body.as_ref()) else {
        received.lock().unwrap_or_else(PoisonError::into_inner).refused += 1;
        return StatusCode::BAD_REQUEST;
    };
    let mut spans = Vec::new();
    for resource in &request.resource_spans {
        let service = resource
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .map(|a| text(a.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for scope in &resource.scope_spans {
            for s in &scope.spans {
                spans.push(Span {
                    service: service.clone(),
                    name: s.name.clone(),
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_id: hex(&s.parent_span_id),
                    attributes: s
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), text(a.value.as_ref().and_then(|v| v.value.as_ref()))))
                        .collect(),
                    events: s.events.iter().map(|e| e.name.clone()).collect(),
                });
            }
        }
    }
    let mut r = received.lock().unwrap_or_else(PoisonError::into_inner);
    r.spans.extend(spans);
    r.bodies.push(body.to_vec());
    StatusCode::OK
}

impl Receiver {
    /// Starts one.
    pub async fn start() -> Receiver {
        let received = Arc::new(Mutex::new(Received::default()));
        let app = axum::Router::new().route("/v1/traces", axum::routing::post(traces)).with_state(received.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding the receiver");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { url, received, task }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.received.lock().unwrap_or_else(PoisonError::into_inner).spans.clone()
    }

    /// Every body received so far, as sent.
    pub fn bodies(&self) -> Vec<Vec<u8>> {
        self.received.lock().unwrap_or_else(PoisonError::into_inner).bodies.clone()
    }

    /// Bodies that were not OTLP protobuf.
    pub fn refused(&self) -> usize {
        self.received.lock().unwrap_or_else(PoisonError::into_inner).refused
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
