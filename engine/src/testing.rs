//! The conformance suites every store passes ([`claim_suite!`](crate::claim_suite),
//! [`admin_suite!`](crate::admin_suite), [`commit_suite!`](crate::commit_suite)),
//! for a store of one's own. `sqs-once` re-exports them (`sqs_once::claim_suite!`)
//! beside `sqs_once::testing::TestConsumer`. A store's own tests beyond the
//! suites drive it through [`Claims`], the claim machine the engine drives
//! every store through, and run [`Directed`], a handler each record's body
//! directs.

// Macro support, as tokio's and axum-core's `__private` are: the suites'
// tests, one function each, which `claim_suite!`, `admin_suite!` and
// `commit_suite!` expand to calls of. The macros are their documentation.
#[doc(hidden)]
pub mod __private;

mod directed;

pub use crate::claim::{Claim, ClaimRequest, Claims, Lease};
pub use directed::Directed;

use aws_lambda_events::sqs::SqsMessage;

/// An SQS message with `id` and `body`, received once, from a standard queue.
///
/// ```
/// let message = sqs_once::testing::message("m-1", r#"{"n": 1}"#);
/// assert_eq!(message.attributes["ApproximateReceiveCount"], "1");
/// ```
pub fn message(id: &str, body: impl Into<String>) -> SqsMessage {
    let mut message = SqsMessage::default();
    message.message_id = Some(id.to_owned());
    message.body = Some(body.into());
    message.event_source = Some("aws:sqs".to_owned());
    message.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:work".to_owned());
    message.attributes.insert("ApproximateReceiveCount".to_owned(), "1".to_owned());
    message
}
