//! Traces across processes. When `OTEL_EXPORTER_OTLP_ENDPOINT` is set, Caret's own spans
//! (sync, search, embedding, model calls, Tab, apply, agent turns and tool calls, runs) are
//! exported over OTLP/HTTP in protobuf from a background thread; when it is not, nothing is
//! exported and nothing is added to requests. The W3C `traceparent` header carries the
//! current span from a client to the server, from the gateway to an upstream, and from a
//! worker to the server, so one request is one trace.
//!
//! Error reports (a 5xx, a panic) go to the log and, when `SENTRY_DSN` is set, to a
//! Sentry-protocol receiver: see [`report`].
//!
//! Only spans whose target is Caret's are exported, with the fields they declare: never
//! events (log lines), whose text may name paths, and never a library's spans. Span fields
//! are ids, names of routes, tools and models, counts and durations: never code, real paths,
//! queries, prompts or secrets (a test with canaries holds the server to it).

pub mod report;
mod spans;

use std::sync::Arc;

use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanProcessor};
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::spans::{Sampling, Spans};

/// The variable that turns export on (the collector's base URL; spans go to `/v1/traces`).
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The W3C trace context header.
pub const TRACEPARENT: &str = "traceparent";

/// The exporter could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("setting up the OTLP exporter to {endpoint}")]
pub struct Error {
    /// Where spans were to go.
    pub endpoint: String,
    /// Why.
    #[source]
    pub source: opentelemetry_otlp::ExporterBuildError,
}

/// Spans are exported while this lives; what is pending is sent when it is dropped.
pub struct Exporter {
    processor: Arc<BatchSpanProcessor>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exporter")
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Err(e) = self.processor.shutdown() {
            tracing::warn!(error = %e, "sending the last spans");
        }
    }
}

/// A boxed layer of subscriber `S`.
pub type BoxedLayer<S> = Box<dyn Layer<S> + Send + Sync>;

/// A layer exporting Caret's spans as `service` (`caret-server`, `caret-client`,
/// `caret-worker`), when [`ENDPOINT_VAR`] is set; `None` when it is not.
pub fn layer<S>(service: &'static str) -> Result<Option<(BoxedLayer<S>, Exporter)>, Error>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let Some(endpoint) = std::env::var(ENDPOINT_VAR).ok().filter(|e| !e.trim().is_empty()) else {
        return Ok(None);
    };
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_http_client(Blocking::new())
        .build()
        .map_err(|source| Error { endpoint: endpoint.clone(), source })?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service)
        .with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let mut processor = BatchSpanProcessor::builder(exporter).build();
    processor.set_resource(&resource);
    let processor = Arc::new(processor);
    let var = |name: &str| std::env::var(name).ok();
    let sampling = Sampling::from_env(var("OTEL_TRACES_SAMPLER").as_deref(), var("OTEL_TRACES_SAMPLER_ARG").as_deref());
    // Only what a span says of itself, kept until it closes (see `spans`): no work when a
    // span is entered or left, no thread or source location attributes.
    let layer = Spans::new(Shared(processor.clone()), sampling)
        // The level hint keeps the process's maximum level where the logs' filter puts it:
        // without it every `debug!` and `log` record everywhere would be built and asked about.
        .with_filter(
            tracing_subscriber::filter::filter_fn(|m| {
                m.is_span() && m.target().starts_with("caret") && *m.level() <= tracing::Level::INFO
            })
            .with_max_level_hint(tracing::Level::INFO),
        )
        .boxed();
    Ok(Some((layer, Exporter { processor })))
}

/// The batch processor, shared by the layer and the [`Exporter`] that shuts it down.
#[derive(Debug)]
struct Shared(Arc<BatchSpanProcessor>);

impl SpanProcessor for Shared {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.0.on_start(span, cx);
    }
    fn on_end(&self, span: opentelemetry_sdk::trace::SpanData) {
        self.0.on_end(span);
    }
    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }
}

/// Runs `f` on `span`'s exported data (nothing when it is not exported).
fn with_data(span: &tracing::Span, f: &mut dyn FnMut(&mut spans::Data, &Sampling)) {
    span.with_subscriber(|(id, dispatch)| spans::with_data(dispatch, id, f));
}

/// The current span's `traceparent`, when it is exported (none without a collector).
pub fn traceparent() -> Option<String> {
    let mut out = None;
    with_data(&tracing::Span::current(), &mut |d, _| out = Some(d.traceparent()));
    out
}

/// Makes the trace a `traceparent` header names the parent of `span` (a request's span on
/// the server, a run's on the worker), before it has children. A missing or malformed
/// header leaves `span` a root.
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    let Some((trace, parent, sampled)) = traceparent.and_then(spans::parse_traceparent) else { return };
    with_data(span, &mut |d, sampling| {
        d.trace = trace;
        d.parent = parent;
        d.remote_parent = true;
        d.sampled = sampling.keep(trace, Some(sampled));
    });
}

/// The trace id of `span` (hex), when it is exported.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    let mut out = None;
    with_data(span, &mut |d, _| out = Some(d.trace.to_string()));
    out
}

/// The `traceparent` of a request's headers.
pub fn from_headers(headers: &http::HeaderMap) -> Option<&str> {
    headers.get(TRACEPARENT).and_then(|v| v.to_str().ok())
}

/// The exporter's HTTP client: the workspace's reqwest, blocking (spans are sent from the
/// exporter's own thread, outside any async runtime), built on first use there.
#[derive(Debug)]
struct Blocking(std::sync::OnceLock<reqwest::blocking::Client>);

impl Blocking {
    fn new() -> Blocking {
        Blocking(std::sync::OnceLock::new())
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Blocking {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let client = match self.0.get() {
            Some(c) => c,
            None => {
                let c = reqwest::blocking::Client::builder().timeout(std::time::Duration::from_secs(10)).build()?;
                self.0.get_or_init(|| c)
            }
        };
        let (parts, body) = request.into_parts();
        let answer =
            client.request(parts.method, parts.uri.to_string()).headers(parts.headers).body(body.to_vec()).send()?;
        let mut response = http::Response::builder().status(answer.status());
        if let Some(h) = response.headers_mut() {
            h.extend(answer.headers().clone());
        }
        Ok(response.body(answer.bytes()?)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_collector_nothing_is_sent_and_a_parent_is_harmless() {
        assert_eq!(traceparent(), None, "no span is exported, so none is named");
        let span = tracing::info_span!("request");
        set_parent(&span, Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
        set_parent(&span, Some("garbage"));
        set_parent(&span, None);
    }
}
