//! How an invocation spends the time before its deadline.
//!
//! Lambda fails a whole batch that has not answered by the deadline, so the
//! engine plans backwards from it:
//!
//! ```text
//!  start ─────────────── cutoff ──────────── writes_by ──── sqs_by ──── deadline
//!    handlers start        │ no handler starts;    │ the answer   │ the SQS   │
//!                          │ running handlers are  │ is computed; │ step ends;│
//!                          │ cancelled; waiting    │ unconfirmed  │ the answer│
//!                          │ finishing writes go   │ writes go on │ is posted │
//!                          │ out at once           │ in the back- │           │
//!                          │                       │ ground       │           │
//!                          └─ margin (SQS_ONCE_DEADLINE_MARGIN_MS) ───────────┘
//! ```
//!
//! Between the cut-off and `writes_by`, the answer waits for the finishing
//! writes (completion, failure record, release) of handlers that returned:
//! it goes out as soon as every one is confirmed, or at `writes_by`,
//! whichever is first. What the SQS step and the answer itself need is kept
//! back from the margin ([`ANSWER_TIME`], and `SQS_STEP_TIME` when the
//! consumer acts on failed records through SQS).

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use sqs_once_core::clock::epoch_ms;

/// Kept for posting the answer once everything else is done. Measured in
/// `tests/lifecycle.rs`: the answer reaches the Runtime API about 20 ms
/// after `writes_by`, natively and for the arm64 build under emulation; the
/// rest is room for a loaded host.
pub const ANSWER_TIME: Duration = Duration::from_millis(100);

/// Kept for the SQS step (visibility back-off, dead-letter moves) when the
/// consumer has one. Measured: 11 ms for nine visibility changes and a
/// dead-letter move against a local SQS server (moto); in a Region a
/// `ChangeMessageVisibilityBatch` or `SendMessage` answers in tens of
/// milliseconds, so this leaves room for one retry.
pub(crate) const SQS_STEP_TIME: Duration = Duration::from_millis(150);

/// How long a Lambda function shutting down (SIGTERM) spends sending its
/// unconfirmed finishing writes again. Lambda kills the runtime 500 ms after
/// the signal when only internal extensions are registered, and 300 ms after
/// it when external ones are (a monitoring layer): within the shorter, with
/// room for the log line and the exit.
pub const SHUTDOWN_TIME: Duration = Duration::from_millis(250);

/// How long `invoke` and `poll` wait, as they leave, for unconfirmed
/// finishing writes sent again: a few of the SDK's attempts.
pub const LEAVING_TIME: Duration = Duration::from_secs(5);

/// How every invocation's budget is planned: the margin before the
/// deadline, and whether an SQS step follows the engine (it then keeps
/// `SQS_STEP_TIME` of the margin besides [`ANSWER_TIME`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Margins {
    /// Before the deadline by this much, no record starts and handlers still
    /// running are cancelled (`SQS_ONCE_DEADLINE_MARGIN_MS`).
    pub deadline_margin: Duration,
    /// Whether the SQS step (back-off, dead-letter moves) follows the engine.
    pub sqs_step: bool,
}

impl Default for Margins {
    fn default() -> Self {
        Self { deadline_margin: Duration::from_millis(500), sqs_step: false }
    }
}

impl Margins {
    /// The budget of an invocation due at `deadline`, planned at `now_ms`
    /// (epoch milliseconds, from the consumer's clock). The deadline is a
    /// wall-clock time and the plan's instants are the runtime's, so the time
    /// left is read from the same clock as the leases.
    pub(crate) fn budget(&self, deadline: SystemTime, now_ms: u64) -> DeadlineBudget {
        let remaining = Duration::from_millis(epoch_ms(deadline).saturating_sub(now_ms));
        let reserve = if self.sqs_step { ANSWER_TIME + SQS_STEP_TIME } else { ANSWER_TIME };
        DeadlineBudget::new(Instant::now() + remaining, self.deadline_margin, reserve)
    }
}

/// The deadline of one invocation and the instants planned back from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlineBudget {
    deadline: Instant,
    margin: Duration,
    reserve: Duration,
}

impl DeadlineBudget {
    /// The budget of an invocation due at `deadline`: handlers stop
    /// `margin` before it, finishing writes are waited for until `reserve`
    /// before it. A reserve larger than the margin is cut to it.
    pub(crate) fn new(deadline: Instant, margin: Duration, reserve: Duration) -> Self {
        Self { deadline, margin, reserve: reserve.min(margin) }
    }

    /// When the answer is due.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// No handler starts after this, and handlers still running are cancelled.
    pub fn cutoff(&self) -> Instant {
        self.before_deadline(self.margin)
    }

    /// Finishing writes of handlers that returned are waited for until this.
    pub fn writes_by(&self) -> Instant {
        self.before_deadline(self.reserve)
    }

    /// The SQS step that follows the engine ends by this.
    pub fn sqs_by(&self) -> Instant {
        self.before_deadline(ANSWER_TIME.min(self.reserve))
    }

    /// Time left until `writes_by`.
    pub(crate) fn writes_left(&self) -> Duration {
        self.writes_by().saturating_duration_since(Instant::now())
    }

    fn before_deadline(&self, by: Duration) -> Instant {
        self.deadline.checked_sub(by).unwrap_or(self.deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_cuts_off_before_it_writes_and_writes_before_the_deadline() {
        let budget =
            DeadlineBudget::new(Instant::now() + Duration::from_secs(3), Duration::from_millis(500), ANSWER_TIME);
        assert!(budget.cutoff() < budget.writes_by() && budget.writes_by() < budget.deadline());
        assert_eq!(budget.deadline() - budget.cutoff(), Duration::from_millis(500));
        assert_eq!(budget.deadline() - budget.writes_by(), ANSWER_TIME);
    }

    #[test]
    fn the_sqs_step_takes_its_share_of_the_margin() {
        let margins = Margins { deadline_margin: Duration::from_millis(500), sqs_step: true };
        let now = SystemTime::now();
        let budget = margins.budget(now + Duration::from_secs(3), epoch_ms(now));
        assert_eq!(budget.deadline() - budget.writes_by(), Duration::from_millis(250));
    }
}
