//! Putting outbox messages on EventBridge buses, up to ten in a `PutEvents`.

use async_trait::async_trait;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;

use super::{Unsent, trace_header};
use sqs_once_aws::batched::BatchCall;
use sqs_once_core::{
    destinations::SendError,
    trace::Propagators,
    transaction::{Message, OUTBOX_ID_FIELD},
};

const OPERATION: &str = "EventBridge PutEvents";

/// An event to put, with its outbox id.
#[derive(Debug)]
pub(super) struct Put {
    outbox_id: String,
    entry: PutEventsRequestEntry,
}

impl Put {
    /// The event of `message`, to `event_bus` from `source` as `detail_type`:
    /// its detail with the outbox id in it, its trace context as its trace
    /// header where X-Ray's header is written.
    pub(super) fn new(
        (event_bus, source, detail_type): (&str, &str, &str),
        outbox_id: &str,
        message: &Message,
        propagators: Propagators,
    ) -> Result<Self, SendError> {
        let mut detail: serde_json::Value = serde_json::from_str(&message.body)
            .map_err(|error| SendError::refused(format!("the event's detail is not JSON: {error}")))?;
        if let Some(fields) = detail.as_object_mut() {
            fields.insert(OUTBOX_ID_FIELD.to_owned(), outbox_id.into());
        }
        let entry = PutEventsRequestEntry::builder()
            .event_bus_name(event_bus)
            .source(source)
            .detail_type(detail_type)
            .detail(detail.to_string())
            .set_trace_header(trace_header(message, propagators))
            .build();
        Ok(Self { outbox_id: outbox_id.to_owned(), entry })
    }

    /// Its entry in a request.
    #[cfg(test)]
    pub(super) fn entry(&self) -> &PutEventsRequestEntry {
        &self.entry
    }

    /// Its size as EventBridge counts it against a request's limit: its
    /// source, detail type and detail (it names no time or resources).
    fn bytes(&self) -> usize {
        let entry = &self.entry;
        [entry.source(), entry.detail_type(), entry.detail()].into_iter().flatten().map(str::len).sum()
    }
}

/// The events put on one bus at the same time, gathered into `PutEvents`
/// requests: up to ten events and less than 256 KiB a request (EventBridge
/// bills each 64 KiB of an event as one event, batched or not), each event
/// answered on its own, in the request's order.
#[derive(Debug)]
pub(super) struct BusPuts {
    eventbridge: aws_sdk_eventbridge::Client,
}

impl BusPuts {
    pub(super) fn new(eventbridge: aws_sdk_eventbridge::Client) -> Self {
        Self { eventbridge }
    }
}

#[async_trait]
impl BatchCall for BusPuts {
    type Input = Put;
    type Output = ();
    type Error = Unsent;
    const LIMIT: usize = 10;
    const MAX_BYTES: usize = 256 * 1024 - 1;
    const IN_FLIGHT: usize = 4;

    fn item(put: &Put) -> &str {
        &put.outbox_id
    }

    fn bytes(put: &Put) -> usize {
        put.bytes()
    }

    async fn call(&self, inputs: Vec<Put>) -> Vec<Result<(), Unsent>> {
        let count = inputs.len();
        let entries = inputs.into_iter().map(|put| put.entry).collect();
        let output = match self.eventbridge.put_events().set_entries(Some(entries)).send().await {
            Ok(output) => output,
            Err(error) => return vec![Err(Unsent::of_request(OPERATION, &error)); count],
        };
        let mut answers = output.entries().iter();
        let answer = |_| match answers.next() {
            Some(result) => match result.error_code() {
                Some(code) => Err(Unsent::of_entry(OPERATION, code, result.error_message())),
                None => Ok(()),
            },
            None => Err(Self::unanswered(format!("{OPERATION} answered nothing for the entry"))),
        };
        (0..count).map(answer).collect()
    }

    fn unanswered(reason: String) -> Unsent {
        Unsent::unanswered(reason)
    }

    fn congested(result: &Result<(), Unsent>) -> bool {
        result.as_ref().is_err_and(|unsent| unsent.congested)
    }
}
