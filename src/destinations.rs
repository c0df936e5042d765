//! Sending outbox messages to SQS, SNS and EventBridge with the AWS SDK,
//! the messages due to one destination at the same time gathered into the
//! service's batch requests ([`Batcher`]), each answered on its own.

use parking_lot::Mutex;
use std::{collections::HashMap, sync::Arc};

use async_trait::async_trait;
use aws_config::{Region, SdkConfig};
#[cfg(any(feature = "sns", feature = "eventbridge"))]
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};

use self::queues::QueueSends;
use crate::sqs::Sqs;
use sqs_once_aws::batched::{BatchCall, Batcher};
use sqs_once_core::{
    destinations::{Destinations, SendError},
    payload::SIZE_ATTRIBUTE,
    trace::{Propagators, TRACEPARENT},
    transaction::{Destination, Message, OUTBOX_ID_ATTRIBUTE},
};

#[cfg(feature = "eventbridge")]
mod buses;
mod queues;
#[cfg(feature = "sns")]
mod topics;

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

/// Error codes with which a service answers that it cannot now: throttled
/// (SNS's `Throttled` and `KMSThrottling`, EventBridge's and SQS's
/// `ThrottlingException`), unavailable, or failed inside. They are never a
/// refusal, whatever else the code says.
const NOT_NOW: &[&str] = &["Throttl", "ServiceUnavailable", "InternalError", "InternalFailure", "InternalException"];

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
    queues: Gathered<QueueSends>,
    #[cfg(feature = "sns")]
    sns: aws_sdk_sns::Client,
    /// The publishes to each topic, gathered into `PublishBatch` requests.
    #[cfg(feature = "sns")]
    topics: Gathered<topics::TopicPublishes>,
    #[cfg(feature = "eventbridge")]
    eventbridge: aws_sdk_eventbridge::Client,
    /// The events to each bus, gathered into `PutEvents` requests.
    #[cfg(feature = "eventbridge")]
    buses: Gathered<buses::BusPuts>,
}

/// A batcher for each destination of one kind, by its address.
type Gathered<C> = Mutex<HashMap<String, Arc<Batcher<C>>>>;

/// The batcher of the destination at `address`, made by `call` if it is the
/// first send there.
fn gathered<C: BatchCall>(batchers: &Gathered<C>, address: &str, call: impl FnOnce() -> C) -> Arc<Batcher<C>> {
    let mut batchers = batchers.lock();
    let batcher = batchers.entry(address.to_owned()).or_insert_with(|| Arc::new(Batcher::new(Arc::new(call()))));
    Arc::clone(batcher)
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
            #[cfg(feature = "sns")]
            topics: Mutex::default(),
            #[cfg(feature = "eventbridge")]
            eventbridge: aws_sdk_eventbridge::Client::new(&config),
            #[cfg(feature = "eventbridge")]
            buses: Mutex::default(),
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

#[async_trait]
impl Destinations for AwsDestinations {
    async fn send(&self, outbox_id: &str, message: &Message) -> Result<(), SendError> {
        self.clients(&message.destination).await.send(outbox_id, message, self.propagators).await
    }
}

impl Clients {
    /// Sends `message` with whatever else is due to its destination now.
    async fn send(&self, outbox_id: &str, message: &Message, propagators: Propagators) -> Result<(), SendError> {
        match &message.destination {
            Destination::Sqs { queue_url } => {
                let outgoing = queues::outgoing(outbox_id, message, propagators)?;
                let sends = gathered(&self.queues, queue_url, || QueueSends::new(self.sqs.clone(), queue_url));
                let sent = sends.submit((outbox_id.to_owned(), outgoing)).await;
                sent.map_err(|error| judged(&error.reason, error.to_string()))
            }
            #[cfg(feature = "sns")]
            Destination::Sns { topic_arn } => {
                let publish = topics::Publish::new(outbox_id, message, propagators)?;
                let publishes =
                    gathered(&self.topics, topic_arn, || topics::TopicPublishes::new(self.sns.clone(), topic_arn));
                publishes.submit(publish).await.map_err(|unsent| unsent.error)
            }
            #[cfg(feature = "eventbridge")]
            Destination::EventBridge { event_bus, source, detail_type } => {
                let put = buses::Put::new((event_bus, source, detail_type), outbox_id, message, propagators)?;
                let puts = gathered(&self.buses, event_bus, || buses::BusPuts::new(self.eventbridge.clone()));
                puts.submit(put).await.map_err(|unsent| unsent.error)
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
/// [`REFUSALS`] and not one of [`NOT_NOW`].
fn judged(code: &str, reason: String) -> SendError {
    let among = |codes: &[&str]| codes.iter().any(|listed| code.contains(listed));
    match among(REFUSALS) && !among(NOT_NOW) {
        true => SendError::refused(reason),
        false => SendError::failed(reason),
    }
}

/// Why an entry of an SNS or EventBridge batch request was not sent.
#[cfg(any(feature = "sns", feature = "eventbridge"))]
#[derive(Debug, Clone)]
struct Unsent {
    error: SendError,
    /// The service throttled it or could not be reached: fewer requests go
    /// out at once ([`BatchCall::congested`]).
    congested: bool,
}

#[cfg(any(feature = "sns", feature = "eventbridge"))]
impl Unsent {
    /// An entry the service answered with the error `code`.
    fn of_entry(operation: &str, code: &str, message: Option<&str>) -> Self {
        let reason = format!("{operation}: {code}: {}", message.unwrap_or("no message"));
        Self { error: judged(code, reason), congested: NOT_NOW.iter().any(|listed| code.contains(listed)) }
    }

    /// Each entry of a request that failed as a whole.
    fn of_request<E, R>(operation: &str, error: &SdkError<E, R>) -> Self
    where
        SdkError<E, R>: std::error::Error + ProvideErrorMetadata,
    {
        let reason = format!("{operation}: {}", sqs_once_aws::describe(error));
        let Some(code) = error.code() else {
            return Self { error: SendError::failed(reason), congested: sqs_once_aws::unanswered(error) };
        };
        Self { error: judged(code, reason), congested: NOT_NOW.iter().any(|listed| code.contains(listed)) }
    }

    /// An entry whose request ended without answering it: to be sent again.
    fn unanswered(reason: String) -> Self {
        Self { error: SendError::failed(reason), congested: true }
    }

    /// An entry that cannot be sent as it stands.
    #[cfg(feature = "sns")]
    fn refused(reason: String) -> Self {
        Self { error: SendError::refused(reason), congested: false }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use testkit::sqs::Queue;

    use super::*;
    use crate::sqs::OutgoingMessage;
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
        let put =
            |message: &Message, propagators| buses::Put::new(("default", "shop", "Paid"), "id", message, propagators);
        let traced_put = put(&traced, all).unwrap();
        let entry = traced_put.entry();
        let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0";
        assert_eq!(entry.trace_header(), Some(xray));
        let detail: serde_json::Value = serde_json::from_str(entry.detail().unwrap()).unwrap();
        assert_eq!(detail, serde_json::json!({"order": "o-1", "sqs_once_outbox_id": "id"}), "the detail as staged");
        assert_eq!(put(&message, all).unwrap().entry().trace_header(), None);
        let w3c_only = "tracecontext".parse().unwrap();
        let untraced = put(&traced, w3c_only).unwrap();
        assert_eq!(untraced.entry().trace_header(), None, "X-Ray's header only where OTEL_PROPAGATORS names it");
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sends_at_once_share_batch_requests_and_each_entry_is_answered_on_its_own() {
        let queue = Queue::create(false, 30).await;
        let url = queue.url().to_owned();
        let sent =
            sent_at_once(testkit::faults::SQS, "SendMessageBatch", &queue, |n| Message::sqs(&url, n.to_string()));
        sent.await;
    }

    #[cfg(feature = "sns")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn publishes_at_once_share_batch_requests_and_each_entry_is_answered_on_its_own() {
        let queue = Queue::create(false, 30).await;
        let topic = queue.subscribed_topic().await;
        sent_at_once(testkit::faults::SNS, "PublishBatch", &queue, |n| Message::sns(&topic, n.to_string())).await;
    }

    #[cfg(feature = "eventbridge")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn events_at_once_share_batch_requests_and_each_entry_is_answered_on_its_own() {
        let queue = Queue::create(false, 30).await;
        let source = format!("shop.{}", uuid::Uuid::new_v4().simple());
        queue.receive_events_of(&source).await;
        let event = |n: usize| Message::event("default", &source, "Counted", serde_json::json!({ "n": n }));
        sent_at_once(testkit::faults::EVENTBRIDGE, "PutEvents", &queue, event).await;
    }

    /// Sends 50 messages at once through a proxy in front of `service` that
    /// fails a fifth of the entries of each `operation` request on their own,
    /// as the services' `InternalError` and `InternalFailure` do: those are
    /// answered as to be sent again, exactly the others arrive in `queue`
    /// (where the messages lead), in a few requests; sent again, all arrive.
    async fn sent_at_once(
        service: testkit::faults::Service,
        operation: &'static str,
        queue: &Queue,
        message: impl Fn(usize) -> Message,
    ) {
        use testkit::faults::{FaultMix, FaultProxy};
        let endpoint = std::env::var("AWS_ENDPOINT_URL_SQS").expect("the SQS server, which serves SNS and EventBridge");
        let failing = FaultMix { statement_error: 0.2, ..FaultMix::default() };
        let operations = Box::leak(Box::new([operation]));
        let proxy = FaultProxy::start(&endpoint, service, failing, operations, 11).await;
        let destinations = AwsDestinations::new(&testkit::aws_config_through(&proxy.url).await);
        let messages: Vec<Message> = (0..50).map(message).collect();
        let ids: Vec<String> = (0..50).map(|n| format!("outbox-{n}")).collect();
        let send = |n: usize| destinations.send(&ids[n], &messages[n]);
        let answers = futures::future::join_all((0..50).map(send)).await;
        let failed: Vec<usize> = (0..50).filter(|n| answers[*n].is_err()).collect();
        assert!(!failed.is_empty() && failed.len() < 50, "some entries failed, the others were sent: {failed:?}");
        for n in &failed {
            let error = answers[*n].as_ref().unwrap_err();
            assert!(!error.refused && error.reason.contains("Internal"), "{error}: to be sent again");
        }
        // A message's number is its body, or its event's detail's `n`.
        let number = |message: &aws_sdk_sqs::types::Message| -> usize {
            let body: serde_json::Value = serde_json::from_str(message.body().unwrap()).unwrap();
            let number = if body.is_object() { &body["detail"]["n"] } else { &body };
            usize::try_from(number.as_u64().unwrap()).unwrap()
        };
        let received = |messages: Vec<aws_sdk_sqs::types::Message>| -> Vec<usize> {
            let mut numbers: Vec<usize> = messages.iter().map(number).collect();
            numbers.sort_unstable();
            numbers
        };
        let sent: Vec<usize> = (0..50).filter(|n| !failed.contains(n)).collect();
        assert_eq!(received(queue.drain().await), sent, "exactly the entries answered as sent arrived");
        let requests = proxy.injected.of(operation);
        assert!(requests <= 8, "50 sends at once in {requests} {operation} requests");
        assert_eq!(proxy.injected.requests.load(std::sync::atomic::Ordering::SeqCst), requests, "no other call");

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
