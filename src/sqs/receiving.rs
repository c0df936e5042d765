//! The SQS calls of `poll`: receiving, deleting, and a
//! received message as the Lambda event record it would have been.

use std::time::Duration;

use aws_lambda_events::{
    encodings::Base64Data,
    sqs::{SqsMessage, SqsMessageAttribute},
};
use aws_sdk_sqs::{
    primitives::Blob,
    types::{DeleteMessageBatchRequestEntry, Message, MessageAttributeValue, MessageSystemAttributeName},
};

use super::{BATCH_LIMIT, QueueInfo, Sqs, SqsError, in_batches};

impl Sqs {
    /// Whether the client can sign a request: a Region, and credentials its
    /// provider can load. Asked when a call got no answer, since the SDK
    /// reports those two missing as it reports a connection lost: a start
    /// that lacks them is refused, not waited out.
    pub(crate) async fn can_sign(&self) -> Result<(), SqsError> {
        use aws_sdk_sqs::config::ProvideCredentials;
        const NOT_SIGNED: &str = "signing";
        let config = self.client.config();
        if config.region().is_none() {
            return Err(SqsError::lasting(NOT_SIGNED, "no AWS Region: set AWS_REGION".into()));
        }
        if let Some(credentials) = &self.credentials
            && let Err(error) = credentials.provide_credentials().await
        {
            let reason = format!("no AWS credentials: {}", sqs_once_aws::with_causes(&error));
            return Err(SqsError::lasting(NOT_SIGNED, reason));
        }
        Ok(())
    }

    /// Deletes messages by receipt handle. One result per message, in order.
    pub(crate) async fn delete(&self, queue_url: &str, receipt_handles: &[&str]) -> Vec<Result<(), SqsError>> {
        const OPERATION: &str = "DeleteMessageBatch";
        let entry = |id, receipt_handle: &&str| {
            DeleteMessageBatchRequestEntry::builder().id(id).receipt_handle(*receipt_handle).build()
        };
        in_batches(OPERATION, receipt_handles, entry, |entries| async move {
            let call = self.client.delete_message_batch().queue_url(queue_url).set_entries(Some(entries));
            call.send().await.map(|output| output.failed).map_err(|error| SqsError::new(OPERATION, error))
        })
        .await
    }

    /// Receives up to `max` (at most 10) messages with all their attributes,
    /// waiting up to `wait` for the first (long polling).
    pub(crate) async fn receive(&self, queue_url: &str, max: usize, wait: Duration) -> Result<Vec<Message>, SqsError> {
        let max = i32::try_from(max.clamp(1, BATCH_LIMIT)).unwrap_or(1);
        let wait_seconds = i32::try_from(wait.as_secs()).unwrap_or(20);
        let timeouts = aws_sdk_sqs::config::Builder::default().timeout_config(sqs_once_aws::timeouts(Some(wait)));
        self.client
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(max)
            .wait_time_seconds(wait_seconds)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .customize()
            .config_override(timeouts)
            .send()
            .await
            .map(|output| output.messages.unwrap_or_default())
            .map_err(|error| SqsError::new("ReceiveMessage", error))
    }
}

/// A received message as a Lambda event record of `queue`, so that `poll`
/// feeds the engine exactly what Lambda would.
pub(crate) fn event_message(message: Message, queue: &QueueInfo) -> SqsMessage {
    let mut record = SqsMessage::default();
    record.attributes = message
        .attributes
        .unwrap_or_default()
        .into_iter()
        .map(|(name, value)| (name.as_str().to_owned(), value))
        .collect();
    record.message_attributes = message
        .message_attributes
        .unwrap_or_default()
        .into_iter()
        .map(|(name, value)| (name, event_attribute(value)))
        .collect();
    record.message_id = message.message_id;
    record.receipt_handle = message.receipt_handle;
    record.body = message.body;
    record.md5_of_body = message.md5_of_body;
    record.md5_of_message_attributes = message.md5_of_message_attributes;
    record.event_source = Some("aws:sqs".into());
    record.aws_region = queue.arn.split(':').nth(3).map(str::to_owned);
    record.event_source_arn = Some(queue.arn.clone());
    record
}

fn event_attribute(value: MessageAttributeValue) -> SqsMessageAttribute {
    let mut attribute = SqsMessageAttribute::default();
    attribute.data_type = Some(value.data_type);
    attribute.string_value = value.string_value;
    attribute.binary_value = value.binary_value.map(base64_data);
    attribute.string_list_values = value.string_list_values.unwrap_or_default();
    attribute.binary_list_values = value.binary_list_values.unwrap_or_default().into_iter().map(base64_data).collect();
    attribute
}

fn base64_data(blob: Blob) -> Base64Data {
    let mut data = Base64Data::default();
    *data = blob.into_inner();
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_received_message_is_the_record_lambda_would_have_delivered() {
        let queue = QueueInfo {
            url: "https://sqs.eu-west-1.amazonaws.com/123456789012/orders".into(),
            arn: "arn:aws:sqs:eu-west-1:123456789012:orders".into(),
            visibility_timeout: Duration::from_secs(30),
            fifo: false,
        };
        let message = Message::builder()
            .message_id("m-1")
            .receipt_handle("rh-1")
            .body("{}")
            .attributes(MessageSystemAttributeName::ApproximateReceiveCount, "2")
            .build();
        let record = event_message(message, &queue);
        assert_eq!(record.attributes["ApproximateReceiveCount"], "2");
        assert_eq!(record.event_source_arn.as_deref(), Some("arn:aws:sqs:eu-west-1:123456789012:orders"));
        assert_eq!(record.aws_region.as_deref(), Some("eu-west-1"));
        assert_eq!(record.receipt_handle.as_deref(), Some("rh-1"));
    }
}
