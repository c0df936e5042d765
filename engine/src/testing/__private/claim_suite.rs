//! The claim-store conformance suite: the claim state machine's behaviour,
//! written once and run against every store, sqs-once's and yours.
//! [`claim_suite!`](crate::claim_suite) expands to one test per transition;
//! each function here is one of them, for a store the caller makes.
//!
//! A store must keep time by the `now_ms` it is given, not by its own clock
//! (the suite moves a manual clock), and should delete records whose expiry
//! has passed no earlier than that expiry in real time.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use serde_json::json;

use crate::{
    claim::{Claim, ClaimPolicy, ClaimRequest, Claims, Lease},
    clocks::ManualClock,
};
use sqs_once_core::{
    clock::{Clock, SystemClock},
    store::{
        Capabilities, ClaimAdmin, ClaimStatus, ClaimStore, CommitStore, Fenced, Finish, OutboxStore, PutOutcome,
        StoreError, StoredClaim,
    },
};

/// A start for a manual clock: the current time, rounded down to a second.
/// Real time, because DynamoDB Local's TTL sweeper deletes records whose
/// expiry is past in real time.
pub(crate) fn now_s_ms() -> u64 {
    SystemClock.now_ms() / 1000 * 1000
}
const MARGIN: Duration = Duration::from_secs(2);

/// A state machine over `store` with a manual clock at `t0`, no local cache
/// unless `policy` says otherwise.
#[allow(missing_debug_implementations)]
pub struct Machine {
    /// When the clock started.
    pub(crate) t0: u64,
    /// The state machine, counting its requests to the store.
    pub(crate) claims: Claims,
    /// The clock the state machine reads.
    pub(crate) clock: Arc<ManualClock>,
    /// The store under test, for reading what it holds.
    pub(crate) store: Arc<dyn ClaimStore>,
    /// The requests the state machine made.
    pub(crate) counting: Arc<Counting>,
}

impl Machine {
    /// A state machine over `store` with `policy`.
    pub(crate) fn new(store: Arc<dyn ClaimStore>, policy: ClaimPolicy) -> Self {
        let t0 = now_s_ms();
        let clock = Arc::new(ManualClock::new(t0));
        let counting = Counting::new(store.clone());
        let claims = Claims::with_policy(counting.clone(), policy, clock.clone());
        Self { t0, claims, clock, store, counting }
    }

    /// The invocation deadline the tests claim under: 30 s after `t0`.
    pub(crate) fn deadline(&self) -> u64 {
        self.t0 + 30_000
    }

    /// A state machine over `store` with the suite's policy ([`policy`]).
    pub fn plain(store: Arc<dyn ClaimStore>) -> Self {
        Self::new(store, policy())
    }

    /// Claims `id` for `holder`; panics on a store error.
    pub async fn claim(&self, id: &str, body: &str, holder: &str) -> Claim {
        let message_id = format!("m-{id}");
        let request =
            ClaimRequest { id, body, deadline_ms: self.deadline(), holder, attempt: 1, message_id: &message_id };
        self.claims.claim(&request).await.expect("store error")
    }

    /// Claims `id`, which must be won.
    pub async fn win(&self, id: &str) -> Lease {
        match self.claim(id, "{}", "holder-1").await {
            Claim::Won(lease) => lease,
            other => panic!("expected to win {id}, got {other:?}"),
        }
    }

    /// What the store holds for `id`.
    pub async fn stored(&self, id: &str) -> Option<StoredClaim> {
        self.store.get(id).await.expect("store error")
    }

    /// The store's listing and operator edits, which the suite that tests them needs.
    pub(crate) fn admin(&self) -> Arc<dyn ClaimAdmin> {
        Arc::clone(&self.store).capabilities().admin.expect("the admin suite needs a store that offers its admin")
    }

    /// The store's commits, which the commit suite needs.
    pub(crate) fn commits(&self) -> Arc<dyn CommitStore> {
        Arc::clone(&self.store).capabilities().commits.expect("the commit suite needs a store that commits")
    }

    /// The store's outbox, which the commit suite needs.
    pub(crate) fn outbox(&self) -> Arc<dyn OutboxStore> {
        Arc::clone(&self.store).capabilities().outbox.expect("the commit suite needs a store that keeps an outbox")
    }
}

/// The suite's policy: a 2 s lease margin, no local cache.
pub(crate) fn policy() -> ClaimPolicy {
    ClaimPolicy { lease_margin: MARGIN, local_cache_entries: 0, ..ClaimPolicy::default() }
}

/// Checks that a free key is won and recorded in progress.
pub async fn a_free_key_is_won_and_recorded_in_progress(store: Arc<dyn ClaimStore>) {
    let m = Machine::plain(store);
    let lease = m.win("k-free").await;
    assert_eq!(lease.lease_until_ms, m.deadline() + 2_000);
    let record = m.stored("k-free").await.expect("claim stored");
    assert_eq!(record.status, ClaimStatus::InProgress);
    assert_eq!(record.token.as_deref(), Some(lease.token.as_str()));
    assert_eq!(record.holder.as_deref(), Some("holder-1"));
    assert_eq!(record.attempt, Some(1));
    assert_eq!(record.message_id.as_deref(), Some("m-k-free"), "the claiming delivery's message id");
    assert_eq!(record.lease_until_ms, Some(m.deadline() + 2_000));
    assert_eq!(record.expires_at_s, m.t0 / 1000 + 3600);
    assert_eq!(record.claimed_at_ms, Some(m.t0));
}

/// Checks that a completed key is a duplicate.
pub async fn a_completed_key_is_a_duplicate(store: Arc<dyn ClaimStore>) {
    let m = Machine::plain(store);
    let lease = m.win("k-done").await;
    m.clock.advance(Duration::from_secs(1));
    assert_eq!(m.claims.complete(&lease, None).await.unwrap(), Fenced::Applied);
    let record = m.stored("k-done").await.unwrap();
    assert_eq!(record.status, ClaimStatus::Completed);
    assert_eq!(record.lease_until_ms, None);
    assert_eq!(record.expires_at_s, m.t0 / 1000 + 1 + 3600);
    assert_eq!(m.claim("k-done", "{}", "holder-2").await, Claim::Duplicate { result: None });
}

/// Checks that a live lease is a conflict.
pub async fn a_live_lease_is_a_conflict(store: Arc<dyn ClaimStore>) {
    let m = Machine::plain(store);
    m.win("k-live").await;
    m.clock.advance(Duration::from_secs(10));
    let retry_after = Duration::from_millis(m.deadline() + 2_000 + 1 - (m.t0 + 10_000));
    assert_eq!(m.claim("k-live", "{}", "holder-2").await, Claim::Conflict { retry_after });
    // The last millisecond of the lease still belongs to its holder.
    m.clock.set(m.deadline() + 2_000);
    assert!(matches!(m.claim("k-live", "{}", "holder-2").await, Claim::Conflict { .. }));
}

/// Checks that an ended lease is taken over and the old holder is fenced off.
pub async fn an_ended_lease_is_taken_over_and_the_old_holder_is_fenced_off(store: Arc<dyn ClaimStore>) {
    let m = Machine::plain(store);
    let old = m.win("k-stale").await;
    m.clock.set(m.deadline() + 2_001);
    let Claim::Won(new) = m.claim("k-stale", "{}", "holder-2").await else { panic!("stale lease not taken over") };
    assert_ne!(new.token, old.token);
    assert_eq!(m.claims.complete(&old, None).await.unwrap(), Fenced::Refused);
    assert_eq!(m.claims.release(&old).await.unwrap(), Fenced::Refused);
    assert_eq!(m.claims.fail(&old, "late").await.unwrap(), Fenced::Refused);
    let record = m.stored("k-stale").await.unwrap();
    assert_eq!((record.status, record.holder.as_deref()), (ClaimStatus::InProgress, Some("holder-2")));
    assert_eq!(m.claims.complete(&new, None).await.unwrap(), Fenced::Applied);
    assert_eq!(m.stored("k-stale").await.unwrap().status, ClaimStatus::Completed);
    assert_eq!(m.claims.counters().refused.load(Ordering::SeqCst), 3);
}

/// Checks that a retryable failure releases the key.
pub async fn a_retryable_failure_releases_the_key(store: Arc<dyn ClaimStore>) {
    let m = Machine::plain(store);
    let lease = m.win("k-retry").await;
    assert_eq!(m.claims.release(&lease).await.unwrap(), Fenced::Applied);
    assert_eq!(m.stored("k-retry").await, None);
    m.win("k-retry").await;
}

/// Checks that a release that finds the key free is released.
pub async fn a_release_that_finds_the_key_free_is_released(store: Arc<dyn ClaimStore>) {
    let m = Machine::plain(store);
    let lease = m.win("k-gone").await;
    // The release applied and its answer was lost: the retry finds no record.
    assert_eq!(m.store.release(&lease.id, &lease.token).await.unwrap(), Fenced::Applied);
    assert_eq!(m.claims.release(&lease).await.unwrap(), Fenced::Applied);
    assert_eq!(m.claims.counters().refused.load(Ordering::SeqCst), 0, "not a takeover");
}

/// Checks that a permanent failure is kept until it expires.
pub async fn a_permanent_failure_is_kept_until_it_expires(store: Arc<dyn ClaimStore>) {
    let m = Machine::plain(store);
    let lease = m.win("k-perm").await;
    assert_eq!(m.claims.fail(&lease, "card declined").await.unwrap(), Fenced::Applied);
    let record = m.stored("k-perm").await.unwrap();
    assert_eq!((record.status, record.error.as_deref()), (ClaimStatus::Failed, Some("card declined")));
    let error = Some("card declined".to_owned());
    assert_eq!(m.claim("k-perm", "{}", "holder-2").await, Claim::FailedBefore { error });
    m.clock.set(m.t0 + 3_601_000);
    m.win("k-perm").await;
}

/// Checks that an expired completion is claimed again.
pub async fn an_expired_completion_is_claimed_again(store: Arc<dyn ClaimStore>) {
    let m = Machine::plain(store);
    let lease = m.win("k-exp").await;
    m.claims.complete(&lease, None).await.unwrap();
    m.clock.set(m.t0 + 3_600_000);
    assert!(matches!(m.claim("k-exp", "{}", "h").await, Claim::Duplicate { .. }), "expiry second still counts");
    m.clock.set(m.t0 + 3_601_000);
    m.win("k-exp").await;
}

/// Checks that a live lease outlives the record expiry.
pub async fn a_live_lease_outlives_the_record_expiry(store: Arc<dyn ClaimStore>) {
    // The lease (30 s + 2 s) is longer than the time a key is remembered (20 s).
    let policy = ClaimPolicy { expires_after: Duration::from_secs(20), ..policy() };
    let m = Machine::new(store, policy);
    let lease = m.win("k-long").await;
    // The expiry is the TTL attribute: a store that deletes expired records must not free a live lease.
    let stored = m.stored("k-long").await.expect("claim stored");
    assert!(
        stored.expires_at_s * 1000 > lease.lease_until_ms,
        "{} s, lease until {} ms",
        stored.expires_at_s,
        lease.lease_until_ms
    );
    m.clock.advance(Duration::from_secs(25));
    assert!(matches!(m.claim("k-long", "{}", "h2").await, Claim::Conflict { .. }));
}

/// Checks that an in progress record without a lease waits for its expiry.
pub async fn an_in_progress_record_without_a_lease_waits_for_its_expiry(store: Arc<dyn ClaimStore>) {
    // Written by a tool that knew no invocation deadline.
    let m = Machine::plain(store.clone());
    let foreign = StoredClaim {
        id: "k-foreign".into(),
        status: ClaimStatus::InProgress,
        expires_at_s: m.t0 / 1000 + 60,
        lease_until_ms: None,
        token: None,
        holder: None,
        attempt: None,
        message_id: None,
        claimed_at_ms: None,
        updated_at_ms: None,
        payload_hash: None,
        result: None,
        error: None,
    };
    assert_eq!(store.put_if_free(&foreign, m.t0).await.unwrap(), PutOutcome::Claimed);
    let retry_after = Duration::from_millis(61_000);
    assert_eq!(m.claim("k-foreign", "{}", "h").await, Claim::Conflict { retry_after });
    m.clock.set(m.t0 + 61_000);
    m.win("k-foreign").await;
}

/// Checks that payload validation refuses another body.
pub async fn payload_validation_refuses_another_body(store: Arc<dyn ClaimStore>) {
    let policy = ClaimPolicy { validate_payload: true, ..policy() };
    let m = Machine::new(store, policy);
    let lease = match m.claim("k-pay", r#"{"amount":1}"#, "h").await {
        Claim::Won(lease) => lease,
        other => panic!("{other:?}"),
    };
    assert_eq!(m.claim("k-pay", r#"{"amount":2}"#, "h2").await, Claim::PayloadMismatch);
    m.claims.complete(&lease, None).await.unwrap();
    assert_eq!(m.claim("k-pay", r#"{"amount":2}"#, "h2").await, Claim::PayloadMismatch);
    assert_eq!(m.claim("k-pay", r#"{"amount":1}"#, "h2").await, Claim::Duplicate { result: None });
}

/// Checks that results are stored unless too large.
pub async fn results_are_stored_unless_too_large(store: Arc<dyn ClaimStore>) {
    let policy = ClaimPolicy { store_result: true, max_result_bytes: 64, ..policy() };
    let m = Machine::new(store, policy);
    let small = m.win("k-small").await;
    m.claims.complete(&small, Some(&json!({"receipt": "r-1"}))).await.unwrap();
    let result = Some(r#"{"receipt":"r-1"}"#.to_owned());
    assert_eq!(m.stored("k-small").await.unwrap().result, result);
    assert_eq!(m.claim("k-small", "{}", "h").await, Claim::Duplicate { result });

    let large = m.win("k-large").await;
    let big = json!({"blob": "x".repeat(100)});
    assert_eq!(m.claims.complete(&large, Some(&big)).await.unwrap(), Fenced::Applied);
    let record = m.stored("k-large").await.unwrap();
    assert_eq!((record.status, record.result), (ClaimStatus::Completed, None));
}

/// Checks that the local cache answers duplicates without a request.
pub async fn the_local_cache_answers_duplicates_without_a_request(store: Arc<dyn ClaimStore>) {
    let policy = ClaimPolicy { local_cache_entries: 16, ..policy() };
    let m = Machine::new(store, policy);
    let lease = m.win("k-cache").await;
    m.claims.complete(&lease, None).await.unwrap();
    m.counting.take();
    assert!(matches!(m.claim("k-cache", "{}", "h").await, Claim::Duplicate { .. }));
    assert_eq!(m.counting.take(), 0);
    // A cached completion expires with the record.
    m.clock.set(m.t0 + 3_601_000);
    m.win("k-cache").await;
    assert_eq!(m.counting.take(), 1);
}

/// Checks that requests per path meet the floor.
pub async fn requests_per_path_meet_the_floor(store: Arc<dyn ClaimStore>) {
    let m = Machine::plain(store);
    let lease = m.win("k-count").await;
    m.claims.complete(&lease, None).await.unwrap();
    assert_eq!(m.counting.take(), 2, "new record: claim + complete");
    m.claim("k-count", "{}", "h").await;
    assert_eq!(m.counting.take(), 1, "duplicate: one failed claim");
    let lease = m.win("k-count-fail").await;
    m.claims.release(&lease).await.unwrap();
    assert_eq!(m.counting.take(), 2, "handler failure: claim + release");
}

/// Checks that a store that does not return the old record is read once.
pub async fn a_store_that_does_not_return_the_old_record_is_read_once(store: Arc<dyn ClaimStore>) {
    let m = Machine::plain(Arc::new(WithoutOldItem(store)));
    let lease = m.win("k-noitem").await;
    m.claims.complete(&lease, None).await.unwrap();
    m.counting.take();
    assert_eq!(m.claim("k-noitem", "{}", "h").await, Claim::Duplicate { result: None });
    assert_eq!(m.counting.take(), 2, "failed claim + one consistent read");
    m.win("k-noitem-live").await;
    assert!(matches!(m.claim("k-noitem-live", "{}", "h").await, Claim::Conflict { .. }));
}

/// `claimants` claim one key at once, `rounds` times: exactly one wins each round.
pub async fn concurrent_claims_have_one_winner(store: Arc<dyn ClaimStore>, claimants: usize, rounds: usize) {
    let t0 = now_s_ms();
    let deadline_ms = t0 + 30_000;
    let claims = Arc::new(Claims::with_policy(store, policy(), Arc::new(ManualClock::new(t0))));
    for round in 0..rounds {
        let id = format!("k-race-{round}");
        let attempts = (0..claimants).map(|n| {
            let (claims, id) = (claims.clone(), id.clone());
            tokio::spawn(async move {
                let holder = format!("holder-{n}");
                let request =
                    ClaimRequest { id: &id, body: "{}", deadline_ms, holder: &holder, attempt: 1, message_id: &holder };
                claims.claim(&request).await.expect("store error")
            })
        });
        let outcomes = futures::future::join_all(attempts).await;
        let winners = outcomes.iter().filter(|outcome| matches!(outcome, Ok(Claim::Won(_)))).count();
        assert_eq!(winners, 1, "round {round}: {outcomes:?}");
        assert!(outcomes.iter().all(|o| matches!(o, Ok(Claim::Won(_) | Claim::Conflict { .. }))));
    }
}

/// One test per transition for the store that `$make` (an expression, which
/// may `.await`, giving `Arc<dyn ClaimStore>`) builds; each test makes its own.
/// The tests are `#[tokio::test]`s, so the calling crate needs `tokio` with
/// the `macros` and `rt-multi-thread` features.
///
/// ```no_run
/// use std::sync::Arc;
/// use sqs_once::store::{ClaimStore, MemoryStore};
///
/// fn store() -> Arc<dyn ClaimStore> {
///     Arc::new(MemoryStore::default())
/// }
///
/// sqs_once::claim_suite!(store());
/// ```
#[macro_export]
macro_rules! claim_suite {
    ($make:expr, $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $crate::testing::__private::claim_suite::$name($make).await;
            }
        )*
    };
    ($make:expr) => {
        $crate::claim_suite!(
            $make,
            a_free_key_is_won_and_recorded_in_progress,
            a_completed_key_is_a_duplicate,
            a_live_lease_is_a_conflict,
            an_ended_lease_is_taken_over_and_the_old_holder_is_fenced_off,
            a_retryable_failure_releases_the_key,
            a_release_that_finds_the_key_free_is_released,
            a_permanent_failure_is_kept_until_it_expires,
            an_expired_completion_is_claimed_again,
            a_live_lease_outlives_the_record_expiry,
            an_in_progress_record_without_a_lease_waits_for_its_expiry,
            payload_validation_refuses_another_body,
            results_are_stored_unless_too_large,
            the_local_cache_answers_duplicates_without_a_request,
            requests_per_path_meet_the_floor,
            a_store_that_does_not_return_the_old_record_is_read_once,
            thirty_two_claimants_of_one_key_have_one_winner,
        );
    };
}

/// 32 claimants race for one key, 50 times over.
pub async fn thirty_two_claimants_of_one_key_have_one_winner(store: Arc<dyn ClaimStore>) {
    concurrent_claims_have_one_winner(store, 32, 50).await;
}

/// Wraps a store and counts the requests made to it.
#[allow(missing_debug_implementations)]
pub(crate) struct Counting {
    /// The store counted.
    pub(crate) inner: Arc<dyn ClaimStore>,
    /// Requests so far.
    pub(crate) requests: AtomicUsize,
}

impl Counting {
    /// Counts the requests made to `inner`.
    pub(crate) fn new(inner: Arc<dyn ClaimStore>) -> Arc<Self> {
        Arc::new(Self { inner, requests: AtomicUsize::new(0) })
    }

    /// The requests made since the last call, and a new count from zero.
    pub(crate) fn take(&self) -> usize {
        self.requests.swap(0, Ordering::SeqCst)
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl ClaimStore for Counting {
    async fn put_if_free(&self, record: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        self.count();
        self.inner.put_if_free(record, now_ms).await
    }
    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        self.count();
        self.inner.get(id).await
    }
    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        self.count();
        self.inner.finish(id, token, finish).await
    }
    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        self.count();
        self.inner.release(id, token).await
    }
    // The capabilities go to the store itself, uncounted: the suite counts the claim paths.
    fn capabilities(self: Arc<Self>) -> Capabilities {
        Arc::clone(&self.inner).capabilities()
    }
}

/// Wraps a store so that a taken key comes back without the old record, as
/// stores that cannot return it in the same request answer.
#[allow(missing_debug_implementations)]
pub(crate) struct WithoutOldItem(pub Arc<dyn ClaimStore>);

#[async_trait]
impl ClaimStore for WithoutOldItem {
    async fn put_if_free(&self, record: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        Ok(match self.0.put_if_free(record, now_ms).await? {
            PutOutcome::Taken(_) => PutOutcome::Taken(None),
            claimed => claimed,
        })
    }
    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        self.0.get(id).await
    }
    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        self.0.finish(id, token, finish).await
    }
    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        self.0.release(id, token).await
    }
    fn capabilities(self: Arc<Self>) -> Capabilities {
        Arc::clone(&self.0).capabilities()
    }
}
