//! The outbox beside batches, in paused time: a slow destination's backlog
//! adds at most a moment to a batch's answer, none of its sends is in flight when the
//! answer goes out (Lambda would freeze it there), batches leave it to the
//! schedule's sweep until it answers quickly or a while has passed, a sweep
//! is not started again by every batch, and a process that is never frozen
//! sweeps on its timer alone.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use tokio::time::Instant;

use super::*;
use crate::{
    clocks::PausedClock,
    outbox::{AVOIDED_FOR, CUT_GRACE, OutboxTimes},
};
use sqs_once_core::{
    destinations::{Destinations, SendError},
    store::{Capabilities, Commit, CommitStore, Committed},
    transaction::Message,
};

const QUEUE: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/notices";
const SWEEP_EVERY: Duration = Duration::from_secs(60);
const SEND_TIME: Duration = Duration::from_secs(2);

/// A destination that is down (refusing at once) or answers each send
/// after `SEND_TIME` (at once when `quick`), counting sends under way.
#[derive(Default)]
struct SlowDestination {
    down: AtomicBool,
    quick: AtomicBool,
    in_flight: AtomicUsize,
    started: AtomicUsize,
    sent: AtomicUsize,
}

#[async_trait]
impl Destinations for SlowDestination {
    async fn send(&self, _outbox_id: &str, _message: &Message) -> Result<(), SendError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(SendError::failed("down"));
        }
        let _under_way = InFlight::counted(&self.in_flight);
        self.started.fetch_add(1, Ordering::SeqCst);
        if !self.quick.load(Ordering::SeqCst) {
            tokio::time::sleep(SEND_TIME).await;
        }
        self.sent.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A send under way, counted until it ends or is dropped (cut off).
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn counted(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Stages two messages for a body `{"notices": true}`, nothing otherwise;
/// works `{"work_ms": n}` first.
struct Notices;

impl Handler for Notices {
    async fn handle(&self, record: &Record) -> HandlerResult {
        let body: Value = serde_json::from_str(&record.body).unwrap_or_default();
        if let Some(ms) = body["work_ms"].as_u64() {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if body["notices"] == json!(true) {
            for n in 0..2 {
                record.transaction().send(Message::sqs(QUEUE, format!("{}-{n}", record.message_id)))?;
            }
        }
        Ok(None)
    }
}

struct Consumer {
    engine: Engine,
    clock: Arc<PausedClock>,
    destination: Arc<SlowDestination>,
    store: Arc<MemoryStore>,
}

/// The memory store, each commit answered `late` after it applied.
struct LateCommits {
    inner: Arc<MemoryStore>,
    late: Duration,
}

#[async_trait]
impl ClaimStore for LateCommits {
    async fn put_if_free(&self, claim: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        self.inner.put_if_free(claim, now_ms).await
    }
    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        self.inner.get(id).await
    }
    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        self.inner.finish(id, token, finish).await
    }
    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        self.inner.release(id, token).await
    }
    fn capabilities(self: Arc<Self>) -> Capabilities {
        let inner = Arc::clone(&self.inner).capabilities();
        Capabilities { commits: Some(self), ..inner }
    }
}

#[async_trait]
impl CommitStore for LateCommits {
    async fn commit(&self, id: &str, token: &str, commit: &Commit) -> Result<Committed, StoreError> {
        let commits = Arc::clone(&self.inner).capabilities().commits.unwrap();
        let committed = commits.commit(id, token, commit).await;
        tokio::time::sleep(self.late).await;
        committed
    }
}

impl Consumer {
    fn new() -> Self {
        Self::committing_late(None)
    }

    /// A consumer whose store answers each commit `late` after it applied, if given.
    fn committing_late(late: Option<Duration>) -> Self {
        let (clock, destination) = (Arc::new(PausedClock::starting_now()), Arc::default());
        let store: Arc<MemoryStore> = Arc::default();
        let claims: Arc<dyn ClaimStore> = match late {
            Some(late) => Arc::new(LateCommits { inner: Arc::clone(&store), late }),
            None => Arc::clone(&store) as _,
        };
        let keys = Keys::new("messageId", "test").unwrap();
        let destinations = Arc::clone(&destination) as Arc<dyn Destinations>;
        let engine = Engine::builder(claims, keys)
            .clock(Arc::clone(&clock) as Arc<dyn Clock>)
            .outbox(destinations, OutboxTimes::both(SEND_TIME), Some(SWEEP_EVERY))
            .build(BoxHandler::new(Notices));
        Self { engine, clock, destination, store }
    }

    /// Processes `records` in an invocation due `timeout` from now; the
    /// report, how long the answer took, and the sends under way as it went out.
    async fn batch(&self, records: Vec<Value>, timeout: Duration) -> (BatchReport, Duration, usize) {
        let invocation = Invocation { deadline: self.clock.after(timeout), request_id: "r".into() };
        let event = parse_event(&json!({ "Records": records }).to_string()).unwrap();
        let started = Instant::now();
        let report = self.engine.process(&event, &invocation, None).await;
        (report, started.elapsed(), self.destination.in_flight.load(Ordering::SeqCst))
    }

    /// 64 committed runs of two messages each, left unsent (the destination
    /// was down) and due: their leases ended, a sweep is due, and batches
    /// no longer avoid the destination for having failed.
    async fn with_backlog(self) -> Self {
        self.destination.down.store(true, Ordering::SeqCst);
        let records = (0..64).map(|n| message(&format!("m-{n}"), json!({"notices": true}))).collect();
        let (report, ..) = self.batch(records, Duration::from_secs(10)).await;
        assert!(report.response().batch_item_failures.is_empty(), "committed: the sends failed after");
        assert_eq!(self.unsent().await, 128);
        self.destination.down.store(false, Ordering::SeqCst);
        tokio::time::sleep(AVOIDED_FOR.max(SWEEP_EVERY) + Duration::from_secs(1)).await;
        self
    }

    async fn unsent(&self) -> usize {
        let query = sqs_once_core::store::OutboxQuery { due_at_ms: None, limit: usize::MAX };
        let outbox = Arc::clone(&self.store).capabilities().outbox.unwrap();
        outbox.entries(&query).await.unwrap().len()
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_destinations_backlog_holds_a_batchs_answer_a_moment_at_most_and_the_schedules_sweep_sends_it() {
    let consumer = Consumer::new().with_backlog().await;
    // A batch that stages nothing, with ten seconds to answer: its sweep starts 16 runs at once, each send taking
    // 2 s. The batch's work is done in 100 ms, and it answers a moment later: the sends are cut, none in flight.
    let work = || json!({"work_ms": 100});
    let (report, took, in_flight) = consumer.batch(vec![message("quiet-1", work())], SECS_10).await;
    assert!(report.response().batch_item_failures.is_empty());
    assert_eq!(took, Duration::from_millis(100) + CUT_GRACE, "answered a moment after its own work was done");
    assert_eq!(in_flight, 0, "no send in flight when the answer goes out");
    assert_eq!(consumer.destination.sent.load(Ordering::SeqCst), 0);
    assert_eq!(consumer.destination.started.load(Ordering::SeqCst), 16, "one send of each of 16 runs, cut");
    // Later batches, each with a sweep due and the cut entries' leases ended, leave the slow destination alone.
    for n in 0..4 {
        tokio::time::sleep(SWEEP_EVERY).await;
        let (_, took, _) = consumer.batch(vec![message(&format!("later-{n}"), work())], SECS_10).await;
        assert_eq!(took, Duration::from_millis(100));
    }
    assert_eq!(consumer.destination.started.load(Ordering::SeqCst), 16, "no send started towards it");
    // The schedule's sweep, with its whole invocation to send in, sends every message, each once.
    let sent = consumer.engine.sweep_outbox(consumer.clock.after(Duration::from_secs(60))).await;
    assert_eq!(sent, 128);
    assert_eq!(consumer.unsent().await, 0);
    assert_eq!(consumer.destination.sent.load(Ordering::SeqCst), 128, "each sent once");
}

#[tokio::test(start_paused = true)]
async fn batches_sweep_towards_a_destination_again_once_it_answers_quickly_or_a_while_has_passed() {
    let consumer = Consumer::new().with_backlog().await;
    let work = || json!({"work_ms": 100});
    let (_, took, _) = consumer.batch(vec![message("cut", work())], SECS_10).await;
    assert_eq!((took, consumer.destination.sent.load(Ordering::SeqCst)), (Duration::from_millis(100) + CUT_GRACE, 0));
    // The destination is quick again, but no batch has heard from it: they leave it alone for five minutes, then
    // sweep towards it again and send the whole backlog, with no schedule.
    consumer.destination.quick.store(true, Ordering::SeqCst);
    let mut batches = 0;
    while consumer.unsent().await > 0 {
        tokio::time::sleep(SWEEP_EVERY).await;
        batches += 1;
        consumer.batch(vec![message(&format!("later-{batches}"), work())], SECS_10).await;
        assert!(batches < 10, "the backlog was not sent");
    }
    assert_eq!(batches, 5, "the first sweep towards it came five minutes after the cut");
    assert_eq!(consumer.destination.sent.load(Ordering::SeqCst), 128, "each sent once");
    // Slow, then quick at a run's own send: the next batch's sweep goes to it at once.
    consumer.destination.quick.store(false, Ordering::SeqCst);
    consumer.destination.down.store(true, Ordering::SeqCst);
    let notices = |id: &str| vec![message(id, json!({"notices": true}))];
    consumer.batch(notices("failed-1"), SECS_10).await;
    assert_eq!(consumer.unsent().await, 2, "the send failed: the destination is avoided");
    consumer.destination.down.store(false, Ordering::SeqCst);
    consumer.destination.quick.store(true, Ordering::SeqCst);
    tokio::time::sleep(SWEEP_EVERY).await;
    consumer.batch(notices("quick-1"), SECS_10).await;
    assert_eq!(consumer.unsent().await, 2, "the run's own went out quickly; its sweep, started first, avoided it");
    tokio::time::sleep(SWEEP_EVERY).await;
    consumer.batch(vec![message("swept", work())], SECS_10).await;
    assert_eq!(consumer.unsent().await, 0, "the failed run's messages, swept beside a batch at once");
}

const SECS_10: Duration = Duration::from_secs(10);

#[tokio::test(start_paused = true)]
async fn a_committed_runs_own_sends_end_before_its_answer_cut_off_when_slow() {
    let consumer = Consumer::new();
    // Three seconds to answer, 2.75 s to the answer's reserve: the send is cut to 1.75 s, its deletion's second
    // kept, and the destination takes 2 s. The send is cut before the answer, not frozen in flight.
    let notices = |id: &str| vec![message(id, json!({"notices": true}))];
    let (report, took, in_flight) = consumer.batch(notices("m-1"), Duration::from_secs(3)).await;
    assert!(report.response().batch_item_failures.is_empty(), "committed");
    assert_eq!((in_flight, consumer.destination.sent.load(Ordering::SeqCst)), (0, 0));
    assert!(took <= Duration::from_millis(2_750), "answered by its reserve: {took:?}");
    assert_eq!(consumer.unsent().await, 2, "left for a sweep");
    // With time enough, the run sends its messages itself.
    let (_, _, in_flight) = consumer.batch(notices("m-2"), SECS_10).await;
    assert_eq!((in_flight, consumer.destination.sent.load(Ordering::SeqCst)), (0, 2));
}

#[tokio::test(start_paused = true)]
async fn a_process_that_is_never_frozen_sweeps_on_its_timer_and_no_batch_waits_for_it() {
    let consumer = Consumer::new().with_backlog().await;
    let engine = consumer.engine.clone();
    tokio::spawn(async move { engine.tend(std::future::pending()).await });
    tokio::task::yield_now().await;
    let (_, took, _) = consumer.batch(vec![message("quiet-1", json!({}))], SECS_10).await;
    assert_eq!(took, Duration::ZERO, "the batch swept nothing, although a sweep was due");
    assert_eq!(consumer.destination.sent.load(Ordering::SeqCst), 0);
    // The timer's sweeps send the backlog.
    tokio::time::sleep(SWEEP_EVERY * 10).await;
    assert_eq!(consumer.unsent().await, 0);
    assert_eq!(consumer.destination.sent.load(Ordering::SeqCst), 128);
}

#[tokio::test(start_paused = true)]
async fn a_commit_answered_after_its_batch_sends_its_messages_in_the_next_batch() {
    let consumer = Consumer::committing_late(Some(Duration::from_secs(4)));
    consumer.destination.quick.store(true, Ordering::SeqCst);
    // Three seconds to answer; the commit applies at once and its answer comes 4 s later, after the batch answered.
    let notices = vec![message("late-1", json!({"notices": true}))];
    consumer.batch(notices, Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(consumer.unsent().await, 2, "committed, answered after the batch: nothing sent in its window");
    // The next batch, 5 s after the commit (its messages' lease has 10 s left, no sweep due), sends them.
    consumer.batch(vec![message("next", json!({}))], SECS_10).await;
    assert_eq!(consumer.destination.sent.load(Ordering::SeqCst), 2);
    assert_eq!(consumer.unsent().await, 0);
}
