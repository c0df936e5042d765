//! A consumer: the engine around a handler, the claim store and keys the
//! settings choose, and the SQS step that follows each batch. Every way to
//! run (Lambda, `poll`, `invoke`) builds one at start and processes batches
//! with it.
//!
#![doc = include_str!("../docs/redelivery.md")]

use std::{
    sync::{Arc, atomic::Ordering},
    time::SystemTime,
};

use aws_config::SdkConfig;
use aws_lambda_events::sqs::SqsBatchResponse;

pub use crate::{engine::Invocation, sqs::redelivery::RedeliveryCounts};

use crate::{
    Handler,
    claim::Claims,
    clock::SystemClock,
    config::{Config, StoreChoice},
    engine::Engine,
    event::EventRecord,
    handler::BoxHandler,
    metrics::{Extra, MetricsConfig},
    outbox::{AwsDestinations, Outbox},
    report::BatchReport,
    sqs::Sqs,
    sqs::redelivery::Redelivery,
    store::{
        ClaimStore, DynamoDbStore, MemoryStore, StoreError,
        dynamodb::{self, RequestCounter},
    },
};

/// Why the engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The store could not be opened.
    #[error("cannot open the claim store")]
    Store(#[from] StoreError),
    /// The DynamoDB claim table does not exist. Checked at start outside a
    /// deployed function (`invoke`, `poll`, `sam local invoke`), where a
    /// table not created yet is the likely mistake: every record would
    /// otherwise fail `store_error`.
    #[error(
        "the claim table `{table}` does not exist at {endpoint}: create it with `sqs-once create-table --table {table}` \
         (or deploy template.yaml, which makes it)"
    )]
    MissingTable {
        /// The table `SQS_ONCE_TABLE` names.
        table: String,
        /// Where it was looked for.
        endpoint: String,
    },
}

/// The engine around a handler, the claim store and keys the settings
/// choose, and the SQS step after each batch: what the Lambda function runs,
/// for a program that serves batches its own way.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::time::{Duration, SystemTime};
/// use sqs_once::{config::Config, consumer::{Consumer, Invocation}, event::parse_event, handler_fn};
///
/// let config = Config::from_lookup(|name| match name {
///     "SQS_ONCE_STORE" => Some("memory".to_owned()),
///     _ => None,
/// })
/// .unwrap();
/// let consumer = Consumer::new(&config, handler_fn(|_| async { Ok(None) })).await.unwrap();
/// let event = r#"{ "Records": [{ "messageId": "m-1", "body": "{}" }] }"#;
/// let invocation = Invocation { deadline: SystemTime::now() + Duration::from_secs(30), request_id: "r-1".into() };
/// let answer = consumer.process(&parse_event(event).unwrap(), &invocation).await;
/// assert!(answer.response.batch_item_failures.is_empty());
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct Consumer {
    /// The engine: handler, claims, keys.
    pub(crate) engine: Engine,
    /// DynamoDB requests made so far, when the store is DynamoDB.
    pub(crate) dynamodb_requests: Option<Arc<RequestCounter>>,
    /// What SQS does with failed records, unless the policy asks nothing.
    pub(crate) redelivery: Option<Redelivery>,
    /// The metrics published after each batch.
    pub(crate) metrics: MetricsConfig,
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
    pub async fn new(config: &Config, handler: impl Handler) -> Result<Self, StartupError> {
        Self::assemble(config, Arc::new(handler)).await
    }

    /// [`new`](Self::new), with the claims kept in `store` whatever the
    /// settings say of the store: for a [`ClaimStore`] of one's own.
    pub async fn with_store(config: &Config, handler: impl Handler, store: Arc<dyn ClaimStore>) -> Self {
        let aws = if config.redelivery.is_active() { Some(crate::aws::sdk_config().await) } else { None };
        Self::around(config, Arc::new(handler), (store, None), aws)
    }

    /// [`new`](Self::new), for a handler chosen at run time.
    pub(crate) async fn assemble(config: &Config, handler: BoxHandler) -> Result<Self, StartupError> {
        let needs_aws = matches!(config.store, StoreChoice::DynamoDb(_)) || config.redelivery.is_active();
        // Loaded once: credentials and region are resolved once for every client.
        let aws = if needs_aws { Some(crate::aws::sdk_config().await) } else { None };
        if let (StoreChoice::DynamoDb(layout), Some(aws)) = (&config.store, &aws)
            && !crate::config::deployed()
            && dynamodb::table_missing(&aws_sdk_dynamodb::Client::new(aws), &layout.table).await
        {
            return Err(StartupError::MissingTable { table: layout.table.clone(), endpoint: dynamodb_endpoint(aws) });
        }
        let store = store_with(config, aws.as_ref())?;
        tracing::info!(store = %store_target(config, aws.as_ref()), "claims kept in the store");
        Ok(Self::around(config, handler, store, aws))
    }

    fn around(config: &Config, handler: BoxHandler, store: CountedStore, aws: Option<SdkConfig>) -> Self {
        let (store, dynamodb_requests) = store;
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
        Self { engine, dynamodb_requests, redelivery, metrics: config.metrics.clone() }
    }

    /// Processes a batch, then carries out the redelivery policy on its
    /// failures.
    pub async fn process(&self, records: &[EventRecord], invocation: &Invocation) -> Answer {
        let report = self.engine.process(records, invocation).await;
        self.redeliver(records, report, invocation.deadline).await
    }

    /// The redelivery step of [`process`](Self::process). It is best effort
    /// and ends by `deadline` (less the time to post the answer): when SQS is
    /// slow or down, the engine's own answer stands, which is correct on its
    /// own (failed records come back after the queue's timeout).
    pub(crate) async fn redeliver(&self, records: &[EventRecord], report: BatchReport, deadline: SystemTime) -> Answer {
        let Some(redelivery) = &self.redelivery else {
            return Answer { response: report.response(), report, redelivery: None };
        };
        let sqs_by = self.engine.budget(deadline).sqs_by();
        let (response, counts) = redelivery.apply(records, &report, sqs_by).await;
        Answer { response, report, redelivery: Some(counts) }
    }

    /// The counts metrics take from outside the batch report, since start,
    /// and the outbox's age if a sweep measured it since the last call.
    pub(crate) fn extra(&self) -> Extra {
        let outbox = self.engine.outbox();
        let count = |counter: fn(&crate::outbox::OutboxCounters) -> &std::sync::atomic::AtomicU64| {
            outbox.map_or(0, |outbox| counter(outbox.counters()).load(Ordering::Relaxed))
        };
        Extra {
            lease_takeovers_refused: self.engine.claims().counters().refused.load(Ordering::Relaxed),
            completions_landed_later: self.engine.claims().counters().landed_later.load(Ordering::Relaxed),
            outbox_sent: count(|counters| &counters.sent),
            outbox_failed: count(|counters| &counters.failed),
            outbox_refused: count(|counters| &counters.refused),
            outbox_oldest_age: outbox.and_then(|outbox| outbox.take_oldest_age()),
            dynamodb_requests: self.dynamodb_requests.as_ref().map(|counter| counter.snapshot().total()),
            redelivery: None,
        }
    }

    /// Before the process leaves: sends the unconfirmed finishing writes
    /// again (and the messages of the commits that land), then sweeps the
    /// outbox for messages left unsent, until `until`. Returns the ids of
    /// the claims whose writes are still unconfirmed.
    pub async fn leave(&self, until: tokio::time::Instant) -> Vec<String> {
        let left = self.engine.leave(until).await;
        if let Some(sweep) = self.engine.outbox().and_then(|outbox| outbox.sweep_now(Some(until))) {
            let _ = tokio::time::timeout_at(until, sweep.finished()).await;
        }
        left
    }
}

/// A claim store, and the counter of its requests when it is DynamoDB.
pub(crate) type CountedStore = (Arc<dyn ClaimStore>, Option<Arc<RequestCounter>>);

/// The store `config` chooses, and its request counter if it is DynamoDB.
#[cfg(feature = "cli")]
pub(crate) async fn open_store(config: &Config) -> Result<CountedStore, StartupError> {
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
        #[cfg(feature = "sqlite")]
        (StoreChoice::File(path), _) => (Arc::new(crate::store::SqliteStore::open(path)?), None),
        _ => (Arc::new(MemoryStore::default()), None),
    })
}

/// Which store `config` keeps claims in, and where, as a person reads it:
/// so that a command says what it acts on.
pub(crate) fn store_target(config: &Config, aws: Option<&SdkConfig>) -> String {
    match (&config.store, aws) {
        (StoreChoice::DynamoDb(layout), Some(aws)) => format!("table {} at {}", layout.table, dynamodb_endpoint(aws)),
        (StoreChoice::DynamoDb(layout), None) => format!("table {}", layout.table),
        #[cfg(feature = "sqlite")]
        (StoreChoice::File(path), _) => format!("file {}", path.display()),
        _ => "memory".to_owned(),
    }
}

/// Where DynamoDB requests go, as a person reads it: the endpoint the
/// environment names (`AWS_ENDPOINT_URL_DYNAMODB`, `AWS_ENDPOINT_URL`), or
/// AWS's own in the configuration's Region, of the account its credentials
/// name.
pub(crate) fn dynamodb_endpoint(aws: &SdkConfig) -> String {
    let named = |name: &str| std::env::var(name).ok().filter(|value| !value.trim().is_empty());
    match named("AWS_ENDPOINT_URL_DYNAMODB").or_else(|| named("AWS_ENDPOINT_URL")) {
        Some(url) => url,
        None => format!(
            "AWS, region {} (no AWS_ENDPOINT_URL_DYNAMODB: the account the credentials name)",
            aws.region().map_or("unset", |region| region.as_ref())
        ),
    }
}

/// A DynamoDB store on `layout`, with a client built from the SDK's default
/// configuration chain, and the counter of its requests.
#[cfg(feature = "cli")]
pub(crate) async fn dynamodb_store(layout: crate::store::TableLayout) -> (DynamoDbStore, Arc<RequestCounter>) {
    let (client, requests) = dynamodb::client().await;
    (DynamoDbStore::new(client, layout), requests)
}
