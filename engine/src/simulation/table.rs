//! The table every simulated consumer shares, as DynamoDB keeps it rather
//! than as a map would: a transaction's `ClientRequestToken` is answered as
//! its first answer for ten minutes and is a new request after; claims
//! expire, and TTL deletes an expired one at some later moment; two
//! transactions on one item at once conflict (`TransactionConflict`), as
//! does a single write to an item a transaction holds; and the outbox is
//! listed from an index that lags the table (eventually consistent) and
//! answers at most a page.
//!
//! It also keeps what the checks need and DynamoDB would not tell: every
//! application of a run's staged writes, with when the run decided to apply
//! them and when its completion expires.

use parking_lot::Mutex;
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use futures::FutureExt;
use serde_json::Value;

use sqs_once_core::store::TOKEN_WINDOW;

use super::world::SimClock;
use sqs_once_core::{
    clock::{Clock, duration_ms},
    store::{
        ClaimAdmin, ClaimQuery, ClaimStatus, ClaimStore, Commit, CommitStore, Committed, Fenced, Finish, Listing,
        MemoryStore, OutboxEntry, OutboxQuery, OutboxStore, PutOutcome, StoreError, StoredClaim, items::item_keys,
    },
    transaction::{
        Action, Write,
        item_keys::{InItem, KeyInItem},
    },
};

/// One application of a run's staged writes.
#[derive(Debug, Clone)]
pub(super) struct Application {
    /// The key's stored id.
    pub key: String,
    /// The run whose writes applied.
    pub run: u64,
    /// When the run decided to apply them: its claim (claiming first), or
    /// the moment its commit judges the key free at (without a claim).
    pub decided_ms: u64,
    /// When they applied.
    pub applied_ms: u64,
    /// When the run's lease ended (its invocation's deadline, and a margin).
    pub lease_until_ms: u64,
    /// When the completion written with them expires, epoch seconds.
    pub expires_at_s: u64,
}

/// DynamoDB's table, shared by every process of a world.
#[derive(Debug)]
pub(super) struct Table {
    items: MemoryStore,
    clock: Arc<SimClock>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Tokens of the transactions that applied, with when they did.
    tokens: HashMap<String, u64>,
    /// Claims a transaction holds, until when.
    held: HashMap<String, u64>,
    /// Each outbox entry's versions as the table had them, oldest first,
    /// `None` once deleted: the index shows a lagging one.
    versions: BTreeMap<String, Vec<(u64, Option<OutboxEntry>)>>,
    applications: Vec<Application>,
    /// When each key's finished claim was last forgotten: deleted by TTL,
    /// or replaced once it had expired.
    forgotten: HashMap<String, u64>,
    /// Each claim taken, by its token: when it was taken and its lease's
    /// end, for the application of a commit made under it, which may land
    /// after another run took the key over.
    claims: HashMap<String, (Option<u64>, Option<u64>)>,
}

/// A transaction that met another on the same item.
fn conflict(id: &str) -> StoreError {
    StoreError::unavailable(format!("TransactionConflict: a transaction holds {id}"))
}

impl Table {
    pub(super) fn new(clock: Arc<SimClock>) -> Self {
        Self { items: MemoryStore::default(), clock, state: Mutex::default() }
    }

    /// The items staged writes committed to `table`.
    pub(super) fn items(&self, table: &str) -> Vec<Value> {
        self.items.items(table)
    }

    /// Every application of staged writes so far.
    pub(super) fn applications(&self) -> Vec<Application> {
        self.state.lock().applications.clone()
    }

    /// TTL's pass: deletes each expired claim that `deletes` picks.
    pub(super) fn expire(&self, deletes: impl FnMut(&str) -> bool) {
        let now_ms = self.clock.now_ms();
        let deleted = self.items.delete_expired(now_ms, deletes);
        self.state.lock().forgotten.extend(deleted.into_iter().map(|id| (id, now_ms)));
    }

    /// Whether the finished claim of `id` was forgotten after `at_ms`: the
    /// table no longer says what it said then.
    pub(super) fn forgotten_since(&self, id: &str, at_ms: u64) -> bool {
        self.state.lock().forgotten.get(id).is_some_and(|&forgotten_ms| forgotten_ms >= at_ms)
    }

    /// Notes that a write replaced `before`, a finished claim (so expired).
    fn replaced(&self, before: Option<&StoredClaim>) {
        if let Some(claim) = before.filter(|claim| claim.status != ClaimStatus::InProgress) {
            self.state.lock().forgotten.insert(claim.id.clone(), self.clock.now_ms());
        }
    }

    /// A single write to `id` meets a transaction that holds it.
    fn check_held(&self, id: &str) -> Result<(), StoreError> {
        let now_ms = self.clock.now_ms();
        match self.state.lock().held.get(id) {
            Some(&until_ms) if until_ms > now_ms => Err(conflict(id)),
            _ => Ok(()),
        }
    }

    /// Commits as `TransactWriteItems` does: answered as its first answer
    /// within the token's window; cancelled when another transaction holds
    /// the claim; otherwise evaluated, and holding the claim for `holds_ms`.
    pub(super) fn commit(
        &self,
        id: &str,
        token: &str,
        commit: &Commit,
        holds_ms: u64,
    ) -> Result<Committed, StoreError> {
        let now_ms = self.clock.now_ms();
        let mut state = self.state.lock();
        if commit.key_in_item.is_some() {
            // One conditional update of the business item: no token, no claim held, none written (a run that
            // claimed first completes its claim after).
            let committed = self.items.commit(id, token, commit).now_or_never().expect("in memory")?;
            if committed == Committed::Applied
                && let Some(run) = run_of(&commit.writes)
            {
                let (decided_ms, lease_until_ms) = match &commit.unclaimed {
                    Some(unclaimed) => (unclaimed.now_ms, unclaimed.claim.lease_until_ms),
                    // Its own claim's, not the one the key holds now: a late send lands after a takeover.
                    None => {
                        let (claimed_at_ms, lease_until_ms) = state.claims.get(token).copied().unwrap_or_default();
                        (claimed_at_ms.unwrap_or(now_ms), lease_until_ms)
                    }
                };
                state.applications.push(Application {
                    key: id.to_owned(),
                    run,
                    decided_ms,
                    applied_ms: now_ms,
                    lease_until_ms: lease_until_ms.unwrap_or(now_ms),
                    expires_at_s: commit.finish.expires_at_s,
                });
            }
            return Ok(committed);
        }
        if state.tokens.get(token).is_some_and(|&at| now_ms <= at + duration_ms(TOKEN_WINDOW)) {
            return Ok(Committed::Applied);
        }
        if state.held.get(id).is_some_and(|&until_ms| until_ms > now_ms) {
            return Err(conflict(id));
        }
        state.held.insert(id.to_owned(), now_ms + holds_ms);
        let before = self.items.get(id).now_or_never().expect("in memory")?;
        let already = commit.judged_by(token, before.as_ref()) == Some(Committed::Applied);
        let committed = self.items.commit(id, token, commit).now_or_never().expect("in memory")?;
        if committed == Committed::Applied && !already {
            state.tokens.insert(token.to_owned(), now_ms);
            if commit.unclaimed.is_some()
                && let Some(claim) = before.as_ref().filter(|claim| claim.status != ClaimStatus::InProgress)
            {
                state.forgotten.insert(claim.id.clone(), now_ms);
            }
            let (decided_ms, lease_until_ms) = match &commit.unclaimed {
                Some(unclaimed) => (unclaimed.now_ms, unclaimed.claim.lease_until_ms),
                None => (before.as_ref().and_then(|claim| claim.claimed_at_ms).unwrap_or(now_ms), {
                    before.as_ref().and_then(|claim| claim.lease_until_ms)
                }),
            };
            if let Some(run) = run_of(&commit.writes) {
                let (key, expires_at_s) = (id.to_owned(), commit.finish.expires_at_s);
                let lease_until_ms = lease_until_ms.unwrap_or(now_ms);
                let applied_ms = now_ms;
                let application = Application { key, run, decided_ms, applied_ms, lease_until_ms, expires_at_s };
                state.applications.push(application);
            }
            for entry in &commit.outbox {
                state.versions.entry(entry.id.clone()).or_default().push((now_ms, Some(entry.clone())));
            }
        }
        Ok(committed)
    }

    /// The outbox as its index showed it `lag_ms` ago, at most `query.limit`
    /// entries.
    pub(super) fn entries(&self, query: &OutboxQuery, lag_ms: u64) -> Vec<OutboxEntry> {
        let as_of_ms = self.clock.now_ms().saturating_sub(lag_ms);
        let state = self.state.lock();
        let mut entries: Vec<OutboxEntry> = state
            .versions
            .values()
            .filter_map(|versions| versions.iter().rev().find(|(at, _)| *at <= as_of_ms)?.1.clone())
            .filter(|entry| query.due_at_ms.is_none_or(|now_ms| entry.is_due(now_ms)))
            .collect();
        entries.sort_by(|left, right| (left.created_at_ms, &left.id).cmp(&(right.created_at_ms, &right.id)));
        entries.truncate(query.limit);
        entries
    }

    /// The outbox as it stands, for the checks.
    pub(super) fn unsent(&self) -> Vec<OutboxEntry> {
        self.entries(&OutboxQuery { due_at_ms: None, limit: usize::MAX }, 0)
    }

    fn version(&self, id: &str, entry: Option<OutboxEntry>) {
        let now_ms = self.clock.now_ms();
        self.state.lock().versions.entry(id.to_owned()).or_default().push((now_ms, entry));
    }
}

/// The run a commit's writes belong to: the key of its item in `runs`, or
/// the run an increment that keeps its key names.
fn run_of(writes: &[Write]) -> Option<u64> {
    let run_item = writes.iter().filter_map(Write::target).find(|target| target.table == "runs").and_then(|target| {
        target.key.attributes().iter().find(|(name, _)| name == "run").and_then(|(_, value)| value.as_u64())
    });
    let named = || {
        writes.iter().find_map(|write| match write {
            Write::Update(update) if update.keeps_key() => update.actions().iter().find_map(|action| match action {
                Action::Set(name, value) if name == "run" => value.as_u64(),
                _ => None,
            }),
            _ => None,
        })
    };
    run_item.or_else(named)
}

impl Table {
    /// Whether the `applied` item `pk` keeps the key stored as `id` still,
    /// for consumers whose key memory is `memory` ([`KeyInItem::judge`]).
    pub(super) fn keeps_in_item(&self, id: &str, pk: &str, memory: std::time::Duration) -> bool {
        let item = self.items("applied").into_iter().find(|item| item["pk"] == pk);
        let keys = item_keys(item.as_ref().and_then(Value::as_object));
        KeyInItem::new(id, self.clock.now_ms(), memory).judge(&keys) == InItem::Duplicate
    }
}

#[async_trait::async_trait]
impl ClaimStore for Table {
    async fn put_if_free(&self, record: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        self.check_held(&record.id)?;
        let before = self.items.get(&record.id).await?;
        let put = self.items.put_if_free(record, now_ms).await?;
        if put == PutOutcome::Claimed {
            self.replaced(before.as_ref());
            if let Some(token) = &record.token {
                self.state.lock().claims.insert(token.clone(), (record.claimed_at_ms, record.lease_until_ms));
            }
        }
        Ok(put)
    }

    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        self.items.get(id).await
    }

    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        self.check_held(id)?;
        self.items.finish(id, token, finish).await
    }

    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        self.check_held(id)?;
        self.items.release(id, token).await
    }
}

#[async_trait::async_trait]
impl ClaimAdmin for Table {
    async fn list(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
        self.items.list(query).await
    }

    async fn replace_seen(
        &self,
        seen: Option<&StoredClaim>,
        record: Option<&StoredClaim>,
    ) -> Result<Fenced, StoreError> {
        self.items.replace_seen(seen, record).await
    }
}

#[async_trait::async_trait]
impl CommitStore for Table {
    fn keeps_keys_in_items(&self) -> bool {
        true
    }

    async fn commit(&self, id: &str, token: &str, commit: &Commit) -> Result<Committed, StoreError> {
        Table::commit(self, id, token, commit, 0)
    }
}

#[async_trait::async_trait]
impl OutboxStore for Table {
    async fn entries(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>, StoreError> {
        Ok(Table::entries(self, query, 0))
    }

    async fn take_entry(
        &self,
        entry: &OutboxEntry,
        token: &str,
        lease_until_ms: u64,
    ) -> Result<Option<OutboxEntry>, StoreError> {
        let taken = self.items.take_entry(entry, token, lease_until_ms).await?;
        if let Some(leased) = &taken {
            self.version(&entry.id, Some(leased.clone()));
        }
        Ok(taken)
    }

    async fn entry_sent(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        let deleted = self.items.entry_sent(id, token).await?;
        if deleted == Fenced::Applied {
            self.version(id, None);
        }
        Ok(deleted)
    }
}
