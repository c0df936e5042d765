//! The vocabulary of [`sqs-once`](https://docs.rs/sqs-once): what handlers,
//! stores and destinations are written in. The [`Handler`] and its
//! [`Record`] with the [`HandlerError`] it fails with, the staged
//! [`transaction`], the [`store`] traits and types with the in-memory store,
//! the outbox's [`destinations`], large [`payload`]s kept in S3, message
//! [`envelope`]s, [`trace`] contexts and the [`clock`]. It makes no AWS
//! request and runs nothing: the engine that runs batches through these is
//! `sqs-once-engine`, above it. Of the AWS SDK it names only
//! `aws-sdk-dynamodb`'s types (the `dynamodb` feature): a handler may stage an
//! SDK `TransactWriteItem` of its own.
//!
//! A handler's crate uses it through `sqs-once`, which re-exports everything
//! here a program needs. A store, destination or payload store of one's own
//! may depend on this crate alone, and is checked against the engine's
//! conformance suites (`sqs_once_engine::testing`, a dev-dependency).
//! Everything public here is documented and checked against the last
//! release.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
pub mod clock;
pub mod destinations;
pub mod envelope;
mod error;
mod handler;
pub mod payload;
mod record;
pub mod store;
pub mod trace;
pub mod transaction;

pub use body::Body;
pub use error::{ErrorKind, HandlerError};
pub use handler::{BoxHandler, BuildHandler, Handler, HandlerFn, HandlerResult, handler_fn};
pub use record::Record;
