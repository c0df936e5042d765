//! What became of a batch: each record's [`Outcome`] ([`RecordReport`]),
//! the batch's ([`BatchReport`]), and the partial-batch response SQS acts on.
//!
#![doc = include_str!("../docs/outcomes.md")]

use std::{collections::HashMap, time::Duration};

use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse};

pub mod reason;

/// What became of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and succeeded. `confirmed` is false when the
    /// completed state was not confirmed written (the store failed, the lease
    /// had been taken over, or the answer was due before the store answered);
    /// the record still succeeded and SQS may delete it.
    Processed {
        /// Whether the claim was confirmed completed.
        confirmed: bool,
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
        matches!(self, Self::Processed { confirmed: false })
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
#[non_exhaustive]
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
    /// The record carries an S3 pointer (the Amazon SQS Extended Client's)
    /// whose payload could not be read; another delivery may read it.
    #[error("payload unavailable: {0}")]
    PayloadUnavailable(String),
    /// The deadline came before the record finished (or started).
    #[error("not finished before the invocation deadline")]
    Deadline,
    /// An earlier record of the same FIFO message group failed.
    #[error("skipped: earlier record {0} of its FIFO message group failed")]
    GroupSkipped(String),
    /// The handler staged writes, and their commit was not confirmed when
    /// the answer was due (or failed): it may still land, so the record comes
    /// back once the claim's lease can have ended, to find the claim
    /// completed (a duplicate) or to run and commit once.
    #[error("the handler's transaction was not confirmed committed; delivered again after the lease (in {} ms)", retry_after.as_millis())]
    Uncommitted {
        /// Time until the claim's lease can have ended.
        retry_after: Duration,
    },
    /// The handler's transaction was refused because the claim's lease had
    /// been taken over by another delivery: nothing of this run applied, and
    /// the other holder's run is the one that counts.
    #[error(
        "the claim was taken over after its lease before the handler's transaction committed; nothing of this run applied"
    )]
    LeaseLost,
    /// The handler's one update keeps its key in an item whose window of
    /// kept keys is full: nothing applied, and no such commit into the item
    /// can apply before the window turns, a key memory after it began.
    #[error(
        "{item} keeps as many keys of its window already as an item holds (256): nothing applied; the window turns \
         in {} s, and the record comes back then (or after SQS_ONCE_RETRY_MAX_SECS, if that is sooner); for an \
         item this busy, stage its update without keep_key (a transaction keeps each key in an item of its own)",
        retry_after.as_secs()
    )]
    WindowFull {
        /// The item, described.
        item: String,
        /// Time until the window turns.
        retry_after: Duration,
    },
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
            Self::PayloadUnavailable(_) => "payload_unavailable",
            Self::Deadline => "deadline",
            Self::GroupSkipped(_) => "group_skipped",
            Self::Uncommitted { .. } => "uncommitted",
            Self::LeaseLost => "lease_lost",
            Self::WindowFull { .. } => "window_full",
        }
    }

    /// What a later delivery can make of the record, which decides its
    /// redelivery: a dead-letter queue takes a [`FailureClass::Final`]
    /// failure at once, a back-off delays a [`FailureClass::Transient`]
    /// one, and a [`FailureClass::WaitsFor`] one waits as long as it must.
    pub fn class(&self) -> FailureClass {
        match self {
            Self::Permanent(_)
            | Self::FailedBefore(_)
            | Self::PayloadMismatch
            | Self::InvalidRecord(_)
            | Self::MissingKey(_) => FailureClass::Final,
            Self::Conflict { retry_after }
            | Self::Uncommitted { retry_after }
            | Self::WindowFull { retry_after, .. } => FailureClass::WaitsFor(*retry_after),
            Self::Retryable(_)
            | Self::Panicked(_)
            | Self::Store(_)
            | Self::PayloadUnavailable(_)
            | Self::Deadline
            | Self::LeaseLost => FailureClass::Transient,
            Self::GroupSkipped(_) => FailureClass::Skipped,
        }
    }
}

/// What a later delivery can make of a failed record ([`Failure::class`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureClass {
    /// It fails the same way however often it comes back: the handler said
    /// so, the key's stored outcome is a failure, or the record itself
    /// cannot be run (`permanent`, `failed_before`, `payload_mismatch`,
    /// `invalid_record`, `missing_key`).
    Final,
    /// It cannot succeed for this long: a lease holds the key (another
    /// delivery's claim, or this run's own commit, which may still land:
    /// `conflict`, `uncommitted`), or its item's window of kept keys is
    /// full until it turns (`window_full`). Tried before, it would meet
    /// the same.
    WaitsFor(Duration),
    /// It may succeed when tried again (`retryable`, `panicked`,
    /// `store_error`, `payload_unavailable`, `deadline`, `lease_lost`).
    Transient,
    /// It was not run: an earlier record of its FIFO group failed
    /// (`group_skipped`), and it comes back with that one, in order.
    Skipped,
}

/// The fate of one record of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// The bytes of its payload read from S3, for a record that carried an
    /// S3 pointer (the Amazon SQS Extended Client's).
    pub payload_bytes: Option<u64>,
}

/// The fate of a whole batch, in event order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchReport {
    /// One entry per event record.
    pub records: Vec<RecordReport>,
}

#[cfg(any(test, feature = "testing"))]
impl RecordReport {
    /// A report of `outcome` for `message_id`, with no key, time or payload:
    /// for the tests of what reads reports.
    pub fn of(message_id: impl Into<String>, outcome: Outcome) -> Self {
        Self {
            message_id: message_id.into(),
            key: None,
            outcome,
            duration: Duration::ZERO,
            claim_latency: None,
            payload_bytes: None,
        }
    }
}

#[cfg(any(test, feature = "testing"))]
impl BatchReport {
    /// A batch's report of `records`: for the tests of what reads reports.
    pub fn of(records: Vec<RecordReport>) -> Self {
        Self { records }
    }
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
