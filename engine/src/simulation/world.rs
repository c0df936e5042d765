//! The world of one seed: what its scenario drew (`scenario.rs`), its
//! clock, the processes' lives, and the course of its run: the queue
//! drains under faults, the faults heal, traffic goes on or stops, time
//! passes (hours, in some worlds), the last environments are reclaimed, and
//! the world is judged.

use parking_lot::Mutex;
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, UNIX_EPOCH},
};

use tokio::{sync::Notify, time::Instant};

use super::{
    LONG_POLL, Run, check,
    ledger::{Ledger, Reported, Stats},
    queue::{Delivery, Queue, Sent, Settled},
    scenario::{Faults, Mode, Scenario},
    table::Table,
    workload::Spec,
};
use crate::{
    claim::SENDING_LEASE,
    engine::Invocation,
    report::{BatchReport, Failure, Outcome},
};
use sqs_once_core::clock::{Clock, duration_ms, epoch_ms};

/// How long the queue may take to drain before the world is judged as it
/// is, besides the queue's own clocks (see [`World::drain_limit`]).
const DRAIN_LIMIT: Duration = Duration::from_secs(3 * 3_600);

/// How many records the tail ([`Spec::tail`]: every way of committing in
/// turn) sends, in worlds with live traffic, after the queue drained and
/// the faults healed, a second apart at least: past every lease, every
/// sending lease and sweep.
const TAIL_RECORDS: usize = 90;

/// How often TTL looks for expired claims.
const TTL_EVERY: Duration = Duration::from_secs(30);

/// The wall clock of the world: a fixed date, moved by tokio's paused time.
#[derive(Debug)]
pub(super) struct SimClock {
    start: Instant,
}

impl SimClock {
    const BASE_MS: u64 = 1_800_000_000_000;
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        Self::BASE_MS + duration_ms(self.start.elapsed())
    }
}

/// Whether a process runs, is frozen, or is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Life {
    Running,
    Frozen,
    Dead,
}

/// The world of one seed.
#[derive(Debug)]
pub(super) struct World {
    pub scenario: Scenario,
    rng: Mutex<fastrand::Rng>,
    /// The table every process shares: what DynamoDB holds.
    pub table: Table,
    queue: Mutex<Queue>,
    /// Wakes consumers waiting for a message when one is sent.
    sent: Notify,
    pub clock: Arc<SimClock>,
    pub ledger: Mutex<Ledger>,
    lives: Mutex<Vec<Life>>,
    /// Wakes every request held by a freeze when a process's life changes.
    /// (Not a `watch` channel: it wakes its waiters in a random order, and
    /// a replay must not depend on it.)
    life_changed: Notify,
    faults_on: AtomicBool,
    /// When the faults healed, epoch milliseconds.
    pub healed_ms: std::sync::atomic::AtomicU64,
    stopping: AtomicBool,
    /// The schedule stops too: the world is over.
    ended: AtomicBool,
    /// The schedule's invocations find nothing to do while the world waits
    /// days for a redrive: they are skipped, to spare the simulation.
    schedule_idle: AtomicBool,
    /// How many records of the tail ([`Spec::tail`]) were sent.
    tail_sent: AtomicUsize,
}

impl World {
    pub(super) fn new(seed: u64) -> Arc<Self> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let scenario = Scenario::draw(&mut rng);
        let clock = Arc::new(SimClock { start: Instant::now() });
        let queue = Queue::new(scenario.queue.clone());
        Arc::new(Self {
            scenario,
            rng: Mutex::new(rng),
            table: Table::new(Arc::clone(&clock)),
            queue: Mutex::new(queue),
            sent: Notify::new(),
            clock,
            ledger: Mutex::new(Ledger::default()),
            lives: Mutex::new(Vec::new()),
            life_changed: Notify::new(),
            faults_on: AtomicBool::new(true),
            healed_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
            stopping: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            schedule_idle: AtomicBool::new(false),
            tail_sent: AtomicUsize::new(0),
        })
    }

    /// Sends the messages, starts the consumers and TTL, waits for the
    /// queue to drain, heals the faults, runs the tail (or stops the
    /// traffic), lets the quiet pass, stops every process, and judges.
    pub(super) async fn run(self: Arc<Self>) -> Run {
        let scenario = &self.scenario;
        {
            let mut ledger = self.ledger.lock();
            ledger.stats.quiet_worlds += u64::from(!scenario.tail);
            ledger.stats.fifo_worlds += u64::from(scenario.groups > 0);
        }
        let sent: Vec<Sent> = scenario
            .messages
            .iter()
            .enumerate()
            .map(|(n, &spec)| Sent {
                message_id: format!("m-{n}"),
                deduplication_id: format!("m-{n}"),
                body: serde_json::to_string(&scenario.specs[spec]).expect("a spec serializes"),
                group: (scenario.groups > 0).then(|| format!("g-{}", n % scenario.groups)),
            })
            .collect();
        for message in &sent {
            self.send_message(message.clone());
        }
        let resending = tokio::spawn(Arc::clone(&self).send_again(sent));
        let schedule = self.start(Mode::Scheduled);
        for &mode in &scenario.consumers {
            self.start(mode);
        }
        let ttl = tokio::spawn(Arc::clone(&self).expire());
        resending.await.expect("the producer's retries are sent");
        let drained = self.wait_for_queue(self.drain_limit()).await;
        self.faults_on.store(false, Ordering::SeqCst);
        self.healed_ms.store(self.clock.now_ms(), Ordering::SeqCst);
        if scenario.tail {
            for n in 0..TAIL_RECORDS {
                let body = serde_json::to_string(&Spec::tail(n)).expect("a spec serializes");
                let group = (scenario.groups > 0).then(|| "g-tail".to_owned());
                self.send_message(Sent {
                    message_id: format!("t-{n}"),
                    deduplication_id: format!("t-{n}"),
                    body,
                    group,
                });
                self.tail_sent.store(n + 1, Ordering::SeqCst);
                tokio::time::sleep(self.tail_spacing()).await;
            }
        }
        let tail_drained = self.wait_for_queue(self.tail_limit()).await;
        tokio::time::sleep(scenario.quiet).await;
        self.stop_consumers(schedule).await;
        let redriven_drained = match scenario.redrive_after {
            Some(after) => self.redrive(after, schedule).await,
            None => true,
        };
        // The schedule goes on: what the last processes committed as they left is sent once its sending lease
        // has ended, at the next scheduled sweep.
        tokio::time::sleep(SENDING_LEASE + scenario.schedule_every + Duration::from_secs(1)).await;
        self.ended.store(true, Ordering::SeqCst);
        self.wait_for_processes(usize::MAX).await;
        ttl.abort();
        let mut violations = check::invariants(&self, drained && tail_drained && redriven_drained).await;
        let mut ledger = self.ledger.lock();
        violations.append(&mut ledger.violations);
        // The drawn world, beside a seed that broke an invariant: what it was made of, before replaying it.
        let scenario = (!violations.is_empty()).then(|| format!("{scenario:#?}"));
        Run { violations, digest: ledger.digest(), stats: ledger.stats.clone(), scenario }
    }

    fn send_message(&self, message: Sent) {
        let now_ms = self.clock.now_ms();
        let taken = self.queue.lock().push(message, now_ms);
        self.count(|stats| stats.deduplicated += u64::from(!taken));
        self.sent.notify_waiters();
    }

    /// The producer sends some messages again, as a retry after a lost
    /// answer does: the same deduplication id (a FIFO queue drops one
    /// within its interval), a new message id.
    async fn send_again(self: Arc<Self>, sent: Vec<Sent>) {
        let mut resent: Vec<(usize, Duration)> = self.scenario.resent.clone();
        resent.sort_by_key(|(_, after)| *after);
        let start = Instant::now();
        for (n, after) in resent {
            tokio::time::sleep_until(start + after).await;
            let message = Sent { message_id: format!("{}-again", sent[n].message_id), ..sent[n].clone() };
            self.send_message(message);
        }
    }

    /// How long the queue may take to drain: a failed message comes back
    /// after a visibility timeout or a back-off, until its receives reach
    /// `maxReceiveCount`, and a FIFO group's messages wait for one another.
    fn drain_limit(&self) -> Duration {
        let queue = &self.scenario.queue;
        let messages = u32::try_from(self.scenario.messages.len()).unwrap_or(u32::MAX);
        let per_receive = queue.redelivered_within() + self.scenario.timeout;
        let in_turn = if queue.fifo { messages } else { messages.min(4) };
        DRAIN_LIMIT + per_receive * queue.max_receives * in_turn
    }

    /// How far apart the tail's records are sent: a second; where kept-key
    /// statements may be held for up to three key memories, spread over
    /// them, so that the item they credit turns its window while such a
    /// statement is held, and the window must refuse it.
    fn tail_spacing(&self) -> Duration {
        match self.scenario.kept_statements {
            Some(_) => (self.scenario.kept_key_memory() * 3 / TAIL_RECORDS as u32).max(Duration::from_secs(1)),
            None => Duration::from_secs(1),
        }
    }

    /// How long the tail's records may take once the faults healed: a
    /// conflict with a copy, or a freeze, returns a record after a
    /// visibility timeout or a back-off, a few times at most.
    fn tail_limit(&self) -> Duration {
        Duration::from_secs(120) + (self.scenario.queue.redelivered_within() + self.scenario.timeout) * 3
    }

    /// Stops every consumer but `but` (the schedule), and waits for them to leave.
    async fn stop_consumers(&self, but: usize) {
        self.stopping.store(true, Ordering::SeqCst);
        self.sent.notify_waiters();
        self.wait_for_processes(but).await;
    }

    /// `after` the world went quiet, the operator moves the dead-letter
    /// queue's messages back; new processes (cold) drain them. Whether the
    /// queue drained.
    async fn redrive(self: &Arc<Self>, after: Duration, schedule: usize) -> bool {
        // The schedule sweeps what the processes left as they stopped, then has nothing to do until the redrive.
        let idle = SENDING_LEASE + self.scenario.schedule_every * 2;
        tokio::time::sleep(idle.min(after)).await;
        self.schedule_idle.store(true, Ordering::SeqCst);
        tokio::time::sleep(after.saturating_sub(idle)).await;
        self.schedule_idle.store(false, Ordering::SeqCst);
        let moved = self.queue.lock().redrive(self.clock.now_ms());
        if moved == 0 {
            return true;
        }
        self.count(|stats| stats.redriven += moved as u64);
        self.stopping.store(false, Ordering::SeqCst);
        for &mode in &self.scenario.consumers {
            self.start(mode);
        }
        let drained = self.wait_for_queue(self.drain_limit()).await;
        self.stop_consumers(schedule).await;
        drained
    }

    async fn wait_for_queue(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while !self.queue.lock().settled(self.clock.now_ms()) {
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        true
    }

    /// Waits until every process but `but` has left (the last ones are
    /// reclaimed as the world stops), at most a minute.
    async fn wait_for_processes(&self, but: usize) {
        let until = Instant::now() + Duration::from_secs(60);
        let running = || self.lives.lock().iter().enumerate().any(|(id, life)| id != but && *life != Life::Dead);
        while running() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// TTL: every pass, each expired claim is deleted with the world's chance.
    async fn expire(self: Arc<Self>) {
        loop {
            tokio::time::sleep(TTL_EVERY).await;
            let before = self.ledger.lock().stats.ttl_deleted;
            let mut deleted = 0;
            self.table.expire(|id| {
                let deletes = self.draw(|rng| rng.f64()) < self.scenario.ttl;
                if deletes {
                    self.ledger.lock().note(("ttl", id));
                    deleted += 1;
                }
                deletes
            });
            self.ledger.lock().stats.ttl_deleted = before + deleted;
        }
    }

    /// What every message sent asked of its handler: the drawn ones, and
    /// the tail's.
    pub(super) fn specs(&self) -> Vec<Spec> {
        let tail = (0..self.tail_sent.load(Ordering::SeqCst)).map(Spec::tail);
        self.scenario.specs.iter().cloned().chain(tail).collect()
    }

    /// Whether a message left the queue unprocessed (dead-lettered, or
    /// past the retention period), or came back from the dead-letter queue:
    /// SQS's order ends there.
    pub(super) fn out_of_order(&self, message_id: &str) -> bool {
        let queue = self.queue.lock();
        queue.left_unprocessed(message_id) || queue.redriven(message_id)
    }

    /// Whether the consumers should stop.
    pub(super) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Whether the schedule has nothing to do for a long while.
    pub(super) fn schedule_idle(&self) -> bool {
        self.schedule_idle.load(Ordering::SeqCst)
    }

    /// Whether the world is over, the schedule included.
    pub(super) fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// A draw from the seed's generator.
    pub(super) fn draw<T>(&self, draw: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
        draw(&mut self.rng.lock())
    }

    /// Whether a fault of rate `rate` strikes now (never once healed).
    pub(super) fn strikes(&self, rate: impl FnOnce(&Faults) -> f64) -> bool {
        self.faults_on.load(Ordering::SeqCst) && self.draw(|rng| rng.f64()) < rate(&self.scenario.faults)
    }

    /// Starts a consumer process; its id.
    pub(super) fn start(self: &Arc<Self>, mode: Mode) -> usize {
        let id = {
            let mut lives = self.lives.lock();
            lives.push(Life::Running);
            lives.len() - 1
        };
        self.ledger.lock().note(("start", id, mode));
        tokio::spawn(super::process::drive(Arc::clone(self), id, mode));
        id
    }

    pub(super) fn life(&self, process: usize) -> Life {
        self.lives.lock()[process]
    }

    pub(super) fn set_life(&self, process: usize, life: Life) {
        let mut ledger = self.ledger.lock();
        ledger.note(("life", process, life));
        if life == Life::Frozen {
            ledger.stats.freezes += 1;
        }
        if life != Life::Running {
            // What it was sending or deleting may wait for a thaw past its sending lease, or forever.
            ledger.stopped(process);
        }
        drop(ledger);
        self.lives.lock()[process] = life;
        self.life_changed.notify_waiters();
    }

    /// Waits while `process` is frozen; never returns once it is dead.
    pub(super) async fn hold(&self, process: usize) {
        loop {
            let changed = self.life_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.life(process) {
                Life::Running => return,
                Life::Frozen => {}
                Life::Dead => std::future::pending::<()>().await,
            }
            changed.await;
        }
    }

    pub(super) fn count(&self, count: impl FnOnce(&mut Stats)) {
        count(&mut self.ledger.lock().stats);
    }

    /// A batch of visible messages for a consumer, waiting for one as long
    /// polling does; empty once the world stops.
    pub(super) async fn receive(&self) -> Vec<Delivery> {
        loop {
            if self.stopping() {
                return Vec::new();
            }
            let sent = self.sent.notified();
            tokio::pin!(sent);
            sent.as_mut().enable();
            let copied = self.strikes(|faults| faults.copy) && self.scenario.groups == 0;
            let now_ms = self.clock.now_ms();
            let (deliveries, next_ms) = {
                let mut queue = self.queue.lock();
                let deliveries = queue.receive(self.scenario.batch_size, now_ms, copied);
                (deliveries, queue.next_visible_at(now_ms))
            };
            if !deliveries.is_empty() {
                if copied {
                    self.count(|stats| stats.copies += 1);
                }
                return deliveries;
            }
            let wait = next_ms.map_or(LONG_POLL, |at| Duration::from_millis(at - now_ms).min(LONG_POLL));
            tokio::select! {
                () = tokio::time::sleep(wait.max(super::TICK)) => {}
                () = &mut sent => {}
            }
        }
    }

    /// The invocation of a batch starting now.
    pub(super) fn invocation(&self, process: usize, batch: u64) -> Invocation {
        let deadline_ms = self.clock.now_ms() + duration_ms(self.scenario.timeout);
        Invocation {
            deadline: UNIX_EPOCH + Duration::from_millis(deadline_ms),
            request_id: format!("p{process}-b{batch}"),
        }
    }

    /// Takes a batch's answer: each record's outcome goes to the queue and
    /// the ledger.
    pub(super) fn answered(&self, invocation: &Invocation, deliveries: &[Delivery], report: &BatchReport) {
        let now_ms = self.clock.now_ms();
        let batch_started_ms = epoch_ms(invocation.deadline) - duration_ms(self.scenario.timeout);
        let mut ledger = self.ledger.lock();
        ledger.stats.batches += 1;
        ledger.stats.records += deliveries.len() as u64;
        // What the queue does with each record is what the answer says, as the function posts it.
        let answer = report.response();
        let listed =
            |message_id: &str| answer.batch_item_failures.iter().any(|failed| failed.item_identifier == message_id);
        for (delivery, record) in deliveries.iter().zip(&report.records) {
            ledger.note((&invocation.request_id, &delivery.message_id, record.outcome.label()));
            match &record.outcome {
                Outcome::Failed(Failure::Uncommitted { .. }) => ledger.stats.uncommitted += 1,
                Outcome::Failed(Failure::Permanent(reason) | Failure::Retryable(reason))
                    if reason.contains("gate is closed") =>
                {
                    ledger.stats.cancelled += 1
                }
                _ => {}
            }
            ledger.reports.push(Reported {
                batch_started_ms,
                holder: invocation.request_id.clone(),
                message_id: delivery.message_id.clone(),
                key: record.key.clone(),
                outcome: record.outcome.clone(),
                back_after: delivery.back_after,
            });
            let copy_at_ms = self.strikes(|faults| faults.copy).then(|| now_ms + self.draw(|rng| rng.u64(0..30_000)));
            let (jitter, change_failed) = self.draw(|rng| (rng.f64(), rng.f64() < self.scenario.queue.change_fails));
            let listed = listed(&delivery.message_id);
            ledger.stats.visibility_failed += u64::from(change_failed && listed);
            self.queue.lock().settle(Settled {
                message_id: &delivery.message_id,
                listed,
                outcome: &record.outcome,
                now_ms,
                copy_at_ms,
                jitter,
                change_failed,
            });
        }
    }
}
