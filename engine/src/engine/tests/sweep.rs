//! The outbox beside batches, in paused time: a slow destination holds no
//! batch's answer beyond the sends under way when its work is done, none is
//! in flight when the answer goes out (Lambda would freeze it there), a
//! sweep is not started again by every batch, and a process that is never
//! frozen sweeps on its timer alone.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use tokio::time::Instant;

use super::*;
use crate::{clocks::PausedClock, outbox::OutboxTimes};
use sqs_once_core::{
    destinations::{Destinations, SendError},
    transaction::Message,
};

const QUEUE: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/notices";
const SWEEP_EVERY: Duration = Duration::from_secs(60);
const SEND_TIME: Duration = Duration::from_secs(2);

/// A destination that is down (refusing at once) or answers each send
/// after `SEND_TIME`, counting sends under way.
#[derive(Default)]
struct SlowDestination {
    down: AtomicBool,
    in_flight: AtomicUsize,
    sent: AtomicUsize,
}

#[async_trait]
impl Destinations for SlowDestination {
    async fn send(&self, _outbox_id: &str, _message: &Message) -> Result<(), SendError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(SendError::failed("down"));
        }
        let _under_way = InFlight::counted(&self.in_flight);
        tokio::time::sleep(SEND_TIME).await;
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

impl Consumer {
    fn new() -> Self {
        let (clock, destination, store) = (Arc::new(PausedClock::starting_now()), Arc::default(), Arc::default());
        let keys = Keys::new("messageId", "test").unwrap();
        let destinations = Arc::clone(&destination) as Arc<dyn Destinations>;
        let engine = Engine::builder(Arc::clone(&store) as Arc<dyn ClaimStore>, keys)
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
    /// was down) and due: their leases ended, and a sweep is due.
    async fn with_backlog(self) -> Self {
        self.destination.down.store(true, Ordering::SeqCst);
        let records = (0..64).map(|n| message(&format!("m-{n}"), json!({"notices": true}))).collect();
        let (report, ..) = self.batch(records, Duration::from_secs(10)).await;
        assert!(report.response().batch_item_failures.is_empty(), "committed: the sends failed after");
        assert_eq!(self.unsent().await, 128);
        self.destination.down.store(false, Ordering::SeqCst);
        tokio::time::sleep(SWEEP_EVERY + Duration::from_secs(1)).await;
        self
    }

    async fn unsent(&self) -> usize {
        let query = sqs_once_core::store::OutboxQuery { due_at_ms: None, limit: usize::MAX };
        let outbox = Arc::clone(&self.store).capabilities().outbox.unwrap();
        outbox.entries(&query).await.unwrap().len()
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_destination_holds_a_batch_for_the_sends_under_way_alone_and_none_is_in_flight_at_the_answer() {
    let consumer = Consumer::new().with_backlog().await;
    // A batch that stages nothing, with ten seconds to answer: its sweep starts 16 runs at once, each first
    // send ending in 2 s. The batch's work is done in 100 ms: no send starts after it.
    let work = || json!({"work_ms": 100});
    let (report, took, in_flight) = consumer.batch(vec![message("quiet-1", work())], SECS_10).await;
    assert!(report.response().batch_item_failures.is_empty());
    assert_eq!(in_flight, 0, "no send in flight when the answer goes out");
    assert!(took <= SEND_TIME * 2, "held for the sends under way (a send and its deletion), not {took:?}");
    assert_eq!(consumer.destination.sent.load(Ordering::SeqCst), 16, "one send of each run started");
    // The next batch, right after, sweeps nothing: the interval holds, however much the last sweep left.
    let (_, took, _) = consumer.batch(vec![message("quiet-2", work())], SECS_10).await;
    assert_eq!(took, Duration::from_millis(100));
    assert_eq!(consumer.destination.sent.load(Ordering::SeqCst), 16);
    // Every message leaves in time, by later sweeps.
    for n in 0..20 {
        tokio::time::sleep(SWEEP_EVERY).await;
        let (_, _, in_flight) = consumer.batch(vec![message(&format!("later-{n}"), work())], SECS_10).await;
        assert_eq!(in_flight, 0);
    }
    assert_eq!(consumer.unsent().await, 0);
    assert_eq!(consumer.destination.sent.load(Ordering::SeqCst), 128, "each sent once");
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
