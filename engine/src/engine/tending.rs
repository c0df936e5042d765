//! Beside and between batches: finishing writes whose send failed are sent
//! again, the outbox is swept, and a process that leaves waits for what is
//! under way.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, SystemTime},
};

use futures::future::join;
use tokio::{
    sync::Notify,
    time::{Instant, timeout_at},
};

use super::Engine;
use crate::outbox::SendWindow;
use sqs_once_core::store::OutboxEntry;

impl Engine {
    /// Sends again the finishing writes whose last send failed (see
    /// [`Claims::resend_unconfirmed`]), and the messages of each commit that
    /// landed, within `window`, with those of commits whose answer came too
    /// late for their own window (`Outbox::deliver_run`).
    async fn resend_unconfirmed(&self, window: &SendWindow) {
        let (outbox, window) = (self.inner.outbox.clone(), window.clone());
        let held = async {
            if let Some(outbox) = &outbox {
                outbox.deliver_held(&window).await;
            }
        };
        let deliver = {
            let (outbox, window) = (outbox.clone(), window.clone());
            move |entries: Vec<OutboxEntry>| {
                let (outbox, window) = (outbox.clone(), window.clone());
                async move {
                    if let Some(outbox) = outbox {
                        outbox.deliver_run(&entries, &window).await;
                    }
                }
            }
        };
        join(held, self.inner.claims.resend_unconfirmed(deliver)).await;
    }

    /// While the batch runs (until `done`), sends again the finishing
    /// writes whose last send failed: those that failed before it, at its
    /// start, and those that fail while it runs, a moment after. A write
    /// whose send was still waiting for its answer when the batch started
    /// (frozen with the process at the last answer, and timed out at the
    /// thaw) is sent again by the batch it failed in, not a batch later.
    /// Their messages are sent within `window`.
    pub(super) async fn resend_while(&self, done: &Done, window: &SendWindow) {
        loop {
            let failure = self.inner.claims.next_failure();
            self.resend_unconfirmed(window).await;
            if done.is_set() {
                return;
            }
            tokio::select! {
                biased;
                () = done.wait() => return,
                () = failure => {}
            }
            tokio::select! {
                biased;
                () = done.wait() => return,
                () = tokio::time::sleep(RESEND_PAUSE) => {}
            }
        }
    }

    /// Keeps a process that is never frozen moving between its batches
    /// (`poll`, Lambda Managed Instances), whether batches come or not:
    /// sends again, a moment after, each finishing write whose send failed,
    /// and sweeps the outbox on its schedule, so that neither waits for the
    /// next batch of a queue gone quiet. From its first call, batches
    /// sweep nothing beside them. Returns once `stopped` completes.
    pub async fn tend(&self, stopped: impl Future<Output = ()>) {
        self.inner.tended.store(true, Ordering::Relaxed);
        let resends = async {
            loop {
                let failure = self.inner.claims.next_failure();
                self.resend_unconfirmed(&SendWindow::default()).await;
                failure.await;
                tokio::time::sleep(RESEND_PAUSE).await;
            }
        };
        let sweeps = async {
            let timer = self.inner.outbox.as_ref().and_then(|outbox| Some((outbox, outbox.sweep_every()?)));
            let Some((outbox, every)) = timer else { return std::future::pending().await };
            loop {
                tokio::time::sleep(every).await;
                if let Some(sweep) = outbox.sweep_if_due(None) {
                    sweep.finished().await;
                }
            }
        };
        tokio::select! {
            () = stopped => {}
            ((), ()) = join(resends, sweeps) => {}
        }
    }

    /// Before the process leaves (SIGTERM, `poll`'s stop, `invoke`'s exit):
    /// waits for the finishing writes still under way and sends again those
    /// whose send failed, and the messages of the commits that land, and
    /// lets the deliveries and a sweep under way finish, until `until`. Returns the ids of the claims whose writes are still
    /// unconfirmed (logged): they stay in progress until their leases end.
    pub async fn leave(&self, until: Instant) -> Vec<String> {
        // Writes whose send is under way are waited for, and sent again if that send fails (a process thawed
        // to be shut down finds its sends cut off by the freeze), until every one is answered or `until`.
        let window = SendWindow::ending_by(Some(until));
        let landing = async {
            loop {
                let answer = self.inner.claims.next_answer();
                self.resend_unconfirmed(&window).await;
                if self.inner.claims.all_confirmed() {
                    return;
                }
                answer.await;
            }
        };
        let _ = timeout_at(until, landing).await;
        if let Some(outbox) = &self.inner.outbox {
            // A committed run's messages may still be on their way (the answer came at the cut-off): a message
            // sent whose entry is not deleted yet would be sent again by a sweep after its lease.
            outbox.finish_deliveries(until).await;
            outbox.finish_sweep(until).await;
        }
        self.inner.claims.still_unconfirmed()
    }

    /// A process that stops for good (`poll`'s stop, `invoke`'s exit):
    /// [`leave`](Self::leave), then, if it may have left a message of its
    /// own unsent, sweeps the outbox until `until`. Only such a process
    /// sweeps: another's messages are swept by the processes that go on,
    /// and by the schedule. Returns what `leave` returns.
    pub async fn leave_sweeping(&self, until: Instant) -> Vec<String> {
        let left = self.leave(until).await;
        let outbox = self.outbox().filter(|outbox| outbox.counters().left_unsent.load(Ordering::Relaxed));
        if let Some(sweep) = outbox.and_then(|outbox| outbox.sweep_now(Some(until))) {
            let _ = timeout_at(until, sweep.finished()).await;
        }
        left
    }

    /// Settles what batches left, as a scheduled invocation asks
    /// (`events/outbox-sweep.json`), in an invocation due at `deadline`,
    /// every send ending by its reserve: sends again the finishing writes
    /// left unconfirmed (an answer due, then a freeze), rather than leave
    /// them to the next batch, and sweeps the outbox now. Returns how many
    /// messages it sent.
    pub async fn sweep_outbox(&self, deadline: SystemTime) -> u64 {
        let by = self.budget(deadline).writes_by();
        let _ = timeout_at(by, self.resend_unconfirmed(&SendWindow::ending_by(Some(by)))).await;
        let Some(outbox) = self.outbox() else { return 0 };
        outbox.sweep_asked(by).await
    }
}

/// How long a batch waits, after a finishing write failed, before it sends
/// it again: the SDK has retried it already.
const RESEND_PAUSE: Duration = Duration::from_millis(250);

/// Set once every record of a batch has its outcome.
#[derive(Debug, Default)]
pub(super) struct Done {
    set: AtomicBool,
    notify: Notify,
}

impl Done {
    pub(super) fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub(super) fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    pub(super) async fn wait(&self) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !self.is_set() {
            notified.await;
        }
    }
}
