//! The engine of [`sqs-once`](https://docs.rs/sqs-once): one SQS batch in,
//! one partial-batch response out. It runs each record's handler once per
//! idempotency [`key`] through the claim machine, commits what the handler
//! staged with the claim, sends the [`outbox`], answers within the deadline's
//! [`budget`], and [`report`]s every record's outcome, with the
//! [`redelivery`] each failure asks for. It reads the Lambda [`event`] and
//! makes no AWS request of its own: the stores and destinations it runs
//! through are the vocabulary's traits (`sqs-once-core`), which the DynamoDB
//! store and `sqs-once`'s AWS destinations implement.
//!
//! Use it through `sqs-once`, whose Lambda function and `poll` are runners of
//! this engine. A runner of one's own (a loop other than Lambda's or
//! `poll`) builds an [`Engine`] with [`Engine::builder`] and hands it each
//! batch. A store of one's own runs the conformance suites of [`testing`]
//! (the `testing` feature). Everything public here is documented and checked
//! against the last release.
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

pub mod budget;
// The claim machine is the engine's own, public only under `testing`
// (`testing::Claims`), for a store's own tests: without that feature its
// `pub` items are reachable from nowhere, as meant.
#[cfg_attr(not(any(test, feature = "testing")), allow(unreachable_pub))]
mod claim;
#[cfg(any(test, feature = "testing"))]
mod clocks;
mod engine;
pub mod event;
pub mod key;
mod opened;
pub mod outbox;
pub mod redelivery;
pub mod report;
#[cfg(test)]
mod simulation;
mod spans;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use engine::{
    ClaimFirst, ClaimPolicy, Engine, EngineBuilder, EngineCounts, EngineOptions, Invocation, KeyMemory, jitter_spread,
};
