//! Failed records and SQS, against a real SQS server (moto, started by
//! scripts/test): `invoke --sqs` acts as the Lambda function does after a
//! batch, and the server's own state tells when each message comes back.

use crate::common;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    process::{Command, Output, Stdio},
    time::Duration,
};

use crate::common::sqs::{LARGEST_MESSAGE, Queue, body_of_size, now_ms, visible_at};
use aws_sdk_sqs::types::Message;
use serde_json::{Value, json};

/// One consumer's world: a claims file, a demo log, events; keys are `body.id`.
struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> Self {
        Self { dir: tempfile::tempdir().unwrap() }
    }

    fn command(&self, args: &[&str], envs: &[(&str, &str)]) -> Command {
        let mut command = common::command_in(self.dir.path());
        command
            .args(args)
            .env("SQS_ONCE_KEY", "body.id")
            .env("SQS_ONCE_HASH_KEYS", "false")
            .env("SQS_ONCE_RETRY_BASE_SECS", "2")
            .envs(envs.iter().copied());
        command
    }

    fn event_file(&self, event: &Value) -> PathBuf {
        let path = self.dir.path().join(format!("event-{}.json", uuid::Uuid::new_v4().simple()));
        std::fs::write(&path, event.to_string()).unwrap();
        path
    }

    /// `invoke --sqs --metrics` on `event`.
    fn invoke(&self, event: &Value, envs: &[(&str, &str)]) -> Output {
        let path = self.event_file(event);
        self.command(&["invoke", "--sqs", "--metrics", "--timeout", "20"], envs).arg(path).output().unwrap()
    }

    /// How many times the handler ran on `id`.
    fn runs(&self, id: &str) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("demo.log")).unwrap_or_default();
        log.lines().filter(|line| line.starts_with(&format!("sqs-once#{id}\t"))).count()
    }

    fn claim(&self, id: &str) -> Value {
        let output = self.command(&["claims", "show", id, "--json"], &[]).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout).unwrap()[0].clone()
    }
}

/// The received messages by their body's `id`.
fn by_id(messages: &[Message]) -> HashMap<String, Message> {
    messages
        .iter()
        .map(|message| {
            let body: Value = serde_json::from_str(message.body.as_deref().unwrap()).unwrap();
            (body["id"].as_str().unwrap().to_owned(), message.clone())
        })
        .collect()
}

fn ids<'a>(messages: impl IntoIterator<Item = &'a Message>) -> HashSet<String> {
    messages.into_iter().map(|message| message.message_id.clone().unwrap()).collect()
}

fn visible_at_of(message: &Message) -> u64 {
    let id = message.message_id.as_deref().unwrap();
    *visible_at().get(id).unwrap_or_else(|| panic!("the server has no message {id}"))
}

#[tokio::test]
async fn conflicts_return_when_the_lease_can_end_and_retries_back_off_exponentially() {
    let queue = Queue::create(false, 60).await;
    let world = World::new();
    // Another consumer holds key `c`: its handler sleeps, its lease ends 4 s + the 2 s margin after it starts.
    let hold = json!({"Records": [{"messageId": "hold", "body": json!({"id": "c", "sleep_ms": 60_000}).to_string()}]});
    let mut holder = world
        .command(&["invoke", "--timeout", "4"], &[])
        .arg(world.event_file(&hold))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    while world.runs("c") == 0 {
        assert!(holder.try_wait().unwrap().is_none(), "the holder exited before its handler started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let bodies = [
        json!({"id": "c"}),
        json!({"id": "r", "fail": "retryable"}),
        json!({"id": "p", "fail": "permanent"}),
        json!({"id": "k"}),
    ];
    queue.send(&bodies).await;
    let messages = by_id(&queue.receive(4).await);

    let before = now_ms();
    let output = world.invoke(&queue.event(&messages.values().cloned().collect::<Vec<_>>()), &[]);
    let (failures, metrics) = common::invoke_answer(&output);
    let after = now_ms();
    assert_eq!(failures, ids([&messages["c"], &messages["r"], &messages["p"]]));
    assert_eq!((metrics["VisibilityChanged"].as_u64(), metrics["VisibilityChangeFailed"].as_u64()), (Some(2), Some(0)));
    assert_eq!((world.runs("c"), world.runs("r"), world.runs("k")), (1, 1, 1), "the conflicting record did not run");

    // The conflict comes back once the holder's lease can have ended: not before, and
    // no later than the jitter (a fifth of the wait and a second, in whole seconds) allows.
    let lease_until = world.claim("c")["lease_until_ms"].as_u64().unwrap();
    let conflict_at = visible_at_of(&messages["c"]);
    let wait = lease_until - before;
    assert!(conflict_at >= lease_until, "visible {} ms before the lease ends", lease_until - conflict_at);
    assert!(conflict_at <= lease_until + wait / 5 + 2_000 + (after - before), "{} ms late", conflict_at - lease_until);
    // The retryable record: base 2 s for its first delivery, plus jitter.
    let retry_at = visible_at_of(&messages["r"]);
    assert!(
        retry_at >= before + 2_000 && retry_at <= after + 2_000 + 400 + 2_000,
        "{}",
        retry_at as i64 - before as i64
    );
    // The permanent failure (no dead-letter queue set) keeps the queue's 60 s.
    assert!(visible_at_of(&messages["p"]) >= before + 50_000);

    // Its second delivery waits twice as long.
    while now_ms() < retry_at + 100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // (The conflicting record may come back first, depending on how long the holder took to start.)
    let mut again = by_id(&queue.receive(1).await);
    while !again.contains_key("r") {
        again = by_id(&queue.receive(1).await);
    }
    let retried = &again["r"];
    assert_eq!(
        retried.attributes.as_ref().unwrap()[&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount],
        "2"
    );
    let before = now_ms();
    let (failures, _) = common::invoke_answer(&world.invoke(&queue.event(std::slice::from_ref(retried)), &[]));
    let after = now_ms();
    assert_eq!(failures, ids([retried]));
    let retry_at = visible_at_of(retried);
    assert!(
        retry_at >= before + 4_000 && retry_at <= after + 4_000 + 800 + 2_000,
        "{}",
        retry_at as i64 - before as i64
    );
    assert_eq!(world.runs("r"), 2);
    holder.wait().unwrap();
}

#[tokio::test]
async fn fifo_records_keep_the_queue_timeout_so_their_group_stays_in_order() {
    let queue = Queue::create(true, 60).await;
    let world = World::new();
    queue.send(&[json!({"id": "f1", "fail": "retryable"}), json!({"id": "f2"})]).await;
    let messages = queue.receive(2).await;
    let before = now_ms();
    let (failures, metrics) = common::invoke_answer(&world.invoke(&queue.event(&messages), &[]));
    assert_eq!(failures, ids(&messages), "the second record is skipped behind the first");
    assert_eq!(metrics["VisibilityChanged"], 0);
    for message in &messages {
        assert!(visible_at_of(message) >= before + 50_000, "a FIFO record's visibility changed");
    }
}

#[tokio::test]
async fn permanent_failures_move_to_the_dead_letter_queue_with_their_reasons() {
    let (queue, dead_letters) = (Queue::create(false, 60).await, Queue::create(false, 60).await);
    let world = World::new();
    queue.send(&[json!({"id": "p", "fail": "permanent"}), json!({"id": "r", "fail": "retryable"})]).await;
    let messages = by_id(&queue.receive(2).await);
    let dlq = [("SQS_ONCE_DLQ_URL", dead_letters.url())];
    let (failures, metrics) =
        common::invoke_answer(&world.invoke(&queue.event(&messages.values().cloned().collect::<Vec<_>>()), &dlq));
    assert_eq!(failures, ids([&messages["r"]]), "the dead-lettered record is reported done");
    assert_eq!((metrics["DeadLettered"].as_u64(), metrics["DeadLetterFailed"].as_u64()), (Some(1), Some(0)));

    let moved = &dead_letters.receive(1).await[0];
    assert_eq!(moved.body, messages["p"].body);
    let attributes = moved.message_attributes.as_ref().unwrap();
    let attribute = |name: &str| attributes[name].string_value.clone().unwrap();
    assert_eq!(attribute("SqsOnce.Error"), "handler failed (permanent): demo: asked to fail (permanent)");
    assert_eq!(attribute("SqsOnce.Key"), "sqs-once#p");
    assert_eq!(attribute("SqsOnce.MessageId"), messages["p"].message_id.clone().unwrap());
    assert_eq!(attribute("SqsOnce.ReceiveCount"), "1");
    assert_eq!(attribute("SqsOnce.SourceQueue"), queue.info.arn);
    // The claim still says it failed: nothing was marked done that did not complete.
    assert_eq!(world.claim("p")["status"], "FAILED");
}

#[tokio::test]
async fn messages_of_the_largest_size_run_once_and_dead_letter_whole() {
    let (queue, dead_letters) = (Queue::create(false, 60).await, Queue::create(false, 60).await);
    let world = World::new();
    let full = |fields| body_of_size(fields, LARGEST_MESSAGE);
    let bodies = [
        full(json!({"id": "ok"})),
        full(json!({"id": "full", "fail": "permanent"})),
        body_of_size(json!({"id": "near", "fail": "permanent"}), LARGEST_MESSAGE - 4096),
    ];
    for body in &bodies {
        queue.send_body(body).await;
    }
    let messages = by_id(&queue.receive(3).await);
    let dlq = [("SQS_ONCE_DLQ_URL", dead_letters.url())];
    let output = world.invoke(&queue.event(&messages.values().cloned().collect::<Vec<_>>()), &dlq);
    let (failures, metrics) = common::invoke_answer(&output);
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!((metrics["DeadLettered"].as_u64(), metrics["DeadLetterFailed"].as_u64()), (Some(2), Some(0)));
    assert_eq!((world.runs("ok"), world.runs("full"), world.runs("near")), (1, 1, 1));

    let moved = by_id(&dead_letters.receive(2).await);
    assert_eq!(moved["full"].body.as_deref(), Some(bodies[1].as_str()), "the body moved whole");
    assert_eq!(moved["near"].body.as_deref(), Some(bodies[2].as_str()));
    // SQS counts attributes in the 1 MiB: a full message keeps its body and loses the explanation.
    assert!(moved["full"].message_attributes.is_none(), "{:?}", moved["full"].message_attributes);
    let near = moved["near"].message_attributes.as_ref().expect("room for the explanation");
    assert_eq!(near["SqsOnce.Key"].string_value.as_deref(), Some("sqs-once#near"));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no room left for this dead-letter attribute"));
}

#[tokio::test]
async fn every_permanent_outcome_moves_to_the_dead_letter_queue() {
    let (queue, dead_letters) = (Queue::create(false, 60).await, Queue::create(false, 60).await);
    let world = World::new();
    let validating = [("SQS_ONCE_VALIDATE_PAYLOAD", "true")];
    // First deliveries, without a dead-letter queue: `p` fails permanently, `v` completes.
    queue.send(&[json!({"id": "p", "fail": "permanent"}), json!({"id": "v", "version": 1})]).await;
    let first = queue.receive(2).await;
    common::invoke_answer(&world.invoke(&queue.event(&first), &validating));
    // Later: `p` again (failed before), `v` with another body (payload mismatch), one without a key.
    queue.send(&[json!({"id": "p", "fail": "permanent"}), json!({"id": "v", "version": 2}), json!({"no_id": 1})]).await;
    let later = queue.receive(3).await;
    let dlq = [validating[0], ("SQS_ONCE_DLQ_URL", dead_letters.url())];
    let (failures, metrics) = common::invoke_answer(&world.invoke(&queue.event(&later), &dlq));
    assert!(failures.is_empty(), "dead-lettered records are done here: {failures:?}");
    assert_eq!((metrics["DeadLettered"].as_u64(), metrics["FailedPermanent"].as_u64()), (Some(3), Some(2)));
    assert_eq!(metrics["FailedMissingKey"].as_u64(), Some(1));

    let moved = dead_letters.receive(3).await;
    let reasons: HashMap<String, String> = moved
        .iter()
        .map(|message| {
            let error = message.message_attributes.as_ref().unwrap()["SqsOnce.Error"].string_value.clone().unwrap();
            (message.body.clone().unwrap(), error)
        })
        .collect();
    let reason = |body: Value| reasons.get(&body.to_string()).cloned().unwrap_or_default();
    assert!(
        reason(json!({"id": "p", "fail": "permanent"})).starts_with("key failed permanently before"),
        "{reasons:?}"
    );
    assert!(reason(json!({"id": "v", "version": 2})).contains("different body"), "{reasons:?}");
    assert!(reason(json!({"no_id": 1})).starts_with("no idempotency key"), "{reasons:?}");
    assert_eq!((world.runs("p"), world.runs("v")), (1, 1), "neither ran again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_moves_confirmed_by_the_cut_off_count_as_done_and_the_others_stay_failed() {
    let (queue, dead_letters) = (Queue::create(false, 60).await, Queue::create(false, 60).await);
    let world = World::new();
    queue.send(&[json!({"id": "moved", "fail": "permanent"}), json!({"id": "held", "fail": "permanent"})]).await;
    let messages = by_id(&queue.receive(2).await);
    // The SQS server answers every call but the dead-letter copy of `held`, which it never answers.
    let sqs = common::dynamodb::proxy_to(&common::sqs::endpoint(), |operation, request| {
        let held = operation == "SendMessage" && request["MessageBody"].as_str().is_some_and(|b| b.contains("held"));
        if held { common::dynamodb::Reply::Hold } else { common::dynamodb::Reply::Forward }
    })
    .await;
    let envs = [("SQS_ONCE_DLQ_URL", dead_letters.url()), ("AWS_ENDPOINT_URL_SQS", sqs.as_str())];
    let path = world.event_file(&queue.event(&messages.values().cloned().collect::<Vec<_>>()));
    let output = world.command(&["invoke", "--sqs", "--metrics", "--timeout", "3"], &envs).arg(path).output().unwrap();
    let (failures, metrics) = common::invoke_answer(&output);
    assert_eq!(failures, ids([&messages["held"]]), "the unconfirmed move leaves its record failed");
    assert_eq!((metrics["DeadLettered"].as_u64(), metrics["DeadLetterFailed"].as_u64()), (Some(1), Some(1)));
    let moved = dead_letters.receive(1).await;
    assert_eq!(moved[0].body, messages["moved"].body, "the confirmed move is done");
}

#[tokio::test]
async fn a_failed_dead_letter_send_leaves_the_record_failed() {
    let queue = Queue::create(false, 60).await;
    let world = World::new();
    queue.send(&[json!({"id": "p", "fail": "permanent"})]).await;
    let messages = queue.receive(1).await;
    let missing = format!("{}-missing", queue.url());
    let output = world.invoke(&queue.event(&messages), &[("SQS_ONCE_DLQ_URL", &missing)]);
    let (failures, metrics) = common::invoke_answer(&output);
    assert_eq!(failures, ids(&messages));
    assert_eq!((metrics["DeadLettered"].as_u64(), metrics["DeadLetterFailed"].as_u64()), (Some(0), Some(1)));
    assert!(String::from_utf8_lossy(&output.stderr).contains("not moved to the dead-letter queue"));
}

#[tokio::test]
async fn an_unreachable_sqs_leaves_the_answer_correct() {
    let world = World::new();
    let record = |id: &str, body: Value| {
        json!({"messageId": id, "receiptHandle": format!("rh-{id}"), "body": body.to_string(), "eventSource": "aws:sqs",
               "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:work", "attributes": {"ApproximateReceiveCount": "1"}})
    };
    let event = json!({"Records": [
        record("m-ok", json!({"id": "ok"})),
        record("m-retry", json!({"id": "retry", "fail": "retryable"})),
        record("m-perm", json!({"id": "perm", "fail": "permanent"})),
    ]});
    let down = [
        ("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:9"),
        ("SQS_ONCE_DLQ_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/dlq"),
    ];
    let output = world.invoke(&event, &down);
    let (failures, metrics) = common::invoke_answer(&output);
    assert_eq!(failures, HashSet::from(["m-retry".to_owned(), "m-perm".to_owned()]));
    assert_eq!((metrics["VisibilityChanged"].as_u64(), metrics["VisibilityChangeFailed"].as_u64()), (Some(0), Some(1)));
    assert_eq!((metrics["DeadLettered"].as_u64(), metrics["DeadLetterFailed"].as_u64()), (Some(0), Some(1)));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("visibility not changed"), "{stderr}");
    assert_eq!((world.runs("ok"), world.runs("retry"), world.runs("perm")), (1, 1, 1));
}

#[tokio::test]
async fn an_sqs_that_never_answers_is_cut_off_at_the_deadline_and_the_answer_stands() {
    // Accepts connections and never answers them.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let held: Vec<_> = listener.incoming().take(16).collect();
        std::thread::sleep(Duration::from_secs(60));
        drop(held);
    });
    let world = World::new();
    let record = |id: &str, body: Value| {
        json!({"messageId": id, "receiptHandle": format!("rh-{id}"), "body": body.to_string(), "eventSource": "aws:sqs",
               "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:work"})
    };
    let event = json!({"Records": [
        record("m-retry", json!({"id": "retry", "fail": "retryable"})),
        record("m-perm", json!({"id": "perm", "fail": "permanent"})),
    ]});
    let path = world.event_file(&event);
    let hanging = [
        ("AWS_ENDPOINT_URL_SQS", endpoint.as_str()),
        ("SQS_ONCE_DLQ_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/dlq"),
    ];
    let output =
        world.command(&["invoke", "--sqs", "--metrics", "--timeout", "1.5"], &hanging).arg(path).output().unwrap();
    let (failures, metrics) = common::invoke_answer(&output);
    assert_eq!(failures, HashSet::from(["m-retry".to_owned(), "m-perm".to_owned()]));
    assert_eq!((metrics["VisibilityChanged"].as_u64(), metrics["VisibilityChangeFailed"].as_u64()), (Some(0), Some(1)));
    assert_eq!((metrics["DeadLettered"].as_u64(), metrics["DeadLetterFailed"].as_u64()), (Some(0), Some(1)));
    assert!(String::from_utf8_lossy(&output.stderr).contains("SQS did not answer before the deadline"));
}

/// The SQS server the tests and the docs' local runs use keeps a FIFO group's
/// order after a visibility timeout, as SQS does: the group's first message
/// comes back first, and each later one only once the one before is deleted.
/// (moto 5.2.5 as published handed out the group's last message first;
/// scripts/sqs-server.py mends it.)
#[tokio::test]
async fn the_local_sqs_server_keeps_a_fifo_groups_order_after_a_visibility_timeout() {
    let queue = common::sqs::Queue::create(true, 1).await;
    queue.send(&[json!({"n": 1}), json!({"n": 2}), json!({"n": 3})]).await;
    let first = queue.receive(3).await;
    assert_eq!(bodies(&first), ["{\"n\":1}", "{\"n\":2}", "{\"n\":3}"], "received in order, none deleted");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for n in 1..=3 {
        let again = queue.receive(1).await;
        assert_eq!(bodies(&again), [format!("{{\"n\":{n}}}")], "redelivered in the group's order");
        let handle = again[0].receipt_handle().unwrap();
        queue.client.delete_message().queue_url(queue.url()).receipt_handle(handle).send().await.unwrap();
    }
}

fn bodies(messages: &[Message]) -> Vec<String> {
    messages.iter().map(|message| message.body().unwrap_or_default().to_owned()).collect()
}
