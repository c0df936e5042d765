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
