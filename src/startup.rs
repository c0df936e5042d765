//! From settings to a running engine: what every entry point does at start.

use std::sync::{Arc, atomic::Ordering};

use crate::{
    claim::Claims,
    clock::SystemClock,
    config::{Config, StoreChoice},
    engine::Engine,
    handlers::{self, HandlerSetupError},
    metrics::Extra,
    store::{
        ClaimStore, DynamoDbStore, MemoryStore, SqliteStore, StoreError,
        dynamodb::{self, RequestCounter, TableLayout},
    },
};

/// Why the engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// `SQS_ONCE_HANDLER` names no registered handler, or it cannot start.
    #[error(transparent)]
    Handler(#[from] HandlerSetupError),
    /// The store could not be opened.
    #[error("cannot open the claim store")]
    Store(#[from] StoreError),
}

/// A consumer, assembled from the settings.
#[derive(Clone)]
pub struct Consumer {
    /// The engine: handler, claims, keys.
    pub engine: Engine,
    /// DynamoDB requests made so far, when the store is DynamoDB.
    pub dynamodb_requests: Option<Arc<RequestCounter>>,
}

impl Consumer {
    /// The counts metrics take from outside the batch report, since start.
    pub fn extra(&self) -> Extra {
        Extra {
            lease_takeovers_refused: self.engine.claims().counters().refused.load(Ordering::Relaxed),
            dynamodb_requests: self.dynamodb_requests.as_ref().map(|counter| counter.snapshot().total()),
        }
    }
}

/// The store `config` chooses, and its request counter if it is DynamoDB.
pub async fn store(config: &Config) -> Result<(Arc<dyn ClaimStore>, Option<Arc<RequestCounter>>), StartupError> {
    Ok(match &config.store {
        StoreChoice::Memory => (Arc::new(MemoryStore::default()), None),
        StoreChoice::File(path) => (Arc::new(SqliteStore::open(path)?), None),
        StoreChoice::DynamoDb(layout) => {
            let (store, requests) = dynamodb_store(layout.clone()).await;
            (Arc::new(store), Some(requests))
        }
    })
}

/// A DynamoDB store on `layout`, with a client built from the SDK's default
/// configuration chain, and the counter of its requests.
pub async fn dynamodb_store(layout: TableLayout) -> (DynamoDbStore, Arc<RequestCounter>) {
    let (client, requests) = dynamodb::client().await;
    (DynamoDbStore::new(client, layout), requests)
}

/// The consumer `config` describes: its handler, store, keys and tuning.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let config = sqs_once::config::Config::from_lookup(|name| match name {
///     "SQS_ONCE_STORE" => Some("memory".to_owned()),
///     _ => None,
/// }).unwrap();
/// let consumer = sqs_once::startup::consumer(&config).await.unwrap();
/// # });
/// ```
pub async fn consumer(config: &Config) -> Result<Consumer, StartupError> {
    let handler = handlers::build(&config.handler)?;
    let (store, dynamodb_requests) = store(config).await?;
    let claims = Claims::with_policy(store, config.claims.clone(), Arc::new(SystemClock));
    let engine = Engine::new(handler, Arc::new(claims), config.key_deriver(), config.engine.clone());
    Ok(Consumer { engine, dynamodb_requests })
}
