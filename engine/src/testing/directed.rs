//! A handler the engine's and the stores' tests direct through their bodies.

use parking_lot::Mutex;
use std::{sync::Arc, time::Duration};

use serde_json::Value;

use sqs_once_core::{Handler, HandlerError, HandlerResult, Record};

/// The bundled demo handler's directives: `{"sleep_ms": 250}` sleeps, and
/// `{"fail": "retryable" | "permanent" | "panic"}` fails that way. Every
/// run is kept, before it obeys anything, as (key, message id).
#[derive(Clone, Debug, Default)]
pub struct Directed {
    runs: Arc<Mutex<Vec<(String, String)>>>,
}

impl Directed {
    /// Every run so far, as (key, message id).
    pub fn runs(&self) -> Vec<(String, String)> {
        self.runs.lock().clone()
    }
}

impl Handler for Directed {
    async fn handle(&self, record: &Record) -> HandlerResult {
        self.runs.lock().push((record.key.clone(), record.message_id.clone()));
        let body: Value = serde_json::from_str(&record.body).unwrap_or_default();
        if let Some(ms) = body["sleep_ms"].as_u64() {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        match body["fail"].as_str() {
            None => Ok(None),
            Some("retryable") => Err(HandlerError::retryable("asked to fail")),
            Some("panic") => panic!("asked to panic"),
            Some(_) => Err(HandlerError::permanent("asked to fail")),
        }
    }
}
