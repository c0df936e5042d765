//! Large messages as the Amazon SQS Extended Client sends them: the Python
//! client (amazon-sqs-extended-client, through scripts/extended-client.py)
//! keeps the payloads over its threshold in S3 and sends pointers; the
//! function, on the real `lambda_runtime` loop, reads them from S3 (moto's,
//! the SQS server started by scripts/test) before anything else.

use std::time::Duration;

use serde_json::json;

use crate::common::{
    self,
    function::{Function, wait_for},
    sqs::{Queue, body_of_size},
};

/// Runs scripts/extended-client.py with `args`, `input` on its standard input.
fn extended_client(args: &[&str], input: &str) {
    common::extended_client::run(args, input);
}

/// How many times the demo handler ran on each of `ids` (keys are `body.id`).
fn runs(log: &std::path::Path, ids: &[&str]) -> Vec<usize> {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    ids.iter().map(|id| log.lines().filter(|line| line.starts_with(&format!("sqs-once#{id}\t"))).count()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_extended_clients_large_messages_are_read_from_s3_and_run_once() {
    let queue = Queue::create(false, 30).await;
    let bucket = format!("large-{}", uuid::Uuid::new_v4().simple());
    // Two orders over the client's 256 KiB threshold travel through S3; the small one as it is.
    let bodies = [
        body_of_size(json!({"id": "o-1"}), 300_000),
        body_of_size(json!({"id": "o-2"}), 900_000),
        json!({"id": "o-3"}).to_string(),
    ];
    extended_client(&["send", queue.url(), &bucket], &(bodies.join("\n") + "\n"));
    let messages = queue.receive(3).await;
    let pointers = messages.iter().filter(|message| message.body().unwrap().contains("PayloadS3Pointer")).count();
    assert_eq!(pointers, 2, "the client sent two pointers");
    let event = queue.event(&messages);

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("demo.log");
    let s3 = common::sqs::endpoint();
    let envs = [
        ("SQS_ONCE_KEY", "body.id"),
        ("SQS_ONCE_HASH_KEYS", "false"),
        ("SQS_ONCE_DEMO_LOG", log.to_str().unwrap()),
        ("AWS_ENDPOINT_URL_S3", s3.as_str()),
    ];
    let function = Function::start(&envs).await;
    let failed = function.failed(&event, Duration::from_secs(30)).await;
    assert!(failed.is_empty(), "{failed:?}\n{}", function.output());
    assert_eq!(runs(&log, &["o-1", "o-2", "o-3"]), [1, 1, 1], "each order keyed by its payload, run once");
    let metrics = function.metrics(1).await;
    assert_eq!(metrics[0]["PayloadsFetched"], 2);
    assert_eq!(metrics[0]["PayloadBytesFetched"], 1_200_000);

    // The same messages again: duplicates, found by the keys in their payloads.
    assert!(function.failed(&event, Duration::from_secs(30)).await.is_empty());
    assert_eq!(runs(&log, &["o-1", "o-2", "o-3"]), [1, 1, 1]);

    // With the objects gone, the pointers fail alone and say why; the small message is a duplicate.
    extended_client(&["delete", &bucket], "");
    let failed = function.failed(&event, Duration::from_secs(30)).await;
    let pointed: Vec<String> = messages
        .iter()
        .filter(|message| message.body().unwrap().contains("PayloadS3Pointer"))
        .map(|message| message.message_id().unwrap().to_owned())
        .collect();
    assert_eq!(sorted(failed), sorted(pointed));
    let unavailable = |lines: &[String]| lines.iter().filter(|line| line.contains("payload_unavailable")).count();
    wait_for(&function.stderr, |lines| unavailable(lines) >= 2).await;
    let logs = function.logs(0).await;
    let reasons: Vec<&str> = logs
        .iter()
        .filter(|line| line["outcome"] == "payload_unavailable")
        .map(|line| line["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons.len(), 2, "{}", function.output());
    assert!(reasons.iter().all(|reason| reason.starts_with("payload unavailable: no object at s3://")), "{reasons:?}");
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}
