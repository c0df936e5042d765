//! Wall-clock time as the claim state machine sees it.
//!
//! Claims are judged by timestamps written into the store, so every "now" the
//! state machine uses comes through a [`Clock`]. Production code uses
//! [`SystemClock`]; the engine's tests use clocks of their own, to step over
//! leases and expiries without sleeping.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    /// The current time, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's real-time clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        epoch_ms(SystemTime::now())
    }
}

/// `time` as milliseconds since the Unix epoch (0 for times before it).
pub fn epoch_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map(duration_ms).unwrap_or(0)
}

/// `duration` in whole milliseconds, saturating at `u64::MAX`.
pub fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_reads_epoch_milliseconds() {
        assert!(SystemClock.now_ms() > 1_600_000_000_000);
        assert_eq!(epoch_ms(UNIX_EPOCH - Duration::from_secs(1)), 0, "times before the epoch read 0");
    }
}
