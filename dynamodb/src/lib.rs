//! The production store: claims in a DynamoDB table.
//!
//! A claim is one conditional `PutItem` that asks for the old item back when
//! its condition fails (`ReturnValuesOnConditionCheckFailure = ALL_OLD`), so a
//! duplicate or a conflict costs one request. The condition is
//! [`StoredClaim::is_free`](sqs_once_core::store::StoredClaim::is_free) written as a DynamoDB condition expression.
//! Completing, failing and releasing are an `UpdateItem` or `DeleteItem`
//! conditioned on the claim's token.
//!
//! By default the writes of records running at the same time go out
//! together, as PartiQL statements in `BatchExecuteStatement` (see
//! *Batched writes* below): a new record then costs about 2/25 of a request instead
//! of 2, at the same write units. A claim that finds the key taken reads the
//! record in a batched consistent read (about 1/100 of a request and one
//! read unit), since a refused statement may not return it.
//!
//! Attribute names default to those of Powertools for AWS Lambda (`id`,
//! `expiration`, `in_progress_expiration`, `status`, `data`, `validation`), so
//! a table can be shared with functions that use it; tables keyed by a static
//! partition value and a sort key are supported as Powertools supports them.
//! The reference (layout, requests, capacity, IAM) is docs/dynamodb.md, the
//! documentation of [`DynamoDbStore`].

//!
//! This crate is the store alone; use it through `sqs-once`, whose
//! `sqs_once::store` re-exports it.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod client;
mod layout;
mod statements;
mod store;

pub use client::{RequestCounter, client_from, with_limits};
pub use layout::{Attributes, TableKey, TableLayout};
pub use store::{DynamoDbStore, Unusable, check_table};
