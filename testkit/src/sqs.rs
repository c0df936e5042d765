//! The SQS server the test command starts (moto), queues on it, and its
//! view of each message's visibility.

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::TcpStream,
    time::{SystemTime, UNIX_EPOCH},
};

use aws_sdk_sqs::{
    Client,
    types::{Message, MessageSystemAttributeName, QueueAttributeName, SendMessageBatchRequestEntry},
};
use serde_json::{Map, Value, json};

/// The endpoint `scripts/test` exported; these tests need the real server.
pub fn endpoint() -> String {
    std::env::var("AWS_ENDPOINT_URL_SQS")
        .expect("AWS_ENDPOINT_URL_SQS is not set: run the tests with scripts/test, which starts an SQS server")
}

/// A client for the tests' own calls, patient with a server busy serving pollers.
pub async fn client() -> Client {
    endpoint();
    let patient = aws_sdk_sqs::config::timeout::TimeoutConfig::builder()
        .operation_attempt_timeout(std::time::Duration::from_secs(30))
        .operation_timeout(std::time::Duration::from_secs(60))
        .build();
    let config = aws_sdk_sqs::config::Builder::from(&crate::aws_config().await).timeout_config(patient);
    Client::from_conf(config.build())
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// What a queue is.
#[derive(Debug, Clone)]
pub struct QueueInfo {
    /// Its URL.
    pub url: String,
    /// Its ARN: the `eventSourceARN` of its records.
    pub arn: String,
    /// Whether it is a FIFO queue.
    pub fifo: bool,
}

/// A queue on the SQS server.
#[derive(Debug)]
pub struct Queue {
    /// The client the test's own calls go through.
    pub client: Client,
    /// What the queue is.
    pub info: QueueInfo,
}

impl Queue {
    /// A fresh queue with a unique name.
    pub async fn create(fifo: bool, visibility_secs: u32) -> Self {
        let client = client().await;
        let suffix = if fifo { ".fifo" } else { "" };
        let name = format!("q-{}{suffix}", uuid::Uuid::new_v4().simple());
        let mut request = client
            .create_queue()
            .queue_name(&name)
            .attributes(QueueAttributeName::VisibilityTimeout, visibility_secs.to_string());
        if fifo {
            request = request
                .attributes(QueueAttributeName::FifoQueue, "true")
                .attributes(QueueAttributeName::ContentBasedDeduplication, "true");
        }
        let url = request.send().await.expect("create queue").queue_url.unwrap();
        Self::existing(&url).await
    }

    /// The queue at `url`, which exists.
    pub async fn existing(url: &str) -> Self {
        let client = client().await;
        let output = client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .attribute_names(QueueAttributeName::FifoQueue)
            .send()
            .await
            .expect("queue attributes");
        let attributes = output.attributes.unwrap_or_default();
        let arn = attributes[&QueueAttributeName::QueueArn].clone();
        let fifo = attributes.get(&QueueAttributeName::FifoQueue).is_some_and(|fifo| fifo == "true");
        Self { client, info: QueueInfo { url: url.to_owned(), arn, fifo } }
    }

    /// A new SNS topic delivering raw messages to this queue; its ARN.
    pub async fn subscribed_topic(&self) -> String {
        let sns = aws_sdk_sns::Client::new(&crate::aws_config().await);
        let name = format!("t-{}", uuid::Uuid::new_v4().simple());
        let topic = sns.create_topic().name(name).send().await.unwrap().topic_arn.unwrap();
        let subscribe = sns.subscribe().topic_arn(&topic).protocol("sqs").endpoint(&self.info.arn);
        subscribe.attributes("RawMessageDelivery", "true").send().await.unwrap();
        topic
    }

    /// A new rule on the default bus delivering events of `source` to this
    /// queue.
    pub async fn receive_events_of(&self, source: &str) {
        let events = aws_sdk_eventbridge::Client::new(&crate::aws_config().await);
        let rule = format!("r-{}", uuid::Uuid::new_v4().simple());
        let pattern = serde_json::json!({ "source": [source] }).to_string();
        events.put_rule().name(&rule).event_pattern(pattern).event_bus_name("default").send().await.unwrap();
        let target = aws_sdk_eventbridge::types::Target::builder().id("queue").arn(&self.info.arn).build().unwrap();
        events.put_targets().rule(&rule).targets(target).send().await.unwrap();
    }

    /// The queue's URL.
    pub fn url(&self) -> &str {
        &self.info.url
    }

    /// Sends each body (with a FIFO group for FIFO queues), ten at a time.
    pub async fn send(&self, bodies: &[Value]) {
        for (chunk_index, chunk) in bodies.chunks(10).enumerate() {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(index, body)| {
                    let entry = SendMessageBatchRequestEntry::builder()
                        .id(format!("{chunk_index}-{index}"))
                        .message_body(body.to_string());
                    let entry = if self.info.fifo { entry.message_group_id("g") } else { entry };
                    entry.build().unwrap()
                })
                .collect();
            let output =
                self.client.send_message_batch().queue_url(self.url()).set_entries(Some(entries)).send().await.unwrap();
            assert!(output.failed.is_empty(), "send failed: {:?}", output.failed);
        }
    }

    /// Sends `body` as it is, in a request of its own: a message near SQS's
    /// 1 MiB limit fills a `SendMessageBatch` alone.
    pub async fn send_body(&self, body: &str) {
        let request = self.client.send_message().queue_url(self.url()).message_body(body);
        let request = if self.info.fifo { request.message_group_id("g") } else { request };
        request.send().await.expect("send message");
    }

    /// Receives `count` messages, in order of arrival.
    pub async fn receive(&self, count: usize) -> Vec<Message> {
        let mut messages = Vec::new();
        for _ in 0..50 {
            if messages.len() >= count {
                break;
            }
            messages.extend(self.receive_up_to(count - messages.len()).await);
        }
        assert_eq!(messages.len(), count, "not every message arrived");
        messages
    }

    /// One long poll of a second for up to `count` (at most 10) messages, with
    /// all their attributes.
    async fn receive_up_to(&self, count: usize) -> Vec<Message> {
        let output = self
            .client
            .receive_message()
            .queue_url(self.url())
            .max_number_of_messages(count.min(10) as i32)
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap();
        output.messages.unwrap_or_default()
    }

    /// Receives and deletes every message until the queue has stayed empty
    /// for a few long polls.
    pub async fn drain(&self) -> Vec<Message> {
        let mut messages = Vec::new();
        let mut empty_polls = 0;
        while empty_polls < 3 {
            let received = self.receive_up_to(10).await;
            empty_polls = if received.is_empty() { empty_polls + 1 } else { 0 };
            for message in &received {
                let handle = message.receipt_handle().unwrap();
                self.client.delete_message().queue_url(self.url()).receipt_handle(handle).send().await.unwrap();
            }
            messages.extend(received);
        }
        messages
    }

    /// The Lambda event Lambda would build from `messages`, as its
    /// documentation shows one (strings for every attribute, binary values
    /// in base64).
    pub fn event(&self, messages: &[Message]) -> Value {
        let region = self.info.arn.split(':').nth(3).unwrap_or_default();
        let records: Vec<Value> = messages
            .iter()
            .map(|message| {
                let attributes: Map<String, Value> = message
                    .attributes()
                    .into_iter()
                    .flatten()
                    .map(|(name, value)| (name.as_str().to_owned(), value.clone().into()))
                    .collect();
                let message_attributes: Map<String, Value> = message
                    .message_attributes()
                    .into_iter()
                    .flatten()
                    .map(|(name, value)| {
                        let mut attribute =
                            json!({ "dataType": value.data_type(), "stringListValues": [], "binaryListValues": [] });
                        if let Some(text) = value.string_value() {
                            attribute["stringValue"] = text.into();
                        }
                        (name.clone(), attribute)
                    })
                    .collect();
                json!({
                    "messageId": message.message_id(), "receiptHandle": message.receipt_handle(),
                    "body": message.body(), "md5OfBody": message.md5_of_body(),
                    "attributes": attributes, "messageAttributes": message_attributes,
                    "eventSource": "aws:sqs", "eventSourceARN": self.info.arn, "awsRegion": region,
                })
            })
            .collect();
        json!({ "Records": records })
    }

    /// Messages waiting, and messages in flight.
    pub async fn depth(&self) -> (u64, u64) {
        let output = self
            .client
            .get_queue_attributes()
            .queue_url(self.url())
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .unwrap();
        let attributes = output.attributes.unwrap();
        let count = |name| attributes[&name].parse().unwrap();
        (
            count(QueueAttributeName::ApproximateNumberOfMessages),
            count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        )
    }
}

/// The largest message SQS takes: 1 MiB, body and message attributes together.
pub const LARGEST_MESSAGE: usize = 1 << 20;

/// A JSON body of exactly `bytes` bytes: `fields` and a `pad` string that fills it.
pub fn body_of_size(fields: Value, bytes: usize) -> String {
    let mut body = fields;
    body["pad"] = json!("");
    let pad = bytes - body.to_string().len();
    body["pad"] = json!("x".repeat(pad));
    let body = body.to_string();
    assert_eq!(body.len(), bytes);
    body
}

/// When each message becomes visible again (epoch milliseconds), by message
/// id, as the server itself holds it (moto's state dump).
pub fn visible_at() -> HashMap<String, u64> {
    let address = endpoint().trim_start_matches("http://").to_owned();
    let mut stream = TcpStream::connect(&address).unwrap();
    write!(stream, "GET /moto-api/data.json HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let body = &answer[answer.find("\r\n\r\n").expect("an HTTP answer") + 4..];
    let state: Value = serde_json::from_str(body).expect("moto's state is JSON");
    // The dump lists a received message twice: the queue's live copy first,
    // then a snapshot taken when it was received, which later changes miss.
    let mut visible_at = HashMap::new();
    for message in state["sqs"]["Message"].as_array().into_iter().flatten() {
        let id = message["id"].as_str().unwrap().to_owned();
        visible_at.entry(id).or_insert(message["visible_at"].as_f64().unwrap() as u64);
    }
    visible_at
}
