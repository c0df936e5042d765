//! Staged writes committed with their claim, and the outbox, on every store
//! that commits: the same suite (`sqs_once::commit_suite!`) on the memory
//! store, a SQLite file, and DynamoDB Local with both table layouts, so the
//! in-process stores are held to what DynamoDB itself does.

use crate::common;

use std::sync::{
    Arc, LazyLock,
    atomic::{AtomicUsize, Ordering},
};

use sqs_once::store::{ClaimStore, MemoryStore, SqliteStore, TableKey};

const TABLE: &str = "items";

mod memory {
    use super::*;

    sqs_once::commit_suite!((Arc::new(MemoryStore::default()) as Arc<dyn ClaimStore>, TABLE.to_owned()));
}

mod sqlite {
    use super::*;

    /// One temporary folder for this test binary's database files.
    static DIR: LazyLock<tempfile::TempDir> = LazyLock::new(|| tempfile::tempdir().expect("temp dir"));

    fn store() -> Arc<dyn ClaimStore> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = DIR.path().join(format!("claims-{}.db", NEXT.fetch_add(1, Ordering::SeqCst)));
        Arc::new(SqliteStore::open(path).expect("open store"))
    }

    sqs_once::commit_suite!((store(), TABLE.to_owned()));
}

mod dynamodb {
    use super::*;

    async fn store(key: TableKey) -> (Arc<dyn ClaimStore>, String) {
        (Arc::new(common::fresh_table(key).await), testkit::dynamodb::items_table().await)
    }

    sqs_once::commit_suite!(store(TableKey::Partition).await);

    mod sort_key_table {
        use super::*;

        sqs_once::commit_suite!(store(common::sorted()).await);
    }
}
