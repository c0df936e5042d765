//! Claims written one request at a time, or as statements of a batch when
//! batching is on: claiming, reading, finishing and releasing a key.

use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;

use super::DynamoDbStore;
use crate::{
    client::{Conditional, conditional, unavailable},
    layout::{Item, TOKEN, s, text},
    statements::{Batches, Written},
};
use sqs_once_core::store::{ClaimStatus, Fenced, Finish, PutOutcome, StoreError, StoredClaim};

impl DynamoDbStore {
    /// The returned old item says whether a refused finishing write had in
    /// fact been applied by an earlier attempt whose answer was lost.
    pub(super) fn already_finished(&self, old: Option<&Item>, token: &str, status: Option<ClaimStatus>) -> Fenced {
        let names = &self.layout.attributes;
        let ours = old.is_some_and(|old| text(old, TOKEN).as_deref() == Some(token));
        let settled = old.and_then(|old| text(old, &names.status)).and_then(|stored| ClaimStatus::parse(&stored));
        if ours && settled == status { Fenced::Applied } else { Fenced::Refused }
    }
    /// The batched requests, unless they are off or DynamoDB refused them.
    pub(super) fn batched(&self) -> Option<&Batches> {
        self.batches.as_deref().filter(|batches| !batches.refused())
    }

    /// A claim as an `INSERT`; `None` when the key's record is free, which
    /// only the conditional `PutItem` can take over.
    pub(super) async fn put_batched(
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
    pub(super) async fn finish_batched(
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
    pub(super) async fn release_batched(&self, batches: &Batches, id: &str, token: &str) -> Result<Fenced, StoreError> {
        Ok(match batches.write(|| self.layout.release(id, token)).await? {
            Written::Applied => Fenced::Applied,
            Written::Refused(returned) => released_unless(batches.refused_item(id, returned).await?.as_ref()),
        })
    }

    /// One conditional `PutItem`.
    pub(super) async fn put_one(&self, record: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
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
    pub(super) fn returned_values(&self) -> ReturnValuesOnConditionCheckFailure {
        if self.return_old_item {
            ReturnValuesOnConditionCheckFailure::AllOld
        } else {
            ReturnValuesOnConditionCheckFailure::None
        }
    }

    /// One consistent `GetItem`.
    pub(super) async fn get_one(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        self.get_item(id).await?.map(|item| self.layout.read_item(&item)).transpose()
    }

    /// The item, as one consistent `GetItem` reads it.
    pub(super) async fn get_item(&self, id: &str) -> Result<Option<Item>, StoreError> {
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
    pub(super) async fn finish_one(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
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
    pub(super) async fn release_one(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
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

/// A release refused by its condition: the claim is released if no record
/// holds the key (an earlier attempt of the same release applied unseen, or
/// the record went since), and refused if one does (the lease was taken over).
pub(super) fn released_unless(old: Option<&Item>) -> Fenced {
    if old.is_some() { Fenced::Refused } else { Fenced::Applied }
}
