//! Staged writes evaluated in process, as DynamoDB evaluates a
//! `TransactWriteItems`: every condition is judged against the items as they
//! stand before the transaction, and either every write applies or none. The
//! memory and SQLite stores keep items this way; the DynamoDB store sends the
//! same writes to DynamoDB, and the transaction suite runs both on the same
//! cases.

use std::cmp::Ordering;

use serde_json::{Map, Number, Value};

use super::{Cancellation, Committed, StoreError};
use crate::transaction::{
    Action, Comparison, Condition, MAX_ITEM_BYTES, Target, Write,
    item_keys::{InItem, ItemKeys, KEYS, KEYS_BEFORE, KEYS_SINCE, KeyInItem},
    item_size,
};

/// An item: attribute names and values.
pub type JsonItem = Map<String, Value>;

/// Where an item lives: its table, and its key as canonical JSON.
pub type Place = (String, String);

/// The place of the item a write is about.
pub fn place(target: &Target) -> Place {
    let mut key: Vec<_> = target.key.attributes().iter().collect();
    key.sort_by(|left, right| left.0.cmp(&right.0));
    (target.table.clone(), serde_json::to_string(&key).unwrap_or_default())
}

/// What a transaction does to one item.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The item becomes this.
    Put(Place, JsonItem),
    /// The item is deleted.
    Delete(Place),
}

/// What evaluating a transaction's writes came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Evaluated {
    /// Every condition holds: these changes, applied together.
    Apply(Vec<Change>),
    /// A condition does not hold: nothing applies.
    Cancelled(Cancellation),
}

/// Evaluates `writes` against the items `read` returns.
pub fn evaluate(
    writes: &[Write],
    mut read: impl FnMut(&Place) -> Result<Option<JsonItem>, StoreError>,
) -> Result<Evaluated, StoreError> {
    let mut changes = Vec::with_capacity(writes.len());
    let mut failed = Vec::new();
    for (index, write) in writes.iter().enumerate() {
        let Some(target) = write.target() else {
            return Err(StoreError::Unsupported(format!(
                "an in-process store evaluates typed writes only, and {} is not one: use the DynamoDB store",
                write.describe()
            )));
        };
        let place = place(target);
        let current = read(&place)?;
        if !target.condition.as_ref().is_none_or(|condition| holds(condition, current.as_ref())) {
            failed.push(index);
            continue;
        }
        match write {
            Write::Put(put) => changes.push(Change::Put(place, put.full_item())),
            Write::Update(update) => {
                let mut item = current.unwrap_or_else(|| target.key.attributes().iter().cloned().collect());
                for action in update.actions() {
                    apply(action, &mut item, write)?;
                }
                changes.push(Change::Put(place, item))
            }
            Write::Delete(_) => changes.push(Change::Delete(place)),
            Write::Check(_) => {}
            #[cfg(feature = "dynamodb")]
            Write::Sdk(_) => {}
        }
    }
    for change in &changes {
        if let Change::Put(place, item) = change
            && item_size(item) > MAX_ITEM_BYTES
        {
            return Err(StoreError::Rejected(format!("the item {} would exceed 400 KB", place.1)));
        }
    }
    match failed.first() {
        None => Ok(Evaluated::Apply(changes)),
        Some(&first) => Ok(Evaluated::Cancelled(Cancellation::by(writes, first, reasons(writes, &failed)))),
    }
}

/// Evaluates a commit that keeps its key in the item of its one `write`
/// ([`KeyInItem`]), as DynamoDB evaluates the one conditional update the
/// DynamoDB store sends for it: the change it makes (the update, and the
/// key added to the item's keys), or the answer it gets without one (the
/// item keeps the key already; the update's condition does not hold; the
/// item's window is full).
pub fn evaluate_keeping_key(
    write: &Write,
    key: &KeyInItem,
    read: impl FnMut(&Place) -> Result<Option<JsonItem>, StoreError>,
) -> Result<Result<Change, Committed>, StoreError> {
    let mut read = read;
    let current = match write.target() {
        Some(target) => read(&place(target))?,
        None => None,
    };
    let keys = item_keys(current.as_ref());
    let judged = key.judge(&keys);
    match judged {
        InItem::Duplicate => return Ok(Err(Committed::InItemAlready)),
        InItem::Full => return Ok(Err(Committed::window_full(key, write, keys.since_ms.unwrap_or_default()))),
        InItem::Late => return Err(StoreError::window_too_late(key, keys.since_ms)),
        InItem::SameWindow | InItem::NextWindow | InItem::Fresh => {}
    }
    let writes = std::slice::from_ref(write);
    match evaluate(writes, |_| Ok(current.clone()))? {
        Evaluated::Cancelled(cancellation) => Ok(Err(Committed::Cancelled(cancellation))),
        Evaluated::Apply(mut changes) => match changes.pop() {
            Some(Change::Put(place, mut item)) => {
                keep(&mut item, &key.added_to(&keys, judged));
                Ok(Ok(Change::Put(place, item)))
            }
            _ => Err(StoreError::Unsupported(format!(
                "a commit keeps its key in the item of one update, and {} is not one",
                write.describe()
            ))),
        },
    }
}

/// The keys `item` keeps: its sets as JSON arrays of strings, its window's
/// start as a number.
pub fn item_keys(item: Option<&JsonItem>) -> ItemKeys {
    let set = |name: &str| {
        let values = item.and_then(|item| item.get(name)).and_then(Value::as_array);
        values.into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
    };
    ItemKeys {
        current: set(KEYS),
        before: set(KEYS_BEFORE),
        since_ms: item.and_then(|item| item.get(KEYS_SINCE)).and_then(Value::as_u64),
    }
}

/// Writes `keys` into `item`, as [`item_keys`] reads them.
fn keep(item: &mut JsonItem, keys: &ItemKeys) {
    let set = |keys: &std::collections::BTreeSet<String>| Value::from(keys.iter().cloned().collect::<Vec<_>>());
    item.insert(KEYS.to_owned(), set(&keys.current));
    if !keys.before.is_empty() {
        item.insert(KEYS_BEFORE.to_owned(), set(&keys.before));
    }
    if let Some(since_ms) = keys.since_ms {
        item.insert(KEYS_SINCE.to_owned(), since_ms.into());
    }
}

/// The reasons of a cancelled transaction, in DynamoDB's words: each write
/// whose condition did not hold.
fn reasons(writes: &[Write], failed: &[usize]) -> String {
    let failures = failed
        .iter()
        .map(|&index| format!("write {index} ({}): ConditionalCheckFailed", writes[index].describe()))
        .collect::<Vec<_>>();
    failures.join("; ")
}

/// Applies one update action to `item`.
fn apply(action: &Action, item: &mut JsonItem, write: &Write) -> Result<(), StoreError> {
    match action {
        Action::Set(name, value) => {
            item.insert(name.clone(), value.clone());
        }
        Action::SetIfAbsent(name, value) => {
            item.entry(name.clone()).or_insert_with(|| value.clone());
        }
        Action::Remove(name) => {
            item.remove(name);
        }
        Action::Add(name, amount) => {
            let sum = match item.get(name) {
                None => amount.clone(),
                Some(Value::Number(current)) => add(current, amount),
                Some(other) => {
                    return Err(StoreError::Rejected(format!(
                        "{}: ADD needs a number, and `{name}` is {other}",
                        write.describe()
                    )));
                }
            };
            item.insert(name.clone(), Value::Number(sum));
        }
    }
    Ok(())
}

/// Whether `condition` holds on `item` (`None`: no such item).
pub fn holds(condition: &Condition, item: Option<&JsonItem>) -> bool {
    let attribute = |name: &str| item.and_then(|item| item.get(name));
    match condition {
        Condition::Exists(name) => attribute(name).is_some(),
        Condition::NotExists(name) => attribute(name).is_none(),
        Condition::Compare(name, comparison, value) => match attribute(name) {
            None => *comparison == Comparison::Ne,
            Some(current) => compares(current, *comparison, value),
        },
        Condition::BeginsWith(name, prefix) => {
            matches!(attribute(name), Some(Value::String(text)) if text.starts_with(prefix.as_str()))
        }
        Condition::And(left, right) => holds(left, item) && holds(right, item),
        Condition::Or(left, right) => holds(left, item) || holds(right, item),
        Condition::Not(inner) => !holds(inner, item),
    }
}

/// `left <comparison> right`, as DynamoDB compares: values of different
/// types are unequal and unordered; only numbers and strings order.
fn compares(left: &Value, comparison: Comparison, right: &Value) -> bool {
    let ordering = match (left, right) {
        (Value::Number(left), Value::Number(right)) => Some(numeric(left, right)),
        (Value::String(left), Value::String(right)) => Some(left.as_bytes().cmp(right.as_bytes())),
        _ => None,
    };
    match (comparison, ordering) {
        (Comparison::Eq, _) => equal(left, right),
        (Comparison::Ne, _) => !equal(left, right),
        (_, None) => false,
        (Comparison::Lt, Some(ordering)) => ordering.is_lt(),
        (Comparison::Le, Some(ordering)) => ordering.is_le(),
        (Comparison::Gt, Some(ordering)) => ordering.is_gt(),
        (Comparison::Ge, Some(ordering)) => ordering.is_ge(),
    }
}

/// Equality as DynamoDB sees it: numbers by value (`1` is `1.0`), lists
/// and maps element by element.
fn equal(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(left), Value::Number(right)) => numeric(left, right).is_eq(),
        (Value::Array(left), Value::Array(right)) => {
            left.len() == right.len() && left.iter().zip(right).all(|(left, right)| equal(left, right))
        }
        (Value::Object(left), Value::Object(right)) => {
            left.len() == right.len()
                && left.iter().all(|(name, value)| right.get(name).is_some_and(|other| equal(value, other)))
        }
        (left, right) => left == right,
    }
}

/// Integers exactly, anything else as a double.
fn numeric(left: &Number, right: &Number) -> Ordering {
    match (integer(left), integer(right)) {
        (Some(left), Some(right)) => left.cmp(&right),
        _ => left.as_f64().unwrap_or(f64::NAN).total_cmp(&right.as_f64().unwrap_or(f64::NAN)),
    }
}

fn integer(number: &Number) -> Option<i128> {
    number.as_i64().map(i128::from).or_else(|| number.as_u64().map(i128::from))
}

/// `left + right`: exact for integers, a double otherwise.
fn add(left: &Number, right: &Number) -> Number {
    if let (Some(left), Some(right)) = (integer(left), integer(right)) {
        let sum = left + right;
        if let Ok(sum) = i64::try_from(sum) {
            return sum.into();
        }
        if let Ok(sum) = u64::try_from(sum) {
            return sum.into();
        }
    }
    let sum = left.as_f64().unwrap_or_default() + right.as_f64().unwrap_or_default();
    Number::from_f64(sum).unwrap_or_else(|| 0.into())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::transaction::{Check, Delete, Key, Put, Update};

    fn item(value: Value) -> JsonItem {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn comparisons_follow_dynamodb_on_types_and_missing_attributes() {
        let account = item(json!({"pk": "a", "balance": 10, "name": "Ann", "tags": [1, 2]}));
        let on = |condition: Condition| holds(&condition, Some(&account));
        assert!(on(Condition::ge("balance", 10)) && on(Condition::lt("balance", 10.5)));
        assert!(on(Condition::eq("balance", 10.0)), "numbers equal by value");
        assert!(!on(Condition::ge("balance", "10")), "a number and a string do not order");
        assert!(on(Condition::ne("balance", "10")) && !on(Condition::eq("balance", "10")));
        assert!(!on(Condition::ge("missing", 0)) && on(Condition::ne("missing", 0)));
        assert!(on(Condition::gt("name", "Al")) && on(Condition::begins_with("name", "An")));
        assert!(on(Condition::eq("tags", json!([1.0, 2]))));
        assert!(on(!Condition::exists("missing").and(Condition::exists("pk"))));
        assert!(!holds(&Condition::exists("pk"), None), "no item has no attribute");
    }

    #[test]
    fn writes_apply_together_or_not_at_all() {
        let mut table = std::collections::HashMap::new();
        let ledger = Update::new("ledger", Key::new("pk", "a")).add("balance", 5).set_if_absent("opened", "m-1");
        let writes: Vec<Write> = vec![
            ledger.clone().into(),
            Put::new("log", Key::new("pk", "m-1")).set("amount", 5).into(),
            Check::new("accounts", Key::new("pk", "a"), Condition::not_exists("closed")).into(),
        ];
        let Evaluated::Apply(changes) = evaluate(&writes, |place| Ok(table.get(place).cloned())).unwrap() else {
            panic!("cancelled")
        };
        assert_eq!(changes.len(), 2, "a check changes nothing");
        for change in changes {
            if let Change::Put(place, item) = change {
                table.insert(place, item);
            }
        }
        let balance = place(ledger.target());
        assert_eq!(Value::Object(table[&balance].clone()), json!({"pk": "a", "balance": 5, "opened": "m-1"}));

        let debit =
            Update::new("ledger", Key::new("pk", "a")).add("balance", -7).condition(Condition::ge("balance", 7));
        let gone = Delete::new("log", Key::new("pk", "m-1")).condition(Condition::eq("amount", 6));
        let writes: Vec<Write> = vec![debit.into(), gone.into()];
        let Evaluated::Cancelled(cancellation) = evaluate(&writes, |place| Ok(table.get(place).cloned())).unwrap()
        else {
            panic!("applied")
        };
        assert_eq!(cancellation.write, 0);
        assert!(cancellation.reasons.contains("write 1 (delete of log"), "{}", cancellation.reasons);
    }

    #[test]
    fn adding_to_what_is_not_a_number_and_sdk_actions_are_refused() {
        let named = item(json!({"pk": "a", "balance": "ten"}));
        let add: Write = Update::new("t", Key::new("pk", "a")).add("balance", 1).into();
        let refused = evaluate(&[add], |_| Ok(Some(named.clone()))).unwrap_err();
        assert!(refused.to_string().contains("ADD needs a number"), "{refused}");
        #[cfg(feature = "dynamodb")]
        let sdk = Write::from(aws_sdk_dynamodb::types::TransactWriteItem::builder().build());
        #[cfg(feature = "dynamodb")]
        assert!(matches!(evaluate(&[sdk], |_| Ok(None)), Err(StoreError::Unsupported(_))));
    }

    #[test]
    fn integers_add_exactly_and_overflow_into_doubles() {
        assert_eq!(add(&i64::MAX.into(), &1.into()), Number::from(i64::MAX as u64 + 1));
        assert_eq!(add(&(-5).into(), &3.into()), Number::from(-2));
        assert_eq!(add(&Number::from_f64(0.5).unwrap(), &1.into()), Number::from_f64(1.5).unwrap());
    }
}
