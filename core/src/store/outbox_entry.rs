//! One message in the outbox, as the claim store keeps it, and its sending
//! lease: a token and an end, so that one sender at a time sends it. Here,
//! beside the store that keeps it, rather than with the sending (the
//! engine's outbox), which reads and writes it through the store.
//!
//! The run that committed an entry holds its lease first; an entry whose
//! lease has ended is taken over by a sweep with a write conditioned on the
//! token it read, and deleted once sent by the holder of the lease.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{clock::duration_ms, transaction::Message};

/// What the token of an entry no sender holds starts with
/// ([`OutboxEntry::released_token`]); a sender's token is a UUID.
const RELEASED: &str = "released";

/// One message in the outbox, as the claim store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxEntry {
    /// The stored id: the claim's id, its token, and the message's place
    /// among the run's messages.
    pub id: String,
    /// The claim whose run sent it.
    pub claim_id: String,
    /// The SQS message id of the delivery whose run sent it.
    pub message_id: String,
    /// The message.
    pub message: Message,
    /// The sending lease's token; taking the entry over and deleting it are
    /// conditioned on it.
    pub token: String,
    /// End of the sending lease, epoch milliseconds.
    pub lease_until_ms: u64,
    /// When the run committed it, epoch milliseconds.
    pub created_at_ms: u64,
}

/// An outbox entry the store holds and cannot read: written by another
/// version of sqs-once (a destination this one does not know, after a
/// rollback) or changed by hand. Listings and sweeps skip it, so that it is
/// never a reason to send nothing; `sqs-once claims outbox` shows it, and
/// `sqs-once claims outbox --drop ID --force` gives it up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnreadableEntry {
    /// The stored id.
    pub id: String,
    /// The sending lease's token as stored: dropping the entry is
    /// conditioned on it, as for any entry.
    pub token: String,
    /// What could not be read.
    pub reason: String,
}

impl UnreadableEntry {
    /// The entry `id`, leased to `token`, which cannot be read for `reason`.
    pub fn new(id: impl Into<String>, token: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { id: id.into(), token: token.into(), reason: reason.into() }
    }

    /// Logs that a listing skipped the entry (`OutboxUnreadable`, one line
    /// each time, for a log metric filter to count).
    pub fn skipped(&self) {
        tracing::warn!(
            id = %self.id,
            reason = %self.reason,
            "OutboxUnreadable: an outbox entry this version cannot read is skipped (written by another version?); \
             the others are sent. `sqs-once claims outbox --drop ID --force` gives it up"
        );
    }
}

impl OutboxEntry {
    /// The entries of the messages a run with `token` on claim `claim_id`
    /// staged, leased to that run until `lease_until_ms`.
    pub fn of_run(
        claim_id: &str,
        token: &str,
        message_id: &str,
        messages: &[Message],
        now_ms: u64,
        lease_until_ms: u64,
    ) -> Vec<Self> {
        messages
            .iter()
            .enumerate()
            .map(|(n, message)| Self {
                id: Self::stored_id(claim_id, token, n),
                claim_id: claim_id.to_owned(),
                message_id: message_id.to_owned(),
                message: message.clone(),
                token: token.to_owned(),
                lease_until_ms,
                created_at_ms: now_ms,
            })
            .collect()
    }

    /// The stored id of the `n`th message a run with `token` on claim
    /// `claim_id` staged.
    pub fn stored_id(claim_id: &str, token: &str, n: usize) -> String {
        // Zero-padded, so that listing by id keeps a run's messages in order.
        format!("{claim_id}#outbox#{token}#{n:03}")
    }

    /// The id the message carries wherever it is sent, the same however
    /// often: 64 hexadecimal digits (SHA-256 of the stored id), fit for a
    /// FIFO deduplication id.
    pub fn outbox_id(&self) -> String {
        Self::outbox_id_of(&self.id)
    }

    /// The outbox id of the entry stored as `stored_id`.
    pub fn outbox_id_of(stored_id: &str) -> String {
        hex::encode(Sha256::digest(stored_id.as_bytes()))
    }

    /// The token of an entry no sender holds, after `failed_sends` sends of
    /// it failed (1 at least): its sender gave the lease up
    /// ([`OutboxStore::release_entry`]). A sweep takes it again once its
    /// retry time (its lease's end) has passed, an operator's `sqs-once
    /// claims outbox --send` at once.
    ///
    /// [`OutboxStore::release_entry`]: crate::store::OutboxStore::release_entry
    pub fn released_token(failed_sends: u32) -> String {
        format!("{RELEASED}.{}", failed_sends.max(1))
    }

    /// Whether no sender holds it: its last send failed
    /// ([`released_token`](Self::released_token)).
    pub fn is_released(&self) -> bool {
        self.failed_sends() > 0
    }

    /// How many sends of it failed in a row, as its token says: 0 while a
    /// sender holds it.
    pub fn failed_sends(&self) -> u32 {
        match self.token.strip_prefix(RELEASED) {
            // Written before the token counted them.
            Some("") => 1,
            Some(count) => count.strip_prefix('.').and_then(|count| count.parse().ok()).unwrap_or(0),
            None => 0,
        }
    }

    /// Whether another sender may take the entry over at `now_ms`.
    pub fn is_due(&self, now_ms: u64) -> bool {
        self.lease_until_ms < now_ms
    }

    /// Whether enough of its lease is left at `now_ms` for a send and the
    /// deletion after it (`room`) to end before another sender may take it over.
    pub fn has_room_to_send(&self, now_ms: u64, room: Duration) -> bool {
        now_ms <= self.lease_until_ms.saturating_sub(duration_ms(room))
    }

    /// The run that committed it: its claim and the claim's token, from the
    /// stored id (`<claim>#outbox#<token>#<n>`). A run's entries are sent in
    /// order.
    pub fn run(&self) -> (&str, &str) {
        (&self.claim_id, Self::committing_token(&self.id))
    }

    /// The token of the run that committed the entry stored as `stored_id`
    /// (`<claim>#outbox#<token>#<n>`). That run sends its entries first, and
    /// deletes each it sent, whoever took it over since
    /// ([`OutboxStore::entry_sent`](crate::store::OutboxStore::entry_sent)).
    pub fn committing_token(stored_id: &str) -> &str {
        let mut parts = stored_id.rsplit('#');
        parts.next();
        parts.next().unwrap_or_default()
    }

    /// Its place among its run's messages, from the stored id; `None` for
    /// an id not of that form (one changed by hand).
    pub fn place(&self) -> Option<usize> {
        self.id.rsplit('#').next()?.parse().ok()
    }

    /// The stored id of the message before it in its run, if any.
    pub fn earlier_id(&self) -> Option<String> {
        let place = self.place()?.checked_sub(1)?;
        let (claim, token) = self.run();
        Some(Self::stored_id(claim, token, place))
    }
}

/// What one sweep reads ([`OutboxStore::sweep_part`](crate::store::OutboxStore::sweep_part)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepPart {
    /// The entries read, as [`sweep_listing`](crate::store::OutboxStore::sweep_listing) lists them.
    pub entries: Vec<OutboxEntry>,
    /// Whether this part ends a pass: the parts read since the last pass
    /// ended went through the whole outbox.
    pub passed: bool,
}

impl SweepPart {
    /// The part holding `entries`, ending a pass if `passed`.
    pub fn new(entries: Vec<OutboxEntry>, passed: bool) -> Self {
        Self { entries, passed }
    }
}

/// Which outbox entries [`OutboxStore::entries`](crate::store::OutboxStore::entries) lists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxQuery {
    /// Only entries whose sending lease had ended at this time.
    pub due_at_ms: Option<u64>,
    /// At most this many.
    pub limit: usize,
}
