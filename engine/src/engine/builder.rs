//! The one way to put an engine together: the consumer's builder,
//! `TestConsumer`, the engine's tests and the simulation all build their
//! engines here, so that what one of them proves holds for the others.

use std::{fmt, sync::Arc, time::Duration};

use super::{Engine, EngineOptions};
use crate::{
    claim::{ClaimPolicy, Claims},
    key::Keys,
    outbox::{Outbox, OutboxTimes},
};
use sqs_once_core::{
    BoxHandler,
    clock::{Clock, SystemClock},
    destinations::Destinations,
    payload::PayloadStore,
    store::ClaimStore,
};

/// Builds an [`Engine`] ([`Engine::builder`]): its store and keys, and
/// for the rest the default policy and options, the system clock, no
/// outbox and no payload store unless set.
pub struct EngineBuilder {
    store: Arc<dyn ClaimStore>,
    keys: Keys,
    policy: ClaimPolicy,
    options: EngineOptions,
    clock: Arc<dyn Clock>,
    outbox: Option<OutboxParts>,
    payloads: Option<Arc<dyn PayloadStore>>,
}

/// What the outbox sends with.
struct OutboxParts {
    destinations: Arc<dyn Destinations>,
    times: OutboxTimes,
    sweep_every: Option<Duration>,
}

impl Engine {
    /// An engine over `store` (claims, commits and outbox entries) keying
    /// records with `keys`, built by the [`EngineBuilder`]'s calls.
    pub fn builder(store: Arc<dyn ClaimStore>, keys: Keys) -> EngineBuilder {
        EngineBuilder {
            store,
            keys,
            policy: ClaimPolicy::default(),
            options: EngineOptions::default(),
            clock: Arc::new(SystemClock),
            outbox: None,
            payloads: None,
        }
    }
}

impl EngineBuilder {
    /// Takes and keeps claims by `policy`.
    pub fn policy(mut self, policy: ClaimPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Runs batches by `options`.
    pub fn options(mut self, options: EngineOptions) -> Self {
        self.options = options;
        self
    }

    /// Judges every lease, expiry and sending lease by `clock`.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sends committed messages to `destinations`, each send and deletion
    /// within `times`, sweeping entries left unsent every `sweep_every`
    /// (`None`: only when asked), when the store keeps an outbox. Without
    /// it they wait in the store for `sqs-once claims outbox --send`.
    pub fn outbox(
        mut self,
        destinations: Arc<dyn Destinations>,
        times: OutboxTimes,
        sweep_every: Option<Duration>,
    ) -> Self {
        self.outbox = Some(OutboxParts { destinations, times, sweep_every });
        self
    }

    /// Reads the payloads records point to from `payloads` (S3); without
    /// one, a record that carries a pointer fails `payload_unavailable`.
    pub fn payloads(mut self, payloads: Option<Arc<dyn PayloadStore>>) -> Self {
        self.payloads = payloads;
        self
    }

    /// The engine around `handler`.
    pub fn build(self, handler: BoxHandler) -> Engine {
        let claims = Claims::with_policy(Arc::clone(&self.store), self.policy, Arc::clone(&self.clock));
        let outbox = self.outbox.and_then(|parts| {
            let entries = Arc::clone(&self.store).capabilities().outbox?;
            let outbox = Outbox::new(entries, parts.destinations, self.clock, parts.times, parts.sweep_every);
            Some(Arc::new(outbox))
        });
        Engine::new(handler, Arc::new(claims), self.keys, self.options, outbox, self.payloads)
    }
}

impl fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("keys", &self.keys)
            .field("policy", &self.policy)
            .field("options", &self.options)
            .field("outbox", &self.outbox.as_ref().map(|outbox| (outbox.times, outbox.sweep_every)))
            .finish_non_exhaustive()
    }
}
