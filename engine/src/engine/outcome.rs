//! What a run's end means for its record: the outcome of a claim that was
//! not won, and of a handler's result before the write that records it is
//! confirmed.

use std::time::Duration;

use crate::{
    claim::{Claim, Lease},
    report::{Failure, Outcome, reason},
};
use sqs_once_core::{ErrorKind, HandlerResult, transaction::Staged};

/// The lease of a claim won, or the outcome of one that was not.
pub(super) fn won(claim: Claim) -> Result<Lease, Outcome> {
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
pub(super) fn lease_left(lease: &Lease, now_ms: u64) -> Duration {
    Duration::from_millis(lease.lease_until_ms.saturating_sub(now_ms).max(1000))
}

/// What a handler's return leaves to record under its lease.
pub(super) enum Ending {
    /// It succeeded: its output is completed, or committed with what it
    /// staged.
    Succeeded { output: Option<serde_json::Value>, staged: Staged },
    /// It failed (its error, its panic): a failure record or a release.
    Failed(Failure),
}

/// What a handler's result leaves to record, and what it means for the
/// record until that write is confirmed: the answer due at the deadline
/// reports this. A handler that staged writes has done nothing until they
/// commit. Error texts are capped ([`reason::capped`]).
pub(super) fn ending(
    result: std::thread::Result<HandlerResult>,
    staged: Staged,
    lease: &Lease,
    now_ms: u64,
) -> (Ending, Outcome) {
    let text = |error: &dyn std::fmt::Display| reason::capped(&error.to_string()).into_owned();
    let failure = match result {
        Ok(Ok(output)) => {
            let outcome = match staged.is_empty() {
                true => Outcome::Processed { confirmed: false },
                false => Outcome::Failed(Failure::Uncommitted { retry_after: lease_left(lease, now_ms) }),
            };
            return (Ending::Succeeded { output, staged }, outcome);
        }
        Ok(Err(error)) if error.kind() == ErrorKind::Permanent => Failure::Permanent(text(&error)),
        Ok(Err(error)) => Failure::Retryable(text(&error)),
        Err(panic) => Failure::Panicked(text(&panic_message(panic.as_ref()))),
    };
    (Ending::Failed(failure.clone()), Outcome::Failed(failure))
}

/// The text of a panic's payload.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|message| (*message).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}
