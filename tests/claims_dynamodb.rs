//! The claim state machine on the DynamoDB store, against DynamoDB Local:
//! the same suite as every other store, on both table layouts, with writes
//! batched (the default) and single.

use crate::common;

use std::sync::Arc;

use sqs_once::store::{ClaimStore, TableKey};

async fn store() -> Arc<dyn ClaimStore> {
    Arc::new(common::fresh_table(TableKey::Partition).await)
}

sqs_once::claim_suite!(store().await);
sqs_once::admin_suite!(store().await);

/// The suite again on a table keyed by a static partition value and a sort key.
mod sort_key_table {
    use super::*;

    async fn store() -> Arc<dyn ClaimStore> {
        Arc::new(common::fresh_table(common::sorted()).await)
    }

    sqs_once::claim_suite!(store().await);
    sqs_once::admin_suite!(store().await);
}

/// The suite again with every write in a request of its own.
mod single_requests {
    use super::*;

    async fn store() -> Arc<dyn ClaimStore> {
        Arc::new(common::fresh_table(TableKey::Partition).await.batching(false))
    }

    sqs_once::claim_suite!(store().await);
}
