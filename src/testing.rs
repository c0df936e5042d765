//! Helpers for the tests of handlers and stores written outside this crate.
//!
//! [`TestConsumer`] runs a handler through the real engine on the in-memory
//! store, so a test sees what SQS would see: which records fail, which are
//! duplicates, how often the handler ran. [`event`] and [`message`] build the
//! input from bodies. [`claim_suite`] is the conformance suite every claim
//! store passes, for a [`ClaimStore`] of one's own.
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
//! use sqs_once::{Handler, HandlerError, HandlerResult, Record, engine::{Failure, Outcome}, testing};
//!
//! #[derive(Default)]
//! struct Charge(AtomicUsize);
//!
//! impl Handler for Charge {
//!     async fn handle(&self, record: &Record) -> HandlerResult {
//!         let order: serde_json::Value = record.body_json()?;
//!         if order["amount"] == 0 {
//!             return Err(HandlerError::permanent("nothing to charge"));
//!         }
//!         self.0.fetch_add(1, Ordering::SeqCst);
//!         Ok(None)
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let charge = Arc::new(Charge::default());
//! let consumer = testing::TestConsumer::new(Arc::clone(&charge)).key("body.order_id");
//! let event = testing::event([
//!     r#"{"order_id": "o-1", "amount": 5}"#,
//!     r#"{"order_id": "o-1", "amount": 5}"#,
//!     r#"{"order_id": "o-2", "amount": 0}"#,
//! ]);
//! let report = consumer.process(&event).await;
//! assert_eq!(testing::failures(&report), ["m-2"]);
//! assert!(matches!(report.records[2].outcome, Outcome::Failed(Failure::Permanent(_))));
//! assert_eq!(charge.0.load(Ordering::SeqCst), 1, "one charge for o-1's two deliveries");
//!
//! // SQS delivers o-1 again: a duplicate, and no second charge.
//! let report = consumer.process(&testing::event([r#"{"order_id": "o-1", "amount": 5}"#])).await;
//! assert_eq!(report.records[0].outcome, Outcome::Duplicate);
//! assert_eq!(charge.0.load(Ordering::SeqCst), 1);
//! # });
//! ```
//!
#![doc = include_str!("../docs/tests.md")]

pub mod claim_suite;

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use aws_lambda_events::sqs::SqsMessage;

use crate::{
    Handler, Record,
    claim::{ClaimPolicy, Claims},
    clock::SystemClock,
    engine::{BatchReport, Engine, EngineOptions, Invocation},
    key::{KeyDeriver, KeySpec, OnMissingKey},
    sqs::event::EventRecord,
    store::{ClaimStore, MemoryStore},
};

/// An SQS message with `id` and `body`, received once, from a standard queue.
///
/// ```
/// let message = sqs_once::testing::message("m-1", r#"{"n": 1}"#);
/// assert_eq!(message.attributes["ApproximateReceiveCount"], "1");
/// ```
pub fn message(id: &str, body: impl Into<String>) -> SqsMessage {
    let mut message = SqsMessage::default();
    message.message_id = Some(id.to_owned());
    message.body = Some(body.into());
    message.event_source = Some("aws:sqs".to_owned());
    message.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:work".to_owned());
    message.attributes.insert("ApproximateReceiveCount".to_owned(), "1".to_owned());
    message
}

/// A batch of messages with these bodies, their ids `m-0`, `m-1`, ... in
/// order.
///
/// ```
/// let event = sqs_once::testing::event(["a", "b"]);
/// assert_eq!(event[1].message_id(), "m-1");
/// ```
pub fn event<B: Into<String>>(bodies: impl IntoIterator<Item = B>) -> Vec<EventRecord> {
    bodies
        .into_iter()
        .enumerate()
        .map(|(n, body)| EventRecord::Message(Box::new(message(&format!("m-{n}"), body))))
        .collect()
}

/// A record with `body` as a handler gets it, keyed by its message id, with
/// 30 seconds left: for calling a handler's `handle` directly.
///
/// ```
/// let record = sqs_once::testing::record(r#"{"n": 1}"#);
/// assert_eq!(record.message_id, "m-0");
/// assert!(record.remaining_time() > std::time::Duration::from_secs(29));
/// ```
pub fn record(body: impl Into<String>) -> Record {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    Record::new(&message("m-0", body), "test#m-0".to_owned(), deadline)
}

/// How long each batch may take, unless [`TestConsumer::timeout`] says otherwise.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A handler behind the real engine and claim state machine, on a store
/// that lives as long as the consumer (in memory unless [`store`](Self::store)
/// gives another), keyed by message id unless [`key`](Self::key) says
/// otherwise. Every [`process`](Self::process) is one invocation.
#[derive(Clone)]
pub struct TestConsumer {
    handler: crate::BoxHandler,
    store: Arc<dyn ClaimStore>,
    key: KeySpec,
    policy: ClaimPolicy,
    options: EngineOptions,
    timeout: Duration,
    engine: Engine,
}

impl std::fmt::Debug for TestConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestConsumer").field("key", &self.key).field("options", &self.options).finish_non_exhaustive()
    }
}

impl TestConsumer {
    /// `handler` on a fresh in-memory store, keyed by message id.
    pub fn new(handler: impl Handler) -> Self {
        let handler: crate::BoxHandler = Arc::new(handler);
        let store: Arc<dyn ClaimStore> = Arc::new(MemoryStore::default());
        let (key, policy, options) = (KeySpec::default(), ClaimPolicy::default(), EngineOptions::default());
        let engine = engine(&handler, &store, &key, &policy, &options);
        Self { handler, store, key, policy, options, timeout: TIMEOUT, engine }
    }

    /// Keys records as `SQS_ONCE_KEY` would. Panics on an invalid
    /// specification, as a test should.
    pub fn key(self, spec: &str) -> Self {
        let key = spec.parse().unwrap_or_else(|error| panic!("{error}"));
        self.rebuilt(|consumer| consumer.key = key)
    }

    /// Runs on `store` instead of a fresh in-memory one.
    pub fn store(self, store: Arc<dyn ClaimStore>) -> Self {
        self.rebuilt(|consumer| consumer.store = store)
    }

    /// The claim state machine's tuning (payload validation, stored results).
    pub fn policy(self, policy: ClaimPolicy) -> Self {
        self.rebuilt(|consumer| consumer.policy = policy)
    }

    /// The engine's tuning (concurrency, deadline margin, envelope).
    pub fn options(self, options: EngineOptions) -> Self {
        self.rebuilt(|consumer| consumer.options = options)
    }

    /// How long each batch may take before its unfinished records fail
    /// `deadline` (30 s unless set).
    pub fn timeout(self, timeout: Duration) -> Self {
        self.rebuilt(|consumer| consumer.timeout = timeout)
    }

    /// The store the claims are kept in, to check what it holds.
    pub fn claim_store(&self) -> &Arc<dyn ClaimStore> {
        &self.store
    }

    /// Processes one batch, as one invocation, and reports every record's
    /// fate in event order.
    pub async fn process(&self, records: &[EventRecord]) -> BatchReport {
        let invocation = Invocation {
            deadline: SystemTime::now() + self.timeout,
            request_id: format!("test-{}", uuid::Uuid::new_v4().simple()),
        };
        self.engine.process(records, &invocation).await
    }

    fn rebuilt(mut self, change: impl FnOnce(&mut Self)) -> Self {
        change(&mut self);
        self.engine = engine(&self.handler, &self.store, &self.key, &self.policy, &self.options);
        self
    }
}

fn engine(
    handler: &crate::BoxHandler,
    store: &Arc<dyn ClaimStore>,
    key: &KeySpec,
    policy: &ClaimPolicy,
    options: &EngineOptions,
) -> Engine {
    let claims = Claims::with_policy(Arc::clone(store), policy.clone(), Arc::new(SystemClock));
    let keys = KeyDeriver::new(key.clone(), "test", false, OnMissingKey::Fail);
    Engine::new(Arc::clone(handler), Arc::new(claims), keys, options.clone())
}

/// The message ids in the batch's `batchItemFailures`, in event order.
pub fn failures(report: &BatchReport) -> Vec<String> {
    report.response().batch_item_failures.into_iter().map(|failure| failure.item_identifier).collect()
}
