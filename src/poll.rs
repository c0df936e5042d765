//! `sqs-once poll`: the same engine and handlers as a long-running consumer,
//! for ECS, EC2 or a laptop.
//!
//! Several receivers long-poll the queue, up to ten messages a call, while
//! the messages received and not yet settled stay under a bound. Each
//! received batch goes through the engine exactly as a Lambda batch would,
//! with a deadline one visibility timeout away (or `--timeout`); while it
//! runs, its messages' visibility is extended every half visibility timeout,
//! so a batch still settling is not delivered to someone else. Then the
//! successes are deleted with `DeleteMessageBatch` and the failures get the
//! redelivery policy's back-off, exactly as in Lambda.
//!
//! At the start, a claim table or a queue that does not answer is waited for
//! ([`crate::waiting`]), as a receive that fails is tried again later; a
//! signal meanwhile ends the wait, with nothing done.
//!
//! Shutdown stops receiving, lets the batches in flight finish, settle and
//! delete, and returns; nothing is dropped half-way. A receive call cut short
//! by the shutdown may have taken messages that it never returns: SQS makes
//! them visible again after their visibility timeout.

use parking_lot::Mutex;
use std::{
    collections::HashSet,
    convert::Infallible,
    future::Future,
    ops::ControlFlow,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use aws_sdk_sqs::types::Message;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::{
    consumer::{Answer, Consumer},
    sqs::{QueueInfo, Sqs, SqsError, event_message},
};
use sqs_once_engine::{
    Invocation,
    budget::LEAVING_TIME,
    event::EventRecord,
    report::{BatchReport, Failure, Outcome},
};

/// Messages per `ReceiveMessage`, as SQS allows.
const RECEIVE_LIMIT: usize = 10;
/// Pause after a failed `ReceiveMessage`, so a queue that is down is not hammered.
const RECEIVE_RETRY: Duration = Duration::from_secs(1);

/// Tuning of the poller; `sqs-once poll --help` shows the matching flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PollOptions {
    /// `ReceiveMessage` calls in flight at once.
    pub receivers: usize,
    /// Messages received and not yet settled, at most.
    pub max_in_flight: usize,
    /// How long a `ReceiveMessage` waits for messages (long polling, at most 20 s).
    pub wait: Duration,
    /// Each record's deadline, counted from its receipt; the queue's
    /// visibility timeout when `None`.
    pub timeout: Option<Duration>,
}

impl Default for PollOptions {
    fn default() -> Self {
        Self { receivers: 2, max_in_flight: 100, wait: Duration::from_secs(20), timeout: None }
    }
}

/// What a run of the poller did, printed when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct PollSummary {
    /// Messages received.
    pub received: u64,
    /// Records whose handler ran and succeeded.
    pub processed: u64,
    /// Records whose key had completed before.
    pub duplicates: u64,
    /// Records left on the queue for another delivery.
    pub failed: u64,
    /// Records moved to the dead-letter queue.
    pub dead_lettered: u64,
    /// Messages deleted from the queue.
    pub deleted: u64,
    /// Deletions SQS refused or that could not be sent (those messages come
    /// back, and are then duplicates).
    pub delete_failed: u64,
    /// `ReceiveMessage` calls that failed.
    pub receive_errors: u64,
    /// Finishing writes still unconfirmed when the poller stopped (sent again
    /// for up to five seconds first; their claims stay in progress until
    /// their leases end).
    pub unconfirmed: u64,
}

/// Why the poller cannot start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PollError {
    /// The queue's attributes could not be read.
    #[error("cannot read the queue's attributes")]
    Queue(#[from] SqsError),
    /// No time is left for a record.
    #[error("the queue's visibility timeout is 0 s: pass a timeout (--timeout SECONDS) to give each record time")]
    NoTimeout,
}

/// A long-running consumer of one queue.
pub(crate) struct Poller {
    consumer: Consumer,
    sqs: Sqs,
    queue: QueueInfo,
    options: PollOptions,
    timeout: Duration,
    /// This process, in the claims' holder names.
    id: String,
    batches: AtomicU64,
    summary: Mutex<PollSummary>,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller")
            .field("queue", &self.queue.url)
            .field("options", &self.options)
            .field("timeout", &self.timeout)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Poller {
    /// A poller of `queue_url`, after reading the queue's attributes: a
    /// queue that does not answer is waited for ([`crate::waiting`]).
    pub(crate) async fn new(
        consumer: Consumer,
        sqs: Sqs,
        queue_url: &str,
        options: PollOptions,
    ) -> Result<Self, PollError> {
        let endpoint = sqs.endpoint();
        if let Some(host) = foreign_host(queue_url, &endpoint) {
            tracing::warn!(
                queue = queue_url, %endpoint,
                "the queue URL names {host}, but SQS requests go to {endpoint}: set AWS_ENDPOINT_URL_SQS to the queue's \
                 server (the SDK sends to its endpoint, whatever host the queue URL names)"
            );
        }
        let what = format!("the queue (SQS at {endpoint})");
        let queue = crate::waiting::until_answered(&what, async || match sqs.queue_info(queue_url).await {
            Err(error) if error.transient => match sqs.can_sign().await {
                Ok(()) => ControlFlow::Continue(error.to_string()),
                Err(unsigned) => ControlFlow::Break(Err(unsigned)),
            },
            read => ControlFlow::Break(read),
        })
        .await?;
        let timeout = options.timeout.unwrap_or(queue.visibility_timeout);
        if timeout.is_zero() {
            return Err(PollError::NoTimeout);
        }
        consumer.redelivered_by_queue(queue.visibility_timeout, timeout);
        tracing::info!(
            queue = %queue.arn, fifo = queue.fifo, visibility_timeout_s = queue.visibility_timeout.as_secs(),
            timeout_ms = timeout.as_millis(), "polling"
        );
        let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
        Ok(Self {
            consumer,
            sqs,
            queue,
            options,
            timeout,
            id,
            batches: AtomicU64::new(0),
            summary: Mutex::new(PollSummary::default()),
        })
    }

    /// Polls until `shutdown` completes, then finishes the messages in flight
    /// and returns what it did.
    pub(crate) async fn run(self, shutdown: impl Future<Output = ()>) -> PollSummary {
        let poller = Arc::new(self);
        let bound = poller.options.max_in_flight.max(1);
        let in_flight = Arc::new(Semaphore::new(bound));
        let (stop, stopped) = watch::channel(false);
        let receivers: Vec<_> = (0..poller.options.receivers.max(1))
            .map(|_| tokio::spawn(Arc::clone(&poller).receive(Arc::clone(&in_flight), stopped.clone())))
            .collect();
        // Failed writes are sent again and the outbox swept whether batches come or not.
        let tender = tokio::spawn({
            let (engine, mut stopped) = (poller.consumer.engine.clone(), stopped.clone());
            async move {
                let stopping = async {
                    let _ = stopped.wait_for(|stopped| *stopped).await;
                };
                engine.tend(stopping).await;
            }
        });
        shutdown.await;
        tracing::info!("stopping: no more receiving; finishing the messages in flight");
        let _ = stop.send(true);
        futures::future::join_all(receivers).await;
        let _ = tender.await;
        // Every batch holds its permits until it has settled.
        let _all_settled = in_flight.acquire_many(u32::try_from(bound).unwrap_or(u32::MAX)).await;
        let unconfirmed = poller.consumer.leave(tokio::time::Instant::now() + LEAVING_TIME).await;
        poller.summary.lock().unconfirmed = unconfirmed.len() as u64;
        let summary = *poller.summary.lock();
        tracing::info!(?summary, "stopped");
        summary
    }

    /// One receiver: waits for room, receives, hands the batch off, again.
    async fn receive(self: Arc<Self>, in_flight: Arc<Semaphore>, mut stopped: watch::Receiver<bool>) {
        loop {
            let mut permits = tokio::select! {
                permit = Arc::clone(&in_flight).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
                _ = stopped.wait_for(|stopped| *stopped) => return,
            };
            while permits.num_permits() < RECEIVE_LIMIT {
                match Arc::clone(&in_flight).try_acquire_owned() {
                    Ok(more) => permits.merge(more),
                    Err(_) => break,
                }
            }
            let received = tokio::select! {
                received = self.sqs.receive(&self.queue.url, permits.num_permits(), self.options.wait) => received,
                _ = stopped.wait_for(|stopped| *stopped) => return,
            };
            match received {
                Err(error) => {
                    self.summary.lock().receive_errors += 1;
                    tracing::warn!(%error, "cannot receive; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(RECEIVE_RETRY) => {}
                        _ = stopped.wait_for(|stopped| *stopped) => return,
                    }
                }
                Ok(messages) if messages.is_empty() => {}
                Ok(messages) => {
                    // Room not taken by this batch goes back at once.
                    drop(permits.split(permits.num_permits().saturating_sub(messages.len())));
                    tokio::spawn(Arc::clone(&self).process(messages, permits));
                }
            }
        }
    }

    /// Runs one received batch through the engine, keeping its messages
    /// invisible meanwhile, then settles it with SQS.
    async fn process(self: Arc<Self>, messages: Vec<Message>, _permits: OwnedSemaphorePermit) {
        let deadline = SystemTime::now() + self.timeout;
        let records: Vec<EventRecord> = messages
            .into_iter()
            .map(|message| EventRecord::Message(Arc::new(event_message(message, &self.queue))))
            .collect();
        let batch = self.batches.fetch_add(1, Ordering::Relaxed);
        let invocation = Invocation { deadline, request_id: format!("poll-{}-{batch}", self.id) };
        let report = tokio::select! {
            report = self.consumer.engine.process(&records, &invocation, None) => report,
            never = self.keep_invisible(&records) => match never {},
        };
        self.hint_at_deadlines(&report);
        let answer = self.consumer.redeliver(&records, report, deadline).await;
        let (deleted, delete_failed) = self.delete_settled(&records, &answer).await;
        self.consumer.export_spans(self.consumer.engine.budget(deadline).sqs_by()).await;
        let mut summary = self.summary.lock();
        summary.received += records.len() as u64;
        for record in &answer.report.records {
            match record.outcome {
                Outcome::Processed { .. } => summary.processed += 1,
                Outcome::Duplicate => summary.duplicates += 1,
                // Failed records are counted from the answer below.
                _ => {}
            }
        }
        summary.failed += answer.response.batch_item_failures.len() as u64;
        summary.dead_lettered += answer.redelivery.map_or(0, |counts| counts.dead_lettered);
        summary.deleted += deleted;
        summary.delete_failed += delete_failed;
    }

    /// Says why records ended `deadline`, and what to change: in `poll` a
    /// record's time is `--timeout`, the queue's visibility timeout unless
    /// given, which a handler longer than it never finishes within.
    fn hint_at_deadlines(&self, report: &BatchReport) {
        let cut = report.records.iter().filter(|record| matches!(record.outcome, Outcome::Failed(Failure::Deadline)));
        let (count, longest) =
            cut.fold((0, Duration::ZERO), |(count, longest), record| (count + 1, longest.max(record.duration)));
        if count > 0 {
            tracing::warn!(
                records = count,
                timeout_s = self.timeout.as_secs_f64(),
                ran_ms = longest.as_millis(),
                visibility_timeout_s = self.queue.visibility_timeout.as_secs(),
                "records not finished within poll's timeout of {:?} ({}): raise --timeout to give handlers longer \
                 (poll keeps their messages invisible meanwhile), or shorten the handlers",
                self.timeout,
                if self.timeout == self.queue.visibility_timeout {
                    "the queue's visibility timeout"
                } else {
                    "--timeout"
                }
            );
        }
    }

    /// Extends the visibility of `records` by the queue's visibility timeout
    /// every half of it; never returns, and is dropped when the batch is done.
    async fn keep_invisible(&self, records: &[EventRecord]) -> Infallible {
        let visibility = self.queue.visibility_timeout;
        let changes: Vec<(&str, Duration)> =
            records.iter().filter_map(receipt_handle).map(|receipt_handle| (receipt_handle, visibility)).collect();
        loop {
            tokio::time::sleep((visibility / 2).max(Duration::from_secs(1))).await;
            if visibility.is_zero() {
                continue;
            }
            for error in self.sqs.change_visibility(&self.queue.url, &changes).await.into_iter().filter_map(Result::err)
            {
                tracing::warn!(%error, "visibility not extended; the message may be delivered again meanwhile");
            }
        }
    }

    /// Deletes every record that is not in the response's failures; returns
    /// how many were deleted and how many were not.
    async fn delete_settled(&self, records: &[EventRecord], answer: &Answer) -> (u64, u64) {
        let failed: HashSet<&str> =
            answer.response.batch_item_failures.iter().map(|failure| failure.item_identifier.as_str()).collect();
        let settled: Vec<&str> =
            records.iter().filter(|record| !failed.contains(record.message_id())).filter_map(receipt_handle).collect();
        let results = self.sqs.delete(&self.queue.url, &settled).await;
        let mut deleted = 0;
        for result in &results {
            match result {
                Ok(()) => deleted += 1,
                Err(error) => tracing::warn!(%error, "not deleted; it will come back as a duplicate"),
            }
        }
        (deleted, results.len() as u64 - deleted)
    }
}

fn receipt_handle(record: &EventRecord) -> Option<&str> {
    match record {
        EventRecord::Message(message) => message.receipt_handle.as_deref(),
        _ => None,
    }
}

/// Completes at the first SIGINT or SIGTERM. A second one ends the process
/// at once (exit status 130): claims in flight then end with their leases,
/// and their messages come back after their visibility timeout.
///
/// The handlers are installed when this is called, not when the future is
/// first polled, so a signal that comes while the poller starts is not lost.
pub(crate) fn interrupted() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let signals =
        signal(SignalKind::terminate()).and_then(|terminate| Ok((terminate, signal(SignalKind::interrupt())?)));
    async move {
        let Ok((mut terminate, mut interrupt)) = signals else {
            tracing::warn!("cannot listen for SIGINT and SIGTERM; stop with SIGKILL");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM"),
            _ = interrupt.recv() => tracing::info!("SIGINT"),
        }
        tokio::spawn(async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
            tracing::warn!("second signal: leaving now; unfinished messages come back after their visibility timeout");
            std::process::exit(130);
        });
    }
}

/// The host `queue_url` names when it is not AWS's and requests go to AWS
/// (`endpoint` names no URL of its own): a local queue polled without
/// `AWS_ENDPOINT_URL_SQS`, whose requests would never reach it.
fn foreign_host<'u>(queue_url: &'u str, endpoint: &str) -> Option<&'u str> {
    if endpoint.starts_with("http://") || endpoint.starts_with("https://") {
        return None;
    }
    let host = queue_url.split_once("://")?.1.split('/').next()?;
    let name = host.split(':').next().unwrap_or(host);
    (!name.ends_with(".amazonaws.com") && !name.ends_with(".amazonaws.com.cn")).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_url_of_another_host_than_aws_is_named_when_requests_go_to_aws() {
        let aws = "AWS, region us-east-1 (no AWS_ENDPOINT_URL_SQS: the account the credentials name)";
        assert_eq!(foreign_host("http://127.0.0.1:9324/123456789012/work", aws), Some("127.0.0.1:9324"));
        assert_eq!(foreign_host("https://sqs.us-east-1.amazonaws.com/123456789012/work", aws), None);
        assert_eq!(foreign_host("http://127.0.0.1:9324/123456789012/work", "http://127.0.0.1:9324"), None);
    }
}
