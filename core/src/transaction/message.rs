//! Messages a handler sends through the outbox: written in the transaction
//! with the claim, sent after the commit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::StageError;
use crate::{
    payload::{Offload, PayloadPointer, RESERVED_ATTRIBUTES, SIZE_ATTRIBUTE},
    trace::{TRACEPARENT, TraceContext},
};

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "service", rename_all = "lowercase")]
#[non_exhaustive]
pub enum Destination {
    /// An SQS queue (`SendMessage`).
    Sqs {
        /// The queue URL.
        queue_url: String,
    },
    /// An SNS topic (`Publish`).
    Sns {
        /// The topic ARN.
        topic_arn: String,
    },
    /// An EventBridge event bus (`PutEvents`).
    #[serde(rename = "eventbridge")]
    EventBridge {
        /// The bus name or ARN (`default` for the account's default bus).
        event_bus: String,
        /// The event's `source`.
        source: String,
        /// The event's `detail-type`.
        detail_type: String,
    },
}

impl Destination {
    /// Whether the destination is a FIFO queue or topic (its name ends in
    /// `.fifo`): it then needs a message group and takes a deduplication id.
    pub fn is_fifo(&self) -> bool {
        match self {
            Self::Sqs { queue_url } => queue_url.ends_with(".fifo"),
            Self::Sns { topic_arn } => topic_arn.ends_with(".fifo"),
            Self::EventBridge { .. } => false,
        }
    }

    /// The queue, topic or bus, for logs.
    pub fn name(&self) -> &str {
        match self {
            Self::Sqs { queue_url } => queue_url,
            Self::Sns { topic_arn } => topic_arn,
            Self::EventBridge { event_bus, .. } => event_bus,
        }
    }
}

/// A message to send once the handler's transaction has committed.
///
/// Each message sent carries an id that stays the same however often it is
/// sent: the outbox id, as the message attribute [`OUTBOX_ID_ATTRIBUTE`]
/// (SQS, SNS), as the deduplication id on FIFO destinations, and as the
/// `sqs_once_outbox_id` field of an EventBridge event's `detail` object. A
/// downstream sqs-once consumer keys on it with
/// `SQS_ONCE_KEY=messageAttributes.SqsOnce.OutboxId`.
///
/// ```
/// use sqs_once::transaction::Message;
///
/// let receipt = Message::sqs("https://sqs.eu-west-1.amazonaws.com/123456789012/receipts", r#"{"order":"o-1"}"#)
///     .attribute("kind", "receipt");
/// let fifo = Message::sqs("https://sqs.eu-west-1.amazonaws.com/123456789012/audit.fifo", "o-1 paid").group("o-1");
/// let event = Message::event("default", "shop.orders", "OrderPaid", serde_json::json!({"order": "o-1"}));
/// let topic = Message::sns("arn:aws:sns:eu-west-1:123456789012:orders", "o-1 paid");
/// # let _ = (receipt, fifo, event, topic);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Where it goes.
    pub destination: Destination,
    /// The body (an event's `detail`, as JSON text).
    pub body: String,
    /// String message attributes (SQS, SNS).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
    /// The message group, which FIFO destinations require.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
}

/// The message attribute that carries a sent message's outbox id.
pub const OUTBOX_ID_ATTRIBUTE: &str = "SqsOnce.OutboxId";

/// The field of an EventBridge event's `detail` object that carries its
/// outbox id (EventBridge events have no attributes).
pub const OUTBOX_ID_FIELD: &str = "sqs_once_outbox_id";

impl Message {
    /// A message for the SQS queue at `queue_url`.
    pub fn sqs(queue_url: impl Into<String>, body: impl Into<String>) -> Self {
        Self::to(Destination::Sqs { queue_url: queue_url.into() }, body.into())
    }

    /// A message for the SNS topic `topic_arn`.
    pub fn sns(topic_arn: impl Into<String>, body: impl Into<String>) -> Self {
        Self::to(Destination::Sns { topic_arn: topic_arn.into() }, body.into())
    }

    /// An event for the EventBridge bus `event_bus`, with `detail` as its detail.
    pub fn event(
        event_bus: impl Into<String>,
        source: impl Into<String>,
        detail_type: impl Into<String>,
        detail: serde_json::Value,
    ) -> Self {
        let destination = Destination::EventBridge {
            event_bus: event_bus.into(),
            source: source.into(),
            detail_type: detail_type.into(),
        };
        Self::to(destination, detail.to_string())
    }

    /// Adds a string message attribute (SQS and SNS; an event takes only
    /// `traceparent`).
    ///
    /// `traceparent` is the message's W3C trace context: staged by a run,
    /// a message carries its record's unless it names its own, so that the
    /// next consumer links to the trace. Sent, it is also SQS's
    /// `AWSTraceHeader` system attribute, and an event's `TraceHeader`.
    pub fn attribute(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.attributes.insert(name.into(), value.into());
        self
    }

    /// The message group: required on FIFO queues and topics.
    pub fn group(mut self, group_id: impl Into<String>) -> Self {
        self.group_id = Some(group_id.into());
        self
    }

    fn to(destination: Destination, body: String) -> Self {
        Self { destination, body, attributes: BTreeMap::new(), group_id: None }
    }

    /// The message as staged under `context`, the trace context of the
    /// record whose run stages it, and its size (see [`validate`]): it
    /// carries the context onward as its `traceparent` attribute unless it
    /// has one of its own, or has no room for one (its destination's limit
    /// of attributes or bytes): a message gives up nothing for its trace.
    ///
    /// [`validate`]: Self::validate
    pub(super) fn staged_under(
        mut self,
        context: Option<&TraceContext>,
        offload: Option<&Offload>,
    ) -> Result<(Self, usize), StageError> {
        if let Some(context) = context
            && !self.attributes.contains_key(TRACEPARENT)
        {
            self.attributes.insert(TRACEPARENT.to_owned(), context.traceparent());
            match self.validate(offload) {
                Ok(bytes) => return Ok((self, bytes)),
                Err(_) => self.attributes.remove(TRACEPARENT),
            };
        }
        let bytes = self.validate(offload)?;
        Ok((self, bytes))
    }

    /// Whether it goes through S3 past `threshold` bytes ([`Offload`]): its
    /// size as sent is over the threshold or its destination's limit, or it
    /// is too large to keep in an outbox entry.
    pub fn needs_offload(&self, threshold: usize) -> bool {
        let (sent, limit) = self.sent_size();
        sent > threshold.min(limit) || self.stored_size() > MAX_STORED_BYTES
    }

    /// The message that carries `pointer` in its place, as the Amazon SQS
    /// Extended Client sends one: the pointer for a body, and the payload's
    /// size as its `ExtendedPayloadSize` attribute.
    pub fn through(&self, pointer: &PayloadPointer) -> Self {
        let mut sent = self.clone();
        sent.attributes.insert(SIZE_ATTRIBUTE.to_owned(), self.body.len().to_string());
        sent.body = pointer.body();
        sent
    }

    /// The trace context it carries onward: its `traceparent` attribute, if
    /// that parses.
    pub fn trace_context(&self) -> Option<TraceContext> {
        self.attributes.get(TRACEPARENT).and_then(|value| TraceContext::from_traceparent(value))
    }

    /// What its destination would refuse for good, found as it is staged,
    /// each refusal naming the rule; returns the size of the outbox item
    /// that will hold it. A message staged is committed and then sent until
    /// sent: one its destination refuses would be committed and never sent.
    ///
    /// A message past the threshold, too large for its destination or for
    /// its outbox entry, goes through S3 when `offload` says where (a
    /// queue's or a topic's; an event has no such form): what is then
    /// stored and sent is a pointer, which must pass instead.
    fn validate(&self, offload: Option<&Offload>) -> Result<usize, StageError> {
        let invalid =
            |reason: String| StageError::InvalidMessage { destination: self.destination.name().into(), reason };
        if let Some(name) = self.attributes.keys().find(|name| RESERVED_ATTRIBUTES.contains(&name.as_str())) {
            return Err(invalid(format!(
                "attribute `{name}` is the Amazon SQS Extended Client's, which marks a payload kept in S3"
            )));
        }
        let through_s3 = offload.filter(|_| !matches!(self.destination, Destination::EventBridge { .. }));
        let Some(offload) = through_s3.filter(|offload| self.needs_offload(offload.threshold)) else {
            return self.sendable();
        };
        if self.body.len() as u64 > offload.max_bytes {
            return Err(invalid(format!(
                "a body of {} bytes, more than SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES={} through S3",
                self.body.len(),
                offload.max_bytes
            )));
        }
        if self.attributes.len() >= MAX_ATTRIBUTES {
            return Err(invalid(format!(
                "{} attributes at most through S3 (the payload's size and the outbox id are the last two of ten)",
                MAX_ATTRIBUTES - 1
            )));
        }
        // Any outbox id has this length: the pointer sent is this long.
        self.through(&offload.pointer(&"0".repeat(OUTBOX_ID_LEN))).sendable()
    }

    /// What its destination would refuse of it as it is sent and stored;
    /// returns the size of the outbox item that will hold it.
    fn sendable(&self) -> Result<usize, StageError> {
        let invalid =
            |reason: String| StageError::InvalidMessage { destination: self.destination.name().into(), reason };
        self.destination.validate().map_err(invalid)?;
        if self.body.is_empty() {
            return Err(invalid("the body is empty".into()));
        }
        match &self.destination {
            Destination::Sqs { .. } | Destination::Sns { .. } => {
                text("the body", &self.body).map_err(invalid)?;
                if self.attributes.len() > MAX_ATTRIBUTES {
                    return Err(invalid(format!("{MAX_ATTRIBUTES} attributes at most (the outbox id is the tenth)")));
                }
                for (name, value) in &self.attributes {
                    attribute_name(name).and_then(|()| text(&format!("attribute `{name}`"), value)).map_err(invalid)?;
                }
            }
            Destination::EventBridge { .. } => {
                // The one attribute an event takes is its trace context, sent as its `TraceHeader`.
                let trace_only = self
                    .attributes
                    .iter()
                    .all(|(name, value)| name == TRACEPARENT && TraceContext::from_traceparent(value).is_some());
                if !trace_only || self.group_id.is_some() {
                    return Err(invalid(format!(
                        "an event has no message group and no attributes but a valid `{TRACEPARENT}` (its trace \
                         header)"
                    )));
                }
                if !serde_json::from_str::<serde_json::Value>(&self.body).is_ok_and(|detail| detail.is_object()) {
                    return Err(invalid("an event's detail must be a JSON object".into()));
                }
            }
        }
        match &self.group_id {
            Some(group_id) => self::group_id(group_id).map_err(invalid)?,
            None if self.destination.is_fifo() => {
                return Err(invalid("a FIFO destination needs a message group (Message::group)".into()));
            }
            None => {}
        }
        let (sent, limit) = self.sent_size();
        if sent > limit {
            return Err(invalid(format!("about {sent} bytes, more than the {limit} bytes it takes")));
        }
        let stored = self.stored_size();
        if stored > MAX_STORED_BYTES {
            return Err(invalid(format!(
                "its outbox item would be about {stored} bytes, more than the {MAX_STORED_BYTES} a DynamoDB item \
                 holds beside the entry's ids"
            )));
        }
        Ok(stored)
    }

    /// Its size as its destination counts it, as it is sent (the outbox id
    /// added: an attribute of a queue's or topic's message, a field of an
    /// event's detail), and the most the destination takes.
    pub(super) fn sent_size(&self) -> (usize, usize) {
        let attribute = |name: &str, value: usize| name.len() + "String".len() + value;
        let attributes: usize = self.attributes.iter().map(|(name, value)| attribute(name, value.len())).sum::<usize>()
            + attribute(OUTBOX_ID_ATTRIBUTE, OUTBOX_ID_LEN);
        match &self.destination {
            Destination::Sqs { .. } => (self.body.len() + attributes, MAX_SQS_BYTES),
            Destination::Sns { .. } => (self.body.len() + attributes, MAX_SNS_BYTES),
            Destination::EventBridge { source, detail_type, .. } => {
                (source.len() + detail_type.len() + self.sent_detail_len(), MAX_EVENT_BYTES)
            }
        }
    }

    /// The length of an event's detail as it is sent: parsed, the outbox id
    /// field added, written again (a number may come back longer).
    fn sent_detail_len(&self) -> usize {
        let Ok(serde_json::Value::Object(mut detail)) = serde_json::from_str(&self.body) else {
            return self.body.len();
        };
        detail.insert(OUTBOX_ID_FIELD.to_owned(), "0".repeat(OUTBOX_ID_LEN).into());
        serde_json::Value::Object(detail).to_string().len()
    }

    /// Its size in the outbox item that holds it: the body as it is (the
    /// DynamoDB store keeps it in an attribute of its own, unescaped), the
    /// rest as JSON.
    pub fn stored_size(&self) -> usize {
        let destination = match &self.destination {
            Destination::Sqs { queue_url } => json_len(queue_url),
            Destination::Sns { topic_arn } => json_len(topic_arn),
            Destination::EventBridge { event_bus, source, detail_type } => {
                json_len(event_bus) + json_len(source) + json_len(detail_type)
            }
        };
        let attributes: usize = self.attributes.iter().map(|(name, value)| json_len(name) + json_len(value) + 2).sum();
        self.body.len() + destination + attributes + self.group_id.as_deref().map_or(0, json_len) + JSON_FIELDS
    }
}

/// Attributes a message may carry of its own: SQS and SNS take ten, and the
/// outbox id is one.
const MAX_ATTRIBUTES: usize = 9;

/// The length of an outbox id: 64 hexadecimal digits.
const OUTBOX_ID_LEN: usize = 64;

/// What SQS takes in one message, body and attributes (each its name, type
/// and value): 1 MiB since August 2025
/// (docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html).
const MAX_SQS_BYTES: usize = 1024 * 1024;

/// What SNS takes in one message, attributes (name, type and value)
/// included: 256 KiB (docs.aws.amazon.com/sns/latest/api/API_Publish.html,
/// `MessageAttributeValue`).
const MAX_SNS_BYTES: usize = 256 * 1024;

/// What EventBridge takes in one `PutEvents` entry, counted as it counts it
/// (source, detail type and detail, as UTF-8 bytes): 1 MiB since January
/// 2026, 256 KiB before (docs.aws.amazon.com/eventbridge/latest/userguide/calculate-putevents-entry-size.html).
const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// What an outbox item may hold of a message: a DynamoDB item holds 400 KB
/// ([`MAX_ITEM_BYTES`](crate::transaction::MAX_ITEM_BYTES)),
/// and room is kept for the entry's ids (the claim's, twice, may be 2 KB
/// each), its tokens and the attributes' names.
const MAX_STORED_BYTES: usize = 400 * 1024 - 8 * 1024;

/// The names and punctuation of the message's JSON fields.
const JSON_FIELDS: usize = 96;

/// The length of `text` as a JSON string: quoted, with `"`, `\` and control
/// characters escaped.
fn json_len(text: &str) -> usize {
    let escaped: usize = text
        .chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if u32::from(c) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum();
    escaped + 2
}

/// A body or string attribute value of SQS and SNS: any character of the
/// ranges SQS documents (tab, line feed, carriage return, U+0020 to
/// U+D7FF, U+E000 to U+FFFD, U+10000 and up; a Rust string holds no
/// surrogates), and, for a value, not empty.
fn text(what: &str, text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err(format!("{what} is empty"));
    }
    let allowed = |c: char| matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && !matches!(c, '\u{FFFE}' | '\u{FFFF}'));
    match text.chars().find(|c| !allowed(*c)) {
        Some(c) => Err(format!("{what} holds U+{:04X}, a character SQS and SNS refuse", u32::from(c))),
        None => Ok(()),
    }
}

/// A message attribute's name: letters, digits, `_`, `-` and `.`, at most
/// 256, not starting with `AWS.` or `Amazon.` (any case), not starting or
/// ending with a period, no two periods in a row.
fn attribute_name(name: &str) -> Result<(), String> {
    let refused = |rule: &str| Err(format!("attribute name `{name}`: {rule}"));
    let lower = name.to_ascii_lowercase();
    if name.is_empty() || name.len() > 256 {
        refused("1 to 256 characters")
    } else if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
        refused("only letters, digits, `_`, `-` and `.`")
    } else if lower.starts_with("aws.") || lower.starts_with("amazon.") {
        refused("the prefixes `AWS.` and `Amazon.` are reserved")
    } else if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        refused("no period first, last, or two in a row")
    } else {
        Ok(())
    }
}

/// A message group id: 1 to 128 characters, letters, digits and ASCII
/// punctuation.
fn group_id(group_id: &str) -> Result<(), String> {
    let printable = |c: char| c.is_ascii_graphic();
    if group_id.is_empty() || group_id.len() > 128 || !group_id.chars().all(printable) {
        return Err(format!("message group `{group_id}`: 1 to 128 characters, letters, digits and ASCII punctuation"));
    }
    Ok(())
}

impl Destination {
    /// A queue URL, a topic ARN, an event bus name or ARN, as the services
    /// take them.
    fn validate(&self) -> Result<(), String> {
        let name_ok = |name: &str, most: usize, extra: &[char]| {
            !name.is_empty()
                && name.len() <= most
                && name.chars().all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
        };
        match self {
            Self::Sqs { queue_url } => {
                let path = queue_url.strip_prefix("https://").or_else(|| queue_url.strip_prefix("http://"));
                let segments: Vec<&str> = path.map(|path| path.split('/').collect()).unwrap_or_default();
                match segments.as_slice() {
                    [host, account, name]
                        if !host.is_empty()
                            && !account.is_empty()
                            && name.len() <= 80
                            && name_ok(name.strip_suffix(".fifo").unwrap_or(name), 80, &['-', '_']) =>
                    {
                        Ok(())
                    }
                    _ => {
                        Err(format!("`{queue_url}` is not a queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME)"))
                    }
                }
            }
            Self::Sns { topic_arn } => match arn(topic_arn, "sns") {
                Some(name) if name_ok(name.trim_end_matches(".fifo"), 256, &['-', '_']) => Ok(()),
                _ => Err(format!("`{topic_arn}` is not a topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME)")),
            },
            Self::EventBridge { event_bus, source, detail_type } => {
                let bus = arn(event_bus, "events").and_then(|resource| resource.strip_prefix("event-bus/"));
                if !name_ok(bus.unwrap_or(event_bus), 256, &['/', '.', '-', '_']) {
                    return Err(format!("`{event_bus}` is not an event bus name or ARN"));
                }
                if source.is_empty() || source.len() > 256 || detail_type.is_empty() || detail_type.len() > 128 {
                    return Err("an event needs a source of 1 to 256 characters and a detail type of 1 to 128".into());
                }
                Ok(())
            }
        }
    }

    /// The Region an ARN or an AWS queue URL names, if it names one: the
    /// outbox sends to it through a client of that Region, since the AWS
    /// SDK sends to its client's Region whatever the URL or ARN says.
    pub fn region(&self) -> Option<&str> {
        match self {
            Self::Sqs { queue_url } => {
                let host = queue_url.split("://").nth(1)?.split('/').next()?;
                let mut labels = host.split('.');
                match (labels.next()?, labels.next()?, labels.next()?) {
                    ("sqs", region, "amazonaws") => Some(region),
                    (region, "queue", "amazonaws") => Some(region),
                    _ => None,
                }
            }
            Self::Sns { topic_arn: arn } | Self::EventBridge { event_bus: arn, .. } => {
                arn.strip_prefix("arn:")?.split(':').nth(2).filter(|region| !region.is_empty())
            }
        }
    }
}

/// The resource of `text` if it is an ARN of `service` with a Region and an
/// account: `arn:PARTITION:SERVICE:REGION:ACCOUNT:RESOURCE`.
fn arn<'a>(text: &'a str, service: &str) -> Option<&'a str> {
    let mut parts = text.splitn(6, ':');
    let (prefix, _partition, named, region, account, resource) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let account_ok = account.len() == 12 && account.bytes().all(|byte| byte.is_ascii_digit());
    (prefix == "arn" && named == service && !region.is_empty() && account_ok).then_some(resource)
}
