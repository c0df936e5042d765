//! A handler's staged writes committed with its claim in one
//! `TransactWriteItems`, with an outbox item (see [`super::outbox`]) per message.
//!
//! The transaction's actions are, in order: the claim's completion (the
//! same conditional update a single completion sends, returning the claim
//! as it stood if its condition fails), the staged writes, and one put per
//! outbox entry. Its `ClientRequestToken` is the claim's token, so a request
//! sent again after its answer was lost applies once within DynamoDB's ten
//! minutes; after them, the claim's own condition refuses a second
//! application, and the claim as DynamoDB returns it (completed under the
//! same token) says the commit had applied.
//!
//! Cancellation reasons are read from `CancellationReasons` and, where an
//! answer lacks them (DynamoDB documents the property for Java only), from
//! the codes the exception's message lists in the same order.

use std::collections::HashMap;

use aws_sdk_dynamodb::{
    operation::transact_write_items::TransactWriteItemsError,
    types::{
        AttributeValue, CancellationReason, ConditionCheck, Delete, Put, ReturnValuesOnConditionCheckFailure,
        TransactWriteItem, Update,
        error::{ResourceNotFoundException, TransactionCanceledException},
    },
};

use super::{DynamoDbStore, admin::table_missing};
use crate::{
    client::{described, too_late, unavailable},
    layout::{Item, attribute_value},
    statements::Backoff,
};
use sqs_once_core::{
    store::{Cancellation, ClaimStatus, Commit, Committed, StoreError},
    transaction::{Action, Condition, Write},
};

/// The table an action writes or checks.
fn action_table(action: &TransactWriteItem) -> Option<&str> {
    (action.put().map(Put::table_name))
        .or_else(|| action.update().map(Update::table_name))
        .or_else(|| action.delete().map(Delete::table_name))
        .or_else(|| action.condition_check().map(ConditionCheck::table_name))
}

/// The names and values of one action's expressions, aliased.
#[derive(Debug, Default)]
pub(super) struct Expression {
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Expression {
    pub(super) fn name(&mut self, name: &str) -> String {
        if let Some((alias, _)) = self.names.iter().find(|(_, existing)| *existing == name) {
            return alias.clone();
        }
        let alias = format!("#n{}", self.names.len());
        self.names.insert(alias.clone(), name.to_owned());
        alias
    }

    pub(super) fn value(&mut self, value: AttributeValue) -> String {
        let alias = format!(":v{}", self.values.len());
        self.values.insert(alias.clone(), value);
        alias
    }

    pub(super) fn condition(&mut self, condition: &Condition) -> Result<String, StoreError> {
        Ok(match condition {
            Condition::Exists(name) => format!("attribute_exists({})", self.name(name)),
            Condition::NotExists(name) => format!("attribute_not_exists({})", self.name(name)),
            Condition::Compare(name, comparison, value) => {
                let name = self.name(name);
                format!("{name} {} {}", comparison.operator(), self.value(attribute_value(value)))
            }
            Condition::BeginsWith(name, prefix) => {
                let name = self.name(name);
                format!("begins_with({name}, {})", self.value(AttributeValue::S(prefix.clone())))
            }
            Condition::And(left, right) => format!("({}) AND ({})", self.condition(left)?, self.condition(right)?),
            Condition::Or(left, right) => format!("({}) OR ({})", self.condition(left)?, self.condition(right)?),
            Condition::Not(inner) => format!("NOT ({})", self.condition(inner)?),
            unknown => return Err(unknown_to_this_store(unknown)),
        })
    }

    /// `SET … REMOVE … ADD …`, each clause once, actions in order within it.
    fn update(&mut self, actions: &[Action]) -> Result<String, StoreError> {
        self.update_with(actions, Vec::new(), Vec::new())
    }

    /// [`update`](Self::update), with `set` and `add` (clauses' parts, their
    /// names and values aliased already) after the actions' own.
    pub(super) fn update_with(
        &mut self,
        actions: &[Action],
        extra_set: Vec<String>,
        extra_add: Vec<String>,
    ) -> Result<String, StoreError> {
        let (mut set, mut remove, mut add) = (Vec::new(), Vec::new(), Vec::new());
        for action in actions {
            let name = self.name(action.attribute());
            match action {
                Action::Set(_, value) => set.push(format!("{name} = {}", self.value(attribute_value(value)))),
                Action::SetIfAbsent(_, value) => {
                    set.push(format!("{name} = if_not_exists({name}, {})", self.value(attribute_value(value))))
                }
                Action::Add(_, amount) => {
                    add.push(format!("{name} {}", self.value(AttributeValue::N(amount.to_string()))))
                }
                Action::Remove(_) => remove.push(name),
                unknown => return Err(unknown_to_this_store(unknown)),
            }
        }
        set.extend(extra_set);
        add.extend(extra_add);
        Ok([("SET", set), ("REMOVE", remove), ("ADD", add)]
            .into_iter()
            .filter(|(_, parts)| !parts.is_empty())
            .map(|(clause, parts)| format!("{clause} {}", parts.join(", ")))
            .collect::<Vec<_>>()
            .join(" "))
    }

    pub(super) fn names(&self) -> Option<HashMap<String, String>> {
        Some(self.names.clone()).filter(|names| !names.is_empty())
    }

    pub(super) fn values(&self) -> Option<HashMap<String, AttributeValue>> {
        Some(self.values.clone()).filter(|values| !values.is_empty())
    }
}

/// One staged write as a transaction's action.
fn action(write: &Write) -> Result<TransactWriteItem, StoreError> {
    let invalid = |error: aws_sdk_dynamodb::error::BuildError| StoreError::Rejected(error.to_string());
    let Some(target) = write.target() else {
        let Write::Sdk(item) = write else { unreachable!("only SDK actions have no target") };
        return Ok((**item).clone());
    };
    let mut expression = Expression::default();
    let condition = target.condition.as_ref().map(|condition| expression.condition(condition)).transpose()?;
    let key: Item =
        target.key.attributes().iter().map(|(name, value)| (name.clone(), attribute_value(value))).collect();
    let item = match write {
        Write::Put(put) => {
            let item = put.full_item().iter().map(|(name, value)| (name.clone(), attribute_value(value))).collect();
            let put = Put::builder()
                .table_name(&target.table)
                .set_item(Some(item))
                .set_condition_expression(condition)
                .set_expression_attribute_names(expression.names())
                .set_expression_attribute_values(expression.values());
            TransactWriteItem::builder().put(put.build().map_err(invalid)?)
        }
        Write::Update(update) => {
            let update_expression = expression.update(update.actions())?;
            let update = Update::builder()
                .table_name(&target.table)
                .set_key(Some(key))
                .update_expression(update_expression)
                .set_condition_expression(condition)
                .set_expression_attribute_names(expression.names())
                .set_expression_attribute_values(expression.values());
            TransactWriteItem::builder().update(update.build().map_err(invalid)?)
        }
        Write::Delete(_) => {
            let delete = Delete::builder()
                .table_name(&target.table)
                .set_key(Some(key))
                .set_condition_expression(condition)
                .set_expression_attribute_names(expression.names())
                .set_expression_attribute_values(expression.values());
            TransactWriteItem::builder().delete(delete.build().map_err(invalid)?)
        }
        Write::Check(_) | Write::Sdk(_) => {
            let check = ConditionCheck::builder()
                .table_name(&target.table)
                .set_key(Some(key))
                .set_condition_expression(condition)
                .set_expression_attribute_names(expression.names())
                .set_expression_attribute_values(expression.values());
            TransactWriteItem::builder().condition_check(check.build().map_err(invalid)?)
        }
        unknown => return Err(unknown_to_this_store(unknown)),
    };
    Ok(item.build())
}

/// A staged write, action or condition of a kind this store cannot express:
/// only a core newer than the store makes one (the crates are released together).
fn unknown_to_this_store(unknown: &dyn std::fmt::Debug) -> StoreError {
    StoreError::Rejected(format!("the DynamoDB store cannot express {unknown:?}: a newer sqs-once-core than the store"))
}

/// How each action of a cancelled transaction fared: DynamoDB's code (`None`
/// when it had no error), its message, and the item it returned.
struct Reason {
    code: Option<String>,
    message: Option<String>,
    item: Option<Item>,
}

impl Reason {
    fn of(reason: &CancellationReason) -> Self {
        let code = reason.code().filter(|code| *code != "None").map(str::to_owned);
        let item = reason.item().filter(|item| !item.is_empty()).cloned();
        Self { code, message: reason.message().map(str::to_owned), item }
    }

    fn is(&self, code: &str) -> bool {
        self.code.as_deref() == Some(code)
    }
}

/// The reasons of a cancellation: as the answer lists them, or, when it does
/// not, from the codes its message names ("… reasons [None,
/// ConditionalCheckFailed]").
fn reasons(cancelled: &TransactionCanceledException) -> Vec<Reason> {
    if !cancelled.cancellation_reasons().is_empty() {
        return cancelled.cancellation_reasons().iter().map(Reason::of).collect();
    }
    let message = cancelled.message().unwrap_or_default();
    let listed = message.rsplit_once('[').and_then(|(_, rest)| rest.split_once(']')).map(|(codes, _)| codes);
    listed
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|code| !code.is_empty())
        .map(|code| Reason { code: Some(code.to_owned()).filter(|code| code != "None"), message: None, item: None })
        .collect()
}

/// Codes on which the same transaction may well succeed if sent again.
const TRANSIENT: &[&str] = &[
    "TransactionConflict",
    "ThrottlingError",
    "ProvisionedThroughputExceeded",
    "RequestLimitExceeded",
    "InternalServerError",
];

/// How long after a transaction's first attempt one more goes out when
/// DynamoDB answers `TransactionInProgressException`: at least five
/// seconds, DynamoDB's recommendation for recovering a transaction stuck in
/// progress.
const IN_PROGRESS_RETRY: std::time::Duration = std::time::Duration::from_millis(5_100);

/// What a cancellation means for the commit.
enum Judged {
    Done(Result<Committed, StoreError>),
    /// Throttled or in conflict with another transaction: send it again.
    Again(String),
}

impl DynamoDbStore {
    /// [`CommitStore::commit`](sqs_once_core::store::CommitStore::commit) as one
    /// `TransactWriteItems`, sent again (same token, same actions) while
    /// DynamoDB cancels it for conflicts or throttling, up to
    /// [`sqs_once_aws::MAX_ATTEMPTS`] times. A transaction another request of
    /// the same token holds in progress is sent again until an attempt goes
    /// out [`IN_PROGRESS_RETRY`] after the first, as DynamoDB asks: that
    /// attempt makes it recover a transaction stuck half-way.
    pub(super) async fn commit_transaction(
        &self,
        id: &str,
        token: &str,
        commit: &Commit,
    ) -> Result<Committed, StoreError> {
        let actions = self.actions(id, token, commit)?;
        let send_by_ms = commit.send_by_ms();
        let mut backoff = Backoff::default();
        let mut attempts = 0;
        let first = tokio::time::Instant::now();
        loop {
            attempts += 1;
            if let Some(late) = too_late(send_by_ms) {
                return Err(late);
            }
            let sent_at = tokio::time::Instant::now();
            let sent = self
                .client
                .transact_write_items()
                .set_transact_items(Some(actions.clone()))
                .client_request_token(token)
                .customize()
                // Checked again before each of the SDK's own attempts: a freeze can hold one for hours.
                .map_request(move |request| too_late(send_by_ms).map_or(Ok(request), Err))
                .send()
                .await;
            let (again, in_progress) = match sent {
                Ok(_) => return Ok(Committed::Applied),
                Err(error) => match error.into_service_error() {
                    TransactWriteItemsError::TransactionCanceledException(cancelled) => {
                        match self.judge(id, token, commit, &cancelled).await {
                            Judged::Done(committed) => return committed,
                            Judged::Again(reason) => (reason, false),
                        }
                    }
                    TransactWriteItemsError::TransactionInProgressException(in_progress) => {
                        (described(&in_progress), true)
                    }
                    // The token was used with other actions: only an earlier
                    // attempt of this commit can have used it; the claim says
                    // whether it applied.
                    TransactWriteItemsError::IdempotentParameterMismatchException(_) => {
                        return self.judge_claim(id, token, commit, None).await;
                    }
                    TransactWriteItemsError::ResourceNotFoundException(missing) => {
                        return Err(self.missing_tables(&actions, &missing).await);
                    }
                    other => return Err(unavailable(other)),
                },
            };
            let recovery_due = in_progress && sent_at < first + IN_PROGRESS_RETRY;
            if attempts >= sqs_once_aws::MAX_ATTEMPTS && !recovery_due {
                return Err(StoreError::unavailable(format!("transaction not committed: {again}")));
            }
            tracing::debug!(id, reason = %again, "transaction cancelled for now; sending it again");
            match recovery_due && attempts >= sqs_once_aws::MAX_ATTEMPTS {
                true => tokio::time::sleep_until(first + IN_PROGRESS_RETRY).await,
                false => backoff.wait().await,
            }
        }
    }

    /// Why DynamoDB answered `ResourceNotFoundException` to a transaction
    /// of `actions`: the handler's tables it names that DynamoDB says do not
    /// exist (misnamed or not created: a mistake no resend mends, and the
    /// record fails for good naming them). When no handler table is found
    /// missing (the claim table is, or `DescribeTable` is not allowed), an
    /// outage, sent again later, its reason naming the tables to look at.
    async fn missing_tables(&self, actions: &[TransactWriteItem], answer: &ResourceNotFoundException) -> StoreError {
        let mut tables: Vec<&str> = actions.iter().filter_map(action_table).collect();
        tables.sort_unstable();
        tables.dedup();
        let mut missing = Vec::new();
        for table in tables.iter().filter(|table| **table != self.layout.table) {
            if table_missing(&self.client, table).await {
                missing.push(format!("`{table}`"));
            }
        }
        if missing.is_empty() {
            let named: Vec<String> = tables.iter().map(|table| format!("`{table}`")).collect();
            return StoreError::unavailable(format!(
                "a table of the transaction does not exist ({}): one of {}; allow dynamodb:DescribeTable on the \
                 handler's tables to have it named and the record failed for good",
                described(answer),
                named.join(", ")
            ));
        }
        let (noun, verb) = if missing.len() == 1 { ("table", "does") } else { ("tables", "do") };
        StoreError::Rejected(format!(
            "the handler's {noun} {} {verb} not exist ({}): create it, or correct the table the handler stages its \
             writes to",
            missing.join(", "),
            described(answer)
        ))
    }

    /// The transaction's actions: the claim's completion, the writes, the
    /// outbox entries.
    fn actions(&self, id: &str, token: &str, commit: &Commit) -> Result<Vec<TransactWriteItem>, StoreError> {
        let claim_key = self.layout.key(id);
        let own_item = commit.writes.iter().filter_map(Write::target).find(|target| {
            target.table == self.layout.table
                && target
                    .key
                    .attributes()
                    .iter()
                    .all(|(name, value)| claim_key.get(name).is_some_and(|claim| *claim == attribute_value(value)))
        });
        if let Some(target) = own_item {
            return Err(StoreError::Rejected(format!(
                "a staged write ({}) is about the claim's own item; a transaction takes one action per item",
                target.describe()
            )));
        }
        let mut actions = vec![self.claim_action(id, token, commit)?];
        for write in &commit.writes {
            actions.push(action(write)?);
        }
        for entry in &commit.outbox {
            let put = Put::builder()
                .table_name(&self.layout.table)
                .set_item(Some(self.layout.outbox_item(entry)?))
                .condition_expression("attribute_not_exists(#id)")
                .expression_attribute_names("#id", &self.layout.attributes.id)
                .build()
                .map_err(|error| StoreError::Rejected(error.to_string()))?;
            actions.push(TransactWriteItem::builder().put(put).build());
        }
        Ok(actions)
    }

    /// The claim's action: the conditional update that finishes the claim
    /// in progress, or, for an unclaimed commit, the put of its claim
    /// finished, conditioned on the key being free (as a claim is). Either
    /// returns the claim as it stood when its condition fails.
    fn claim_action(&self, id: &str, token: &str, commit: &Commit) -> Result<TransactWriteItem, StoreError> {
        let invalid = |error: aws_sdk_dynamodb::error::BuildError| StoreError::Rejected(error.to_string());
        let returned = ReturnValuesOnConditionCheckFailure::AllOld;
        if let (Some(unclaimed), Some(claim)) = (&commit.unclaimed, commit.finished_claim(None)) {
            let free = self.layout.free_condition(unclaimed.now_ms);
            let put = Put::builder()
                .table_name(&self.layout.table)
                .set_item(Some(self.layout.write_item(&claim)))
                .condition_expression(free.condition)
                .set_expression_attribute_names(Some(free.names))
                .set_expression_attribute_values(Some(free.values))
                .return_values_on_condition_check_failure(returned);
            return Ok(TransactWriteItem::builder().put(put.build().map_err(invalid)?).build());
        }
        let finish = self.layout.finish_update(id, token, &commit.finish);
        let update = Update::builder()
            .table_name(&self.layout.table)
            .set_key(Some(self.layout.key(id)))
            .update_expression(finish.update)
            .condition_expression(finish.condition)
            .set_expression_attribute_names(Some(finish.names))
            .set_expression_attribute_values(Some(finish.values))
            .return_values_on_condition_check_failure(returned);
        Ok(TransactWriteItem::builder().update(update.build().map_err(invalid)?).build())
    }

    async fn judge(&self, id: &str, token: &str, commit: &Commit, cancelled: &TransactionCanceledException) -> Judged {
        let reasons = reasons(cancelled);
        let text = self.reasons_text(commit, &reasons, cancelled.message());
        if let Some(claim) = reasons.first().filter(|claim| claim.is("ConditionalCheckFailed")) {
            return Judged::Done(self.judge_claim(id, token, commit, claim.item.as_ref()).await);
        }
        if reasons.iter().any(|reason| reason.is("ValidationError") || reason.is("ItemCollectionSizeLimitExceeded")) {
            return Judged::Done(Err(StoreError::Rejected(text)));
        }
        let writes = commit.writes.len();
        if let Some(write) = reasons.iter().skip(1).take(writes).position(|reason| reason.is("ConditionalCheckFailed"))
        {
            return Judged::Done(Ok(Committed::Cancelled(Cancellation::by(&commit.writes, write, text))));
        }
        let failing = reasons.iter().filter_map(|reason| reason.code.as_deref());
        if reasons.is_empty() || failing.clone().all(|code| TRANSIENT.contains(&code)) {
            return Judged::Again(text);
        }
        Judged::Done(Err(StoreError::unavailable(text)))
    }

    /// What the claim says of a commit whose claim condition failed, or
    /// whose token DynamoDB saw with other actions: applied if the claim is
    /// completed under our token (an earlier attempt applied unseen), not
    /// confirmed if it is still ours and in progress; otherwise refused,
    /// or for an unclaimed commit the key taken, by the claim returned.
    /// `returned` is the claim as DynamoDB returned it; without it, the
    /// claim is read.
    async fn judge_claim(
        &self,
        id: &str,
        token: &str,
        commit: &Commit,
        returned: Option<&Item>,
    ) -> Result<Committed, StoreError> {
        let claim = match returned {
            Some(item) => Some(self.layout.read_item(item)?),
            None => self.get_one(id).await?,
        };
        let ours = claim.as_ref().filter(|claim| claim.token.as_deref() == Some(token)).map(|claim| claim.status);
        match ours {
            Some(ClaimStatus::Completed) => Ok(Committed::Applied),
            Some(ClaimStatus::InProgress) if commit.unclaimed.is_none() => Err(StoreError::unavailable(
                "DynamoDB saw the transaction's token with other actions, and the claim is still in progress",
            )),
            _ if commit.unclaimed.is_some() => Ok(Committed::Taken(claim.map(Box::new))),
            _ => Ok(Committed::Refused),
        }
    }

    /// Each action that failed, named: the claim, a write (by its place and
    /// what it is), or an outbox entry.
    fn reasons_text(&self, commit: &Commit, reasons: &[Reason], message: Option<&str>) -> String {
        let writes = commit.writes.len();
        let failed: Vec<String> = reasons
            .iter()
            .enumerate()
            .filter_map(|(index, reason)| {
                let code = reason.code.as_deref()?;
                let action = match index {
                    0 => "the claim's completion".to_owned(),
                    index if index <= writes => {
                        format!("write {} ({})", index - 1, commit.writes[index - 1].describe())
                    }
                    index => format!("outbox entry {}", index - 1 - writes),
                };
                Some(match &reason.message {
                    Some(message) => format!("{action}: {code}: {message}"),
                    None => format!("{action}: {code}"),
                })
            })
            .collect();
        if failed.is_empty() {
            return format!("transaction cancelled: {}", message.unwrap_or("no reason given"));
        }
        format!("transaction cancelled: {}", failed.join("; "))
    }
}

#[cfg(test)]
mod tests {
    // What only DynamoDB does with a commit, answered to measure.
    mod answers;

    use serde_json::json;

    use super::*;
    use sqs_once_core::transaction::{Key, Update as StagedUpdate};

    #[test]
    fn json_values_become_dynamodb_values() {
        let value = json!({"n": 12, "f": 1.5, "b": true, "z": null, "l": [-3, "a"]});
        let AttributeValue::M(map) = attribute_value(&value) else { panic!("not a map") };
        assert_eq!(map["n"], AttributeValue::N("12".into()));
        assert_eq!(map["f"], AttributeValue::N("1.5".into()));
        assert_eq!(map["b"], AttributeValue::Bool(true));
        assert_eq!(map["z"], AttributeValue::Null(true));
        assert_eq!(map["l"], AttributeValue::L(vec![AttributeValue::N("-3".into()), AttributeValue::S("a".into())]));
    }

    #[test]
    fn expressions_alias_every_name_and_value_and_keep_clauses_apart() {
        let mut expression = Expression::default();
        let update = expression.update(&[
            Action::Add("balance".into(), 5.into()),
            Action::Set("updated by".into(), json!("m-1")),
            Action::SetIfAbsent("opened".into(), json!(1)),
            Action::Remove("hold".into()),
        ]);
        assert_eq!(update.unwrap(), "SET #n1 = :v1, #n2 = if_not_exists(#n2, :v2) REMOVE #n3 ADD #n0 :v0");
        let condition = expression.condition(&(Condition::ge("balance", 5).or(!Condition::exists("hold"))));
        assert_eq!(condition.unwrap(), "(#n0 >= :v3) OR (NOT (attribute_exists(#n3)))");
        assert_eq!(expression.names.get("#n1").map(String::as_str), Some("updated by"));
    }

    #[test]
    fn reasons_come_from_the_answer_or_else_from_its_message() {
        let listed = TransactionCanceledException::builder()
            .message("Transaction cancelled, please refer cancellation reasons for specific reasons [None, ConditionalCheckFailed]")
            .build();
        let codes: Vec<_> = reasons(&listed).into_iter().map(|reason| reason.code).collect();
        assert_eq!(codes, [None, Some("ConditionalCheckFailed".to_owned())]);
        let answered = TransactionCanceledException::builder()
            .cancellation_reasons(CancellationReason::builder().code("None").build())
            .cancellation_reasons(CancellationReason::builder().code("TransactionConflict").message("busy").build())
            .message("[ignored]")
            .build();
        let reasons = reasons(&answered);
        assert!(reasons[0].code.is_none() && reasons[1].is("TransactionConflict"));
    }

    #[test]
    fn a_typed_write_becomes_its_transaction_action() {
        let write: Write = StagedUpdate::new("ledger", Key::new("pk", "a"))
            .add("balance", -3)
            .condition(Condition::ge("balance", 3))
            .into();
        let update = action(&write).unwrap().update.unwrap();
        assert_eq!(update.table_name(), "ledger");
        assert_eq!(update.update_expression(), "ADD #n0 :v1");
        assert_eq!(update.condition_expression(), Some("#n0 >= :v0"));
        assert_eq!(update.key()["pk"], AttributeValue::S("a".into()));
        assert_eq!(update.expression_attribute_values().unwrap()[":v1"], AttributeValue::N("-3".into()));
    }
}
