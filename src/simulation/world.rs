//! The simulated world: the shared store and destinations as each process
//! meets them (faults, freezes, kills), the queue, and the ledger of what
//! happened that [`super::check`] judges.

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    future::Future,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, UNIX_EPOCH},
};

use async_trait::async_trait;
use tokio::{sync::Notify, time::Instant};

use super::{
    Run, check,
    queue::{Delivery, Queue},
    workload::{HOLDER, Spec, message_body},
};
use crate::{
    Record,
    clock::{Clock, duration_ms},
    engine::Invocation,
    lock::lock,
    outbox::{Destinations, SendError},
    report::{BatchReport, Outcome},
    store::{
        ClaimAdmin, ClaimQuery, ClaimStore, Commit, CommitStore, Committed, Fenced, Finish, Listing, MemoryStore,
        OutboxEntry, OutboxQuery, OutboxStore, PutOutcome, StoreError, StoredClaim,
    },
    transaction::Message,
};

/// How long the queue may take to drain before the world is judged as it is.
const DRAIN_LIMIT: Duration = Duration::from_secs(30 * 60);

/// How long records that stage nothing keep arriving after the queue drained
/// and the faults healed: past every lease, every sending lease and sweep.
const TAIL: Duration = Duration::from_secs(90);

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

/// How a consumer runs its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// One batch after another, frozen from each answer to the next invocation.
    Lambda,
    /// Batches overlapping, never frozen.
    Poll,
    /// Lambda Managed Instances: invocations at once, never frozen, the
    /// writes and the outbox tended in the background between them.
    Managed,
}

/// How often each fault strikes.
#[derive(Debug, Clone, Default)]
pub(super) struct Faults {
    /// A store request fails before it applies (throttled, refused, down).
    pub fail_before: f64,
    /// A store request applies, and its answer is lost.
    pub lost_after: f64,
    /// A store request times out for its caller and applies later.
    pub linger: f64,
    /// A store request's way there or back takes seconds.
    pub slow: f64,
    /// A destination fails a message (not sent).
    pub send_fail: f64,
    /// A destination refuses a message (not sent).
    pub send_refused: f64,
    /// A destination takes a message and its answer is lost.
    pub send_lost: f64,
    /// A process is killed: mid-batch, or while frozen after its answer.
    pub kill: f64,
    /// A process is shut down cleanly (SIGTERM, `poll`'s stop).
    pub shutdown: f64,
    /// SQS delivers a message twice.
    pub copy: f64,
}

impl Faults {
    fn draw(rng: &mut fastrand::Rng) -> Self {
        let mut rate = |base: f64| match rng.u8(0..4) {
            0 => 0.0,
            1 | 2 => base,
            _ => base * 3.0,
        };
        Self {
            fail_before: rate(0.04),
            lost_after: rate(0.03),
            linger: rate(0.01),
            slow: rate(0.03),
            send_fail: rate(0.05),
            send_refused: rate(0.02),
            send_lost: rate(0.03),
            kill: rate(0.02),
            shutdown: rate(0.02),
            copy: rate(0.05),
        }
    }
}

/// The world a seed makes.
#[derive(Debug)]
pub(super) struct Scenario {
    pub consumers: Vec<Mode>,
    pub specs: Vec<Spec>,
    /// Each message's spec, by index into `specs`: some keys are sent twice.
    pub messages: Vec<usize>,
    pub batch_size: usize,
    pub timeout: Duration,
    pub concurrency: usize,
    pub gathers: bool,
    pub cache_entries: usize,
    pub sweep_every: Duration,
    /// The share of processes whose runs take no claim (the rest claim first).
    pub unclaimed: f64,
    pub faults: Faults,
}

impl Scenario {
    fn draw(rng: &mut fastrand::Rng) -> Self {
        let modes = [Mode::Lambda, Mode::Poll, Mode::Managed];
        let consumers = (0..rng.usize(1..=3)).map(|_| modes[rng.usize(..modes.len())]).collect();
        let keys = rng.usize(4..=24);
        let specs = Spec::draw(rng, keys);
        let mut messages: Vec<usize> = (0..keys).collect();
        messages.extend((0..rng.usize(0..=keys / 3)).map(|_| rng.usize(0..keys)));
        rng.shuffle(&mut messages);
        Self {
            consumers,
            specs,
            messages,
            batch_size: rng.usize(1..=10),
            timeout: Duration::from_millis(rng.u64(2_000..=8_000)),
            concurrency: rng.usize(1..=8),
            gathers: rng.bool(),
            cache_entries: if rng.bool() { 1024 } else { 0 },
            sweep_every: Duration::from_secs(rng.u64(1..=10)),
            unclaimed: [0.0, 0.5, 1.0][rng.usize(..3)],
            faults: Faults::draw(rng),
        }
    }
}

/// Whether a process runs, is frozen, or is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Life {
    Running,
    Frozen,
    Dead,
}

/// A run of the handler, as it saw itself.
#[derive(Debug, Clone)]
pub(super) struct RunInfo {
    pub id: u64,
    pub key: String,
    /// The run's place among the runs of its key, from 1.
    pub attempt: u32,
    /// The claim it ran under, read from the store as it started.
    pub holder: String,
    pub spec: Spec,
}

/// A record's outcome as its batch reported it.
#[derive(Debug, Clone)]
pub(super) struct Reported {
    pub holder: String,
    pub message_id: String,
    pub key: Option<String>,
    pub outcome: Outcome,
}

/// Counts of what the world did, summed over seeds for the summary line.
#[derive(Debug, Clone, Default)]
pub(super) struct Stats {
    pub batches: u64,
    pub records: u64,
    pub store_calls: u64,
    pub failed_before: u64,
    pub lost_after: u64,
    pub lingered: u64,
    pub slow: u64,
    pub send_failed: u64,
    pub send_refused: u64,
    pub send_lost: u64,
    pub kills: u64,
    pub shutdowns: u64,
    pub copies: u64,
    pub freezes: u64,
    pub overlapping: u64,
    pub applied_runs: u64,
    pub messages_sent: u64,
    pub uncommitted: u64,
    pub cancelled: u64,
    pub unclaimed_commits: u64,
    pub taken: u64,
}

impl Stats {
    pub(super) fn add(&mut self, other: &Stats) {
        let fields = [
            (&mut self.batches, other.batches),
            (&mut self.records, other.records),
            (&mut self.store_calls, other.store_calls),
            (&mut self.failed_before, other.failed_before),
            (&mut self.lost_after, other.lost_after),
            (&mut self.lingered, other.lingered),
            (&mut self.slow, other.slow),
            (&mut self.send_failed, other.send_failed),
            (&mut self.send_refused, other.send_refused),
            (&mut self.send_lost, other.send_lost),
            (&mut self.kills, other.kills),
            (&mut self.shutdowns, other.shutdowns),
            (&mut self.copies, other.copies),
            (&mut self.freezes, other.freezes),
            (&mut self.overlapping, other.overlapping),
            (&mut self.applied_runs, other.applied_runs),
            (&mut self.messages_sent, other.messages_sent),
            (&mut self.uncommitted, other.uncommitted),
            (&mut self.cancelled, other.cancelled),
            (&mut self.unclaimed_commits, other.unclaimed_commits),
            (&mut self.taken, other.taken),
        ];
        for (total, value) in fields {
            *total += value;
        }
    }

    /// The faults and schedules the simulation is made to meet, counted.
    pub(super) fn faults(&self) -> [(&'static str, u64); 15] {
        [
            ("a request failed before applying", self.failed_before),
            ("an answer lost after applying", self.lost_after),
            ("a request applied after its caller gave up", self.lingered),
            ("a slow answer", self.slow),
            ("a failed send", self.send_failed),
            ("a refused send", self.send_refused),
            ("a send whose answer was lost", self.send_lost),
            ("a killed process", self.kills),
            ("a shutdown", self.shutdowns),
            ("an SQS copy", self.copies),
            ("overlapping batches", self.overlapping),
            ("an uncommitted record", self.uncommitted),
            ("a cancelled commit", self.cancelled),
            ("a commit without a claim", self.unclaimed_commits),
            ("a commit without a claim that found the key taken", self.taken),
        ]
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} batches, {} records, {} store calls, {} runs applied, {} messages sent; faults: {}",
            self.batches,
            self.records,
            self.store_calls,
            self.applied_runs,
            self.messages_sent,
            self.faults().iter().map(|(what, count)| format!("{what} {count}")).collect::<Vec<_>>().join(", ")
        )
    }
}

/// What happened, for the checks.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    pub runs: Vec<RunInfo>,
    attempts: HashMap<String, u32>,
    pub reports: Vec<Reported>,
    /// Each message body sent, with how often.
    pub sends: HashMap<String, u32>,
    /// Bodies whose send or deletion met a fault, a freeze or a kill: these
    /// may be sent twice.
    pub disturbed: BTreeSet<String>,
    /// The bodies each process sent.
    sent_by: HashMap<usize, Vec<String>>,
    /// The body of each outbox entry, by entry id.
    entries: HashMap<String, String>,
    /// Finishing writes waiting for their answer, by claim and token.
    pending: HashMap<(String, String), u32>,
    pub violations: Vec<String>,
    pub stats: Stats,
    digest: DefaultHasher,
}

impl Ledger {
    fn note(&mut self, event: impl Hash) {
        event.hash(&mut self.digest);
    }
}

/// The world of one seed.
#[derive(Debug)]
pub(super) struct World {
    pub scenario: Scenario,
    rng: Mutex<fastrand::Rng>,
    /// The store every process shares: what DynamoDB holds.
    pub store: Arc<MemoryStore>,
    pub queue: Mutex<Queue>,
    pub clock: Arc<SimClock>,
    pub ledger: Mutex<Ledger>,
    lives: Mutex<Vec<Life>>,
    /// Wakes every request held by a freeze when a process's life changes.
    /// (Not a `watch` channel: it wakes its waiters in a random order, and
    /// a replay must not depend on it.)
    life_changed: Notify,
    faults_on: AtomicBool,
    stopping: AtomicBool,
}

impl World {
    pub(super) fn new(seed: u64) -> Arc<Self> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let scenario = Scenario::draw(&mut rng);
        Arc::new(Self {
            scenario,
            rng: Mutex::new(rng),
            store: Arc::new(MemoryStore::default()),
            queue: Mutex::new(Queue::default()),
            clock: Arc::new(SimClock { start: Instant::now() }),
            ledger: Mutex::new(Ledger::default()),
            lives: Mutex::new(Vec::new()),
            life_changed: Notify::new(),
            faults_on: AtomicBool::new(true),
            stopping: AtomicBool::new(false),
        })
    }

    /// Sends the messages, starts the consumers, waits for the queue to
    /// drain, heals the faults, runs the tail, and judges.
    pub(super) async fn run(self: Arc<Self>) -> Run {
        for (n, &spec) in self.scenario.messages.iter().enumerate() {
            let body = serde_json::to_string(&self.scenario.specs[spec]).expect("a spec serializes");
            self.send_message(format!("m-{n}"), body);
        }
        for &mode in &self.scenario.consumers {
            self.start(mode);
        }
        let drained = self.wait_for_queue(DRAIN_LIMIT).await;
        self.faults_on.store(false, Ordering::SeqCst);
        let tail_start = Instant::now();
        let mut n = 0;
        while tail_start.elapsed() < TAIL {
            let body = serde_json::json!({ "id": format!("tail-{n}") }).to_string();
            self.send_message(format!("t-{n}"), body);
            n += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let tail_drained = self.wait_for_queue(Duration::from_secs(120)).await;
        self.stopping.store(true, Ordering::SeqCst);
        let mut violations = check::invariants(&self, drained && tail_drained).await;
        let mut ledger = lock(&self.ledger);
        violations.append(&mut ledger.violations);
        Run { violations, digest: ledger.digest.finish(), stats: ledger.stats.clone() }
    }

    fn send_message(&self, message_id: String, body: String) {
        let now_ms = self.clock.now_ms();
        lock(&self.queue).push(message_id, body, now_ms);
    }

    async fn wait_for_queue(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while !lock(&self.queue).settled() {
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        true
    }

    /// Whether the consumers should stop.
    pub(super) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// A draw from the seed's generator.
    pub(super) fn draw<T>(&self, draw: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
        draw(&mut lock(&self.rng))
    }

    /// Whether a fault of rate `rate` strikes now (never once healed).
    pub(super) fn strikes(&self, rate: impl FnOnce(&Faults) -> f64) -> bool {
        self.faults_on.load(Ordering::SeqCst) && self.draw(|rng| rng.f64()) < rate(&self.scenario.faults)
    }

    /// Starts a consumer process.
    pub(super) fn start(self: &Arc<Self>, mode: Mode) {
        let id = {
            let mut lives = lock(&self.lives);
            lives.push(Life::Running);
            lives.len() - 1
        };
        lock(&self.ledger).note(("start", id, mode as u8));
        tokio::spawn(super::process::drive(Arc::clone(self), id, mode));
    }

    fn life(&self, process: usize) -> Life {
        lock(&self.lives)[process]
    }

    pub(super) fn set_life(&self, process: usize, life: Life) {
        let mut ledger = lock(&self.ledger);
        ledger.note(("life", process, life as u8));
        match life {
            Life::Frozen => ledger.stats.freezes += 1,
            Life::Dead => {
                // Whatever it sent may not have been deleted.
                let sent = ledger.sent_by.remove(&process).unwrap_or_default();
                ledger.disturbed.extend(sent);
            }
            Life::Running => {}
        }
        drop(ledger);
        lock(&self.lives)[process] = life;
        self.life_changed.notify_waiters();
    }

    pub(super) fn count(&self, count: impl FnOnce(&mut Stats)) {
        count(&mut lock(&self.ledger).stats);
    }

    /// Up to a batch of visible messages for a consumer.
    pub(super) fn receive(&self) -> Vec<Delivery> {
        let copied = self.strikes(|faults| faults.copy);
        let visibility = self.scenario.timeout + Duration::from_secs(5);
        let deliveries = lock(&self.queue).receive(self.scenario.batch_size, self.clock.now_ms(), visibility, copied);
        if copied && !deliveries.is_empty() {
            self.count(|stats| stats.copies += 1);
        }
        deliveries
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
        let mut ledger = lock(&self.ledger);
        ledger.stats.batches += 1;
        ledger.stats.records += deliveries.len() as u64;
        for (delivery, record) in deliveries.iter().zip(&report.records) {
            ledger.note((&invocation.request_id, &delivery.message_id, record.outcome.label()));
            match &record.outcome {
                Outcome::Failed(crate::report::Failure::Uncommitted { .. }) => ledger.stats.uncommitted += 1,
                Outcome::Failed(
                    crate::report::Failure::Permanent(reason) | crate::report::Failure::Retryable(reason),
                ) if reason.contains("gate is closed") => ledger.stats.cancelled += 1,
                _ => {}
            }
            ledger.reports.push(Reported {
                holder: invocation.request_id.clone(),
                message_id: delivery.message_id.clone(),
                key: record.key.clone(),
                outcome: record.outcome.clone(),
            });
            let copy_at_ms = self.strikes(|faults| faults.copy).then(|| now_ms + self.draw(|rng| rng.u64(0..30_000)));
            lock(&self.queue).settle(&delivery.message_id, &record.outcome, now_ms, copy_at_ms);
        }
    }

    /// A handler run starts: the invocation it runs in, and its attempt.
    pub(super) fn start_run(&self, record: &Record, spec: &Spec) -> RunInfo {
        let holder = record.message_attributes().get(HOLDER).and_then(|holder| holder.string_value.clone());
        let holder = holder.unwrap_or_default();
        let mut ledger = lock(&self.ledger);
        let attempt = {
            let attempts = ledger.attempts.entry(spec.id.clone()).or_default();
            *attempts += 1;
            *attempts
        };
        let run =
            RunInfo { id: ledger.runs.len() as u64, key: record.key.clone(), attempt, holder, spec: spec.clone() };
        ledger.note(("run", run.id, &run.key, &run.holder));
        ledger.runs.push(run.clone());
        run
    }
}

/// The store as one process meets it.
#[derive(Debug)]
pub(super) struct Link {
    pub world: Arc<World>,
    pub process: usize,
}

/// What becomes of one store request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Fate {
    Answered,
    FailedBefore,
    LostAfter,
    /// The caller gives up after the first duration; the request applies
    /// after the second.
    Lingers,
}

/// A store request, for the fences it must respect and the ledger.
struct Call<'a> {
    name: &'static str,
    /// What it is about, as the digest may see it (no tokens: they are
    /// random per test process).
    about: &'a str,
    /// The claim and token of a finishing write: only one may be waiting
    /// for its answer at a time.
    fence: Option<(&'a str, &'a str)>,
    /// The outbox entry's body, for a deletion.
    entry_body: Option<String>,
}

impl Link {
    /// Waits while the process is frozen; never returns once it is dead.
    /// Returns whether it waited.
    pub(super) async fn hold(&self) -> bool {
        let mut waited = false;
        loop {
            let changed = self.world.life_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.world.life(self.process) {
                Life::Running => return waited,
                Life::Frozen => waited = true,
                Life::Dead => std::future::pending::<()>().await,
            }
            changed.await;
        }
    }

    fn fate(&self) -> (Fate, Duration, Duration) {
        let world = &self.world;
        let short = |rng: &mut fastrand::Rng| Duration::from_millis(rng.u64(1..=15));
        let long = |rng: &mut fastrand::Rng| Duration::from_millis(rng.u64(200..=8_000));
        let fate = if world.strikes(|faults| faults.fail_before) {
            Fate::FailedBefore
        } else if world.strikes(|faults| faults.lost_after) {
            Fate::LostAfter
        } else if world.strikes(|faults| faults.linger) {
            Fate::Lingers
        } else {
            Fate::Answered
        };
        let slow = world.strikes(|faults| faults.slow);
        world.draw(|rng| match fate {
            Fate::Lingers => {
                let gives_up = Duration::from_millis(rng.u64(500..=3_000));
                (fate, gives_up, gives_up + Duration::from_millis(rng.u64(1..=2_000)))
            }
            _ if slow && rng.bool() => (fate, long(rng), short(rng)),
            _ if slow => (fate, short(rng), long(rng)),
            _ => (fate, short(rng), short(rng)),
        })
    }

    /// One request: its fate drawn, the operation applied to the shared
    /// store (or not) after its way there, the answer back after its way
    /// back, held while the process is frozen, never once it is dead.
    async fn call<T, F, Fut>(&self, call: Call<'_>, operation: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<MemoryStore>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let held_before = self.hold().await;
        let world = &self.world;
        let (fate, there, back) = self.fate();
        {
            let mut ledger = lock(&world.ledger);
            ledger.note((self.process, call.name, call.about, fate, there, back));
            ledger.stats.store_calls += 1;
            match fate {
                Fate::FailedBefore => ledger.stats.failed_before += 1,
                Fate::LostAfter => ledger.stats.lost_after += 1,
                Fate::Lingers => ledger.stats.lingered += 1,
                Fate::Answered => {}
            }
            if there + back > Duration::from_millis(100) && fate != Fate::Lingers {
                ledger.stats.slow += 1;
            }
            if let Some((id, token)) = call.fence {
                let pending = ledger.pending.entry((id.to_owned(), token.to_owned())).or_default();
                *pending += 1;
                if *pending > 1 {
                    let violation = format!(
                        "process {}: the {} of {id} was sent while an earlier send of it waited for its answer",
                        self.process, call.name
                    );
                    ledger.violations.push(violation);
                }
            }
        }
        let (applied, answer) = tokio::sync::oneshot::channel();
        let store = Arc::clone(&world.store);
        if fate != Fate::FailedBefore {
            // The request travels on its own: once sent, it applies whatever becomes of its sender.
            tokio::spawn(async move {
                tokio::time::sleep(there).await;
                let _ = applied.send(operation(store).await);
            });
        }
        let result = match fate {
            Fate::Answered => {
                let result = answer.await.unwrap_or_else(|_| Err(StoreError::unavailable("no answer")));
                tokio::time::sleep(back).await;
                result
            }
            Fate::FailedBefore => {
                tokio::time::sleep(there + back).await;
                Err(StoreError::unavailable("throttled"))
            }
            Fate::LostAfter => {
                let _ = answer.await;
                tokio::time::sleep(back).await;
                Err(StoreError::unavailable("the answer was lost"))
            }
            Fate::Lingers => {
                tokio::time::sleep(there).await;
                Err(StoreError::unavailable("timed out"))
            }
        };
        let held_after = self.hold().await;
        let mut ledger = lock(&world.ledger);
        if let Some((id, token)) = call.fence
            && let Some(pending) = ledger.pending.get_mut(&(id.to_owned(), token.to_owned()))
        {
            *pending -= 1;
        }
        let clean = fate == Fate::Answered && there + back < Duration::from_secs(1) && !held_before && !held_after;
        if let Some(body) = call.entry_body.filter(|_| !clean) {
            ledger.disturbed.insert(body);
        }
        result
    }

    fn entry_body(&self, id: &str) -> Option<String> {
        lock(&self.world.ledger).entries.get(id).cloned()
    }
}

#[async_trait]
impl ClaimStore for Link {
    async fn put_if_free(&self, record: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
        let call = Call { name: "claim", about: &record.id, fence: None, entry_body: None };
        let record = record.clone();
        self.call(call, move |store| async move { store.put_if_free(&record, now_ms).await }).await
    }

    async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        let call = Call { name: "read", about: id, fence: None, entry_body: None };
        let id = id.to_owned();
        self.call(call, move |store| async move { store.get(&id).await }).await
    }

    async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
        let call = Call { name: "finish", about: id, fence: Some((id, token)), entry_body: None };
        let (id, token, finish) = (id.to_owned(), token.to_owned(), finish.clone());
        self.call(call, move |store| async move { store.finish(&id, &token, &finish).await }).await
    }

    async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        let call = Call { name: "release", about: id, fence: Some((id, token)), entry_body: None };
        let (id, token) = (id.to_owned(), token.to_owned());
        self.call(call, move |store| async move { store.release(&id, &token).await }).await
    }

    fn gathers_calls(&self) -> bool {
        self.world.scenario.gathers
    }

    fn admin(self: Arc<Self>) -> Option<Arc<dyn ClaimAdmin>> {
        Some(self)
    }

    fn commits(self: Arc<Self>) -> Option<Arc<dyn CommitStore>> {
        Some(self)
    }

    fn outbox(self: Arc<Self>) -> Option<Arc<dyn OutboxStore>> {
        Some(self)
    }
}

#[async_trait]
impl ClaimAdmin for Link {
    async fn list(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
        self.world.store.list(query).await
    }

    async fn replace_seen(
        &self,
        seen: Option<&StoredClaim>,
        record: Option<&StoredClaim>,
    ) -> Result<Fenced, StoreError> {
        self.world.store.replace_seen(seen, record).await
    }
}

#[async_trait]
impl CommitStore for Link {
    async fn commit(&self, id: &str, token: &str, commit: &Commit) -> Result<Committed, StoreError> {
        {
            let mut ledger = lock(&self.world.ledger);
            for entry in &commit.outbox {
                ledger.entries.insert(entry.id.clone(), entry.message.body.clone());
            }
        }
        let call = Call { name: "commit", about: id, fence: Some((id, token)), entry_body: None };
        let unclaimed = commit.unclaimed.is_some();
        let (id, token, commit) = (id.to_owned(), token.to_owned(), commit.clone());
        let committed = self.call(call, move |store| async move { store.commit(&id, &token, &commit).await }).await;
        self.world.count(|stats| {
            stats.unclaimed_commits += u64::from(unclaimed);
            stats.taken += u64::from(matches!(committed, Ok(Committed::Taken(_))));
        });
        committed
    }
}

#[async_trait]
impl OutboxStore for Link {
    async fn entries(&self, query: &OutboxQuery) -> Result<Vec<OutboxEntry>, StoreError> {
        let call = Call { name: "outbox", about: "", fence: None, entry_body: None };
        let query = *query;
        self.call(call, move |store| async move { store.entries(&query).await }).await
    }

    async fn take_entry(&self, entry: &OutboxEntry, token: &str, lease_until_ms: u64) -> Result<Fenced, StoreError> {
        let call = Call { name: "take", about: &entry.message.body, fence: None, entry_body: None };
        let (entry, token) = (entry.clone(), token.to_owned());
        self.call(call, move |store| async move { store.take_entry(&entry, &token, lease_until_ms).await }).await
    }

    async fn entry_sent(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
        let body = self.entry_body(id);
        let about = body.clone().unwrap_or_default();
        let call = Call { name: "delete", about: &about, fence: None, entry_body: body };
        let (id, token) = (id.to_owned(), token.to_owned());
        self.call(call, move |store| async move { store.entry_sent(&id, &token).await }).await
    }
}

/// The destinations as one process meets them.
#[derive(Debug)]
pub(super) struct Sender {
    pub link: Arc<Link>,
}

#[async_trait]
impl Destinations for Sender {
    async fn send(&self, _outbox_id: &str, message: &Message) -> Result<(), SendError> {
        let world = &self.link.world;
        let held_before = self.link.hold().await;
        let (failed, refused, lost) = (
            world.strikes(|faults| faults.send_fail),
            world.strikes(|faults| faults.send_refused),
            world.strikes(|faults| faults.send_lost),
        );
        tokio::time::sleep(Duration::from_millis(world.draw(|rng| rng.u64(1..=20)))).await;
        let body = &message.body;
        let delivered = !failed && !refused;
        {
            let mut ledger = lock(&world.ledger);
            ledger.note((self.link.process, "send", body, failed, refused, lost));
            if failed {
                ledger.stats.send_failed += 1;
            } else if refused {
                ledger.stats.send_refused += 1;
            } else {
                ledger.stats.messages_sent += 1;
                *ledger.sends.entry(body.clone()).or_default() += 1;
                ledger.sent_by.entry(self.link.process).or_default().push(body.clone());
                if world.life(self.link.process) != Life::Running {
                    // Sent on its way as the process was killed or frozen: not deleted by it (until a thaw, if one
                    // comes before the sending lease ends).
                    ledger.disturbed.insert(body.clone());
                }
                if lost {
                    ledger.stats.send_lost += 1;
                }
            }
        }
        let held_after = self.link.hold().await;
        if delivered && (lost || held_before || held_after) {
            lock(&world.ledger).disturbed.insert(body.clone());
        }
        match (failed, refused, lost) {
            (true, _, _) => Err(SendError { refused: false, reason: "the destination failed".into() }),
            (_, true, _) => Err(SendError { refused: true, reason: "AccessDenied".into() }),
            (_, _, true) => Err(SendError { refused: false, reason: "the answer was lost".into() }),
            _ => Ok(()),
        }
    }
}

/// The body of an outbox message as the handler named it, for checks.
pub(super) fn expected_bodies(run: &RunInfo) -> Vec<String> {
    let messages = run.spec.staged.as_ref().map_or(0, |staged| staged.messages);
    (0..messages).map(|n| message_body(run.id, n)).collect()
}
