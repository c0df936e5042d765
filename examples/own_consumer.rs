//! An SQS consumer of one's own: a handler, its key, and a consumer around
//! them.
//!
//! `sqs-once new <name>` writes this file as the `src/main.rs` of a new
//! consumer crate, with a `Cargo.toml`, a SAM template and a sample event
//! around it.
//!
//! The binary is the Lambda function inside Lambda (`sam build` builds it
//! with cargo-lambda) and the command line outside it: `invoke` processes an
//! event offline (`cargo run -- invoke events/batch.json`), `poll` consumes
//! a queue, `claims` reads and repairs the claim table and `create-table`
//! makes one.

use std::process::ExitCode;

use serde::Deserialize;
use sqs_once::{Consumer, Handler, HandlerError, HandlerResult, Record};

/// Which part of a message is its key: each order is charged once, whichever
/// message brings it. Set here, in code, it is the same wherever the binary
/// runs (Lambda, `poll`, `invoke`) and in the tests; an `SQS_ONCE_KEY` that
/// says otherwise stops the start.
const KEY: &str = "body.order_id";

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
        //
        // Or, when the whole effect is one DynamoDB item's update, stage it
        // and let the item keep the key: one conditional write, applied once,
        // a write unit where a transaction costs four (docs/transactions.md,
        // "The key in the item"; `use sqs_once::transaction::{Key, Update};`):
        //
        //     record.transaction().stage(
        //         Update::new("orders", Key::new("pk", payment.order_id.as_str()))
        //             .add("charged_cents", payment.amount_cents)
        //             .keep_key(),
        //     )?;
        Ok(Some(serde_json::json!({ "order_id": payment.order_id, "charged": payment.amount_cents })))
    }
}

// A tenth less CPU per record than the system allocator; transparent huge
// pages off (the `no_thp` feature) keep its peak memory at the system's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// One thread: a batch waits on DynamoDB far more than it computes. A handler
// must not block it; blocking work goes to `tokio::task::spawn_blocking`.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    Consumer::builder().key(KEY).run(Payments).await
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
        let consumer = TestConsumer::new(Payments).key(KEY);
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
