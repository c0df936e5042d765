//! An OTLP/HTTP collector for tests: it takes `POST /v1/traces` with a
//! protobuf `ExportTraceServiceRequest`, as an OpenTelemetry collector
//! does, decodes it with the protocol's own messages, and keeps each span
//! with when it arrived. It can also refuse every request, or never answer.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest,
    common::v1::{AnyValue, KeyValue, any_value::Value},
};
use prost::Message;
use tokio::{
    io::{AsyncWriteExt, BufReader},
    net::TcpListener,
    time::Instant,
};

use crate::runtime_api::{read_request, response};

/// One span as the collector received it; ids in lowercase hex.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// `service.name` of its resource.
    pub service: String,
    /// The span's name.
    pub name: String,
    /// `SPAN_KIND_*` as the protocol numbers it (4: producer, 5: consumer).
    pub kind: i32,
    /// The trace.
    pub trace_id: String,
    /// The span.
    pub span_id: String,
    /// Its parent span, empty for a root.
    pub parent_span_id: String,
    /// Its attributes, each as text.
    pub attributes: HashMap<String, String>,
    /// The contexts it links to: (trace id, span id).
    pub links: Vec<(String, String)>,
    /// The status code (2: error).
    pub status_code: i32,
    /// When the request that carried it arrived.
    pub received_at: Instant,
}

impl ReceivedSpan {
    /// An attribute, as text.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// How the collector answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answering {
    /// 200, every span kept.
    Accept,
    /// This status, nothing kept.
    Refuse(u16),
    /// Never: the request hangs.
    Hang,
}

#[derive(Debug)]
struct State {
    spans: Mutex<Vec<ReceivedSpan>>,
    requests: Mutex<Vec<HashMap<String, String>>>,
    answering: Mutex<Answering>,
}

/// The collector, listening on a free loopback port.
#[derive(Debug)]
pub struct Collector {
    /// Where it listens.
    pub address: SocketAddr,
    state: Arc<State>,
}

impl Collector {
    /// Starts accepting every request.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let state = Arc::new(State {
            spans: Mutex::default(),
            requests: Mutex::default(),
            answering: Mutex::new(Answering::Accept),
        });
        let accepting = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(BufReader::new(stream), Arc::clone(&accepting)));
            }
        });
        Self { address, state }
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT` for it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Answers later requests as `answering` says.
    pub fn answer(&self, answering: Answering) {
        *self.state.answering.lock().unwrap() = answering;
    }

    /// Every span received so far, in the order received.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.state.spans.lock().unwrap().clone()
    }

    /// The headers of every request received, answered or not.
    pub fn requests(&self) -> Vec<HashMap<String, String>> {
        self.state.requests.lock().unwrap().clone()
    }
}

async fn serve(mut stream: BufReader<tokio::net::TcpStream>, state: Arc<State>) {
    while let Some((method, path, headers, body)) = read_request(&mut stream).await {
        let received_at = Instant::now();
        let content_type = headers.get("content-type").cloned().unwrap_or_default();
        state.requests.lock().unwrap().push(headers);
        let answering = *state.answering.lock().unwrap();
        let reply = match (method.as_str(), path.as_str(), answering) {
            (_, _, Answering::Hang) => std::future::pending().await,
            ("POST", "/v1/traces", Answering::Refuse(status)) => response(status, "", b""),
            ("POST", "/v1/traces", Answering::Accept) if content_type == "application/x-protobuf" => {
                match ExportTraceServiceRequest::decode(body.as_slice()) {
                    Ok(request) => {
                        state.spans.lock().unwrap().extend(spans_of(request, received_at));
                        response(200, "", b"")
                    }
                    Err(_) => response(400, "", b""),
                }
            }
            ("POST", "/v1/traces", Answering::Accept) => response(415, "", b""),
            _ => response(404, "", b""),
        };
        if stream.get_mut().write_all(&reply).await.is_err() {
            return;
        }
    }
}

fn spans_of(request: ExportTraceServiceRequest, received_at: Instant) -> Vec<ReceivedSpan> {
    let mut spans = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans.resource.map(|resource| attributes(&resource.attributes)).unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for span in resource_spans.scope_spans.into_iter().flat_map(|scope| scope.spans) {
            spans.push(ReceivedSpan {
                service: service.clone(),
                name: span.name,
                kind: span.kind,
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: hex(&span.parent_span_id),
                attributes: attributes(&span.attributes),
                links: span.links.iter().map(|link| (hex(&link.trace_id), hex(&link.span_id))).collect(),
                status_code: span.status.map_or(0, |status| status.code),
                received_at,
            });
        }
    }
    spans
}

fn attributes(attributes: &[KeyValue]) -> HashMap<String, String> {
    attributes.iter().map(|pair| (pair.key.clone(), pair.value.as_ref().map(text).unwrap_or_default())).collect()
}

fn text(value: &AnyValue) -> String {
    match &value.value {
        Some(Value::StringValue(text)) => text.clone(),
        Some(Value::BoolValue(value)) => value.to_string(),
        Some(Value::IntValue(value)) => value.to_string(),
        Some(Value::DoubleValue(value)) => value.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
