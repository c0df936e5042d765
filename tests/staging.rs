//! A transaction commits whole or not at all, whatever the handler does
//! with a staging error: a write or message refused when staged keeps every
//! other part from committing, even when the handler ignores the error
//! (`let _ = transaction.send(..)`, as rustc suggests for an unused result)
//! and returns success. Run through `TestConsumer`, as a handler's own tests
//! run it.

use serde_json::json;
use sqs_once::{
    Handler, HandlerError, HandlerResult, Record,
    report::{Failure, Outcome},
    testing::{self, TestConsumer},
    transaction::{Key, Message, Update},
};

/// Charges `{"account", "cents"}` and sends a receipt to `receipts`, which
/// is no queue URL when `{"bad_receipts": true}`; ignores the staging error
/// of the receipt, or returns it (`{"propagate": true}`), or fails on its own
/// afterwards (`{"fail": true}`).
struct Payments {
    stages_every_effect: bool,
}

impl Handler for Payments {
    async fn handle(&self, record: &Record) -> HandlerResult {
        let body: serde_json::Value = record.body_json()?;
        let transaction = record.transaction();
        let charge = Update::new("accounts", Key::new("account", body["account"].as_str().unwrap_or_default()));
        transaction.stage(charge.add("charged_cents", body["cents"].as_i64().unwrap_or_default()))?;
        let receipts = match body["bad_receipts"].as_bool() {
            Some(true) => "receipts",
            _ => "https://sqs.us-east-1.amazonaws.com/123456789012/receipts",
        };
        let sent = transaction.send(Message::sqs(receipts, record.body.clone()));
        if body["propagate"] == json!(true) {
            sent?;
        }
        if body["fail"] == json!(true) {
            return Err(HandlerError::retryable("the handler's own failure"));
        }
        Ok(None)
    }

    fn stages_every_effect(&self) -> bool {
        self.stages_every_effect
    }
}

fn consumers() -> [TestConsumer; 2] {
    [false, true].map(|stages_every_effect| TestConsumer::new(Payments { stages_every_effect }))
}

#[tokio::test]
async fn a_message_refused_at_staging_and_ignored_commits_nothing_and_fails_the_record() {
    for consumer in consumers() {
        let bodies =
            [json!({"account": "a-1", "cents": 700, "bad_receipts": true}), json!({"account": "a-2", "cents": 300})];
        let report = consumer.process(&testing::event(bodies.iter().map(|body| body.to_string()))).await;
        assert_eq!(testing::failures(&report), ["m-0"], "{report:?}");
        let Outcome::Failed(Failure::Permanent(reason)) = &report.records[0].outcome else { panic!("{report:?}") };
        assert!(reason.contains("`receipts` is not a queue URL"), "{reason}");
        assert!(reason.contains("commits whole or not at all"), "{reason}");
        // The charge of a-1 did not commit without its receipt; a-2 is unaffected.
        assert_eq!(consumer.items("accounts"), [json!({"account": "a-2", "charged_cents": 300})]);
        assert_eq!(consumer.sent().len(), 1);
        assert!(consumer.sent()[0].message.body.contains("a-2"));
    }
}

#[tokio::test]
async fn a_staging_error_returned_or_beside_the_handlers_own_failure_keeps_its_reason() {
    for consumer in consumers() {
        let bodies = [
            json!({"account": "a-1", "cents": 700, "bad_receipts": true, "propagate": true}),
            json!({"account": "a-2", "cents": 300, "bad_receipts": true, "fail": true}),
        ];
        let report = consumer.process(&testing::event(bodies.iter().map(|body| body.to_string()))).await;
        assert_eq!(testing::failures(&report), ["m-0", "m-1"]);
        let Outcome::Failed(Failure::Permanent(reason)) = &report.records[0].outcome else { panic!("{report:?}") };
        assert!(reason.contains("`receipts` is not a queue URL") && !reason.contains("whole"), "{reason}");
        let Outcome::Failed(Failure::Retryable(reason)) = &report.records[1].outcome else { panic!("{report:?}") };
        assert_eq!(reason, "the handler's own failure");
        assert_eq!(consumer.items("accounts"), Vec::<serde_json::Value>::new());
        assert!(consumer.sent().is_empty());
    }
}
