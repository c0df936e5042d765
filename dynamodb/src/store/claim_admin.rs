//! What an operator's `sqs-once claims` asks of the table: listings, from the
//! open-claims index read partition by partition or, where no index serves
//! the query, from the whole table in segments; and replacing a claim seen.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};

use super::DynamoDbStore;
use crate::{
    client::{Conditional, conditional, unavailable},
    layout::{Item, OPEN_INDEX, TOKEN, open_partitions, s},
};
use sqs_once_core::store::{ClaimQuery, ClaimStatus, Fenced, Listing, StoreError, StoredClaim, replaced_id};

impl DynamoDbStore {
    /// The claims `query` asks for, from the open-claims index where it
    /// serves the query, else from the whole table.
    pub(super) async fn list_claims(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
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

    /// Replaces (or deletes, `record` `None`) the claim an operator saw, if
    /// it is still as seen ([`ClaimAdmin::replace_seen`](sqs_once_core::store::ClaimAdmin::replace_seen)).
    pub(super) async fn replace_claim(
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
