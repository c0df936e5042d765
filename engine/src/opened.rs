//! An SQS message with its envelope opened (`SQS_ONCE_ENVELOPE`): the view
//! that keys, payload validation, logs and the handler's [`Record`] are made
//! from, and the S3 pointer a message marked by the Extended Client carries.
//! The envelope's types are the vocabulary's (`sqs_once_core::envelope`);
//! opening one is the engine's.
//!
//! [`Record`]: sqs_once_core::Record

use std::{ops::Deref, sync::Arc};

use aws_lambda_events::sqs::SqsMessage;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::Instant;

use sqs_once_core::{
    Body, Record,
    envelope::{Envelope, EnvelopeKind, EventBridgeEvent, SnsNotification},
    payload::{PayloadPointer, RESERVED_ATTRIBUTES},
    transaction::Transaction,
};

/// A body that is not the configured envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("body is not {expected}: {reason}")]
pub(crate) struct InvalidEnvelope {
    expected: &'static str,
    reason: String,
}

/// The publisher's message as the engine holds it: borrowed from the event,
/// or a text of its own (an SNS notification's `Message`, a payload read
/// from S3) that the handler's [`Record::body`](sqs_once_core::Record) shares rather
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
    /// The message as SQS delivered it, shared with the handler's [`Record`](sqs_once_core::Record).
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

    /// The record a handler gets of the message, claimed under `key`, to
    /// finish by `deadline`, staging into `transaction`.
    pub(crate) fn record(&self, key: String, deadline: Instant, transaction: Transaction) -> Record {
        Record::new(self.message, self.body.body(), self.envelope.clone(), key, deadline, transaction)
    }

    /// The S3 pointer the message carries: `None` for a message without the
    /// pointer's attribute (on the SQS message, or for SNS's extended client
    /// on the notification inside the envelope), or why its body is not one.
    pub(crate) fn pointer(&self) -> Option<Result<PayloadPointer, String>> {
        self.size_attribute().map(|_| PayloadPointer::parse(&self.body))
    }

    /// The payload's size as the pointer's attribute declares it, in bytes.
    pub(crate) fn declared_size(&self) -> Option<u64> {
        self.size_attribute()??.trim().parse().ok()
    }

    /// The attribute that marks the message as a pointer, when one does: on
    /// the SQS message, or on the SNS notification inside the envelope; with
    /// its value, when it has a text one.
    fn size_attribute(&self) -> Option<Option<&str>> {
        RESERVED_ATTRIBUTES.iter().find_map(|name| {
            let on_message = self.message.message_attributes.get(*name).map(|value| value.string_value.as_deref());
            let on_envelope = match &self.envelope {
                Some(Envelope::Sns(notification)) => {
                    notification.message_attributes.get(*name).map(|value| Some(&*value.value))
                }
                _ => None,
            };
            on_message.or(on_envelope)
        })
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
    mod envelopes {
        use super::super::*;
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
    }

    mod pointers {
        use std::{collections::HashMap, sync::Arc};

        use aws_lambda_events::sqs::{SqsMessage, SqsMessageAttribute};
        use serde_json::json;

        use super::super::*;
        use sqs_once_core::payload::SIZE_ATTRIBUTE;

        fn message(body: &str, attributes: &[&str]) -> Arc<SqsMessage> {
            let mut message = SqsMessage::default();
            message.message_id = Some("m-1".into());
            message.body = Some(body.into());
            message.message_attributes = attributes
                .iter()
                .map(|name| {
                    let mut attribute = SqsMessageAttribute::default();
                    attribute.string_value = Some("300000".into());
                    attribute.data_type = Some("Number".into());
                    ((*name).to_owned(), attribute)
                })
                .collect::<HashMap<_, _>>();
            Arc::new(message)
        }

        // The body amazon-sqs-extended-client 1.0.1 (Python) sends, byte for byte.
        const PYTHON_BODY: &str = r#"["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3BucketName": "large", "s3Key": "5f1f4a47-2f63-4be8-8c3f-0b5c8a0d1e2f"}]"#;

        #[test]
        fn the_extended_clients_pointers_are_read_from_a_marked_message() {
            let pointer = PayloadPointer { bucket: "large".into(), key: "5f1f4a47-2f63-4be8-8c3f-0b5c8a0d1e2f".into() };
            let sent = message(PYTHON_BODY, &[SIZE_ATTRIBUTE]);
            assert_eq!(Opened::plain(&sent).pointer(), Some(Ok(pointer.clone())));
            for class in [
                "com.amazon.sqs.javamessaging.MessageS3Pointer",
                "com.amazonaws.services.extendedmessaging.MessageS3Pointer",
            ] {
                let legacy = PYTHON_BODY.replace("software.amazon.payloadoffloading.PayloadS3Pointer", class);
                let sent = message(&legacy, &["SQSLargePayloadSize"]);
                assert_eq!(Opened::plain(&sent).pointer(), Some(Ok(pointer.clone())), "{class}");
                assert_eq!(Opened::plain(&sent).declared_size(), Some(300_000));
            }
            assert_eq!(PayloadPointer::parse(&pointer.body()), Ok(pointer), "what sqs-once writes, it reads");
        }

        #[test]
        fn a_message_without_the_attribute_is_its_own_payload_whatever_its_body() {
            let sent = message(PYTHON_BODY, &["tenant"]);
            assert_eq!(Opened::plain(&sent).pointer(), None);
        }

        #[test]
        fn a_marked_message_whose_body_is_no_pointer_says_why() {
            let other = r#"["com.example.MessageS3Pointer", {"s3BucketName": "b", "s3Key": "k"}]"#;
            for body in ["{}", r#"["x.Other", {"s3BucketName": "b", "s3Key": "k"}]"#, other, r#"[1, 2]"#] {
                let sent = message(body, &[SIZE_ATTRIBUTE]);
                let refused = Opened::plain(&sent).pointer().expect("marked");
                assert!(refused.is_err(), "{body}");
            }
            let empty = r#"["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3BucketName": "", "s3Key": "k"}]"#;
            let sent = message(empty, &[SIZE_ATTRIBUTE]);
            assert_eq!(Opened::plain(&sent).pointer(), Some(Err("the S3 pointer names no bucket or no key".into())));
        }

        #[test]
        fn snss_extended_client_marks_the_notification_inside_the_envelope() {
            let notification = json!({
                "Type": "Notification",
                "MessageId": "95df01b4-ee98-5cb9-9903-4c221d41eb5e",
                "TopicArn": "arn:aws:sns:us-east-1:123456789012:orders",
                "Message": PYTHON_BODY,
                "Timestamp": "2026-11-23T10:00:00.000Z",
                "MessageAttributes": {"ExtendedPayloadSize": {"Type": "Number", "Value": "300000"}}
            });
            let sent = message(&notification.to_string(), &[]);
            let opened = Opened::new(&sent, EnvelopeKind::Sns).expect("an SNS notification");
            assert_eq!(opened.pointer().map(|pointer| pointer.map(|p| p.bucket)), Some(Ok("large".into())));
            assert_eq!(opened.declared_size(), Some(300_000));
        }
    }
}
