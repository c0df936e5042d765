//! A deterministic simulation of the engine, the claim state machine, the
//! commits and the outbox, in the manner of FoundationDB's and TigerBeetle's
//! simulators.
//!
//! One seed draws a scenario (`scenario`) and makes one world (`world`): a
//! queue of messages (standard, some copied by SQS, or FIFO with message
//! groups; some sharing a business key), a
//! handler that stages DynamoDB writes and messages (some conditioned on
//! items other records write), and one to three consumers, each a Lambda
//! function (batches one after another, frozen from each answer to the next
//! invocation, now and then for minutes to hours, shut down, killed or
//! reclaimed with SIGTERM), a `poll` process or a Lambda Managed Instances
//! environment (batches overlapping). They share one table (`table`) that
//! keeps DynamoDB's clocks: a transaction's token answers as its first
//! answer for ten minutes only, keys expire (after a minute to an hour) and
//! TTL deletes them at some later moment, transactions on one item
//! conflict, and the outbox's index lags. Each process meets it through a
//! link (`link`) whose requests the seed delays, loses after they applied,
//! fails, or leaves to apply seconds after the caller gave up; and
//! destinations that fail, refuse, lose their answers or take seconds.
//! Time is tokio's paused clock, so a world of hours runs in milliseconds
//! and the same seed replays the same schedule.
//!
//! The consumers decide with the code users run, not a model of it: each
//! batch goes through [`crate::engine::Engine`] as the builder assembles
//! it; the queue takes what the batch's answer says
//! ([`crate::report::BatchReport::response`], the `batchItemFailures` the
//! function posts: a record left out is deleted), and keeps a failed
//! record away as the consumers' [`crate::redelivery::RedeliveryPolicy`],
//! drawn as the settings read it, decides.
//!
//! After the queue has drained, the faults heal; traffic goes on for a
//! while, or stops for good; the world is left alone for minutes to hours;
//! then every process is stopped (Lambda environments reclaimed with
//! SIGTERM) and [`check`] judges the world against what sqs-once promises.
//!
//! ```text
//! cargo test -p sqs-once-core --lib simulation                     # 2,000 seeds
//! SQS_ONCE_SIM_SEEDS=20000 cargo test -p sqs-once-core --lib simulation
//! SQS_ONCE_SIM_SEED=1234 cargo test -p sqs-once-core --lib simulation -- --nocapture   # replay one
//! ```

mod check;
mod ledger;
mod link;
mod process;
mod queue;
mod scenario;
mod table;
mod workload;
mod world;

use std::time::Duration;

/// Seeds run when `SQS_ONCE_SIM_SEEDS` does not say.
const DEFAULT_SEEDS: u64 = 2_000;

/// What a seed's run came to.
#[derive(Debug)]
struct Run {
    /// Every invariant the world broke, described.
    violations: Vec<String>,
    /// A digest of everything that happened, to prove a replay is exact.
    digest: u64,
    /// What happened, in a few numbers, for the summary line.
    stats: ledger::Stats,
    /// The drawn scenario, when the world broke an invariant.
    scenario: Option<String>,
}

/// Runs the world of `seed` on a runtime of its own with paused time.
fn simulate(seed: u64) -> Run {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds");
    // The world is made inside the runtime, so that its clock starts on the paused one.
    runtime.block_on(async move { world::World::new(seed).run().await })
}

fn seeds() -> Vec<u64> {
    let number = |name: &str| std::env::var(name).ok().map(|value| value.parse::<u64>().expect("a number"));
    match number("SQS_ONCE_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..number("SQS_ONCE_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS)).collect(),
    }
}

/// The runs of `seeds`, in their order, on as many threads as there are
/// cores: each seed's world is on a runtime of its own and shares nothing.
fn simulate_all(seeds: &[u64]) -> Vec<(u64, Run)> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from).clamp(1, seeds.len().max(1));
    let mut runs: Vec<(u64, Run)> = std::thread::scope(|scope| {
        let shares: Vec<_> = (0..threads)
            .map(|share| {
                scope.spawn(move || {
                    seeds.iter().skip(share).step_by(threads).map(|&seed| (seed, simulate(seed))).collect::<Vec<_>>()
                })
            })
            .collect();
        shares.into_iter().flat_map(|share| share.join().expect("a simulation thread panicked")).collect()
    });
    runs.sort_by_key(|(seed, _)| *seed);
    runs
}

#[test]
fn every_schedule_keeps_the_invariants() {
    let seeds = seeds();
    let mut broken = Vec::new();
    let mut total = ledger::Stats::default();
    for (seed, run) in simulate_all(&seeds) {
        total.add(&run.stats);
        if !run.violations.is_empty() {
            broken.push((seed, run.violations, run.scenario.unwrap_or_default()));
        }
    }
    println!("{} seeds: {total}", seeds.len());
    if broken.is_empty() {
        return;
    }
    // The first failing seed's world in full; the others' violations only.
    let shown: Vec<String> = broken
        .iter()
        .take(5)
        .enumerate()
        .map(|(n, (seed, violations, scenario))| {
            let drawn = if n == 0 { format!("\n  drawn: {scenario}") } else { String::new() };
            format!("seed {seed}:\n  {}{drawn}", violations.join("\n  "))
        })
        .collect();
    let seeds: Vec<String> = broken.iter().map(|(seed, ..)| seed.to_string()).collect();
    // Alike violations counted, each with the first seed that broke it.
    let mut kinds: std::collections::BTreeMap<String, (usize, u64)> = std::collections::BTreeMap::new();
    for (seed, violation) in broken.iter().flat_map(|(seed, violations, _)| violations.iter().map(move |v| (*seed, v)))
    {
        kinds.entry(kind(violation)).or_insert((0, seed)).0 += 1;
    }
    let kinds: Vec<String> =
        kinds.iter().map(|(kind, (count, seed))| format!("{count:>6}  {kind} (seed {seed})")).collect();
    panic!(
        "{} of the seeds broke an invariant (replay one with SQS_ONCE_SIM_SEED=<seed>): {}\n{}\n{}",
        broken.len(),
        seeds.join(", "),
        kinds.join("\n"),
        shown.join("\n")
    );
}

/// A violation with its numbers and names taken out, to count alike ones.
fn kind(violation: &str) -> String {
    let mut kind = String::new();
    for word in violation.split(' ') {
        let word = if word.chars().any(|c| c.is_ascii_digit()) { "…" } else { word };
        kind.push_str(word);
        kind.push(' ');
    }
    kind.trim_end().to_owned()
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [3, 17, 101] {
        let (first, second) = (simulate(seed), simulate(seed));
        assert_eq!(first.digest, second.digest, "seed {seed} ran two different schedules");
        assert_eq!(first.violations, second.violations);
    }
}

#[test]
fn the_worlds_meet_every_fault_they_are_made_of() {
    let mut total = ledger::Stats::default();
    for (_, run) in simulate_all(&(0..200).collect::<Vec<_>>()) {
        total.add(&run.stats);
    }
    // A simulation that never loses an answer or kills a process proves nothing.
    for (what, count) in total.faults() {
        assert!(count > 0, "no seed of 200 met {what}: {total}");
    }
}

/// A short pause, as the consumers' loops take between looks at the queue.
const TICK: Duration = Duration::from_millis(100);

/// How long a consumer waits for a message before it looks again, as
/// SQS's long polling (and Lambda's poller) does.
const LONG_POLL: Duration = Duration::from_secs(20);
