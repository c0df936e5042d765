//! Where outbox messages go: the [`Destinations`] a consumer sends through,
//! and the [`SendError`] a send ends with. The AWS destinations are
//! `sqs-once`'s; the outbox that sends through them is the engine's.

use async_trait::async_trait;

use crate::transaction::Message;

/// Why a message was not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
#[non_exhaustive]
pub struct SendError {
    /// The destination refused the message for good as it stands (no
    /// permission, no such queue, an invalid message); otherwise it failed
    /// and may take it later.
    pub refused: bool,
    /// Why, as the service put it.
    pub reason: String,
}

impl SendError {
    /// A send that failed and may succeed later (a timeout, throttling).
    pub fn failed(reason: impl Into<String>) -> Self {
        Self { refused: false, reason: reason.into() }
    }

    /// A send the destination refused for good as the message stands: the
    /// entry stays, counted as refused (`OutboxRefused`), until an operator
    /// acts.
    pub fn refused(reason: impl Into<String>) -> Self {
        Self { refused: true, reason: reason.into() }
    }
}

/// Where outbox messages go: by default the AWS services their
/// destinations name; a program may give its own
/// ([`Builder::destinations`](https://docs.rs/sqs-once/latest/sqs_once/consumer/struct.Builder.html#method.destinations)).
///
/// A message may be sent more than once (its sender stopped between the
/// send and the entry's deletion): `outbox_id` is the same each time, and the
/// receiver deduplicates on it.
#[async_trait]
pub trait Destinations: Send + Sync {
    /// Sends `message`, carrying `outbox_id` as its deduplication id.
    async fn send(&self, outbox_id: &str, message: &Message) -> Result<(), SendError>;
}
