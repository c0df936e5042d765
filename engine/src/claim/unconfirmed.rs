//! Finishing writes whose answer has not been confirmed, and who owns each.
//!
//! A finishing write (completion, commit, failure record, release) can be
//! cut off from its answer: the store is slow or down, or Lambda freezes the
//! process at its answer and thaws it much later, past the SDK's timeouts. A
//! completion that never lands leaves the claim in progress, and a copy of
//! the message delivered after the lease would run the handler again. So
//! every finishing write is kept here from the moment it is sent until the
//! store answers it for good (applied, refused by its fence, cancelled by a
//! condition of its own, rejected for what it holds).
//!
//! A kept write has one owner at a time: the send under way ([`Sending`]).
//! While it waits for its answer nobody sends the write again, however many
//! batches start meanwhile; only a write whose last send ended in an error
//! (or was abandoned) is sent again, by the next batch, SIGTERM, `poll`'s
//! stop or `invoke`'s exit. So the caller whose answer confirmed a commit is
//! the only one that acts on it (sends its messages), and a commit answered
//! "cancelled" is never sent again: DynamoDB does not remember a cancelled
//! transaction, and a second send could apply what the first caller
//! reported as not applied. The writes are fenced by the claim's token, so a
//! late one never overwrites a newer holder's claim; a commit that takes no
//! claim has no token to be fenced by, and is sent again only until
//! [`Commit::send_by_ms`](sqs_once_core::store::Commit::send_by_ms), then given up.

use parking_lot::Mutex;
use std::{
    collections::HashMap,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::sync::{Notify, futures::Notified};

use super::{Finish, Lease};
use sqs_once_core::{
    clock::duration_ms,
    store::{Commit, Committed, StoreError},
};

/// How often a write whose sends keep failing is sent again before it is
/// given up (logged): a store that fails it that often is not coming back
/// within the claim's life.
const MAX_RESENDS: u32 = 5;

/// Finishing writes kept this many at most; past it the oldest is given up.
const MAX_ENTRIES: usize = 10_000;

/// How a won claim ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ending {
    /// Completed or failed, recorded with this change.
    Finish(Finish),
    /// Completed in one transaction with the handler's staged writes
    /// (boxed: a commit may carry the claim it writes).
    Commit(Box<Commit>),
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

    /// The last moment (epoch milliseconds) the write may still be sent
    /// again: a commit that takes no claim, until
    /// [`Commit::send_by_ms`](sqs_once_core::store::Commit::send_by_ms); one made
    /// under a claim, until the completion it writes (its expiry set as it
    /// was prepared) would no longer be remembered when it lands, a margin
    /// before it expires. Sent later, it would apply and leave the key free
    /// at once, and the record's redelivery (reported `uncommitted`, its
    /// claim's lease ended) would run and apply again; given up instead,
    /// the redelivery takes the claim over and commits once.
    pub(crate) fn send_again_by_ms(&self) -> Option<u64> {
        match self {
            Self::Commit(commit) => commit.send_by_ms().or_else(|| {
                Some((commit.finish.expires_at_s * 1000).saturating_sub(duration_ms(sqs_once_core::store::SEND_MARGIN)))
            }),
            Self::Finish(_) | Self::Release => None,
        }
    }

    /// The change to the claim, unless the claim is deleted.
    pub(crate) fn finish(&self) -> Option<&Finish> {
        match self {
            Self::Finish(finish) => Some(finish),
            Self::Commit(commit) => Some(&commit.finish),
            Self::Release => None,
        }
    }
}

/// Whether a kept write is being sent, or waits to be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A send of it is under way: its owner waits for the answer.
    Sending,
    /// Its last send ended in an error: the next resend takes it.
    Failed,
}

/// A write kept until its answer: its lease, the write (shared with the send
/// under way, not copied: a completion may carry a large result), how often
/// it was sent again, and whether a send of it is under way.
#[derive(Debug)]
struct Kept {
    lease: Lease,
    ending: Arc<Ending>,
    resends: u32,
    state: State,
}

/// The finishing writes of a process not yet confirmed.
#[derive(Debug, Default)]
pub(crate) struct Unconfirmed {
    entries: Mutex<HashMap<u64, Kept>>,
    next: AtomicU64,
    /// Woken when a send fails, for the batches running to send it again.
    failures: Notify,
    /// Woken when a send ends, either way, for a process leaving.
    answers: Notify,
    /// Writes given up unconfirmed, for metrics.
    given_up: AtomicU64,
}

/// A write taken for sending again: the write and its send's ownership.
#[derive(Debug)]
pub(crate) struct Resend {
    pub(crate) lease: Lease,
    pub(crate) ending: Arc<Ending>,
    pub(crate) sending: Sending,
}

impl Unconfirmed {
    /// Keeps `ending` of `lease` until its answer; the caller owns its first send.
    pub(crate) fn keep(self: &Arc<Self>, lease: &Lease, ending: &Arc<Ending>) -> Sending {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.entries.lock();
        if entries.len() >= MAX_ENTRIES
            && let Some(oldest) = entries.keys().min().copied()
            && let Some(dropped) = entries.remove(&oldest)
        {
            self.give_up(&dropped, "too many unconfirmed writes are kept");
        }
        let kept = Kept { lease: lease.clone(), ending: Arc::clone(ending), resends: 0, state: State::Sending };
        entries.insert(ticket, kept);
        Sending { unconfirmed: Arc::clone(self), ticket, answered: false }
    }

    /// The writes whose last send ended in an error, oldest first, each now
    /// owned by the caller and counted as resent. Writes whose send is under
    /// way are not among them; a commit past the moment it may be sent again
    /// (`now_ms` beyond its [`Ending::send_again_by_ms`]) is given up.
    pub(crate) fn to_resend(self: &Arc<Self>, now_ms: u64) -> Vec<Resend> {
        let mut entries = self.entries.lock();
        let late: Vec<u64> = entries
            .iter()
            .filter(|(_, kept)| kept.state == State::Failed)
            .filter(|(_, kept)| kept.ending.send_again_by_ms().is_some_and(|send_by_ms| now_ms > send_by_ms))
            .map(|(&ticket, _)| ticket)
            .collect();
        for ticket in late {
            if let Some(kept) = entries.remove(&ticket) {
                self.give_up(
                    &kept,
                    "a commit is not sent again once the completion it writes could have expired (and without a \
                     claim, been deleted, or DynamoDB's ten-minute token window has passed): it could apply a second \
                     time; its record was reported failed, and its redelivery decides",
                );
            }
        }
        let mut resends: Vec<(u64, Resend)> = entries
            .iter_mut()
            .filter(|(_, kept)| kept.state == State::Failed)
            .map(|(&ticket, kept)| {
                kept.state = State::Sending;
                kept.resends += 1;
                let sending = Sending { unconfirmed: Arc::clone(self), ticket, answered: false };
                (ticket, Resend { lease: kept.lease.clone(), ending: Arc::clone(&kept.ending), sending })
            })
            .collect();
        resends.sort_by_key(|(ticket, _)| *ticket);
        resends.into_iter().map(|(_, resend)| resend).collect()
    }

    /// How many writes were given up unconfirmed so far.
    pub(crate) fn given_up(&self) -> u64 {
        self.given_up.load(Ordering::Relaxed)
    }

    /// Completes at the next send that fails (or is abandoned) from now on.
    pub(crate) fn next_failure(&self) -> Pin<Box<Notified<'_>>> {
        let mut failure = Box::pin(self.failures.notified());
        failure.as_mut().enable();
        failure
    }

    /// Completes at the next send that ends, answered or failed, from now on.
    pub(crate) fn next_answer(&self) -> Pin<Box<Notified<'_>>> {
        let mut answer = Box::pin(self.answers.notified());
        answer.as_mut().enable();
        answer
    }

    /// Whether every write kept so far has been answered for good (or given up).
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.lock().is_empty()
    }

    /// The ids of the claims whose writes are still unconfirmed.
    pub(crate) fn ids(&self) -> Vec<String> {
        self.entries.lock().values().map(|kept| kept.lease.id.clone()).collect()
    }

    /// The send of `ticket` ended without an answer for good: the write waits
    /// for the next resend, or is given up after [`MAX_RESENDS`].
    fn failed(&self, ticket: u64) {
        let mut entries = self.entries.lock();
        let Some(kept) = entries.get_mut(&ticket) else { return };
        if kept.resends >= MAX_RESENDS {
            if let Some(kept) = entries.remove(&ticket) {
                self.give_up(&kept, "its sends kept failing");
            }
        } else {
            kept.state = State::Failed;
        }
        drop(entries);
        self.failures.notify_waiters();
        self.answers.notify_waiters();
    }
}

/// The one send under way of a kept write. Its owner reports the answer
/// with [`answered`](Self::answered); dropped without one (the send was
/// abandoned), the write waits to be sent again.
#[derive(Debug)]
pub(crate) struct Sending {
    unconfirmed: Arc<Unconfirmed>,
    ticket: u64,
    answered: bool,
}

impl Sending {
    /// The store answered the send: for good (applied, refused, cancelled,
    /// rejected), the write is no longer kept; after an error that may not
    /// be final (unavailable, malformed, contended), it waits to be sent again.
    pub(crate) fn answered(mut self, result: &Result<Committed, StoreError>) {
        self.answered = true;
        match result {
            Ok(_) | Err(StoreError::Rejected(_) | StoreError::Unsupported(_)) => {
                self.unconfirmed.entries.lock().remove(&self.ticket);
                self.unconfirmed.answers.notify_waiters();
            }
            Err(_) => self.unconfirmed.failed(self.ticket),
        }
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        if !self.answered {
            self.unconfirmed.failed(self.ticket);
        }
    }
}

impl Unconfirmed {
    /// Gives up a write (logged, counted): the claim stays as it stands (in
    /// progress until its lease ends, or, without a claim, not written).
    fn give_up(&self, kept: &Kept, why: &str) {
        self.given_up.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            id = %kept.lease.id, write = kept.ending.name(),
            "WriteGivenUp: {why}; giving up a finishing write; a claim it would have finished stays in progress until \
             its lease ends"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(id: &str) -> Lease {
        Lease { id: id.into(), token: "t".into(), lease_until_ms: 0, payload_hash: None, unclaimed: None }
    }

    fn unavailable() -> Result<Committed, StoreError> {
        Err(StoreError::unavailable("timed out"))
    }

    #[test]
    fn a_write_whose_send_is_under_way_is_not_sent_again() {
        let unconfirmed = Arc::new(Unconfirmed::default());
        let first = unconfirmed.keep(&lease("a"), &Arc::new(Ending::Release));
        assert!(unconfirmed.to_resend(0).is_empty(), "its first send still waits for its answer");
        first.answered(&unavailable());
        let resends = unconfirmed.to_resend(0);
        assert_eq!(resends.len(), 1, "its send failed: it is sent again");
        assert!(unconfirmed.to_resend(0).is_empty(), "and that resend is under way");
        let Resend { sending, .. } = resends.into_iter().next().unwrap();
        let cancelled = sqs_once_core::store::Cancellation::by(&[], 0, String::new());
        sending.answered(&Ok(Committed::Cancelled(cancelled)));
        assert!(unconfirmed.ids().is_empty(), "a cancelled commit is final");
    }

    #[test]
    fn an_abandoned_send_leaves_the_write_to_be_sent_again() {
        let unconfirmed = Arc::new(Unconfirmed::default());
        drop(unconfirmed.keep(&lease("a"), &Arc::new(Ending::Release)));
        assert_eq!(unconfirmed.to_resend(0).len(), 1);
    }

    #[test]
    fn a_write_whose_sends_keep_failing_is_given_up() {
        let unconfirmed = Arc::new(Unconfirmed::default());
        unconfirmed.keep(&lease("a"), &Arc::new(Ending::Release)).answered(&unavailable());
        for _ in 0..MAX_RESENDS {
            let resends = unconfirmed.to_resend(0);
            assert_eq!(resends.len(), 1);
            resends.into_iter().for_each(|resend| resend.sending.answered(&unavailable()));
        }
        assert!(unconfirmed.to_resend(0).is_empty());
        assert!(unconfirmed.ids().is_empty());
    }
}
