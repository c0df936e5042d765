//! Sending outbox messages to SQS queues, up to ten in a `SendMessageBatch`.

use std::collections::HashMap;

use async_trait::async_trait;

use super::{data_type, sent_attributes, trace_header};
use crate::sqs::{BATCH_BYTES, BATCH_LIMIT, OutgoingMessage, Sqs, SqsError};
use sqs_once_aws::batched::BatchCall;
use sqs_once_core::{destinations::SendError, trace::Propagators, transaction::Message};

/// `message` as sent to a queue: its attributes and the outbox id, which a
/// FIFO queue deduplicates on too.
pub(super) fn outgoing(
    outbox_id: &str,
    message: &Message,
    propagators: Propagators,
) -> Result<OutgoingMessage, SendError> {
    let attribute = |name: &str, value: &str| {
        let value = aws_sdk_sqs::types::MessageAttributeValue::builder().string_value(value);
        value.data_type(data_type(name)).build()
    };
    let attributes = sent_attributes(message, outbox_id, propagators)
        .map(|(name, value)| Ok((name.to_owned(), attribute(name, value)?)))
        .collect::<Result<HashMap<_, _>, aws_sdk_sqs::error::BuildError>>()
        .map_err(|error| SendError::refused(format!("invalid message attribute: {error}")))?;
    let fifo = message.destination.is_fifo();
    Ok(OutgoingMessage {
        body: message.body.clone(),
        attributes,
        group_id: message.group_id.clone(),
        deduplication_id: fifo.then(|| outbox_id.to_owned()),
        trace_header: trace_header(message, propagators),
    })
}

/// The messages sent to one queue at the same time, gathered into
/// `SendMessageBatch` requests: ten messages for the price of one request
/// (SQS bills a request of up to 64 KiB of messages as one), each message
/// answered on its own. The outbox sends a run's messages one after
/// another, so a request never holds two of one run, and a FIFO queue's
/// groups keep their order.
#[derive(Debug)]
pub(super) struct QueueSends {
    sqs: Sqs,
    queue_url: String,
}

impl QueueSends {
    pub(super) fn new(sqs: Sqs, queue_url: &str) -> Self {
        Self { sqs, queue_url: queue_url.to_owned() }
    }
}

#[async_trait]
impl BatchCall for QueueSends {
    /// A message and its outbox id.
    type Input = (String, OutgoingMessage);
    type Output = ();
    type Error = SqsError;
    const LIMIT: usize = BATCH_LIMIT;
    const MAX_BYTES: usize = BATCH_BYTES;
    const IN_FLIGHT: usize = 4;

    fn item((outbox_id, _): &Self::Input) -> &str {
        outbox_id
    }

    fn bytes((_, message): &Self::Input) -> usize {
        message.bytes()
    }

    async fn call(&self, inputs: Vec<Self::Input>) -> Vec<Result<(), SqsError>> {
        let messages: Vec<OutgoingMessage> = inputs.into_iter().map(|(_, message)| message).collect();
        self.sqs.send_batch(&self.queue_url, &messages).await
    }

    fn unanswered(reason: String) -> SqsError {
        SqsError { operation: "SendMessageBatch", reason, transient: true }
    }

    fn congested(result: &Result<(), SqsError>) -> bool {
        result.as_ref().is_err_and(|error| error.transient)
    }
}
