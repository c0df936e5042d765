//! One environment, several invocations at once, as Lambda Managed Instances
//! runs a function (`AWS_LAMBDA_MAX_CONCURRENCY`): the bundled binary on the
//! real `lambda_runtime` loop (`run_concurrent`), the harness's Runtime API
//! answering each of its outstanding `/next` requests with an invocation of
//! its own, claims in DynamoDB Local.

use std::{collections::HashMap, time::Duration};

use crate::common::function::Function;
use serde_json::{Value, json};

/// Invocations Lambda hands the environment at once.
const AT_ONCE: &str = "4";

/// An event of `bodies`, its message ids `<prefix>-<n>`.
fn event(prefix: &str, bodies: impl IntoIterator<Item = Value>) -> Value {
    let records: Vec<Value> = bodies
        .into_iter()
        .enumerate()
        .map(|(n, body)| json!({"messageId": format!("{prefix}-{n}"), "body": body.to_string(), "eventSource": "aws:sqs"}))
        .collect();
    json!({ "Records": records })
}

/// Invokes `function` with each of `events` at once, each due `timeout` after
/// it is sent; the message ids each answer reported failed.
async fn all_at_once(function: &Function, events: &[Value], timeout: Duration) -> Vec<Vec<String>> {
    futures::future::join_all(events.iter().map(|event| function.failed(event, timeout))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invocations_run_at_once_and_each_answers_by_its_own_deadline() {
    // Four batches whose handlers take 1.5 s, each due 4 s after it is sent: served one at a time, the third
    // starts at 3 s, past its cut-off (3.5 s, with the 500 ms margin), and fails; served at once, none does.
    let batches: Vec<Value> =
        (0..4).map(|b| event(&format!("b{b}"), (0..5).map(|_| json!({"sleep_ms": 1500})))).collect();
    let timeout = Duration::from_secs(4);

    let one_at_a_time = Function::start(&[]).await;
    let failed = all_at_once(&one_at_a_time, &batches, timeout).await;
    assert!(failed.iter().filter(|failed| !failed.is_empty()).count() >= 2, "one at a time: {failed:?}");

    let at_once = Function::start(&[("AWS_LAMBDA_MAX_CONCURRENCY", AT_ONCE)]).await;
    let failed = all_at_once(&at_once, &batches, timeout).await;
    assert!(failed.iter().all(Vec::is_empty), "{failed:?}\n{}", at_once.output());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_shared_by_invocations_at_once_run_once_and_each_line_counts_its_own_records() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("demo.log");
    let log_path = log.to_str().unwrap();
    let function = Function::start(&[("AWS_LAMBDA_MAX_CONCURRENCY", AT_ONCE), ("SQS_ONCE_DEMO_LOG", log_path)]).await;
    // SQS hands copies of the same 30 messages to four invocations at once, each with 5 of its own.
    let event_of = |b: usize| {
        let shared = (0..30).map(|n| (format!("shared-{n}"), json!({"sleep_ms": 200})));
        let own = (0..5).map(move |n| (format!("own-{b}-{n}"), json!({})));
        let records: Vec<Value> = shared
            .chain(own)
            .map(|(id, body)| json!({"messageId": id, "body": body.to_string(), "eventSource": "aws:sqs"}))
            .collect();
        json!({ "Records": records })
    };
    let events: Vec<Value> = (0..4).map(event_of).collect();
    let failed = all_at_once(&function, &events, Duration::from_secs(20)).await;
    // Each key ran once, in whichever invocation claimed it; the others answered conflict (failed, to come
    // back) or duplicate.
    let mut runs: HashMap<String, usize> = HashMap::new();
    for line in std::fs::read_to_string(&log).unwrap().lines() {
        *runs.entry(line.split('\t').nth(1).unwrap().to_owned()).or_default() += 1;
    }
    assert_eq!(runs.len(), 30 + 4 * 5, "every key ran");
    assert!(runs.values().all(|&times| times == 1), "{runs:?}");
    let shared_failures = failed.iter().flatten().filter(|id| id.starts_with("shared-")).count();
    assert!(shared_failures <= 3 * 30, "{failed:?}");
    assert!(failed.iter().flatten().all(|id| id.starts_with("shared-")), "no invocation fails another's records");

    // One metrics line per invocation, counting its own records, and together every record once.
    let lines = function.metrics(4).await;
    assert_eq!(lines.len(), 4);
    assert!(lines.iter().all(|line| line["Records"] == 35), "{lines:?}");
    let sum = |metric: &str| lines.iter().map(|line| line[metric].as_u64().unwrap_or(0)).sum::<u64>();
    assert_eq!(sum("Processed"), 50, "each key processed in one line only");
    assert_eq!(sum("Processed") + sum("Duplicates") + sum("Failed"), 4 * 35);
    assert_eq!(sum("Failed") as usize, failed.iter().map(Vec::len).sum::<usize>());
}
