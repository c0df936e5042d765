//! A standard SQS queue as consumers meet it: messages hidden while a
//! consumer holds them, back after their visibility timeout or when reported
//! failed, deleted on success, moved to the dead-letter queue after too many
//! receives, and now and then delivered twice: to two consumers at once, or
//! once more after a success.

use std::{collections::BTreeMap, time::Duration};

use crate::report::{Failure, Outcome};

/// Receives after which a message moves to the dead-letter queue.
const MAX_RECEIVES: u32 = 40;

/// Where a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// Still to be processed.
    Live,
    /// Deleted after a success.
    Done,
    /// Moved to the dead-letter queue.
    DeadLettered,
}

#[derive(Debug)]
struct Queued {
    body: String,
    visible_at_ms: u64,
    receives: u32,
    fate: Fate,
    /// A copy to deliver once more after the message was deleted.
    copy_at_ms: Option<u64>,
}

/// One delivery of a message.
#[derive(Debug, Clone)]
pub(super) struct Delivery {
    pub message_id: String,
    pub body: String,
    pub receive_count: u32,
}

/// The queue, keyed by message id.
#[derive(Debug, Default)]
pub(super) struct Queue {
    messages: BTreeMap<String, Queued>,
}

impl Queue {
    /// Sends a message.
    pub(super) fn push(&mut self, message_id: String, body: String, now_ms: u64) {
        let queued = Queued { body, visible_at_ms: now_ms, receives: 0, fate: Fate::Live, copy_at_ms: None };
        self.messages.insert(message_id, queued);
    }

    /// Up to `max` visible messages, hidden for `visibility` from now; with
    /// `copied`, the first stays visible as well (SQS delivers a copy to
    /// another consumer). Copies of deleted messages come back once.
    pub(super) fn receive(&mut self, max: usize, now_ms: u64, visibility: Duration, copied: bool) -> Vec<Delivery> {
        let hidden_until = now_ms + u64::try_from(visibility.as_millis()).unwrap_or(u64::MAX);
        let mut deliveries = Vec::new();
        for (message_id, queued) in &mut self.messages {
            if deliveries.len() == max {
                break;
            }
            let copy_due = queued.copy_at_ms.is_some_and(|at| at <= now_ms);
            let visible = queued.fate == Fate::Live && queued.visible_at_ms <= now_ms;
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
                message_id: message_id.clone(),
                body: queued.body.clone(),
                receive_count: queued.receives,
            });
        }
        deliveries
    }

    /// What a consumer reported for a delivery: a success deletes the
    /// message (a copy may come back at `copy_at_ms`), a failure makes it
    /// visible when the engine said it could succeed, or moves it to the
    /// dead-letter queue after too many receives.
    pub(super) fn settle(&mut self, message_id: &str, outcome: &Outcome, now_ms: u64, copy_at_ms: Option<u64>) {
        let Some(queued) = self.messages.get_mut(message_id) else { return };
        if queued.fate != Fate::Live {
            return;
        }
        match outcome {
            Outcome::Failed(failure) if queued.receives >= MAX_RECEIVES => {
                let _ = failure;
                queued.fate = Fate::DeadLettered;
            }
            Outcome::Failed(failure) => {
                let after = match failure {
                    Failure::Conflict { retry_after } | Failure::Uncommitted { retry_after } => *retry_after,
                    _ => Duration::from_millis(500),
                };
                queued.visible_at_ms = now_ms + u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
            }
            Outcome::Processed { .. } | Outcome::Duplicate => {
                queued.fate = Fate::Done;
                queued.copy_at_ms = copy_at_ms;
            }
        }
    }

    /// Whether every message is deleted or dead-lettered, and no copy is due.
    pub(super) fn settled(&self) -> bool {
        self.messages.values().all(|queued| queued.fate != Fate::Live && queued.copy_at_ms.is_none())
    }
}
