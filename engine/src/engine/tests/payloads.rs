//! Records whose payload the Amazon SQS Extended Client kept in S3: read
//! before anything else, so that keys, payload validation and the handler
//! see the message the producer sent; a payload that cannot be read fails
//! its record alone. A bucket in memory stands in for S3 here (the S3 one
//! is tested against a local S3 server in `tests/payloads.rs`).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{Value, json};

use super::{Remembers, Setup, failures, message, outcome, run};
use crate::report::{Failure, Outcome};
use sqs_once_core::{
    envelope::EnvelopeKind,
    payload::{PayloadError, PayloadOptions, PayloadPointer, PayloadStore},
    store::{ClaimStore, MemoryStore, OutboxEntry, OutboxQuery},
    transaction::Message,
};

/// Objects by key in one bucket, the keys deleted, and where each payload
/// read was read into; writes refused while `refuses_writes`.
#[derive(Debug, Default)]
struct Bucket {
    objects: Mutex<HashMap<String, String>>,
    deleted: Mutex<Vec<String>>,
    read_into: Mutex<Vec<usize>>,
    refuses_writes: std::sync::atomic::AtomicBool,
}

impl Bucket {
    fn with(objects: &[(&str, &str)]) -> Arc<Self> {
        let objects = objects.iter().map(|(key, body)| ((*key).to_owned(), (*body).to_owned())).collect();
        Arc::new(Self { objects: Mutex::new(objects), ..Self::default() })
    }

    fn deleted(&self) -> Vec<String> {
        let mut deleted = self.deleted.lock().unwrap().clone();
        deleted.sort();
        deleted
    }
}

#[async_trait::async_trait]
impl PayloadStore for Bucket {
    async fn get(&self, pointer: &PayloadPointer, limit: u64) -> Result<String, PayloadError> {
        if pointer.bucket != "large" {
            let reason = "PermanentRedirect: the bucket is in another Region".into();
            return Err(PayloadError::Unreachable { pointer: pointer.clone(), reason });
        }
        let object = self.objects.lock().unwrap().get(&pointer.key).cloned();
        let object = object.ok_or_else(|| PayloadError::Missing(pointer.clone()))?;
        match object.len() as u64 {
            size if size > limit => Err(PayloadError::TooLarge { pointer: pointer.clone(), size, limit }),
            _ => {
                self.read_into.lock().unwrap().push(object.as_ptr() as usize);
                Ok(object)
            }
        }
    }

    async fn put(&self, pointer: &PayloadPointer, payload: &str) -> Result<(), PayloadError> {
        if self.refuses_writes.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(PayloadError::Unavailable { pointer: pointer.clone(), reason: "AccessDenied: no".into() });
        }
        self.objects.lock().unwrap().insert(pointer.key.clone(), payload.to_owned());
        Ok(())
    }

    async fn delete(&self, pointer: &PayloadPointer) -> Result<(), PayloadError> {
        self.objects.lock().unwrap().remove(&pointer.key);
        self.deleted.lock().unwrap().push(pointer.key.clone());
        Ok(())
    }
}

/// A message as the Extended Client sends it: the pointer to `key` in the
/// bucket `large`, marked with `ExtendedPayloadSize`.
fn pointer(id: &str, key: &str) -> Value {
    let body = json!(["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3BucketName": "large", "s3Key": key}]);
    let mut message = message(id, body);
    message["messageAttributes"] = json!({"ExtendedPayloadSize": {"stringValue": "300000", "dataType": "Number"}});
    message
}

fn order(id: &str, padding: usize) -> String {
    json!({"order_id": id, "lines": "x".repeat(padding)}).to_string()
}

fn setup(bucket: &Arc<Bucket>, payloads: PayloadOptions) -> Setup {
    let store: Arc<dyn PayloadStore> = bucket.clone();
    Setup {
        key: "body.order_id",
        options: super::EngineOptions { payloads, ..Default::default() },
        payloads: Some(store),
        ..Setup::default()
    }
}

fn bodies(handler: &Remembers) -> Vec<String> {
    let mut bodies: Vec<String> = handler.0.lock().unwrap().iter().map(|(body, _)| body.to_string()).collect();
    bodies.sort();
    bodies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pointer_is_read_before_the_key_and_the_handler_sees_the_payload() {
    let large = order("o-1", 300_000);
    let large_bytes = large.len() as u64;
    let bucket = Bucket::with(&[("k-1", &large), ("k-big", &order("o-4", 2_000_000))]);
    let options = PayloadOptions { max_bytes: 1_000_000, ..Default::default() };
    let handler = Arc::new(Remembers::default());
    let engine = setup(&bucket, options).engine(Arc::clone(&handler));
    let mut malformed = message("m-malformed", json!({"order_id": "o-3"}));
    malformed["messageAttributes"] = pointer("-", "-")["messageAttributes"].clone();
    let records = vec![
        pointer("m-1", "k-1"),
        message("m-plain", json!({"order_id": "o-2"})),
        pointer("m-gone", "k-gone"),
        malformed,
        pointer("m-big", "k-big"),
        // Another message pointing to m-1's payload: the same order, so the same key.
        pointer("m-1-again", "k-1"),
    ];
    let report = run(&engine, records, Duration::from_secs(30)).await;

    assert_eq!(failures(&report), ["m-gone", "m-malformed", "m-big"]);
    assert_eq!(bodies(&handler), [large, json!({"order_id": "o-2"}).to_string()]);
    let record = |id: &str| report.records.iter().find(|record| record.message_id == id).unwrap();
    assert_eq!(record("m-1").key.as_deref(), Some("test#o-1"), "keyed by the payload");
    assert_eq!(record("m-1").payload_bytes, Some(large_bytes));
    assert_eq!(outcome(&report, "m-1-again"), &Outcome::Duplicate);
    assert_eq!(record("m-plain").payload_bytes, None);
    let unavailable = |id: &str| match outcome(&report, id) {
        Outcome::Failed(Failure::PayloadUnavailable(reason)) => reason.clone(),
        other => panic!("{id}: {other:?}"),
    };
    assert!(unavailable("m-gone").starts_with("no object at s3://large/k-gone"), "{}", unavailable("m-gone"));
    assert!(unavailable("m-big").contains("over SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES=1000000"), "{}", unavailable("m-big"));
    assert!(matches!(outcome(&report, "m-malformed"), Outcome::Failed(Failure::InvalidRecord(_))));
    assert!(bucket.deleted().is_empty(), "objects are kept unless SQS_ONCE_LARGE_PAYLOAD_DELETE is on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_in_a_bucket_out_of_reach_fails_its_record_for_good() {
    let bucket = Bucket::with(&[("k-1", &order("o-1", 100))]);
    let handler = Arc::new(Remembers::default());
    let engine = setup(&bucket, PayloadOptions::default()).engine(Arc::clone(&handler));
    let mut far = pointer("m-far", "k-1");
    far["body"] = json!(far["body"].as_str().unwrap().replace("\"large\"", "\"elsewhere\""));
    let report = run(&engine, vec![far, pointer("m-1", "k-1")], Duration::from_secs(30)).await;
    assert_eq!(failures(&report), ["m-far"]);
    match outcome(&report, "m-far") {
        Outcome::Failed(Failure::Permanent(reason)) => assert!(reason.contains("another Region"), "{reason}"),
        other => panic!("not tried again until the dead-letter queue: {other:?}"),
    }
    assert_eq!(bodies(&handler).len(), 1, "the handler never saw the pointer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_are_deleted_after_success_only_when_asked() {
    let bucket = Bucket::with(&[
        ("k-ok", &order("o-1", 10)),
        ("k-fail", &json!({"order_id": "o-2", "fail": "retryable"}).to_string()),
    ]);
    let handler = super::Directed::default();
    let options = PayloadOptions { delete_after: true, ..Default::default() };
    let engine = setup(&bucket, options).engine(handler.clone());
    let report =
        run(&engine, vec![pointer("m-ok", "k-ok"), pointer("m-fail", "k-fail")], Duration::from_secs(30)).await;

    assert_eq!(failures(&report), ["m-fail"]);
    assert_eq!(bucket.deleted(), ["k-ok"], "the failed record's payload stays for its redelivery");
    assert_eq!(handler.runs().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_large_payloads_off_the_pointer_is_the_body() {
    let bucket = Bucket::with(&[("k-1", &order("o-1", 10))]);
    let handler = Arc::new(Remembers::default());
    let options = PayloadOptions { fetch: false, ..Default::default() };
    let engine = Setup { key: "messageId", ..setup(&bucket, options) }.engine(Arc::clone(&handler));
    let report = run(&engine, vec![pointer("m-1", "k-1")], Duration::from_secs(30)).await;

    assert!(failures(&report).is_empty());
    let pointer_body = pointer("m-1", "k-1")["body"].as_str().unwrap().to_owned();
    assert_eq!(bodies(&handler), [pointer_body]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_payload_store_a_pointer_fails_its_record_alone() {
    let handler = Arc::new(Remembers::default());
    let engine = Setup::default().engine(Arc::clone(&handler));
    let report = run(&engine, vec![pointer("m-1", "k-1"), message("m-2", json!({}))], Duration::from_secs(30)).await;

    assert_eq!(failures(&report), ["m-1"]);
    match outcome(&report, "m-1") {
        Outcome::Failed(Failure::PayloadUnavailable(reason)) => assert!(reason.contains("`s3` feature"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(handler.0.lock().unwrap().len(), 1, "the pointer never reaches the handler as a payload");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sns_extended_clients_pointer_is_read_inside_the_envelope() {
    let payload = order("o-9", 400_000);
    let bucket = Bucket::with(&[("k-9", &payload)]);
    let handler = Arc::new(Remembers::default());
    let options = super::EngineOptions { envelope: EnvelopeKind::Sns, ..Default::default() };
    let setup = Setup {
        options: super::EngineOptions { payloads: PayloadOptions::default(), ..options },
        ..setup(&bucket, PayloadOptions::default())
    };
    let engine = setup.engine(Arc::clone(&handler));
    let pointer_body = pointer("-", "k-9")["body"].as_str().unwrap().to_owned();
    let notification = json!({
        "Type": "Notification",
        "MessageId": "95df01b4-ee98-5cb9-9903-4c221d41eb5e",
        "TopicArn": "arn:aws:sns:us-east-1:123456789012:orders",
        "Message": pointer_body,
        "Timestamp": "2026-11-23T10:00:00.000Z",
        "MessageAttributes": {"ExtendedPayloadSize": {"Type": "Number", "Value": "400024"}}
    });
    let report = run(&engine, vec![message("m-9", notification)], Duration::from_secs(30)).await;

    assert!(failures(&report).is_empty(), "{report:?}");
    assert_eq!(bodies(&handler), [payload]);
}

/// Forwards each record's body to a queue: large bodies make large messages.
struct Forwards;

impl sqs_once_core::Handler for Forwards {
    async fn handle(&self, record: &sqs_once_core::Record) -> sqs_once_core::HandlerResult {
        record.transaction().send(Message::sqs(QUEUE, record.body.clone()).attribute("kind", "forwarded"))?;
        Ok(None)
    }
}

const QUEUE: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/forwarded";

/// The outbox entries the store holds.
async fn entries(store: &Arc<MemoryStore>) -> Vec<OutboxEntry> {
    let outbox = Arc::clone(store).capabilities().outbox.expect("the memory store keeps an outbox");
    outbox.entries(&OutboxQuery { due_at_ms: None, limit: 100 }).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_too_large_to_send_is_written_to_s3_before_the_commit_and_sent_as_a_pointer() {
    let bucket = Bucket::with(&[]);
    let store = Arc::new(MemoryStore::default());
    let options = PayloadOptions { bucket: Some("large".into()), ..Default::default() };
    let setup = Setup { key: "messageId", store: store.clone(), ..setup(&bucket, options) };
    let engine = setup.engine(Forwards);
    let large = "x".repeat(2 * 1024 * 1024);
    let records = vec![message("m-large", json!(large)), message("m-small", json!("small"))];
    let report = run(&engine, records, Duration::from_secs(30)).await;

    assert!(failures(&report).is_empty(), "{report:?}");
    let entries = entries(&store).await;
    let large_entry = entries.iter().find(|entry| entry.message_id == "m-large").unwrap();
    let key = format!("sqs-once/{}", large_entry.outbox_id());
    let pointer = PayloadPointer { bucket: "large".into(), key: key.clone() };
    assert_eq!(large_entry.message.body, pointer.body(), "the entry, and so the message sent, is the pointer");
    assert_eq!(large_entry.message.attributes["ExtendedPayloadSize"], large.len().to_string());
    assert_eq!(large_entry.message.attributes["kind"], "forwarded");
    assert_eq!(bucket.objects.lock().unwrap().get(&key), Some(&large), "the payload, under the entry's outbox id");
    let small_entry = entries.iter().find(|entry| entry.message_id == "m-small").unwrap();
    assert_eq!(small_entry.message.body, "small", "a message that fits is sent as it is");
    assert_eq!(bucket.objects.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_that_cannot_be_written_fails_its_record_with_nothing_committed() {
    let bucket = Bucket::with(&[]);
    bucket.refuses_writes.store(true, std::sync::atomic::Ordering::SeqCst);
    let store = Arc::new(MemoryStore::default());
    let options = PayloadOptions { bucket: Some("large".into()), ..Default::default() };
    let engine = Setup { key: "messageId", store: store.clone(), ..setup(&bucket, options) }.engine(Forwards);
    let large = "x".repeat(2 * 1024 * 1024);
    let report = run(&engine, vec![message("m-large", json!(large))], Duration::from_secs(30)).await;

    assert_eq!(failures(&report), ["m-large"]);
    match outcome(&report, "m-large") {
        Outcome::Failed(Failure::Retryable(reason)) => assert!(reason.contains("AccessDenied"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(entries(&store).await.is_empty(), "nothing committed");

    // Writable again, the redelivery runs and commits once.
    bucket.refuses_writes.store(false, std::sync::atomic::Ordering::SeqCst);
    let report = run(&engine, vec![message("m-large", json!(large))], Duration::from_secs(30)).await;
    assert!(failures(&report).is_empty(), "{report:?}");
    assert_eq!(entries(&store).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_bucket_a_message_too_large_to_send_is_refused_when_staged() {
    let bucket = Bucket::with(&[]);
    let store = Arc::new(MemoryStore::default());
    let engine =
        Setup { key: "messageId", store: store.clone(), ..setup(&bucket, PayloadOptions::default()) }.engine(Forwards);
    let report =
        run(&engine, vec![message("m-large", json!("x".repeat(2 * 1024 * 1024)))], Duration::from_secs(30)).await;

    assert!(matches!(outcome(&report, "m-large"), Outcome::Failed(Failure::Permanent(_))));
    assert!(entries(&store).await.is_empty());
    assert!(bucket.objects.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payloads_held_at_once_stay_within_the_memory_budget() {
    // Three payloads of 300,000 bytes (as their pointers declare) in room for two, each counted once: the engine
    // and the record's body share the buffer it was read into.
    let objects: Vec<(String, String)> =
        (1..=3).map(|n| (format!("k-{n}"), order(&format!("o-{n}"), 299_970))).collect();
    let bucket = Bucket::with(&objects.iter().map(|(key, body)| (key.as_str(), body.as_str())).collect::<Vec<_>>());
    let options = PayloadOptions { memory: 700_000, max_bytes: 400_000, ..Default::default() };
    let handler = Arc::new(Remembers::default());
    let engine = setup(&bucket, options).engine(Arc::clone(&handler));
    let batch = || (1..=3).map(|n| pointer(&format!("m-{n}"), &format!("k-{n}"))).collect::<Vec<_>>();
    let report = run(&engine, batch(), Duration::from_secs(30)).await;

    let failed = failures(&report);
    assert_eq!(failed.len(), 1, "{report:?}");
    match outcome(&report, &failed[0]) {
        Outcome::Failed(Failure::PayloadUnavailable(reason)) => {
            assert!(reason.contains("SQS_ONCE_LARGE_PAYLOAD_MEMORY=700000"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // The batch answered, its payloads are let go: the one left out fits when it comes back.
    let again = batch().into_iter().filter(|record| record["messageId"] == failed[0].as_str()).collect();
    let report = run(&engine, again, Duration::from_secs(30)).await;
    assert!(failures(&report).is_empty(), "{report:?}");
    assert_eq!(handler.0.lock().unwrap().len(), 3, "each order ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_is_held_once_the_handler_given_the_buffer_it_was_read_into() {
    // Eight payloads of 100,000 bytes in a budget of eight times 100 KiB (it counts whole KiB): all of them fit,
    // as they are held once.
    let objects: Vec<(String, String)> =
        (1..=8).map(|n| (format!("k-{n}"), order(&format!("o-{n}"), 99_970))).collect();
    let bucket = Bucket::with(&objects.iter().map(|(key, body)| (key.as_str(), body.as_str())).collect::<Vec<_>>());
    let options = PayloadOptions { memory: 8 * 100 * 1024, max_bytes: 100_000, ..Default::default() };
    let handler = Arc::new(Remembers::default());
    let engine = setup(&bucket, options).engine(Arc::clone(&handler));
    let mut batch: Vec<Value> = (1..=8).map(|n| pointer(&format!("m-{n}"), &format!("k-{n}"))).collect();
    for record in &mut batch {
        record["messageAttributes"]["ExtendedPayloadSize"]["stringValue"] = json!("100000");
    }
    let report = run(&engine, batch, Duration::from_secs(30)).await;
    assert!(failures(&report).is_empty(), "{report:?}");
    // Not a copy: each body the handler read is a buffer a payload was read into.
    let read_into = bucket.read_into.lock().unwrap().clone();
    let given: Vec<usize> = handler.0.lock().unwrap().iter().map(|(body, _)| body.as_ptr() as usize).collect();
    assert_eq!(given.len(), 8);
    assert!(given.iter().all(|body| read_into.contains(body)), "{given:?} not among {read_into:?}");
}
