//! Sending outbox messages to SQS, SNS and EventBridge with the AWS SDK.

use parking_lot::Mutex;
use std::{collections::HashMap, sync::Arc};

use async_trait::async_trait;
use aws_config::{Region, SdkConfig};
#[cfg(any(feature = "sns", feature = "eventbridge"))]
use aws_sdk_sqs::error::ProvideErrorMetadata;

use crate::sqs::{BATCH_BYTES, BATCH_LIMIT, OutgoingMessage, Sqs, SqsError};
use sqs_once_aws::batched::{BatchCall, Batcher};
use sqs_once_core::{
    destinations::{Destinations, SendError},
    payload::SIZE_ATTRIBUTE,
    trace::{Propagators, TRACEPARENT},
    transaction::{Destination, Message, OUTBOX_ID_ATTRIBUTE},
};

/// Error codes with which a service refuses a message for good, as it
/// stands: sending it again unchanged cannot succeed until someone acts.
const REFUSALS: &[&str] = &[
    "AccessDenied",
    "InvalidAddress",
    "InvalidAttribute",
    "Authorization",
    "NotAuthorized",
    "NotFound",
    "NonExistent",
    "DoesNotExist",
    "InvalidParameter",
    "InvalidArgument",
    "InvalidMessageContents",
    "MalformedDetail",
    "Validation",
    "Kms",
    "KMS",
];

/// The SQS, SNS and EventBridge clients of the consumer, built from the
/// shared SDK configuration ([`sqs_once_aws::sdk_config`]), so
/// `AWS_ENDPOINT_URL_SQS`, `AWS_ENDPOINT_URL_SNS` and
/// `AWS_ENDPOINT_URL_EVENTBRIDGE` point them elsewhere. A message to a queue,
/// topic or bus of another Region than the configuration's (as its URL or
/// ARN names it) goes through clients of that Region: the SDK sends to its
/// client's Region whatever the URL says, and the service refuses an address
/// of another Region (`InvalidAddress`).
#[derive(Debug, Default)]
pub(crate) struct AwsDestinations {
    config: tokio::sync::OnceCell<SdkConfig>,
    /// The clients of each Region sent to; `None` is the configuration's own.
    clients: Mutex<HashMap<Option<String>, Arc<Clients>>>,
    /// The trace headers written.
    propagators: Propagators,
}

#[derive(Debug)]
struct Clients {
    sqs: Sqs,
    /// The sends to each queue, gathered into `SendMessageBatch` requests.
    queues: Mutex<HashMap<String, Arc<Batcher<QueueSends>>>>,
    #[cfg(feature = "sns")]
    sns: aws_sdk_sns::Client,
    #[cfg(feature = "eventbridge")]
    eventbridge: aws_sdk_eventbridge::Client,
}

impl Clients {
    /// Clients that send with `config`, each send one attempt for as long as
    /// the operation may take ([`sqs_once_aws::sending`]): a send cut off by an
    /// attempt's timeout may have landed, and is not sent again at once.
    fn new(config: &SdkConfig) -> Self {
        let config = sqs_once_aws::sending(config);
        Self {
            sqs: Sqs::new(&config),
            queues: Mutex::default(),
            #[cfg(feature = "sns")]
            sns: aws_sdk_sns::Client::new(&config),
            #[cfg(feature = "eventbridge")]
            eventbridge: aws_sdk_eventbridge::Client::new(&config),
        }
    }
}

impl AwsDestinations {
    /// The clients, from `config`.
    pub(crate) fn new(config: &SdkConfig) -> Self {
        Self {
            config: tokio::sync::OnceCell::new_with(Some(config.clone())),
            clients: Mutex::default(),
            propagators: Propagators::default(),
        }
    }

    /// Writes the trace headers `propagators` name (`OTEL_PROPAGATORS`).
    pub(crate) fn propagating(mut self, propagators: Propagators) -> Self {
        self.propagators = propagators;
        self
    }

    /// The clients, from the SDK's default configuration, loaded when the
    /// first message is sent: a consumer that sends none never loads it.
    pub(crate) fn from_env() -> Self {
        Self::default()
    }

    /// The clients that reach `destination`'s Region.
    async fn clients(&self, destination: &Destination) -> Arc<Clients> {
        let config = self.config.get_or_init(sqs_once_aws::sdk_config).await;
        let own = config.region().map(|region| region.as_ref());
        let region = destination.region().filter(|region| Some(*region) != own);
        let mut clients = self.clients.lock();
        let clients = clients.entry(region.map(str::to_owned)).or_insert_with(|| {
            Arc::new(match region {
                Some(region) => Clients::new(&config.to_builder().region(Region::new(region.to_owned())).build()),
                None => Clients::new(config),
            })
        });
        Arc::clone(clients)
    }
}

impl Clients {
    async fn send_sqs(
        &self,
        queue_url: &str,
        (outbox_id, message): (&str, &Message),
        propagators: Propagators,
    ) -> Result<(), SendError> {
        let attribute = |name: &str, value: &str| {
            let value = aws_sdk_sqs::types::MessageAttributeValue::builder().string_value(value);
            value.data_type(data_type(name)).build()
        };
        let attributes = sent_attributes(message, outbox_id, propagators)
            .map(|(name, value)| Ok((name.to_owned(), attribute(name, value)?)))
            .collect::<Result<HashMap<_, _>, aws_sdk_sqs::error::BuildError>>()
            .map_err(|error| SendError::refused(format!("invalid message attribute: {error}")))?;
        let fifo = message.destination.is_fifo();
        let outgoing = OutgoingMessage {
            body: message.body.clone(),
            attributes,
            group_id: message.group_id.clone(),
            deduplication_id: fifo.then(|| outbox_id.to_owned()),
            trace_header: trace_header(message, propagators),
        };
        let sends = Arc::clone(self.queues.lock().entry(queue_url.to_owned()).or_insert_with(|| {
            Arc::new(Batcher::new(Arc::new(QueueSends { sqs: self.sqs.clone(), queue_url: queue_url.to_owned() })))
        }));
        let sent = sends.submit((outbox_id.to_owned(), outgoing)).await;
        sent.map_err(|error| judged(&error.reason, error.to_string()))
    }

    #[cfg(feature = "sns")]
    async fn send_sns(
        &self,
        topic_arn: &str,
        (outbox_id, message): (&str, &Message),
        propagators: Propagators,
    ) -> Result<(), SendError> {
        let attribute = |name: &str, value: &str| {
            let value = aws_sdk_sns::types::MessageAttributeValue::builder().string_value(value);
            value.data_type(data_type(name)).build()
        };
        let attributes = sent_attributes(message, outbox_id, propagators)
            .map(|(name, value)| Ok((name.to_owned(), attribute(name, value)?)))
            .collect::<Result<HashMap<_, _>, aws_sdk_sns::error::BuildError>>()
            .map_err(|error| SendError::refused(format!("invalid message attribute: {error}")))?;
        self.sns
            .publish()
            .topic_arn(topic_arn)
            .message(&message.body)
            .set_message_attributes(Some(attributes))
            .set_message_group_id(message.group_id.clone())
            .set_message_deduplication_id(message.destination.is_fifo().then(|| outbox_id.to_owned()))
            .send()
            .await
            .map(drop)
            .map_err(|error| service_error("SNS Publish", error.into_service_error()))
    }

    #[cfg(feature = "eventbridge")]
    async fn send_event(
        &self,
        (event_bus, source, detail_type): (&str, &str, &str),
        (outbox_id, message): (&str, &Message),
        propagators: Propagators,
    ) -> Result<(), SendError> {
        let entry = event_entry((event_bus, source, detail_type), outbox_id, message, propagators)?;
        let output = self
            .eventbridge
            .put_events()
            .entries(entry)
            .send()
            .await
            .map_err(|error| service_error("EventBridge PutEvents", error.into_service_error()))?;
        match output.entries().first() {
            Some(result) if result.error_code().is_some() || output.failed_entry_count() > 0 => {
                let code = result.error_code().unwrap_or("unknown error");
                Err(judged(
                    code,
                    format!("EventBridge PutEvents: {code}: {}", result.error_message().unwrap_or("no message")),
                ))
            }
            _ => Ok(()),
        }
    }
}

/// The messages sent to one queue at the same time, gathered into
/// `SendMessageBatch` requests: ten messages for the price of one request
/// (SQS bills a request of up to 64 KiB of messages as one), each message
/// answered on its own. The outbox sends a run's messages one after
/// another, so a request never holds two of one run, and a FIFO queue's
/// groups keep their order.
#[derive(Debug)]
struct QueueSends {
    sqs: Sqs,
    queue_url: String,
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

/// The `PutEvents` entry of an event: its detail with the outbox id in it,
/// its trace context as its trace header where X-Ray's header is written.
#[cfg(feature = "eventbridge")]
fn event_entry(
    (event_bus, source, detail_type): (&str, &str, &str),
    outbox_id: &str,
    message: &Message,
    propagators: Propagators,
) -> Result<aws_sdk_eventbridge::types::PutEventsRequestEntry, SendError> {
    let mut detail: serde_json::Value = serde_json::from_str(&message.body)
        .map_err(|error| SendError::refused(format!("the event's detail is not JSON: {error}")))?;
    if let Some(fields) = detail.as_object_mut() {
        fields.insert(sqs_once_core::transaction::OUTBOX_ID_FIELD.to_owned(), outbox_id.into());
    }
    Ok(aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
        .event_bus_name(event_bus)
        .source(source)
        .detail_type(detail_type)
        .detail(detail.to_string())
        .set_trace_header(trace_header(message, propagators))
        .build())
}

#[async_trait]
impl Destinations for AwsDestinations {
    async fn send(&self, outbox_id: &str, message: &Message) -> Result<(), SendError> {
        self.clients(&message.destination).await.send(outbox_id, message, self.propagators).await
    }
}

impl Clients {
    async fn send(&self, outbox_id: &str, message: &Message, propagators: Propagators) -> Result<(), SendError> {
        let entry = (outbox_id, message);
        match &message.destination {
            Destination::Sqs { queue_url } => self.send_sqs(queue_url, entry, propagators).await,
            #[cfg(feature = "sns")]
            Destination::Sns { topic_arn } => self.send_sns(topic_arn, entry, propagators).await,
            #[cfg(feature = "eventbridge")]
            Destination::EventBridge { event_bus, source, detail_type } => {
                self.send_event((event_bus, source, detail_type), entry, propagators).await
            }
            #[allow(unreachable_patterns)]
            other => Err(SendError::refused(format!(
                "this build sends no message to {}: enable the `{}` feature of sqs-once",
                other.name(),
                if matches!(other, Destination::Sns { .. }) { "sns" } else { "eventbridge" }
            ))),
        }
    }
}

/// The attributes a message is sent with: its own, but its `traceparent`
/// only where W3C's header is written, and the outbox id.
fn sent_attributes<'m>(
    message: &'m Message,
    outbox_id: &'m str,
    propagators: Propagators,
) -> impl Iterator<Item = (&'m str, &'m str)> {
    let own = message.attributes.iter().map(|(name, value)| (name.as_str(), value.as_str()));
    let own = own.filter(move |(name, _)| propagators.w3c || *name != TRACEPARENT);
    own.chain([(OUTBOX_ID_ATTRIBUTE, outbox_id)])
}

/// The data type a message attribute is sent with: the payload size of a
/// message whose payload went through S3 is a number, as the Extended
/// Client sends it; every other attribute a string.
fn data_type(name: &str) -> &'static str {
    if name == SIZE_ATTRIBUTE { "Number" } else { "String" }
}

/// The X-Ray trace header a message is sent with (SQS's `AWSTraceHeader`,
/// an event's `TraceHeader`): its trace context, where X-Ray's header is
/// written.
fn trace_header(message: &Message, propagators: Propagators) -> Option<String> {
    message.trace_context().filter(|_| propagators.xray).map(|context| context.xray_header())
}

/// A failed send, refused for good when the service's error `code` is one of
/// [`REFUSALS`].
fn judged(code: &str, reason: String) -> SendError {
    match REFUSALS.iter().any(|refusal| code.contains(refusal)) {
        true => SendError::refused(reason),
        false => SendError::failed(reason),
    }
}

#[cfg(any(feature = "sns", feature = "eventbridge"))]
fn service_error(operation: &str, error: impl std::error::Error + ProvideErrorMetadata) -> SendError {
    let code = error.code().unwrap_or_default().to_owned();
    judged(&code, format!("{operation}: {}", sqs_once_aws::describe(&error)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use testkit::sqs::Queue;

    use super::*;
    use crate::testing::{TestConsumer, failures};
    use sqs_once_core::handler_fn;
    use sqs_once_engine::event::{EventRecord, parse_event};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fifo_queue_drops_an_entry_sent_twice_and_a_downstream_consumer_runs_it_once() {
        let fifo = Queue::create(true, 30).await;
        let destinations = AwsDestinations::new(&sqs_once_aws::sdk_config().await);
        let message = Message::sqs(fifo.url(), "once").group("g");
        // A sender that stopped between its send and the entry's deletion: the next sender sends it again.
        destinations.send("a-stable-outbox-id", &message).await.unwrap();
        destinations.send("a-stable-outbox-id", &message).await.unwrap();
        assert_eq!(fifo.drain().await.len(), 1, "deduplicated by the outbox id");

        // On a standard queue both copies arrive; a downstream consumer keyed on the outbox id runs once.
        let standard = Queue::create(false, 30).await;
        let message = Message::sqs(standard.url(), "once");
        destinations.send("another-outbox-id", &message).await.unwrap();
        destinations.send("another-outbox-id", &message).await.unwrap();
        let copies = standard.drain().await;
        assert_eq!(copies.len(), 2);
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let downstream = TestConsumer::new(handler_fn(move |_| {
            let counted = Arc::clone(&counted);
            async move {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(None)
            }
        }))
        .key(&format!("messageAttributes.{OUTBOX_ID_ATTRIBUTE}"));
        let report = downstream.process(&parse_event(&standard.event(&copies).to_string()).unwrap()).await;
        assert!(failures(&report).is_empty());
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1, "two copies, one run");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trace_goes_on_through_the_outbox_so_that_the_next_consumer_links_to_it() {
        use aws_sdk_sqs::types::{MessageSystemAttributeNameForSends, MessageSystemAttributeValue};

        use sqs_once_core::trace::TraceContext;

        // The producer is traced with X-Ray: SQS delivers its context as the `AWSTraceHeader` system attribute.
        let (first, next) = (Queue::create(false, 30).await, Queue::create(false, 30).await);
        let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let header = MessageSystemAttributeValue::builder().data_type("String").string_value(xray).build().unwrap();
        let client = testkit::sqs::client().await;
        let send = client.send_message().queue_url(first.url()).message_body("o-1");
        send.message_system_attributes(MessageSystemAttributeNameForSends::AwsTraceHeader, header)
            .send()
            .await
            .unwrap();
        let url = next.url().to_owned();
        let consumer = TestConsumer::new(handler_fn(move |record| {
            let notice = Message::sqs(&url, format!("paid: {}", record.body));
            async move { record.transaction().send(notice).map(|()| None).map_err(Into::into) }
        }));
        let report = consumer.process(&parse_event(&first.event(&first.drain().await).to_string()).unwrap()).await;
        assert!(failures(&report).is_empty());

        let [sent] = &consumer.sent()[..] else { panic!("one message staged") };
        let traceparent = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01";
        assert_eq!(sent.message.attributes["traceparent"], traceparent, "stored with the entry, as the sweep sends it");
        AwsDestinations::new(&sqs_once_aws::sdk_config().await).send(&sent.outbox_id, &sent.message).await.unwrap();
        let received = next.drain().await;
        let [notice] = &received[..] else { panic!("one notice: {received:?}") };
        let system = notice.attributes().unwrap();
        assert_eq!(system[&aws_sdk_sqs::types::MessageSystemAttributeName::AwsTraceHeader], xray);
        assert_eq!(notice.message_attributes().unwrap()["traceparent"].string_value(), Some(traceparent));

        // The next consumer, sqs-once or not, reads the same context.
        let records = parse_event(&next.event(&received).to_string()).unwrap();
        let EventRecord::Message(message) = &records[0] else { panic!("a message") };
        assert_eq!(TraceContext::of(message, Propagators::default()), TraceContext::from_xray(xray));

        // What OTEL_PROPAGATORS names is what goes out: W3C's header alone, or X-Ray's alone.
        let sdk = sqs_once_aws::sdk_config().await;
        for (propagators, w3c, x_ray) in [("tracecontext", true, false), ("xray", false, true)] {
            let destinations = AwsDestinations::new(&sdk).propagating(propagators.parse().unwrap());
            destinations.send(&sent.outbox_id, &sent.message).await.unwrap();
            let received = next.drain().await;
            let [notice] = &received[..] else { panic!("one notice: {received:?}") };
            let attributes = notice.message_attributes().unwrap();
            assert_eq!(attributes.contains_key("traceparent"), w3c, "{propagators}");
            assert!(attributes.contains_key(OUTBOX_ID_ATTRIBUTE), "{propagators}: the rest as before");
            let system = notice.attributes().unwrap();
            let header = system.get(&aws_sdk_sqs::types::MessageSystemAttributeName::AwsTraceHeader);
            assert_eq!(header.map(String::as_str), x_ray.then_some(xray), "{propagators}");
        }
    }

    #[cfg(feature = "eventbridge")]
    #[test]
    fn an_event_carries_its_trace_context_as_its_trace_header() {
        let traceparent = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00";
        let message = Message::event("default", "shop", "Paid", serde_json::json!({"order": "o-1"}));
        let traced = message.clone().attribute("traceparent", traceparent);
        let all = Propagators::default();
        let entry = event_entry(("default", "shop", "Paid"), "id", &traced, all).unwrap();
        let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0";
        assert_eq!(entry.trace_header(), Some(xray));
        let detail: serde_json::Value = serde_json::from_str(entry.detail().unwrap()).unwrap();
        assert_eq!(detail, serde_json::json!({"order": "o-1", "sqs_once_outbox_id": "id"}), "the detail as staged");
        assert_eq!(event_entry(("default", "shop", "Paid"), "id", &message, all).unwrap().trace_header(), None);
        let w3c_only = "tracecontext".parse().unwrap();
        let untraced = event_entry(("default", "shop", "Paid"), "id", &traced, w3c_only).unwrap();
        assert_eq!(untraced.trace_header(), None, "X-Ray's header only where OTEL_PROPAGATORS names it");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queue_of_another_region_gets_its_message_through_a_client_of_that_region() {
        let config = sqs_once_aws::sdk_config().await;
        let europe = aws_sdk_sqs::Client::new(&config.to_builder().region(Region::new("eu-west-1")).build());
        let name = format!("europe-{}", uuid::Uuid::new_v4().simple());
        let created = europe.create_queue().queue_name(&name).send().await.unwrap();
        let url = format!("https://sqs.eu-west-1.amazonaws.com/123456789012/{name}");
        // The configuration's own Region does not know the queue, as SQS refuses an address of another Region.
        let own = Sqs::new(&config);
        let outgoing = |body: &str| OutgoingMessage {
            body: body.into(),
            attributes: HashMap::new(),
            group_id: None,
            deduplication_id: None,
            trace_header: None,
        };
        assert!(own.send_batch(&url, &[outgoing("through us-east-1")]).await[0].is_err());
        AwsDestinations::new(&config).send("an-outbox-id", &Message::sqs(&url, "across")).await.unwrap();
        let received =
            europe.receive_message().queue_url(created.queue_url().unwrap()).wait_time_seconds(1).send().await.unwrap();
        let bodies: Vec<&str> = received.messages().iter().filter_map(|message| message.body()).collect();
        assert_eq!(bodies, ["across"]);
    }

    /// Service settings that read no environment variable, so that a
    /// configuration's endpoint wins over `AWS_ENDPOINT_URL_SQS`.
    #[derive(Debug)]
    struct NoEnvironment;

    impl aws_types::service_config::LoadServiceConfig for NoEnvironment {
        fn load_config(&self, _key: aws_types::service_config::ServiceConfigKey<'_>) -> Option<String> {
            None
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sends_at_once_share_batch_requests_and_each_entry_is_answered_on_its_own() {
        use testkit::faults::{FaultMix, FaultProxy, SQS};
        let queue = Queue::create(false, 30).await;
        let endpoint = std::env::var("AWS_ENDPOINT_URL_SQS").expect("the SQS server");
        // A fifth of the entries of each `SendMessageBatch` fail on their own, as SQS's `InternalError` does.
        let failing = FaultMix { statement_error: 0.2, ..FaultMix::default() };
        let proxy = FaultProxy::start(&endpoint, SQS, failing, &["SendMessageBatch"], 11).await;
        let config = testkit::aws_config().await.to_builder().service_config(NoEnvironment).endpoint_url(&proxy.url);
        let destinations = AwsDestinations::new(&config.build());
        let messages: Vec<Message> = (0..50).map(|n| Message::sqs(queue.url(), n.to_string())).collect();
        let ids: Vec<String> = (0..50).map(|n| format!("outbox-{n}")).collect();
        let send = |n: usize| destinations.send(&ids[n], &messages[n]);
        let answers = futures::future::join_all((0..50).map(send)).await;
        let failed: Vec<usize> = (0..50).filter(|n| answers[*n].is_err()).collect();
        assert!(!failed.is_empty() && failed.len() < 50, "some entries failed, the others were sent: {failed:?}");
        for n in &failed {
            let error = answers[*n].as_ref().unwrap_err();
            assert!(!error.refused && error.reason.contains("InternalError"), "{error}: to be sent again");
        }
        let received = |messages: Vec<aws_sdk_sqs::types::Message>| -> Vec<usize> {
            let mut bodies: Vec<usize> =
                messages.iter().map(|message| message.body().unwrap().parse().unwrap()).collect();
            bodies.sort_unstable();
            bodies
        };
        let sent: Vec<usize> = (0..50).filter(|n| !failed.contains(n)).collect();
        assert_eq!(received(queue.drain().await), sent, "exactly the entries answered as sent arrived");
        let requests = proxy.injected.of("SendMessageBatch");
        assert!(requests <= 8, "50 sends at once in {requests} requests");

        // Sent again, the failed ones arrive too (the proxy refuses a fifth of them again; a third round is spare).
        let mut left = failed;
        for _ in 0..5 {
            let answers = futures::future::join_all(left.iter().map(|n| send(*n))).await;
            let arrived: Vec<usize> = received(queue.drain().await);
            let with = |ok: bool| -> Vec<usize> {
                left.iter().zip(&answers).filter(|(_, answer)| answer.is_ok() == ok).map(|(n, _)| *n).collect()
            };
            let (sent, failed) = (with(true), with(false));
            assert_eq!(arrived, sent);
            left = failed;
            if left.is_empty() {
                return;
            }
        }
        panic!("entries never sent: {left:?}");
    }
}
