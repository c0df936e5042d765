//! Large messages both ways, on the S3 and SQS servers scripts/test starts
//! (moto): a consumer's handler stages messages too large for SQS, which go
//! through S3 as the Amazon SQS Extended Client sends them; the Python
//! client (amazon-sqs-extended-client, through scripts/extended-client.py)
//! reads what sqs-once sent, and sqs-once reads it too.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use serde_json::json;
use sqs_once::{
    Record,
    config::Config,
    consumer::{Consumer, Invocation},
    event::parse_event,
    handler_fn, testing,
    transaction::Message,
};
use testkit::sqs::Queue;

/// What scripts/extended-client.py printed, run with `args`.
fn extended_client(args: &[&str]) -> String {
    testkit::extended_client::run(args, "")
}

/// A bucket of its own on the S3 server; its name.
async fn bucket() -> String {
    let config = testkit::aws_config().await;
    let s3 = aws_sdk_s3::config::Builder::from(&config).endpoint_url(testkit::sqs::endpoint()).force_path_style(true);
    let name = format!("large-{}", uuid::Uuid::new_v4().simple());
    aws_sdk_s3::Client::from_conf(s3.build()).create_bucket().bucket(&name).send().await.unwrap();
    name
}

/// A consumer on the memory store, as the settings describe one with
/// `bucket` for the payloads of large messages; its handler runs `handle`.
async fn consumer<F, Fut>(bucket: &str, handle: F) -> Consumer
where
    F: Fn(Record) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = sqs_once::HandlerResult> + Send + 'static,
{
    let bucket = bucket.to_owned();
    let config = Config::from_lookup(|name| match name {
        "SQS_ONCE_STORE" => Some("memory".to_owned()),
        "SQS_ONCE_LARGE_PAYLOAD_BUCKET" => Some(bucket.clone()),
        _ => std::env::var(name).ok(),
    })
    .unwrap();
    // The consumer's S3 client reads its endpoint where the SDK does, as a deployed one would.
    assert!(std::env::var_os("AWS_ENDPOINT_URL_S3").is_some(), "the S3 server's endpoint: run scripts/test");
    Consumer::builder().config(config).build(handler_fn(handle)).await.unwrap()
}

async fn process(consumer: &Consumer, event: &serde_json::Value) {
    let invocation = Invocation { deadline: SystemTime::now() + Duration::from_secs(20), request_id: "r".into() };
    let answer = consumer.process(&parse_event(&event.to_string()).unwrap(), &invocation).await;
    assert!(testing::failures(&answer.report).is_empty(), "{:?}", answer.report);
}

fn json_of(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap()
}

/// An order's JSON body of exactly `bytes` bytes.
fn order(id: &str, bytes: usize) -> String {
    let mut body = json!({ "id": id, "pad": "" }).to_string();
    body.insert_str(body.len() - 2, &"x".repeat(bytes - body.len()));
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_too_large_for_sqs_go_through_s3_and_both_extended_clients_read_them() {
    let (bucket, forwarded, read_back) =
        (bucket().await, Queue::create(false, 30).await, Queue::create(false, 30).await);
    let forward = |queue: String| {
        move |record: Record| {
            let queue = queue.clone();
            async move {
                record.transaction().send(Message::sqs(queue, record.body.clone()))?;
                Ok(None)
            }
        }
    };
    let sender = consumer(&bucket, forward(forwarded.url().to_owned())).await;
    // Past SQS's 1 MiB and past an outbox entry's 392 KB: both through S3; the small one as it is.
    let bodies = [order("o-1", 2 * 1024 * 1024), order("o-2", 500 * 1024), order("o-3", 100)];
    let records = testkit::records(bodies.iter().map(|body| json_of(body)));
    process(&sender, &json!({ "Records": records })).await;

    // The Python Extended Client reads each payload from S3.
    let mut received: Vec<String> =
        extended_client(&["receive", forwarded.url(), "3"]).lines().map(str::to_owned).collect();
    received.sort();
    assert_eq!(received, bodies, "what the Python client read");

    // sqs-once reads what it sent: a second consumer behind the same kind of queue.
    let again = consumer(&bucket, forward(read_back.url().to_owned())).await;
    process(&again, &json!({ "Records": testkit::records([json_of(&order("o-4", 3 * 1024 * 1024))]) })).await;
    let messages = read_back.receive(1).await;
    assert!(messages[0].body().unwrap().starts_with(r#"["software.amazon.payloadoffloading.PayloadS3Pointer","#));
    let size = messages[0].message_attributes().unwrap()["ExtendedPayloadSize"].clone();
    assert_eq!((size.data_type(), size.string_value()), ("Number", Some("3145728")));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let seen = Arc::clone(&seen);
        consumer(&bucket, move |record: Record| {
            seen.lock().unwrap().push(record.body.clone());
            async { Ok(None) }
        })
        .await
    };
    process(&reader, &read_back.event(&messages)).await;
    assert_eq!(*seen.lock().unwrap(), [order("o-4", 3 * 1024 * 1024)]);
}
