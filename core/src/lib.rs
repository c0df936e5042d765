//! The engine of [`sqs-once`](https://docs.rs/sqs-once), making no AWS request:
//! the [`Handler`] and its [`Record`], idempotency keys, the claim machine,
//! the [`store`] and [`outbox`] interfaces with the in-memory store, staged
//! [`transaction`]s, reports and trace contexts. Of the AWS SDK it names
//! only `aws-sdk-dynamodb`'s types: a handler may stage an SDK
//! `TransactWriteItem` of its own.
//!
//! Use it through `sqs-once`, which re-exports everything here a program
//! needs beside the Lambda function, `poll`, the DynamoDB and SQLite stores,
//! the AWS destinations and the settings. A store or destination of one's own
//! may depend on this crate alone. Modules hidden from this documentation
//! (the engine, budgets, the clock, keys) are the interface between
//! sqs-once's own crates, not a promise to other programs: they change
//! between minor versions.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The engine isolates a handler's panic in its record by catching the unwind;
// with `panic = "abort"` one panicking record would kill the process and fail
// every record of the batch. cargo-lambda builds with abort unless the release
// profile sets `panic` itself.
#[cfg(panic = "abort")]
compile_error!(
    "sqs-once needs panic = \"unwind\" so that a panicking handler fails its record, not the whole batch: \
     add `panic = \"unwind\"` to [profile.release] in your Cargo.toml (cargo-lambda builds with \
     panic = \"abort\" unless the profile says otherwise)"
);

#[cfg(feature = "aws")]
#[doc(hidden)]
pub mod aws;
mod body;
#[doc(hidden)]
pub mod budget;
#[doc(hidden)]
pub mod claim;
#[doc(hidden)]
pub mod clock;
#[doc(hidden)]
pub mod engine;
pub mod envelope;
pub mod event;
#[doc(hidden)]
pub mod handler;
#[doc(hidden)]
pub mod key;
#[doc(hidden)]
pub mod lock;
pub mod outbox;
#[doc(hidden)]
pub mod payload;
#[doc(hidden)]
pub mod reason;
#[doc(hidden)]
pub mod record;
pub mod report;
#[cfg(test)]
mod simulation;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[doc(hidden)]
pub mod trace;
pub mod transaction;

pub use body::Body;
pub use handler::{BoxHandler, ErrorKind, Handler, HandlerError, HandlerFn, HandlerResult, handler_fn};
pub use record::Record;
