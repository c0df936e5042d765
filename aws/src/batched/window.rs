//! How many requests of a kind are on the wire at once, found from what the
//! store answers rather than fixed.
//!
//! The rule is TCP Vegas's: the fastest answer seen is what an idle store
//! costs, and an answer slower than that, times the requests out, estimates
//! how many of them are queued inside the store. Fewer than one queued and
//! calls waiting for a slot: one more slot. More than three queued: one
//! fewer. The store throttling or failing (or a request left unanswered past
//! [`BatchCall::SLOW_AFTER`](super::BatchCall::SLOW_AFTER)): half the slots,
//! at most once per round trip, as TCP halves its window on a loss; never
//! fewer than two.
//!
//! A request of 25 statements takes longer than one of a single statement
//! without anything queued, so answers are compared with the fastest answer
//! to a request at least as large (by size class, powers of two).

use parking_lot::Mutex;
use std::{sync::Arc, time::Duration};

use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

/// Estimated requests queued in the store below which the window grows
/// (when calls are waiting for a slot), and above which it shrinks.
const GROW_BELOW: f64 = 1.0;
const SHRINK_ABOVE: f64 = 3.0;
/// Answers after which the fastest answers seen are forgotten, so that the
/// baseline can rise when the store moves further away or gets slower.
const PERIOD: u32 = 256;
/// Slots kept however the store answers. With two, a request whose answer
/// is lost or held does not stop every call of its kind until
/// [`BatchCall::SLOW_AFTER`](super::BatchCall::SLOW_AFTER) frees its slot:
/// under faults, one request of two is still moving.
const FEWEST: usize = 2;
/// Request size classes: 1, 2, 3–4, 5–8, … up to 128 and above.
const CLASSES: usize = 8;

/// Slots for requests: a semaphore whose size follows the store's answers.
#[derive(Debug)]
pub(super) struct Window {
    semaphore: Arc<Semaphore>,
    state: Mutex<State>,
    min: usize,
    max: usize,
}

#[derive(Debug)]
struct State {
    /// Requests allowed on the wire at once.
    limit: usize,
    /// Permits to forget as they come back: the limit shrank below the
    /// requests that were out.
    owed: usize,
    /// The fastest answer per size class, over this period and the last.
    fastest: [Option<Duration>; CLASSES],
    fastest_this_period: [Option<Duration>; CLASSES],
    answers_this_period: u32,
    /// When the window was last halved: once per round trip at most.
    halved_at: Option<Instant>,
}

/// What a request's answer says about the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Signal {
    /// Answered; `pressed` when calls were waiting for a slot as it went out.
    Answered {
        /// Calls were left waiting when the request went out.
        pressed: bool,
    },
    /// Throttled, failed, or not answered in time.
    Congested,
}

/// A request's place in the window, given back when it is dropped.
#[derive(Debug)]
pub(super) struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    window: Arc<Window>,
    sent: Instant,
    size: usize,
}

impl Window {
    /// A window of `first` slots, never more than `max` (nor fewer than
    /// two, or `max` if that is less).
    pub(super) fn new(first: usize, max: usize) -> Arc<Self> {
        let max = max.max(1);
        let min = FEWEST.min(max);
        let first = first.clamp(min, max);
        let state = State {
            limit: first,
            owed: 0,
            fastest: [None; CLASSES],
            fastest_this_period: [None; CLASSES],
            answers_this_period: 0,
            halved_at: None,
        };
        Arc::new(Self { semaphore: Arc::new(Semaphore::new(first)), state: Mutex::new(state), min, max })
    }

    /// Waits for a free slot.
    pub(super) async fn slot(self: &Arc<Self>) -> Slot {
        // The semaphore is never closed, so this waits for a permit and gets it.
        let permit = Arc::clone(&self.semaphore).acquire_owned().await.ok();
        self.slot_of(permit)
    }

    /// A free slot, if there is one now.
    pub(super) fn try_slot(self: &Arc<Self>) -> Option<Slot> {
        Arc::clone(&self.semaphore).try_acquire_owned().ok().map(|permit| self.slot_of(Some(permit)))
    }

    fn slot_of(self: &Arc<Self>, permit: Option<OwnedSemaphorePermit>) -> Slot {
        Slot { permit, window: Arc::clone(self), sent: Instant::now(), size: 0 }
    }

    /// Requests allowed on the wire at once now.
    pub(super) fn limit(&self) -> usize {
        self.state.lock().limit
    }

    fn learn(&self, size: usize, latency: Duration, signal: Signal) {
        let mut state = self.state.lock();
        let class = class(size);
        let fastest_now = &mut state.fastest_this_period[class];
        *fastest_now = Some(fastest_now.map_or(latency, |fastest| fastest.min(latency)));
        state.answers_this_period += 1;
        if state.answers_this_period >= PERIOD {
            state.fastest = std::mem::take(&mut state.fastest_this_period);
            state.answers_this_period = 0;
        }
        let idle = state.fastest[class..]
            .iter()
            .chain(&state.fastest_this_period[class..])
            .flatten()
            .min()
            .copied()
            .unwrap_or(latency);
        match signal {
            Signal::Congested => {
                if state.halved_at.is_none_or(|at| at.elapsed() >= latency) {
                    state.halved_at = Some(Instant::now());
                    let half = state.limit / 2;
                    self.shrink(&mut state, half);
                }
            }
            Signal::Answered { pressed } => {
                let queued = state.limit as f64 * (1.0 - idle.as_secs_f64() / latency.as_secs_f64().max(1e-9));
                if queued < GROW_BELOW && pressed && state.limit < self.max {
                    self.grow(&mut state);
                } else if queued > SHRINK_ABOVE {
                    self.shrink(&mut state, 1);
                }
            }
        }
    }

    fn grow(&self, state: &mut State) {
        state.limit += 1;
        if state.owed > 0 {
            state.owed -= 1;
        } else {
            self.semaphore.add_permits(1);
        }
    }

    /// Takes `by` slots away, keeping the fewest: free permits at once, the
    /// others as the requests holding them give them back.
    fn shrink(&self, state: &mut State, by: usize) {
        let by = by.min(state.limit.saturating_sub(self.min));
        state.limit -= by;
        let forgotten = self.semaphore.forget_permits(by);
        state.owed += by - forgotten;
    }

    fn give_back(&self, permit: OwnedSemaphorePermit) {
        let mut state = self.state.lock();
        if state.owed > 0 {
            state.owed -= 1;
            permit.forget();
        }
    }
}

impl Slot {
    /// A slot taken without waiting for the window (an answer is due): it
    /// holds no permit and teaches the window nothing.
    pub(super) fn outside(window: &Arc<Window>) -> Self {
        window.slot_of(None)
    }

    /// Requests its window allows on the wire at once now.
    pub(super) fn limit(&self) -> usize {
        self.window.limit()
    }

    /// The request of `size` calls goes out now.
    pub(super) fn sent(&mut self, size: usize) {
        self.sent = Instant::now();
        self.size = size;
    }

    /// The request was answered (or was not in time): the window learns from
    /// it, and the slot is free.
    pub(super) fn done(self, signal: Signal) {
        if self.permit.is_some() {
            self.window.learn(self.size, self.sent.elapsed(), signal);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.window.give_back(permit);
        }
    }
}

/// The size class of a request of `size` calls.
fn class(size: usize) -> usize {
    (usize::BITS - size.saturating_sub(1).leading_zeros()).min(CLASSES as u32 - 1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRESSED: Signal = Signal::Answered { pressed: true };
    const IDLE: Signal = Signal::Answered { pressed: false };

    fn answer(window: &Window, size: usize, millis: u64, signal: Signal) {
        window.learn(size, Duration::from_millis(millis), signal);
    }

    #[test]
    fn size_classes_are_powers_of_two() {
        let classes: Vec<usize> = [1, 2, 3, 4, 5, 8, 9, 25, 100, 1000].into_iter().map(class).collect();
        assert_eq!(classes, [0, 1, 2, 2, 3, 3, 4, 5, 7, 7]);
    }

    #[test]
    fn grows_while_answers_stay_fast_and_calls_wait() {
        let window = Window::new(2, 16);
        for _ in 0..10 {
            answer(&window, 25, 20, PRESSED);
        }
        assert_eq!(window.limit(), 12);
        for _ in 0..10 {
            answer(&window, 25, 20, PRESSED);
        }
        assert_eq!(window.limit(), 16, "never above its maximum");
    }

    #[test]
    fn does_not_grow_without_calls_waiting() {
        let window = Window::new(2, 16);
        for _ in 0..10 {
            answer(&window, 25, 20, IDLE);
        }
        assert_eq!(window.limit(), 2);
    }

    #[test]
    fn stops_growing_when_answers_slow_and_shrinks_when_requests_queue() {
        let window = Window::new(4, 16);
        answer(&window, 25, 10, PRESSED);
        assert_eq!(window.limit(), 5);
        // 5 × (1 − 10/15) ≈ 1.7 queued: held.
        answer(&window, 25, 15, PRESSED);
        assert_eq!(window.limit(), 5);
        // 5 × (1 − 10/40) = 3.75 queued: one fewer, then 4 × 0.75 = 3: held.
        answer(&window, 25, 40, PRESSED);
        answer(&window, 25, 40, PRESSED);
        assert_eq!(window.limit(), 4);
    }

    #[test]
    fn a_full_request_is_not_compared_with_a_lone_call() {
        let window = Window::new(4, 16);
        answer(&window, 1, 2, IDLE);
        // Eight times the lone call's time, but the first of its size: nothing queued.
        answer(&window, 25, 16, PRESSED);
        assert_eq!(window.limit(), 5);
    }

    #[test]
    fn halves_on_congestion_once_per_round_trip_and_keeps_two_slots() {
        let window = Window::new(8, 16);
        answer(&window, 25, 10, Signal::Congested);
        assert_eq!(window.limit(), 4);
        // Within the same round trip: the same congestion, not a new one.
        answer(&window, 25, 10_000, Signal::Congested);
        assert_eq!(window.limit(), 4);
        let window = Window::new(3, 16);
        answer(&window, 25, 10, Signal::Congested);
        assert_eq!(window.limit(), 2);
        answer(&window, 25, 10_000, Signal::Congested);
        assert_eq!(window.limit(), 2);
        assert_eq!(Window::new(1, 16).limit(), 2);
        assert_eq!(Window::new(4, 1).limit(), 1, "never above its maximum");
    }

    #[tokio::test]
    async fn a_smaller_window_takes_its_slots_back_as_requests_return_them() {
        let window = Window::new(4, 16);
        let slots: Vec<Slot> = futures::future::join_all((0..4).map(|_| window.slot())).await;
        assert!(window.try_slot().is_none());
        // Halved while all four are out: two of them are not given back.
        answer(&window, 25, 10, Signal::Congested);
        drop(slots);
        let held: Vec<Slot> = std::iter::from_fn(|| window.try_slot()).take(10).collect();
        assert_eq!(held.len(), 2);
        drop(held);
        // And growing again gives them back one by one.
        answer(&window, 25, 10, PRESSED);
        let held: Vec<Slot> = std::iter::from_fn(|| window.try_slot()).take(10).collect();
        assert_eq!(held.len(), 3);
    }

    #[tokio::test]
    async fn a_slot_outside_the_window_teaches_nothing() {
        let window = Window::new(2, 16);
        for _ in 0..5 {
            let mut slot = Slot::outside(&window);
            slot.sent(25);
            slot.done(Signal::Congested);
        }
        assert_eq!(window.limit(), 2);
    }
}
