//! Caret's span layer: each exported span keeps its ids, start time and the few fields it
//! declares in its extensions until it closes, and is then handed, whole, to the
//! OpenTelemetry SDK's batch processor (a channel send; the export runs on the processor's
//! thread). Nothing is done when a span is entered or left, so a future polled a thousand
//! times costs what one polled once does.
//!
//! Sampling follows `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (`always_on`,
//! `always_off`, `traceidratio`, and their `parentbased_` forms, the default being
//! `parentbased_always_on`): a root span is sampled by its trace id, a child as its parent
//! (a remote parent by its `traceparent` flags). Unsampled spans still carry ids, so the
//! trace context propagates.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator, SpanData, SpanProcessor};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Dispatch, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// What a span keeps until it closes.
#[derive(Debug, Clone)]
pub(crate) struct Data {
    pub(crate) trace: TraceId,
    pub(crate) id: SpanId,
    pub(crate) parent: SpanId,
    pub(crate) remote_parent: bool,
    pub(crate) sampled: bool,
    start: SystemTime,
    attributes: Vec<KeyValue>,
}

impl Data {
    /// The W3C `traceparent` naming this span.
    pub(crate) fn traceparent(&self) -> String {
        format!("00-{}-{}-{:02x}", self.trace, self.id, u8::from(self.sampled))
    }
}

/// Which root spans are sampled, and whether a child follows its parent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sampling {
    /// The share of root traces kept (0 to 1).
    ratio: f64,
    /// A child is sampled as its parent is (else by its trace id like a root).
    parent_based: bool,
}

impl Sampling {
    /// From the OpenTelemetry variables' values.
    pub(crate) fn from_env(sampler: Option<&str>, arg: Option<&str>) -> Sampling {
        let ratio = || arg.and_then(|a| a.trim().parse::<f64>().ok()).map_or(1.0, |r| r.clamp(0.0, 1.0));
        match sampler.map(str::trim) {
            Some("always_off") => Sampling { ratio: 0.0, parent_based: false },
            Some("parentbased_always_off") => Sampling { ratio: 0.0, parent_based: true },
            Some("always_on") => Sampling { ratio: 1.0, parent_based: false },
            Some("traceidratio") => Sampling { ratio: ratio(), parent_based: false },
            Some("parentbased_traceidratio") => Sampling { ratio: ratio(), parent_based: true },
            _ => Sampling { ratio: 1.0, parent_based: true },
        }
    }

    /// Whether a span of `trace` is kept, given its parent's decision (if it has a parent).
    pub(crate) fn keep(&self, trace: TraceId, parent: Option<bool>) -> bool {
        match parent {
            Some(sampled) if self.parent_based => sampled,
            _ => {
                // The trace id's low 63 bits against the ratio, as OpenTelemetry's
                // `TraceIdRatioBased` does, so every process decides the same for a trace.
                let low = u64::from_be_bytes(trace.to_bytes()[8..].try_into().unwrap_or([0; 8])) >> 1;
                (low as f64) < self.ratio * (1u64 << 63) as f64
            }
        }
    }
}

/// The sampling of the process's exporting layer (set when it is made).
static SAMPLING: std::sync::OnceLock<Sampling> = std::sync::OnceLock::new();

/// Runs `f` on the exported data of the span `id` of `dispatch` and the layer's sampling
/// (nothing for a span it does not export, or a subscriber without Caret's layer).
pub(crate) fn with_data(dispatch: &Dispatch, id: &Id, f: &mut dyn FnMut(&mut Data, &Sampling)) {
    let Some(sampling) = SAMPLING.get() else { return };
    let Some(registry) = dispatch.downcast_ref::<tracing_subscriber::Registry>() else { return };
    let Some(span) = registry.span(id) else { return };
    let mut extensions = span.extensions_mut();
    if let Some(data) = extensions.get_mut::<Data>() {
        f(data, sampling);
    }
}

/// The layer.
pub(crate) struct Spans<P> {
    processor: P,
    sampling: Sampling,
    scope: InstrumentationScope,
    ids: RandomIdGenerator,
}

impl<P: SpanProcessor> Spans<P> {
    /// The layer; spans are reachable from [`with_data`] when the subscriber is a
    /// `tracing_subscriber::Registry` with layers.
    pub(crate) fn new(processor: P, sampling: Sampling) -> Self {
        let _ = SAMPLING.set(sampling);
        Spans {
            processor,
            sampling,
            scope: InstrumentationScope::builder("caret").with_version(env!("CARGO_PKG_VERSION")).build(),
            ids: RandomIdGenerator::default(),
        }
    }
}

/// Keeps a span's fields as attributes (a later value of a field replaces the earlier).
struct Fields<'a>(&'a mut Vec<KeyValue>);

impl Fields<'_> {
    fn put(&mut self, field: &Field, value: opentelemetry::Value) {
        let key = field.name();
        match self.0.iter_mut().find(|kv| kv.key.as_str() == key) {
            Some(kv) => kv.value = value,
            None => self.0.push(KeyValue::new(key, value)),
        }
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.to_owned().into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, i64::try_from(value).unwrap_or(i64::MAX).into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}").into());
    }
}

impl<S, P> tracing_subscriber::Layer<S> for Spans<P>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    P: SpanProcessor + 'static,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let parent = span.parent().and_then(|p| p.extensions().get::<Data>().map(|d| (d.trace, d.id, d.sampled)));
        let (trace, parent_id, parent_sampled) = match parent {
            Some((trace, id, sampled)) => (trace, id, Some(sampled)),
            None => (self.ids.new_trace_id(), SpanId::INVALID, None),
        };
        let mut data = Data {
            trace,
            id: self.ids.new_span_id(),
            parent: parent_id,
            remote_parent: false,
            sampled: self.sampling.keep(trace, parent_sampled),
            start: SystemTime::now(),
            attributes: Vec::with_capacity(attrs.fields().len()),
        };
        attrs.record(&mut Fields(&mut data.attributes));
        span.extensions_mut().insert(data);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        if let Some(data) = span.extensions_mut().get_mut::<Data>() {
            values.record(&mut Fields(&mut data.attributes));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(data) = span.extensions_mut().remove::<Data>() else { return };
        if !data.sampled {
            return;
        }
        self.processor.on_end(SpanData {
            span_context: SpanContext::new(data.trace, data.id, TraceFlags::SAMPLED, false, TraceState::NONE),
            parent_span_id: data.parent,
            parent_span_is_remote: data.remote_parent,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed(span.metadata().name()),
            start_time: data.start,
            end_time: SystemTime::now(),
            attributes: data.attributes,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: self.scope.clone(),
        });
    }
}

/// Parses a W3C `traceparent` (`00-TRACE-SPAN-FLAGS`): trace, parent span, sampled.
pub(crate) fn parse_traceparent(value: &str) -> Option<(TraceId, SpanId, bool)> {
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || version == "ff" || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let trace = TraceId::from_hex(trace).ok().filter(|t| *t != TraceId::INVALID)?;
    let span = SpanId::from_hex(span).ok().filter(|s| *s != SpanId::INVALID)?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some((trace, span, flags & 1 == 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_read_strictly() {
        let (t, s, sampled) = parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
        assert_eq!(
            (t.to_string().as_str(), s.to_string().as_str(), sampled),
            ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", true)
        );
        assert!(!parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00").unwrap().2);
        for bad in [
            "garbage",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }

    /// A processor that keeps what it is given (a test double of the batch processor).
    #[derive(Debug, Clone, Default)]
    struct Kept(std::sync::Arc<std::sync::Mutex<Vec<SpanData>>>);

    impl SpanProcessor for Kept {
        fn on_start(&self, _: &mut opentelemetry_sdk::trace::Span, _: &opentelemetry::Context) {}
        fn on_end(&self, span: SpanData) {
            self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(span);
        }
        fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: std::time::Duration) -> opentelemetry_sdk::error::OTelSdkResult {
            Ok(())
        }
    }

    #[test]
    fn spans_keep_their_fields_parents_and_a_remote_parent() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let kept = Kept::default();
        let subscriber = tracing_subscriber::registry().with(Spans::new(kept.clone(), Sampling::from_env(None, None)));
        tracing::subscriber::with_default(subscriber, || {
            let request = tracing::info_span!("request", http.route = "/v1/x", http.status = tracing::field::Empty);
            crate::set_parent(&request, Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
            {
                let _entered = request.enter();
                let parent = crate::traceparent().unwrap_or_default();
                assert!(parent.starts_with("00-0af7651916cd43dd8448eb211c80319c-"), "{parent}");
                assert!(parent.ends_with("-01"));
                let search = tracing::info_span!("index.search", k = 10u64);
                let _inner = search.enter();
                request.record("http.status", 200u64);
            }
            assert_eq!(crate::trace_id(&request).as_deref(), Some("0af7651916cd43dd8448eb211c80319c"));
            drop(request);
            let _root = tracing::info_span!("another").entered();
        });
        let spans = kept.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["index.search", "request", "another"], "closed in that order");
        let (search, request, other) = (&spans[0], &spans[1], &spans[2]);
        assert_eq!(request.parent_span_id.to_string(), "b7ad6b7169203331");
        assert!(request.parent_span_is_remote);
        assert_eq!(search.parent_span_id, request.span_context.span_id());
        assert_eq!(search.span_context.trace_id(), request.span_context.trace_id());
        assert_ne!(other.span_context.trace_id(), request.span_context.trace_id(), "a root starts its own trace");
        let attr =
            |s: &SpanData, k: &str| s.attributes.iter().find(|kv| kv.key.as_str() == k).map(|kv| kv.value.to_string());
        assert_eq!(attr(request, "http.route").as_deref(), Some("/v1/x"));
        assert_eq!(attr(request, "http.status").as_deref(), Some("200"), "recorded after the start");
        assert_eq!(attr(search, "k").as_deref(), Some("10"));
        assert!(request.start_time <= request.end_time);
    }

    #[test]
    fn an_unsampled_parent_keeps_its_children_out() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let kept = Kept::default();
        let subscriber = tracing_subscriber::registry().with(Spans::new(kept.clone(), Sampling::from_env(None, None)));
        tracing::subscriber::with_default(subscriber, || {
            let request = tracing::info_span!("request");
            crate::set_parent(&request, Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"));
            let _entered = request.enter();
            assert!(crate::traceparent().is_some_and(|p| p.ends_with("-00")), "the context still propagates");
            let _child = tracing::info_span!("child").entered();
        });
        assert!(kept.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_empty());
    }

    #[test]
    fn sampling_by_ratio_and_by_parent() {
        let all = Sampling::from_env(None, None);
        let none = Sampling::from_env(Some("always_off"), None);
        let half = Sampling::from_env(Some("parentbased_traceidratio"), Some("0.5"));
        let ids = RandomIdGenerator::default();
        let traces: Vec<TraceId> = (0..2000).map(|_| ids.new_trace_id()).collect();
        assert!(traces.iter().all(|t| all.keep(*t, None)));
        assert!(traces.iter().all(|t| !none.keep(*t, None) && !none.keep(*t, Some(true))));
        let kept = traces.iter().filter(|t| half.keep(**t, None)).count();
        assert!((800..1200).contains(&kept), "{kept} of 2000 at 0.5");
        // A child follows its parent whatever its trace id says.
        assert!(traces.iter().all(|t| half.keep(*t, Some(true)) && !half.keep(*t, Some(false))));
    }
}
