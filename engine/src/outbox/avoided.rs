//! Destinations a batch's sweep leaves alone for a while: those that
//! answered too slowly for a batch (a send cut at its answer) or failed.
//!
//! A sweep beside a batch sends what others left unsent while the batch's
//! own records run; a send still in flight when they are done is cut, since
//! the answer must not wait for it. Started again by every batch, a slow
//! destination's sends would be cut every time (and may each arrive, a copy
//! with the same outbox id). So the process learns the destination, and
//! its batches' sweeps take none of its entries for [`AVOIDED_FOR`]: the
//! schedule's sweep (the outbox sweep event, with the whole invocation to
//! send in), `claims outbox --send`, a process that is never frozen, and
//! the runs' own messages still send to it, and a quick answer from it to
//! any of them ends the avoidance at once.

use std::{collections::HashMap, time::Duration};

use parking_lot::Mutex;
use tokio::time::Instant;

/// How long batches' sweeps avoid a destination learnt slow or failing: the
/// template's default sweep schedule, so that its sweep has tried it again
/// by the time batches do.
pub(crate) const AVOIDED_FOR: Duration = super::SCHEDULE_PERIOD;

/// A send answered within this is quick: the destination is healthy again.
/// The least time a send starts in before a batch's answer.
pub(super) const QUICK_SEND: Duration = super::LEAST_SEND_WINDOW;

/// The destinations avoided now, each until when.
#[derive(Debug, Default)]
pub(super) struct Avoided {
    until: Mutex<HashMap<String, Instant>>,
}

impl Avoided {
    /// Batches' sweeps leave `destination` alone from now for [`AVOIDED_FOR`].
    pub(super) fn avoid(&self, destination: &str) {
        self.until.lock().insert(destination.to_owned(), Instant::now() + AVOIDED_FOR);
    }

    /// A send to `destination` succeeded in `took`: quick, it ends the avoidance.
    pub(super) fn answered(&self, destination: &str, took: Duration) {
        if took <= QUICK_SEND {
            self.until.lock().remove(destination);
        }
    }

    /// Whether batches' sweeps leave `destination` alone now.
    pub(super) fn avoids(&self, destination: &str) -> bool {
        let mut until = self.until.lock();
        match until.get(destination) {
            Some(ends) if *ends > Instant::now() => true,
            Some(_) => {
                until.remove(destination);
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_destination_is_avoided_until_its_time_ends_or_it_answers_quickly() {
        let avoided = Avoided::default();
        assert!(!avoided.avoids("q"));
        avoided.avoid("q");
        assert!(avoided.avoids("q") && !avoided.avoids("other"));
        avoided.answered("q", QUICK_SEND * 2);
        assert!(avoided.avoids("q"), "a slow answer is no sign of health");
        tokio::time::sleep(AVOIDED_FOR).await;
        assert!(!avoided.avoids("q"), "tried again once its time ends");
        avoided.avoid("q");
        avoided.answered("q", QUICK_SEND);
        assert!(!avoided.avoids("q"), "a quick answer ends it");
    }
}
