//! The claim state machine and the operator's listing on the in-memory store.

use std::sync::Arc;

use sqs_once::store::{ClaimStore, MemoryStore};

fn store() -> Arc<dyn ClaimStore> {
    Arc::new(MemoryStore::default())
}

sqs_once::claim_suite!(store());
sqs_once::admin_suite!(store());
