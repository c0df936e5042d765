//! The production store: claims in a DynamoDB table.
//!
//! A claim is one conditional `PutItem` that asks for the old item back when
//! its condition fails (`ReturnValuesOnConditionCheckFailure = ALL_OLD`), so a
//! duplicate or a conflict costs one request. The condition is
//! [`ClaimRecord::is_free`] written as a DynamoDB condition expression.
//! Completing, failing and releasing are an `UpdateItem` or `DeleteItem`
//! conditioned on the claim's token.
//!
//! By default the writes of records running at the same time go out
//! together, as PartiQL statements in `BatchExecuteStatement` (see
//! [`statements`]): a new record then costs about 2/25 of a request instead
//! of 2, at the same write units. A claim that finds the key taken reads the
//! record in a batched consistent read (about 1/100 of a request and one
//! read unit), since a refused statement may not return it.
//!
//! Attribute names default to those of Powertools for AWS Lambda (`id`,
//! `expiration`, `in_progress_expiration`, `status`, `data`, `validation`), so
//! a table can be shared with functions that use it; tables keyed by a static
//! partition value and a sort key are supported as Powertools supports them.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use aws_sdk_dynamodb::{
    Client,
    client::Waiters,
    config::{ConfigBag, Intercept, RuntimeComponents, interceptors::BeforeTransmitInterceptorContextRef},
    error::{BoxError, ProvideErrorMetadata},
    operation::{
        create_table::CreateTableError, delete_item::DeleteItemError, put_item::PutItemError,
        update_item::UpdateItemError,
    },
    types::{
        AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
        ProjectionType, ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TimeToLiveSpecification,
    },
};
use futures::StreamExt;

use self::statements::{Batches, Written};
use super::{ClaimQuery, ClaimStore, Fenced, Finish, Listing, PutOutcome, StoreError, replaced_id};
use crate::claim::{ClaimRecord, ClaimStatus};

mod statements;

type Item = HashMap<String, AttributeValue>;

/// Names of the attributes a claim is stored in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// The key attribute holding the claim's id (the partition key, or the
    /// sort key of a [`TableKey::Sorted`] table). Default `id`.
    pub id: String,
    /// Overall expiry, epoch seconds; the table's TTL attribute. Default `expiration`.
    pub expiry: String,
    /// Lease end, epoch milliseconds. Default `in_progress_expiration`.
    pub lease: String,
    /// `INPROGRESS`, `COMPLETED` or `FAILED`. Default `status`.
    pub status: String,
    /// The stored handler output. Default `data`.
    pub data: String,
    /// The body hash for payload validation. Default `validation`.
    pub validation: String,
}

impl Default for Attributes {
    fn default() -> Self {
        Self {
            id: "id".into(),
            expiry: "expiration".into(),
            lease: "in_progress_expiration".into(),
            status: "status".into(),
            data: "data".into(),
            validation: "validation".into(),
        }
    }
}

/// The sparse attribute that exists only while a claim is in progress or
/// failed, and the index on it: listing open claims reads only them, never
/// the whole table. It holds the claim's status and a shard of its id
/// (`INPROGRESS#0` to `INPROGRESS#15`, see [`open_partition`]).
pub const OPEN_STATUS: &str = "open_status";

/// How many index partitions each open status is spread over.
///
/// Every claim writes the index and every completion deletes from it, so an
/// index keyed by the bare status would take all of them on one or two
/// partition key values; one value is served by one index partition (about
/// 1,000 writes a second), and a throttled index throttles the table's
/// writes. Sixteen values per status take some 16,000 index writes a second
/// (8,000 new records) before any one is hot, and cost a listing sixteen
/// small queries per status.
pub const OPEN_SHARDS: u32 = 16;

/// The [`OPEN_STATUS`] value of an open claim: its status and a stable shard
/// of its id (FNV-1a, so every process and version agrees).
///
/// ```
/// use sqs_once::{claim::ClaimStatus, store::dynamodb::open_partition};
///
/// let partition = open_partition(ClaimStatus::InProgress, "orders#o-1");
/// assert!(partition.starts_with("INPROGRESS#"));
/// assert_eq!(partition, open_partition(ClaimStatus::InProgress, "orders#o-1"));
/// ```
pub fn open_partition(status: ClaimStatus, id: &str) -> String {
    let hash = id.bytes().fold(0x811c_9dc5_u32, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193));
    shard_of(status, hash % OPEN_SHARDS)
}

/// Every [`OPEN_STATUS`] value claims of `status` can have: the shards, and
/// the bare status that versions before the sharding wrote.
fn open_partitions(status: ClaimStatus) -> impl Iterator<Item = String> {
    (0..OPEN_SHARDS).map(move |shard| shard_of(status, shard)).chain([status.as_str().to_owned()])
}

fn shard_of(status: ClaimStatus, shard: u32) -> String {
    format!("{}#{shard}", status.as_str())
}
/// The global secondary index on [`OPEN_STATUS`].
pub const OPEN_INDEX: &str = "open-claims";

/// Attributes this project adds to the Powertools layout.
const TOKEN: &str = "token";
const HOLDER: &str = "holder";
const ATTEMPT: &str = "attempt";
const MESSAGE_ID: &str = "message_id";
const CLAIMED_AT: &str = "claimed_at";
const UPDATED_AT: &str = "updated_at";
const ERROR: &str = "error";

/// How claims map onto the table's primary key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TableKey {
    /// The claim id is the partition key, named [`Attributes::id`].
    #[default]
    Partition,
    /// Every claim shares one partition value, and the claim id is the sort key.
    Sorted {
        /// The partition key attribute.
        partition_attribute: String,
        /// Its value on every claim.
        partition_value: String,
    },
}

/// Where claims live in DynamoDB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableLayout {
    /// The table name.
    pub table: String,
    /// Attribute names.
    pub attributes: Attributes,
    /// The primary key's shape.
    pub key: TableKey,
}

impl TableLayout {
    /// A table keyed by `id` alone, with the default attribute names.
    ///
    /// ```
    /// use sqs_once::store::dynamodb::{TableKey, TableLayout};
    ///
    /// let layout = TableLayout::new("idempotency");
    /// assert_eq!((layout.attributes.id.as_str(), layout.attributes.expiry.as_str()), ("id", "expiration"));
    /// assert_eq!(layout.key, TableKey::Partition);
    /// ```
    pub fn new(table: impl Into<String>) -> Self {
        Self { table: table.into(), attributes: Attributes::default(), key: TableKey::default() }
    }

    fn key(&self, id: &str) -> Item {
        let mut key = Item::from([(self.attributes.id.clone(), s(id))]);
        if let TableKey::Sorted { partition_attribute, partition_value } = &self.key {
            key.insert(partition_attribute.clone(), s(partition_value));
        }
        key
    }
}

/// DynamoDB requests made by a client, counted as they are sent (retries
/// count again), per operation.
#[derive(Debug, Default)]
pub struct RequestCounter {
    put: AtomicU64,
    get: AtomicU64,
    update: AtomicU64,
    delete: AtomicU64,
    query: AtomicU64,
    scan: AtomicU64,
    batch_statement: AtomicU64,
    batch_get: AtomicU64,
    other: AtomicU64,
}

/// A snapshot of a [`RequestCounter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// `PutItem` requests (claims).
    pub put: u64,
    /// `GetItem` requests (reads after a claim that returned no item).
    pub get: u64,
    /// `UpdateItem` requests (completions and failure records).
    pub update: u64,
    /// `DeleteItem` requests (releases).
    pub delete: u64,
    /// `Query` requests (listing open claims through the index).
    pub query: u64,
    /// `Scan` requests (listing without an index).
    pub scan: u64,
    /// `BatchExecuteStatement` requests (batched claims, completions,
    /// failure records and releases).
    pub batch_statement: u64,
    /// `BatchGetItem` requests (batched reads after a refused claim).
    pub batch_get: u64,
    /// Any other request.
    pub other: u64,
}

impl RequestCounts {
    /// All requests.
    pub fn total(&self) -> u64 {
        let batched = self.batch_statement + self.batch_get;
        self.put + self.get + self.update + self.delete + self.query + self.scan + batched + self.other
    }
}

impl RequestCounter {
    /// The counts so far.
    pub fn snapshot(&self) -> RequestCounts {
        RequestCounts {
            put: self.put.load(Ordering::Relaxed),
            get: self.get.load(Ordering::Relaxed),
            update: self.update.load(Ordering::Relaxed),
            delete: self.delete.load(Ordering::Relaxed),
            query: self.query.load(Ordering::Relaxed),
            scan: self.scan.load(Ordering::Relaxed),
            batch_statement: self.batch_statement.load(Ordering::Relaxed),
            batch_get: self.batch_get.load(Ordering::Relaxed),
            other: self.other.load(Ordering::Relaxed),
        }
    }
}

/// Counts each request as the SDK sends it, by its `X-Amz-Target` operation.
#[derive(Debug, Clone)]
struct CountRequests(Arc<RequestCounter>);

impl Intercept for CountRequests {
    fn name(&self) -> &'static str {
        "CountRequests"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let target = context.request().headers().get("x-amz-target").unwrap_or_default();
        let counter = match target.rsplit('.').next() {
            Some("PutItem") => &self.0.put,
            Some("GetItem") => &self.0.get,
            Some("UpdateItem") => &self.0.update,
            Some("DeleteItem") => &self.0.delete,
            Some("Query") => &self.0.query,
            Some("Scan") => &self.0.scan,
            Some("BatchExecuteStatement") => &self.0.batch_statement,
            Some("BatchGetItem") => &self.0.batch_get,
            _ => &self.0.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A DynamoDB client as this store uses it: built once per process from the
/// SDK's default chain (so `AWS_REGION`, credentials and
/// `AWS_ENDPOINT_URL_DYNAMODB` work as the SDK defines them), with this
/// [`crate::aws`] retry and timeout settings, counting its requests.
pub async fn client() -> (Client, Arc<RequestCounter>) {
    client_from(&crate::aws::sdk_config().await)
}

/// A client as [`client`] builds it, from an already loaded configuration.
pub fn client_from(shared: &aws_config::SdkConfig) -> (Client, Arc<RequestCounter>) {
    let counter = Arc::new(RequestCounter::default());
    let config =
        aws_sdk_dynamodb::config::Builder::from(shared).interceptor(CountRequests(Arc::clone(&counter))).build();
    (Client::from_conf(config), counter)
}

/// Claims in a DynamoDB table.
///
/// ```no_run
/// # async fn example() {
/// use std::sync::Arc;
/// use sqs_once::{claim::Claims, store::dynamodb::{self, DynamoDbStore, TableLayout}};
///
/// let (client, _requests) = dynamodb::client().await;
/// let store = DynamoDbStore::new(client, TableLayout::new("idempotency"));
/// let claims = Claims::new(Arc::new(store));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DynamoDbStore {
    client: Client,
    layout: Arc<TableLayout>,
    return_old_item: bool,
    batches: Option<Arc<Batches>>,
}

impl DynamoDbStore {
    /// A store on `layout.table`, through `client`, batching its writes.
    pub fn new(client: Client, layout: TableLayout) -> Self {
        let layout = Arc::new(layout);
        let batches = Some(Arc::new(Batches::new(&client, &layout)));
        Self { client, layout, return_old_item: true, batches }
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

    /// Creates the table (on-demand billing, TTL on the expiry attribute).
    /// Returns `false` when it already existed; TTL is enabled either way.
    pub async fn create_table(&self) -> Result<bool, StoreError> {
        let layout = &self.layout;
        let id = layout.attributes.id.as_str();
        let mut keys = vec![(id, KeyType::Hash)];
        if let TableKey::Sorted { partition_attribute, .. } = &layout.key {
            keys = vec![(partition_attribute.as_str(), KeyType::Hash), (id, KeyType::Range)];
        }
        let open_claims = GlobalSecondaryIndex::builder()
            .index_name(OPEN_INDEX)
            .key_schema(key_element(OPEN_STATUS, KeyType::Hash)?)
            .key_schema(key_element(id, KeyType::Range)?)
            .projection(Projection::builder().projection_type(ProjectionType::All).build())
            .build()
            .map_err(StoreError::unavailable)?;
        let mut request = self
            .client
            .create_table()
            .table_name(&layout.table)
            .billing_mode(BillingMode::PayPerRequest)
            .global_secondary_indexes(open_claims);
        for name in keys.iter().map(|(name, _)| *name).chain([OPEN_STATUS]) {
            let definition =
                AttributeDefinition::builder().attribute_name(name).attribute_type(ScalarAttributeType::S).build();
            request = request.attribute_definitions(definition.map_err(StoreError::unavailable)?);
        }
        for (name, key_type) in keys {
            request = request.key_schema(key_element(name, key_type)?);
        }
        let created = match request.send().await {
            Ok(_) => true,
            Err(error) if matches!(error.as_service_error(), Some(CreateTableError::ResourceInUseException(_))) => {
                false
            }
            Err(error) => return Err(unavailable(error)),
        };
        self.client.wait_until_table_exists().table_name(&layout.table).wait(Duration::from_secs(120)).await.map_err(
            |error| StoreError::unavailable(format!("table {} did not become active: {error}", layout.table)),
        )?;
        let ttl = TimeToLiveSpecification::builder()
            .attribute_name(&layout.attributes.expiry)
            .enabled(true)
            .build()
            .map_err(StoreError::unavailable)?;
        match self.client.update_time_to_live().table_name(&layout.table).time_to_live_specification(ttl).send().await {
            Ok(_) => Ok(created),
            Err(error) if error.message().is_some_and(|message| message.contains("already enabled")) => Ok(created),
            Err(error) => Err(unavailable(error)),
        }
    }

    fn write_item(&self, record: &ClaimRecord) -> Item {
        let names = &self.layout.attributes;
        let mut item = self.layout.key(&record.id);
        item.insert(names.status.clone(), s(record.status.as_str()));
        item.insert(names.expiry.clone(), n(record.expires_at_s));
        let optional = [
            (names.lease.as_str(), record.lease_until_ms.map(n)),
            (TOKEN, record.token.as_deref().map(s)),
            (HOLDER, record.holder.as_deref().map(s)),
            (ATTEMPT, record.attempt.map(n)),
            (MESSAGE_ID, record.message_id.as_deref().map(s)),
            (CLAIMED_AT, record.claimed_at_ms.map(n)),
            (UPDATED_AT, record.updated_at_ms.map(n)),
            (names.validation.as_str(), record.payload_hash.as_deref().map(s)),
            (names.data.as_str(), record.result.as_deref().map(s)),
            (ERROR, record.error.as_deref().map(s)),
            (
                OPEN_STATUS,
                (record.status != ClaimStatus::Completed).then(|| s(open_partition(record.status, &record.id))),
            ),
        ];
        item.extend(optional.into_iter().filter_map(|(name, value)| Some((name.to_owned(), value?))));
        item
    }

    fn read_item(&self, item: &Item) -> Result<ClaimRecord, StoreError> {
        let names = &self.layout.attributes;
        let id = text(item, &names.id).unwrap_or_default();
        let malformed = |reason: String| StoreError::Malformed { id: id.clone(), reason };
        let status_text = text(item, &names.status).unwrap_or_default();
        let status = ClaimStatus::parse(&status_text)
            .ok_or_else(|| malformed(format!("unknown {} `{status_text}`", names.status)))?;
        let number = |name: &str| match item.get(name) {
            None => Ok(None),
            Some(AttributeValue::N(value)) => value
                .parse::<f64>()
                .map(|value| Some(value as u64))
                .map_err(|_| malformed(format!("{name} is not a number"))),
            Some(_) => Err(malformed(format!("{name} is not a number"))),
        };
        Ok(ClaimRecord {
            status,
            expires_at_s: number(&names.expiry)?.ok_or_else(|| malformed(format!("no {}", names.expiry)))?,
            lease_until_ms: number(&names.lease)?,
            token: text(item, TOKEN),
            holder: text(item, HOLDER),
            attempt: number(ATTEMPT)?.and_then(|attempt| u32::try_from(attempt).ok()),
            message_id: text(item, MESSAGE_ID),
            claimed_at_ms: number(CLAIMED_AT)?,
            updated_at_ms: number(UPDATED_AT)?,
            payload_hash: text(item, &names.validation),
            result: text(item, &names.data),
            error: text(item, ERROR),
            id,
        })
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

#[async_trait]
impl ClaimStore for DynamoDbStore {
    async fn put_if_free(&self, record: &ClaimRecord, now_ms: u64) -> Result<PutOutcome, StoreError> {
        if let Some(batches) = self.batched()
            && let Some(outcome) = batches.or_single(self.put_batched(batches, record, now_ms).await)
            && let Some(outcome) = outcome?
        {
            return Ok(outcome);
        }
        self.put_one(record, now_ms).await
    }

    async fn get(&self, id: &str) -> Result<Option<ClaimRecord>, StoreError> {
        if let Some(batches) = self.batched()
            && let Some(item) = batches.or_single(batches.reads.submit(id.to_owned()).await)
        {
            return item?.map(|item| self.read_item(&item)).transpose();
        }
        self.get_one(id).await
    }

    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        if let Some(batches) = self.batched()
            && let Some(fenced) = batches.or_single(self.finish_batched(batches, id, token, finish).await)
        {
            return fenced;
        }
        self.finish_one(id, token, finish).await
    }

    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        if let Some(batches) = self.batched()
            && let Some(fenced) = batches.or_single(self.release_batched(batches, id, token).await)
        {
            return fenced;
        }
        self.release_one(id, token).await
    }

    async fn list(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
        if query.status == Some(ClaimStatus::Completed) {
            tracing::warn!("completed claims are not in the {OPEN_INDEX} index: reading the whole table");
            return self.scan(query).await;
        }
        // Each partition of the index is read on its own, a few at a time.
        let partitions = query.statuses().into_iter().flat_map(open_partitions);
        let mut reads =
            futures::stream::iter(partitions.map(|partition| self.query_open(partition, query))).buffer_unordered(8);
        let mut records = Vec::new();
        while let Some(read) = reads.next().await {
            match read? {
                Some(found) => records.extend(found),
                None => {
                    tracing::warn!(
                        table = %self.layout.table,
                        "the table has no {OPEN_INDEX} index (see create-table or template.yaml): \
                         reading the whole table instead"
                    );
                    return self.scan(query).await;
                }
            }
        }
        Ok(query.select(records, false))
    }

    async fn replace_seen(
        &self,
        seen: Option<&ClaimRecord>,
        record: Option<&ClaimRecord>,
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
        let values = (!values.is_empty()).then_some(values);
        let refused = match record {
            Some(record) => {
                let put = self
                    .client
                    .put_item()
                    .table_name(&self.layout.table)
                    .set_item(Some(self.write_item(record)))
                    .condition_expression(condition)
                    .set_expression_attribute_names(Some(attribute_names))
                    .set_expression_attribute_values(values);
                match put.send().await {
                    Ok(_) => false,
                    Err(error) => match error.into_service_error() {
                        PutItemError::ConditionalCheckFailedException(_) => true,
                        other => return Err(unavailable(other)),
                    },
                }
            }
            None => {
                let delete = self
                    .client
                    .delete_item()
                    .table_name(&self.layout.table)
                    .set_key(Some(self.layout.key(id)))
                    .condition_expression(condition)
                    .set_expression_attribute_names(Some(attribute_names))
                    .set_expression_attribute_values(values);
                match delete.send().await {
                    Ok(_) => false,
                    Err(error) => match error.into_service_error() {
                        DeleteItemError::ConditionalCheckFailedException(_) => true,
                        other => return Err(unavailable(other)),
                    },
                }
            }
        };
        Ok(if refused { Fenced::Refused } else { Fenced::Applied })
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
        record: &ClaimRecord,
        now_ms: u64,
    ) -> Result<Option<PutOutcome>, StoreError> {
        let insert = || self.layout.insert(self.write_item(record), &record.id);
        let returned = match batches.write(insert).await? {
            Written::Applied => return Ok(Some(PutOutcome::Claimed)),
            Written::Refused(returned) => returned,
        };
        let old = batches.refused_item(&record.id, returned).await?.map(|item| self.read_item(&item)).transpose()?;
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
    async fn put_one(&self, record: &ClaimRecord, now_ms: u64) -> Result<PutOutcome, StoreError> {
        let names = &self.layout.attributes;
        let result = self
            .client
            .put_item()
            .table_name(&self.layout.table)
            .set_item(Some(self.write_item(record)))
            .condition_expression(
                "attribute_not_exists(#id) \
                 OR (#status = :inprogress AND #lease < :now_ms) \
                 OR (#status <> :inprogress AND #expiry < :now_s) \
                 OR (#status = :inprogress AND attribute_not_exists(#lease) AND #expiry < :now_s)",
            )
            .expression_attribute_names("#id", &names.id)
            .expression_attribute_names("#status", &names.status)
            .expression_attribute_names("#lease", &names.lease)
            .expression_attribute_names("#expiry", &names.expiry)
            .expression_attribute_values(":inprogress", s(ClaimStatus::InProgress.as_str()))
            .expression_attribute_values(":now_ms", n(now_ms))
            .expression_attribute_values(":now_s", n(now_ms / 1000))
            .return_values_on_condition_check_failure(self.returned_values())
            .send()
            .await;
        match result {
            Ok(_) => Ok(PutOutcome::Claimed),
            Err(error) => match error.into_service_error() {
                PutItemError::ConditionalCheckFailedException(failed) => match failed.item {
                    Some(item) if !item.is_empty() => Ok(PutOutcome::Taken(Some(Box::new(self.read_item(&item)?)))),
                    _ => Ok(PutOutcome::Taken(None)),
                },
                other => Err(unavailable(other)),
            },
        }
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
    async fn get_one(&self, id: &str) -> Result<Option<ClaimRecord>, StoreError> {
        self.get_item(id).await?.map(|item| self.read_item(&item)).transpose()
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
        let names = &self.layout.attributes;
        let mut set = vec!["#status = :status", "#expiry = :expiry", "#updated = :updated"];
        let mut request = self
            .client
            .update_item()
            .table_name(&self.layout.table)
            .set_key(Some(self.layout.key(id)))
            .condition_expression("#status = :inprogress AND #token = :token")
            .expression_attribute_names("#status", &names.status)
            .expression_attribute_names("#expiry", &names.expiry)
            .expression_attribute_names("#updated", UPDATED_AT)
            .expression_attribute_names("#lease", &names.lease)
            .expression_attribute_names("#token", TOKEN)
            .expression_attribute_names("#open", OPEN_STATUS)
            .expression_attribute_values(":status", s(finish.status.as_str()))
            .expression_attribute_values(":expiry", n(finish.expires_at_s))
            .expression_attribute_values(":updated", n(finish.finished_at_ms))
            .expression_attribute_values(":inprogress", s(ClaimStatus::InProgress.as_str()))
            .expression_attribute_values(":token", s(token))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if let Some(result) = &finish.result {
            set.push("#data = :data");
            request = request
                .expression_attribute_names("#data", &names.data)
                .expression_attribute_values(":data", s(result));
        }
        if let Some(error) = &finish.error {
            set.push("#error = :error");
            request =
                request.expression_attribute_names("#error", ERROR).expression_attribute_values(":error", s(error));
        }
        // A failed claim stays in the open-claims index; a completed one leaves it.
        let remove = if finish.status == ClaimStatus::Failed {
            set.push("#open = :open");
            request = request.expression_attribute_values(":open", s(open_partition(finish.status, id)));
            "#lease"
        } else {
            "#lease, #open"
        };
        let result = request.update_expression(format!("SET {} REMOVE {remove}", set.join(", "))).send().await;
        match result {
            Ok(_) => Ok(Fenced::Applied),
            Err(error) => match error.into_service_error() {
                UpdateItemError::ConditionalCheckFailedException(failed) => {
                    Ok(self.already_finished(failed.item.as_ref(), token, Some(finish.status)))
                }
                other => Err(unavailable(other)),
            },
        }
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
        match result {
            Ok(_) => Ok(Fenced::Applied),
            Err(error) => match error.into_service_error() {
                DeleteItemError::ConditionalCheckFailedException(failed) => {
                    let old = match failed.item.filter(|item| !item.is_empty()) {
                        Some(item) => Some(item),
                        None if self.return_old_item => None,
                        None => self.get_item(id).await?,
                    };
                    Ok(released_unless(old.as_ref()))
                }
                other => Err(unavailable(other)),
            },
        }
    }
}

impl DynamoDbStore {
    /// The claims of one partition of the open-claims index that match
    /// `query`, at most its limit; `None` when the table has no such index.
    async fn query_open(&self, partition: String, query: &ClaimQuery) -> Result<Option<Vec<ClaimRecord>>, StoreError> {
        let mut items = self
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
        let mut records = Vec::new();
        while records.len() < query.limit {
            match items.next().await {
                None => break,
                Some(Ok(item)) => {
                    let record = self.read_item(&item)?;
                    if query.matches(&record) {
                        records.push(record);
                    }
                }
                Some(Err(error)) if error.message().is_some_and(|message| message.contains("index")) => {
                    return Ok(None);
                }
                Some(Err(error)) => return Err(unavailable(error)),
            }
        }
        Ok(Some(records))
    }

    /// Lists by reading the whole table: the fallback when no index serves the query.
    async fn scan(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
        let mut items = self.client.scan().table_name(&self.layout.table).into_paginator().items().send();
        let mut records = Vec::new();
        while let Some(item) = items.next().await {
            records.push(self.read_item(&item.map_err(unavailable)?)?);
        }
        Ok(query.select(records, true))
    }
}

/// A release refused by its condition: the claim is released if no record
/// holds the key (an earlier attempt of the same release applied unseen, or
/// the record went since), and refused if one does (the lease was taken over).
fn released_unless(old: Option<&Item>) -> Fenced {
    if old.is_some() { Fenced::Refused } else { Fenced::Applied }
}

fn key_element(name: &str, key_type: KeyType) -> Result<KeySchemaElement, StoreError> {
    KeySchemaElement::builder().attribute_name(name).key_type(key_type).build().map_err(StoreError::unavailable)
}

fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn text(item: &Item, name: &str) -> Option<String> {
    match item.get(name) {
        Some(AttributeValue::S(value)) => Some(value.clone()),
        _ => None,
    }
}

/// An SDK failure as a store error, in one line ([`crate::aws::describe`]).
fn unavailable(error: impl std::error::Error + ProvideErrorMetadata) -> StoreError {
    StoreError::unavailable(described(&error))
}

/// An SDK failure in one line, naming DynamoDB.
fn described(error: &(impl std::error::Error + ProvideErrorMetadata)) -> String {
    format!("DynamoDB: {}", crate::aws::describe(error))
}
