//! Exactly once for DynamoDB side effects: writes a handler stages commit in
//! one transaction with its claim's completion, and the messages it sends
//! leave through an outbox written in that transaction.
//!
//! A handler's side effect and the claim's completion are two writes, and
//! between them lies a window no timing closes: a process frozen, killed or
//! cut off after the side effect and before the completion leaves the claim
//! in progress, and a delivery after its lease runs the handler again. When
//! the side effect is a DynamoDB write, the handler stages it on its
//! [`Record`](crate::Record) instead of making it:
//!
//! ```
//! use serde::Deserialize;
//! use sqs_once::{ErrorKind, Handler, HandlerResult, Record, transaction::{Condition, Key, Message, Update}};
//!
//! #[derive(Deserialize)]
//! struct Credit { account: String, amount: i64 }
//!
//! struct Ledger;
//!
//! impl Handler for Ledger {
//!     async fn handle(&self, record: &Record) -> HandlerResult {
//!         let credit: Credit = record.body_json()?;
//!         let mut update = Update::new("ledger", Key::new("pk", credit.account.as_str())).add("balance", credit.amount);
//!         if credit.amount < 0 {
//!             update = update
//!                 .condition(Condition::ge("balance", -credit.amount))
//!                 .or_fail(ErrorKind::Permanent, "insufficient balance");
//!         }
//!         let transaction = record.transaction();
//!         transaction.stage(update)?;
//!         transaction.send(Message::sqs("https://sqs.eu-west-1.amazonaws.com/123456789012/credits", record.body.clone()))?;
//!         Ok(None)
//!     }
//! }
//! ```
//!
//! When the handler returns success, the writes, an outbox item per message and
//! the claim's completion commit in one DynamoDB transaction: all of it, or
//! none. A handler that stages nothing keeps the ordinary path.
//!
#![doc = include_str!("../docs/transactions.md")]

pub mod item_keys;
mod message;
mod write;

use parking_lot::Mutex;
use std::{collections::HashSet, sync::Arc};

pub use message::{Destination, Message, OUTBOX_ID_ATTRIBUTE, OUTBOX_ID_FIELD};
pub use write::{Action, Check, Comparison, Condition, Delete, Key, Put, Refusal, Target, Update, Write};

/// An item's size as DynamoDB counts it.
pub(crate) fn item_size(item: &serde_json::Map<String, serde_json::Value>) -> usize {
    write::attributes_size(item.iter().map(|(name, value)| (name.as_str(), value)))
}

use crate::{HandlerError, payload::Offload, trace::TraceContext};

/// Most actions in one transaction, the claim's completion included
/// (DynamoDB's limit for `TransactWriteItems`:
/// docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html).
pub const MAX_ITEMS: usize = 100;

/// Most bytes in one transaction (DynamoDB: 4 MB in all, on the same page);
/// room for the claim's item, which may carry a stored result, is kept back.
pub const MAX_BYTES: usize = 4_000_000;

/// Most bytes in one item (DynamoDB: 400 KB, attribute names and values,
/// on the same page).
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// A staging limit a handler would breach, found before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// More than [`MAX_ITEMS`] actions.
    #[error(
        "a transaction holds at most {MAX_ITEMS} actions, the claim's completion and each message among them: \
         {0} is one too many"
    )]
    TooManyActions(String),
    /// Two actions on one item.
    #[error("{0} is written twice in one transaction: DynamoDB takes one action per item")]
    SameItem(String),
    /// More than [`MAX_BYTES`] in all.
    #[error("the transaction would hold about {0} bytes; DynamoDB takes 4 MB in all, with room for the claim")]
    TooLarge(usize),
    /// One item over [`MAX_ITEM_BYTES`].
    #[error("the {what} would be about {bytes} bytes; a DynamoDB item holds at most 400 KB")]
    ItemTooLarge {
        /// Which write or message.
        what: String,
        /// Its size.
        bytes: usize,
    },
    /// A key that is not one or two named string or number attributes.
    #[error("invalid key: {0} (one or two attributes, each a non-empty string or a number)")]
    InvalidKey(String),
    /// An update that changes a key attribute.
    #[error("`{0}` is a key attribute of {1}: DynamoDB does not update key attributes")]
    KeyAttribute(String, String),
    /// An update without actions.
    #[error("the update of {0} changes nothing")]
    NothingToUpdate(String),
    /// A write that names an attribute an item keeps its kept keys in.
    #[error(
        "`{0}` is where sqs-once keeps the keys of the messages applied to {1} (see `Update::keep_key`): a staged write may not name it"
    )]
    KeptKeys(String, String),
    /// Attributes that are not a JSON object.
    #[error("the attributes of a put must serialize to a JSON object: {0}")]
    NotAnObject(String),
    /// A message its destination would refuse.
    #[error("message to {destination}: {reason}")]
    InvalidMessage {
        /// The queue, topic or bus.
        destination: String,
        /// What it would refuse.
        reason: String,
    },
}

impl From<StageError> for HandlerError {
    fn from(error: StageError) -> Self {
        HandlerError::permanent(error)
    }
}

/// What a handler staged: its writes and its messages, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Staged {
    writes: Vec<Write>,
    messages: Vec<Message>,
    bytes: usize,
    items: HashSet<String>,
    /// The first write or message refused at staging: a transaction that
    /// lost one of its parts never commits, whatever the handler did with
    /// the error.
    refused: Option<Box<StageError>>,
}

impl Staged {
    /// The staged writes, in order.
    pub fn writes(&self) -> &[Write] {
        &self.writes
    }

    /// The staged messages, in order.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Whether nothing was staged.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.messages.is_empty()
    }

    /// The staged messages, to put pointers in place of payloads that go
    /// through S3 (see [`crate::payload::Offload`]).
    pub fn messages_mut(&mut self) -> &mut [Message] {
        &mut self.messages
    }

    /// The writes and the messages.
    pub fn into_parts(self) -> (Vec<Write>, Vec<Message>) {
        (self.writes, self.messages)
    }

    /// Actions this adds to the transaction, the claim's completion not counted.
    fn actions(&self) -> usize {
        self.writes.len() + self.messages.len()
    }

    /// `staging`, the first error of which is kept as the transaction's
    /// refusal.
    fn refuse_on_error<T>(&mut self, staging: Result<T, StageError>) -> Result<T, StageError> {
        staging.inspect_err(|error| {
            self.refused.get_or_insert_with(|| Box::new(error.clone()));
        })
    }

    fn make_room(&self, what: &dyn Fn() -> String, bytes: usize) -> Result<(), StageError> {
        if self.actions() + 1 >= MAX_ITEMS {
            return Err(StageError::TooManyActions(what()));
        }
        let total = self.bytes + bytes;
        if total > MAX_BYTES - MAX_ITEM_BYTES {
            return Err(StageError::TooLarge(total));
        }
        Ok(())
    }
}

/// Where a handler stages its DynamoDB writes and messages; a record's own
/// ([`Record::transaction`](crate::Record::transaction)). Staging is cheap
/// and checks DynamoDB's limits at once; nothing is sent before the handler
/// returns success.
///
/// ```
/// use sqs_once::transaction::{Key, Message, Put, Transaction};
///
/// let transaction = Transaction::default();
/// transaction.stage(Put::new("orders", Key::new("pk", "o-1")).set("state", "paid"))?;
/// transaction.send(Message::sns("arn:aws:sns:eu-west-1:123456789012:paid", "o-1"))?;
/// assert_eq!(transaction.staged().writes().len(), 1);
///
/// let twice = transaction.stage(Put::new("orders", Key::new("pk", "o-1")));
/// assert!(twice.unwrap_err().to_string().contains("written twice"));
/// # Ok::<(), sqs_once::transaction::StageError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Transaction {
    staged: Arc<Mutex<Staged>>,
    /// The trace context of the record whose run stages: the messages
    /// staged carry it onward.
    context: Option<TraceContext>,
    /// Where messages too large to send go instead, when anywhere.
    offload: Option<Arc<Offload>>,
}

impl Transaction {
    /// An empty transaction whose messages carry `context` onward, and go
    /// through S3 as `offload` says when too large to send.
    pub fn carrying(context: Option<TraceContext>, offload: Option<Arc<Offload>>) -> Self {
        Self { staged: Arc::default(), context, offload }
    }

    /// Stages a write, to commit with the claim when the handler succeeds.
    ///
    /// A write refused here (a limit it would breach, an item written
    /// twice) also keeps the whole transaction from committing: the record
    /// fails with this error even if the handler goes on and returns
    /// success, so that no part of a transaction commits without the rest.
    pub fn stage(&self, write: impl Into<Write>) -> Result<(), StageError> {
        let write = write.into();
        let mut staged = self.staged.lock();
        let staging = write.validate().and_then(|bytes| {
            staged.make_room(&|| write.describe(), bytes)?;
            if let Some(item) = write.item()
                && staged.items.contains(&item)
            {
                return Err(StageError::SameItem(write.describe()));
            }
            Ok((bytes, write.item()))
        });
        let (bytes, item) = staged.refuse_on_error(staging)?;
        staged.items.extend(item);
        staged.bytes += bytes;
        staged.writes.push(write);
        Ok(())
    }

    /// Stages a message, to leave through the outbox once the transaction
    /// has committed. A message refused here keeps the transaction from
    /// committing, as a refused [`stage`](Self::stage) does.
    pub fn send(&self, message: Message) -> Result<(), StageError> {
        let mut staged = self.staged.lock();
        let staging =
            message.staged_under(self.context.as_ref(), self.offload.as_deref()).and_then(|(message, bytes)| {
                staged.make_room(&|| format!("message to {}", message.destination.name()), bytes)?;
                Ok((message, bytes))
            });
        let (message, bytes) = staged.refuse_on_error(staging)?;
        staged.bytes += bytes;
        staged.messages.push(message);
        Ok(())
    }

    /// A copy of what is staged so far.
    pub fn staged(&self) -> Staged {
        self.staged.lock().clone()
    }

    /// Whether nothing is staged (a write or message refused at staging is
    /// not: it is no part of the transaction, which then does not commit).
    pub fn is_empty(&self) -> bool {
        self.staged.lock().is_empty()
    }

    /// Takes what was staged, leaving nothing: the engine commits it once;
    /// or, when anything was refused at staging, the first refusal, which
    /// fails the record instead.
    pub fn take(&self) -> Result<Staged, StageError> {
        let mut staged = std::mem::take(&mut *self.staged.lock());
        match staged.refused.take() {
            Some(refused) => Err(*refused),
            None => Ok(staged),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUEUE: &str = "https://sqs.us-east-1.amazonaws.com/1/q";

    #[test]
    fn a_transaction_holds_ninety_nine_actions_beside_the_claim() {
        let transaction = Transaction::default();
        for n in 0..90 {
            transaction.stage(Update::new("t", Key::new("pk", n)).add("n", 1)).unwrap();
        }
        for _ in 0..9 {
            transaction.send(Message::sqs(QUEUE, "m")).unwrap();
        }
        let error = transaction.send(Message::sqs(QUEUE, "m")).unwrap_err();
        assert!(matches!(error, StageError::TooManyActions(_)), "{error}");
        let error = transaction.stage(Update::new("t", Key::new("pk", 1000)).add("n", 1)).unwrap_err();
        assert!(matches!(error, StageError::TooManyActions(_)), "{error}");
        assert_eq!(transaction.staged().actions(), 99);
    }

    #[test]
    fn one_action_per_item_and_four_megabytes_in_all() {
        let transaction = Transaction::default();
        transaction.stage(Check::new("t", Key::new("pk", "a").and("sk", 1), Condition::exists("pk"))).unwrap();
        transaction.stage(Delete::new("t", Key::new("pk", "a").and("sk", 2))).unwrap();
        transaction.stage(Delete::new("u", Key::new("pk", "a").and("sk", 1))).unwrap();
        let twice = transaction.stage(Update::new("t", Key::new("pk", "a").and("sk", 1)).set("x", 1));
        assert!(matches!(twice, Err(StageError::SameItem(_))));
        // One item to DynamoDB: numbers by value, key attributes by name.
        let twice = transaction.stage(Update::new("t", Key::new("sk", 2.0).and("pk", "a")).set("x", 1));
        assert!(matches!(twice, Err(StageError::SameItem(_))), "{twice:?}");
        let big = "x".repeat(390 * 1024);
        let mut refused = None;
        for n in 0..20 {
            if let Err(error) = transaction.stage(Put::new("big", Key::new("pk", n)).set("blob", big.as_str())) {
                refused = Some((n, error));
                break;
            }
        }
        let (n, error) = refused.expect("refused before 20 items of 390 KB");
        assert!(matches!(error, StageError::TooLarge(_)), "{error}");
        // 4,000,000 bytes less 400 KB kept for the claim: eight items of 390 KB and the small ones.
        assert_eq!(n, 8, "eight items of 390 KB fit beside the claim's room");
    }

    #[test]
    fn messages_their_destination_would_refuse_are_refused_when_staged() {
        const TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:t";
        let transaction = Transaction::default();
        let refused = |message: Message| transaction.send(message).unwrap_err().to_string();
        assert!(refused(Message::sqs(QUEUE, "")).contains("empty"));
        assert!(refused(Message::sqs(format!("{QUEUE}.fifo"), "m")).contains("message group"));
        assert!(refused(Message::event("default", "s", "t", serde_json::json!([1]))).contains("JSON object"));
        assert!(refused(Message::sns(TOPIC, "x".repeat(300 * 1024))).contains("bytes"));
        // What the send adds counts: the outbox id (an attribute of `SqsOnce.OutboxId`, `String` and 64 digits).
        assert!(refused(Message::sns(TOPIC, "x".repeat(256 * 1024 - 40))).contains("bytes"));
        transaction.send(Message::sns(TOPIC, "x".repeat(256 * 1024 - 86))).unwrap();
        // An event's detail as sent: with the outbox id field, 1 MiB at most for source, detail type and detail
        // (the outbox item's 392 KB come first: a detail that large is for S3).
        let detail = |len: usize| serde_json::json!({ "d": "x".repeat(len) });
        let event = |len| Message::event("default", "s", "t", detail(len));
        transaction.send(event(300 * 1024)).unwrap();
        let event_len = |len| "s".len() + "t".len() + detail(len).to_string().len();
        let limit_len = 1024 * 1024 - event_len(0);
        assert!(event_len(limit_len) <= 1024 * 1024);
        let too_large = Message::event("default", "s", "t", detail(limit_len)).sent_size();
        assert!(too_large.0 > too_large.1, "the outbox id field takes it over: {too_large:?}");
        let crowded = (0..10).fold(Message::sqs(QUEUE, "m"), |message, n| message.attribute(format!("a{n}"), "v"));
        assert!(refused(crowded).contains("attributes"));
        // Attributes SQS and SNS refuse.
        assert!(refused(Message::sqs(QUEUE, "m").attribute("note", "")).contains("`note` is empty"));
        for name in ["AWS.trace", "amazon.x", "a..b", ".a", "a.", "a b", "ü", &"n".repeat(257)] {
            assert!(refused(Message::sns(TOPIC, "m").attribute(name, "v")).contains("attribute name"), "{name}");
        }
        assert!(refused(Message::sqs(QUEUE, "m").attribute("a", "\u{7}")).contains("U+0007"));
        // Bodies with characters SQS refuses.
        assert!(refused(Message::sqs(QUEUE, "a\u{1}b")).contains("U+0001"));
        assert!(refused(Message::sns(TOPIC, "\u{FFFF}")).contains("U+FFFF"));
        // Message groups.
        for group in ["g".repeat(129), "a b".into(), "é".into(), String::new()] {
            assert!(
                refused(Message::sqs(format!("{QUEUE}.fifo"), "m").group(group.clone())).contains("group"),
                "{group}"
            );
        }
        let event = Message::event("default", "s", "t", serde_json::json!({}));
        assert!(refused(event.clone().attribute("a", "v")).contains("no attributes"));
        assert!(refused(event.group("g")).contains("no attributes"));
        // Addresses the services do not take.
        for url in ["queue", "https://sqs.us-east-1.amazonaws.com/q", "https://h/1/bad name", "https://h/1/"] {
            assert!(refused(Message::sqs(url, "m")).contains("not a queue URL"), "{url}");
        }
        for arn in ["orders", "arn:aws:sns:us-east-1:1:t", "arn:aws:sqs:us-east-1:123456789012:t"] {
            assert!(refused(Message::sns(arn, "m")).contains("not a topic ARN"), "{arn}");
        }
        assert!(refused(Message::event("my bus", "s", "t", serde_json::json!({}))).contains("event bus"));
        assert!(refused(Message::event("default", "", "t", serde_json::json!({}))).contains("source"));
        // Accepted: what the services take.
        let fine = [
            Message::sqs(format!("{QUEUE}.fifo"), "m\t\n\u{10FFFF}").group("o-1!").attribute("kind.v2", "ü"),
            Message::sqs("http://127.0.0.1:4566/000000000000/local-queue", "m"),
            Message::sns(format!("{TOPIC}.fifo"), "m").group("g"),
            Message::event("arn:aws:events:eu-west-1:123456789012:event-bus/orders", "s", "t", serde_json::json!({})),
        ];
        for message in fine {
            transaction.send(message).unwrap();
        }
        assert_eq!(transaction.staged().messages().len(), 6);
    }

    #[test]
    fn messages_carry_the_trace_context_of_their_record_onward_where_there_is_room() {
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let transaction = Transaction::carrying(TraceContext::from_traceparent(traceparent), None);
        let own = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00";
        let nine = (0..9).fold(Message::sqs(QUEUE, "m"), |message, n| message.attribute(format!("a{n}"), "v"));
        let event = Message::event("default", "s", "t", serde_json::json!({}));
        // Room for the outbox id (86 bytes as an attribute), none for the trace context.
        let whole = Message::sns("arn:aws:sns:us-east-1:123456789012:t", "x".repeat(256 * 1024 - 100));
        for message in [
            Message::sqs(QUEUE, "m"),
            Message::sqs(QUEUE, "m").attribute("traceparent", own),
            nine,
            event.clone(),
            whole,
        ] {
            transaction.send(message).unwrap();
        }
        let staged = transaction.staged();
        let carried: Vec<Option<&str>> =
            staged.messages().iter().map(|message| message.attributes.get("traceparent").map(String::as_str)).collect();
        // The record's; a handler's own; none where the outbox id needs the tenth attribute, or the bytes are taken.
        assert_eq!(carried, [Some(traceparent), Some(own), None, Some(traceparent), None]);
        assert_eq!(staged.messages()[0].trace_context(), TraceContext::from_traceparent(traceparent));

        // An event takes a trace context, its trace header, and no other attribute.
        let untraced = Transaction::default();
        untraced.send(event.clone().attribute("traceparent", own)).unwrap();
        assert!(untraced.send(event.attribute("traceparent", "not one")).unwrap_err().to_string().contains("valid"));
        assert!(untraced.staged().messages()[0].attributes.len() == 1);
        untraced.send(Message::sqs(QUEUE, "m")).unwrap();
        assert!(untraced.staged().messages()[1].attributes.is_empty(), "a record in no trace carries none");
    }

    #[test]
    fn an_outbox_item_holds_a_body_as_it_is_and_refuses_one_it_cannot() {
        let transaction = Transaction::default();
        // JSON whose quotes would take twice the room escaped: stored as it is, it fits.
        let body = r#"{"k":"v"},"#.repeat(390 * 1024 / 10);
        transaction.send(Message::sqs(QUEUE, body.clone())).expect("fits an item");
        let stored = transaction.staged().messages()[0].stored_size();
        assert!(stored < MAX_ITEM_BYTES && stored >= body.len(), "{stored}");
        let error = Transaction::default().send(Message::sqs(QUEUE, "x".repeat(395 * 1024))).unwrap_err();
        assert!(error.to_string().contains("outbox item"), "{error}");
        // Escaped attributes count as stored.
        let quoted = "\"".repeat(200 * 1024);
        let error = Transaction::default().send(Message::sqs(QUEUE, "m").attribute("q", quoted)).unwrap_err();
        assert!(error.to_string().contains("outbox item"), "{error}");
    }

    #[test]
    fn with_a_bucket_messages_too_large_to_send_are_staged_to_go_through_s3() {
        const TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:t";
        // A threshold past what SNS and an outbox item take: their limits decide.
        let threshold = 1024 * 1024;
        let offload = Offload { bucket: "large".into(), max_bytes: 8 * 1024 * 1024, threshold };
        let transaction = Transaction::carrying(None, Some(Arc::new(offload)));
        // Past SQS's 1 MiB, SNS's 256 KiB and an outbox item's 392 KB: staged, and counted as the pointer they become.
        for message in [
            Message::sqs(QUEUE, "x".repeat(2 * 1024 * 1024)),
            Message::sns(TOPIC, "x".repeat(300 * 1024)),
            Message::sqs(QUEUE, "x".repeat(395 * 1024)).attribute("kind", "report"),
        ] {
            assert!(message.needs_offload(threshold));
            transaction.send(message).unwrap();
        }
        transaction.send(Message::sqs(QUEUE, "x".repeat(300 * 1024))).unwrap();
        let staged = transaction.staged();
        assert_eq!(staged.messages().iter().filter(|message| message.needs_offload(threshold)).count(), 3);
        // The Extended Client's threshold, 256 KiB: past it, through S3 too.
        assert!(staged.messages()[3].needs_offload(crate::payload::DEFAULT_THRESHOLD));
        let pointers = staged.bytes - staged.messages()[3].stored_size();
        assert!(pointers < 4 * 1024, "pointers, not payloads, count towards the transaction: {pointers}");
        let refused = |message: Message| transaction.send(message).unwrap_err().to_string();
        assert!(refused(Message::sqs(QUEUE, "x".repeat(9 * 1024 * 1024))).contains("SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES"));
        // An event has no pointer form.
        let detail = serde_json::json!({ "d": "x".repeat(1100 * 1024) });
        assert!(refused(Message::event("default", "s", "t", detail)).contains("bytes it takes"));
        // The pointer takes an attribute: a message with nine of its own has no room for it.
        let crowded = (0..9).fold(Message::sqs(QUEUE, "x".repeat(2 * 1024 * 1024)), |message, n| {
            message.attribute(format!("a{n}"), "v")
        });
        let error = refused(crowded);
        assert!(error.contains("8 attributes at most through S3"), "{error}");
        // The Extended Client's own attributes would make a message of one's own a pointer.
        for name in ["ExtendedPayloadSize", "SQSLargePayloadSize"] {
            assert!(refused(Message::sqs(QUEUE, "m").attribute(name, "12")).contains("Extended Client"), "{name}");
            let plain = Transaction::default().send(Message::sqs(QUEUE, "m").attribute(name, "12"));
            assert!(plain.is_err(), "{name} refused without a bucket too");
        }
    }

    #[test]
    fn a_message_through_s3_is_the_extended_clients_pointer_with_the_payloads_size() {
        let pointer = crate::payload::PayloadPointer { bucket: "large".into(), key: "sqs-once/abc".into() };
        let message = Message::sqs(QUEUE, "x".repeat(2_000_000)).attribute("kind", "report");
        let sent = message.through(&pointer);
        assert_eq!(
            sent.body,
            r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"large","s3Key":"sqs-once/abc"}]"#
        );
        assert_eq!(sent.attributes["ExtendedPayloadSize"], "2000000");
        assert_eq!(sent.attributes["kind"], "report");
        assert!(!sent.needs_offload(crate::payload::DEFAULT_THRESHOLD));
    }

    #[test]
    fn queue_urls_and_arns_name_their_region() {
        let region = |destination: Destination| destination.region().map(str::to_owned);
        let sqs = |url: &str| Destination::Sqs { queue_url: url.into() };
        assert_eq!(region(sqs("https://sqs.eu-west-1.amazonaws.com/123456789012/q")).as_deref(), Some("eu-west-1"));
        assert_eq!(
            region(sqs("https://sqs.cn-north-1.amazonaws.com.cn/123456789012/q")).as_deref(),
            Some("cn-north-1")
        );
        assert_eq!(region(sqs("https://ap-south-1.queue.amazonaws.com/123456789012/q")).as_deref(), Some("ap-south-1"));
        assert_eq!(region(sqs("http://127.0.0.1:4566/000000000000/q")), None);
        let sns = Destination::Sns { topic_arn: "arn:aws:sns:us-west-2:123456789012:t".into() };
        assert_eq!(region(sns).as_deref(), Some("us-west-2"));
        let bus = |event_bus: &str| Destination::EventBridge {
            event_bus: event_bus.into(),
            source: "s".into(),
            detail_type: "t".into(),
        };
        assert_eq!(region(bus("arn:aws:events:sa-east-1:123456789012:event-bus/b")).as_deref(), Some("sa-east-1"));
        assert_eq!(region(bus("default")), None);
    }

    #[test]
    fn a_stage_error_is_a_permanent_handler_error() {
        let error: HandlerError = StageError::NothingToUpdate("t".into()).into();
        assert_eq!(error.kind(), crate::ErrorKind::Permanent);
    }
}
