//! An SQS queue as consumers meet it: messages hidden while a consumer
//! holds them, back after their visibility timeout or when reported failed,
//! deleted on success, moved to the dead-letter queue after too many
//! receives. A standard queue now and then delivers a message twice: to two
//! consumers at once, or once more after a success. A FIFO queue delivers a
//! message group's messages in order, none while an earlier one of the
//! group is held, and no copies.

use std::time::Duration;

use crate::report::{Failure, Outcome};

/// Receives after which a message moves to the dead-letter queue.
const MAX_RECEIVES: u32 = 40;

/// Where a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Still to be processed.
    Live,
    /// Deleted after a success.
    Done,
    /// Moved to the dead-letter queue.
    DeadLettered,
}

#[derive(Debug)]
struct Queued {
    message_id: String,
    body: String,
    group: Option<String>,
    visible_at_ms: u64,
    receives: u32,
    fate: Fate,
    /// A copy to deliver once more after the message was deleted.
    copy_at_ms: Option<u64>,
}

impl Queued {
    fn visible(&self, now_ms: u64) -> bool {
        self.fate == Fate::Live && self.visible_at_ms <= now_ms
    }
}

/// One delivery of a message.
#[derive(Debug, Clone)]
pub(super) struct Delivery {
    pub message_id: String,
    pub body: String,
    /// The message group, on a FIFO queue.
    pub group: Option<String>,
    pub receive_count: u32,
}

/// The queue, its messages in the order they were sent.
#[derive(Debug, Default)]
pub(super) struct Queue {
    messages: Vec<Queued>,
}

impl Queue {
    /// Sends a message (of `group`, on a FIFO queue).
    pub(super) fn push(&mut self, message_id: String, body: String, group: Option<String>, now_ms: u64) {
        let queued =
            Queued { message_id, body, group, visible_at_ms: now_ms, receives: 0, fate: Fate::Live, copy_at_ms: None };
        self.messages.push(queued);
    }

    /// Up to `max` visible messages, hidden for `visibility` from now; with
    /// `copied`, the first stays visible as well (SQS delivers a copy to
    /// another consumer). Copies of deleted messages come back once. A
    /// message of a group is delivered only once every earlier message of
    /// its group is settled, or comes in the same batch.
    pub(super) fn receive(&mut self, max: usize, now_ms: u64, visibility: Duration, copied: bool) -> Vec<Delivery> {
        let hidden_until = now_ms + u64::try_from(visibility.as_millis()).unwrap_or(u64::MAX);
        let mut blocked: Vec<String> = Vec::new();
        let mut deliveries = Vec::new();
        for queued in &mut self.messages {
            if deliveries.len() == max {
                break;
            }
            let copy_due = queued.copy_at_ms.is_some_and(|at| at <= now_ms);
            let visible = queued.visible(now_ms);
            if let Some(group) = &queued.group {
                if blocked.contains(group) {
                    continue;
                }
                if queued.fate == Fate::Live && !visible {
                    // Held, or come back later: the rest of its group waits.
                    blocked.push(group.clone());
                    continue;
                }
            }
            if !visible && !copy_due {
                continue;
            }
            queued.receives += 1;
            if copy_due {
                queued.copy_at_ms = None;
            } else if !(copied && deliveries.is_empty()) {
                queued.visible_at_ms = hidden_until;
            }
            deliveries.push(Delivery {
                message_id: queued.message_id.clone(),
                body: queued.body.clone(),
                group: queued.group.clone(),
                receive_count: queued.receives,
            });
        }
        deliveries
    }

    /// When a message not visible now becomes visible (or its copy comes),
    /// if one ever does.
    pub(super) fn next_visible_at(&self, now_ms: u64) -> Option<u64> {
        self.messages
            .iter()
            .filter_map(|queued| match queued.fate {
                Fate::Live if queued.visible_at_ms > now_ms => Some(queued.visible_at_ms),
                _ => queued.copy_at_ms.filter(|at| *at > now_ms),
            })
            .min()
    }

    /// What a consumer reported for a delivery: a success deletes the
    /// message (a copy may come back at `copy_at_ms`), a failure makes it
    /// visible when the engine said it could succeed, or moves it to the
    /// dead-letter queue after too many receives.
    pub(super) fn settle(&mut self, message_id: &str, outcome: &Outcome, now_ms: u64, copy_at_ms: Option<u64>) {
        let Some(queued) = self.messages.iter_mut().find(|queued| queued.message_id == message_id) else { return };
        if queued.fate != Fate::Live {
            return;
        }
        match outcome {
            Outcome::Failed(_) if queued.receives >= MAX_RECEIVES => queued.fate = Fate::DeadLettered,
            Outcome::Failed(failure) => {
                let after = match failure {
                    Failure::Conflict { retry_after } | Failure::Uncommitted { retry_after } => *retry_after,
                    _ => Duration::from_millis(500),
                };
                queued.visible_at_ms = now_ms + u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
            }
            Outcome::Processed { .. } | Outcome::Duplicate => {
                queued.fate = Fate::Done;
                queued.copy_at_ms = copy_at_ms.filter(|_| queued.group.is_none());
            }
        }
    }

    /// Whether every message is deleted or dead-lettered, and no copy is due.
    pub(super) fn settled(&self) -> bool {
        self.messages.iter().all(|queued| queued.fate != Fate::Live && queued.copy_at_ms.is_none())
    }

    /// Whether the message `message_id` was moved to the dead-letter queue.
    pub(super) fn dead_lettered(&self, message_id: &str) -> bool {
        self.messages.iter().any(|queued| queued.message_id == message_id && queued.fate == Fate::DeadLettered)
    }

    /// Whether any message is held by a consumer now.
    #[cfg(test)]
    fn any_held(&self, now_ms: u64) -> bool {
        self.messages.iter().any(|queued| queued.fate == Fate::Live && queued.receives > 0 && !queued.visible(now_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VISIBILITY: Duration = Duration::from_secs(30);

    fn ids(deliveries: &[Delivery]) -> Vec<&str> {
        deliveries.iter().map(|delivery| delivery.message_id.as_str()).collect()
    }

    #[test]
    fn a_fifo_group_waits_while_an_earlier_message_of_it_is_held() {
        let mut queue = Queue::default();
        for (id, group) in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b")] {
            queue.push(id.into(), "{}".into(), Some(group.into()), 0);
        }
        assert_eq!(ids(&queue.receive(1, 0, VISIBILITY, false)), ["a1"]);
        assert_eq!(ids(&queue.receive(10, 0, VISIBILITY, false)), ["b1", "b2"], "a2 waits behind a1");
        assert!(queue.any_held(0));
        queue.settle("a1", &Outcome::Failed(Failure::Retryable("again".into())), 0, None);
        assert!(queue.receive(10, 100, VISIBILITY, false).is_empty(), "a1 is back in 500 ms, and a2 behind it");
        assert_eq!(ids(&queue.receive(10, 500, VISIBILITY, false)), ["a1", "a2"]);
        queue.settle("a1", &Outcome::Duplicate, 600, Some(700));
        assert!(queue.receive(10, 800, VISIBILITY, false).is_empty(), "no copies on a FIFO queue");
    }
}
