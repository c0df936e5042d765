//! The claim state machine on the SQLite file store.

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
sqs_once::admin_suite!(store());
