//! The batch engine: one SQS batch in, one partial-batch response out.
//!
//! Records fan out concurrently, with a bound. Records that share a key run
//! once and share the outcome. FIFO records run in order within their message
//! group, and a failure stops the rest of its group. When the invocation's
//! deadline comes within the safety margin, nothing new starts, and the engine
//! answers with every unfinished record failed, so a slow record never turns
//! into a Lambda timeout that would redeliver the whole batch.
//!
//! The engine knows a [`Claims`] state machine and a handler; it does not know
//! which store is behind them, nor whether it runs inside Lambda.

use std::{
    collections::HashMap,
    panic::AssertUnwindSafe,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use futures::{
    FutureExt,
    future::{BoxFuture, Shared, join, join_all},
};
use tokio::{
    sync::{Notify, OwnedSemaphorePermit, Semaphore},
    task::{AbortHandle, JoinHandle},
    time::{Instant, timeout_at},
};

use tracing::Instrument;

use crate::{
    ErrorKind, HandlerResult, Record,
    budget::{DeadlineBudget, Margins},
    claim::{Claim, ClaimRequest, Claims, Lease},
    clock::{duration_ms, epoch_ms},
    envelope::{EnvelopeKind, Opened},
    event::EventRecord,
    handler::BoxHandler,
    key::Keys,
    lock::lock,
    outbox::Outbox,
    reason,
    report::{BatchReport, Failure, Outcome, RecordReport},
    store::{Committed, Fenced, OutboxEntry, StoreError},
    transaction::Staged,
};

/// Tuning of the engine; docs/configuration.md has the matching settings.
#[derive(Debug, Clone)]
pub(crate) struct EngineOptions {
    /// Records running at once (`SQS_ONCE_CONCURRENCY`).
    pub concurrency: usize,
    /// How each invocation's time is planned back from its deadline; see
    /// [`DeadlineBudget`].
    pub margins: Margins,
    /// Include each record's body in its log line (`SQS_ONCE_LOG_BODIES`).
    pub log_bodies: bool,
    /// The envelope message bodies arrive in (`SQS_ONCE_ENVELOPE`).
    pub envelope: EnvelopeKind,
    /// When a run claims its key before the handler runs (`SQS_ONCE_CLAIM`).
    pub claim: ClaimFirst,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            concurrency: 64,
            margins: Margins::default(),
            log_bodies: false,
            envelope: EnvelopeKind::None,
            claim: ClaimFirst::Auto,
        }
    }
}

/// When a run claims its key before its handler runs (`SQS_ONCE_CLAIM`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum ClaimFirst {
    /// Unless the handler stages every effect
    /// ([`Handler::stages_every_effect`](crate::Handler::stages_every_effect)):
    /// its run then takes no claim, and its commit writes the completion
    /// where the key is free.
    #[default]
    Auto,
    /// Always: only the claim's winner runs the handler.
    Always,
}

impl std::str::FromStr for ClaimFirst {
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        match text {
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            _ => Err(()),
        }
    }
}

/// One invocation of the engine.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// When the answer is due (the Lambda deadline, or `invoke --timeout`).
    pub deadline: SystemTime,
    /// Who is processing: stored as the claims' holder.
    pub request_id: String,
}

/// The batch engine. Cheap to clone; build one per process and reuse it.
#[derive(Clone)]
pub(crate) struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Inner { keys, options, .. } = &*self.inner;
        f.debug_struct("Engine").field("keys", keys).field("options", options).finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct Inner {
    handler: BoxHandler,
    claims: Arc<Claims>,
    keys: Keys,
    options: EngineOptions,
    outbox: Option<Arc<Outbox>>,
    bounds: Bounds,
}

/// The bounds every batch of the process shares, however many run at once
/// (`poll`'s overlapping batches, Lambda Managed Instances' concurrent
/// invocations): `SQS_ONCE_CONCURRENCY` bounds the process, not a batch.
#[derive(Debug, Clone)]
struct Bounds {
    /// Records claiming, waiting for a handler slot, or in their handler:
    /// `concurrency`, and as many more when the store gathers calls into
    /// shared requests, so that claims run ahead of the handlers.
    admitted: Arc<Semaphore>,
    /// Handlers under way, at most `concurrency`.
    handlers: Arc<Semaphore>,
    /// Finishing writes under way that gave their run's permit back: at
    /// most `concurrency` too when the store gathers calls into shared
    /// requests, none when each call is a request of its own.
    finishing: Arc<Semaphore>,
}

impl Bounds {
    /// `concurrency` handlers, and `overlap` more records on either side of them.
    fn new(concurrency: usize, overlap: usize) -> Self {
        Self {
            admitted: Arc::new(Semaphore::new(concurrency + overlap)),
            handlers: Arc::new(Semaphore::new(concurrency)),
            finishing: Arc::new(Semaphore::new(overlap)),
        }
    }
}

/// How a key's run ended.
#[derive(Debug, Clone)]
struct RunResult {
    outcome: Outcome,
    duration: Duration,
    claim_latency: Option<Duration>,
}

impl RunResult {
    fn failed(failure: Failure) -> Self {
        Self { outcome: Outcome::Failed(failure), duration: Duration::ZERO, claim_latency: None }
    }
}

/// A key's run, awaited by every record of the batch that shares the key.
type KeyRun<'a> = Shared<BoxFuture<'a, RunResult>>;

/// The run of each key in a batch, with the body it ran with (compared when
/// payload validation is on).
type Runs<'a> = Mutex<HashMap<String, (KeyRun<'a>, &'a str)>>;

/// How far a key's run has got, as the answer at the deadline sees it.
#[derive(Debug, Default)]
enum Progress {
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

/// What the task that claims and runs the handler hands on.
enum Step {
    /// The run ended without a handler's result to record (duplicate,
    /// conflict, store error...).
    Ended(Outcome),
    /// The handler returned under `lease`: its result is to be recorded,
    /// with what it staged.
    Returned(Lease, std::thread::Result<HandlerResult>, Staged),
}

/// A key's run, as the cut-off finds it: the task claiming and running its
/// handler, and how far it got.
struct Started {
    key: String,
    progress: Arc<Mutex<Progress>>,
    /// The task, until it has finished: a handle kept longer would keep the
    /// task's memory until the batch ends (a 10,000-record batch: 13 MB).
    handler: Option<AbortHandle>,
}

/// What the records of one batch share while it runs.
struct BatchState {
    /// Outcome of each record, by event index; `None` until it is known.
    reports: Mutex<Vec<Option<RecordReport>>>,
    started: Mutex<Vec<Started>>,
    /// The engine's bounds on records admitted and finishing writes.
    bounds: Bounds,
    /// The engine's handler slots, until this batch's cut-off.
    handler_slots: HandlerSlots,
    budget: DeadlineBudget,
    deadline_ms: u64,
    request_id: Arc<str>,
}

impl Engine {
    /// An engine running `handler` under `claims`, keying records with `keys`.
    pub(crate) fn new(handler: BoxHandler, claims: Arc<Claims>, keys: Keys, options: EngineOptions) -> Self {
        let concurrency = options.concurrency.max(1);
        // Records whose store calls may be under way beyond the concurrency bound, on either side of the
        // handlers: claims running ahead of them, and finishing writes after them (see `Engine::start`). Only
        // calls gathered into shared requests may overlap: a store that sends each call alone would get up to
        // three times the requests, and under faults three times the late answers.
        let overlap = if claims.gathers_calls() { concurrency } else { 0 };
        let bounds = Bounds::new(concurrency, overlap);
        Self { inner: Arc::new(Inner { handler, claims, keys, options, outbox: None, bounds }) }
    }

    /// This engine, sending the messages handlers stage through `outbox`
    /// once their transactions commit. Without one, they wait in the store
    /// for a sweep (`sqs-once claims outbox --send`).
    pub(crate) fn with_outbox(self, outbox: Option<Arc<Outbox>>) -> Self {
        let mut inner = Arc::unwrap_or_clone(self.inner);
        inner.outbox = outbox;
        Self { inner: Arc::new(inner) }
    }

    /// The claim state machine the engine runs on.
    pub(crate) fn claims(&self) -> &Arc<Claims> {
        &self.inner.claims
    }

    /// The outbox the engine sends staged messages through, if it has one.
    pub(crate) fn outbox(&self) -> Option<&Arc<Outbox>> {
        self.inner.outbox.as_ref()
    }

    /// The budget of an invocation due at `deadline`, as this engine plans it.
    pub(crate) fn budget(&self, deadline: SystemTime) -> DeadlineBudget {
        self.inner.options.margins.budget(deadline, self.inner.claims.now_ms())
    }

    /// Processes one batch and reports every record's fate, in event order.
    ///
    /// Finishing writes left unconfirmed by earlier batches are sent again
    /// first (see [`Claims::resend_unconfirmed`]). The time until the
    /// deadline is spent as [`DeadlineBudget`] says.
    pub(crate) async fn process(&self, records: &[EventRecord], invocation: &Invocation) -> BatchReport {
        let budget = self.budget(invocation.deadline);
        if budget.cutoff() <= Instant::now() && !records.is_empty() {
            tracing::warn!(
                margin_ms = duration_ms(self.inner.options.margins.deadline_margin),
                "the invocation had no more time than SQS_ONCE_DEADLINE_MARGIN_MS: no record can start, each fails \
                 `deadline`; the margin must stay well below the function timeout"
            );
        }
        let left = budget.deadline().saturating_duration_since(Instant::now());
        tracing::debug!(records = records.len(), remaining_ms = left.as_millis(), "batch received");
        let state = BatchState {
            reports: Mutex::new(vec![None; records.len()]),
            started: Mutex::new(Vec::new()),
            bounds: self.inner.bounds.clone(),
            handler_slots: HandlerSlots { free: Arc::clone(&self.inner.bounds.handlers), cutoff: budget.cutoff() },
            budget,
            deadline_ms: epoch_ms(invocation.deadline),
            request_id: invocation.request_id.as_str().into(),
        };
        let groups = message_groups(records);
        let opened: Vec<Result<Opened<'_>, Failure>> = records.iter().map(|record| self.open(record)).collect();
        // Declared after `state` and `opened`, which the runs borrow.
        let runs: Runs<'_> = Mutex::new(HashMap::new());
        // Entries left unsent by any process are swept while the batch runs.
        let sweep = self.inner.outbox.as_ref().and_then(|outbox| outbox.sweep_if_due(Some(budget.cutoff())));
        let done = Done::default();
        let groups_run = async {
            join_all(groups.iter().map(|group| self.run_group(records, &opened, group, &state, &runs))).await;
            done.set();
        };
        let work = join(groups_run, self.resend_while(&done));
        tokio::pin!(work);
        if timeout_at(budget.cutoff(), &mut work).await.is_err() {
            let cancelled = cancel_running(&state);
            self.inner.claims.expedite(budget.writes_by());
            tracing::warn!(
                cancelled,
                wait_ms = budget.writes_left().as_millis(),
                "deadline margin reached: no handler starts, running handlers are cancelled; \
                 waiting for the finishing writes of handlers that returned"
            );
            if timeout_at(budget.writes_by(), &mut work).await.is_err() {
                tracing::warn!("answering before every finishing write was confirmed; they go on in the background");
            }
        }
        if let Some(sweep) = sweep {
            // The sweep takes nothing new once the batch is done, and its sends under way end before the
            // answer, so that none is left in flight when Lambda freezes the process.
            sweep.stop();
            let _ = timeout_at(budget.writes_by(), sweep.finished()).await;
        }
        let returned = returned_outcomes(&state);
        let reports = std::mem::take(&mut *lock(&state.reports));
        let mut report = BatchReport {
            records: records
                .iter()
                .zip(&opened)
                .zip(reports)
                .map(|((record, opened), report)| report.unwrap_or_else(|| self.unanswered(record, opened, &returned)))
                .collect(),
        };
        keep_group_order(&groups, &mut report.records);
        for (opened, report) in opened.iter().zip(&report.records) {
            let body = opened.as_ref().map_or("", |opened| &opened.body);
            log_record(report, self.inner.options.log_bodies.then_some(body));
        }
        report
    }

    /// Sends again the finishing writes whose last send failed (see
    /// [`Claims::resend_unconfirmed`]), and the messages of each commit that
    /// landed.
    async fn resend_unconfirmed(&self) {
        let outbox = self.inner.outbox.clone();
        let deliver = move |entries: Vec<OutboxEntry>| {
            let outbox = outbox.clone();
            async move {
                if let Some(outbox) = outbox {
                    outbox.deliver(&entries).await;
                }
            }
        };
        self.inner.claims.resend_unconfirmed(deliver).await;
    }

    /// While the batch runs (until `done`), sends again the finishing
    /// writes whose last send failed: those that failed before it, at its
    /// start, and those that fail while it runs, a moment after. A write
    /// whose send was still waiting for its answer when the batch started
    /// (frozen with the process at the last answer, and timed out at the
    /// thaw) is sent again by the batch it failed in, not a batch later.
    async fn resend_while(&self, done: &Done) {
        loop {
            let failure = self.inner.claims.next_failure();
            self.resend_unconfirmed().await;
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
    /// next batch of a queue gone quiet. Returns once `stopped` completes.
    pub(crate) async fn tend(&self, stopped: impl Future<Output = ()>) {
        let resends = async {
            loop {
                let failure = self.inner.claims.next_failure();
                self.resend_unconfirmed().await;
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
    /// lets a sweep under way finish, until `until`. Returns the ids of the claims whose writes are still
    /// unconfirmed (logged): they stay in progress until their leases end.
    pub(crate) async fn leave(&self, until: Instant) -> Vec<String> {
        // Writes whose send is under way are waited for, and sent again if that send fails (a process thawed
        // to be shut down finds its sends cut off by the freeze), until every one is answered or `until`.
        let landing = async {
            loop {
                let answer = self.inner.claims.next_answer();
                self.resend_unconfirmed().await;
                if self.inner.claims.all_confirmed() {
                    return;
                }
                answer.await;
            }
        };
        let _ = timeout_at(until, landing).await;
        if let Some(outbox) = &self.inner.outbox {
            outbox.finish_sweep(until).await;
        }
        self.inner.claims.still_unconfirmed()
    }

    /// Whether runs take no claim: the handler stages every effect, and
    /// `SQS_ONCE_CLAIM` leaves it so.
    fn unclaimed(&self) -> bool {
        self.inner.options.claim == ClaimFirst::Auto && self.inner.handler.stages_every_effect()
    }

    /// The record as keys, payload validation, logs and the handler read it:
    /// its envelope opened, or why it cannot be.
    fn open<'m>(&self, record: &'m EventRecord) -> Result<Opened<'m>, Failure> {
        match record {
            EventRecord::Message(message) => Opened::new(message, self.inner.options.envelope)
                .map_err(|invalid| Failure::InvalidRecord(invalid.to_string())),
            EventRecord::Malformed { reason, .. } => Err(Failure::InvalidRecord(reason.clone())),
        }
    }

    /// The report of a record whose run had not reported when the answer
    /// was due: its handler's outcome if the handler had returned (its
    /// finishing write not confirmed), otherwise a `deadline` failure.
    fn unanswered(
        &self,
        record: &EventRecord,
        opened: &Result<Opened<'_>, Failure>,
        returned: &HashMap<String, Outcome>,
    ) -> RecordReport {
        let key = opened.as_ref().ok().and_then(|opened| self.inner.keys.derive(opened).ok());
        let outcome = key.as_ref().and_then(|key| returned.get(key)).cloned();
        if let (Some(outcome), Some(key)) = (&outcome, &key)
            && outcome.is_unconfirmed()
        {
            tracing::warn!(
                message_id = record.message_id(), key = %key,
                "CompletionUnconfirmed: the handler succeeded but its completion was not confirmed before the \
                 answer was due; reported successful. The write goes on and is sent again by this process; \
                 until it lands the claim stays in progress"
            );
        }
        RecordReport {
            message_id: record.message_id().to_owned(),
            key,
            outcome: outcome.unwrap_or(Outcome::Failed(Failure::Deadline)),
            duration: Duration::ZERO,
            claim_latency: None,
        }
    }

    /// Runs one message group in order; a standard queue's record is a group
    /// of its own. After a failure in a FIFO group the rest is skipped.
    async fn run_group<'a>(
        &self,
        records: &'a [EventRecord],
        opened: &'a [Result<Opened<'a>, Failure>],
        group: &Group,
        state: &'a BatchState,
        runs: &Runs<'a>,
    ) {
        let mut failed: Option<&str> = None;
        for &index in &group.indices {
            let record = &records[index];
            let (key, run) = match (failed, &opened[index]) {
                (Some(message_id), _) => (None, RunResult::failed(Failure::GroupSkipped(message_id.to_owned()))),
                (None, Err(invalid)) => (None, RunResult::failed(invalid.clone())),
                (None, Ok(opened)) => self.run_record(opened, state, runs).await,
            };
            if group.fifo && failed.is_none() && run.outcome.is_failure() {
                failed = Some(record.message_id());
            }
            let report = RecordReport {
                message_id: record.message_id().to_owned(),
                key,
                outcome: run.outcome,
                duration: run.duration,
                claim_latency: run.claim_latency,
            };
            lock(&state.reports)[index] = Some(report);
        }
    }

    async fn run_record<'a>(
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
            let mut runs = lock(runs);
            match runs.get(&key) {
                Some((_, first_body)) if validate && *first_body != message.body => {
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
    fn start<'a>(&self, message: &'a Opened<'a>, key: String, state: &'a BatchState) -> KeyRun<'a> {
        let engine = self.clone();
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
            let record = Record::opened(message, key.clone(), state.budget.deadline());
            let (deadline_ms, holder) = (state.deadline_ms, Arc::clone(&state.request_id));
            let progress = Arc::new(Mutex::new(Progress::Running));
            let started = Instant::now();
            let handler = engine.spawn_handler(record, deadline_ms, holder, Arc::clone(&progress), permit, state);
            let slot = {
                let mut started = lock(&state.started);
                started.push(Started { key, progress: Arc::clone(&progress), handler: Some(handler.abort_handle()) });
                started.len() - 1
            };
            let ran = handler.await;
            lock(&state.started)[slot].handler = None;
            let (record, step, claim_latency, permit) = match ran {
                Ok(ran) => ran,
                Err(error) if error.is_cancelled() => return RunResult::failed(Failure::Deadline),
                Err(error) => return RunResult::failed(Failure::Panicked(error.to_string())),
            };
            let outcome = match step {
                Step::Ended(outcome) => outcome,
                Step::Returned(lease, result, staged) => {
                    let fallback = provisional_outcome(&result, &staged, &lease, engine.inner.claims.now_ms());
                    let permit = Arc::clone(&state.bounds.finishing).try_acquire_owned().unwrap_or(permit);
                    engine.spawn_write(record, lease, result, staged, progress, permit).await.unwrap_or(fallback)
                }
            };
            RunResult { outcome, duration: started.elapsed(), claim_latency: Some(claim_latency) }
        }
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
        result: std::thread::Result<HandlerResult>,
        staged: Staged,
        progress: Arc<Mutex<Progress>>,
        permit: OwnedSemaphorePermit,
    ) -> JoinHandle<Outcome> {
        let engine = self.clone();
        tokio::spawn(
            async move {
                let _permit = permit;
                engine.write_ending(&record, &lease, result, staged, &progress).await
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
            true => self.inner.claims.start_unclaimed(&request).await,
            false => self.inner.claims.claim(&request).await,
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
        let result = AssertUnwindSafe(async { self.inner.handler.handle_boxed(record).await }).catch_unwind().await;
        // What the handler staged is committed only if it succeeded.
        let staged = record.transaction().take();
        // No await between the handler's return and this: a run cancelled at
        // the cut-off either has its handler's outcome here or never returned.
        *lock(progress) = Progress::Returned(provisional_outcome(&result, &staged, &lease, self.inner.claims.now_ms()));
        (Step::Returned(lease, result, staged), claim_latency)
    }

    /// Writes how the handler ended (completion, commit, failure record,
    /// release) and says what that makes of the record.
    async fn write_ending(
        &self,
        record: &Record,
        lease: &Lease,
        result: std::thread::Result<HandlerResult>,
        staged: Staged,
        progress: &Mutex<Progress>,
    ) -> Outcome {
        let outcome = provisional_outcome(&result, &staged, lease, self.inner.claims.now_ms());
        match result {
            // A run that took no claim commits its completion even with nothing staged: that write is its claim.
            Ok(Ok(output)) if !staged.is_empty() || lease.is_unclaimed() => {
                self.commit(record, lease, output, staged, progress).await
            }
            Ok(Ok(output)) => {
                let confirmed = match self.inner.claims.complete(lease, output.as_ref()).await {
                    Ok(fenced) => fenced == Fenced::Applied,
                    Err(error) => {
                        tracing::error!(
                            message_id = %record.message_id, key = %record.key, %error,
                            "CompletionUnconfirmed: the handler succeeded but its completion could not be \
                             recorded; it is sent again later, and until it lands the claim stays in progress"
                        );
                        false
                    }
                };
                Outcome::Processed { confirmed }
            }
            _ => match outcome {
                Outcome::Failed(failure) => self.write_failure(record, lease, failure, progress).await,
                outcome => outcome,
            },
        }
    }

    /// Records how a handler failed (its error, its panic, or its staged
    /// writes refused): a failure record when it is permanent, a release
    /// otherwise. The answer reports the failure from now on, whether or
    /// not the write is confirmed in time.
    async fn write_failure(
        &self,
        record: &Record,
        lease: &Lease,
        failure: Failure,
        progress: &Mutex<Progress>,
    ) -> Outcome {
        *lock(progress) = Progress::Returned(Outcome::Failed(failure.clone()));
        let written = match &failure {
            Failure::Permanent(reason) => self.inner.claims.fail(lease, reason).await,
            _ => self.inner.claims.release(lease).await,
        };
        log_unwritten(record, written);
        Outcome::Failed(failure)
    }

    /// Commits what the handler staged with the claim's completion. Only a
    /// confirmed commit makes the record processed, and its messages are
    /// sent then; a cancelled one is the handler's failure, as the write
    /// that cancelled it declared.
    async fn commit(
        &self,
        record: &Record,
        lease: &Lease,
        output: Option<serde_json::Value>,
        staged: Staged,
        progress: &Mutex<Progress>,
    ) -> Outcome {
        let claims = &self.inner.claims;
        let nothing_staged = staged.is_empty();
        let commit = claims.prepare_commit(lease, output.as_ref(), staged, &record.message_id);
        let entries = commit.outbox.clone();
        let (message_id, key) = (&record.message_id, &record.key);
        let outcome = match claims.commit(lease, commit).await {
            Ok(Committed::Applied) => Outcome::Processed { confirmed: true },
            Ok(Committed::Refused) => Outcome::Failed(Failure::LeaseLost),
            // A run without a claim found the key taken: by a copy that committed first (a duplicate), a claim
            // live elsewhere, a failure recorded. Nothing of this run applied.
            Ok(Committed::Taken(existing)) => match claims.taken(lease, existing).await {
                // A record that holds the key is never a claim won.
                Ok(claim) => won(claim).err().unwrap_or(Outcome::Failed(Failure::LeaseLost)),
                Err(error) => Outcome::Failed(error.into()),
            },
            Ok(Committed::Cancelled(cancellation)) => {
                let refusal = &cancellation.refusal;
                let reason = reason::capped(&format!("{} ({})", refusal.reason, cancellation.reasons)).into_owned();
                tracing::warn!(%message_id, %key, %reason, "a staged write's condition did not hold: nothing applied");
                let failure = match refusal.kind {
                    ErrorKind::Permanent => Failure::Permanent(reason),
                    ErrorKind::Retryable => Failure::Retryable(reason),
                };
                self.write_failure(record, lease, failure, progress).await
            }
            Err(error @ (StoreError::Rejected(_) | StoreError::Unsupported(_))) => {
                let reason = reason::capped(&format!("the staged writes cannot be committed: {error}")).into_owned();
                self.write_failure(record, lease, Failure::Permanent(reason), progress).await
            }
            // A run without a claim that staged nothing has no effect to lose: its completion is a completion.
            Err(error) if nothing_staged => {
                tracing::error!(
                    %message_id, %key, %error,
                    "CompletionUnconfirmed: the handler succeeded but its completion could not be recorded; it is \
                     sent again later"
                );
                Outcome::Processed { confirmed: false }
            }
            Err(error) => {
                tracing::error!(
                    %message_id, %key, %error,
                    "the handler's transaction could not be confirmed: the record is reported failed and comes \
                     back after the lease; the commit is sent again, and its claim's token (or, without a claim, \
                     the key's completion) refuses it if another delivery has committed meanwhile"
                );
                Outcome::Failed(Failure::Uncommitted { retry_after: lease_left(lease, claims.now_ms()) })
            }
        };
        *lock(progress) = Progress::Returned(outcome.clone());
        if outcome == (Outcome::Processed { confirmed: true }) {
            self.deliver(&entries).await;
        }
        outcome
    }

    /// Sends a committed run's messages, if the engine has an outbox.
    async fn deliver(&self, entries: &[OutboxEntry]) {
        if let Some(outbox) = &self.inner.outbox
            && !entries.is_empty()
        {
            outbox.deliver(entries).await;
        }
    }
}

/// How long a batch waits, after a finishing write failed, before it sends
/// it again: the SDK has retried it already.
const RESEND_PAUSE: Duration = Duration::from_millis(250);

/// Set once every record of a batch has its outcome.
#[derive(Debug, Default)]
struct Done {
    set: AtomicBool,
    notify: Notify,
}

impl Done {
    fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    async fn wait(&self) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !self.is_set() {
            notified.await;
        }
    }
}

/// The lease of a claim won, or the outcome of one that was not.
fn won(claim: Claim) -> Result<Lease, Outcome> {
    Err(Outcome::Failed(match claim {
        Claim::Won(lease) => return Ok(lease),
        Claim::Duplicate { .. } => return Err(Outcome::Duplicate),
        Claim::Conflict { retry_after } => Failure::Conflict { retry_after },
        Claim::FailedBefore { error } => Failure::FailedBefore(error),
        Claim::PayloadMismatch => Failure::PayloadMismatch,
    }))
}

/// Time until `lease` has ended, at least a second: when a record whose
/// commit is unconfirmed may come back.
fn lease_left(lease: &Lease, now_ms: u64) -> Duration {
    Duration::from_millis(lease.lease_until_ms.saturating_sub(now_ms).max(1000))
}

/// What a handler's result means for its record before the write that
/// records it is confirmed: the answer due at the deadline reports this. A
/// handler that staged writes has done nothing until they commit.
/// Error texts are capped ([`reason::capped`]).
fn provisional_outcome(
    result: &std::thread::Result<HandlerResult>,
    staged: &Staged,
    lease: &Lease,
    now_ms: u64,
) -> Outcome {
    let text = |error: &dyn std::fmt::Display| reason::capped(&error.to_string()).into_owned();
    match result {
        Ok(Ok(_)) if !staged.is_empty() => {
            Outcome::Failed(Failure::Uncommitted { retry_after: lease_left(lease, now_ms) })
        }
        Ok(Ok(_)) => Outcome::Processed { confirmed: false },
        Ok(Err(error)) if error.kind() == ErrorKind::Permanent => Outcome::Failed(Failure::Permanent(text(error))),
        Ok(Err(error)) => Outcome::Failed(Failure::Retryable(text(error))),
        Err(panic) => Outcome::Failed(Failure::Panicked(text(&panic_message(panic.as_ref())))),
    }
}

/// The handler slots of a batch: a run that has won its claim waits here.
#[derive(Clone)]
struct HandlerSlots {
    free: Arc<Semaphore>,
    cutoff: Instant,
}

impl HandlerSlots {
    /// A slot for a run whose claim is won, or `None` once the cut-off has
    /// come. The run is `Waiting` meanwhile, and turns `Running` under the
    /// same lock that [`cancel_running`] reads it with, after the cut-off:
    /// either the cut-off cancels the handler, or the handler never starts.
    async fn take(&self, progress: &Mutex<Progress>) -> Option<OwnedSemaphorePermit> {
        let slot = match Arc::clone(&self.free).try_acquire_owned() {
            Ok(slot) => Some(slot),
            Err(_) => {
                *lock(progress) = Progress::Waiting;
                tokio::select! {
                    biased;
                    slot = Arc::clone(&self.free).acquire_owned() => slot.ok(),
                    () = tokio::time::sleep_until(self.cutoff) => None,
                }
            }
        };
        let mut progress = lock(progress);
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
fn cancel_running(state: &BatchState) -> usize {
    let started = lock(&state.started);
    // A run that ended at its claim (a duplicate, a conflict) never left `Running`; its task has finished.
    let running = started.iter().filter_map(|run| {
        let handler = run.handler.as_ref().filter(|handler| !handler.is_finished())?;
        matches!(*lock(&run.progress), Progress::Running).then_some((run, handler))
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

/// The outcome of every key whose handler returned, by key.
fn returned_outcomes(state: &BatchState) -> HashMap<String, Outcome> {
    lock(&state.started)
        .iter()
        .filter_map(|run| match &*lock(&run.progress) {
            Progress::Returned(outcome) => Some((run.key.clone(), outcome.clone())),
            Progress::Running | Progress::Waiting => None,
        })
        .collect()
}

/// FIFO order, whatever path each report took: after the first failed record
/// of a FIFO group, every later record of the group fails too. (A record
/// answered at the deadline from another group's run of the same key could
/// otherwise succeed after its own group's earlier record failed.)
fn keep_group_order(groups: &[Group], reports: &mut [RecordReport]) {
    for group in groups.iter().filter(|group| group.fifo) {
        let mut failed: Option<String> = None;
        for &index in &group.indices {
            let report = &mut reports[index];
            match &failed {
                None if report.outcome.is_failure() => failed = Some(report.message_id.clone()),
                Some(first) if !report.outcome.is_failure() => {
                    report.outcome = Outcome::Failed(Failure::GroupSkipped(first.clone()));
                }
                _ => {}
            }
        }
    }
}

fn log_unwritten(record: &Record, written: Result<Fenced, StoreError>) {
    if let Err(error) = written {
        tracing::error!(
            message_id = %record.message_id, key = %record.key, %error,
            "could not record how the handler ended; it is sent again later, and until it lands the claim \
             stays in progress"
        );
    }
}

/// One line per record: message id, key, outcome and duration, and the body
/// only when the user opted in.
fn log_record(report: &RecordReport, body: Option<&str>) {
    let duration_ms = u64::try_from(report.duration.as_millis()).unwrap_or(u64::MAX);
    let key = report.key.as_deref().unwrap_or("-");
    match &report.outcome {
        Outcome::Failed(failure) => tracing::warn!(
            message_id = %report.message_id, key, outcome = failure.label(), duration_ms, reason = %failure, body,
            "record failed"
        ),
        outcome => tracing::info!(
            message_id = %report.message_id, key, outcome = outcome.label(), duration_ms, body, "record done"
        ),
    }
}

/// Records that must run in order, and whether they come from a FIFO queue.
struct Group {
    indices: Vec<usize>,
    fifo: bool,
}

/// Splits the batch into FIFO message groups (in event order) and single
/// records of standard queues.
fn message_groups(records: &[EventRecord]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    let mut by_group_id: HashMap<&str, usize> = HashMap::new();
    for (index, record) in records.iter().enumerate() {
        match record.fifo_group() {
            Some(group_id) => {
                let slot = *by_group_id.entry(group_id).or_insert_with(|| {
                    groups.push(Group { indices: Vec::new(), fifo: true });
                    groups.len() - 1
                });
                groups[slot].indices.push(index);
            }
            None => groups.push(Group { indices: vec![index], fifo: false }),
        }
    }
    groups
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|message| (*message).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

#[cfg(test)]
pub(crate) mod tests;
