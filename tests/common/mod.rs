//! Test support shared by the integration tests.

#![allow(dead_code)]

pub mod claim_suite;
pub mod runtime_api;
pub mod sqs;

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use async_trait::async_trait;
use sqs_once::{
    claim::ClaimRecord,
    store::{ClaimQuery, ClaimStore, Fenced, Finish, Listing, PutOutcome, StoreError},
};

/// Wraps a store and counts the requests made to it.
pub struct Counting {
    pub inner: Arc<dyn ClaimStore>,
    pub requests: AtomicUsize,
}

impl Counting {
    pub fn new(inner: Arc<dyn ClaimStore>) -> Arc<Self> {
        Arc::new(Self { inner, requests: AtomicUsize::new(0) })
    }

    pub fn take(&self) -> usize {
        self.requests.swap(0, Ordering::SeqCst)
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl ClaimStore for Counting {
    async fn put_if_free(&self, record: &ClaimRecord, now_ms: u64) -> Result<PutOutcome, StoreError> {
        self.count();
        self.inner.put_if_free(record, now_ms).await
    }
    async fn get(&self, id: &str) -> Result<Option<ClaimRecord>, StoreError> {
        self.count();
        self.inner.get(id).await
    }
    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        self.count();
        self.inner.finish(id, token, finish).await
    }
    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        self.count();
        self.inner.release(id, token).await
    }
    async fn list(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
        self.count();
        self.inner.list(query).await
    }
    async fn replace_seen(&self, seen: Option<&ClaimRecord>, new: Option<&ClaimRecord>) -> Result<Fenced, StoreError> {
        self.count();
        self.inner.replace_seen(seen, new).await
    }
}

/// Wraps a store so that a taken key comes back without the old record, as
/// stores that cannot return it in the same request answer.
pub struct WithoutOldItem(pub Arc<dyn ClaimStore>);

#[async_trait]
impl ClaimStore for WithoutOldItem {
    async fn put_if_free(&self, record: &ClaimRecord, now_ms: u64) -> Result<PutOutcome, StoreError> {
        Ok(match self.0.put_if_free(record, now_ms).await? {
            PutOutcome::Taken(_) => PutOutcome::Taken(None),
            claimed => claimed,
        })
    }
    async fn get(&self, id: &str) -> Result<Option<ClaimRecord>, StoreError> {
        self.0.get(id).await
    }
    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        self.0.finish(id, token, finish).await
    }
    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        self.0.release(id, token).await
    }
    async fn list(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
        self.0.list(query).await
    }
    async fn replace_seen(&self, seen: Option<&ClaimRecord>, new: Option<&ClaimRecord>) -> Result<Fenced, StoreError> {
        self.0.replace_seen(seen, new).await
    }
}

/// A store that is down: every request fails.
pub struct Down;

#[async_trait]
impl ClaimStore for Down {
    async fn put_if_free(&self, _: &ClaimRecord, _: u64) -> Result<PutOutcome, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn get(&self, _: &str) -> Result<Option<ClaimRecord>, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn finish(&self, _: &str, _: &str, _: &Finish) -> Result<Fenced, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn release(&self, _: &str, _: &str) -> Result<Fenced, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn list(&self, _: &ClaimQuery) -> Result<Listing, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn replace_seen(&self, _: Option<&ClaimRecord>, _: Option<&ClaimRecord>) -> Result<Fenced, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
}

/// DynamoDB Local, as `scripts/test` starts it.
pub mod dynamodb {
    use std::sync::Arc;

    use sqs_once::store::{
        DynamoDbStore,
        dynamodb::{self, RequestCounter, TableKey, TableLayout},
    };

    /// The endpoint `scripts/test` exported; these tests need the real server.
    pub fn endpoint() -> String {
        std::env::var("AWS_ENDPOINT_URL_DYNAMODB").expect(
            "AWS_ENDPOINT_URL_DYNAMODB is not set: run the tests with scripts/test, which starts DynamoDB Local",
        )
    }

    /// A fresh table with a unique name, created as `sqs-once create-table` creates it.
    pub async fn fresh_table(key: TableKey) -> (DynamoDbStore, Arc<RequestCounter>) {
        endpoint();
        let (client, requests) = dynamodb::client().await;
        let name = format!("claims-{}", uuid::Uuid::new_v4().simple());
        let store = DynamoDbStore::new(client, TableLayout { key, ..TableLayout::new(name) });
        assert!(store.create_table().await.expect("create table"), "table name collided");
        (store, requests)
    }

    /// A table keyed by a static partition value and a sort key, as Powertools lays it out.
    pub fn sorted() -> TableKey {
        TableKey::Sorted { partition_attribute: "pk".into(), partition_value: "idempotency#tests".into() }
    }
}
