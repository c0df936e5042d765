//! What a seed draws: the consumers and how they run, the messages, the
//! faults and how often each strikes, and the clocks' settings (expiry, TTL,
//! the index's lag, quiet hours). The world (`world.rs`) runs what is drawn.

use std::time::Duration;

use super::{queue::QueueSettings, workload::Spec};
use crate::redelivery::{RedeliveryPolicy, RetryBackoff};
use sqs_once_core::clock::duration_ms;

/// How a consumer runs its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Mode {
    /// One batch after another, frozen from each answer to the next
    /// invocation, sometimes for hours, reclaimed with SIGTERM.
    Lambda,
    /// Batches overlapping, never frozen.
    Poll,
    /// Lambda Managed Instances: invocations at once, never frozen, the
    /// writes and the outbox tended in the background between them.
    Managed,
    /// A Lambda function invoked by the template's schedule with the outbox
    /// sweep event, frozen between its invocations, whatever the traffic.
    Scheduled,
}

/// How often each fault strikes.
#[derive(Debug, Clone, Default)]
pub(super) struct Faults {
    /// A store request fails before it applies (throttled, refused, down).
    pub fail_before: f64,
    /// A store request applies, and its answer is lost.
    pub lost_after: f64,
    /// A store request times out for its caller and applies seconds later.
    pub linger: f64,
    /// A store request's way there or back takes seconds.
    pub slow: f64,
    /// A destination fails a message (not sent).
    pub send_fail: f64,
    /// A destination refuses a message (not sent).
    pub send_refused: f64,
    /// A destination takes a message and its answer is lost.
    pub send_lost: f64,
    /// A send takes seconds.
    pub slow_send: f64,
    /// A process is killed: mid-batch, or while frozen after its answer.
    pub kill: f64,
    /// A process is shut down cleanly (SIGTERM, `poll`'s stop).
    pub shutdown: f64,
    /// A Lambda environment stays frozen for minutes to hours after its
    /// answer (another takes the traffic), then is invoked again or
    /// reclaimed.
    pub long_freeze: f64,
    /// SQS delivers a message twice (standard queues).
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
            slow_send: rate(0.03),
            kill: rate(0.02),
            shutdown: rate(0.02),
            long_freeze: rate(0.05),
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
    /// Message groups of a FIFO queue; 0 for a standard queue.
    pub groups: usize,
    /// The queue's clocks and the consumers' redelivery policy.
    pub queue: QueueSettings,
    /// Messages the producer sends again (a retry after a lost answer),
    /// by index into `messages`, and how long after: on a FIFO queue, the
    /// deduplication interval drops those sent within it.
    pub resent: Vec<(usize, Duration)>,
    /// When the operator moves the dead-letter queue's messages back,
    /// after the world went quiet, if ever.
    pub redrive_after: Option<Duration>,
    pub batch_size: usize,
    pub timeout: Duration,
    pub concurrency: usize,
    pub gathers: bool,
    pub cache_entries: usize,
    pub sweep_every: Duration,
    /// The share of processes whose runs take no claim (the rest claim first).
    pub unclaimed: f64,
    /// How long a finished key is remembered (`SQS_ONCE_EXPIRES_AFTER_SECS`).
    pub expires_after: Duration,
    /// The chance TTL deletes an expired claim at each of its passes.
    pub ttl: f64,
    /// How long a transaction holds its claim against another, at most.
    pub transaction_ms: u64,
    /// How far behind the table the outbox's index lists, at most.
    pub index_lag_ms: u64,
    /// Whether traffic goes on after the faults heal (a tail of records).
    pub tail: bool,
    /// How long the world goes on once its queue has settled.
    pub quiet: Duration,
    /// How often the schedule invokes a sweep of the outbox.
    pub schedule_every: Duration,
    pub faults: Faults,
    /// The visibility timeout the consumers are told
    /// (`SQS_ONCE_VISIBILITY_TIMEOUT_SECS`): the queue's, or in some worlds
    /// a shorter one, as a copied template or a queue changed in the
    /// console leaves it. Each process reads the queue's own at its start,
    /// as the Lambda function does at its first batch and `poll` before it
    /// receives, and keeps keys past the longer.
    pub told_visibility_timeout: Duration,
    /// How the store sends the commits that keep their key in an item:
    /// `None`, each as one request; `Some(rate)`, as a statement among
    /// others in a batch, each attempt checked against the commit's
    /// deadline and sent again while its own answer says throttled (as the
    /// DynamoDB store does), and at `rate` a statement held minutes to hours
    /// (a freeze with it in flight, a queue behind slow requests) and sent
    /// then unchecked, as a store that forgot its deadline would: the item
    /// itself must refuse it (`InItem::Late`).
    pub kept_statements: Option<f64>,
}

impl Scenario {
    /// How long the consumers' items keep a key at least: the key memory,
    /// three redelivery windows when that is longer, and a commit's own
    /// memory at least (as [`crate::claim::Claims`] keeps it).
    pub(super) fn kept_key_memory(&self) -> Duration {
        let memory = self.expires_after.max(3 * self.queue.redelivered_within());
        memory.max(sqs_once_core::store::COMMIT_MEMORY)
    }

    pub(super) fn draw(rng: &mut fastrand::Rng) -> Self {
        let modes = [Mode::Lambda, Mode::Poll, Mode::Managed];
        let consumers = (0..rng.usize(1..=3)).map(|_| modes[rng.usize(..modes.len())]).collect();
        let keys = rng.usize(4..=24);
        let specs = Spec::draw(rng, keys);
        let mut messages: Vec<usize> = (0..keys).collect();
        messages.extend((0..rng.usize(0..=keys / 3)).map(|_| rng.usize(0..keys)));
        rng.shuffle(&mut messages);
        let seconds =
            |choices: &[u64], rng: &mut fastrand::Rng| Duration::from_secs(choices[rng.usize(..choices.len())]);
        let quiet = seconds(&[60, 1_800, 2 * 3_600], rng);
        let groups = if rng.u8(0..5) == 0 { rng.usize(1..=3) } else { 0 };
        // Lambda's timeouts, up to its 15 minutes; most are seconds.
        let timeout = match rng.u8(0..10) {
            0 => seconds(&[30, 900], rng),
            _ => Duration::from_millis(rng.u64(2_000..=8_000)),
        };
        let queue = draw_queue(rng, groups > 0, timeout);
        // A world of hours sweeps at most every minute, as a process with the default setting does: a sweep a
        // second for hours would cost the simulation much and find nothing more.
        let hours = quiet > Duration::from_secs(1_800) || queue.visibility_timeout > Duration::from_secs(600);
        let sweep_every = match hours {
            true => Duration::from_secs(60),
            false => seconds(&[1, 5, 10, 30, 60], rng),
        };
        let mut resent = Vec::new();
        for n in 0..messages.len() {
            if rng.u8(0..10) == 0 {
                resent.push((n, Duration::from_secs(rng.u64(1..=600))));
            }
        }
        let redrive_after = (rng.u8(0..3) == 0).then(|| seconds(&[600, 2 * 3_600, 26 * 3_600, 3 * 24 * 3_600], rng));
        let mut scenario = Self {
            consumers,
            specs,
            messages,
            groups,
            queue,
            resent,
            redrive_after,
            batch_size: rng.usize(1..=10),
            timeout,
            concurrency: rng.usize(1..=8),
            gathers: rng.bool(),
            cache_entries: if rng.bool() { 1024 } else { 0 },
            sweep_every,
            unclaimed: [0.0, 0.5, 1.0][rng.usize(..3)],
            // Down to the shortest the start accepts: the queue's redelivery is what keys must outlive.
            expires_after: seconds(&[1, 20, 60, 300, 3_600], rng),
            ttl: [0.0, 0.1, 1.0][rng.usize(..3)],
            transaction_ms: [0, 20, 300][rng.usize(..3)],
            index_lag_ms: [0, 100, 2_000][rng.usize(..3)],
            tail: rng.bool(),
            quiet,
            schedule_every: seconds(&[60, 300], rng),
            faults: Faults::draw(rng),
            told_visibility_timeout: Duration::ZERO,
            kept_statements: None,
        };
        // Drawn last, so that what every seed drew before keeps its draws.
        scenario.keep_keys_in_items(rng);
        let real = scenario.queue.visibility_timeout;
        scenario.told_visibility_timeout = real;
        if rng.u8(0..4) == 0 {
            let shortest = timeout.as_millis() as u64;
            scenario.told_visibility_timeout = Duration::from_millis(rng.u64(shortest..=duration_ms(real)));
        }
        scenario.kept_statements = rng.bool().then(|| [0.05, 0.3][rng.usize(..2)]);
        scenario
    }

    /// In a third of the worlds, half the keys whose handler stages without
    /// a gate keep their key in the item: their runs stage the increment
    /// alone, and (without a claim, where the key memory allows) commit it
    /// alone, into an item of their own or one that several keys credit.
    fn keep_keys_in_items(&mut self, rng: &mut fastrand::Rng) {
        if rng.u8(0..3) != 0 {
            return;
        }
        for spec in &mut self.specs {
            if let Some(staged) = spec.staged.as_mut().filter(|staged| staged.gate.is_none() && staged.opens.is_none())
                && rng.bool()
            {
                let item = if rng.bool() { spec.id.clone() } else { "account".to_owned() };
                *staged = super::workload::Staging { messages: 0, opens: None, gate: None, kept_in: Some(item) };
            }
        }
    }
}

/// A queue as users set one up: a visibility timeout at least the
/// function's `timeout` (Lambda refuses a shorter one), often six times it
/// as AWS advises, now and then hours; a back-off or none, visibility
/// changes that fail now and then; a dead-letter queue after a few receives
/// or many; days of retention, or an hour.
fn draw_queue(rng: &mut fastrand::Rng, fifo: bool, timeout: Duration) -> QueueSettings {
    let visibility_timeout = match rng.u8(0..10) {
        0..=4 => timeout + Duration::from_secs(5),
        5..=7 => timeout * 6,
        // Not on a FIFO queue, whose group waits out each failure's timeout in turn: days of a world.
        _ if fifo => timeout * 6,
        _ => Duration::from_secs(rng.u64(timeout.as_secs().max(60)..=2 * 3_600)),
    };
    // The consumers' policy as the settings read it: conflicts backed off or not, retries backed off or not.
    let mut policy = RedeliveryPolicy::none();
    policy.longest_delay = Duration::from_secs([30, 900][rng.usize(..2)]);
    policy.conflict_backoff = rng.bool();
    policy.retry_backoff =
        rng.bool().then(|| RetryBackoff { base: Duration::from_secs(rng.u64(1..=5)), max: policy.longest_delay });
    // Many receives with a long timeout would keep a world going for days.
    let max_receives = match visibility_timeout > Duration::from_secs(600) {
        true => rng.u32(2..=5),
        false => [2, 3, 5, 10, 40][rng.usize(..5)],
    };
    let retention = match rng.u8(0..10) {
        0 => Duration::from_secs(3_600),
        _ => Duration::from_secs([4, 14][rng.usize(..2)] * 24 * 3_600),
    };
    QueueSettings {
        fifo,
        visibility_timeout,
        max_receives,
        retention,
        policy,
        change_fails: [0.0, 0.1, 0.5][rng.usize(..3)],
    }
}
