//! `ledger`: credits and debits accounts exactly once, however often SQS
//! delivers the message and whatever happens to the process.
//!
//! A body `{"account": "<id>", "amount": <integer>}` adds `amount` to the
//! attribute `balance` of the item whose partition key `pk` is the account,
//! in the table `SQS_ONCE_LEDGER_TABLE` (created when the account is first
//! credited). The write is staged, not made: it commits in one DynamoDB
//! transaction with the claim's completion, so it applies once or not at
//! all. A debit that would take the balance below zero fails permanently
//! through the write's own condition, and nothing of it applies.
//!
//! Every effect is staged, so a run takes no claim first
//! ([`Handler::stages_every_effect`]), and the credit keeps its key in the
//! account's item ([`Update::keep_key`]): it commits alone, as one
//! conditional `UpdateItem` that is refused when the account holds the key
//! already, one request and 1 write unit per credit for an account item
//! under 1 KB. `SQS_ONCE_CLAIM=always` claims first anyway;
//! `SQS_ONCE_LEDGER_KEYS_IN_ACCOUNTS=false` commits each credit in a
//! transaction with its key's completion instead (4 write units), the better
//! choice for an account credited more than some 60 times a key memory.
//!
//! With `SQS_ONCE_LEDGER_NOTIFY_URL` set, each entry also sends
//! `{"account", "amount", "message_id"}` to that queue through the outbox:
//! written in one transaction with the credit and the key's completion,
//! sent once it has committed (one request; a transaction is charged 2
//! write units an item: the credit, the completion and the outbox item).

use serde::Deserialize;
use serde_json::json;

use sqs_once::{
    ErrorKind, Handler, HandlerError, HandlerResult, Record,
    transaction::{Condition, Key, Message, Update},
};

/// The ledger handler.
#[derive(Debug, Clone)]
pub struct Ledger {
    table: String,
    notify: Option<String>,
    keys_in_accounts: bool,
}

/// A ledger entry, as the publisher sends it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    account: String,
    amount: i64,
}

impl Ledger {
    /// A ledger on `table`, notifying the queue at `notify` of each entry,
    /// each credit's key kept in its account's item.
    pub fn new(table: impl Into<String>, notify: Option<String>) -> Self {
        Self { table: table.into(), notify, keys_in_accounts: true }
    }

    /// Whether a credit keeps its key in its account's item (the default),
    /// or commits in a transaction with its key's completion: the better
    /// choice for accounts credited more than some 60 times a key memory
    /// (see `Update::keep_key`).
    pub fn keeping_keys_in_accounts(self, keys_in_accounts: bool) -> Self {
        Self { keys_in_accounts, ..self }
    }

    /// The ledger `SQS_ONCE_LEDGER_TABLE`, `SQS_ONCE_LEDGER_NOTIFY_URL` and
    /// `SQS_ONCE_LEDGER_KEYS_IN_ACCOUNTS` describe.
    pub fn from_env() -> Result<Self, String> {
        let setting = |name: &str| std::env::var(name).ok().filter(|value| !value.trim().is_empty());
        let table = setting("SQS_ONCE_LEDGER_TABLE")
            .ok_or("SQS_ONCE_LEDGER_TABLE is not set: name the DynamoDB table that holds the balances")?;
        let keys_in_accounts = match setting("SQS_ONCE_LEDGER_KEYS_IN_ACCOUNTS").as_deref().map(str::trim) {
            None | Some("true") => true,
            Some("false") => false,
            Some(other) => return Err(format!("SQS_ONCE_LEDGER_KEYS_IN_ACCOUNTS={other:?}: expected true or false")),
        };
        Ok(Self::new(table, setting("SQS_ONCE_LEDGER_NOTIFY_URL")).keeping_keys_in_accounts(keys_in_accounts))
    }
}

impl Handler for Ledger {
    async fn handle(&self, record: &Record) -> HandlerResult {
        let entry: Entry = record.body_json()?;
        if entry.account.is_empty() {
            return Err(HandlerError::permanent("an entry needs an account"));
        }
        let mut update = Update::new(&self.table, Key::new("pk", entry.account.as_str())).add("balance", entry.amount);
        if self.keys_in_accounts {
            update = update.keep_key();
        }
        if entry.amount < 0 {
            let debit = entry.amount.checked_neg().ok_or_else(|| HandlerError::permanent("amount out of range"))?;
            update = update
                .condition(Condition::ge("balance", debit))
                .or_fail(ErrorKind::Permanent, format!("account {}: the balance is below {debit}", entry.account));
        }
        let transaction = record.transaction();
        transaction.stage(update)?;
        if let Some(queue_url) = &self.notify {
            let notice = json!({ "account": entry.account, "amount": entry.amount, "message_id": record.message_id });
            transaction.send(Message::sqs(queue_url, notice.to_string()))?;
        }
        Ok(Some(json!({ "account": entry.account, "amount": entry.amount })))
    }

    fn stages_every_effect(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use sqs_once::{
        event::EventRecord,
        report::{Failure, Outcome},
        testing::{self, TestConsumer},
    };

    /// One delivery of each message: its id and body.
    fn deliveries(messages: &[(&str, &str)]) -> Vec<EventRecord> {
        let message =
            |(id, body): &(&str, &str)| EventRecord::Message(std::sync::Arc::new(testing::message(id, *body)));
        messages.iter().map(message).collect()
    }

    const NOTIFY: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/ledger-notices";

    fn balances(consumer: &TestConsumer) -> Vec<(String, i64)> {
        let items = consumer.items("ledger");
        items.iter().map(|item| (item["pk"].as_str().unwrap().to_owned(), item["balance"].as_i64().unwrap())).collect()
    }

    #[tokio::test]
    async fn each_entry_applies_once_and_is_announced_once() {
        let consumer = TestConsumer::new(Ledger::new("ledger", Some(NOTIFY.into())));
        let credit = r#"{"account": "a-1", "amount": 50}"#;
        let event =
            testing::event([credit, r#"{"account": "a-2", "amount": 7}"#, r#"{"account": "a-1", "amount": -20}"#]);
        let report = consumer.process(&event).await;
        assert!(testing::failures(&report).is_empty(), "{report:?}");
        // SQS delivers the whole batch again: every record is a duplicate, nothing applies twice.
        let again = consumer.process(&event).await;
        assert!(again.records.iter().all(|record| record.outcome == Outcome::Duplicate));
        assert_eq!(balances(&consumer), [("a-1".to_owned(), 30), ("a-2".to_owned(), 7)]);
        let notices: Vec<Value> =
            consumer.sent().iter().map(|sent| serde_json::from_str(&sent.message.body).unwrap()).collect();
        assert_eq!(notices.len(), 3);
        assert!(notices.contains(&json!({"account": "a-1", "amount": -20, "message_id": "m-2"})));
    }

    #[tokio::test]
    async fn an_overdraft_fails_for_good_and_changes_nothing() {
        let consumer = TestConsumer::new(Ledger::new("ledger", Some(NOTIFY.into())));
        consumer.process(&deliveries(&[("m-1", r#"{"account": "a-1", "amount": 10}"#)])).await;
        let report = consumer.process(&deliveries(&[("m-2", r#"{"account": "a-1", "amount": -11}"#)])).await;
        let Outcome::Failed(Failure::Permanent(reason)) = &report.records[0].outcome else { panic!("{report:?}") };
        assert!(reason.contains("balance is below 11") && reason.contains("ConditionalCheckFailed"), "{reason}");
        assert_eq!(balances(&consumer), [("a-1".to_owned(), 10)]);
        assert_eq!(consumer.sent().len(), 1, "the refused debit announced nothing");
        let unknown = consumer.process(&deliveries(&[("m-3", r#"{"account": "a-9", "amount": -1}"#)])).await;
        assert!(unknown.records[0].outcome.is_failure(), "no account, no balance to debit");
    }

    #[tokio::test]
    async fn entries_that_do_not_parse_fail_for_good() {
        let consumer = TestConsumer::new(Ledger::new("ledger", None));
        let event = testing::event([r#"{"account": "a-1"}"#, r#"{"account": "", "amount": 1}"#, "5"]);
        let report = consumer.process(&event).await;
        assert!(report.records.iter().all(|record| matches!(record.outcome, Outcome::Failed(Failure::Permanent(_)))));
        assert!(consumer.items("ledger").is_empty());
    }
}
