//! From settings to a running engine: what every entry point does at start.

use std::sync::Arc;

use crate::{
    claim::Claims,
    clock::SystemClock,
    config::{Config, StoreChoice},
    engine::Engine,
    handlers::{self, UnknownHandler},
    store::{
        ClaimStore, DynamoDbStore, MemoryStore, SqliteStore, StoreError,
        dynamodb::{self, TableLayout},
    },
};

/// Why the engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// `SQS_ONCE_HANDLER` names no registered handler.
    #[error(transparent)]
    UnknownHandler(#[from] UnknownHandler),
    /// The store could not be opened.
    #[error("cannot open the claim store")]
    Store(#[from] StoreError),
}

/// The store `config` chooses.
pub async fn store(config: &Config) -> Result<Arc<dyn ClaimStore>, StartupError> {
    Ok(match &config.store {
        StoreChoice::Memory => Arc::new(MemoryStore::default()),
        StoreChoice::File(path) => Arc::new(SqliteStore::open(path)?),
        StoreChoice::DynamoDb(layout) => Arc::new(dynamodb_store(layout.clone()).await),
    })
}

/// A DynamoDB store on `layout`, with a client built from the SDK's default
/// configuration chain.
pub async fn dynamodb_store(layout: TableLayout) -> DynamoDbStore {
    let (client, _requests) = dynamodb::client().await;
    DynamoDbStore::new(client, layout)
}

/// The engine `config` describes: its handler, store, keys and tuning.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let config = sqs_once::config::Config::from_lookup(|name| match name {
///     "SQS_ONCE_STORE" => Some("memory".to_owned()),
///     _ => None,
/// }).unwrap();
/// let engine = sqs_once::startup::engine(&config).await.unwrap();
/// # });
/// ```
pub async fn engine(config: &Config) -> Result<Engine, StartupError> {
    let handler = handlers::build(&config.handler)?;
    let claims = Claims::with_policy(store(config).await?, config.claims.clone(), Arc::new(SystemClock));
    Ok(Engine::new(handler, Arc::new(claims), config.key_deriver(), config.engine.clone()))
}
