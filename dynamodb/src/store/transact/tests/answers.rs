//! What only DynamoDB does with a commit: actions built with the SDK, the
//! claim's own item refused before anything is sent, and DynamoDB's answers
//! made to measure where DynamoDB Local does not give them (conflicts,
//! throttling, lost answers, cancellation reasons missing from the answer).

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update as SdkUpdate};
use serde_json::json;
use testkit::{
    dynamodb::{Reply, item, items_table, proxy},
    faults::{DYNAMODB, FaultMix, FaultProxy},
};

use sqs_once_engine::testing::{Claim, ClaimRequest, Claims, Lease};

use crate::{
    DynamoDbStore, TableLayout,
    store::tests::{fresh_table, store_through},
};
use sqs_once_core::store::{
    ClaimAdmin, ClaimQuery, ClaimStore, Committed, Fenced, MemoryStore, OutboxQuery, OutboxStore, StoreError,
    StoredClaim,
};
use sqs_once_core::transaction::{Condition, Key, Message, Transaction, Update, Write};

const QUEUE: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/notices";

async fn win(claims: &Claims, id: &str) -> Lease {
    let request = ClaimRequest {
        id,
        body: "{}",
        deadline_ms: sqs_once_core::clock::epoch_ms(std::time::SystemTime::now()) + 30_000,
        holder: "test",
        attempt: 1,
        message_id: "m-1",
    };
    match claims.claim(&request).await.unwrap() {
        Claim::Won(lease) => lease,
        other => panic!("{other:?}"),
    }
}

async fn commit(claims: &Claims, id: &str, writes: Vec<Write>) -> Result<Committed, StoreError> {
    let lease = win(claims, id).await;
    let transaction = Transaction::default();
    for write in writes {
        transaction.stage(write).unwrap();
    }
    transaction.send(Message::sqs(QUEUE, "notice")).unwrap();
    claims.commit(&lease, claims.prepare_commit(&lease, None, transaction.staged(), "m-1")).await
}

fn credit(table: &str, account: &str, amount: i64) -> Vec<Write> {
    vec![Update::new(table, Key::new("pk", account)).add("balance", amount).into()]
}

/// A claim table, an items table, and the claims on that table with
/// their requests going through `endpoint` (a proxy); also the store
/// without the proxy.
async fn behind(endpoint: &str) -> (Claims, DynamoDbStore, String) {
    let (direct, _) = fresh_table().await;
    let table = items_table().await;
    let store = store_through(endpoint, direct.layout().clone()).await;
    (Claims::new(Arc::new(store)), direct, table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_actions_are_sent_as_they_are() {
    let (claims, _, table) = behind(&testkit::dynamodb::endpoint()).await;
    let append = SdkUpdate::builder()
        .table_name(&table)
        .key("pk", AttributeValue::S("log".into()))
        .update_expression("SET #entries = list_append(if_not_exists(#entries, :empty), :entry)")
        .expression_attribute_names("#entries", "entries")
        .expression_attribute_values(":empty", AttributeValue::L(Vec::new()))
        .expression_attribute_values(":entry", AttributeValue::L(vec![AttributeValue::S("m-1".into())]))
        .build()
        .unwrap();
    let write = Write::from(TransactWriteItem::builder().update(append).build());
    assert_eq!(commit(&claims, "k-sdk", vec![write.clone()]).await.unwrap(), Committed::Applied);
    assert_eq!(item(&table, "log").await.unwrap()["entries"], json!(["m-1"]));
    // An in-process store cannot evaluate what only DynamoDB can.
    let memory = Claims::new(Arc::new(MemoryStore::default()));
    assert!(matches!(commit(&memory, "k-sdk", vec![write]).await, Err(StoreError::Unsupported(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_write_on_the_claims_own_item_is_refused_before_anything_is_sent() {
    let (url, seen) = answering_first(0, || Reply::Forward).await;
    let (claims, direct, _) = behind(&url).await;
    let claim_table = direct.layout().table.clone();
    let own = Update::new(&claim_table, Key::new("id", "k-own")).set("note", "mine");
    let committed = commit(&claims, "k-own", vec![own.into()]).await;
    assert!(
        matches!(&committed, Err(StoreError::Rejected(reason)) if reason.contains("claim's own item")),
        "{committed:?}"
    );
    assert_eq!(seen.load(Ordering::SeqCst), 0, "nothing was sent");
}

/// A DynamoDB error answer, as DynamoDB writes a cancelled transaction:
/// `CancellationReasons` in order when given, the codes in the message
/// either way.
fn cancelled(codes: &[&str], with_reasons: bool) -> Reply {
    let mut body = json!({
        "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
        "Message": format!(
            "Transaction cancelled, please refer cancellation reasons for specific reasons [{}]",
            codes.join(", ")
        ),
    });
    if with_reasons {
        let reasons: Vec<_> =
            codes.iter().map(|code| json!({ "Code": code, "Message": format!("{code} here") })).collect();
        body["CancellationReasons"] = json!(reasons);
    }
    Reply::Answer(400, body.to_string())
}

/// A proxy that answers the first `n` transactions with `reply` and
/// forwards everything else; the transactions it saw.
async fn answering_first(n: usize, reply: impl Fn() -> Reply + Send + Sync + 'static) -> (String, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&seen);
    let url = proxy(move |operation, _| match operation {
        "TransactWriteItems" if counted.fetch_add(1, Ordering::SeqCst) < n => reply(),
        _ => Reply::Forward,
    })
    .await;
    (url, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_in_conflict_is_sent_again_until_it_commits() {
    for (reply, name) in [
        (cancelled(&["None", "TransactionConflict", "None"], true), "conflict"),
        (cancelled(&["ThrottlingError", "None", "None"], true), "throttled item"),
        (cancelled(&["None", "TransactionConflict", "None"], false), "conflict, reasons in the message"),
        (Reply::error("TransactionInProgressException", "in progress"), "in progress"),
    ] {
        let reply = std::sync::Mutex::new(Some(reply));
        let (url, seen) = answering_first(1, move || reply.lock().unwrap().take().unwrap()).await;
        let (claims, _, table) = behind(&url).await;
        assert_eq!(commit(&claims, "k-retry", credit(&table, "acct", 5)).await.unwrap(), Committed::Applied, "{name}");
        assert_eq!(seen.load(Ordering::SeqCst), 2, "{name}: sent again once");
        assert_eq!(item(&table, "acct").await.unwrap()["balance"], 5, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_in_progress_for_seconds_is_sent_again_five_seconds_after_the_first_attempt() {
    // DynamoDB holds the token's transaction in progress for 4 s; an attempt after 5 s recovers it.
    let started = std::time::Instant::now();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let attempts = Arc::clone(&seen);
    let url = proxy(move |operation, _| match operation {
        "TransactWriteItems" => {
            attempts.lock().unwrap().push(started.elapsed());
            if started.elapsed() < std::time::Duration::from_secs(4) {
                Reply::error("TransactionInProgressException", "in progress")
            } else {
                Reply::Forward
            }
        }
        _ => Reply::Forward,
    })
    .await;
    let (claims, _, table) = behind(&url).await;
    assert_eq!(commit(&claims, "k-in-progress", credit(&table, "acct", 5)).await.unwrap(), Committed::Applied);
    assert_eq!(item(&table, "acct").await.unwrap()["balance"], 5);
    let attempts = seen.lock().unwrap().clone();
    assert!(attempts.last().unwrap() >= &std::time::Duration::from_secs(5), "{attempts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_cancelled_on_every_attempt_is_not_confirmed() {
    let (url, seen) = answering_first(usize::MAX, || cancelled(&["None", "TransactionConflict", "None"], true)).await;
    let (claims, _, table) = behind(&url).await;
    let committed = commit(&claims, "k-busy", credit(&table, "acct", 5)).await;
    assert!(
        matches!(&committed, Err(StoreError::Unavailable(reason)) if reason.to_string().contains("TransactionConflict")),
        "{committed:?}"
    );
    assert_eq!(seen.load(Ordering::SeqCst), sqs_once_aws::MAX_ATTEMPTS as usize);
    assert!(item(&table, "acct").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasons_missing_from_the_answer_are_read_from_its_message() {
    // The claim's action and the write's: the write's condition failed.
    let (url, _) = answering_first(1, || cancelled(&["None", "ConditionalCheckFailed", "None"], false)).await;
    let (claims, _, table) = behind(&url).await;
    let committed = commit(&claims, "k-reasons", credit(&table, "acct", 5)).await.unwrap();
    let Committed::Cancelled(cancellation) = committed else { panic!("{committed:?}") };
    assert_eq!(cancellation.write, 0);
    assert!(cancellation.reasons.contains("write 0 (update of"), "{}", cancellation.reasons);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_or_throttling_is_retried_and_applies_once() {
    for (mix, name) in [
        (FaultMix { lost_answer: 1e-9, ..FaultMix::default() }, "answer lost after the commit applied"),
        (FaultMix { throttled: 1e-9, ..FaultMix::default() }, "throttled"),
        (FaultMix { server_error: 1e-9, ..FaultMix::default() }, "server error"),
    ] {
        let faults = FaultProxy::start(&testkit::dynamodb::endpoint(), DYNAMODB, mix, &["TransactWriteItems"], 1).await;
        let (claims, _, table) = behind(&faults.url).await;
        assert_eq!(commit(&claims, "k-lost", credit(&table, "acct", 5)).await.unwrap(), Committed::Applied, "{name}");
        assert_eq!(faults.injected.of("TransactWriteItems"), 2, "{name}: the SDK sent it again");
        assert_eq!(item(&table, "acct").await.unwrap()["balance"], 5, "{name}: applied once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_claim_was_taken_over_is_refused_with_the_claim_returned() {
    let (claims, direct, table) = behind(&testkit::dynamodb::endpoint()).await;
    let lease = win(&claims, "k-over").await;
    // Another holder takes the claim over (its lease ended early, as a clock on another host says).
    let stolen = StoredClaim { token: Some("other".into()), ..direct.get("k-over").await.unwrap().unwrap() };
    assert_eq!(
        direct.replace_seen(direct.get("k-over").await.unwrap().as_ref(), Some(&stolen)).await.unwrap(),
        Fenced::Applied
    );
    let transaction = Transaction::default();
    transaction
        .stage(Update::new(&table, Key::new("pk", "acct")).add("balance", 5).condition(Condition::not_exists("frozen")))
        .unwrap();
    let committed = claims.commit(&lease, claims.prepare_commit(&lease, None, transaction.staged(), "m-1")).await;
    assert_eq!(committed.unwrap(), Committed::Refused);
    assert!(item(&table, "acct").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_table_without_the_index_the_outbox_and_the_claims_are_read_whole_and_apart() {
    let (client, _) = crate::client_from(&sqs_once_aws::sdk_config().await);
    let table = testkit::dynamodb::plain_table("no-index", "id").await;
    let store = Arc::new(DynamoDbStore::new(client, TableLayout::new(&table)));
    let claims = Claims::new(store.clone());
    let balances = items_table().await;
    assert_eq!(commit(&claims, "k-1", credit(&balances, "acct", 1)).await.unwrap(), Committed::Applied);
    let _open = win(&claims, "k-2").await;
    let entries = store.entries(&OutboxQuery { due_at_ms: None, limit: 10 }).await.unwrap();
    assert_eq!(entries.len(), 1, "the outbox entry, found by reading the table");
    assert_eq!(entries[0].message.body, "notice");
    let listing = store.list(&ClaimQuery { limit: 10, ..ClaimQuery::default() }).await.unwrap();
    let ids: Vec<&str> = listing.claims.iter().map(|record| record.id.as_str()).collect();
    assert_eq!((ids, listing.full_scan), (vec!["k-2"], true), "the open claim only, not the outbox entry");
}
