//! Reads of whole partitions of the open-claims index, and of the whole
//! table: what listings and the outbox's sweeps stand on.

use futures::StreamExt;

use super::DynamoDbStore;
use crate::{
    client::{no_such_index, unavailable},
    layout::{Item, OPEN_INDEX, OPEN_STATUS, s},
};
use sqs_once_core::store::StoreError;

impl DynamoDbStore {
    /// Every item of these partitions of the open-claims index, each read on
    /// its own and whole, a few at a time; `None` when the table has no such
    /// index. (The index is sorted by id, not by age, so only all of a
    /// status's partitions together say which claims are the oldest.)
    pub(super) async fn query_partitions(
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
    pub(super) async fn query_partition(&self, partition: String) -> Result<Option<Vec<Item>>, StoreError> {
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

    /// Every item of the table, claims and outbox entries.
    pub(super) async fn scan_items(&self) -> Result<Vec<Item>, StoreError> {
        let mut pages = self.client.scan().table_name(&self.layout.table).into_paginator().items().send();
        let mut items = Vec::new();
        while let Some(item) = pages.next().await {
            items.push(item.map_err(unavailable)?);
        }
        Ok(items)
    }
}
