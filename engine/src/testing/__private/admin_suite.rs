//! The admin conformance suite: what `sqs-once claims` needs of a store
//! ([`ClaimAdmin`](sqs_once_core::store::ClaimAdmin), which [`Capabilities::admin`](sqs_once_core::store::Capabilities::admin) hands out): listings that
//! find what their query asks, and operator writes that act only on the
//! claim the operator saw. [`admin_suite!`](crate::admin_suite) expands to
//! one test per case, for a store that offers it.

use std::{sync::Arc, time::Duration};

use super::claim_suite::Machine;
use sqs_once_core::{
    clock::Clock,
    store::{ClaimQuery, ClaimStatus, ClaimStore, Fenced},
};

/// Checks that a listing finds what its query asks: the open claims by
/// default (in progress and failed, not completed), oldest first; one
/// status; the stale claims (in progress, their leases ended); one
/// delivery's claim by its message id; at most the limit.
pub async fn listings_find_what_their_query_asks(store: Arc<dyn ClaimStore>) {
    let m = Machine::plain(store);
    let admin = m.admin();
    let prefix = format!("list-{}", uuid::Uuid::new_v4().simple());
    let key = |name: &str| format!("{prefix}-{name}");
    let (running, done, failed) =
        (m.win(&key("running")).await, m.win(&key("done")).await, m.win(&key("failed")).await);
    m.claims.complete(&done, None).await.unwrap();
    m.claims.fail(&failed, "for good").await.unwrap();
    let ours = |query: ClaimQuery| {
        let admin = Arc::clone(&admin);
        let prefix = prefix.clone();
        async move {
            let listing = admin.list(&ClaimQuery { limit: 10_000, ..query }).await.unwrap();
            let mut ids: Vec<String> =
                listing.claims.into_iter().map(|claim| claim.id).filter(|id| id.starts_with(&prefix)).collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(ours(ClaimQuery::default()).await, [key("failed"), key("running")], "open claims");
    let completed = ClaimQuery { status: Some(ClaimStatus::Completed), ..ClaimQuery::default() };
    assert_eq!(ours(completed).await, [key("done")]);
    let stale = |at_ms: u64| ClaimQuery { stale_at_ms: Some(at_ms), ..ClaimQuery::default() };
    assert!(ours(stale(m.clock.now_ms())).await.is_empty(), "no lease has ended");
    m.clock.advance(Duration::from_secs(60));
    assert_eq!(ours(stale(m.clock.now_ms())).await, [key("running")], "its lease ended: stale");
    let by_message = ClaimQuery { message_id: Some(format!("m-{}", running.id)), ..ClaimQuery::default() };
    assert_eq!(ours(by_message).await, [key("running")]);
    let limited = admin.list(&ClaimQuery { limit: 1, ..ClaimQuery::default() }).await.unwrap();
    assert!(limited.claims.len() <= 1);
}

/// Checks that an operator's write acts only on the claim it saw: a claim
/// that changed since (its holder completed it) or appeared since is left
/// alone, so `claims release` and `claims complete` never undo work they did
/// not see.
pub async fn an_operators_write_acts_only_on_the_claim_it_saw(store: Arc<dyn ClaimStore>) {
    let m = Machine::plain(store);
    let admin = m.admin();
    let lease = m.win("k-seen").await;
    let seen = m.stored("k-seen").await;
    assert_eq!(m.claims.complete(&lease, None).await.unwrap(), Fenced::Applied);
    assert_eq!(admin.replace_seen(seen.as_ref(), None).await.unwrap(), Fenced::Refused, "changed since seen");
    assert_eq!(m.stored("k-seen").await.map(|claim| claim.status), Some(ClaimStatus::Completed));
    let mut completed = m.stored("k-seen").await.unwrap();
    completed.error = Some("by hand".into());
    assert_eq!(admin.replace_seen(None, Some(&completed)).await.unwrap(), Fenced::Refused, "appeared since");
    assert_eq!(m.stored("k-seen").await.unwrap().error, None);
    let current = m.stored("k-seen").await;
    assert_eq!(admin.replace_seen(current.as_ref(), None).await.unwrap(), Fenced::Applied);
    assert_eq!(m.stored("k-seen").await, None);
}

/// One test per case for the store that `$make` (an expression, which may
/// `.await`, giving `Arc<dyn ClaimStore>`) builds, which must offer
/// [`Capabilities::admin`](sqs_once_core::store::Capabilities::admin). The tests are `#[tokio::test]`s, as
/// [`claim_suite!`](crate::claim_suite)'s are.
///
/// ```no_run
/// use std::sync::Arc;
/// use sqs_once::store::{ClaimStore, MemoryStore};
///
/// fn store() -> Arc<dyn ClaimStore> {
///     Arc::new(MemoryStore::default())
/// }
///
/// sqs_once::admin_suite!(store());
/// ```
#[macro_export]
macro_rules! admin_suite {
    ($make:expr, $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $crate::testing::__private::admin_suite::$name($make).await;
            }
        )*
    };
    ($make:expr) => {
        $crate::admin_suite!($make, listings_find_what_their_query_asks, an_operators_write_acts_only_on_the_claim_it_saw);
    };
}
