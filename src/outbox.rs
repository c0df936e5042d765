//! The outbox: messages a handler staged, written in its transaction and
//! sent after the commit.
//!
//! Each staged [`Message`] becomes an [`OutboxEntry`] in the claim store,
//! written in the same transaction as the handler's writes and the claim's
//! completion, so a message exists exactly when the run that sent it
//! committed. The entry carries a sending lease: the run whose
//! answer confirmed the commit holds it and sends at once, and no one else
//! does; an entry whose lease has ended is taken over by a sweep,
//! with a conditional write, so two senders never send one entry at the same
//! time. A sent entry is deleted.
//!
//! An entry is never lost: a destination that refuses (no permission, no such
//! queue) or fails leaves it in place, logged and counted (`OutboxRefused`,
//! `OutboxFailed`), for the next sweep; an operator can drop one given up on
//! (`sqs-once claims outbox --drop`). A sender stopped between the send and
//! the deletion (killed, frozen past its lease) leaves the entry to be sent
//! again, with the same outbox id
//! ([`OUTBOX_ID_ATTRIBUTE`](crate::transaction::OUTBOX_ID_ATTRIBUTE), the
//! FIFO deduplication id), on which the receiver deduplicates.
//!
//! Messages go to the AWS services their destinations name, or to the
//! [`Destinations`] a program gives its consumer.
//!
//! Here: the entry and its lease (`entry`), sending (`Outbox`), the sweep
//! (`sweep`), the AWS destinations (`aws`); the DynamoDB store's outbox
//! items and requests are in its own `outbox` module.

mod aws;
mod entry;
mod sweep;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;

pub(crate) use aws::AwsDestinations;
pub(crate) use entry::SENDING_LEASE;
pub use entry::{OutboxEntry, OutboxQuery};

use crate::{
    clock::Clock,
    store::{Fenced, OutboxStore},
    transaction::Message,
};

/// Why a message was not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
#[non_exhaustive]
pub struct SendError {
    /// The destination refused the message for good as it stands (no
    /// permission, no such queue, an invalid message); otherwise it failed
    /// and may take it later.
    pub refused: bool,
    /// Why, as the service put it.
    pub reason: String,
}

impl SendError {
    /// A send that failed and may succeed later (a timeout, throttling).
    pub fn failed(reason: impl Into<String>) -> Self {
        Self { refused: false, reason: reason.into() }
    }

    /// A send the destination refused for good as the message stands: the
    /// entry stays, counted as refused (`OutboxRefused`), until an operator
    /// acts.
    pub fn refused(reason: impl Into<String>) -> Self {
        Self { refused: true, reason: reason.into() }
    }
}

/// Where outbox messages go: by default the AWS services their
/// destinations name; a program may give its own
/// ([`Builder::destinations`](crate::consumer::Builder::destinations)).
///
/// A message may be sent more than once (its sender stopped between the
/// send and the entry's deletion): `outbox_id` is the same each time, and the
/// receiver deduplicates on it.
#[async_trait]
pub trait Destinations: Send + Sync {
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

/// Sends outbox entries and takes over those left unsent.
pub(crate) struct Outbox {
    store: Arc<dyn OutboxStore>,
    destinations: Arc<dyn Destinations>,
    clock: Arc<dyn Clock>,
    counters: OutboxCounters,
    sweep_every: Option<Duration>,
    schedule: Mutex<sweep::Schedule>,
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
        store: Arc<dyn OutboxStore>,
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
            schedule: Mutex::new(sweep::Schedule::starting_now()),
        }
    }

    /// How often the outbox is swept, unless sweeps are off (the timer of
    /// a process that is never frozen: see `Engine::tend`).
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

    /// Sends one entry and deletes it; whether it was sent.
    async fn send(&self, entry: &OutboxEntry) -> bool {
        if !entry.has_room_to_send(self.clock.now_ms()) {
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
        match self.store.entry_sent(&entry.id, &entry.token).await {
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
