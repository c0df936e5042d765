//! What happened in a world, as [`super::check`] judges it: the runs of the
//! handler, the outcomes the batches reported, the messages the
//! destinations received and which of them may be received twice, and a
//! few counts for the summary line.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt,
    hash::{DefaultHasher, Hash, Hasher},
};

use super::{queue::Ended, workload::Spec};
use crate::report::Outcome;

/// A run of the handler, as it saw itself.
#[derive(Debug, Clone)]
pub(super) struct RunInfo {
    pub id: u64,
    pub key: String,
    /// The run's place among the runs of its key, from 1.
    pub attempt: u32,
    /// The invocation it ran in.
    pub holder: String,
    pub spec: Spec,
}

/// A record's outcome as its batch reported it.
#[derive(Debug, Clone)]
pub(super) struct Reported {
    /// When its batch started: what the table said of the key from then on
    /// is what the outcome answers to.
    pub batch_started_ms: u64,
    pub holder: String,
    pub message_id: String,
    pub key: Option<String>,
    pub outcome: Outcome,
    /// For a delivery the queue made because the last one ended without a
    /// deletion (see [`Delivery::back_after`](super::queue::Delivery)):
    /// that one.
    pub back_after: Option<Ended>,
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
    pub conflicts: u64,
    pub send_failed: u64,
    pub send_refused: u64,
    pub send_lost: u64,
    pub slow_sends: u64,
    pub kills: u64,
    pub shutdowns: u64,
    pub copies: u64,
    pub freezes: u64,
    pub long_freezes: u64,
    pub overlapping: u64,
    pub applied_runs: u64,
    pub messages_sent: u64,
    pub uncommitted: u64,
    pub cancelled: u64,
    pub unclaimed_commits: u64,
    pub taken: u64,
    /// Commits of one update with the key kept in its item, applied.
    pub kept_in_items: u64,
    /// Commits that found their key kept in the item already.
    pub in_item_already: u64,
    /// Kept-key statements throttled on their own, and sent again.
    pub statements_throttled: u64,
    /// Kept-key statements held minutes to hours, then sent unchecked.
    pub statements_held: u64,
    /// Kept-key commits that an item's window refused as too late for them.
    pub refused_late: u64,
    pub ttl_deleted: u64,
    pub given_up: u64,
    pub quiet_worlds: u64,
    pub fifo_worlds: u64,
    /// Records back from the queue after a visibility timeout, a back-off
    /// or a kill, whose key had applied before.
    pub back_after_applied: u64,
    pub visibility_failed: u64,
    pub deduplicated: u64,
    pub redriven: u64,
    /// Each committed message's time from its commit to its first send, in
    /// worlds whose traffic goes on and in those whose traffic stops.
    pub send_ms: [Vec<u64>; 2],
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
            (&mut self.conflicts, other.conflicts),
            (&mut self.send_failed, other.send_failed),
            (&mut self.send_refused, other.send_refused),
            (&mut self.send_lost, other.send_lost),
            (&mut self.slow_sends, other.slow_sends),
            (&mut self.kills, other.kills),
            (&mut self.shutdowns, other.shutdowns),
            (&mut self.copies, other.copies),
            (&mut self.freezes, other.freezes),
            (&mut self.long_freezes, other.long_freezes),
            (&mut self.overlapping, other.overlapping),
            (&mut self.applied_runs, other.applied_runs),
            (&mut self.messages_sent, other.messages_sent),
            (&mut self.uncommitted, other.uncommitted),
            (&mut self.cancelled, other.cancelled),
            (&mut self.unclaimed_commits, other.unclaimed_commits),
            (&mut self.taken, other.taken),
            (&mut self.kept_in_items, other.kept_in_items),
            (&mut self.in_item_already, other.in_item_already),
            (&mut self.statements_throttled, other.statements_throttled),
            (&mut self.statements_held, other.statements_held),
            (&mut self.refused_late, other.refused_late),
            (&mut self.ttl_deleted, other.ttl_deleted),
            (&mut self.given_up, other.given_up),
            (&mut self.quiet_worlds, other.quiet_worlds),
            (&mut self.fifo_worlds, other.fifo_worlds),
            (&mut self.back_after_applied, other.back_after_applied),
            (&mut self.visibility_failed, other.visibility_failed),
            (&mut self.deduplicated, other.deduplicated),
            (&mut self.redriven, other.redriven),
        ];
        for (total, value) in fields {
            *total += value;
        }
        for (total, values) in self.send_ms.iter_mut().zip(&other.send_ms) {
            total.extend(values);
        }
    }

    /// The median and the 99th percentile of each world kind's send times,
    /// in seconds.
    fn send_times(&self) -> String {
        let percentiles = |values: &[u64]| {
            let mut values = values.to_vec();
            values.sort_unstable();
            let at = |q: f64| values.get(((values.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0);
            format!("p50 {:.2} s, p99 {:.1} s", at(0.5) as f64 / 1000.0, at(0.99) as f64 / 1000.0)
        };
        format!(
            "commit to send: with traffic {}, traffic stopped {}",
            percentiles(&self.send_ms[0]),
            percentiles(&self.send_ms[1])
        )
    }

    /// The faults and schedules the simulation is made to meet, counted.
    pub(super) fn faults(&self) -> [(&'static str, u64); 32] {
        [
            ("a request failed before applying", self.failed_before),
            ("an answer lost after applying", self.lost_after),
            ("a request applied after its caller gave up", self.lingered),
            ("a slow answer", self.slow),
            ("a transaction conflict", self.conflicts),
            ("a failed send", self.send_failed),
            ("a refused send", self.send_refused),
            ("a send whose answer was lost", self.send_lost),
            ("a send that took seconds", self.slow_sends),
            ("a killed process", self.kills),
            ("a shutdown", self.shutdowns),
            ("an SQS copy", self.copies),
            ("an environment frozen for minutes to hours", self.long_freezes),
            ("overlapping batches", self.overlapping),
            ("an uncommitted record", self.uncommitted),
            ("a cancelled commit", self.cancelled),
            ("a commit without a claim", self.unclaimed_commits),
            ("a commit without a claim that found the key taken", self.taken),
            ("a commit of one update, its key kept in the item", self.kept_in_items),
            ("a commit that found its key kept in the item", self.in_item_already),
            ("a kept-key statement throttled on its own and sent again", self.statements_throttled),
            ("a kept-key statement held minutes to hours and sent unchecked", self.statements_held),
            ("a kept-key commit refused by a window begun too late for it", self.refused_late),
            ("a claim deleted by TTL", self.ttl_deleted),
            ("a commit given up unconfirmed", self.given_up),
            ("a world whose traffic stops", self.quiet_worlds),
            ("a FIFO queue", self.fifo_worlds),
            ("a run applied", self.applied_runs),
            ("a record back from the queue after its key applied", self.back_after_applied),
            ("a visibility change that failed", self.visibility_failed),
            ("a producer's retry dropped by FIFO deduplication", self.deduplicated),
            ("a message redriven from the dead-letter queue", self.redriven),
        ]
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} batches, {} records, {} store calls, {} runs applied, {} messages sent; {}; faults: {}",
            self.batches,
            self.records,
            self.store_calls,
            self.applied_runs,
            self.messages_sent,
            self.send_times(),
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
    /// Each message body received by its destination, with how often.
    pub sends: HashMap<String, u32>,
    /// The bodies in the order their destination first received them, with
    /// when.
    pub first_sent: Vec<(String, u64)>,
    /// Bodies that may be received twice: a process died or froze while
    /// their send or deletion was under way, the send's answer was lost, or
    /// the deletion failed.
    pub excused: BTreeSet<String>,
    /// Bodies each process sent and has not yet deleted the entry of.
    in_flight: BTreeMap<usize, BTreeSet<String>>,
    /// The body of each outbox entry, by entry id.
    pub entries: HashMap<String, String>,
    /// Finishing writes waiting for their answer, by claim and token.
    pub pending: HashMap<(String, String), u32>,
    pub violations: Vec<String>,
    pub stats: Stats,
    digest: DefaultHasher,
}

impl Ledger {
    /// Adds `event` to the digest that proves a replay exact; with
    /// `SQS_ONCE_SIM_TRACE` set, prints it too, at the world's time.
    pub(super) fn note(&mut self, event: impl Hash + fmt::Debug) {
        if std::env::var_os("SQS_ONCE_SIM_TRACE").is_some() {
            eprintln!("{event:?}");
        }
        event.hash(&mut self.digest);
    }

    pub(super) fn digest(&self) -> u64 {
        self.digest.finish()
    }

    /// A handler run starts.
    pub(super) fn start_run(&mut self, key: String, holder: String, spec: &Spec) -> RunInfo {
        let attempt = {
            let attempts = self.attempts.entry(spec.id.clone()).or_default();
            *attempts += 1;
            *attempts
        };
        let run = RunInfo { id: self.runs.len() as u64, key, attempt, holder, spec: spec.clone() };
        self.note(("run", run.id, &run.key, &run.holder));
        self.runs.push(run.clone());
        run
    }

    /// `process` delivered `body` to its destination at `now_ms`.
    pub(super) fn received(&mut self, process: usize, body: &str, now_ms: u64) {
        self.stats.messages_sent += 1;
        let times = self.sends.entry(body.to_owned()).or_default();
        *times += 1;
        if *times == 1 {
            self.first_sent.push((body.to_owned(), now_ms));
        }
        self.in_flight.entry(process).or_default().insert(body.to_owned());
    }

    /// `process` deleted the entry of `body`: sent once by it, for good.
    pub(super) fn deleted(&mut self, process: usize, body: &str) {
        if let Some(bodies) = self.in_flight.get_mut(&process) {
            bodies.remove(body);
        }
    }

    /// `process` died or froze: what it sent and had not deleted yet may be
    /// sent again by another.
    pub(super) fn stopped(&mut self, process: usize) {
        let bodies = self.in_flight.remove(&process).unwrap_or_default();
        self.excused.extend(bodies);
    }
}
