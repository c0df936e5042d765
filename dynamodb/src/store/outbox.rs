//! The DynamoDB store's outbox: the item that holds an entry, and the
//! requests that list, take over and delete entries.
//!
//! An outbox item lives in the claim table beside the claims, in the sparse
//! open-claims index under `OUTBOX#<shard>` until it is sent, without a
//! status or an expiry (the table's TTL never deletes an unsent message,
//! and Powertools' readers never meet one). A run's entries share a shard
//! (the shard of the run, not of the entry: items written before kept the
//! entry's), so that a page of a shard, in id order, holds a run whole.
//!
//! The entry item is written once, by the commit, under the committing
//! run's lease. A sweeper that takes an entry over writes its sending lease
//! to an item of its own (the entry's id and [`LEASE_SUFFIX`], beside the
//! entry in the index) rather than rewrite the entry: DynamoDB charges a
//! write by the whole item's size, in the table and in the index, so a
//! refused backlog of 100 KB messages taken over by every sweep cost some
//! 200 write units an entry a sweep; a lease costs one, and one in the index.
//!
//! A sweep reads a bounded page of each shard ([`SWEEP_PAGE`] items, and at
//! most DynamoDB's megabyte), starting where the last sweep's page ended,
//! whichever process swept last (the position is an item of the table), and
//! wrapping around at the end: a backlog that cannot be sent (a deleted
//! queue, a removed permission) neither runs the function out of memory nor
//! hides the entries behind it, from a warm process or a cold one. An item
//! that cannot be read (a destination this version does not know, after a
//! rollback) is skipped and logged, and the rest are sent.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use futures::StreamExt;

use super::{DynamoDbStore, claims::released_unless};
use crate::{
    client::{Conditional, conditional, no_such_index, unavailable},
    layout::{
        CLAIMED_AT, Item, MESSAGE_ID, OPEN_INDEX, OPEN_SHARDS, OPEN_STATUS, TOKEN, TableLayout, n, s, shard_of,
        sharded, text,
    },
    statements::Written,
};
use sqs_once_core::store::{Fenced, OutboxEntry, OutboxQuery, StoreError, SweepPart, UnreadableEntry};

/// The [`OPEN_STATUS`] prefix of outbox entries: unsent messages are open
/// work too, and the index lists them without reading the table.
const OUTBOX_STATUS: &str = "OUTBOX";

/// The attribute that holds an outbox entry (its message, as JSON); only
/// outbox items have it.
const OUTBOX: &str = "outbox";

/// The attribute of an outbox item that holds its message's body.
const OUTBOX_BODY: &str = "body";

/// The suffix of a sending lease's item id: its entry's id and this.
/// Without a `#`, it sorts right after its entry, in its entry's run, so a
/// sweep page holds an entry and its lease together.
const LEASE_SUFFIX: &str = "~lease";

/// The attribute that marks a sending lease's item: the id of the entry it
/// leases.
const LEASE_OF: &str = "outbox_lease_of";

/// How long a lease's item is kept once its lease ended, for the table's
/// TTL: the item of a lease whose entry its committing run sent and deleted
/// meanwhile goes by itself. Listings ignore a lease without its entry.
const LEASE_ITEM_KEPT_S: u64 = 24 * 3600;

/// What a sweep's listing reads of an entry's item, and of a lease's:
/// every attribute that choosing what to send needs, not the message's body
/// ([`OUTBOX_BODY`]), which the take reads ([`DynamoDbStore::take_outbox_entry`]).
/// A sweep then holds the bodies of the entries it is sending, not those of
/// every entry of its part (16 MB of them, of a backlog of 100 KB messages).
const SWEEP_LISTED: &str = "#listed_id, #listed_token, #listed_lease, #listed_outbox, #listed_of";

/// Every [`OPEN_STATUS`] value of outbox entries.
fn outbox_partitions() -> impl Iterator<Item = String> {
    (0..OPEN_SHARDS).map(|shard| shard_of(OUTBOX_STATUS, shard))
}

/// Items a sweep reads of each shard at most: 16 shards of 100, or of
/// DynamoDB's one megabyte a page, whichever is less. A run has fewer
/// entries than this (a transaction holds 100 actions, one the claim's).
pub(super) const SWEEP_PAGE: i32 = 100;

/// The item that keeps where each shard's next sweep page starts, for
/// every sweeper: a cold process goes on where the last sweep, anyone's,
/// left off. Its id has no `#`, so no claim's (`<prefix>#<key>`) or entry's
/// id is ever it; it has no status, no outbox entry and no expiry, so no
/// listing reads it and the TTL keeps it.
const POSITION_ID: &str = "sqs-once.outbox-sweep-position";

/// The attribute of the position item: shard → the id its next page starts
/// after. A shard it does not name starts at its start. In the scan's
/// position item: the key the next scan starts after.
const POSITION_AFTER: &str = "after";

/// The attribute of a position item that counts its writes: a sweeper
/// keeps the position it reached only if no other sweeper kept one since it
/// read it, so a slow sweeper never moves it back.
const POSITION_VERSION: &str = "version";

/// The item that keeps where the next sweep's scan of a table without the
/// index starts, as [`POSITION_ID`] does for the index's pages.
const SCAN_POSITION_ID: &str = "sqs-once.outbox-sweep-scan-position";

/// What this process's sweeps keep between the parts they read.
#[derive(Debug, Default)]
pub(super) struct SweepProgress {
    /// The shards read to their end since the last pass over the whole
    /// outbox ended (see [`SweepPart::passed`]).
    ended: Mutex<HashSet<String>>,
    /// Where the part after the one last read starts, kept once its sweep
    /// handled it ([`OutboxStore::sweep_part_handled`](sqs_once_core::store::OutboxStore::sweep_part_handled)).
    next: Mutex<Option<NextPart>>,
}

/// Where a sweep's next part starts, once the one read is handled.
#[derive(Debug)]
struct NextPart {
    /// The position item: [`POSITION_ID`] or [`SCAN_POSITION_ID`].
    id: &'static str,
    /// Its `after` (each shard's next start, or the scan's start key), the
    /// start when `None`.
    after: Option<Item>,
    /// Its version as read, `None` when it had none.
    read: Option<u64>,
}

/// A position item as read: where the next part starts, and its version.
#[derive(Debug, Default)]
struct Position {
    after: Option<Item>,
    version: Option<u64>,
}

/// One shard's sweep page: the entries its items hold, and the id the next
/// page starts after (`None`: the page reached the shard's end).
struct SweepPage {
    shard: String,
    entries: Vec<OutboxEntry>,
    next: Option<String>,
}

/// The run an outbox entry id belongs to: its id up to its place in the run
/// (`<claim>#outbox#<token>#`).
pub(super) fn run_of(id: &str) -> &str {
    id.rfind('#').map_or(id, |end| &id[..=end])
}

impl TableLayout {
    /// The attribute names [`SWEEP_LISTED`] stands for.
    fn sweep_listed_names(&self) -> [(&'static str, &str); 5] {
        [
            ("#listed_id", &self.attributes.id),
            ("#listed_token", TOKEN),
            ("#listed_lease", &self.attributes.lease),
            ("#listed_outbox", OUTBOX),
            ("#listed_of", LEASE_OF),
        ]
    }

    /// The item that stores an outbox entry: no status and no expiry (the
    /// table's TTL never deletes an unsent message), in the open-claims
    /// index under `OUTBOX#<shard>`. The message's body is an attribute of
    /// its own, as it is: inside the entry's JSON, every quote of a JSON body
    /// would be escaped, and a body that fits an item would not.
    pub(super) fn outbox_item(&self, entry: &OutboxEntry) -> Result<Item, StoreError> {
        let mut described = entry.clone();
        let body = std::mem::take(&mut described.message.body);
        let text = serde_json::to_string(&described).map_err(StoreError::unavailable)?;
        let mut item = self.key(&entry.id);
        item.extend([
            (OPEN_STATUS.to_owned(), s(sharded(OUTBOX_STATUS, run_of(&entry.id)))),
            (TOKEN.to_owned(), s(&entry.token)),
            (self.attributes.lease.clone(), n(entry.lease_until_ms)),
            (MESSAGE_ID.to_owned(), s(&entry.message_id)),
            (CLAIMED_AT.to_owned(), n(entry.created_at_ms)),
            (OUTBOX.to_owned(), s(text)),
            (OUTBOX_BODY.to_owned(), s(body)),
        ]);
        Ok(item)
    }

    /// The outbox entry `item` stores, its lease as the item holds it. An
    /// item written before the body had an attribute of its own holds it in
    /// the entry's JSON.
    pub(super) fn read_outbox(&self, item: &Item) -> Result<OutboxEntry, StoreError> {
        let id = text(item, &self.attributes.id).unwrap_or_default();
        let malformed = |reason: String| StoreError::Malformed { id: id.clone(), reason };
        let entry = text(item, OUTBOX).ok_or_else(|| malformed("not an outbox entry".into()))?;
        let mut entry: OutboxEntry = serde_json::from_str(&entry).map_err(|error| malformed(error.to_string()))?;
        if let Some(body) = text(item, OUTBOX_BODY) {
            entry.message.body = body;
        }
        let lease_until_ms = match item.get(&self.attributes.lease) {
            Some(AttributeValue::N(value)) => value.parse().map_err(|_| malformed("lease is not a number".into()))?,
            _ => entry.lease_until_ms,
        };
        Ok(OutboxEntry { token: text(item, TOKEN).unwrap_or(entry.token), lease_until_ms, ..entry })
    }
}

/// Whether `item` holds an outbox entry, not a claim.
pub(super) fn is_outbox(item: &Item) -> bool {
    item.contains_key(OUTBOX)
}

/// Whether `item` holds an outbox entry's sending lease.
fn is_lease(item: &Item) -> bool {
    item.contains_key(LEASE_OF)
}

/// The id of the item that holds the sending lease of the entry `id`.
pub(super) fn lease_id(id: &str) -> String {
    format!("{id}{LEASE_SUFFIX}")
}

/// Those of `entries` that `query` asks for, oldest run first.
fn oldest_first(mut entries: Vec<OutboxEntry>, query: &OutboxQuery) -> Vec<OutboxEntry> {
    entries.retain(|entry| query.due_at_ms.is_none_or(|now_ms| entry.is_due(now_ms)));
    entries.sort_by(|left, right| (left.created_at_ms, &left.id).cmp(&(right.created_at_ms, &right.id)));
    entries.truncate(query.limit);
    entries
}

/// A sending lease as its item holds it.
struct SendingLease {
    token: String,
    until_ms: u64,
}

impl SendingLease {
    /// The lease `item` holds; `None` for an item changed by hand, whose
    /// entry is then listed under the lease it holds itself.
    fn read(item: &Item, lease_attribute: &str) -> Option<Self> {
        let until_ms = item.get(lease_attribute)?.as_n().ok()?.parse().ok()?;
        Some(Self { token: text(item, TOKEN)?, until_ms })
    }
}

impl DynamoDbStore {
    /// [`OutboxStore::entries`](sqs_once_core::store::OutboxStore::entries): every
    /// entry of the index's `OUTBOX` partitions, or of the whole table when
    /// it has no index.
    pub(super) async fn outbox_entries(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>, StoreError> {
        let listed = self.query_partitions(outbox_partitions()).await?;
        self.outbox_listing(listed, query).await
    }

    /// [`OutboxStore::sweep_part`](sqs_once_core::store::OutboxStore::sweep_part):
    /// a page of each shard of the index's `OUTBOX` partitions, from where
    /// the last sweep's ended; as much of the table when it has no index.
    pub(super) async fn outbox_sweep_part(&self, limit: usize) -> Result<SweepPart, StoreError> {
        let (entries, passed) = match self.sweep_pages().await? {
            Some(pages) => pages,
            None => {
                let (items, passed) = self.sweep_scan(limit).await?;
                (self.readable_entries(&items), passed)
            }
        };
        Ok(SweepPart::new(oldest_first(entries, &OutboxQuery { due_at_ms: None, limit }), passed))
    }

    /// The outbox items of a part of a table without the index: up to as
    /// many pages of a `Scan` as the index's shards (16 MB at most) and
    /// `limit` items, from where the last sweep's scan ended (kept in an
    /// item of its own), and whether it reached the table's end.
    async fn sweep_scan(&self, limit: usize) -> Result<(Vec<Item>, bool), StoreError> {
        tracing::warn!(
            table = %self.layout.table,
            "the table has no {OPEN_INDEX} index: a sweep reads up to 16 MB of the whole table for outbox entries \
             (create-table makes it)"
        );
        let position = self.position(SCAN_POSITION_ID).await;
        let mut start = position.after;
        let mut items = Vec::new();
        for _ in 0..OPEN_SHARDS {
            // Limit counts the items read, before the filter: never more than `limit` come back.
            let left = i32::try_from(limit.saturating_sub(items.len())).unwrap_or(i32::MAX);
            if left == 0 {
                break;
            }
            let mut scan = self
                .client
                .scan()
                .table_name(&self.layout.table)
                .filter_expression("attribute_exists(#outbox) OR attribute_exists(#lease_of)")
                .expression_attribute_names("#outbox", OUTBOX)
                .expression_attribute_names("#lease_of", LEASE_OF)
                .projection_expression(SWEEP_LISTED)
                .set_exclusive_start_key(start.take())
                .limit(left);
            for (name, attribute) in self.layout.sweep_listed_names() {
                scan = scan.expression_attribute_names(name, attribute);
            }
            let page = scan.send().await.map_err(unavailable)?;
            items.extend(page.items.unwrap_or_default());
            start = page.last_evaluated_key;
            if start.is_none() {
                break;
            }
        }
        let ended = start.is_none();
        *self.outbox_progress.next.lock() =
            Some(NextPart { id: SCAN_POSITION_ID, after: start, read: position.version });
        Ok((items, ended))
    }

    /// Where the next sweep part starts, as the position item `id` keeps it
    /// for every sweeper; the start when there is none or it cannot be read.
    async fn position(&self, id: &str) -> Position {
        let key = self.layout.key(id);
        let read = self.client.get_item().table_name(&self.layout.table).set_key(Some(key)).send().await;
        let mut item = match read {
            Ok(output) => output.item.unwrap_or_default(),
            Err(error) => {
                tracing::warn!(error = %unavailable(error), "outbox: cannot read where the last sweep ended; sweeping from the start");
                return Position::default();
            }
        };
        let version = item.get(POSITION_VERSION).and_then(|version| version.as_n().ok()?.parse().ok());
        match item.remove(POSITION_AFTER) {
            Some(AttributeValue::M(after)) => Position { after: Some(after), version },
            _ => Position { after: None, version },
        }
    }

    /// [`OutboxStore::sweep_part_handled`](sqs_once_core::store::OutboxStore::sweep_part_handled):
    /// keeps where the part after the one last read starts, unless another
    /// sweeper kept a position since this one read it (it is further on, or
    /// reads the same part again: either way rework, never an entry
    /// skipped). One that cannot be kept is logged: the next sweep reads the
    /// same part again.
    pub(super) async fn keep_sweep_position(&self) {
        let Some(NextPart { id, after, read }) = self.outbox_progress.next.lock().take() else { return };
        let mut item = self.layout.key(id);
        item.insert(POSITION_VERSION.to_owned(), AttributeValue::N((read.unwrap_or(0) + 1).to_string()));
        if let Some(after) = after {
            item.insert(POSITION_AFTER.to_owned(), AttributeValue::M(after));
        }
        let put = self.client.put_item().table_name(&self.layout.table).set_item(Some(item));
        let put = put.expression_attribute_names("#version", POSITION_VERSION);
        let put = match read {
            Some(read) => put
                .condition_expression("#version = :read")
                .expression_attribute_values(":read", AttributeValue::N(read.to_string())),
            None => put.condition_expression("attribute_not_exists(#version)"),
        };
        match conditional(put.send().await) {
            Ok(Conditional::Applied) => {}
            Ok(Conditional::Refused(_)) => {
                tracing::debug!(
                    "outbox: another sweeper kept where its sweep ended since this one read it; theirs stands"
                );
            }
            Err(error) => {
                tracing::warn!(%error, "outbox: cannot keep where this sweep ended; the next one reads the same part");
            }
        }
    }

    /// [`OutboxStore::unreadable`](sqs_once_core::store::OutboxStore::unreadable):
    /// the items of the index's `OUTBOX` partitions (of the whole table when
    /// it has no index) that cannot be read.
    pub(super) async fn unreadable_outbox(&self, limit: usize) -> Result<Vec<UnreadableEntry>, StoreError> {
        let listed = self.query_partitions(outbox_partitions()).await?;
        let items = self.outbox_items(listed).await?;
        Ok(self.read_entries(&items).filter_map(Result::err).take(limit).collect())
    }

    /// The entries `items` hold, each under the sending lease of its lease's
    /// item when `items` hold one, or why an entry cannot be read.
    fn read_entries<'a>(
        &'a self,
        items: &'a [Item],
    ) -> impl Iterator<Item = Result<OutboxEntry, UnreadableEntry>> + 'a {
        let leases: HashMap<String, SendingLease> = items
            .iter()
            .filter_map(|item| Some((text(item, LEASE_OF)?, SendingLease::read(item, &self.layout.attributes.lease)?)))
            .collect();
        items.iter().filter(|item| !is_lease(item)).map(move |item| {
            let entry = self.read_outbox_item(item)?;
            Ok(match leases.get(&entry.id) {
                Some(lease) => OutboxEntry { token: lease.token.clone(), lease_until_ms: lease.until_ms, ..entry },
                None => entry,
            })
        })
    }

    /// The entries of `listed` items (the whole table's when there is no
    /// index) that `query` asks for, oldest run first. Items that cannot be
    /// read are skipped, and logged.
    async fn outbox_listing(
        &self,
        listed: Option<Vec<Item>>,
        query: &OutboxQuery,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        let items = self.outbox_items(listed).await?;
        Ok(oldest_first(self.readable_entries(&items), query))
    }

    /// The entries `items` hold that can be read; the others are skipped,
    /// and logged.
    fn readable_entries(&self, items: &[Item]) -> Vec<OutboxEntry> {
        self.read_entries(items).filter_map(|entry| entry.inspect_err(UnreadableEntry::skipped).ok()).collect()
    }

    /// The outbox items `listed` from the index, or, when the table has no
    /// index (`None`), those of the whole table.
    async fn outbox_items(&self, listed: Option<Vec<Item>>) -> Result<Vec<Item>, StoreError> {
        if let Some(items) = listed {
            return Ok(items);
        }
        tracing::warn!(
            table = %self.layout.table,
            "the table has no {OPEN_INDEX} index: reading the whole table for outbox entries"
        );
        Ok(self.scan_items().await?.into_iter().filter(|item| is_outbox(item) || is_lease(item)).collect())
    }

    /// The entry `item` holds, or why it cannot be read.
    fn read_outbox_item(&self, item: &Item) -> Result<OutboxEntry, UnreadableEntry> {
        self.layout.read_outbox(item).map_err(|error| {
            let reason = match error {
                StoreError::Malformed { reason, .. } => reason,
                other => other.to_string(),
            };
            let id = text(item, &self.layout.attributes.id).unwrap_or_default();
            UnreadableEntry::new(id, text(item, TOKEN).unwrap_or_default(), reason)
        })
    }

    /// A page of every outbox shard, from where the last sweep's ended,
    /// and whether this process's sweeps have now read every shard to its
    /// end since their last pass; `None` when the table has no index. The
    /// position goes on once the sweep handled the pages
    /// ([`keep_sweep_position`](Self::keep_sweep_position)), and only if every
    /// page was read: a shard that failed is read again from where it was.
    async fn sweep_pages(&self) -> Result<Option<(Vec<OutboxEntry>, bool)>, StoreError> {
        let position = self.position(POSITION_ID).await;
        let positions: HashMap<String, String> = position
            .after
            .iter()
            .flatten()
            .filter_map(|(shard, id)| Some((shard.clone(), id.as_s().ok()?.clone())))
            .collect();
        let pages = outbox_partitions().map(|shard| {
            let after = positions.get(&shard).cloned();
            self.sweep_page(shard, after)
        });
        let pages: Vec<_> = futures::stream::iter(pages).buffer_unordered(8).collect().await;
        let (mut entries, mut next, mut ended) = (Vec::new(), HashMap::new(), Vec::new());
        for page in pages {
            let Some(page) = page? else { return Ok(None) };
            entries.extend(page.entries);
            match page.next {
                Some(after) => drop(next.insert(page.shard, after)),
                None => ended.push(page.shard),
            }
        }
        *self.outbox_progress.next.lock() = (next != positions).then(|| {
            let after = next.into_iter().map(|(shard, id)| (shard, s(id))).collect();
            NextPart { id: POSITION_ID, after: Some(after), read: position.version }
        });
        let mut passes = self.outbox_progress.ended.lock();
        passes.extend(ended);
        let passed = passes.len() >= outbox_partitions().count();
        if passed {
            passes.clear();
        }
        Ok(Some((entries, passed)))
    }

    /// One page of `shard`, after `after` (or from its start), its last run
    /// left for the next page when the page is full (a run may go on beyond
    /// it); `None` when the table has no index.
    async fn sweep_page(&self, shard: String, after: Option<String>) -> Result<Option<SweepPage>, StoreError> {
        let mut request = self
            .client
            .query()
            .table_name(&self.layout.table)
            .index_name(OPEN_INDEX)
            .expression_attribute_names("#open", OPEN_STATUS)
            .expression_attribute_values(":shard", s(&shard))
            .projection_expression(SWEEP_LISTED)
            .limit(SWEEP_PAGE);
        for (name, attribute) in self.layout.sweep_listed_names() {
            request = request.expression_attribute_names(name, attribute);
        }
        request = match &after {
            Some(after) => request
                .key_condition_expression("#open = :shard AND #id > :after")
                .expression_attribute_names("#id", &self.layout.attributes.id)
                .expression_attribute_values(":after", s(after)),
            None => request.key_condition_expression("#open = :shard"),
        };
        let page = match request.send().await {
            Ok(page) => page,
            Err(error) if no_such_index(&error) => return Ok(None),
            Err(error) => return Err(unavailable(error)),
        };
        let mut items = page.items.unwrap_or_default();
        let id = |item: &Item| text(item, &self.layout.attributes.id).unwrap_or_default();
        let next = match page.last_evaluated_key {
            // The shard is read to its end: the next page starts at its start.
            None => None,
            Some(_) => {
                let last_run = items.last().map(|item| run_of(&id(item)).to_owned()).unwrap_or_default();
                let whole = items.iter().position(|item| run_of(&id(item)) == last_run).unwrap_or(0);
                if whole > 0 {
                    items.truncate(whole);
                }
                // After every id of the last run held whole: its prefix, then a character above the digits.
                items.last().map(|item| format!("{}~", run_of(&id(item))))
            }
        };
        // Read as each page arrives, its items dropped then: a sweep holds its part's entries, not every page's
        // items beside them. A run's entries and their leases share its page.
        Ok(Some(SweepPage { shard, entries: self.readable_entries(&items), next }))
    }

    /// Gives the entry's sending lease to `token`, if it still has the token
    /// it was listed with: writes the lease's item, never the entry. The
    /// entry is then read, consistently, and returned whole under the new
    /// lease (a sweep's listing leaves the body out): one sent and deleted
    /// since it was listed (which the index shows late) is not sent again.
    pub(super) async fn take_outbox_entry(
        &self,
        entry: &OutboxEntry,
        token: &str,
        lease_until_ms: u64,
    ) -> Result<Option<OutboxEntry>, StoreError> {
        if let Conditional::Refused(_) = self.write_lease(entry, token, lease_until_ms).await? {
            return Ok(None);
        }
        if let Some(item) = self.get_item(&entry.id).await?.filter(is_outbox) {
            let taken = self.layout.read_outbox(&item)?;
            return Ok(Some(OutboxEntry { token: token.to_owned(), lease_until_ms, ..taken }));
        }
        self.release_lease(&entry.id, token).await?;
        Ok(None)
    }

    /// Gives `entry`'s lease up until `retry_at_ms`, after `failed_sends`
    /// ([`OutboxStore::release_entry`](sqs_once_core::store::OutboxStore::release_entry)):
    /// its lease's item, written as a take writes it, without the take's
    /// read of the entry.
    pub(super) async fn release_outbox_entry(
        &self,
        entry: &OutboxEntry,
        failed_sends: u32,
        retry_at_ms: u64,
    ) -> Result<Fenced, StoreError> {
        let token = OutboxEntry::released_token(failed_sends);
        Ok(match self.write_lease(entry, &token, retry_at_ms).await? {
            Conditional::Applied => Fenced::Applied,
            Conditional::Refused(_) => Fenced::Refused,
        })
    }

    /// Writes `entry`'s lease's item for `token` until `lease_until_ms`, if
    /// no one has taken it since it was listed (the token it was listed with
    /// holds it, or no lease's item does: the committing run's lease is in the
    /// entry).
    async fn write_lease(
        &self,
        entry: &OutboxEntry,
        token: &str,
        lease_until_ms: u64,
    ) -> Result<Conditional, StoreError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.layout.key(&lease_id(&entry.id))))
            .update_expression("SET #open = :shard, #of = :entry, #token = :new, #lease = :until, #expiry = :expiry")
            .condition_expression("attribute_not_exists(#token) OR #token = :seen")
            .expression_attribute_names("#open", OPEN_STATUS)
            .expression_attribute_names("#of", LEASE_OF)
            .expression_attribute_names("#token", TOKEN)
            .expression_attribute_names("#lease", &self.layout.attributes.lease)
            .expression_attribute_names("#expiry", &self.layout.attributes.expiry)
            .expression_attribute_values(":shard", s(sharded(OUTBOX_STATUS, run_of(&entry.id))))
            .expression_attribute_values(":entry", s(&entry.id))
            .expression_attribute_values(":new", s(token))
            .expression_attribute_values(":until", n(lease_until_ms))
            .expression_attribute_values(":expiry", n(lease_until_ms / 1000 + LEASE_ITEM_KEPT_S))
            .expression_attribute_values(":seen", s(&entry.token))
            .send()
            .await;
        conditional(result)
    }

    /// Deletes the sent entry `id` if `token` holds its sending lease or
    /// committed it. A sweeper's lease is its lease's item: the entry goes
    /// first, then the lease, so that no other sweeper finds the entry
    /// without a lease in between and takes and sends it again (a lease
    /// without its entry is taken by no one: a take finds no entry to send).
    /// (A sender's lease an earlier version kept in the entry is its sender's
    /// too: the entry it sent goes.) The committing run's lease is the
    /// entry's own token, checked by the entry's deletion. One that is gone
    /// counts as deleted.
    pub(super) async fn delete_outbox_entry(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        if token != OutboxEntry::committing_token(id) {
            self.delete_sent(id, None).await?;
            return Ok(match self.release_lease(id, token).await {
                Ok(Conditional::Refused(Some(_))) => Fenced::Refused,
                Ok(_) => Fenced::Applied,
                Err(error) => {
                    tracing::debug!(id, %error, "outbox: the sent entry is deleted; its lease's item is left to its TTL");
                    Fenced::Applied
                }
            });
        }
        if let Some(batches) = self.batched() {
            let deleted = batches.write(|| self.layout.delete_outbox(id, token)).await;
            let deleted = match deleted {
                Ok(Written::Applied) => Ok(Fenced::Applied),
                Ok(Written::Refused(returned)) => {
                    Ok(released_unless(batches.refused_item(id, returned).await?.as_ref()))
                }
                Err(error) => Err(error),
            };
            if let Some(deleted) = batches.or_single(deleted) {
                return deleted;
            }
        }
        self.delete_sent(id, Some(token)).await
    }

    /// Deletes the entry `id`, if it is still leased to `token` when one is
    /// given. Refused without an item: the entry is gone, deleted by an
    /// earlier attempt, which counts as deleted.
    async fn delete_sent(&self, id: &str, token: Option<&str>) -> Result<Fenced, StoreError> {
        let mut request = self.client.delete_item().table_name(&self.layout.table).set_key(Some(self.layout.key(id)));
        if let Some(token) = token {
            request = request
                .condition_expression("#token = :token")
                .expression_attribute_names("#token", TOKEN)
                .expression_attribute_values(":token", s(token))
                .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        }
        Ok(match conditional(request.send().await)? {
            Conditional::Refused(Some(_)) => Fenced::Refused,
            Conditional::Applied | Conditional::Refused(None) => Fenced::Applied,
        })
    }

    /// Deletes the item of `id`'s sending lease if `token` holds it: refused
    /// with the item when another sender holds it, without when there is none.
    async fn release_lease(&self, id: &str, token: &str) -> Result<Conditional, StoreError> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.layout.key(&lease_id(id))))
            .condition_expression("#token = :token")
            .expression_attribute_names("#token", TOKEN)
            .expression_attribute_values(":token", s(token))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        conditional(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outbox_item_keeps_its_body_apart_and_one_written_before_is_read_too() {
        let layout = TableLayout::new("claims");
        let message =
            sqs_once_core::transaction::Message::sqs("https://sqs.us-east-1.amazonaws.com/1/q", r#"{"a":"\"b\""}"#);
        let entry = OutboxEntry::of_run("c#k", "t", "m-1", std::slice::from_ref(&message), 5, 9).remove(0);
        let item = layout.outbox_item(&entry).unwrap();
        assert_eq!(text(&item, OUTBOX_BODY).as_deref(), Some(message.body.as_str()), "the body as it is");
        assert!(!text(&item, OUTBOX).unwrap().contains("\\\"b"), "and not again, escaped, in the JSON");
        assert_eq!(layout.read_outbox(&item).unwrap(), entry);
        // Written by a version that kept the body in the JSON.
        let mut before = item.clone();
        before.remove(OUTBOX_BODY);
        before.insert(OUTBOX.to_owned(), s(serde_json::to_string(&entry).unwrap()));
        assert_eq!(layout.read_outbox(&before).unwrap(), entry);
    }
}
