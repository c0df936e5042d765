//! The claim state machine, written once for every store.
//!
//! One record per stored key:
//!
//! ```text
//!            claim (key free)                 complete (token matches)
//!   (none) ──────────────────▶ INPROGRESS ───────────────────────────▶ COMPLETED
//!     ▲                          │    │        fail (token matches)
//!     │ release (token matches)  │    └──────────────────────────────▶ FAILED
//!     └──────────────────────────┘
//! ```
//!
//! A key is *free* (see [`StoredClaim::is_free`]) when no record holds it, when
//! its in-progress lease has ended, or when a finished record's expiry has
//! passed. A live lease is never taken over because the record's overall
//! expiry passed. Whoever claims a free key gets a fresh random token; the
//! finishing writes are conditioned on it, so a holder whose lease was taken
//! over can neither overwrite nor delete the new holder's claim.
//!
//! Expiry is always judged from the timestamps in the record, never from
//! whether the store has deleted it yet.

use parking_lot::Mutex;
use std::{
    future::Future,
    num::NonZeroUsize,
    sync::{
        Arc, LazyLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use lru::LruCache;
use serde_json::Value;
use tokio::time::Instant;

use crate::{key::payload_hash, report::reason};
use sqs_once_core::{
    clock::{Clock, duration_ms},
    store::{
        COMMIT_MEMORY, ClaimStatus, ClaimStore, Commit, CommitStore, Committed, Fenced, Finish, OutboxEntry,
        PutOutcome, StoreError, StoredClaim, Unclaimed,
    },
    transaction::{Staged, Write, item_keys::KeyInItem},
};

mod unconfirmed;

use unconfirmed::{Ending, Resend, Unconfirmed};

/// A fresh token (of a claim, or of an outbox entry's sending lease): a
/// random per-process prefix and a counter, 32 hexadecimal digits. Tokens
/// fence writes and are not secrets, so uniqueness is all they need, and this
/// costs no system call per claim.
pub(crate) fn new_token() -> String {
    static PREFIX: LazyLock<u64> = LazyLock::new(|| uuid::Uuid::new_v4().as_u64_pair().0);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{:016x}{:016x}", *PREFIX, NEXT.fetch_add(1, Ordering::Relaxed))
}

/// How long a sender holds an outbox entry (the run that committed it
/// first, a sweep that takes it over after): the send and the deletion, each within
/// its time ([`OutboxTimes`](crate::outbox::OutboxTimes)), with room to spare. A sender frozen or
/// stopped longer than this leaves the entry to the next sweep.
pub(crate) const SENDING_LEASE: Duration = Duration::from_secs(15);

/// What the state machine needs to know about one claim attempt.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The stored key.
    pub id: &'a str,
    /// The message body (hashed when payload validation is on).
    pub body: &'a str,
    /// When the invocation must answer, epoch milliseconds; the lease ends a
    /// margin after it.
    pub deadline_ms: u64,
    /// Who claims (the Lambda request id, or the process).
    pub holder: &'a str,
    /// The SQS delivery attempt.
    pub attempt: u32,
    /// The SQS message id of the delivery.
    pub message_id: &'a str,
}

/// A claim that was won: the right to run the handler until `lease_until_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The stored key.
    pub id: String,
    /// The token the finishing writes are conditioned on.
    pub token: String,
    /// End of the lease, epoch milliseconds.
    pub lease_until_ms: u64,
    /// The body hash stored with the claim, when payload validation is on.
    pub payload_hash: Option<String>,
    /// `None` for a claim held in the store. A run that took none (see
    /// `Claims::start_unclaimed`) keeps the claim it would have taken,
    /// which its commit writes where the key is free.
    pub unclaimed: Option<Box<StoredClaim>>,
}

impl Lease {
    fn of(claim: StoredClaim) -> Self {
        Self {
            id: claim.id,
            token: claim.token.unwrap_or_default(),
            lease_until_ms: claim.lease_until_ms.unwrap_or_default(),
            payload_hash: claim.payload_hash,
            unclaimed: None,
        }
    }

    /// Whether the run took no claim: nothing of it is in the store until
    /// it commits.
    pub(crate) fn is_unclaimed(&self) -> bool {
        self.unclaimed.is_some()
    }

    /// The earliest a completion written under this lease may expire, epoch
    /// seconds, when the queue delivers failed records again `within` at
    /// most after their answer (or their receive, unanswered): the lease's
    /// end, plus `within` for a delivery received before then (this run's
    /// own, or a copy's that met the lease as a conflict) to answer, since
    /// an invocation lasts no longer than the visibility timeout, plus
    /// `within` for the queue to bring it back. A record the framework asked
    /// the queue to deliver again because of this run finds the completion.
    fn remembered_until_s(&self, within: Duration) -> u64 {
        let until_ms = self.lease_until_ms.saturating_add(2 * duration_ms(within));
        until_ms.div_ceil(1000) + 1
    }
}

/// The outcome of [`Claims::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key was free and is now ours: run the handler.
    Won(Lease),
    /// The key completed before: a duplicate, not run again.
    Duplicate {
        /// The stored output, if one was stored.
        result: Option<String>,
    },
    /// Another holder's lease is live: try again when it can have ended.
    Conflict {
        /// Time until the key can be claimed.
        retry_after: Duration,
    },
    /// The key failed permanently before: not run again until it expires.
    FailedBefore {
        /// The recorded reason.
        error: Option<String>,
    },
    /// The key was claimed with a different body, and payload validation is on.
    PayloadMismatch,
}

/// Tuning of the state machine; docs/configuration.md has the matching settings.
#[derive(Debug, Clone)]
pub struct ClaimPolicy {
    /// How long a finished key is remembered (`SQS_ONCE_EXPIRES_AFTER_SECS`),
    /// at least: see `redelivered_within`.
    pub expires_after: Duration,
    /// The longest a record the consumer reported failed can stay away
    /// after its answer before the queue delivers it again: the queue's
    /// visibility timeout, or the longest back-off the consumer asks of
    /// the queue, whichever is longer (see [`Self::redelivery_window`]),
    /// and no shorter than an invocation. A completed key is remembered
    /// twice this past its lease, however short `expires_after`: a commit
    /// whose answer was lost is reported `uncommitted`, and its redelivery
    /// must find it. `None` when no queue delivers the records again
    /// (`invoke` of an event file, tests).
    pub redelivered_within: Option<Duration>,
    /// How long after the invocation deadline a lease lasts.
    pub lease_margin: Duration,
    /// Store a body hash and refuse the same key with another body.
    pub validate_payload: bool,
    /// Store the handler's output with the completed claim.
    pub store_result: bool,
    /// Outputs longer than this (bytes of JSON) are not stored.
    pub max_result_bytes: usize,
    /// Completed keys remembered in this process (0 turns the cache off).
    pub local_cache_entries: usize,
    /// Keep the key in the item of every run whose one effect is one
    /// update, as if it said [`keep_key`](sqs_once_core::transaction::Update::keep_key)
    /// (`SQS_ONCE_KEYS_IN_ITEMS`).
    pub keys_in_items: bool,
}

impl Default for ClaimPolicy {
    fn default() -> Self {
        Self {
            expires_after: Duration::from_secs(3600),
            redelivered_within: None,
            lease_margin: Duration::from_secs(2),
            validate_payload: false,
            store_result: false,
            // DynamoDB items are capped at 400 KB; leave room for the rest of the item.
            max_result_bytes: 350 * 1024,
            local_cache_entries: 1024,
            keys_in_items: false,
        }
    }
}

impl ClaimPolicy {
    /// The longest a record reported failed can stay away after its answer
    /// before the queue delivers it again: the queue's `visibility_timeout`
    /// (SQS's own redelivery, and the consumer's when a visibility change
    /// fails), or `longest_delay`, the longest the consumer asks SQS to keep
    /// a record away (if it asks), with its jitter, whichever is longer:
    /// the value of [`redelivered_within`](Self::redelivered_within).
    pub fn redelivery_window(visibility_timeout: Duration, longest_delay: Option<Duration>) -> Duration {
        let longest = longest_delay.map(|delay| delay + jitter_spread(delay));
        visibility_timeout.max(longest.unwrap_or_default())
    }
}

/// The most random jitter adds to a redelivery delay of `delay`: a fifth
/// of it, and a second, so that records failed together do not return
/// together.
pub fn jitter_spread(delay: Duration) -> Duration {
    delay / 5 + Duration::from_secs(1)
}

/// A completed key as remembered by the local cache.
#[derive(Debug, Clone)]
struct Completed {
    expires_at_s: u64,
    payload_hash: Option<String>,
    result: Option<String>,
}

/// Counters of what the state machine saw, for metrics.
#[derive(Debug, Default)]
pub struct ClaimCounters {
    /// Finishing writes refused because the lease had been taken over.
    pub refused: AtomicU64,
    /// Duplicates answered from the local cache, without a store request.
    pub cache_hits: AtomicU64,
    /// Outputs not stored because they were too large.
    pub oversized_results: AtomicU64,
    /// Finishing writes that were not confirmed when first sent and landed
    /// when sent again (in a later batch, or before the process left).
    pub landed_later: AtomicU64,
}

/// A fenced write's answer as a commit's: both are applied or refused.
fn committed(fenced: Fenced) -> Committed {
    match fenced {
        Fenced::Applied => Committed::Applied,
        Fenced::Refused => Committed::Refused,
    }
}

/// A finishing write's answer; only a commit has conditions of its own to
/// be cancelled by.
fn fenced(committed: Committed) -> Fenced {
    match committed {
        Committed::Applied => Fenced::Applied,
        Committed::Refused
        | Committed::Cancelled(_)
        | Committed::Taken(_)
        | Committed::InItemAlready
        | Committed::WindowFull { .. } => Fenced::Refused,
    }
}

/// How many times a claim is retried when the record changes under it.
const CONTENDED_RETRIES: usize = 2;

/// The claim state machine over a [`ClaimStore`].
pub struct Claims {
    store: Arc<dyn ClaimStore>,
    /// The store's commits, if it offers them ([`Capabilities::commits`](sqs_once_core::store::Capabilities::commits)).
    commits: Option<Arc<dyn CommitStore>>,
    clock: Arc<dyn Clock>,
    policy: ClaimPolicy,
    cache: Option<Mutex<LruCache<String, Completed>>>,
    counters: ClaimCounters,
    unconfirmed: Arc<Unconfirmed>,
    /// The policy's `redelivered_within` in milliseconds ([`NOT_REDELIVERED`]
    /// for `None`), which a consumer that learns its queue's visibility
    /// timeout after the start sets ([`Claims::set_redelivered_within`]).
    redelivered_within_ms: AtomicU64,
}

/// `redelivered_within_ms` when no queue delivers the records again.
const NOT_REDELIVERED: u64 = u64::MAX;

impl std::fmt::Debug for Claims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claims").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl Claims {
    /// The state machine over `store`, with the default policy and the system clock.
    #[cfg(any(test, feature = "testing"))]
    pub fn new(store: Arc<dyn ClaimStore>) -> Self {
        Self::with_policy(store, ClaimPolicy::default(), Arc::new(sqs_once_core::clock::SystemClock))
    }

    /// The state machine over `store`, with `policy`, reading time from `clock`.
    pub fn with_policy(store: Arc<dyn ClaimStore>, policy: ClaimPolicy, clock: Arc<dyn Clock>) -> Self {
        let cache = NonZeroUsize::new(policy.local_cache_entries).map(|size| Mutex::new(LruCache::new(size)));
        let commits = Arc::clone(&store).capabilities().commits;
        let redelivered_within_ms = AtomicU64::new(policy.redelivered_within.map_or(NOT_REDELIVERED, duration_ms));
        Self {
            store,
            commits,
            clock,
            policy,
            cache,
            counters: ClaimCounters::default(),
            unconfirmed: Arc::default(),
            redelivered_within_ms,
        }
    }

    /// Sets how long a failed record can stay away before the queue
    /// delivers it again (see [`ClaimPolicy::redelivered_within`]): `poll`
    /// learns it from its queue's visibility timeout once it has read it.
    pub fn set_redelivered_within(&self, within: Option<Duration>) {
        self.redelivered_within_ms.store(within.map_or(NOT_REDELIVERED, duration_ms), Ordering::Relaxed);
    }

    /// How long a failed record can stay away before the queue delivers it
    /// again, as last set.
    pub fn redelivered_within(&self) -> Option<Duration> {
        match self.redelivered_within_ms.load(Ordering::Relaxed) {
            NOT_REDELIVERED => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// The shortest time a completed key is remembered for: the policy's
    /// `expires_after`, or the redelivery window when that is longer.
    pub(crate) fn remembers_at_least(&self) -> Duration {
        self.policy.expires_after.max(self.redelivered_within().unwrap_or_default())
    }

    /// The policy in force.
    pub fn policy(&self) -> &ClaimPolicy {
        &self.policy
    }

    /// The current time, epoch milliseconds, as leases are judged.
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// What the state machine counted so far.
    pub fn counters(&self) -> &ClaimCounters {
        &self.counters
    }

    /// Claims `request.id`: one conditional write, plus one strongly
    /// consistent read only when the store could not say who holds the key.
    pub async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let payload_hash = self.policy.validate_payload.then(|| payload_hash(request.body));
        if let Some(completed) = self.cached(request.id) {
            self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(self.duplicate(completed.payload_hash.as_deref(), payload_hash.as_deref(), completed.result));
        }
        for _ in 0..=CONTENDED_RETRIES {
            let now_ms = self.clock.now_ms();
            let record = self.new_claim(request, now_ms, payload_hash.clone());
            let existing = match self.store.put_if_free(&record, now_ms).await? {
                PutOutcome::Claimed => return Ok(Claim::Won(Lease::of(record))),
                PutOutcome::Taken(Some(existing)) => *existing,
                // The record went away between the write and the read: claim again.
                PutOutcome::Taken(None) => match self.store.get(request.id).await? {
                    Some(existing) => existing,
                    None => continue,
                },
            };
            // A retried write whose first attempt succeeded unseen finds our own claim.
            if existing.token.is_some() && existing.token == record.token {
                return Ok(Claim::Won(Lease::of(record)));
            }
            if let Some(claim) = self.judge(existing, payload_hash.as_deref()) {
                return Ok(claim);
            }
        }
        Err(StoreError::Contended(request.id.to_owned()))
    }

    /// The start of a run that takes no claim, for a handler that stages
    /// every effect: its commit writes the claim's completion where the key
    /// is free, with the staged writes, in one request (see
    /// [`Unclaimed`](sqs_once_core::store::Unclaimed)). A key this process saw
    /// completed is a duplicate; a redelivery (attempt > 1) reads the key
    /// first, one consistent read, since a message delivered before has
    /// likely completed, and finding that out at the commit costs the
    /// handler's run and a refused transaction. Otherwise the lease the
    /// commit is made under, its claim not written.
    pub(crate) async fn start_unclaimed(&self, request: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let payload_hash = self.policy.validate_payload.then(|| payload_hash(request.body));
        if let Some(completed) = self.cached(request.id) {
            self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(self.duplicate(completed.payload_hash.as_deref(), payload_hash.as_deref(), completed.result));
        }
        if request.attempt > 1
            && let Some(existing) = self.store.get(request.id).await?
            && let Some(claim) = self.judge(existing, payload_hash.as_deref())
        {
            return Ok(claim);
        }
        let claim = self.new_claim(request, self.clock.now_ms(), payload_hash);
        Ok(Claim::Won(Lease { unclaimed: Some(Box::new(claim.clone())), ..Lease::of(claim) }))
    }

    /// What the record that holds a key means for an unclaimed commit it
    /// refused ([`Committed::Taken`]); read when the store did not return it.
    pub(crate) async fn taken(&self, lease: &Lease, existing: Option<Box<StoredClaim>>) -> Result<Claim, StoreError> {
        let existing = match existing {
            Some(existing) => Some(*existing),
            None => self.store.get(&lease.id).await?,
        };
        // Free by now (expired since, or gone): the redelivery commits.
        existing
            .and_then(|existing| self.judge(existing, lease.payload_hash.as_deref()))
            .ok_or_else(|| StoreError::Contended(lease.id.clone()))
    }

    /// Marks the lease's claim completed, storing `output` if the policy says so.
    pub async fn complete(&self, lease: &Lease, output: Option<&Value>) -> Result<Fenced, StoreError> {
        let finish = self.finish(lease, ClaimStatus::Completed, self.result_of(lease, output), None);
        self.settle(lease, Ending::Finish(finish)).await.map(fenced)
    }

    /// Records a permanent failure of the lease's claim, with `error` as the
    /// reason (capped at [`reason::MAX_BYTES`], the cut marked). A run that
    /// took no claim writes its failed claim where the key is free: a key
    /// another run completed meanwhile stays completed.
    pub async fn fail(&self, lease: &Lease, error: &str) -> Result<Fenced, StoreError> {
        let error = reason::capped(error).into_owned();
        let finish = self.finish(lease, ClaimStatus::Failed, None, Some(error));
        let Some(unclaimed) = &lease.unclaimed else {
            return self.settle(lease, Ending::Finish(finish)).await.map(fenced);
        };
        let mut failed = (**unclaimed).clone();
        failed.apply(&finish);
        Ok(match self.store.put_if_free(&failed, finish.finished_at_ms).await? {
            PutOutcome::Claimed => Fenced::Applied,
            PutOutcome::Taken(_) => Fenced::Refused,
        })
    }

    /// Deletes the lease's claim so that a redelivery runs again; a run
    /// that took no claim has nothing to delete.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<Fenced, StoreError> {
        if lease.is_unclaimed() {
            return Ok(Fenced::Applied);
        }
        self.settle(lease, Ending::Release).await.map(fenced)
    }

    /// The commit of what a handler staged under `lease` (its writes, an
    /// outbox entry per message, leased to this run for the outbox's
    /// sending lease) with the claim's completion, storing `output` if
    /// the policy says so. `message_id` is the delivery's.
    ///
    /// A run whose one effect is one update that keeps its key
    /// ([`Update::keep_key`](sqs_once_core::transaction::Update::keep_key), or every
    /// such update with [`ClaimPolicy::keys_in_items`]) commits that update
    /// alone, its key kept in the item, where the store can
    /// ([`CommitStore::keeps_keys_in_items`]); a run that claimed first
    /// completes its claim after.
    pub fn prepare_commit(&self, lease: &Lease, output: Option<&Value>, staged: Staged, message_id: &str) -> Commit {
        let mut finish = self.finish(lease, ClaimStatus::Completed, self.result_of(lease, output), None);
        let now_ms = finish.finished_at_ms;
        // Remembered long enough for the commit to land and be answered, however short the key memory.
        finish.expires_at_s = finish.expires_at_s.max((now_ms + duration_ms(COMMIT_MEMORY)).div_ceil(1000));
        let (writes, messages) = staged.into_parts();
        let lease_until_ms = now_ms + duration_ms(SENDING_LEASE);
        let outbox = OutboxEntry::of_run(&lease.id, &lease.token, message_id, &messages, now_ms, lease_until_ms);
        let remembered_ms =
            duration_ms(self.policy.expires_after.max(2 * self.redelivered_within().unwrap_or_default()));
        let unclaimed =
            lease.unclaimed.as_ref().map(|claim| Unclaimed { claim: (**claim).clone(), now_ms, remembered_ms });
        let key_in_item = self.keeps_key_in_item(&writes, &outbox).then(|| {
            let memory = self.key_memory();
            // The key is kept a key memory at least: what a late send of the commit must land within.
            finish.expires_at_s = (now_ms + duration_ms(memory)) / 1000;
            KeyInItem::new(&lease.id, now_ms, memory)
        });
        Commit { finish, unclaimed, writes, outbox, key_in_item }
    }

    /// Whether the run, whose commit holds `writes` and `outbox`, commits
    /// its one update with its key kept in the item: whether or not it
    /// claimed first, so that consumers that claim first and consumers that
    /// do not keep such a key in one place.
    fn keeps_key_in_item(&self, writes: &[Write], outbox: &[OutboxEntry]) -> bool {
        let one_update = match writes {
            [Write::Update(update)] => update.keeps_key() || self.policy.keys_in_items,
            _ => false,
        };
        one_update && outbox.is_empty() && self.commits.as_ref().is_some_and(|commits| commits.keeps_keys_in_items())
    }

    /// How long an item keeps a key at least ([`KeyInItem::memory_ms`]):
    /// the key memory, and three redelivery windows when that is longer,
    /// which covers what a completion is kept for (its run's lease and two
    /// windows past it), and never less than a commit needs to land
    /// (`COMMIT_MEMORY`). The same for every run of the consumer, so that
    /// its runs judge an item's windows alike.
    fn key_memory(&self) -> Duration {
        let memory = self.policy.expires_after.max(3 * self.redelivered_within().unwrap_or_default());
        memory.max(COMMIT_MEMORY)
    }

    /// Commits under the lease (see [`CommitStore::commit`]). Like a
    /// finishing write, the commit is kept until the store answers it, and
    /// sent again before the next batch's runs until one does.
    pub async fn commit(&self, lease: &Lease, commit: Commit) -> Result<Committed, StoreError> {
        self.settle(lease, Ending::Commit(Box::new(commit))).await
    }

    /// Sends again every finishing write (and commit) whose last send ended
    /// in an error, each in a task of its own, so that a thawed or retried
    /// process lands what a freeze or a failure cut off; the same task hands
    /// the outbox entries of a commit that lands to `deliver`, so that a
    /// caller that stops waiting (a batch answering) cuts off neither the
    /// write nor the sending of its messages and their deletion. Writes
    /// whose send is still waiting for its answer are left to it. The future
    /// ends when each resend has an answer (or failed again, to be sent with
    /// the next call) and its messages were handed on.
    pub(crate) fn resend_unconfirmed<D, F>(self: &Arc<Self>, deliver: D) -> impl Future<Output = ()> + Send + 'static
    where
        D: Fn(Vec<OutboxEntry>) -> F + Clone + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let writes: Vec<_> = self
            .unconfirmed
            .to_resend(self.clock.now_ms())
            .into_iter()
            .map(|Resend { lease, ending, sending }| {
                let (claims, deliver) = (Arc::clone(self), deliver.clone());
                tokio::spawn(async move {
                    let result = claims.send(&lease, &ending).await;
                    let landed = matches!(result, Ok(Committed::Applied));
                    sending.answered(&result);
                    if let Ok(Committed::Taken(_)) = result {
                        tracing::info!(
                            id = %lease.id,
                            "commit refused: the key was taken by another run meanwhile (a copy's commit), which is \
                             the one that counts; nothing of this run applied"
                        );
                    }
                    if let Ok(Committed::InItemAlready) = result {
                        tracing::info!(
                            id = %lease.id,
                            "commit refused: the key is kept in its item already (a copy's commit applied the effect, \
                             or an earlier send of this one did); nothing applied now"
                        );
                    }
                    if !landed {
                        return;
                    }
                    claims.counters.landed_later.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(id = %lease.id, write = ending.name(), "unconfirmed write landed");
                    if let Ending::Commit(commit) = &*ending
                        && !commit.outbox.is_empty()
                    {
                        deliver(commit.outbox.clone()).await;
                    }
                })
            })
            .collect();
        if !writes.is_empty() {
            tracing::info!(writes = writes.len(), "sending unconfirmed finishing writes again");
        }
        async move {
            futures::future::join_all(writes).await;
        }
    }

    /// Completes at the next finishing write whose send fails from now on.
    pub(crate) fn next_failure(&self) -> impl Future<Output = ()> + Send + '_ {
        self.unconfirmed.next_failure()
    }

    /// Completes at the next finishing write whose send ends, either way.
    pub(crate) fn next_answer(&self) -> impl Future<Output = ()> + Send + '_ {
        self.unconfirmed.next_answer()
    }

    /// How many finishing writes were given up unconfirmed so far (see
    /// [`Commit::send_by_ms`]).
    pub fn writes_given_up(&self) -> u64 {
        self.unconfirmed.given_up()
    }

    /// Whether every finishing write sent so far was answered for good.
    pub(crate) fn all_confirmed(&self) -> bool {
        self.unconfirmed.is_empty()
    }

    /// The ids of the claims whose finishing writes are still unconfirmed,
    /// logged as the process leaves: they stay in progress until their
    /// leases end.
    pub(crate) fn still_unconfirmed(&self) -> Vec<String> {
        let left = self.unconfirmed.ids();
        if !left.is_empty() {
            tracing::error!(
                ids = ?left,
                "finishing writes still unconfirmed as the process leaves; their claims stay in progress until \
                 their leases end (sqs-once claims list --stale shows them then)"
            );
        }
        left
    }

    /// The answer is due: finishing writes waiting to be sent go out now,
    /// and until `until` without waiting for room (see
    /// [`ClaimStore::expedite`]).
    pub(crate) fn expedite(&self, until: Instant) {
        self.store.expedite(until);
    }

    /// Opens what the store's first calls will need, for at most `within`
    /// (see [`ClaimStore::connect`]).
    pub async fn connect(&self, within: Duration) {
        if tokio::time::timeout(within, self.store.connect()).await.is_err() {
            tracing::warn!(within_ms = within.as_millis(), "the claim store did not connect in time; going on");
        }
    }

    /// Whether the store sends concurrent calls in shared requests (see
    /// [`ClaimStore::gathers_calls`]).
    pub(crate) fn gathers_calls(&self) -> bool {
        self.store.gathers_calls()
    }

    /// Commits a run's one update with its key kept in the item; a run that
    /// claimed first then completes its claim (a second write), whether the
    /// update applied now or before: the item is what says the key's effect
    /// applied, so a claim left in progress (its completion lost) ends with
    /// its lease, and the next run finds the key in the item.
    async fn commit_in_item(&self, lease: &Lease, commit: &Commit) -> Result<Committed, StoreError> {
        let committed = self.committing()?.commit(&lease.id, &lease.token, commit).await?;
        if lease.is_unclaimed() || !matches!(committed, Committed::Applied | Committed::InItemAlready) {
            return Ok(committed);
        }
        let finished = self.store.finish(&lease.id, &lease.token, &commit.finish).await;
        match finished {
            Ok(Fenced::Applied) => {}
            Ok(Fenced::Refused) => self.count_refusal(lease, "completion"),
            Err(error) => tracing::warn!(
                id = %lease.id, %error,
                "the claim's completion after its update could not be recorded: the claim ends with its lease, and \
                 the next run of the key finds it kept in the item"
            ),
        }
        Ok(committed)
    }

    /// Sends a finishing write, keeping it until the store answers; the
    /// caller owns the send, and only an error leaves the write to be sent
    /// again.
    async fn settle(&self, lease: &Lease, ending: Ending) -> Result<Committed, StoreError> {
        let ending = Arc::new(ending);
        let sending = self.unconfirmed.keep(lease, &ending);
        let result = self.send(lease, &ending).await;
        sending.answered(&result);
        result
    }

    /// One attempt of a finishing write, counted and remembered as its answer says.
    async fn send(&self, lease: &Lease, ending: &Ending) -> Result<Committed, StoreError> {
        let (id, token) = (&lease.id, &lease.token);
        let committed = match ending {
            Ending::Finish(finish) => committed(self.store.finish(id, token, finish).await?),
            Ending::Commit(commit) if commit.writes.is_empty() && commit.outbox.is_empty() => {
                match commit.unclaimed.as_ref().zip(commit.finished_claim(None)) {
                    // Nothing staged: the claim's completion alone, a single conditional put.
                    Some((unclaimed, claim)) => match self.store.put_if_free(&claim, unclaimed.now_ms).await? {
                        PutOutcome::Claimed => Committed::Applied,
                        PutOutcome::Taken(existing) => commit.judged_by(token, existing.as_deref()).unwrap_or(
                            // The key's record went away between the write and the answer: free again.
                            Committed::Taken(None),
                        ),
                    },
                    None => self.committing()?.commit(id, token, commit).await?,
                }
            }
            Ending::Commit(commit) if commit.key_in_item.is_some() => self.commit_in_item(lease, commit).await?,
            Ending::Commit(commit) => self.committing()?.commit(id, token, commit).await?,
            Ending::Release => committed(self.store.release(id, token).await?),
        };
        if let (Committed::Applied, Some(finish)) = (&committed, ending.finish())
            && finish.status == ClaimStatus::Completed
        {
            let completed = Completed {
                expires_at_s: finish.expires_at_s,
                payload_hash: lease.payload_hash.clone(),
                result: finish.result.clone(),
            };
            self.cache_insert(id, completed);
        }
        if committed == Committed::Refused {
            self.count_refusal(lease, ending.name());
        }
        Ok(committed)
    }

    /// The store's commits, or why there are none: a commit fails its record for good.
    fn committing(&self) -> Result<&dyn CommitStore, StoreError> {
        self.commits.as_deref().ok_or_else(|| {
            StoreError::Unsupported(
                "this claim store does not commit staged writes (ClaimStore::capabilities: commits)".into(),
            )
        })
    }

    fn new_claim(&self, request: &ClaimRequest<'_>, now_ms: u64, payload_hash: Option<String>) -> StoredClaim {
        let lease_until_ms = request.deadline_ms.saturating_add(duration_ms(self.policy.lease_margin));
        StoredClaim {
            id: request.id.to_owned(),
            status: ClaimStatus::InProgress,
            // The expiry is the table's TTL attribute: DynamoDB may delete the
            // record once it has passed, and a deleted claim is free to anyone.
            // It must not pass before the lease ends, however long the lease.
            expires_at_s: self.expiry_from(now_ms).max(lease_until_ms.div_ceil(1000) + 1),
            lease_until_ms: Some(lease_until_ms),
            token: Some(new_token()),
            holder: Some(request.holder.to_owned()),
            attempt: Some(request.attempt),
            message_id: Some(request.message_id.to_owned()),
            claimed_at_ms: Some(now_ms),
            updated_at_ms: Some(now_ms),
            payload_hash,
            result: None,
            error: None,
        }
    }

    /// What an existing record means for a claim; `None` when it turned out
    /// to be free after all (it expired between the write and the read).
    fn judge(&self, existing: StoredClaim, payload_hash: Option<&str>) -> Option<Claim> {
        let now_ms = self.clock.now_ms();
        if existing.is_free(now_ms) {
            return None;
        }
        if self.mismatched(existing.payload_hash.as_deref(), payload_hash) {
            return Some(Claim::PayloadMismatch);
        }
        Some(match existing.status {
            ClaimStatus::InProgress => Claim::Conflict { retry_after: existing.free_in(now_ms) },
            ClaimStatus::Failed => Claim::FailedBefore { error: existing.error },
            ClaimStatus::Completed => {
                let completed = Completed {
                    expires_at_s: existing.expires_at_s,
                    payload_hash: existing.payload_hash,
                    result: existing.result,
                };
                self.cache_insert(&existing.id, completed.clone());
                self.duplicate(completed.payload_hash.as_deref(), payload_hash, completed.result)
            }
        })
    }

    fn duplicate(&self, stored_hash: Option<&str>, payload_hash: Option<&str>, result: Option<String>) -> Claim {
        if self.mismatched(stored_hash, payload_hash) { Claim::PayloadMismatch } else { Claim::Duplicate { result } }
    }

    fn mismatched(&self, stored_hash: Option<&str>, payload_hash: Option<&str>) -> bool {
        matches!((stored_hash, payload_hash), (Some(stored), Some(ours)) if stored != ours)
    }

    /// How `lease`'s claim finishes. A completion's expiry covers every
    /// redelivery the consumer's own answer can cause (see
    /// [`ClaimPolicy::redelivered_within`]); a failure's need not: its
    /// redelivery finding the key free runs the handler once more, and
    /// nothing of the failed run applied.
    fn finish(&self, lease: &Lease, status: ClaimStatus, result: Option<String>, error: Option<String>) -> Finish {
        let now_ms = self.clock.now_ms();
        let floor_s = match (status, self.redelivered_within()) {
            (ClaimStatus::Completed, Some(within)) => lease.remembered_until_s(within),
            _ => 0,
        };
        let expires_at_s = self.expiry_from(now_ms).max(floor_s);
        Finish { status, expires_at_s, finished_at_ms: now_ms, result, error }
    }

    fn expiry_from(&self, now_ms: u64) -> u64 {
        now_ms / 1000 + self.policy.expires_after.as_secs()
    }

    fn count_refusal(&self, lease: &Lease, write: &str) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(id = %lease.id, "{write} refused: the lease was taken over by another holder");
    }

    /// The output to store with a completion, if the policy stores outputs.
    fn result_of(&self, lease: &Lease, output: Option<&Value>) -> Option<String> {
        output.filter(|_| self.policy.store_result).and_then(|output| self.storable(lease, output))
    }

    /// `output` as JSON text, or `None` (with a warning) when it is too large
    /// to store: the record still completes, only the output is not kept.
    fn storable(&self, lease: &Lease, output: &Value) -> Option<String> {
        let text = output.to_string();
        if text.len() <= self.policy.max_result_bytes {
            return Some(text);
        }
        self.counters.oversized_results.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            id = %lease.id,
            bytes = text.len(),
            limit = self.policy.max_result_bytes,
            "handler output too large to store; the claim completes without it"
        );
        None
    }

    fn cache_insert(&self, id: &str, completed: Completed) {
        if let Some(cache) = &self.cache {
            cache.lock().put(id.to_owned(), completed);
        }
    }

    fn cached(&self, id: &str) -> Option<Completed> {
        let mut cache = self.cache.as_ref()?.lock();
        let now_s = self.clock.now_ms() / 1000;
        match cache.get(id) {
            Some(completed) if completed.expires_at_s >= now_s => Some(completed.clone()),
            Some(_) => {
                cache.pop(id);
                None
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clocks::ManualClock;
    use sqs_once_core::store::MemoryStore;

    #[tokio::test]
    async fn a_commit_without_a_claim_is_sent_while_a_later_runs_completion_is_remembered_whatever_its_own_lease() {
        // Keys remembered a minute, failed records back within three: a copy deciding after this run keeps its
        // completion six minutes at least, though this run's lease (a 15 minute invocation) ends much later.
        let now_ms = 1_800_000_000_000;
        let policy = ClaimPolicy {
            expires_after: Duration::from_secs(60),
            redelivered_within: Some(Duration::from_secs(180)),
            ..ClaimPolicy::default()
        };
        let claims = Claims::with_policy(Arc::new(MemoryStore::default()), policy, Arc::new(ManualClock::new(now_ms)));
        let request = ClaimRequest {
            id: "k",
            body: "{}",
            deadline_ms: now_ms + 900_000,
            holder: "r",
            attempt: 1,
            message_id: "m",
        };
        let Claim::Won(lease) = claims.start_unclaimed(&request).await.unwrap() else {
            panic!("a run without a claim")
        };
        let commit = claims.prepare_commit(&lease, None, Staged::default(), "m");
        assert!(
            commit.finish.expires_at_s * 1000 > now_ms + 1_200_000,
            "its own completion: its lease and two windows"
        );
        assert_eq!(commit.send_by_ms(), Some(now_ms + 360_000 - 60_000), "a later run's six minutes, less a minute");
    }
}
