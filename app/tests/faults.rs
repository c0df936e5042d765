//! Effectively once on a faulty network. DynamoDB Local sits behind a proxy
//! that loses answers after the write applied, resets connections, throttles,
//! fails and delays requests, and refuses single statements of a batch, at
//! random from a seed (`common::faults`). Then:
//!
//! - three `sqs-once invoke` processes (`--timeout 4`) get every pending
//!   message twice per round, a message leaving the queue once any process
//!   reports it successful, until none is left; then, once every lease has
//!   ended, a copy of every message again, as SQS standard queues deliver one
//!   now and then even after success: with batched writes and with single
//!   requests;
//! - two `sqs-once poll` processes drain a queue holding duplicates, with
//!   the SQS server's deletes and visibility changes failing too.
//!
//! Each time, every key's handler must have run exactly once and no message
//! may be lost, but where docs/guarantees.md says a key runs again: its completion
//! still unconfirmed as its process left for good, or its run cancelled at
//! the cut-off while its handler was under way. `SQS_ONCE_FAULTS_KEYS`, `SQS_ONCE_FAULTS_RATE` and
//! `SQS_ONCE_FAULTS_SEEDS` make the invoke rounds heavier (`bench/soak`);
//! each drain prints a `faults-report` JSON line.

use crate::common;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use crate::common::{
    faults::{DYNAMODB, FaultMix, FaultProxy, SQS},
    rounds::{Rounds, seeds, setting},
};
use serde_json::{Value, json};

/// How many times each message id's handler ran, and under which stored
/// key, from the demo log.
fn runs(log: &Path) -> HashMap<String, (String, usize)> {
    let mut runs: HashMap<String, (String, usize)> = HashMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let (key, message_id) = line.split_once('\t').expect("<key>\t<messageId>");
        runs.entry(message_id.to_owned()).or_insert_with(|| (key.to_owned(), 0)).1 += 1;
    }
    runs
}

/// The stored keys on the processes' log lines that say `marker`.
fn logged_keys(dir: &Path, marker: &str) -> HashSet<String> {
    let mut keys = HashSet::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.path().extension().is_some_and(|extension| extension == "log") {
            let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
            for line in log.lines().filter(|line| line.contains(marker)) {
                let tokens = line.split(|c: char| c.is_whitespace() || "\"[],".contains(c));
                keys.extend(
                    tokens.filter(|token| token.contains('#')).map(|token| token.trim_start_matches("key=").to_owned()),
                );
            }
        }
    }
    keys
}

/// The stored keys whose finishing writes a process still had unconfirmed
/// as it left: the window docs/guarantees.md names, where a copy after the lease
/// runs a key again.
fn left_unconfirmed(dir: &Path) -> HashSet<String> {
    logged_keys(dir, "still unconfirmed as the process leaves")
}

/// The stored keys whose runs were cancelled at the cut-off, their handlers
/// perhaps half done: a delivery after the lease runs them again, as the
/// README says of cancelled handlers.
fn cancelled_at_the_cutoff(dir: &Path) -> HashSet<String> {
    logged_keys(dir, "run cancelled at the cut-off")
}

/// The body of message `n`: most succeed at once; one in ten takes 200 ms,
/// one in ten fails (retryable) on its first delivery, and one in fifty
/// stalls past the deadline on its first delivery, so that its claim is left
/// in progress and taken over after its lease in a later round. Failing and
/// stalling happen before the demo handler's side effect starts.
fn body(n: usize) -> String {
    match n % 50 {
        2 => json!({ "n": n, "stall_first_ms": 10_000 }),
        _ if n.is_multiple_of(10) => json!({ "n": n, "sleep_ms": 200 }),
        _ if n % 10 == 1 => json!({ "n": n, "fail_first": "retryable" }),
        _ => json!({ "n": n }),
    }
    .to_string()
}

/// How long after an `invoke --timeout 4` process started the claims it took
/// stop holding: its deadline plus the default lease margin, and a second more.
const PAST_THE_LEASE: Duration = Duration::from_secs(4 + 2 + 1);

/// Drains `keys` messages by rounds, then, once every lease has ended,
/// delivers a copy of each message again (SQS standard queues deliver one now
/// and then even after success) and drains those copies; the figures.
async fn drain_by_rounds(keys: usize, rate: f64, seed: u64, batching: bool) -> Value {
    let store = common::fresh_table().await;
    let mix = FaultMix::spread(rate);
    let proxy = FaultProxy::start(&common::dynamodb::endpoint(), DYNAMODB, mix, &[], seed).await;
    let dir = tempfile::tempdir().unwrap();
    let batched = batching;
    let batching = batching.to_string();
    let demo_log = dir.path().join("demo.log").display().to_string();
    let envs = [
        ("SQS_ONCE_TABLE", store.layout().table.as_str()),
        ("AWS_ENDPOINT_URL_DYNAMODB", proxy.url.as_str()),
        ("SQS_ONCE_DYNAMODB_BATCHING", batching.as_str()),
        ("SQS_ONCE_DEMO_LOG", demo_log.as_str()),
    ];
    let messages: BTreeMap<String, String> = (0..keys).map(|n| (format!("m-{seed}-{n:05}"), body(n))).collect();
    let mut shuffle = fastrand::Rng::with_seed(seed);
    let mut rounds = Rounds::default();
    let started = Instant::now();
    let mut pending = messages.clone();
    rounds.drain(dir.path(), &mut pending, &mut shuffle, &envs).await;
    let after_first_drain = (rounds.rounds, runs(&dir.path().join("demo.log")).len());
    tokio::time::sleep(PAST_THE_LEASE).await;
    let mut copies = if pending.is_empty() { messages.clone() } else { BTreeMap::new() };
    rounds.drain(dir.path(), &mut copies, &mut shuffle, &envs).await;
    let runs = runs(&dir.path().join("demo.log"));
    let ran_twice: Vec<_> = runs.iter().filter(|(_, (_, count))| *count > 1).collect();
    let window = left_unconfirmed(dir.path());
    let cancelled = cancelled_at_the_cutoff(dir.path());
    let (in_window, rest): (Vec<_>, Vec<_>) = ran_twice.into_iter().partition(|(_, (key, _))| window.contains(key));
    let (after_cancel, unexplained): (Vec<_>, Vec<_>) =
        rest.into_iter().partition(|(_, (key, _))| cancelled.contains(key));
    let counted = |metric: &str| rounds.sum(metric);
    let report = json!({
        "writes": if batching == "true" { "batched" } else { "single" }, "keys": keys, "rate": rate, "seed": seed,
        "rounds": rounds.rounds, "rounds_before_copies": after_first_drain.0, "deliveries": rounds.deliveries,
        "seconds": started.elapsed().as_secs(),
        "deadline": counted("FailedDeadline"), "store_error": counted("FailedStoreError"),
        "conflict": counted("Conflicts"), "completion_unconfirmed": counted("CompletionUnconfirmed"),
        "ran_twice": in_window.len() + after_cancel.len() + unexplained.len(),
        "ran_twice_left_unconfirmed": in_window.len(), "ran_twice_cancelled_at_the_cutoff": after_cancel.len(),
        "left_unconfirmed_at_exit": window.len(), "never_ran": keys - runs.len(), "left_in_queue": pending.len(),
        "copies_left_in_queue": copies.len(), "injected": proxy.injected.report(),
    });
    println!("faults-report {report}");
    if std::env::var_os("SQS_ONCE_FAULTS_KEEP").is_some() {
        println!("faults-logs {}", dir.keep().display());
    }
    assert!(
        proxy.injected.missing(&mix).is_empty(),
        "faults never injected: {:?}\n{report}",
        proxy.injected.missing(&mix)
    );
    // Each drain takes the write path it names. Batched, every finishing write goes in a batch, and so
    // does every claim but the takeover of an ended lease (a `PutItem` conditioned on the item it
    // replaces: under emulation, with most first deliveries cut off, these can outnumber the batches).
    let of = |operation: &str| proxy.injected.of(operation);
    if batched {
        let batched_only = of("UpdateItem") == 0 && of("DeleteItem") == 0 && of("BatchExecuteStatement") > 0;
        assert!(batched_only, "batched writes: {report}");
    } else {
        let single_only = of("BatchExecuteStatement") == 0 && of("BatchGetItem") == 0 && of("UpdateItem") > 0;
        assert!(single_only, "single requests only: {report}");
    }
    // The stalled first deliveries were cut off, their claims left in progress: each key then ran once
    // (asserted below), which only a takeover after the lease allows. A stalling key whose first
    // deliveries never reached its handler (its claim cut off by a fault) never stalls: half are asked for.
    let stalled = (keys / 50).div_ceil(2) as u64;
    assert!(after_first_drain.0 >= 2 && counted("FailedDeadline") >= stalled, "no takeover: {report}");
    assert!(pending.is_empty(), "messages never processed: {report}");
    assert_eq!(after_first_drain.1, keys, "messages that left the queue without their handler running: {report}");
    assert!(copies.is_empty(), "copies after success never reported successful: {report}");
    // A key may run again only where docs/guarantees.md says: its completion still unconfirmed when its process
    // left for good, and a copy delivered after the lease; or its run cancelled at the cut-off with its
    // handler under way (one in ten sleeps 200 ms after its side effect began).
    assert!(unexplained.is_empty(), "keys whose handler ran twice: {unexplained:?}\n{report}");
    assert_eq!(runs.len(), keys, "{report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_writes_run_every_key_once_on_a_faulty_network() {
    for seed in seeds() {
        drain_by_rounds(setting("SQS_ONCE_FAULTS_KEYS", 200), setting("SQS_ONCE_FAULTS_RATE", 0.18), seed, true).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_requests_run_every_key_once_on_a_faulty_network() {
    for seed in seeds() {
        drain_by_rounds(setting("SQS_ONCE_FAULTS_KEYS", 200), setting("SQS_ONCE_FAULTS_RATE", 0.18), seed, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_runs_every_key_once_with_faulty_dynamodb_and_sqs() {
    let seed = seeds()[0];
    let queue = common::sqs::Queue::create(false, 5).await;
    // 150 keys, 50 of them sent twice.
    let bodies: Vec<Value> = (0..200).map(|n| json!({ "id": format!("k-{}", n % 150) })).collect();
    queue.send(&bodies).await;
    let store = common::fresh_table().await;
    let dynamodb_faults = FaultMix::spread(0.1);
    let dynamodb = FaultProxy::start(&common::dynamodb::endpoint(), DYNAMODB, dynamodb_faults, &[], seed).await;
    // Deletes and visibility changes fail, whole calls (retried by the SDK) and single entries of a
    // batch call (which no SDK retries): messages that succeeded come back, as duplicates.
    let sqs_faults = FaultMix { slow: 0.0, ..FaultMix::spread(0.2) };
    let settled = &["DeleteMessageBatch", "ChangeMessageVisibilityBatch", "ChangeMessageVisibility"];
    let sqs = FaultProxy::start(&common::sqs::endpoint(), SQS, sqs_faults, settled, seed).await;
    let dir = tempfile::tempdir().unwrap();
    let pollers: Vec<_> = (0..2)
        .map(|n| {
            let mut command = tokio::process::Command::from(common::sqs_once_command());
            command
                .args(["poll", "--queue-url", queue.url(), "--wait-secs", "1", "--timeout", "4"])
                .current_dir(dir.path())
                .env_remove("AWS_LAMBDA_RUNTIME_API")
                .env_remove("SQS_ONCE_STORE")
                .env("SQS_ONCE_TABLE", &store.layout().table)
                .env("AWS_ENDPOINT_URL_DYNAMODB", &dynamodb.url)
                .env("AWS_ENDPOINT_URL_SQS", &sqs.url)
                .env("SQS_ONCE_KEY", "body.id")
                .env("SQS_ONCE_RETRY_BASE_SECS", "1")
                .env("SQS_ONCE_DEMO_LOG", dir.path().join("demo.log"))
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(dir.path().join(format!("poll-{n}.out"))).unwrap())
                .stderr(std::fs::File::create(dir.path().join(format!("poll-{n}.log"))).unwrap())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    let started = Instant::now();
    while queue.depth().await != (0, 0) {
        assert!(started.elapsed() < Duration::from_secs(180), "the queue was not drained: {:?}", queue.depth().await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut summaries = Vec::new();
    for (n, mut poller) in pollers.into_iter().enumerate() {
        let pid = poller.id().unwrap().to_string();
        assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = poller.wait().await.unwrap();
        let stderr = std::fs::read_to_string(dir.path().join(format!("poll-{n}.log"))).unwrap_or_default();
        assert!(status.success(), "poll did not stop cleanly on SIGTERM: {status:?}\n{stderr}");
        let stdout = std::fs::read_to_string(dir.path().join(format!("poll-{n}.out"))).unwrap();
        summaries.push(serde_json::from_str::<Value>(&stdout).expect("the poller's summary is one JSON object"));
    }
    let total = |field: &str| summaries.iter().map(|summary| summary[field].as_u64().unwrap()).sum::<u64>();
    // Runs counted by key: the demo log's first column is the stored key.
    let mut by_key: HashMap<String, usize> = HashMap::new();
    for line in std::fs::read_to_string(dir.path().join("demo.log")).unwrap().lines() {
        *by_key.entry(line.split('\t').next().unwrap().to_owned()).or_default() += 1;
    }
    let report = json!({
        "consumer": "poll", "dynamodb_injected": dynamodb.injected.report(), "sqs_injected": sqs.injected.report(),
        "summaries": summaries,
    });
    println!("faults-report {report}");
    assert!(dynamodb.injected.missing(&dynamodb_faults).is_empty(), "{report}");
    assert!(sqs.injected.missing(&sqs_faults).is_empty(), "{report}");
    assert_eq!(by_key.len(), 150, "every key ran: {report}");
    let twice: Vec<_> = by_key.iter().filter(|(_, count)| **count > 1).collect();
    assert!(twice.is_empty(), "keys whose handler ran twice: {twice:?}\n{report}");
    // The pollers' own accounts agree: every received message has one outcome, every key a success.
    let outcomes = total("processed") + total("duplicates") + total("failed") + total("dead_lettered");
    assert_eq!(total("received"), outcomes, "{report}");
    // Two copies of a key in one batch share its run and are both `processed`: count keys, not records.
    assert_eq!(logged_keys(dir.path(), r#"outcome="processed""#).len(), 150, "every key processed: {report}");
    assert!(total("delete_failed") > 0 && total("duplicates") > 50, "failed deletes came back as duplicates: {report}");
}
