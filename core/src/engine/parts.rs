//! What an engine is made of besides its handler, and the one way to put
//! it together: the builder, `TestConsumer`, the engine's tests and the
//! simulation all assemble their engines here, so that what one of them
//! proves holds for the others.

use std::{fmt, sync::Arc, time::Duration};

use super::{Engine, EngineOptions};
use crate::{
    claim::{ClaimPolicy, Claims},
    clock::{Clock, SystemClock},
    handler::BoxHandler,
    key::Keys,
    outbox::{Destinations, Outbox, OutboxTimes},
    payload::PayloadStore,
    store::ClaimStore,
};

/// An engine's parts: its store, keys, policy, options, clock and outbox.
pub struct EngineParts {
    /// Where claims, commits and outbox entries live.
    pub store: Arc<dyn ClaimStore>,
    /// How records are keyed.
    pub keys: Keys,
    /// How claims are taken and kept.
    pub policy: ClaimPolicy,
    /// How batches run.
    pub options: EngineOptions,
    /// The time every lease, expiry and sending lease is judged by.
    pub clock: Arc<dyn Clock>,
    /// Where committed messages go, when the store keeps an outbox; without
    /// it they wait in the store for `sqs-once claims outbox --send`.
    pub outbox: Option<OutboxParts>,
    /// Where the payloads records point to are read (S3); without it, a
    /// record that carries a pointer fails `payload_unavailable`.
    pub payloads: Option<Arc<dyn PayloadStore>>,
}

/// What the outbox sends with.
pub struct OutboxParts {
    /// Where messages go.
    pub destinations: Arc<dyn Destinations>,
    /// How long a send and a deletion may take.
    pub times: OutboxTimes,
    /// How often entries left unsent are swept (`None`: only when asked).
    pub sweep_every: Option<Duration>,
}

impl fmt::Debug for OutboxParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxParts")
            .field("times", &self.times)
            .field("sweep_every", &self.sweep_every)
            .finish_non_exhaustive()
    }
}

impl EngineParts {
    /// The parts of an engine over `store` keyed by `keys`, with the default
    /// policy and options, the system clock and no outbox.
    pub fn new(store: Arc<dyn ClaimStore>, keys: Keys) -> Self {
        Self {
            store,
            keys,
            policy: ClaimPolicy::default(),
            options: EngineOptions::default(),
            clock: Arc::new(SystemClock),
            outbox: None,
            payloads: None,
        }
    }

    /// The engine of these parts around `handler`.
    pub fn engine(self, handler: BoxHandler) -> Engine {
        let claims = Claims::with_policy(Arc::clone(&self.store), self.policy, Arc::clone(&self.clock));
        let outbox = self.outbox.and_then(|parts| {
            let entries = Arc::clone(&self.store).outbox()?;
            let outbox = Outbox::new(entries, parts.destinations, self.clock, parts.times, parts.sweep_every);
            Some(Arc::new(outbox))
        });
        Engine::new(handler, Arc::new(claims), self.keys, self.options, outbox, self.payloads)
    }
}

impl std::fmt::Debug for EngineParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineParts")
            .field("keys", &self.keys)
            .field("policy", &self.policy)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}
