//! The library's integration suites, one module per file, linked as one test
//! binary (each binary links the AWS SDK). `traces.rs` stays a binary of its
//! own: it installs a subscriber, and tracing keeps callsite interest
//! process-wide.

mod common;

mod claims_dynamodb;
mod claims_memory;
mod claims_sqlite;
mod commits;
mod layers;
mod outbox;
mod own_store;
mod payloads;
mod staging;
