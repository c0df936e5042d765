//! A key's run: admitted under the engine's bounds, its claim, its handler
//! in a task the cut-off can cancel, and the hand-over to the task that
//! records how it ended.

use parking_lot::Mutex;
use std::{collections::HashMap, panic::AssertUnwindSafe, sync::Arc, time::Duration};

use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};
use tokio::{
    sync::OwnedSemaphorePermit,
    task::JoinHandle,
    time::{Instant, timeout_at},
};
use tracing::Instrument;

use super::{
    BatchState, Engine,
    cutoff::{HandlerSlots, Progress, Started, at_answer},
    outcome::{Ending, ending, won},
};
use crate::{
    claim::{ClaimRequest, Lease},
    opened::Opened,
    report::{Failure, Outcome},
    spans,
};
use sqs_once_core::{
    Handler, HandlerError, HandlerResult, Record,
    transaction::{StageError, Staged},
};

/// How a key's run ended.
#[derive(Debug, Clone)]
pub(super) struct RunResult {
    pub(super) outcome: Outcome,
    pub(super) duration: Duration,
    pub(super) claim_latency: Option<Duration>,
}

impl RunResult {
    pub(super) fn failed(failure: Failure) -> Self {
        Self { outcome: Outcome::Failed(failure), duration: Duration::ZERO, claim_latency: None }
    }
}

/// A key's run, awaited by every record of the batch that shares the key.
pub(super) type KeyRun<'a> = Shared<BoxFuture<'a, RunResult>>;

/// The run of each key in a batch, with the body it ran with (compared when
/// payload validation is on).
pub(super) type Runs<'a> = Mutex<HashMap<String, (KeyRun<'a>, &'a str)>>;

/// What the task that claims and runs the handler hands on.
enum Step {
    /// The run ended without a handler's result to record (duplicate,
    /// conflict, store error...).
    Ended(Outcome),
    /// The handler returned under `lease`: how it ended is to be recorded.
    Returned(Lease, Ending),
}

impl Engine {
    /// Runs the record under its key, derived here (the one place a
    /// record's key is derived): the key's run, started here or by an
    /// earlier record of the batch with the same key (a copy).
    pub(super) async fn run_record<'a>(
        &self,
        message: &'a Opened<'a>,
        state: &'a BatchState,
        runs: &Runs<'a>,
    ) -> (Option<String>, RunResult) {
        let key = match self.inner.keys.derive(message) {
            Ok(key) => key,
            Err(missing) => return (None, RunResult::failed(Failure::MissingKey(missing.to_string()))),
        };
        let validate = self.inner.claims.policy().validate_payload;
        let (run, leader) = {
            let mut runs = runs.lock();
            match runs.get(&key) {
                Some((_, first_body)) if validate && *first_body != &*message.body => {
                    return (Some(key), RunResult::failed(Failure::PayloadMismatch));
                }
                Some((run, _)) => (run.clone(), false),
                None => {
                    let run = self.start(message, key.clone(), state);
                    runs.insert(key.clone(), (run.clone(), &*message.body));
                    (run, true)
                }
            }
        };
        let mut result = run.await;
        if !leader {
            result.claim_latency = None;
        }
        (Some(key), result)
    }

    /// The run of a key. Once the record is admitted (and the cut-off has
    /// not come), the claim and the handler run in a task, so that records
    /// run concurrently (in parallel on a multi-thread runtime) and the
    /// handler can be cancelled at the cut-off; the finishing write then
    /// runs in a task of its own, which nothing cancels.
    ///
    /// At most `concurrency` handlers run at once. When the store gathers
    /// calls into shared requests, twice as many records are admitted, so
    /// that claims run ahead of the handlers: a store far away does not
    /// leave the handler slots idle for a round trip per record. A claim won
    /// that finds no handler slot before the cut-off is released. When the
    /// handler returns, its finishing write trades the run's admission for
    /// one of `concurrency` finishing permits, if one is free, so that the
    /// next record's claim travels while this write does. Without a free
    /// one, the write keeps the admission, never waiting: at most three
    /// times `concurrency` records' copies, tasks and store calls are alive
    /// (`concurrency` when each call is a request of its own).
    ///
    /// The run ends by the time the batch's finishing writes must be done
    /// (`writes_by`), whatever its tasks are waiting for: what is still
    /// under way goes on in the background, and the run reports the outcome
    /// its progress shows ([`at_answer`]).
    fn start<'a>(&self, message: &'a Opened<'a>, key: String, state: &'a BatchState) -> KeyRun<'a> {
        let engine = self.clone();
        // In the span of the record that started the run: the claim, the
        // handler and the write are its children, whichever record polls it.
        let span = tracing::Span::current();
        async move {
            // Biased: the outcome is the same either way (the cut-off is
            // checked after), and a fixed order keeps a schedule replayable.
            let permit = tokio::select! {
                biased;
                permit = Arc::clone(&state.bounds.admitted).acquire_owned() => permit.ok(),
                () = tokio::time::sleep_until(state.budget.cutoff()) => None,
            };
            let Some(permit) = permit.filter(|_| Instant::now() < state.budget.cutoff()) else {
                return RunResult::failed(Failure::Deadline);
            };
            let record = message.record(key.clone(), state.budget.deadline(), engine.transaction(message));
            let (deadline_ms, holder) = (state.deadline_ms, Arc::clone(&state.request_id));
            let progress = Arc::new(Mutex::new(Progress::Running));
            let started = Instant::now();
            let writes_by = state.budget.writes_by();
            let handler = engine.spawn_handler(record, deadline_ms, holder, Arc::clone(&progress), permit, state);
            let slot = {
                let mut started = state.started.lock();
                let handler = Some(handler.abort_handle());
                started.push(Started { key: key.clone(), progress: Arc::clone(&progress), handler });
                started.len() - 1
            };
            let ran = timeout_at(writes_by, handler).await;
            state.started.lock()[slot].handler = None;
            let ended = |outcome| RunResult { outcome, duration: started.elapsed(), claim_latency: None };
            let (record, step, claim_latency, permit) = match ran {
                Ok(Ok(ran)) => ran,
                // Cut off: it reports the time it had.
                Ok(Err(error)) if error.is_cancelled() => return ended(Outcome::Failed(Failure::Deadline)),
                Ok(Err(error)) => return RunResult::failed(Failure::Panicked(error.to_string())),
                // A release after the cut-off, or a handler deaf to its cancellation, still under way.
                Err(_) => return ended(at_answer(&progress, &key)),
            };
            let outcome = match step {
                Step::Ended(outcome) => outcome,
                Step::Returned(lease, ending) => {
                    let permit = Arc::clone(&state.bounds.finishing).try_acquire_owned().unwrap_or(permit);
                    let writing = engine.spawn_write(record, lease, ending, Arc::clone(&progress), permit);
                    match timeout_at(writes_by, writing).await {
                        Ok(Ok(outcome)) => outcome,
                        Ok(Err(_)) | Err(_) => at_answer(&progress, &key),
                    }
                }
            };
            RunResult { outcome, duration: started.elapsed(), claim_latency: Some(claim_latency) }
        }
        .instrument(span)
        .boxed()
        .shared()
    }

    // The tasks are built outside the run's future: built inside it, they
    // would take room in it (rustc keeps a place for them across the awaits),
    // and every record's run would be allocated and copied at four times its
    // size.

    /// The task that claims the record's key and runs the handler; it hands
    /// back the record and the permit for the finishing write.
    fn spawn_handler(
        &self,
        record: Record,
        deadline_ms: u64,
        holder: Arc<str>,
        progress: Arc<Mutex<Progress>>,
        permit: OwnedSemaphorePermit,
        state: &BatchState,
    ) -> JoinHandle<(Record, Step, Duration, OwnedSemaphorePermit)> {
        let engine = self.clone();
        let slots = state.handler_slots.clone();
        // In the invocation's span, so that the handler's own logs and its
        // panic's line carry the request id.
        tokio::spawn(
            async move {
                let (step, claim_latency) =
                    engine.claim_and_handle(&record, deadline_ms, &holder, &progress, &slots).await;
                (record, step, claim_latency, permit)
            }
            .in_current_span(),
        )
    }

    /// The task that records the handler's result; nothing cancels it.
    fn spawn_write(
        &self,
        record: Record,
        lease: Lease,
        ending: Ending,
        progress: Arc<Mutex<Progress>>,
        permit: OwnedSemaphorePermit,
    ) -> JoinHandle<Outcome> {
        let engine = self.clone();
        tokio::spawn(
            async move {
                let _permit = permit;
                engine.write_ending(&record, &lease, ending, &progress).await
            }
            .in_current_span(),
        )
    }

    /// Claims the record's key and, if the claim is won, runs the handler
    /// once a slot is free; a won claim that finds none before the cut-off
    /// is released. Also returns how long the claim took.
    async fn claim_and_handle(
        &self,
        record: &Record,
        deadline_ms: u64,
        holder: &str,
        progress: &Mutex<Progress>,
        slots: &HandlerSlots,
    ) -> (Step, Duration) {
        let request = ClaimRequest {
            id: &record.key,
            body: &record.body,
            deadline_ms,
            holder,
            attempt: record.receive_count,
            message_id: &record.message_id,
        };
        let started = Instant::now();
        let claim = match self.unclaimed() {
            true => self.inner.claims.start_unclaimed(&request).instrument(spans::claim_span(true)).await,
            false => self.inner.claims.claim(&request).instrument(spans::claim_span(false)).await,
        };
        let claim_latency = started.elapsed();
        let lease = match claim.map_err(|error| Outcome::Failed(error.into())).and_then(won) {
            Ok(lease) => lease,
            Err(outcome) => return (Step::Ended(outcome), claim_latency),
        };
        let Some(_slot) = slots.take(progress).await else {
            tracing::debug!(key = %record.key, "claimed, but no handler slot came free before the cut-off: released");
            let outcome = self.write_failure(record, &lease, Failure::Deadline, progress).await;
            return (Step::Ended(outcome), claim_latency);
        };
        // Called inside the caught future, so that a handler that panics while
        // it builds its future (before its first await) is caught as well.
        let handling = async { self.inner.handler.handle(record).await }.instrument(spans::handler_span());
        let result = AssertUnwindSafe(handling).catch_unwind().await;
        // What the handler staged is committed only if it succeeded, and
        // only whole: a part refused at staging fails the run.
        let (result, staged) = staged_whole(result, record.transaction().take());
        let (ending, outcome) = ending(result, staged, &lease, self.inner.claims.now_ms());
        // No await between the handler's return and this: a run cancelled at
        // the cut-off either has its handler's outcome here or never returned.
        *progress.lock() = Progress::Returned(outcome);
        (Step::Returned(lease, ending), claim_latency)
    }
}

/// The handler's result and what it staged, unless staging refused a part
/// of the transaction: then a success is that refusal (permanent, as
/// staging it again would be refused again) and nothing commits. The
/// handler's own failure stays its outcome.
fn staged_whole(
    result: std::thread::Result<HandlerResult>,
    staged: Result<Staged, StageError>,
) -> (std::thread::Result<HandlerResult>, Staged) {
    match (result, staged) {
        (result, Ok(staged)) => (result, staged),
        (Ok(Ok(_)), Err(refused)) => {
            let error = HandlerError::permanent(format!(
                "{refused} (refused when staged; the handler went on and returned success, but a transaction \
                 commits whole or not at all)"
            ));
            (Ok(Err(error)), Staged::default())
        }
        (result, Err(_)) => (result, Staged::default()),
    }
}
