//! Where claims live: the [`ClaimStore`] trait, its capabilities, and the
//! in-memory store. `sqs_once::store` re-exports them beside the DynamoDB and
//! SQLite stores and says how to write a store of one's own.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;

use crate::{
    clock::duration_ms,
    transaction::{Refusal, Write, item_keys},
};

pub mod items;
mod memory;
mod outbox_entry;
mod stored;

pub use stored::{ClaimStatus, Finish, StoredClaim};

pub use outbox_entry::{OutboxEntry, OutboxQuery, SweepPart, UnreadableEntry};

pub use memory::MemoryStore;

/// The outcome of [`ClaimStore::put_if_free`].
#[derive(Debug, Clone, PartialEq)]
pub enum PutOutcome {
    /// The record was written: the caller holds the claim.
    Claimed,
    /// Another record holds the key. It is returned when the store can say
    /// what it is in the same request; `None` makes the state machine read it.
    Taken(Option<Box<StoredClaim>>),
}

/// The outcome of a write fenced by a claim's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// The caller still held the claim and the write took effect.
    Applied,
    /// The claim is no longer the caller's (its lease was taken over, or it is
    /// gone): nothing was written.
    Refused,
}

/// A handler's staged writes and outbox entries, to commit in one
/// transaction with the completion of its claim (see [`crate::transaction`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    /// The claim's completion.
    pub finish: Finish,
    /// `None` when the caller holds the claim (in progress under the
    /// commit's token), which the commit finishes. A run that took no claim
    /// (its handler stages every effect) commits the claim it never took.
    pub unclaimed: Option<Unclaimed>,
    /// The handler's writes, in the order it staged them.
    pub writes: Vec<Write>,
    /// The outbox entries of the messages it staged.
    pub outbox: Vec<OutboxEntry>,
    /// Set when the commit is its one write alone, which records the key in
    /// its item (see [`item_keys`]): then `writes` holds one update and
    /// `outbox` nothing, and the store writes no claim (a run that claimed
    /// first completes its claim after, with [`ClaimStore::finish`]).
    pub key_in_item: Option<item_keys::KeyInItem>,
}

/// The claim a run that took none commits: written, finished, where the
/// key is free, instead of finishing a claim in progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Unclaimed {
    /// The claim as the run would have taken it (its token the commit's);
    /// the commit writes it with [`Commit::finish`] applied.
    pub claim: StoredClaim,
    /// The time the key must be free at, by [`StoredClaim::is_free`].
    pub now_ms: u64,
    /// How long past `now_ms` the completion of any run of the key that
    /// decides from then on is remembered at least, milliseconds: the key
    /// memory, or twice the redelivery window when that is longer. What
    /// refuses this commit's late send may be such a run's completion, so
    /// the commit is sent within it ([`Commit::send_by_ms`]).
    pub remembered_ms: u64,
}

impl Commit {
    /// What the key's claim as stored (`stored`) answers this commit under
    /// `token` before its writes are evaluated; `None` when it may apply.
    /// An attempt that meets its own earlier, applied attempt (the claim
    /// finished under `token`) is [`Committed::Applied`].
    pub fn judged_by(&self, token: &str, stored: Option<&StoredClaim>) -> Option<Committed> {
        let ours = stored.filter(|claim| claim.token.as_deref() == Some(token));
        if ours.is_some_and(|claim| claim.status == self.finish.status) {
            return Some(Committed::Applied);
        }
        match &self.unclaimed {
            None if ours.is_some_and(|claim| claim.status == ClaimStatus::InProgress) => None,
            None => Some(Committed::Refused),
            Some(unclaimed) => match stored {
                Some(claim) if !claim.is_free(unclaimed.now_ms) => {
                    Some(Committed::Taken(Some(Box::new(claim.clone()))))
                }
                _ => None,
            },
        }
    }

    /// The last moment (epoch milliseconds) this commit may still be sent,
    /// for a commit that takes no claim or keeps its key in its item; `None`
    /// for one that finishes a claim, whose token refuses it whenever it
    /// comes.
    ///
    /// A commit without a claim is conditioned on its key being free, and
    /// what refuses a second application is the key's completion: its own
    /// (an earlier send applied unseen) or a redelivery's. Once that record
    /// can have expired and been deleted by the table's TTL, a late send
    /// would find the key free and apply again; and after DynamoDB's ten
    /// minutes a request token is new. So every send, first or again, goes
    /// out before the completion it writes could expire, and that of any
    /// run that decided after it ([`Unclaimed::remembered_ms`]), and within
    /// the token's window, each less a margin (a send's own time, clocks that
    /// differ); after that it is given up, and the record's redelivery
    /// (reported `uncommitted`) decides. A commit that keeps its key in its
    /// item is refused by that key while the item keeps it, a key memory at
    /// least, claim or not: it keeps the same time.
    pub fn send_by_ms(&self) -> Option<u64> {
        let (decided_ms, remembered_ms) = match (&self.unclaimed, &self.key_in_item) {
            (Some(unclaimed), _) => (unclaimed.now_ms, unclaimed.remembered_ms),
            (None, Some(key)) => (key.now_ms, key.memory_ms),
            (None, None) => return None,
        };
        let token_window = decided_ms + duration_ms(TOKEN_WINDOW - SEND_MARGIN);
        let expiry = (self.finish.expires_at_s * 1000).saturating_sub(duration_ms(SEND_MARGIN));
        // Not only its own completion: a run that decided after this commit was made (a copy's, its lease
        // perhaps ending before this one's) keeps its completion this long at least.
        let others = (decided_ms + remembered_ms).saturating_sub(duration_ms(SEND_MARGIN));
        Some(token_window.min(expiry).min(others))
    }

    /// The claim as this commit leaves it, `stored` being the one it
    /// finishes (ignored for an unclaimed commit, which writes its own).
    pub fn finished_claim(&self, stored: Option<&StoredClaim>) -> Option<StoredClaim> {
        let mut claim = self.unclaimed.as_ref().map(|unclaimed| &unclaimed.claim).or(stored)?.clone();
        claim.apply(&self.finish);
        Some(claim)
    }
}

/// How long DynamoDB answers a `TransactWriteItems` sent again with the same
/// `ClientRequestToken` as it answered the first: "A client request token is
/// valid for 10 minutes after the first request that uses it is completed.
/// After 10 minutes, any request with the same client token is treated as a
/// new request" (the API reference).
pub const TOKEN_WINDOW: Duration = Duration::from_secs(600);

/// Kept back from each bound of [`Commit::send_by_ms`]: how long after it
/// was sent a request may still reach DynamoDB and apply, its caller long
/// gone (its attempt timeout is 2 s by default, but a request held in the
/// network and delivered late applies when it arrives), and clocks that
/// differ by a second. A commit without a claim is safe only if it lands
/// while what refuses it exists: its own completion, and that of any run
/// of the key that decided after it was sent (see `UNCLAIMED_MEMORY`).
pub const SEND_MARGIN: Duration = Duration::from_secs(60);

/// The shortest time the key of a commit is remembered from the moment the
/// commit was made, whatever `SQS_ONCE_EXPIRES_AFTER_SECS` says: a
/// [`SEND_MARGIN`] to be sent in (first or again, [`Commit::send_by_ms`])
/// and another to land and be answered. A shorter memory would give every
/// commit up before its first send, at every delivery, until the
/// dead-letter queue: nothing applied twice, and nothing applied at all.
pub const COMMIT_MEMORY: Duration = Duration::from_secs(2 * SEND_MARGIN.as_secs());

/// The outcome of [`CommitStore::commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed {
    /// Everything applied: the claim is completed, the writes and the outbox
    /// entries are in place. Also the answer when an earlier attempt of the
    /// same commit had applied unseen.
    Applied,
    /// The claim is no longer the caller's (its lease was taken over, or it
    /// is gone): nothing applied.
    Refused,
    /// A staged write's own condition did not hold: nothing applied.
    Cancelled(Cancellation),
    /// An unclaimed commit found the key not free: nothing applied. The
    /// record that holds it is returned when the store can say what it is
    /// in the same request; `None` makes the state machine read it.
    Taken(Option<Box<StoredClaim>>),
    /// A commit that keeps its key in its item ([`Commit::key_in_item`])
    /// found the key there: the run's effect had applied, by an earlier
    /// attempt of this commit or by another run of the key. Nothing applied
    /// now.
    InItemAlready,
    /// A commit that keeps its key in its item found the item's window of
    /// keys full ([`item_keys::MAX_KEYS_PER_WINDOW`]): nothing applied, and
    /// no commit into the item can apply before the window turns.
    WindowFull {
        /// The item, described.
        item: String,
        /// How long until the window turns, from the commit's making.
        turns_in: Duration,
    },
}

impl Committed {
    /// The answer to `key`'s commit of `write` into an item whose window
    /// under way, begun at `since_ms`, is full
    /// ([`InItem::Full`](item_keys::InItem::Full)): refused until the window
    /// turns.
    pub fn window_full(key: &item_keys::KeyInItem, write: &Write, since_ms: u64) -> Self {
        let item = write.target().map_or_else(|| write.describe(), |target| target.describe());
        Self::WindowFull { item, turns_in: key.window_turns_in(since_ms) }
    }
}

impl StoreError {
    /// The error of `key`'s commit into an item whose window under way,
    /// begun at `since_ms`, came too late for it
    /// ([`InItem::Late`](item_keys::InItem::Late)): given up, not sent.
    pub fn window_too_late(key: &item_keys::KeyInItem, since_ms: Option<u64>) -> Self {
        Self::unavailable(format!(
            "the item's window of kept keys began at {} (epoch ms), a key memory ({} ms) or more after the commit \
             was made at {}: too late to be sent, given up unsent; the record's redelivery decides",
            since_ms.unwrap_or_default(),
            key.memory_ms,
            key.now_ms
        ))
    }
}

/// Which staged write cancelled a commit, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Cancellation {
    /// The write, by its place in [`Commit::writes`].
    pub write: usize,
    /// How the handler fails for it, as the write declared
    /// ([`Write::refusal`]).
    pub refusal: Refusal,
    /// The reason of each action of the transaction, as the store gave
    /// them (DynamoDB's cancellation reasons, in order).
    pub reasons: String,
}

impl Cancellation {
    /// The cancellation of a commit of `writes` by the one at `write`, for
    /// `reasons`: the handler fails as that write declared.
    pub fn by(writes: &[Write], write: usize, reasons: String) -> Self {
        let refusal = writes.get(write).map(Write::refusal).unwrap_or_default();
        Self { write, refusal, reasons }
    }
}

/// Which claims an operator lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimQuery {
    /// Only claims in this state; `None` lists the open ones (in progress and failed).
    pub status: Option<ClaimStatus>,
    /// Only in-progress claims whose lease had ended at this time (work that crashed).
    pub stale_at_ms: Option<u64>,
    /// Only the claim made by the delivery with this SQS message id.
    pub message_id: Option<String>,
    /// At most this many claims.
    pub limit: usize,
}

impl ClaimQuery {
    /// Whether `record` belongs in the listing; every store filters with this.
    pub fn matches(&self, claim: &StoredClaim) -> bool {
        let status = match self.status {
            Some(status) => claim.status == status,
            None => claim.status != ClaimStatus::Completed,
        };
        status
            && self.stale_at_ms.is_none_or(|now_ms| claim.is_stale(now_ms))
            && self.message_id.as_ref().is_none_or(|message_id| claim.message_id.as_ref() == Some(message_id))
    }

    /// The listing of those of `claims` that match, oldest first,
    /// at most `limit` of them.
    ///
    /// ```
    /// use sqs_once::store::{ClaimQuery, ClaimStatus, StoredClaim};
    ///
    /// let claim = |id: &str, status, claimed_at_ms| StoredClaim {
    ///     id: id.into(), status, expires_at_s: u64::MAX / 1000, lease_until_ms: None, token: None, holder: None,
    ///     attempt: None, message_id: None, claimed_at_ms: Some(claimed_at_ms), updated_at_ms: None, payload_hash: None,
    ///     result: None, error: None,
    /// };
    /// let claims = vec![
    ///     claim("late", ClaimStatus::Failed, 20),
    ///     claim("done", ClaimStatus::Completed, 5),
    ///     claim("early", ClaimStatus::Failed, 10),
    /// ];
    /// let open = ClaimQuery { limit: 10, ..ClaimQuery::default() }.select(claims, false);
    /// let ids: Vec<&str> = open.claims.iter().map(|claim| claim.id.as_str()).collect();
    /// assert_eq!(ids, ["early", "late"]); // open claims only, oldest first
    /// ```
    pub fn select(&self, claims: impl IntoIterator<Item = StoredClaim>, full_scan: bool) -> Listing {
        let mut claims: Vec<StoredClaim> = claims.into_iter().filter(|claim| self.matches(claim)).collect();
        claims.sort_by_key(|claim| claim.claimed_at_ms);
        claims.truncate(self.limit);
        Listing { claims, full_scan }
    }

    /// The states whose claims can match.
    pub fn statuses(&self) -> Vec<ClaimStatus> {
        match (self.status, self.stale_at_ms) {
            (_, Some(_)) => vec![ClaimStatus::InProgress],
            (Some(status), None) => vec![status],
            (None, None) => vec![ClaimStatus::InProgress, ClaimStatus::Failed],
        }
    }
}

/// Claims found by [`ClaimAdmin::list`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listing {
    /// The claims, at most the query's limit.
    pub claims: Vec<StoredClaim>,
    /// The store had to read every claim to answer (no index for the query).
    pub full_scan: bool,
}

/// A failure to reach or understand the store. Records that meet one are
/// reported failed and never marked done.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or refused the request (I/O error,
    /// network, throttling, timeout).
    #[error("claim store unavailable: {0}")]
    Unavailable(Box<dyn std::error::Error + Send + Sync>),
    /// The store holds a record this version cannot read.
    #[error("stored claim `{id}` is malformed: {reason}")]
    Malformed {
        /// The record's id.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The record changed under every attempt to claim it.
    #[error("stored claim `{0}` kept changing while it was being claimed")]
    Contended(String),
    /// The store refused the request for what it holds (an item over the
    /// size limit, a key too long): sending it again cannot succeed.
    #[error("claim store rejected the request: {0}")]
    Rejected(String),
    /// The store does not do what was asked of it.
    #[error("{0}")]
    Unsupported(String),
}

impl StoreError {
    /// Wraps a backend error as [`StoreError::Unavailable`].
    pub fn unavailable(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Unavailable(error.into())
    }
}

/// Atomic operations on stored claims, keyed by their stored id: the four
/// every store offers, and the capabilities a store may add, each a trait
/// of its own that [`capabilities`](Self::capabilities) hands out when the
/// store has it.
///
/// Implementations must make each method atomic with respect to every other
/// caller of the same store, including other processes when the store is
/// shared. The state machine supplies all timestamps, so a store never reads
/// a clock of its own.
///
/// A store with the four methods alone runs handlers that stage nothing; a
/// consumer that needs more (a handler that stages every effect needs
/// commits; `sqs-once claims` needs the listing) refuses to start on it,
/// naming what is missing.
#[async_trait]
pub trait ClaimStore: Send + Sync {
    /// Writes `claim` (replacing what is there) if no claim holds its id or
    /// the one that does is free at `now_ms` by [`StoredClaim::is_free`].
    async fn put_if_free(&self, claim: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError>;

    /// Reads a record, with strong consistency.
    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError>;

    /// Records the end of an in-progress claim that still carries `token`.
    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError>;

    /// Deletes an in-progress claim that still carries `token`. A key no
    /// record holds counts as released ([`Fenced::Applied`]): a retried
    /// release whose first attempt applied unseen finds it so, and a free key
    /// is what a release wants. Only another holder's record refuses it.
    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError>;

    /// The answer of a batch is due by `until`: writes waiting to be sent
    /// together go out now, and until then without waiting for a free
    /// request slot. Stores that send each write at once have nothing to do.
    fn expedite(&self, until: tokio::time::Instant) {
        let _ = until;
    }

    /// Opens, ahead of the first batch, what its calls will need. The Lambda
    /// function calls it in its init phase when that phase runs ahead of any
    /// invocation (provisioned concurrency), so that the first batch finds
    /// its connections open. Best effort: a failure is logged, not returned,
    /// and calls open what they need themselves. Stores with nothing to open
    /// do nothing (the default).
    async fn connect(&self) {}

    /// Whether concurrent calls share requests, as batched statements do.
    /// The engine then claims records ahead of its handlers and lets a
    /// record's finishing write overlap the next record's claim: they travel
    /// in the requests that go out anyway. A store that sends each call as a
    /// request of its own answers `false` (the default), and the engine
    /// keeps its calls under way within the concurrency bound.
    fn gathers_calls(&self) -> bool {
        false
    }

    /// What the store offers beside its claims: its listing and operator
    /// edits, its commits of staged writes, its outbox ([`Capabilities`]).
    /// None of them by default; a store that offers all three answers
    /// [`Capabilities::all`], and a store that wraps another forwards this
    /// one call.
    fn capabilities(self: Arc<Self>) -> Capabilities {
        Capabilities::default()
    }
}

/// What a claim store offers beside its claims
/// ([`ClaimStore::capabilities`]), each a trait of its own.
#[derive(Clone, Default)]
pub struct Capabilities {
    /// Listing claims and an operator's edits (`sqs-once claims`).
    pub admin: Option<Arc<dyn ClaimAdmin>>,
    /// Commits of staged writes with a claim's completion
    /// ([`crate::transaction`]); without them, a handler's staged writes
    /// fail its record for good.
    pub commits: Option<Arc<dyn CommitStore>>,
    /// The outbox of messages committed with staged writes.
    pub outbox: Option<Arc<dyn OutboxStore>>,
}

impl Capabilities {
    /// All three, of a store that offers them.
    pub fn all<S: ClaimAdmin + CommitStore + OutboxStore + 'static>(store: Arc<S>) -> Self {
        Self { admin: Some(Arc::clone(&store) as _), commits: Some(Arc::clone(&store) as _), outbox: Some(store) }
    }
}

impl std::fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capabilities")
            .field("admin", &self.admin.is_some())
            .field("commits", &self.commits.is_some())
            .field("outbox", &self.outbox.is_some())
            .finish()
    }
}

/// Listing claims and changing one as an operator saw it: what `sqs-once
/// claims` needs of a store ([`Capabilities::admin`]).
#[async_trait]
pub trait ClaimAdmin: Send + Sync {
    /// Claims matching `query`, for operators.
    async fn list(&self, query: &ClaimQuery) -> Result<Listing, StoreError>;

    /// Replaces the record `seen` was read from with `record` (or deletes it,
    /// for `None`), if it is still in the state seen (same status and token).
    /// `seen` of `None` means the key had no record, and still must not.
    async fn replace_seen(
        &self,
        seen: Option<&StoredClaim>,
        record: Option<&StoredClaim>,
    ) -> Result<Fenced, StoreError>;
}

/// Commits of a handler's staged writes with its claim's completion
/// ([`Capabilities::commits`]).
#[async_trait]
pub trait CommitStore: Send + Sync {
    /// Applies `commit` atomically, if the in-progress claim `id` still
    /// carries `token` (for an unclaimed commit: if the key is free, see
    /// [`Unclaimed`]) and every staged write's condition holds: the
    /// claim's completion, the writes and the outbox entries, or nothing.
    /// An attempt that meets its own earlier, applied attempt answers
    /// [`Committed::Applied`]. A store without an outbox refuses a commit
    /// that holds outbox entries with [`StoreError::Unsupported`]. A store
    /// whose records expire by a TTL (a key free again once deleted) sends no
    /// attempt of a commit without a claim after [`Commit::send_by_ms`], and
    /// answers it with an error.
    ///
    /// A commit that keeps its key in its item ([`Commit::key_in_item`],
    /// only for a store that [`keeps_keys_in_items`](Self::keeps_keys_in_items))
    /// applies its one update with the key added to the item's keys, as
    /// [`KeyInItem::judge`](item_keys::KeyInItem::judge) and
    /// [`added_to`](item_keys::KeyInItem::added_to) say, in one conditional
    /// write, and writes no claim: [`Committed::InItemAlready`] when the item
    /// holds the key, a cancellation when the update's own condition does not
    /// hold, [`Committed::WindowFull`] when the item's window is full, and
    /// an error, nothing applied, when the item's window began too late for
    /// the commit ([`item_keys::InItem::Late`]).
    async fn commit(&self, id: &str, token: &str, commit: &Commit) -> Result<Committed, StoreError>;

    /// Whether the store commits a run's one update with its key kept in
    /// the updated item ([`Commit::key_in_item`]). By default it does not,
    /// and such runs commit their claim with their update.
    fn keeps_keys_in_items(&self) -> bool {
        false
    }
}

/// The outbox: messages committed with staged writes, until they are sent
/// ([`Capabilities::outbox`]).
#[async_trait]
pub trait OutboxStore: Send + Sync {
    /// Outbox entries, oldest run first and each run's in order; entries
    /// the store cannot read are skipped ([`unreadable`](Self::unreadable)).
    async fn entries(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>, StoreError>;

    /// What a sweep reads: at most `limit` entries, due or not (an entry of
    /// a run held by another sender tells the sweep to leave the run's later
    /// ones), each run's listed from its first, oldest run first. A store
    /// whose outbox may grow beyond what a process holds reads a bounded
    /// part of it, going on where the last sweep's part ended, so that
    /// entries that cannot be sent do not hide the others (the DynamoDB
    /// store does). Its entries may leave their messages' bodies out (the
    /// DynamoDB store's do): a sweep sends the entry
    /// [`take_entry`](Self::take_entry) gives it, whole. By default,
    /// [`entries`](Self::entries).
    async fn sweep_listing(&self, limit: usize) -> Result<Vec<OutboxEntry>, StoreError> {
        self.entries(&OutboxQuery { due_at_ms: None, limit }).await
    }

    /// [`sweep_listing`](Self::sweep_listing), and whether the listings
    /// since the last that said so went through the whole outbox: `sqs-once
    /// claims outbox --send` sweeps until a whole pass sends nothing. By
    /// default, whether the listing held fewer than `limit` entries.
    async fn sweep_part(&self, limit: usize) -> Result<SweepPart, StoreError> {
        let entries = self.sweep_listing(limit).await?;
        Ok(SweepPart { passed: entries.len() < limit, entries })
    }

    /// The sweep of the part [`sweep_part`](Self::sweep_part) last read
    /// handled every entry it listed (sent it, or left it to its retry time
    /// or to the sender holding it): the next part goes on after it. A sweep
    /// cut short before it took every due entry it listed does not call it,
    /// so the next reads the same part again, less what was sent. A store
    /// that keeps where the next part starts for every sweeper keeps it here
    /// (the DynamoDB store does, unless another sweeper moved it since this
    /// one read it). By default nothing, as for a store that reads its
    /// outbox from its start.
    async fn sweep_part_handled(&self) {}

    /// Entries the store holds and cannot read, at most `limit`, which
    /// [`entries`](Self::entries) and [`sweep_listing`](Self::sweep_listing)
    /// skip: for operators (`sqs-once claims outbox`). By default none, as
    /// for a store that reads every entry it keeps.
    async fn unreadable(&self, limit: usize) -> Result<Vec<UnreadableEntry>, StoreError> {
        let _ = limit;
        Ok(Vec::new())
    }

    /// Whether the store holds the entry stored as `id`, readable or not, as
    /// of a read after every write it acknowledged: a sweep asks before it
    /// sends a run's message whose earlier one it did not list (one it cannot
    /// read, or one a listing's bounded part did not reach). By default, from
    /// [`entries`](Self::entries) and [`unreadable`](Self::unreadable).
    async fn holds_entry(&self, id: &str) -> Result<bool, StoreError> {
        let every = OutboxQuery { due_at_ms: None, limit: usize::MAX };
        Ok(self.entries(&every).await?.iter().any(|entry| entry.id == id)
            || self.unreadable(usize::MAX).await?.iter().any(|entry| entry.id == id))
    }

    /// Gives `entry`'s sending lease to `token` until `lease_until_ms`, if
    /// the entry is still there under the token it was listed with, and
    /// returns the entry as taken: its message whole (a listing may have left
    /// its body out) under the new lease. `None` when it is not: another
    /// sender took it, or it was sent and deleted.
    ///
    /// Taken over again and again while its destination refuses it, an
    /// entry should cost what its lease costs, not its message: the DynamoDB
    /// store writes the lease to an item of its own rather than rewrite the
    /// entry, which DynamoDB would charge by the whole item's size, and reads
    /// the message then, so that a sweep holds the bodies of the entries it
    /// sends, not of every entry it lists.
    async fn take_entry(
        &self,
        entry: &OutboxEntry,
        token: &str,
        lease_until_ms: u64,
    ) -> Result<Option<OutboxEntry>, StoreError>;

    /// Gives `entry`'s sending lease up after a send that failed, if
    /// `entry.token` still holds it: no sender holds the entry from then on
    /// (its token [`OutboxEntry::released_token`] of `failed_sends`, the
    /// failed sends in a row so far), a sweep takes it again from
    /// `retry_at_ms` as it would at a lease's end, and an operator's
    /// `sqs-once claims outbox --send` at once, rather than wait out a lease
    /// nobody is using. `Refused` when another sender holds it now.
    ///
    /// By default a take by the released token; the DynamoDB store writes
    /// the lease alone, without the take's read of the entry.
    async fn release_entry(
        &self,
        entry: &OutboxEntry,
        failed_sends: u32,
        retry_at_ms: u64,
    ) -> Result<Fenced, StoreError> {
        let taken = self.take_entry(entry, &OutboxEntry::released_token(failed_sends), retry_at_ms).await?;
        Ok(if taken.is_some() { Fenced::Applied } else { Fenced::Refused })
    }

    /// Deletes the sent entry `id`, if it is still leased to `token` or
    /// `token` is the committing run's ([`OutboxEntry::committing_token`]),
    /// which deletes each message it sent, taken over since or not; another
    /// sender's token is [`Fenced::Refused`]. An entry that is gone counts
    /// as deleted.
    async fn entry_sent(&self, id: &str, token: &str) -> Result<Fenced, StoreError>;
}

/// The id a [`ClaimAdmin::replace_seen`] call is about.
pub fn replaced_id<'r>(seen: Option<&'r StoredClaim>, record: Option<&'r StoredClaim>) -> Option<&'r str> {
    seen.or(record).map(|record| record.id.as_str())
}

/// Whether `current` is still the record an operator saw as `seen`.
pub fn unchanged(seen: Option<&StoredClaim>, current: Option<&StoredClaim>) -> bool {
    match (seen, current) {
        (None, None) => true,
        (Some(seen), Some(current)) => seen.status == current.status && seen.token == current.token,
        _ => false,
    }
}
