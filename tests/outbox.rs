//! The outbox end to end on the SQS server (moto, which answers SNS and
//! EventBridge too): a consumer's handler stages messages, and they reach an
//! SQS queue, a FIFO queue, an SNS topic and an EventBridge bus (both
//! delivering to queues), each carrying its outbox id where a receiver can
//! key on it.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use aws_sdk_sqs::types::Message as SqsMessage;
use serde_json::{Value, json};
use sqs_once::{
    Record,
    config::Config,
    consumer::{Consumer, Invocation},
    event::parse_event,
    handler_fn,
    outbox::OutboxQuery,
    store::{ClaimStore, MemoryStore},
    testing,
    transaction::{Message, OUTBOX_ID_ATTRIBUTE, OUTBOX_ID_FIELD},
};
use testkit::sqs::Queue;

/// A consumer on the memory store, as the settings describe one, whose
/// handler stages `messages` for every record.
async fn consumer(messages: Vec<Message>) -> Consumer {
    let handler = handler_fn(move |record: Record| {
        let messages = messages.clone();
        async move {
            for message in messages {
                record.transaction().send(message)?;
            }
            Ok(None)
        }
    });
    let config = Config::from_lookup(|name| match name {
        "SQS_ONCE_STORE" => Some("memory".to_owned()),
        _ => std::env::var(name).ok(),
    })
    .unwrap();
    Consumer::builder().config(config).build(handler).await.unwrap()
}

async fn process(consumer: &Consumer, body: &str) {
    let event = json!({ "Records": [{ "messageId": "m-1", "body": body, "eventSource": "aws:sqs" }] });
    let invocation = Invocation { deadline: SystemTime::now() + Duration::from_secs(20), request_id: "r".into() };
    let answer = consumer.process(&parse_event(&event.to_string()).unwrap(), &invocation).await;
    assert!(testing::failures(&answer.report).is_empty(), "{:?}", answer.report);
}

fn attribute<'m>(message: &'m SqsMessage, name: &str) -> Option<&'m str> {
    message.message_attributes()?.get(name)?.string_value()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_reach_queues_topics_and_buses_with_their_outbox_id() {
    let (direct, fifo, from_topic, from_bus) = (
        Queue::create(false, 30).await,
        Queue::create(true, 30).await,
        Queue::create(false, 30).await,
        Queue::create(false, 30).await,
    );
    let topic = from_topic.subscribed_topic().await;
    let source = format!("shop.{}", uuid::Uuid::new_v4().simple());
    from_bus.receive_events_of(&source).await;
    let consumer = consumer(vec![
        Message::sqs(direct.url(), "to the queue").attribute("kind", "direct"),
        Message::sqs(fifo.url(), "to the fifo queue").group("g-1"),
        Message::sns(&topic, "to the topic").attribute("kind", "published"),
        Message::event("default", &source, "OrderPaid", json!({ "order": "o-1" })),
    ])
    .await;
    process(&consumer, "paid").await;

    let (queued, fifo_queued, published, events) =
        tokio::join!(direct.drain(), fifo.drain(), from_topic.drain(), from_bus.drain());
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].body(), Some("to the queue"));
    assert_eq!(attribute(&queued[0], "kind"), Some("direct"));
    let outbox_id = attribute(&queued[0], OUTBOX_ID_ATTRIBUTE).expect("the outbox id").to_owned();
    assert_eq!(outbox_id.len(), 64);

    assert_eq!(fifo_queued.len(), 1);
    let system = fifo_queued[0].attributes().unwrap();
    let deduplication = system.get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageDeduplicationId);
    assert_eq!(deduplication.map(String::as_str), attribute(&fifo_queued[0], OUTBOX_ID_ATTRIBUTE));
    assert_eq!(
        system.get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId).map(String::as_str),
        Some("g-1")
    );

    assert_eq!(published.len(), 1);
    assert_eq!(published[0].body(), Some("to the topic"));
    assert_eq!(attribute(&published[0], "kind"), Some("published"));
    assert!(attribute(&published[0], OUTBOX_ID_ATTRIBUTE).is_some());

    assert_eq!(events.len(), 1);
    let event: Value = serde_json::from_str(events[0].body().unwrap()).unwrap();
    assert_eq!((event["source"].as_str(), event["detail-type"].as_str()), (Some(source.as_str()), Some("OrderPaid")));
    assert_eq!(event["detail"]["order"], "o-1");
    assert_eq!(event["detail"][OUTBOX_ID_FIELD].as_str().map(str::len), Some(64));

    // Four messages of one run: four distinct ids.
    let ids: std::collections::HashSet<String> = [
        outbox_id,
        attribute(&fifo_queued[0], OUTBOX_ID_ATTRIBUTE).unwrap().to_owned(),
        attribute(&published[0], OUTBOX_ID_ATTRIBUTE).unwrap().to_owned(),
        event["detail"][OUTBOX_ID_FIELD].as_str().unwrap().to_owned(),
    ]
    .into();
    assert_eq!(ids.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_slower_than_an_attempt_gets_each_message_once() {
    // A queue whose requests take 3 s, past the SDK's 2 s attempt: a send the attempt's timeout cut off had landed,
    // and each retry landed again (three copies a send, never confirmed, sent again by every sweep).
    let queue = Queue::create(false, 30).await;
    let endpoint = std::env::var("AWS_ENDPOINT_URL_SQS").expect("the SQS server");
    let slow = testkit::delay::DelayProxy::slow_service(&endpoint, Duration::from_secs(3)).await.unwrap();
    let sdk = testkit::aws_config_through(&slow.url).await;
    let handler = handler_fn({
        let url = queue.url().to_owned();
        move |record: Record| {
            let url = url.clone();
            async move {
                record.transaction().send(Message::sqs(url, "slow"))?;
                Ok(None)
            }
        }
    });
    let config = Config::from_lookup(|name| match name {
        "SQS_ONCE_STORE" => Some("memory".to_owned()),
        _ => std::env::var(name).ok(),
    })
    .unwrap();
    let store = Arc::new(MemoryStore::default());
    let claims: Arc<dyn ClaimStore> = store.clone();
    let consumer = Consumer::builder().config(config).sdk_config(sdk).store(claims).build(handler).await.unwrap();
    let started = std::time::Instant::now();
    process(&consumer, "paid").await;
    assert!(started.elapsed() >= Duration::from_secs(3), "the run's own send answered: {:?}", started.elapsed());
    // Every copy a retry could have sent has landed by now.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let sent = queue.drain().await;
    assert_eq!(sent.iter().map(|message| message.body()).collect::<Vec<_>>(), [Some("slow")], "sent once");
    let outbox = store.capabilities().outbox.expect("the memory store keeps an outbox");
    let left = outbox.entries(&OutboxQuery { due_at_ms: None, limit: 10 }).await.unwrap();
    assert!(left.is_empty(), "sent, so deleted: {left:?}");
}

/// A consumer whose SQS requests go through `proxy`, keeping claims in memory, and whose handler stages
/// `messages(record)`.
async fn consumer_through<F>(proxy: &testkit::faults::FaultProxy, messages: F) -> Consumer
where
    F: Fn(&Record) -> Vec<Message> + Send + Sync + 'static,
{
    let sdk = testkit::aws_config_through(&proxy.url).await;
    let messages = Arc::new(messages);
    let handler = handler_fn(move |record: Record| {
        let messages = Arc::clone(&messages);
        async move {
            for message in messages(&record) {
                record.transaction().send(message)?;
            }
            Ok(None)
        }
    });
    let config = Config::from_lookup(|name| match name {
        "SQS_ONCE_STORE" => Some("memory".to_owned()),
        _ => std::env::var(name).ok(),
    })
    .unwrap();
    let store: Arc<dyn ClaimStore> = Arc::new(MemoryStore::default());
    Consumer::builder().config(config).sdk_config(sdk).store(store).build(handler).await.unwrap()
}

/// A batch of `count` records, bodies `0`, `1`, ….
fn batch_of(count: usize) -> Vec<sqs_once::event::EventRecord> {
    let records: Vec<Value> = (0..count)
        .map(|n| json!({ "messageId": format!("m-{n}"), "body": n.to_string(), "eventSource": "aws:sqs" }))
        .collect();
    parse_event(&json!({ "Records": records }).to_string()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_a_hundred_notices_leaves_in_about_ten_requests() {
    let queue = Queue::create(false, 30).await;
    let endpoint = std::env::var("AWS_ENDPOINT_URL_SQS").expect("the SQS server");
    let proxy = testkit::faults::FaultProxy::start(&endpoint, testkit::faults::SQS, Default::default(), &[], 0).await;
    let url = queue.url().to_owned();
    let consumer = consumer_through(&proxy, move |record| vec![Message::sqs(&url, record.body.to_string())]).await;
    let invocation = Invocation { deadline: SystemTime::now() + Duration::from_secs(20), request_id: "r".into() };
    let answer = consumer.process(&batch_of(100), &invocation).await;
    assert!(testing::failures(&answer.report).is_empty(), "{:?}", answer.report);
    let mut bodies: Vec<usize> =
        queue.drain().await.iter().map(|message| message.body().unwrap().parse().unwrap()).collect();
    bodies.sort_unstable();
    assert_eq!(bodies, (0..100).collect::<Vec<_>>(), "each notice once");
    let (batches, singles) = (proxy.injected.of("SendMessageBatch"), proxy.injected.of("SendMessage"));
    assert_eq!(singles, 0);
    assert!((10..=15).contains(&batches), "{batches} SendMessageBatch requests for 100 notices");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_queue_gets_each_runs_messages_in_order_across_requests() {
    let queue = Queue::create(true, 30).await;
    let endpoint = std::env::var("AWS_ENDPOINT_URL_SQS").expect("the SQS server");
    let proxy = testkit::faults::FaultProxy::start(&endpoint, testkit::faults::SQS, Default::default(), &[], 0).await;
    let url = queue.url().to_owned();
    // 30 runs of 4 messages each, all in one of three groups: 120 messages, more than one request holds.
    let consumer = consumer_through(&proxy, move |record| {
        let run = record.body.to_string();
        let group = format!("g{}", run.parse::<usize>().unwrap() % 3);
        (0..4).map(|n| Message::sqs(&url, format!("{run}.{n}")).group(&group)).collect()
    })
    .await;
    let invocation = Invocation { deadline: SystemTime::now() + Duration::from_secs(20), request_id: "r".into() };
    let answer = consumer.process(&batch_of(30), &invocation).await;
    assert!(testing::failures(&answer.report).is_empty(), "{:?}", answer.report);
    let received = queue.drain().await;
    assert_eq!(received.len(), 120, "each message once");
    for run in 0..30 {
        let sent: Vec<&str> = received
            .iter()
            .filter_map(|message| message.body())
            .filter(|body| body.split('.').next() == Some(&run.to_string()))
            .collect();
        let expected: Vec<String> = (0..4).map(|n| format!("{run}.{n}")).collect();
        assert_eq!(sent, expected, "run {run}'s messages in the order it staged them");
    }
    assert!(proxy.injected.of("SendMessageBatch") < 60, "{:?}", proxy.injected.report());
}
