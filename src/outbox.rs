//! The outbox: messages a handler staged, written in its transaction with
//! the claim and sent after the commit; each leaves as an [`OutboxEntry`]
//! the store keeps until a sender has sent it, to the AWS services its
//! destination names or to the [`Destinations`] a program gives its
//! consumer. The sending is the engine's ([`Outbox`]); the destinations'
//! interface and the entries are the vocabulary's, which stores and
//! destinations of one's own are written in.

pub use sqs_once_core::{
    destinations::{Destinations, SendError},
    store::{OutboxEntry, OutboxQuery, SweepPart, UnreadableEntry},
};
pub use sqs_once_engine::outbox::{LeaseTooShort, Outbox, OutboxTimes};
