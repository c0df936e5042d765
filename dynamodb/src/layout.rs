//! How claims map onto a DynamoDB table: the attribute names, the primary
//! key's shape, the sparse open-claims index, and the item that stores a
//! claim.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;

use sqs_once_core::store::{ClaimStatus, Finish, StoreError, StoredClaim};

/// A DynamoDB item: attribute names and values.
pub(crate) type Item = HashMap<String, AttributeValue>;

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

/// The sparse attribute that only failed claims and outbox entries carry, and
/// the index on it: the outbox sweeps and the listing of failed claims read
/// only them, never the whole table. It holds the claim's status and a shard
/// of its id (`FAILED#0` to `FAILED#15`, see [`open_partition`]). Claims in
/// progress do not carry it: they are most claims, each would cost its
/// record a write unit to enter the index and one to leave it, and they are
/// listed only when an operator asks (by reading the table). Items written
/// by versions that put claims in progress in the index too keep working:
/// the completion removes the attribute either way.
pub(crate) const OPEN_STATUS: &str = "open_status";

/// How many index partitions each open status is spread over.
///
/// A burst of failures or of staged messages writes the index at the rate
/// records run; an index keyed by the bare status would take them on one
/// partition key value, served by one index partition (about 1,000 writes a
/// second), and a throttled index throttles the table's writes. Sixteen
/// values per status take some 16,000 index writes a second before any one
/// is hot, and cost a listing sixteen small queries per status.
pub(crate) const OPEN_SHARDS: u32 = 16;

/// The [`OPEN_STATUS`] value of an open claim: its status and a stable shard
/// of its id (FNV-1a, so every process and version agrees).
pub(crate) fn open_partition(status: ClaimStatus, id: &str) -> String {
    sharded(status.as_str(), id)
}

/// `prefix` and a stable shard of `id` (FNV-1a).
pub(crate) fn sharded(prefix: &str, id: &str) -> String {
    let hash = id.bytes().fold(0x811c_9dc5_u32, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193));
    format!("{prefix}#{}", hash % OPEN_SHARDS)
}

/// Every [`OPEN_STATUS`] value claims of `status` can have: the shards, and
/// the bare status that versions before the sharding wrote.
pub(crate) fn open_partitions(status: ClaimStatus) -> impl Iterator<Item = String> {
    (0..OPEN_SHARDS).map(move |shard| shard_of(status.as_str(), shard)).chain([status.as_str().to_owned()])
}

pub(crate) fn shard_of(prefix: &str, shard: u32) -> String {
    format!("{prefix}#{shard}")
}

/// The global secondary index on [`OPEN_STATUS`].
pub(crate) const OPEN_INDEX: &str = "open-claims";

/// Attributes this project adds to the Powertools layout.
pub(crate) const TOKEN: &str = "token";
pub(crate) const HOLDER: &str = "holder";
pub(crate) const ATTEMPT: &str = "attempt";
pub(crate) const MESSAGE_ID: &str = "message_id";
pub(crate) const CLAIMED_AT: &str = "claimed_at";
pub(crate) const UPDATED_AT: &str = "updated_at";
pub(crate) const ERROR: &str = "error";

/// How claims map onto the table's primary key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
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
    /// use sqs_once::store::{TableKey, TableLayout};
    ///
    /// let layout = TableLayout::new("idempotency");
    /// assert_eq!((layout.attributes.id.as_str(), layout.attributes.expiry.as_str()), ("id", "expiration"));
    /// assert_eq!(layout.key, TableKey::Partition);
    /// ```
    pub fn new(table: impl Into<String>) -> Self {
        Self { table: table.into(), attributes: Attributes::default(), key: TableKey::default() }
    }

    pub(crate) fn key(&self, id: &str) -> Item {
        self.key_fields(id).map(|(name, value)| (name.to_owned(), s(value))).collect()
    }

    /// The key attributes of `id`'s item, as names and values.
    pub(crate) fn key_fields<'a>(&'a self, id: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> {
        let partition = match &self.key {
            TableKey::Partition => None,
            TableKey::Sorted { partition_attribute, partition_value } => {
                Some((partition_attribute.as_str(), partition_value.as_str()))
            }
        };
        std::iter::once((self.attributes.id.as_str(), id)).chain(partition)
    }
}

/// How claims are encoded as items.
impl TableLayout {
    /// The item that stores `record`.
    pub(crate) fn write_item(&self, claim: &StoredClaim) -> Item {
        self.fields(claim).into_iter().map(|(name, value)| (name.to_owned(), value)).collect()
    }

    /// The attributes of the item that stores `record`, as names and
    /// values: what [`Self::write_item`] holds, without a map to build
    /// where a statement lists them.
    pub(crate) fn fields<'a>(&'a self, record: &'a StoredClaim) -> Vec<(&'a str, AttributeValue)> {
        let names = &self.attributes;
        let key = self.key_fields(&record.id).map(|(name, value)| (name, s(value)));
        let required =
            [(names.status.as_str(), s(record.status.as_str())), (names.expiry.as_str(), n(record.expires_at_s))];
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
            (OPEN_STATUS, (record.status == ClaimStatus::Failed).then(|| s(open_partition(record.status, &record.id)))),
        ];
        let optional = optional.into_iter().filter_map(|(name, value)| Some((name, value?)));
        key.chain(required).chain(optional).collect()
    }

    /// The record `item` stores.
    pub(crate) fn read_item(&self, item: &Item) -> Result<StoredClaim, StoreError> {
        let names = &self.attributes;
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
        Ok(StoredClaim {
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
}

/// The conditional `UpdateItem` that finishes a claim, as its parts: the
/// single request and the claim's action in a transaction send the same.
#[derive(Debug, Clone)]
pub(crate) struct FinishUpdate {
    pub(crate) update: String,
    pub(crate) condition: &'static str,
    pub(crate) names: HashMap<String, String>,
    pub(crate) values: HashMap<String, AttributeValue>,
}

/// The condition of a write that takes a key over: [`StoredClaim::is_free`]
/// at `now_ms`, as a condition expression with its names and values.
#[derive(Debug, Clone)]
pub(crate) struct FreeCondition {
    pub(crate) condition: &'static str,
    pub(crate) names: HashMap<String, String>,
    pub(crate) values: HashMap<String, AttributeValue>,
}

impl TableLayout {
    /// The key's record is free at `now_ms`.
    pub(crate) fn free_condition(&self, now_ms: u64) -> FreeCondition {
        let names = &self.attributes;
        let aliases = [
            ("#id", names.id.as_str()),
            ("#status", names.status.as_str()),
            ("#lease", names.lease.as_str()),
            ("#expiry", names.expiry.as_str()),
        ];
        let values = [
            (":inprogress", s(ClaimStatus::InProgress.as_str())),
            (":now_ms", n(now_ms)),
            (":now_s", n(now_ms / 1000)),
        ];
        FreeCondition {
            condition: "attribute_not_exists(#id) \
                        OR (#status = :inprogress AND #lease < :now_ms) \
                        OR (#status <> :inprogress AND #expiry < :now_s) \
                        OR (#status = :inprogress AND attribute_not_exists(#lease) AND #expiry < :now_s)",
            names: aliases.into_iter().map(|(alias, name)| (alias.to_owned(), name.to_owned())).collect(),
            values: values.into_iter().map(|(alias, value)| (alias.to_owned(), value)).collect(),
        }
    }

    /// Finishes the in-progress claim `id` under `token` as `finish` says.
    pub(crate) fn finish_update(&self, id: &str, token: &str, finish: &Finish) -> FinishUpdate {
        let names = &self.attributes;
        let mut set = vec!["#status = :status", "#expiry = :expiry", "#updated = :updated"];
        let mut aliases = vec![
            ("#status", names.status.as_str()),
            ("#expiry", names.expiry.as_str()),
            ("#updated", UPDATED_AT),
            ("#lease", names.lease.as_str()),
            ("#token", TOKEN),
            ("#open", OPEN_STATUS),
        ];
        let mut values = vec![
            (":status", s(finish.status.as_str())),
            (":expiry", n(finish.expires_at_s)),
            (":updated", n(finish.finished_at_ms)),
            (":inprogress", s(ClaimStatus::InProgress.as_str())),
            (":token", s(token)),
        ];
        if let Some(result) = &finish.result {
            set.push("#data = :data");
            aliases.push(("#data", names.data.as_str()));
            values.push((":data", s(result)));
        }
        if let Some(error) = &finish.error {
            set.push("#error = :error");
            aliases.push(("#error", ERROR));
            values.push((":error", s(error)));
        }
        // A failed claim stays in the open-claims index; a completed one leaves it.
        let remove = if finish.status == ClaimStatus::Failed {
            set.push("#open = :open");
            values.push((":open", s(open_partition(finish.status, id))));
            "#lease"
        } else {
            "#lease, #open"
        };
        FinishUpdate {
            update: format!("SET {} REMOVE {remove}", set.join(", ")),
            condition: "#status = :inprogress AND #token = :token",
            names: aliases.into_iter().map(|(alias, name)| (alias.to_owned(), name.to_owned())).collect(),
            values: values.into_iter().map(|(alias, value)| (alias.to_owned(), value)).collect(),
        }
    }
}

/// A value as DynamoDB holds it: strings, numbers, booleans, null, lists
/// and maps.
pub(crate) fn attribute_value(value: &Value) -> AttributeValue {
    match value {
        Value::Null => AttributeValue::Null(true),
        Value::Bool(flag) => AttributeValue::Bool(*flag),
        Value::Number(number) => AttributeValue::N(number.to_string()),
        Value::String(text) => AttributeValue::S(text.clone()),
        Value::Array(values) => AttributeValue::L(values.iter().map(attribute_value).collect()),
        Value::Object(map) => {
            AttributeValue::M(map.iter().map(|(name, value)| (name.clone(), attribute_value(value))).collect())
        }
    }
}

pub(crate) fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

pub(crate) fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

pub(crate) fn text(item: &Item, name: &str) -> Option<String> {
    match item.get(name) {
        Some(AttributeValue::S(value)) => Some(value.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_partition_is_stable_per_key() {
        let partition = open_partition(ClaimStatus::InProgress, "orders#o-1");
        assert!(partition.starts_with("INPROGRESS#"));
        assert_eq!(partition, open_partition(ClaimStatus::InProgress, "orders#o-1"));
    }
}
