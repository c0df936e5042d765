//! The cut-off's view of a batch: how far each key's run has got, the
//! handler slots a run waits for, and what the cut-off cancels or reports.

use parking_lot::Mutex;
use std::sync::Arc;

use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    task::AbortHandle,
    time::Instant,
};

use super::BatchState;
use crate::report::{Failure, Outcome};

/// How far a key's run has got, as the answer at the deadline sees it.
#[derive(Debug, Default)]
pub(super) enum Progress {
    /// Claiming, or running the handler.
    #[default]
    Running,
    /// The claim is won and waits for a handler slot. The cut-off does not
    /// cancel it: the run releases its claim itself, so that a redelivery
    /// need not wait for the lease.
    Waiting,
    /// The handler returned: this is the key's outcome, whether or not the
    /// write that records it is confirmed before the answer is due.
    Returned(Outcome),
}

/// A key's run, as the cut-off finds it: the task claiming and running its
/// handler, and how far it got.
pub(super) struct Started {
    pub(super) key: String,
    pub(super) progress: Arc<Mutex<Progress>>,
    /// The task, until it has finished: a handle kept longer would keep the
    /// task's memory until the batch ends (a 10,000-record batch: 13 MB).
    pub(super) handler: Option<AbortHandle>,
}

/// The handler slots of a batch: a run that has won its claim waits here.
#[derive(Clone)]
pub(super) struct HandlerSlots {
    pub(super) free: Arc<Semaphore>,
    pub(super) cutoff: Instant,
}

impl HandlerSlots {
    /// A slot for a run whose claim is won, or `None` once the cut-off has
    /// come. The run is `Waiting` meanwhile, and turns `Running` under the
    /// same lock that [`cancel_running`] reads it with, after the cut-off:
    /// either the cut-off cancels the handler, or the handler never starts.
    pub(super) async fn take(&self, progress: &Mutex<Progress>) -> Option<OwnedSemaphorePermit> {
        let slot = match Arc::clone(&self.free).try_acquire_owned() {
            Ok(slot) => Some(slot),
            Err(_) => {
                *progress.lock() = Progress::Waiting;
                tokio::select! {
                    biased;
                    slot = Arc::clone(&self.free).acquire_owned() => slot.ok(),
                    () = tokio::time::sleep_until(self.cutoff) => None,
                }
            }
        };
        let mut progress = progress.lock();
        let slot = slot.filter(|_| Instant::now() < self.cutoff);
        *progress = if slot.is_some() { Progress::Running } else { Progress::Waiting };
        slot
    }
}

/// At the cut-off: cancels the runs whose handler has not returned (their
/// claims keep their leases until the leases end), each logged with its key:
/// a side effect the handler had begun may be half done, and a delivery
/// after the lease runs the handler again (what it staged was never
/// committed). A handler in the middle of a poll finishes it first, and if
/// it returns then, its outcome counts. Returns how many were cancelled.
pub(super) fn cancel_running(state: &BatchState) -> usize {
    let started = state.started.lock();
    // A run that ended at its claim (a duplicate, a conflict) never left `Running`; its task has finished.
    let running = started.iter().filter_map(|run| {
        let handler = run.handler.as_ref().filter(|handler| !handler.is_finished())?;
        matches!(*run.progress.lock(), Progress::Running).then_some((run, handler))
    });
    running
        .map(|(run, handler)| {
            handler.abort();
            tracing::warn!(
                key = %run.key,
                "run cancelled at the cut-off: its claim keeps its lease, and a delivery after the lease runs the \
                 handler again"
            );
        })
        .count()
}

/// The outcome a run reports when the answer is due before it ended:
/// its handler's, if the handler returned (the write that records it not
/// confirmed), otherwise `deadline`.
pub(super) fn at_answer(progress: &Mutex<Progress>, key: &str) -> Outcome {
    let outcome = match &*progress.lock() {
        Progress::Returned(outcome) => outcome.clone(),
        Progress::Running | Progress::Waiting => return Outcome::Failed(Failure::Deadline),
    };
    if outcome.is_unconfirmed() {
        tracing::warn!(
            key,
            "CompletionUnconfirmed: the handler succeeded but its completion was not confirmed before the answer \
             was due; reported successful. The write goes on and is sent again by this process; until it lands the \
             claim stays in progress"
        );
    }
    outcome
}
