//! Exactly once for DynamoDB side effects: writes a handler stages commit in
//! one transaction with its claim's completion, and the messages it sends
//! leave through an outbox written in that transaction (see
//! [`Record::transaction`](crate::Record::transaction)).
//!
//! The format a store of one's own keeps keys in items with is
//! `sqs_once_core::transaction::item_keys`: a handler needs none of it
//! ([`Update::keep_key`] is all it takes).
//!
#![doc = include_str!("../docs/transactions.md")]

pub use sqs_once_core::transaction::{
    Action, Check, Comparison, Condition, Delete, Destination, Key, MAX_BYTES, MAX_ITEM_BYTES, MAX_ITEMS, Message,
    OUTBOX_ID_ATTRIBUTE, OUTBOX_ID_FIELD, Put, Refusal, StageError, Staged, Target, Transaction, Update, Write,
};
