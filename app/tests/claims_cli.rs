//! `sqs-once claims`, as an on-call engineer runs it, on the file store and on
//! DynamoDB Local: stale work from a killed process is found and released, a
//! live lease is not, a key completed by hand is a duplicate afterwards, and
//! DynamoDB listings use the open-claims index when the table has it.

use crate::common;

use std::{
    path::PathBuf,
    process::{Command, Output, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{Value, json};
use sqs_once::store::{ClaimAdmin, ClaimQuery, ClaimStatus, DynamoDbStore};

/// One consumer's world: a store, a demo log, an event folder.
struct Setup {
    dir: tempfile::TempDir,
    store: (&'static str, String),
}

impl Setup {
    fn file() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claims.db").display().to_string();
        Self { dir, store: ("SQS_ONCE_STORE_PATH", path) }
    }

    async fn dynamodb() -> Self {
        let store = common::fresh_table().await;
        Self { dir: tempfile::tempdir().unwrap(), store: ("SQS_ONCE_TABLE", store.layout().table.clone()) }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = common::command_in(self.dir.path());
        command.args(args).env(self.store.0, &self.store.1).env("SQS_ONCE_LEASE_MARGIN_MS", "0");
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn event(&self, name: &str, records: &[(&str, Value)]) -> PathBuf {
        let records: Vec<Value> = records
            .iter()
            .map(|(id, body)| json!({"messageId": id, "body": body.to_string(), "eventSource": "aws:sqs"}))
            .collect();
        let path = self.dir.path().join(name);
        std::fs::write(&path, json!({ "Records": records }).to_string()).unwrap();
        path
    }

    fn runs_of(&self, message_id: &str) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("demo.log")).unwrap_or_default();
        log.lines().filter(|line| line.ends_with(&format!("\t{message_id}"))).count()
    }

    fn list(&self, args: &[&str]) -> Vec<Value> {
        let output = self.run(&[&["claims", "list", "--json"], args].concat());
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout).unwrap().as_array().unwrap().clone()
    }
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

async fn a_crashed_claim_is_found_released_and_run_again(setup: Setup) {
    let slow = json!({"sleep_ms": 60_000});
    let event = setup.event("slow.json", &[("m-crash", slow.clone()), ("m-forced", slow)]);
    let mut crashed = setup
        .command(&["invoke", "--timeout", "4"])
        .arg(&event)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = tokio::time::Instant::now();
    while setup.runs_of("m-crash") == 0 || setup.runs_of("m-forced") == 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "the handler never started");
        assert!(crashed.try_wait().unwrap().is_none(), "invoke exited before its handler started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    crashed.kill().unwrap();
    crashed.wait().unwrap();

    // A live lease is completed or released only with --force, and a completed claim released only so.
    let refused = setup.run(&["claims", "complete", "m-forced"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("live lease"), "{}", text(&refused));
    assert_eq!(setup.run(&["claims", "complete", "--force", "m-forced"]).status.code(), Some(0));
    let shown = setup.run(&["claims", "show", "m-forced", "--json"]);
    assert_eq!(serde_json::from_slice::<Value>(&shown.stdout).unwrap()[0]["status"], "COMPLETED");
    assert_eq!(setup.run(&["claims", "release", "m-forced"]).status.code(), Some(2), "completed claims are kept");
    assert_eq!(setup.run(&["claims", "release", "--force", "m-forced"]).status.code(), Some(0));
    assert_eq!(setup.run(&["claims", "show", "m-forced"]).status.code(), Some(1), "released: gone");

    // The lease (deadline + 0 ms margin) is still live: listed, not stale, not released.
    let open = setup.list(&[]);
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!((open[0]["status"].as_str(), open[0]["stale"].as_bool()), (Some("INPROGRESS"), Some(false)));
    let refused = setup.run(&["claims", "release", "m-crash"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("live lease"), "{}", text(&refused));

    tokio::time::sleep(Duration::from_millis(4_200)).await;
    let stale = setup.list(&["--stale"]);
    assert_eq!(stale.len(), 1);
    assert_eq!(stale[0]["stale"], true);
    let table = setup.run(&["claims", "list", "--stale"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("INPROGRESS (stale)"), "{}", text(&table));

    let released = setup.run(&["claims", "release", "m-crash"]);
    assert_eq!(released.status.code(), Some(0), "{}", text(&released));
    assert!(setup.list(&[]).is_empty());
    let missing = setup.run(&["claims", "show", "m-crash"]);
    assert_eq!(missing.status.code(), Some(1));

    let redelivery = setup.event("again.json", &[("m-crash", json!({}))]);
    let output = setup.run(&["invoke", redelivery.to_str().unwrap()]);
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), r#"{"batchItemFailures":[]}"#);
    assert_eq!(setup.runs_of("m-crash"), 2, "the released key ran again");
}

async fn a_key_completed_by_hand_is_a_duplicate(setup: Setup) {
    let done = setup.run(&["claims", "complete", "m-manual"]);
    assert_eq!(done.status.code(), Some(0), "{}", text(&done));
    let shown = setup.run(&["claims", "show", "m-manual", "--json"]);
    assert_eq!(serde_json::from_slice::<Value>(&shown.stdout).unwrap()[0]["status"], "COMPLETED");
    let event = setup.event("manual.json", &[("m-manual", json!({})), ("m-other", json!({}))]);
    let output = setup.run(&["invoke", event.to_str().unwrap()]);
    assert!(text(&output).contains("outcome=\"duplicate\""), "{}", text(&output));
    assert_eq!((setup.runs_of("m-manual"), setup.runs_of("m-other")), (0, 1));
    assert_eq!(setup.run(&["claims", "complete", "m-manual"]).status.code(), Some(0), "completing twice is fine");
    assert_eq!(setup.run(&["claims", "release", "m-manual"]).status.code(), Some(2), "completed claims are kept");

    let failing = setup.event("failing.json", &[("m-fail", json!({"fail": "permanent"}))]);
    setup.run(&["invoke", failing.to_str().unwrap()]);
    let failed = setup.list(&["--status", "failed"]);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["error"], "demo: asked to fail (permanent)");
    assert_eq!(failed[0]["message_id"], "m-fail", "the delivery that claimed and failed it");
    let table = setup.run(&["claims", "list", "--status", "failed"]);
    let header = String::from_utf8_lossy(&table.stdout).lines().next().unwrap().to_owned();
    assert!(header.contains("MESSAGE ID"), "{header}");
    assert!(String::from_utf8_lossy(&table.stdout).contains("m-fail"), "{}", text(&table));
    assert_eq!(setup.list(&["--status", "completed"]).len(), 2);

    // Found by the message id alone: a failed claim (open), and a completed one.
    for (message_id, status) in [("m-fail", "FAILED"), ("m-other", "COMPLETED")] {
        let shown = setup.run(&["claims", "show", "--message-id", message_id, "--json"]);
        assert_eq!(shown.status.code(), Some(0), "{}", text(&shown));
        let shown = &serde_json::from_slice::<Value>(&shown.stdout).unwrap()[0];
        assert_eq!((shown["status"].as_str(), shown["message_id"].as_str()), (Some(status), Some(message_id)));
    }
    assert_eq!(setup.run(&["claims", "show", "--message-id", "m-unknown"]).status.code(), Some(1));
    assert_eq!(setup.run(&["claims", "release", "--message-id", "m-fail"]).status.code(), Some(0));
    assert!(setup.list(&["--status", "failed"]).is_empty());
}

async fn the_failures_of_one_cause_are_released_together(setup: Setup) {
    let failing = json!({"fail": "permanent"});
    let event = setup.event("failing.json", &[("m-a", failing.clone()), ("m-b", failing), ("m-ok", json!({}))]);
    setup.run(&["invoke", event.to_str().unwrap()]);
    assert_eq!(setup.list(&["--status", "failed"]).len(), 2);
    // First the listing, and nothing changes.
    let listed = setup.run(&["claims", "release-all", "--reason", "asked to fail", "--since", "1h", "--json"]);
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed));
    let picked: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
    let mut ids: Vec<&str> = picked.iter().filter_map(|claim| claim["message_id"].as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["m-a", "m-b"]);
    assert!(text(&listed).contains("2 claim(s) picked; nothing changed"), "{}", text(&listed));
    assert_eq!(setup.list(&["--status", "failed"]).len(), 2, "nothing released without --yes");
    // Another cause's text picks none of them.
    let other = setup.run(&["claims", "release-all", "--reason", "ResourceNotFound", "--yes"]);
    assert!(text(&other).contains("released 0 of 0"), "{}", text(&other));
    let wrong = setup.run(&["claims", "release-all", "--since", "yesterday"]);
    assert_eq!(wrong.status.code(), Some(3), "{}", text(&wrong));
    assert!(text(&wrong).contains("--since \"yesterday\""), "{}", text(&wrong));
    // Then released, and each runs once more.
    let released = setup.run(&["claims", "release-all", "--reason", "asked to fail", "--since", "1h", "--yes"]);
    assert_eq!(released.status.code(), Some(0), "{}", text(&released));
    assert!(text(&released).contains("released 2 of 2"), "{}", text(&released));
    assert!(setup.list(&["--status", "failed"]).is_empty());
    setup.run(&["invoke", event.to_str().unwrap()]);
    assert_eq!((setup.runs_of("m-a"), setup.runs_of("m-b"), setup.runs_of("m-ok")), (2, 2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_store_the_failures_of_one_cause_are_released_together() {
    the_failures_of_one_cause_are_released_together(Setup::file()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_the_failures_of_one_cause_are_released_together() {
    the_failures_of_one_cause_are_released_together(Setup::dynamodb().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_store_a_crashed_claim_is_found_released_and_run_again() {
    a_crashed_claim_is_found_released_and_run_again(Setup::file()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_store_a_key_completed_by_hand_is_a_duplicate() {
    a_key_completed_by_hand_is_a_duplicate(Setup::file()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_a_crashed_claim_is_found_released_and_run_again() {
    a_crashed_claim_is_found_released_and_run_again(Setup::dynamodb().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_a_key_completed_by_hand_is_a_duplicate() {
    a_key_completed_by_hand_is_a_duplicate(Setup::dynamodb().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_failed_claims_are_listed_through_the_index_open_ones_from_the_table() {
    let store = common::fresh_table().await;
    let setup = Setup { dir: tempfile::tempdir().unwrap(), store: ("SQS_ONCE_TABLE", store.layout().table.clone()) };
    let event = setup.event("mixed.json", &[("a", json!({})), ("b", json!({"fail": "permanent"}))]);
    setup.run(&["invoke", event.to_str().unwrap()]);
    // The store again, its requests counted by operation on their way.
    let operations = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&operations);
    let proxy = common::dynamodb::proxy(move |operation, _| {
        seen.lock().unwrap().push(operation.to_owned());
        common::dynamodb::Reply::Forward
    })
    .await;
    let counted = DynamoDbStore::new(common::dynamodb::client_at(&proxy).await, store.layout().clone());
    let failed = ClaimQuery { status: Some(ClaimStatus::Failed), limit: 10, ..ClaimQuery::default() };
    let listing = counted.list(&failed).await.unwrap();
    assert_eq!(listing.claims.len(), 1, "the failed claim");
    assert!(!listing.full_scan);
    // One query per partition of the index: its 16 shards (docs/dynamodb.md),
    // and the bare status older versions wrote.
    let queried = std::mem::take(&mut *operations.lock().unwrap());
    assert_eq!(queried, vec!["Query"; 16 + 1], "queries only, no scan");
    // Claims in progress are not in the index: the open claims are read from
    // the table, in 8 segments at once, each one page here.
    let listing = counted.list(&ClaimQuery { limit: 10, ..ClaimQuery::default() }).await.unwrap();
    assert_eq!(listing.claims.len(), 1, "only the failed claim is open");
    assert!(listing.full_scan);
    assert_eq!(operations.lock().unwrap().clone(), vec!["Scan"; 8]);

    // A table created without the index (by hand, or by an older version).
    let bare = common::dynamodb::unique_name("bare");
    let client = common::dynamodb::client().await;
    client
        .create_table()
        .table_name(&bare)
        .billing_mode(aws_sdk_dynamodb::types::BillingMode::PayPerRequest)
        .attribute_definitions(
            aws_sdk_dynamodb::types::AttributeDefinition::builder()
                .attribute_name("id")
                .attribute_type(aws_sdk_dynamodb::types::ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            aws_sdk_dynamodb::types::KeySchemaElement::builder()
                .attribute_name("id")
                .key_type(aws_sdk_dynamodb::types::KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let bare_setup = Setup { dir: tempfile::tempdir().unwrap(), store: ("SQS_ONCE_TABLE", bare) };
    let event = bare_setup.event("mixed.json", &[("a", json!({})), ("b", json!({"fail": "permanent"}))]);
    bare_setup.run(&["invoke", event.to_str().unwrap()]);
    let output = bare_setup.run(&["claims", "list", "--status", "failed"]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("reading the whole table instead"), "{}", text(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout).lines().count(), 2, "header and the failed claim");
    // Reading the table says what it cost.
    let output = setup.run(&["claims", "list"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("listed by reading the whole table") && stderr.contains("read_units="), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_be_reached_exits_3_with_one_line() {
    let setup = Setup::dynamodb().await;
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", nobody.local_addr().unwrap());
    drop(nobody);
    for args in [&["claims", "list"][..], &["claims", "release", "k"], &["claims", "complete", "k"]] {
        let output = setup.command(args).env("AWS_ENDPOINT_URL_DYNAMODB", &endpoint).output().unwrap();
        assert_eq!(output.status.code(), Some(3), "{args:?}: {}", text(&output));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: one line: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_entry_given_up_on_is_dropped_only_with_force_and_logged_whole() {
    // A ledger credit whose notice goes to a queue that does not exist: committed, its notice refused, kept.
    let setup = Setup::file();
    let missing = format!("{}/123456789012/nobody-{}", common::sqs::endpoint(), uuid::Uuid::new_v4().simple());
    let event = setup.event("credit.json", &[("m-drop", json!({"account": "a", "amount": 5}))]);
    let ledger = |command: &mut Command| {
        command
            .env("SQS_ONCE_HANDLER", "ledger")
            .env("SQS_ONCE_LEDGER_TABLE", "balances")
            .env("SQS_ONCE_LEDGER_NOTIFY_URL", &missing)
            .env("SQS_ONCE_OUTBOX_SWEEP_SECS", "0");
    };
    let mut invoke = setup.command(&["invoke", event.to_str().unwrap()]);
    ledger(&mut invoke);
    let output = invoke.output().unwrap();
    assert!(output.status.success(), "{}", text(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("OutboxRefused"), "{}", text(&output));
    let listed = setup.run(&["claims", "outbox", "--json"]);
    let entries: Vec<Value> = serde_json::from_slice::<Value>(&listed.stdout).unwrap().as_array().unwrap().clone();
    assert_eq!(entries.len(), 1, "{}", text(&listed));
    let id = entries[0]["id"].as_str().unwrap().to_owned();

    let refused = setup.run(&["claims", "outbox", "--drop", &id]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("--force") && text(&refused).contains("m-drop"), "{}", text(&refused));
    assert_eq!(setup.run(&["claims", "outbox", "--json"]).stdout, listed.stdout, "nothing dropped");

    let unknown = setup.run(&["claims", "outbox", "--drop", "no-such-entry", "--force"]);
    assert_eq!(unknown.status.code(), Some(1), "{}", text(&unknown));

    // By its outbox id, as a receiver sees it.
    let outbox_id = entries[0]["outbox_id"].as_str().unwrap();
    let dropped = setup.run(&["claims", "outbox", "--drop", outbox_id, "--force"]);
    assert!(dropped.status.success(), "{}", text(&dropped));
    let logged = text(&dropped);
    assert!(logged.contains(&id) && logged.contains(r#"\"account\":\"a\""#) && logged.contains(&missing), "{logged}");
    let left = setup.run(&["claims", "outbox", "--json"]);
    assert_eq!(serde_json::from_slice::<Value>(&left.stdout).unwrap(), json!([]), "{}", text(&left));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_entry_this_version_cannot_read_is_listed_apart_and_the_others_are_sent() {
    // Two ledger credits whose notices go to a queue that does not exist yet: committed, their notices kept.
    let setup = Setup::file();
    let name = format!("later-{}", uuid::Uuid::new_v4().simple());
    let url = format!("{}/123456789012/{name}", common::sqs::endpoint());
    let credits = [("m-1", json!({"account": "a", "amount": 1})), ("m-2", json!({"account": "b", "amount": 2}))];
    let event = setup.event("credits.json", &credits);
    let mut invoke = setup.command(&["invoke", event.to_str().unwrap()]);
    invoke
        .env("SQS_ONCE_HANDLER", "ledger")
        .env("SQS_ONCE_LEDGER_TABLE", "balances")
        .env("SQS_ONCE_LEDGER_NOTIFY_URL", &url)
        .env("SQS_ONCE_OUTBOX_SWEEP_SECS", "0");
    let output = invoke.output().unwrap();
    assert!(output.status.success(), "{}", text(&output));
    // One of them as a later version (or a hand) left it: an entry this version cannot read.
    let file = rusqlite::Connection::open(&setup.store.1).unwrap();
    let unreadable: String = file.query_row("SELECT id FROM outbox ORDER BY id LIMIT 1", [], |row| row.get(0)).unwrap();
    file.execute("UPDATE outbox SET entry = '{\"written_by\":\"a later version\"}' WHERE id = ?1", [&unreadable])
        .unwrap();

    let listed = setup.run(&["claims", "outbox", "--json"]);
    assert!(listed.status.success(), "{}", text(&listed));
    let rows: Vec<Value> = serde_json::from_slice::<Value>(&listed.stdout).unwrap().as_array().unwrap().clone();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows[0]["body"].as_str().is_some_and(|body| body.contains("\"account\"")), "{rows:?}");
    assert_eq!(rows[1]["id"], json!(unreadable));
    assert!(rows[1]["unreadable"].as_str().is_some_and(|why| why.contains("missing field")), "{rows:?}");
    let table = setup.run(&["claims", "outbox"]);
    let row =
        String::from_utf8_lossy(&table.stdout).lines().find(|line| line.starts_with(&unreadable)).map(str::to_owned);
    assert!(row.is_some_and(|row| row.contains("unreadable")), "{}", text(&table));
    assert!(
        String::from_utf8_lossy(&table.stderr).contains(&format!("--drop {unreadable} --force")),
        "{}",
        text(&table)
    );

    // The queue exists now: the readable notice is sent, the unreadable entry stays, keeping nothing back.
    let client = common::sqs::client().await;
    client.create_queue().queue_name(&name).send().await.unwrap();
    let queue = common::sqs::Queue::existing(&url).await;
    // Once the refused send's lease has ended (the entry is due again).
    for _ in 0..40 {
        let listed = setup.run(&["claims", "outbox", "--json"]);
        if serde_json::from_slice::<Value>(&listed.stdout).unwrap()[0]["due"] == json!(true) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let sent = setup.run(&["claims", "outbox", "--send"]);
    assert!(sent.status.success(), "{}", text(&sent));
    assert!(String::from_utf8_lossy(&sent.stderr).contains("sent 1 message(s)"), "{}", text(&sent));
    assert!(text(&sent).contains("OutboxUnreadable"), "skipped, and said: {}", text(&sent));
    assert_eq!(queue.drain().await.len(), 1);

    // Given up by its stored id, with --force only.
    let refused = setup.run(&["claims", "outbox", "--drop", &unreadable]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("cannot read"), "{}", text(&refused));
    let dropped = setup.run(&["claims", "outbox", "--drop", &unreadable, "--force"]);
    assert!(dropped.status.success(), "{}", text(&dropped));
    let left = setup.run(&["claims", "outbox", "--json"]);
    assert_eq!(serde_json::from_slice::<Value>(&left.stdout).unwrap(), json!([]), "{}", text(&left));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_send_right_after_the_queue_is_created_sends_every_refused_notice() {
    // Three ledger credits on DynamoDB whose notices go to a queue that does not exist yet: each send refused.
    let setup = Setup::dynamodb().await;
    let name = format!("created-later-{}", uuid::Uuid::new_v4().simple());
    let url = format!("{}/123456789012/{name}", common::sqs::endpoint());
    let credits: Vec<(String, Value)> =
        (0..3).map(|n| (format!("m-{n}"), json!({"account": format!("a{n}"), "amount": 1}))).collect();
    let credits: Vec<(&str, Value)> = credits.iter().map(|(id, body)| (id.as_str(), body.clone())).collect();
    let event = setup.event("credits.json", &credits);
    let ledger_table = common::dynamodb::items_table().await;
    let mut invoke = setup.command(&["invoke", event.to_str().unwrap()]);
    invoke
        .env("SQS_ONCE_HANDLER", "ledger")
        .env("SQS_ONCE_LEDGER_TABLE", &ledger_table)
        .env("SQS_ONCE_LEDGER_NOTIFY_URL", &url)
        .env("SQS_ONCE_OUTBOX_SWEEP_SECS", "0");
    let output = invoke.output().unwrap();
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("OutboxRefused"), "{}", text(&output));
    let listed = setup.run(&["claims", "outbox"]);
    assert!(String::from_utf8_lossy(&listed.stderr).contains("3 entries failed to send"), "{}", text(&listed));
    assert!(String::from_utf8_lossy(&listed.stdout).contains("retry"), "{}", text(&listed));

    // The operator creates the queue and sends at once: every notice goes, none waits for a lease no one holds.
    common::sqs::client().await.create_queue().queue_name(&name).send().await.unwrap();
    let queue = common::sqs::Queue::existing(&url).await;
    let sent = setup.run(&["claims", "outbox", "--send"]);
    assert!(sent.status.success(), "{}", text(&sent));
    assert!(String::from_utf8_lossy(&sent.stderr).contains("sent 3 message(s)"), "{}", text(&sent));
    assert_eq!(queue.drain().await.len(), 3);
    let left = setup.run(&["claims", "outbox", "--json"]);
    assert_eq!(serde_json::from_slice::<Value>(&left.stdout).unwrap(), json!([]), "{}", text(&left));
}
