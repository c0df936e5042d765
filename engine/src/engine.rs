//! The batch engine: one SQS batch in, one partial-batch response out.
//!
//! Records fan out concurrently, with a bound. Records that share a key run
//! once: the first is reported as the run ended, the copies as duplicates of
//! a confirmed success, or as the run ended otherwise. FIFO records run in order within their message
//! group, and a failure stops the rest of its group. When the invocation's
//! deadline comes within the safety margin, nothing new starts, and the engine
//! answers with every unfinished record failed, so a slow record never turns
//! into a Lambda timeout that would redeliver the whole batch.
//!
//! The engine knows a [`Claims`] state machine and a handler; it does not know
//! which store is behind them, nor whether it runs inside Lambda.
//!
//! A batch passes through its phases in this order, one module each: this
//! one takes the batch in, cuts it off at the deadline and answers;
//! `payloads` reads the payloads records point to in S3;
//! `groups` runs FIFO groups in order; `run` admits each key's run, claims
//! the key and runs the handler; `finish` records how the handler ended
//! and delivers what it committed; `tending` resends what failed to land,
//! beside the batch, between batches and before the process leaves.

mod builder;
mod cutoff;
mod finish;
mod groups;
mod outcome;
mod payloads;
mod run;
mod tending;

pub use crate::claim::{ClaimPolicy, jitter_spread};
pub use builder::EngineBuilder;

use parking_lot::Mutex;
use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use futures::future::{join, join_all};
use tokio::{
    sync::Semaphore,
    time::{Instant, timeout_at},
};
use tracing::Instrument;

use crate::{
    budget::{DeadlineBudget, Margins},
    claim::Claims,
    event::EventRecord,
    key::Keys,
    opened::Opened,
    outbox::{Outbox, OutboxCounters, SendWindow},
    report::{BatchReport, Failure, Outcome, RecordReport},
    spans,
};
use cutoff::{HandlerSlots, Started, cancel_running};
use groups::message_groups;
use payloads::{Fetched, PayloadMemory};
use run::Runs;
use sqs_once_core::{
    BoxHandler, Handler,
    clock::{duration_ms, epoch_ms},
    envelope::EnvelopeKind,
    payload::{Offload, PayloadOptions, PayloadStore},
    store::StoreError,
    trace::{Propagators, TraceContext},
    transaction::Transaction,
};
use tending::Done;

/// Tuning of the engine; docs/configuration.md has the matching settings.
#[derive(Debug, Clone)]
pub struct EngineOptions {
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
    /// The trace headers read and written (`OTEL_PROPAGATORS`).
    pub propagators: Propagators,
    /// How records that carry an S3 pointer are read.
    pub payloads: PayloadOptions,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            concurrency: 64,
            margins: Margins::default(),
            log_bodies: false,
            envelope: EnvelopeKind::None,
            claim: ClaimFirst::Auto,
            propagators: Propagators::default(),
            payloads: PayloadOptions::default(),
        }
    }
}

/// When a run claims its key before its handler runs (`SQS_ONCE_CLAIM`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClaimFirst {
    /// Unless the handler stages every effect
    /// ([`Handler::stages_every_effect`]):
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

/// The shortest key memory under which runs take no claim: a commit
/// without a claim must land while the completion of every run that
/// decided after it was sent is still remembered, the completions of runs
/// that staged nothing (kept `SQS_ONCE_EXPIRES_AFTER_SECS` alone) among
/// them; below a commit's own memory, runs claim first.
const UNCLAIMED_MEMORY: Duration = sqs_once_core::store::COMMIT_MEMORY;

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
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Inner { keys, options, .. } = &*self.inner;
        f.debug_struct("Engine").field("keys", keys).field("options", options).finish_non_exhaustive()
    }
}

struct Inner {
    handler: BoxHandler,
    claims: Arc<Claims>,
    keys: Keys,
    options: EngineOptions,
    outbox: Option<Arc<Outbox>>,
    /// Where payloads that records point to are read (S3), and those of
    /// messages too large to send are written.
    payloads: Option<Arc<dyn PayloadStore>>,
    /// Where the payloads of messages too large to send go, when a bucket
    /// is set and there is a store to write them with.
    offload: Option<Arc<Offload>>,
    /// The payloads read from S3 that the process holds at once.
    payload_memory: PayloadMemory,
    bounds: Bounds,
    /// Whether [`Engine::tend`] keeps the process moving between batches (it
    /// is never frozen): its outbox is swept on a timer, never beside a batch.
    tended: AtomicBool,
}

/// What an engine has counted since it was built ([`Engine::counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineCounts {
    /// Finishing writes refused because another delivery had taken the
    /// lease over.
    pub lease_takeovers_refused: u64,
    /// Finishing writes not confirmed when first sent that landed when sent
    /// again.
    pub completions_landed_later: u64,
    /// Finishing writes given up unconfirmed (see
    /// [`Commit::send_by_ms`](sqs_once_core::store::Commit::send_by_ms)).
    pub writes_given_up: u64,
    /// Outbox messages sent.
    pub outbox_sent: u64,
    /// Outbox sends that failed or were refused; their entries stay for a
    /// later sweep.
    pub outbox_failed: u64,
    /// Outbox sends the destination refused for good as the message stands.
    pub outbox_refused: u64,
    /// The outbox's oldest unsent entry's age, when a sweep measured it
    /// since the last count.
    pub outbox_oldest_age: Option<Duration>,
}

impl EngineCounts {
    /// What was counted since `earlier`, a count of the same engine; the
    /// outbox's age is this count's.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            lease_takeovers_refused: self.lease_takeovers_refused - earlier.lease_takeovers_refused,
            completions_landed_later: self.completions_landed_later - earlier.completions_landed_later,
            writes_given_up: self.writes_given_up - earlier.writes_given_up,
            outbox_sent: self.outbox_sent - earlier.outbox_sent,
            outbox_failed: self.outbox_failed - earlier.outbox_failed,
            outbox_refused: self.outbox_refused - earlier.outbox_refused,
            outbox_oldest_age: self.outbox_oldest_age,
        }
    }
}

/// How long an engine remembers completed keys ([`Engine::key_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyMemory {
    /// `SQS_ONCE_EXPIRES_AFTER_SECS`.
    pub expires_after: Duration,
    /// How long a failed record can stay away from the queue, when known:
    /// keys are remembered past it too.
    pub redelivered_within: Option<Duration>,
}

impl From<&ClaimPolicy> for KeyMemory {
    /// The memory `policy` sets out, before a queue's own visibility
    /// timeout is known.
    fn from(policy: &ClaimPolicy) -> Self {
        Self { expires_after: policy.expires_after, redelivered_within: policy.redelivered_within }
    }
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

/// What the records of one batch share while it runs.
struct BatchState {
    started: Mutex<Vec<Started>>,
    /// The engine's bounds on records admitted and finishing writes.
    bounds: Bounds,
    /// The engine's handler slots, until this batch's cut-off.
    handler_slots: HandlerSlots,
    budget: DeadlineBudget,
    deadline_ms: u64,
    request_id: Arc<str>,
    /// Each record's `process` span, by event index (see [`crate::spans`]).
    spans: Vec<tracing::Span>,
}

impl Engine {
    /// An engine running `handler` under `claims`, keying records with
    /// `keys`, sending the messages handlers stage through `outbox` once
    /// their transactions commit (without one, they wait in the store for a
    /// sweep: `sqs-once claims outbox --send`), reading the payloads records
    /// point to from `payloads`. Built by [`EngineBuilder`].
    fn new(
        handler: BoxHandler,
        claims: Arc<Claims>,
        keys: Keys,
        options: EngineOptions,
        outbox: Option<Arc<Outbox>>,
        payloads: Option<Arc<dyn PayloadStore>>,
    ) -> Self {
        let concurrency = options.concurrency.max(1);
        // Records whose store calls may be under way beyond the concurrency bound, on either side of the
        // handlers: claims running ahead of them, and finishing writes after them (see `Engine::start`). Only
        // calls gathered into shared requests may overlap: a store that sends each call alone would get up to
        // three times the requests, and under faults three times the late answers.
        let overlap = if claims.gathers_calls() { concurrency } else { 0 };
        let bounds = Bounds::new(concurrency, overlap);
        let offload = options.payloads.offload().filter(|_| payloads.is_some()).map(Arc::new);
        let payload_memory = PayloadMemory::new(options.payloads.memory);
        let inner = Inner {
            handler,
            claims,
            keys,
            options,
            outbox,
            payloads,
            offload,
            payload_memory,
            bounds,
            tended: AtomicBool::new(false),
        };
        Self { inner: Arc::new(inner) }
    }

    /// The trace headers it reads and writes (`OTEL_PROPAGATORS`).
    pub fn propagators(&self) -> Propagators {
        self.inner.options.propagators
    }

    /// The claim state machine the engine runs on, for the tests to look
    /// into.
    #[cfg(test)]
    pub(crate) fn claims(&self) -> &Arc<Claims> {
        &self.inner.claims
    }

    /// What the engine has counted since it was built, and the age of the
    /// outbox's oldest entry if a sweep measured it since the last call:
    /// what metrics publish beside each batch's report.
    pub fn counts(&self) -> EngineCounts {
        let counters = self.inner.claims.counters();
        let outbox = self.inner.outbox.as_deref();
        let count = |counter: fn(&OutboxCounters) -> &AtomicU64| {
            outbox.map_or(0, |outbox| counter(outbox.counters()).load(Ordering::Relaxed))
        };
        EngineCounts {
            lease_takeovers_refused: counters.refused.load(Ordering::Relaxed),
            completions_landed_later: counters.landed_later.load(Ordering::Relaxed),
            writes_given_up: self.inner.claims.writes_given_up(),
            outbox_sent: count(|counters| &counters.sent),
            outbox_failed: count(|counters| &counters.failed),
            outbox_refused: count(|counters| &counters.refused),
            outbox_oldest_age: outbox.and_then(Outbox::take_oldest_age),
        }
    }

    /// Opens what the store's first calls will need, for at most `within`
    /// (see [`ClaimStore::connect`](sqs_once_core::store::ClaimStore::connect)).
    pub async fn connect(&self, within: Duration) {
        self.inner.claims.connect(within).await;
    }

    /// Sets how long a failed record can stay away before the queue
    /// delivers it again, so that keys are remembered past it (see
    /// [`ClaimPolicy::redelivered_within`](crate::claim::ClaimPolicy)).
    pub fn set_redelivered_within(&self, within: Option<Duration>) {
        self.inner.claims.set_redelivered_within(within);
    }

    /// How long completed keys are remembered: the settings' expiry, and
    /// the queue's redelivery when it is known.
    pub fn key_memory(&self) -> KeyMemory {
        let claims = &self.inner.claims;
        KeyMemory { expires_after: claims.policy().expires_after, redelivered_within: claims.redelivered_within() }
    }

    /// The outbox the engine sends staged messages through, if it has one.
    pub(crate) fn outbox(&self) -> Option<&Arc<Outbox>> {
        self.inner.outbox.as_ref()
    }

    /// The transaction a run on `message` stages into: its messages carry
    /// the record's trace context onward, and go through S3 when too large
    /// to send and a bucket is set.
    fn transaction(&self, message: &Opened<'_>) -> Transaction {
        let context = spans::onward(message.message, self.inner.options.propagators);
        Transaction::carrying(context, self.inner.offload.clone())
    }

    /// The budget of an invocation due at `deadline`, as this engine plans it.
    pub fn budget(&self, deadline: SystemTime) -> DeadlineBudget {
        self.inner.options.margins.budget(deadline, self.inner.claims.now_ms())
    }

    /// Processes one batch and reports every record's fate, in event order.
    ///
    /// Finishing writes left unconfirmed by earlier batches are sent again
    /// first. The time until the deadline is spent as [`DeadlineBudget`]
    /// says. The batch's span is a
    /// child of `parent` (in Lambda, the invocation's own trace).
    pub async fn process(
        &self,
        records: &[EventRecord],
        invocation: &Invocation,
        parent: Option<&TraceContext>,
    ) -> BatchReport {
        let budget = self.budget(invocation.deadline);
        self.warn_if_no_time(records, &budget);
        let batch_span = spans::batch_span(records.len(), parent);
        let state = BatchState {
            started: Mutex::new(Vec::new()),
            bounds: self.inner.bounds.clone(),
            handler_slots: HandlerSlots { free: Arc::clone(&self.inner.bounds.handlers), cutoff: budget.cutoff() },
            budget,
            deadline_ms: epoch_ms(invocation.deadline),
            request_id: invocation.request_id.as_str().into(),
            spans: batch_span.in_scope(|| {
                records.iter().map(|record| spans::record_span(record, self.inner.options.propagators)).collect()
            }),
        };
        let mut opened: Vec<Result<Opened<'_>, Failure>> = records.iter().map(|record| self.open(record)).collect();
        let fetched = self.fetch_payloads(&mut opened, budget.cutoff()).await;
        let reports = self.run_batch(records, &opened, &state).instrument(batch_span).await;
        self.answer(reports, &opened, &fetched, &state).await
    }

    /// Warns when the batch arrives with no time left to start a record.
    fn warn_if_no_time(&self, records: &[EventRecord], budget: &DeadlineBudget) {
        let now = Instant::now();
        if budget.cutoff() <= now && !records.is_empty() {
            tracing::warn!(
                margin_ms = duration_ms(self.inner.options.margins.deadline_margin),
                "the invocation had no more time than SQS_ONCE_DEADLINE_MARGIN_MS: no record can start, each fails \
                 `deadline`; the margin must stay well below the function timeout"
            );
        }
        let left = budget.deadline().saturating_duration_since(now);
        tracing::debug!(records = records.len(), remaining_ms = left.as_millis(), "batch received");
    }

    /// Runs the batch's message groups until every record has reported,
    /// with the finishing writes that failed sent again beside them and, in
    /// a process Lambda freezes, the outbox swept. At the cut-off no handler
    /// starts and those running are cancelled; every run reports by the time
    /// the finishing writes must be done. The sweep's sends are cut a moment
    /// after the runs end (`outbox::CUT_GRACE`). Returns each record's report, in event order.
    async fn run_batch<'a>(
        &self,
        records: &'a [EventRecord],
        opened: &'a [Result<Opened<'a>, Failure>],
        state: &'a BatchState,
    ) -> Vec<RecordReport> {
        let budget = state.budget;
        let groups = message_groups(records);
        // Declared after `state` and `opened`, which the runs borrow.
        let runs: Runs<'a> = Mutex::new(HashMap::new());
        // Entries left unsent by any process are swept while the batch runs, by a process Lambda freezes.
        let sweep = self.sweeps_beside_batches().and_then(|outbox| outbox.sweep_beside_batch(budget.writes_by()));
        let done = Done::default();
        let groups_run = async {
            let reports = join_all(groups.iter().map(|group| self.run_group(records, opened, group, state, &runs)));
            let reports = reports.await;
            done.set();
            reports
        };
        // Messages are sent within this batch's time, in a process Lambda freezes once it answers.
        let frozen_after = !self.inner.tended.load(Ordering::Relaxed);
        let window = SendWindow::ending_by(frozen_after.then(|| budget.writes_by()));
        if let Some(outbox) = &self.inner.outbox {
            outbox.enter_batch(window.clone());
        }
        let work = join(groups_run, timeout_at(budget.writes_by(), self.resend_while(&done, &window)));
        tokio::pin!(work);
        let (reports, _) = match timeout_at(budget.cutoff(), &mut work).await {
            Ok(ran) => ran,
            Err(_) => self.at_cutoff(state, work).await,
        };
        if let Some(sweep) = sweep {
            // The batch's work is done: the sweep takes no more entries and its sends still in flight a moment later
            // are cut, so that the answer waits for no slow one and none is in flight when Lambda freezes the process.
            sweep.cut();
            let _ = timeout_at(budget.writes_by(), sweep.finished()).await;
        }
        let mut reports: Vec<(usize, RecordReport)> = reports.into_iter().flatten().collect();
        reports.sort_unstable_by_key(|(index, _)| *index);
        reports.into_iter().map(|(_, report)| report).collect()
    }

    /// At the cut-off: cancels the handlers still running, hurries the
    /// store's calls to end by the time the finishing writes must be done,
    /// and waits for the runs until then.
    async fn at_cutoff<T>(&self, state: &BatchState, work: impl Future<Output = T>) -> T {
        let cancelled = cancel_running(state);
        let writes_by = state.budget.writes_by();
        self.inner.claims.expedite(writes_by);
        tracing::warn!(
            cancelled,
            wait_ms = state.budget.writes_left().as_millis(),
            "deadline margin reached: no handler starts, running handlers are cancelled; \
             waiting for the finishing writes of handlers that returned"
        );
        let ran = work.await;
        if Instant::now() >= writes_by {
            tracing::warn!("answering before every finishing write was confirmed; they go on in the background");
        }
        ran
    }

    /// The batch's answer, once every record has reported: copies of a
    /// processed record are duplicates, each record's span and log line get
    /// its outcome, and the payloads of records that succeeded are deleted
    /// when asked.
    async fn answer(
        &self,
        records: Vec<RecordReport>,
        opened: &[Result<Opened<'_>, Failure>],
        fetched: &[Option<Fetched>],
        state: &BatchState,
    ) -> BatchReport {
        let mut report = BatchReport { records };
        copies_are_duplicates(&mut report.records);
        for ((span, report), fetched) in state.spans.iter().zip(&mut report.records).zip(fetched) {
            report.payload_bytes = fetched.as_ref().map(|fetched| fetched.bytes);
            spans::record_outcome(span, report);
        }
        if self.inner.options.payloads.delete_after {
            let _ = timeout_at(state.budget.writes_by(), self.delete_payloads(fetched, &report)).await;
        }
        for (opened, report) in opened.iter().zip(&report.records) {
            let body = opened.as_ref().map_or("", |opened| &opened.body);
            log_record(report, self.inner.options.log_bodies.then_some(body));
        }
        report
    }

    /// The outbox, when it is swept beside batches: in a process that
    /// Lambda freezes between invocations, so no timer of its own runs.
    fn sweeps_beside_batches(&self) -> Option<&Arc<Outbox>> {
        self.inner.outbox.as_ref().filter(|_| !self.inner.tended.load(Ordering::Relaxed))
    }

    /// Whether runs take no claim: the handler stages every effect,
    /// `SQS_ONCE_CLAIM` leaves it so, and keys are remembered long enough
    /// for a commit without a claim to be sent (see
    /// [`Commit::send_by_ms`](sqs_once_core::store::Commit::send_by_ms)).
    fn unclaimed(&self) -> bool {
        self.inner.options.claim == ClaimFirst::Auto
            && self.inner.handler.stages_every_effect()
            && self.inner.claims.remembers_at_least() >= UNCLAIMED_MEMORY
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
}

/// Records that share their key with an earlier record of the batch are
/// copies of it, and ran as its run: where that run succeeded and its
/// completion is confirmed, the first record is the one processed and the
/// others are duplicates of it, as a later batch would find them (and as
/// metrics count them). A run whose completion is not confirmed leaves its
/// copies as it is (a duplicate says the key is completed), and a failed run
/// fails every copy, so that each comes back.
fn copies_are_duplicates(records: &mut [RecordReport]) {
    let mut processed = HashSet::new();
    for record in records {
        if let (Some(key), Outcome::Processed { confirmed: true }) = (&record.key, &record.outcome)
            && !processed.insert(key.clone())
        {
            record.outcome = Outcome::Duplicate;
        }
    }
}

// Here rather than beside `Failure`: a report knows nothing of stores, and
// the engine is where a store's error becomes a record's failure.
impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Self::Store(error.to_string())
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

#[cfg(test)]
mod tests;
