//! Clocks for tests: `ManualClock` steps over leases and expiries without
//! sleeping (the stores' conformance suites use it), `PausedClock` has them
//! pass with tokio's paused time.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use sqs_once_core::clock::{Clock, duration_ms};

/// A clock that only moves when told to, for tests of leases and expiry.
#[derive(Debug, Default)]
pub(crate) struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub(crate) fn new(now_ms: u64) -> Self {
        Self(AtomicU64::new(now_ms))
    }

    /// Moves the clock forward by `by`.
    pub(crate) fn advance(&self, by: Duration) {
        self.0.fetch_add(duration_ms(by), Ordering::SeqCst);
    }

    /// Sets the clock to `now_ms`.
    pub(crate) fn set(&self, now_ms: u64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Epoch milliseconds that move with tokio's clock, for tests in paused
/// time: leases and deadlines pass as the runtime's sleeps do.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct PausedClock(tokio::time::Instant);

#[cfg(test)]
impl PausedClock {
    /// Stands at a fixed epoch time now, and moves with tokio's clock.
    pub(crate) fn starting_now() -> Self {
        Self(tokio::time::Instant::now())
    }

    /// The wall-clock time `from_now` after now, as this clock reads it.
    pub(crate) fn after(&self, from_now: Duration) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + Duration::from_millis(self.now_ms()) + from_now
    }
}

#[cfg(test)]
impl Clock for PausedClock {
    fn now_ms(&self) -> u64 {
        1_800_000_000_000 + duration_ms(self.0.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        clock.advance(Duration::from_secs(2));
        assert_eq!(clock.now_ms(), 3_000);
        clock.set(10);
        assert_eq!(clock.now_ms(), 10);
    }
}
