//! Helpers for the tests of handlers and stores written outside this crate.
//!
//! [`TestConsumer`] runs a handler through the real engine on the in-memory
//! store, so a test sees what SQS would see: which records fail, which are
//! duplicates, how often the handler ran, and, for a handler that stages
//! writes and messages ([`crate::transaction`]), the items its transactions
//! committed ([`TestConsumer::items`]) and the messages its outbox sent
//! ([`TestConsumer::sent`]). [`event`] and [`message`] build the input from
//! bodies. [`claim_suite`](crate::claim_suite) is the conformance suite every claim store
//! passes, for a [`ClaimStore`] of one's own, and [`commit_suite`](crate::commit_suite) the one
//! for committing staged writes and keeping the outbox.
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
//! use sqs_once::{Handler, HandlerError, HandlerResult, Record, report::{Failure, Outcome}, testing};
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

// Written here before the crates were cut; the core's simulation builds its records with it too.
#[doc(inline)]
pub use sqs_once_engine::testing::message;

use parking_lot::Mutex;
use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use async_trait::async_trait;

use crate::{
    config::Config,
    store::{ClaimStore, MemoryStore},
};
use sqs_once_core::{
    Body, BoxHandler, Handler, Record,
    destinations::{Destinations, SendError},
    transaction::{Message, Transaction},
};
use sqs_once_engine::{Engine, Invocation, event::EventRecord, outbox::OutboxTimes, report::BatchReport};

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
        .map(|(n, body)| EventRecord::Message(Arc::new(message(&format!("m-{n}"), body))))
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
    let message = Arc::new(message("m-0", body));
    let body = Body::from(message.body.as_deref().unwrap_or_default());
    Record::new(&message, body, None, "test#m-0".to_owned(), deadline, Transaction::default())
}

/// How long each batch may take, unless [`TestConsumer::timeout`] says otherwise.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A message a [`TestConsumer`]'s outbox sent: kept, not sent anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sent {
    /// The id it carried (its deduplication id).
    pub outbox_id: String,
    /// The message.
    pub message: Message,
}

/// Destinations that keep every message sent to them, in order, instead of
/// sending it: what [`TestConsumer`] sends through.
#[derive(Debug, Default)]
pub(crate) struct Recorded {
    sent: Mutex<Vec<Sent>>,
}

impl Recorded {
    /// Every message sent so far, in order.
    pub(crate) fn sent(&self) -> Vec<Sent> {
        self.sent.lock().clone()
    }
}

#[async_trait]
impl Destinations for Recorded {
    async fn send(&self, outbox_id: &str, message: &Message) -> Result<(), SendError> {
        self.sent.lock().push(Sent { outbox_id: outbox_id.to_owned(), message: message.clone() });
        Ok(())
    }
}

/// A handler behind the real engine and claim state machine, on a store
/// that lives as long as the consumer (in memory unless [`store`](Self::store)
/// gives another), keyed by message id unless [`key`](Self::key) says
/// otherwise. Every [`process`](Self::process) is one invocation. Messages
/// a handler stages are kept, not sent: [`sent`](Self::sent) lists them.
#[derive(Clone)]
pub struct TestConsumer {
    setup: Setup,
    engine: Engine,
}

/// What a [`TestConsumer`]'s engine is built from.
#[derive(Clone)]
struct Setup {
    handler: BoxHandler,
    store: Arc<dyn ClaimStore>,
    memory: Option<Arc<MemoryStore>>,
    destinations: Arc<Recorded>,
    /// `SQS_ONCE_` settings, later ones winning.
    settings: Vec<(String, String)>,
    timeout: Duration,
}

/// What a test consumer's settings are unless the test says otherwise: keys
/// stored as they are, under `test`, so that a test reads them.
const TEST_SETTINGS: [(&str, &str); 2] = [("SQS_ONCE_KEY_PREFIX", "test"), ("SQS_ONCE_HASH_KEYS", "false")];

impl Setup {
    fn config(&self) -> Config {
        let lookup = |name: &str| {
            let given = self.settings.iter().rev().find(|(setting, _)| setting == name).map(|(_, value)| value.clone());
            given.or_else(|| {
                TEST_SETTINGS.iter().find(|(setting, _)| *setting == name).map(|(_, value)| (*value).to_owned())
            })
        };
        Config::from_lookup(lookup).unwrap_or_else(|error| panic!("{error}"))
    }

    fn engine(&self) -> Engine {
        let config = self.config();
        let destinations = Arc::clone(&self.destinations) as Arc<dyn Destinations>;
        Engine::builder(Arc::clone(&self.store), config.keys)
            .policy(config.claims)
            .options(config.engine)
            .outbox(destinations, OutboxTimes::both(sqs_once_aws::OPERATION_TIMEOUT), None)
            .build(self.handler.clone())
    }
}

impl std::fmt::Debug for TestConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestConsumer").field("settings", &self.setup.settings).finish_non_exhaustive()
    }
}

impl TestConsumer {
    /// `handler` on a fresh in-memory store, keyed by message id.
    pub fn new(handler: impl Handler) -> Self {
        let memory = Arc::new(MemoryStore::default());
        let setup = Setup {
            handler: BoxHandler::new(handler),
            store: Arc::clone(&memory) as Arc<dyn ClaimStore>,
            memory: Some(memory),
            destinations: Arc::new(Recorded::default()),
            settings: Vec::new(),
            timeout: TIMEOUT,
        };
        Self { engine: setup.engine(), setup }
    }

    /// Keys records as `SQS_ONCE_KEY` would. Panics on an invalid
    /// specification, as a test should.
    pub fn key(self, spec: &str) -> Self {
        self.setting("SQS_ONCE_KEY", spec)
    }

    /// Runs as the `SQS_ONCE_` variable `name` set to `value` would make it
    /// run (`SQS_ONCE_VALIDATE_PAYLOAD`, `SQS_ONCE_CONCURRENCY`,
    /// `SQS_ONCE_DEADLINE_MARGIN_MS`…; see [`crate::config`]). Keys are
    /// stored unhashed under `test` unless set otherwise. Panics on an
    /// invalid value, as a test should.
    ///
    /// ```
    /// use sqs_once::{handler_fn, testing::TestConsumer};
    ///
    /// let consumer = TestConsumer::new(handler_fn(|_| async { Ok(None) }))
    ///     .key("body.order_id")
    ///     .setting("SQS_ONCE_VALIDATE_PAYLOAD", "true");
    /// ```
    pub fn setting(self, name: &str, value: &str) -> Self {
        let (name, value) = (name.to_owned(), value.to_owned());
        self.rebuilt(|setup| setup.settings.push((name, value)))
    }

    /// Runs on `store` instead of a fresh in-memory one.
    pub fn store(self, store: Arc<dyn ClaimStore>) -> Self {
        self.rebuilt(|setup| {
            setup.store = store;
            setup.memory = None;
        })
    }

    /// How long each batch may take before its unfinished records fail
    /// `deadline` (30 s unless set).
    pub fn timeout(self, timeout: Duration) -> Self {
        self.rebuilt(|setup| setup.timeout = timeout)
    }

    /// The store the claims are kept in, to check what it holds.
    pub fn claim_store(&self) -> &Arc<dyn ClaimStore> {
        &self.setup.store
    }

    /// The items the handler's committed transactions left in `table`,
    /// ordered by key. Panics when the consumer runs on a store of its own
    /// ([`store`](Self::store)): read that store instead.
    pub fn items(&self, table: &str) -> Vec<serde_json::Value> {
        let memory = self.setup.memory.as_ref();
        memory.expect("items() reads the in-memory store, and this consumer runs on another").items(table)
    }

    /// The messages the outbox sent, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.setup.destinations.sent()
    }

    /// Processes one batch, as one invocation, and reports every record's
    /// fate in event order.
    pub async fn process(&self, records: &[EventRecord]) -> BatchReport {
        let invocation = Invocation {
            deadline: SystemTime::now() + self.setup.timeout,
            request_id: format!("test-{}", uuid::Uuid::new_v4().simple()),
        };
        self.engine.process(records, &invocation, None).await
    }

    fn rebuilt(mut self, change: impl FnOnce(&mut Setup)) -> Self {
        change(&mut self.setup);
        self.engine = self.setup.engine();
        self
    }
}

/// The message ids in the batch's `batchItemFailures`, in event order.
pub fn failures(report: &BatchReport) -> Vec<String> {
    report.response().batch_item_failures.into_iter().map(|failure| failure.item_identifier).collect()
}
