//! The engine of [`sqs-once`](https://docs.rs/sqs-once), making no AWS request:
//! the [`Handler`] and its [`Record`], idempotency [`key`]s, the
//! [`engine`] that runs a batch through the claim machine, the [`store`],
//! [`outbox`] and [`payload`] interfaces with the in-memory store, staged
//! [`transaction`]s, [`report`]s, the [`clock`] and the deadline's
//! [`budget`], and [`trace`] contexts. Of the AWS SDK it names only
//! `aws-sdk-dynamodb`'s types: a handler may stage an SDK
//! `TransactWriteItem` of its own.
//!
//! Use it through `sqs-once`, which re-exports everything here a program
//! needs beside the Lambda function, `poll`, the DynamoDB and SQLite stores,
//! the AWS destinations and the settings. A store or destination of one's own
//! may depend on this crate alone; a runner of one's own (a loop other than
//! Lambda's or `poll`) builds an [`Engine`](engine::Engine) with
//! [`Engine::builder`](engine::Engine::builder). Everything public here is
//! documented and checked against the last release: the crates sqs-once is
//! cut into build on this API and nothing else.
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

mod body;
pub mod budget;
// The claim machine is the engine's own, public only under `testing`
// (`testing::Claims`), for a store's own tests: without that feature its
// `pub` items are reachable from nowhere, as meant.
#[cfg_attr(not(any(test, feature = "testing")), allow(unreachable_pub))]
mod claim;
pub mod clock;
pub mod engine;
pub mod envelope;
pub mod event;
mod handler;
pub mod key;
pub mod outbox;
pub mod payload;
mod record;
pub mod redelivery;
pub mod report;
#[cfg(test)]
mod simulation;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trace;
pub mod transaction;

pub use body::Body;
pub use handler::{BoxHandler, BuildHandler, ErrorKind, Handler, HandlerError, HandlerFn, HandlerResult, handler_fn};
pub use record::Record;
