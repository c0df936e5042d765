//! Test support shared by the library's integration tests: claim tables on
//! DynamoDB Local, made through the public API as a user makes them.

// Each test crate uses a part of this support, and reaches it through `mod
// common`, never as a public API.
#![allow(dead_code, unreachable_pub)]

use sqs_once::store::{DynamoDbStore, TableKey, TableLayout};

/// A fresh claim table keyed as `key` says, with a unique name.
pub async fn fresh_table(key: TableKey) -> DynamoDbStore {
    let name = testkit::dynamodb::unique_name("claims");
    let store = DynamoDbStore::new(testkit::dynamodb::client().await, TableLayout { key, ..TableLayout::new(name) });
    assert!(store.create_table().await.expect("create table"), "table name collided");
    store
}

/// A table keyed by a static partition value and a sort key, as Powertools lays it out.
pub fn sorted() -> TableKey {
    TableKey::Sorted { partition_attribute: "pk".into(), partition_value: "idempotency#tests".into() }
}
