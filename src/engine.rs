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
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse};
use futures::{
    FutureExt,
    future::{BoxFuture, Shared, join_all},
};
use tokio::{
    sync::Semaphore,
    task::AbortHandle,
    time::{Instant, timeout_at},
};

use crate::{
    BoxHandler, ErrorKind, Record,
    claim::{Claim, ClaimRequest, Claims, Lease},
    clock::epoch_ms,
    envelope::{EnvelopeKind, Opened},
    key::KeyDeriver,
    lock::lock,
    sqs::event::EventRecord,
    store::{Fenced, StoreError},
};

/// Tuning of the engine; see the README for the matching settings.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Records running at once (`SQS_ONCE_CONCURRENCY`).
    pub concurrency: usize,
    /// Stop starting records, and answer, this long before the deadline
    /// (`SQS_ONCE_DEADLINE_MARGIN_MS`).
    pub deadline_margin: Duration,
    /// Include each record's body in its log line (`SQS_ONCE_LOG_BODIES`).
    pub log_bodies: bool,
    /// The envelope message bodies arrive in (`SQS_ONCE_ENVELOPE`).
    pub envelope: EnvelopeKind,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            concurrency: 64,
            deadline_margin: Duration::from_millis(500),
            log_bodies: false,
            envelope: EnvelopeKind::None,
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

/// What became of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The handler ran and succeeded. `recorded` is false when the completed
    /// state was not confirmed written (the store failed, the lease had been
    /// taken over, or the answer was due before the store answered); the
    /// record still succeeded and SQS may delete it.
    Processed {
        /// Whether the claim was confirmed completed.
        recorded: bool,
    },
    /// The key had completed before: the handler did not run.
    Duplicate,
    /// The record must be delivered again.
    Failed(Failure),
}

impl Outcome {
    /// Whether the record goes into `batchItemFailures`.
    pub fn is_failure(&self) -> bool {
        matches!(self, Self::Failed(_))
    }

    /// Whether the handler succeeded but its completion is not confirmed
    /// in the store (see [`Outcome::Processed`]).
    pub fn is_unconfirmed(&self) -> bool {
        matches!(self, Self::Processed { recorded: false })
    }

    /// A short label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Processed { .. } => "processed",
            Self::Duplicate => "duplicate",
            Self::Failed(failure) => failure.label(),
        }
    }
}

/// Why a record failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The record's fields do not parse.
    #[error("invalid record: {0}")]
    InvalidRecord(String),
    /// No idempotency key could be derived.
    #[error("no idempotency key: {0}")]
    MissingKey(String),
    /// Another holder's lease on the key is live.
    #[error("key is being processed elsewhere; free in {} ms", retry_after.as_millis())]
    Conflict {
        /// Time until that lease can have ended.
        retry_after: Duration,
    },
    /// The handler failed, and another delivery may succeed.
    #[error("handler failed (retryable): {0}")]
    Retryable(String),
    /// The handler failed, and no delivery can succeed.
    #[error("handler failed (permanent): {0}")]
    Permanent(String),
    /// The key failed permanently in an earlier delivery.
    #[error("key failed permanently before: {}", .0.as_deref().unwrap_or("no reason recorded"))]
    FailedBefore(Option<String>),
    /// The key was claimed before with a different body.
    #[error("key was processed before with a different body (payload validation)")]
    PayloadMismatch,
    /// The handler panicked.
    #[error("handler panicked: {0}")]
    Panicked(String),
    /// The claim store failed.
    #[error("claim store error: {0}")]
    Store(String),
    /// The deadline came before the record finished (or started).
    #[error("not finished before the invocation deadline")]
    Deadline,
    /// An earlier record of the same FIFO message group failed.
    #[error("skipped: earlier record {0} of its FIFO message group failed")]
    GroupSkipped(String),
}

impl Failure {
    /// A short label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidRecord(_) => "invalid_record",
            Self::MissingKey(_) => "missing_key",
            Self::Conflict { .. } => "conflict",
            Self::Retryable(_) => "retryable",
            Self::Permanent(_) => "permanent",
            Self::FailedBefore(_) => "failed_before",
            Self::PayloadMismatch => "payload_mismatch",
            Self::Panicked(_) => "panicked",
            Self::Store(_) => "store_error",
            Self::Deadline => "deadline",
            Self::GroupSkipped(_) => "group_skipped",
        }
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Self::Store(error.to_string())
    }
}

/// The fate of one record of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordReport {
    /// The record's message id.
    pub message_id: String,
    /// The stored key, when one was derived.
    pub key: Option<String>,
    /// What happened.
    pub outcome: Outcome,
    /// Time spent on its key (shared by in-batch duplicates).
    pub duration: Duration,
    /// Time the claim took, for the record that made it (in-batch duplicates
    /// and records that never claimed have none).
    pub claim_latency: Option<Duration>,
}

/// The fate of a whole batch, in event order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// One entry per event record.
    pub records: Vec<RecordReport>,
}

impl BatchReport {
    /// The partial-batch response: each failed record's message id, once.
    pub fn response(&self) -> SqsBatchResponse {
        let mut seen = std::collections::HashSet::new();
        let mut response = SqsBatchResponse::default();
        response.batch_item_failures = self
            .records
            .iter()
            .filter(|record| record.outcome.is_failure() && seen.insert(record.message_id.as_str()))
            .map(|record| {
                let mut failure = BatchItemFailure::default();
                failure.item_identifier = record.message_id.clone();
                failure
            })
            .collect();
        response
    }

    /// How many records had each outcome label.
    pub fn counts(&self) -> HashMap<&'static str, usize> {
        let mut counts = HashMap::new();
        for record in &self.records {
            *counts.entry(record.outcome.label()).or_default() += 1;
        }
        counts
    }
}

/// The batch engine. Cheap to clone; build one per process and reuse it.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::{sync::Arc, time::{Duration, SystemTime}};
/// use sqs_once::{
///     Handler, HandlerResult, Record, claim::Claims, engine::{Engine, EngineOptions, Invocation},
///     sqs::event::parse_event, key::KeyDeriver, store::MemoryStore,
/// };
///
/// struct Echo;
/// impl Handler for Echo {
///     async fn handle(&self, _record: &Record) -> HandlerResult { Ok(None) }
/// }
///
/// let claims = Arc::new(Claims::new(Arc::new(MemoryStore::default())));
/// let keys = KeyDeriver::new(Default::default(), "echo", true, Default::default());
/// let engine = Engine::new(Arc::new(Echo), claims, keys, EngineOptions::default());
/// let event = serde_json::json!({"Records": [{"messageId": "m-1", "body": "hi"}]});
/// let invocation = Invocation { deadline: SystemTime::now() + Duration::from_secs(5), request_id: "r-1".into() };
/// let report = engine.process(&parse_event(event).unwrap(), &invocation).await;
/// assert!(report.response().batch_item_failures.is_empty());
/// # });
/// ```
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
    keys: KeyDeriver,
    options: EngineOptions,
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
    /// The handler returned: this is the key's outcome, whether or not the
    /// write that records it is confirmed before the answer is due.
    Returned(Outcome),
}

/// How long the answer waits for cancelled runs to stop: a handler in the
/// middle of a poll finishes it first, and if that poll returns, the
/// handler's outcome counts. Only a handler that blocks its thread longer
/// has its record reported `deadline` while it may still return.
const STOPPING: Duration = Duration::from_millis(100);

/// A key's run in its task, as the answer at the deadline finds it.
struct Started {
    key: String,
    progress: Arc<Mutex<Progress>>,
    task: AbortHandle,
}

/// What the records of one batch share while it runs.
struct BatchState {
    /// Outcome of each record, by event index; `None` until it is known.
    reports: Mutex<Vec<Option<RecordReport>>>,
    started: Mutex<Vec<Started>>,
    permits: Arc<Semaphore>,
    /// No record starts after this instant.
    cutoff: Instant,
    deadline: Instant,
    deadline_ms: u64,
    request_id: Arc<str>,
}

impl Engine {
    /// An engine running `handler` under `claims`, keying records with `keys`.
    pub fn new(handler: BoxHandler, claims: Arc<Claims>, keys: KeyDeriver, options: EngineOptions) -> Self {
        Self { inner: Arc::new(Inner { handler, claims, keys, options }) }
    }

    /// The claim state machine the engine runs on.
    pub fn claims(&self) -> &Arc<Claims> {
        &self.inner.claims
    }

    /// Processes one batch and reports every record's fate, in event order.
    pub async fn process(&self, records: &[EventRecord], invocation: &Invocation) -> BatchReport {
        let remaining = invocation.deadline.duration_since(SystemTime::now()).unwrap_or_default();
        tracing::debug!(records = records.len(), remaining_ms = remaining.as_millis(), "batch received");
        let deadline = Instant::now() + remaining;
        let state = BatchState {
            reports: Mutex::new(vec![None; records.len()]),
            started: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(self.inner.options.concurrency.max(1))),
            cutoff: deadline.checked_sub(self.inner.options.deadline_margin).unwrap_or(deadline),
            deadline,
            deadline_ms: epoch_ms(invocation.deadline),
            request_id: invocation.request_id.as_str().into(),
        };
        let groups = message_groups(records);
        let opened: Vec<Result<Opened<'_>, Failure>> = records.iter().map(|record| self.open(record)).collect();
        // Declared after `state` and `opened`, which the runs borrow.
        let runs: Runs<'_> = Mutex::new(HashMap::new());
        let work = join_all(groups.into_iter().map(|group| self.run_group(records, &opened, group, &state, &runs)));
        if timeout_at(state.cutoff, work).await.is_err() {
            tracing::warn!("deadline margin reached: answering now; records whose handler has not returned fail");
        }
        let returned = cut_off_runs(&state).await;
        let reports = std::mem::take(&mut *lock(&state.reports));
        let report = BatchReport {
            records: records
                .iter()
                .zip(&opened)
                .zip(reports)
                .map(|((record, opened), report)| report.unwrap_or_else(|| self.unanswered(record, opened, &returned)))
                .collect(),
        };
        for (opened, report) in opened.iter().zip(&report.records) {
            let body = opened.as_ref().map_or("", |opened| &opened.body);
            log_record(report, self.inner.options.log_bodies.then_some(body));
        }
        report
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
    /// settling write not confirmed), otherwise a `deadline` failure.
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
                "handler succeeded but its completion was not confirmed before the answer was due: \
                 reported successful; until the write lands the claim stays in progress until its lease ends"
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
        group: Group,
        state: &'a BatchState,
        runs: &Runs<'a>,
    ) {
        let mut failed: Option<&str> = None;
        for index in group.indices {
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

    /// The run of a key: once a concurrency permit is free, it is spawned, so
    /// that records run in parallel on the runtime. Waiting for the permit
    /// first keeps at most `concurrency` records' copies and tasks alive.
    fn start<'a>(&self, message: &'a Opened<'a>, key: String, state: &'a BatchState) -> KeyRun<'a> {
        let engine = self.clone();
        async move {
            let Ok(permit) = Arc::clone(&state.permits).acquire_owned().await else {
                return RunResult::failed(Failure::Deadline);
            };
            if Instant::now() >= state.cutoff {
                return RunResult::failed(Failure::Deadline);
            }
            let record = Record::opened(message, key.clone(), state.deadline);
            let (deadline_ms, holder) = (state.deadline_ms, Arc::clone(&state.request_id));
            let progress = Arc::new(Mutex::new(Progress::Running));
            let run_progress = Arc::clone(&progress);
            let task = tokio::spawn(async move {
                let _permit = permit;
                let started = Instant::now();
                let (outcome, claim_latency) = engine.run_key(&record, deadline_ms, &holder, &run_progress).await;
                RunResult { outcome, duration: started.elapsed(), claim_latency: Some(claim_latency) }
            });
            lock(&state.started).push(Started { key, progress, task: task.abort_handle() });
            task.await.unwrap_or_else(|error| RunResult::failed(Failure::Panicked(error.to_string())))
        }
        .boxed()
        .shared()
    }

    /// Claims the record's key and, if the claim is won, runs the handler and
    /// records how it ended. Also returns how long the claim took.
    async fn run_key(
        &self,
        record: &Record,
        deadline_ms: u64,
        holder: &str,
        progress: &Mutex<Progress>,
    ) -> (Outcome, Duration) {
        let request = ClaimRequest {
            id: &record.key,
            body: &record.body,
            deadline_ms,
            holder,
            attempt: record.receive_count,
            message_id: &record.message_id,
        };
        let started = Instant::now();
        let claim = self.inner.claims.claim(&request).await;
        let claim_latency = started.elapsed();
        (self.after_claim(record, claim, progress).await, claim_latency)
    }

    async fn after_claim(
        &self,
        record: &Record,
        claim: Result<Claim, StoreError>,
        progress: &Mutex<Progress>,
    ) -> Outcome {
        let lease = match claim {
            Ok(Claim::Won(lease)) => lease,
            Ok(Claim::Duplicate { .. }) => return Outcome::Duplicate,
            Ok(Claim::Conflict { retry_after }) => return Outcome::Failed(Failure::Conflict { retry_after }),
            Ok(Claim::FailedBefore { error }) => return Outcome::Failed(Failure::FailedBefore(error)),
            Ok(Claim::PayloadMismatch) => return Outcome::Failed(Failure::PayloadMismatch),
            Err(error) => return Outcome::Failed(error.into()),
        };
        // Called inside the caught future, so that a handler that panics while
        // it builds its future (before its first await) is caught as well.
        let result = AssertUnwindSafe(async { self.inner.handler.handle_boxed(record).await }).catch_unwind().await;
        // No await between the handler's return and this: a run cancelled at
        // the answer either has its handler's outcome here or never returned.
        *lock(progress) = Progress::Returned(unrecorded_outcome(&result));
        self.record_outcome(record, &lease, result).await
    }

    async fn record_outcome(
        &self,
        record: &Record,
        lease: &Lease,
        result: std::thread::Result<crate::HandlerResult>,
    ) -> Outcome {
        let claims = &self.inner.claims;
        match result {
            Ok(Ok(output)) => {
                let recorded = match claims.complete(lease, output.as_ref()).await {
                    Ok(fenced) => fenced == Fenced::Applied,
                    Err(error) => {
                        tracing::error!(
                            message_id = %record.message_id, key = %record.key, %error,
                            "handler succeeded but its completion could not be recorded; \
                             the claim stays in progress until its lease ends"
                        );
                        false
                    }
                };
                Outcome::Processed { recorded }
            }
            Ok(Err(error)) if error.kind() == ErrorKind::Permanent => {
                let reason = error.to_string();
                log_unrecorded(record, claims.fail(lease, &reason).await);
                Outcome::Failed(Failure::Permanent(reason))
            }
            Ok(Err(error)) => {
                log_unrecorded(record, claims.release(lease).await);
                Outcome::Failed(Failure::Retryable(error.to_string()))
            }
            Err(panic) => {
                log_unrecorded(record, claims.release(lease).await);
                Outcome::Failed(Failure::Panicked(panic_message(panic.as_ref())))
            }
        }
    }
}

/// What a handler's result means for its record before the write that
/// records it is confirmed: the answer due at the deadline reports this.
fn unrecorded_outcome(result: &std::thread::Result<crate::HandlerResult>) -> Outcome {
    match result {
        Ok(Ok(_)) => Outcome::Processed { recorded: false },
        Ok(Err(error)) if error.kind() == ErrorKind::Permanent => {
            Outcome::Failed(Failure::Permanent(error.to_string()))
        }
        Ok(Err(error)) => Outcome::Failed(Failure::Retryable(error.to_string())),
        Err(panic) => Outcome::Failed(Failure::Panicked(panic_message(panic.as_ref()))),
    }
}

/// At the answer: runs whose handler has not returned are cancelled (their
/// claims keep their leases, and their records fail `deadline`); runs whose
/// handler returned, also while they were being cancelled, go on with the
/// write that records it, in the background, and their outcome is returned
/// by key.
async fn cut_off_runs(state: &BatchState) -> HashMap<String, Outcome> {
    let started: Vec<Started> = lock(&state.started).drain(..).collect();
    let running = |run: &Started| matches!(*lock(&run.progress), Progress::Running);
    for run in started.iter().filter(|run| running(run)) {
        run.task.abort();
    }
    // A cancelled run stops at its next await; one whose handler is being
    // polled right now finishes that poll first, and may return.
    let waiting = Instant::now();
    while started.iter().any(|run| running(run) && !run.task.is_finished()) && waiting.elapsed() < STOPPING {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    started
        .into_iter()
        .filter_map(|run| match std::mem::take(&mut *lock(&run.progress)) {
            Progress::Returned(outcome) => Some((run.key, outcome)),
            Progress::Running => None,
        })
        .collect()
}

fn log_unrecorded(record: &Record, written: Result<Fenced, StoreError>) {
    if let Err(error) = written {
        tracing::error!(
            message_id = %record.message_id, key = %record.key, %error,
            "could not record the failure; the claim stays in progress until its lease ends"
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
