//! The spans a batch leaves, named as OpenTelemetry's messaging conventions
//! name them, and the trace context a message's producer sent with it.
//!
//! Each batch is a `process` span (`messaging.batch.message_count`), each
//! record a `process` span of its own under it (`messaging.message.id`, the
//! queue, the outcome, a hash of the key: never the key or the body, which
//! may hold personal data), and each record's run has children: `claim`,
//! `handler` (under which the handler's own spans nest) and the finishing
//! write (`commit`, `complete`, `fail` or `release`). The record span names
//! the producer's context, read from the message's `traceparent` attribute
//! (W3C Trace Context) or, failing that, the `AWSTraceHeader` system
//! attribute SQS fills when the producer is traced with X-Ray.
//!
//! The spans are at `DEBUG` level under the target `sqs_once::trace`. The
//! log lines never show them, at any level; a subscriber a program installs
//! before sqs-once's, that collects spans (an OpenTelemetry layer), gets
//! them, and without one they cost a disabled callsite each.
//!
//! With the `opentelemetry` feature and an OTLP endpoint set, sqs-once
//! records them itself and sends them to a collector (`otlp`): the
//! batch span is then a child of Lambda's own trace, each record span is
//! linked to its producer's context, and the messages its run sends carry
//! the record span's context onward.

use aws_lambda_events::sqs::SqsMessage;
use sha2::{Digest, Sha256};

use crate::{
    event::EventRecord,
    report::{Outcome, RecordReport},
};

use sqs_once_core::trace::{Propagators, TARGET, TraceContext};

/// A batch's `process` span, child of the current span (in Lambda, the
/// invocation's) or, for OpenTelemetry, of `parent`: Lambda's own trace
/// (`Lambda-Runtime-Trace-Id`), whose sampling decision it follows unless
/// `OTEL_TRACES_SAMPLER` says otherwise.
pub(crate) fn batch_span(records: usize, parent: Option<&TraceContext>) -> tracing::Span {
    let span = tracing::debug_span!(
        target: TARGET,
        "process",
        otel.name = "process",
        otel.kind = "consumer",
        messaging.system = "aws_sqs",
        messaging.operation.type = "process",
        messaging.batch.message_count = records,
    );
    #[cfg(feature = "opentelemetry")]
    if let Some(parent) = parent.filter(|_| !span.is_disabled()) {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        // Refused only without an OpenTelemetry layer, which leaves nothing to parent.
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(parent.remote()));
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = parent;
    span
}

/// The context a record's run gives the messages it sends: its own span's
/// when spans are recorded, else its producer's as it arrived (what W3C
/// Trace Context asks of an intermediary that does not trace); none when
/// `propagators` write no header.
pub(crate) fn onward(message: &SqsMessage, propagators: Propagators) -> Option<TraceContext> {
    if !(propagators.w3c || propagators.xray) {
        return None;
    }
    TraceContext::of_span(&tracing::Span::current()).or_else(|| TraceContext::of(message, propagators))
}

/// A record's `process` span, child of the current span (the batch's),
/// naming (and linked to) the producer's context `propagators` read.
pub(crate) fn record_span(record: &EventRecord, propagators: Propagators) -> tracing::Span {
    let message = match record {
        EventRecord::Message(message) => Some(&**message),
        EventRecord::Malformed { .. } => None,
    };
    let arn = message.and_then(|message| message.event_source_arn.as_deref());
    let queue = arn.and_then(|arn| arn.rsplit(':').next()).unwrap_or("");
    let span = tracing::debug_span!(
        target: TARGET,
        "process",
        otel.name = %format_args!("process {queue}"),
        otel.kind = "consumer",
        messaging.system = "aws_sqs",
        messaging.operation.type = "process",
        messaging.destination.name = queue,
        messaging.message.id = record.message_id(),
        sqs_once.producer_context = tracing::field::Empty,
        sqs_once.key_hash = tracing::field::Empty,
        sqs_once.payload_bytes = tracing::field::Empty,
        sqs_once.outcome = tracing::field::Empty,
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if !span.is_disabled()
        && let Some(context) = message.and_then(|message| TraceContext::of(message, propagators))
    {
        span.record("sqs_once.producer_context", tracing::field::display(context));
        // A link, not a parent: the batch holds messages of many producers.
        #[cfg(feature = "opentelemetry")]
        tracing_opentelemetry::OpenTelemetrySpanExt::add_link(&span, context.remote());
    }
    span
}

/// Records, on a record's span, the outcome the answer reports, a hash of
/// the key it ran under (two records of one key are seen to share it
/// without the key in the trace) and the bytes of a payload read from S3;
/// a failure's label is its `error.type`.
pub(crate) fn record_outcome(span: &tracing::Span, report: &RecordReport) {
    if span.is_disabled() {
        return;
    }
    if let Some(key) = &report.key {
        span.record("sqs_once.key_hash", hex::encode(&Sha256::digest(key.as_bytes())[..8]));
    }
    if let Some(bytes) = report.payload_bytes {
        span.record("sqs_once.payload_bytes", bytes);
    }
    span.record("sqs_once.outcome", report.outcome.label());
    if let Outcome::Failed(failure) = &report.outcome {
        span.record("error.type", failure.label());
        span.record("otel.status_code", "ERROR");
    }
}

/// A run's `claim` span; `unclaimed` when the run takes no claim (its
/// handler stages every effect) and only reads whether the key is free.
pub(crate) fn claim_span(unclaimed: bool) -> tracing::Span {
    tracing::debug_span!(target: TARGET, "claim", sqs_once.unclaimed = unclaimed)
}

/// The span a handler runs in: its own spans nest under it.
pub(crate) fn handler_span() -> tracing::Span {
    tracing::debug_span!(target: TARGET, "handler")
}

/// The span of the write that records how a handler ended: `commit` (with
/// what it staged), `complete`, `fail` (permanently) or `release`.
pub(crate) fn write_span(write: &'static str) -> tracing::Span {
    tracing::debug_span!(target: TARGET, "finish", otel.name = write, sqs_once.write = write)
}

/// The span of a committed run's messages leaving through the outbox.
pub(crate) fn send_span(messages: usize) -> tracing::Span {
    tracing::debug_span!(
        target: TARGET,
        "send",
        otel.name = "send",
        otel.kind = "producer",
        messaging.operation.type = "send",
        messaging.batch.message_count = messages,
    )
}
