//! What every store holds of claims ([`StoredClaim`]): their states and the
//! change that finishes them. Stores keep them; the engine's claim machine
//! moves claims between the states. (Outbox entries, which stores keep too,
//! are in `outbox_entry`.)

use std::time::Duration;

/// The state of a stored claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimStatus {
    /// A holder is running the handler under a lease.
    InProgress,
    /// The handler succeeded; deliveries until expiry are duplicates.
    Completed,
    /// The handler failed permanently; deliveries until expiry are not run.
    Failed,
}

impl ClaimStatus {
    /// The status as stored (`INPROGRESS` and `COMPLETED` as Powertools writes them).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "INPROGRESS",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
        }
    }

    /// Parses a stored status.
    pub fn parse(stored: &str) -> Option<Self> {
        match stored {
            "INPROGRESS" => Some(Self::InProgress),
            "COMPLETED" => Some(Self::Completed),
            "FAILED" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// One claim, as every store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredClaim {
    /// The stored key: the key prefix and the key, hashed unless
    /// `SQS_ONCE_HASH_KEYS=false`.
    pub id: String,
    /// Where the claim stands.
    pub status: ClaimStatus,
    /// When the record stops counting, epoch seconds (the table's TTL).
    pub expires_at_s: u64,
    /// End of the in-progress lease, epoch milliseconds.
    pub lease_until_ms: Option<u64>,
    /// The holder's random token; the finishing writes are conditioned on it.
    pub token: Option<String>,
    /// Who holds or held the claim (the Lambda request id, or the process).
    pub holder: Option<String>,
    /// The SQS delivery attempt (`ApproximateReceiveCount`) that made the claim.
    pub attempt: Option<u32>,
    /// The SQS message id of the delivery that made the claim; for a failed
    /// claim, also the delivery whose handler failed it (only the holder of
    /// a claim runs its handler).
    pub message_id: Option<String>,
    /// When the claim was made, epoch milliseconds.
    pub claimed_at_ms: Option<u64>,
    /// When the claim last changed, epoch milliseconds.
    pub updated_at_ms: Option<u64>,
    /// SHA-256 of the body, when payload validation is on.
    pub payload_hash: Option<String>,
    /// The handler's output as JSON text, when result storage is on.
    pub result: Option<String>,
    /// Why the claim failed, for [`ClaimStatus::Failed`].
    pub error: Option<String>,
}

impl StoredClaim {
    /// Whether a new claim may replace this record at `now_ms`.
    ///
    /// An in-progress record is free once its lease has ended, whatever its
    /// overall expiry; any other record (and an in-progress one without a
    /// lease, as other tools write them) once its expiry has passed. The
    /// DynamoDB store evaluates the same predicate as a condition expression.
    ///
    /// ```
    /// use sqs_once::store::{ClaimStatus, StoredClaim};
    ///
    /// let claim = StoredClaim {
    ///     id: "orders#o-1".into(),
    ///     status: ClaimStatus::InProgress,
    ///     expires_at_s: 1_000,           // the record's expiry has passed at 2,000 s...
    ///     lease_until_ms: Some(3_000_000), // ...but its lease runs until 3,000 s
    ///     token: Some("t".into()),
    ///     holder: None, attempt: None, message_id: None, claimed_at_ms: None, updated_at_ms: None,
    ///     payload_hash: None, result: None, error: None,
    /// };
    /// assert!(!claim.is_free(2_000_000), "a live lease is never taken over");
    /// assert!(claim.is_free(3_000_001), "an ended lease is");
    ///
    /// let completed = StoredClaim { status: ClaimStatus::Completed, lease_until_ms: None, ..claim };
    /// assert!(!completed.is_free(1_000_999), "remembered through its last second");
    /// assert!(completed.is_free(1_001_000));
    /// ```
    pub fn is_free(&self, now_ms: u64) -> bool {
        match (self.status, self.lease_until_ms) {
            (ClaimStatus::InProgress, Some(lease_until_ms)) => lease_until_ms < now_ms,
            _ => self.expires_at_s < now_ms / 1000,
        }
    }

    /// Whether this is an in-progress claim whose lease has ended at `now_ms`:
    /// work that crashed or timed out.
    pub fn is_stale(&self, now_ms: u64) -> bool {
        self.status == ClaimStatus::InProgress && self.is_free(now_ms)
    }

    /// Time until the key may be claimed again.
    pub fn free_in(&self, now_ms: u64) -> Duration {
        let free_at_ms = match (self.status, self.lease_until_ms) {
            (ClaimStatus::InProgress, Some(lease_until_ms)) => lease_until_ms + 1,
            _ => (self.expires_at_s + 1) * 1000,
        };
        Duration::from_millis(free_at_ms.saturating_sub(now_ms))
    }

    /// This record after `finish`, as every store must write it.
    pub fn apply(&mut self, finish: &Finish) {
        self.status = finish.status;
        self.expires_at_s = finish.expires_at_s;
        self.lease_until_ms = None;
        self.updated_at_ms = Some(finish.finished_at_ms);
        self.result = finish.result.clone();
        self.error = finish.error.clone();
    }
}

/// How a finished claim is recorded by
/// [`ClaimStore::finish`](super::ClaimStore::finish).
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// [`ClaimStatus::Completed`] or [`ClaimStatus::Failed`].
    pub status: ClaimStatus,
    /// New overall expiry, epoch seconds.
    pub expires_at_s: u64,
    /// When the claim finished, epoch milliseconds.
    pub finished_at_ms: u64,
    /// The handler's output as JSON text, when stored.
    pub result: Option<String>,
    /// Why the claim failed, for [`ClaimStatus::Failed`].
    pub error: Option<String>,
}
