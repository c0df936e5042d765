//! An in-process store: for tests and for `SQS_ONCE_STORE=memory`.

use parking_lot::{Mutex, MutexGuard};
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use async_trait::async_trait;
use serde_json::Value;

use super::{
    Capabilities, ClaimAdmin, ClaimQuery, ClaimStatus, ClaimStore, Commit, CommitStore, Committed, Fenced, Finish,
    Listing, OutboxEntry, OutboxQuery, OutboxStore, PutOutcome, StoreError, StoredClaim,
    items::{self, Change, Evaluated, JsonItem, Place},
    replaced_id, unchanged,
};

/// Claims, the items handlers' staged writes commit to, and the outbox, in
/// hash maps; nothing survives the process. A commit applies under one lock,
/// so it is atomic as a DynamoDB transaction is.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    records: HashMap<String, StoredClaim>,
    items: HashMap<Place, JsonItem>,
    outbox: BTreeMap<String, OutboxEntry>,
}

impl MemoryStore {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic cannot leave a half-written state behind (a commit checks
        // everything before it changes anything), so a poisoned lock is
        // still consistent.
        self.state.lock()
    }

    /// The items staged writes committed to `table`, ordered by key: what a
    /// test of a transactional handler checks.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use sqs_once::store::MemoryStore;
    ///
    /// let store = MemoryStore::default();
    /// assert!(store.items("ledger").is_empty());
    /// # });
    /// ```
    pub fn items(&self, table: &str) -> Vec<Value> {
        let state = self.state();
        let mut items: Vec<_> = state.items.iter().filter(|((name, _), _)| name == table).collect();
        items.sort_by(|left, right| left.0.1.cmp(&right.0.1));
        items.into_iter().map(|(_, item)| Value::Object(item.clone())).collect()
    }

    /// Deletes, as a table's TTL does, each claim whose expiry has passed at
    /// `now_ms` and that `deletes` picks (by id, in id order); the ids deleted.
    pub fn delete_expired(&self, now_ms: u64, mut deletes: impl FnMut(&str) -> bool) -> Vec<String> {
        let mut state = self.state();
        let mut expired: Vec<String> = state
            .records
            .values()
            .filter(|record| record.expires_at_s < now_ms / 1000)
            .map(|record| record.id.clone())
            .collect();
        expired.sort();
        expired.retain(|id| deletes(id));
        for id in &expired {
            state.records.remove(id);
        }
        expired
    }

    /// Applies `change` to the in-progress record `id` if it still holds `token`.
    fn fenced(&self, id: &str, token: &str, change: impl FnOnce(&mut HashMap<String, StoredClaim>)) -> Fenced {
        let mut state = self.state();
        match state.records.get(id) {
            Some(record) if record.status == ClaimStatus::InProgress && record.token.as_deref() == Some(token) => {
                change(&mut state.records);
                Fenced::Applied
            }
            _ => Fenced::Refused,
        }
    }
}

#[async_trait]
impl ClaimStore for MemoryStore {
    async fn put_if_free(&self, record: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        let mut state = self.state();
        match state.records.get(&record.id) {
            Some(existing) if !existing.is_free(now_ms) => Ok(PutOutcome::Taken(Some(Box::new(existing.clone())))),
            _ => {
                state.records.insert(record.id.clone(), record.clone());
                Ok(PutOutcome::Claimed)
            }
        }
    }

    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        Ok(self.state().records.get(id).cloned())
    }

    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        Ok(self.fenced(id, token, |records| {
            if let Some(record) = records.get_mut(id) {
                record.apply(finish);
            }
        }))
    }

    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        if !self.state().records.contains_key(id) {
            return Ok(Fenced::Applied);
        }
        Ok(self.fenced(id, token, |records| {
            records.remove(id);
        }))
    }

    fn capabilities(self: Arc<Self>) -> Capabilities {
        Capabilities::all(self)
    }
}

#[async_trait]
impl ClaimAdmin for MemoryStore {
    async fn list(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
        Ok(query.select(self.state().records.values().cloned(), false))
    }

    async fn replace_seen(
        &self,
        seen: Option<&StoredClaim>,
        record: Option<&StoredClaim>,
    ) -> Result<Fenced, StoreError> {
        let Some(id) = replaced_id(seen, record).map(str::to_owned) else { return Ok(Fenced::Refused) };
        let mut state = self.state();
        if !unchanged(seen, state.records.get(&id)) {
            return Ok(Fenced::Refused);
        }
        match record {
            Some(record) => state.records.insert(id, record.clone()),
            None => state.records.remove(&id),
        };
        Ok(Fenced::Applied)
    }
}

#[async_trait]
impl CommitStore for MemoryStore {
    fn keeps_keys_in_items(&self) -> bool {
        true
    }

    async fn commit(&self, id: &str, token: &str, commit: &Commit) -> Result<Committed, StoreError> {
        let mut state = self.state();
        let State { records, items, outbox } = &mut *state;
        if let (Some(key), [write]) = (&commit.key_in_item, commit.writes.as_slice()) {
            // The one update alone, with the key in its item: no claim is read or written.
            return Ok(match items::evaluate_keeping_key(write, key, |place| Ok(items.get(place).cloned()))? {
                Ok(Change::Put(place, item)) => {
                    items.insert(place, item);
                    Committed::Applied
                }
                Ok(Change::Delete(place)) => {
                    items.remove(&place);
                    Committed::Applied
                }
                Err(answer) => answer,
            });
        }
        if let Some(answer) = commit.judged_by(token, records.get(id)) {
            return Ok(answer);
        }
        let changes = match items::evaluate(&commit.writes, |place| Ok(items.get(place).cloned()))? {
            Evaluated::Apply(changes) => changes,
            Evaluated::Cancelled(cancellation) => return Ok(Committed::Cancelled(cancellation)),
        };
        for change in changes {
            match change {
                Change::Put(place, item) => items.insert(place, item),
                Change::Delete(place) => items.remove(&place),
            };
        }
        if let Some(claim) = commit.finished_claim(records.get(id)) {
            records.insert(id.to_owned(), claim);
        }
        outbox.extend(commit.outbox.iter().map(|entry| (entry.id.clone(), entry.clone())));
        Ok(Committed::Applied)
    }
}

#[async_trait]
impl OutboxStore for MemoryStore {
    async fn entries(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>, StoreError> {
        let state = self.state();
        let due = |entry: &&OutboxEntry| query.due_at_ms.is_none_or(|now_ms| entry.is_due(now_ms));
        let mut entries: Vec<OutboxEntry> = state.outbox.values().filter(due).cloned().collect();
        entries.sort_by(|left, right| (left.created_at_ms, &left.id).cmp(&(right.created_at_ms, &right.id)));
        entries.truncate(query.limit);
        Ok(entries)
    }

    async fn take_entry(
        &self,
        entry: &OutboxEntry,
        token: &str,
        lease_until_ms: u64,
    ) -> Result<Option<OutboxEntry>, StoreError> {
        let mut state = self.state();
        Ok(match state.outbox.get_mut(&entry.id) {
            Some(stored) if stored.token == entry.token => {
                stored.token = token.to_owned();
                stored.lease_until_ms = lease_until_ms;
                Some(stored.clone())
            }
            _ => None,
        })
    }

    async fn entry_sent(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        let mut state = self.state();
        Ok(match state.outbox.get(id) {
            None => Fenced::Applied,
            Some(stored) if stored.token == token || OutboxEntry::committing_token(id) == token => {
                state.outbox.remove(id);
                Fenced::Applied
            }
            Some(_) => Fenced::Refused,
        })
    }
}
