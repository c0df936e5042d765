//! Messages that reach the queue inside an envelope: an SNS notification
//! fanned out to the queue, or an EventBridge event sent to it.
//!
//! With an envelope configured (`SQS_ONCE_ENVELOPE`), the publisher's message
//! is what the key is derived from, what payload validation hashes, what the
//! logs show and what the handler gets as [`Record::body`](crate::Record);
//! the envelope's own fields travel beside it as an [`Envelope`]. SQS itself
//! (redelivery, the dead-letter queue) keeps the message as it arrived, so a
//! message moved to the dead-letter queue can be driven back unchanged.

use std::{collections::HashMap, fmt, ops::Deref, str::FromStr, sync::Arc};

use aws_lambda_events::sqs::SqsMessage;
use serde::Deserialize;

use crate::body::Body;
use serde_json::value::RawValue;

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

/// A body that is not the configured envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("body is not {expected}: {reason}")]
pub(crate) struct InvalidEnvelope {
    expected: &'static str,
    reason: String,
}

/// The publisher's message as the engine holds it: borrowed from the event,
/// or a text of its own (an SNS notification's `Message`, a payload read
/// from S3) that the handler's [`Record::body`](crate::Record) shares rather
/// than copies.
#[derive(Debug, Clone)]
pub(crate) enum Text<'m> {
    /// A part of the event as SQS delivered it.
    Delivered(&'m str),
    /// A text read from elsewhere.
    Read(Body),
}

impl Text<'_> {
    /// The text as a record's body: shared when it was read, a copy of the
    /// event's part otherwise.
    pub(crate) fn body(&self) -> Body {
        match self {
            Self::Delivered(text) => Body::from(*text),
            Self::Read(text) => text.clone(),
        }
    }
}

impl Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Self::Delivered(text) => text,
            Self::Read(text) => text,
        }
    }
}

/// An SQS message with its envelope opened: the view that keys, payload
/// validation, logs and the handler read.
#[derive(Debug, Clone)]
pub(crate) struct Opened<'m> {
    /// The message as SQS delivered it, shared with the handler's [`Record`](crate::Record).
    pub(crate) message: &'m Arc<SqsMessage>,
    /// The publisher's message: the body, or what the envelope wraps.
    pub(crate) body: Text<'m>,
    /// The envelope's fields, when there is an envelope.
    pub(crate) envelope: Option<Envelope>,
}

impl<'m> Opened<'m> {
    /// Opens `message`'s body as an envelope of `kind`.
    pub(crate) fn new(message: &'m Arc<SqsMessage>, kind: EnvelopeKind) -> Result<Self, InvalidEnvelope> {
        let text = message.body.as_deref().unwrap_or_default();
        let (body, envelope) = match kind {
            EnvelopeKind::None => return Ok(Self::plain(message)),
            EnvelopeKind::Sns => {
                let wire: SnsWire = parse(text, SNS_NOTIFICATION)?;
                if wire.kind != "Notification" {
                    return Err(InvalidEnvelope {
                        expected: SNS_NOTIFICATION,
                        reason: format!("its Type is `{}`", wire.kind),
                    });
                }
                (Text::Read(Body::from(wire.message)), Envelope::Sns(wire.notification))
            }
            EnvelopeKind::EventBridge => {
                let wire: EventBridgeWire<'m> = parse(text, EVENTBRIDGE_EVENT)?;
                (Text::Delivered(wire.detail.get()), Envelope::EventBridge(wire.event))
            }
        };
        Ok(Self { message, body, envelope: Some(envelope) })
    }

    /// `message` as it is, with no envelope.
    pub(crate) fn plain(message: &'m Arc<SqsMessage>) -> Self {
        Self { message, body: Text::Delivered(message.body.as_deref().unwrap_or_default()), envelope: None }
    }
}

/// An SNS notification as it travels: its `Message` beside its other fields.
#[derive(Deserialize)]
struct SnsWire {
    #[serde(rename = "Type")]
    kind: String,
    #[serde(rename = "Message")]
    message: String,
    #[serde(flatten)]
    notification: SnsNotification,
}

/// An EventBridge event as it travels; its `detail` is kept as the text it
/// was sent as, so the handler and payload validation see the publisher's
/// bytes.
#[derive(Deserialize)]
struct EventBridgeWire<'m> {
    #[serde(borrow)]
    detail: &'m RawValue,
    #[serde(flatten)]
    event: EventBridgeEvent,
}

/// What an SNS envelope is, worded for the user whose subscription has raw
/// message delivery on, the likeliest reason a body is not one.
const SNS_NOTIFICATION: &str = "an SNS notification (with raw message delivery on, set SQS_ONCE_ENVELOPE=none)";
const EVENTBRIDGE_EVENT: &str = "an EventBridge event";

fn parse<'m, T: Deserialize<'m>>(text: &'m str, expected: &'static str) -> Result<T, InvalidEnvelope> {
    serde_json::from_str(text).map_err(|error| InvalidEnvelope { expected, reason: error.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(body: serde_json::Value) -> Arc<SqsMessage> {
        let mut message = SqsMessage::default();
        message.message_id = Some("m-1".into());
        message.body = Some(body.to_string());
        Arc::new(message)
    }

    fn sns(inner: &str) -> serde_json::Value {
        json!({
            "Type": "Notification",
            "MessageId": "95df01b4-ee98-5cb9-9903-4c221d41eb5e",
            "TopicArn": "arn:aws:sns:us-east-1:123456789012:orders",
            "Subject": "order",
            "Message": inner,
            "Timestamp": "2026-11-23T10:00:00.000Z",
            "SignatureVersion": "1",
            "Signature": "EXAMPLE",
            "SigningCertURL": "https://sns.us-east-1.amazonaws.com/cert.pem",
            "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe",
            "MessageAttributes": {"tenant": {"Type": "String", "Value": "t-9"}}
        })
    }

    #[test]
    fn an_sns_notification_opens_to_its_message_and_fields() {
        let message = message(sns(r#"{"order_id":"o-77"}"#));
        let opened = Opened::new(&message, EnvelopeKind::Sns).unwrap();
        assert_eq!(&*opened.body, r#"{"order_id":"o-77"}"#);
        let Some(Envelope::Sns(notification)) = opened.envelope else { panic!("no SNS envelope") };
        assert_eq!(notification.topic_arn, "arn:aws:sns:us-east-1:123456789012:orders");
        assert_eq!(notification.subject.as_deref(), Some("order"));
        assert_eq!(notification.timestamp, "2026-11-23T10:00:00.000Z");
        assert_eq!(notification.message_attributes["tenant"].value, "t-9");
        assert_eq!(notification.message_attributes["tenant"].data_type, "String");
    }

    #[test]
    fn an_eventbridge_event_opens_to_its_detail_as_sent() {
        let body = r#"{"version":"0","id":"e-1","detail-type":"OrderPlaced","source":"shop.orders","account":"123456789012","time":"2026-11-23T10:00:00Z","region":"us-east-1","resources":[],"detail":{"z":1, "order_id":"o-77"}}"#;
        let mut message = SqsMessage::default();
        message.body = Some(body.into());
        let message = Arc::new(message);
        let opened = Opened::new(&message, EnvelopeKind::EventBridge).unwrap();
        assert_eq!(&*opened.body, r#"{"z":1, "order_id":"o-77"}"#, "detail kept byte for byte");
        let Some(Envelope::EventBridge(event)) = opened.envelope else { panic!("no EventBridge envelope") };
        assert_eq!(
            (event.id.as_str(), event.source.as_str(), event.detail_type.as_str()),
            ("e-1", "shop.orders", "OrderPlaced")
        );
        assert_eq!(event.region.as_deref(), Some("us-east-1"));
    }

    #[test]
    fn a_body_that_is_not_the_envelope_is_refused_with_its_reason() {
        let raw = message(json!({"order_id": "o-77"}));
        let error = Opened::new(&raw, EnvelopeKind::Sns).unwrap_err().to_string();
        assert!(error.starts_with("body is not an SNS notification (with raw message delivery on, set SQS_ONCE_ENVELOPE=none): missing field"), "{error}");
        let mut not_json = SqsMessage::default();
        not_json.body = Some("plain text".into());
        assert!(Opened::new(&Arc::new(not_json), EnvelopeKind::EventBridge).is_err());
        let confirmation = message(
            json!({"Type": "SubscriptionConfirmation", "MessageId": "x", "TopicArn": "t", "Message": "m", "Timestamp": "t"}),
        );
        let error = Opened::new(&confirmation, EnvelopeKind::Sns).unwrap_err().to_string();
        assert!(error.contains("its Type is `SubscriptionConfirmation`"), "{error}");
        let no_detail = message(json!({"id": "e", "source": "s", "detail-type": "d"}));
        assert!(Opened::new(&no_detail, EnvelopeKind::EventBridge).unwrap_err().to_string().contains("detail"));
    }

    #[test]
    fn without_an_envelope_the_body_is_borrowed_as_it_is() {
        let message = message(sns("x"));
        let opened = Opened::new(&message, EnvelopeKind::None).unwrap();
        assert!(matches!(opened.body, Text::Delivered(_)));
        assert!(opened.envelope.is_none());
    }

    #[test]
    fn an_sns_envelope_opens_and_a_plain_message_is_itself() {
        use aws_lambda_events::sqs::SqsMessage;

        let mut message = SqsMessage::default();
        message.body = Some(
            serde_json::json!({
                "Type": "Notification", "MessageId": "sns-1", "TopicArn": "arn:aws:sns:eu-west-1:123456789012:orders",
                "Message": "{\"order_id\":\"o-77\"}", "Timestamp": "2026-11-23T10:00:00.000Z",
            })
            .to_string(),
        );

        let message = Arc::new(message);
        let opened = Opened::new(&message, EnvelopeKind::Sns).unwrap();
        assert_eq!(&*opened.body, r#"{"order_id":"o-77"}"#);
        assert!(matches!(&opened.envelope, Some(Envelope::Sns(sns)) if sns.message_id == "sns-1"));

        // Without an envelope the body is the message itself.
        assert_eq!(&*Opened::plain(&message).body, message.body.as_deref().unwrap());
    }

    #[test]
    fn envelope_kinds_parse_by_name() {
        assert_eq!("sns".parse::<EnvelopeKind>().unwrap(), EnvelopeKind::Sns);
        assert_eq!(EnvelopeKind::default(), EnvelopeKind::None);
        assert!("kinesis".parse::<EnvelopeKind>().is_err());
    }
}
