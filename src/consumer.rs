//! A consumer: the engine around a handler, the claim store and keys the
//! settings choose, and the SQS step that follows each batch. Every way to
//! run (Lambda, `poll`, `invoke`) builds one at start and processes batches
//! with it.

use std::{
    sync::{Arc, atomic::Ordering},
    time::SystemTime,
};

use aws_config::SdkConfig;
use aws_lambda_events::sqs::SqsBatchResponse;

use crate::{
    BoxHandler,
    claim::Claims,
    clock::SystemClock,
    config::{Config, StoreChoice},
    engine::{Engine, Invocation},
    event::EventRecord,
    metrics::Extra,
    outbox::{AwsDestinations, Outbox},
    report::BatchReport,
    sqs::Sqs,
    sqs::redelivery::{Redelivery, RedeliveryCounts},
    store::{
        ClaimStore, DynamoDbStore, MemoryStore, SqliteStore, StoreError,
        dynamodb::{self, RequestCounter, TableLayout},
    },
};

/// Why the engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The store could not be opened.
    #[error("cannot open the claim store")]
    Store(#[from] StoreError),
}

/// A consumer: assembled from the settings with [`Consumer::new`], or in
/// code from its parts, with no environment at all.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use sqs_once::{config::Config, consumer::Consumer, handlers::orders::Orders};
///
/// let config = Config::from_lookup(|name| match name {
///     "SQS_ONCE_STORE" => Some("memory".to_owned()),
///     _ => None,
/// }).unwrap();
/// let consumer = Consumer::new(&config, Arc::new(Orders)).await.unwrap();
/// # });
/// ```
///
/// From its parts: the store, the key and the tuning chosen in code.
///
/// ```
/// use std::sync::Arc;
/// use sqs_once::{
///     claim::{ClaimPolicy, Claims}, clock::SystemClock, consumer::Consumer,
///     engine::{Engine, EngineOptions}, handlers::orders::Orders, key::Keys,
///     store::MemoryStore,
/// };
///
/// let policy = ClaimPolicy { validate_payload: true, ..ClaimPolicy::default() };
/// let claims = Claims::with_policy(Arc::new(MemoryStore::default()), policy, Arc::new(SystemClock));
/// let keys = Keys::new("body.order_id", "orders").unwrap();
/// let options = EngineOptions { concurrency: 16, ..EngineOptions::default() };
/// let engine = Engine::new(Arc::new(Orders), Arc::new(claims), keys, options);
/// // No SQS step: failed records come back after the queue's visibility timeout.
/// let consumer = Consumer { engine, dynamodb_requests: None, redelivery: None };
/// ```
#[derive(Debug, Clone)]
pub struct Consumer {
    /// The engine: handler, claims, keys.
    pub engine: Engine,
    /// DynamoDB requests made so far, when the store is DynamoDB.
    pub dynamodb_requests: Option<Arc<RequestCounter>>,
    /// What SQS does with failed records, unless the policy asks nothing.
    pub redelivery: Option<Redelivery>,
}

/// What a batch comes to: the engine's report and the answer Lambda returns.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Every record's fate, as the engine saw it.
    pub report: BatchReport,
    /// The partial-batch response: the engine's failures less the records
    /// moved to the dead-letter queue.
    pub response: SqsBatchResponse,
    /// What the SQS step did, when there is one.
    pub redelivery: Option<RedeliveryCounts>,
}

impl Consumer {
    /// The consumer `config` describes around `handler`: its store, keys and
    /// tuning, and the SQS step when the redelivery policy asks for one.
    pub async fn new(config: &Config, handler: BoxHandler) -> Result<Self, StartupError> {
        let needs_aws = matches!(config.store, StoreChoice::DynamoDb(_)) || config.redelivery.is_active();
        // Loaded once: credentials and region are resolved once for both clients.
        let aws = if needs_aws { Some(crate::aws::sdk_config().await) } else { None };
        let (store, dynamodb_requests) = store_with(config, aws.as_ref())?;
        let claims = Claims::with_policy(Arc::clone(&store), config.claims.clone(), Arc::new(SystemClock));
        // Messages handlers stage leave through the outbox; a consumer that
        // sends none never loads the AWS configuration for it.
        let destinations = aws.as_ref().map_or_else(AwsDestinations::from_env, AwsDestinations::new);
        let outbox = Outbox::new(store, Arc::new(destinations), Arc::new(SystemClock), config.outbox_sweep);
        let redelivery = aws
            .filter(|_| config.redelivery.is_active())
            .map(|aws| Redelivery::new(config.redelivery.clone(), Sqs::new(&aws)));
        let mut options = config.engine.clone();
        options.margins.sqs_step = redelivery.is_some();
        let engine = Engine::new(handler, Arc::new(claims), config.keys.clone(), options).with_outbox(Arc::new(outbox));
        Ok(Self { engine, dynamodb_requests, redelivery })
    }

    /// Processes a batch, then carries out the redelivery policy on its
    /// failures.
    pub async fn process(&self, records: &[EventRecord], invocation: &Invocation) -> Answer {
        let report = self.engine.process(records, invocation).await;
        self.redeliver(records, report, invocation.deadline).await
    }

    /// The redelivery step of [`process`](Self::process), for callers that
    /// run the engine themselves. It is best effort and ends by `deadline`
    /// (less the time to post the answer): when SQS is slow or down, the
    /// engine's own answer stands, which is correct on its own (failed
    /// records come back after the queue's timeout).
    pub async fn redeliver(&self, records: &[EventRecord], report: BatchReport, deadline: SystemTime) -> Answer {
        let Some(redelivery) = &self.redelivery else {
            return Answer { response: report.response(), report, redelivery: None };
        };
        let sqs_by = self.engine.budget(deadline).sqs_by();
        let (response, counts) = redelivery.apply(records, &report, sqs_by).await;
        Answer { response, report, redelivery: Some(counts) }
    }

    /// The counts metrics take from outside the batch report, since start.
    pub fn extra(&self) -> Extra {
        let outbox = self.engine.outbox().map(|outbox| outbox.counters());
        Extra {
            lease_takeovers_refused: self.engine.claims().counters().refused.load(Ordering::Relaxed),
            completions_landed_later: self.engine.claims().counters().landed_later.load(Ordering::Relaxed),
            outbox_sent: outbox.map_or(0, |counters| counters.sent.load(Ordering::Relaxed)),
            outbox_failed: outbox.map_or(0, |counters| counters.failed.load(Ordering::Relaxed)),
            dynamodb_requests: self.dynamodb_requests.as_ref().map(|counter| counter.snapshot().total()),
            redelivery: None,
        }
    }

    /// Before the process leaves: sends the unconfirmed finishing writes
    /// again and lets an outbox sweep under way finish, until `until`.
    /// Returns the ids of the claims whose writes are still unconfirmed.
    pub async fn leave(&self, until: tokio::time::Instant) -> Vec<String> {
        let left = self.engine.claims().land_unconfirmed(until).await;
        if let Some(outbox) = self.engine.outbox() {
            outbox.finish_sweep(until).await;
        }
        left
    }
}

/// A claim store, and the counter of its requests when it is DynamoDB.
pub type CountedStore = (Arc<dyn ClaimStore>, Option<Arc<RequestCounter>>);

/// The store `config` chooses, and its request counter if it is DynamoDB.
pub async fn open_store(config: &Config) -> Result<CountedStore, StartupError> {
    let aws = match config.store {
        StoreChoice::DynamoDb(_) => Some(crate::aws::sdk_config().await),
        _ => None,
    };
    store_with(config, aws.as_ref())
}

/// [`store`], with the AWS configuration already loaded when the store is DynamoDB.
fn store_with(config: &Config, aws: Option<&SdkConfig>) -> Result<CountedStore, StartupError> {
    Ok(match (&config.store, aws) {
        (StoreChoice::DynamoDb(layout), Some(aws)) => {
            let (client, requests) = dynamodb::client_from(aws);
            let store = DynamoDbStore::new(client, layout.clone()).batching(config.dynamodb_batching);
            (Arc::new(store), Some(requests))
        }
        (StoreChoice::File(path), _) => (Arc::new(SqliteStore::open(path)?), None),
        _ => (Arc::new(MemoryStore::default()), None),
    })
}

/// A DynamoDB store on `layout`, with a client built from the SDK's default
/// configuration chain, and the counter of its requests.
pub async fn dynamodb_store(layout: TableLayout) -> (DynamoDbStore, Arc<RequestCounter>) {
    let (client, requests) = dynamodb::client().await;
    (DynamoDbStore::new(client, layout), requests)
}
