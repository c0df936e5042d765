//! The batch engine: which records land in `batchItemFailures`, and how often
//! handlers run. The in-memory store stands in for DynamoDB here.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use crate::{
    budget::Margins,
    claim::ClaimPolicy,
    engine::{Engine, EngineOptions, Invocation},
    event::parse_event,
    key::{Keys, OnMissingKey},
    report::{BatchReport, Failure, Outcome},
    testing::Directed,
};
use rusty_fork::rusty_fork_test;
use serde_json::{Value, json};
use sqs_once_core::{
    BoxHandler, Handler, HandlerError, HandlerResult, Record,
    clock::{Clock, SystemClock},
    envelope::{Envelope, EnvelopeKind},
    payload::PayloadStore,
    store::{ClaimStatus, ClaimStore, Fenced, Finish, MemoryStore, PutOutcome, StoreError, StoredClaim},
};

fn message(id: &str, body: Value) -> Value {
    let body = match body {
        Value::String(text) => text,
        other => other.to_string(),
    };
    json!({"messageId": id, "body": body, "eventSource": "aws:sqs",
           "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:work",
           "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {}})
}

fn fifo(id: &str, group: &str, body: Value) -> Value {
    let mut message = message(id, body);
    message["eventSourceARN"] = json!("arn:aws:sqs:us-east-1:123456789012:work.fifo");
    message["attributes"]["MessageGroupId"] = json!(group);
    message
}

struct Setup {
    store: Arc<dyn ClaimStore>,
    key: &'static str,
    on_missing: OnMissingKey,
    options: EngineOptions,
    policy: ClaimPolicy,
    clock: Arc<dyn Clock>,
    payloads: Option<Arc<dyn PayloadStore>>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            store: Arc::new(MemoryStore::default()),
            key: "messageId",
            on_missing: OnMissingKey::Fail,
            options: EngineOptions::default(),
            policy: ClaimPolicy::default(),
            clock: Arc::new(SystemClock),
            payloads: None,
        }
    }
}

impl Setup {
    fn engine(self, handler: impl Handler) -> Engine {
        let keys = Keys::new(self.key, "test").unwrap().hashed(false).on_missing(self.on_missing);
        let Self { store, policy, options, clock, payloads, .. } = self;
        Engine::builder(store, keys)
            .policy(policy)
            .options(options)
            .clock(clock)
            .payloads(payloads)
            .build(BoxHandler::new(handler))
    }
}

async fn run(engine: &Engine, records: Vec<Value>, timeout: Duration) -> BatchReport {
    let invocation = Invocation { deadline: SystemTime::now() + timeout, request_id: "req-1".into() };
    engine.process(&parse_event(&json!({ "Records": records }).to_string()).unwrap(), &invocation, None).await
}

fn failures(report: &BatchReport) -> Vec<String> {
    report.response().batch_item_failures.into_iter().map(|failure| failure.item_identifier).collect()
}

fn outcome<'r>(report: &'r BatchReport, message_id: &str) -> &'r Outcome {
    &report.records.iter().find(|record| record.message_id == message_id).unwrap().outcome
}

/// A store that is down: every request fails.
struct Down;

#[async_trait::async_trait]
impl ClaimStore for Down {
    async fn put_if_free(&self, _: &StoredClaim, _: u64) -> Result<PutOutcome, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn get(&self, _: &str) -> Result<Option<StoredClaim>, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn finish(&self, _: &str, _: &str, _: &Finish) -> Result<Fenced, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn release(&self, _: &str, _: &str) -> Result<Fenced, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
}

/// A directed handler, and a handle on its runs.
fn demo() -> (Directed, Directed) {
    let handler = Directed::default();
    (handler.clone(), handler)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_directive_lands_where_it_should() {
    let (handler, log) = demo();
    let engine = Setup::default().engine(handler);
    let records = vec![
        message("ok", json!({"n": 1})),
        message("text", json!("plain text")),
        message("slow", json!({"sleep_ms": 50})),
        message("retry", json!({"fail": "retryable"})),
        message("perm", json!({"fail": "permanent"})),
        message("boom", json!({"fail": "panic"})),
    ];
    let report = run(&engine, records.clone(), Duration::from_secs(30)).await;
    assert_eq!(failures(&report), ["retry", "perm", "boom"]);
    assert!(matches!(outcome(&report, "retry"), Outcome::Failed(Failure::Retryable(_))));
    assert!(matches!(outcome(&report, "perm"), Outcome::Failed(Failure::Permanent(_))));
    assert!(matches!(outcome(&report, "boom"), Outcome::Failed(Failure::Panicked(m)) if m.contains("asked to panic")));
    assert_eq!(log.runs().len(), 6);

    // Redelivery: completed keys are duplicates, released keys run again, the
    // permanent failure is not run again.
    let report = run(&engine, records, Duration::from_secs(30)).await;
    assert_eq!(failures(&report), ["retry", "perm", "boom"]);
    assert_eq!(outcome(&report, "ok"), &Outcome::Duplicate);
    assert!(matches!(outcome(&report, "perm"), Outcome::Failed(Failure::FailedBefore(Some(_)))));
    let ran: Vec<String> = log.runs().into_iter().skip(6).map(|(_, id)| id).collect();
    assert_eq!(ran.iter().collect::<HashSet<_>>(), HashSet::from([&"retry".to_owned(), &"boom".to_owned()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_sharing_a_key_run_once_and_the_copies_of_a_success_are_duplicates() {
    let (handler, log) = demo();
    let counting = crate::testing::__private::claim_suite::Counting::new(Arc::new(MemoryStore::default()));
    let engine = Setup { key: "body.order", store: counting.clone(), ..Setup::default() }.engine(handler);
    let records = vec![
        message("a1", json!({"order": "A", "sleep_ms": 20})),
        message("b1", json!({"order": "B", "fail": "retryable"})),
        message("a2", json!({"order": "A"})),
        message("b2", json!({"order": "B"})),
        message("a3", json!({"order": "A"})),
    ];
    let report = run(&engine, records, Duration::from_secs(30)).await;
    assert_eq!(failures(&report), ["b1", "b2"]);
    assert_eq!(log.runs().len(), 2, "one run per key");
    assert_eq!(counting.take(), 4, "claim + settle per key, nothing for in-batch duplicates");
    // The first record of a key is the one processed; its copies are duplicates of it.
    let labels: Vec<&str> = report.records.iter().map(|record| record.outcome.label()).collect();
    assert_eq!(labels, ["processed", "retryable", "duplicate", "retryable", "duplicate"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_group_stops_at_its_first_failure_and_keeps_its_order() {
    #[derive(Default)]
    struct Sequence(Mutex<Vec<String>>);
    impl Handler for Sequence {
        async fn handle(&self, record: &Record) -> HandlerResult {
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.0.lock().unwrap().push(record.message_id.clone());
            if record.body.contains("fail") {
                return Err(sqs_once_core::HandlerError::retryable("asked to"));
            }
            Ok(None)
        }
    }
    let seen = Arc::new(Sequence::default());
    let engine = Setup::default().engine(seen.clone());
    let records = vec![
        fifo("a1", "A", json!({})),
        fifo("b1", "B", json!({})),
        fifo("a2", "A", json!({"fail": true})),
        fifo("b2", "B", json!({})),
        fifo("a3", "A", json!({})),
        fifo("b3", "B", json!({})),
        fifo("a4", "A", json!({})),
    ];
    let report = run(&engine, records, Duration::from_secs(30)).await;
    assert_eq!(failures(&report), ["a2", "a3", "a4"]);
    assert_eq!(outcome(&report, "a3"), &Outcome::Failed(Failure::GroupSkipped("a2".into())));
    let seen = seen.0.lock().unwrap().clone();
    let order = |group: char| seen.iter().filter(|id| id.starts_with(group)).cloned().collect::<Vec<_>>();
    assert_eq!(order('a'), ["a1", "a2"], "a3 and a4 never ran");
    assert_eq!(order('b'), ["b1", "b2", "b3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_fails_only_its_record_and_releases_its_claim() {
    let (handler, _) = demo();
    let store: Arc<dyn ClaimStore> = Arc::new(MemoryStore::default());
    let engine = Setup { store: store.clone(), ..Setup::default() }.engine(handler);
    let records =
        (0..20).map(|n| message(&format!("m{n}"), if n == 7 { json!({"fail": "panic"}) } else { json!({}) })).collect();
    let report = run(&engine, records, Duration::from_secs(30)).await;
    assert_eq!(failures(&report), ["m7"]);
    assert_eq!(store.get("test#m7").await.unwrap(), None, "claim released, so a redelivery runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_drains_the_batch_and_fails_what_did_not_finish() {
    let (handler, log) = demo();
    let options = EngineOptions {
        concurrency: 2,
        margins: Margins { deadline_margin: Duration::from_millis(300), ..Margins::default() },
        ..Default::default()
    };
    let engine = Setup { options, ..Setup::default() }.engine(handler);
    let mut records = vec![message("fast-1", json!({})), message("fast-2", json!({}))];
    records.extend((0..4).map(|n| message(&format!("slow-{n}"), json!({"sleep_ms": 60_000}))));
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    let report = run(&engine, records, Duration::from_millis(1500)).await;
    assert!(tokio::time::Instant::now() < deadline, "answered after the deadline");
    assert_eq!(failures(&report), ["slow-0", "slow-1", "slow-2", "slow-3"]);
    assert!(report.records[2..].iter().all(|r| r.outcome == Outcome::Failed(Failure::Deadline)));
    let started: HashSet<String> = log.runs().into_iter().map(|(_, id)| id).collect();
    let slow_started = started.iter().filter(|id| id.starts_with("slow")).count();
    assert_eq!(slow_started, 2, "two slow records held both slots; the others never started: {started:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_without_a_key_fail_or_fall_back_to_their_message_id() {
    let records = || {
        vec![
            message("json", json!({"id": "k1"})),
            message("text", json!("not json")),
            message("no-id", json!({"x": 1})),
            // Two orders with an empty id: as one key, the second would pass as the first's duplicate.
            message("empty-1", json!({"id": "", "order": 1})),
            message("empty-2", json!({"id": "", "order": 2})),
        ]
    };
    let (handler, log) = demo();
    let report =
        run(&Setup { key: "body.id", ..Setup::default() }.engine(handler), records(), Duration::from_secs(30)).await;
    assert_eq!(failures(&report), ["text", "no-id", "empty-1", "empty-2"]);
    assert!(matches!(outcome(&report, "empty-2"), Outcome::Failed(Failure::MissingKey(r)) if r.contains("empty")));
    assert_eq!(log.runs().len(), 1, "only the record with a key ran");
    assert!(
        matches!(outcome(&report, "text"), Outcome::Failed(Failure::MissingKey(r)) if r.contains("body is not JSON"))
    );
    assert!(matches!(outcome(&report, "no-id"), Outcome::Failed(Failure::MissingKey(r)) if r.contains("body.id")));

    let (handler, log) = demo();
    let setup = Setup { key: "body.id", on_missing: OnMissingKey::MessageId, ..Setup::default() };
    let report = run(&setup.engine(handler), records(), Duration::from_secs(30)).await;
    assert!(failures(&report).is_empty());
    let keys: HashMap<String, String> = log.runs().into_iter().map(|(k, id)| (id, k)).collect();
    assert_eq!(keys["text"], "test#text");
    assert_eq!(keys["json"], "test#k1");
    assert_eq!((keys["empty-1"].as_str(), keys["empty-2"].as_str()), ("test#empty-1", "test#empty-2"), "each ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_fails_every_record_and_marks_nothing_done() {
    let (handler, log) = demo();
    let engine = Setup { store: Arc::new(Down), ..Setup::default() }.engine(handler);
    let report = run(&engine, vec![message("a", json!({})), message("b", json!({}))], Duration::from_secs(30)).await;
    assert_eq!(failures(&report), ["a", "b"]);
    assert!(matches!(outcome(&report, "a"), Outcome::Failed(Failure::Store(r)) if r.contains("connection refused")));
    assert!(log.runs().is_empty(), "no handler runs without a claim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_records_fail_alone_and_duplicate_message_ids_are_reported_once() {
    let (handler, _) = demo();
    let engine = Setup::default().engine(handler);
    let mut bad = message("bad", json!({}));
    bad["attributes"] = json!({"ApproximateReceiveCount": 1});
    let records = vec![
        message("good", json!({})),
        bad,
        message("twice", json!({"fail": "retryable"})),
        message("twice", json!({})),
    ];
    let report = run(&engine, records, Duration::from_secs(30)).await;
    assert_eq!(failures(&report), ["bad", "twice"]);
    assert!(matches!(outcome(&report, "bad"), Outcome::Failed(Failure::InvalidRecord(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_run_in_parallel_within_the_concurrency_bound() {
    /// Counts handlers under way; each waits at a barrier of two, which
    /// opens only when two run at once.
    struct Gauge {
        under_way: UnderWay,
        pairs: tokio::sync::Barrier,
    }
    impl Handler for Gauge {
        async fn handle(&self, _record: &Record) -> HandlerResult {
            self.under_way
                .during(async {
                    self.pairs.wait().await;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                })
                .await;
            Ok(None)
        }
    }
    // Whether or not claims run ahead of the handlers (they do when the store gathers calls).
    for gathering in [false, true] {
        let gauge = Arc::new(Gauge { under_way: UnderWay::default(), pairs: tokio::sync::Barrier::new(2) });
        let options = EngineOptions { concurrency: 2, ..EngineOptions::default() };
        let store = Arc::new(HeldStore { gathering, ..HeldStore::default() });
        let engine = Setup { store, options, ..Setup::default() }.engine(gauge.clone());
        let records = (0..40).map(|n| message(&format!("m{n}"), json!({}))).collect();
        let report = run(&engine, records, Duration::from_secs(10)).await;
        // Every pair met at the barrier (else the deadline fails them), and never more than two ran at once.
        assert!(failures(&report).is_empty(), "{report:?}");
        assert_eq!(gauge.under_way.most(), 2, "at most the bound (gathering: {gathering})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_running_at_once_share_one_bound_on_handlers() {
    /// Counts handlers under way, each a moment long.
    struct Gauge(UnderWay);
    impl Handler for Gauge {
        async fn handle(&self, _record: &Record) -> HandlerResult {
            self.0.during(tokio::time::sleep(Duration::from_millis(5))).await;
            Ok(None)
        }
    }
    // Four batches at once (concurrent invocations of Lambda Managed Instances, `poll`'s overlapping batches)
    // on one engine whose bound is three: never more than three handlers at once, every record processed.
    let gauge = Arc::new(Gauge(UnderWay::default()));
    let options = EngineOptions { concurrency: 3, ..EngineOptions::default() };
    let store = Arc::new(HeldStore { gathering: true, ..HeldStore::default() });
    let engine = Setup { store, options, ..Setup::default() }.engine(gauge.clone());
    let batch = |b: usize| (0..20).map(|n| message(&format!("b{b}-m{n}"), json!({}))).collect::<Vec<_>>();
    let reports = futures::future::join_all((0..4).map(|b| run(&engine, batch(b), SECS_30))).await;
    assert!(reports.iter().all(|report| failures(report).is_empty()), "{reports:?}");
    assert_eq!(gauge.0.most(), 3, "one bound for the process, not one per batch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_payload_validation_an_in_batch_duplicate_with_another_body_fails() {
    let (handler, log) = demo();
    let policy = ClaimPolicy { validate_payload: true, ..ClaimPolicy::default() };
    let engine = Setup { key: "body.order", policy, ..Setup::default() }.engine(handler);
    let records = vec![
        message("first", json!({"order": "A", "amount": 1})),
        message("same", json!({"order": "A", "amount": 1})),
        message("changed", json!({"order": "A", "amount": 2})),
    ];
    let report = run(&engine, records, Duration::from_secs(30)).await;
    assert_eq!(failures(&report), ["changed"]);
    assert_eq!(outcome(&report, "changed"), &Outcome::Failed(Failure::PayloadMismatch));
    assert_eq!(log.runs().len(), 1);
}

/// Remembers the body and envelope of every record it runs.
#[derive(Default)]
struct Remembers(Mutex<Vec<(sqs_once_core::Body, Option<Envelope>)>>);

impl Handler for Remembers {
    async fn handle(&self, record: &Record) -> HandlerResult {
        self.0.lock().unwrap().push((record.body.clone(), record.envelope.clone()));
        Ok(None)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_and_payload_validation_see_the_message_inside_the_envelope() {
    let notification = |sns_id: &str, message: Value| {
        json!({"Type": "Notification", "MessageId": sns_id, "TopicArn": "arn:aws:sns:us-east-1:123456789012:orders",
               "Timestamp": format!("2026-11-23T10:00:0{}.000Z", sns_id.len()), "Message": message.to_string(),
               "MessageAttributes": {"tenant": {"Type": "String", "Value": "t-9"}}})
    };
    let policy = ClaimPolicy { validate_payload: true, ..ClaimPolicy::default() };
    let options = EngineOptions { envelope: EnvelopeKind::Sns, ..EngineOptions::default() };
    let handler = Arc::new(Remembers::default());
    let engine = Setup { key: "body.order", policy, options, ..Setup::default() }.engine(Arc::clone(&handler));
    // Two publishes of one message (envelopes differ in id and time), then the same order with another message.
    let records = vec![
        message("first", notification("sns-1", json!({"order": "A", "amount": 1}))),
        message("republished", notification("sns-22", json!({"order": "A", "amount": 1}))),
        message("changed", notification("sns-333", json!({"order": "A", "amount": 2}))),
    ];
    let report = run(&engine, records, Duration::from_secs(30)).await;
    assert_eq!(failures(&report), ["changed"]);
    assert_eq!(outcome(&report, "republished"), &Outcome::Duplicate);
    assert_eq!(outcome(&report, "changed"), &Outcome::Failed(Failure::PayloadMismatch));
    let runs = handler.0.lock().unwrap().clone();
    assert_eq!(runs.len(), 1);
    let (body, envelope) = &runs[0];
    assert_eq!(body, r#"{"amount":1,"order":"A"}"#);
    let Some(Envelope::Sns(notification)) = envelope else { panic!("no SNS envelope: {envelope:?}") };
    assert_eq!(
        (notification.message_id.as_str(), notification.topic_arn.as_str()),
        ("sns-1", "arn:aws:sns:us-east-1:123456789012:orders")
    );
    assert_eq!(notification.message_attributes["tenant"].value, "t-9");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_returned_is_reported_as_it_returned_when_its_write_is_late() {
    let (handler, log) = demo();
    let store = HeldStore::finishing_late(Duration::from_millis(2500), 0);
    let options = EngineOptions {
        margins: Margins { deadline_margin: Duration::from_millis(300), ..Margins::default() },
        ..Default::default()
    };
    let engine = Setup { store: store.clone(), options, ..Setup::default() }.engine(handler);
    let records = vec![
        message("done", json!({})),
        message("permanent", json!({"fail": "permanent"})),
        message("slow", json!({"sleep_ms": 60_000})),
    ];
    let report = run(&engine, records, Duration::from_millis(1200)).await;
    // The handler succeeded: its completion is not confirmed yet, and it is a success all the same.
    assert_eq!(outcome(&report, "done"), &Outcome::Processed { confirmed: false });
    assert!(matches!(outcome(&report, "permanent"), Outcome::Failed(Failure::Permanent(_))));
    assert_eq!(outcome(&report, "slow"), &Outcome::Failed(Failure::Deadline));
    assert_eq!(failures(&report), ["permanent", "slow"]);
    // Cut off, it reports the time it had: the batch's, up to its cut-off (900 ms), not 0.
    let slow = report.records.iter().find(|record| record.message_id == "slow").unwrap();
    assert!(slow.duration >= Duration::from_millis(800), "{:?}", slow.duration);
    let runs = log.runs();
    assert_eq!(runs.len(), 3, "every handler started once: {runs:?}");

    // The writes of the handlers that returned go on after the answer and land; the cut-off run's claim
    // keeps its lease.
    let status = |id: &'static str| {
        let store = store.clone();
        async move { store.inner.get(id).await.unwrap().map(|claim| claim.status) }
    };
    let landed = async {
        while status("test#done").await != Some(ClaimStatus::Completed)
            || status("test#permanent").await != Some(ClaimStatus::Failed)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), landed).await.expect("the writes after the answer landed");
    assert_eq!(status("test#slow").await, Some(ClaimStatus::InProgress));
}

/// Panics before it hands out its future, for one message.
struct PanicsWhileBuilding;

impl Handler for PanicsWhileBuilding {
    #[allow(clippy::manual_async_fn)]
    fn handle(&self, record: &Record) -> impl Future<Output = HandlerResult> + Send {
        assert_ne!(record.message_id, "bad", "no future for this one");
        async { Ok(None) }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_building_its_future_fails_its_record_and_releases_its_claim() {
    let store: Arc<dyn ClaimStore> = Arc::new(MemoryStore::default());
    let engine = Setup { store: store.clone(), ..Setup::default() }.engine(PanicsWhileBuilding);
    let report =
        run(&engine, vec![message("good", json!({})), message("bad", json!({}))], Duration::from_secs(30)).await;
    assert_eq!(failures(&report), ["bad"]);
    assert!(
        matches!(outcome(&report, "bad"), Outcome::Failed(Failure::Panicked(reason)) if reason.contains("no future"))
    );
    assert_eq!(store.get("test#bad").await.unwrap(), None, "claim released, so a redelivery runs");
    assert_eq!(store.get("test#good").await.unwrap().map(|claim| claim.status), Some(ClaimStatus::Completed));
}

/// Blocks its thread (no await) past the answer's cut-off, then succeeds,
/// fails or panics as the body's `fail` says.
struct BlocksThroughTheCutoff(Duration);

impl Handler for BlocksThroughTheCutoff {
    async fn handle(&self, record: &Record) -> HandlerResult {
        // In place, so that the worker hands its queue on to another thread
        // while it blocks: a task it woke or spawned just before waits in
        // the worker's LIFO slot, which no other worker steals, and would
        // start only after the block, past the cut-off (seen on a loaded
        // machine: a record never claimed, reported `deadline`).
        tokio::task::block_in_place(|| std::thread::sleep(self.0));
        match record.body_json::<Value>()?["fail"].as_str() {
            Some("retryable") => Err(sqs_once_core::HandlerError::retryable("asked to fail")),
            Some("permanent") => Err(sqs_once_core::HandlerError::permanent("asked to fail")),
            Some(_) => panic!("asked to panic"),
            None => Ok(None),
        }
    }
}

// Six workers: four blocked by the handlers at once, and the timers still driven.
#[tokio::test(flavor = "multi_thread", worker_threads = 6)]
async fn a_handler_returning_while_the_answer_is_cut_off_keeps_its_outcome() {
    // The cut-off comes at 1.2 s, while the handlers are still in their poll; they return at 1.25 s.
    // Reported `deadline`, a success would come back and run again although its side effect happened,
    // and a permanent failure would be tried again.
    let store = Arc::new(MemoryStore::default());
    let options = EngineOptions {
        margins: Margins { deadline_margin: Duration::from_millis(800), ..Margins::default() },
        concurrency: 4,
        ..Default::default()
    };
    let engine = Setup { store: store.clone(), options, ..Setup::default() }
        .engine(BlocksThroughTheCutoff(Duration::from_millis(1250)));
    let records = vec![
        message("busy", json!({})),
        message("retry", json!({"fail": "retryable"})),
        message("perm", json!({"fail": "permanent"})),
        message("boom", json!({"fail": "panic"})),
    ];
    let report = run(&engine, records, Duration::from_millis(2000)).await;
    assert_eq!(outcome(&report, "busy"), &Outcome::Processed { confirmed: true }, "{report:?}");
    assert!(matches!(outcome(&report, "retry"), Outcome::Failed(Failure::Retryable(_))), "{report:?}");
    assert!(matches!(outcome(&report, "perm"), Outcome::Failed(Failure::Permanent(_))), "{report:?}");
    assert!(matches!(outcome(&report, "boom"), Outcome::Failed(Failure::Panicked(_))), "{report:?}");
    // And the store says the same: completed, released, failed, released.
    let status = async |id: &str| store.get(&format!("test#{id}")).await.unwrap().map(|claim| claim.status);
    assert_eq!(status("busy").await, Some(ClaimStatus::Completed));
    assert_eq!((status("retry").await, status("boom").await), (None, None));
    assert_eq!(status("perm").await, Some(ClaimStatus::Failed));
}

// Three workers: one blocked by the handler, the timers still driven.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_handler_deaf_to_its_cancellation_fails_deadline_and_the_answer_does_not_wait_for_it() {
    // The handler blocks its thread past the deadline (2 s), so the cut-off's cancellation never reaches it. The
    // batch answers all the same, the record a `deadline` failure: it comes back, and the success it returns later
    // is not reported.
    let store = Arc::new(MemoryStore::default());
    let options = EngineOptions {
        margins: Margins { deadline_margin: Duration::from_millis(800), ..Margins::default() },
        ..Default::default()
    };
    let engine = Setup { store: store.clone(), options, ..Setup::default() }
        .engine(BlocksThroughTheCutoff(Duration::from_millis(3000)));
    let report = run(&engine, vec![message("deaf", json!({}))], Duration::from_millis(2000)).await;
    assert_eq!(outcome(&report, "deaf"), &Outcome::Failed(Failure::Deadline), "{report:?}");
    assert_eq!(
        store.get("test#deaf").await.unwrap().map(|claim| claim.status),
        Some(ClaimStatus::InProgress),
        "answered while the handler still ran: its claim keeps its lease"
    );
}

/// How many things are under way at once, and the most there ever were.
#[derive(Default)]
struct UnderWay(Mutex<(usize, usize)>);

impl UnderWay {
    async fn during<T>(&self, work: impl std::future::Future<Output = T>) -> T {
        {
            let mut counts = self.0.lock().unwrap();
            counts.0 += 1;
            counts.1 = counts.1.max(counts.0);
        }
        let output = work.await;
        self.0.lock().unwrap().0 -= 1;
        output
    }

    fn most(&self) -> usize {
        self.0.lock().unwrap().1
    }
}

/// The memory store with its requests held: every request `every` late, and
/// finishing writes (completion, failure record, release) `finishing` more,
/// the first `failing` of those failing after they applied nothing, as a
/// store that is down does. It counts the requests under way at once.
#[derive(Default)]
struct HeldStore {
    inner: MemoryStore,
    every: Duration,
    finishing: Duration,
    failing: std::sync::atomic::AtomicU32,
    under_way: UnderWay,
    /// Releases asked for.
    releases: std::sync::atomic::AtomicU32,
    /// Answers [`ClaimStore::gathers_calls`] with this.
    gathering: bool,
}

impl HeldStore {
    fn finishing_late(finishing: Duration, failing: u32) -> Arc<Self> {
        Arc::new(Self { finishing, failing: failing.into(), ..Self::default() })
    }

    async fn request<T>(
        &self,
        finishing: bool,
        request: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.under_way
            .during(async {
                tokio::time::sleep(if finishing { self.every + self.finishing } else { self.every }).await;
                let failing = finishing
                    && self
                        .failing
                        .fetch_update(
                            std::sync::atomic::Ordering::SeqCst,
                            std::sync::atomic::Ordering::SeqCst,
                            |left| left.checked_sub(1),
                        )
                        .is_ok();
                if failing { Err(StoreError::unavailable("injected: connection reset")) } else { request.await }
            })
            .await
    }

    async fn status(&self, id: &str) -> Option<ClaimStatus> {
        self.inner.get(id).await.unwrap().map(|claim| claim.status)
    }
}

#[async_trait::async_trait]
impl ClaimStore for HeldStore {
    async fn put_if_free(&self, claim: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        self.request(false, self.inner.put_if_free(claim, now_ms)).await
    }
    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        self.request(false, self.inner.get(id)).await
    }
    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        self.request(true, self.inner.finish(id, token, finish)).await
    }
    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        self.releases.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.request(true, self.inner.release(id, token)).await
    }
    fn gathers_calls(&self) -> bool {
        self.gathering
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finishing_writes_that_can_land_before_the_deadline_are_waited_for() {
    // Deadline 2 s, cut-off at 1.2 s. Twenty handlers return at about 1 s; their completions take 250 ms,
    // so they land after the cut-off and well before the answer reserve. A slow handler is cancelled at
    // the cut-off, and cancelling it must not cancel the others' writes.
    let (handler, log) = demo();
    let store = HeldStore::finishing_late(Duration::from_millis(250), 0);
    let options = EngineOptions {
        margins: Margins { deadline_margin: Duration::from_millis(800), ..Margins::default() },
        ..Default::default()
    };
    let engine = Setup { store: store.clone(), options, ..Setup::default() }.engine(handler);
    let mut records: Vec<Value> = (0..20).map(|n| message(&format!("m-{n}"), json!({"sleep_ms": 1000}))).collect();
    records.push(message("slow", json!({"sleep_ms": 60_000})));
    let report = run(&engine, records, Duration::from_millis(2000)).await;
    assert_eq!(failures(&report), ["slow"]);
    for n in 0..20 {
        let id = format!("m-{n}");
        assert_eq!(outcome(&report, &id), &Outcome::Processed { confirmed: true }, "{id}");
        // Confirmed before the answer: nothing is left to land after it.
        assert_eq!(store.status(&format!("test#{id}")).await, Some(ClaimStatus::Completed), "{id}");
    }
    assert_eq!(outcome(&report, "slow"), &Outcome::Failed(Failure::Deadline));
    assert_eq!(store.status("test#slow").await, Some(ClaimStatus::InProgress), "the cut-off run keeps its lease");
    assert_eq!(log.runs().len(), 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_failed_is_sent_again_with_the_next_batch_and_lands() {
    let (handler, _) = demo();
    // Every finishing write fails once (as if cut off by a freeze past the SDK's timeouts), then works.
    let store = HeldStore::finishing_late(Duration::ZERO, 2);
    let engine = Setup { store: store.clone(), ..Setup::default() }.engine(handler);
    let first =
        run(&engine, vec![message("done", json!({})), message("retry", json!({"fail": "retryable"}))], SECS_30).await;
    assert_eq!(outcome(&first, "done"), &Outcome::Processed { confirmed: false }, "a success all the same");
    assert_eq!(failures(&first), ["retry"]);
    assert_eq!(store.status("test#done").await, Some(ClaimStatus::InProgress));
    assert_eq!(store.status("test#retry").await, Some(ClaimStatus::InProgress), "the release failed too");

    let next = run(&engine, vec![message("other", json!({}))], SECS_30).await;
    assert!(failures(&next).is_empty());
    assert_eq!(store.status("test#done").await, Some(ClaimStatus::Completed), "the completion landed");
    assert_eq!(store.status("test#retry").await, None, "the release landed: a redelivery runs again");
    let landed = engine.claims().counters().landed_later.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(landed, 2);
    // Landed writes are forgotten: the batch after sends nothing again.
    run(&engine, vec![message("third", json!({}))], SECS_30).await;
    assert_eq!(engine.claims().counters().landed_later.load(std::sync::atomic::Ordering::SeqCst), 2);
}

const SECS_30: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_still_unconfirmed_as_the_process_leaves_is_landed_first() {
    let (handler, _) = demo();
    let store = HeldStore::finishing_late(Duration::ZERO, 1);
    let engine = Setup { store: store.clone(), ..Setup::default() }.engine(handler);
    run(&engine, vec![message("done", json!({}))], SECS_30).await;
    assert_eq!(store.status("test#done").await, Some(ClaimStatus::InProgress));
    let left = engine.leave(tokio::time::Instant::now() + Duration::from_secs(5)).await;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(store.status("test#done").await, Some(ClaimStatus::Completed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_record_answered_at_the_deadline_from_another_group_keeps_its_groups_order() {
    // Group 1 is a slow record, then key B; group 2 runs key B at once. At the deadline key B has
    // succeeded, but group 1's second record comes after a failure of its group: it must fail too.
    let (handler, _) = demo();
    let options = EngineOptions {
        margins: Margins { deadline_margin: Duration::from_millis(300), ..Margins::default() },
        ..Default::default()
    };
    let engine = Setup { key: "body.k", options, ..Setup::default() }.engine(handler);
    let records = vec![
        fifo("g1-slow", "g1", json!({"k": "A", "sleep_ms": 60_000})),
        fifo("g1-b", "g1", json!({"k": "B"})),
        fifo("g2-b", "g2", json!({"k": "B"})),
    ];
    let report = run(&engine, records, Duration::from_millis(1000)).await;
    assert_eq!(outcome(&report, "g2-b"), &Outcome::Processed { confirmed: true });
    assert_eq!(outcome(&report, "g1-slow"), &Outcome::Failed(Failure::Deadline));
    assert_eq!(outcome(&report, "g1-b"), &Outcome::Failed(Failure::GroupSkipped("g1-slow".into())));
    assert_eq!(failures(&report), ["g1-slow", "g1-b"]);
}

/// Waits at a barrier before succeeding, unless asked to fail: the barrier
/// opens only when every waiting record runs at the same time.
struct Together(tokio::sync::Barrier);

impl Handler for Together {
    async fn handle(&self, record: &Record) -> HandlerResult {
        if record.body.contains("fail") {
            return Err(sqs_once_core::HandlerError::retryable("asked to fail"));
        }
        self.0.wait().await;
        Ok(None)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_queue_tenants_records_run_concurrently_and_fail_alone() {
    // A standard queue whose messages carry a MessageGroupId: tenant T's first record fails, its five
    // others must still run, all at once (the barrier opens only then), and tenant U's is untouched.
    let tenant = |id: &str, group: &str, body: Value| {
        let mut record = message(id, body);
        record["attributes"]["MessageGroupId"] = json!(group);
        record
    };
    let mut records = vec![tenant("t-0", "T", json!({"fail": true}))];
    records.extend((1..6).map(|n| tenant(&format!("t-{n}"), "T", json!({"n": n}))));
    records.push(tenant("u-0", "U", json!({"fail": false, "n": 0})));
    let engine = Setup::default().engine(Together(tokio::sync::Barrier::new(5)));
    // u-0's body mentions "fail" too, on purpose: it fails on its own, T's records are unaffected by it.
    let report = run(&engine, records, Duration::from_secs(10)).await;
    assert_eq!(failures(&report), ["t-0", "u-0"]);
    for n in 1..6 {
        assert_eq!(outcome(&report, &format!("t-{n}")), &Outcome::Processed { confirmed: true });
    }
}

/// Fails permanently with a reason of a mebibyte.
struct HugeReason;

impl Handler for HugeReason {
    async fn handle(&self, _record: &Record) -> HandlerResult {
        Err(sqs_once_core::HandlerError::permanent("x".repeat(1 << 20)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mebibyte_error_text_is_capped_where_it_is_stored_and_reported() {
    let store: Arc<dyn ClaimStore> = Arc::new(MemoryStore::default());
    let engine = Setup { store: store.clone(), ..Setup::default() }.engine(HugeReason);
    let report = run(&engine, vec![message("huge", json!({}))], SECS_30).await;
    let Outcome::Failed(Failure::Permanent(reason)) = outcome(&report, "huge") else { panic!("{report:?}") };
    assert!(
        reason.len() <= crate::report::reason::MAX_BYTES && reason.ends_with("more bytes cut]"),
        "{}",
        reason.len()
    );
    let stored = store.get("test#huge").await.unwrap().unwrap();
    assert_eq!(stored.status, ClaimStatus::Failed);
    assert_eq!(stored.error.as_deref(), Some(reason.as_str()));
}

/// While it runs, another holder takes its claim over (as after the lease
/// ended), through the store's own claim write; then it does what the body
/// says (the demo's `fail` directive, or success).
struct TakenOverWhileRunning(Arc<MemoryStore>);

impl Handler for TakenOverWhileRunning {
    async fn handle(&self, record: &Record) -> HandlerResult {
        let mut claim = self.0.get(&record.key).await.unwrap().expect("our claim");
        claim.token = Some("the-new-holder".into());
        claim.holder = Some("another-process".into());
        let after_the_lease = claim.lease_until_ms.unwrap() + 1;
        assert_eq!(self.0.put_if_free(&claim, after_the_lease).await.unwrap(), PutOutcome::Claimed);
        match record.body_json::<Value>()?["fail"].as_str() {
            Some("permanent") => Err(sqs_once_core::HandlerError::permanent("asked to fail")),
            Some(_) => Err(sqs_once_core::HandlerError::retryable("asked to fail")),
            None => Ok(None),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finishing_write_refused_after_a_takeover_keeps_the_outcome_and_the_new_holders_claim() {
    let store = Arc::new(MemoryStore::default());
    let engine = Setup { store: store.clone(), ..Setup::default() }.engine(TakenOverWhileRunning(store.clone()));
    let records = vec![
        message("done", json!({})),
        message("perm", json!({"fail": "permanent"})),
        message("retry", json!({"fail": "retryable"})),
    ];
    let report = run(&engine, records, SECS_30).await;
    // A handler that returned success is never reported failed, even when its completion is refused.
    assert_eq!(failures(&report), ["perm", "retry"]);
    assert_eq!(outcome(&report, "done"), &Outcome::Processed { confirmed: false });
    assert!(matches!(outcome(&report, "perm"), Outcome::Failed(Failure::Permanent(_))));
    for id in ["done", "perm", "retry"] {
        let claim = store.get(&format!("test#{id}")).await.unwrap().expect("not deleted by the old holder");
        assert_eq!((claim.status, claim.token.as_deref()), (ClaimStatus::InProgress, Some("the-new-holder")), "{id}");
    }
    // The refusals are counted, as the LeaseTakeoversRefused metric reports them, and not sent again.
    assert_eq!(engine.claims().counters().refused.load(std::sync::atomic::Ordering::SeqCst), 3);
    let left = engine.leave(tokio::time::Instant::now() + Duration::from_secs(1)).await;
    assert!(left.is_empty(), "a refused write is an answer, not a write to send again: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_groups_run_concurrently_and_a_fifo_arn_alone_makes_a_group() {
    // Three groups whose first records meet at a barrier: it opens only if the groups run at the same time.
    let records = vec![fifo("a-0", "A", json!({})), fifo("b-0", "B", json!({})), fifo("c-0", "C", json!({}))];
    let engine = Setup::default().engine(Together(tokio::sync::Barrier::new(3)));
    assert!(failures(&run(&engine, records, Duration::from_secs(10)).await).is_empty());

    // Records of a `.fifo` queue without a MessageGroupId keep their order as one group.
    let ungrouped = |id: &str, body: Value| {
        let mut record = fifo(id, "-", body);
        record["attributes"].as_object_mut().unwrap().remove("MessageGroupId");
        record
    };
    let (handler, _) = demo();
    let engine = Setup::default().engine(handler);
    let records = vec![ungrouped("first", json!({"fail": "retryable"})), ungrouped("second", json!({}))];
    let report = run(&engine, records, SECS_30).await;
    assert_eq!(failures(&report), ["first", "second"]);
    assert!(matches!(outcome(&report, "second"), Outcome::Failed(Failure::GroupSkipped(_))));
}

/// The most store calls under way at once for 30 records at concurrency 3.
async fn most_calls_under_way(gathering: bool) -> usize {
    let store = Arc::new(HeldStore { every: Duration::from_millis(10), gathering, ..HeldStore::default() });
    let options = EngineOptions { concurrency: 3, ..EngineOptions::default() };
    let (handler, _) = demo();
    let engine = Setup { store: store.clone(), options, ..Setup::default() }.engine(handler);
    let records = (0..30).map(|n| message(&format!("m{n}"), json!({}))).collect();
    let report = run(&engine, records, SECS_30).await;
    assert!(failures(&report).is_empty());
    store.under_way.most()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_run_ahead_of_the_handlers_within_three_times_the_bound_when_the_store_gathers_calls() {
    // Six records admitted for three handler slots: three claims travel while the finishing writes of the
    // six before them do, three of those on finishing permits and three on their runs' admissions.
    assert_eq!(most_calls_under_way(true).await, 9, "claims travel ahead of the handlers and beside the writes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_won_that_finds_no_handler_slot_before_the_cut_off_is_released() {
    // One handler slot, two records admitted (`a` and `b`, the first two): whichever claims first holds
    // the slot past the cut-off while the other has won its claim and waits; `c` is never admitted. All
    // three fail at the deadline, and a redelivery of the waiting one must not wait for a lease its
    // handler never used.
    let (handler, log) = demo();
    let store = Arc::new(HeldStore { gathering: true, ..HeldStore::default() });
    let options = EngineOptions {
        concurrency: 1,
        margins: Margins { deadline_margin: Duration::from_millis(300), ..Margins::default() },
        ..Default::default()
    };
    let engine = Setup { store: store.clone(), options, ..Setup::default() }.engine(handler);
    let records = ["a", "b", "c"].map(|id| message(id, json!({"sleep_ms": 60_000}))).to_vec();
    let report = run(&engine, records, Duration::from_millis(1000)).await;
    assert_eq!(failures(&report), ["a", "b", "c"]);
    assert!(report.records.iter().all(|r| r.outcome == Outcome::Failed(Failure::Deadline)), "{report:?}");
    let ran = log.runs();
    assert_eq!(ran.len(), 1, "one slot: {ran:?}");
    let (ran, waited) = if ran[0].1 == "a" { ("a", "b") } else { ("b", "a") };
    assert_eq!(store.releases.load(std::sync::atomic::Ordering::SeqCst), 1, "the waiting claim, and only it");
    assert_eq!(store.status(&format!("test#{waited}")).await, None, "released: a redelivery claims it at once");
    assert_eq!(
        store.status(&format!("test#{ran}")).await,
        Some(ClaimStatus::InProgress),
        "the cut-off run keeps its lease"
    );
    assert_eq!(store.status("test#c").await, None, "never claimed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_sending_each_call_alone_gets_no_more_than_the_concurrency_bound() {
    assert_eq!(most_calls_under_way(false).await, 3, "a finishing write keeps its run's permit");
}

mod payloads;
mod sweep;
mod unclaimed;

/// Every span the engine opens, as a subscriber sees it: name, fields and
/// parent (see [`crate::spans`]).
mod spans {
    use std::sync::{Arc, Mutex};

    use tracing::{
        Subscriber,
        field::{Field, Visit},
        span::{Attributes, Id, Record as Values},
    };
    use tracing_subscriber::{Layer, layer::Context, prelude::*, registry::LookupSpan};

    #[derive(Debug, Clone)]
    pub(super) struct Span {
        pub(super) id: u64,
        pub(super) name: &'static str,
        pub(super) parent: Option<u64>,
        pub(super) fields: Vec<(String, String)>,
    }

    impl Span {
        pub(super) fn field(&self, name: &str) -> Option<&str> {
            self.fields.iter().rev().find(|(field, _)| field == name).map(|(_, value)| value.as_str())
        }
    }

    struct Fields<'a>(&'a mut Vec<(String, String)>);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push((field.name().to_owned(), format!("{value:?}")));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.push((field.name().to_owned(), value.to_owned()));
        }
    }

    #[derive(Clone, Default)]
    pub(super) struct Capture(Arc<Mutex<Vec<Span>>>);

    impl Capture {
        pub(super) fn spans(&self) -> Vec<Span> {
            self.0.lock().unwrap().clone()
        }

        /// Captures every span opened on this thread until the guard drops.
        pub(super) fn install(&self) -> tracing::subscriber::DefaultGuard {
            tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
        }
    }

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            let parent = match attrs.parent() {
                Some(parent) => Some(parent.into_u64()),
                None if attrs.is_contextual() => ctx.current_span().id().map(Id::into_u64),
                None => None,
            };
            let mut fields = Vec::new();
            attrs.record(&mut Fields(&mut fields));
            let span = Span { id: id.into_u64(), name: attrs.metadata().name(), parent, fields };
            self.0.lock().unwrap().push(span);
        }

        fn on_record(&self, id: &Id, values: &Values<'_>, _: Context<'_, S>) {
            let mut spans = self.0.lock().unwrap();
            if let Some(span) = spans.iter_mut().rev().find(|span| span.id == id.into_u64()) {
                values.record(&mut Fields(&mut span.fields));
            }
        }
    }
}

/// The demo handler inside a span of its own, as a handler that traces its
/// work would be.
struct Traced(Directed);

impl Handler for Traced {
    async fn handle(&self, record: &Record) -> HandlerResult {
        use tracing::Instrument;
        self.0.handle(record).instrument(tracing::info_span!("charge")).await
    }
}

rusty_fork_test! {
    // Each span test runs in a process of its own: tracing-core keeps each callsite's interest and the highest
    // level enabled process-wide, and while another test thread adds or drops a subscriber a `DEBUG` span opened
    // here can find itself disabled (runs of the engine's tests saw no `claim`, `handler` or finishing span, or
    // some of them only, the INFO `charge` spans captured).
    #[test]
    fn each_record_is_a_process_span_linked_to_its_producer_with_its_claim_handler_and_write() {
        in_runtime(traced_batch());
    }

    #[test]
    fn records_that_share_a_key_share_one_run_under_the_first_records_span() {
        in_runtime(shared_key_batch());
    }
}

/// Runs a test's body on a runtime of one thread, as `#[tokio::test]` does.
fn in_runtime(body: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime").block_on(body);
}

/// The batch of [`each_record_is_a_process_span_linked_to_its_producer_with_its_claim_handler_and_write`].
async fn traced_batch() {
    let capture = spans::Capture::default();
    let _guard = capture.install();
    let options = EngineOptions {
        margins: Margins { deadline_margin: Duration::from_millis(300), ..Margins::default() },
        ..Default::default()
    };
    let store: Arc<dyn ClaimStore> = Arc::new(MemoryStore::default());
    let engine = Setup { store: store.clone(), options, ..Setup::default() }.engine(Traced(Directed::default()));
    let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let mut done = message("done", json!({}));
    done["attributes"]["AWSTraceHeader"] = json!(xray);
    let mut retryable = message("retryable", json!({"fail": "retryable"}));
    retryable["messageAttributes"]["traceparent"] = json!({"stringValue": traceparent, "dataType": "String"});
    let records = vec![
        done.clone(),
        retryable,
        message("permanent", json!({"fail": "permanent"})),
        message("slow", json!({"sleep_ms": 60_000})),
    ];
    let report = run(&engine, records, Duration::from_millis(1200)).await;
    assert_eq!(failures(&report), ["retryable", "permanent", "slow"]);

    let spans = capture.spans();
    let named = |name: &str| spans.iter().filter(|span| span.name == name).cloned().collect::<Vec<_>>();
    let children = |parent: &spans::Span, name: &str| {
        spans.iter().filter(|span| span.parent == Some(parent.id) && span.name == name).cloned().collect::<Vec<_>>()
    };
    let process = named("process");
    let [batch] = &process.iter().filter(|span| span.parent.is_none()).cloned().collect::<Vec<_>>()[..] else {
        panic!("one batch span: {process:#?}");
    };
    assert_eq!(batch.field("messaging.batch.message_count"), Some("4"));
    let records = children(batch, "process");
    let record = |id: &str| records.iter().find(|span| span.field("messaging.message.id") == Some(id)).unwrap();
    assert_eq!(records.len(), 4, "{records:#?}");
    for span in &records {
        assert_eq!(span.field("messaging.system"), Some("aws_sqs"));
        assert_eq!(span.field("messaging.operation.type"), Some("process"));
        assert_eq!(span.field("messaging.destination.name"), Some("work"));
        let hash = span.field("sqs_once.key_hash").unwrap();
        assert!(hash.len() == 16 && !hash.contains("test"), "a hash, never the key: {hash}");
        assert_eq!(children(span, "claim").len(), 1, "{span:#?}");
        let handler = children(span, "handler");
        assert_eq!(handler.len(), 1);
        assert_eq!(children(&handler[0], "charge").len(), 1, "the handler's own span nests under `handler`");
    }
    // Linked to the producer's context: the X-Ray header converted, the traceparent as it came.
    assert_eq!(
        record("done").field("sqs_once.producer_context"),
        Some("00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01")
    );
    assert_eq!(record("retryable").field("sqs_once.producer_context"), Some(traceparent));
    assert_eq!(record("permanent").field("sqs_once.producer_context"), None);
    let outcome_of = |id: &str| (record(id).field("sqs_once.outcome"), record(id).field("error.type"));
    assert_eq!(outcome_of("done"), (Some("processed"), None));
    // The outcome as the record's log line labels it; a failure's label is also its `error.type`.
    assert_eq!(outcome_of("retryable"), (Some("retryable"), Some("retryable")));
    assert_eq!(outcome_of("permanent"), (Some("permanent"), Some("permanent")));
    assert_eq!(outcome_of("slow"), (Some("deadline"), Some("deadline")));
    let writes = |id: &str| {
        children(record(id), "finish")
            .iter()
            .map(|span| span.field("sqs_once.write").unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(writes("done"), ["complete"]);
    assert_eq!(writes("retryable"), ["release"]);
    assert_eq!(writes("permanent"), ["fail"]);
    assert_eq!(writes("slow"), Vec::<String>::new(), "cancelled at the cut-off: no write");

    // Delivered again after it succeeded: a duplicate, whose run ends at its claim.
    let before = capture.spans().len();
    let report = run(&engine, vec![done], Duration::from_secs(5)).await;
    assert_eq!(report.records[0].outcome, Outcome::Duplicate);
    let spans = capture.spans()[before..].to_vec();
    let record = spans.iter().find(|span| span.field("messaging.message.id") == Some("done")).unwrap();
    assert_eq!(record.field("sqs_once.outcome"), Some("duplicate"));
    assert_eq!(
        record.field("sqs_once.key_hash"),
        records.iter().find(|s| s.field("messaging.message.id") == Some("done")).unwrap().field("sqs_once.key_hash")
    );
    let under = |name: &str| spans.iter().filter(|span| span.parent == Some(record.id) && span.name == name).count();
    assert_eq!((under("claim"), under("handler"), under("finish")), (1, 0, 0));
}

/// The batch of [`records_that_share_a_key_share_one_run_under_the_first_records_span`].
async fn shared_key_batch() {
    let capture = spans::Capture::default();
    let _guard = capture.install();
    let engine = Setup::default().engine(Traced(Directed::default()));
    let copy = message("m1", json!({}));
    let report = run(&engine, vec![copy.clone(), copy], Duration::from_secs(5)).await;
    assert!(failures(&report).is_empty());
    let spans = capture.spans();
    let records: Vec<_> = spans.iter().filter(|span| span.name == "process" && span.parent.is_some()).collect();
    assert_eq!(records.len(), 2, "{spans:#?}");
    let under = |record: &spans::Span| {
        let count = |name| spans.iter().filter(|span| span.parent == Some(record.id) && span.name == name).count();
        (count("claim"), count("handler"), count("finish"))
    };
    assert_eq!(under(records[0]), (1, 1, 1));
    assert_eq!(under(records[1]), (0, 0, 0));
    assert_eq!(records[0].field("sqs_once.key_hash"), records[1].field("sqs_once.key_hash"));
    assert_eq!(records[1].field("sqs_once.outcome"), Some("duplicate"));
}
