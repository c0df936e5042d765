//! When a failed record comes back, or whether it leaves for the
//! dead-letter queue: the decision, which the consumer carries out through
//! SQS after each batch's answer, and which a simulated queue takes as the
//! real one does.
//!
//! Listing a record in `batchItemFailures` makes SQS deliver it again after
//! the queue's visibility timeout, every time, until `maxReceiveCount` moves
//! it to the dead-letter queue. That timing suits no failure: a conflict can
//! be retried as soon as the other holder's lease can end, a retryable error
//! wants exponential back-off, and a permanent failure should not come back
//! at all. So a [`RedeliveryPolicy`] says, for each failed record:
//!
//! - a **conflict** becomes visible again when the lease can have ended;
//! - a **retryable** failure (handler error, panic, store error, deadline)
//!   becomes visible after `min(max, base × 2^(receiveCount − 1))`;
//! - a **permanent** failure goes to the dead-letter queue, if there is one.
//!
//! Both delays get up to a fifth (plus one second) of random jitter
//! ([`jittered`]), so records failed together do not return together.
//! Records of FIFO queues keep the queue's visibility timeout: SQS holds
//! back a message group while any of its messages is in flight, so the rest
//! of the group (failed behind the first failure) would keep the group
//! blocked anyway, and shortening some of a group's timeouts but not others
//! buys nothing for the risk of reordering on a partial failure.
//!
//! ```
//! use std::time::Duration;
//! use sqs_once_engine::{
//!     redelivery::{NextDelivery, RedeliveryPolicy},
//!     report::Failure,
//! };
//!
//! let policy = RedeliveryPolicy::default();
//! let failure = Failure::Retryable("the payment service timed out".into());
//! // Five seconds after the first receive, twenty after the third, at most fifteen minutes.
//! assert_eq!(policy.next_delivery(&failure, 3, false), NextDelivery::After(Duration::from_secs(20)));
//! // A queue whose visibility timeout is three minutes: keys outlive the longest delay with its jitter.
//! assert_eq!(policy.redelivered_within(Duration::from_secs(180)), Duration::from_secs(1_081));
//! ```

use std::time::Duration;

use crate::{
    engine::{ClaimPolicy, jitter_spread},
    report::{Failure, FailureClass},
};

/// Exponential back-off of retryable failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBackoff {
    /// Delay after the first delivery (`SQS_ONCE_RETRY_BASE_SECS`).
    pub base: Duration,
    /// Longest delay (`SQS_ONCE_RETRY_MAX_SECS`).
    pub max: Duration,
}

impl Default for RetryBackoff {
    fn default() -> Self {
        Self { base: Duration::from_secs(5), max: Duration::from_secs(900) }
    }
}

impl RetryBackoff {
    /// `min(max, base × 2^(receive_count − 1))`.
    pub fn delay(&self, receive_count: u32) -> Duration {
        let doublings = receive_count.saturating_sub(1).min(31);
        self.base.saturating_mul(1 << doublings).min(self.max)
    }
}

/// What to do with failed records besides reporting them. The default is
/// the settings' default: conflicts and retryable failures backed off, no
/// dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedeliveryPolicy {
    /// Make a conflicting record visible when the lease can have ended
    /// (`SQS_ONCE_CONFLICT_BACKOFF`), after `longest_delay` at most.
    pub conflict_backoff: bool,
    /// The longest the policy keeps any record away, before jitter
    /// (`SQS_ONCE_RETRY_MAX_SECS`, the retry back-off's ceiling too): it
    /// bounds how long keys must be remembered (see
    /// [`redelivered_within`](Self::redelivered_within)).
    pub longest_delay: Duration,
    /// Back off retryable failures; `None` leaves them to the queue.
    pub retry_backoff: Option<RetryBackoff>,
    /// The queue that takes permanent failures (`SQS_ONCE_DLQ_URL`).
    pub dead_letter_queue: Option<String>,
}

/// What becomes of one failed record.
///
/// Open to exhaustive matches: whoever carries the decision out acts on
/// each, so a new one is a breaking change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextDelivery {
    /// The queue's own visibility timeout applies.
    AsQueued,
    /// It becomes visible again after at least this long.
    After(Duration),
    /// It moves to the dead-letter queue.
    DeadLetter,
}

impl Default for RedeliveryPolicy {
    fn default() -> Self {
        let backoff = RetryBackoff::default();
        Self {
            conflict_backoff: true,
            longest_delay: backoff.max,
            retry_backoff: Some(backoff),
            dead_letter_queue: None,
        }
    }
}

impl RedeliveryPolicy {
    /// A policy that asks nothing of SQS: failed records come back after
    /// the queue's visibility timeout.
    pub fn none() -> Self {
        Self { conflict_backoff: false, retry_backoff: None, dead_letter_queue: None, ..Self::default() }
    }

    /// Whether the policy asks anything of SQS.
    pub fn is_active(&self) -> bool {
        self.conflict_backoff || self.retry_backoff.is_some() || self.dead_letter_queue.is_some()
    }

    /// The longest a failed record stays away before SQS delivers it again,
    /// on a queue whose visibility timeout is `visibility_timeout`: that
    /// timeout (SQS's own redelivery, which also applies when a visibility
    /// change fails), or the longest delay the policy sets, jitter
    /// included, whichever is longer. Keys are remembered past it
    /// ([`ClaimPolicy::redelivered_within`]).
    pub fn redelivered_within(&self, visibility_timeout: Duration) -> Duration {
        let backs_off = self.conflict_backoff || self.retry_backoff.is_some();
        ClaimPolicy::redelivery_window(visibility_timeout, backs_off.then_some(self.longest_delay))
    }

    /// The next delivery of a record that failed with `failure`, before jitter.
    pub fn next_delivery(&self, failure: &Failure, receive_count: u32, fifo: bool) -> NextDelivery {
        match failure.class() {
            FailureClass::Final if self.dead_letter_queue.is_some() => NextDelivery::DeadLetter,
            _ if fifo => NextDelivery::AsQueued,
            // Each waits for a lease (another holder's, or the one whose commit may still land), or a window's turn.
            FailureClass::WaitsFor(retry_after) if self.conflict_backoff => {
                NextDelivery::After(retry_after.min(self.longest_delay))
            }
            FailureClass::Transient => self
                .retry_backoff
                .map_or(NextDelivery::AsQueued, |backoff| NextDelivery::After(backoff.delay(receive_count))),
            _ => NextDelivery::AsQueued,
        }
    }
}

/// `delay` plus `fraction` (0 to 1, drawn at random) of its jitter's
/// spread: up to a fifth of it, and up to one second more, so that records
/// failed together do not come back together.
pub fn jittered(delay: Duration, fraction: f64) -> Duration {
    delay + jitter_spread(delay).mul_f64(fraction.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RedeliveryPolicy {
        RedeliveryPolicy {
            conflict_backoff: true,
            longest_delay: Duration::from_secs(30),
            retry_backoff: Some(RetryBackoff { base: Duration::from_secs(2), max: Duration::from_secs(30) }),
            dead_letter_queue: Some("https://sqs.us-east-1.amazonaws.com/1/dlq".into()),
        }
    }

    #[test]
    fn no_record_is_kept_away_longer_than_the_keys_are_remembered_past_their_lease() {
        let policy = policy();
        // A conflict with a lease of an hour comes back after the longest delay, not the lease.
        let conflict = Failure::Conflict { retry_after: Duration::from_secs(3_600) };
        assert_eq!(policy.next_delivery(&conflict, 1, false), NextDelivery::After(Duration::from_secs(30)));
        let retryable = Failure::Retryable("again".into());
        assert_eq!(policy.next_delivery(&retryable, 20, false), NextDelivery::After(Duration::from_secs(30)));
        // Whichever is longer: the longest delay with its jitter (30 s + 6 s + 1 s), or the queue's own timeout.
        assert_eq!(policy.redelivered_within(Duration::from_secs(20)), Duration::from_secs(37));
        assert_eq!(policy.redelivered_within(Duration::from_secs(180)), Duration::from_secs(180));
        let most = jittered(Duration::from_secs(30), 1.0);
        assert_eq!(most, policy.redelivered_within(Duration::ZERO), "the longest delay, its jitter whole");
        // A policy that asks nothing of SQS leaves the queue's timeout alone.
        assert_eq!(RedeliveryPolicy::none().redelivered_within(Duration::from_secs(20)), Duration::from_secs(20));
    }

    #[test]
    fn each_failure_has_its_next_delivery() {
        let policy = policy();
        let after = |secs| NextDelivery::After(Duration::from_secs(secs));
        let conflict = Failure::Conflict { retry_after: Duration::from_secs(7) };
        assert_eq!(policy.next_delivery(&conflict, 3, false), after(7));
        for retryable in [
            Failure::Retryable("x".into()),
            Failure::Panicked("x".into()),
            Failure::Store("x".into()),
            Failure::Deadline,
        ] {
            assert_eq!(policy.next_delivery(&retryable, 1, false), after(2), "{retryable:?}");
            assert_eq!(policy.next_delivery(&retryable, 4, false), after(16), "{retryable:?}");
            assert_eq!(policy.next_delivery(&retryable, 5, false), after(30), "{retryable:?}");
            assert_eq!(policy.next_delivery(&retryable, 2, true), NextDelivery::AsQueued, "{retryable:?}");
        }
        for permanent in [
            Failure::Permanent("x".into()),
            Failure::FailedBefore(None),
            Failure::PayloadMismatch,
            Failure::InvalidRecord("x".into()),
            Failure::MissingKey("x".into()),
        ] {
            assert_eq!(policy.next_delivery(&permanent, 1, false), NextDelivery::DeadLetter, "{permanent:?}");
            assert_eq!(policy.next_delivery(&permanent, 1, true), NextDelivery::DeadLetter, "{permanent:?}");
        }
        let skipped = Failure::GroupSkipped("m-1".into());
        assert_eq!(policy.next_delivery(&skipped, 1, true), NextDelivery::AsQueued);
    }

    #[test]
    fn switched_off_parts_leave_records_to_the_queue() {
        let policy = RedeliveryPolicy::none();
        assert!(!policy.is_active());
        let conflict = Failure::Conflict { retry_after: Duration::from_secs(7) };
        assert_eq!(policy.next_delivery(&conflict, 1, false), NextDelivery::AsQueued);
        assert_eq!(policy.next_delivery(&Failure::Retryable("x".into()), 1, false), NextDelivery::AsQueued);
        assert_eq!(policy.next_delivery(&Failure::Permanent("x".into()), 1, false), NextDelivery::AsQueued);
    }

    #[test]
    fn back_off_saturates_instead_of_overflowing() {
        let backoff = RetryBackoff { base: Duration::from_secs(3600), max: Duration::from_secs(43_200) };
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(43_200));
        assert_eq!(backoff.delay(0), Duration::from_secs(3600));
    }

    #[test]
    fn a_conflict_comes_back_when_the_lease_ends_unless_fifo() {
        let policy = RedeliveryPolicy { conflict_backoff: true, ..RedeliveryPolicy::none() };
        let conflict = Failure::Conflict { retry_after: Duration::from_secs(4) };
        assert_eq!(policy.next_delivery(&conflict, 1, false), NextDelivery::After(Duration::from_secs(4)));
        // FIFO records keep the queue's timing.
        assert_eq!(policy.next_delivery(&conflict, 1, true), NextDelivery::AsQueued);
    }

    #[test]
    fn retries_back_off_exponentially_up_to_the_maximum() {
        let backoff = RetryBackoff { base: Duration::from_secs(5), max: Duration::from_secs(60) };
        assert_eq!(backoff.delay(1), Duration::from_secs(5));
        assert_eq!(backoff.delay(3), Duration::from_secs(20));
        assert_eq!(backoff.delay(40), Duration::from_secs(60));
    }
}
