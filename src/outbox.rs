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
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use futures::StreamExt;
use tokio::{task::JoinHandle, time::Instant};

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
}

/// Sends outbox entries and takes over those left unsent.
pub(crate) struct Outbox {
    store: Arc<dyn ClaimStore>,
    destinations: Arc<dyn Destinations>,
    clock: Arc<dyn Clock>,
    counters: OutboxCounters,
    sweep_every: Option<Duration>,
    last_sweep: Mutex<Option<Instant>>,
    sweeping: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox").field("sweep_every", &self.sweep_every).finish_non_exhaustive()
    }
}

impl Outbox {
    /// An outbox over `store`'s entries, sending to `destinations`, sweeping
    /// for entries left unsent at most every `sweep_every` (`None`: only when
    /// asked, as `claims outbox --send` does).
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
            last_sweep: Mutex::new(None),
            sweeping: Mutex::new(None),
        }
    }

    /// What the outbox counted so far.
    pub(crate) fn counters(&self) -> &OutboxCounters {
        &self.counters
    }

    /// Sends the entries of one run, in order, each while its lease leaves
    /// room for the send, and deletes each once sent. The first that cannot
    /// be sent stops the rest, which keep their order for a later sweep.
    /// Returns how many were sent.
    ///
    /// A process that sends through the outbox also sweeps it for entries
    /// left unsent (by itself or by a process that is gone), in the
    /// background, at most once per sweep interval.
    pub(crate) async fn deliver(self: &Arc<Self>, entries: &[OutboxEntry]) -> usize {
        let sent = self.send_in_order(entries).await;
        self.sweep_in_background();
        sent
    }

    /// Starts a sweep in a task of its own, if one is due.
    pub(crate) fn sweep_in_background(self: &Arc<Self>) {
        if !self.sweep_due() {
            return;
        }
        let outbox = Arc::clone(self);
        let sweep = tokio::spawn(async move {
            if let Err(error) = outbox.sweep().await {
                tracing::warn!(%error, "outbox: the sweep could not read the outbox; the next one tries again");
            }
        });
        *lock(&self.sweeping) = Some(sweep);
    }

    /// Before the process leaves: waits for a sweep under way, until `until`.
    pub(crate) async fn finish_sweep(&self, until: Instant) {
        let sweep = lock(&self.sweeping).take();
        if let Some(sweep) = sweep {
            let _ = tokio::time::timeout_at(until, sweep).await;
        }
    }

    async fn send_in_order(&self, entries: &[OutboxEntry]) -> usize {
        let mut sent = 0;
        for entry in entries {
            if !self.send(entry).await {
                break;
            }
            sent += 1;
        }
        sent
    }

    /// Whether a sweep is due: never swept, or the last one is older than
    /// the sweep interval. Marks the sweep as started.
    fn sweep_due(&self) -> bool {
        let Some(every) = self.sweep_every else { return false };
        let mut last = lock(&self.last_sweep);
        let due = last.is_none_or(|last| last.elapsed() >= every);
        if due {
            *last = Some(Instant::now());
        }
        due
    }

    /// Takes over the entries whose sending lease has ended (at most a few
    /// hundred per call) and sends them, the entries of one run in order.
    /// Returns how many were sent.
    pub(crate) async fn sweep(&self) -> Result<usize, StoreError> {
        let now_ms = self.clock.now_ms();
        let due = self.store.outbox(&OutboxQuery { due_at_ms: Some(now_ms), limit: SWEEP_LIMIT }).await?;
        if due.is_empty() {
            return Ok(0);
        }
        tracing::info!(entries = due.len(), "outbox: sending entries left unsent");
        let mut runs: BTreeMap<(String, String), Vec<OutboxEntry>> = BTreeMap::new();
        for entry in due {
            runs.entry((entry.claim_id.clone(), run_token(&entry.id).to_owned())).or_default().push(entry);
        }
        let sent = futures::stream::iter(runs.into_values().map(|entries| self.take_and_deliver(entries)))
            .buffer_unordered(SWEEP_CONCURRENCY)
            .fold(0, |total, sent| async move { total + sent })
            .await;
        Ok(sent)
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
        self.send_in_order(&taken).await
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
                tracing::error!(
                    id = %entry.id, message_id = %entry.message_id, destination, %error,
                    "OutboxFailed: the destination refused the message; it stays in the outbox and is sent again by \
                     the next sweep (check the function's permissions and the destination)"
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
