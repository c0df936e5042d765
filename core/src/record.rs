//! The view of one SQS message that a [`Handler`](crate::Handler) receives.

use std::{collections::HashMap, sync::Arc, time::Duration};

use aws_lambda_events::sqs::{SqsMessage, SqsMessageAttribute};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::{body::Body, envelope::Envelope, error::HandlerError, transaction::Transaction};

/// One SQS message, as the business handler sees it.
///
/// Besides the message itself it carries the idempotency key the message was
/// claimed under and the time left before the invocation must answer. When
/// messages arrive in an envelope (`SQS_ONCE_ENVELOPE`), `body` is the
/// publisher's message and `envelope` holds the envelope's fields.
#[derive(Debug, Clone)]
pub struct Record {
    /// The SQS message id.
    pub message_id: String,
    /// The message body as text (empty when the event carried none); with an
    /// envelope, the message inside it (SNS's `Message`, EventBridge's
    /// `detail`); for a message that points to S3, the payload read there.
    /// Shared, not copied (see [`Body`]).
    pub body: Body,
    /// The envelope the message arrived in, when one is configured.
    pub envelope: Option<Envelope>,
    /// The key this record was claimed under, as stored (prefixed, and hashed
    /// unless key hashing is off).
    pub key: String,
    /// How many times SQS has delivered this message, this delivery included.
    pub receive_count: u32,
    /// The message as SQS delivered it, shared with the batch rather than
    /// copied into every record.
    message: Arc<SqsMessage>,
    deadline: Instant,
    transaction: Transaction,
}

impl Record {
    /// The record a handler gets for `message`: `body` is what it reads
    /// (the message's body, the message inside its `envelope`, or the payload
    /// read from S3 for a pointer), `key` the key it was claimed under, and
    /// `deadline` when the invocation answers; it stages into `transaction`.
    /// A runner of its own builds records so; the engine does for its runs.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use aws_lambda_events::sqs::SqsMessage;
    /// use sqs_once::{Record, transaction::Transaction};
    ///
    /// let mut message = SqsMessage::default();
    /// message.message_id = Some("m-1".into());
    /// message.body = Some("{}".into());
    /// let message = Arc::new(message);
    /// let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    /// let body = message.body.as_deref().unwrap_or_default().into();
    /// let record = Record::new(&message, body, None, "orders#m-1".into(), deadline, Transaction::default());
    /// assert_eq!((record.message_id.as_str(), record.receive_count), ("m-1", 1));
    /// ```
    pub fn new(
        message: &Arc<SqsMessage>,
        body: Body,
        envelope: Option<Envelope>,
        key: String,
        deadline: Instant,
        transaction: Transaction,
    ) -> Self {
        Self {
            message_id: message.message_id.clone().unwrap_or_default(),
            body,
            envelope,
            key,
            receive_count: Self::receive_count_of(message),
            message: Arc::clone(message),
            deadline,
            transaction,
        }
    }

    /// `message`'s `ApproximateReceiveCount`, or 1 when the event lacks it:
    /// what [`receive_count`](Self::receive_count) holds for its record.
    pub fn receive_count_of(message: &SqsMessage) -> u32 {
        message.attributes.get("ApproximateReceiveCount").and_then(|count| count.parse().ok()).unwrap_or(1)
    }

    /// System attributes such as `ApproximateReceiveCount` or `MessageGroupId`.
    ///
    /// ```
    /// let record = sqs_once::testing::record("{}");
    /// assert_eq!(record.attributes()["ApproximateReceiveCount"], "1");
    /// ```
    pub fn attributes(&self) -> &HashMap<String, String> {
        &self.message.attributes
    }

    /// User message attributes.
    ///
    /// ```
    /// let record = sqs_once::testing::record("{}");
    /// let tenant = record.message_attributes().get("tenant").and_then(|value| value.string_value.as_deref());
    /// assert_eq!(tenant, None);
    /// ```
    pub fn message_attributes(&self) -> &HashMap<String, SqsMessageAttribute> {
        &self.message.message_attributes
    }

    /// The queue's ARN, when the event names it.
    ///
    /// ```
    /// let record = sqs_once::testing::record("{}");
    /// assert!(record.event_source_arn().is_some_and(|arn| arn.starts_with("arn:aws:sqs:")));
    /// ```
    pub fn event_source_arn(&self) -> Option<&str> {
        self.message.event_source_arn.as_deref()
    }

    /// Time left before the invocation answers; a handler that needs longer
    /// should return a retryable error instead of starting.
    pub fn remaining_time(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Where the handler stages DynamoDB writes and outbox messages, to
    /// commit in one transaction with the claim's completion when it returns
    /// success (see [`crate::transaction`]). Copies of the record share it.
    ///
    /// ```
    /// use sqs_once::transaction::{Key, Update};
    ///
    /// let record = sqs_once::testing::record(r#"{"account": "a-1"}"#);
    /// record.transaction().stage(Update::new("ledger", Key::new("pk", "a-1")).add("balance", 5))?;
    /// assert!(!record.transaction().is_empty());
    /// # Ok::<(), sqs_once::transaction::StageError>(())
    /// ```
    pub fn transaction(&self) -> &Transaction {
        &self.transaction
    }

    /// The body parsed as JSON into `T`; a body that does not parse is a
    /// permanent error, since redelivering the same bytes cannot fix it.
    ///
    /// ```
    /// use sqs_once::{ErrorKind, testing};
    ///
    /// #[derive(Debug, serde::Deserialize)]
    /// struct Order {
    ///     id: u64,
    /// }
    ///
    /// let order: Order = testing::record(r#"{"id": 7}"#).body_json().unwrap();
    /// assert_eq!(order.id, 7);
    /// let error = testing::record("not json").body_json::<Order>().unwrap_err();
    /// assert_eq!(error.kind(), ErrorKind::Permanent);
    /// ```
    pub fn body_json<T: DeserializeOwned>(&self) -> Result<T, HandlerError> {
        serde_json::from_str(&self.body).map_err(|e| HandlerError::permanent(format!("body does not parse: {e}")))
    }
}
