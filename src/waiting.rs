//! How a long-running command (`poll`) waits at its start for a service that
//! does not answer yet: a claim table or a queue whose endpoint is still
//! starting (a container beside it, a network coming up) or too loaded to
//! answer within the SDK's timeouts. A service that answers "no" (a missing
//! table or queue, refused credentials) is not waited for: it stops the
//! start at once, naming what is wrong.
//!
//! Once running, the poller already waits out such a service (a failed
//! receive is tried again); refusing to start where it would have run a
//! second later made its supervisor, or its user, do the waiting.

use std::{ops::ControlFlow, time::Duration};

/// The first pause after a call that got no answer.
const FIRST_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause: a service back after minutes is found within this.
const LONGEST_PAUSE: Duration = Duration::from_secs(30);

/// Calls `call` until it breaks, pausing after each call that continues
/// (with the reason no answer came, logged with `what`) 1 s, then twice as
/// long each time, up to 30 s. Whoever awaits it stops it by dropping it
/// (`poll` does, on SIGINT or SIGTERM).
pub(crate) async fn until_answered<T>(what: &str, mut call: impl AsyncFnMut() -> ControlFlow<T, String>) -> T {
    let mut pause = FIRST_PAUSE;
    loop {
        match call().await {
            ControlFlow::Break(answer) => return answer,
            ControlFlow::Continue(reason) => {
                tracing::warn!(%reason, retry_in_s = pause.as_secs(), "{what} does not answer; waiting for it");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waits_longer_each_time_up_to_the_longest_pause_then_returns_the_answer() {
        let started = Instant::now();
        let calls = Mutex::new(Vec::new());
        let answer = until_answered("the queue", async || {
            let mut calls = calls.lock().unwrap();
            calls.push(started.elapsed().as_secs());
            if calls.len() < 8 { ControlFlow::Continue("no answer".into()) } else { ControlFlow::Break(calls.len()) }
        })
        .await;
        assert_eq!(answer, 8);
        // Pauses of 1, 2, 4, 8, 16, 30 and 30 s between the calls.
        assert_eq!(*calls.lock().unwrap(), [0, 1, 3, 7, 15, 31, 61, 91]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_at_once_is_returned_at_once() {
        let started = Instant::now();
        let answer: Result<(), &str> =
            until_answered("the claim table", async || ControlFlow::Break(Err("missing"))).await;
        assert_eq!(answer, Err("missing"));
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
