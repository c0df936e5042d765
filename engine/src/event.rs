//! Reading an SQS event one record at a time.
//!
//! A record that does not fit [`SqsMessage`] fails alone instead of failing
//! the whole event, as `serde`'s all-or-nothing parse of `SqsEvent` would.
//! Bodies stay text; whoever needs them as JSON parses them.

use std::sync::Arc;

use aws_lambda_events::sqs::SqsMessage;
use serde::Deserialize;
use serde_json::{Value, value::RawValue};

/// One entry of an event's `Records`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum EventRecord {
    /// A well-formed SQS message; the records handed to the handler share it.
    Message(Arc<SqsMessage>),
    /// A record with a message id whose other fields do not parse; it is
    /// reported failed.
    Malformed {
        /// The record's message id.
        message_id: String,
        /// What did not parse.
        reason: String,
        /// Its FIFO message group, if it names one, so the group still stops.
        fifo_group: Option<String>,
    },
}

impl EventRecord {
    /// The record's message id (never empty).
    pub fn message_id(&self) -> &str {
        match self {
            Self::Message(message) => message.message_id.as_deref().unwrap_or_default(),
            Self::Malformed { message_id, .. } => message_id,
        }
    }

    /// The record's FIFO message group, for a record of a FIFO queue (its
    /// `eventSourceARN` ends in `.fifo`): its `MessageGroupId`, or one shared
    /// group when it lacks one. `None` for a standard queue's record, also
    /// when it carries a `MessageGroupId`: on a standard queue that is a fair
    /// queue's tenant, not an order.
    pub fn fifo_group(&self) -> Option<&str> {
        let message = match self {
            Self::Message(message) => message,
            Self::Malformed { fifo_group, .. } => return fifo_group.as_deref(),
        };
        let fifo_queue = message.event_source_arn.as_deref().is_some_and(|arn| arn.ends_with(".fifo"));
        let group_id = message.attributes.get("MessageGroupId").map(String::as_str);
        fifo_queue.then(|| group_id.unwrap_or_default())
    }
}

/// An event that cannot be processed at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidEvent {
    /// The text is not JSON.
    #[error("not JSON: {0}")]
    NotJson(String),
    /// The JSON is not an SQS event.
    #[error("not an SQS event: {0}")]
    NotSqs(String),
    /// A record has no message id, so it could not be reported failed.
    #[error("invalid SQS event: record {0} has no messageId")]
    MissingMessageId(usize),
}

/// Splits an SQS event, as JSON text, into its records.
///
/// ```
/// use sqs_once::event::{parse_event, EventRecord, InvalidEvent};
///
/// let event = r#"{"Records": [
///     {"messageId": "m-1", "body": "not json", "eventSource": "aws:sqs"},
///     {"messageId": "m-2", "attributes": {"ApproximateReceiveCount": 2}}
/// ]}"#;
/// let records = parse_event(event).unwrap();
/// assert!(matches!(&records[0], EventRecord::Message(_)));
/// assert!(matches!(&records[1], EventRecord::Malformed { message_id, .. } if message_id == "m-2"));
/// assert!(matches!(parse_event(r#"{"detail-type": "x"}"#), Err(InvalidEvent::NotSqs(_))));
/// assert!(matches!(parse_event("{"), Err(InvalidEvent::NotJson(_))));
/// ```
pub fn parse_event(event: &str) -> Result<Vec<EventRecord>, InvalidEvent> {
    /// The event's records, each left as text: a well-formed record is read
    /// straight into an [`SqsMessage`], with no JSON tree built on the way.
    #[derive(Deserialize)]
    struct Records<'a> {
        #[serde(rename = "Records", borrow)]
        records: Option<Vec<&'a RawValue>>,
    }

    let not_sqs = || InvalidEvent::NotSqs("expected a JSON object with a `Records` array".into());
    let records = match serde_json::from_str::<Records<'_>>(event) {
        Ok(Records { records: Some(records) }) => records,
        Ok(Records { records: None }) => return Err(not_sqs()),
        Err(error) if error.is_syntax() || error.is_eof() => return Err(InvalidEvent::NotJson(error.to_string())),
        Err(_) => return Err(not_sqs()),
    };
    records.into_iter().enumerate().map(|(index, record)| parse_record(index, record.get())).collect()
}

/// What an invocation asks of the consumer.
#[derive(Debug)]
pub enum Invoked {
    /// Process these records.
    Batch(Vec<EventRecord>),
    /// Sweep the outbox: send the committed messages whose sender stopped or
    /// whose destination failed, as a schedule asks when the queue is quiet.
    OutboxSweep,
}

/// The `sqs-once` field of the event that asks for an outbox sweep, and its
/// value: `{"sqs-once": "outbox-sweep"}` (`events/outbox-sweep.json`, what
/// the template's schedule sends).
const SWEEP_FIELD: (&str, &str) = ("sqs-once", "outbox-sweep");

/// Reads an invocation's event: an SQS event ([`parse_event`]), or the
/// event that asks for an outbox sweep. Only an event that is not an SQS
/// event is looked at again, so a batch costs nothing more.
pub fn parse_invocation(event: &str) -> Result<Invoked, InvalidEvent> {
    match parse_event(event) {
        Ok(records) => Ok(Invoked::Batch(records)),
        Err(InvalidEvent::NotSqs(reason)) => {
            let asked = serde_json::from_str::<Value>(event).ok().and_then(|event| {
                let value = event.get(SWEEP_FIELD.0)?;
                Some(value.as_str() == Some(SWEEP_FIELD.1))
            });
            match asked {
                Some(true) => Ok(Invoked::OutboxSweep),
                Some(false) => Err(InvalidEvent::NotSqs(format!(
                    "`{}` asks for `{}` alone (an outbox sweep)",
                    SWEEP_FIELD.0, SWEEP_FIELD.1
                ))),
                None => Err(InvalidEvent::NotSqs(reason)),
            }
        }
        Err(invalid) => Err(invalid),
    }
}

fn parse_record(index: usize, record: &str) -> Result<EventRecord, InvalidEvent> {
    let message = match serde_json::from_str::<SqsMessage>(record) {
        Ok(message) => message,
        Err(error) => return parse_malformed(index, record, &error),
    };
    if let Some(source) = message.event_source.as_deref().filter(|source| *source != "aws:sqs") {
        return Err(not_from_sqs(index, source));
    }
    if message.message_id.as_deref().unwrap_or_default().is_empty() {
        return Err(InvalidEvent::MissingMessageId(index));
    }
    Ok(EventRecord::Message(Arc::new(message)))
}

/// A record that is not an [`SqsMessage`] (`error` says why): malformed if
/// it has a message id to report it failed under.
fn parse_malformed(index: usize, record: &str, error: &serde_json::Error) -> Result<EventRecord, InvalidEvent> {
    let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(record) else {
        return Err(InvalidEvent::NotSqs(format!("record {index} is not a JSON object")));
    };
    if let Some(source) = fields.get("eventSource").and_then(Value::as_str).filter(|source| *source != "aws:sqs") {
        return Err(not_from_sqs(index, source));
    }
    let message_id = match fields.get("messageId") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        _ => return Err(InvalidEvent::MissingMessageId(index)),
    };
    let fifo_queue = fields.get("eventSourceARN").and_then(Value::as_str).is_some_and(|arn| arn.ends_with(".fifo"));
    let group_id = fields.get("attributes").and_then(|attributes| attributes.get("MessageGroupId"));
    let fifo_group = fifo_queue.then(|| group_id.and_then(Value::as_str).unwrap_or_default().to_owned());
    Ok(EventRecord::Malformed { message_id, reason: format!("record does not parse: {error}"), fifo_group })
}

fn not_from_sqs(index: usize, source: &str) -> InvalidEvent {
    InvalidEvent::NotSqs(format!("record {index} comes from `{source}`, not aws:sqs"))
}

/// A message's `ApproximateReceiveCount`, or 1 when the event lacks it.
pub fn receive_count(message: &SqsMessage) -> u32 {
    message.attributes.get("ApproximateReceiveCount").and_then(|count| count.parse().ok()).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(event: Value) -> Result<Vec<EventRecord>, InvalidEvent> {
        parse_event(&event.to_string())
    }

    #[test]
    fn records_without_usable_ids_invalidate_the_event() {
        assert_eq!(parse(json!({"Records": [{"body": "x"}]})).unwrap_err(), InvalidEvent::MissingMessageId(0));
        let empty_id = json!({"Records": [{"messageId": "a"}, {"messageId": ""}]});
        assert_eq!(parse(empty_id).unwrap_err(), InvalidEvent::MissingMessageId(1));
        let numeric_id = json!({"Records": [{"messageId": 7}]});
        assert_eq!(parse(numeric_id).unwrap_err(), InvalidEvent::MissingMessageId(0));
        assert!(matches!(parse(json!({"Records": "nope"})), Err(InvalidEvent::NotSqs(_))));
        assert!(matches!(parse(json!({"Records": null})), Err(InvalidEvent::NotSqs(_))));
        assert!(matches!(parse(json!([1, 2])), Err(InvalidEvent::NotSqs(_))));
        assert!(matches!(parse(json!({"Records": [1]})), Err(InvalidEvent::NotSqs(_))));
        assert!(matches!(parse_event(r#"{"Records": [{"messageId": "a"}"#), Err(InvalidEvent::NotJson(_))));
        let kinesis = json!({"Records": [{"eventSource": "aws:kinesis", "messageId": "a"}]});
        assert!(parse(kinesis).unwrap_err().to_string().contains("aws:kinesis"));
        let malformed_kinesis = json!({"Records": [{"eventSource": "aws:kinesis", "messageId": "a", "body": 1}]});
        assert!(parse(malformed_kinesis).unwrap_err().to_string().contains("aws:kinesis"));
    }

    #[test]
    fn a_record_that_does_not_parse_fails_alone_and_says_why() {
        let event = json!({"Records": [
            {"messageId": "m-1", "body": "{\"id\": 1}", "attributes": {"ApproximateReceiveCount": "2"},
             "messageAttributes": {"kind": {"dataType": "String", "stringValue": "order"}}},
            {"messageId": "m-2", "body": {"id": 2}},
        ]});
        let records = parse(event).unwrap();
        let EventRecord::Message(message) = &records[0] else { panic!("m-1 is well formed: {:?}", records[0]) };
        assert_eq!(message.body.as_deref(), Some("{\"id\": 1}"));
        assert_eq!(message.attributes["ApproximateReceiveCount"], "2");
        assert_eq!(message.message_attributes["kind"].string_value.as_deref(), Some("order"));
        let EventRecord::Malformed { message_id, reason, .. } = &records[1] else { panic!("m-2 has a JSON body") };
        assert_eq!(message_id, "m-2");
        assert!(reason.contains("invalid type"), "{reason}");
    }

    #[test]
    fn only_a_fifo_queue_has_message_groups() {
        let record =
            |arn: &str| json!({"messageId": "m", "eventSourceARN": arn, "attributes": {"MessageGroupId": "tenant-a"}});
        let groups = |event| -> Vec<Option<String>> {
            parse(event).unwrap().iter().map(|record| record.fifo_group().map(str::to_owned)).collect()
        };
        let fifo = json!({"Records": [record("arn:aws:sqs:us-east-1:1:work.fifo")]});
        assert_eq!(groups(fifo), [Some("tenant-a".to_owned())]);
        let fair = json!({"Records": [record("arn:aws:sqs:us-east-1:1:work")]});
        assert_eq!(groups(fair), [None], "a MessageGroupId on a standard queue is a fair-queue tenant");
        let without_group =
            json!({"Records": [{"messageId": "m", "eventSourceARN": "arn:aws:sqs:us-east-1:1:w.fifo"}]});
        assert_eq!(groups(without_group), [Some(String::new())]);
        let malformed_fair = json!({"Records": [{"messageId": "m", "eventSourceARN": "arn:aws:sqs:us-east-1:1:w", "body": 1,
                                "attributes": {"MessageGroupId": "t"}}]});
        assert_eq!(groups(malformed_fair), [None]);
        let malformed_fifo = json!({"Records": [{"messageId": "m", "eventSourceARN": "arn:aws:sqs:us-east-1:1:w.fifo",
                                "body": 1, "attributes": {"MessageGroupId": "t"}}]});
        assert_eq!(groups(malformed_fifo), [Some("t".to_owned())]);
    }

    #[test]
    fn an_outbox_sweep_is_asked_for_by_its_own_event() {
        let sample = include_str!("../../events/outbox-sweep.json");
        assert!(matches!(parse_invocation(sample), Ok(Invoked::OutboxSweep)));
        assert!(matches!(parse_invocation(r#"{"Records": []}"#), Ok(Invoked::Batch(records)) if records.is_empty()));
        let other = parse_invocation(r#"{"sqs-once": "sweep"}"#).unwrap_err();
        assert!(other.to_string().contains("outbox-sweep"), "{other}");
        assert!(matches!(parse_invocation(r#"{"detail-type": "x"}"#), Err(InvalidEvent::NotSqs(_))));
        assert!(matches!(parse_invocation("{"), Err(InvalidEvent::NotJson(_))));
    }

    #[test]
    fn an_empty_batch_is_valid() {
        assert!(parse(json!({"Records": []})).unwrap().is_empty());
    }
}
