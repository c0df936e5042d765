//! Messages that reach the queue inside an envelope: an SNS notification
//! fanned out to the queue, or an EventBridge event sent to it.
//!
//! With an envelope configured (`SQS_ONCE_ENVELOPE`), the publisher's message
//! is what the key is derived from, what payload validation hashes, what the
//! logs show and what the handler gets as [`Record::body`](crate::Record);
//! the envelope's own fields travel beside it as an [`Envelope`]. SQS itself
//! (redelivery, the dead-letter queue) keeps the message as it arrived, so a
//! message moved to the dead-letter queue can be driven back unchanged.

use std::{collections::HashMap, fmt, str::FromStr};

use serde::Deserialize;

/// Which envelope message bodies arrive in (`SQS_ONCE_ENVELOPE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EnvelopeKind {
    /// The body is the message itself (a direct send, or SNS with raw
    /// message delivery on).
    #[default]
    None,
    /// The body is an SNS notification; the message is its `Message`.
    Sns,
    /// The body is an EventBridge event; the message is its `detail`.
    EventBridge,
}

impl FromStr for EnvelopeKind {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "none" => Ok(Self::None),
            "sns" => Ok(Self::Sns),
            "eventbridge" => Ok(Self::EventBridge),
            other => Err(format!("`{other}` (valid: none, sns, eventbridge)")),
        }
    }
}

impl fmt::Display for EnvelopeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Sns => "sns",
            Self::EventBridge => "eventbridge",
        })
    }
}

/// The envelope a message arrived in, without the message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Envelope {
    /// An SNS notification.
    Sns(SnsNotification),
    /// An EventBridge event.
    EventBridge(EventBridgeEvent),
}

/// The fields of an SNS notification as SQS delivers it (raw message
/// delivery off), its `Message` excepted.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SnsNotification {
    /// The SNS message id: the same in every copy SNS delivers of one
    /// publish, so `envelope.MessageId` keys away SNS's own duplicates.
    pub message_id: String,
    /// The topic the message was published to.
    pub topic_arn: String,
    /// When it was published (ISO 8601, as SNS writes it).
    pub timestamp: String,
    /// The subject, when the publisher gave one.
    #[serde(default)]
    pub subject: Option<String>,
    /// The publisher's message attributes.
    #[serde(default)]
    pub message_attributes: HashMap<String, SnsMessageAttribute>,
}

/// One SNS message attribute.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SnsMessageAttribute {
    /// `String`, `String.Array`, `Number` or `Binary`.
    #[serde(rename = "Type")]
    pub data_type: String,
    /// The value as text (base64 for `Binary`).
    #[serde(rename = "Value")]
    pub value: String,
}

/// The fields of an EventBridge event, its `detail` excepted.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EventBridgeEvent {
    /// The event id: the same in every copy EventBridge delivers of one
    /// event, so `envelope.id` keys away its duplicates.
    pub id: String,
    /// Who emitted the event.
    pub source: String,
    /// What kind of event it is.
    #[serde(rename = "detail-type")]
    pub detail_type: String,
    /// When it happened (ISO 8601).
    #[serde(default)]
    pub time: Option<String>,
    /// The account it comes from.
    #[serde(default)]
    pub account: Option<String>,
    /// The region it comes from.
    #[serde(default)]
    pub region: Option<String>,
    /// The resources it concerns.
    #[serde(default)]
    pub resources: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_kinds_parse_by_name() {
        assert_eq!("sns".parse::<EnvelopeKind>().unwrap(), EnvelopeKind::Sns);
        assert_eq!(EnvelopeKind::default(), EnvelopeKind::None);
        assert!("kinesis".parse::<EnvelopeKind>().is_err());
    }
}
