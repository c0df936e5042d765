//! The table and the destinations as one process meets them: each request
//! travels there and back in its own time, may fail before it applies, be
//! lost after, or apply after its caller gave up (even after the caller's
//! next request was answered); a frozen process holds its requests until
//! it thaws, and a dead one never gets an answer.

use std::{future::Future, sync::Arc, time::Duration};

use async_trait::async_trait;

use super::{
    table::Table,
    world::{Life, World},
};
use sqs_once_core::{
    clock::{Clock, duration_ms},
    destinations::{Destinations, SendError},
    store::{
        Capabilities, ClaimAdmin, ClaimQuery, ClaimStore, Commit, CommitStore, Committed, Fenced, Finish, Listing,
        OutboxEntry, OutboxQuery, OutboxStore, PutOutcome, StoreError, StoredClaim,
    },
    transaction::Message,
};

/// The table as one process meets it.
#[derive(Debug)]
pub(super) struct Link {
    pub world: Arc<World>,
    pub process: usize,
}

/// What becomes of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Fate {
    Answered,
    FailedBefore,
    LostAfter,
    /// The caller gives up after the first duration; the request applies
    /// after the second, seconds later.
    Lingers,
}

/// A request, for the fences it must respect and the ledger.
struct Call<'a> {
    name: &'static str,
    /// What it is about, as the digest may see it (no tokens: they are
    /// random per test process).
    about: &'a str,
    /// The claim and token of a finishing write: only one may be waiting
    /// for its answer at a time.
    fence: Option<(&'a str, &'a str)>,
    /// The outbox entry's body, for a deletion.
    deletes: Option<String>,
}

/// Excuses a second send of `body` unless disarmed: a send or deletion
/// whose caller stopped waiting, or met an error, leaves the entry to be
/// sent again.
struct Excuse<'w> {
    world: &'w World,
    body: Option<String>,
}

impl Excuse<'_> {
    fn disarm(mut self) {
        self.body = None;
    }
}

impl Drop for Excuse<'_> {
    fn drop(&mut self) {
        if let Some(body) = self.body.take() {
            self.world.ledger.lock().excused.insert(body);
        }
    }
}

impl Link {
    /// Waits while the process is frozen; never returns once it is dead.
    pub(super) async fn hold(&self) {
        self.world.hold(self.process).await;
    }

    fn fate(&self, held: Option<Duration>) -> (Fate, Duration, Duration) {
        let world = &self.world;
        if let Some(held) = held {
            // Held past its caller's patience, then applied: the caller gives up in a few seconds.
            let gives_up = world.draw(|rng| Duration::from_millis(rng.u64(500..=3_000)));
            return (Fate::Lingers, gives_up, held.max(gives_up + Duration::from_millis(1)));
        }
        let short = |rng: &mut fastrand::Rng| Duration::from_millis(rng.u64(1..=15));
        let long = |rng: &mut fastrand::Rng| Duration::from_millis(rng.u64(200..=8_000));
        let fate = if world.strikes(|faults| faults.fail_before) {
            Fate::FailedBefore
        } else if world.strikes(|faults| faults.lost_after) {
            Fate::LostAfter
        } else if world.strikes(|faults| faults.linger) {
            Fate::Lingers
        } else {
            Fate::Answered
        };
        let slow = world.strikes(|faults| faults.slow);
        world.draw(|rng| match fate {
            Fate::Lingers => {
                // Applied as late as the margin a commit without a claim keeps for it (`SEND_MARGIN`), less a
                // second for the completion's expiry counted in whole seconds.
                let gives_up = Duration::from_millis(rng.u64(500..=3_000));
                let latest = sqs_once_core::store::SEND_MARGIN - Duration::from_secs(1);
                let applies = rng.u64(duration_ms(gives_up) + 1..=duration_ms(latest));
                (fate, gives_up, Duration::from_millis(applies))
            }
            _ if slow && rng.bool() => (fate, long(rng), short(rng)),
            _ if slow => (fate, short(rng), long(rng)),
            _ => (fate, short(rng), short(rng)),
        })
    }

    /// One request: its fate drawn, the operation applied to the table (or
    /// not) after its way there, the answer back after its way back, held
    /// while the process is frozen, never once it is dead.
    async fn call<T, F>(&self, call: Call<'_>, operation: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Table) -> Result<T, StoreError> + Send + 'static,
    {
        self.call_held(call, None, operation).await
    }

    /// [`call`](Self::call), the request held `held` before it applies, if
    /// that is given, whatever the faults draw.
    async fn call_held<T, F>(&self, call: Call<'_>, held: Option<Duration>, operation: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Table) -> Result<T, StoreError> + Send + 'static,
    {
        self.hold().await;
        let world = &self.world;
        let (fate, there, back) = self.fate(held);
        let excuse = Excuse { world, body: call.deletes.clone() };
        {
            let mut ledger = world.ledger.lock();
            ledger.note((self.process, call.name, call.about, fate, there, back));
            ledger.stats.store_calls += 1;
            match fate {
                Fate::FailedBefore => ledger.stats.failed_before += 1,
                Fate::LostAfter => ledger.stats.lost_after += 1,
                Fate::Lingers => ledger.stats.lingered += 1,
                Fate::Answered => {}
            }
            if there + back > Duration::from_millis(100) && fate != Fate::Lingers {
                ledger.stats.slow += 1;
            }
            if let Some((id, token)) = call.fence {
                let pending = ledger.pending.entry((id.to_owned(), token.to_owned())).or_default();
                *pending += 1;
                if *pending > 1 {
                    let violation = format!(
                        "process {}: the {} of {id} was sent while an earlier send of it waited for its answer",
                        self.process, call.name
                    );
                    ledger.violations.push(violation);
                }
            }
        }
        let (applied, answer) = tokio::sync::oneshot::channel();
        if fate != Fate::FailedBefore {
            // The request travels on its own: once sent, it applies whatever becomes of its sender.
            let world = Arc::clone(world);
            let (process, deletes) = (self.process, call.deletes.clone());
            let applies_after = if fate == Fate::Lingers { back } else { there };
            tokio::spawn(async move {
                tokio::time::sleep(applies_after).await;
                let result = operation(&world.table);
                if let (Some(body), Ok(_)) = (&deletes, &result) {
                    world.ledger.lock().deleted(process, body);
                }
                let _ = applied.send(result);
            });
        }
        let result = match fate {
            Fate::Answered => {
                let result = answer.await.unwrap_or_else(|_| Err(StoreError::unavailable("no answer")));
                tokio::time::sleep(back).await;
                result
            }
            Fate::FailedBefore => {
                tokio::time::sleep(there + back).await;
                Err(StoreError::unavailable("throttled"))
            }
            Fate::LostAfter => {
                let _ = answer.await;
                tokio::time::sleep(back).await;
                Err(StoreError::unavailable("the answer was lost"))
            }
            Fate::Lingers => {
                tokio::time::sleep(there).await;
                Err(StoreError::unavailable("timed out"))
            }
        };
        if world.life(self.process) != Life::Running {
            // The answer waits for a thaw that may come after the sending lease, or never.
            drop(excuse);
        } else if result.is_ok() {
            excuse.disarm();
        }
        self.hold().await;
        let mut ledger = world.ledger.lock();
        if let Some((id, token)) = call.fence
            && let Some(pending) = ledger.pending.get_mut(&(id.to_owned(), token.to_owned()))
        {
            *pending -= 1;
        }
        result
    }

    fn entry_body(&self, id: &str) -> Option<String> {
        self.world.ledger.lock().entries.get(id).cloned()
    }
}

#[async_trait]
impl ClaimStore for Link {
    async fn put_if_free(&self, record: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        let call = Call { name: "claim", about: &record.id, fence: None, deletes: None };
        let record = record.clone();
        self.call(call, move |table| table.put_if_free(&record, now_ms).now()).await
    }

    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        let call = Call { name: "read", about: id, fence: None, deletes: None };
        let id = id.to_owned();
        self.call(call, move |table| table.get(&id).now()).await
    }

    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        let call = Call { name: "finish", about: id, fence: Some((id, token)), deletes: None };
        let (id, token, finish) = (id.to_owned(), token.to_owned(), finish.clone());
        self.call(call, move |table| table.finish(&id, &token, &finish).now()).await
    }

    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        let call = Call { name: "release", about: id, fence: Some((id, token)), deletes: None };
        let (id, token) = (id.to_owned(), token.to_owned());
        self.call(call, move |table| table.release(&id, &token).now()).await
    }

    fn gathers_calls(&self) -> bool {
        self.world.scenario.gathers
    }

    fn capabilities(self: Arc<Self>) -> Capabilities {
        Capabilities::all(self)
    }
}

#[async_trait]
impl ClaimAdmin for Link {
    async fn list(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
        self.world.table.list(query).await
    }

    async fn replace_seen(
        &self,
        seen: Option<&StoredClaim>,
        record: Option<&StoredClaim>,
    ) -> Result<Fenced, StoreError> {
        self.world.table.replace_seen(seen, record).await
    }
}

#[async_trait]
impl CommitStore for Link {
    fn keeps_keys_in_items(&self) -> bool {
        true
    }

    async fn commit(&self, id: &str, token: &str, commit: &Commit) -> Result<Committed, StoreError> {
        {
            let mut ledger = self.world.ledger.lock();
            for entry in &commit.outbox {
                ledger.entries.insert(entry.id.clone(), entry.message.body.clone());
            }
        }
        let (unclaimed, kept) = (commit.unclaimed.is_some(), commit.key_in_item.is_some());
        let committed = match self.world.scenario.kept_statements.filter(|_| kept) {
            Some(late) => self.commit_as_statement(id, token, commit, late).await,
            None => self.commit_once(id, token, commit, None).await,
        };
        self.world.count(|stats| {
            stats.unclaimed_commits += u64::from(unclaimed);
            stats.taken += u64::from(matches!(committed, Ok(Committed::Taken(_))));
            stats.kept_in_items += u64::from(matches!(committed, Ok(Committed::Applied)) && kept);
            stats.in_item_already += u64::from(matches!(committed, Ok(Committed::InItemAlready)));
        });
        committed
    }
}

impl Link {
    /// Whether the commit's time to be sent has passed (once the process
    /// runs: an attempt held by a freeze is checked at the thaw), as the
    /// DynamoDB store's client checks before every attempt.
    async fn too_late(&self, commit: &Commit) -> Option<StoreError> {
        let send_by_ms = commit.send_by_ms()?;
        self.hold().await;
        (self.world.clock.now_ms() > send_by_ms).then(|| StoreError::unavailable("too late to send the commit"))
    }

    /// A commit that keeps its key in its item, as the DynamoDB store sends
    /// one for the window under way: a statement that waits for a batch,
    /// throttled on its own now and then and sent again after a pause
    /// (three attempts, each checked against the commit's deadline), the
    /// batch's answer lost, late or failed as any request's. At rate
    /// `late`, the statement is held minutes to hours and sent then without
    /// a check: what refuses it, if the key could be forgotten by then, is
    /// the item's window (`InItem::Late`).
    async fn commit_as_statement(
        &self,
        id: &str,
        token: &str,
        commit: &Commit,
        late: f64,
    ) -> Result<Committed, StoreError> {
        let world = &self.world;
        if world.strikes(|_| late) {
            let memory = Duration::from_millis(commit.key_in_item.as_ref().map_or(0, |key| key.memory_ms));
            let held = world.draw(|rng| Duration::from_millis(rng.u64(1_000..=duration_ms(memory * 3))));
            world.count(|stats| stats.statements_held += 1);
            return self.commit_once(id, token, commit, Some(held)).await;
        }
        for attempt in 1.. {
            if let Some(late) = self.too_late(commit).await {
                return Err(late);
            }
            // Its wait for a slot in the batch: at most as long as a slow request holds one.
            tokio::time::sleep(Duration::from_millis(world.draw(|rng| rng.u64(0..=500)))).await;
            if !world.strikes(|faults| faults.fail_before) {
                break;
            }
            world.count(|stats| stats.statements_throttled += 1);
            if attempt == 3 {
                return Err(StoreError::unavailable("ThrottlingError: slow down"));
            }
            tokio::time::sleep(Duration::from_millis(world.draw(|rng| rng.u64(12..=100)))).await;
        }
        if let Some(late) = self.too_late(commit).await {
            return Err(late);
        }
        self.commit_once(id, token, commit, None).await
    }

    /// One request of `commit` (held `held` before it applies, unchecked,
    /// if that is given; otherwise checked against its deadline first).
    async fn commit_once(
        &self,
        id: &str,
        token: &str,
        commit: &Commit,
        held: Option<Duration>,
    ) -> Result<Committed, StoreError> {
        if held.is_none()
            && let Some(late) = self.too_late(commit).await
        {
            return Err(late);
        }
        let call = Call { name: "commit", about: id, fence: Some((id, token)), deletes: None };
        let holds_ms = self.world.draw(|rng| rng.u64(0..=self.world.scenario.transaction_ms));
        let (id, token, commit) = (id.to_owned(), token.to_owned(), commit.clone());
        let world = Arc::clone(&self.world);
        self.call_held(call, held, move |table| {
            let committed = table.commit(&id, &token, &commit, holds_ms);
            if matches!(&committed, Err(StoreError::Unavailable(error)) if error.to_string().starts_with("TransactionConflict"))
            {
                world.count(|stats| stats.conflicts += 1);
            }
            if matches!(&committed, Err(StoreError::Unavailable(error)) if error.to_string().contains("too late to be sent"))
            {
                world.count(|stats| stats.refused_late += 1);
            }
            committed
        })
        .await
    }
}

#[async_trait]
impl OutboxStore for Link {
    async fn entries(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>, StoreError> {
        let call = Call { name: "outbox", about: "", fence: None, deletes: None };
        let query = *query;
        let lag_ms = self.world.draw(|rng| rng.u64(0..=self.world.scenario.index_lag_ms));
        self.call(call, move |table| Ok(table.entries(&query, lag_ms))).await
    }

    async fn take_entry(
        &self,
        entry: &OutboxEntry,
        token: &str,
        lease_until_ms: u64,
    ) -> Result<Option<OutboxEntry>, StoreError> {
        let call = Call { name: "take", about: &entry.message.body, fence: None, deletes: None };
        let (entry, token) = (entry.clone(), token.to_owned());
        self.call(call, move |table| table.take_entry(&entry, &token, lease_until_ms).now()).await
    }

    async fn entry_sent(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        let body = self.entry_body(id);
        let about = body.clone().unwrap_or_default();
        let call = Call { name: "delete", about: &about, fence: None, deletes: body };
        let (id, token) = (id.to_owned(), token.to_owned());
        self.call(call, move |table| table.entry_sent(&id, &token).now()).await
    }
}

/// A future of the in-memory table, which never waits: its answer now.
trait Now: Future + Sized {
    fn now(self) -> Self::Output {
        futures::FutureExt::now_or_never(self).expect("the table answers at once")
    }
}

impl<F: Future> Now for F {}

/// The destinations as one process meets them.
#[derive(Debug)]
pub(super) struct Sender {
    pub link: Arc<Link>,
}

#[async_trait]
impl Destinations for Sender {
    async fn send(&self, _outbox_id: &str, message: &Message) -> Result<(), SendError> {
        let link = &self.link;
        let world = &link.world;
        link.hold().await;
        let (failed, refused, lost, slow) = (
            world.strikes(|faults| faults.send_fail),
            world.strikes(|faults| faults.send_refused),
            world.strikes(|faults| faults.send_lost),
            world.strikes(|faults| faults.slow_send),
        );
        let (there, back) = world.draw(|rng| match slow {
            true => (Duration::from_millis(rng.u64(1_000..=8_000)), Duration::from_millis(rng.u64(1..=2_000))),
            false => (Duration::from_millis(rng.u64(1..=10)), Duration::from_millis(rng.u64(1..=10))),
        });
        let body = message.body.clone();
        let delivered = !failed && !refused;
        let excuse = Excuse { world, body: delivered.then(|| body.clone()) };
        {
            let mut ledger = world.ledger.lock();
            ledger.note((link.process, "send", &body, failed, refused, lost, there, back));
            if failed {
                ledger.stats.send_failed += 1;
            } else if refused {
                ledger.stats.send_refused += 1;
            }
            ledger.stats.send_lost += u64::from(delivered && lost);
            ledger.stats.slow_sends += u64::from(slow);
        }
        let (arrived, arrival) = tokio::sync::oneshot::channel();
        if delivered {
            // The message travels on its own: once sent, it arrives whatever becomes of its sender.
            let (world, process) = (Arc::clone(world), link.process);
            tokio::spawn(async move {
                tokio::time::sleep(there).await;
                let now_ms = world.clock.now_ms();
                world.ledger.lock().received(process, &body, now_ms);
                let _ = arrived.send(());
            });
            let _ = arrival.await;
        } else {
            tokio::time::sleep(there).await;
        }
        tokio::time::sleep(back).await;
        if world.life(link.process) != Life::Running {
            drop(excuse);
        } else if delivered && !lost {
            excuse.disarm();
        }
        link.hold().await;
        match (failed, refused, lost) {
            (true, _, _) => Err(SendError::failed("the destination failed")),
            (_, true, _) => Err(SendError::refused("AccessDenied")),
            (_, _, true) => Err(SendError::failed("the answer was lost")),
            _ => Ok(()),
        }
    }
}
