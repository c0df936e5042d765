//! Messages a handler sends through the outbox: written in the transaction
//! with the claim, sent after the commit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "service", rename_all = "lowercase")]
pub enum Destination {
    /// An SQS queue (`SendMessage`).
    Sqs {
        /// The queue URL.
        queue_url: String,
    },
    /// An SNS topic (`Publish`).
    Sns {
        /// The topic ARN.
        topic_arn: String,
    },
    /// An EventBridge event bus (`PutEvents`).
    #[serde(rename = "eventbridge")]
    EventBridge {
        /// The bus name or ARN (`default` for the account's default bus).
        event_bus: String,
        /// The event's `source`.
        source: String,
        /// The event's `detail-type`.
        detail_type: String,
    },
}

impl Destination {
    /// Whether the destination is a FIFO queue or topic (its name ends in
    /// `.fifo`): it then needs a message group and takes a deduplication id.
    pub fn is_fifo(&self) -> bool {
        match self {
            Self::Sqs { queue_url } => queue_url.ends_with(".fifo"),
            Self::Sns { topic_arn } => topic_arn.ends_with(".fifo"),
            Self::EventBridge { .. } => false,
        }
    }

    /// The queue, topic or bus, for logs.
    pub fn name(&self) -> &str {
        match self {
            Self::Sqs { queue_url } => queue_url,
            Self::Sns { topic_arn } => topic_arn,
            Self::EventBridge { event_bus, .. } => event_bus,
        }
    }
}

/// A message to send once the handler's transaction has committed.
///
/// Each message sent carries an id that stays the same however often it is
/// sent: the outbox id, as the message attribute [`OUTBOX_ID_ATTRIBUTE`]
/// (SQS, SNS), as the deduplication id on FIFO destinations, and as the
/// `sqs_once_outbox_id` field of an EventBridge event's `detail` object. A
/// downstream sqs-once consumer keys on it with
/// `SQS_ONCE_KEY=messageAttributes.SqsOnce.OutboxId`.
///
/// ```
/// use sqs_once::transaction::Message;
///
/// let receipt = Message::sqs("https://sqs.eu-west-1.amazonaws.com/123456789012/receipts", r#"{"order":"o-1"}"#)
///     .attribute("kind", "receipt");
/// let fifo = Message::sqs("https://sqs.eu-west-1.amazonaws.com/123456789012/audit.fifo", "o-1 paid").group("o-1");
/// let event = Message::event("default", "shop.orders", "OrderPaid", serde_json::json!({"order": "o-1"}));
/// let topic = Message::sns("arn:aws:sns:eu-west-1:123456789012:orders", "o-1 paid");
/// # let _ = (receipt, fifo, event, topic);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Where it goes.
    pub destination: Destination,
    /// The body (an event's `detail`, as JSON text).
    pub body: String,
    /// String message attributes (SQS, SNS).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
    /// The message group, which FIFO destinations require.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
}

/// The message attribute that carries a sent message's outbox id.
pub const OUTBOX_ID_ATTRIBUTE: &str = "SqsOnce.OutboxId";

/// The field of an EventBridge event's `detail` object that carries its
/// outbox id (EventBridge events have no attributes).
pub const OUTBOX_ID_FIELD: &str = "sqs_once_outbox_id";

impl Message {
    /// A message for the SQS queue at `queue_url`.
    pub fn sqs(queue_url: impl Into<String>, body: impl Into<String>) -> Self {
        Self::to(Destination::Sqs { queue_url: queue_url.into() }, body.into())
    }

    /// A message for the SNS topic `topic_arn`.
    pub fn sns(topic_arn: impl Into<String>, body: impl Into<String>) -> Self {
        Self::to(Destination::Sns { topic_arn: topic_arn.into() }, body.into())
    }

    /// An event for the EventBridge bus `event_bus`, with `detail` as its detail.
    pub fn event(
        event_bus: impl Into<String>,
        source: impl Into<String>,
        detail_type: impl Into<String>,
        detail: serde_json::Value,
    ) -> Self {
        let destination = Destination::EventBridge {
            event_bus: event_bus.into(),
            source: source.into(),
            detail_type: detail_type.into(),
        };
        Self::to(destination, detail.to_string())
    }

    /// Adds a string message attribute (SQS and SNS; an event has none).
    pub fn attribute(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.attributes.insert(name.into(), value.into());
        self
    }

    /// The message group: required on FIFO queues and topics.
    pub fn group(mut self, group_id: impl Into<String>) -> Self {
        self.group_id = Some(group_id.into());
        self
    }

    fn to(destination: Destination, body: String) -> Self {
        Self { destination, body, attributes: BTreeMap::new(), group_id: None }
    }

    /// Its size as the outbox item that holds it counts it.
    pub(super) fn size(&self) -> usize {
        let attributes: usize = self.attributes.iter().map(|(name, value)| name.len() + value.len()).sum();
        self.body.len() + attributes + self.destination.name().len() + self.group_id.as_ref().map_or(0, String::len)
    }
}
