//! A claim store of one's own, run on Lambda through the builder.
//!
//! [`ClaimStore`]'s core is four methods, each one atomic, conditional
//! operation in the store's backend: claim a key if it is free, read it,
//! finish it and release it, the last two only while the caller's token
//! still holds it. Implement them on what you run (a relational table with
//! `INSERT … ON CONFLICT … WHERE`, a cache with compare-and-set) and
//! `sqs_once::claim_suite!` checks the contract: this file runs it in its
//! own tests (`cargo test --example own_store`).
//!
//! This store keeps its claims in the process, behind one lock: every batch
//! of one long-lived process (`poll`, or one Lambda Managed Instances
//! environment) is deduplicated against every other, a fresh process starts
//! with none. With the four methods alone it runs handlers that stage
//! nothing; a handler that stages writes needs [`Capabilities::commits`](sqs_once::store::Capabilities), and
//! the consumer refuses to start without it rather than fail records later.
//!
//! The builder also wraps the Lambda service in a tower layer here, as
//! `lambda_runtime::Runtime::layer` does: one log line per invocation,
//! before any record of it is read.
//!
//! ```text
//! cargo run --example own_store -- invoke events/single.json
//! ```

use std::{
    collections::HashMap,
    process::ExitCode,
    sync::{Arc, Mutex, MutexGuard},
};

use lambda_runtime::{LambdaInvocation, tower::util::MapRequestLayer};
use sqs_once::{
    Consumer, Handler, HandlerResult, Record,
    store::{ClaimStore, Fenced, Finish, PutOutcome, StoreError, StoredClaim},
};

/// Claims in this process's memory, by stored id.
#[derive(Debug, Default)]
struct ProcessClaims {
    claims: Mutex<HashMap<String, StoredClaim>>,
}

impl ProcessClaims {
    fn claims(&self) -> MutexGuard<'_, HashMap<String, StoredClaim>> {
        // A panic while the lock was held left no half-written claim: every change is one insert or remove.
        self.claims.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies `change` to the claim `id` if it is in progress under
    /// `token`: the fence every write after the claim goes through.
    fn fenced(&self, id: &str, token: &str, change: impl FnOnce(&mut HashMap<String, StoredClaim>)) -> Fenced {
        let mut claims = self.claims();
        match claims.get(id) {
            Some(claim) if claim.token.as_deref() == Some(token) => {
                change(&mut claims);
                Fenced::Applied
            }
            _ => Fenced::Refused,
        }
    }
}

#[async_trait::async_trait]
impl ClaimStore for ProcessClaims {
    async fn put_if_free(&self, claim: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        let mut claims = self.claims();
        match claims.get(&claim.id) {
            // The holder comes back with the refusal: the engine tells a duplicate from a conflict by it.
            Some(held) if !held.is_free(now_ms) => Ok(PutOutcome::Taken(Some(Box::new(held.clone())))),
            _ => {
                claims.insert(claim.id.clone(), claim.clone());
                Ok(PutOutcome::Claimed)
            }
        }
    }

    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        Ok(self.claims().get(id).cloned())
    }

    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        Ok(self.fenced(id, token, |claims| {
            if let Some(claim) = claims.get_mut(id) {
                claim.apply(finish);
            }
        }))
    }

    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        if !self.claims().contains_key(id) {
            // A retried release whose first attempt applied finds the key free, as a release wants it.
            return Ok(Fenced::Applied);
        }
        Ok(self.fenced(id, token, |claims| {
            claims.remove(id);
        }))
    }
}

/// Greets each message once.
struct Greeter;

impl Handler for Greeter {
    async fn handle(&self, record: &Record) -> HandlerResult {
        tracing::info!(message_id = %record.message_id, body = %record.body, "hello");
        Ok(None)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let announced = MapRequestLayer::new(|invocation: LambdaInvocation| {
        tracing::info!(request_id = %invocation.context.request_id, "invocation");
        invocation
    });
    // Every other part (settings, AWS clients, the SQS step) from the environment, as `sqs_once::run` makes them.
    Consumer::builder().store(Arc::new(ProcessClaims::default())).layer(announced).run(Greeter).await
}

#[cfg(test)]
mod tests {
    use super::ProcessClaims;

    sqs_once::claim_suite!(std::sync::Arc::new(ProcessClaims::default()));
}
