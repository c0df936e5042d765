//! Publishing outbox messages to SNS topics, up to ten in a `PublishBatch`.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};

use super::{Unsent, data_type, sent_attributes};
use sqs_once_aws::batched::BatchCall;
use sqs_once_core::{destinations::SendError, trace::Propagators, transaction::Message};

const OPERATION: &str = "SNS PublishBatch";

/// A message to publish, with its outbox id.
#[derive(Debug)]
pub(super) struct Publish {
    outbox_id: String,
    body: String,
    attributes: HashMap<String, MessageAttributeValue>,
    group_id: Option<String>,
    deduplication_id: Option<String>,
}

impl Publish {
    /// `message` as published: its attributes and the outbox id, which a
    /// FIFO topic deduplicates on too.
    pub(super) fn new(outbox_id: &str, message: &Message, propagators: Propagators) -> Result<Self, SendError> {
        let attribute = |name: &str, value: &str| {
            let value = MessageAttributeValue::builder().string_value(value);
            value.data_type(data_type(name)).build()
        };
        let attributes = sent_attributes(message, outbox_id, propagators)
            .map(|(name, value)| Ok((name.to_owned(), attribute(name, value)?)))
            .collect::<Result<HashMap<_, _>, aws_sdk_sns::error::BuildError>>()
            .map_err(|error| SendError::refused(format!("invalid message attribute: {error}")))?;
        Ok(Self {
            outbox_id: outbox_id.to_owned(),
            body: message.body.clone(),
            attributes,
            group_id: message.group_id.clone(),
            deduplication_id: message.destination.is_fifo().then(|| outbox_id.to_owned()),
        })
    }

    /// Its size as SNS counts it against a request's limit: the body, and
    /// each attribute's name, data type and value.
    fn bytes(&self) -> usize {
        let attributes = self
            .attributes
            .iter()
            .map(|(name, value)| name.len() + value.data_type().len() + value.string_value().map_or(0, str::len));
        self.body.len() + attributes.sum::<usize>()
    }

    /// Its entry in a request, under the request's own `id` for it.
    fn entry(&self, id: usize) -> Result<PublishBatchRequestEntry, aws_sdk_sns::error::BuildError> {
        PublishBatchRequestEntry::builder()
            .id(id.to_string())
            .message(&self.body)
            .set_message_attributes(Some(self.attributes.clone()).filter(|attributes| !attributes.is_empty()))
            .set_message_group_id(self.group_id.clone())
            .set_message_deduplication_id(self.deduplication_id.clone())
            .build()
    }
}

/// The messages published to one topic at the same time, gathered into
/// `PublishBatch` requests: up to ten messages and 256 KiB a request (SNS
/// bills each 64 KiB of a request as one request), each message answered on
/// its own. The outbox sends a run's messages one after another, so a
/// request never holds two of one run, and a FIFO topic's groups keep their
/// order.
#[derive(Debug)]
pub(super) struct TopicPublishes {
    sns: aws_sdk_sns::Client,
    topic_arn: String,
}

impl TopicPublishes {
    pub(super) fn new(sns: aws_sdk_sns::Client, topic_arn: &str) -> Self {
        Self { sns, topic_arn: topic_arn.to_owned() }
    }
}

#[async_trait]
impl BatchCall for TopicPublishes {
    type Input = Publish;
    type Output = ();
    type Error = Unsent;
    const LIMIT: usize = 10;
    const MAX_BYTES: usize = 256 * 1024;
    const IN_FLIGHT: usize = 4;

    fn item(publish: &Publish) -> &str {
        &publish.outbox_id
    }

    fn bytes(publish: &Publish) -> usize {
        publish.bytes()
    }

    async fn call(&self, inputs: Vec<Publish>) -> Vec<Result<(), Unsent>> {
        let every = |unsent: Unsent| inputs.iter().map(|_| Err(unsent.clone())).collect();
        let entries = match inputs.iter().enumerate().map(|(id, publish)| publish.entry(id)).collect() {
            Ok(entries) => entries,
            Err(error) => return every(Unsent::refused(format!("{OPERATION}: {error}"))),
        };
        let request =
            self.sns.publish_batch().topic_arn(&self.topic_arn).set_publish_batch_request_entries(Some(entries));
        let output = match request.send().await {
            Ok(output) => output,
            Err(error) => return every(Unsent::of_request(OPERATION, &error)),
        };
        let published: HashSet<&str> = output.successful().iter().filter_map(|entry| entry.id()).collect();
        let failed: HashMap<&str, _> = output.failed().iter().map(|entry| (entry.id(), entry)).collect();
        let answer = |id: String| match failed.get(id.as_str()) {
            Some(failed) => Err(Unsent::of_entry(OPERATION, failed.code(), failed.message())),
            None if published.contains(id.as_str()) => Ok(()),
            None => Err(Self::unanswered(format!("{OPERATION} answered nothing for the entry"))),
        };
        (0..inputs.len()).map(|id| answer(id.to_string())).collect()
    }

    fn unanswered(reason: String) -> Unsent {
        Unsent::unanswered(reason)
    }

    fn congested(result: &Result<(), Unsent>) -> bool {
        result.as_ref().is_err_and(|unsent| unsent.congested)
    }
}
