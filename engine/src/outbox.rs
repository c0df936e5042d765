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

mod sweep;

use parking_lot::Mutex;
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::claim::SENDING_LEASE;

/// Kept free in a sending lease besides a send's and a deletion's times:
/// the steps between them, and clocks that differ.
const LEASE_SPARE: Duration = Duration::from_secs(1);

use sqs_once_core::{
    clock::Clock,
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

/// The least time before its window ends that a send starts in: room for
/// one request and the deletion after it, each usually a few milliseconds.
const LEAST_SEND_WINDOW: Duration = Duration::from_secs(1);

/// When a send may start, and by when it and its deletion end. A process
/// may be frozen once it answers (Lambda freezes it as soon as its answer
/// is out), and a send or a deletion frozen in flight is one whose entry
/// another sender may send again after the lease. So a send starts only
/// while at least [`LEAST_SEND_WINDOW`] is left before the answer, and the
/// send and its deletion are cut to end by then, each within its own time
/// too. A sweep beside a batch also takes no entry once the window is
/// closed (the batch's own work is done), so that the answer waits only for
/// the sends of entries taken before. What does not start stays due, for
/// the next sweep or the schedule's.
#[derive(Debug, Clone, Default)]
pub(crate) struct SendWindow {
    /// Sends and deletions end by this; `None` for a process that is never frozen.
    ends_by: Option<tokio::time::Instant>,
    closed: Arc<AtomicBool>,
}

impl SendWindow {
    /// A window whose sends end by `ends_by` (`None`: any time).
    pub(crate) fn ending_by(ends_by: Option<tokio::time::Instant>) -> Self {
        Self { ends_by, closed: Arc::default() }
    }

    /// No entry is taken from now on; the sends of those taken end.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    /// Whether an entry may be taken now, to be sent.
    fn takes(&self, times: OutboxTimes) -> bool {
        !self.closed.load(Ordering::Relaxed) && self.times_now(times).is_some()
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

    /// Sends the entries of one run, in order, each while its lease and
    /// `window` leave room for the send and the deletion after it, and
    /// deletes each once sent. The first that cannot be sent stops the rest,
    /// which keep their order for a later sweep; when its send failed, its
    /// lease and theirs are given up ([`release`](Self::release)). Returns
    /// how many were sent.
    pub(crate) async fn deliver(&self, entries: &[OutboxEntry], window: &SendWindow) -> usize {
        let _under_way = UnderWay::new(&self.delivering);
        for (sent, entry) in entries.iter().enumerate() {
            let Some(times) = window.times_now(self.times) else {
                tracing::debug!(id = %entry.id, "outbox: no time left to send before the answer; a sweep sends it");
                self.note_left_unsent();
                return sent;
            };
            if !self.send(entry, times).await {
                self.note_left_unsent();
                self.release(&entries[sent..], times.delete).await;
                return sent;
            }
        }
        entries.len()
    }

    /// Gives up the leases of `entries` (a run's, the first of which could
    /// not be sent), each within `time`: no one waits for a lease no sender
    /// is using. A sweep sends them again when their leases would have
    /// ended, as before, and an operator's `claims outbox --send` at once.
    /// One that cannot be given up keeps its lease until it ends.
    async fn release(&self, entries: &[OutboxEntry], time: Duration) {
        // The last first: while the first is held, a sweep takes none after it.
        for entry in entries.iter().rev() {
            let released = tokio::time::timeout(time, self.store.release_entry(entry, entry.lease_until_ms)).await;
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

    /// Sends one entry and deletes it, each within its time of `times`;
    /// whether it was sent.
    async fn send(&self, entry: &OutboxEntry, times: OutboxTimes) -> bool {
        if !entry.has_room_to_send(self.clock.now_ms(), times.room()) {
            tracing::info!(id = %entry.id, "outbox: too little of the sending lease is left; the next sweep sends it");
            return false;
        }
        let destination = entry.message.destination.name();
        let sent = tokio::time::timeout(times.send, self.destinations.send(&entry.outbox_id(), &entry.message))
            .await
            .unwrap_or_else(|_| {
                Err(SendError::failed(format!(
                    "no answer within {:?} (it may have arrived: a later send carries the same outbox id)",
                    times.send
                )))
            });
        if let Err(error) = sent {
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
            return false;
        }
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
        true
    }
}

#[cfg(test)]
mod tests {
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
            committer.deliver(&entries, &SendWindow::default()).await
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
            async move { outbox.deliver(&entries, &SendWindow::default()).await }
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
