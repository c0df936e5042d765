//! Runs that take no claim: a handler that stages every effect runs, and its
//! transaction writes the key's completion where the key is free, with what
//! it staged. What users rely on: the writes apply once however many runs of
//! a key race, a failure leaves nothing applied, and a live claim elsewhere
//! is a conflict.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::*;
use crate::engine::ClaimFirst;
use sqs_once_core::{
    ErrorKind,
    store::{Capabilities, Commit, CommitStore, Committed},
    transaction::{Check, Condition, Key, Update, item_keys},
};

/// Stages one increment of `applied` for its key; `{"fail": ...}` fails,
/// `{"gate": "permanent" | "retryable"}` stages a check on an item nobody
/// writes, `{"sleep_ms": n}` sleeps first, `{"stage": false}` stages nothing,
/// `{"keep": true}` keeps the key in the item (`Update::keep_key`),
/// `{"below": n}` conditions the increment on `n` being below that.
#[derive(Clone, Default)]
struct Credits {
    runs: Arc<AtomicU32>,
}

impl Credits {
    fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Handler for Credits {
    async fn handle(&self, record: &Record) -> HandlerResult {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let body: Value = serde_json::from_str(&record.body).unwrap_or_default();
        if let Some(ms) = body["sleep_ms"].as_u64() {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        match body["fail"].as_str() {
            Some("retryable") => return Err(HandlerError::retryable("asked to fail")),
            Some(_) => return Err(HandlerError::permanent("asked to fail")),
            None => {}
        }
        if body["stage"] == json!(false) {
            return Ok(None);
        }
        let transaction = record.transaction();
        let mut credit = Update::new("applied", Key::new("pk", record.key.as_str())).add("n", 1);
        if body["keep"] == json!(true) {
            credit = credit.keep_key();
        }
        if let Some(most) = body["below"].as_u64() {
            credit = credit.condition(Condition::lt("n", most)).or_fail(ErrorKind::Permanent, "at its most");
        }
        transaction.stage(credit)?;
        if let Some(kind) = body["gate"].as_str() {
            let kind = if kind == "permanent" { ErrorKind::Permanent } else { ErrorKind::Retryable };
            let check = Check::new("gates", Key::new("pk", "closed"), Condition::exists("open"));
            transaction.stage(check.or_fail(kind, "the gate is closed"))?;
        }
        Ok(None)
    }

    fn stages_every_effect(&self) -> bool {
        true
    }
}

/// The memory store, keeping the name of every call it gets; while
/// `losing_commit_answers` is set, its commits apply and their answers are
/// lost (as DynamoDB slow to answer, or a freeze at the answer).
#[derive(Default)]
struct Calls {
    inner: MemoryStore,
    calls: Mutex<Vec<&'static str>>,
    losing_commit_answers: AtomicBool,
}

impl Calls {
    fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    fn note(&self, call: &'static str) {
        self.calls.lock().unwrap().push(call);
    }

    /// How often the key's writes applied.
    fn applied(&self, key: &str) -> u64 {
        self.applied_item(key).map_or(0, |item| item["n"].as_u64().unwrap_or(0))
    }

    /// The item the key's writes go to.
    fn applied_item(&self, key: &str) -> Option<Value> {
        self.inner.items("applied").into_iter().find(|item| item["pk"] == key)
    }

    /// The digests of the keys the key's item keeps, the window under way's first.
    fn kept_keys(&self, key: &str) -> (Vec<String>, Vec<String>) {
        let item = self.applied_item(key).unwrap_or_default();
        let set = |name: &str| -> Vec<String> {
            item[name].as_array().into_iter().flatten().filter_map(|key| key.as_str().map(str::to_owned)).collect()
        };
        (set(item_keys::KEYS), set(item_keys::KEYS_BEFORE))
    }

    async fn status(&self, key: &str) -> Option<ClaimStatus> {
        self.inner.get(key).await.unwrap().map(|claim| claim.status)
    }
}

#[async_trait::async_trait]
impl ClaimStore for Calls {
    async fn put_if_free(&self, claim: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        self.note("put_if_free");
        self.inner.put_if_free(claim, now_ms).await
    }
    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        self.note("get");
        self.inner.get(id).await
    }
    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        self.note("finish");
        self.inner.finish(id, token, finish).await
    }
    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        self.note("release");
        self.inner.release(id, token).await
    }
    fn capabilities(self: Arc<Self>) -> Capabilities {
        Capabilities { commits: Some(self), ..Capabilities::default() }
    }
}

#[async_trait::async_trait]
impl CommitStore for Calls {
    fn keeps_keys_in_items(&self) -> bool {
        self.inner.keeps_keys_in_items()
    }

    async fn commit(&self, id: &str, token: &str, commit: &Commit) -> Result<Committed, StoreError> {
        self.note(match (&commit.key_in_item, &commit.unclaimed) {
            (Some(_), _) => "commit in item",
            (None, Some(_)) => "commit unclaimed",
            (None, None) => "commit",
        });
        let committed = self.inner.commit(id, token, commit).await;
        match self.losing_commit_answers.load(Ordering::SeqCst) {
            true => Err(StoreError::unavailable("the answer was lost")),
            false => committed,
        }
    }
}

/// An engine over `store`, running `handler`, its local cache off (so that
/// each run meets the store), claiming as `claim` says.
fn engine(store: &Arc<Calls>, handler: &Credits, claim: ClaimFirst) -> Engine {
    let policy = ClaimPolicy { local_cache_entries: 0, ..ClaimPolicy::default() };
    let options = EngineOptions { claim, ..EngineOptions::default() };
    Setup { store: Arc::clone(store) as Arc<dyn ClaimStore>, policy, options, ..Setup::default() }
        .engine(handler.clone())
}

/// A delivery of `id`, its `ApproximateReceiveCount` `attempt`.
fn delivery(id: &str, body: Value, attempt: u32) -> Value {
    let mut message = message(id, body);
    message["attributes"]["ApproximateReceiveCount"] = json!(attempt.to_string());
    message
}

const SECS_30: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_run_takes_no_claim_and_its_commit_completes_the_key_with_its_writes() {
    let (store, handler) = (Arc::new(Calls::default()), Credits::default());
    let engine = engine(&store, &handler, ClaimFirst::Auto);
    let report = run(&engine, vec![message("m-1", json!({}))], SECS_30).await;
    assert_eq!(outcome(&report, "m-1"), &Outcome::Processed { confirmed: true });
    assert_eq!(store.take(), ["commit unclaimed"], "one request: the commit, no claim before it");
    assert_eq!((store.applied("test#m-1"), store.status("test#m-1").await), (1, Some(ClaimStatus::Completed)));

    // A copy runs the handler (it takes no claim), and its commit finds the key completed: a duplicate.
    let again = run(&engine, vec![message("m-1", json!({}))], SECS_30).await;
    assert_eq!(outcome(&again, "m-1"), &Outcome::Duplicate);
    assert_eq!((handler.runs(), store.applied("test#m-1")), (2, 1));
}

#[tokio::test]
async fn a_redelivery_reads_the_key_first_and_a_completed_one_does_not_run() {
    let (store, handler) = (Arc::new(Calls::default()), Credits::default());
    let engine = engine(&store, &handler, ClaimFirst::Auto);
    run(&engine, vec![message("m-1", json!({}))], SECS_30).await;
    store.take();
    let report = run(&engine, vec![delivery("m-1", json!({}), 2)], SECS_30).await;
    assert_eq!(outcome(&report, "m-1"), &Outcome::Duplicate);
    assert_eq!(store.take(), ["get"], "one consistent read");
    assert_eq!(handler.runs(), 1, "the handler did not run again");
    // A redelivery of a key never completed reads, then runs and commits.
    let report = run(&engine, vec![delivery("m-2", json!({}), 3)], SECS_30).await;
    assert_eq!(outcome(&report, "m-2"), &Outcome::Processed { confirmed: true });
    assert_eq!(store.take(), ["get", "commit unclaimed"]);
}

#[tokio::test]
async fn runs_of_one_key_that_race_both_stage_and_one_commits() {
    let (store, handler) = (Arc::new(Calls::default()), Credits::default());
    let (first, second) = (engine(&store, &handler, ClaimFirst::Auto), engine(&store, &handler, ClaimFirst::Auto));
    let copy = || vec![message("m-1", json!({"sleep_ms": 100}))];
    let (one, two) = tokio::join!(run(&first, copy(), SECS_30), run(&second, copy(), SECS_30));
    let mut outcomes = [outcome(&one, "m-1").clone(), outcome(&two, "m-1").clone()];
    outcomes.sort_by_key(|outcome| outcome.label());
    assert_eq!(outcomes, [Outcome::Duplicate, Outcome::Processed { confirmed: true }]);
    assert_eq!(handler.runs(), 2, "both ran: neither took a claim");
    assert_eq!(store.applied("test#m-1"), 1, "one commit applied");
}

#[tokio::test]
async fn a_failed_run_applies_nothing_and_only_a_permanent_one_is_remembered() {
    let (store, handler) = (Arc::new(Calls::default()), Credits::default());
    let engine = engine(&store, &handler, ClaimFirst::Auto);
    let records = vec![
        message("retry", json!({"fail": "retryable"})),
        message("perm", json!({"fail": "permanent"})),
        message("closed", json!({"gate": "permanent"})),
        message("later", json!({"gate": "retryable"})),
    ];
    let report = run(&engine, records, SECS_30).await;
    assert_eq!(failures(&report), ["retry", "perm", "closed", "later"]);
    assert!(
        matches!(outcome(&report, "closed"), Outcome::Failed(Failure::Permanent(reason)) if reason.contains("gate"))
    );
    assert!(matches!(outcome(&report, "later"), Outcome::Failed(Failure::Retryable(_))));
    for key in ["test#retry", "test#later"] {
        assert_eq!((store.status(key).await, store.applied(key)), (None, 0), "{key}: nothing stored");
    }
    for key in ["test#perm", "test#closed"] {
        assert_eq!((store.status(key).await, store.applied(key)), (Some(ClaimStatus::Failed), 0), "{key}");
    }
    let calls = store.take();
    assert!(!calls.contains(&"release") && !calls.contains(&"finish"), "no claim to finish: {calls:?}");
    // A later delivery of a key failed for good does not run.
    let again = run(&engine, vec![delivery("perm", json!({}), 2)], SECS_30).await;
    assert!(matches!(outcome(&again, "perm"), Outcome::Failed(Failure::FailedBefore(_))));
    assert_eq!(handler.runs(), 4);
}

#[tokio::test]
async fn a_live_claim_elsewhere_refuses_the_commit_as_a_conflict() {
    let (store, handler) = (Arc::new(Calls::default()), Credits::default());
    // Another consumer, which claims first, holds the key.
    let holder = engine(&store, &handler, ClaimFirst::Always);
    let unclaimed = engine(&store, &handler, ClaimFirst::Auto);
    let held = run(&holder, vec![message("m-1", json!({"sleep_ms": 300}))], SECS_30);
    let refused = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        run(&unclaimed, vec![message("m-1", json!({}))], SECS_30).await
    };
    let (held, refused) = tokio::join!(held, refused);
    assert_eq!(outcome(&held, "m-1"), &Outcome::Processed { confirmed: true });
    assert!(matches!(outcome(&refused, "m-1"), Outcome::Failed(Failure::Conflict { .. })), "{refused:?}");
    assert_eq!(store.applied("test#m-1"), 1, "the claim's holder committed; the refused run applied nothing");
}

#[tokio::test]
async fn claiming_always_claims_first_and_nothing_staged_completes_with_one_conditional_write() {
    let (store, handler) = (Arc::new(Calls::default()), Credits::default());
    run(&engine(&store, &handler, ClaimFirst::Always), vec![message("m-1", json!({}))], SECS_30).await;
    assert_eq!(store.take(), ["put_if_free", "commit"], "SQS_ONCE_CLAIM=always: the claim, then its commit");

    let engine = engine(&store, &handler, ClaimFirst::Auto);
    let report = run(&engine, vec![message("m-2", json!({"stage": false}))], SECS_30).await;
    assert_eq!(outcome(&report, "m-2"), &Outcome::Processed { confirmed: true });
    assert_eq!(store.take(), ["put_if_free"], "the completed claim alone, where the key is free");
    assert_eq!(store.status("test#m-2").await, Some(ClaimStatus::Completed));
    let again = run(&engine, vec![message("m-2", json!({"stage": false}))], SECS_30).await;
    assert_eq!(outcome(&again, "m-2"), &Outcome::Duplicate);
}

/// A commit whose answer was lost, kept, and sent again `later` (as the
/// process leaves: SIGTERM), the key's completion deleted by TTL first when
/// `deleted`: how often the key's writes applied, and how many writes the
/// engine gave up.
async fn kept_commit_sent_again(later: Duration, deleted: bool) -> (u64, u64) {
    let (store, clock, engine) = commit_kept().await;
    clock.advance(later);
    if deleted {
        // The key's completion expired (3 min), and TTL deleted it, as it may at any moment after.
        store.inner.delete_expired(clock.now_ms(), |_| true);
        assert_eq!(store.inner.get("test#m-1").await.unwrap(), None);
    }
    store.losing_commit_answers.store(false, Ordering::SeqCst);
    engine.leave(tokio::time::Instant::now() + Duration::from_secs(1)).await;
    (store.applied("test#m-1"), engine.claims().writes_given_up())
}

/// An engine whose one run's commit applied and lost its answer: kept, to be
/// sent again; with the store and the clock it runs on.
async fn commit_kept() -> (Arc<Calls>, Arc<crate::clocks::ManualClock>, Engine) {
    let store = Arc::new(Calls { losing_commit_answers: AtomicBool::new(true), ..Calls::default() });
    let clock = Arc::new(crate::clocks::ManualClock::new(SystemClock.now_ms()));
    let policy =
        ClaimPolicy { expires_after: Duration::from_secs(180), local_cache_entries: 0, ..ClaimPolicy::default() };
    let setup =
        Setup { store: Arc::clone(&store) as Arc<dyn ClaimStore>, policy, clock: clock.clone(), ..Setup::default() };
    let engine = setup.engine(Credits::default());
    let deadline = std::time::UNIX_EPOCH + Duration::from_millis(clock.now_ms()) + SECS_30;
    let invocation = Invocation { deadline, request_id: "r-1".into() };
    let event = parse_event(&json!({ "Records": [message("m-1", json!({}))] }).to_string()).unwrap();
    let report = engine.process(&event, &invocation, None).await;
    assert!(matches!(outcome(&report, "m-1"), Outcome::Failed(Failure::Uncommitted { .. })), "{report:?}");
    assert_eq!(store.applied("test#m-1"), 1, "the commit applied; its answer was lost");
    (store, clock, engine)
}

#[tokio::test]
async fn the_scheduled_sweep_sends_again_the_writes_a_batch_left_unconfirmed() {
    let (store, clock, engine) = commit_kept().await;
    // The queue goes quiet: no batch comes, the schedule invokes the function with the outbox sweep event.
    clock.advance(Duration::from_secs(10));
    store.losing_commit_answers.store(false, Ordering::SeqCst);
    assert!(!engine.claims().all_confirmed());
    let deadline = std::time::UNIX_EPOCH + Duration::from_millis(clock.now_ms()) + SECS_30;
    engine.sweep_outbox(deadline).await;
    assert!(engine.claims().all_confirmed(), "{:?}", engine.claims().still_unconfirmed());
    assert_eq!(store.applied("test#m-1"), 1, "sent again, it lands as the write that had applied");
}

#[tokio::test]
async fn a_kept_commit_is_not_sent_again_once_the_completion_that_refuses_it_can_be_gone() {
    let (applied, given_up) = kept_commit_sent_again(Duration::from_secs(11 * 60), true).await;
    assert_eq!(applied, 1, "the key's writes applied a second time, hours after the first");
    assert_eq!(given_up, 1, "the commit is given up, counted");
}

#[tokio::test]
async fn a_kept_commit_sent_again_within_its_time_finds_its_own_completion() {
    let (applied, given_up) = kept_commit_sent_again(Duration::from_secs(10), false).await;
    assert_eq!((applied, given_up), (1, 0), "sent again, it lands as the write that had applied");
}

/// A commit whose answer is lost (reported `uncommitted`), with keys
/// remembered 30 s and a queue that delivers failed records again within
/// `redelivered_within`; its record delivered again `after` the answer:
/// the redelivery's outcome, and how often the key's writes applied.
async fn redelivered(claim: ClaimFirst, redelivered_within: Option<Duration>, after: Duration) -> (Outcome, u64) {
    redelivered_with(claim, redelivered_within, after, json!({})).await
}

/// [`redelivered`], the record's body `body`.
async fn redelivered_with(
    claim: ClaimFirst,
    redelivered_within: Option<Duration>,
    after: Duration,
    body: Value,
) -> (Outcome, u64) {
    let store = Arc::new(Calls { losing_commit_answers: AtomicBool::new(true), ..Calls::default() });
    let clock = Arc::new(crate::clocks::ManualClock::new(SystemClock.now_ms()));
    let policy = ClaimPolicy {
        expires_after: Duration::from_secs(30),
        redelivered_within,
        local_cache_entries: 0,
        ..ClaimPolicy::default()
    };
    let options = EngineOptions { claim, ..EngineOptions::default() };
    let setup = Setup {
        store: Arc::clone(&store) as Arc<dyn ClaimStore>,
        policy,
        options,
        clock: clock.clone(),
        ..Setup::default()
    };
    let engine = setup.engine(Credits::default());
    let invoke = |attempt: u32| {
        let deadline = std::time::UNIX_EPOCH + Duration::from_millis(clock.now_ms()) + SECS_30;
        let invocation = Invocation { deadline, request_id: format!("r-{attempt}") };
        let event = parse_event(&json!({ "Records": [delivery("m-1", body.clone(), attempt)] }).to_string()).unwrap();
        let engine = engine.clone();
        async move { engine.process(&event, &invocation, None).await }
    };
    let first = invoke(1).await;
    assert!(matches!(outcome(&first, "m-1"), Outcome::Failed(Failure::Uncommitted { .. })), "{first:?}");
    assert_eq!(store.applied("test#m-1"), 1, "the commit applied; its answer was lost");
    store.losing_commit_answers.store(false, Ordering::SeqCst);
    clock.advance(after);
    let again = invoke(2).await;
    (outcome(&again, "m-1").clone(), store.applied("test#m-1"))
}

/// The template's queue: failed records back within its visibility timeout, 180 s.
const TEMPLATE_VISIBILITY: Duration = Duration::from_secs(180);

#[tokio::test]
async fn an_uncommitted_record_back_after_the_visibility_timeout_finds_its_commit_whatever_the_key_memory() {
    for claim in [ClaimFirst::Auto, ClaimFirst::Always] {
        // Keys remembered 30 s; the record back 181 s after its answer, as SQS returns it.
        let (outcome, applied) = redelivered(claim, Some(TEMPLATE_VISIBILITY), Duration::from_secs(181)).await;
        assert_eq!((outcome, applied), (Outcome::Duplicate, 1), "{claim:?}: the credit applied twice");
    }
}

#[tokio::test]
async fn a_redelivery_after_the_window_and_the_key_memory_runs_again() {
    // The documented end of the promise: a record back after both (a dead-letter queue's redrive a day
    // later) finds the key forgotten, and its run applies again.
    let day = Duration::from_secs(24 * 3_600);
    let (outcome, applied) = redelivered(ClaimFirst::Auto, Some(TEMPLATE_VISIBILITY), day).await;
    assert_eq!((outcome, applied), (Outcome::Processed { confirmed: true }, 2));
    // Records no queue delivers again (`invoke` of an event file) keep the key memory alone, and a commit's two
    // minutes at least: within them, a duplicate; after, the key is forgotten.
    let (outcome, applied) = redelivered(ClaimFirst::Auto, None, Duration::from_secs(100)).await;
    assert_eq!((outcome, applied), (Outcome::Duplicate, 1));
    let (outcome, applied) = redelivered(ClaimFirst::Auto, None, Duration::from_secs(122)).await;
    assert_eq!((outcome, applied), (Outcome::Processed { confirmed: true }, 2));
}

#[tokio::test]
async fn a_run_whose_one_update_keeps_its_key_commits_it_alone_and_a_copy_finds_the_key_in_the_item() {
    let (store, handler) = (Arc::new(Calls::default()), Credits::default());
    let engine = engine(&store, &handler, ClaimFirst::Auto);
    let report = run(&engine, vec![message("m-1", json!({"keep": true}))], SECS_30).await;
    assert_eq!(outcome(&report, "m-1"), &Outcome::Processed { confirmed: true });
    assert_eq!(store.take(), ["commit in item"], "one write: the update, its key in the item");
    assert_eq!((store.applied("test#m-1"), store.status("test#m-1").await), (1, None), "no claim, no completion");
    let digest = item_keys::KeyInItem::digest_of("test#m-1");
    assert_eq!(store.kept_keys("test#m-1"), (vec![digest], vec![item_keys::NO_KEY.to_owned()]));

    // A copy runs the handler and its commit finds the key in the item: a duplicate, nothing applied.
    let again = run(&engine, vec![message("m-1", json!({"keep": true}))], SECS_30).await;
    assert_eq!(outcome(&again, "m-1"), &Outcome::Duplicate);
    assert_eq!((handler.runs(), store.applied("test#m-1")), (2, 1));
}

#[tokio::test]
async fn runs_of_one_key_that_race_to_keep_it_in_the_item_apply_once() {
    let (store, handler) = (Arc::new(Calls::default()), Credits::default());
    let (first, second) = (engine(&store, &handler, ClaimFirst::Auto), engine(&store, &handler, ClaimFirst::Auto));
    let copy = || vec![message("m-1", json!({"sleep_ms": 100, "keep": true}))];
    let (one, two) = tokio::join!(run(&first, copy(), SECS_30), run(&second, copy(), SECS_30));
    let mut outcomes = [outcome(&one, "m-1").clone(), outcome(&two, "m-1").clone()];
    outcomes.sort_by_key(|outcome| outcome.label());
    assert_eq!(outcomes, [Outcome::Duplicate, Outcome::Processed { confirmed: true }]);
    assert_eq!(store.applied("test#m-1"), 1);
}

#[tokio::test]
async fn a_run_keeps_its_key_in_the_item_only_when_the_update_is_its_one_effect() {
    let (store, handler) = (Arc::new(Calls::default()), Credits::default());
    // Beside a check, the run commits its transaction: the key kept with its claim.
    let unclaimed = engine(&store, &handler, ClaimFirst::Auto);
    let report = run(&unclaimed, vec![message("m-1", json!({"keep": true, "gate": "permanent"}))], SECS_30).await;
    assert!(matches!(outcome(&report, "m-1"), Outcome::Failed(Failure::Permanent(_))), "{report:?}");
    assert_eq!(store.take(), ["commit unclaimed", "put_if_free"]);
    // A run that claims first commits its update the same way, its key kept in the item, then completes its
    // claim: consumers that claim first and those that do not keep the key in one place.
    let claiming = engine(&store, &handler, ClaimFirst::Always);
    run(&claiming, vec![message("m-2", json!({"keep": true}))], SECS_30).await;
    assert_eq!(store.take(), ["put_if_free", "commit in item", "finish"]);
    assert_eq!(store.status("test#m-2").await, Some(ClaimStatus::Completed));
    assert_eq!(store.kept_keys("test#m-2").0, [item_keys::KeyInItem::digest_of("test#m-2")]);
    // A copy run by a consumer that does not claim first finds the key in the item.
    let report = run(&unclaimed, vec![message("m-2", json!({"keep": true}))], SECS_30).await;
    assert_eq!(outcome(&report, "m-2"), &Outcome::Duplicate);
    assert_eq!(store.applied("test#m-2"), 1);
}

#[tokio::test]
async fn with_keys_in_items_set_every_run_whose_one_effect_is_an_update_keeps_its_key_there() {
    let (store, handler) = (Arc::new(Calls::default()), Credits::default());
    let policy = ClaimPolicy { keys_in_items: true, local_cache_entries: 0, ..ClaimPolicy::default() };
    let setup = Setup { store: Arc::clone(&store) as Arc<dyn ClaimStore>, policy, ..Setup::default() };
    let engine = setup.engine(handler.clone());
    let report = run(&engine, vec![message("m-1", json!({})), message("m-2", json!({"stage": false}))], SECS_30).await;
    assert!(failures(&report).is_empty(), "{report:?}");
    let mut calls = store.take();
    calls.sort();
    assert_eq!(calls, ["commit in item", "put_if_free"], "the update alone; nothing staged writes its completion");
    assert_eq!(store.kept_keys("test#m-1").0, [item_keys::KeyInItem::digest_of("test#m-1")]);
}

#[tokio::test]
async fn an_update_whose_own_condition_fails_fails_as_it_declared_and_keeps_no_key() {
    let (store, handler) = (Arc::new(Calls::default()), Credits::default());
    let engine = engine(&store, &handler, ClaimFirst::Auto);
    run(&engine, vec![message("m-1", json!({"keep": true}))], SECS_30).await;
    // Conditioned on the item's `n` being below 1: m-2's item has none, and a comparison with nothing fails.
    let record = |id| vec![message(id, json!({"keep": true, "below": 1}))];
    let key = |id: &str| format!("test#{id}");
    let refused = run(&engine, record("m-2"), SECS_30).await;
    assert!(
        matches!(outcome(&refused, "m-2"), Outcome::Failed(Failure::Permanent(reason)) if reason.contains("at its most")),
        "{refused:?}"
    );
    assert_eq!(store.applied(&key("m-1")), 1);
    assert_eq!(store.status(&key("m-2")).await, Some(ClaimStatus::Failed), "the failure for good is recorded");
    assert_eq!(store.kept_keys(&key("m-1")).0.len(), 1, "one key kept");
}

#[tokio::test]
async fn a_commit_into_a_full_window_waits_for_the_window_to_turn_and_the_item_keeps_its_bound() {
    let store = Arc::new(Calls::default());
    // One account's item, credited by MAX_KEYS_PER_WINDOW messages in one window.
    struct OneAccount;
    impl Handler for OneAccount {
        async fn handle(&self, record: &Record) -> HandlerResult {
            record.transaction().stage(Update::new("applied", Key::new("pk", "acct")).add("n", 1).keep_key())?;
            Ok(None)
        }
        fn stages_every_effect(&self) -> bool {
            true
        }
    }
    let policy = ClaimPolicy { local_cache_entries: 0, ..ClaimPolicy::default() };
    let setup = Setup { store: Arc::clone(&store) as Arc<dyn ClaimStore>, policy, ..Setup::default() };
    let engine = setup.engine(OneAccount);
    let records = (0..=item_keys::MAX_KEYS_PER_WINDOW).map(|n| message(&format!("m-{n}"), json!({}))).collect();
    let report = run(&engine, records, SECS_30).await;
    let failed = failures(&report);
    assert_eq!(failed.len(), 1, "{failed:?}");
    let Outcome::Failed(failure @ Failure::WindowFull { retry_after, .. }) = outcome(&report, &failed[0]) else {
        panic!("{report:?}")
    };
    assert!(failure.to_string().contains("as an item holds (256)"), "{failure}");
    // The window began with the batch, and turns a key memory (an hour) later: the record stays away until then,
    // as long as the back-off allows, at every receive, rather than backed off 5, 10, 20… s to the dead-letter queue.
    assert!((Duration::from_secs(3_590)..=Duration::from_secs(3_600)).contains(retry_after), "{failure}");
    let policy = crate::redelivery::RedeliveryPolicy::default();
    for receive_count in 1..=5 {
        let next = policy.next_delivery(failure, receive_count, false);
        assert_eq!(next, crate::redelivery::NextDelivery::After(policy.longest_delay), "receive {receive_count}");
    }
    assert_eq!(store.applied("acct"), item_keys::MAX_KEYS_PER_WINDOW as u64);
    assert_eq!(store.kept_keys("acct").0.len(), item_keys::MAX_KEYS_PER_WINDOW);
}

#[tokio::test]
async fn a_kept_key_commit_whose_answer_was_lost_applies_once_sent_again_or_redelivered() {
    // Sent again by the process (its answer lost): the item holds the key, the effect applied once.
    let store = Arc::new(Calls { losing_commit_answers: AtomicBool::new(true), ..Calls::default() });
    let engine = engine(&store, &Credits::default(), ClaimFirst::Auto);
    let report = run(&engine, vec![message("m-1", json!({"keep": true}))], SECS_30).await;
    assert!(matches!(outcome(&report, "m-1"), Outcome::Failed(Failure::Uncommitted { .. })), "{report:?}");
    store.losing_commit_answers.store(false, Ordering::SeqCst);
    engine.leave(tokio::time::Instant::now() + Duration::from_secs(1)).await;
    assert!(engine.claims().all_confirmed());
    assert_eq!((store.applied("test#m-1"), engine.claims().writes_given_up()), (1, 0));
    // Back after the queue's visibility timeout, keys remembered 30 s: the key is still in the item.
    let keep = json!({"keep": true});
    let (outcome, applied) =
        redelivered_with(ClaimFirst::Auto, Some(TEMPLATE_VISIBILITY), Duration::from_secs(181), keep.clone()).await;
    assert_eq!((outcome, applied), (Outcome::Duplicate, 1), "the credit applied twice");
    // A redrive a day later finds the key forgotten, as documented.
    let day = Duration::from_secs(24 * 3_600);
    let (outcome, applied) = redelivered_with(ClaimFirst::Auto, Some(TEMPLATE_VISIBILITY), day, keep).await;
    assert_eq!((outcome, applied), (Outcome::Processed { confirmed: true }, 2));
}
