//! Reading an SQS event one record at a time.
//!
//! A record that does not fit [`SqsMessage`] fails alone instead of failing
//! the whole event, as `serde`'s all-or-nothing parse of `SqsEvent` would.
//! Bodies stay text; whoever needs them as JSON parses them.

use aws_lambda_events::sqs::SqsMessage;
use serde_json::Value;

/// One entry of an event's `Records`.
#[derive(Debug, Clone)]
pub enum EventRecord {
    /// A well-formed SQS message.
    Message(Box<SqsMessage>),
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
    pub(crate) fn fifo_group(&self) -> Option<&str> {
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
pub enum InvalidEvent {
    /// The JSON is not an SQS event.
    #[error("not an SQS event: {0}")]
    NotSqs(String),
    /// A record has no message id, so it could not be reported failed.
    #[error("invalid SQS event: record {0} has no messageId")]
    MissingMessageId(usize),
}

/// Splits an SQS event into its records.
///
/// ```
/// use sqs_once::event::{parse_event, EventRecord};
///
/// let event = serde_json::json!({"Records": [
///     {"messageId": "m-1", "body": "not json", "eventSource": "aws:sqs"},
///     {"messageId": "m-2", "attributes": {"ApproximateReceiveCount": 2}},
/// ]});
/// let records = parse_event(event).unwrap();
/// assert!(matches!(&records[0], EventRecord::Message(_)));
/// assert!(matches!(&records[1], EventRecord::Malformed { message_id, .. } if message_id == "m-2"));
/// assert!(parse_event(serde_json::json!({"detail-type": "x"})).is_err());
/// ```
pub fn parse_event(event: Value) -> Result<Vec<EventRecord>, InvalidEvent> {
    let Value::Object(mut event) = event else {
        return Err(InvalidEvent::NotSqs("expected a JSON object with a `Records` array".into()));
    };
    let Some(Value::Array(records)) = event.remove("Records") else {
        return Err(InvalidEvent::NotSqs("expected a JSON object with a `Records` array".into()));
    };
    records.into_iter().enumerate().map(|(index, record)| parse_record(index, record)).collect()
}

fn parse_record(index: usize, record: Value) -> Result<EventRecord, InvalidEvent> {
    let Value::Object(fields) = &record else {
        return Err(InvalidEvent::NotSqs(format!("record {index} is not a JSON object")));
    };
    if let Some(source) = fields.get("eventSource").and_then(Value::as_str).filter(|source| *source != "aws:sqs") {
        return Err(InvalidEvent::NotSqs(format!("record {index} comes from `{source}`, not aws:sqs")));
    }
    let message_id = match fields.get("messageId") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        _ => return Err(InvalidEvent::MissingMessageId(index)),
    };
    let fifo_queue = fields.get("eventSourceARN").and_then(Value::as_str).is_some_and(|arn| arn.ends_with(".fifo"));
    let group_id = record.pointer("/attributes/MessageGroupId").and_then(Value::as_str).unwrap_or_default();
    let fifo_group = fifo_queue.then(|| group_id.to_owned());
    Ok(match serde_json::from_value::<SqsMessage>(record) {
        Ok(message) => EventRecord::Message(Box::new(message)),
        Err(error) => {
            EventRecord::Malformed { message_id, reason: format!("record does not parse: {error}"), fifo_group }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn records_without_usable_ids_invalidate_the_event() {
        assert_eq!(parse_event(json!({"Records": [{"body": "x"}]})).unwrap_err(), InvalidEvent::MissingMessageId(0));
        let empty_id = json!({"Records": [{"messageId": "a"}, {"messageId": ""}]});
        assert_eq!(parse_event(empty_id).unwrap_err(), InvalidEvent::MissingMessageId(1));
        assert!(parse_event(json!({"Records": "nope"})).is_err());
        assert!(parse_event(json!([1, 2])).is_err());
        let kinesis = json!({"Records": [{"eventSource": "aws:kinesis", "messageId": "a"}]});
        assert!(parse_event(kinesis).unwrap_err().to_string().contains("aws:kinesis"));
    }

    #[test]
    fn only_a_fifo_queue_has_message_groups() {
        let record =
            |arn: &str| json!({"messageId": "m", "eventSourceARN": arn, "attributes": {"MessageGroupId": "tenant-a"}});
        let groups = |event| -> Vec<Option<String>> {
            parse_event(event).unwrap().iter().map(|record| record.fifo_group().map(str::to_owned)).collect()
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
    }

    #[test]
    fn an_empty_batch_is_valid() {
        assert!(parse_event(json!({"Records": []})).unwrap().is_empty());
    }
}
