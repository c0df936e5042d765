//! `sqs-once poll` as a long-running consumer, against a real SQS server
//! (moto) and DynamoDB Local, both started by scripts/test.

mod common;

use std::{
    collections::HashMap,
    fs::File,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use common::{
    otlp::Collector,
    outage::Outage,
    sqs::{LARGEST_MESSAGE, Queue, QueueInfo, body_of_size},
};
use serde_json::{Value, json};
use sqs_once::store::{ClaimStore, DynamoDbStore, TableLayout};
use tokio::time::{Instant, sleep};

/// Pollers sharing a claim table and a demo log; keys are `body.id`.
struct Consumers {
    dir: tempfile::TempDir,
    table: String,
}

impl Consumers {
    async fn new() -> Self {
        let store = common::fresh_table().await;
        Self { dir: tempfile::tempdir().unwrap(), table: store.layout().table.clone() }
    }

    fn poll(&self, queue: &Queue, args: &[&str], envs: &[(&str, &str)]) -> Poller {
        let name = uuid::Uuid::new_v4().simple().to_string();
        let child = common::sqs_once_command()
            .args(["poll", "--queue-url", queue.url(), "--wait-secs", "1"])
            .args(args)
            .current_dir(self.dir.path())
            .env_remove("AWS_LAMBDA_RUNTIME_API")
            .env_remove("SQS_ONCE_STORE")
            .env("SQS_ONCE_TABLE", &self.table)
            .env("SQS_ONCE_DEMO_LOG", self.dir.path().join("demo.log"))
            .env("SQS_ONCE_KEY", "body.id")
            .env("SQS_ONCE_HASH_KEYS", "false")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            // Files, not pipes: a poller logs a line per record, more than a pipe holds.
            .stdout(File::create(self.dir.path().join(format!("poll-{name}.out"))).unwrap())
            .stderr(File::create(self.dir.path().join(format!("poll-{name}.err"))).unwrap())
            .spawn()
            .unwrap();
        Poller { child, dir: self.dir.path().to_owned(), name }
    }

    /// How many times the handler ran, by body id.
    fn runs(&self) -> HashMap<String, usize> {
        let log = std::fs::read_to_string(self.dir.path().join("demo.log")).unwrap_or_default();
        let mut runs = HashMap::new();
        for line in log.lines() {
            let id = line.split('\t').next().unwrap().trim_start_matches("sqs-once#").to_owned();
            *runs.entry(id).or_default() += 1;
        }
        runs
    }
}

/// A running `sqs-once poll`, its output going to files.
struct Poller {
    child: Child,
    dir: PathBuf,
    name: String,
}

impl Poller {
    /// What it has logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("poll-{}.err", self.name))).unwrap_or_default()
    }

    /// Waits until it logs `line`, failing with its log if it exits first.
    async fn logged(&mut self, line: &str) {
        let started = Instant::now();
        while !self.log().contains(line) {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the poller exited ({status}) before logging {line:?}:\n{}", self.log());
            }
            assert!(started.elapsed() < Duration::from_secs(60), "no {line:?} within 60 s:\n{}", self.log());
            sleep(Duration::from_millis(200)).await;
        }
    }
}

/// SIGTERM once the poller polls, then the summary it prints as it exits cleanly.
async fn stop(mut poller: Poller) -> Value {
    // A signal before the process has set up its handlers would kill it outright.
    poller.logged("polling").await;
    terminate(poller).await
}

/// SIGTERM, then the summary the poller prints as it exits cleanly.
async fn terminate(poller: Poller) -> Value {
    let Poller { mut child, dir, name } = poller;
    let log = dir.join(format!("poll-{name}.err"));
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "poll did not exit cleanly: {status:?}\n{stderr}");
    assert!(stderr.contains("SIGTERM") && stderr.contains("stopped"), "{stderr}");
    let stdout = std::fs::read_to_string(dir.join(format!("poll-{name}.out"))).unwrap();
    serde_json::from_str(&stdout).expect("the summary is one JSON object")
}

async fn until(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < within, "timed out waiting until {what}");
        sleep(Duration::from_millis(200)).await;
    }
}

fn total(summaries: &[Value], field: &str) -> u64 {
    summaries.iter().map(|summary| summary[field].as_u64().unwrap()).sum()
}

#[tokio::test]
async fn poll_drains_a_queue_with_duplicates_running_each_key_once_and_stops_cleanly() {
    let queue = Queue::create(false, 10).await;
    let consumers = Consumers::new().await;
    // 1,600 keys; 400 of them sent twice, the copy some 1,000 messages later.
    let mut bodies = Vec::new();
    for id in 0..1_600 {
        bodies.push(json!({ "id": id.to_string() }));
        if (800..1_200).contains(&id) {
            bodies.push(json!({ "id": (id - 800).to_string() }));
        }
    }
    assert_eq!(bodies.len(), 2_000);
    queue.send(&bodies).await;

    let pollers = [consumers.poll(&queue, &[], &[]), consumers.poll(&queue, &["--receivers", "3"], &[])];
    until("the queue is drained", Duration::from_secs(240), async || queue.depth().await == (0, 0)).await;
    let runs = consumers.runs();
    assert_eq!(runs.len(), 1_600);
    assert!(runs.values().all(|&count| count == 1), "a key ran twice: {:?}", runs.iter().find(|(_, c)| **c > 1));

    // Slow messages, then SIGTERM while some are running: those finish and are deleted,
    // the rest stay in the queue.
    let slow: Vec<Value> = (0..20).map(|n| json!({ "id": format!("slow-{n}"), "sleep_ms": 1_500 })).collect();
    queue.send(&slow).await;
    until("a slow message runs", Duration::from_secs(30), async || {
        consumers.runs().keys().any(|id| id.starts_with("slow-"))
    })
    .await;
    let mut summaries = Vec::new();
    for poller in pollers {
        summaries.push(stop(poller).await);
    }
    let finished = consumers.runs().keys().filter(|id| id.starts_with("slow-")).count() as u64;
    let (waiting, in_flight) = queue.depth().await;
    assert_eq!(waiting + in_flight, 20 - finished, "every slow message is either done or still queued");
    // SQS delivers at least once: a message may come twice (a conflict, or the server handing
    // one message to two receivers). Then it is a duplicate or fails, and is deleted or comes back.
    // A deletion may be refused too (a receipt handle made stale by a second receive): that
    // message, if still there, comes back as a duplicate, and the last drain below finds it.
    let (received, deleted) = (total(&summaries, "received"), total(&summaries, "deleted"));
    let delete_failed = total(&summaries, "delete_failed");
    assert_eq!(total(&summaries, "processed"), 1_600 + finished, "{summaries:?}");
    assert!(total(&summaries, "duplicates") >= 400, "{summaries:?}");
    assert_eq!(deleted + delete_failed + total(&summaries, "failed"), received, "{summaries:?}");
    assert!(deleted + delete_failed >= 2_000 + finished, "{summaries:?}");
    assert!(delete_failed <= 5, "deletions refused in a healthy queue: {summaries:?}");

    // A new poller takes the rest (messages a stopped receive took come back after 10 s).
    let poller = consumers.poll(&queue, &[], &[]);
    until("the slow messages are drained", Duration::from_secs(60), async || queue.depth().await == (0, 0)).await;
    stop(poller).await;
    let runs = consumers.runs();
    assert_eq!(runs.len(), 1_620);
    assert!(runs.values().all(|&count| count == 1));
}

#[tokio::test]
async fn poll_exports_each_batchs_spans_as_the_batch_ends() {
    let collector = Collector::start().await;
    let queue = Queue::create(false, 30).await;
    let consumers = Consumers::new().await;
    queue.send(&[json!({"id": "traced"})]).await;
    let endpoint = collector.endpoint();
    let poller =
        consumers.poll(&queue, &[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), ("OTEL_SERVICE_NAME", "poller")]);
    // While the poller runs on: not kept for its exit.
    until("the batch's spans arrived", Duration::from_secs(30), async || {
        collector.spans().iter().any(|span| span.attribute("sqs_once.outcome") == Some("processed"))
    })
    .await;
    assert!(collector.spans().iter().all(|span| span.service == "poller"));
    assert_eq!(stop(poller).await["processed"], 1);
}

#[tokio::test]
async fn poll_moves_permanent_failures_to_the_dead_letter_queue_and_out_of_the_source() {
    let (queue, dead_letters) = (Queue::create(false, 30).await, Queue::create(false, 30).await);
    let consumers = Consumers::new().await;
    queue.send(&[json!({"id": "p", "fail": "permanent"}), json!({"id": "k"})]).await;
    let poller = consumers.poll(&queue, &[], &[("SQS_ONCE_DLQ_URL", dead_letters.url())]);
    until("the queue is drained", Duration::from_secs(30), async || queue.depth().await == (0, 0)).await;
    let summary = stop(poller).await;
    assert_eq!((summary["dead_lettered"].as_u64(), summary["deleted"].as_u64()), (Some(1), Some(2)));
    let moved = &dead_letters.receive(1).await[0];
    assert_eq!(moved.body.as_deref(), Some(r#"{"fail":"permanent","id":"p"}"#));
    assert_eq!(dead_letters.depth().await, (0, 1));
}

#[tokio::test]
async fn poll_takes_messages_of_the_largest_size_and_dead_letters_them_whole() {
    let (queue, dead_letters) = (Queue::create(false, 30).await, Queue::create(false, 30).await);
    let consumers = Consumers::new().await;
    let failing = body_of_size(json!({"id": "full", "fail": "permanent"}), LARGEST_MESSAGE);
    queue.send_body(&body_of_size(json!({"id": "ok"}), LARGEST_MESSAGE)).await;
    queue.send_body(&failing).await;
    let poller = consumers.poll(&queue, &[], &[("SQS_ONCE_DLQ_URL", dead_letters.url())]);
    until("the queue is drained", Duration::from_secs(30), async || queue.depth().await == (0, 0)).await;
    let summary = stop(poller).await;
    assert_eq!((summary["dead_lettered"].as_u64(), summary["deleted"].as_u64()), (Some(1), Some(2)));
    assert_eq!(consumers.runs(), HashMap::from([("ok".to_owned(), 1), ("full".to_owned(), 1)]));
    let moved = &dead_letters.receive(1).await[0];
    assert_eq!(moved.body.as_deref(), Some(failing.as_str()), "the body moved whole");
}

#[tokio::test]
async fn poll_leaves_a_record_it_could_not_dead_letter_in_the_source_queue() {
    let queue = Queue::create(false, 30).await;
    let consumers = Consumers::new().await;
    queue.send(&[json!({"id": "p", "fail": "permanent"})]).await;
    let missing = format!("{}-missing", queue.url());
    let poller = consumers.poll(&queue, &[], &[("SQS_ONCE_DLQ_URL", &missing)]);
    until("the record ran", Duration::from_secs(30), async || consumers.runs().contains_key("p")).await;
    let summary = stop(poller).await;
    assert_eq!((summary["failed"].as_u64(), summary["dead_lettered"].as_u64()), (Some(1), Some(0)));
    assert_eq!(summary["deleted"], 0);
    assert_eq!(queue.depth().await, (0, 1), "still in the source queue, in flight until its timeout");
}

#[tokio::test]
async fn poll_keeps_a_long_record_invisible_past_the_queue_timeout() {
    // A 2 s visibility timeout, a record that takes 4 s: without the extension it
    // would be delivered again mid-run, and the second delivery would conflict.
    let queue = Queue::create(false, 2).await;
    let consumers = Consumers::new().await;
    queue.send(&[json!({"id": "long", "sleep_ms": 4_000})]).await;
    let poller = consumers.poll(&queue, &["--timeout", "8", "--receivers", "2"], &[]);
    until("the queue is drained", Duration::from_secs(30), async || queue.depth().await == (0, 0)).await;
    let summary = stop(poller).await;
    assert_eq!((summary["received"].as_u64(), summary["processed"].as_u64()), (Some(1), Some(1)));
    assert_eq!(consumers.runs()["long"], 1);
}

#[tokio::test]
async fn poll_keeps_a_claim_in_the_table_as_long_as_its_lease_however_short_the_expiry() {
    // A record's deadline is one visibility timeout (2 hours) after receipt, far past the 60 s a key is remembered:
    // the claim's expiry, the table's TTL attribute, must still outlast its lease.
    let queue = Queue::create(false, 7_200).await;
    let consumers = Consumers::new().await;
    queue.send(&[json!({"id": "long-lease", "sleep_ms": 3_000})]).await;
    let poller = consumers.poll(&queue, &[], &[("SQS_ONCE_EXPIRES_AFTER_SECS", "60")]);
    until("the record runs", Duration::from_secs(30), async || consumers.runs().contains_key("long-lease")).await;
    let store = DynamoDbStore::new(common::dynamodb::client().await, TableLayout::new(consumers.table.clone()));
    let claim = store.get("sqs-once#long-lease").await.unwrap().expect("the claim is in the table");
    let lease_until_ms = claim.lease_until_ms.expect("in progress, under a lease");
    let now_ms = common::sqs::now_ms();
    assert!(lease_until_ms > now_ms + 7_000_000, "the lease runs to the deadline: {}", lease_until_ms - now_ms);
    assert!(
        claim.expires_at_s * 1000 > lease_until_ms,
        "expiry {} s, lease until {lease_until_ms} ms",
        claim.expires_at_s
    );
    until("the queue is drained", Duration::from_secs(30), async || queue.depth().await == (0, 0)).await;
    stop(poller).await;
}

#[tokio::test]
async fn poll_opens_sns_envelopes_and_dead_letters_what_is_not_one_as_it_arrived() {
    let (queue, dead_letters) = (Queue::create(false, 30).await, Queue::create(false, 30).await);
    let consumers = Consumers::new().await;
    let notification = |sns_id: &str, message: Value| {
        json!({"Type": "Notification", "MessageId": sns_id, "TopicArn": "arn:aws:sns:us-east-1:123456789012:orders",
               "Timestamp": "2026-11-23T10:00:00.000Z", "Message": message.to_string()})
    };
    let failing = notification("sns-p", json!({"id": "p", "fail": "permanent"}));
    // SNS delivers "sns-a" twice; one body is not an envelope at all.
    let bodies = [
        notification("sns-a", json!({"id": "a"})),
        notification("sns-b", json!({"id": "b"})),
        notification("sns-a", json!({"id": "a"})),
        failing.clone(),
        json!({"id": "raw"}),
    ];
    queue.send(&bodies).await;
    let settings = [("SQS_ONCE_ENVELOPE", "sns"), ("SQS_ONCE_DLQ_URL", dead_letters.url())];
    let poller = consumers.poll(&queue, &[], &settings);
    until("the queue is drained", Duration::from_secs(30), async || queue.depth().await == (0, 0)).await;
    let summary = stop(poller).await;
    assert_eq!(consumers.runs(), HashMap::from([("a".into(), 1), ("b".into(), 1), ("p".into(), 1)]));
    assert_eq!((summary["dead_lettered"].as_u64(), summary["deleted"].as_u64()), (Some(2), Some(5)), "{summary}");
    // Dead letters keep the body they arrived with, so a redrive sends the envelope again.
    let mut moved: Vec<Value> = dead_letters
        .receive(2)
        .await
        .iter()
        .map(|message| serde_json::from_str(message.body.as_deref().unwrap()).unwrap())
        .collect();
    moved.sort_by_key(|body| body.to_string());
    assert_eq!(moved, [failing, json!({"id": "raw"})]);
}

#[tokio::test]
async fn poll_waits_at_its_start_for_a_table_and_a_queue_that_do_not_answer_yet() {
    let queue = Queue::create(false, 30).await;
    let consumers = Consumers::new().await;
    queue.send(&[json!({"id": "after-the-outage"})]).await;
    // Both services still starting: every connection closes unanswered.
    let dynamodb = Outage::start(&common::dynamodb::endpoint()).await.unwrap();
    let sqs = Outage::start(&common::sqs::endpoint()).await.unwrap();
    let endpoints = [("AWS_ENDPOINT_URL_DYNAMODB", dynamodb.url.as_str()), ("AWS_ENDPOINT_URL_SQS", sqs.url.as_str())];
    let mut poller = consumers.poll(&queue, &[], &endpoints);
    poller.logged("the claim table does not answer; waiting for it").await;
    dynamodb.end();
    // Naming where the requests go.
    poller.logged(&format!("the queue (SQS at {}) does not answer; waiting for it", sqs.url)).await;
    assert!(!poller.log().contains("polling"), "{}", poller.log());
    sqs.end();
    until("the queue is drained", Duration::from_secs(60), async || queue.depth().await == (0, 0)).await;
    let summary = stop(poller).await;
    assert_eq!((summary["processed"].as_u64(), summary["deleted"].as_u64()), (Some(1), Some(1)));
    assert_eq!(consumers.runs(), HashMap::from([("after-the-outage".to_owned(), 1)]));
    assert!(dynamodb.refused.load(std::sync::atomic::Ordering::SeqCst) > 0);
}

#[tokio::test]
async fn poll_stopped_while_it_waits_for_the_queue_exits_cleanly_having_received_nothing() {
    let queue = Queue::create(false, 30).await;
    let consumers = Consumers::new().await;
    queue.send(&[json!({"id": "never-received"})]).await;
    let sqs = Outage::start(&common::sqs::endpoint()).await.unwrap();
    let mut poller = consumers.poll(&queue, &[], &[("AWS_ENDPOINT_URL_SQS", sqs.url.as_str())]);
    poller.logged("does not answer; waiting for it").await;
    let summary = terminate(poller).await;
    assert_eq!((summary["received"].as_u64(), summary["processed"].as_u64()), (Some(0), Some(0)));
    assert!(consumers.runs().is_empty());
    assert_eq!(queue.depth().await, (1, 0), "the message waits in the queue, never received");
}

#[tokio::test]
async fn poll_refuses_what_waiting_would_not_change_without_waiting() {
    let queue = Queue::create(false, 30).await;
    let consumers = Consumers::new().await;
    let url = format!("{}-missing", queue.url());
    let missing = Queue { client: queue.client.clone(), info: QueueInfo { url, ..queue.info.clone() } };
    let log = refused_at_once(consumers.poll(&missing, &[], &[])).await;
    assert!(log.contains("The specified queue does not exist"), "{log}");
    let table = common::dynamodb::unique_name("missing");
    let log = refused_at_once(consumers.poll(&queue, &[], &[("SQS_ONCE_TABLE", &table)])).await;
    assert!(log.contains(&format!("the claim table `{table}` does not exist")), "{log}");
    assert!(consumers.runs().is_empty());
}

/// The log of a poller that exits with status 1 without waiting for anything.
async fn refused_at_once(mut poller: Poller) -> String {
    let status = loop {
        if let Some(status) = poller.child.try_wait().unwrap() {
            break status;
        }
        assert!(!poller.log().contains("waiting for it"), "waits:\n{}", poller.log());
        sleep(Duration::from_millis(200)).await;
    };
    let log = poller.log();
    assert_eq!(status.code(), Some(1), "{log}");
    log
}
