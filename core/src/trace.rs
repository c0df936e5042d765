//! The trace context a message's producer sent with it, and the one a sent
//! message carries onward: W3C's `traceparent` and X-Ray's trace header,
//! parsed and written. A leaf of the vocabulary: a staged message carries a
//! context. The spans a batch leaves are the engine's (`sqs-once-engine`).

use std::fmt;

use aws_lambda_events::sqs::SqsMessage;

/// The target every span and trace log line of sqs-once is under, the
/// engine's spans and the contexts read here alike.
pub const TARGET: &str = "sqs_once::trace";

/// The message attribute that carries a W3C trace context, read from
/// messages received and written on messages sent through the outbox.
pub const TRACEPARENT: &str = "traceparent";

/// Which trace headers sqs-once reads from the messages it receives and
/// writes on those it sends (`OTEL_PROPAGATORS`, a comma-separated list):
/// W3C's `traceparent` (`tracecontext`), X-Ray's `AWSTraceHeader` and
/// `TraceHeader` (`xray`), and whether a batch's span is a child of Lambda's
/// own trace (`xray` or `xray-lambda`); `baggage` is accepted and carries
/// nothing, `none` is none. Unset, all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Propagators {
    /// `traceparent`, read and written.
    pub w3c: bool,
    /// `AWSTraceHeader` (and an event's `TraceHeader`), read and written.
    pub xray: bool,
    /// A batch under Lambda's trace (`Lambda-Runtime-Trace-Id`).
    pub lambda: bool,
}

impl Default for Propagators {
    fn default() -> Self {
        Self { w3c: true, xray: true, lambda: true }
    }
}

impl std::str::FromStr for Propagators {
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        let mut chosen = Self { w3c: false, xray: false, lambda: false };
        for name in text.split(',').map(str::trim) {
            match name {
                "tracecontext" => chosen.w3c = true,
                "xray" => (chosen.xray, chosen.lambda) = (true, true),
                "xray-lambda" => chosen.lambda = true,
                "baggage" | "none" => {}
                _ => return Err(()),
            }
        }
        Ok(chosen)
    }
}

/// What `OTEL_PROPAGATORS` takes, for its error.
pub const PROPAGATORS: &str = "a comma-separated list of tracecontext, xray, xray-lambda, baggage, or none";

/// A W3C trace context: the trace, the span that is the parent, and
/// whether the producer sampled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    sampled: bool,
}

impl TraceContext {
    /// The producer's context of `message`, from the headers `propagators`
    /// read: its `traceparent` message attribute, or its `AWSTraceHeader`
    /// system attribute. A value that does not parse is no context (and is
    /// logged at debug level).
    pub fn of(message: &SqsMessage, propagators: Propagators) -> Option<Self> {
        let traceparent = message.message_attributes.get(TRACEPARENT).and_then(|value| value.string_value.as_deref());
        let traceparent = traceparent.filter(|_| propagators.w3c);
        let from_traceparent = traceparent.and_then(|text| Self::from_traceparent(text).or_else(|| ignored(text)));
        from_traceparent.or_else(|| {
            let header = message.attributes.get("AWSTraceHeader").filter(|_| propagators.xray)?;
            Self::from_xray(header).or_else(|| ignored(header))
        })
    }

    /// Parses a `traceparent` header: `version-traceid-spanid-flags`. A
    /// later version than `00` is read by its first four fields, as the
    /// specification asks; version `ff` and all-zero ids are invalid.
    pub(crate) fn from_traceparent(text: &str) -> Option<Self> {
        let mut fields = text.trim().split('-');
        let version = fields.next().filter(|version| hex::<1>(version).is_some() && *version != "ff")?;
        let (trace_id, span_id, flags) = (hex::<16>(fields.next()?)?, hex::<8>(fields.next()?)?, fields.next()?);
        if version == "00" && fields.next().is_some() {
            return None;
        }
        // A later version may append fields after a dash, never to the flags' two digits.
        let flags = hex::<1>(flags)?[0];
        Self::new(trace_id, span_id, flags & 1 == 1)
    }

    /// Parses an X-Ray trace header: `Root=1-{8 hex time}-{24 hex};
    /// Parent={16 hex};Sampled={0|1|?}`, in any order, other keys (such as
    /// `Lineage`) ignored. The W3C trace id is the root's two hex parts.
    pub fn from_xray(text: &str) -> Option<Self> {
        let (mut root, mut parent, mut sampled) = (None, None, false);
        // Parts without a value (a trailing `;`) say nothing.
        for part in text.split(';').filter_map(|part| part.trim().split_once('=')) {
            match part {
                ("Root", value) => root = Some(value),
                ("Parent", value) => parent = Some(value),
                ("Sampled", value) => sampled = value == "1",
                _ => {}
            }
        }
        let root = root?.strip_prefix("1-")?;
        let (time, random) = root.split_once('-')?;
        let trace_id = (time.len() == 8 && random.len() == 24).then(|| format!("{time}{random}"))?;
        Self::new(hex::<16>(&trace_id)?, hex::<8>(parent?)?, sampled)
    }

    fn new(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Option<Self> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(Self { trace_id, span_id, sampled })
    }

    /// The context of `span` as an OpenTelemetry layer records it: `None`
    /// without one (or without the `opentelemetry` feature), since a span
    /// then has no ids.
    pub fn of_span(span: &tracing::Span) -> Option<Self> {
        #[cfg(feature = "opentelemetry")]
        if !span.is_disabled() {
            use opentelemetry::trace::TraceContextExt;
            use tracing_opentelemetry::OpenTelemetrySpanExt;
            let context = span.context();
            let context = context.span().span_context().clone();
            if context.is_valid() {
                return Self::new(context.trace_id().to_bytes(), context.span_id().to_bytes(), context.is_sampled());
            }
        }
        #[cfg(not(feature = "opentelemetry"))]
        let _ = span;
        None
    }

    /// The context as OpenTelemetry's, of a span in another process.
    #[cfg(feature = "opentelemetry")]
    pub fn remote(&self) -> opentelemetry::trace::SpanContext {
        use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
        let flags = if self.sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
        let (trace_id, span_id) = (TraceId::from_bytes(self.trace_id), SpanId::from_bytes(self.span_id));
        SpanContext::new(trace_id, span_id, flags, true, TraceState::default())
    }

    /// The context as a version `00` `traceparent` header.
    pub(crate) fn traceparent(&self) -> String {
        format!("00-{}-{}-{:02x}", to_hex(&self.trace_id), to_hex(&self.span_id), u8::from(self.sampled))
    }

    /// The context as an X-Ray trace header, as SQS's `AWSTraceHeader`
    /// system attribute and EventBridge's `TraceHeader` carry it: the trace
    /// id's first 8 hex digits are the root's time, the other 24 its random
    /// part.
    pub fn xray_header(&self) -> String {
        let trace_id = to_hex(&self.trace_id);
        let (time, random) = trace_id.split_at(8);
        format!("Root=1-{time}-{random};Parent={};Sampled={}", to_hex(&self.span_id), u8::from(self.sampled))
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.traceparent())
    }
}

fn ignored(text: &str) -> Option<TraceContext> {
    tracing::debug!(target: TARGET, value = text, "a trace context that does not parse: the record links to none");
    None
}

/// `N` bytes from exactly `2 × N` lowercase hex digits (W3C Trace Context
/// allows no other; X-Ray writes lowercase too).
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N || !digits.iter().all(|digit| matches!(digit, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut bytes = [0; N];
    for (byte, pair) in bytes.iter_mut().zip(digits.chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(bytes)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_xray_header_is_the_w3c_context_of_the_same_trace() {
        // The example of AWS's X-Ray documentation ("Tracing header").
        let header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let context = TraceContext::from_xray(header).unwrap();
        assert_eq!(context.traceparent(), "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01");
        assert_eq!(context.xray_header(), header, "and back");
        let with_lineage = "Sampled=0;Root=1-5759e988-bd862e3fe1be46a994272793;Lineage=a87bd80c:1|68fd508a:5;\
                            Parent=53995c3f42cd8ad8";
        let trailing = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1;";
        assert_eq!(TraceContext::from_xray(trailing), Some(context));
        assert_eq!(
            TraceContext::from_xray(with_lineage).unwrap().traceparent(),
            "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00"
        );
        for invalid in [
            "Root=1-5759e988-bd862e3fe1be46a994272793", // no parent
            "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8", // unknown version
            "Root=1-5759e98-bd862e3fe1be46a9942727930;Parent=53995c3f42cd8ad8", // wrong split
            "Root=1-5759e988-bd862e3fe1be46a99427279z;Parent=53995c3f42cd8ad8", // not hex
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=0000000000000000", // no parent span
            "garbage",
        ] {
            assert_eq!(TraceContext::from_xray(invalid), None, "{invalid}");
        }
    }

    #[test]
    fn a_traceparent_reads_as_the_w3c_specification_says() {
        // The example of the W3C Trace Context specification.
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let context = TraceContext::from_traceparent(traceparent).unwrap();
        assert_eq!(context.traceparent(), traceparent);
        // A later version is read by its first four fields.
        let later = TraceContext::from_traceparent("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-09-what");
        assert_eq!(later, Some(context));
        for invalid in [
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "zz-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "FF-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        ] {
            assert_eq!(TraceContext::from_traceparent(invalid), None, "{invalid}");
        }
        assert!(
            !TraceContext::from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00").unwrap().sampled
        );
    }

    #[test]
    fn a_message_names_its_producer_by_traceparent_first_then_by_aws_trace_header() {
        let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let all = Propagators::default();
        let mut message = SqsMessage::default();
        assert_eq!(TraceContext::of(&message, all), None);
        message.attributes.insert("AWSTraceHeader".into(), xray.into());
        assert_eq!(TraceContext::of(&message, all), TraceContext::from_xray(xray));
        let attribute = |value: &str| {
            let mut attribute = aws_lambda_events::sqs::SqsMessageAttribute::default();
            attribute.string_value = Some(value.into());
            attribute.data_type = Some("String".into());
            attribute
        };
        message.message_attributes.insert("traceparent".into(), attribute(traceparent));
        assert_eq!(TraceContext::of(&message, all), TraceContext::from_traceparent(traceparent));
        // Only the headers the propagators name.
        let w3c: Propagators = "tracecontext".parse().unwrap();
        let xray_only: Propagators = "xray".parse().unwrap();
        assert_eq!(TraceContext::of(&message, w3c), TraceContext::from_traceparent(traceparent));
        assert_eq!(TraceContext::of(&message, xray_only), TraceContext::from_xray(xray));
        assert_eq!(TraceContext::of(&message, "none".parse().unwrap()), None);
        // A traceparent that does not parse leaves the X-Ray header to say.
        message.message_attributes.insert("traceparent".into(), attribute("nonsense"));
        assert_eq!(TraceContext::of(&message, all), TraceContext::from_xray(xray));
        assert_eq!(TraceContext::of(&message, w3c), None);
    }

    #[test]
    fn the_propagators_are_the_ones_listed() {
        let parsed = |text: &str| text.parse::<Propagators>().map(|p| (p.w3c, p.xray, p.lambda));
        assert_eq!(parsed("tracecontext,baggage"), Ok((true, false, false)));
        assert_eq!(parsed(" xray "), Ok((false, true, true)));
        assert_eq!(parsed("tracecontext, xray-lambda"), Ok((true, false, true)));
        assert_eq!(parsed("none"), Ok((false, false, false)));
        assert_eq!(parsed("tracecontext,b3"), Err(()), "one it cannot read or write is refused");
        let all = Propagators::default();
        assert_eq!((all.w3c, all.xray, all.lambda), (true, true, true));
    }
}
