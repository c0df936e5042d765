//! The bundled `sqs-once` binary, as a library for its tests and
//! benchmarks: the [`handlers`] it can run, chosen by `SQS_ONCE_HANDLER`,
//! and the consumer crate [`new`] writes.
//!
//! The binary uses only the public API of the `sqs-once` library, as a
//! consumer crate of one's own does.

pub mod handlers;
pub mod new;
