//! An in-process store: for tests and for `SQS_ONCE_STORE=memory`.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
};

use async_trait::async_trait;

use super::{ClaimQuery, ClaimStore, Fenced, Finish, Listing, PutOutcome, StoreError, replaced_id, unchanged};
use crate::{
    claim::{ClaimStatus, StoredClaim},
    lock::lock,
};

/// Claims in a hash map; nothing survives the process.
///
/// ```
/// use std::sync::Arc;
/// use sqs_once::{claim::Claims, store::MemoryStore};
///
/// let claims = Claims::new(Arc::new(MemoryStore::default()));
/// ```
#[derive(Debug, Default)]
pub struct MemoryStore {
    records: Mutex<HashMap<String, StoredClaim>>,
}

impl MemoryStore {
    fn records(&self) -> MutexGuard<'_, HashMap<String, StoredClaim>> {
        // A panic cannot leave a half-written record behind (every write is a
        // single map operation), so a poisoned map is still consistent.
        lock(&self.records)
    }

    /// Applies `change` to the in-progress record `id` if it still holds `token`.
    fn fenced(&self, id: &str, token: &str, change: impl FnOnce(&mut HashMap<String, StoredClaim>)) -> Fenced {
        let mut records = self.records();
        match records.get(id) {
            Some(record) if record.status == ClaimStatus::InProgress && record.token.as_deref() == Some(token) => {
                change(&mut records);
                Fenced::Applied
            }
            _ => Fenced::Refused,
        }
    }
}

#[async_trait]
impl ClaimStore for MemoryStore {
    async fn put_if_free(&self, record: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        let mut records = self.records();
        match records.get(&record.id) {
            Some(existing) if !existing.is_free(now_ms) => Ok(PutOutcome::Taken(Some(Box::new(existing.clone())))),
            _ => {
                records.insert(record.id.clone(), record.clone());
                Ok(PutOutcome::Claimed)
            }
        }
    }

    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        Ok(self.records().get(id).cloned())
    }

    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        Ok(self.fenced(id, token, |records| {
            if let Some(record) = records.get_mut(id) {
                record.apply(finish);
            }
        }))
    }

    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        if !self.records().contains_key(id) {
            return Ok(Fenced::Applied);
        }
        Ok(self.fenced(id, token, |records| {
            records.remove(id);
        }))
    }

    async fn list(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
        Ok(query.select(self.records().values().cloned(), false))
    }

    async fn replace_seen(
        &self,
        seen: Option<&StoredClaim>,
        record: Option<&StoredClaim>,
    ) -> Result<Fenced, StoreError> {
        let Some(id) = replaced_id(seen, record).map(str::to_owned) else { return Ok(Fenced::Refused) };
        let mut records = self.records();
        if !unchanged(seen, records.get(&id)) {
            return Ok(Fenced::Refused);
        }
        match record {
            Some(record) => records.insert(id, record.clone()),
            None => records.remove(&id),
        };
        Ok(Fenced::Applied)
    }
}
