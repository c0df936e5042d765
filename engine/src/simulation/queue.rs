//! An SQS queue as consumers meet it, with its clocks: a received message
//! is hidden for the queue's visibility timeout and comes back then unless
//! its consumer deleted it; a failed record comes back after the delay the
//! consumer's redelivery policy sets with `ChangeMessageVisibility` (which
//! can fail, leaving the visibility timeout), or after the visibility
//! timeout on a FIFO queue; after `maxReceiveCount` receives a message
//! moves to the dead-letter queue, from which an operator may redrive it
//! (`StartMessageMoveTask`) minutes to days later; a message older than the
//! retention period is gone. A standard queue now and then delivers a
//! message twice: to two consumers at once, or once more after a success.
//! A FIFO queue delivers a message group's messages in order, none while
//! an earlier one of the group is held, no copies, and drops a message sent
//! again with a deduplication id it took within five minutes.

use std::time::Duration;

use crate::{
    redelivery::{NextDelivery, RedeliveryPolicy, jittered},
    report::{Failure, Outcome},
};
use sqs_once_core::clock::duration_ms;

/// FIFO's deduplication interval.
pub(super) const DEDUPLICATION_WINDOW: Duration = Duration::from_secs(5 * 60);

/// How a queue and its consumers' redelivery policy are set.
#[derive(Debug, Clone)]
pub(super) struct QueueSettings {
    pub fifo: bool,
    /// The queue's visibility timeout.
    pub visibility_timeout: Duration,
    /// Receives after which a message moves to the dead-letter queue.
    pub max_receives: u32,
    /// How long a message is kept from when it was first sent.
    pub retention: Duration,
    /// The consumers' redelivery policy, as the settings read it
    /// (`SQS_ONCE_CONFLICT_BACKOFF`, `SQS_ONCE_RETRY_BASE_SECS`,
    /// `SQS_ONCE_RETRY_MAX_SECS`): the very decision the consumer carries out
    /// with `ChangeMessageVisibility`.
    pub policy: RedeliveryPolicy,
    /// The chance a `ChangeMessageVisibility` fails.
    pub change_fails: f64,
}

impl QueueSettings {
    /// The longest a failed record stays away before the queue delivers it
    /// again, as the composition root hands it to the claims.
    pub(super) fn redelivered_within(&self) -> Duration {
        self.policy.redelivered_within(self.visibility_timeout)
    }

    /// The delay the consumers' policy asks for a record that failed with
    /// `failure` on its `receives`th receive, `jitter` of its spread added;
    /// `None`: the visibility timeout applies.
    fn delay(&self, failure: &Failure, receives: u32, jitter: f64) -> Option<Duration> {
        match self.policy.next_delivery(failure, receives, self.fifo) {
            NextDelivery::After(delay) => Some(jittered(delay, jitter)),
            _ => None,
        }
    }
}

/// Where a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Still to be processed.
    Live,
    /// Deleted after a success.
    Done,
    /// Moved to the dead-letter queue.
    DeadLettered,
    /// Past the retention period.
    Gone,
}

#[derive(Debug)]
struct Queued {
    message_id: String,
    body: String,
    group: Option<String>,
    sent_ms: u64,
    visible_at_ms: u64,
    receives: u32,
    fate: Fate,
    /// A copy to deliver once more after the message was deleted.
    copy_at_ms: Option<u64>,
    /// When the consumer holding it last reported it failed.
    failed_ms: Option<u64>,
    /// When it was last received.
    received_ms: u64,
    /// Whether it came back from the dead-letter queue.
    redriven: bool,
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
    /// For a delivery the queue makes because the consumers' last delivery
    /// of the message ended without deleting it (reported failed, or held
    /// past the visibility timeout): that delivery. `None` for a first
    /// delivery, a copy, and a message redriven from the dead-letter queue.
    pub back_after: Option<Ended>,
}

/// A delivery that ended without a deletion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ended {
    /// When it was received.
    pub received_ms: u64,
    /// When its consumer reported it failed, or its visibility timeout passed.
    pub ended_ms: u64,
}

/// The queue, its messages in the order they were sent.
#[derive(Debug)]
pub(super) struct Queue {
    settings: QueueSettings,
    messages: Vec<Queued>,
    /// FIFO deduplication ids taken, with when.
    deduplication: Vec<(String, u64)>,
}

impl Queue {
    pub(super) fn new(settings: QueueSettings) -> Self {
        Self { settings, messages: Vec::new(), deduplication: Vec::new() }
    }

    /// Sends a message (of `group`, on a FIFO queue), unless a FIFO queue
    /// took its `deduplication_id` within the interval; whether it was taken.
    pub(super) fn push(&mut self, message: Sent, now_ms: u64) -> bool {
        let Sent { message_id, deduplication_id, body, group } = message;
        if self.settings.fifo {
            let window_ms = duration_ms(DEDUPLICATION_WINDOW);
            if self.deduplication.iter().any(|(id, at_ms)| *id == deduplication_id && now_ms < at_ms + window_ms) {
                return false;
            }
            self.deduplication.push((deduplication_id, now_ms));
        }
        let queued = Queued {
            message_id,
            body,
            group,
            sent_ms: now_ms,
            visible_at_ms: now_ms,
            receives: 0,
            fate: Fate::Live,
            copy_at_ms: None,
            failed_ms: None,
            received_ms: 0,
            redriven: false,
        };
        self.messages.push(queued);
        true
    }

    /// Up to `max` visible messages, hidden for the visibility timeout from
    /// now; with `copied`, the first stays visible as well (SQS delivers a
    /// copy to another consumer). Copies of deleted messages come back once.
    /// A message of a group is delivered only once every earlier message of
    /// its group is settled, or comes in the same batch.
    pub(super) fn receive(&mut self, max: usize, now_ms: u64, copied: bool) -> Vec<Delivery> {
        self.retire(now_ms);
        let hidden_until = now_ms + duration_ms(self.settings.visibility_timeout);
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
            let back_after = match copy_due || queued.receives == 0 || queued.redriven {
                true => None,
                // Back: after a failure, or once the last receive's visibility timeout passed unanswered.
                false => Some(Ended {
                    received_ms: queued.received_ms,
                    ended_ms: queued.failed_ms.unwrap_or(queued.visible_at_ms),
                }),
            };
            queued.receives += 1;
            if copy_due {
                queued.copy_at_ms = None;
            } else {
                queued.failed_ms = None;
                queued.received_ms = now_ms;
                if !(copied && deliveries.is_empty()) {
                    queued.visible_at_ms = hidden_until;
                }
            }
            deliveries.push(Delivery {
                message_id: queued.message_id.clone(),
                body: queued.body.clone(),
                group: queued.group.clone(),
                receive_count: queued.receives,
                back_after,
            });
        }
        deliveries
    }

    /// Messages past the retention period are gone; one received
    /// `maxReceiveCount` times and visible again (its consumer never
    /// answered) moves to the dead-letter queue.
    fn retire(&mut self, now_ms: u64) {
        let retention_ms = duration_ms(self.settings.retention);
        let max_receives = self.settings.max_receives;
        for queued in &mut self.messages {
            if matches!(queued.fate, Fate::Live | Fate::DeadLettered) && queued.sent_ms + retention_ms <= now_ms {
                queued.fate = Fate::Gone;
            } else if queued.visible(now_ms) && queued.receives >= max_receives {
                queued.fate = Fate::DeadLettered;
            }
        }
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
    /// message (a copy may come back at `copy_at_ms`); a failure moves it
    /// to the dead-letter queue after `maxReceiveCount` receives, or makes
    /// it visible after the delay the policy asks for (`jitter` of its
    /// spread added), unless the visibility change `change_failed`: then
    /// after the visibility timeout of its receive.
    pub(super) fn settle(&mut self, settled: Settled<'_>) {
        let Settled { message_id, listed, outcome, now_ms, copy_at_ms, jitter, change_failed } = settled;
        let settings = self.settings.clone();
        let Some(queued) = self.messages.iter_mut().find(|queued| queued.message_id == message_id) else { return };
        if queued.fate != Fate::Live {
            return;
        }
        if listed {
            queued.failed_ms = Some(now_ms);
            let delay = match outcome {
                Outcome::Failed(failure) => settings.delay(failure, queued.receives, jitter),
                _ => None,
            };
            if let Some(delay) = delay.filter(|_| !change_failed) {
                queued.visible_at_ms = now_ms + duration_ms(delay);
            }
            // SQS moves a message on the receive past maxReceiveCount; a consumer meets it no more.
            if queued.receives >= settings.max_receives {
                queued.fate = Fate::DeadLettered;
            }
        } else {
            queued.fate = Fate::Done;
            queued.copy_at_ms = copy_at_ms.filter(|_| queued.group.is_none());
        }
    }

    /// Moves every message of the dead-letter queue back (as
    /// `StartMessageMoveTask` does), visible now; how many.
    pub(super) fn redrive(&mut self, now_ms: u64) -> usize {
        self.retire(now_ms);
        let mut moved = 0;
        for queued in &mut self.messages {
            if queued.fate == Fate::DeadLettered {
                *queued = Queued {
                    message_id: queued.message_id.clone(),
                    body: std::mem::take(&mut queued.body),
                    group: queued.group.take(),
                    visible_at_ms: now_ms,
                    receives: 0,
                    fate: Fate::Live,
                    copy_at_ms: None,
                    failed_ms: None,
                    redriven: true,
                    ..*queued
                };
                moved += 1;
            }
        }
        moved
    }

    /// Whether every message is deleted, dead-lettered or gone, and no copy
    /// is due.
    pub(super) fn settled(&mut self, now_ms: u64) -> bool {
        self.retire(now_ms);
        self.messages.iter().all(|queued| queued.fate != Fate::Live && queued.copy_at_ms.is_none())
    }

    /// Whether the message `message_id` left the queue unprocessed: moved
    /// to the dead-letter queue (and not redriven since), or gone.
    pub(super) fn left_unprocessed(&self, message_id: &str) -> bool {
        self.messages
            .iter()
            .any(|queued| queued.message_id == message_id && matches!(queued.fate, Fate::DeadLettered | Fate::Gone))
    }

    /// Whether the message `message_id` was ever moved back from the
    /// dead-letter queue.
    pub(super) fn redriven(&self, message_id: &str) -> bool {
        self.messages.iter().any(|queued| queued.message_id == message_id && queued.redriven)
    }

    /// Whether any message is held by a consumer now.
    #[cfg(test)]
    fn any_held(&self, now_ms: u64) -> bool {
        self.messages.iter().any(|queued| queued.fate == Fate::Live && queued.receives > 0 && !queued.visible(now_ms))
    }
}

/// A message a producer sends.
#[derive(Debug, Clone)]
pub(super) struct Sent {
    pub message_id: String,
    /// What a FIFO queue deduplicates on: the same for a producer's retry.
    pub deduplication_id: String,
    pub body: String,
    /// The message group, on a FIFO queue.
    pub group: Option<String>,
}

/// A consumer's report of one delivery, as [`Queue::settle`] takes it.
#[derive(Debug)]
pub(super) struct Settled<'a> {
    pub message_id: &'a str,
    /// Whether the batch's answer listed it in `batchItemFailures`: if not,
    /// the consumer deletes it (Lambda's poller, or `poll` itself).
    pub listed: bool,
    /// Its outcome, which says how long a listed record stays away.
    pub outcome: &'a Outcome,
    pub now_ms: u64,
    /// When SQS delivers a copy of a deleted message, if it does.
    pub copy_at_ms: Option<u64>,
    /// The share of the jitter's spread added to a delay, from 0 to 1.
    pub jitter: f64,
    /// Whether the `ChangeMessageVisibility` of a failed record failed.
    pub change_failed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(base: Duration, longest: Duration) -> RedeliveryPolicy {
        RedeliveryPolicy {
            longest_delay: longest,
            retry_backoff: Some(crate::redelivery::RetryBackoff { base, max: longest }),
            ..RedeliveryPolicy::default()
        }
    }

    fn settings(fifo: bool) -> QueueSettings {
        QueueSettings {
            fifo,
            visibility_timeout: Duration::from_secs(30),
            max_receives: 3,
            retention: Duration::from_secs(4 * 24 * 3_600),
            policy: policy(Duration::from_secs(1), Duration::from_secs(60)),
            change_fails: 0.0,
        }
    }

    fn sent(id: &str, deduplication_id: &str, group: Option<&str>) -> Sent {
        Sent {
            message_id: id.into(),
            deduplication_id: deduplication_id.into(),
            body: "{}".into(),
            group: group.map(str::to_owned),
        }
    }

    fn ids(deliveries: &[Delivery]) -> Vec<&str> {
        deliveries.iter().map(|delivery| delivery.message_id.as_str()).collect()
    }

    #[test]
    fn a_fifo_group_waits_while_an_earlier_message_of_it_is_held_and_failed_ones_wait_out_the_timeout() {
        let mut queue = Queue::new(settings(true));
        for (id, group) in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b")] {
            assert!(queue.push(sent(id, id, Some(group)), 0));
        }
        assert_eq!(ids(&queue.receive(1, 0, false)), ["a1"]);
        assert_eq!(ids(&queue.receive(10, 0, false)), ["b1", "b2"], "a2 waits behind a1");
        assert!(queue.any_held(0));
        for id in ["b1", "b2"] {
            let done = Outcome::Processed { confirmed: true };
            let (copy_at_ms, jitter, change_failed) = (None, 0.0, false);
            let settled = Settled {
                message_id: id,
                listed: false,
                outcome: &done,
                now_ms: 50,
                copy_at_ms,
                jitter,
                change_failed,
            };
            queue.settle(settled);
        }
        let retry = Outcome::Failed(Failure::Retryable("again".into()));
        queue.settle(Settled {
            message_id: "a1",
            listed: true,
            outcome: &retry,
            now_ms: 100,
            copy_at_ms: None,
            jitter: 0.0,
            change_failed: false,
        });
        assert!(queue.receive(10, 29_999, false).is_empty(), "a FIFO record waits out the visibility timeout");
        let back = queue.receive(10, 30_000, false);
        assert_eq!(ids(&back), ["a1", "a2"]);
        assert_eq!(back[0].back_after, Some(Ended { received_ms: 0, ended_ms: 100 }), "back after its failure");
        assert_eq!(back[1].back_after, None, "a first delivery");
        queue.settle(Settled {
            message_id: "a1",
            listed: false,
            outcome: &Outcome::Duplicate,
            now_ms: 30_100,
            copy_at_ms: Some(30_200),
            jitter: 0.0,
            change_failed: false,
        });
        assert!(queue.receive(10, 70_000, false).iter().all(|d| d.message_id != "a1"), "no copies on a FIFO queue");
        assert!(!queue.push(sent("a1-again", "a1", Some("a")), 200_000), "deduplicated");
        assert!(queue.push(sent("a1-later", "a1", Some("a")), 300_001), "past the interval");
    }

    #[test]
    fn a_standard_queue_backs_off_until_the_dead_letter_queue_and_a_redrive_brings_it_back() {
        let mut queue = Queue::new(settings(false));
        queue.push(sent("m", "m", None), 0);
        let retry = Outcome::Failed(Failure::Retryable("again".into()));
        let settle = |queue: &mut Queue, now_ms, change_failed| {
            queue.settle(Settled {
                message_id: "m",
                listed: true,
                outcome: &retry,
                now_ms,
                copy_at_ms: None,
                jitter: 1.0,
                change_failed,
            })
        };
        assert_eq!(queue.receive(10, 0, false).len(), 1);
        settle(&mut queue, 1_000, false);
        // 1 s back-off, jitter 1.2 s at most.
        assert!(queue.receive(10, 3_199, false).is_empty());
        assert_eq!(queue.receive(10, 3_200, false)[0].back_after, Some(Ended { received_ms: 0, ended_ms: 1_000 }));
        settle(&mut queue, 4_000, true);
        assert!(queue.receive(10, 33_199, false).is_empty(), "the change failed: the visibility timeout");
        let third = queue.receive(10, 33_200, false);
        assert_eq!(third[0].receive_count, 3);
        settle(&mut queue, 34_000, false);
        assert!(queue.left_unprocessed("m") && queue.settled(40_000), "dead-lettered after three receives");
        assert_eq!(queue.redrive(86_400_000), 1);
        let redriven = queue.receive(10, 86_400_000, false);
        assert_eq!((redriven[0].receive_count, redriven[0].back_after), (1, None));
        assert!(queue.redriven("m"));
    }
}
