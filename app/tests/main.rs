//! The `sqs-once` binary's integration suites, one module per file, linked
//! as one test binary (each binary links the AWS SDK). The three long ones,
//! `ledger.rs`, `lifecycle.rs` and `poll.rs`, are binaries of their own: beside
//! the others, `poll`'s drain of 2,000 messages and the ledger's drains share
//! one SQS server, and the lifecycle's tests run one at a time.

mod common;

mod claims_cli;
mod dynamodb;
mod emulator;
mod faults;
mod invoke;
mod lambda;
mod managed;
mod new;
mod payloads;
mod sqs;
mod template;
mod traces;
