//! A runner of one's own: the engine fed from a loop this program writes,
//! rather than from Lambda's or `poll`'s.
//!
//! `sqs-once-engine` is what the Lambda function and `poll` run: one batch
//! in, one partial-batch response out. A program whose messages reach it
//! another way (a queue it reads itself, a test harness, a replay of a
//! dead-letter queue) builds an [`Engine`] with [`Engine::builder`] over a
//! store and keys, and hands it each batch with a deadline; the answer says
//! which records failed, as `batchItemFailures` would. Here the loop reads
//! batches from a channel and the store is the in-memory one; a deployed
//! runner would give it the DynamoDB store, and call [`Engine::tend`] between
//! batches and [`Engine::leave`] before it exits, as `poll` does.
//!
//! ```text
//! cargo run --example own_runner
//! cargo test --example own_runner
//! ```

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime},
};

use aws_lambda_events::sqs::SqsMessage;
use sqs_once::{BoxHandler, HandlerError, handler_fn, store::MemoryStore};
use sqs_once_engine::{Engine, Invocation, event::EventRecord, key::Keys, report::BatchReport};

/// One message as this runner's source delivers it.
fn message(id: &str, body: &str) -> EventRecord {
    let mut message = SqsMessage::default();
    message.message_id = Some(id.to_owned());
    message.body = Some(body.to_owned());
    message.event_source = Some("aws:sqs".to_owned());
    EventRecord::Message(Arc::new(message))
}

/// Runs `batch` through `engine`, answering within ten seconds.
async fn run(engine: &Engine, batch: &[EventRecord], n: usize) -> BatchReport {
    let invocation =
        Invocation { deadline: SystemTime::now() + Duration::from_secs(10), request_id: format!("batch-{n}") };
    engine.process(batch, &invocation, None).await
}

/// The loop of one's own: batches from a channel, run one after another;
/// each batch's failed message ids, and how often the handler ran.
async fn serve(mut batches: tokio::sync::mpsc::Receiver<Vec<EventRecord>>) -> (Vec<Vec<String>>, usize) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let handler = handler_fn(move |record| {
        let counted = Arc::clone(&counted);
        async move {
            if record.body.is_empty() {
                return Err(HandlerError::permanent("an empty order"));
            }
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(None)
        }
    });
    let engine = Engine::builder(Arc::new(MemoryStore::default()), Keys::default()).build(BoxHandler::new(handler));
    let mut failed = Vec::new();
    while let Some(batch) = batches.recv().await {
        let report = run(&engine, &batch, failed.len()).await;
        println!("batch {}: {:?}", failed.len(), report.counts());
        failed.push(report.response().batch_item_failures.into_iter().map(|failure| failure.item_identifier).collect());
    }
    (failed, runs.load(Ordering::SeqCst))
}

/// Three orders, the second empty, delivered twice: the second batch a
/// redelivery of the first.
async fn deliveries() -> tokio::sync::mpsc::Receiver<Vec<EventRecord>> {
    let (sender, batches) = tokio::sync::mpsc::channel(2);
    for _ in 0..2 {
        let batch = vec![message("m-1", r#"{"order": 1}"#), message("m-2", ""), message("m-3", r#"{"order": 3}"#)];
        sender.send(batch).await.expect("the loop is listening");
    }
    batches
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (failed, runs) = serve(deliveries().await).await;
    println!("failed in each batch: {failed:?}; orders run: {runs}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_order_runs_once_and_the_empty_one_fails_in_every_batch() {
        let (failed, runs) = serve(deliveries().await).await;
        assert_eq!(failed, [["m-2"], ["m-2"]], "a permanent failure, then failed before");
        assert_eq!(runs, 2, "two batches of the same two good orders ran each once");
    }
}
