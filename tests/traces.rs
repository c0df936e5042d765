//! A program's own tracer provider given to the builder: sqs-once's spans
//! and the handler's are recorded with it and flushed before `process`
//! answers, though its batch processor would otherwise wait seconds.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use opentelemetry_sdk::{
    error::OTelSdkResult,
    trace::{SdkTracerProvider, SpanData, SpanExporter},
};
use sqs_once::{Consumer, config::Config, consumer::Invocation, event::parse_event, handler_fn};
use tracing_subscriber::{
    Layer,
    filter::{LevelFilter, Targets},
    layer::SubscriberExt,
};

/// Keeps what it is given.
#[derive(Debug, Clone, Default)]
struct Kept(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Kept {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

// One thread: the subscriber is the test thread's default, and the handler runs in a task.
#[tokio::test]
async fn a_tracer_provider_given_is_flushed_before_the_answer() {
    let kept = Kept::default();
    let provider = SdkTracerProvider::builder().with_batch_exporter(kept.clone()).build();
    let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "test");
    // With `build`, the program installs the layer over its provider itself.
    let spans = Targets::new().with_target("sqs_once", LevelFilter::DEBUG).with_target("traces", LevelFilter::INFO);
    let layer = tracing_opentelemetry::layer().with_tracer(tracer).with_filter(spans);
    let subscriber = tracing_subscriber::registry().with(layer);
    let _installed = tracing::subscriber::set_default(subscriber);
    let config = Config::from_lookup(|name| (name == "SQS_ONCE_STORE").then(|| "memory".to_owned())).unwrap();
    let handler = handler_fn(|_| async {
        tracing::info_span!("charge").in_scope(|| ());
        Ok(None)
    });
    let consumer = Consumer::builder().config(config).tracer_provider(provider).build(handler).await.unwrap();
    let event = parse_event(r#"{ "Records": [{ "messageId": "m-1", "body": "{}" }] }"#).unwrap();
    let invocation = Invocation { deadline: SystemTime::now() + Duration::from_secs(30), request_id: "r-1".into() };
    let answer = consumer.process(&event, &invocation).await;
    assert!(answer.response.batch_item_failures.is_empty());
    let names: Vec<String> = kept.0.lock().unwrap().iter().map(|span| span.name.to_string()).collect();
    let mut names: Vec<&str> = names.iter().map(String::as_str).collect();
    names.sort_unstable();
    // The batch, its record (of no queue), and the record's children.
    assert_eq!(names, ["charge", "claim", "complete", "handler", "process", "process "]);
    let charge = kept.0.lock().unwrap().iter().find(|span| span.name == "charge").cloned().unwrap();
    let handler = kept.0.lock().unwrap().iter().find(|span| span.name == "handler").cloned().unwrap();
    assert_eq!(charge.parent_span_id, handler.span_context.span_id(), "the handler's span nests under sqs-once's");
}
