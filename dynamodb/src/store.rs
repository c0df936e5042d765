//! [`DynamoDbStore`]: its state, and the store traits it implements, each
//! method handing over to the child that writes its requests: claims one at a
//! time or batched ([`claims`]), an operator's listings and edits ([`claim_admin`]) on reads of the index ([`index`]), commits in a
//! transaction ([`transact`]) or in the claim's item ([`in_item`]), the
//! outbox ([`outbox`]) and the table itself ([`admin`]).

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;

use crate::{
    layout::TableLayout,
    statements::{self, Batches},
};
use sqs_once_core::store::{
    Capabilities, ClaimAdmin, ClaimQuery, ClaimStore, Commit, CommitStore, Committed, Fenced, Finish, Listing,
    OutboxEntry, OutboxQuery, OutboxStore, PutOutcome, StoreError, StoredClaim, SweepPart, UnreadableEntry,
};

mod admin;
mod claim_admin;
mod claims;
mod in_item;
mod index;
mod outbox;
mod transact;

pub use admin::{Unusable, check_table};

/// The key [`ClaimStore::connect`] reads: only read, so whether a record
/// holds it matters not.
const CONNECT_KEY: &str = "sqs-once:connect";

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
    outbox_progress: Arc<outbox::SweepProgress>,
    /// The windows of the items whose keys this process's commits kept (see
    /// [`in_item`]).
    windows: Arc<in_item::Windows>,
}

impl DynamoDbStore {
    /// A store on `layout.table`, through `client`, batching its writes.
    pub fn new(client: Client, layout: TableLayout) -> Self {
        let layout = Arc::new(layout);
        let batches = Some(Arc::new(Batches::new(&client, &layout)));
        Self {
            client,
            layout,
            return_old_item: true,
            batches,
            outbox_progress: Arc::default(),
            windows: Arc::default(),
        }
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
        self.list_claims(query).await
    }

    async fn replace_seen(
        &self,
        seen: Option<&StoredClaim>,
        record: Option<&StoredClaim>,
    ) -> Result<Fenced, StoreError> {
        self.replace_claim(seen, record).await
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

    async fn sweep_part_handled(&self) {
        self.keep_sweep_position().await;
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

    async fn release_entry(
        &self,
        entry: &OutboxEntry,
        failed_sends: u32,
        retry_at_ms: u64,
    ) -> Result<Fenced, StoreError> {
        self.release_outbox_entry(entry, failed_sends, retry_at_ms).await
    }

    async fn entry_sent(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        self.delete_outbox_entry(id, token).await
    }
}

#[cfg(test)]
pub(crate) mod tests;
