//! `orders`: an example of the intended style. It takes an order message,
//! rejects malformed ones as permanent failures, charges it, and returns a
//! receipt that is stored with the claim when `SQS_ONCE_STORE_RESULT` is on.
//!
//! The charge is simulated; a real one would call a payment API here, passing
//! the record's key as the provider's idempotency key, and map timeouts and
//! 5xx answers to [`HandlerError::retryable`].

use serde::Deserialize;
use serde_json::json;

use sqs_once::{Handler, HandlerError, HandlerResult, Record};

/// A message on the orders queue.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Order {
    order_id: String,
    customer_id: String,
    amount_cents: u64,
    currency: String,
}

/// Charges orders.
#[derive(Debug, Default)]
pub struct Orders;

impl Handler for Orders {
    async fn handle(&self, record: &Record) -> HandlerResult {
        let order: Order = record.body_json()?;
        if order.amount_cents == 0 {
            return Err(HandlerError::permanent(format!("order {}: amount must be positive", order.order_id)));
        }
        if order.currency.len() != 3 || !order.currency.bytes().all(|byte| byte.is_ascii_uppercase()) {
            return Err(HandlerError::permanent(format!(
                "order {}: currency {:?} is not an ISO 4217 code",
                order.order_id, order.currency
            )));
        }
        let charge_id = format!("ch_{}", &record.key[record.key.len().saturating_sub(12)..]);
        tracing::info!(order_id = %order.order_id, customer_id = %order.customer_id, %charge_id, "order charged");
        Ok(Some(json!({
            "order_id": order.order_id,
            "charge_id": charge_id,
            "amount_cents": order.amount_cents,
            "currency": order.currency,
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqs_once::{ErrorKind, testing};

    async fn charge(body: &str) -> HandlerResult {
        Orders.handle(&testing::record(body)).await
    }

    #[tokio::test]
    async fn a_valid_order_is_charged_under_its_key_and_returns_a_receipt() {
        let receipt = charge(r#"{"order_id":"o-1","customer_id":"c-1","amount_cents":2599,"currency":"EUR"}"#).await;
        let receipt = receipt.unwrap().unwrap();
        // The charge is named after the record's key: the provider's idempotency key.
        assert_eq!(receipt["charge_id"], format!("ch_{}", testing::record("").key));
        assert_eq!(receipt["amount_cents"], 2599);
    }

    #[tokio::test]
    async fn invalid_orders_fail_permanently() {
        for body in [
            "not json",
            r#"{"order_id":"o-1"}"#,
            r#"{"order_id":"o-1","customer_id":"c","amount_cents":0,"currency":"EUR"}"#,
            r#"{"order_id":"o-1","customer_id":"c","amount_cents":5,"currency":"euro"}"#,
            r#"{"order_id":"o-1","customer_id":"c","amount_cents":5,"currency":"EUR","coupon":"X"}"#,
        ] {
            let error = charge(body).await.unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Permanent, "{body}: {error}");
        }
    }
}
