//! The DynamoDB writes a handler stages: put, update, delete and condition
//! check, on any table, with conditions that the in-process stores evaluate
//! exactly as DynamoDB does.

use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};

use super::StageError;
use crate::ErrorKind;

/// An item's primary key: its partition key attribute and, for tables with
/// a sort key, the sort key attribute. Values are strings or numbers.
///
/// ```
/// use sqs_once::transaction::Key;
///
/// let account = Key::new("pk", "acct-1");
/// let entry = Key::new("pk", "acct-1").and("sk", 42);
/// assert_eq!(entry.to_string(), r#"pk="acct-1", sk=42"#);
/// # let _ = account;
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Key(Vec<(String, Value)>);

impl Key {
    /// The key of a table with a partition key only.
    pub fn new(name: impl Into<String>, value: impl Into<Value>) -> Self {
        Self(vec![(name.into(), value.into())])
    }

    /// Adds the sort key attribute.
    pub fn and(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.0.push((name.into(), value.into()));
        self
    }

    /// The key attributes, partition key first.
    pub fn attributes(&self) -> &[(String, Value)] {
        &self.0
    }

    /// Whether `name` is one of the key's attributes.
    pub(crate) fn holds(&self, name: &str) -> bool {
        self.0.iter().any(|(key, _)| key == name)
    }

    /// One or two attributes of distinct names, each a string or a number.
    fn validate(&self) -> Result<(), StageError> {
        let valid_value = |value: &Value| matches!(value, Value::String(text) if !text.is_empty()) || value.is_number();
        let distinct = self.0.len() < 2 || self.0[0].0 != self.0[1].0;
        if !(1..=2).contains(&self.0.len()) || !distinct || !self.0.iter().all(|(_, value)| valid_value(value)) {
            return Err(StageError::InvalidKey(self.to_string()));
        }
        Ok(())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, (name, value)) in self.0.iter().enumerate() {
            let separator = if n == 0 { "" } else { ", " };
            write!(f, "{separator}{name}={value}")?;
        }
        Ok(())
    }
}

/// How two values compare in a [`Condition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Comparison {
    /// `=`
    Eq,
    /// `<>`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl Comparison {
    /// The operator as DynamoDB writes it.
    pub fn operator(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::Ne => "<>",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Ge => ">=",
        }
    }
}

/// A condition on the item a write is about, judged before the transaction
/// applies anything: if it does not hold, nothing of the transaction
/// applies. Attribute names are top-level attributes of the item.
///
/// A comparison with an attribute the item does not have, or of a different
/// type, holds only for [`Condition::ne`], as in DynamoDB. Numbers compare
/// as numbers and strings byte by byte.
///
/// ```
/// use sqs_once::transaction::Condition;
///
/// let open = Condition::eq("status", "open").and(Condition::ge("balance", 10));
/// let new = Condition::not_exists("pk");
/// let either = open.or(new);
/// // The same with operators: `&`, `|` and `!`.
/// let same = (Condition::eq("status", "open") & Condition::ge("balance", 10)) | Condition::not_exists("pk");
/// assert_eq!(either, same);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Condition {
    /// The attribute exists.
    Exists(String),
    /// The attribute does not exist.
    NotExists(String),
    /// The attribute compares to the value.
    Compare(String, Comparison, Value),
    /// The attribute is a string starting with the prefix.
    BeginsWith(String, String),
    /// Both hold.
    And(Box<Condition>, Box<Condition>),
    /// Either holds.
    Or(Box<Condition>, Box<Condition>),
    /// It does not hold.
    Not(Box<Condition>),
}

impl Condition {
    /// Whether the condition names `attribute` anywhere.
    fn names(&self, attribute: &str) -> bool {
        match self {
            Self::Exists(name) | Self::NotExists(name) | Self::Compare(name, ..) | Self::BeginsWith(name, _) => {
                name == attribute
            }
            Self::And(left, right) | Self::Or(left, right) => left.names(attribute) || right.names(attribute),
            Self::Not(inner) => inner.names(attribute),
        }
    }

    /// The attribute exists.
    pub fn exists(name: impl Into<String>) -> Self {
        Self::Exists(name.into())
    }

    /// The attribute does not exist (for a key attribute: no such item).
    pub fn not_exists(name: impl Into<String>) -> Self {
        Self::NotExists(name.into())
    }

    /// The attribute equals `value`.
    pub fn eq(name: impl Into<String>, value: impl Into<Value>) -> Self {
        Self::Compare(name.into(), Comparison::Eq, value.into())
    }

    /// The attribute does not equal `value` (or does not exist).
    pub fn ne(name: impl Into<String>, value: impl Into<Value>) -> Self {
        Self::Compare(name.into(), Comparison::Ne, value.into())
    }

    /// The attribute is less than `value`.
    pub fn lt(name: impl Into<String>, value: impl Into<Value>) -> Self {
        Self::Compare(name.into(), Comparison::Lt, value.into())
    }

    /// The attribute is at most `value`.
    pub fn le(name: impl Into<String>, value: impl Into<Value>) -> Self {
        Self::Compare(name.into(), Comparison::Le, value.into())
    }

    /// The attribute is greater than `value`.
    pub fn gt(name: impl Into<String>, value: impl Into<Value>) -> Self {
        Self::Compare(name.into(), Comparison::Gt, value.into())
    }

    /// The attribute is at least `value`.
    pub fn ge(name: impl Into<String>, value: impl Into<Value>) -> Self {
        Self::Compare(name.into(), Comparison::Ge, value.into())
    }

    /// The attribute is a string that starts with `prefix`.
    pub fn begins_with(name: impl Into<String>, prefix: impl Into<String>) -> Self {
        Self::BeginsWith(name.into(), prefix.into())
    }

    /// This and `other`.
    pub fn and(self, other: Condition) -> Self {
        Self::And(Box::new(self), Box::new(other))
    }

    /// This or `other`.
    pub fn or(self, other: Condition) -> Self {
        Self::Or(Box::new(self), Box::new(other))
    }
}

impl std::ops::Not for Condition {
    type Output = Condition;

    fn not(self) -> Condition {
        Condition::Not(Box::new(self))
    }
}

impl std::ops::BitAnd for Condition {
    type Output = Condition;

    fn bitand(self, other: Condition) -> Condition {
        self.and(other)
    }
}

impl std::ops::BitOr for Condition {
    type Output = Condition;

    fn bitor(self, other: Condition) -> Condition {
        self.or(other)
    }
}

/// One change an [`Update`] makes to its item.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Action {
    /// Sets the attribute to the value.
    Set(String, Value),
    /// Sets the attribute to the value unless it exists.
    SetIfAbsent(String, Value),
    /// Adds the number to the attribute; a missing attribute counts as 0.
    Add(String, serde_json::Number),
    /// Removes the attribute.
    Remove(String),
}

impl Action {
    /// The attribute the action changes.
    pub fn attribute(&self) -> &str {
        match self {
            Self::Set(name, _) | Self::SetIfAbsent(name, _) | Self::Add(name, _) | Self::Remove(name) => name,
        }
    }
}

/// How the handler fails when a write's own condition does not hold: the
/// error kind and the reason, as the handler would have returned them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Retryable (the claim is released, SQS delivers again) or permanent
    /// (the failure is recorded).
    pub kind: ErrorKind,
    /// Why, for the record's outcome and the log.
    pub reason: String,
}

impl Default for Refusal {
    fn default() -> Self {
        Self { kind: ErrorKind::Permanent, reason: "a staged write's condition does not hold".into() }
    }
}

/// What every typed write has: where it goes, its condition, and how the
/// handler fails when the condition does not hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The table.
    pub table: String,
    /// The item's key.
    pub key: Key,
    /// The condition the write is applied on, if any.
    pub condition: Option<Condition>,
    /// The handler's failure when the condition does not hold.
    pub refusal: Refusal,
}

impl Target {
    fn new(table: impl Into<String>, key: Key) -> Self {
        Self { table: table.into(), key, condition: None, refusal: Refusal::default() }
    }

    /// `table` and `key`, for messages.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.table, self.key)
    }
}

/// The builder methods every typed write shares.
macro_rules! conditioned {
    ($write:ident) => {
        impl $write {
            /// Applies the write only if `condition` holds; otherwise
            /// nothing of the transaction applies and the handler fails as
            /// [`or_fail`](Self::or_fail) says (permanently, by default).
            pub fn condition(mut self, condition: Condition) -> Self {
                self.target.condition = Some(condition);
                self
            }

            /// How the handler fails when the condition does not hold:
            /// [`ErrorKind::Retryable`] releases the claim for another
            /// delivery, [`ErrorKind::Permanent`] records the failure.
            pub fn or_fail(mut self, kind: ErrorKind, reason: impl Into<String>) -> Self {
                self.target.refusal = Refusal { kind, reason: reason.into() };
                self
            }

            /// Where the write goes and on which condition.
            pub fn target(&self) -> &Target {
                &self.target
            }
        }
    };
}

/// Writes a whole item, replacing any item with its key.
///
/// ```
/// use sqs_once::transaction::{Condition, Key, Put};
///
/// #[derive(serde::Serialize)]
/// struct Shipment { order_id: String, carrier: String }
///
/// let shipment = Shipment { order_id: "o-1".into(), carrier: "ups".into() };
/// let put = Put::new("shipments", Key::new("pk", "o-1"))
///     .item(&shipment)?
///     .set("state", "booked")
///     .condition(Condition::not_exists("pk"));
/// # Ok::<(), sqs_once::transaction::StageError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Put {
    target: Target,
    attributes: Map<String, Value>,
}

impl Put {
    /// A put of the item with `key` (its key attributes are written too).
    pub fn new(table: impl Into<String>, key: Key) -> Self {
        Self { target: Target::new(table, key), attributes: Map::new() }
    }

    /// Sets one attribute.
    pub fn set(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.attributes.insert(name.into(), value.into());
        self
    }

    /// Sets the attributes of `value`, which must serialize to a JSON object.
    pub fn item(mut self, value: &impl Serialize) -> Result<Self, StageError> {
        match serde_json::to_value(value) {
            Ok(Value::Object(attributes)) => {
                self.attributes.extend(attributes);
                Ok(self)
            }
            Ok(other) => Err(StageError::NotAnObject(other.to_string())),
            Err(error) => Err(StageError::NotAnObject(error.to_string())),
        }
    }

    /// The whole item: the key's attributes and the others.
    pub fn full_item(&self) -> Map<String, Value> {
        let mut item = self.attributes.clone();
        item.extend(self.target.key.attributes().iter().cloned());
        item
    }
}

conditioned!(Put);

/// Changes some attributes of an item, creating it if there is none.
///
/// ```
/// use sqs_once::{ErrorKind, transaction::{Condition, Key, Update}};
///
/// // Take 30 from the balance, unless that would take it below zero.
/// let debit = Update::new("ledger", Key::new("pk", "acct-1"))
///     .add("balance", -30)
///     .set("updated_by", "m-1")
///     .condition(Condition::ge("balance", 30))
///     .or_fail(ErrorKind::Permanent, "insufficient balance");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    target: Target,
    actions: Vec<Action>,
    keeps_key: bool,
}

impl Update {
    /// An update of the item with `key`.
    pub fn new(table: impl Into<String>, key: Key) -> Self {
        Self { target: Target::new(table, key), actions: Vec::new(), keeps_key: false }
    }

    /// Keeps the run's key in this item: when the update is its run's only
    /// effect (no other write, no message), it commits alone, as one
    /// conditional write that records the key in the item and is refused
    /// when the item holds it already. No claim and no completion are
    /// written: a write unit for an item under 1 KB, where a transaction
    /// costs four. The item keeps two windows of the key memory's keys
    /// (see [`item_keys`](crate::transaction::item_keys)). Beside other
    /// effects, the run commits its transaction, its key kept with its claim.
    ///
    /// ```
    /// use sqs_once::transaction::{Key, Update};
    ///
    /// let credit = Update::new("ledger", Key::new("pk", "acct-1")).add("balance", 30).keep_key();
    /// assert!(credit.keeps_key());
    /// ```
    pub fn keep_key(mut self) -> Self {
        self.keeps_key = true;
        self
    }

    /// Whether the update keeps its run's key in its item ([`keep_key`](Self::keep_key)).
    pub fn keeps_key(&self) -> bool {
        self.keeps_key
    }

    /// Sets an attribute.
    pub fn set(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.actions.push(Action::Set(name.into(), value.into()));
        self
    }

    /// Sets an attribute unless the item has it already.
    pub fn set_if_absent(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.actions.push(Action::SetIfAbsent(name.into(), value.into()));
        self
    }

    /// Adds `amount` to a number attribute (DynamoDB's `ADD`); a missing
    /// attribute counts as 0.
    pub fn add(mut self, name: impl Into<String>, amount: impl Into<serde_json::Number>) -> Self {
        self.actions.push(Action::Add(name.into(), amount.into()));
        self
    }

    /// Removes an attribute.
    pub fn remove(mut self, name: impl Into<String>) -> Self {
        self.actions.push(Action::Remove(name.into()));
        self
    }

    /// The changes, in order.
    pub fn actions(&self) -> &[Action] {
        &self.actions
    }
}

conditioned!(Update);

/// Deletes an item (nothing happens if there is none).
///
/// ```
/// use sqs_once::transaction::{Condition, Delete, Key};
///
/// let cancel = Delete::new("reservations", Key::new("pk", "r-9")).condition(Condition::eq("state", "held"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Delete {
    target: Target,
}

impl Delete {
    /// A delete of the item with `key`.
    pub fn new(table: impl Into<String>, key: Key) -> Self {
        Self { target: Target::new(table, key) }
    }
}

conditioned!(Delete);

/// Writes nothing, but the transaction applies only if `condition` holds on
/// the item.
///
/// ```
/// use sqs_once::{ErrorKind, transaction::{Check, Condition, Key}};
///
/// let active = Check::new("customers", Key::new("pk", "c-7"), Condition::eq("state", "active"))
///     .or_fail(ErrorKind::Permanent, "customer is not active");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    target: Target,
}

impl Check {
    /// A check that `condition` holds on the item with `key`.
    pub fn new(table: impl Into<String>, key: Key, condition: Condition) -> Self {
        Self { target: Target { condition: Some(condition), ..Target::new(table, key) } }
    }
}

conditioned!(Check);

/// One staged DynamoDB write: a typed one, or the SDK's own
/// `TransactWriteItem` for what the typed ones do not express (sets,
/// binary values, nested paths, other expressions). The in-process stores
/// (memory, SQLite) evaluate the typed ones only.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Write {
    /// See [`Put`].
    Put(Put),
    /// See [`Update`].
    Update(Update),
    /// See [`Delete`].
    Delete(Delete),
    /// See [`Check`].
    Check(Check),
    /// An action built with the AWS SDK, sent as it is (feature `dynamodb`).
    #[cfg(feature = "dynamodb")]
    #[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
    Sdk(Box<aws_sdk_dynamodb::types::TransactWriteItem>),
}

impl Write {
    /// Where a typed write goes; `None` for an SDK action.
    pub fn target(&self) -> Option<&Target> {
        match self {
            Self::Put(put) => Some(&put.target),
            Self::Update(update) => Some(&update.target),
            Self::Delete(delete) => Some(&delete.target),
            Self::Check(check) => Some(&check.target),
            #[cfg(feature = "dynamodb")]
            Self::Sdk(_) => None,
        }
    }

    /// The item the write is about, as DynamoDB tells items apart: its
    /// table, and its key's attributes by name with numbers by value
    /// (`1` and `1.0` are one item), in one text. `None` for an SDK put,
    /// whose key attributes only the table knows. A store that keeps what
    /// it knows of items, or batches writes about distinct items, names
    /// them by it.
    pub fn item(&self) -> Option<String> {
        let (table, key): (&str, Vec<(&str, String)>) = match self {
            #[cfg(feature = "dynamodb")]
            Self::Sdk(item) => sdk_item(item)?,
            typed => {
                let target = typed.target()?;
                let key = target.key.attributes().iter().map(|(name, value)| (name.as_str(), key_value(value)));
                (&target.table, key.collect())
            }
        };
        let mut key = key;
        key.sort();
        let key: Vec<String> = key.into_iter().map(|(name, value)| format!("{name}={value}")).collect();
        Some(format!("{table}\u{0}{}", key.join("\u{0}")))
    }

    /// The write's kind and item, for messages.
    pub fn describe(&self) -> String {
        let kind = match self {
            Self::Put(_) => "put",
            Self::Update(_) => "update",
            Self::Delete(_) => "delete",
            Self::Check(_) => "condition check",
            #[cfg(feature = "dynamodb")]
            Self::Sdk(_) => return "an SDK action".to_owned(),
        };
        format!("{kind} of {}", self.target().map(Target::describe).unwrap_or_default())
    }

    /// The handler's failure when this write's condition does not hold.
    pub fn refusal(&self) -> Refusal {
        self.target().map(|target| target.refusal.clone()).unwrap_or_default()
    }

    /// The attribute of an item's kept keys ([`crate::transaction::item_keys`])
    /// that the write names, if any: only sqs-once writes them.
    fn kept_keys_named(&self) -> Option<&'static str> {
        let target = self.target()?;
        let names = |attribute: &str| match self {
            Self::Put(put) => put.attributes.contains_key(attribute),
            Self::Update(update) => update.actions.iter().any(|action| action.attribute() == attribute),
            _ => false,
        } || target.condition.as_ref().is_some_and(|condition| condition.names(attribute));
        crate::transaction::item_keys::KEY_ATTRIBUTES.into_iter().find(|attribute| names(attribute))
    }

    /// Checks what DynamoDB would refuse for the write alone, and returns
    /// its size as DynamoDB counts it.
    pub(super) fn validate(&self) -> Result<usize, StageError> {
        let Some(target) = self.target() else { return Ok(sdk_size(self)) };
        if target.table.is_empty() {
            return Err(StageError::InvalidKey(format!("no table for {}", self.describe())));
        }
        target.key.validate()?;
        if let Some(kept) = self.kept_keys_named() {
            return Err(StageError::KeptKeys(kept.to_owned(), target.describe()));
        }
        let key_size = attributes_size(target.key.attributes().iter().map(|(name, value)| (name.as_str(), value)));
        let condition_size = target.condition.as_ref().map_or(0, condition_size);
        let size = match self {
            Self::Put(put) => attributes_size(put.full_item().iter().map(|(name, value)| (name.as_str(), value))),
            Self::Update(update) => {
                if update.actions.is_empty() {
                    return Err(StageError::NothingToUpdate(target.describe()));
                }
                if let Some(action) = update.actions.iter().find(|action| target.key.holds(action.attribute())) {
                    return Err(StageError::KeyAttribute(action.attribute().to_owned(), target.describe()));
                }
                // Room for the keys the item may come to keep, at their bound.
                let kept = if update.keeps_key { crate::transaction::item_keys::KEYS_ROOM } else { 0 };
                key_size + update.actions.iter().map(action_size).sum::<usize>() + kept
            }
            Self::Delete(_) | Self::Check(_) => key_size,
            #[cfg(feature = "dynamodb")]
            Self::Sdk(_) => key_size,
        };
        if size > super::MAX_ITEM_BYTES {
            return Err(StageError::ItemTooLarge { what: self.describe(), bytes: size });
        }
        Ok(size + condition_size)
    }
}

impl From<Put> for Write {
    fn from(put: Put) -> Self {
        Self::Put(put)
    }
}

impl From<Update> for Write {
    fn from(update: Update) -> Self {
        Self::Update(update)
    }
}

impl From<Delete> for Write {
    fn from(delete: Delete) -> Self {
        Self::Delete(delete)
    }
}

impl From<Check> for Write {
    fn from(check: Check) -> Self {
        Self::Check(check)
    }
}

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
impl From<aws_sdk_dynamodb::types::TransactWriteItem> for Write {
    fn from(item: aws_sdk_dynamodb::types::TransactWriteItem) -> Self {
        Self::Sdk(Box::new(item))
    }
}

/// A key attribute's value as DynamoDB compares it: strings byte by byte,
/// numbers by value.
fn key_value(value: &Value) -> String {
    match value {
        Value::String(text) => format!("S:{text}"),
        Value::Number(number) => format!("N:{}", canonical_number(&number.to_string())),
        other => format!("?:{other}"),
    }
}

/// The table and key of an SDK update, delete or condition check.
#[cfg(feature = "dynamodb")]
fn sdk_item(item: &aws_sdk_dynamodb::types::TransactWriteItem) -> Option<(&str, Vec<(&str, String)>)> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let (table, key) = if let Some(update) = &item.update {
        (update.table_name(), update.key())
    } else if let Some(delete) = &item.delete {
        (delete.table_name(), delete.key())
    } else {
        let check = item.condition_check.as_ref()?;
        (check.table_name(), check.key())
    };
    let value = |value: &AttributeValue| match value {
        AttributeValue::S(text) => format!("S:{text}"),
        AttributeValue::N(number) => format!("N:{}", canonical_number(number)),
        AttributeValue::B(bytes) => format!("B:{}", hex::encode(bytes.as_ref())),
        other => format!("?:{other:?}"),
    };
    Some((table, key.iter().map(|(name, attribute)| (name.as_str(), value(attribute))).collect()))
}

/// A decimal number in one form for each value: `1`, `1.0`, `1e0` and
/// `10E-1` all read `1e0`, `-0` reads `0`. Text that is not a number is
/// kept as it is.
pub(crate) fn canonical_number(text: &str) -> String {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => match exponent.parse::<i64>() {
            Ok(exponent) => (mantissa, exponent),
            Err(_) => return text.to_owned(),
        },
        None => (unsigned, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole.bytes().chain(fraction.bytes()).all(|byte| byte.is_ascii_digit())
    {
        return text.to_owned();
    }
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return "0".to_owned();
    }
    let exponent = exponent - fraction.len() as i64 + (digits.len() - significant.len()) as i64;
    format!("{}{significant}e{exponent}", if negative { "-" } else { "" })
}

/// The size DynamoDB counts for attributes: each name's bytes and its
/// value's size (see the developer guide, *Item sizes*).
pub(crate) fn attributes_size<'a>(attributes: impl Iterator<Item = (&'a str, &'a Value)>) -> usize {
    attributes.map(|(name, value)| name.len() + value_size(value)).sum()
}

/// A value's size as DynamoDB counts it: strings by their UTF-8 bytes,
/// numbers by about one byte per two significant digits plus one, lists and
/// maps three bytes plus a byte per element.
pub(crate) fn value_size(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) => 1,
        Value::String(text) => text.len(),
        Value::Number(number) => {
            let digits = number.to_string().bytes().filter(u8::is_ascii_digit).count();
            (digits.div_ceil(2) + 1).min(21)
        }
        Value::Array(values) => 3 + values.iter().map(|value| 1 + value_size(value)).sum::<usize>(),
        Value::Object(map) => 3 + map.iter().map(|(name, value)| 1 + name.len() + value_size(value)).sum::<usize>(),
    }
}

fn action_size(action: &Action) -> usize {
    match action {
        Action::Set(name, value) | Action::SetIfAbsent(name, value) => name.len() + value_size(value),
        Action::Add(name, number) => name.len() + value_size(&Value::Number(number.clone())),
        Action::Remove(name) => name.len(),
    }
}

fn condition_size(condition: &Condition) -> usize {
    match condition {
        Condition::Exists(name) | Condition::NotExists(name) => name.len(),
        Condition::Compare(name, _, value) => name.len() + value_size(value),
        Condition::BeginsWith(name, prefix) => name.len() + prefix.len(),
        Condition::And(left, right) | Condition::Or(left, right) => condition_size(left) + condition_size(right),
        Condition::Not(inner) => condition_size(inner),
    }
}

/// An SDK action's size: the length of its debug form, which holds every
/// name and value, is an upper bound close enough for the 4 MB limit.
fn sdk_size(write: &Write) -> usize {
    format!("{write:?}").len()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn sizes_follow_dynamodbs_rules() {
        assert_eq!(value_size(&json!("héllo")), 6);
        assert_eq!(value_size(&json!(12345)), 4);
        assert_eq!(value_size(&json!(true)), 1);
        assert_eq!(value_size(&json!([1, "ab"])), 3 + (1 + 2) + (1 + 2));
        let put = Write::from(Put::new("t", Key::new("pk", "a")).set("n", 7));
        assert_eq!(put.validate().unwrap(), (2 + 1) + (1 + 2));
    }

    #[test]
    fn numbers_are_one_value_however_they_are_written() {
        for same in ["1", "1.0", "1e0", "10E-1", "+1", "0.1e1", "001.000"] {
            assert_eq!(canonical_number(same), "1e0", "{same}");
        }
        assert_eq!(canonical_number("-0.0"), "0");
        assert_eq!(canonical_number("1200"), canonical_number("1.2e3"));
        assert_ne!(canonical_number("12"), canonical_number("1.2"));
        assert_eq!(canonical_number("-15.50"), "-155e-1");
    }

    #[test]
    fn an_item_is_its_table_and_its_key_by_name_and_value() {
        let item = |write: Write| write.item().unwrap();
        let a = item(Delete::new("t", Key::new("pk", 1)).into());
        assert_eq!(a, item(Update::new("t", Key::new("pk", 1.0)).add("n", 1).into()));
        assert_ne!(a, item(Delete::new("u", Key::new("pk", 1)).into()));
        assert_ne!(a, item(Delete::new("t", Key::new("pk", "1")).into()), "a string is not a number");
        let sorted = item(Check::new("t", Key::new("pk", "a").and("sk", 2), Condition::exists("pk")).into());
        assert_eq!(sorted, item(Delete::new("t", Key::new("sk", 2.0).and("pk", "a")).into()));
    }

    #[cfg(feature = "dynamodb")]
    #[test]
    fn an_sdk_action_is_the_item_its_table_and_key_name() {
        let item = |write: Write| write.item().unwrap();
        let a = item(Delete::new("t", Key::new("pk", 1)).into());
        use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
        let sdk = aws_sdk_dynamodb::types::Delete::builder()
            .table_name("t")
            .key("pk", AttributeValue::N("1.00".into()))
            .build()
            .unwrap();
        assert_eq!(item(TransactWriteItem::builder().delete(sdk).build().into()), a);
        let put = aws_sdk_dynamodb::types::Put::builder().table_name("t").item("pk", AttributeValue::N("1".into()));
        assert_eq!(Write::from(TransactWriteItem::builder().put(put.build().unwrap()).build()).item(), None);
    }

    #[test]
    fn writes_dynamodb_would_refuse_are_refused_when_staged() {
        let refused = |write: Write| write.validate().unwrap_err();
        assert!(matches!(refused(Update::new("t", Key::new("pk", "a")).into()), StageError::NothingToUpdate(_)));
        let on_key = Update::new("t", Key::new("pk", "a")).set("pk", "b");
        assert!(matches!(refused(on_key.into()), StageError::KeyAttribute(name, _) if name == "pk"));
        for key in [Key::new("pk", true), Key::new("pk", ""), Key::new("pk", 1).and("pk", 2), Key(Vec::new())] {
            assert!(matches!(refused(Delete::new("t", key).into()), StageError::InvalidKey(_)));
        }
        let huge = Put::new("t", Key::new("pk", "a")).set("blob", "x".repeat(410 * 1024));
        assert!(matches!(refused(huge.into()), StageError::ItemTooLarge { .. }));
        assert!(Put::new("t", Key::new("pk", "a")).item(&json!([1])).is_err());
    }

    #[test]
    fn no_staged_write_names_the_attributes_an_item_keeps_its_keys_in_and_a_kept_key_leaves_them_room() {
        use crate::transaction::item_keys::{KEY_ATTRIBUTES, KEYS_ROOM};
        let refused = |write: Write| write.validate().unwrap_err();
        for attribute in KEY_ATTRIBUTES {
            let writes: [Write; 4] = [
                Update::new("t", Key::new("pk", "a")).set(attribute, "x").into(),
                Update::new("t", Key::new("pk", "a")).add("n", 1).condition(Condition::not_exists(attribute)).into(),
                Put::new("t", Key::new("pk", "a")).set(attribute, "x").into(),
                Check::new("t", Key::new("pk", "a"), !Condition::exists(attribute)).into(),
            ];
            for write in writes {
                let what = write.describe();
                assert!(matches!(refused(write), StageError::KeptKeys(name, _) if name == attribute), "{what}");
            }
        }
        // An update that fits an item alone, but not beside two full windows of keys, is refused once it keeps them.
        let near_full = || Update::new("t", Key::new("pk", "a")).set("blob", "x".repeat(400 * 1024 - KEYS_ROOM));
        assert!(Write::from(near_full()).validate().is_ok());
        assert!(matches!(refused(near_full().keep_key().into()), StageError::ItemTooLarge { .. }));
    }
}
