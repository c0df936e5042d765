//! A failed record's redelivery, carried out through SQS after each batch's
//! answer: the policy's decision ([`sqs_once_engine::redelivery`]: when a
//! conflict or a retryable failure comes back, whether a permanent one
//! leaves for the dead-letter queue) made into `ChangeMessageVisibility`
//! calls and dead-letter sends.
//!
//! The partial-batch response stays correct whatever SQS answers: a
//! visibility change that fails leaves the record to the queue's own
//! timeout, and a permanent failure is reported successful (so it leaves
//! the source queue) only once the dead-letter queue took it, with
//! attributes saying why; if the send fails, it stays failed and nothing is
//! lost.

use parking_lot::Mutex;
use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use aws_lambda_events::sqs::{SqsBatchResponse, SqsMessage};
use aws_sdk_sqs::types::MessageAttributeValue;
use futures::{FutureExt, StreamExt, stream};
use tokio::time::Instant;

use crate::sqs::{OutgoingMessage, Sqs, SqsError, outgoing_attribute};
use sqs_once_core::trace::TraceContext;
use sqs_once_engine::{
    event::{EventRecord, receive_count},
    redelivery::{NextDelivery, RedeliveryPolicy, jittered},
    report::{BatchReport, Failure, Outcome},
};

/// SQS keeps at most ten message attributes per message.
const MAX_ATTRIBUTES: usize = 10;

/// SQS's largest message: the body and every attribute's name, type and
/// value together.
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Dead-letter sends in flight at once.
const DEAD_LETTER_CONCURRENCY: usize = 16;

/// `delay` with a random part of its jitter.
fn with_jitter(delay: Duration) -> Duration {
    jittered(delay, fastrand::f64())
}

/// What the SQS side of one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedeliveryCounts {
    /// Visibility timeouts changed.
    pub visibility_changed: u64,
    /// Visibility changes that SQS refused or that could not be sent.
    pub visibility_failed: u64,
    /// Records sent to the dead-letter queue (and so reported successful).
    pub dead_lettered: u64,
    /// Dead-letter sends that failed (those records stay failed).
    pub dead_letter_failed: u64,
}

/// A [`RedeliveryPolicy`] carried out through SQS.
#[derive(Debug, Clone)]
pub(crate) struct Redelivery {
    policy: RedeliveryPolicy,
    sqs: Sqs,
}

/// A failed record that SQS can act on.
#[derive(Clone, Copy)]
struct Failed<'a> {
    message: &'a SqsMessage,
    failure: &'a Failure,
    key: Option<&'a str>,
    fifo: bool,
    receipt_handle: &'a str,
    queue_arn: &'a str,
}

impl Redelivery {
    /// Carries out `policy` with `sqs`.
    pub(crate) fn new(policy: RedeliveryPolicy, sqs: Sqs) -> Self {
        Self { policy, sqs }
    }

    /// The policy carried out.
    pub(crate) fn policy(&self) -> &RedeliveryPolicy {
        &self.policy
    }

    /// Acts on the failed records of `report` (the engine's report on
    /// `records`) and returns the partial-batch response: the engine's,
    /// less the records now in the dead-letter queue. Records without a
    /// receipt handle or queue ARN are left as they are.
    ///
    /// Gives up at `deadline`: calls not answered by then count as failed,
    /// and their records keep the queue's timing and stay in the response.
    pub(crate) async fn apply(
        &self,
        records: &[EventRecord],
        report: &BatchReport,
        deadline: Instant,
    ) -> (SqsBatchResponse, RedeliveryCounts) {
        let plan = self.plan(records, report);
        let planned_changes = plan.visibility.values().map(Vec::len).sum::<usize>() as u64;
        let planned_moves = plan.dead_letters.len() as u64;
        let settled = Mutex::new(Settled::default());
        let work = futures::future::join(
            self.change_all(&plan.visibility, &settled),
            self.dead_letter_all(plan.dead_letters, &settled),
        );
        let finished = tokio::time::timeout_at(deadline, work).await.is_ok();
        let Settled { mut counts, moved } = settled.into_inner();
        if !finished {
            tracing::warn!(
                "SQS did not answer before the deadline; records it did not confirm keep the queue's timing"
            );
            counts.visibility_failed = planned_changes - counts.visibility_changed;
            counts.dead_letter_failed = planned_moves - counts.dead_lettered;
        }
        let mut response = report.response();
        response.batch_item_failures.retain(|failure| !moved.contains(failure.item_identifier.as_str()));
        (response, counts)
    }

    /// What to ask of SQS for the failed records.
    fn plan<'a>(&self, records: &'a [EventRecord], report: &'a BatchReport) -> Plan<'a> {
        let mut plan = Plan::default();
        for failed in failed_messages(records, report) {
            match self.policy.next_delivery(failed.failure, receive_count(failed.message), failed.fifo) {
                NextDelivery::AsQueued => {}
                NextDelivery::After(delay) => plan
                    .visibility
                    .entry(failed.queue_arn)
                    .or_default()
                    .push((failed.receipt_handle, with_jitter(delay))),
                NextDelivery::DeadLetter => {
                    // The same message twice in a batch is sent once.
                    plan.dead_letters.entry(failed.message.message_id.as_deref().unwrap_or_default()).or_insert(failed);
                }
            }
        }
        plan
    }

    async fn change_all(&self, visibility: &HashMap<&str, Vec<(&str, Duration)>>, settled: &Mutex<Settled<'_>>) {
        for (queue_arn, changes) in visibility {
            for result in self.change_visibility(queue_arn, changes).await {
                let mut settled = settled.lock();
                match result {
                    Ok(()) => settled.counts.visibility_changed += 1,
                    Err(error) => {
                        settled.counts.visibility_failed += 1;
                        tracing::warn!(%error, queue = queue_arn, "visibility not changed; the queue's timeout applies");
                    }
                }
            }
        }
    }

    async fn change_visibility(&self, queue_arn: &str, changes: &[(&str, Duration)]) -> Vec<Result<(), SqsError>> {
        match Sqs::queue_url(queue_arn) {
            Some(url) => self.sqs.change_visibility(&url, changes).await,
            None => {
                let error = SqsError::lasting("ChangeMessageVisibilityBatch", "not an SQS queue ARN".into());
                vec![Err(error); changes.len()]
            }
        }
    }

    /// Sends each record to the dead-letter queue, noting the message ids sent.
    async fn dead_letter_all<'a>(&self, dead_letters: HashMap<&'a str, Failed<'a>>, settled: &Mutex<Settled<'a>>) {
        let Some(queue_url) = self.policy.dead_letter_queue.as_deref() else { return };
        let mut sends = Vec::with_capacity(dead_letters.len());
        for (message_id, failed) in dead_letters {
            let message = dead_letter(&failed, queue_url.ends_with(".fifo"));
            sends.push(self.sqs.send(queue_url, message).map(move |sent| (message_id, sent)).boxed());
        }
        let mut results = stream::iter(sends).buffer_unordered(DEAD_LETTER_CONCURRENCY);
        while let Some((message_id, sent)) = results.next().await {
            let mut settled = settled.lock();
            match sent {
                Ok(()) => {
                    settled.counts.dead_lettered += 1;
                    settled.moved.insert(message_id);
                    tracing::info!(message_id, "moved to the dead-letter queue");
                }
                Err(error) => {
                    settled.counts.dead_letter_failed += 1;
                    tracing::warn!(message_id, %error, "not moved to the dead-letter queue; it stays failed");
                }
            }
        }
    }
}

/// The SQS calls one batch needs.
#[derive(Default)]
struct Plan<'a> {
    /// New visibility timeouts by receipt handle, per queue ARN.
    visibility: HashMap<&'a str, Vec<(&'a str, Duration)>>,
    /// Records to move, by message id.
    dead_letters: HashMap<&'a str, Failed<'a>>,
}

/// What SQS has confirmed so far, kept when the deadline cuts the calls short.
#[derive(Default)]
struct Settled<'a> {
    counts: RedeliveryCounts,
    /// Message ids now in the dead-letter queue.
    moved: HashSet<&'a str>,
}

/// The failed records that SQS can act on, in event order.
fn failed_messages<'a>(records: &'a [EventRecord], report: &'a BatchReport) -> impl Iterator<Item = Failed<'a>> {
    records.iter().zip(&report.records).filter_map(|(record, report)| {
        let (EventRecord::Message(message), Outcome::Failed(failure)) = (record, &report.outcome) else {
            return None;
        };
        Some(Failed {
            message,
            failure,
            key: report.key.as_deref(),
            fifo: record.fifo_group().is_some(),
            receipt_handle: message.receipt_handle.as_deref()?,
            queue_arn: message.event_source_arn.as_deref()?,
        })
    })
}

/// The dead-letter copy of a failed message: its body and message
/// attributes, and as many of the `SqsOnce.*` attributes saying why as SQS's
/// limits leave room for: ten attributes, the message's own first, and 1 MiB
/// in all (a message that was near it keeps its body and loses the
/// explanation). Their values are made what SQS accepts ([`attribute_text`]).
fn dead_letter(failed: &Failed<'_>, fifo_queue: bool) -> OutgoingMessage {
    let message = failed.message;
    let body = message.body.clone().unwrap_or_default();
    let mut attributes: HashMap<String, MessageAttributeValue> = message
        .message_attributes
        .iter()
        .filter_map(|(name, attribute)| Some((name.clone(), outgoing_attribute(attribute)?)))
        .collect();
    let mut size = body.len() + attributes.iter().map(|(name, value)| attribute_size(name, value)).sum::<usize>();
    let message_id = message.message_id.clone().unwrap_or_default();
    let explanation = [
        ("SqsOnce.Error", "String", failed.failure.to_string()),
        ("SqsOnce.MessageId", "String", message_id.clone()),
        ("SqsOnce.Key", "String", failed.key.unwrap_or("-").to_owned()),
        ("SqsOnce.ReceiveCount", "Number", receive_count(message).to_string()),
        ("SqsOnce.SourceQueue", "String", failed.queue_arn.to_owned()),
    ];
    for (name, data_type, value) in explanation {
        let Ok(value) =
            MessageAttributeValue::builder().data_type(data_type).string_value(attribute_text(&value)).build()
        else {
            continue;
        };
        let grown = size + attribute_size(name, &value);
        if attributes.len() >= MAX_ATTRIBUTES || grown > MAX_MESSAGE_BYTES {
            tracing::warn!(message_id, attribute = name, "no room left for this dead-letter attribute");
            continue;
        }
        size = grown;
        attributes.insert(name.to_owned(), value);
    }
    OutgoingMessage {
        body,
        attributes,
        group_id: fifo_queue
            .then(|| message.attributes.get("MessageGroupId").cloned().unwrap_or_else(|| "sqs-once".into())),
        deduplication_id: fifo_queue.then_some(message_id),
        // The copy stays in the trace the message arrived in.
        // (Only as it parses: SQS refuses a header that is not X-Ray's.)
        trace_header: message
            .attributes
            .get("AWSTraceHeader")
            .filter(|header| TraceContext::from_xray(header).is_some())
            .cloned(),
    }
}

/// What an attribute counts towards SQS's message size.
fn attribute_size(name: &str, value: &MessageAttributeValue) -> usize {
    let binary = value.binary_value.as_ref().map_or(0, |blob| blob.as_ref().len());
    name.len() + value.data_type.len() + value.string_value.as_deref().map_or(0, str::len) + binary
}

/// `text` as SQS accepts it in an attribute: capped ([`sqs_once_engine::report::reason::capped`])
/// and every character outside the ranges `SendMessage` allows (#x9, #xA, #xD,
/// #x20 to #xD7FF, #xE000 to #xFFFD, #x10000 to #x10FFFF) replaced by U+FFFD.
pub(crate) fn attribute_text(text: &str) -> String {
    let allowed = |c: char| matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}');
    sqs_once_engine::report::reason::capped(text).chars().map(|c| if allowed(c) { c } else { '\u{FFFD}' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_a_fifth_and_a_second() {
        for _ in 0..1000 {
            let jittered = with_jitter(Duration::from_secs(10));
            assert!(jittered >= Duration::from_secs(10) && jittered <= Duration::from_secs(13), "{jittered:?}");
        }
    }

    #[test]
    fn dead_letters_keep_the_message_and_say_why() {
        let mut message = SqsMessage::default();
        message.message_id = Some("m-1".into());
        message.body = Some("{\"id\":1}".into());
        message.attributes.insert("ApproximateReceiveCount".into(), "3".into());
        message.attributes.insert("MessageGroupId".into(), "g".into());
        for index in 0..8 {
            let mut attribute = aws_lambda_events::sqs::SqsMessageAttribute::default();
            attribute.data_type = Some("String".into());
            attribute.string_value = Some(format!("v{index}"));
            message.message_attributes.insert(format!("a{index}"), attribute);
        }
        let failure = Failure::Permanent("bad order".into());
        let failed = Failed {
            message: &message,
            failure: &failure,
            key: Some("orders#1"),
            fifo: true,
            receipt_handle: "r",
            queue_arn: "arn:q.fifo",
        };
        let outgoing = dead_letter(&failed, true);
        assert_eq!(outgoing.body, "{\"id\":1}");
        assert_eq!(outgoing.group_id.as_deref(), Some("g"));
        assert_eq!(outgoing.deduplication_id.as_deref(), Some("m-1"));
        // Eight of the message's own, then the first two explanations fit.
        assert_eq!(outgoing.attributes.len(), 10);
        assert_eq!(outgoing.attributes["a7"].string_value(), Some("v7"));
        assert_eq!(outgoing.attributes["SqsOnce.Error"].string_value(), Some("handler failed (permanent): bad order"));
        assert_eq!(outgoing.attributes["SqsOnce.MessageId"].string_value(), Some("m-1"));
        assert!(!outgoing.attributes.contains_key("SqsOnce.ReceiveCount"));
        assert!(dead_letter(&failed, false).group_id.is_none());
        assert_eq!(outgoing.trace_header, None, "it arrived in no trace");
    }

    #[test]
    fn a_dead_letter_stays_in_the_trace_its_message_arrived_in() {
        let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let mut message = SqsMessage::default();
        message.attributes.insert("AWSTraceHeader".into(), xray.into());
        let failure = Failure::Permanent("bad order".into());
        let header = |message: &SqsMessage| {
            let failed =
                Failed { message, failure: &failure, key: None, fifo: false, receipt_handle: "r", queue_arn: "q" };
            dead_letter(&failed, false).trace_header
        };
        assert_eq!(header(&message).as_deref(), Some(xray));
        // SQS refuses a header that is not X-Ray's: the copy goes without it.
        message.attributes.insert("AWSTraceHeader".into(), "Root=nonsense".into());
        assert_eq!(header(&message), None);
    }

    #[test]
    fn attribute_text_is_what_sqs_accepts() {
        assert_eq!(attribute_text("bad\u{0}byte\u{FFFF}\tok"), "bad\u{FFFD}byte\u{FFFD}\tok");
        assert!(attribute_text(&"x".repeat(1 << 20)).len() <= sqs_once_engine::report::reason::MAX_BYTES);
    }

    #[test]
    fn jitter_adds_up_to_thirty_percent() {
        let jittered = with_jitter(Duration::from_secs(10));
        assert!(jittered >= Duration::from_secs(10) && jittered <= Duration::from_secs(13));
    }
}
