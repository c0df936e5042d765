//! The consumers of the simulated world, each a process with its own engine,
//! claims and outbox over its own view of the shared store: a Lambda
//! function or a `poll` process.

use std::{sync::Arc, time::Duration};

use aws_lambda_events::sqs::SqsMessageAttribute;
use tokio::{sync::Semaphore, time::Instant};

use super::{
    TICK,
    queue::Delivery,
    workload::{HOLDER, SimHandler},
    world::{Life, Link, Mode, Sender, World},
};
use crate::{
    budget::{LEAVING_TIME, SHUTDOWN_TIME},
    claim::{ClaimPolicy, Claims},
    clock::Clock,
    engine::{ClaimFirst, Engine, EngineOptions, Invocation},
    event::EventRecord,
    key::Keys,
    outbox::Outbox,
    store::ClaimStore,
};

/// Batches a `poll` process runs at once.
const POLL_BATCHES: usize = 3;

/// Runs process `id` as `mode` says, until the world stops or the process
/// dies (a replacement then takes its place).
pub(super) async fn drive(world: Arc<World>, id: usize, mode: Mode) {
    let engine = engine(&world, id);
    match mode {
        Mode::Lambda => lambda(&world, id, &engine).await,
        Mode::Poll => poll(&world, id, &engine, Mode::Poll).await,
        Mode::Managed => {
            // Tended in the background until the process stops (once killed, its requests never return anyway).
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let tended = engine.clone();
            tokio::spawn(async move { tended.tend(async move { drop(stopped.await) }).await });
            poll(&world, id, &engine, Mode::Managed).await;
            drop(stop);
        }
    }
}

fn engine(world: &Arc<World>, id: usize) -> Engine {
    let scenario = &world.scenario;
    let link = Arc::new(Link { world: Arc::clone(world), process: id });
    let store: Arc<dyn ClaimStore> = Arc::clone(&link) as Arc<dyn ClaimStore>;
    let clock: Arc<dyn Clock> = Arc::clone(&world.clock) as Arc<dyn Clock>;
    let policy = ClaimPolicy {
        expires_after: Duration::from_secs(86_400),
        local_cache_entries: scenario.cache_entries,
        ..ClaimPolicy::default()
    };
    let claims = Claims::with_policy(Arc::clone(&store), policy, Arc::clone(&clock));
    let entries = Arc::clone(&link).outbox().expect("the world's store keeps an outbox");
    let outbox = Outbox::new(entries, Arc::new(Sender { link }), clock, Some(scenario.sweep_every));
    let keys = Keys::new("body.id", "sim").expect("a valid key").hashed(false);
    // The handler stages every effect: a process claims first, or (as `SQS_ONCE_CLAIM=auto` has it) runs
    // without a claim and commits the key's completion where it is free. Worlds mix the two.
    let claim = match world.draw(|rng| rng.f64() < scenario.unclaimed) {
        true => ClaimFirst::Auto,
        false => ClaimFirst::Always,
    };
    let options = EngineOptions { concurrency: scenario.concurrency, claim, ..EngineOptions::default() };
    let handler = Arc::new(SimHandler { world: Arc::clone(world) });
    Engine::new(handler, Arc::new(claims), keys, options).with_outbox(Some(Arc::new(outbox)))
}

/// The records of an invocation's `deliveries`, each carrying the
/// invocation's request id (the claims' holder) in the message attribute
/// [`HOLDER`], so that a run that takes no claim knows its holder too.
fn records(deliveries: &[Delivery], invocation: &Invocation) -> Vec<EventRecord> {
    deliveries
        .iter()
        .map(|delivery| {
            let mut message = crate::testing::message(&delivery.message_id, delivery.body.clone());
            message.attributes.insert("ApproximateReceiveCount".into(), delivery.receive_count.to_string());
            let mut holder = SqsMessageAttribute::default();
            holder.string_value = Some(invocation.request_id.clone());
            holder.data_type = Some("String".into());
            message.message_attributes.insert(HOLDER.into(), holder);
            EventRecord::Message(Arc::new(message))
        })
        .collect()
}

/// A Lambda function: one invocation at a time, frozen from its answer to
/// its next invocation; killed now and then mid-batch or while frozen, or
/// shut down with SIGTERM's time to send its unconfirmed writes again.
async fn lambda(world: &Arc<World>, id: usize, engine: &Engine) {
    world.set_life(id, Life::Frozen);
    for batch in 0.. {
        let deliveries = loop {
            if world.stopping() {
                return;
            }
            let deliveries = world.receive();
            if !deliveries.is_empty() {
                break deliveries;
            }
            tokio::time::sleep(TICK).await;
        };
        world.set_life(id, Life::Running);
        let invocation = world.invocation(id, batch);
        let records = records(&deliveries, &invocation);
        let killed_at = world.strikes(|faults| faults.kill).then(|| {
            Instant::now()
                + world.draw(|rng| Duration::from_millis(rng.u64(0..world.scenario.timeout.as_millis() as u64)))
        });
        let report = tokio::select! {
            biased;
            report = engine.process(&records, &invocation, None) => report,
            () = sleep_until(killed_at) => return kill(world, id, Mode::Lambda),
        };
        world.answered(&invocation, &deliveries, &report);
        world.set_life(id, Life::Frozen);
        if world.strikes(|faults| faults.kill) {
            return kill(world, id, Mode::Lambda);
        }
        if world.strikes(|faults| faults.shutdown) {
            world.set_life(id, Life::Running);
            world.count(|stats| stats.shutdowns += 1);
            engine.leave(Instant::now() + SHUTDOWN_TIME).await;
            return replace(world, id, Mode::Lambda);
        }
    }
}

/// A `poll` process, or an environment of Lambda Managed Instances (`mode`):
/// batches overlapping, never frozen; killed now and then, or stopped (its
/// batches finish, its unconfirmed writes are sent again).
async fn poll(world: &Arc<World>, id: usize, engine: &Engine, mode: Mode) {
    let batches = Arc::new(Semaphore::new(POLL_BATCHES));
    for batch in 0.. {
        if world.stopping() {
            return;
        }
        let Ok(permit) = Arc::clone(&batches).acquire_owned().await else { return };
        let deliveries = world.receive();
        if deliveries.is_empty() {
            drop(permit);
            // As `poll` does, the outbox is swept between batches too (a managed environment's tending does).
            if let Some(outbox) = engine.outbox().filter(|_| mode == Mode::Poll) {
                outbox.sweep_if_due(None);
            }
            tokio::time::sleep(TICK).await;
            continue;
        }
        if batches.available_permits() < POLL_BATCHES - 1 {
            world.count(|stats| stats.overlapping += 1);
        }
        let (world_, engine_) = (Arc::clone(world), engine.clone());
        tokio::spawn(async move {
            let invocation = world_.invocation(id, batch);
            let report = engine_.process(&records(&deliveries, &invocation), &invocation, None).await;
            world_.answered(&invocation, &deliveries, &report);
            drop(permit);
        });
        if world.strikes(|faults| faults.kill) {
            return kill(world, id, mode);
        }
        if world.strikes(|faults| faults.shutdown) {
            world.count(|stats| stats.shutdowns += 1);
            let _all_done = batches.acquire_many(POLL_BATCHES as u32).await;
            engine.leave(Instant::now() + LEAVING_TIME).await;
            return replace(world, id, mode);
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The process is gone; another takes its place.
fn replace(world: &Arc<World>, id: usize, mode: Mode) {
    world.set_life(id, Life::Dead);
    world.start(mode);
}

/// The process is killed without notice; another takes its place.
fn kill(world: &Arc<World>, id: usize, mode: Mode) {
    world.count(|stats| stats.kills += 1);
    replace(world, id, mode);
}
