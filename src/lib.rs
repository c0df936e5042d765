//! Effectively-once processing of SQS batches on AWS Lambda.
//!
//! SQS delivers every message at least once. `sqs-once` turns that into
//! *effectively once*: each record of a batch gets an idempotency key, the
//! key is claimed with an atomic conditional write in a [`store`], and only
//! the claim's winner runs the business [`Handler`]. The [`engine`] answers
//! with a partial-batch response listing exactly the records SQS must
//! deliver again.
//!
//! A consumer of one's own is a handler and one call:
//!
//! ```no_run
//! use sqs_once::{Handler, HandlerResult, Record};
//!
//! struct Ship;
//!
//! impl Handler for Ship {
//!     async fn handle(&self, record: &Record) -> HandlerResult {
//!         // The side effect, run once per key however often SQS delivers it.
//!         let _order: serde_json::Value = record.body_json()?;
//!         Ok(None)
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     // The Lambda function inside Lambda; `invoke`, `poll`, `claims` and `create-table` outside it.
//!     sqs_once::run(Ship).await
//! }
//! ```
//!
//! The pieces, from the inside out:
//!
//! - [`Handler`]: the business logic for one [`Record`] ([`handler_fn`]
//!   makes one of a closure);
//! - [`claim`]: the claim state machine, written once for every store;
//! - [`store`]: where claims live (memory, a SQLite file, DynamoDB);
//! - [`key`]: which part of a message identifies it, and [`envelope`]: the
//!   SNS or EventBridge envelope a message may arrive in;
//! - [`engine`]: fans a batch out, keeps FIFO order and the deadline;
//! - [`sqs`]: the SQS side: reading an event one record at a time
//!   ([`sqs::event`]), when failed records come back or leave for the
//!   dead-letter queue ([`sqs::redelivery`]), and the SQS calls;
//! - [`consumer`]: the engine, the store and the SQS step, assembled from
//!   the [`config`] (the `SQS_ONCE_` settings);
//! - [`lambda`] and [`poll`]: the Lambda function, and the same consumer
//!   polling a queue itself; [`run`] serves either, with the command line;
//! - [`testing`]: running a handler through the real engine in a test, and
//!   the conformance suite for claim stores.

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

pub mod aws;
pub mod budget;
pub mod claim;
pub mod clock;
pub mod config;
pub mod consumer;
pub mod engine;
pub mod envelope;
pub mod event;
mod handler;
pub mod key;
mod lock;
pub mod metrics;
pub mod operator;
pub mod outbox;
pub mod reason;
mod record;
pub mod report;
pub mod sqs;
pub mod store;
pub mod testing;
pub mod transaction;

#[path = "../handlers/mod.rs"]
pub mod handlers;

mod cli;
pub mod lambda;
pub mod poll;

pub use cli::{run, run_with};
pub use handler::{BoxHandler, DynHandler, ErrorKind, Handler, HandlerError, HandlerFn, HandlerResult, handler_fn};
pub use record::Record;
