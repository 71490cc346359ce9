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

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

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
    provider: SdkTracerProvider,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exporter")
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
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
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    let tracer = provider.tracer("caret");
    // Only what a span says of itself: no per-poll bookkeeping (busy/idle times, entering
    // OpenTelemetry's own context — `traceparent()` reads the span's), no thread or source
    // location attributes. Each costs CPU on every request.
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_context_activation(false)
        .with_threads(false)
        .with_location(false)
        // The level hint keeps the process's maximum level where the logs' filter puts it:
        // without it every `debug!` and `log` record everywhere would be built and asked about.
        .with_filter(
            tracing_subscriber::filter::filter_fn(|m| {
                m.is_span() && m.target().starts_with("caret") && *m.level() <= tracing::Level::INFO
            })
            .with_max_level_hint(tracing::Level::INFO),
        )
        .boxed();
    Ok(Some((layer, Exporter { provider })))
}

/// The current span's `traceparent`, when it is exported (none without a collector).
pub fn traceparent() -> Option<String> {
    let cx = tracing::Span::current().context();
    let mut carrier = Carrier::default();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.0
}

/// Makes the trace a `traceparent` header names the parent of `span` (a request's span on
/// the server, a run's on the worker). A missing or malformed header leaves `span` a root.
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(value) = traceparent else { return };
    let cx = TraceContextPropagator::new().extract(&Carrier(Some(value.to_owned())));
    let _ = span.set_parent(cx);
}

/// The trace id of `span` (hex), when it is exported.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
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

/// One `traceparent` value (the only header the W3C propagator needs; `tracestate` is not
/// carried).
#[derive(Default)]
struct Carrier(Option<String>);

impl Injector for Carrier {
    fn set(&mut self, key: &str, value: String) {
        if key == TRACEPARENT {
            self.0 = Some(value);
        }
    }
}

impl Extractor for Carrier {
    fn get(&self, key: &str) -> Option<&str> {
        if key == TRACEPARENT { self.0.as_deref() } else { None }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
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

    #[test]
    fn a_traceparent_survives_the_carrier() {
        let value = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let cx = TraceContextPropagator::new().extract(&Carrier(Some(value.to_owned())));
        let mut out = Carrier::default();
        TraceContextPropagator::new().inject_context(&cx, &mut out);
        assert_eq!(out.0.as_deref(), Some(value));
    }
}
