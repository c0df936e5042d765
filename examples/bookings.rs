//! A consumer crate of one's own whose side effects are DynamoDB writes and
//! a message, so they happen exactly once: each booking takes a seat on its
//! flight and records the booking in one transaction with the completion of
//! the message's key, and its confirmation leaves through the outbox once
//! that transaction has committed. Nothing else is done, so a run needs no
//! claim first: one request per booking.
//!
//! ```sh
//! BOOKINGS_FLIGHTS_TABLE=flights BOOKINGS_TABLE=bookings \
//!     cargo run --example bookings -- invoke events/bookings.json
//! ```
//!
//! Offline, the SQLite store keeps the flights and bookings beside the
//! claims; run it twice and every record is a duplicate. In Lambda, the
//! tables are DynamoDB tables (partition keys `flight` and `booking`), and
//! the role needs `dynamodb:UpdateItem` and `dynamodb:PutItem` on them (the
//! template's `HandlerTableArns`), and `sqs:SendMessage` on the confirmation
//! queue (`HandlerQueueArns`).

use std::process::ExitCode;

use serde::Deserialize;
use serde_json::json;
use sqs_once::{
    ErrorKind, Handler, HandlerResult, Record,
    transaction::{Condition, Key, Message, Put, Update},
};

/// Seats on every flight.
const SEATS: u64 = 2;

/// A booking request, as the publisher sends it.
#[derive(Deserialize)]
struct Booking {
    booking: String,
    flight: String,
    passenger: String,
}

/// Books seats, once per booking however often SQS delivers it.
struct Bookings {
    flights: String,
    bookings: String,
    confirmations: Option<String>,
}

impl Handler for Bookings {
    async fn handle(&self, record: &Record) -> HandlerResult {
        let booking: Booking = record.body_json()?;
        let transaction = record.transaction();
        // One seat fewer, unless the flight is full: then nothing of this booking applies.
        let seat = Update::new(&self.flights, Key::new("flight", booking.flight.as_str()))
            .add("booked", 1)
            .condition(Condition::not_exists("booked") | Condition::lt("booked", SEATS))
            .or_fail(ErrorKind::Permanent, format!("flight {} is full", booking.flight));
        transaction.stage(seat)?;
        let record_it = Put::new(&self.bookings, Key::new("booking", booking.booking.as_str()))
            .set("flight", booking.flight.as_str())
            .set("passenger", booking.passenger.as_str())
            .condition(Condition::not_exists("booking"))
            .or_fail(ErrorKind::Permanent, format!("booking {} exists already", booking.booking));
        transaction.stage(record_it)?;
        if let Some(queue_url) = &self.confirmations {
            let confirmation = json!({ "booking": booking.booking, "flight": booking.flight });
            transaction.send(Message::sqs(queue_url, confirmation.to_string()))?;
        }
        Ok(None)
    }

    // Every effect is staged: a run takes no claim first, and its one transaction completes the key with the
    // seat, the booking and the confirmation's outbox item.
    fn stages_every_effect(&self) -> bool {
        true
    }
}

impl Bookings {
    /// The tables and queue `BOOKINGS_FLIGHTS_TABLE`, `BOOKINGS_TABLE` and
    /// `BOOKINGS_CONFIRM_URL` name.
    fn from_env() -> Result<Self, String> {
        let setting = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        Ok(Self {
            flights: setting("BOOKINGS_FLIGHTS_TABLE").ok_or("BOOKINGS_FLIGHTS_TABLE is not set")?,
            bookings: setting("BOOKINGS_TABLE").ok_or("BOOKINGS_TABLE is not set")?,
            confirmations: setting("BOOKINGS_CONFIRM_URL"),
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    sqs_once::run_with(async || Bookings::from_env()).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqs_once::{
        event::EventRecord,
        report::{Failure, Outcome},
        testing::{self, TestConsumer},
    };

    const CONFIRM: &str = "https://sqs.eu-west-1.amazonaws.com/123456789012/confirmations";

    fn consumer() -> TestConsumer {
        let bookings =
            Bookings { flights: "flights".into(), bookings: "bookings".into(), confirmations: Some(CONFIRM.into()) };
        TestConsumer::new(bookings)
    }

    /// Deliveries of (message id, body).
    fn deliveries(messages: &[(&str, &str)]) -> Vec<EventRecord> {
        messages
            .iter()
            .map(|(id, body)| EventRecord::Message(std::sync::Arc::new(testing::message(id, *body))))
            .collect()
    }

    #[tokio::test]
    async fn a_booking_delivered_twice_takes_one_seat_and_is_confirmed_once() {
        let consumer = consumer();
        let booking = r#"{"booking": "b-1", "flight": "f-1", "passenger": "Ada"}"#;
        let report = consumer.process(&deliveries(&[("m-1", booking), ("m-1", booking)])).await;
        assert!(testing::failures(&report).is_empty());
        let again = consumer.process(&deliveries(&[("m-1", booking)])).await;
        assert_eq!(again.records[0].outcome, Outcome::Duplicate);
        assert_eq!(consumer.items("flights"), [json!({"flight": "f-1", "booked": 1})]);
        assert_eq!(consumer.items("bookings"), [json!({"booking": "b-1", "flight": "f-1", "passenger": "Ada"})]);
        assert_eq!(consumer.sent().len(), 1);
        assert_eq!(consumer.sent()[0].message.body, r#"{"booking":"b-1","flight":"f-1"}"#);
    }

    #[tokio::test]
    async fn a_full_flight_refuses_the_booking_and_writes_nothing() {
        let consumer = consumer();
        let event = deliveries(&[
            ("m-1", r#"{"booking": "b-1", "flight": "f-1", "passenger": "Ada"}"#),
            ("m-2", r#"{"booking": "b-2", "flight": "f-1", "passenger": "Bob"}"#),
        ]);
        assert!(testing::failures(&consumer.process(&event).await).is_empty());
        let full = deliveries(&[("m-3", r#"{"booking": "b-3", "flight": "f-1", "passenger": "Cy"}"#)]);
        let report = consumer.process(&full).await;
        let Outcome::Failed(Failure::Permanent(reason)) = &report.records[0].outcome else { panic!("{report:?}") };
        assert!(reason.starts_with("flight f-1 is full"), "{reason}");
        assert_eq!(consumer.items("flights"), [json!({"flight": "f-1", "booked": 2})]);
        assert_eq!(consumer.items("bookings").len(), 2, "b-3 was not recorded");
        assert_eq!(consumer.sent().len(), 2, "b-3 was not confirmed");
    }
}
