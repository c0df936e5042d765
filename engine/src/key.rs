//! Idempotency keys: which part of a message identifies it, and how that
//! becomes the id stored in the claim table.

use std::{fmt, str::FromStr};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::opened::Opened;

/// Where one part of a key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeySource {
    /// The SQS message id.
    MessageId,
    /// A field of the body parsed as JSON (of the message inside the
    /// envelope, when there is one); numeric segments index arrays, and a
    /// step that meets a string holding JSON continues inside it.
    Body(Vec<String>),
    /// A field of the envelope the message arrived in (`SQS_ONCE_ENVELOPE`),
    /// e.g. the SNS `MessageId`, read like a body path.
    Envelope(Vec<String>),
    /// A system attribute, e.g. `MessageDeduplicationId`.
    Attribute(String),
    /// The string value of a message attribute.
    MessageAttribute(String),
}

/// What `SQS_ONCE_KEY` says: one or more sources, joined into one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec(Vec<KeySource>);

impl KeySpec {
    /// The sources, in the order they were given.
    pub(crate) fn sources(&self) -> &[KeySource] {
        &self.0
    }

    /// Whether the key reads the envelope's fields.
    pub fn reads_envelope(&self) -> bool {
        self.0.iter().any(|source| matches!(source, KeySource::Envelope(_)))
    }
}

impl Default for KeySpec {
    fn default() -> Self {
        Self(vec![KeySource::MessageId])
    }
}

/// A key specification that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "messageId, body.<path>, envelope.<path>, attributes.<Name> or messageAttributes.<Name>, comma-separated for a composite key (`{0}` is none of these)"
)]
pub struct InvalidKeySpec(String);

impl FromStr for KeySpec {
    type Err = InvalidKeySpec;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        spec.split(',').map(|part| parse_source(part.trim())).collect::<Result<_, _>>().map(Self)
    }
}

fn parse_source(part: &str) -> Result<KeySource, InvalidKeySpec> {
    let invalid = || InvalidKeySpec(part.to_owned());
    let nonempty = |name: &str| if name.is_empty() { Err(invalid()) } else { Ok(name.to_owned()) };
    if part == "messageId" {
        return Ok(KeySource::MessageId);
    }
    let (scope, rest) = part.split_once('.').ok_or_else(invalid)?;
    let path = || rest.split('.').map(nonempty).collect::<Result<_, _>>();
    match scope {
        "body" => path().map(KeySource::Body),
        "envelope" => path().map(KeySource::Envelope),
        "attributes" => nonempty(rest).map(KeySource::Attribute),
        "messageAttributes" => nonempty(rest).map(KeySource::MessageAttribute),
        _ => Err(invalid()),
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MessageId => f.write_str("messageId"),
            Self::Body(path) => write!(f, "body.{}", path.join(".")),
            Self::Envelope(path) => write!(f, "envelope.{}", path.join(".")),
            Self::Attribute(name) => write!(f, "attributes.{name}"),
            Self::MessageAttribute(name) => write!(f, "messageAttributes.{name}"),
        }
    }
}

/// Why a record's key could not be derived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MissingKey {
    /// The key reads the body, and the body is not JSON.
    #[error("{key_source}: body is not JSON ({reason})")]
    BodyNotJson {
        /// The key source that needed the body.
        key_source: String,
        /// The parser's message.
        reason: String,
    },
    /// The source names nothing in this message (or names a JSON null).
    #[error("{0}: not present in the message")]
    Absent(String),
    /// The source names an empty text: as keys, every such message would
    /// be one message, so it is no key (as Powertools treats it).
    #[error("{0}: empty in the message")]
    Empty(String),
}

/// How a record with no derivable key is treated (`SQS_ONCE_ON_MISSING_KEY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMissingKey {
    /// Report the record failed with the reason logged.
    #[default]
    Fail,
    /// Use the record's message id as its key.
    MessageId,
}

impl FromStr for OnMissingKey {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "fail" => Ok(Self::Fail),
            "message-id" => Ok(Self::MessageId),
            other => Err(format!("`{other}` (valid: fail, message-id)")),
        }
    }
}

/// The key settings (`SQS_ONCE_KEY`, `SQS_ONCE_KEY_PREFIX`,
/// `SQS_ONCE_HASH_KEYS`, `SQS_ONCE_ON_MISSING_KEY`), and how they turn
/// messages into the ids their claims are stored under: `<prefix>#<key>`,
/// where `<key>` is the SHA-256 (hex) of the key's canonical text when
/// hashing is on, or the canonical text itself.
///
/// The canonical text of a one-part key is the part itself (a JSON string
/// unquoted, any other JSON value serialised with sorted object keys); a
/// composite key is the JSON array of its parts.
#[derive(Debug, Clone)]
pub struct Keys {
    spec: KeySpec,
    prefix: String,
    hash: bool,
    on_missing: OnMissingKey,
}

/// The namespace of stored keys when neither `SQS_ONCE_KEY_PREFIX` nor a
/// Lambda function name gives one.
pub const DEFAULT_KEY_PREFIX: &str = "sqs-once";

impl Default for Keys {
    /// The message id, under the prefix `sqs-once`, hashed; a record without
    /// a key fails.
    fn default() -> Self {
        Self { spec: KeySpec::default(), prefix: DEFAULT_KEY_PREFIX.into(), hash: true, on_missing: OnMissingKey::Fail }
    }
}

impl Keys {
    /// Keys read from `spec` (as `SQS_ONCE_KEY` takes it), stored under
    /// `prefix`, hashed; a record without a key fails.
    #[cfg(any(test, feature = "testing"))]
    pub fn new(spec: &str, prefix: impl Into<String>) -> Result<Self, InvalidKeySpec> {
        Ok(Self::of(spec.parse()?, prefix.into()))
    }

    /// Keys read from a parsed `spec`, stored under `prefix`.
    pub fn of(spec: KeySpec, prefix: String) -> Self {
        Self { spec, prefix, ..Self::default() }
    }

    /// Whether stored keys are SHA-256 hashes (the default), so that no
    /// message content lands in the table.
    pub fn hashed(self, hash: bool) -> Self {
        Self { hash, ..self }
    }

    /// What a record without a key gets.
    pub fn on_missing(self, on_missing: OnMissingKey) -> Self {
        Self { on_missing, ..self }
    }

    /// The namespace of stored keys.
    #[cfg(any(test, feature = "testing"))]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The stored id for `message`, falling back to its message id when the
    /// key is missing and the settings allow it.
    pub(crate) fn derive(&self, message: &Opened<'_>) -> Result<String, MissingKey> {
        match self.parts(message) {
            Ok(parts) => Ok(self.stored_id(&parts)),
            Err(missing) => match (self.on_missing, &message.message.message_id) {
                (OnMissingKey::MessageId, Some(id)) => Ok(self.stored_id(std::slice::from_ref(id))),
                _ => Err(missing),
            },
        }
    }

    /// The stored id for a key given as its parts' canonical texts, in the
    /// order of the key specification: how an operator finds a claim by the
    /// key they know.
    pub fn stored_id(&self, parts: &[String]) -> String {
        let canonical = match parts {
            [single] => single.clone(),
            _ => Value::from(parts.to_vec()).to_string(),
        };
        let key = if self.hash { hex::encode(Sha256::digest(canonical.as_bytes())) } else { canonical };
        format!("{}#{key}", self.prefix)
    }

    fn parts(&self, opened: &Opened<'_>) -> Result<Vec<String>, MissingKey> {
        let (mut body, mut envelope) = (None, None);
        self.spec
            .sources()
            .iter()
            .map(|source| match part(source, opened, &mut body, &mut envelope)? {
                part if part.is_empty() => Err(MissingKey::Empty(source.to_string())),
                part => Ok(part),
            })
            .collect()
    }
}

/// The canonical text of the part `source` names in `opened`; the body and
/// the envelope are parsed once for all the parts of a key.
fn part(
    source: &KeySource,
    opened: &Opened<'_>,
    body: &mut Option<Value>,
    envelope: &mut Option<Value>,
) -> Result<String, MissingKey> {
    let message = opened.message;
    let absent = || MissingKey::Absent(source.to_string());
    let json = |text: &str| {
        serde_json::from_str(text)
            .map_err(|e| MissingKey::BodyNotJson { key_source: source.to_string(), reason: e.to_string() })
    };
    match source {
        KeySource::MessageId => message.message_id.clone().ok_or_else(absent),
        KeySource::Attribute(name) => message.attributes.get(name).cloned().ok_or_else(absent),
        KeySource::MessageAttribute(name) => {
            message.message_attributes.get(name).and_then(|attribute| attribute.string_value.clone()).ok_or_else(absent)
        }
        KeySource::Body(path) => {
            if body.is_none() {
                *body = Some(json(&opened.body)?);
            }
            body.as_ref().and_then(|body| lookup(body, path)).ok_or_else(absent)
        }
        KeySource::Envelope(_) if opened.envelope.is_none() => Err(absent()),
        KeySource::Envelope(path) => {
            if envelope.is_none() {
                *envelope = Some(json(message.body.as_deref().unwrap_or_default())?);
            }
            envelope.as_ref().and_then(|envelope| lookup(envelope, path)).ok_or_else(absent)
        }
    }
}

/// The key text at `path` in `value`. A step that meets a string holding
/// JSON continues inside it, as publishers that nest a serialised message
/// (SNS's `Message`, a string field of JSON) need; a string that is not
/// JSON has no fields, so the part is absent.
fn lookup(value: &Value, path: &[String]) -> Option<String> {
    let Some((segment, rest)) = path.split_first() else {
        return (!value.is_null()).then(|| canonical_text(value));
    };
    match value {
        Value::Object(map) => lookup(map.get(segment)?, rest),
        Value::Array(items) => lookup(items.get(segment.parse::<usize>().ok()?)?, rest),
        Value::String(text) => lookup(&serde_json::from_str(text).ok()?, path),
        _ => None,
    }
}

/// A JSON value as key text: strings unquoted, everything else as compact JSON
/// (`serde_json` keeps object keys sorted, which makes it canonical).
fn canonical_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// SHA-256 (hex) of a message body, stored for payload validation.
pub(crate) fn payload_hash(body: &str) -> String {
    hex::encode(Sha256::digest(body.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lambda_events::sqs::{SqsMessage, SqsMessageAttribute};
    use sqs_once_core::envelope::EnvelopeKind;
    use std::sync::Arc;

    fn message(body: &str) -> Arc<SqsMessage> {
        let mut message = SqsMessage::default();
        message.message_id = Some("m-1".into());
        message.body = Some(body.into());
        message.attributes.insert("MessageDeduplicationId".into(), "dedup-1".into());
        let mut attribute = SqsMessageAttribute::default();
        attribute.string_value = Some("tenant-9".into());
        attribute.data_type = Some("String".into());
        message.message_attributes.insert("Tenant".into(), attribute);
        Arc::new(message)
    }

    /// A deriver of unhashed keys under `p`, deriving from messages without
    /// an envelope.
    fn plain(spec: &str, on_missing: OnMissingKey) -> impl Fn(&Arc<SqsMessage>) -> Result<String, MissingKey> {
        let deriver = Keys::new(spec, "p").unwrap().hashed(false).on_missing(on_missing);
        move |message| deriver.derive(&Opened::plain(message))
    }

    #[test]
    fn every_source_kind_reads_its_part() {
        let m = message(r#"{"order":{"id":"o-7","lines":[{"sku":"A"},{"sku":"B"}]},"n":3}"#);
        let derive = |spec| plain(spec, OnMissingKey::Fail)(&m).unwrap();
        assert_eq!(derive("messageId"), "p#m-1");
        assert_eq!(derive("body.order.id"), "p#o-7");
        assert_eq!(derive("body.order.lines.1.sku"), "p#B");
        assert_eq!(derive("body.n"), "p#3");
        assert_eq!(derive("body.order.lines.0"), r#"p#{"sku":"A"}"#);
        assert_eq!(derive("attributes.MessageDeduplicationId"), "p#dedup-1");
        assert_eq!(derive("messageAttributes.Tenant"), "p#tenant-9");
        assert_eq!(derive("messageAttributes.Tenant, body.order.id"), r#"p#["tenant-9","o-7"]"#);
    }

    #[test]
    fn object_keys_are_canonical_whatever_their_order() {
        let a = plain("body.k", OnMissingKey::Fail)(&message(r#"{"k":{"b":1,"a":2}}"#));
        let b = plain("body.k", OnMissingKey::Fail)(&message(r#"{"k":{"a":2,"b":1}}"#));
        assert_eq!(a.unwrap(), b.unwrap());
    }

    #[test]
    fn hashing_hides_the_key_and_is_stable() {
        let deriver = Keys::new("body.email", "fn").unwrap();
        let id = deriver.derive(&Opened::plain(&message(r#"{"email":"ann@example.com"}"#))).unwrap();
        assert!(!id.contains("ann"));
        assert_eq!(id, format!("fn#{}", payload_hash("ann@example.com")));
        assert_eq!(id.len(), "fn#".len() + 64);
    }

    #[test]
    fn an_empty_key_is_a_missing_key() {
        // Two orders whose id is empty would share one key: the second would be dropped as the first's duplicate.
        for body in [r#"{"id":"","order":1}"#, r#"{"id":"","order":2}"#] {
            let error = plain("body.id", OnMissingKey::Fail)(&message(body)).unwrap_err();
            assert_eq!(error, MissingKey::Empty("body.id".into()));
            assert_eq!(error.to_string(), "body.id: empty in the message");
            assert_eq!(plain("body.id", OnMissingKey::MessageId)(&message(body)).unwrap(), "p#m-1");
        }
        let both_empty = plain("body.a,body.b", OnMissingKey::Fail)(&message(r#"{"a":"","b":""}"#));
        assert!(both_empty.is_err(), "a composite key of empty parts is missing");
        let one_empty = plain("body.a,body.b", OnMissingKey::Fail)(&message(r#"{"a":"x","b":""}"#));
        assert_eq!(one_empty.unwrap_err(), MissingKey::Empty("body.b".into()), "as is any part missing");
        // Zero, false and an empty object are values, not emptiness.
        assert_eq!(plain("body.id", OnMissingKey::Fail)(&message(r#"{"id":0}"#)).unwrap(), "p#0");
        assert_eq!(plain("body.id", OnMissingKey::Fail)(&message(r#"{"id":{}}"#)).unwrap(), "p#{}");
    }

    #[test]
    fn missing_parts_are_reported_or_fall_back_to_the_message_id() {
        let not_json = message("plain text");
        let error = plain("body.id", OnMissingKey::Fail)(&not_json).unwrap_err();
        assert!(matches!(error, MissingKey::BodyNotJson { .. }), "{error}");
        assert!(error.to_string().starts_with("body.id: body is not JSON"));
        let absent = plain("body.id", OnMissingKey::Fail)(&message(r#"{"id":null}"#)).unwrap_err();
        assert_eq!(absent, MissingKey::Absent("body.id".into()));
        let attribute = plain("attributes.MessageGroupId", OnMissingKey::Fail)(&not_json);
        assert_eq!(attribute.unwrap_err().to_string(), "attributes.MessageGroupId: not present in the message");
        assert_eq!(plain("body.id", OnMissingKey::MessageId)(&not_json).unwrap(), "p#m-1");
    }

    #[test]
    fn paths_enter_strings_that_hold_json() {
        let sns =
            serde_json::json!({"Type": "Notification", "Message": r#"{"order_id":"o-77","lines":[{"sku":"A"}]}"#});
        let m = message(&sns.to_string());
        assert_eq!(plain("body.Message.order_id", OnMissingKey::Fail)(&m).unwrap(), "p#o-77");
        assert_eq!(plain("body.Message.lines.0.sku", OnMissingKey::Fail)(&m).unwrap(), "p#A");
        // The string itself is a value like any other.
        assert_eq!(plain("body.Type", OnMissingKey::Fail)(&m).unwrap(), "p#Notification");
        // JSON inside JSON inside JSON, and a body that is itself a JSON string.
        let twice = serde_json::json!({"outer": serde_json::json!({"inner": r#"{"id":5}"#}).to_string()});
        assert_eq!(plain("body.outer.inner.id", OnMissingKey::Fail)(&message(&twice.to_string())).unwrap(), "p#5");
        assert_eq!(plain("body.id", OnMissingKey::Fail)(&message(r#""{\"id\":6}""#)).unwrap(), "p#6");
        // A string that is not JSON has no fields: the key is missing, and
        // the fallback to the message id still applies.
        let text = message(r#"{"Message":"order o-77"}"#);
        let missing = plain("body.Message.order_id", OnMissingKey::Fail)(&text).unwrap_err();
        assert_eq!(missing, MissingKey::Absent("body.Message.order_id".into()));
        assert_eq!(plain("body.Message.order_id", OnMissingKey::MessageId)(&text).unwrap(), "p#m-1");
    }

    #[test]
    fn envelope_paths_read_the_envelope_and_body_paths_the_message_inside() {
        let sns = serde_json::json!({
            "Type": "Notification", "MessageId": "sns-1", "TopicArn": "arn:aws:sns:us-east-1:1:t",
            "Timestamp": "2026-11-23T10:00:00.000Z", "Message": r#"{"order_id":"o-77"}"#,
        });
        let m = message(&sns.to_string());
        let opened = Opened::new(&m, EnvelopeKind::Sns).unwrap();
        let derive = |spec: &str| Keys::new(spec, "p").unwrap().hashed(false).derive(&opened);
        assert_eq!(derive("body.order_id").unwrap(), "p#o-77");
        assert_eq!(derive("envelope.MessageId").unwrap(), "p#sns-1");
        assert_eq!(derive("envelope.TopicArn, body.order_id").unwrap(), r#"p#["arn:aws:sns:us-east-1:1:t","o-77"]"#);
        assert_eq!(derive("body.MessageId").unwrap_err(), MissingKey::Absent("body.MessageId".into()));
        // Without an envelope there is nothing for `envelope.` to read.
        let missing = plain("envelope.MessageId", OnMissingKey::Fail)(&m).unwrap_err();
        assert_eq!(missing, MissingKey::Absent("envelope.MessageId".into()));
        assert!("envelope.MessageId".parse::<KeySpec>().unwrap().reads_envelope());
    }

    #[test]
    fn bad_specs_are_rejected() {
        for spec in ["", "body", "body.", "body.a..b", "envelope", "envelope.", "attributes.", "headers.x", "messageid"]
        {
            assert!(spec.parse::<KeySpec>().is_err(), "{spec:?} parsed");
        }
    }

    #[test]
    fn keys_are_stored_under_their_prefix() {
        let keys = Keys::new("body.order_id", "orders").unwrap().hashed(false).on_missing(OnMissingKey::MessageId);
        assert_eq!(keys.stored_id(&["42".to_owned()]), "orders#42");
        assert!(Keys::new("body.", "orders").is_err());
    }
}
