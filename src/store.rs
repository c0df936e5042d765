//! Where claims live: the [`ClaimStore`] trait and its implementations.
//!
//! A store knows nothing of SQS or handlers. It offers the few atomic
//! operations the claim state machine is built from, and each store performs
//! them atomically in its own way: a mutex in memory, an immediate
//! transaction in SQLite, a conditional write in DynamoDB. The state machine
//! itself (who wins a key, when a lease ends, what a duplicate gets) is
//! written once above them, so a store of one's own inherits it; the
//! conformance suite (`claim_suite!`, feature `testing`) proves a store
//! keeps its part.
//!
//! A store of one's own implements [`ClaimStore`]'s four required methods
//! (claim if free, read, finish, release), then what it can of the
//! capabilities, each a trait its `ClaimStore` impl hands out in its
//! [`Capabilities`] ([`Capabilities::all`] for a store that offers the three):
//!
//! | capability | what needs it | its suite |
//! |---|---|---|
//! | [`CommitStore`] | a handler that stages writes ([`crate::transaction`]) | `commit_suite!` |
//! | [`OutboxStore`] | a handler that stages messages | `commit_suite!` |
//! | [`ClaimAdmin`] | `sqs-once claims` | `admin_suite!` |
//!
//! A consumer that needs one its store lacks refuses to start, naming it
//! (a handler that stages every effect, `claims`); a handler that stages
//! writes now and then on a store without commits fails those records for
//! good. `examples/own_store.rs` is a store of the four methods, given to
//! [`Consumer::builder`](crate::Consumer::builder) and run on Lambda.

pub use sqs_once_core::store::{
    Cancellation, Capabilities, ClaimAdmin, ClaimQuery, ClaimStatus, ClaimStore, Commit, CommitStore, Committed,
    Fenced, Finish, Listing, MemoryStore, OutboxStore, PutOutcome, StoreError, StoredClaim, Unclaimed,
};

#[cfg(feature = "sqlite")]
pub use crate::sqlite::SqliteStore;
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub use sqs_once_dynamodb::{Attributes, DynamoDbStore, TableKey, TableLayout};
