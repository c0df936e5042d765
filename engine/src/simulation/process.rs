//! The consumers of the simulated world, each a process with its own
//! engine, claims and outbox over its own view of the shared table: a
//! Lambda function, a `poll` process or an environment of Lambda Managed
//! Instances. Each is assembled as the builder assembles a real consumer
//! ([`Engine::builder`]), on the world's clock, and runs its batches, its
//! tending and its leaving through the engine calls the real loops make:
//! [`Engine::process`], [`Engine::tend`], [`Engine::leave`] within
//! [`SHUTDOWN_TIME`] as the SIGTERM handler does, and
//! [`Engine::leave_sweeping`] as `poll` stops.

use std::{sync::Arc, time::Duration};

use aws_lambda_events::sqs::SqsMessageAttribute;
use tokio::{sync::Semaphore, time::Instant};

use super::{
    LONG_POLL,
    link::{Link, Sender},
    queue::Delivery,
    scenario::Mode,
    workload::{HOLDER, SimHandler},
    world::{Life, World},
};
use crate::{
    budget::{LEAVING_TIME, SHUTDOWN_TIME},
    claim::ClaimPolicy,
    engine::{ClaimFirst, Engine, EngineOptions, Invocation},
    event::EventRecord,
    key::Keys,
    outbox::OutboxTimes,
};
use sqs_once_core::{BoxHandler, clock::Clock, store::ClaimStore};

/// Batches a `poll` process (or a managed environment) runs at once.
const POLL_BATCHES: usize = 3;

/// Runs process `id` as `mode` says, until the world stops or the process
/// dies (a replacement then takes its place).
pub(super) async fn drive(world: Arc<World>, id: usize, mode: Mode) {
    let engine = engine(&world, id);
    // The queue's own visibility timeout, read before the first batch (the Lambda function's first batch reads
    // it, `poll` reads it as it starts): keys are kept past the longer of it and the one the settings told.
    let queue = &world.scenario.queue;
    let read = queue.visibility_timeout.max(world.scenario.told_visibility_timeout);
    engine.set_redelivered_within(Some(queue.policy.redelivered_within(read)));
    match mode {
        Mode::Lambda => lambda(&world, id, &engine).await,
        Mode::Scheduled => scheduled(&world, id, &engine).await,
        Mode::Poll | Mode::Managed => {
            // Tended in the background until the process stops, as `poll` and a managed environment are (once
            // killed, its requests never return anyway).
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let tended = engine.clone();
            tokio::spawn(async move { tended.tend(async move { drop(stopped.await) }).await });
            poll(&world, id, &engine, mode).await;
            drop(stop);
        }
    }
    let given_up = engine.claims().writes_given_up();
    world.count(|stats| stats.given_up += given_up);
}

/// The engine of process `id`, as the builder would assemble it.
fn engine(world: &Arc<World>, id: usize) -> Engine {
    let scenario = &world.scenario;
    let link = Arc::new(Link { world: Arc::clone(world), process: id });
    let store: Arc<dyn ClaimStore> = Arc::clone(&link) as Arc<dyn ClaimStore>;
    let clock: Arc<dyn Clock> = Arc::clone(&world.clock) as Arc<dyn Clock>;
    // The handler stages every effect: a process claims first, or (as `SQS_ONCE_CLAIM=auto` has it) runs
    // without a claim and commits the key's completion where it is free. Worlds mix the two.
    let claim = match world.draw(|rng| rng.f64() < scenario.unclaimed) {
        true => ClaimFirst::Auto,
        false => ClaimFirst::Always,
    };
    let told = scenario.queue.policy.redelivered_within(scenario.told_visibility_timeout);
    let policy = ClaimPolicy {
        expires_after: scenario.expires_after,
        redelivered_within: Some(told),
        local_cache_entries: scenario.cache_entries,
        ..ClaimPolicy::default()
    };
    let keys = Keys::new("body.id", "sim").expect("a valid key").hashed(false);
    Engine::builder(store, keys)
        .policy(policy)
        .options(EngineOptions { concurrency: scenario.concurrency, claim, ..EngineOptions::default() })
        .clock(clock)
        .outbox(Arc::new(Sender { link }), OutboxTimes::both(Duration::from_secs(5)), Some(scenario.sweep_every))
        .build(BoxHandler::new(SimHandler { world: Arc::clone(world) }))
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
            if let Some(group) = &delivery.group {
                message.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:work.fifo".into());
                message.attributes.insert("MessageGroupId".into(), group.clone());
            }
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
/// shut down with SIGTERM; now and then left frozen for minutes to hours
/// while another environment takes the traffic, then invoked again or
/// reclaimed; reclaimed with SIGTERM when the world stops.
async fn lambda(world: &Arc<World>, id: usize, engine: &Engine) {
    world.set_life(id, Life::Frozen);
    for batch in 0.. {
        let deliveries = world.receive().await;
        if deliveries.is_empty() {
            return shut_down_by_sigterm(world, id, engine).await;
        }
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
            shut_down_by_sigterm(world, id, engine).await;
            world.start(Mode::Lambda);
            return;
        }
        if world.strikes(|faults| faults.long_freeze) && !long_freeze(world).await {
            return shut_down_by_sigterm(world, id, engine).await;
        }
    }
}

/// The environment the schedule invokes with the outbox sweep event, every
/// `schedule_every`, until the world is over.
async fn scheduled(world: &Arc<World>, id: usize, engine: &Engine) {
    world.set_life(id, Life::Frozen);
    while !world.ended() {
        tokio::time::sleep(world.scenario.schedule_every).await;
        if world.schedule_idle() {
            continue;
        }
        world.set_life(id, Life::Running);
        let deadline = world.invocation(id, 0).deadline;
        engine.sweep_outbox(deadline).await;
        world.set_life(id, Life::Frozen);
    }
    world.set_life(id, Life::Dead);
}

/// The environment stays frozen for minutes to hours, while another takes
/// the traffic; whether it is then invoked again (or else reclaimed).
async fn long_freeze(world: &Arc<World>) -> bool {
    world.count(|stats| stats.long_freezes += 1);
    world.start(Mode::Lambda);
    let frozen_for = world.draw(|rng| Duration::from_secs(rng.u64(120..=3 * 3_600)));
    let until = Instant::now() + frozen_for;
    while Instant::now() < until && !world.stopping() {
        tokio::time::sleep(LONG_POLL.min(until - Instant::now())).await;
    }
    !world.stopping() && world.draw(|rng| rng.bool())
}

/// Lambda reclaims the environment: SIGTERM, its time to send its
/// unconfirmed writes again, and it is gone.
async fn shut_down_by_sigterm(world: &Arc<World>, id: usize, engine: &Engine) {
    world.set_life(id, Life::Running);
    world.count(|stats| stats.shutdowns += 1);
    engine.leave(Instant::now() + SHUTDOWN_TIME).await;
    world.set_life(id, Life::Dead);
}

/// A `poll` process, or an environment of Lambda Managed Instances (`mode`):
/// batches overlapping, never frozen; killed now and then, or stopped: its
/// batches finish, its unconfirmed writes are sent again (`poll` leaving,
/// or a managed environment's SIGTERM).
async fn poll(world: &Arc<World>, id: usize, engine: &Engine, mode: Mode) {
    let batches = Arc::new(Semaphore::new(POLL_BATCHES));
    for batch in 0.. {
        let Ok(permit) = Arc::clone(&batches).acquire_owned().await else { return };
        let deliveries = world.receive().await;
        if deliveries.is_empty() {
            drop(permit);
            return leave(world, id, engine, mode, &batches).await;
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
            leave(world, id, engine, mode, &batches).await;
            world.start(mode);
            return;
        }
    }
}

/// A `poll` process or a managed environment stops: its batches finish,
/// then it leaves as each does.
async fn leave(world: &Arc<World>, id: usize, engine: &Engine, mode: Mode, batches: &Semaphore) {
    world.count(|stats| stats.shutdowns += 1);
    let _all_done = batches.acquire_many(POLL_BATCHES as u32).await;
    match mode {
        Mode::Managed => drop(engine.leave(Instant::now() + SHUTDOWN_TIME).await),
        _ => drop(engine.leave_sweeping(Instant::now() + LEAVING_TIME).await),
    }
    world.set_life(id, Life::Dead);
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The process is killed without notice; another takes its place.
fn kill(world: &Arc<World>, id: usize, mode: Mode) {
    world.count(|stats| stats.kills += 1);
    world.set_life(id, Life::Dead);
    world.start(mode);
}
