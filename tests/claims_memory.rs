//! The claim state machine on the in-memory store.

mod common;

use std::sync::Arc;

use sqs_once::store::{ClaimStore, MemoryStore};

fn store() -> Arc<dyn ClaimStore> {
    Arc::new(MemoryStore::default())
}

claim_suite!(store());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_have_one_winner() {
    common::claim_suite::concurrent_claims_have_one_winner(store(), 32, 200).await;
}
