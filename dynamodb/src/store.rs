//! The production store: claims in a DynamoDB table.
//!
//! A claim is one conditional `PutItem` that asks for the old item back when
//! its condition fails (`ReturnValuesOnConditionCheckFailure = ALL_OLD`), so a
//! duplicate or a conflict costs one request. The condition is
//! [`StoredClaim::is_free`] written as a DynamoDB condition expression.
//! Completing, failing and releasing are an `UpdateItem` or `DeleteItem`
//! conditioned on the claim's token.
//!
//! By default the writes of records running at the same time go out
//! together, as PartiQL statements in `BatchExecuteStatement` (see
//! *Batched writes* below): a new record then costs about 2/25 of a request instead
//! of 2, at the same write units. A claim that finds the key taken reads the
//! record in a batched consistent read (about 1/100 of a request and one
//! read unit), since a refused statement may not return it.
//!
//! Attribute names default to those of Powertools for AWS Lambda (`id`,
//! `expiration`, `in_progress_expiration`, `status`, `data`, `validation`), so
//! a table can be shared with functions that use it; tables keyed by a static
//! partition value and a sort key are supported as Powertools supports them.
//! The reference (layout, requests, capacity, IAM) is docs/dynamodb.md, the
//! documentation of [`DynamoDbStore`].

//!
//! This crate is the store alone; use it through `sqs-once`, whose
//! `sqs_once::store` re-exports it.
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::{collections::HashMap, sync::Arc};

use async_trait::async_trait;
use aws_sdk_dynamodb::{
    Client,
    error::ProvideErrorMetadata,
    types::{AttributeValue, ReturnConsumedCapacity, ReturnValuesOnConditionCheckFailure},
};
use futures::StreamExt;

use self::statements::{Batches, Written};
use sqs_once_core::store::{
    Capabilities, ClaimAdmin, ClaimQuery, ClaimStatus, ClaimStore, Commit, CommitStore, Committed, Fenced, Finish,
    Listing, OutboxEntry, OutboxQuery, OutboxStore, PutOutcome, StoreError, StoredClaim, SweepPart, UnreadableEntry,
    replaced_id,
};

mod admin;
mod batched;
pub use admin::{Unusable, check_table};
mod client;
mod in_item;
mod layout;
mod outbox;
mod statements;
mod transact;

pub use client::{RequestCounter, client_from, with_limits};
pub use layout::{Attributes, TableKey, TableLayout};
pub(crate) use layout::{OPEN_INDEX, OPEN_STATUS, open_partition};

use client::{Conditional, conditional, described, unavailable};
use layout::{ERROR, TOKEN, UPDATED_AT, attribute_value, n, open_partitions, s, text};

/// The key [`ClaimStore::connect`] reads: only read, so whether a record
/// holds it matters not.
const CONNECT_KEY: &str = "sqs-once:connect";

/// A DynamoDB item: attribute names and values.
type Item = HashMap<String, AttributeValue>;

/// Claims in a DynamoDB table: the production store, which
/// `SQS_ONCE_TABLE` chooses. Built in code, it takes a client of one's own
/// (another endpoint, other credentials):
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use sqs_once::{Consumer, handler_fn, store::{DynamoDbStore, TableLayout}};
///
/// let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
/// let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&aws), TableLayout::new("idempotency"));
/// store.create_table().await?;
/// let handler = handler_fn(|_| async { Ok(None) });
/// let consumer = Consumer::builder().store(Arc::new(store)).build(handler).await?;
/// # Ok(())
/// # }
/// ```
///
#[doc = include_str!("../docs/dynamodb.md")]
#[derive(Debug, Clone)]
pub struct DynamoDbStore {
    client: Client,
    layout: Arc<TableLayout>,
    return_old_item: bool,
    batches: Option<Arc<Batches>>,
    /// The outbox shards this process's sweeps read to their end since
    /// their last pass (see [`outbox::SweepPasses`]).
    outbox_passes: Arc<outbox::SweepPasses>,
    /// The windows of the items whose keys this process's commits kept (see
    /// [`in_item`]).
    windows: Arc<in_item::Windows>,
}

impl DynamoDbStore {
    /// A store on `layout.table`, through `client`, batching its writes.
    pub fn new(client: Client, layout: TableLayout) -> Self {
        let layout = Arc::new(layout);
        let batches = Some(Arc::new(Batches::new(&client, &layout)));
        Self { client, layout, return_old_item: true, batches, outbox_passes: Arc::default(), windows: Arc::default() }
    }

    /// Whether the writes of concurrent records go out together in
    /// `BatchExecuteStatement` requests (on by default), or each in a request
    /// of its own. Batching needs `dynamodb:PartiQLInsert`, `PartiQLUpdate`,
    /// `PartiQLDelete` and `BatchGetItem` on the table; denied them (or
    /// refused them in any way single requests would not be refused), the
    /// store says so once and makes single requests.
    pub fn batching(mut self, batching: bool) -> Self {
        let batches = self.batches.take().unwrap_or_else(|| Arc::new(Batches::new(&self.client, &self.layout)));
        self.batches = batching.then_some(batches);
        self
    }

    /// Whether a failed claim asks DynamoDB for the item that holds the key
    /// (on by default). Off, the state machine reads it with a consistent
    /// `GetItem`, as it must with servers that do not return it.
    pub fn returning_old_item(mut self, return_old_item: bool) -> Self {
        self.return_old_item = return_old_item;
        self
    }

    /// The table layout.
    pub fn layout(&self) -> &TableLayout {
        &self.layout
    }

    /// The returned old item says whether a refused finishing write had in
    /// fact been applied by an earlier attempt whose answer was lost.
    fn already_finished(&self, old: Option<&Item>, token: &str, status: Option<ClaimStatus>) -> Fenced {
        let names = &self.layout.attributes;
        let ours = old.is_some_and(|old| text(old, TOKEN).as_deref() == Some(token));
        let settled = old.and_then(|old| text(old, &names.status)).and_then(|stored| ClaimStatus::parse(&stored));
        if ours && settled == status { Fenced::Applied } else { Fenced::Refused }
    }
}

// The single requests are boxed apart: an SDK call's future is several KiB,
// and inline it would make every call's future (boxed by `async_trait`) that
// large, though with batching on the common path needs a tenth of it.
#[async_trait]
impl ClaimStore for DynamoDbStore {
    async fn put_if_free(&self, claim: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        if let Some(batches) = self.batched()
            && let Some(outcome) = batches.or_single(self.put_batched(batches, claim, now_ms).await)
            && let Some(outcome) = outcome?
        {
            return Ok(outcome);
        }
        Box::pin(self.put_one(claim, now_ms)).await
    }

    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        if let Some(batches) = self.batched()
            && let Some(item) = batches.or_single(batches.reads.submit(id.to_owned()).await)
        {
            return item?.map(|item| self.layout.read_item(&item)).transpose();
        }
        Box::pin(self.get_one(id)).await
    }

    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        if let Some(batches) = self.batched()
            && let Some(fenced) = batches.or_single(self.finish_batched(batches, id, token, finish).await)
        {
            return fenced;
        }
        Box::pin(self.finish_one(id, token, finish)).await
    }

    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        if let Some(batches) = self.batched()
            && let Some(fenced) = batches.or_single(self.release_batched(batches, id, token).await)
        {
            return fenced;
        }
        Box::pin(self.release_one(id, token)).await
    }

    fn expedite(&self, until: tokio::time::Instant) {
        if let Some(batches) = self.batched() {
            batches.expedite(until);
        }
    }

    fn gathers_calls(&self) -> bool {
        self.batched().is_some()
    }

    /// Reads a key no record holds, as many times at once as the first
    /// requests of a kind go out at once: each read opens a connection (a
    /// TCP handshake, then TLS) and leaves it in the client's pool.
    async fn connect(&self) {
        let started = std::time::Instant::now();
        let reads = futures::future::join_all((0..statements::IN_FLIGHT).map(|_| self.get_item(CONNECT_KEY))).await;
        match reads.into_iter().find_map(Result::err) {
            Some(error) => tracing::warn!(%error, "could not open connections to DynamoDB ahead of the first batch"),
            None => tracing::debug!(
                connections = statements::IN_FLIGHT,
                elapsed_ms = started.elapsed().as_millis(),
                "connections to DynamoDB opened"
            ),
        }
    }

    fn capabilities(self: Arc<Self>) -> Capabilities {
        Capabilities::all(self)
    }
}

#[async_trait]
impl ClaimAdmin for DynamoDbStore {
    async fn list(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
        // Only failed claims are in the open-claims index: one entry per
        // claim in progress would cost every record two more write units
        // (the claim adds it, the completion takes it out). Listing claims
        // in progress, or completed, reads the table, when an operator asks.
        let statuses = query.statuses();
        if statuses != [ClaimStatus::Failed] {
            return self.scan(query, &statuses).await;
        }
        let Some(items) = self.query_partitions(open_partitions(ClaimStatus::Failed)).await? else {
            tracing::warn!(
                table = %self.layout.table,
                "the table has no {OPEN_INDEX} index (see create-table or template.yaml): reading the whole table instead"
            );
            return self.scan(query, &statuses).await;
        };
        let mut records = Vec::new();
        for item in &items {
            let record = self.layout.read_item(item)?;
            if query.matches(&record) {
                records.push(record);
            }
        }
        Ok(query.select(records, false))
    }

    async fn replace_seen(
        &self,
        seen: Option<&StoredClaim>,
        record: Option<&StoredClaim>,
    ) -> Result<Fenced, StoreError> {
        let Some(id) = replaced_id(seen, record) else { return Ok(Fenced::Refused) };
        let names = &self.layout.attributes;
        let (condition, attribute_names, values) = match seen {
            None => ("attribute_not_exists(#id)", vec![("#id", names.id.as_str())], vec![]),
            Some(seen) => {
                let mut values = vec![(":seen_status", s(seen.status.as_str()))];
                let condition = match &seen.token {
                    Some(token) => {
                        values.push((":seen_token", s(token)));
                        "#status = :seen_status AND #token = :seen_token"
                    }
                    None => "#status = :seen_status AND attribute_not_exists(#token)",
                };
                (condition, vec![("#status", names.status.as_str()), ("#token", TOKEN)], values)
            }
        };
        let attribute_names: HashMap<String, String> =
            attribute_names.into_iter().map(|(alias, name)| (alias.to_owned(), name.to_owned())).collect();
        let values: HashMap<String, AttributeValue> =
            values.into_iter().map(|(alias, value)| (alias.to_owned(), value)).collect();
        let (names, values) = (Some(attribute_names), (!values.is_empty()).then_some(values));
        let answer = match record {
            Some(record) => {
                let put = self.client.put_item().set_item(Some(self.layout.write_item(record)));
                let put = put.table_name(&self.layout.table).condition_expression(condition);
                conditional(
                    put.set_expression_attribute_names(names).set_expression_attribute_values(values).send().await,
                )
            }
            None => {
                let delete = self.client.delete_item().set_key(Some(self.layout.key(id)));
                let delete = delete.table_name(&self.layout.table).condition_expression(condition);
                conditional(
                    delete.set_expression_attribute_names(names).set_expression_attribute_values(values).send().await,
                )
            }
        };
        Ok(match answer? {
            Conditional::Applied => Fenced::Applied,
            Conditional::Refused(_) => Fenced::Refused,
        })
    }
}

#[async_trait]
impl CommitStore for DynamoDbStore {
    async fn commit(&self, id: &str, token: &str, commit: &Commit) -> Result<Committed, StoreError> {
        match &commit.key_in_item {
            Some(key) => self.commit_in_item(commit, key).await,
            None => self.commit_transaction(id, token, commit).await,
        }
    }

    fn keeps_keys_in_items(&self) -> bool {
        true
    }
}

#[async_trait]
impl OutboxStore for DynamoDbStore {
    async fn entries(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>, StoreError> {
        self.outbox_entries(query).await
    }

    async fn sweep_listing(&self, limit: usize) -> Result<Vec<OutboxEntry>, StoreError> {
        Ok(self.outbox_sweep_part(limit).await?.entries)
    }

    async fn sweep_part(&self, limit: usize) -> Result<SweepPart, StoreError> {
        self.outbox_sweep_part(limit).await
    }

    async fn unreadable(&self, limit: usize) -> Result<Vec<UnreadableEntry>, StoreError> {
        self.unreadable_outbox(limit).await
    }

    async fn holds_entry(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.get_item(id).await?.is_some_and(|item| outbox::is_outbox(&item)))
    }

    async fn take_entry(
        &self,
        entry: &OutboxEntry,
        token: &str,
        lease_until_ms: u64,
    ) -> Result<Option<OutboxEntry>, StoreError> {
        self.take_outbox_entry(entry, token, lease_until_ms).await
    }

    async fn entry_sent(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        self.delete_outbox_entry(id, token).await
    }
}

impl DynamoDbStore {
    /// The batched requests, unless they are off or DynamoDB refused them.
    fn batched(&self) -> Option<&Batches> {
        self.batches.as_deref().filter(|batches| !batches.refused())
    }

    /// A claim as an `INSERT`; `None` when the key's record is free, which
    /// only the conditional `PutItem` can take over.
    async fn put_batched(
        &self,
        batches: &Batches,
        record: &StoredClaim,
        now_ms: u64,
    ) -> Result<Option<PutOutcome>, StoreError> {
        let insert = || self.layout.insert(record);
        let returned = match batches.write(insert).await? {
            Written::Applied => return Ok(Some(PutOutcome::Claimed)),
            Written::Refused(returned) => returned,
        };
        let old =
            batches.refused_item(&record.id, returned).await?.map(|item| self.layout.read_item(&item)).transpose()?;
        // Free, or gone since the insert: the conditional write settles it.
        Ok(old.filter(|old| !old.is_free(now_ms)).map(|old| PutOutcome::Taken(Some(Box::new(old)))))
    }

    /// The finishing write as an `UPDATE` statement.
    async fn finish_batched(
        &self,
        batches: &Batches,
        id: &str,
        token: &str,
        finish: &Finish,
    ) -> Result<Fenced, StoreError> {
        Ok(match batches.write(|| self.layout.finish(id, token, finish)).await? {
            Written::Applied => Fenced::Applied,
            Written::Refused(returned) => {
                let old = batches.refused_item(id, returned).await?;
                self.already_finished(old.as_ref(), token, Some(finish.status))
            }
        })
    }

    /// The releasing write as a `DELETE` statement.
    async fn release_batched(&self, batches: &Batches, id: &str, token: &str) -> Result<Fenced, StoreError> {
        Ok(match batches.write(|| self.layout.release(id, token)).await? {
            Written::Applied => Fenced::Applied,
            Written::Refused(returned) => released_unless(batches.refused_item(id, returned).await?.as_ref()),
        })
    }

    /// One conditional `PutItem`.
    async fn put_one(&self, record: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        let free = self.layout.free_condition(now_ms);
        let result = self
            .client
            .put_item()
            .table_name(&self.layout.table)
            .set_item(Some(self.layout.write_item(record)))
            .condition_expression(free.condition)
            .set_expression_attribute_names(Some(free.names))
            .set_expression_attribute_values(Some(free.values))
            .return_values_on_condition_check_failure(self.returned_values())
            .send()
            .await;
        Ok(match conditional(result)? {
            Conditional::Applied => PutOutcome::Claimed,
            Conditional::Refused(item) => {
                PutOutcome::Taken(item.map(|item| self.layout.read_item(&item)).transpose()?.map(Box::new))
            }
        })
    }

    /// What a refused conditional write asks DynamoDB to return.
    fn returned_values(&self) -> ReturnValuesOnConditionCheckFailure {
        if self.return_old_item {
            ReturnValuesOnConditionCheckFailure::AllOld
        } else {
            ReturnValuesOnConditionCheckFailure::None
        }
    }

    /// One consistent `GetItem`.
    async fn get_one(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        self.get_item(id).await?.map(|item| self.layout.read_item(&item)).transpose()
    }

    /// The item, as one consistent `GetItem` reads it.
    async fn get_item(&self, id: &str) -> Result<Option<Item>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.layout.key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(output.item.filter(|item| !item.is_empty()))
    }

    /// One conditional `UpdateItem`.
    async fn finish_one(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        let update = self.layout.finish_update(id, token, finish);
        let result = self
            .client
            .update_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.layout.key(id)))
            .update_expression(update.update)
            .condition_expression(update.condition)
            .set_expression_attribute_names(Some(update.names))
            .set_expression_attribute_values(Some(update.values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        Ok(match conditional(result)? {
            Conditional::Applied => Fenced::Applied,
            Conditional::Refused(item) => self.already_finished(item.as_ref(), token, Some(finish.status)),
        })
    }

    /// One conditional `DeleteItem`.
    async fn release_one(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.layout.key(id)))
            .condition_expression("#status = :inprogress AND #token = :token")
            .expression_attribute_names("#status", &self.layout.attributes.status)
            .expression_attribute_names("#token", TOKEN)
            .expression_attribute_values(":inprogress", s(ClaimStatus::InProgress.as_str()))
            .expression_attribute_values(":token", s(token))
            .return_values_on_condition_check_failure(self.returned_values())
            .send()
            .await;
        let old = match conditional(result)? {
            Conditional::Applied => return Ok(Fenced::Applied),
            Conditional::Refused(Some(item)) => Some(item),
            Conditional::Refused(None) if self.return_old_item => None,
            Conditional::Refused(None) => self.get_item(id).await?,
        };
        Ok(released_unless(old.as_ref()))
    }
}

impl DynamoDbStore {
    /// Every item of these partitions of the open-claims index, each read on
    /// its own and whole, a few at a time; `None` when the table has no such
    /// index. (The index is sorted by id, not by age, so only all of a
    /// status's partitions together say which claims are the oldest.)
    async fn query_partitions(
        &self,
        partitions: impl Iterator<Item = String>,
    ) -> Result<Option<Vec<Item>>, StoreError> {
        let mut reads =
            futures::stream::iter(partitions.map(|partition| self.query_partition(partition))).buffer_unordered(8);
        let mut items = Vec::new();
        while let Some(read) = reads.next().await {
            match read? {
                Some(found) => items.extend(found),
                None => return Ok(None),
            }
        }
        Ok(Some(items))
    }

    /// Every item of one partition of the open-claims index; `None` when the
    /// table has no such index.
    async fn query_partition(&self, partition: String) -> Result<Option<Vec<Item>>, StoreError> {
        let mut pages = self
            .client
            .query()
            .table_name(&self.layout.table)
            .index_name(OPEN_INDEX)
            .key_condition_expression("#open = :partition")
            .expression_attribute_names("#open", OPEN_STATUS)
            .expression_attribute_values(":partition", s(partition))
            .into_paginator()
            .items()
            .send();
        let mut items = Vec::new();
        while let Some(item) = pages.next().await {
            match item {
                Ok(item) => items.push(item),
                Err(error) if no_such_index(&error) => return Ok(None),
                Err(error) => return Err(unavailable(error)),
            }
        }
        Ok(Some(items))
    }

    /// Lists by reading the whole table: the fallback when no index serves the query.
    /// The claims of `statuses` that match `query`, read from the whole
    /// table in [`SCAN_SEGMENTS`] segments at once. DynamoDB filters by
    /// status before it answers, but charges for every item it reads: the
    /// read units are logged.
    async fn scan(&self, query: &ClaimQuery, statuses: &[ClaimStatus]) -> Result<Listing, StoreError> {
        let started = std::time::Instant::now();
        let segments = (0..SCAN_SEGMENTS).map(|segment| self.scan_segment(segment, statuses));
        let mut claims = Vec::new();
        let (mut scanned, mut read_units) = (0, 0.0);
        for segment in futures::future::try_join_all(segments).await? {
            claims.extend(segment.items.iter().map(|item| self.layout.read_item(item)));
            scanned += segment.scanned;
            read_units += segment.read_units;
        }
        tracing::info!(
            table = %self.layout.table,
            scanned_items = scanned,
            read_units,
            elapsed_ms = started.elapsed().as_millis(),
            "listed by reading the whole table (only failed claims and outbox entries are in the {OPEN_INDEX} index)"
        );
        Ok(query.select(claims.into_iter().collect::<Result<Vec<_>, _>>()?, true))
    }

    /// One segment of a [`scan`](Self::scan): the claims of `statuses` in it
    /// (outbox items have no status, so none of them), how many items it
    /// read, and what DynamoDB charged.
    async fn scan_segment(&self, segment: i32, statuses: &[ClaimStatus]) -> Result<ScannedSegment, StoreError> {
        let names: Vec<String> = (0..statuses.len()).map(|index| format!(":status{index}")).collect();
        let mut request = self
            .client
            .scan()
            .table_name(&self.layout.table)
            .segment(segment)
            .total_segments(SCAN_SEGMENTS)
            .limit(SCAN_PAGE_ITEMS)
            .filter_expression(format!("#status IN ({})", names.join(", ")))
            .expression_attribute_names("#status", &self.layout.attributes.status)
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        for (name, status) in names.iter().zip(statuses) {
            request = request.expression_attribute_values(name, s(status.as_str()));
        }
        let mut pages = request.into_paginator().send();
        let mut scanned = ScannedSegment::default();
        while let Some(page) = pages.next().await {
            let page = page.map_err(unavailable)?;
            scanned.scanned += u64::try_from(page.scanned_count).unwrap_or(0);
            scanned.read_units += page.consumed_capacity.and_then(|capacity| capacity.capacity_units).unwrap_or(0.0);
            scanned.items.extend(page.items.unwrap_or_default());
        }
        Ok(scanned)
    }

    /// Every item of the table, claims and outbox entries.
    async fn scan_items(&self) -> Result<Vec<Item>, StoreError> {
        let mut pages = self.client.scan().table_name(&self.layout.table).into_paginator().items().send();
        let mut items = Vec::new();
        while let Some(item) = pages.next().await {
            items.push(item.map_err(unavailable)?);
        }
        Ok(items)
    }
}

/// Segments of a scan read at once: a table of a million claims (a few
/// hundred MB) is read in a fraction of the time one reader takes, and a
/// small table costs a few more requests.
const SCAN_SEGMENTS: i32 = 8;

/// Items a scan reads per request. Pages of DynamoDB's full 1 MB made each
/// request of a million-claim table on DynamoDB Local take up to 1.5 s
/// alone, and eight at once outlasted the client's 5 s per request;
/// 1,000-item pages took 20 ms each and the whole segment a ninth of the time
/// (bench/listing). The read units are the same: DynamoDB charges for the
/// items read, however they are paged.
const SCAN_PAGE_ITEMS: i32 = 1_000;

/// What one segment of a scan found.
#[derive(Debug, Default)]
struct ScannedSegment {
    items: Vec<Item>,
    scanned: u64,
    read_units: f64,
}

/// Whether a query failed because the table has no such index (DynamoDB:
/// `ValidationException`, "The table does not have the specified index"),
/// as opposed to any other failure that merely mentions the index (access
/// denied on it, throttling, an index still being built).
fn no_such_index(error: &impl ProvideErrorMetadata) -> bool {
    error.code() == Some("ValidationException")
        && error.message().is_some_and(|message| message.contains("does not have the specified index"))
}

/// A release refused by its condition: the claim is released if no record
/// holds the key (an earlier attempt of the same release applied unseen, or
/// the record went since), and refused if one does (the lease was taken over).
fn released_unless(old: Option<&Item>) -> Fenced {
    if old.is_some() { Fenced::Refused } else { Fenced::Applied }
}

#[cfg(test)]
pub(crate) mod tests;
