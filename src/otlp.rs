//! Sending the spans to a collector: OTLP over HTTP, protobuf, configured by
//! OpenTelemetry's standard variables (feature `opentelemetry`).
//!
//! A Lambda function is frozen as soon as it answers, so spans cannot wait
//! for a background exporter: the SDK's batch processor exports from a
//! thread of its own, which a freeze stops mid-request, and its flush blocks
//! the calling thread. Here the tracer's only processor keeps finished spans
//! in memory ([`SpanBuffer`]), and the consumer sends them at its flush
//! points, awaiting on its own runtime: before each Lambda answer, at the
//! end of each batch of `invoke` and `poll`, and as the process leaves. A
//! flush that cannot finish by its time is abandoned and counted; the answer
//! never waits past its budget for it.

use parking_lot::Mutex;
use std::{
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use futures::{StreamExt, stream};
use http::{HeaderName, HeaderValue, Request, Uri, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use opentelemetry::{Context, trace::TracerProvider as _};
use opentelemetry_proto::{
    tonic::collector::trace::v1::ExportTraceServiceRequest,
    transform::{common::tonic::ResourceAttributesWithSchema, trace::tonic::group_spans_by_resource_and_scope},
};
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    trace::{SdkTracerProvider, Span, SpanData, SpanProcessor, Tracer},
};
use prost::Message as _;
use tokio::time::{Instant, timeout_at};

use tracing_subscriber::{
    Layer,
    filter::{LevelFilter, Targets},
};

use crate::{config::ConfigError, logging::SpanLayer};

/// The spans of a process and how they leave it: either kept by sqs-once
/// and sent at the flush points, or a tracer provider the program gave,
/// flushed there.
#[derive(Debug, Clone)]
pub(crate) struct Export {
    provider: SdkTracerProvider,
    sending: Sending,
    counters: Arc<ExportCounters>,
}

#[derive(Debug, Clone)]
enum Sending {
    /// Kept in the buffer, sent to the endpoint.
    Kept { buffer: Arc<SpanBuffer>, endpoint: Arc<Endpoint> },
    /// The program's own provider: its processors send, and a flush point
    /// calls its `force_flush` (which blocks a thread) on a thread of its own.
    Provider,
}

/// What the flushes came to since the process started.
#[derive(Debug, Default)]
pub(crate) struct ExportCounters {
    /// Flushes that failed or did not finish in time.
    pub failed: AtomicU64,
    /// Spans lost: left over a full buffer, or in a flush that failed.
    pub dropped: AtomicU64,
}

impl Export {
    /// The export the environment asks for: `None` unless
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// is set (and `OTEL_SDK_DISABLED` is not `true`). The service is
    /// `OTEL_SERVICE_NAME`, else the Lambda function's name; the sampler
    /// `OTEL_TRACES_SAMPLER` (and `…_ARG`), read by the SDK.
    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, ConfigError> {
        // The specification reads an empty variable as one unset (`sam local invoke` sets a variable whose
        // condition it cannot resolve to "").
        let lookup = |name: &str| lookup(name).filter(|value| !value.trim().is_empty());
        if lookup("OTEL_SDK_DISABLED").is_some_and(|value| value.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let Some(endpoint) = Endpoint::from_lookup(&lookup)? else {
            return Ok(None);
        };
        let capacity =
            count(&lookup, "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_CAPACITY, "finished spans kept until a flush")?;
        let counters = Arc::<ExportCounters>::default();
        let buffer = Arc::new(SpanBuffer::new(capacity, Arc::clone(&counters)));
        let mut resource = Resource::builder();
        if lookup("OTEL_SERVICE_NAME").is_none()
            && let Some(function) = crate::environment::Environment::from_lookup(lookup).function_name
        {
            resource = resource.with_service_name(function);
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Keep(Arc::clone(&buffer)))
            .with_resource(resource.build())
            .build();
        Ok(Some(Self { provider, sending: Sending::Kept { buffer, endpoint: Arc::new(endpoint) }, counters }))
    }

    /// The export of a program's own tracer provider.
    pub(crate) fn of_provider(provider: SdkTracerProvider) -> Self {
        Self { provider, sending: Sending::Provider, counters: Arc::default() }
    }

    /// The `tracing` layer that records spans with this export's tracer:
    /// sqs-once's own (`sqs_once::trace`, at `DEBUG`) and, at `INFO` and
    /// above, the handlers' spans and events, which nest under their
    /// record's. Left out: the Lambda runtime's invocation span (the batch
    /// span stands for it, a child of Lambda's own trace) and the AWS SDK's
    /// and HTTP clients' inner spans.
    pub(crate) fn layer(&self) -> SpanLayer {
        let recorded = Targets::new()
            .with_default(LevelFilter::INFO)
            .with_target(sqs_once_core::trace::TARGET, LevelFilter::DEBUG)
            .with_targets(
                ["lambda_runtime", "lambda_runtime_api_client", "aws_smithy_runtime", "aws_config", "hyper"]
                    .map(|target| (target, LevelFilter::OFF)),
            );
        tracing_opentelemetry::layer().with_tracer(self.tracer()).with_filter(recorded).boxed()
    }

    fn tracer(&self) -> Tracer {
        self.provider.tracer("sqs-once")
    }

    /// The counts since start.
    pub(crate) fn counters(&self) -> &ExportCounters {
        &self.counters
    }

    /// Sends the spans finished so far, by `by` at the latest: past it the
    /// flush is abandoned, and it and its spans are counted.
    pub(crate) async fn flush(&self, by: Instant) {
        let sent = match &self.sending {
            Sending::Kept { buffer, endpoint } => {
                let (spans, resource) = buffer.take();
                if spans.is_empty() {
                    return;
                }
                endpoint.send_all(spans, &resource, by).await
            }
            Sending::Provider => {
                let provider = self.provider.clone();
                let flushing = tokio::task::spawn_blocking(move || provider.force_flush());
                match timeout_at(by, flushing).await {
                    Ok(Ok(Ok(()))) => Ok(()),
                    Ok(Ok(Err(error))) => Err((ExportError::Provider(error.to_string()), 0)),
                    Ok(Err(error)) => Err((ExportError::Provider(error.to_string()), 0)),
                    Err(_) => Err((ExportError::Late, 0)),
                }
            }
        };
        if let Err((error, spans)) = sent {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            self.counters.dropped.fetch_add(spans, Ordering::Relaxed);
            tracing::warn!(%error, spans, "the spans could not be exported; they are dropped");
        }
    }
}

/// Why a flush failed.
#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error("the collector did not answer in time")]
    Late,
    #[error("cannot reach the collector: {0}")]
    Unreachable(String),
    #[error("the collector refused the spans: HTTP {0}")]
    Refused(http::StatusCode),
    #[error("the tracer provider's flush failed: {0}")]
    Provider(String),
}

/// The spec's default for the batch processor's queue, which this buffer
/// stands for.
const DEFAULT_CAPACITY: usize = 2048;

/// Spans finished since the last flush, at most `capacity`; those over it
/// are dropped and counted, so a collector that is down never costs memory.
#[derive(Debug)]
struct SpanBuffer {
    spans: Mutex<Vec<SpanData>>,
    resource: Mutex<Resource>,
    capacity: usize,
    counters: Arc<ExportCounters>,
}

impl SpanBuffer {
    fn new(capacity: usize, counters: Arc<ExportCounters>) -> Self {
        Self {
            spans: Mutex::new(Vec::new()),
            resource: Mutex::new(Resource::builder_empty().build()),
            capacity,
            counters,
        }
    }

    fn take(&self) -> (Vec<SpanData>, Resource) {
        (std::mem::take(&mut *self.spans.lock()), self.resource.lock().clone())
    }
}

/// The tracer's processor: keeps each finished span in the buffer.
#[derive(Debug)]
struct Keep(Arc<SpanBuffer>);

impl SpanProcessor for Keep {
    fn on_start(&self, _: &mut Span, _: &Context) {}

    fn on_end(&self, span: SpanData) {
        let mut spans = self.0.spans.lock();
        match spans.len() < self.0.capacity {
            true => spans.push(span),
            false => _ = self.0.counters.dropped.fetch_add(1, Ordering::Relaxed),
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        *self.0.resource.lock() = resource.clone();
    }
}

/// Where the spans go: an OTLP/HTTP endpoint taking protobuf.
#[derive(Debug)]
struct Endpoint {
    uri: Uri,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
    /// The most spans in one request (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).
    batch: usize,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Endpoint {
    /// The endpoint the standard variables name, the traces' own taking
    /// precedence: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` appended; the
    /// protocol (`http/protobuf` only), headers and timeout likewise.
    fn from_lookup(lookup: &impl Fn(&str) -> Option<String>) -> Result<Option<Self>, ConfigError> {
        let either = |traces: &'static str, all: &'static str| match lookup(traces) {
            Some(value) => Some((traces, value)),
            None => lookup(all).map(|value| (all, value)),
        };
        let uri = match either("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") {
            None => return Ok(None),
            Some((name @ "OTEL_EXPORTER_OTLP_ENDPOINT", base)) => {
                endpoint_uri(name, &format!("{}/v1/traces", base.trim().trim_end_matches('/')))?
            }
            Some((name, url)) => endpoint_uri(name, url.trim())?,
        };
        if let Some((name, protocol)) = either("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
            && protocol.trim() != "http/protobuf"
        {
            return Err(ConfigError { name, value: protocol, expected: "http/protobuf".into() });
        }
        let timeout = match either("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT") {
            None => DEFAULT_TIMEOUT,
            Some((name, value)) => match value.trim().parse() {
                Ok(ms) => Duration::from_millis(ms),
                Err(_) => return Err(ConfigError { name, value, expected: "milliseconds".into() }),
            },
        };
        let headers = match either("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS") {
            None => Vec::new(),
            Some((name, value)) => headers(&value).ok_or_else(|| ConfigError {
                name,
                value,
                expected: "`key=value` pairs separated by commas, values percent-encoded".into(),
            })?,
        };
        let batch = count(lookup, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BATCH, "the most spans in one request")?;
        let client = Client::builder(TokioExecutor::new()).build_http();
        Ok(Some(Self { uri, headers, timeout, batch, client }))
    }

    /// Sends `spans` in requests of at most `batch` spans, a few at once,
    /// by `by` or the timeout, whichever is first; on failure, the first
    /// error and the spans lost (those of every request that failed or was
    /// not answered in time).
    async fn send_all(
        &self,
        mut spans: Vec<SpanData>,
        resource: &Resource,
        by: Instant,
    ) -> Result<(), (ExportError, u64)> {
        let by = by.min(Instant::now() + self.timeout);
        let resource = ResourceAttributesWithSchema::from(resource);
        let mut requests = Vec::new();
        while !spans.is_empty() {
            let rest = spans.split_off(spans.len().min(self.batch));
            requests.push(std::mem::replace(&mut spans, rest));
        }
        let sent: Vec<Result<(), (ExportError, u64)>> = stream::iter(requests)
            .map(|spans| {
                let count = spans.len() as u64;
                let resource = &resource;
                async move {
                    match timeout_at(by, self.send(spans, resource)).await {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(error)) => Err((error, count)),
                        Err(_) => Err((ExportError::Late, count)),
                    }
                }
            })
            .buffer_unordered(REQUESTS_AT_ONCE)
            .collect()
            .await;
        let lost: u64 = sent.iter().filter_map(|sent| sent.as_ref().err()).map(|(_, count)| count).sum();
        match sent.into_iter().find_map(Result::err) {
            Some((error, _)) => Err((error, lost)),
            None => Ok(()),
        }
    }

    /// Sends `spans` in one request.
    async fn send(&self, spans: Vec<SpanData>, resource: &ResourceAttributesWithSchema) -> Result<(), ExportError> {
        let request = ExportTraceServiceRequest { resource_spans: group_spans_by_resource_and_scope(spans, resource) };
        let mut post = Request::post(self.uri.clone()).header(CONTENT_TYPE, "application/x-protobuf");
        for (name, value) in &self.headers {
            post = post.header(name, value);
        }
        let post = post.body(Full::new(Bytes::from(request.encode_to_vec()))).map_err(unreachable)?;
        let answer = self.client.request(post).await.map_err(unreachable)?;
        let status = answer.status();
        // Read to the end, so that the connection is kept for the next flush.
        let _ = answer.into_body().collect().await;
        match status.is_success() {
            true => Ok(()),
            false => Err(ExportError::Refused(status)),
        }
    }
}

fn unreachable(error: impl std::error::Error) -> ExportError {
    ExportError::Unreachable(sqs_once_aws::with_causes(&error))
}

/// The spec's default wait for one export.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The spec's default for the batch processor's largest export, which a
/// request here is.
const DEFAULT_BATCH: usize = 512;

/// Requests of one flush in flight at once.
const REQUESTS_AT_ONCE: usize = 4;

/// A count above 0 that `name` sets, `default` when it is unset.
fn count(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: usize,
    what: &str,
) -> Result<usize, ConfigError> {
    let Some(value) = lookup(name) else {
        return Ok(default);
    };
    match value.trim().parse() {
        Ok(count) if count > 0 => Ok(count),
        _ => Err(ConfigError { name, value, expected: format!("{what}: a number above 0") }),
    }
}

/// A plain-HTTP URL: a collector beside the function (the ADOT collector
/// layer listens on `http://localhost:4318`) signs and sends onward.
fn endpoint_uri(name: &'static str, url: &str) -> Result<Uri, ConfigError> {
    let refused = |expected: &str| ConfigError { name, value: url.to_owned(), expected: expected.into() };
    let uri = Uri::from_str(url).map_err(|_| refused("a URL such as http://localhost:4318"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http"), Some(_)) => Ok(uri),
        _ => Err(refused(
            "an http:// URL of a collector (such as the ADOT collector layer's http://localhost:4318); https is \
             not sent directly",
        )),
    }
}

/// `key1=value1,key2=value2`, values percent-decoded, as the spec writes
/// `OTEL_EXPORTER_OTLP_HEADERS`.
fn headers(text: &str) -> Option<Vec<(HeaderName, HeaderValue)>> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=')?;
            let value = percent_encoding::percent_decode_str(value.trim()).decode_utf8().ok()?;
            Some((HeaderName::from_str(name.trim()).ok()?, HeaderValue::from_str(&value).ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |name| pairs.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone())
    }

    fn endpoint(pairs: &[(&str, &str)]) -> Result<Option<Endpoint>, ConfigError> {
        Endpoint::from_lookup(&lookup(pairs))
    }

    #[tokio::test]
    async fn the_endpoint_is_the_traces_own_or_the_base_with_the_signal_path() {
        assert!(endpoint(&[]).unwrap().is_none());
        let base = endpoint(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318/")]).unwrap().unwrap();
        assert_eq!(base.uri, "http://localhost:4318/v1/traces");
        assert_eq!(base.timeout, Duration::from_secs(10));
        let own = endpoint(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:9000/spans"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "250"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=a%20b, authorization=Bearer%20t"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(own.uri, "http://collector:9000/spans", "taken as it is");
        assert_eq!(own.timeout, Duration::from_millis(250));
        assert_eq!(own.headers[0], (HeaderName::from_static("x-tenant"), HeaderValue::from_static("a b")));
        assert_eq!(own.headers[1].1, "Bearer t");
    }

    #[test]
    fn spans_over_the_buffer_are_dropped_and_counted_and_a_flush_takes_the_rest() {
        use opentelemetry::trace::{Span as _, Tracer as _};
        let counters = Arc::<ExportCounters>::default();
        let buffer = Arc::new(SpanBuffer::new(2, Arc::clone(&counters)));
        let provider = SdkTracerProvider::builder().with_span_processor(Keep(Arc::clone(&buffer))).build();
        let tracer = provider.tracer("test");
        for name in ["a", "b", "c"] {
            tracer.start(name).end();
        }
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 1);
        let (spans, _) = buffer.take();
        assert_eq!(spans.iter().map(|span| span.name.as_ref()).collect::<Vec<_>>(), ["a", "b"]);
        assert!(buffer.take().0.is_empty(), "taken once");
        tracer.start("d").end();
        assert_eq!(buffer.take().0.len(), 1, "room again after a flush");
    }

    #[tokio::test]
    async fn settings_that_cannot_be_sent_are_refused_by_name() {
        for (pairs, refused) in [
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "https://xray.us-east-1.amazonaws.com")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (vec![("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "localhost:4318")], "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"), ("OTEL_EXPORTER_OTLP_TIMEOUT", "1s")],
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"),
                    ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
                ],
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
        ] {
            assert_eq!(endpoint(&pairs).unwrap_err().name, refused);
        }
        let queue = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"), ("OTEL_BSP_MAX_QUEUE_SIZE", "0")];
        assert_eq!(Export::from_lookup(lookup(&queue)).unwrap_err().name, "OTEL_BSP_MAX_QUEUE_SIZE");
        let disabled = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"), ("OTEL_SDK_DISABLED", "true")];
        assert!(Export::from_lookup(lookup(&disabled)).unwrap().is_none());
        let empty = [("OTEL_EXPORTER_OTLP_ENDPOINT", ""), ("OTEL_EXPORTER_OTLP_PROTOCOL", " ")];
        assert!(Export::from_lookup(lookup(&empty)).unwrap().is_none(), "empty is unset");
    }
}
