//! Sweeping the outbox: the entries whose sender stopped (killed, frozen
//! past its lease) or whose destination failed are taken over and sent, on
//! the outbox's own schedule, whether or not anyone stages messages.
//!
//! Every process that can send sweeps: a process Lambda freezes as each
//! batch starts, one that is never frozen (`poll`, Lambda Managed
//! Instances) on a timer of its own, and `invoke` and `poll` before they
//! leave when they may have left a message of their own unsent; at most
//! once per sweep interval (`SQS_ONCE_OUTBOX_SWEEP_SECS`), the process's
//! start counting as one, however much the last one left. A Lambda function
//! whose queue is quiet is invoked for one by the template's schedule (the
//! outbox sweep event). A sweep beside a batch holds its answer for no more
//! than a moment: as the batch's own work is done, it takes no more entries,
//! and its sends still unanswered [`CUT_GRACE`](super::CUT_GRACE) later are
//! cut ([`SendWindow`]), so that none is in flight when Lambda freezes the
//! process; batches' sweeps leave a destination learnt slow or failing to
//! the schedule's for a while.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{
    FutureExt, StreamExt,
    future::{BoxFuture, Shared},
};
use tokio::time::Instant;

use super::{Outbox, SendWindow};
use crate::claim::{SENDING_LEASE, new_token};
use sqs_once_core::{
    clock::duration_ms,
    store::{OutboxEntry, StoreError, SweepPart},
};

/// Entries read per sweep at most; the rest wait for the next: as many as
/// the DynamoDB store's pages hold (16 shards of 100).
const SWEEP_LIMIT: usize = 1_600;

/// Runs whose entries are sent at once during a sweep: enough that the sends
/// to one destination share batch requests, few enough that the bodies held
/// at once stay small (each run holds the body of the entry it is sending)
/// and a slow DynamoDB answers the takes and deletions in time (64 at once
/// against DynamoDB Local on two cores left half a drain's deletions
/// unanswered, each entry then sent again: `bench/outbox-cost`).
const SWEEP_CONCURRENCY: usize = 16;

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Messages sent.
    pub sent: usize,
    /// Whether its listing ended a pass over the whole outbox
    /// ([`SweepPart::passed`](sqs_once_core::store::SweepPart)), and it sent every
    /// entry due it read but those refused or failed: not cut short by its
    /// window.
    pub passed: bool,
}

/// A sweep under way in a task of its own: [`finished`](Self::finished)
/// waits for it to end.
#[derive(Clone)]
pub struct Sweep {
    done: Shared<BoxFuture<'static, ()>>,
    window: SendWindow,
}

impl std::fmt::Debug for Sweep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweep").finish_non_exhaustive()
    }
}

impl Sweep {
    /// Completes when the sweep has ended.
    pub async fn finished(&self) {
        self.done.clone().await;
    }

    /// Takes no more entries, and cuts the sends still in flight a moment
    /// later: the batch beside which it runs answers. The rest wait for the
    /// next sweep.
    pub(crate) fn cut(&self) {
        self.window.close();
    }
}

/// When sweeps start, and what the last one found.
#[derive(Debug, Default)]
pub(super) struct Schedule {
    /// When the last sweep started.
    last: Option<Instant>,
    /// The sweep under way, if any; its task clears it as it ends.
    running: Option<Sweep>,
    /// The oldest unsent entry's age as the sweeps of the pass under way
    /// found it, until published.
    oldest_age: Option<Duration>,
    /// When the oldest entry the sweeps of the pass under way read was
    /// committed: a sweep reads a part of the outbox, and the age published
    /// is the outbox's, not the part's.
    pass_oldest_ms: Option<u64>,
}

impl Schedule {
    /// The schedule of an outbox made now: the first sweep is due a sweep
    /// interval later, so that a cold start's batch does not wait for one
    /// and an environment gone within the interval never pays for one.
    pub(super) fn starting_now() -> Self {
        Self { last: Some(Instant::now()), ..Self::default() }
    }
}

impl Outbox {
    /// Starts a sweep in a task of its own, if one is due (none has started
    /// for the sweep interval, the process's start counting as one) and none
    /// is under way, its sends ending by `sends_end_by`: the timer of a
    /// process that is never frozen. A process Lambda freezes sweeps beside
    /// its batches instead ([`sweep_beside_batch`](Self::sweep_beside_batch)),
    /// and a schedule invokes it for one when its queue is quiet
    /// ([`sweep_asked`](Self::sweep_asked)).
    pub(crate) fn sweep_if_due(self: &Arc<Self>, sends_end_by: Option<Instant>) -> Option<Sweep> {
        self.start_if_due(SendWindow::ending_by(sends_end_by))
    }

    /// Starts a sweep as [`sweep_if_due`](Self::sweep_if_due) does, beside a
    /// batch that answers by `answer_by`: [`Sweep::cut`] as the batch's work
    /// is done, and leaving alone the destinations learnt slow or failing.
    pub(crate) fn sweep_beside_batch(self: &Arc<Self>, answer_by: Instant) -> Option<Sweep> {
        self.start_if_due(SendWindow::beside_batch(answer_by))
    }

    fn start_if_due(self: &Arc<Self>, window: SendWindow) -> Option<Sweep> {
        let every = self.sweep_every?;
        let mut schedule = self.schedule.lock();
        let due = schedule.last.is_none_or(|last| last.elapsed() >= every);
        if !due || schedule.running.is_some() {
            return None;
        }
        Some(self.start(&mut schedule, window))
    }

    /// Starts a sweep now, as a sweep that is due starts
    /// when one is due, unless one is under way or sweeps are off: before
    /// `invoke` and `poll` leave.
    pub fn sweep_now(self: &Arc<Self>, sends_end_by: Option<Instant>) -> Option<Sweep> {
        self.sweep_every?;
        let mut schedule = self.schedule.lock();
        if schedule.running.is_some() {
            return None;
        }
        Some(self.start(&mut schedule, SendWindow::ending_by(sends_end_by)))
    }

    /// A sweep asked for (a scheduled invocation): one now, whatever the
    /// sweep interval says, every send of it ending by `by`; how many
    /// messages this process sent meanwhile. A sweep under way is let finish
    /// first: it may be one an earlier invocation left when the environment
    /// froze, its listing as old as the freeze.
    pub async fn sweep_asked(self: &Arc<Self>, by: Instant) -> u64 {
        let sent = || self.counters.sent.load(Ordering::Relaxed);
        let before = sent();
        let running = self.schedule.lock().running.clone();
        if let Some(running) = running {
            let _ = tokio::time::timeout_at(by, running.finished()).await;
        }
        let sweep = {
            let mut schedule = self.schedule.lock();
            match schedule.running {
                Some(_) => None,
                None => Some(self.start(&mut schedule, SendWindow::ending_by(Some(by)))),
            }
        };
        if let Some(sweep) = sweep {
            let _ = tokio::time::timeout_at(by, sweep.finished()).await;
        }
        sent() - before
    }

    /// Starts a sweep in a task of its own, noted in `schedule`. The next
    /// is due a sweep interval later, whatever this one leaves: a sweep cut
    /// short by a slow destination or a backlog is not started again by
    /// every batch.
    fn start(self: &Arc<Self>, schedule: &mut Schedule, window: SendWindow) -> Sweep {
        schedule.last = Some(Instant::now());
        let outbox = Arc::clone(self);
        let sweeping = window.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = outbox.sweep_within(&sweeping, false).await {
                tracing::warn!(%error, "outbox: the sweep could not read the outbox; the next one tries again");
            }
            outbox.schedule.lock().running = None;
        });
        let sweep = Sweep { done: task.map(drop).boxed().shared(), window };
        schedule.running = Some(sweep.clone());
        sweep
    }

    /// Before the process leaves: waits for a sweep under way, until `until`.
    pub(crate) async fn finish_sweep(&self, until: Instant) {
        let sweep = self.schedule.lock().running.clone();
        if let Some(sweep) = sweep {
            let _ = tokio::time::timeout_at(until, sweep.finished()).await;
        }
    }

    /// The oldest unsent entry's age as the sweeps of the last pass over
    /// the outbox found it (every part read since a pass last ended), since
    /// the last call.
    pub fn take_oldest_age(&self) -> Option<Duration> {
        self.schedule.lock().oldest_age.take()
    }

    /// Takes over the entries whose sending lease has ended, among those the
    /// store's [`sweep_listing`](sqs_once_core::store::OutboxStore::sweep_listing)
    /// reads, and sends them, the entries of one run in order, each send
    /// ending by `sends_end_by`. Notes the oldest unsent entry's age it read.
    pub async fn sweep(&self, sends_end_by: Option<Instant>) -> Result<Swept, StoreError> {
        self.sweep_within(&SendWindow::ending_by(sends_end_by), false).await
    }

    /// Sweeps until a whole pass over the outbox sends nothing, as `sqs-once
    /// claims outbox --send` does: a sweep reads a bounded part of it. An
    /// entry no sender holds is sent at once, however long before its retry
    /// time: the operator's command after a fix sends every message a
    /// refusal left. Returns how many messages it sent.
    pub async fn send_due(&self) -> Result<usize, StoreError> {
        let (mut sent, mut sent_in_pass) = (0, 0);
        loop {
            let swept = self.sweep_within(&SendWindow::ending_by(None), true).await?;
            sent += swept.sent;
            sent_in_pass += swept.sent;
            if swept.passed {
                if sent_in_pass == 0 {
                    return Ok(sent);
                }
                sent_in_pass = 0;
            }
        }
    }

    /// [`sweep`](Self::sweep), its sends started within `window`; `eager`,
    /// entries no sender holds are due whatever their retry time.
    async fn sweep_within(&self, window: &SendWindow, eager: bool) -> Result<Swept, StoreError> {
        let now_ms = self.clock.now_ms();
        let due = |entry: &OutboxEntry| entry.is_due(now_ms) || (eager && entry.is_released());
        let SweepPart { entries: listed, passed, .. } = self.store.sweep_part(SWEEP_LIMIT).await?;
        let oldest = listed.iter().map(|entry| entry.created_at_ms).min();
        {
            let mut schedule = self.schedule.lock();
            let oldest = oldest.into_iter().chain(schedule.pass_oldest_ms).min();
            schedule.oldest_age = Some(Duration::from_millis(oldest.map_or(0, |at| now_ms.saturating_sub(at))));
            schedule.pass_oldest_ms = if passed { None } else { oldest };
        }
        let waiting = listed.iter().filter(|entry| !due(entry));
        let (released, leased): (Vec<&OutboxEntry>, Vec<&OutboxEntry>) = waiting.partition(|entry| entry.is_released());
        if let Some(retry_at_ms) = released.iter().map(|entry| entry.lease_until_ms).max() {
            tracing::info!(
                entries = released.len(),
                retry_in_ms = retry_at_ms.saturating_sub(now_ms),
                "outbox: entries whose last send failed are sent again once their retry time has come (sqs-once \
                 claims outbox --send sends them now)"
            );
        }
        let leased = leased.iter().map(|entry| entry.lease_until_ms);
        let (held, held_until_ms) = leased.fold((0, 0), |(count, last), until| (count + 1, last.max(until)));
        if held > 0 {
            // Otherwise a sweep that sends nothing reads as one that failed.
            tracing::info!(
                entries = held,
                leased_for_ms = held_until_ms.saturating_sub(now_ms),
                "outbox: entries leased to another sender (the run that committed them, or a sweep) are left to it; \
                 a sweep sends them once their leases end"
            );
        }
        let mut runs: BTreeMap<(String, String), Vec<OutboxEntry>> = BTreeMap::new();
        for entry in listed {
            let (claim, token) = entry.run();
            runs.entry((claim.to_owned(), token.to_owned())).or_default().push(entry);
        }
        // A run's entries leave in order: those due before the first held by a sender (its lease not ended), and
        // before the first whose earlier one was not listed (unreadable, or deleted since the listing).
        for entries in runs.values_mut() {
            entries.sort_by_key(OutboxEntry::place);
            let due = entries
                .iter()
                .enumerate()
                .take_while(|(n, entry)| {
                    due(entry) && (*n == 0 || entry.place() == entries[n - 1].place().map(|place| place + 1))
                })
                .count();
            entries.truncate(due);
        }
        runs.retain(|_, entries| !entries.is_empty());
        let before = runs.len();
        runs.retain(|_, entries| !self.avoids(window, entries[0].message.destination.name()));
        if runs.len() < before {
            tracing::info!(
                runs = before - runs.len(),
                "outbox: runs whose destination answered slowly or failed lately are left to the schedule's sweep"
            );
        }
        if runs.is_empty() {
            self.store.sweep_part_handled().await;
            return Ok(Swept { sent: 0, passed });
        }
        tracing::info!(entries = runs.values().map(Vec::len).sum::<usize>(), "outbox: sending entries left unsent");
        let cut_short = AtomicBool::new(false);
        let sent = futures::stream::iter(runs.into_values().map(|entries| {
            let cut_short = &cut_short;
            async move {
                let (sent, cut) = self.take_and_deliver(entries, window).await;
                if cut {
                    cut_short.store(true, Ordering::Relaxed);
                }
                sent
            }
        }))
        .buffer_unordered(SWEEP_CONCURRENCY)
        .fold(0, |total, sent| async move { total + sent })
        .await;
        // A sweep cut short leaves the store's position where it was: the entries it listed and did not take are
        // the next sweep's, not skipped until a pass comes round.
        let cut_short = cut_short.load(Ordering::Relaxed);
        if !cut_short {
            self.store.sweep_part_handled().await;
        }
        Ok(Swept { sent, passed: passed && !cut_short })
    }

    /// Takes over one run's due entries, in order, each just before it is
    /// sent, while `window` takes them. The first it cannot take or send
    /// stops the rest: another sender holds it (and sends the run's later
    /// entries after it), it was sent and deleted since the listing (which
    /// the next sweep's listing shows), or its send failed. Either way no
    /// later entry of the run leaves before an earlier one, and none is held
    /// by a take that sends nothing. Returns how many it sent, and whether
    /// `window` stopped taking before the run's end.
    async fn take_and_deliver(&self, entries: Vec<OutboxEntry>, window: &SendWindow) -> (usize, bool) {
        if !window.takes(self.times) {
            return (0, true);
        }
        if !self.earlier_gone(&entries).await {
            return (0, false);
        }
        let mut sent = 0;
        for entry in entries {
            if !window.takes(self.times) {
                return (sent, true);
            }
            let lease_until_ms = self.clock.now_ms() + duration_ms(SENDING_LEASE);
            let token = new_token();
            let taken = match self.store.take_entry(&entry, &token, lease_until_ms).await {
                Ok(Some(taken)) => taken,
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(id = %entry.id, %error, "outbox: cannot take the entry over; the next sweep tries again");
                    break;
                }
            };
            if self.deliver(std::slice::from_ref(&taken), entry.failed_sends(), window).await.0 == 0 {
                break;
            }
            sent += 1;
        }
        (sent, false)
    }

    /// Whether the message before a run's first listed one is gone (sent),
    /// or there is none: one the listing did not show may be one this version
    /// cannot read (written by a newer one, before a rollback) or one beyond
    /// the part of the outbox the listing read (a run written before its
    /// entries shared a shard), and must leave first.
    async fn earlier_gone(&self, entries: &[OutboxEntry]) -> bool {
        let Some(earlier) = entries.first().and_then(OutboxEntry::earlier_id) else {
            return true;
        };
        match self.store.holds_entry(&earlier).await {
            Ok(held) => !held,
            Err(error) => {
                tracing::warn!(id = %earlier, %error, "outbox: cannot tell whether a run's earlier message was sent; the next sweep tries again");
                false
            }
        }
    }
}
