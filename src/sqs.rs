//! The SQS side of the consumer after the engine has answered: what becomes
//! of failed records ([`redelivery`]), and the SQS calls the consumer makes
//! ([`Sqs`]): visibility changes and dead-lettering after a batch, and, for
//! `poll`, receiving and deleting.
//!
//! Batched calls (`ChangeMessageVisibilityBatch`, `DeleteMessageBatch`) take
//! at most ten entries, so longer lists are split and the parts sent
//! concurrently. Results come back entry by entry: a caller counts exactly
//! what happened and what did not.

pub mod redelivery;

use std::{collections::HashMap, future::Future, time::Duration};

use aws_config::SdkConfig;
use aws_lambda_events::{
    encodings::Base64Data,
    sqs::{SqsMessage, SqsMessageAttribute},
};
use aws_sdk_sqs::{
    Client,
    error::{BuildError, ProvideErrorMetadata},
    primitives::Blob,
    types::{
        BatchResultErrorEntry, ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message,
        MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName,
    },
};
use futures::future::join_all;

/// Entries per batched SQS call, as SQS allows.
const BATCH_LIMIT: usize = 10;

/// The longest visibility timeout SQS accepts: 12 hours.
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);

/// An SQS call that failed, or a batch entry that SQS refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SQS {operation} failed: {reason}")]
pub struct SqsError {
    /// The API operation.
    pub operation: &'static str,
    /// Why, as the SDK or SQS put it.
    pub reason: String,
}

impl SqsError {
    fn new(operation: &'static str, error: impl std::error::Error + ProvideErrorMetadata) -> Self {
        Self { operation, reason: crate::aws::describe(&error) }
    }

    fn unbuilt(operation: &'static str, error: BuildError) -> Self {
        Self { operation, reason: format!("invalid request: {error}") }
    }

    fn entry(operation: &'static str, entry: &BatchResultErrorEntry) -> Self {
        let reason = format!("{}: {}", entry.code(), entry.message().unwrap_or("no message"));
        Self { operation, reason }
    }
}

/// What a queue is, as `poll` needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// The queue URL.
    pub url: String,
    /// The queue ARN, given to records as their `eventSourceARN`.
    pub arn: String,
    /// The queue's default visibility timeout.
    pub visibility_timeout: Duration,
    /// Whether it is a FIFO queue.
    pub fifo: bool,
}

/// A message to send.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutgoingMessage {
    /// The body.
    pub body: String,
    /// Message attributes (SQS takes at most ten).
    pub attributes: HashMap<String, MessageAttributeValue>,
    /// The message group, required by FIFO queues.
    pub group_id: Option<String>,
    /// The deduplication id, required by FIFO queues without content-based deduplication.
    pub deduplication_id: Option<String>,
}

/// An SQS client as the consumer uses it.
///
/// ```no_run
/// # async fn example() {
/// use sqs_once::sqs::Sqs;
///
/// let sqs = Sqs::new(&sqs_once::aws::sdk_config().await);
/// let url = Sqs::queue_url("arn:aws:sqs:eu-west-1:123456789012:orders").unwrap();
/// let info = sqs.queue_info(&url).await.unwrap();
/// println!("{} waits {:?}", info.arn, info.visibility_timeout);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Sqs {
    client: Client,
}

impl Sqs {
    /// A client from the shared SDK configuration ([`crate::aws::sdk_config`]),
    /// so `AWS_ENDPOINT_URL_SQS` points it at another server.
    pub fn new(config: &SdkConfig) -> Self {
        Self { client: Client::new(config) }
    }

    /// The URL of the queue with `arn`, as SQS forms it. SQS takes the URL in
    /// the request body and routes by the client's endpoint, so the canonical
    /// form serves a custom endpoint too.
    ///
    /// ```
    /// use sqs_once::sqs::Sqs;
    ///
    /// assert_eq!(
    ///     Sqs::queue_url("arn:aws:sqs:eu-west-1:123456789012:orders.fifo").as_deref(),
    ///     Some("https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo"),
    /// );
    /// assert_eq!(
    ///     Sqs::queue_url("arn:aws-cn:sqs:cn-north-1:123456789012:q").as_deref(),
    ///     Some("https://sqs.cn-north-1.amazonaws.com.cn/123456789012/q"),
    /// );
    /// assert_eq!(Sqs::queue_url("arn:aws:dynamodb:eu-west-1:123456789012:table/t"), None);
    /// ```
    pub fn queue_url(arn: &str) -> Option<String> {
        let mut parts = arn.split(':');
        let (Some("arn"), Some(partition), Some("sqs"), Some(region), Some(account), Some(name), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        if [partition, region, account, name].iter().any(|part| part.is_empty()) {
            return None;
        }
        let suffix = if partition == "aws-cn" { "amazonaws.com.cn" } else { "amazonaws.com" };
        Some(format!("https://sqs.{region}.{suffix}/{account}/{name}"))
    }

    /// The queue's ARN, visibility timeout and type.
    pub async fn queue_info(&self, queue_url: &str) -> Result<QueueInfo, SqsError> {
        const OPERATION: &str = "GetQueueAttributes";
        let output = self
            .client
            .get_queue_attributes()
            .queue_url(queue_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .attribute_names(QueueAttributeName::VisibilityTimeout)
            .attribute_names(QueueAttributeName::FifoQueue)
            .send()
            .await
            .map_err(|error| SqsError::new(OPERATION, error))?;
        let attributes = output.attributes().cloned().unwrap_or_default();
        let attribute = |name: QueueAttributeName| attributes.get(&name).cloned();
        let missing = |what: &str| SqsError { operation: OPERATION, reason: format!("the answer lacks {what}") };
        let arn = attribute(QueueAttributeName::QueueArn).ok_or_else(|| missing("QueueArn"))?;
        let visibility_timeout = attribute(QueueAttributeName::VisibilityTimeout)
            .and_then(|seconds| seconds.parse().ok())
            .map(Duration::from_secs)
            .ok_or_else(|| missing("VisibilityTimeout"))?;
        let fifo = attribute(QueueAttributeName::FifoQueue).is_some_and(|fifo| fifo == "true");
        Ok(QueueInfo { url: queue_url.to_owned(), arn, visibility_timeout, fifo })
    }

    /// Sets each message's visibility timeout, counted from now, to its
    /// duration in whole seconds (rounded up, at most [`MAX_VISIBILITY`]).
    /// One result per change, in order.
    pub async fn change_visibility(&self, queue_url: &str, changes: &[(&str, Duration)]) -> Vec<Result<(), SqsError>> {
        const OPERATION: &str = "ChangeMessageVisibilityBatch";
        let entry = |id, (receipt_handle, visibility): &(&str, Duration)| {
            ChangeMessageVisibilityBatchRequestEntry::builder()
                .id(id)
                .receipt_handle(*receipt_handle)
                .visibility_timeout(visibility_seconds(*visibility))
                .build()
        };
        in_batches(OPERATION, changes, entry, |entries| async move {
            let call = self.client.change_message_visibility_batch().queue_url(queue_url).set_entries(Some(entries));
            call.send().await.map(|output| output.failed).map_err(|error| SqsError::new(OPERATION, error))
        })
        .await
    }

    /// Deletes messages by receipt handle. One result per message, in order.
    pub async fn delete(&self, queue_url: &str, receipt_handles: &[&str]) -> Vec<Result<(), SqsError>> {
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

    /// Sends one message.
    pub async fn send(&self, queue_url: &str, message: OutgoingMessage) -> Result<(), SqsError> {
        self.client
            .send_message()
            .queue_url(queue_url)
            .message_body(message.body)
            .set_message_attributes(Some(message.attributes).filter(|attributes| !attributes.is_empty()))
            .set_message_group_id(message.group_id)
            .set_message_deduplication_id(message.deduplication_id)
            .send()
            .await
            .map(drop)
            .map_err(|error| SqsError::new("SendMessage", error))
    }

    /// Receives up to `max` (at most 10) messages with all their attributes,
    /// waiting up to `wait` for the first (long polling).
    pub async fn receive(&self, queue_url: &str, max: usize, wait: Duration) -> Result<Vec<Message>, SqsError> {
        let max = i32::try_from(max.clamp(1, BATCH_LIMIT)).unwrap_or(1);
        let wait_seconds = i32::try_from(wait.as_secs()).unwrap_or(20);
        let timeouts = aws_sdk_sqs::config::Builder::default().timeout_config(crate::aws::timeouts(Some(wait)));
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

/// Sends `items` as batch entries (built by `entry`, with the index within
/// its call as id) through `call`, at most [`BATCH_LIMIT`] a call, the calls
/// concurrent, and spreads the answers over the items: a failed call fails
/// its whole chunk, otherwise the entries SQS names as failed did.
async fn in_batches<'a, T, E, Fut>(
    operation: &'static str,
    items: &'a [T],
    entry: impl Fn(String, &'a T) -> Result<E, BuildError>,
    call: impl Fn(Vec<E>) -> Fut,
) -> Vec<Result<(), SqsError>>
where
    Fut: Future<Output = Result<Vec<BatchResultErrorEntry>, SqsError>>,
{
    let calls = items.chunks(BATCH_LIMIT).map(|chunk| {
        let entries: Result<Vec<E>, _> =
            chunk.iter().enumerate().map(|(index, item)| entry(index.to_string(), item)).collect();
        let sent = entries.map(&call).map_err(|error| SqsError::unbuilt(operation, error));
        async move { sent?.await }
    });
    let answers = join_all(calls).await;
    items
        .chunks(BATCH_LIMIT)
        .zip(answers)
        .flat_map(|(chunk, answer)| {
            let refused: HashMap<usize, SqsError> = match &answer {
                Ok(failed) => failed
                    .iter()
                    .filter_map(|entry| Some((entry.id().parse().ok()?, SqsError::entry(operation, entry))))
                    .collect(),
                Err(_) => HashMap::new(),
            };
            (0..chunk.len()).map(move |index| match &answer {
                Err(error) => Err(error.clone()),
                Ok(_) => refused.get(&index).cloned().map_or(Ok(()), Err),
            })
        })
        .collect()
}

fn visibility_seconds(visibility: Duration) -> i32 {
    let seconds = visibility.min(MAX_VISIBILITY).as_secs_f64().ceil();
    // At most 43,200: the cast cannot truncate.
    seconds as i32
}

/// A received message as a Lambda event record of `queue`, so that `poll`
/// feeds the engine exactly what Lambda would.
///
/// ```
/// use std::time::Duration;
/// use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
/// use sqs_once::sqs::{QueueInfo, event_message};
///
/// let queue = QueueInfo {
///     url: "https://sqs.eu-west-1.amazonaws.com/123456789012/orders".into(),
///     arn: "arn:aws:sqs:eu-west-1:123456789012:orders".into(),
///     visibility_timeout: Duration::from_secs(30),
///     fifo: false,
/// };
/// let message = Message::builder()
///     .message_id("m-1")
///     .receipt_handle("rh-1")
///     .body("{}")
///     .attributes(MessageSystemAttributeName::ApproximateReceiveCount, "2")
///     .build();
/// let record = event_message(message, &queue);
/// assert_eq!(record.attributes["ApproximateReceiveCount"], "2");
/// assert_eq!(record.event_source_arn.as_deref(), Some("arn:aws:sqs:eu-west-1:123456789012:orders"));
/// assert_eq!(record.aws_region.as_deref(), Some("eu-west-1"));
/// ```
pub fn event_message(message: Message, queue: &QueueInfo) -> SqsMessage {
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

/// A message attribute of an event record, as SQS takes it in `SendMessage`;
/// `None` if it has no data type, which SQS requires.
///
/// ```
/// use aws_lambda_events::sqs::SqsMessageAttribute;
/// use sqs_once::sqs::outgoing_attribute;
///
/// let mut attribute = SqsMessageAttribute::default();
/// attribute.data_type = Some("Number".into());
/// attribute.string_value = Some("42".into());
/// assert_eq!(outgoing_attribute(&attribute).unwrap().string_value(), Some("42"));
/// assert!(outgoing_attribute(&SqsMessageAttribute::default()).is_none());
/// ```
pub fn outgoing_attribute(attribute: &SqsMessageAttribute) -> Option<MessageAttributeValue> {
    MessageAttributeValue::builder()
        .set_data_type(attribute.data_type.clone())
        .set_string_value(attribute.string_value.clone())
        .set_binary_value(attribute.binary_value.as_ref().map(|data| Blob::new(data.0.clone())))
        .build()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_is_whole_seconds_rounded_up_and_capped() {
        assert_eq!(visibility_seconds(Duration::from_millis(2_001)), 3);
        assert_eq!(visibility_seconds(Duration::from_secs(2)), 2);
        assert_eq!(visibility_seconds(Duration::ZERO), 0);
        assert_eq!(visibility_seconds(Duration::from_secs(100_000)), 43_200);
    }

    #[tokio::test]
    async fn batches_spread_answers_over_their_entries() {
        let items: Vec<usize> = (0..23).collect();
        let refused = |id: &str| BatchResultErrorEntry::builder().id(id).code("Refused").sender_fault(true).build();
        let results = in_batches(
            "Op",
            &items,
            |id, item| Ok((id, *item)),
            |entries| async move {
                match entries[0].1 {
                    // The second call fails as a whole; the first refuses its entry 3.
                    10 => Err(SqsError { operation: "Op", reason: "down".into() }),
                    // The third has entries 0 to 2 only: its "refused 3" names none of them.
                    _ => Ok(vec![refused("3").unwrap()]),
                }
            },
        )
        .await;
        assert_eq!(results.len(), 23);
        let failed: Vec<usize> = (0..23).filter(|index| results[*index].is_err()).collect();
        assert_eq!(failed, [3].into_iter().chain(10..20).collect::<Vec<_>>());
        assert_eq!(results[3].as_ref().unwrap_err().reason, "Refused: no message");
    }
}
