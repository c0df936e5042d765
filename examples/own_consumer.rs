//! A consumer crate of one's own: a handler, and `sqs_once::run` around it.
//!
//! The binary is everything the bundled `sqs-once` is, with this handler:
//! the Lambda function inside Lambda (build it with `cargo lambda build`
//! or `sam build`), and outside it `invoke`, `poll`, `claims` and
//! `create-table`:
//!
//! ```sh
//! cargo run --example own_consumer -- invoke events/single.json
//! ```
//!
//! In a crate of your own, `Cargo.toml` needs
//!
//! ```toml
//! [dependencies]
//! sqs-once = { git = "https://github.com/…/sqs-once" }   # or path = "../sqs-once"
//! serde = { version = "1", features = ["derive"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//!
//! [profile.release]
//! panic = "unwind"   # a panicking record fails alone; cargo-lambda would abort the batch
//! ```

use std::process::ExitCode;

use serde::Deserialize;
use sqs_once::{Handler, HandlerError, HandlerResult, Record};

/// A payment request, as the publisher sends it.
#[derive(Deserialize)]
struct Payment {
    order_id: String,
    amount_cents: u64,
}

/// Charges each order once, however often SQS delivers it.
struct Payments;

impl Handler for Payments {
    async fn handle(&self, record: &Record) -> HandlerResult {
        let payment: Payment = record.body_json()?;
        if payment.amount_cents == 0 {
            return Err(HandlerError::permanent(format!("order {}: nothing to charge", payment.order_id)));
        }
        // Call the payment provider here, passing `record.key` as its
        // idempotency key; a timeout is `HandlerError::retryable(..)`.
        Ok(Some(serde_json::json!({ "order_id": payment.order_id, "charged": payment.amount_cents })))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    sqs_once::run(Payments).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqs_once::{
        report::{Failure, Outcome},
        testing::{self, TestConsumer},
    };

    #[tokio::test]
    async fn each_order_is_charged_once_and_an_empty_one_fails_for_good() {
        let consumer = TestConsumer::new(Payments).key("body.order_id");
        let event = testing::event([
            r#"{"order_id": "o-1", "amount_cents": 500}"#,
            r#"{"order_id": "o-1", "amount_cents": 500}"#,
            r#"{"order_id": "o-2", "amount_cents": 0}"#,
            "not json",
        ]);
        let report = consumer.process(&event).await;
        assert_eq!(testing::failures(&report), ["m-2", "m-3"]);
        assert!(
            matches!(&report.records[2].outcome, Outcome::Failed(Failure::Permanent(reason)) if reason.contains("o-2"))
        );
        assert!(matches!(report.records[3].outcome, Outcome::Failed(Failure::MissingKey(_))));

        let again = consumer.process(&testing::event([r#"{"order_id": "o-1", "amount_cents": 500}"#])).await;
        assert_eq!(again.records[0].outcome, Outcome::Duplicate);
    }

    #[tokio::test]
    async fn the_handler_alone_reads_its_record() {
        let output = Payments.handle(&testing::record(r#"{"order_id": "o-3", "amount_cents": 7}"#)).await;
        assert_eq!(output.unwrap().unwrap()["charged"], 7);
    }
}
