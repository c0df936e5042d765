//! What the simulated consumers process: messages whose bodies say what
//! their handler does, and the handler that does it.
//!
//! A staging handler writes, in its transaction, one increment of its key's
//! `applied` counter (so the store shows how often a key's writes applied)
//! and one of its own run's (so the store shows how often each run's
//! writes applied: once at most, ever), may
//! open a gate or be conditioned on one (a `Check` whose refusal is
//! retryable or permanent), and sends messages through the outbox whose
//! bodies name the run. One that keeps its key in the item stages the
//! increment alone, naming its run in it (`Update::keep_key`: the update
//! commits alone, the key kept in the `applied` item). A plain handler
//! stages nothing.

use std::{sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};

use super::world::World;
use sqs_once_core::{
    ErrorKind, Handler, HandlerError, HandlerResult, Record,
    transaction::{Check, Condition, Key, Message, Put, Update},
};

/// The message attribute that names the invocation a record runs in.
pub(super) const HOLDER: &str = "sim-holder";

/// Where the handlers' messages go.
pub(super) const OUT_QUEUE: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/out";

/// What a message asks of its handler; the body of every message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Spec {
    /// The business key: the records' idempotency key.
    pub id: String,
    /// How long the handler takes.
    #[serde(default)]
    pub sleep_ms: u64,
    /// The first this many runs of the key fail, retryably.
    #[serde(default)]
    pub fails: u32,
    /// Every run fails, permanently.
    #[serde(default)]
    pub permanent: bool,
    /// What the handler stages, if anything.
    #[serde(default)]
    pub staged: Option<Staging>,
}

/// What a staging handler stages beside its counter and its run's item.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Staging {
    /// Messages sent through the outbox.
    pub messages: u8,
    /// A gate this run opens.
    pub opens: Option<String>,
    /// A gate that must be open, and whether its refusal is permanent.
    pub gate: Option<(String, bool)>,
    /// The increment alone, its key kept in the `applied` item of this
    /// `pk` (its own key's, or one that other keys credit too): no run
    /// item, no gate, no message.
    #[serde(default)]
    pub kept_in: Option<String>,
}

impl Spec {
    /// The specs of one world: `keys` business keys, a few of them gated,
    /// and every gate that a retryable refusal waits on opened by some key.
    pub(super) fn draw(rng: &mut fastrand::Rng, keys: usize) -> Vec<Spec> {
        let gates = ["g-0", "g-1"];
        let mut specs: Vec<Spec> = (0..keys)
            .map(|n| {
                let staged = rng.f64() < 0.7;
                let staging = staged.then(|| {
                    let gate = (rng.f64() < 0.3).then(|| (gates[rng.usize(..2)].to_owned(), rng.f64() < 0.3));
                    Staging { messages: rng.u8(0..=2), opens: None, gate, kept_in: None }
                });
                Spec {
                    id: format!("k-{n}"),
                    sleep_ms: match rng.u8(0..20) {
                        0 => rng.u64(1_000..10_000),
                        1..=3 => rng.u64(50..500),
                        _ => rng.u64(0..20),
                    },
                    fails: if rng.f64() < 0.15 { rng.u32(1..=2) } else { 0 },
                    permanent: rng.f64() < 0.05,
                    staged: staging,
                }
            })
            .collect();
        for gate in gates {
            let waits = specs.iter().any(|spec| spec.gate() == Some(gate));
            let opener = specs.iter_mut().find(|spec| spec.staged.as_ref().is_some_and(|staged| staged.gate.is_none()));
            if let (true, Some(opener)) = (waits, opener)
                && let Some(staged) = &mut opener.staged
                && staged.opens.is_none()
            {
                staged.opens = Some(gate.to_owned());
            }
        }
        specs
    }

    /// The `n`th record of the traffic that goes on once the faults
    /// healed: every way of committing in turn (nothing staged, a
    /// transaction with a message, a key kept in an item of its own, a key
    /// kept in the item other keys of the world credit too), each of which must
    /// commit, under whatever key memory and queue the world drew.
    pub(super) fn tail(n: usize) -> Spec {
        let id = format!("tail-{n}");
        let staged = match n % 4 {
            0 => None,
            1 => Some(Staging { messages: 1, opens: None, gate: None, kept_in: None }),
            2 => Some(Staging { messages: 0, opens: None, gate: None, kept_in: Some(id.clone()) }),
            _ => Some(Staging { messages: 0, opens: None, gate: None, kept_in: Some("account".to_owned()) }),
        };
        Spec { id, sleep_ms: 0, fails: 0, permanent: false, staged }
    }

    /// The item this spec's key is kept in, if it keeps its key in one.
    pub(super) fn kept_in(&self) -> Option<&str> {
        self.staged.as_ref()?.kept_in.as_deref()
    }

    fn gate(&self) -> Option<&str> {
        self.staged.as_ref()?.gate.as_ref().map(|(gate, _)| gate.as_str())
    }
}

/// The handler of every simulated consumer.
pub(super) struct SimHandler {
    pub world: Arc<World>,
}

impl Handler for SimHandler {
    fn stages_every_effect(&self) -> bool {
        // Sleeping and failing are not effects; every write and message is staged.
        true
    }

    async fn handle(&self, record: &Record) -> HandlerResult {
        let spec: Spec = record.body_json()?;
        let holder = record.message_attributes().get(HOLDER).and_then(|holder| holder.string_value.clone());
        let run = self.world.ledger.lock().start_run(record.key.clone(), holder.unwrap_or_default(), &spec);
        if spec.sleep_ms > 0 {
            tokio::time::sleep(Duration::from_millis(spec.sleep_ms)).await;
        }
        if run.attempt <= spec.fails {
            return Err(HandlerError::retryable("asked to fail this time"));
        }
        if spec.permanent {
            return Err(HandlerError::permanent("asked to fail for good"));
        }
        let Some(staging) = &spec.staged else { return Ok(None) };
        let transaction = record.transaction();
        if let Some(item) = &staging.kept_in {
            let credit = Update::new("applied", Key::new("pk", item.as_str())).add("n", 1).set("run", run.id);
            transaction.stage(credit.keep_key())?;
            return Ok(None);
        }
        transaction.stage(Update::new("applied", Key::new("pk", spec.id.as_str())).add("n", 1))?;
        transaction.stage(Update::new("runs", Key::new("run", run.id)).set("key", spec.id.as_str()).add("n", 1))?;
        if let Some(gate) = &staging.opens {
            transaction.stage(Put::new("gates", Key::new("pk", gate.as_str())).set("open", true))?;
        }
        if let Some((gate, permanent)) = &staging.gate {
            let kind = if *permanent { ErrorKind::Permanent } else { ErrorKind::Retryable };
            let check = Check::new("gates", Key::new("pk", gate.as_str()), Condition::exists("open"));
            transaction.stage(check.or_fail(kind, "the gate is closed"))?;
        }
        for n in 0..staging.messages {
            transaction.send(Message::sqs(OUT_QUEUE, message_body(run.id, n)))?;
        }
        Ok(None)
    }
}

/// The body of the `n`th message of run `run`.
pub(super) fn message_body(run: u64, n: u8) -> String {
    format!("run-{run}/{n}")
}
