//! A handler from an async closure, as `service_fn` makes a service: for
//! logic with no state of its own beyond what the closure captures.
//!
//! ```sh
//! cargo run --example closure_handler -- invoke events/batch.json
//! ```

use std::{
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use sqs_once::{HandlerError, Record, handler_fn};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let seen = Arc::new(AtomicU64::new(0));
    sqs_once::run(handler_fn(move |record: Record| {
        let seen = Arc::clone(&seen);
        async move {
            if record.body.trim().is_empty() {
                return Err(HandlerError::permanent("empty message"));
            }
            let count = seen.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::info!(message_id = %record.message_id, count, "handled");
            Ok(None)
        }
    }))
    .await
}
