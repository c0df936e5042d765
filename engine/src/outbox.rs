//! The outbox: messages a handler staged, written in its transaction and
//! sent after the commit.
//!
//! Each staged [`Message`](sqs_once_core::transaction::Message) becomes an
//! [`OutboxEntry`] in the claim store,
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
//! ([`OUTBOX_ID_ATTRIBUTE`](sqs_once_core::transaction::OUTBOX_ID_ATTRIBUTE), the
//! FIFO deduplication id), on which the receiver deduplicates.
//!
//! Messages go to the AWS services their destinations name, or to the
//! [`Destinations`] a program gives its consumer.
//!
//! Here: sending (`Outbox`) and the sweep (`sweep`). The entry is the
//! vocabulary's (`sqs_once_core::store`), the AWS destinations `sqs-once`'s,
//! and the DynamoDB store's outbox items and requests are in its own
//! `outbox` module.

mod avoided;
mod sweep;

#[cfg(test)]
pub(crate) use avoided::AVOIDED_FOR;

use parking_lot::Mutex;
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::claim::SENDING_LEASE;

/// Kept free in a sending lease besides a send's and a deletion's times:
/// the steps between them, and clocks that differ.
const LEASE_SPARE: Duration = Duration::from_secs(1);

/// The period of the template's outbox sweep schedule by default
/// (`OutboxSweepMinutes` 5): what waits for the schedule's sweep to have
/// tried again waits about this long.
const SCHEDULE_PERIOD: Duration = Duration::from_secs(300);

/// How long an entry waits before a sweep sends it again after
/// `failed_sends` failed sends in a row: a sending lease after the first,
/// doubled with each failure after it, at most the schedule's period. So a
/// destination that refuses for good (a missing queue, a permission) costs
/// a backlog one take of each entry every five minutes, shared by every
/// sender, not one at every sweep; and once it is mended, every entry goes
/// within that period and a sweep, or at once by `claims outbox --send`.
pub(crate) fn retry_after(failed_sends: u32) -> Duration {
    let doublings = failed_sends.saturating_sub(1).min(16);
    SENDING_LEASE.saturating_mul(1 << doublings).min(SCHEDULE_PERIOD)
}

use sqs_once_core::{
    clock::{Clock, duration_ms},
    destinations::{Destinations, SendError},
    store::{Fenced, OutboxEntry, OutboxStore, StoreError},
};

/// Counts of what the outbox did, for metrics.
#[derive(Debug, Default)]
pub(crate) struct OutboxCounters {
    /// Whether this process may have left a committed message unsent: a
    /// run's send stopped short, or a commit with messages was not confirmed
    /// (it may have applied unseen). A process that leaves sweeps only then.
    pub left_unsent: std::sync::atomic::AtomicBool,
    /// Messages sent (and their entries deleted, or left for a sweep to delete).
    pub sent: AtomicU64,
    /// Sends that failed or were refused; their entries stay for a later sweep.
    pub failed: AtomicU64,
    /// Sends the destination refused for good as the message stands (no
    /// permission, no such queue, an invalid message): among `failed`, and
    /// sent again by every sweep until someone acts.
    pub refused: AtomicU64,
}

/// How long a send and the deletion of its entry may take: the operation
/// timeouts of the clients that make them (a program's own destinations
/// and stores get the SDK's, which sqs-once's clients bound). The outbox
/// holds each to its time, and starts a send only while the entry's sending
/// lease has room for both, so that a healthy sender is done with an entry
/// before another sender may take it over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxTimes {
    /// A destination's send, retries included.
    pub send: Duration,
    /// The entry's deletion once sent, retries included.
    pub delete: Duration,
}

/// Outbox times a sending lease cannot hold (see [`OutboxTimes::checked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTooShort(pub OutboxTimes);

impl OutboxTimes {
    /// A send and a deletion that may each take `time`.
    #[cfg(any(test, feature = "testing"))]
    pub const fn both(time: Duration) -> Self {
        Self { send: time, delete: time }
    }

    /// The room a send needs in its lease: the send and the deletion.
    fn room(&self) -> Duration {
        self.send + self.delete
    }

    /// These times, or why a sending lease cannot hold them: a send and its
    /// deletion could then outlast the lease, and another sender send the
    /// message too.
    pub fn checked(self) -> Result<Self, LeaseTooShort> {
        if self.room() + LEASE_SPARE > SENDING_LEASE {
            return Err(LeaseTooShort(self));
        }
        Ok(self)
    }
}

/// Sends outbox entries and takes over those left unsent.
pub struct Outbox {
    store: Arc<dyn OutboxStore>,
    destinations: Arc<dyn Destinations>,
    clock: Arc<dyn Clock>,
    times: OutboxTimes,
    counters: OutboxCounters,
    sweep_every: Option<Duration>,
    schedule: Mutex<sweep::Schedule>,
    /// Deliveries under way, for a process that leaves to let finish.
    delivering: Delivering,
    /// The send window of the batch under way: a run's messages are sent
    /// within it, whichever batch the run belongs to (a commit answered
    /// late, once the next invocation has thawed the process).
    current: Mutex<SendWindow>,
    /// Destinations batches' sweeps leave alone for now.
    avoided: avoided::Avoided,
    /// Runs whose messages found no time left in their window, for the next
    /// ([`deliver_run`](Self::deliver_run)).
    held: Mutex<Vec<Vec<OutboxEntry>>>,
}

/// How many deliveries are under way, and a wake-up as each ends.
#[derive(Debug, Default)]
struct Delivering {
    count: std::sync::atomic::AtomicUsize,
    ended: tokio::sync::Notify,
}

/// One delivery under way, counted until dropped.
struct UnderWay<'a>(&'a Delivering);

impl<'a> UnderWay<'a> {
    fn new(delivering: &'a Delivering) -> Self {
        delivering.count.fetch_add(1, Ordering::SeqCst);
        Self(delivering)
    }
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

/// How long a batch's answer waits, once its own work is done, for the
/// sends its sweep has in flight: long enough for a destination that
/// answers in milliseconds, so that a send about to end is not cut (and
/// sent twice); a destination still unanswered by then is slow, and is
/// learnt so.
pub(crate) const CUT_GRACE: Duration = Duration::from_millis(250);

/// The least time before its window ends that a send starts in: room for
/// one request and the deletion after it, each usually a few milliseconds.
const LEAST_SEND_WINDOW: Duration = Duration::from_secs(1);

/// When a send may start, and by when it and its deletion end. A process
/// may be frozen once it answers (Lambda freezes it as soon as its answer
/// is out), and a send or a deletion frozen in flight is one whose entry
/// another sender may send again after the lease. So a send starts only
/// while at least [`LEAST_SEND_WINDOW`] is left before the answer, and the
/// send and its deletion are cut to end by then, each within its own time
/// too.
///
/// A sweep beside a batch adds at most a moment to the batch's answer: once
/// the batch's own work is done, its window is [closed](Self::close): it
/// takes no more entries, and its sends still unanswered [`CUT_GRACE`]
/// later are cut (their entries stay under the sweep's lease, due again
/// when it ends; a destination may get such a message twice, with the same
/// outbox id). The destination of a
/// send cut or failed is learnt ([`avoided`]), and batches' sweeps leave it
/// alone for a while. What does not start stays due, for the next sweep or
/// the schedule's.
#[derive(Debug, Clone)]
pub(crate) struct SendWindow {
    /// Sends and deletions end by this; `None` for a process that is never frozen.
    ends_by: Option<tokio::time::Instant>,
    /// Whether a batch's answer closes it: a sweep beside the batch.
    beside_batch: bool,
    closed: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for SendWindow {
    fn default() -> Self {
        Self::ending_by(None)
    }
}

impl SendWindow {
    /// A window whose sends end by `ends_by` (`None`: any time).
    pub(crate) fn ending_by(ends_by: Option<tokio::time::Instant>) -> Self {
        Self { ends_by, beside_batch: false, closed: Arc::new(tokio::sync::watch::Sender::new(false)) }
    }

    /// The window of a sweep beside a batch that answers by `ends_by`.
    fn beside_batch(ends_by: tokio::time::Instant) -> Self {
        Self { beside_batch: true, ..Self::ending_by(Some(ends_by)) }
    }

    /// No entry is taken from now on, and the sends in flight are cut
    /// [`CUT_GRACE`] later.
    pub(crate) fn close(&self) {
        self.closed.send_replace(true);
    }

    /// `send`'s output, or `None` when it has not ended [`CUT_GRACE`] after
    /// the window closed: it is cut there.
    async fn unless_cut<T>(&self, send: impl Future<Output = T>) -> Option<T> {
        let mut closed = self.closed.subscribe();
        let cut = async {
            // The sender lives in `self`, so the wait ends only by the close.
            let _ = closed.wait_for(|closed| *closed).await;
            tokio::time::sleep(CUT_GRACE).await;
        };
        tokio::select! {
            biased;
            () = cut => None,
            done = send => Some(done),
        }
    }

    /// Whether an entry may be taken now, to be sent. One taken before the
    /// window closed is still sent, within [`CUT_GRACE`] of the close: held
    /// by its take, it would otherwise wait out a lease for nothing.
    fn takes(&self, times: OutboxTimes) -> bool {
        !*self.closed.borrow() && self.times_now(times).is_some()
    }

    /// The times a send starting now has, within `times`: the deletion
    /// keeps up to half of what is left, the send the rest. `None` when no
    /// send may start.
    fn times_now(&self, times: OutboxTimes) -> Option<OutboxTimes> {
        let Some(ends_by) = self.ends_by else { return Some(times) };
        let left = ends_by.saturating_duration_since(tokio::time::Instant::now());
        if left < LEAST_SEND_WINDOW {
            return None;
        }
        let delete = times.delete.min(left / 2);
        Some(OutboxTimes { send: times.send.min(left - delete), delete })
    }
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox").field("sweep_every", &self.sweep_every).finish_non_exhaustive()
    }
}

impl Outbox {
    /// An outbox over `store`'s entries, sending to `destinations` within
    /// `times`, sweeping for entries left unsent every `sweep_every`
    /// (`None`: only when asked, as `claims outbox --send` does).
    pub fn new(
        store: Arc<dyn OutboxStore>,
        destinations: Arc<dyn Destinations>,
        clock: Arc<dyn Clock>,
        times: OutboxTimes,
        sweep_every: Option<Duration>,
    ) -> Self {
        Self {
            store,
            destinations,
            clock,
            times,
            counters: OutboxCounters::default(),
            sweep_every,
            schedule: Mutex::new(sweep::Schedule::starting_now()),
            delivering: Delivering::default(),
            current: Mutex::default(),
            avoided: avoided::Avoided::default(),
            held: Mutex::default(),
        }
    }

    /// A batch starts: runs' messages are sent within `window` from now on.
    pub(crate) fn enter_batch(&self, window: SendWindow) {
        *self.current.lock() = window;
    }

    /// The window runs' messages are sent within now.
    pub(crate) fn current_window(&self) -> SendWindow {
        self.current.lock().clone()
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

    /// Sends that failed or were refused so far; their entries stay for a
    /// later sweep.
    pub fn failed_sends(&self) -> u64 {
        self.counters.failed.load(Ordering::Relaxed)
    }

    /// A committed run's messages, sent as [`deliver`](Self::deliver)
    /// sends them; those left for want of time in `window` (a commit whose
    /// answer came once its batch had answered, or too close to it) are
    /// held for the next window this process sends in, a batch's or the
    /// schedule's sweep's ([`deliver_held`](Self::deliver_held)), rather
    /// than wait for their lease to end and a sweep.
    pub(crate) async fn deliver_run(&self, entries: &[OutboxEntry], window: &SendWindow) {
        let (sent, out_of_time) = self.deliver(entries, 0, window).await;
        if out_of_time {
            self.held.lock().push(entries[sent..].to_vec());
        }
    }

    /// Sends, within `window`, the runs' messages held for want of time in
    /// an earlier one.
    pub(crate) async fn deliver_held(&self, window: &SendWindow) {
        let held = std::mem::take(&mut *self.held.lock());
        if held.is_empty() {
            return;
        }
        tracing::debug!(runs = held.len(), "outbox: sending the messages of commits answered after their batch");
        futures::future::join_all(held.iter().map(|entries| self.deliver_run(entries, window))).await;
    }

    /// Sends the entries of one run, in order, each while its lease and
    /// `window` leave room for the send and the deletion after it, and
    /// deletes each once sent. The first that cannot be sent stops the rest,
    /// which keep their order for a later sweep; when its send failed (its
    /// sends had failed `failed_before` times in a row), its lease and
    /// theirs are given up ([`release`](Self::release)). Returns how many
    /// were sent, and whether it stopped for want of time in `window`.
    async fn deliver(&self, entries: &[OutboxEntry], failed_before: u32, window: &SendWindow) -> (usize, bool) {
        let _under_way = UnderWay::new(&self.delivering);
        for (sent, entry) in entries.iter().enumerate() {
            let Some(times) = window.times_now(self.times) else {
                tracing::debug!(id = %entry.id, "outbox: no time left to send before the answer; sent later");
                self.note_left_unsent();
                return (sent, true);
            };
            match self.send(entry, times, window).await {
                Sending::Sent => {}
                Sending::Failed => {
                    self.note_left_unsent();
                    let failed_sends = if sent == 0 { failed_before + 1 } else { 1 };
                    let retry_at_ms = self.clock.now_ms() + duration_ms(retry_after(failed_sends));
                    self.release(&entries[sent..], failed_sends, |_| retry_at_ms, times.delete).await;
                    return (sent, false);
                }
                // Nothing failed: each is due again at its lease's end, as it would have been.
                Sending::NoRoom => {
                    self.note_left_unsent();
                    let failed_sends = if sent == 0 { failed_before.max(1) } else { 1 };
                    self.release(&entries[sent..], failed_sends, |entry| entry.lease_until_ms, times.delete).await;
                    return (sent, false);
                }
                // The batch answers now: no write is started after it, and the lease ends on its own.
                Sending::Cut => {
                    self.note_left_unsent();
                    return (sent, false);
                }
            }
        }
        (entries.len(), false)
    }

    /// Gives up the leases of `entries` (a run's, the first of which could
    /// not be sent, its sends having failed `failed_sends` times in a row),
    /// each within `time`: no one waits for a lease no sender is using. A
    /// sweep sends each again from its `retry_at_ms`, and an operator's
    /// `claims outbox --send` at once. One that cannot be given up keeps its
    /// lease until it ends.
    async fn release(
        &self,
        entries: &[OutboxEntry],
        failed_sends: u32,
        retry_at_ms: impl Fn(&OutboxEntry) -> u64,
        time: Duration,
    ) {
        // The last first: while the first is held, a sweep takes none after it.
        for entry in entries.iter().rev() {
            let released = self.store.release_entry(entry, failed_sends, retry_at_ms(entry));
            let released = tokio::time::timeout(time, released).await;
            if let Err(error) =
                released.unwrap_or_else(|_| Err(StoreError::unavailable(format!("no answer within {time:?}"))))
            {
                tracing::debug!(id = %entry.id, %error, "outbox: the lease could not be given up; it ends on its own");
            }
        }
    }

    /// Waits until no delivery is under way, or until `until`: a process
    /// that leaves with a message sent and its entry not yet deleted would
    /// have a sweep send it again after its lease.
    pub(crate) async fn finish_deliveries(&self, until: tokio::time::Instant) {
        loop {
            let ended = self.delivering.ended.notified();
            if self.delivering.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            if tokio::time::timeout_at(until, ended).await.is_err() {
                return;
            }
        }
    }

    /// Notes that this process may have left a committed message unsent (see
    /// [`OutboxCounters::left_unsent`]).
    pub(crate) fn note_left_unsent(&self) {
        self.counters.left_unsent.store(true, Ordering::Relaxed);
    }

    /// Sends one entry and deletes it, each within its time of `times`, the
    /// send cut if `window` closes first.
    async fn send(&self, entry: &OutboxEntry, times: OutboxTimes, window: &SendWindow) -> Sending {
        if !entry.has_room_to_send(self.clock.now_ms(), times.room()) {
            tracing::info!(id = %entry.id, "outbox: too little of the sending lease is left; the next sweep sends it");
            return Sending::NoRoom;
        }
        let destination = entry.message.destination.name();
        let started = tokio::time::Instant::now();
        let outbox_id = entry.outbox_id();
        let sending = tokio::time::timeout(times.send, self.destinations.send(&outbox_id, &entry.message));
        let Some(sent) = window.unless_cut(sending).await else {
            self.avoided.avoid(destination);
            tracing::info!(
                id = %entry.id, destination, after_ms = started.elapsed().as_millis(),
                "outbox: the destination had not answered when the batch's work was done; the send is cut so that \
                 the answer does not wait (it may have arrived: the next send carries the same outbox id), the \
                 entry is due again when its lease ends, and batches' sweeps leave the destination to the \
                 schedule's for a while"
            );
            return Sending::Cut;
        };
        let sent = sent.unwrap_or_else(|_| {
            Err(SendError::failed(format!(
                "no answer within {:?} (it may have arrived: a later send carries the same outbox id)",
                times.send
            )))
        });
        if let Err(error) = sent {
            self.avoided.avoid(destination);
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            if error.refused {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    id = %entry.id, message_id = %entry.message_id, destination, %error,
                    "OutboxRefused: the destination refused the message for good as it stands; it stays in the outbox, \
                     and sweeps send it again until someone acts (check the function's permissions and the \
                     destination, then send it at once: sqs-once claims outbox --send; or drop it: sqs-once claims \
                     outbox --drop ID --force)"
                );
            } else {
                tracing::warn!(
                    id = %entry.id, message_id = %entry.message_id, destination, %error,
                    "OutboxFailed: the message could not be sent; it stays in the outbox for the next sweep"
                );
            }
            return Sending::Failed;
        }
        self.avoided.answered(destination, started.elapsed());
        self.counters.sent.fetch_add(1, Ordering::Relaxed);
        let deleted = tokio::time::timeout(times.delete, self.store.entry_sent(&entry.id, &entry.token)).await;
        let deleted =
            deleted.unwrap_or_else(|_| Err(StoreError::unavailable(format!("no answer within {:?}", times.delete))));
        match deleted {
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
        Sending::Sent
    }

    /// Whether a sweep with `window` leaves `destination` alone: beside a
    /// batch, once learnt slow or failing.
    fn avoids(&self, window: &SendWindow, destination: &str) -> bool {
        window.beside_batch && self.avoided.avoids(destination)
    }
}

/// How one entry's send ended.
enum Sending {
    /// Sent (its entry deleted, or left for a sweep to delete).
    Sent,
    /// Not sent: refused, or failed.
    Failed,
    /// Not sent: too little of its lease was left for the send and the deletion.
    NoRoom,
    /// Cut as the window closed: the batch beside which it went answers.
    Cut,
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use async_trait::async_trait;
    use tokio::time::Instant;

    use super::*;
    use crate::clocks::PausedClock;
    use sqs_once_core::{
        clock::duration_ms,
        store::{
            ClaimStatus, Commit, CommitStore, Finish, MemoryStore, OutboxQuery, StoredClaim, SweepPart, Unclaimed,
            UnreadableEntry,
        },
        transaction::Message,
    };

    /// The memory store's outbox, its deletions answered (and applied) `deleting` after they are sent, and the
    /// entry `unreadable` names, if any, one it cannot read: listed apart.
    #[derive(Default)]
    struct Altered {
        inner: MemoryStore,
        deleting: Duration,
        unreadable: Option<String>,
    }

    impl Altered {
        fn is_unreadable(&self, entry: &OutboxEntry) -> bool {
            self.unreadable.as_deref() == Some(entry.id.as_str())
        }
    }

    #[async_trait]
    impl OutboxStore for Altered {
        async fn entries(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>, StoreError> {
            let mut entries = self.inner.entries(&OutboxQuery { limit: usize::MAX, ..*query }).await?;
            entries.retain(|entry| !self.is_unreadable(entry));
            entries.truncate(query.limit);
            Ok(entries)
        }
        async fn unreadable(&self, _limit: usize) -> Result<Vec<UnreadableEntry>, StoreError> {
            let every = OutboxQuery { due_at_ms: None, limit: usize::MAX };
            let held = self.inner.entries(&every).await?.into_iter().filter(|entry| self.is_unreadable(entry));
            Ok(held.map(|entry| UnreadableEntry::new(entry.id, entry.token, "a newer version's destination")).collect())
        }
        async fn take_entry(
            &self,
            entry: &OutboxEntry,
            token: &str,
            lease_until_ms: u64,
        ) -> Result<Option<OutboxEntry>, StoreError> {
            self.inner.take_entry(entry, token, lease_until_ms).await
        }
        async fn entry_sent(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
            tokio::time::sleep(self.deleting).await;
            self.inner.entry_sent(id, token).await
        }
    }

    /// Destinations whose every send takes `sending`, recording the bodies.
    struct SlowSends {
        sending: Duration,
        sent: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl Destinations for SlowSends {
        async fn send(&self, _outbox_id: &str, message: &Message) -> Result<(), SendError> {
            tokio::time::sleep(self.sending).await;
            self.sent.lock().push(message.body.clone());
            Ok(())
        }
    }

    /// A committed run of `bodies`, its entries leased to it for the sending lease from `now_ms`.
    async fn committed(store: &MemoryStore, bodies: &[&str], now_ms: u64) -> Vec<OutboxEntry> {
        let messages: Vec<Message> =
            bodies.iter().map(|body| Message::sqs("https://sqs.us-east-1.amazonaws.com/1/q", *body)).collect();
        let lease_until_ms = now_ms + duration_ms(SENDING_LEASE);
        let entries = OutboxEntry::of_run("k", "t", "m-1", &messages, now_ms, lease_until_ms);
        let claim = StoredClaim {
            id: "k".into(),
            status: ClaimStatus::InProgress,
            expires_at_s: now_ms / 1000 + 3600,
            lease_until_ms: Some(now_ms + 30_000),
            token: Some("t".into()),
            holder: None,
            attempt: None,
            message_id: None,
            claimed_at_ms: Some(now_ms),
            updated_at_ms: None,
            payload_hash: None,
            result: None,
            error: None,
        };
        let finish = Finish {
            status: ClaimStatus::Completed,
            expires_at_s: now_ms / 1000 + 3600,
            finished_at_ms: now_ms,
            result: None,
            error: None,
        };
        let commit = Commit {
            finish,
            unclaimed: Some(Unclaimed { claim, now_ms, remembered_ms: 3_600_000 }),
            writes: Vec::new(),
            outbox: entries.clone(),
            key_in_item: None,
        };
        store.commit("k", "t", &commit).await.unwrap();
        entries
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_starts_only_while_its_lease_holds_the_deletion_after_it_too() {
        let clock: Arc<dyn Clock> = Arc::new(PausedClock::starting_now());
        let store = Arc::new(Altered { deleting: Duration::from_secs(3), ..Altered::default() });
        let destinations = Arc::new(SlowSends { sending: Duration::from_millis(4_800), sent: Mutex::default() });
        let entries = committed(&store.inner, &["first", "second"], clock.now_ms()).await;
        let outbox = |sweep_every| {
            let (store, destinations) = (Arc::clone(&store) as Arc<dyn OutboxStore>, Arc::clone(&destinations));
            Arc::new(Outbox::new(
                store,
                destinations,
                Arc::clone(&clock),
                OutboxTimes::both(Duration::from_secs(5)),
                sweep_every,
            ))
        };
        let (committer, sweeper) = (outbox(None), outbox(Some(Duration::from_secs(1))));
        // The committer sends its run: the second send would start 7.9 s into the 15 s lease, and its deletion
        // would land after it. A healthy sweeper looks once the lease has ended.
        let delivered = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            committer.deliver(&entries, 0, &SendWindow::default()).await.0
        };
        let swept = async {
            tokio::time::sleep(SENDING_LEASE + Duration::from_millis(200)).await;
            sweeper.sweep(None).await.unwrap()
        };
        let (delivered, swept) = tokio::join!(delivered, swept);
        assert_eq!((delivered, swept.sent), (1, 1), "the second message waits for the lease to end");
        assert_eq!(*destinations.sent.lock(), ["first", "second"], "each sent once, in order");
    }

    #[tokio::test(start_paused = true)]
    async fn a_process_leaving_lets_its_deliveries_finish_their_deletions() {
        let clock: Arc<dyn Clock> = Arc::new(PausedClock::starting_now());
        let store = Arc::new(Altered { deleting: Duration::from_secs(3), ..Altered::default() });
        let destinations = Arc::new(SlowSends { sending: Duration::from_secs(1), sent: Mutex::default() });
        let entries = committed(&store.inner, &["notice"], clock.now_ms()).await;
        let outbox = Arc::new(Outbox::new(
            Arc::clone(&store) as Arc<dyn OutboxStore>,
            destinations,
            Arc::clone(&clock),
            OutboxTimes::both(Duration::from_secs(5)),
            None,
        ));
        let delivering = tokio::spawn({
            let outbox = Arc::clone(&outbox);
            async move { outbox.deliver(&entries, 0, &SendWindow::default()).await.0 }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Leaving while the send is under way: the send (1 s) and the deletion (3 s) are waited for.
        outbox.finish_deliveries(Instant::now() + Duration::from_secs(10)).await;
        let query = OutboxQuery { due_at_ms: None, limit: 10 };
        assert!(store.inner.entries(&query).await.unwrap().is_empty(), "deleted: no sweep sends it again");
        assert_eq!(delivering.await.unwrap(), 1);
        // With nothing under way, leaving waits for nothing.
        let before = Instant::now();
        outbox.finish_deliveries(before + Duration::from_secs(10)).await;
        assert_eq!(before.elapsed(), Duration::ZERO);
    }

    /// A destination that refuses every send while `down`, noting when each was tried.
    #[derive(Default)]
    struct Refusing {
        down: std::sync::atomic::AtomicBool,
        tried: Mutex<Vec<Instant>>,
    }

    #[async_trait]
    impl Destinations for Refusing {
        async fn send(&self, _outbox_id: &str, _message: &Message) -> Result<(), SendError> {
            self.tried.lock().push(Instant::now());
            match self.down.load(Ordering::SeqCst) {
                true => Err(SendError::refused("no such queue")),
                false => Ok(()),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_entry_is_tried_again_less_and_less_often_and_sent_soon_after_its_destination_is_mended() {
        let clock: Arc<dyn Clock> = Arc::new(PausedClock::starting_now());
        let store = Arc::new(MemoryStore::default());
        let destinations = Arc::new(Refusing { down: true.into(), ..Refusing::default() });
        committed(&store, &["notice"], clock.now_ms()).await;
        let outbox = Outbox::new(
            Arc::clone(&store) as Arc<dyn OutboxStore>,
            Arc::clone(&destinations) as Arc<dyn Destinations>,
            clock,
            OutboxTimes::both(Duration::from_secs(5)),
            None,
        );
        // Its run stopped before sending; a sweep every second, for an hour, of a destination that refuses.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3600) {
            outbox.sweep(None).await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let tried = destinations.tried.lock().clone();
        let gaps: Vec<u64> = tried.windows(2).map(|pair| (pair[1] - pair[0]).as_secs()).collect();
        assert_eq!(gaps[..5], [16, 31, 61, 121, 241], "doubled from a sending lease: {gaps:?}");
        assert!(gaps[5..].iter().all(|gap| *gap == 301), "then every five minutes: {gaps:?}");
        assert_eq!(tried.len(), 16, "where a take at every lease's end tried it 225 times");
        // Mended: the next try, within five minutes, sends it, and nothing is left.
        destinations.down.store(false, Ordering::SeqCst);
        let mended = Instant::now();
        while outbox.sweep(None).await.unwrap().sent == 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert!(mended.elapsed() <= SCHEDULE_PERIOD, "sent {:?} after the mend", mended.elapsed());
        let query = OutboxQuery { due_at_ms: None, limit: 10 };
        assert!(store.entries(&query).await.unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_waits_behind_its_unreadable_message_until_it_is_given_up() {
        let clock: Arc<dyn Clock> = Arc::new(PausedClock::starting_now());
        let inner = MemoryStore::default();
        let entries = committed(&inner, &["first", "second", "third"], clock.now_ms()).await;
        let store = Arc::new(Altered { inner, unreadable: Some(entries[1].id.clone()), ..Altered::default() });
        let destinations = Arc::new(SlowSends { sending: Duration::ZERO, sent: Mutex::default() });
        let outbox = Outbox::new(
            Arc::clone(&store) as Arc<dyn OutboxStore>,
            Arc::clone(&destinations) as Arc<dyn Destinations>,
            clock,
            OutboxTimes::both(Duration::from_secs(5)),
            None,
        );
        // The committing run stopped before sending; its lease ends.
        tokio::time::sleep(SENDING_LEASE + Duration::from_secs(1)).await;
        assert_eq!(outbox.sweep(None).await.unwrap().sent, 1);
        assert_eq!(outbox.sweep(None).await.unwrap().sent, 0, "the third waits for the second");
        assert_eq!(*destinations.sent.lock(), ["first"]);
        // The operator gives the second up (`claims outbox --drop`): the third goes.
        assert_eq!(store.inner.entry_sent(&entries[1].id, &entries[1].token).await.unwrap(), Fenced::Applied);
        assert_eq!(outbox.sweep(None).await.unwrap().sent, 1);
        assert_eq!(*destinations.sent.lock(), ["first", "third"]);
    }

    /// The memory store, counting the sweeps that handed their part in.
    #[derive(Default)]
    struct Handing {
        inner: MemoryStore,
        handled: AtomicUsize,
    }

    #[async_trait]
    impl OutboxStore for Handing {
        async fn entries(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>, StoreError> {
            self.inner.entries(query).await
        }
        async fn sweep_part_handled(&self) {
            self.handled.fetch_add(1, Ordering::SeqCst);
        }
        async fn take_entry(
            &self,
            entry: &OutboxEntry,
            token: &str,
            lease_until_ms: u64,
        ) -> Result<Option<OutboxEntry>, StoreError> {
            self.inner.take_entry(entry, token, lease_until_ms).await
        }
        async fn entry_sent(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
            self.inner.entry_sent(id, token).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_cut_short_leaves_its_part_to_the_next_sweep() {
        let clock: Arc<dyn Clock> = Arc::new(PausedClock::starting_now());
        let store = Arc::new(Handing::default());
        committed(&store.inner, &["first", "second"], clock.now_ms()).await;
        let destinations = Arc::new(SlowSends { sending: Duration::ZERO, sent: Mutex::default() });
        let times = OutboxTimes::both(Duration::from_secs(5));
        let outbox = Outbox::new(Arc::clone(&store) as Arc<dyn OutboxStore>, destinations, clock, times, None);
        tokio::time::sleep(SENDING_LEASE + Duration::from_secs(1)).await;
        let handled = || store.handled.load(Ordering::SeqCst);
        // Too little time left to send: nothing is taken, and the part is not handed in.
        let too_soon = Instant::now() + LEAST_SEND_WINDOW / 2;
        assert_eq!(outbox.sweep(Some(too_soon)).await.unwrap().sent, 0);
        assert_eq!(handled(), 0, "the next sweep reads the same part");
        assert_eq!(outbox.sweep(None).await.unwrap().sent, 2);
        assert_eq!(handled(), 1);
        // Nothing due is a part handled too.
        assert_eq!(outbox.sweep(None).await.unwrap().sent, 0);
        assert_eq!(handled(), 2);
    }

    /// An outbox read in parts, as the DynamoDB store reads it: each sweep the next part.
    struct InParts(Mutex<std::collections::VecDeque<SweepPart>>);

    #[async_trait]
    impl OutboxStore for InParts {
        async fn entries(&self, _query: &OutboxQuery) -> Result<Vec<OutboxEntry>, StoreError> {
            Ok(Vec::new())
        }
        async fn sweep_part(&self, _limit: usize) -> Result<SweepPart, StoreError> {
            Ok(self.0.lock().pop_front().unwrap_or_default())
        }
        async fn take_entry(
            &self,
            _entry: &OutboxEntry,
            _token: &str,
            _until_ms: u64,
        ) -> Result<Option<OutboxEntry>, StoreError> {
            Ok(None)
        }
        async fn entry_sent(&self, _id: &str, _token: &str) -> Result<Fenced, StoreError> {
            Ok(Fenced::Applied)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_oldest_age_published_is_the_passs_not_the_parts() {
        let clock = Arc::new(PausedClock::starting_now());
        let now_ms = clock.now_ms();
        let held = |claim: &str, age_s: u64| {
            let message = Message::sqs("https://sqs.us-east-1.amazonaws.com/1/q", claim);
            OutboxEntry::of_run(claim, "t", "m", &[message], now_ms - age_s * 1000, u64::MAX / 2).remove(0)
        };
        let parts = [(held("k-old", 600), false), (held("k-new", 1), true), (held("k-new", 1), true)];
        let parts = parts.into_iter().map(|(entry, passed)| SweepPart::new(vec![entry], passed)).collect();
        let store = Arc::new(InParts(Mutex::new(parts)));
        let destinations = Arc::new(SlowSends { sending: Duration::ZERO, sent: Mutex::default() });
        let outbox = Outbox::new(store, destinations, clock, OutboxTimes::both(Duration::from_secs(5)), None);
        let age_after_a_sweep = || async {
            outbox.sweep(None).await.unwrap();
            outbox.take_oldest_age().unwrap().as_secs()
        };
        assert_eq!(age_after_a_sweep().await, 600);
        assert_eq!(age_after_a_sweep().await, 600, "the pass's oldest, though this part's is a second old");
        assert_eq!(age_after_a_sweep().await, 1, "a new pass");
    }

    #[test]
    fn timeouts_too_long_for_the_sending_lease_refuse_to_start() {
        assert!(OutboxTimes::both(Duration::from_secs(5)).checked().is_ok());
        let long = OutboxTimes { send: Duration::from_secs(10), delete: Duration::from_secs(5) };
        assert_eq!(long.checked(), Err(LeaseTooShort(long)));
    }
}
