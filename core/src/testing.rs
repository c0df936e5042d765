//! The conformance suites every store passes ([`claim_suite!`](crate::claim_suite),
//! [`admin_suite!`](crate::admin_suite), [`commit_suite!`](crate::commit_suite)),
//! for a store of one's own. `sqs-once` re-exports them (`sqs_once::claim_suite!`)
//! beside `sqs_once::testing::TestConsumer`.

// The suites' tests, one function each, are what `claim_suite!`,
// `admin_suite!` and `commit_suite!` expand to calls of; the macros are their
// documentation.
#[doc(hidden)]
pub mod admin_suite;
#[doc(hidden)]
pub mod claim_suite;
#[doc(hidden)]
pub mod commit_suite;

mod directed;

#[doc(hidden)]
pub use directed::Directed;
