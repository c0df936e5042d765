//! The claim state machine on the SQLite file store.

mod common;

use std::sync::{
    Arc, LazyLock,
    atomic::{AtomicUsize, Ordering},
};

use sqs_once::store::{ClaimStore, SqliteStore};

/// One temporary folder for this test binary's database files.
static DIR: LazyLock<tempfile::TempDir> = LazyLock::new(|| tempfile::tempdir().expect("temp dir"));

/// A store in a fresh file.
fn store() -> Arc<dyn ClaimStore> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let path = DIR.path().join(format!("claims-{}.db", NEXT.fetch_add(1, Ordering::SeqCst)));
    Arc::new(SqliteStore::open(path).expect("open store"))
}

sqs_once::claim_suite!(store());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_connections_to_one_file_have_one_winner() {
    // Each store has its own connection, as separate processes would.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claims.db");
    let stores: Vec<Arc<dyn ClaimStore>> =
        (0..8).map(|_| Arc::new(SqliteStore::open(&path).unwrap()) as Arc<dyn ClaimStore>).collect();
    for round in 0..20 {
        let id = format!("k-{round}");
        let attempts = stores.iter().cloned().enumerate().map(|(n, store)| {
            let id = id.clone();
            tokio::spawn(async move {
                let machine = sqs_once::testing::claim_suite::Machine::plain(store);
                machine.claim(&id, "{}", &format!("h-{n}")).await
            })
        });
        let outcomes = futures::future::join_all(attempts).await;
        let winners = outcomes.iter().filter(|o| matches!(o, Ok(sqs_once::claim::Claim::Won(_)))).count();
        assert_eq!(winners, 1, "{outcomes:?}");
    }
}

#[tokio::test]
async fn a_file_of_an_older_version_gains_the_message_id_column_and_keeps_its_claims() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claims.db");
    // The schema before message ids were kept, with one completed claim in it.
    let old = rusqlite::Connection::open(&path).unwrap();
    old.execute_batch(
        "CREATE TABLE claims (id TEXT PRIMARY KEY, status TEXT NOT NULL, expires_at INTEGER NOT NULL,
             lease_until INTEGER, token TEXT, holder TEXT, attempt INTEGER, claimed_at INTEGER, updated_at INTEGER,
             payload_hash TEXT, result TEXT, error TEXT) WITHOUT ROWID;
         INSERT INTO claims (id, status, expires_at) VALUES ('old', 'COMPLETED', 4102444800);",
    )
    .unwrap();
    drop(old);
    // Two processes opening it at once add the column once.
    let (a, b) = (SqliteStore::open(&path).unwrap(), SqliteStore::open(&path).unwrap());
    let old = a.get("old").await.unwrap().expect("the old claim is kept");
    assert_eq!((old.status, old.message_id), (sqs_once::store::ClaimStatus::Completed, None));
    let machine = sqs_once::testing::claim_suite::Machine::plain(Arc::new(b));
    machine.win("new").await;
    assert_eq!(machine.stored("new").await.unwrap().message_id.as_deref(), Some("m-new"));
}
