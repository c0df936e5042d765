//! Messages as `aws sqs receive-message` prints them, turned into the SQS
//! event Lambda would deliver with them, so that `invoke` takes either:
//! `aws sqs receive-message --queue-url … --attribute-names All
//! --message-attribute-names All | sqs-once invoke`.
//!
//! The AWS CLI prints the API's shape (`{"Messages": [{"MessageId",
//! "ReceiptHandle", "Body", "Attributes", "MessageAttributes"}]}`, names in
//! PascalCase, a message attribute as `{"StringValue", "DataType"}`); an
//! event record has the same fields in camelCase. The queue's ARN is not in
//! the output, so the records carry none (`invoke --sqs` needs it: give it an
//! event file instead).

use serde::Deserialize;
use serde_json::{Map, Value, json};

/// `receive-message` output: the messages, every other field skipped
/// unread (an SQS event's `Records` builds nothing here).
#[derive(Deserialize)]
struct Received {
    #[serde(rename = "Messages")]
    messages: Option<Vec<Value>>,
}

/// The SQS event of the messages `text` holds, when it is `receive-message`
/// output (an object with a `Messages` array); `None` for anything else.
pub(super) fn as_event(text: &str) -> Option<String> {
    let messages = serde_json::from_str::<Received>(text).ok()?.messages?;
    let records: Vec<Value> = messages.iter().map(record).collect();
    Some(json!({ "Records": records }).to_string())
}

/// One message as an event record.
fn record(message: &Value) -> Value {
    let mut record = Map::new();
    for (from, to) in [
        ("MessageId", "messageId"),
        ("ReceiptHandle", "receiptHandle"),
        ("Body", "body"),
        ("MD5OfBody", "md5OfBody"),
        ("MD5OfMessageAttributes", "md5OfMessageAttributes"),
    ] {
        if let Some(value) = message.get(from) {
            record.insert(to.into(), value.clone());
        }
    }
    record.insert("attributes".into(), message.get("Attributes").cloned().unwrap_or_else(|| json!({})));
    let attributes = message.get("MessageAttributes").and_then(Value::as_object);
    let attributes: Map<String, Value> =
        attributes.into_iter().flatten().map(|(name, value)| (name.clone(), message_attribute(value))).collect();
    record.insert("messageAttributes".into(), Value::Object(attributes));
    record.insert("eventSource".into(), json!("aws:sqs"));
    Value::Object(record)
}

/// A message attribute as an event record carries it.
fn message_attribute(value: &Value) -> Value {
    json!({
        "stringValue": value.get("StringValue"),
        "binaryValue": value.get("BinaryValue"),
        "stringListValues": [],
        "binaryListValues": [],
        "dataType": value.get("DataType"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqs_once_engine::event::{EventRecord, parse_event};

    #[test]
    fn receive_message_output_becomes_the_event_lambda_would_deliver() {
        let output = r#"{"Messages": [{
            "MessageId": "7a1c0000-0000-4000-8000-000000000001",
            "ReceiptHandle": "AQEB...",
            "MD5OfBody": "d41d8cd98f00b204e9800998ecf8427e",
            "Body": "{\"order_id\": \"o-1\"}",
            "Attributes": {"ApproximateReceiveCount": "3", "MessageGroupId": "g-1"},
            "MessageAttributes": {"tenant": {"StringValue": "acme", "DataType": "String"}}
        }]}"#;
        let event = as_event(output).expect("an event");
        let records = parse_event(&event).unwrap();
        let EventRecord::Message(message) = &records[0] else { panic!("{records:?}") };
        assert_eq!(message.message_id.as_deref(), Some("7a1c0000-0000-4000-8000-000000000001"));
        assert_eq!(message.body.as_deref(), Some(r#"{"order_id": "o-1"}"#));
        assert_eq!(message.attributes["ApproximateReceiveCount"], "3");
        assert_eq!(message.message_attributes["tenant"].string_value.as_deref(), Some("acme"));
        assert_eq!(message.receipt_handle.as_deref(), Some("AQEB..."));
    }

    #[test]
    fn anything_else_is_left_as_it_is() {
        assert_eq!(as_event(r#"{"Records": []}"#), None);
        assert_eq!(as_event("not json"), None);
        // No message received: an empty batch.
        assert_eq!(as_event(r#"{"Messages": []}"#).as_deref(), Some(r#"{"Records":[]}"#));
    }
}
