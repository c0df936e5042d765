//! A commit that keeps its key in its one update's item
//! ([`sqs_once_core::transaction::item_keys`]): one conditional `UpdateItem` of the
//! business item, which applies the handler's update and adds the key's
//! digest to the item's keys, on the condition that the item does not hold
//! it; no claim, no completion, no transaction.
//!
//! What the update does to the item's keys depends on its window (see
//! [`InItem`]), which only the item knows: each commit is sent for the
//! window this process last saw the item in (a window begun now, for an
//! item it never saw), with a condition that holds only then. Refused, the
//! item DynamoDB returns (`ReturnValuesOnConditionCheckFailure = ALL_OLD`)
//! tells which: the key held (a duplicate, the handler's write not applied
//! again), the window full, the handler's own condition failing, or
//! another window, for which the commit is sent again.
//!
//! Where the store batches its writes, a commit sent for the window under
//! way goes out as a PartiQL `UPDATE` among up to 25 in one
//! `BatchExecuteStatement` ([`statements::kept_key_update`]): one write
//! unit still, as the single request. A commit that begins a window (the
//! item may not exist, which only `UpdateItem` creates), one PartiQL has no
//! form for, and one whose statement was refused for no reason the item's
//! keys give (the handler's condition, as PartiQL reads a missing attribute)
//! are sent as the single request, which decides.

use parking_lot::Mutex;
use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use tokio::sync::Notify;

use aws_sdk_dynamodb::{
    operation::update_item::UpdateItemError,
    types::{AttributeValue, ReturnValuesOnConditionCheckFailure},
};

use super::{DynamoDbStore, admin::table_missing, transact::Expression};
use crate::{
    client::{described, too_late, unavailable},
    layout::{Item, attribute_value, n},
    statements::{self, Written},
};
use sqs_once_core::{
    store::{Cancellation, Commit, Committed, StoreError},
    transaction::{
        Target, Update, Write,
        item_keys::{InItem, ItemKeys, KEYS, KEYS_BEFORE, KEYS_SINCE, KeyInItem, MAX_KEYS_PER_WINDOW, NO_KEY},
    },
};

/// Items whose window a process remembers at most; past it, it forgets
/// them all and sends the next commit to each for a window begun now.
const WINDOWS_KEPT: usize = 10_000;

/// How long a commit to an item waits for another commit of this process
/// that is finding out the item's window, at most, before it sends for a
/// window begun now: a request's time.
const LEARNING_WAIT: Duration = Duration::from_secs(1);

/// When each item's window under way began, as this process last saw it,
/// by table and key: what the next commit to it is sent for.
#[derive(Debug, Default)]
pub(super) struct Windows(Mutex<HashMap<String, Seen>>);

/// What a process knows of an item's window.
#[derive(Debug)]
enum Seen {
    /// When it began.
    Since(u64),
    /// A commit of this process is sent for it without knowing: the others
    /// wait for its answer, rather than each guess the same wrong window
    /// and be refused (a batch of credits to one account, on a process's
    /// first batch).
    Learning(Arc<Notify>),
}

impl Windows {
    /// When the window the next commit to `item` is sent for began, as this
    /// process saw it last; `None` when it does not know, and the caller is
    /// to find out ([`saw`](Self::saw) says, whatever its commit's answer).
    async fn since_ms(&self, item: &str) -> Option<u64> {
        loop {
            let learning = {
                let mut windows = self.0.lock();
                match windows.get(item) {
                    Some(Seen::Since(since_ms)) => return Some(*since_ms),
                    Some(Seen::Learning(learning)) => Arc::clone(learning),
                    None => {
                        windows.insert(item.to_owned(), Seen::Learning(Arc::default()));
                        return None;
                    }
                }
            };
            let learnt = learning.notified();
            tokio::pin!(learnt);
            learnt.as_mut().enable();
            // Learnt meanwhile? Then the entry is no longer learning.
            if !matches!(self.0.lock().get(item), Some(Seen::Learning(_))) {
                continue;
            }
            if tokio::time::timeout(LEARNING_WAIT, learnt).await.is_err() {
                return None;
            }
        }
    }

    /// The window of `item` began at `since_ms` (`None`: unknown), as a
    /// commit's answer or the item returned with a refusal says; commits
    /// waiting to know go on.
    fn saw(&self, item: &str, since_ms: Option<u64>) {
        let mut windows = self.0.lock();
        if windows.len() >= WINDOWS_KEPT {
            windows.clear();
        }
        let before = match since_ms {
            Some(since_ms) => windows.insert(item.to_owned(), Seen::Since(since_ms)),
            None => windows.remove(item),
        };
        if let Some(Seen::Learning(learning)) = before {
            learning.notify_waiters();
        }
    }
}

/// The keys `item` keeps, as DynamoDB returned it.
fn item_keys(item: Option<&Item>) -> ItemKeys {
    let set = |name: &str| -> BTreeSet<String> {
        match item.and_then(|item| item.get(name)) {
            Some(AttributeValue::Ss(keys)) => keys.iter().cloned().collect(),
            _ => BTreeSet::new(),
        }
    };
    let since_ms = match item.and_then(|item| item.get(KEYS_SINCE)) {
        Some(AttributeValue::N(since)) => since.parse().ok(),
        _ => None,
    };
    ItemKeys { current: set(KEYS), before: set(KEYS_BEFORE), since_ms }
}

/// How many times a commit is sent for another window before it gives up:
/// each refusal tells the window that holds, so a second send is the last
/// unless another commit changes the item's window in between.
const WINDOW_ATTEMPTS: usize = 4;

impl DynamoDbStore {
    /// [`CommitStore::commit`](sqs_once_core::store::CommitStore::commit) of a
    /// commit whose key is kept in its update's item.
    pub(super) async fn commit_in_item(&self, commit: &Commit, key: &KeyInItem) -> Result<Committed, StoreError> {
        let [Write::Update(update)] = commit.writes.as_slice() else {
            return Err(StoreError::Unsupported(
                "a commit keeps its key in the item of its one update, and holds other writes".into(),
            ));
        };
        // As DynamoDB tells items apart (numbers by value), for the windows known and the batcher.
        let item = commit.writes[0].item().unwrap_or_else(|| update.target().describe());
        let since_ms = self.windows.since_ms(&item).await;
        let committed = self.commit_in_window(commit, key, update, &item, since_ms).await;
        if committed.is_err() {
            // What the item's window is stays unknown: whoever waits on this commit goes on.
            self.windows.saw(&item, since_ms);
        }
        committed
    }

    /// [`commit_in_item`](Self::commit_in_item) of `update`, sent first for
    /// the window begun at `since_ms` (a new one when `None`).
    async fn commit_in_window(
        &self,
        commit: &Commit,
        key: &KeyInItem,
        update: &Update,
        item: &str,
        since_ms: Option<u64>,
    ) -> Result<Committed, StoreError> {
        let send_by_ms = commit.send_by_ms();
        let mut judged = key.judge(&ItemKeys { since_ms, ..ItemKeys::default() });
        // Once a statement was refused for the handler's condition, the single request decides.
        let mut batched = true;
        for _ in 0..WINDOW_ATTEMPTS {
            if let Some(late) = too_late(send_by_ms) {
                return Err(late);
            }
            if judged == InItem::Late {
                return Err(StoreError::window_too_late(key, since_ms));
            }
            let answered_as_statement = match batched {
                true => self.send_batched(update, key, judged, item, send_by_ms).await,
                false => None,
            };
            let (sent, as_statement) = match answered_as_statement {
                Some(sent) => (sent?, true),
                None => (self.send_in_item(update, key, judged, send_by_ms).await?, false),
            };
            let Sent::Refused(refused) = sent else {
                let since_ms = match judged {
                    InItem::SameWindow => since_ms,
                    _ => Some(key.now_ms),
                };
                self.windows.saw(item, since_ms);
                return Ok(Committed::Applied);
            };
            let keys = item_keys(refused.as_ref());
            self.windows.saw(item, keys.since_ms);
            match key.judge(&keys) {
                InItem::Duplicate => return Ok(Committed::InItemAlready),
                InItem::Full => {
                    return Ok(Committed::window_full(key, &commit.writes[0], keys.since_ms.unwrap_or_default()));
                }
                InItem::Late => return Err(StoreError::window_too_late(key, keys.since_ms)),
                now if now == judged && as_statement => batched = false,
                // Sent for the window that holds: what refused it is the handler's own condition.
                now if now == judged => {
                    let reasons = format!("{}: ConditionalCheckFailed", commit.writes[0].describe());
                    return Ok(Committed::Cancelled(Cancellation::by(&commit.writes, 0, reasons)));
                }
                now => judged = now,
            }
        }
        Err(StoreError::Contended(item.to_owned()))
    }

    /// [`send_in_item`](Self::send_in_item) as a PartiQL statement among the
    /// store's batched writes, for the window under way; `None` when it is
    /// to be the single request: the store makes single requests, `judged`
    /// is another window, PartiQL has no form for the update, DynamoDB
    /// rejected the statement for its data (an `ADD` to an attribute the
    /// item lacks, which PartiQL's `+` refuses), or the handler's tables do
    /// not allow PartiQL (then none is sent as one again).
    async fn send_batched(
        &self,
        update: &Update,
        key: &KeyInItem,
        judged: InItem,
        item: &str,
        send_by_ms: Option<u64>,
    ) -> Option<Result<Sent, StoreError>> {
        let batches = self.batches.as_deref().filter(|_| judged == InItem::SameWindow)?;
        let statement = match statements::kept_key_update(update, key, item, send_by_ms)? {
            Ok(statement) => statement,
            Err(error) => return Some(Err(error)),
        };
        Some(match batches.write_to_item(statement).await? {
            Ok(Written::Applied) => Ok(Sent::Applied),
            Ok(Written::Refused(Some(returned))) => Ok(Sent::Refused(Some(returned))),
            Ok(Written::Refused(None)) => self.get_item_of(update.target()).await.map(Sent::Refused),
            Err(error) => Err(error),
        })
    }

    /// Sends `update` with the key added as `judged` says, on the condition
    /// that the item's window is the one `judged` is for and holds no key
    /// of it ([`window_change`]), none of its attempts past `send_by_ms`;
    /// a refusal's item is read when DynamoDB did not return it.
    async fn send_in_item(
        &self,
        update: &Update,
        key: &KeyInItem,
        judged: InItem,
        send_by_ms: Option<u64>,
    ) -> Result<Sent, StoreError> {
        let target = update.target();
        let mut expression = Expression::default();
        let (mut conditions, set, add) = window_change(&mut expression, key, judged);
        if let Some(condition) = &target.condition {
            conditions.push(format!("({})", expression.condition(condition)?));
        }
        let update_expression = expression.update_with(update.actions(), set, add)?;
        let sent = self
            .client
            .update_item()
            .table_name(&target.table)
            .set_key(Some(key_of(target)))
            .update_expression(update_expression)
            .condition_expression(conditions.join(" AND "))
            .set_expression_attribute_names(expression.names())
            .set_expression_attribute_values(expression.values())
            .return_values_on_condition_check_failure(self.returned_values())
            .customize()
            // Checked before each of the SDK's own attempts: a freeze or a slow answer can hold one past its time.
            .map_request(move |request| too_late(send_by_ms).map_or(Ok(request), Err))
            .send()
            .await;
        let error = match sent {
            Ok(_) => return Ok(Sent::Applied),
            Err(error) => error.into_service_error(),
        };
        match error {
            UpdateItemError::ConditionalCheckFailedException(failed) => match failed.item {
                Some(item) if !item.is_empty() => Ok(Sent::Refused(Some(item))),
                _ if self.returned_values() == ReturnValuesOnConditionCheckFailure::AllOld => Ok(Sent::Refused(None)),
                _ => Ok(Sent::Refused(self.get_item_of(target).await?)),
            },
            UpdateItemError::ResourceNotFoundException(missing) if table_missing(&self.client, &target.table).await => {
                Err(StoreError::Rejected(format!(
                    "the handler's table `{}` does not exist ({}): create it, or correct the table the handler \
                     stages its write to",
                    target.table,
                    described(&missing)
                )))
            }
            other => Err(unavailable(other)),
        }
    }

    /// The item `target` names, read consistently.
    async fn get_item_of(&self, target: &Target) -> Result<Option<Item>, StoreError> {
        let read = self.client.get_item().table_name(&target.table).set_key(Some(key_of(target))).consistent_read(true);
        Ok(read.send().await.map_err(unavailable)?.item.filter(|item| !item.is_empty()))
    }
}

/// How a commit that keeps its key in its item was answered.
enum Sent {
    /// It applied: the update and the key.
    Applied,
    /// Its condition did not hold: the item as it stood (`None` for no item).
    Refused(Option<Item>),
}

/// What keeping `key` in the item changes as `judged` says: the conditions
/// that the item's window is the one `judged` is for and holds no key of
/// the commit, the attributes set and those added to.
fn window_change(
    expression: &mut Expression,
    key: &KeyInItem,
    judged: InItem,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let (current, before, since) = (expression.name(KEYS), expression.name(KEYS_BEFORE), expression.name(KEYS_SINCE));
    let digests = expression.value(AttributeValue::Ss(vec![key.digest.clone()]));
    // Aliased only where a condition names it: DynamoDB refuses a value no expression uses.
    let mut digest = || expression.value(AttributeValue::S(key.digest.clone()));
    let (mut set, mut add) = (Vec::new(), Vec::new());
    let mut conditions = Vec::new();
    match judged {
        InItem::SameWindow => {
            let digest = digest();
            let over = expression.value(n(key.memories_ago_ms(1)));
            // A window begun too late for the commit holds for no send of it (KeyInItem::too_late_from_ms).
            let late = expression.value(n(key.too_late_from_ms()));
            let most = expression.value(n(MAX_KEYS_PER_WINDOW));
            conditions.push(format!(
                "{since} > {over} AND {since} < {late} AND NOT contains({current}, {digest}) AND NOT \
                     contains({before}, {digest}) AND size({current}) < {most}"
            ));
            add.push(format!("{current} {digests}"));
        }
        InItem::NextWindow => {
            let digest = digest();
            let (over, forgotten) =
                (expression.value(n(key.memories_ago_ms(1))), expression.value(n(key.memories_ago_ms(2))));
            conditions
                .push(format!("{since} <= {over} AND {since} > {forgotten} AND NOT contains({current}, {digest})"));
            let now = expression.value(n(key.now_ms));
            set.extend([format!("{before} = {current}"), format!("{current} = {digests}"), format!("{since} = {now}")]);
        }
        // A duplicate, a full window or a late one is never sent: judged from the item, answered from it.
        InItem::Fresh | InItem::Duplicate | InItem::Full | InItem::Late => {
            let forgotten = expression.value(n(key.memories_ago_ms(2)));
            conditions.push(format!("(attribute_not_exists({since}) OR {since} <= {forgotten})"));
            let (nothing, now) =
                (expression.value(AttributeValue::Ss(vec![NO_KEY.to_owned()])), expression.value(n(key.now_ms)));
            set.extend([format!("{before} = {nothing}"), format!("{current} = {digests}"), format!("{since} = {now}")]);
        }
    }
    (conditions, set, add)
}

/// The key of the item `target` names, as DynamoDB takes it.
fn key_of(target: &Target) -> Item {
    target.key.attributes().iter().map(|(name, value)| (name.clone(), attribute_value(value))).collect()
}
