//! The SQS calls the consumer makes ([`Sqs`]): the visibility changes and
//! dead-letter sends the redelivery policy decides on
//! ([`crate::redelivery`]), and, for `poll`, receiving and deleting
//! ([`receiving`]).
//!
//! Batched calls (`ChangeMessageVisibilityBatch`, `DeleteMessageBatch`) take
//! at most ten entries, so longer lists are split and the parts sent
//! concurrently. Results come back entry by entry: a caller counts exactly
//! what happened and what did not.

#[cfg(feature = "cli")]
mod receiving;

#[cfg(feature = "cli")]
pub(crate) use receiving::event_message;

use std::{collections::HashMap, future::Future, time::Duration};

use aws_config::SdkConfig;
use aws_lambda_events::sqs::SqsMessageAttribute;
use aws_sdk_sqs::{
    Client,
    config::SharedCredentialsProvider,
    error::{BuildError, ProvideErrorMetadata, SdkError},
    primitives::Blob,
    types::{
        BatchResultErrorEntry, ChangeMessageVisibilityBatchRequestEntry, MessageAttributeValue,
        MessageSystemAttributeNameForSends, MessageSystemAttributeValue, QueueAttributeName,
        SendMessageBatchRequestEntry,
    },
};
use futures::future::join_all;

/// Entries per batched SQS call, as SQS allows.
pub(crate) const BATCH_LIMIT: usize = 10;

/// The most bytes of messages one `SendMessageBatch` holds, bodies and
/// attributes as SQS counts them ([`OutgoingMessage::bytes`]): 1 MiB, the
/// largest message too.
pub(crate) const BATCH_BYTES: usize = 1024 * 1024;

/// The longest visibility timeout SQS accepts: 12 hours.
pub(crate) const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);

/// An SQS call that failed, or a batch entry that SQS refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SQS {operation} failed: {reason}")]
pub(crate) struct SqsError {
    /// The API operation.
    pub operation: &'static str,
    /// Why, as the SDK or SQS put it.
    pub reason: String,
    /// SQS did not answer (a timeout, a connection that failed), or
    /// answered that it cannot now: the same call may succeed later.
    pub transient: bool,
}

/// Error codes with which SQS answers that it cannot now (AWS's common
/// errors: throttled, unavailable, failed inside).
const NOT_NOW: [&str; 5] =
    ["ThrottlingException", "RequestThrottled", "ServiceUnavailable", "InternalFailure", "InternalError"];

impl SqsError {
    fn new<E, R>(operation: &'static str, error: SdkError<E, R>) -> Self
    where
        SdkError<E, R>: std::error::Error + ProvideErrorMetadata,
    {
        let transient = match error.code() {
            Some(code) => NOT_NOW.contains(&code),
            None => sqs_once_aws::unanswered(&error),
        };
        Self { operation, reason: sqs_once_aws::describe(&error), transient }
    }

    /// A failure the same call would meet again: `reason`.
    pub(crate) fn lasting(operation: &'static str, reason: String) -> Self {
        Self { operation, reason, transient: false }
    }

    fn unbuilt(operation: &'static str, error: BuildError) -> Self {
        Self::lasting(operation, format!("invalid request: {error}"))
    }

    fn entry(operation: &'static str, entry: &BatchResultErrorEntry) -> Self {
        Self::lasting(operation, format!("{}: {}", entry.code(), entry.message().unwrap_or("no message")))
    }
}

/// A message to send.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct OutgoingMessage {
    /// The body.
    pub body: String,
    /// Message attributes (SQS takes at most ten).
    pub attributes: HashMap<String, MessageAttributeValue>,
    /// The message group, required by FIFO queues.
    pub group_id: Option<String>,
    /// The deduplication id, required by FIFO queues without content-based deduplication.
    pub deduplication_id: Option<String>,
    /// The trace context in X-Ray's form, sent as the `AWSTraceHeader`
    /// system attribute (which counts against no limit of attributes).
    pub trace_header: Option<String>,
}

impl OutgoingMessage {
    /// Its size as SQS counts it against a request's limit: the body, and
    /// each attribute's name, data type and value.
    pub(crate) fn bytes(&self) -> usize {
        let attributes = self.attributes.iter().map(|(name, value)| {
            let data =
                value.string_value().map_or(0, str::len) + value.binary_value().map_or(0, |blob| blob.as_ref().len());
            name.len() + value.data_type().len() + data
        });
        self.body.len() + attributes.sum::<usize>()
    }
}

/// An SQS client as the consumer uses it.
#[derive(Debug, Clone)]
pub(crate) struct Sqs {
    client: Client,
    /// Where the client's credentials come from, when known (not for a
    /// client given): what `poll` asks when SQS does not answer.
    #[cfg_attr(not(feature = "cli"), expect(dead_code, reason = "asked by `poll` alone"))]
    credentials: Option<SharedCredentialsProvider>,
}

/// What a queue is, as `poll` needs to know it, and the Lambda function its
/// visibility timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueInfo {
    /// The queue URL.
    pub url: String,
    /// The queue ARN, given to records as their `eventSourceARN`.
    pub arn: String,
    /// The queue's default visibility timeout.
    pub visibility_timeout: Duration,
    /// Whether it is a FIFO queue.
    pub fifo: bool,
}

impl Sqs {
    /// The queue's ARN, visibility timeout and type.
    pub(crate) async fn queue_info(&self, queue_url: &str) -> Result<QueueInfo, SqsError> {
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
        let missing = |what: &str| SqsError::lasting(OPERATION, format!("the answer lacks {what}"));
        let arn = attribute(QueueAttributeName::QueueArn).ok_or_else(|| missing("QueueArn"))?;
        let visibility_timeout = attribute(QueueAttributeName::VisibilityTimeout)
            .and_then(|seconds| seconds.parse().ok())
            .map(Duration::from_secs)
            .ok_or_else(|| missing("VisibilityTimeout"))?;
        let fifo = attribute(QueueAttributeName::FifoQueue).is_some_and(|fifo| fifo == "true");
        Ok(QueueInfo { url: queue_url.to_owned(), arn, visibility_timeout, fifo })
    }

    /// Where the client sends its requests, for logs and errors.
    #[cfg(feature = "cli")]
    pub(crate) fn endpoint(&self) -> String {
        crate::environment::endpoint("AWS_ENDPOINT_URL_SQS", self.client.config().region())
    }

    /// A client from the shared SDK configuration ([`sqs_once_aws::sdk_config`]),
    /// so `AWS_ENDPOINT_URL_SQS` points it at another server.
    pub(crate) fn new(config: &SdkConfig) -> Self {
        Self { client: Client::new(config), credentials: config.credentials_provider() }
    }

    /// Requests through `client`.
    pub(crate) fn from_client(client: Client) -> Self {
        Self { client, credentials: None }
    }

    /// An SQS client given by the program, with the timeouts it lacks filled
    /// in as [`sqs_once_aws::with_limits`] fills a configuration's.
    pub(crate) fn with_limits(client: Client) -> Client {
        let config = client.config();
        Client::from_conf(config.to_builder().timeout_config(sqs_once_aws::filled(config.timeout_config())).build())
    }

    /// The URL of the queue with `arn`, as SQS forms it. SQS takes the URL in
    /// the request body and routes by the client's endpoint, so the canonical
    /// form serves a custom endpoint too.
    pub(crate) fn queue_url(arn: &str) -> Option<String> {
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

    /// Sets each message's visibility timeout, counted from now, to its
    /// duration in whole seconds (rounded up, at most [`MAX_VISIBILITY`]).
    /// One result per change, in order.
    pub(crate) async fn change_visibility(
        &self,
        queue_url: &str,
        changes: &[(&str, Duration)],
    ) -> Vec<Result<(), SqsError>> {
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

    /// Sends `messages` to one queue, in `SendMessageBatch` requests of at
    /// most [`BATCH_LIMIT`] (a caller keeps each within [`BATCH_BYTES`]),
    /// and answers each: a request that failed fails its messages, otherwise
    /// the entries SQS names as failed did.
    pub(crate) async fn send_batch(&self, queue_url: &str, messages: &[OutgoingMessage]) -> Vec<Result<(), SqsError>> {
        const OPERATION: &str = "SendMessageBatch";
        let entry = |id: String, message: &OutgoingMessage| {
            SendMessageBatchRequestEntry::builder()
                .id(id)
                .message_body(&message.body)
                .set_message_attributes(Some(message.attributes.clone()).filter(|attributes| !attributes.is_empty()))
                .set_message_group_id(message.group_id.clone())
                .set_message_deduplication_id(message.deduplication_id.clone())
                .set_message_system_attributes(message.trace_header.clone().map(trace_header))
                .build()
        };
        in_batches(OPERATION, messages, entry, |entries| async move {
            let call = self.client.send_message_batch().queue_url(queue_url).set_entries(Some(entries));
            call.send().await.map(|output| output.failed).map_err(|error| SqsError::new(OPERATION, error))
        })
        .await
    }

    /// Sends one message.
    pub(crate) async fn send(&self, queue_url: &str, message: OutgoingMessage) -> Result<(), SqsError> {
        self.client
            .send_message()
            .queue_url(queue_url)
            .message_body(message.body)
            .set_message_attributes(Some(message.attributes).filter(|attributes| !attributes.is_empty()))
            .set_message_group_id(message.group_id)
            .set_message_deduplication_id(message.deduplication_id)
            .set_message_system_attributes(message.trace_header.map(trace_header))
            .send()
            .await
            .map(drop)
            .map_err(|error| SqsError::new("SendMessage", error))
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

/// A message attribute of an event record, as SQS takes it in `SendMessage`;
/// `None` if it has no data type, which SQS requires.
pub(crate) fn outgoing_attribute(attribute: &SqsMessageAttribute) -> Option<MessageAttributeValue> {
    MessageAttributeValue::builder()
        .set_data_type(attribute.data_type.clone())
        .set_string_value(attribute.string_value.clone())
        .set_binary_value(attribute.binary_value.as_ref().map(|data| Blob::new(data.0.clone())))
        .build()
        .ok()
}

/// The `AWSTraceHeader` system attribute carrying `header`, an X-Ray trace
/// header.
fn trace_header(header: String) -> HashMap<MessageSystemAttributeNameForSends, MessageSystemAttributeValue> {
    // The builder fails only without a data type, which is given.
    let value = MessageSystemAttributeValue::builder().data_type("String").string_value(header).build();
    value.into_iter().map(|value| (MessageSystemAttributeNameForSends::AwsTraceHeader, value)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "cli")]
    #[tokio::test]
    async fn a_client_without_a_region_cannot_sign_and_says_so() {
        let latest = aws_config::BehaviorVersion::latest();
        let no_region = Sqs::new(&SdkConfig::builder().behavior_version(latest).build());
        let refused = no_region.can_sign().await.unwrap_err();
        assert!(!refused.transient && refused.reason.contains("no AWS Region"), "{refused}");
        let credentials = aws_sdk_sqs::config::Credentials::new("id", "secret", None, None, "test");
        let signing = SdkConfig::builder()
            .behavior_version(latest)
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(SharedCredentialsProvider::new(credentials))
            .build();
        assert_eq!(Sqs::new(&signing).can_sign().await, Ok(()));
    }

    #[tokio::test]
    async fn a_client_given_gets_the_timeouts_it_lacks() {
        let loaded = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .no_credentials()
            .load()
            .await;
        let client = Sqs::with_limits(Client::new(&loaded));
        let timeouts = client.config().timeout_config().unwrap();
        assert_eq!(timeouts.operation_attempt_timeout(), Some(sqs_once_aws::ATTEMPT_TIMEOUT));
        assert_eq!(timeouts.operation_timeout(), Some(sqs_once_aws::OPERATION_TIMEOUT));
    }

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
                    10 => Err(SqsError::lasting("Op", "down".into())),
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

    #[test]
    fn an_attribute_without_a_type_is_not_sent() {
        use aws_lambda_events::sqs::SqsMessageAttribute;

        let mut attribute = SqsMessageAttribute::default();
        attribute.data_type = Some("Number".into());
        attribute.string_value = Some("42".into());
        assert_eq!(outgoing_attribute(&attribute).unwrap().string_value(), Some("42"));
        assert!(outgoing_attribute(&SqsMessageAttribute::default()).is_none());
    }

    #[test]
    fn a_queue_url_follows_from_its_arn_in_every_partition() {
        assert_eq!(
            Sqs::queue_url("arn:aws:sqs:eu-west-1:123456789012:orders.fifo").as_deref(),
            Some("https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo"),
        );
        assert_eq!(
            Sqs::queue_url("arn:aws-cn:sqs:cn-north-1:123456789012:q").as_deref(),
            Some("https://sqs.cn-north-1.amazonaws.com.cn/123456789012/q"),
        );
        assert_eq!(Sqs::queue_url("arn:aws:dynamodb:eu-west-1:123456789012:table/t"), None);
    }
}
