//! The batched requests of the DynamoDB store: claims, completions, failure
//! records and releases as PartiQL statements, up to 25 in one
//! `BatchExecuteStatement`, with the commits that keep their key in their
//! update's item ([`kept_key_update`]), and the reads that follow a refused
//! claim, up to 100 in one strongly consistent `BatchGetItem`.
//!
//! Each statement keeps the condition of the single request it stands for,
//! and DynamoDB applies or refuses each on its own: a batch is a way to send
//! writes, never a transaction, and costs the same write units as the
//! single requests. What a statement cannot express is left to them: an
//! `INSERT` only claims a key no record holds, so a refused one whose record
//! turns out to be free is claimed again with the conditional `PutItem`.

use std::{
    collections::HashMap,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use aws_sdk_dynamodb::{
    Client,
    error::ProvideErrorMetadata,
    types::{
        AttributeValue, BatchStatementErrorCodeEnum, BatchStatementRequest, BatchStatementResponse, KeysAndAttributes,
        ReturnValuesOnConditionCheckFailure,
    },
};

use sqs_once_aws::batched::{BatchCall, Batcher};

use crate::{
    client::{described, too_late},
    layout::{ERROR, Item, OPEN_STATUS, TOKEN, TableLayout, UPDATED_AT, attribute_value, n, open_partition, s, text},
};
use sqs_once_core::{
    store::{ClaimStatus, Finish, StoreError, StoredClaim},
    transaction::{
        Action, Condition, Update,
        item_keys::{KEYS, KEYS_BEFORE, KEYS_SINCE, KeyInItem, MAX_KEYS_PER_WINDOW},
    },
};

/// Requests of each kind on the wire at once until answers say otherwise
/// (the batcher's window). Eight send the claims of a small batch in the
/// first round trip, as a TCP connection's initial window sends a short
/// answer at once; a store that queues them shrinks the window within a
/// few answers.
pub(crate) const IN_FLIGHT: usize = 8;

/// A write statement about one item.
#[derive(Clone)]
pub(crate) struct Statement {
    item: String,
    request: BatchStatementRequest,
    /// The last moment (epoch milliseconds) it may be sent, for a commit's
    /// statement that has one ([`Commit::send_by_ms`](sqs_once_core::store::Commit::send_by_ms)):
    /// checked before every attempt, whether it waited for a slot, a retry
    /// or the thaw of a frozen process.
    send_by_ms: Option<u64>,
}

/// What DynamoDB did with a [`Statement`].
#[derive(Debug)]
pub(crate) enum Written {
    /// The write took effect.
    Applied,
    /// Its condition did not hold (or, for an insert, the item exists); the
    /// item as it stood, when DynamoDB returned it.
    Refused(Option<Item>),
}

/// The batched requests of one store, and whether DynamoDB lets it use them.
#[derive(Debug)]
pub(crate) struct Batches {
    writes: Batcher<Statements>,
    pub(crate) reads: Batcher<Reads>,
    refused: Arc<AtomicBool>,
    /// The commits that keep their key in a handler's item
    /// ([`kept_key_update`]), apart from the claim table's writes: a
    /// handler's table whose policy grants no PartiQL leaves them to single
    /// requests, and the claims' batches alone.
    items: Batcher<Statements>,
    items_refused: Arc<AtomicBool>,
}

/// What a refused kind of batched write asks of the function's policy.
const CLAIMS_GRANT: &str = "grant dynamodb:PartiQLInsert, PartiQLUpdate, PartiQLDelete and BatchGetItem on the table \
                            (template.yaml does) to send claims in batches";
const ITEMS_GRANT: &str = "grant dynamodb:PartiQLUpdate on the handler's tables (template.yaml does on those \
                           HandlerTableArns names) to send the commits that keep their key in an item in batches";

impl Batches {
    pub(crate) fn new(client: &Client, layout: &Arc<TableLayout>) -> Self {
        let refused = Arc::new(AtomicBool::new(false));
        let statements = |refused: &Arc<AtomicBool>, grant| {
            Batcher::new(Arc::new(Statements { client: client.clone(), refused: Arc::clone(refused), grant }))
        };
        let items_refused = Arc::new(AtomicBool::new(false));
        let reads = Reads { client: client.clone(), layout: Arc::clone(layout), refused: Arc::clone(&refused) };
        Self {
            writes: statements(&refused, CLAIMS_GRANT),
            reads: Batcher::new(Arc::new(reads)),
            items: statements(&items_refused, ITEMS_GRANT),
            refused,
            items_refused,
        }
    }

    /// Whether DynamoDB refused a batched request as single requests would
    /// not be refused (see [`note_refusal`]): the store then makes single
    /// requests for the rest of the process.
    pub(crate) fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// Sends the statement `build` makes together with the other writes
    /// waiting, and sends it again while DynamoDB throttles it (see
    /// [`retrying`]); each attempt joins the next request.
    pub(crate) async fn write(&self, build: impl Fn() -> Result<Statement, StoreError>) -> Result<Written, StoreError> {
        retrying(|| async { self.writes.submit(build()?).await }).await
    }

    /// Sends a commit's update of a handler's item ([`kept_key_update`])
    /// together with the others waiting, as [`write`](Self::write) sends a
    /// claim's; `None` when it is to be the single request (see
    /// [`or_single`](Self::or_single)).
    pub(crate) async fn write_to_item(&self, statement: Statement) -> Option<Result<Written, StoreError>> {
        if self.items_refused.load(Ordering::Relaxed) {
            return None;
        }
        let written = retrying(|| async {
            if let Some(late) = too_late(statement.send_by_ms) {
                return Err(late);
            }
            self.items.submit(statement.clone()).await
        })
        .await;
        single_unless_refused(&self.items_refused, written)
    }

    /// The item a refused statement met: as DynamoDB returned it, or read now.
    pub(crate) async fn refused_item(&self, id: &str, returned: Option<Item>) -> Result<Option<Item>, StoreError> {
        match returned {
            Some(item) => Ok(Some(item)),
            None => self.reads.submit(id.to_owned()).await,
        }
    }

    /// A batched call's result, or `None` when the single request must be
    /// made instead: batching was refused, or DynamoDB rejected this
    /// statement for its data (the single request then says for itself).
    pub(crate) fn or_single<T>(&self, result: Result<T, StoreError>) -> Option<Result<T, StoreError>> {
        single_unless_refused(&self.refused, result)
    }

    /// The answer is due by `until`: see [`Batcher::expedite`].
    pub(crate) fn expedite(&self, until: tokio::time::Instant) {
        self.writes.expedite(until);
        self.reads.expedite(until);
        self.items.expedite(until);
    }
}

/// [`Batches::or_single`] of the writes whose refusal `refused` notes.
fn single_unless_refused<T>(refused: &AtomicBool, result: Result<T, StoreError>) -> Option<Result<T, StoreError>> {
    match result {
        Err(StoreError::Rejected(reason)) => {
            tracing::warn!(%reason, "a batched statement was rejected: sending it alone");
            None
        }
        Err(_) if refused.load(Ordering::Relaxed) => None,
        result => Some(result),
    }
}

/// `BatchExecuteStatement`, 25 write statements per request.
pub(crate) struct Statements {
    client: Client,
    refused: Arc<AtomicBool>,
    /// What a refusal for want of permission asks of the policy.
    grant: &'static str,
}

#[async_trait]
impl BatchCall for Statements {
    type Input = Statement;
    type Output = Attempt;
    type Error = StoreError;
    const LIMIT: usize = 25;
    const IN_FLIGHT: usize = IN_FLIGHT;

    fn item(input: &Statement) -> &str {
        &input.item
    }

    fn unanswered(reason: String) -> StoreError {
        StoreError::unavailable(reason)
    }

    fn congested(result: &Result<Attempt, StoreError>) -> bool {
        matches!(result, Ok(Attempt::Again(_)) | Err(StoreError::Unavailable(_)))
    }

    async fn call(&self, inputs: Vec<Statement>) -> Vec<Result<Attempt, StoreError>> {
        // A statement whose time has passed while it waited is not sent; the others go, each of the SDK's
        // attempts held to the earliest time among them (a freeze can hold an attempt for hours).
        let late: Vec<Option<StoreError>> = inputs.iter().map(|statement| too_late(statement.send_by_ms)).collect();
        let sent: Vec<Statement> =
            inputs.into_iter().zip(&late).filter(|(_, late)| late.is_none()).map(|(statement, _)| statement).collect();
        let send_by_ms = sent.iter().filter_map(|statement| statement.send_by_ms).min();
        let mut answers = match sent.is_empty() {
            true => Vec::new(),
            false => self.send(sent, send_by_ms).await,
        }
        .into_iter();
        late.into_iter().map(|late| late.map_or_else(|| answers.next().unwrap_or_else(missing), Err)).collect()
    }
}

impl Statements {
    /// One `BatchExecuteStatement` of `statements`, none of its attempts
    /// sent past `send_by_ms`; each statement's answer, in order.
    async fn send(&self, statements: Vec<Statement>, send_by_ms: Option<u64>) -> Vec<Result<Attempt, StoreError>> {
        let count = statements.len();
        let requests = statements.into_iter().map(|statement| statement.request).collect();
        let sent = (self.client.batch_execute_statement().set_statements(Some(requests)).customize())
            .map_request(move |request| too_late(send_by_ms).map_or(Ok(request), Err))
            .send()
            .await;
        match sent {
            Ok(output) => {
                let mut responses = output.responses.unwrap_or_default().into_iter();
                (0..count).map(|_| answer(responses.next(), &self.refused, self.grant)).collect()
            }
            Err(error) => {
                let error = error.into_service_error();
                note_refusal(&self.refused, error.code(), error.message(), "BatchExecuteStatement", self.grant);
                each(count, &described(&error))
            }
        }
    }
}

/// The answer of a statement DynamoDB's answer left out.
fn missing() -> Result<Attempt, StoreError> {
    Err(StoreError::unavailable("DynamoDB answered fewer statements than were sent"))
}

/// What DynamoDB's answer to one statement means.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// Applied or refused: the statement's outcome.
    Done(Written),
    /// Throttled, or failed inside DynamoDB: the statement was not applied,
    /// and sending it again may succeed.
    Again(String),
}

fn answer(response: Option<BatchStatementResponse>, refused: &AtomicBool, grant: &str) -> Result<Attempt, StoreError> {
    use BatchStatementErrorCodeEnum as Code;
    let Some(response) = response else { return missing() };
    let Some(error) = response.error else { return Ok(Attempt::Done(Written::Applied)) };
    let code = error.code.as_ref().map_or("unknown error", Code::as_str);
    let reason = format!("DynamoDB: {code}: {}", error.message.as_deref().unwrap_or("no message"));
    match error.code {
        Some(Code::ConditionalCheckFailed | Code::DuplicateItem) => {
            Ok(Attempt::Done(Written::Refused(error.item.filter(|item| !item.is_empty()))))
        }
        Some(
            Code::ThrottlingError
            | Code::ProvisionedThroughputExceeded
            | Code::RequestLimitExceeded
            | Code::InternalServerError
            | Code::TransactionConflict,
        ) => Ok(Attempt::Again(reason)),
        // A statement that DynamoDB does not allow: the single request it
        // stands for may well be allowed, and so are those of every record.
        Some(Code::AccessDenied) => {
            note_refusal(refused, Some(code), error.message.as_deref(), "a PartiQL statement", grant);
            Err(StoreError::unavailable(reason))
        }
        // Refused for its data (an item over 400 KB, a key too long), or for
        // a table that is not there: this statement alone is sent again as a
        // single request, which says for itself (a missing table fails for
        // good), and batching stays on for everyone else.
        Some(Code::ValidationError | Code::ResourceNotFound) => Err(StoreError::Rejected(reason)),
        _ => Err(StoreError::unavailable(reason)),
    }
}

/// Runs `attempt` until its statement is done, as the SDK retries a single
/// request: up to [`sqs_once_aws::MAX_ATTEMPTS`] attempts, with a [`Backoff`]
/// between them. (The SDK itself retries a request that failed as a whole.)
async fn retrying<Sent>(attempt: impl Fn() -> Sent) -> Result<Written, StoreError>
where
    Sent: Future<Output = Result<Attempt, StoreError>>,
{
    let mut backoff = Backoff::default();
    let mut attempts = 1;
    loop {
        match attempt().await? {
            Attempt::Done(written) => return Ok(written),
            Attempt::Again(reason) if attempts >= sqs_once_aws::MAX_ATTEMPTS => {
                return Err(StoreError::unavailable(reason));
            }
            Attempt::Again(_) => {
                backoff.wait().await;
                attempts += 1;
            }
        }
    }
}

/// Pauses between attempts, spaced as the SDK spaces its retries: doubling
/// from [`sqs_once_aws::INITIAL_BACKOFF`] to [`sqs_once_aws::MAX_BACKOFF`], each
/// between half and all of its step.
pub(crate) struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(sqs_once_aws::INITIAL_BACKOFF)
    }
}

impl Backoff {
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.0.mul_f64(0.5 + fastrand::f64() / 2.0)).await;
        self.0 = (self.0 * 2).min(sqs_once_aws::MAX_BACKOFF);
    }
}

/// Strongly consistent `BatchGetItem`, 100 keys per request.
pub(crate) struct Reads {
    client: Client,
    layout: Arc<TableLayout>,
    refused: Arc<AtomicBool>,
}

#[async_trait]
impl BatchCall for Reads {
    type Input = String;
    type Output = Option<Item>;
    type Error = StoreError;
    const LIMIT: usize = 100;
    const IN_FLIGHT: usize = IN_FLIGHT;

    fn item(input: &String) -> &str {
        input
    }

    fn unanswered(reason: String) -> StoreError {
        StoreError::unavailable(reason)
    }

    fn congested(result: &Result<Option<Item>, StoreError>) -> bool {
        matches!(result, Err(StoreError::Unavailable(_)))
    }

    async fn call(&self, ids: Vec<String>) -> Vec<Result<Option<Item>, StoreError>> {
        let layout = &self.layout;
        let keys = ids.iter().map(|id| layout.key(id)).collect();
        let request = KeysAndAttributes::builder().set_keys(Some(keys)).consistent_read(true).build();
        let mut unprocessed = match request {
            Ok(request) => Some(request),
            Err(error) => return each(ids.len(), &error.to_string()),
        };
        let mut found = HashMap::new();
        let mut backoff = Backoff::default();
        // Keys DynamoDB leaves unprocessed (it does so under throttling) are
        // asked for again, as often and as spaced as a throttled statement.
        for round in 1..=sqs_once_aws::MAX_ATTEMPTS {
            let Some(request) = unprocessed.take() else { break };
            if round > 1 {
                backoff.wait().await;
            }
            let mut output = match self.client.batch_get_item().request_items(&layout.table, request).send().await {
                Ok(output) => output,
                Err(error) => {
                    let error = error.into_service_error();
                    note_refusal(&self.refused, error.code(), error.message(), "BatchGetItem", CLAIMS_GRANT);
                    return each(ids.len(), &described(&error));
                }
            };
            let items = output.responses.as_mut().and_then(|tables| tables.remove(&layout.table));
            for item in items.unwrap_or_default() {
                if let Some(id) = text(&item, &layout.attributes.id) {
                    found.insert(id, item);
                }
            }
            unprocessed = output
                .unprocessed_keys
                .and_then(|mut tables| tables.remove(&layout.table))
                .filter(|left| !left.keys.is_empty());
        }
        let left_over = unprocessed.is_some();
        ids.iter()
            .map(|id| match found.remove(id) {
                Some(item) => Ok(Some(item)),
                None if left_over => Err(StoreError::unavailable("DynamoDB left the read of the claim unprocessed")),
                None => Ok(None),
            })
            .collect()
    }
}

/// The same failure, for each of `count` inputs.
fn each<T>(count: usize, reason: &str) -> Vec<Result<T, StoreError>> {
    (0..count).map(|_| Err(StoreError::unavailable(reason.to_owned()))).collect()
}

/// Rejections of a batched request that the single requests it stands for
/// would not meet: not allowed (IAM grants the single actions only), or not
/// accepted in this form (an endpoint without PartiQL, or one that refuses a
/// parameter of the batched form). Throttling, server errors and network
/// failures are not among them: single requests would meet them too.
const REFUSALS: &[&str] =
    &["AccessDeniedException", "AccessDenied", "ValidationException", "ValidationError", "UnknownOperationException"];

/// Remembers, and says once with DynamoDB's reason, that DynamoDB refused a
/// batched request as single requests would not be refused.
fn note_refusal(refused: &AtomicBool, code: Option<&str>, message: Option<&str>, request: &str, grant: &str) {
    let Some(code) = code.filter(|code| REFUSALS.contains(code)) else { return };
    if refused.swap(true, Ordering::Relaxed) {
        return;
    }
    let reason = format!("{code}: {}", message.unwrap_or("no message"));
    if code.starts_with("AccessDenied") {
        tracing::warn!(
            %reason,
            "DynamoDB denied {request}: making single requests from now on; {grant}, or set \
             SQS_ONCE_DYNAMODB_BATCHING=false"
        );
    } else {
        tracing::warn!(
            %reason,
            "DynamoDB refused {request}: making single requests from now on (set \
             SQS_ONCE_DYNAMODB_BATCHING=false to start with them)"
        );
    }
}

impl TableLayout {
    /// Claims a key no record holds: `INSERT` fails on an existing item.
    pub(crate) fn insert(&self, record: &StoredClaim) -> Result<Statement, StoreError> {
        let fields = self.fields(record);
        let mut statement = Partiql::new("INSERT INTO ", &self.table, fields.len());
        statement.text(" VALUE {");
        for (index, (name, value)) in fields.into_iter().enumerate() {
            statement.text(if index == 0 { "" } else { ", " }).literal(name).text(": ").parameter(value);
        }
        statement.text("}");
        statement.build(&record.id)
    }

    /// [`super::DynamoDbStore`]'s finishing `UpdateItem`, as a statement.
    pub(crate) fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Statement, StoreError> {
        let names = &self.attributes;
        let mut set = vec![
            (names.status.as_str(), s(finish.status.as_str())),
            (names.expiry.as_str(), n(finish.expires_at_s)),
            (UPDATED_AT, n(finish.finished_at_ms)),
        ];
        set.extend(finish.result.as_deref().map(|result| (names.data.as_str(), s(result))));
        set.extend(finish.error.as_deref().map(|error| (ERROR, s(error))));
        // A failed claim stays in the open-claims index; a completed one leaves it.
        let mut remove = vec![names.lease.as_str()];
        match finish.status {
            ClaimStatus::Failed => set.push((OPEN_STATUS, s(open_partition(finish.status, id)))),
            _ => remove.push(OPEN_STATUS),
        }
        let mut statement = Partiql::new("UPDATE ", &self.table, set.len() + 4);
        for (name, value) in set {
            statement.text(" SET ").identifier(name).text(" = ").parameter(value);
        }
        for name in remove {
            statement.text(" REMOVE ").identifier(name);
        }
        self.held_by(&mut statement, id, token);
        statement.build(id)
    }

    /// [`super::DynamoDbStore`]'s releasing `DeleteItem`, as a statement.
    pub(crate) fn release(&self, id: &str, token: &str) -> Result<Statement, StoreError> {
        let mut statement = Partiql::new("DELETE FROM ", &self.table, 4);
        self.held_by(&mut statement, id, token);
        statement.build(id)
    }

    /// [`super::DynamoDbStore`]'s deletion of a sent outbox entry, as a statement.
    pub(crate) fn delete_outbox(&self, id: &str, token: &str) -> Result<Statement, StoreError> {
        let mut statement = Partiql::new("DELETE FROM ", &self.table, 3);
        self.of_item(&mut statement, id);
        statement.text(" AND ").identifier(TOKEN).text(" = ").parameter(s(token));
        statement.build(id)
    }

    /// The `WHERE` clause of a finishing write: the item, still in progress
    /// under `token`.
    fn held_by(&self, statement: &mut Partiql, id: &str, token: &str) {
        self.of_item(statement, id);
        statement.text(" AND ").identifier(&self.attributes.status).text(" = ");
        statement.parameter(s(ClaimStatus::InProgress.as_str()));
        statement.text(" AND ").identifier(TOKEN).text(" = ").parameter(s(token));
    }

    /// `WHERE` the item's key attributes are `id`'s.
    fn of_item(&self, statement: &mut Partiql, id: &str) {
        for (index, (name, value)) in self.key_fields(id).enumerate() {
            statement.text(if index == 0 { " WHERE " } else { " AND " }).identifier(name).text(" = ");
            statement.parameter(s(value));
        }
    }
}

/// A commit whose key is kept in its update's item
/// ([`super::in_item`]), sent for the window under way in the item: the
/// update's actions, the key's digest added to the window's keys, on the
/// conditions of the `UpdateItem` it stands for (the window began after
/// one key memory ago, holds neither window's digest and has room; the
/// handler's own condition). `None` when PartiQL has no form for one of the
/// update's actions or conditions (`SetIfAbsent`), which the single request
/// then sends. `item` names the item to the batcher.
///
/// The statement applies where the request would, and only there: its
/// conditions are the request's, written in PartiQL. Where PartiQL reads a
/// comparison with a missing attribute as `MISSING` rather than false (under
/// a `NOT`, it would refuse what the request applies), the caller sends a
/// refusal that the item's keys do not explain as the single request,
/// which decides.
pub(crate) fn kept_key_update(
    update: &Update,
    key: &KeyInItem,
    item: &str,
    send_by_ms: Option<u64>,
) -> Option<Result<Statement, StoreError>> {
    let target = update.target();
    let mut statement = Partiql::new("UPDATE ", &target.table, update.actions().len() + 8);
    for action in update.actions() {
        match action {
            Action::Set(name, value) => {
                statement.text(" SET ").identifier(name).text(" = ").parameter(attribute_value(value));
            }
            Action::Add(name, amount) => {
                statement.text(" SET ").identifier(name).text(" = ").identifier(name).text(" + ");
                statement.parameter(AttributeValue::N(amount.to_string()));
            }
            Action::Remove(name) => _ = statement.text(" REMOVE ").identifier(name),
            // `if_not_exists` has no PartiQL form; nor has what a later core adds.
            _ => return None,
        }
    }
    statement.text(" SET ").identifier(KEYS).text(" = set_add(").identifier(KEYS).text(", ");
    statement.parameter(AttributeValue::Ss(vec![key.digest.clone()])).text(")");
    for (index, (name, value)) in target.key.attributes().iter().enumerate() {
        statement.text(if index == 0 { " WHERE " } else { " AND " }).identifier(name).text(" = ");
        statement.parameter(attribute_value(value));
    }
    statement.text(" AND ").identifier(KEYS_SINCE).text(" > ").parameter(n(key.memories_ago_ms(1)));
    // A window begun too late for the commit holds for no send of it, however late (KeyInItem::too_late_from_ms).
    statement.text(" AND ").identifier(KEYS_SINCE).text(" < ").parameter(n(key.too_late_from_ms()));
    for keys in [KEYS, KEYS_BEFORE] {
        statement.text(" AND NOT contains(").identifier(keys).text(", ");
        statement.parameter(s(key.digest.as_str())).text(")");
    }
    statement.text(" AND size(").identifier(KEYS).text(") < ").parameter(n(MAX_KEYS_PER_WINDOW));
    if let Some(condition) = &target.condition {
        statement.text(" AND (");
        statement.condition(condition)?;
        statement.text(")");
    }
    Some(statement.build(item).map(|statement| Statement { send_by_ms, ..statement }))
}

/// A PartiQL statement as it is written: its text and its parameters. A
/// parameter's `?` and its value go in together, so they stay in order;
/// the text grows in one buffer, since a batch of new records writes two
/// statements per record.
struct Partiql {
    text: String,
    parameters: Vec<AttributeValue>,
}

impl Partiql {
    /// A statement beginning with `verb` on `table`, expecting about
    /// `parameters` parameters.
    fn new(verb: &str, table: &str, parameters: usize) -> Self {
        let mut statement = Self { text: String::with_capacity(96 + 32 * parameters), parameters: Vec::new() };
        statement.parameters.reserve_exact(parameters);
        statement.text(verb).identifier(table);
        statement
    }

    fn text(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// A table or attribute name, quoted.
    fn identifier(&mut self, name: &str) -> &mut Self {
        self.quoted(name, '"')
    }

    /// A string literal (an attribute name in a `VALUE` tuple), quoted.
    fn literal(&mut self, name: &str) -> &mut Self {
        self.quoted(name, '\'')
    }

    /// `name` between `quote`s, each `quote` in it doubled, as PartiQL escapes them.
    fn quoted(&mut self, name: &str, quote: char) -> &mut Self {
        self.text.push(quote);
        for part in name.split_inclusive(quote) {
            self.text.push_str(part);
            if part.ends_with(quote) {
                self.text.push(quote);
            }
        }
        self.text.push(quote);
        self
    }

    /// A write's own condition, as PartiQL writes it; `None` for one it has
    /// no form for.
    fn condition(&mut self, condition: &Condition) -> Option<&mut Self> {
        match condition {
            Condition::Exists(name) => _ = self.identifier(name).text(" IS NOT MISSING"),
            Condition::NotExists(name) => _ = self.identifier(name).text(" IS MISSING"),
            Condition::Compare(name, comparison, value) => {
                self.identifier(name).text(" ").text(comparison.operator()).text(" ");
                self.parameter(attribute_value(value));
            }
            Condition::BeginsWith(name, prefix) => {
                self.text("begins_with(").identifier(name).text(", ").parameter(s(prefix.as_str())).text(")");
            }
            Condition::And(left, right) | Condition::Or(left, right) => {
                let joined = if matches!(condition, Condition::And(..)) { ") AND (" } else { ") OR (" };
                self.text("(").condition(left)?.text(joined).condition(right)?.text(")");
            }
            Condition::Not(inner) => _ = self.text("NOT (").condition(inner)?.text(")"),
            _ => return None,
        }
        Some(self)
    }

    fn parameter(&mut self, value: AttributeValue) -> &mut Self {
        self.text.push('?');
        self.parameters.push(value);
        self
    }

    /// The statement about item `id`, asking for the item as it stood when
    /// its condition fails.
    fn build(self, id: &str) -> Result<Statement, StoreError> {
        let request = BatchStatementRequest::builder()
            .statement(self.text)
            .set_parameters(Some(self.parameters))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(StoreError::unavailable)?;
        Ok(Statement { item: id.to_owned(), request, send_by_ms: None })
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::types::BatchStatementError;

    use super::*;

    // What the statements write and on which conditions is checked by behaviour, not by their text: the
    // claim suite runs against DynamoDB Local with batched writes on both table layouts
    // (tests/claims_dynamodb.rs). Only PartiQL's quoting rules, which no table there exercises, are here.
    #[test]
    fn names_are_quoted_with_their_quotes_doubled() {
        let written = |write: &dyn Fn(&mut Partiql)| {
            let mut statement = Partiql { text: String::new(), parameters: Vec::new() };
            write(&mut statement);
            statement.text
        };
        assert_eq!(written(&|statement| _ = statement.identifier("claims-1.x")), "\"claims-1.x\"");
        assert_eq!(written(&|statement| _ = statement.identifier("odd \"name\"")), "\"odd \"\"name\"\"\"");
        assert_eq!(written(&|statement| _ = statement.literal("it's")), "'it''s'");
        assert_eq!(written(&|statement| _ = statement.literal("''")), "''''''");
    }

    fn refused_with(code: BatchStatementErrorCodeEnum) -> BatchStatementResponse {
        let error = BatchStatementError::builder().code(code).message("no").build();
        BatchStatementResponse::builder().error(error).build()
    }

    #[test]
    fn throttled_statements_are_to_be_sent_again_and_only_they() {
        use BatchStatementErrorCodeEnum as Code;
        let refused = AtomicBool::new(false);
        let outcome = |response| format!("{:?}", answer(Some(response), &refused, CLAIMS_GRANT));
        assert_eq!(outcome(BatchStatementResponse::builder().build()), "Ok(Done(Applied))");
        assert_eq!(outcome(refused_with(Code::ConditionalCheckFailed)), "Ok(Done(Refused(None)))");
        assert_eq!(outcome(refused_with(Code::DuplicateItem)), "Ok(Done(Refused(None)))");
        let transient = [
            Code::ThrottlingError,
            Code::ProvisionedThroughputExceeded,
            Code::RequestLimitExceeded,
            Code::InternalServerError,
            Code::TransactionConflict,
        ];
        for code in transient {
            assert!(outcome(refused_with(code.clone())).starts_with("Ok(Again("), "{code:?}");
        }
        assert!(outcome(refused_with(Code::ItemCollectionSizeLimitExceeded)).starts_with("Err("));
        assert!(!refused.load(Ordering::Relaxed), "single requests would fail the same way");
        assert!(outcome(refused_with(Code::AccessDenied)).starts_with("Err("));
        assert!(refused.load(Ordering::Relaxed), "a denied statement turns batching off");
        // Rejected for its data, or for a table that is gone: the single request says for itself (a missing table
        // fails for good), and batching stays on.
        let refused = AtomicBool::new(false);
        for code in [Code::ValidationError, Code::ResourceNotFound] {
            let rejected = answer(Some(refused_with(code.clone())), &refused, CLAIMS_GRANT);
            assert!(matches!(rejected, Err(StoreError::Rejected(_))), "{code:?}: {rejected:?}");
        }
        assert!(!refused.load(Ordering::Relaxed), "a statement rejected for its data leaves batching on");
    }

    #[tokio::test]
    async fn an_answer_due_hurries_every_batcher_the_kept_keys_one_included() {
        let config = aws_sdk_dynamodb::Config::builder().behavior_version_latest().build();
        let batches = Batches::new(&Client::from_conf(config), &Arc::new(TableLayout::new("claims")));
        batches.expedite(tokio::time::Instant::now() + Duration::from_secs(10));
        assert!(batches.writes.urgent() && batches.reads.urgent(), "the claims' writes and reads");
        assert!(batches.items.urgent(), "the commits that keep their key in an item");
    }

    #[tokio::test]
    async fn a_throttled_statement_is_sent_again_until_it_is_done() {
        let attempts = std::sync::atomic::AtomicU32::new(0);
        let written = retrying(|| async {
            match attempts.fetch_add(1, Ordering::Relaxed) {
                0 => Ok(Attempt::Again("DynamoDB: ThrottlingError: no".into())),
                _ => Ok(Attempt::Done(Written::Applied)),
            }
        })
        .await;
        assert!(matches!(written, Ok(Written::Applied)), "{written:?}");
        assert_eq!(attempts.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_statement_throttled_on_every_attempt_fails_with_the_reason() {
        let attempts = std::sync::atomic::AtomicU32::new(0);
        let written = retrying(|| async {
            attempts.fetch_add(1, Ordering::Relaxed);
            Ok(Attempt::Again("DynamoDB: ProvisionedThroughputExceeded: no".into()))
        })
        .await;
        assert_eq!(attempts.load(Ordering::Relaxed), sqs_once_aws::MAX_ATTEMPTS);
        let error = written.unwrap_err().to_string();
        assert!(error.contains("ProvisionedThroughputExceeded: no"), "{error}");
    }

    #[tokio::test]
    async fn a_request_that_fails_as_a_whole_is_not_sent_again() {
        let attempts = std::sync::atomic::AtomicU32::new(0);
        let written = retrying(|| async {
            attempts.fetch_add(1, Ordering::Relaxed);
            Err(StoreError::unavailable("DynamoDB: dispatch failure"))
        })
        .await;
        assert_eq!(attempts.load(Ordering::Relaxed), 1, "the SDK already retried it");
        assert!(written.unwrap_err().to_string().contains("dispatch"));
    }

    #[test]
    fn an_insert_names_every_attribute_of_the_item_before_its_value() {
        let mut layout = TableLayout::new("claims");
        layout.attributes.status = "it's".into();
        let record = crate::store::tests::failed_claim("k", 5);
        let statement = layout.insert(&record).unwrap();
        let text = statement.request.statement();
        assert!(text.starts_with("INSERT INTO \"claims\" VALUE {"), "{text}");
        let named: Vec<&str> = text["INSERT INTO \"claims\" VALUE {".len()..].split(": ?").collect();
        let names: Vec<&str> = named.iter().map(|name| name.trim_start_matches(", ")).collect();
        let parameters = statement.request.parameters();
        assert_eq!(names.len(), parameters.len() + 1, "{text}");
        let pairs: HashMap<&str, &AttributeValue> = names.into_iter().zip(parameters).collect();
        assert_eq!(pairs["'id'"], &s("k"));
        assert_eq!(pairs["'it''s'"], &s("FAILED"));
        assert_eq!(pairs["'expiration'"], &n(record.expires_at_s));
        assert_eq!(pairs["'token'"], &s("t-k"));
        assert_eq!(pairs["'error'"], &s("asked to fail"));
        assert_eq!(pairs["'claimed_at'"], &n(5));
        assert_eq!(statement.item, "k");
    }
}
