//! Effectively-once processing of SQS batches on AWS Lambda.
//!
//! SQS delivers every message at least once. `sqs-once` turns that into
//! *effectively once*: each record of a batch gets an idempotency key, the
//! key is claimed with an atomic conditional write in a [`store`], and only
//! the claim's winner runs the business [`Handler`]. The consumer answers
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
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> std::process::ExitCode {
//!     // The Lambda function inside Lambda; `invoke`, `poll`, `claims` and `create-table` outside it.
//!     sqs_once::run(Ship).await
//! }
//! ```
//!
//! `run` takes every part from the environment: the `SQS_ONCE_` settings
//! and the AWS SDK's default chain. [`Consumer::builder`] takes any of them
//! as a value instead, the environment supplying the rest:
//!
//! ```no_run
//! # use sqs_once::{Handler, HandlerResult, Record};
//! # struct Ship;
//! # impl Handler for Ship {
//! #     async fn handle(&self, _: &Record) -> HandlerResult { Ok(None) }
//! # }
//! use std::sync::Arc;
//! use sqs_once::{Consumer, store::MemoryStore};
//!
//! # async fn example() -> std::process::ExitCode {
//! let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! Consumer::builder()
//!     .sdk_config(aws)                          // credentials, Region, endpoints, retries of one's own
//!     .store(Arc::new(MemoryStore::default()))  // any ClaimStore, instead of SQS_ONCE_TABLE's
//!     .layer(lambda_runtime::tower::layer::util::Identity::new()) // tower layers around the Lambda service
//!     .run(Ship)
//!     .await
//! # }
//! ```
//!
//! What a crate of one's own uses, from the inside out:
//!
//! - [`Handler`]: the business logic for one [`Record`] ([`handler_fn`]
//!   makes one of a closure), failing with a retryable or permanent
//!   [`HandlerError`];
//! - [`transaction`]: DynamoDB writes and messages a handler stages, which
//!   commit in one transaction with its claim, so they happen exactly once;
//! - [`run`] and [`run_with`]: the Lambda function inside Lambda, and the
//!   command line outside it (`new`, `invoke`, `poll`, `claims`, `create-table`),
//!   every part from the environment; [`Consumer::builder`] the same with
//!   any part given;
//! - [`config`]: the `SQS_ONCE_` settings, and [`consumer`]: the engine,
//!   the claim store and the SQS step they describe, for a program that
//!   serves batches its own way ([`event`] reads them);
//! - [`report`]: each record's fate, and the partial-batch response;
//! - [`envelope`]: the SNS or EventBridge envelope a message may arrive in;
//! - [`store`]: where claims live (DynamoDB, a SQLite file, memory), and
//!   the [`ClaimStore`](store::ClaimStore) trait for a store of one's own:
//!   four methods, and the capabilities a store may add
//!   ([`ClaimAdmin`](store::ClaimAdmin), [`CommitStore`](store::CommitStore),
//!   [`OutboxStore`](store::OutboxStore));
//! - [`outbox`]: where committed messages go ([`Destinations`](outbox::Destinations)
//!   for destinations of one's own);
//! - `testing` (feature `testing`, a dev-dependency's): a handler through
//!   the real engine in a test (`TestConsumer`, what it committed and
//!   sent), and the conformance suites a store passes.
//!
//! These pages hold every feature's items, as docs.rs builds them: `cargo
//! doc --open -p sqs-once --all-features` in a checkout, or `cargo doc
//! --features sqs-once/testing` in a crate that depends on it (then
//! `target/doc/sqs_once/index.html`; a plain `cargo doc` leaves `testing`
//! out).
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `dynamodb` | yes | the DynamoDB claim store (`SQS_ONCE_TABLE`, `store::DynamoDbStore`, `create-table`) and `transaction::Write::Sdk`; without it aws-sdk-dynamodb is not compiled, and a program gives its own store to [`Consumer::builder`] |
//! | `cli` | yes | the command line around the Lambda function; without it a binary is the function alone |
//! | `sqlite` | yes | the SQLite claim store, `invoke`'s default |
//! | `sns`, `eventbridge` | yes | staged messages to SNS topics and EventBridge buses (SQS queues need nothing) |
//! | `opentelemetry` | no | spans exported as OTLP/HTTP whenever `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and `Builder::tracer_provider` |
//! | `testing` | no | `sqs_once::testing`, `claim_suite!`, `admin_suite!` and `commit_suite!` |

// On docs.rs (nightly rustdoc), each item that a feature gates says which.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "cli")]
mod cli;
pub mod config;
pub mod consumer;
mod destinations;
mod environment;
mod lambda;
mod logging;
mod metrics;
#[cfg(feature = "cli")]
mod operator;
#[cfg(feature = "opentelemetry")]
mod otlp;
pub mod outbox;
#[cfg(feature = "cli")]
mod poll;
mod redelivery;
#[cfg(feature = "s3")]
mod s3;
#[cfg(feature = "sqlite")]
mod sqlite;
mod sqs;
mod start;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transaction;
#[cfg(any(feature = "dynamodb", feature = "cli"))]
mod waiting;

pub use consumer::Consumer;
pub use sqs_once_core::{
    Body, BoxHandler, ErrorKind, Handler, HandlerError, HandlerFn, HandlerResult, Record, envelope, handler_fn,
};
#[cfg(feature = "testing")]
pub use sqs_once_engine::{admin_suite, claim_suite, commit_suite};
pub use sqs_once_engine::{event, report};
pub use start::{run, run_with};
