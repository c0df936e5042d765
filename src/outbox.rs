//! The outbox: messages a handler staged, written in its transaction and
//! sent after the commit.
//!
//! Each staged [`Message`] becomes an [`OutboxEntry`] in the claim store,
//! written in the same transaction as the handler's writes and the claim's
//! completion, so a message exists exactly when the run that sent it
//! committed. The entry carries a sending lease (a token and an end): the
//! process that committed holds it and sends at once; an entry whose lease
//! has ended is taken over by a later run (the next invocation's sweep,
//! `poll`, `sqs-once claims outbox --send`), with a conditional write, so two
//! runs never send one entry at the same time. A sent entry is deleted.
//!
//! An entry is never lost: a destination that refuses (no permission, no such
//! queue) or fails leaves it in place, logged and counted (`OutboxFailed`),
//! for the next sweep. A sender stopped between the send and the deletion
//! (killed, frozen past its lease) leaves the entry to be sent again, with
//! the same outbox id ([`OUTBOX_ID_ATTRIBUTE`](crate::transaction::OUTBOX_ID_ATTRIBUTE),
//! the FIFO deduplication id), on which the receiver deduplicates.

mod aws;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use futures::{
    FutureExt, StreamExt,
    future::{BoxFuture, Shared},
};
use tokio::time::Instant;

pub(crate) use aws::AwsDestinations;

use crate::{
    clock::{Clock, duration_ms},
    lock::lock,
    store::{ClaimStore, Fenced, OutboxEntry, OutboxQuery, StoreError, new_token},
    transaction::Message,
};

/// How long a sender holds an entry: the send and the deletion, each within
/// the SDK's operation timeout, with room to spare. A sender frozen or
/// stopped longer than this leaves the entry to the next sweep.
pub(crate) const SENDING_LEASE: Duration = Duration::from_secs(15);

/// A send starts only while this much of its lease is left: a send (the SDK's
/// operation timeout) ends before another sender can take the entry over.
const SEND_ROOM: Duration = crate::aws::OPERATION_TIMEOUT;

/// Entries read per sweep; the rest wait for the next.
const SWEEP_LIMIT: usize = 500;

/// Claims whose entries are sent at once during a sweep.
const SWEEP_CONCURRENCY: usize = 16;

/// Why a message was not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub(crate) struct SendError {
    /// The destination refused the message for good as it stands (no
    /// permission, no such queue, an invalid message); otherwise it failed
    /// and may take it later.
    pub refused: bool,
    /// Why, as the service put it.
    pub reason: String,
}

/// Where outbox messages go: the AWS services ([`AwsDestinations`]), or a
/// recorder in tests ([`crate::testing::Recorded`]).
#[async_trait]
pub(crate) trait Destinations: Send + Sync {
    /// Sends `message`, carrying `outbox_id` as its deduplication id.
    async fn send(&self, outbox_id: &str, message: &Message) -> Result<(), SendError>;
}

/// Counts of what the outbox did, for metrics.
#[derive(Debug, Default)]
pub(crate) struct OutboxCounters {
    /// Messages sent (and their entries deleted, or left for a sweep to delete).
    pub sent: AtomicU64,
    /// Sends that failed or were refused; their entries stay for a later sweep.
    pub failed: AtomicU64,
    /// Sends the destination refused for good as the message stands (no
    /// permission, no such queue, an invalid message): among `failed`, and
    /// sent again by every sweep until someone acts.
    pub refused: AtomicU64,
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Messages sent.
    pub sent: usize,
    /// Whether it went through every entry due: not cut short by its
    /// budget, nor by the listing's limit.
    pub complete: bool,
}

/// A sweep under way in a task of its own, started beside a batch: it takes
/// no new run once [`stop`](Self::stop)ped, and [`finished`](Self::finished)
/// waits for the sends under way.
#[derive(Clone)]
pub(crate) struct Sweep {
    stop: Arc<AtomicBool>,
    done: Shared<BoxFuture<'static, ()>>,
}

impl std::fmt::Debug for Sweep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweep").field("stopped", &self.stop.load(Ordering::Relaxed)).finish_non_exhaustive()
    }
}

impl Sweep {
    /// The sweep takes no new run of entries; the sends under way go on.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Completes when the sweep has ended.
    pub(crate) async fn finished(&self) {
        self.done.clone().await;
    }
}

/// When sweeps start, and what the last one found.
#[derive(Debug, Default)]
struct Schedule {
    /// When the last sweep started; `None` before the first, and after one
    /// that was cut short, so that the next batch goes on with it.
    last: Option<Instant>,
    /// The sweep under way, if any; its task clears it as it ends.
    running: Option<Sweep>,
    /// The oldest unsent entry's age as a sweep found it, until published.
    oldest_age: Option<Duration>,
}

/// Sends outbox entries and takes over those left unsent.
pub(crate) struct Outbox {
    store: Arc<dyn ClaimStore>,
    destinations: Arc<dyn Destinations>,
    clock: Arc<dyn Clock>,
    counters: OutboxCounters,
    sweep_every: Option<Duration>,
    schedule: Mutex<Schedule>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox").field("sweep_every", &self.sweep_every).finish_non_exhaustive()
    }
}

impl Outbox {
    /// An outbox over `store`'s entries, sending to `destinations`, sweeping
    /// for entries left unsent every `sweep_every` (`None`: only when asked,
    /// as `claims outbox --send` does).
    pub(crate) fn new(
        store: Arc<dyn ClaimStore>,
        destinations: Arc<dyn Destinations>,
        clock: Arc<dyn Clock>,
        sweep_every: Option<Duration>,
    ) -> Self {
        Self {
            store,
            destinations,
            clock,
            counters: OutboxCounters::default(),
            sweep_every,
            // The first sweep is due a sweep interval after the start: a
            // cold start's batch does not wait for one, and an environment
            // gone within the interval never pays for one.
            schedule: Mutex::new(Schedule { last: Some(Instant::now()), ..Schedule::default() }),
        }
    }

    /// How often the outbox is swept, unless sweeps are off.
    pub(crate) fn sweep_every(&self) -> Option<Duration> {
        self.sweep_every
    }

    /// What the outbox counted so far.
    pub(crate) fn counters(&self) -> &OutboxCounters {
        &self.counters
    }

    /// Sends the entries of one run, in order, each while its lease leaves
    /// room for the send, and deletes each once sent. The first that cannot
    /// be sent stops the rest, which keep their order for a later sweep.
    /// Returns how many were sent.
    pub(crate) async fn deliver(&self, entries: &[OutboxEntry]) -> usize {
        let mut sent = 0;
        for entry in entries {
            if !self.send(entry).await {
                break;
            }
            sent += 1;
        }
        sent
    }

    /// Starts a sweep in a task of its own, if one is due (none has started
    /// for the sweep interval, the process's start counting as one, or the
    /// last was cut short) and none is under way. It takes no new run of
    /// entries after `until`, nor once stopped. Every process that can send
    /// calls it: as each batch starts, and `poll` on a timer of its own too,
    /// so that an entry whose sender stopped is sent whether or not anyone
    /// stages messages.
    pub(crate) fn sweep_if_due(self: &Arc<Self>, until: Option<Instant>) -> Option<Sweep> {
        let every = self.sweep_every?;
        let due = lock(&self.schedule).last.is_none_or(|last| last.elapsed() >= every);
        if !due {
            return None;
        }
        self.sweep_now(until)
    }

    /// Starts a sweep now, as [`sweep_if_due`](Self::sweep_if_due) does
    /// when one is due, unless one is under way or sweeps are off: before
    /// `invoke` and `poll` leave.
    pub(crate) fn sweep_now(self: &Arc<Self>, until: Option<Instant>) -> Option<Sweep> {
        self.sweep_every?;
        let mut schedule = lock(&self.schedule);
        if schedule.running.is_some() {
            return None;
        }
        schedule.last = Some(Instant::now());
        let stop = Arc::new(AtomicBool::new(false));
        let outbox = Arc::clone(self);
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let swept = outbox.sweep(until, &stopped).await;
            let complete = match swept {
                Ok(swept) => swept.complete,
                Err(error) => {
                    tracing::warn!(%error, "outbox: the sweep could not read the outbox; the next one tries again");
                    true
                }
            };
            let mut schedule = lock(&outbox.schedule);
            schedule.running = None;
            if !complete {
                schedule.last = None;
            }
        });
        let sweep = Sweep { stop, done: task.map(drop).boxed().shared() };
        schedule.running = Some(sweep.clone());
        Some(sweep)
    }

    /// Before the process leaves: waits for a sweep under way, until `until`.
    pub(crate) async fn finish_sweep(&self, until: Instant) {
        let sweep = lock(&self.schedule).running.clone();
        if let Some(sweep) = sweep {
            let _ = tokio::time::timeout_at(until, sweep.finished()).await;
        }
    }

    /// The oldest unsent entry's age as a sweep found it since the last call.
    pub(crate) fn take_oldest_age(&self) -> Option<Duration> {
        lock(&self.schedule).oldest_age.take()
    }

    /// Takes over the entries whose sending lease has ended (at most a few
    /// hundred per call) and sends them, the entries of one run in order,
    /// starting no run after `until` or once `stop` is set. Notes the oldest
    /// unsent entry's age.
    pub(crate) async fn sweep(&self, until: Option<Instant>, stop: &AtomicBool) -> Result<Swept, StoreError> {
        let now_ms = self.clock.now_ms();
        let listed = self.store.outbox(&OutboxQuery { due_at_ms: None, limit: SWEEP_LIMIT }).await?;
        let oldest = listed.iter().map(|entry| entry.created_at_ms).min();
        lock(&self.schedule).oldest_age = Some(Duration::from_millis(oldest.map_or(0, |at| now_ms.saturating_sub(at))));
        let listed_all = listed.len() < SWEEP_LIMIT;
        let mut runs: BTreeMap<(String, String), Vec<OutboxEntry>> = BTreeMap::new();
        for entry in listed.into_iter().filter(|entry| entry.is_due(now_ms)) {
            runs.entry((entry.claim_id.clone(), run_token(&entry.id).to_owned())).or_default().push(entry);
        }
        if runs.is_empty() {
            return Ok(Swept { sent: 0, complete: listed_all });
        }
        tracing::info!(entries = runs.values().map(Vec::len).sum::<usize>(), "outbox: sending entries left unsent");
        let cut_short = AtomicBool::new(false);
        let sent = futures::stream::iter(runs.into_values().map(|entries| {
            let cut_short = &cut_short;
            async move {
                let ended = until.is_some_and(|until| Instant::now() >= until) || stop.load(Ordering::Relaxed);
                if ended {
                    cut_short.store(true, Ordering::Relaxed);
                    return 0;
                }
                self.take_and_deliver(entries).await
            }
        }))
        .buffer_unordered(SWEEP_CONCURRENCY)
        .fold(0, |total, sent| async move { total + sent })
        .await;
        Ok(Swept { sent, complete: listed_all && !cut_short.load(Ordering::Relaxed) })
    }

    /// Takes over one run's due entries, in order, and sends those taken.
    async fn take_and_deliver(&self, entries: Vec<OutboxEntry>) -> usize {
        let mut taken = Vec::new();
        for entry in entries {
            let lease_until_ms = self.clock.now_ms() + duration_ms(SENDING_LEASE);
            let token = new_token();
            match self.store.take_outbox(&entry, &token, lease_until_ms).await {
                Ok(Fenced::Applied) => taken.push(OutboxEntry { token, lease_until_ms, ..entry }),
                // Sent and deleted, or taken by another sender, since it was listed.
                Ok(Fenced::Refused) => {}
                Err(error) => {
                    tracing::warn!(id = %entry.id, %error, "outbox: cannot take the entry over; the next sweep tries again");
                    break;
                }
            }
        }
        self.deliver(&taken).await
    }

    /// Sends one entry and deletes it; whether it was sent.
    async fn send(&self, entry: &OutboxEntry) -> bool {
        let room_until = entry.lease_until_ms.saturating_sub(duration_ms(SEND_ROOM));
        if self.clock.now_ms() > room_until {
            tracing::info!(id = %entry.id, "outbox: too little of the sending lease is left; the next sweep sends it");
            return false;
        }
        let destination = entry.message.destination.name();
        if let Err(error) = self.destinations.send(&entry.outbox_id(), &entry.message).await {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            if error.refused {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    id = %entry.id, message_id = %entry.message_id, destination, %error,
                    "OutboxRefused: the destination refused the message for good as it stands; it stays in the outbox \
                     and every sweep sends it again until someone acts (check the function's permissions and the \
                     destination, or drop it: sqs-once claims outbox --drop ID --force)"
                );
            } else {
                tracing::warn!(
                    id = %entry.id, message_id = %entry.message_id, destination, %error,
                    "OutboxFailed: the message could not be sent; it stays in the outbox for the next sweep"
                );
            }
            return false;
        }
        self.counters.sent.fetch_add(1, Ordering::Relaxed);
        match self.store.outbox_sent(&entry.id, &entry.token).await {
            Ok(Fenced::Applied) => {}
            Ok(Fenced::Refused) => {
                tracing::warn!(id = %entry.id, "outbox: the entry was taken over while it was sent; it may be sent twice")
            }
            Err(error) => tracing::warn!(
                id = %entry.id, %error,
                "outbox: sent, but the entry could not be deleted; it is sent again after its lease, with the same \
                 outbox id"
            ),
        }
        true
    }
}

/// The run token inside an entry's id (`<claim>#outbox#<token>#<n>`).
fn run_token(id: &str) -> &str {
    let mut parts = id.rsplit('#');
    parts.next();
    parts.next().unwrap_or_default()
}
