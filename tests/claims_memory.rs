//! The claim state machine on the in-memory store.

use std::sync::Arc;

use sqs_once::store::{ClaimStore, MemoryStore};

fn store() -> Arc<dyn ClaimStore> {
    Arc::new(MemoryStore::default())
}

sqs_once::claim_suite!(store());
