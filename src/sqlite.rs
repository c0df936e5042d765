//! An embedded, crash-safe store in one SQLite file: the default for the
//! offline `invoke` command.
//!
//! The items handlers' staged writes commit to and the outbox live in the
//! same file (tables `items` and `outbox`), and a commit is one SQLite
//! transaction: the claim's completion, the writes and the outbox entries,
//! or nothing.
//!
//! Several processes may share the file: a claim runs in a `BEGIN IMMEDIATE`
//! transaction, which takes the database's write lock before reading, so two
//! processes can never both see a key free. WAL mode lets readers proceed
//! while one process writes, and a busy timeout makes writers queue instead
//! of failing. With `synchronous = NORMAL` a committed claim survives a crash
//! of the process; an operating-system crash may lose the last few commits.

use parking_lot::Mutex;
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

// The core's store interface, this store's internals among it.
use sqs_once_core::store::{
    Capabilities, ClaimAdmin, ClaimQuery, ClaimStatus, ClaimStore, Commit, CommitStore, Committed, Fenced, Finish,
    Listing, OutboxEntry, OutboxQuery, OutboxStore, PutOutcome, StoreError, StoredClaim, UnreadableEntry,
    items::{self, Change, Evaluated, JsonItem, Place},
    replaced_id, unchanged,
};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS claims (
    id            TEXT PRIMARY KEY,
    status        TEXT NOT NULL,
    expires_at    INTEGER NOT NULL,
    lease_until   INTEGER,
    token         TEXT,
    holder        TEXT,
    attempt       INTEGER,
    claimed_at    INTEGER,
    updated_at    INTEGER,
    payload_hash  TEXT,
    result        TEXT,
    error         TEXT,
    message_id    TEXT
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS items (
    tbl   TEXT NOT NULL,
    key   TEXT NOT NULL,
    item  TEXT NOT NULL,
    PRIMARY KEY (tbl, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (
    id           TEXT PRIMARY KEY,
    token        TEXT NOT NULL,
    lease_until  INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    entry        TEXT NOT NULL
) WITHOUT ROWID;
";

/// Columns added since the first version, added to an older file when it
/// is opened.
const ADDED_COLUMNS: &[(&str, &str)] = &[("message_id", "TEXT")];

const COLUMNS: &str = "id, status, expires_at, lease_until, token, holder, attempt, claimed_at, updated_at, \
                       payload_hash, result, error, message_id";

/// How long a writer waits for another process's transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Claims in a SQLite database file.
///
/// ```
/// use sqs_once::store::SqliteStore;
///
/// let dir = tempfile::tempdir().unwrap();
/// let store = SqliteStore::open(dir.path().join("claims.db")).unwrap();
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    connection: Arc<Mutex<Connection>>,
    path: PathBuf,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").field("path", &self.path).finish()
    }
}

impl SqliteStore {
    /// Opens (creating it and its folder if needed) the database at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(StoreError::unavailable)?;
        }
        let connection = Connection::open(&path).map_err(StoreError::unavailable)?;
        connection.busy_timeout(BUSY_TIMEOUT).map_err(StoreError::unavailable)?;
        prepare(&connection).map_err(StoreError::unavailable)?;
        Ok(Self { connection: Arc::new(Mutex::new(connection)), path })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` on the connection on a blocking thread, since SQLite calls
    /// (and their busy waits) block.
    async fn with_connection<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let connection = Arc::clone(&self.connection);
        tokio::task::spawn_blocking(move || work(&mut connection.lock()))
            .await
            .map_err(StoreError::unavailable)?
            .map_err(StoreError::unavailable)
    }
}

#[async_trait]
impl ClaimStore for SqliteStore {
    async fn put_if_free(&self, claim: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        let claim = claim.clone();
        let existing = self
            .with_connection(move |connection| {
                let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let existing = select(&transaction, &claim.id)?;
                let taken = existing.filter(|existing| existing.as_ref().is_ok_and(|e| !e.is_free(now_ms)));
                if taken.is_none() {
                    upsert(&transaction, &claim)?;
                }
                transaction.commit()?;
                Ok(taken)
            })
            .await?;
        match existing {
            None => Ok(PutOutcome::Claimed),
            Some(existing) => existing.map(|existing| PutOutcome::Taken(Some(Box::new(existing)))),
        }
    }

    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        let id = id.to_owned();
        self.with_connection(move |connection| select(connection, &id)).await?.transpose()
    }

    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        let (id, token, finish) = (id.to_owned(), token.to_owned(), finish.clone());
        let changed = self.with_connection(move |connection| finish_row(connection, &id, &token, &finish)).await?;
        Ok(fenced(changed))
    }

    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        let (id, token) = (id.to_owned(), token.to_owned());
        let changed = self
            .with_connection(move |connection| {
                let deleted = connection.execute(
                    "DELETE FROM claims WHERE id = ?1 AND token = ?2 AND status = 'INPROGRESS'",
                    params![id, token],
                )?;
                // No record to delete is released all the same.
                Ok(deleted + usize::from(deleted == 0 && select(connection, &id)?.is_none()))
            })
            .await?;
        Ok(fenced(changed))
    }

    fn capabilities(self: Arc<Self>) -> Capabilities {
        Capabilities::all(self)
    }
}

#[async_trait]
impl ClaimAdmin for SqliteStore {
    async fn list(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
        let query = query.clone();
        let statuses: Vec<&'static str> = query.statuses().into_iter().map(ClaimStatus::as_str).collect();
        let rows = self
            .with_connection(move |connection| {
                let placeholders = vec!["?"; statuses.len()].join(", ");
                let mut statement =
                    connection.prepare(&format!("SELECT {COLUMNS} FROM claims WHERE status IN ({placeholders})"))?;
                let rows = statement.query_map(rusqlite::params_from_iter(statuses), read_row)?;
                rows.collect::<rusqlite::Result<Vec<_>>>()
            })
            .await?;
        Ok(query.select(rows.into_iter().collect::<Result<Vec<_>, _>>()?, false))
    }

    async fn replace_seen(
        &self,
        seen: Option<&StoredClaim>,
        record: Option<&StoredClaim>,
    ) -> Result<Fenced, StoreError> {
        let Some(id) = replaced_id(seen, record).map(str::to_owned) else { return Ok(Fenced::Refused) };
        let (seen, record) = (seen.cloned(), record.cloned());
        let applied = self
            .with_connection(move |connection| {
                let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let current = select(&transaction, &id)?.and_then(Result::ok);
                if !unchanged(seen.as_ref(), current.as_ref()) {
                    return Ok(false);
                }
                match &record {
                    Some(record) => upsert(&transaction, record)?,
                    None => transaction.execute("DELETE FROM claims WHERE id = ?1", [&id])?,
                };
                transaction.commit()?;
                Ok(true)
            })
            .await?;
        Ok(if applied { Fenced::Applied } else { Fenced::Refused })
    }
}

#[async_trait]
impl CommitStore for SqliteStore {
    fn keeps_keys_in_items(&self) -> bool {
        true
    }

    async fn commit(&self, id: &str, token: &str, commit: &Commit) -> Result<Committed, StoreError> {
        let (id, token, commit) = (id.to_owned(), token.to_owned(), commit.clone());
        self.with_connection(move |connection| {
            let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let committed = commit_in(&transaction, &id, &token, &commit)?;
            if matches!(committed, Ok(Committed::Applied)) {
                transaction.commit()?;
            }
            Ok(committed)
        })
        .await?
    }
}

#[async_trait]
impl OutboxStore for SqliteStore {
    async fn entries(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>, StoreError> {
        let rows = self.outbox_rows(query.due_at_ms, query.limit).await?;
        Ok(rows.into_iter().filter_map(|row| row.read().inspect_err(UnreadableEntry::skipped).ok()).collect())
    }

    async fn unreadable(&self, limit: usize) -> Result<Vec<UnreadableEntry>, StoreError> {
        let rows = self.outbox_rows(None, usize::MAX).await?;
        Ok(rows.into_iter().filter_map(|row| row.read().err()).take(limit).collect())
    }

    async fn take_entry(
        &self,
        entry: &OutboxEntry,
        token: &str,
        lease_until_ms: u64,
    ) -> Result<Option<OutboxEntry>, StoreError> {
        let (id, seen, new) = (entry.id.clone(), entry.token.clone(), token.to_owned());
        let changed = self
            .with_connection(move |connection| {
                connection.execute(
                    "UPDATE outbox SET token = ?1, lease_until = ?2 WHERE id = ?3 AND token = ?4",
                    params![new, lease_until_ms, id, seen],
                )
            })
            .await?;
        // Its listing read the entry whole.
        Ok((fenced(changed) == Fenced::Applied).then(|| OutboxEntry {
            token: token.to_owned(),
            lease_until_ms,
            ..entry.clone()
        }))
    }

    async fn entry_sent(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        let committing = OutboxEntry::committing_token(id) == token;
        let (id, token) = (id.to_owned(), token.to_owned());
        let changed = self
            .with_connection(move |connection| {
                let deleted = connection.execute(
                    "DELETE FROM outbox WHERE id = ?1 AND (token = ?2 OR ?3)",
                    params![id, token, committing],
                )?;
                let gone: bool =
                    connection.query_row("SELECT COUNT(*) = 0 FROM outbox WHERE id = ?1", [&id], |row| row.get(0))?;
                // No entry to delete counts as deleted, as a release does.
                Ok(deleted + usize::from(deleted == 0 && gone))
            })
            .await?;
        Ok(fenced(changed))
    }
}

/// An outbox row as stored: its id, the entry's JSON, and its lease.
struct OutboxRow {
    id: String,
    entry: String,
    token: String,
    lease_until_ms: u64,
}

impl OutboxRow {
    /// The entry the row holds, or why it cannot be read.
    fn read(self) -> Result<OutboxEntry, UnreadableEntry> {
        let entry: OutboxEntry = match serde_json::from_str(&self.entry) {
            Ok(entry) => entry,
            Err(error) => return Err(UnreadableEntry::new(self.id, self.token, error.to_string())),
        };
        Ok(OutboxEntry { token: self.token, lease_until_ms: self.lease_until_ms, ..entry })
    }
}

impl SqliteStore {
    /// At most `limit` outbox rows, oldest first, only those due at
    /// `due_at_ms` if given.
    async fn outbox_rows(&self, due_at_ms: Option<u64>, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        self.with_connection(move |connection| {
            let mut statement = connection.prepare(
                "SELECT id, entry, token, lease_until FROM outbox WHERE ?1 IS NULL OR lease_until < ?1
                 ORDER BY created_at, id LIMIT ?2",
            )?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = statement.query_map(params![due_at_ms, limit], |row| {
                Ok(OutboxRow { id: row.get(0)?, entry: row.get(1)?, token: row.get(2)?, lease_until_ms: row.get(3)? })
            })?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })
        .await
    }
}

/// Records the end of the in-progress claim `id` that still carries `token`;
/// the rows changed (1, or 0 when refused).
fn finish_row(connection: &Connection, id: &str, token: &str, finish: &Finish) -> rusqlite::Result<usize> {
    connection.execute(
        "UPDATE claims SET status = ?1, expires_at = ?2, lease_until = NULL, updated_at = ?3, result = ?4, error = ?5
         WHERE id = ?6 AND token = ?7 AND status = 'INPROGRESS'",
        params![
            finish.status.as_str(),
            finish.expires_at_s,
            finish.finished_at_ms,
            finish.result,
            finish.error,
            id,
            token
        ],
    )
}

/// [`CommitStore::commit`] inside an immediate transaction, which the caller
/// commits when it applied. The outer error is SQLite's, the inner the
/// store's answer.
/// Writes one item's change.
fn apply(connection: &Connection, change: Change) -> rusqlite::Result<usize> {
    match change {
        Change::Put((table, key), item) => connection.execute(
            "INSERT OR REPLACE INTO items (tbl, key, item) VALUES (?1, ?2, ?3)",
            params![table, key, serde_json::Value::Object(item).to_string()],
        ),
        Change::Delete((table, key)) => {
            connection.execute("DELETE FROM items WHERE tbl = ?1 AND key = ?2", params![table, key])
        }
    }
}

fn commit_in(
    connection: &Connection,
    id: &str,
    token: &str,
    commit: &Commit,
) -> rusqlite::Result<Result<Committed, StoreError>> {
    let read = |place: &Place| -> Result<Option<JsonItem>, StoreError> {
        let item: Option<String> = connection
            .query_row("SELECT item FROM items WHERE tbl = ?1 AND key = ?2", params![place.0, place.1], |row| {
                row.get(0)
            })
            .optional()
            .map_err(StoreError::unavailable)?;
        item.map(|item| serde_json::from_str(&item).map_err(StoreError::unavailable)).transpose()
    };
    if let (Some(key), [write]) = (&commit.key_in_item, commit.writes.as_slice()) {
        // The one update alone, with the key in its item: no claim is read or written.
        return Ok(match items::evaluate_keeping_key(write, key, read) {
            Ok(Ok(change)) => {
                apply(connection, change)?;
                Ok(Committed::Applied)
            }
            Ok(Err(answer)) => Ok(answer),
            Err(error) => Err(error),
        });
    }
    let stored = match select(connection, id)? {
        Some(Ok(claim)) => Some(claim),
        Some(Err(malformed)) => return Ok(Err(malformed)),
        None => None,
    };
    if let Some(answer) = commit.judged_by(token, stored.as_ref()) {
        return Ok(Ok(answer));
    }
    let changes = match items::evaluate(&commit.writes, read) {
        Ok(Evaluated::Apply(changes)) => changes,
        Ok(Evaluated::Cancelled(cancellation)) => return Ok(Ok(Committed::Cancelled(cancellation))),
        Err(error) => return Ok(Err(error)),
    };
    for change in changes {
        apply(connection, change)?;
    }
    if let Some(claim) = commit.finished_claim(stored.as_ref()) {
        upsert(connection, &claim)?;
    }
    for entry in &commit.outbox {
        let text =
            serde_json::to_string(entry).map_err(|error| rusqlite::Error::ToSqlConversionFailure(error.into()))?;
        connection.execute(
            "INSERT INTO outbox (id, token, lease_until, created_at, entry) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![entry.id, entry.token, entry.lease_until_ms, entry.created_at_ms, text],
        )?;
    }
    Ok(Ok(Committed::Applied))
}

/// Switches the file to WAL and creates the table. Switching the journal mode
/// does not wait on the busy timeout when another process is doing the same,
/// so a process that opens the file at the same time as another retries.
fn prepare(connection: &Connection) -> rusqlite::Result<()> {
    let mut attempts = 0;
    loop {
        let prepared = connection
            .execute_batch(&format!("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; {SCHEMA}"))
            .and_then(|()| add_columns(connection));
        match prepared {
            Err(rusqlite::Error::SqliteFailure(error, _))
                if error.code == rusqlite::ErrorCode::DatabaseBusy && attempts < 200 =>
            {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

fn fenced(rows_changed: usize) -> Fenced {
    if rows_changed == 1 { Fenced::Applied } else { Fenced::Refused }
}

/// Adds the columns an older file lacks, in one write transaction, so
/// processes opening the file at once add each column once.
fn add_columns(connection: &Connection) -> rusqlite::Result<()> {
    connection.execute_batch("BEGIN IMMEDIATE")?;
    let added = ADDED_COLUMNS.iter().try_for_each(|(name, kind)| {
        let present: bool = connection.query_row(
            "SELECT COUNT(*) > 0 FROM pragma_table_info('claims') WHERE name = ?1",
            [name],
            |row| row.get(0),
        )?;
        if !present {
            connection.execute_batch(&format!("ALTER TABLE claims ADD COLUMN {name} {kind}"))?;
        }
        Ok(())
    });
    connection.execute_batch(if added.is_ok() { "COMMIT" } else { "ROLLBACK" })?;
    added
}

/// The record `id`; the inner error is a row this version cannot read.
fn select(connection: &Connection, id: &str) -> rusqlite::Result<Option<Result<StoredClaim, StoreError>>> {
    connection.query_row(&format!("SELECT {COLUMNS} FROM claims WHERE id = ?1"), [id], read_row).optional()
}

fn upsert(connection: &Connection, claim: &StoredClaim) -> rusqlite::Result<usize> {
    connection.execute(
        &format!(
            "INSERT OR REPLACE INTO claims ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
        ),
        params![
            claim.id,
            claim.status.as_str(),
            claim.expires_at_s,
            claim.lease_until_ms,
            claim.token,
            claim.holder,
            claim.attempt,
            claim.claimed_at_ms,
            claim.updated_at_ms,
            claim.payload_hash,
            claim.result,
            claim.error,
            claim.message_id
        ],
    )
}

fn read_row(row: &Row<'_>) -> rusqlite::Result<Result<StoredClaim, StoreError>> {
    let id: String = row.get(0)?;
    let status: String = row.get(1)?;
    let Some(status) = ClaimStatus::parse(&status) else {
        return Ok(Err(StoreError::Malformed { id, reason: format!("unknown status `{status}`") }));
    };
    Ok(Ok(StoredClaim {
        id,
        status,
        expires_at_s: row.get(2)?,
        lease_until_ms: row.get(3)?,
        token: row.get(4)?,
        holder: row.get(5)?,
        attempt: row.get(6)?,
        claimed_at_ms: row.get(7)?,
        updated_at_ms: row.get(8)?,
        payload_hash: row.get(9)?,
        result: row.get(10)?,
        error: row.get(11)?,
        message_id: row.get(12)?,
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use sqs_once_engine::testing::__private::claim_suite::Machine;

    use crate::store::ClaimStatus;
    use sqs_once_engine::testing::Claim;

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
                    let machine = Machine::plain(store);
                    machine.claim(&id, "{}", &format!("h-{n}")).await
                })
            });
            let outcomes = futures::future::join_all(attempts).await;
            let winners = outcomes.iter().filter(|o| matches!(o, Ok(Claim::Won(_)))).count();
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
        assert_eq!((old.status, old.message_id), (ClaimStatus::Completed, None));
        let machine = Machine::plain(Arc::new(b));
        machine.win("new").await;
        assert_eq!(machine.stored("new").await.unwrap().message_id.as_deref(), Some("m-new"));
    }
}
