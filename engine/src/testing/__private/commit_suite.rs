//! The commit conformance suite: how a store commits a handler's staged
//! writes with its claim ([`CommitStore::commit`](sqs_once_core::store::CommitStore::commit)) and keeps the outbox,
//! written once and run against every store that does (memory, SQLite,
//! DynamoDB Local). [`commit_suite!`](crate::commit_suite) expands to one
//! test per case; each function here is one of them, for a store and the
//! name of a table it may write items to (for DynamoDB, an existing table
//! whose partition key is the string `pk`).
//!
//! The suite reads items back through the contract itself: a commit that
//! stages only a condition check on an item applies exactly when the
//! condition holds there.

use std::{sync::Arc, time::Duration};

use serde_json::{Value, json};

use super::claim_suite::Machine;
use crate::claim::Lease;
use sqs_once_core::{
    clock::Clock,
    store::{Cancellation, ClaimStatus, ClaimStore, Committed, Fenced, OutboxEntry, OutboxQuery, StoreError},
    transaction::{Check, Condition, Delete, Key, Message, Put, Transaction, Update, Write},
};

const QUEUE: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/suite";

/// Commits `writes` (and `messages`) under a fresh claim of `id`.
async fn commit(
    m: &Machine,
    id: &str,
    writes: Vec<Write>,
    messages: Vec<Message>,
) -> (Lease, Result<Committed, StoreError>) {
    let lease = m.win(id).await;
    let committed = commit_under(m, &lease, writes, messages).await;
    (lease, committed)
}

async fn commit_under(
    m: &Machine,
    lease: &Lease,
    writes: Vec<Write>,
    messages: Vec<Message>,
) -> Result<Committed, StoreError> {
    let commit = m.claims.prepare_commit(lease, None, staged(writes, messages), "m-suite");
    m.claims.commit(lease, commit).await
}

/// `writes` and `messages`, staged.
fn staged(writes: Vec<Write>, messages: Vec<Message>) -> sqs_once_core::transaction::Staged {
    let transaction = Transaction::default();
    for write in writes {
        transaction.stage(write).expect("a valid write");
    }
    for message in messages {
        transaction.send(message).expect("a valid message");
    }
    transaction.staged()
}

/// Starts a run of `id` that takes no claim, as delivery `attempt` (a
/// redelivery reads the key first: the run may end there).
async fn start_unclaimed(m: &Machine, id: &str, attempt: u32) -> crate::claim::Claim {
    let request = crate::claim::ClaimRequest {
        id,
        body: "{}",
        deadline_ms: m.deadline(),
        holder: "holder-u",
        attempt,
        message_id: "m-unclaimed",
    };
    m.claims.start_unclaimed(&request).await.expect("store error")
}

/// The lease of a run of `id` that takes no claim.
async fn unclaimed(m: &Machine, id: &str) -> Lease {
    match start_unclaimed(m, id, 1).await {
        crate::claim::Claim::Won(lease) => lease,
        other => panic!("a first delivery of {id} without a claim starts, not {other:?}"),
    }
}

/// Whether `condition` holds on the item `pk` of `table`, as a committed
/// condition check says.
async fn holds(m: &Machine, table: &str, pk: &str, condition: Condition) -> bool {
    let id = format!("check-{}", uuid::Uuid::new_v4().simple());
    match commit(m, &id, vec![Check::new(table, Key::new("pk", pk), condition).into()], Vec::new()).await.1 {
        Ok(Committed::Applied) => true,
        Ok(Committed::Cancelled(_)) => false,
        other => panic!("a condition check answered {other:?}"),
    }
}

fn account(pk: &str) -> Key {
    Key::new("pk", pk)
}

/// A fresh account id.
fn fresh(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Checks that a commit applies the writes, the outbox entries and the
/// claim's completion together, and that the key is then a duplicate.
pub async fn a_commit_applies_writes_outbox_and_completion_at_once(store: Arc<dyn ClaimStore>, table: String) {
    let m = Machine::plain(store);
    let (alice, bob) = (fresh("alice"), fresh("bob"));
    let writes = vec![
        Update::new(&table, account(&alice)).add("balance", 5).set_if_absent("opened", "m-1").into(),
        Put::new(&table, account(&bob)).set("balance", 2).set("tags", json!(["x"])).into(),
    ];
    let messages = vec![Message::sqs(QUEUE, "one"), Message::sqs(QUEUE, "two").attribute("kind", "notice")];
    let (lease, committed) = commit(&m, "k-apply", writes, messages).await;
    assert_eq!(committed.unwrap(), Committed::Applied);
    assert!(holds(&m, &table, &alice, Condition::eq("balance", 5).and(Condition::eq("opened", "m-1"))).await);
    assert!(holds(&m, &table, &bob, Condition::eq("tags", json!(["x"]))).await);
    assert_eq!(m.stored("k-apply").await.unwrap().status, ClaimStatus::Completed);
    let entries = m.outbox().entries(&OutboxQuery { due_at_ms: None, limit: 100 }).await.unwrap();
    let ours: Vec<&OutboxEntry> = entries.iter().filter(|entry| entry.claim_id == lease.id).collect();
    let bodies: Vec<&str> = ours.iter().map(|entry| entry.message.body.as_str()).collect();
    assert_eq!(bodies, ["one", "two"], "in the order staged");
    assert_eq!(ours[1].message.attributes["kind"], "notice");
    assert!(ours.iter().all(|entry| entry.token == lease.token && entry.message_id == "m-suite"));
    assert!(matches!(m.claim("k-apply", "{}", "holder-2").await, crate::claim::Claim::Duplicate { .. }));
}

/// Checks that a commit sent again (its answer lost, a process thawed) is
/// applied once.
pub async fn a_commit_sent_again_applies_once(store: Arc<dyn ClaimStore>, table: String) {
    let m = Machine::plain(store);
    let carol = fresh("carol");
    let lease = m.win("k-again").await;
    let transaction = Transaction::default();
    transaction.stage(Update::new(&table, account(&carol)).add("balance", 5)).unwrap();
    transaction.send(Message::sqs(QUEUE, "once")).unwrap();
    let commit = m.claims.prepare_commit(&lease, None, transaction.staged(), "m-again");
    assert_eq!(m.claims.commit(&lease, commit.clone()).await.unwrap(), Committed::Applied);
    assert_eq!(m.commits().commit(&lease.id, &lease.token, &commit).await.unwrap(), Committed::Applied);
    assert!(holds(&m, &table, &carol, Condition::eq("balance", 5)).await, "added once");
    let entries = m.outbox().entries(&OutboxQuery { due_at_ms: None, limit: 100 }).await.unwrap();
    assert_eq!(entries.iter().filter(|entry| entry.claim_id == lease.id).count(), 1, "one outbox entry");
}

/// Checks that a commit refused because the claim was taken over after
/// its lease applies nothing, and the new holder's does.
pub async fn a_commit_after_a_takeover_applies_nothing(store: Arc<dyn ClaimStore>, table: String) {
    let m = Machine::plain(store);
    let dave = fresh("dave");
    let first = m.win("k-taken").await;
    m.clock.advance(Duration::from_secs(60));
    let second = m.win("k-taken").await;
    let credit = |amount: i64| vec![Update::new(&table, account(&dave)).add("balance", amount).into()];
    let late = commit_under(&m, &first, credit(100), vec![Message::sqs(QUEUE, "late")]).await;
    assert_eq!(late.unwrap(), Committed::Refused);
    assert!(holds(&m, &table, &dave, Condition::not_exists("balance")).await, "nothing of the late commit applied");
    assert_eq!(commit_under(&m, &second, credit(7), Vec::new()).await.unwrap(), Committed::Applied);
    assert!(holds(&m, &table, &dave, Condition::eq("balance", 7)).await);
    let entries = m.outbox().entries(&OutboxQuery { due_at_ms: None, limit: 100 }).await.unwrap();
    assert!(entries.iter().all(|entry| entry.claim_id != first.id), "the refused run sent nothing");
}

/// Checks that a staged write whose condition does not hold cancels the
/// whole commit, says which write it was, and leaves the claim in progress.
pub async fn a_condition_that_does_not_hold_cancels_everything(store: Arc<dyn ClaimStore>, table: String) {
    let m = Machine::plain(store);
    let (erin, frank) = (fresh("erin"), fresh("frank"));
    let writes = vec![
        Update::new(&table, account(&erin)).add("balance", 10).into(),
        Update::new(&table, account(&frank)).add("balance", -5).condition(Condition::ge("balance", 5)).into(),
    ];
    let (_, committed) = commit(&m, "k-cancel", writes, vec![Message::sqs(QUEUE, "never")]).await;
    let Ok(Committed::Cancelled(cancellation)) = committed else { panic!("not cancelled: {committed:?}") };
    assert_eq!(cancellation.write, 1, "the second write's condition failed");
    assert!(cancellation.reasons.contains("ConditionalCheckFailed"), "{}", cancellation.reasons);
    assert!(holds(&m, &table, &erin, Condition::not_exists("balance")).await, "the first write did not apply");
    assert_eq!(m.stored("k-cancel").await.unwrap().status, ClaimStatus::InProgress);
}

/// Checks that a run that took no claim commits the key's completion with
/// its writes and outbox entries where the key is free: one commit, nothing
/// stored before it; the key is then a duplicate.
pub async fn an_unclaimed_commit_completes_a_free_key_with_its_writes(store: Arc<dyn ClaimStore>, table: String) {
    let m = Machine::plain(store);
    let kim = fresh("kim");
    let lease = unclaimed(&m, "k-unclaimed").await;
    assert_eq!(m.stored("k-unclaimed").await, None, "no claim is written before the commit");
    let writes = vec![Update::new(&table, account(&kim)).add("balance", 3).into()];
    let committed = commit_under(&m, &lease, writes, vec![Message::sqs(QUEUE, "credited")]).await;
    assert_eq!(committed.unwrap(), Committed::Applied);
    assert!(holds(&m, &table, &kim, Condition::eq("balance", 3)).await);
    let claim = m.stored("k-unclaimed").await.expect("the commit wrote the claim");
    assert_eq!(claim.status, ClaimStatus::Completed);
    assert_eq!((claim.token.as_deref(), claim.lease_until_ms), (Some(lease.token.as_str()), None));
    assert_eq!((claim.holder.as_deref(), claim.message_id.as_deref()), (Some("holder-u"), Some("m-unclaimed")));
    let entries = m.outbox().entries(&OutboxQuery { due_at_ms: None, limit: 100 }).await.unwrap();
    assert_eq!(entries.iter().filter(|entry| entry.claim_id == lease.id).count(), 1);
    assert!(matches!(m.claim("k-unclaimed", "{}", "holder-2").await, crate::claim::Claim::Duplicate { .. }));
    // A redelivery reads the key first, and does not run.
    assert!(matches!(start_unclaimed(&m, "k-unclaimed", 2).await, crate::claim::Claim::Duplicate { .. }));
}

/// Checks that of two runs of one key that took no claim, the first commit
/// applies and the second is refused with the record that holds the key;
/// the first sent again is applied, once.
pub async fn of_two_unclaimed_commits_of_a_key_one_applies(store: Arc<dyn ClaimStore>, table: String) {
    let m = Machine::plain(store);
    let lee = fresh("lee");
    let (first, second) = (unclaimed(&m, "k-race").await, unclaimed(&m, "k-race").await);
    let credit = |amount: i64| vec![Update::new(&table, account(&lee)).add("balance", amount).into()];
    let one = m.claims.prepare_commit(&first, None, staged(credit(5), Vec::new()), "m-1");
    assert_eq!(m.claims.commit(&first, one.clone()).await.unwrap(), Committed::Applied);
    let two = commit_under(&m, &second, credit(5), vec![Message::sqs(QUEUE, "never")]).await.unwrap();
    let Committed::Taken(holder) = two else { panic!("the second commit answered {two:?}") };
    // A store that cannot say who holds the key answers None, and the state machine reads it.
    if let Some(holder) = holder {
        assert_eq!((holder.status, holder.token.as_deref()), (ClaimStatus::Completed, Some(first.token.as_str())));
    }
    assert_eq!(m.commits().commit(&first.id, &first.token, &one).await.unwrap(), Committed::Applied, "sent again");
    assert!(holds(&m, &table, &lee, Condition::eq("balance", 5)).await, "applied once");
    let entries = m.outbox().entries(&OutboxQuery { due_at_ms: None, limit: 100 }).await.unwrap();
    assert!(entries.iter().all(|entry| entry.claim_id != second.id || entry.token != second.token));
}

/// Checks that an unclaimed commit applies nothing while another holder's
/// claim is live, nor where a staged condition fails (and then writes no
/// claim), and that it takes over a claim whose lease has ended.
pub async fn an_unclaimed_commit_respects_live_claims_and_its_conditions(store: Arc<dyn ClaimStore>, table: String) {
    let m = Machine::plain(store);
    let mo = fresh("mo");
    let credit = |amount: i64| vec![Update::new(&table, account(&mo)).add("balance", amount).into()];
    let held = m.win("k-held").await;
    let lease = unclaimed(&m, "k-held").await;
    let refused = commit_under(&m, &lease, credit(1), Vec::new()).await.unwrap();
    assert!(matches!(refused, Committed::Taken(_)), "{refused:?}");
    assert_eq!(m.stored("k-held").await.unwrap().token.as_deref(), Some(held.token.as_str()), "the claim stands");
    assert!(holds(&m, &table, &mo, Condition::not_exists("balance")).await);

    let gated =
        vec![Update::new(&table, account(&mo)).add("balance", -1).condition(Condition::ge("balance", 1)).into()];
    let lease = unclaimed(&m, "k-gated").await;
    let cancelled = commit_under(&m, &lease, gated, Vec::new()).await.unwrap();
    assert!(matches!(cancelled, Committed::Cancelled(Cancellation { write: 0, .. })), "{cancelled:?}");
    assert_eq!(m.stored("k-gated").await, None, "a cancelled commit writes no claim");

    m.clock.advance(Duration::from_secs(60));
    let late = unclaimed(&m, "k-held").await;
    assert_eq!(commit_under(&m, &late, credit(2), Vec::new()).await.unwrap(), Committed::Applied, "lease ended");
    assert!(holds(&m, &table, &mo, Condition::eq("balance", 2)).await);
}

/// Checks that conditions judge as DynamoDB judges them: missing
/// attributes, values of another type, numbers by value, strings by bytes.
pub async fn conditions_judge_as_dynamodb_does(store: Arc<dyn ClaimStore>, table: String) {
    let m = Machine::plain(store);
    let grace = fresh("grace");
    let item = Put::new(&table, account(&grace))
        .set("balance", 10)
        .set("name", "Ann")
        .set("tags", json!([1, "two"]))
        .set("flag", true)
        .set("nothing", Value::Null);
    assert_eq!(commit(&m, "k-item", vec![item.into()], Vec::new()).await.1.unwrap(), Committed::Applied);
    let cases = [
        (Condition::exists("balance"), true),
        (Condition::not_exists("missing"), true),
        (Condition::exists("nothing"), true),
        (Condition::eq("balance", 10), true),
        (Condition::eq("balance", 10.0), true),
        (Condition::ge("balance", 10) & Condition::lt("balance", 10.5), true),
        (Condition::gt("balance", 9.99), true),
        (Condition::eq("balance", "10"), false),
        (Condition::ne("balance", "10"), true),
        (Condition::ge("balance", "1"), false),
        (Condition::lt("name", 5), false),
        (Condition::ge("missing", 0), false),
        (Condition::eq("missing", 0), false),
        (Condition::ne("missing", 0), true),
        (Condition::gt("name", "Al"), true),
        (Condition::lt("name", "ann"), true),
        (Condition::begins_with("name", "An"), true),
        (Condition::begins_with("balance", "1"), false),
        (Condition::eq("tags", json!([1, "two"])), true),
        (Condition::eq("flag", true), true),
        (Condition::ne("flag", false), true),
        (!Condition::exists("balance") | Condition::eq("name", "Ann"), true),
    ];
    for (condition, expected) in cases {
        let judged = holds(&m, &table, &grace, condition.clone()).await;
        assert_eq!(judged, expected, "{condition:?} on {grace}");
    }
    assert!(holds(&m, &table, &fresh("nobody"), Condition::not_exists("pk")).await, "no item: no attributes");
}

/// Checks that a write DynamoDB refuses for what it holds (adding to a
/// string) is rejected, and applies nothing.
pub async fn adding_to_what_is_not_a_number_is_rejected(store: Arc<dyn ClaimStore>, table: String) {
    let m = Machine::plain(store);
    let heidi = fresh("heidi");
    let named = Put::new(&table, account(&heidi)).set("balance", "ten");
    assert_eq!(commit(&m, "k-named", vec![named.into()], Vec::new()).await.1.unwrap(), Committed::Applied);
    let add = Update::new(&table, account(&heidi)).add("balance", 1);
    let other = Update::new(&table, account(&fresh("ivan"))).add("balance", 1);
    let (_, committed) = commit(&m, "k-add", vec![other.into(), add.into()], Vec::new()).await;
    assert!(matches!(committed, Err(StoreError::Rejected(_))), "{committed:?}");
    assert!(holds(&m, &table, &heidi, Condition::eq("balance", "ten")).await);
}

/// Checks that outbox entries are taken over only once their sending lease
/// has ended and only under the token they were listed with, and deleted
/// only by their holder or by the run that committed them.
pub async fn outbox_entries_are_taken_over_when_due_and_deleted_by_their_holder(
    store: Arc<dyn ClaimStore>,
    table: String,
) {
    let m = Machine::plain(store);
    let writes = vec![Delete::new(&table, account(&fresh("judy"))).into()];
    let (lease, committed) =
        commit(&m, "k-outbox", writes, vec![Message::sqs(QUEUE, "a"), Message::sqs(QUEUE, "b")]).await;
    assert_eq!(committed.unwrap(), Committed::Applied);
    let ours = |entries: Vec<OutboxEntry>| -> Vec<OutboxEntry> {
        entries.into_iter().filter(|entry| entry.claim_id == lease.id).collect()
    };
    let due = |m: &Machine| OutboxQuery { due_at_ms: Some(m.clock.now_ms()), limit: 100 };
    assert!(ours(m.outbox().entries(&due(&m)).await.unwrap()).is_empty(), "leased to the committing run");
    m.clock.advance(crate::claim::SENDING_LEASE + Duration::from_secs(1));
    let entries = ours(m.outbox().entries(&due(&m)).await.unwrap());
    assert_eq!(entries.len(), 2, "due once the lease has ended");
    let (first, second) = (&entries[0], &entries[1]);
    let until = m.clock.now_ms() + 30_000;
    let taken = m.outbox().take_entry(first, "sweeper-1", until).await.unwrap();
    let expected = OutboxEntry { token: "sweeper-1".into(), lease_until_ms: until, ..first.clone() };
    assert_eq!(taken, Some(expected), "the entry as taken: its message whole, under the new lease");
    assert_eq!(m.outbox().take_entry(first, "sweeper-2", until).await.unwrap(), None, "taken already");
    let listed = ours(m.outbox().entries(&OutboxQuery { due_at_ms: None, limit: 100 }).await.unwrap());
    assert_eq!((listed[0].token.as_str(), listed[0].lease_until_ms), ("sweeper-1", until), "listed under its lease");
    assert_eq!(m.outbox().entry_sent(&first.id, "sweeper-2").await.unwrap(), Fenced::Refused, "not its holder");
    assert_eq!(m.outbox().entry_sent(&first.id, "sweeper-1").await.unwrap(), Fenced::Applied);
    assert_eq!(m.outbox().entry_sent(&first.id, "sweeper-1").await.unwrap(), Fenced::Applied, "gone counts as deleted");
    // The committing run deletes what it sent, taken over since or not; the sweeper's lease goes with it.
    assert!(m.outbox().take_entry(second, "sweeper-3", until).await.unwrap().is_some());
    assert_eq!(m.outbox().entry_sent(&second.id, &lease.token).await.unwrap(), Fenced::Applied);
    assert!(ours(m.outbox().entries(&OutboxQuery { due_at_ms: None, limit: 100 }).await.unwrap()).is_empty());
    assert_eq!(m.outbox().entry_sent(&second.id, "sweeper-3").await.unwrap(), Fenced::Applied, "gone");
}

/// Checks that an entry whose holder gave its lease up after a failed send
/// is held by no one: listed under the released token until its retry time,
/// no longer its former holder's, and taken at once under that token (as an
/// operator's `claims outbox --send` takes it), by the committing run's
/// lease and a sweeper's alike.
pub async fn a_released_entry_is_held_by_no_one_and_taken_under_its_released_token(
    store: Arc<dyn ClaimStore>,
    table: String,
) {
    let m = Machine::plain(store);
    let writes = vec![Delete::new(&table, account(&fresh("lena"))).into()];
    let messages = vec![Message::sqs(QUEUE, "released"), Message::sqs(QUEUE, "taken, then released")];
    let (lease, committed) = commit(&m, &fresh("k-released"), writes, messages).await;
    assert_eq!(committed.unwrap(), Committed::Applied);
    let listed = || async {
        let entries = m.outbox().entries(&OutboxQuery { due_at_ms: None, limit: 1000 }).await.unwrap();
        entries.into_iter().filter(|entry| entry.claim_id == lease.id).collect::<Vec<_>>()
    };
    let entries = listed().await;
    let (first, second) = (&entries[0], &entries[1]);
    let retry_at_ms = m.clock.now_ms() + 15_000;
    let outbox = m.outbox();
    let release = |entry, failed_sends| outbox.release_entry(entry, failed_sends, retry_at_ms);
    assert_eq!(release(first, 1).await.unwrap(), Fenced::Applied, "its run gives it up");
    let taken = m.outbox().take_entry(second, "sweeper", retry_at_ms).await.unwrap().expect("taken over");
    assert_eq!(release(&taken, 3).await.unwrap(), Fenced::Applied, "its sweeper too, its third failed send");
    for (entry, failed_sends) in listed().await.into_iter().zip([1, 3]) {
        assert!(entry.is_released() && entry.lease_until_ms == retry_at_ms, "held by no one: {entry:?}");
        assert_eq!(entry.failed_sends(), failed_sends, "the failed sends counted: {entry:?}");
        assert!(!entry.is_due(m.clock.now_ms()), "a sweep waits for its retry time");
    }
    assert_eq!(release(first, 2).await.unwrap(), Fenced::Refused, "no longer its run's");
    assert_eq!(release(&taken, 4).await.unwrap(), Fenced::Refused, "nor the sweeper's");
    for entry in listed().await {
        let now = m.outbox().take_entry(&entry, "operator", retry_at_ms).await.unwrap();
        assert_eq!(now.map(|taken| taken.token), Some("operator".to_owned()), "taken at once, as it was released");
        assert_eq!(m.outbox().entry_sent(&entry.id, "operator").await.unwrap(), Fenced::Applied);
    }
    assert!(listed().await.is_empty());
}

/// Checks that a message as large as staging lets through, a JSON body
/// whose quotes would double its size escaped, commits and is listed whole.
pub async fn a_message_as_large_as_staging_allows_commits_whole(store: Arc<dyn ClaimStore>, table: String) {
    let m = Machine::plain(store);
    let body = r#"{"k":"v"},"#.repeat(390 * 1024 / 10);
    let writes = vec![Delete::new(&table, account(&fresh("kim"))).into()];
    let (lease, committed) = commit(&m, &fresh("k-large"), writes, vec![Message::sqs(QUEUE, body.clone())]).await;
    assert_eq!(committed.unwrap(), Committed::Applied);
    let entries = m.outbox().entries(&OutboxQuery { due_at_ms: None, limit: 1000 }).await.unwrap();
    let ours: Vec<&OutboxEntry> = entries.iter().filter(|entry| entry.claim_id == lease.id).collect();
    assert_eq!(ours.len(), 1);
    assert!(ours[0].message.body == body, "the body comes back as it was staged");
    assert_eq!(m.outbox().entry_sent(&ours[0].id, &lease.token).await.unwrap(), Fenced::Applied);
}

/// A run of `id` without a claim committing `update` (which keeps its key
/// in its item) alone, on the machine's clock: the answer; `None` when the
/// store keeps no keys in items (the case does not apply to it).
async fn kept(m: &Machine, id: &str, update: Update) -> Option<Committed> {
    let lease = unclaimed(m, id).await;
    let commit = m.claims.prepare_commit(&lease, None, staged(vec![update.into()], Vec::new()), "m-kept");
    if commit.key_in_item.is_none() {
        assert!(!m.store.clone().capabilities().commits.is_some_and(|commits| commits.keeps_keys_in_items()));
        return None;
    }
    Some(m.claims.commit(&lease, commit).await.expect("store error"))
}

/// Checks that a run's one update that keeps its key commits alone, writing
/// no claim, and that another run of the key finds it in the item and
/// applies nothing; another key's update of the same item applies.
pub async fn a_kept_key_commit_applies_its_update_alone_and_a_copy_finds_the_key(
    store: Arc<dyn ClaimStore>,
    table: String,
) {
    let m = Machine::plain(store);
    let mia = fresh("mia");
    let credit = || Update::new(&table, account(&mia)).add("balance", 5).keep_key();
    let Some(first) = kept(&m, "k-kept", credit()).await else { return };
    assert_eq!(first, Committed::Applied);
    assert_eq!(m.stored("k-kept").await, None, "no claim, no completion");
    assert_eq!(kept(&m, "k-kept", credit()).await, Some(Committed::InItemAlready), "the key is in the item");
    assert!(holds(&m, &table, &mia, Condition::eq("balance", 5)).await, "applied once");
    assert_eq!(kept(&m, "k-kept-2", credit()).await, Some(Committed::Applied), "another key");
    assert!(holds(&m, &table, &mia, Condition::eq("balance", 10)).await);
}

/// Checks that an item keeps a key at least a key memory and forgets it
/// after two, whatever the item's traffic, and that a kept key's update
/// refused by its own condition is cancelled as it declared, keeping no key.
pub async fn kept_keys_last_a_key_memory_and_a_refused_update_keeps_none(store: Arc<dyn ClaimStore>, table: String) {
    let m = Machine::plain(store);
    let nia = fresh("nia");
    let memory = m.claims.policy().expires_after;
    let credit = || Update::new(&table, account(&nia)).add("balance", 1).keep_key();
    let Some(first) = kept(&m, "k-old", credit()).await else { return };
    assert_eq!(first, Committed::Applied);
    // Just under a key memory later: the same window; then the next one begins, the first's keys kept before.
    m.clock.advance(memory - Duration::from_secs(1));
    assert_eq!(kept(&m, "k-old", credit()).await, Some(Committed::InItemAlready));
    m.clock.advance(Duration::from_secs(2));
    assert_eq!(kept(&m, "k-next", credit()).await, Some(Committed::Applied), "the next window");
    assert_eq!(kept(&m, "k-old", credit()).await, Some(Committed::InItemAlready), "kept a window more");
    // Two key memories after its window began, a quiet item forgets it.
    m.clock.advance(memory);
    assert_eq!(kept(&m, "k-old", credit()).await, Some(Committed::Applied), "forgotten: applied again");
    assert!(holds(&m, &table, &nia, Condition::eq("balance", 3)).await);
    // Refused by its own condition: cancelled as declared, its key not kept.
    let refused = credit().condition(Condition::lt("balance", 3)).or_fail(sqs_once_core::ErrorKind::Retryable, "full");
    let Some(Committed::Cancelled(cancellation)) = kept(&m, "k-refused", refused).await else {
        panic!("a kept key's update refused by its condition is cancelled")
    };
    assert_eq!(cancellation.refusal.kind, sqs_once_core::ErrorKind::Retryable);
    assert_eq!(kept(&m, "k-refused", credit()).await, Some(Committed::Applied), "its key was not kept");
    assert!(holds(&m, &table, &nia, Condition::eq("balance", 4)).await);
}

/// Checks that an item's window holds at most `MAX_KEYS_PER_WINDOW` keys:
/// one more is refused until the window turns (`Committed::WindowFull`,
/// with the time to the turn), then applies.
pub async fn a_full_window_of_kept_keys_refuses_one_more(store: Arc<dyn ClaimStore>, table: String) {
    let m = Machine::plain(store);
    let ona = fresh("ona");
    let credit = || Update::new(&table, account(&ona)).add("balance", 1).keep_key();
    let most = sqs_once_core::transaction::item_keys::MAX_KEYS_PER_WINDOW;
    for n in 0..most {
        match kept(&m, &format!("k-full-{n}"), credit()).await {
            None => return,
            Some(committed) => assert_eq!(committed, Committed::Applied, "key {n}"),
        }
    }
    let Some(Committed::WindowFull { turns_in, .. }) = kept(&m, "k-full-over", credit()).await else {
        panic!("one more key than a window holds is refused until the window turns")
    };
    assert!(turns_in <= m.claims.policy().expires_after && !turns_in.is_zero(), "{turns_in:?}");
    m.clock.advance(m.claims.policy().expires_after);
    assert_eq!(kept(&m, "k-full-over", credit()).await, Some(Committed::Applied), "the next window");
    assert!(holds(&m, &table, &ona, Condition::eq("balance", most as i64 + 1)).await);
}

/// Expands to one `#[tokio::test]` per case of the commit suite, for the
/// store and items table that `$make` (an async expression, evaluated once
/// per test) yields as a pair.
///
/// ```no_run
/// use std::sync::Arc;
/// use sqs_once::store::{ClaimStore, MemoryStore};
///
/// async fn store() -> (Arc<dyn ClaimStore>, String) {
///     (Arc::new(MemoryStore::default()), "items".to_owned())
/// }
///
/// sqs_once::commit_suite!(store().await);
/// ```
#[macro_export]
macro_rules! commit_suite {
    ($make:expr) => {
        $crate::commit_suite!(
            $make,
            a_commit_applies_writes_outbox_and_completion_at_once,
            a_commit_sent_again_applies_once,
            a_commit_after_a_takeover_applies_nothing,
            a_condition_that_does_not_hold_cancels_everything,
            conditions_judge_as_dynamodb_does,
            adding_to_what_is_not_a_number_is_rejected,
            outbox_entries_are_taken_over_when_due_and_deleted_by_their_holder,
            a_released_entry_is_held_by_no_one_and_taken_under_its_released_token,
            a_message_as_large_as_staging_allows_commits_whole,
            an_unclaimed_commit_completes_a_free_key_with_its_writes,
            of_two_unclaimed_commits_of_a_key_one_applies,
            an_unclaimed_commit_respects_live_claims_and_its_conditions,
            a_kept_key_commit_applies_its_update_alone_and_a_copy_finds_the_key,
            kept_keys_last_a_key_memory_and_a_refused_update_keeps_none,
            a_full_window_of_kept_keys_refuses_one_more,
        );
    };
    ($make:expr, $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let (store, table) = $make;
                $crate::testing::__private::commit_suite::$name(store, table).await;
            }
        )*
    };
}
