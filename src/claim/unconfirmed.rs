//! Finishing writes whose answer has not been confirmed.
//!
//! A finishing write (completion, failure record, release) can be cut off
//! from its answer: the store is slow or down, or Lambda freezes the process
//! at its answer and thaws it much later, past the SDK's timeouts. A
//! completion that never lands leaves the claim in progress, and a copy of
//! the message delivered after the lease would run the handler again. So
//! every finishing write is kept here from the moment it is sent until the
//! store answers it (applied, or refused by its fence), and the process sends
//! what is left again: first thing in its next batch, and before it exits.
//! The writes are fenced by the claim's token, so a late or repeated one never
//! overwrites a newer holder's claim.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use super::{Finish, Lease};
use crate::{lock::lock, store::Commit};

/// How often a write is sent again before it is given up (logged): a store
/// that refuses it that often is not coming back within the claim's life.
const MAX_RESENDS: u32 = 5;

/// Finishing writes kept this many at most; past it the oldest is given up.
const MAX_ENTRIES: usize = 10_000;

/// How a won claim ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ending {
    /// Completed or failed, recorded with this change.
    Finish(Finish),
    /// Completed in one transaction with the handler's staged writes.
    Commit(Commit),
    /// Deleted, so that a redelivery runs again.
    Release,
}

impl Ending {
    /// What the write is, for logs.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Finish(finish) if finish.status == super::ClaimStatus::Completed => "completion",
            Self::Finish(_) => "failure record",
            Self::Commit(_) => "commit",
            Self::Release => "release",
        }
    }

    /// The change to the claim, unless the claim is deleted.
    pub(crate) fn finish(&self) -> Option<&Finish> {
        match self {
            Self::Finish(finish) | Self::Commit(Commit { finish, .. }) => Some(finish),
            Self::Release => None,
        }
    }
}

/// A write kept until its answer: its lease, the write (shared with the send
/// under way, not copied: a completion may carry a large result), and how
/// often it was sent again.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub(crate) ticket: u64,
    pub(crate) lease: Lease,
    pub(crate) ending: Arc<Ending>,
    resends: u32,
}

/// The finishing writes of a process not yet confirmed.
#[derive(Debug, Default)]
pub(crate) struct Unconfirmed {
    entries: Mutex<HashMap<u64, Pending>>,
    next: AtomicU64,
}

impl Unconfirmed {
    /// Keeps `ending` of `lease` until [`confirmed`](Self::confirmed);
    /// returns its ticket.
    pub(crate) fn keep(&self, lease: &Lease, ending: &Arc<Ending>) -> u64 {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        let mut entries = lock(&self.entries);
        if entries.len() >= MAX_ENTRIES
            && let Some(oldest) = entries.keys().min().copied()
            && let Some(dropped) = entries.remove(&oldest)
        {
            give_up(&dropped, "too many unconfirmed writes are kept");
        }
        entries.insert(ticket, Pending { ticket, lease: lease.clone(), ending: Arc::clone(ending), resends: 0 });
        ticket
    }

    /// The store answered the write: it is no longer kept. Returns whether it
    /// still was (a resend and the original may both be answered).
    pub(crate) fn confirmed(&self, ticket: u64) -> bool {
        lock(&self.entries).remove(&ticket).is_some()
    }

    /// The writes to send again, oldest first, each counted as resent; those
    /// sent again too often are given up.
    pub(crate) fn to_resend(&self) -> Vec<Pending> {
        let mut entries = lock(&self.entries);
        entries.retain(|_, pending| {
            pending.resends += 1;
            let keep = pending.resends <= MAX_RESENDS;
            if !keep {
                give_up(pending, "sent again too often without an answer");
            }
            keep
        });
        let mut pending: Vec<Pending> = entries.values().cloned().collect();
        pending.sort_by_key(|pending| pending.ticket);
        pending
    }

    /// The ids of the claims whose writes are still unconfirmed.
    pub(crate) fn ids(&self) -> Vec<String> {
        lock(&self.entries).values().map(|pending| pending.lease.id.clone()).collect()
    }
}

fn give_up(pending: &Pending, why: &str) {
    tracing::error!(
        id = %pending.lease.id, write = pending.ending.name(),
        "{why}: giving up a finishing write; the claim stays in progress until its lease ends"
    );
}
