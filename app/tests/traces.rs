//! Traces as a deployed function exports them: the binary on the real
//! `lambda_runtime` loop, claims in DynamoDB Local, `OTEL_EXPORTER_OTLP_ENDPOINT`
//! naming a collector that decodes the OTLP/HTTP protobuf requests; a
//! producer's context arriving as `AWSTraceHeader` or `traceparent`, and
//! going on through the outbox, on the SQS server, to a second consumer.

use crate::common;

use std::{collections::HashMap, time::Duration};

use crate::common::{
    function::Function,
    otlp::{Answering, Collector, ReceivedSpan},
    runtime_api::Answer,
    sqs::Queue,
};
use aws_sdk_sqs::types::{MessageSystemAttributeName, MessageSystemAttributeNameForSends, MessageSystemAttributeValue};
use serde_json::{Value, json};

/// The example of AWS's X-Ray documentation, and of the W3C specification.
const XRAY: &str = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

const SECONDS_30: Duration = Duration::from_secs(30);

/// A record of the queue `work`, with a producer's context as either header.
fn record(id: &str, body: Value, xray: Option<&str>, traceparent: Option<&str>) -> Value {
    let mut attributes = json!({ "ApproximateReceiveCount": "1" });
    if let Some(header) = xray {
        attributes["AWSTraceHeader"] = header.into();
    }
    let mut message_attributes = json!({});
    if let Some(traceparent) = traceparent {
        message_attributes["traceparent"] = json!({ "stringValue": traceparent, "dataType": "String" });
    }
    json!({
        "messageId": id, "body": body.to_string(), "attributes": attributes, "messageAttributes": message_attributes,
        "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:work",
    })
}

fn failures(answer: &Answer) -> Vec<String> {
    let Answer::Response(response) = answer else { panic!("expected a response, got {answer:?}") };
    common::failed_ids(response)
}

/// The (trace id, span id) in hex of an X-Ray header.
fn xray_ids(header: &str) -> (String, String) {
    let field = |name: &str| header.split(';').find_map(|part| part.strip_prefix(name)).unwrap().to_owned();
    (field("Root=1-").replace('-', ""), field("Parent="))
}

fn traceparent_ids(traceparent: &str) -> (String, String) {
    let fields: Vec<&str> = traceparent.split('-').collect();
    (fields[1].to_owned(), fields[2].to_owned())
}

/// The record spans among `spans`, by message id.
fn record_spans(spans: &[ReceivedSpan]) -> HashMap<String, ReceivedSpan> {
    spans.iter().filter_map(|span| Some((span.attribute("messaging.message.id")?.to_owned(), span.clone()))).collect()
}

fn children<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan) -> Vec<&'a str> {
    let mut names: Vec<&str> =
        spans.iter().filter(|span| span.parent_span_id == parent.span_id).map(|span| span.name.as_str()).collect();
    names.sort_unstable();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_record_is_a_span_linked_to_its_producer_exported_before_the_answer() {
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let settings = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_SERVICE_NAME", "orders")];
    let function = Function::start(&settings).await;
    let event = json!({ "Records": [
        record("m-0", json!({}), Some(XRAY), None),
        record("m-1", json!({}), Some(XRAY), Some(TRACEPARENT)),
        record("m-2", json!({ "fail": "retryable" }), None, None),
        record("m-3", json!({ "fail": "permanent" }), None, Some("00-not-a-context")),
        record("m-4", json!({ "sleep_ms": 60_000 }), None, None),
    ]});
    // 2.5 s before the cut-off for the quick records: room for the arm64 build under emulation.
    let answer = function.invoke(&event, Duration::from_secs(3)).await;
    assert_eq!(failures(&answer), ["m-2", "m-3", "m-4"]);

    // Read as the answer arrived: the spans were exported before it.
    let spans = collector.spans();
    let lambda = xray_ids(&function.api.trace_headers()[0]);
    let batch = spans.iter().find(|span| span.attribute("messaging.batch.message_count") == Some("5")).unwrap();
    assert_eq!((&batch.trace_id, &batch.parent_span_id), (&lambda.0, &lambda.1), "a child of Lambda's trace");
    assert_eq!((batch.service.as_str(), batch.kind), ("orders", 5));
    let records = record_spans(&spans);
    assert_eq!(records.len(), 5, "{spans:#?}");
    let outcomes = ["processed", "processed", "retryable", "permanent", "deadline"];
    for (n, outcome) in outcomes.iter().enumerate() {
        let span = &records[&format!("m-{n}")];
        assert_eq!((span.name.as_str(), span.parent_span_id.as_str()), ("process work", batch.span_id.as_str()));
        assert_eq!(span.attribute("sqs_once.outcome"), Some(*outcome), "m-{n}");
        assert_eq!(span.attribute("messaging.system"), Some("aws_sqs"));
        let failed = *outcome != "processed";
        assert_eq!(span.attribute("error.type"), failed.then_some(*outcome), "m-{n}");
        assert_eq!(span.status_code == 2, failed, "m-{n} has the error status when it failed");
        assert!(span.attribute("sqs_once.key_hash").is_some_and(|hash| hash.len() == 16));
    }
    // Linked to exactly its producer's context: traceparent first, then AWSTraceHeader; none that does not parse.
    assert_eq!(records["m-0"].links, [xray_ids(XRAY)]);
    assert_eq!(records["m-1"].links, [traceparent_ids(TRACEPARENT)]);
    assert!(records["m-2"].links.is_empty() && records["m-3"].links.is_empty());
    assert_eq!(children(&spans, &records["m-0"]), ["claim", "complete", "handler"]);
    assert_eq!(children(&spans, &records["m-3"]), ["claim", "fail", "handler"]);
    assert_eq!(children(&spans, &records["m-4"]), ["claim", "handler"], "cut off: its claim is left to expire");
    assert!(spans.iter().all(|span| span.name != "Lambda runtime invoke"), "Lambda's own span is not sent");
    assert!(spans.iter().all(|span| span.trace_id == lambda.0), "one trace per invocation");

    // A copy of m-0 in the next invocation: a duplicate, in that invocation's trace.
    let answer = function.invoke(&json!({ "Records": [record("m-0", json!({}), Some(XRAY), None)] }), SECONDS_30).await;
    assert!(failures(&answer).is_empty());
    let next = xray_ids(&function.api.trace_headers()[1]);
    let spans: Vec<ReceivedSpan> = collector.spans().into_iter().filter(|span| span.trace_id == next.0).collect();
    let duplicate = &record_spans(&spans)["m-0"];
    assert_eq!(duplicate.attribute("sqs_once.outcome"), Some("duplicate"));
    assert_eq!(duplicate.links, [xray_ids(XRAY)]);
    assert!(collector.requests().iter().all(|headers| headers["content-type"] == "application/x-protobuf"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_down_slow_or_refusing_costs_the_batch_nothing_but_a_counted_failure() {
    let collector = Collector::start().await;
    collector.answer(Answering::Hang);
    let endpoint = collector.endpoint();
    let settings = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_EXPORTER_OTLP_TIMEOUT", "300")];
    let function = Function::start(&settings).await;
    let event = |id: &str| json!({ "Records": [record(id, json!({}), None, None), record("bad", json!({"fail": "permanent"}), None, None)] });
    // Hanging: abandoned at its timeout, the answer unchanged.
    assert_eq!(failures(&function.invoke(&event("m-0"), SECONDS_30).await), ["bad"]);
    collector.answer(Answering::Refuse(503));
    assert_eq!(failures(&function.invoke(&event("m-1"), SECONDS_30).await), ["bad"]);
    collector.answer(Answering::Accept);
    assert_eq!(failures(&function.invoke(&event("m-2"), SECONDS_30).await), ["bad"]);
    let metrics = function.metrics(3).await;
    let counted =
        |line: &Value| (line["TraceExportsFailed"].as_u64().unwrap(), line["TraceSpansDropped"].as_u64().unwrap());
    assert_eq!(counted(&metrics[0]).0, 1);
    assert!(counted(&metrics[0]).1 >= 9, "the batch, two records, their claims, handlers and writes: {:?}", metrics[0]);
    assert_eq!(counted(&metrics[1]).0, 1);
    assert_eq!(counted(&metrics[2]), (0, 0));
    // What the collector missed is gone; what came after arrived.
    let records = record_spans(&collector.spans());
    assert!(records.contains_key("m-2") && !records.contains_key("m-0") && !records.contains_key("m-1"));

    // Nothing listening at all.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let unreachable = format!("http://{closed}");
    let function = Function::start(&[("OTEL_EXPORTER_OTLP_ENDPOINT", unreachable.as_str())]).await;
    assert_eq!(failures(&function.invoke(&event("m-3"), SECONDS_30).await), ["bad"]);
    assert_eq!(counted(&function.metrics(1).await[0]).0, 1);
}

/// The `ledger` handler, its notices sent to `notices`, with extra settings.
async fn ledger(notices: &Queue, settings: &[(&str, &str)]) -> Function {
    let balances = common::dynamodb::items_table().await;
    let sqs = common::sqs::endpoint();
    let mut all = vec![
        ("SQS_ONCE_HANDLER", "ledger"),
        ("SQS_ONCE_LEDGER_TABLE", balances.as_str()),
        ("SQS_ONCE_LEDGER_NOTIFY_URL", notices.url()),
        ("AWS_ENDPOINT_URL_SQS", sqs.as_str()),
    ];
    all.extend_from_slice(settings);
    Function::start(&all).await
}

/// A ledger entry as a traced producer sends it (SQS keeps its X-Ray header
/// as the `AWSTraceHeader` system attribute), as Lambda delivers it.
async fn traced_entry() -> Value {
    let work = Queue::create(false, 30).await;
    let header = MessageSystemAttributeValue::builder().data_type("String").string_value(XRAY).build().unwrap();
    common::sqs::client()
        .await
        .send_message()
        .queue_url(work.url())
        .message_body(json!({ "account": format!("a-{}", uuid::Uuid::new_v4()), "amount": 5 }).to_string())
        .message_system_attributes(MessageSystemAttributeNameForSends::AwsTraceHeader, header)
        .send()
        .await
        .unwrap();
    work.event(&work.receive(1).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_carries_the_record_span_onward_and_the_next_consumer_links_to_it() {
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let notices = Queue::create(false, 30).await;
    let ledger = ledger(&notices, &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())]).await;
    assert!(failures(&ledger.invoke(&traced_entry().await, SECONDS_30).await).is_empty());
    let spans = collector.spans();
    let entry = record_spans(&spans).into_values().next().unwrap();
    assert_eq!(entry.links, [xray_ids(XRAY)]);
    assert_eq!(children(&spans, &entry), ["claim", "commit", "handler", "send"]);

    // The notice carries the entry's record span as its traceparent and as its AWSTraceHeader.
    let notice = notices.receive(1).await;
    let traceparent = notice[0].message_attributes().unwrap()["traceparent"].string_value().unwrap().to_owned();
    assert_eq!(traceparent_ids(&traceparent), (entry.trace_id.clone(), entry.span_id.clone()));
    let system = notice[0].attributes().unwrap();
    let aws_trace_header = system[&MessageSystemAttributeName::AwsTraceHeader].clone();
    assert_eq!(xray_ids(&aws_trace_header), (entry.trace_id.clone(), entry.span_id.clone()));

    // The next consumer (the demo handler) links its record to it.
    let next =
        Function::start(&[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_SERVICE_NAME", "next")]).await;
    assert!(failures(&next.invoke(&notices.event(&notice), SECONDS_30).await).is_empty());
    let spans = collector.spans();
    let id = notice[0].message_id().unwrap();
    let linked = spans.iter().find(|span| span.attribute("messaging.message.id") == Some(id)).unwrap();
    assert_eq!(
        (linked.service.as_str(), linked.links.as_slice()),
        ("next", [(entry.trace_id, entry.span_id)].as_slice())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_exports_its_batch_before_it_exits_and_refuses_a_protocol_it_cannot_send() {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let event = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../events/single.json");
    let run = |envs: Vec<(&'static str, String)>| {
        let mut command = common::command_in(dir.path());
        command.arg("invoke").arg(&event).envs(envs);
        tokio::task::spawn_blocking(move || command.output().unwrap())
    };
    // Two spans a request: the batch, its record, the claim, the handler and the completion take three.
    let two =
        vec![("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()), ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2".into())];
    let output = run(two).await.unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let records = record_spans(&collector.spans());
    assert_eq!(records["5f9c6f4e-0001-4d3a-9c1e-000000000001"].attribute("sqs_once.outcome"), Some("processed"));
    assert_eq!((collector.spans().len(), collector.requests().len()), (5, 3));

    let grpc =
        vec![("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".into())];
    let output = run(grpc).await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && stderr.contains("http/protobuf"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invocations_at_once_each_export_their_batch_in_their_own_trace() {
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let settings = [("AWS_LAMBDA_MAX_CONCURRENCY", "4"), ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    let function = Function::start(&settings).await;
    let batch = |b: usize| {
        let records: Vec<Value> =
            (0..5).map(|n| record(&format!("b{b}-{n}"), json!({ "sleep_ms": 200 }), None, None)).collect();
        json!({ "Records": records })
    };
    let events: Vec<Value> = (0..4).map(batch).collect();
    let answers = futures::future::join_all(events.iter().map(|event| function.invoke(event, SECONDS_30))).await;
    assert!(answers.iter().all(|answer| failures(answer).is_empty()), "{answers:?}");
    // Lambda's trace of each invocation: its root and the parent it names.
    let lambda: HashMap<String, String> = function.api.trace_headers().iter().map(|header| xray_ids(header)).collect();
    let spans = collector.spans();
    let records = record_spans(&spans);
    let mut traces = std::collections::HashSet::new();
    for b in 0..4 {
        let parent = &records[&format!("b{b}-0")].parent_span_id;
        let batch = spans.iter().find(|span| &span.span_id == parent).expect("the batch span was exported");
        assert_eq!(lambda.get(&batch.trace_id), Some(&batch.parent_span_id), "b{b}: a child of its invocation's trace");
        for n in 0..5 {
            let span = &records[&format!("b{b}-{n}")];
            assert_eq!((&span.trace_id, &span.parent_span_id), (&batch.trace_id, &batch.span_id), "b{b}-{n}");
        }
        traces.insert(batch.trace_id.clone());
    }
    assert_eq!(traces.len(), 4, "one trace per invocation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_propagators_choose_the_headers_read_and_written() {
    let collector = Collector::start().await;
    let endpoint = collector.endpoint();
    let notices = Queue::create(false, 30).await;
    // W3C's header only: the producer's X-Ray header is not read, Lambda's trace is not the parent, and the notice
    // carries `traceparent` without `AWSTraceHeader`.
    let settings = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_PROPAGATORS", "tracecontext,baggage")];
    let w3c = ledger(&notices, &settings).await;
    assert!(failures(&w3c.invoke(&traced_entry().await, SECONDS_30).await).is_empty());
    let spans = collector.spans();
    let entry = record_spans(&spans).into_values().next().unwrap();
    assert!(entry.links.is_empty(), "AWSTraceHeader is not read");
    let batch = spans.iter().find(|span| span.span_id == entry.parent_span_id).unwrap();
    assert_eq!(batch.parent_span_id, "", "a trace of its own");
    let [notice] = &notices.receive(1).await[..] else { panic!("one notice") };
    let traceparent = notice.message_attributes().unwrap()["traceparent"].string_value().unwrap().to_owned();
    assert_eq!(traceparent_ids(&traceparent), (entry.trace_id.clone(), entry.span_id.clone()));
    assert!(!notice.attributes().unwrap().contains_key(&MessageSystemAttributeName::AwsTraceHeader));

    // None: nothing read, nothing carried on (the spans are still exported).
    let settings = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_PROPAGATORS", "none")];
    let none = ledger(&notices, &settings).await;
    assert!(failures(&none.invoke(&traced_entry().await, SECONDS_30).await).is_empty());
    let [notice] = &notices.receive(1).await[..] else { panic!("one notice") };
    assert!(!notice.message_attributes().unwrap().contains_key("traceparent"));
    assert!(!notice.attributes().unwrap().contains_key(&MessageSystemAttributeName::AwsTraceHeader));

    // One it cannot read or write stops the start, named.
    let mut b3 = Function::start(&[("OTEL_PROPAGATORS", "b3")]).await;
    let status = tokio::time::timeout(Duration::from_secs(20), b3.process.wait()).await.unwrap().unwrap();
    assert!(!status.success());
    let errors = b3.api.init_errors();
    assert!(errors[0]["errorMessage"].as_str().unwrap().contains(r#"invalid OTEL_PROPAGATORS="b3""#), "{errors:?}");
}
