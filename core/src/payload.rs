//! Payloads kept in S3: the pointers of the Amazon SQS Extended Client.
//!
//! A producer whose message is too large for SQS (1 MiB) or SNS (256 KiB)
//! writes it to an S3 object and sends a pointer instead, as the Extended
//! Client for Java and Python (and SNS's for Java) do: the message carries
//! the `ExtendedPayloadSize` attribute (`SQSLargePayloadSize` in the older
//! clients), and its body names the object,
//! `["software.amazon.payloadoffloading.PayloadS3Pointer",
//! {"s3BucketName": "…", "s3Key": "…"}]`. The engine reads such a record's
//! payload from S3 before anything else, so that its key, payload
//! validation, logs and handler see the message the producer sent.
//!
//! The other way round, a message a handler stages that is too large for
//! its destination (or for an outbox entry) goes through S3 the same way
//! when a bucket is set (`SQS_ONCE_LARGE_PAYLOAD_BUCKET`): its payload is
//! written before the commit, under a key derived from its outbox entry, and
//! the message sent is the pointer, which the Extended Client, and sqs-once,
//! read.
//!
//! The engine knows only [`PayloadStore`]; the S3 one lives with the
//! consumer (feature `s3`).

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// The message attribute that marks a pointer, with the payload's size in
/// bytes as its value.
pub const SIZE_ATTRIBUTE: &str = "ExtendedPayloadSize";
/// The same attribute as the Extended Client before version 2 names it.
pub(crate) const LEGACY_SIZE_ATTRIBUTE: &str = "SQSLargePayloadSize";
/// The first element of a pointer body.
const POINTER_CLASS: &str = "software.amazon.payloadoffloading.PayloadS3Pointer";
/// The message attributes only the Extended Client sets: a message of one's
/// own that carried one would be taken for a pointer.
pub const RESERVED_ATTRIBUTES: [&str; 2] = [SIZE_ATTRIBUTE, LEGACY_SIZE_ATTRIBUTE];

/// Whether `class` names a pointer: the class the Extended Client writes
/// since version 2, or one its versions before wrote, which it still reads
/// (`com.amazon.sqs.javamessaging.MessageS3Pointer` and the names its
/// packages had, `com.(amazon|amazonaws).(sqs|services).(javamessaging|extendedmessaging).MessageS3Pointer`).
fn is_pointer_class(class: &str) -> bool {
    let legacy = || {
        let parts: Vec<&str> = class.split('.').collect();
        matches!(
            parts.as_slice(),
            [
                "com",
                "amazon" | "amazonaws",
                "sqs" | "services",
                "javamessaging" | "extendedmessaging",
                "MessageS3Pointer"
            ]
        )
    };
    class == POINTER_CLASS || legacy()
}

/// Where a payload kept in S3 is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PayloadPointer {
    /// The bucket.
    pub bucket: String,
    /// The object's key in it.
    pub key: String,
}

/// The pointer's object as the body carries it.
#[derive(Serialize, Deserialize)]
struct Location {
    #[serde(rename = "s3BucketName")]
    bucket: String,
    #[serde(rename = "s3Key")]
    key: String,
}

impl PayloadPointer {
    /// The pointer a body holds, or why it holds none.
    pub fn parse(body: &str) -> Result<Self, String> {
        let (class, location): (String, Location) = serde_json::from_str(body).map_err(|error| {
            format!("a message marked {SIZE_ATTRIBUTE} must have an S3 pointer for its body: {error}")
        })?;
        if !is_pointer_class(&class) {
            return Err(format!("`{class}` is not an S3 pointer (expected {POINTER_CLASS})"));
        }
        if location.bucket.is_empty() || location.key.is_empty() {
            return Err("the S3 pointer names no bucket or no key".into());
        }
        Ok(Self { bucket: location.bucket, key: location.key })
    }

    /// The body that carries this pointer, as the Extended Client writes it.
    pub fn body(&self) -> String {
        let location = Location { bucket: self.bucket.clone(), key: self.key.clone() };
        // A tuple serializes as the array the Extended Client writes; serializing two strings cannot fail.
        serde_json::to_string(&(POINTER_CLASS, location)).unwrap_or_default()
    }
}

impl fmt::Display for PayloadPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// Why a payload could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// No object at the pointer: deleted after an earlier delivery, by the
    /// bucket's lifecycle rule, or never written.
    #[error("no object at {0}: deleted after an earlier delivery or by a lifecycle rule, or never written")]
    Missing(PayloadPointer),
    /// The object is larger than the consumer reads.
    #[error("the object at {pointer} has {size} bytes, over SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES={limit}")]
    TooLarge {
        /// Where it is.
        pointer: PayloadPointer,
        /// Its size, as far as it was read.
        size: u64,
        /// The largest payload read.
        limit: u64,
    },
    /// The object is not UTF-8 text, as a message body must be.
    #[error("the object at {0} is not UTF-8 text")]
    NotText(PayloadPointer),
    /// The object cannot be reached from here, however often asked: its
    /// bucket is in another Region, or gone.
    #[error("the object at {pointer} cannot be reached: {reason}")]
    Unreachable {
        /// Where it is.
        pointer: PayloadPointer,
        /// Why.
        reason: String,
    },
    /// S3 refused or failed the request.
    #[error("S3 refused or failed the request for {pointer}: {reason}")]
    Unavailable {
        /// Where it is.
        pointer: PayloadPointer,
        /// What S3 said.
        reason: String,
    },
}

/// Where payloads too large for a message are kept: S3 in production.
#[async_trait]
pub trait PayloadStore: Send + Sync + fmt::Debug {
    /// The payload at `pointer`, read into memory once, refused past
    /// `limit` bytes.
    async fn get(&self, pointer: &PayloadPointer, limit: u64) -> Result<String, PayloadError>;

    /// Writes `payload` at `pointer`, replacing what is there: writing one
    /// payload twice under its pointer leaves it as written once.
    async fn put(&self, pointer: &PayloadPointer, payload: &str) -> Result<(), PayloadError>;

    /// Deletes the object at `pointer`; deleting one that is gone succeeds.
    async fn delete(&self, pointer: &PayloadPointer) -> Result<(), PayloadError>;
}

/// How records that carry a pointer are read (docs/configuration.md,
/// *Large messages*).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadOptions {
    /// Read the payload a pointer names (`SQS_ONCE_LARGE_PAYLOADS`); off, the
    /// pointer is the body.
    pub fetch: bool,
    /// The largest payload read, in bytes (`SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES`).
    pub max_bytes: u64,
    /// Delete the object once its record succeeded
    /// (`SQS_ONCE_LARGE_PAYLOAD_DELETE`).
    pub delete_after: bool,
    /// The payloads read that the process holds at once, in bytes
    /// (`SQS_ONCE_LARGE_PAYLOAD_MEMORY`).
    pub memory: u64,
    /// Where the payloads of staged messages too large to send are written
    /// (`SQS_ONCE_LARGE_PAYLOAD_BUCKET`); without one, staging refuses them.
    pub bucket: Option<String>,
    /// The size past which a staged message goes through S3, body and
    /// attributes as SQS counts them (`SQS_ONCE_LARGE_PAYLOAD_THRESHOLD`).
    pub threshold: usize,
}

impl PayloadOptions {
    /// How staged messages too large to send go through S3, when a bucket is set.
    pub fn offload(&self) -> Option<Offload> {
        let bucket = self.bucket.clone()?;
        Some(Offload { bucket, max_bytes: self.max_bytes, threshold: self.threshold })
    }
}

/// How a staged message too large for its destination, or for an outbox
/// entry, goes through S3: its payload in `bucket`, at most `max_bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offload {
    /// The bucket (`SQS_ONCE_LARGE_PAYLOAD_BUCKET`).
    pub bucket: String,
    /// The largest payload written (`SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES`).
    pub max_bytes: u64,
    /// The size past which a message goes through S3, its destination's
    /// own limit if lower (`SQS_ONCE_LARGE_PAYLOAD_THRESHOLD`).
    pub threshold: usize,
}

impl Offload {
    /// Where the payload of the outbox entry whose outbox id is `outbox_id`
    /// is kept: the same however often the entry is committed or sent, so
    /// that a commit sent again writes the same object, and a sweep sends a
    /// pointer to it.
    pub fn pointer(&self, outbox_id: &str) -> PayloadPointer {
        PayloadPointer { bucket: self.bucket.clone(), key: format!("sqs-once/{outbox_id}") }
    }
}

/// The largest payload read unless `SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES` says
/// otherwise.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// The payloads a process holds at once unless
/// `SQS_ONCE_LARGE_PAYLOAD_MEMORY` says otherwise: half the template's
/// function memory (256 MB).
pub(crate) const DEFAULT_MEMORY: u64 = 128 * 1024 * 1024;

/// The size past which a staged message goes through S3 unless
/// `SQS_ONCE_LARGE_PAYLOAD_THRESHOLD` says otherwise: the Extended
/// Client's own default, and what SNS, and a queue whose
/// `MaximumMessageSize` was left at 256 KiB, take.
pub(crate) const DEFAULT_THRESHOLD: usize = 256 * 1024;

impl Default for PayloadOptions {
    fn default() -> Self {
        Self {
            fetch: true,
            max_bytes: DEFAULT_MAX_BYTES,
            delete_after: false,
            memory: DEFAULT_MEMORY,
            bucket: None,
            threshold: DEFAULT_THRESHOLD,
        }
    }
}
