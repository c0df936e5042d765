//! Exactly once for DynamoDB side effects, proved on the bundled `ledger`
//! handler (`handlers/ledger.rs`): its credits and debits are staged and
//! commit in one transaction with their claims' completions, and its
//! notices leave through the outbox. It stages every effect, so its runs
//! take no claim first and their commits race (`SQS_ONCE_CLAIM=auto`);
//! the drains and the takeover run claiming first (`always`) too. Against
//! DynamoDB Local and the SQS server:
//!
//! - `sqs-once invoke` processes get every pending entry twice per round
//!   until each was reported successful once, then a copy of each after
//!   every lease has ended: without faults, and behind proxies that lose
//!   answers, reset connections, throttle, fail and delay DynamoDB's and
//!   SQS's answers (`SQS_ONCE_FAULTS_KEYS`, `_RATE` and `_SEEDS` make them
//!   heavier, as `bench/soak` does);
//! - a process killed after its handlers returned, while their commits were
//!   on their way: the commits never land, land before the copies come, or
//!   land after the copies took the keys over;
//! - a notice queue that does not exist: the notices wait in the outbox,
//!   and `sqs-once claims outbox --send` sends them once it does.
//!
//! Every time: each account's balance is the sum of its distinct entries,
//! exactly (overdrafts refused), every entry's notice is sent under one
//! outbox id, and none is lost. Each drain prints a `ledger-report` line.

mod common;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant},
};

use common::{
    faults::{DYNAMODB, FaultMix, FaultProxy, SQS},
    function::Function,
    rounds::{Rounds, record, seeds, setting},
    sqs::Queue,
};
use serde_json::{Value, json};
use sqs_once::{
    store::{ClaimQuery, ClaimStatus, ClaimStore, DynamoDbStore},
    transaction::OUTBOX_ID_ATTRIBUTE,
};

/// An overdraft: no account can cover it.
const OVERDRAFT: i64 = -1_000_000_000;

/// How long after an `invoke --timeout 4` process started the claims it took
/// stop holding: its deadline plus the default lease margin, and a second more.
const PAST_THE_LEASE: Duration = Duration::from_secs(4 + 2 + 1);

/// The ledger's world: the claim table, the balances, the queue its notices
/// go to, and the dead-letter queue its overdrafts go to.
struct World {
    claims: DynamoDbStore,
    balances: String,
    notices: Queue,
    dead_letters: Queue,
    /// `SQS_ONCE_CLAIM`: the ledger stages every effect, so its runs take no
    /// claim (`auto`) unless told to claim first (`always`).
    claim: &'static str,
    /// Whether the ledger notices its entries (`SQS_ONCE_LEDGER_NOTIFY_URL`):
    /// without, each credit keeps its key in its account's item.
    notifying: bool,
}

impl World {
    async fn new() -> Self {
        Self::claiming("auto").await
    }

    /// A world whose consumers claim as `claim` (`SQS_ONCE_CLAIM`) says.
    async fn claiming(claim: &'static str) -> Self {
        let claims = common::fresh_table().await;
        let (notices, dead_letters) = (Queue::create(false, 30).await, Queue::create(false, 30).await);
        Self { claims, balances: common::dynamodb::items_table().await, notices, dead_letters, claim, notifying: true }
    }

    /// A world whose ledger sends no notice, claiming as `claim` says: its
    /// credits keep their keys in the accounts.
    async fn without_notices(claim: &'static str) -> Self {
        Self { notifying: false, ..Self::claiming(claim).await }
    }

    /// The settings of a ledger consumer whose DynamoDB and SQS requests go
    /// to `dynamodb` and `sqs`.
    fn envs(&self, dynamodb: &str, sqs: &str) -> Vec<(&'static str, String)> {
        let notify = if self.notifying { self.notices.url().to_owned() } else { String::new() };
        vec![
            ("SQS_ONCE_HANDLER", "ledger".into()),
            ("SQS_ONCE_LEDGER_TABLE", self.balances.clone()),
            ("SQS_ONCE_LEDGER_NOTIFY_URL", notify),
            ("SQS_ONCE_TABLE", self.claims.layout().table.clone()),
            ("AWS_ENDPOINT_URL_DYNAMODB", dynamodb.into()),
            ("AWS_ENDPOINT_URL_SQS", sqs.into()),
            ("SQS_ONCE_DLQ_URL", self.dead_letters.url().to_owned()),
            ("SQS_ONCE_CLAIM", self.claim.to_owned()),
        ]
    }

    fn direct(&self) -> Vec<(&'static str, String)> {
        self.envs(&common::dynamodb::endpoint(), &common::sqs::endpoint())
    }

    /// Sends what the outbox still holds (`sqs-once claims outbox --send`),
    /// waiting for entries still leased to a sender that is gone; returns how
    /// many entries there were at first.
    fn flush_outbox(&self) -> usize {
        let mut first = None;
        let started = Instant::now();
        loop {
            let listed = claims_outbox(&self.direct(), &["--send", "--json"]);
            let left = listed.as_array().unwrap().len();
            first.get_or_insert(left);
            if left == 0 {
                return first.unwrap_or(0);
            }
            assert!(started.elapsed() < Duration::from_secs(40), "the outbox keeps {left} entries: {listed}");
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    /// The balance of `account`, if it was ever credited.
    async fn balance(&self, account: &str) -> Option<i64> {
        common::dynamodb::item(&self.balances, account).await.map(|item| item["balance"].as_i64().unwrap())
    }

    /// Every notice the queue received: the entry's message id, and the
    /// outbox id it carried.
    async fn notices(&self) -> Vec<(String, String)> {
        let received = self.notices.drain().await;
        received
            .iter()
            .map(|message| {
                let notice: Value = serde_json::from_str(message.body().unwrap()).unwrap();
                let attributes = message.message_attributes().unwrap();
                let outbox_id = attributes[OUTBOX_ID_ATTRIBUTE].string_value().unwrap().to_owned();
                (notice["message_id"].as_str().unwrap().to_owned(), outbox_id)
            })
            .collect()
    }

    /// Checks the ledger after `entries` were drained: every balance exact,
    /// every entry but the overdrafts noticed under one outbox id, nothing
    /// left in the outbox. Returns the figures.
    async fn check(&self, entries: &BTreeMap<String, String>) -> Value {
        let left_in_outbox = self.flush_outbox();
        let mut expected: BTreeMap<String, i64> = BTreeMap::new();
        for body in entries.values() {
            let entry: Value = serde_json::from_str(body).unwrap();
            if entry["amount"].as_i64().unwrap() != OVERDRAFT {
                *expected.entry(entry["account"].as_str().unwrap().to_owned()).or_default() +=
                    entry["amount"].as_i64().unwrap();
            }
        }
        let mut off_by = 0;
        for (account, balance) in &expected {
            off_by += (self.balance(account).await.unwrap_or(0) - balance).abs();
        }
        let notices = self.notices().await;
        let mut outbox_ids: HashMap<String, BTreeSet<String>> = HashMap::new();
        for (message_id, outbox_id) in &notices {
            outbox_ids.entry(message_id.clone()).or_default().insert(outbox_id.clone());
        }
        let overdrafts: BTreeSet<&String> =
            entries.iter().filter(|(_, body)| body.contains(&OVERDRAFT.to_string())).map(|(id, _)| id).collect();
        let dead_lettered: BTreeSet<String> = self
            .dead_letters
            .drain()
            .await
            .iter()
            .map(|message| {
                message.message_attributes().unwrap()["SqsOnce.MessageId"].string_value().unwrap().to_owned()
            })
            .collect();
        let noticed = |id: &&String| !self.notifying || outbox_ids.contains_key(*id);
        let lost: Vec<&String> = entries.keys().filter(|id| !overdrafts.contains(id) && !noticed(id)).collect();
        let distinct: usize = outbox_ids.values().map(BTreeSet::len).sum();
        let report = json!({
            "accounts": expected.len(), "balances_off_by": off_by, "notices_received": notices.len(),
            "notices_distinct": distinct, "notices_duplicated": notices.len() - distinct,
            "notices_lost": lost.len(), "left_in_outbox_at_the_end": left_in_outbox,
            "overdrafts": overdrafts.len(), "overdrafts_dead_lettered": dead_lettered.len(),
        });
        assert!(overdrafts.iter().all(|id| dead_lettered.contains(*id)), "overdrafts not dead-lettered: {report}");
        assert_eq!(off_by, 0, "balances off: {report}");
        assert!(lost.is_empty(), "entries never noticed: {lost:?}\n{report}");
        assert!(overdrafts.iter().all(|id| !outbox_ids.contains_key(*id)), "an overdraft was noticed: {report}");
        let twice: Vec<_> = outbox_ids.iter().filter(|(_, ids)| ids.len() > 1).collect();
        assert!(twice.is_empty(), "entries committed by two runs: {twice:?}\n{report}");
        report
    }
}

/// `sqs-once claims outbox ARGS` with `envs`, its JSON listing.
fn claims_outbox(envs: &[(&str, String)], args: &[&str]) -> Value {
    let mut command = common::sqs_once_command();
    let output = command
        .args(["claims", "outbox"])
        .args(args)
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env_remove("SQS_ONCE_STORE")
        .envs(envs.iter().map(|(name, value)| (*name, value.as_str())))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "claims outbox failed: {stderr}");
    serde_json::from_slice(&output.stdout).unwrap_or_else(|_| panic!("not JSON: {stderr}"))
}

/// `sqs-once invoke --timeout TIMEOUT EVENT` with `envs`, left running, its output dropped: a process to kill.
fn invoke_in_background(event: &std::path::Path, timeout: &str, envs: &[(&str, String)]) -> tokio::process::Child {
    tokio::process::Command::from(common::sqs_once_command())
        .args(["invoke", "--timeout", timeout])
        .arg(event)
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env_remove("SQS_ONCE_STORE")
        .envs(envs.iter().map(|(name, value)| (*name, value.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// `keys` ledger entries over seven accounts; every 25th an overdraft.
fn entries(keys: usize, seed: u64) -> BTreeMap<String, String> {
    (0..keys)
        .map(|n| {
            let amount = if n % 25 == 7 { OVERDRAFT } else { (n % 50) as i64 + 1 };
            let body = json!({ "account": format!("acct-{seed}-{}", n % 7), "amount": amount });
            (format!("m-{seed}-{n:05}"), body.to_string())
        })
        .collect()
}

/// Drains `keys` entries by rounds of `invoke` processes, behind proxies
/// injecting `dynamodb` faults into every DynamoDB request and `sqs` faults
/// into the notices sent, then, once every lease has ended, a copy of each
/// again; checks the ledger and returns the figures.
async fn drain(keys: usize, dynamodb: FaultMix, sqs: FaultMix, seed: u64, claim: &'static str) -> Value {
    drain_in(World::claiming(claim).await, keys, dynamodb, sqs, seed).await
}

/// [`drain`] in `world`.
async fn drain_in(world: World, keys: usize, dynamodb: FaultMix, sqs: FaultMix, seed: u64) -> Value {
    let claim = world.claim;
    let dynamodb_proxy = FaultProxy::start(&common::dynamodb::endpoint(), DYNAMODB, dynamodb, &[], seed).await;
    let sqs_proxy = FaultProxy::start(&common::sqs::endpoint(), SQS, sqs, &["SendMessage"], seed).await;
    let envs = world.envs(&dynamodb_proxy.url, &sqs_proxy.url);
    let envs: Vec<(&str, &str)> = envs.iter().map(|(name, value)| (*name, value.as_str())).collect();
    let dir = tempfile::tempdir().unwrap();
    let messages = entries(keys, seed);
    let mut shuffle = fastrand::Rng::with_seed(seed);
    let mut rounds = Rounds::default();
    let started = Instant::now();
    let mut pending = messages.clone();
    rounds.drain(dir.path(), &mut pending, &mut shuffle, &envs).await;
    let rounds_before_copies = rounds.rounds;
    tokio::time::sleep(PAST_THE_LEASE).await;
    let mut copies = messages.clone();
    rounds.drain(dir.path(), &mut copies, &mut shuffle, &envs).await;
    assert!(pending.is_empty() && copies.is_empty(), "entries never reported successful: {pending:?} {copies:?}");
    let checked = world.check(&messages).await;
    let sum = |metric: &str| rounds.sum(metric);
    let report = json!({
        "keys": keys, "claim": claim, "dynamodb_faults": FaultMix::rate(&dynamodb), "sqs_faults": FaultMix::rate(&sqs), "seed": seed,
        "rounds": rounds.rounds, "rounds_before_copies": rounds_before_copies, "deliveries": rounds.deliveries,
        "seconds": started.elapsed().as_secs(),
        "processed": sum("Processed"), "duplicates": sum("Duplicates"), "uncommitted": sum("FailedUncommitted"),
        "lease_lost": sum("FailedLeaseLost"), "permanent": sum("FailedPermanent"), "deadline": sum("FailedDeadline"),
        "store_error": sum("FailedStoreError"), "conflicts": sum("Conflicts"),
        "commits_landed_later": sum("CompletionsLandedLater"), "outbox_sent": sum("OutboxSent"),
        "outbox_failed": sum("OutboxFailed"), "checked": checked,
        "dynamodb_injected": dynamodb_proxy.injected.report(), "sqs_injected": sqs_proxy.injected.report(),
    });
    println!("ledger-report {report}");
    assert!(dynamodb_proxy.injected.missing(&dynamodb).is_empty(), "DynamoDB faults never injected: {report}");
    assert!(sqs_proxy.injected.missing(&sqs).is_empty(), "SQS faults never injected: {report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_applies_once_under_duplicate_deliveries() {
    for claim in ["auto", "always"] {
        let report = drain(120, FaultMix::default(), FaultMix::default(), 3, claim).await;
        // Each entry is delivered to two processes at once, and again after it succeeded. The balances are exact
        // and no notice is lost (`drain` checks), and none goes twice. How many rounds that takes is not asserted:
        // on a machine busy with other tests a copy's transaction can outlast its 2 s attempt, or an overdraft's
        // move to the dead-letter queue its 4 s invocation (both seen in CI: 119 copies `uncommitted`), and the
        // entry comes back, a duplicate then.
        assert_eq!(report["checked"]["notices_duplicated"], 0, "{report}");
    }
}

/// Drains entries on a faulty network, its consumers claiming as `claim` says.
async fn faulty_network(claim: &'static str) {
    for seed in seeds() {
        let rate = setting("SQS_ONCE_FAULTS_RATE", 0.18);
        let keys = setting("SQS_ONCE_FAULTS_KEYS", 150);
        // Notices sent with lost answers, resets, errors, throttling and slow answers: some are sent twice.
        let sqs = FaultMix { statement_error: 0.0, ..FaultMix::spread(rate) };
        drain(keys, FaultMix::spread(rate), sqs, seed, claim).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_applies_once_on_a_faulty_network() {
    // The ledger stages every effect: its runs take no claim, and their commits race.
    faulty_network("auto").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_applies_once_on_a_faulty_network_when_runs_claim_first() {
    faulty_network("always").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_credit_kept_in_its_account_applies_once_on_a_faulty_network() {
    // Without a notice queue, each credit's one update keeps its key in its account: one conditional write, no
    // transaction; claiming first or not. Lost answers, resets, errors, throttling and late answers come between.
    for claim in ["auto", "always"] {
        for seed in seeds() {
            let rate = setting("SQS_ONCE_FAULTS_RATE", 0.18);
            let keys = setting("SQS_ONCE_FAULTS_KEYS", 150);
            let world = World::without_notices(claim).await;
            let (claims, balances) = (world.claims.clone(), world.balances.clone());
            let report = drain_in(world, keys, FaultMix::spread(rate), FaultMix::default(), seed).await;
            // Every account keeps the keys of its credits; without a claim, none was written but for overdrafts.
            let account = common::dynamodb::item(&balances, &format!("acct-{seed}-1")).await.unwrap();
            assert!(account["sqs_once_keys"].as_array().is_some_and(|keys| !keys.is_empty()), "{account}");
            let completed = ClaimQuery { status: Some(ClaimStatus::Completed), limit: 10_000, ..ClaimQuery::default() };
            let completed = Arc::new(claims).capabilities().admin.unwrap().list(&completed).await.unwrap().claims.len();
            match claim {
                "auto" => assert_eq!(completed, 0, "a credit without a claim writes none: {report}"),
                _ => assert!(completed > 0, "a run that claimed first completes its claim: {report}"),
            }
        }
    }
}

/// Delivers `pending` entries to `function` as SQS delivers them to an
/// environment serving four invocations at once: each round, every entry
/// in two of four invocations sent together (receive count `round`), until
/// each was reported successful once. Returns the rounds it took.
async fn drain_at_once(function: &Function, pending: &mut BTreeMap<String, String>, round: &mut u32) {
    let first = *round;
    while !pending.is_empty() {
        *round += 1;
        assert!(*round <= first + 40, "entries never reported successful: {pending:?}\n{}", function.output());
        let events: Vec<Vec<Value>> = (0..4)
            .map(|invocation| {
                let entries = pending.iter().enumerate().filter(|(n, _)| (n + invocation) % 4 < 2);
                entries.map(|(_, (id, body))| record(id, body, *round)).collect()
            })
            .collect();
        let answers = futures::future::join_all(events.iter().map(|records| {
            // The deadline of a 6 s function timeout, as each invocation starts.
            invoke(function, records, Duration::from_secs(6))
        }))
        .await;
        for (records, failed) in events.iter().zip(answers) {
            for id in records.iter().filter_map(|record| record["messageId"].as_str()) {
                if !failed.contains(id) {
                    pending.remove(id);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The ledger as Lambda Managed Instances runs it (four invocations at once
/// in one environment, `AWS_LAMBDA_MAX_CONCURRENCY`), claiming as `claim`
/// says, behind proxies that lose, reset, throttle, fail and delay
/// DynamoDB's and SQS's answers: the entries drained, then a copy of each
/// after every lease; balances exact, every notice sent.
async fn at_once_on_a_faulty_network(claim: &'static str) {
    let world = World::claiming(claim).await;
    let seed = 13;
    let rate = setting("SQS_ONCE_FAULTS_RATE", 0.18);
    let dynamodb = FaultProxy::start(&common::dynamodb::endpoint(), DYNAMODB, FaultMix::spread(rate), &[], seed).await;
    let sqs_faults = FaultMix { statement_error: 0.0, ..FaultMix::spread(rate) };
    let sqs = FaultProxy::start(&common::sqs::endpoint(), SQS, sqs_faults, &["SendMessage"], seed).await;
    let mut envs = world.envs(&dynamodb.url, &sqs.url);
    envs.push(("AWS_LAMBDA_MAX_CONCURRENCY", "4".to_owned()));
    let function = Function::spawn(&envs).await;
    let messages = entries(setting("SQS_ONCE_FAULTS_KEYS", 80), seed);
    let (mut pending, mut round) = (messages.clone(), 0);
    drain_at_once(&function, &mut pending, &mut round).await;
    tokio::time::sleep(Duration::from_secs(6 + 2 + 1)).await;
    let mut copies = messages.clone();
    drain_at_once(&function, &mut copies, &mut round).await;
    let checked = world.check(&messages).await;
    println!(
        "ledger-report {}",
        json!({ "case": "invocations at once", "claim": claim, "rounds": round,
        "dynamodb_injected": dynamodb.injected.report(), "checked": checked })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_applies_once_with_invocations_at_once_on_a_faulty_network() {
    at_once_on_a_faulty_network("auto").await;
    at_once_on_a_faulty_network("always").await;
}

/// What becomes of commits held by DynamoDB when their process is killed.
#[derive(Debug, Clone, Copy)]
enum Held {
    /// They never arrive (the connections die with the process).
    Lost,
    /// They apply 1.5 s later, before the lease ends and the copies come.
    LandBeforeCopies,
    /// They apply 12 s later, after the copies took the keys over.
    LandAfterTakeover,
}

async fn killed_between_return_and_commit(held: Held, claim: &'static str) {
    let world = World::claiming(claim).await;
    let hold = match held {
        Held::LandAfterTakeover => Duration::from_secs(12),
        _ => Duration::from_millis(1500),
    };
    let proxy = FaultProxy::holding_finishing_writes(hold).await;
    let dir = tempfile::tempdir().unwrap();
    // Seven entries, one per account, no overdraft.
    let messages = entries(7, 11);
    let event = |receive_count: u32| {
        let records: Vec<Value> = messages.iter().map(|(id, body)| record(id, body, receive_count)).collect();
        json!({ "Records": records }).to_string()
    };
    let path = dir.path().join("first.json");
    std::fs::write(&path, event(1)).unwrap();
    let envs = world.envs(&proxy.url, &common::sqs::endpoint());
    let mut process = invoke_in_background(&path, "4", &envs);
    let started = Instant::now();
    // Every handler has returned once its commit is on its way: then the process dies.
    while proxy.injected.of("TransactWriteItems") < messages.len() as u64 {
        assert!(started.elapsed() < Duration::from_secs(20), "the commits never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The process's deadline came before this moment plus its 4 s timeout, and its leases end 2 s after.
    let seen = Instant::now();
    process.start_kill().unwrap();
    process.wait().await.unwrap();
    if let Held::Lost = held {
        proxy.freeze();
    }
    tokio::time::sleep(PAST_THE_LEASE.saturating_sub(seen.elapsed())).await;
    let copies = dir.path().join("copies.json");
    std::fs::write(&copies, event(2)).unwrap();
    let direct = world.direct();
    let direct: Vec<(&str, &str)> = direct.iter().map(|(name, value)| (*name, value.as_str())).collect();
    let answer = common::rounds::invoke(dir.path(), &copies, &direct).await;
    assert!(answer.failed.is_empty(), "{held:?}: copies failed: {:?}", answer.failed);
    let (processed, duplicates) = (answer.metrics["Processed"].as_u64(), answer.metrics["Duplicates"].as_u64());
    match held {
        Held::LandBeforeCopies => assert_eq!(duplicates, Some(7), "{held:?}: the commits had landed"),
        _ => assert_eq!(processed, Some(7), "{held:?}: the copies took the keys over"),
    }
    if let Held::LandAfterTakeover = held {
        // The held commits arrive now, and their claims' tokens refuse them.
        tokio::time::sleep(hold.saturating_sub(seen.elapsed()) + Duration::from_secs(1)).await;
    }
    let report = world.check(&messages).await;
    println!("ledger-report {}", json!({ "case": format!("{held:?}"), "claim": claim, "checked": report }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_before_its_commits_landed_leaves_them_to_the_copies() {
    killed_between_return_and_commit(Held::Lost, "auto").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_that_land_after_their_process_died_make_the_copies_duplicates() {
    killed_between_return_and_commit(Held::LandBeforeCopies, "auto").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_that_land_after_a_takeover_are_refused_by_the_claims_token() {
    killed_between_return_and_commit(Held::LandAfterTakeover, "always").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_without_a_claim_that_land_after_the_copies_committed_are_refused_by_the_completion() {
    killed_between_return_and_commit(Held::LandAfterTakeover, "auto").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_to_a_queue_that_does_not_exist_wait_in_the_outbox() {
    let world = World::new().await;
    let missing = format!("{}-later", world.notices.url());
    let dir = tempfile::tempdir().unwrap();
    let mut envs = world.direct();
    envs.retain(|(name, _)| *name != "SQS_ONCE_LEDGER_NOTIFY_URL");
    envs.push(("SQS_ONCE_LEDGER_NOTIFY_URL", missing.clone()));
    let path = dir.path().join("event.json");
    let records = [record("m-q-1", r#"{"account": "q", "amount": 5}"#, 1)];
    std::fs::write(&path, json!({ "Records": records }).to_string()).unwrap();
    let borrowed: Vec<(&str, &str)> = envs.iter().map(|(name, value)| (*name, value.as_str())).collect();
    let answer = common::rounds::invoke(dir.path(), &path, &borrowed).await;
    assert!(answer.failed.is_empty(), "the credit committed: the refused notice does not fail it");
    assert_eq!((answer.metrics["OutboxSent"].as_u64(), answer.metrics["OutboxFailed"].as_u64()), (Some(0), Some(1)));
    let log = std::fs::read_to_string(path.with_extension("log")).unwrap();
    assert!(log.contains("OutboxFailed") && log.contains("NonExistentQueue"), "{log}");
    assert_eq!(world.balance("q").await, Some(5));
    let listed = claims_outbox(&envs, &["--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["message_id"], "m-q-1");
    // The queue is created; once the entry's sending lease has ended, the next sweep sends it.
    let name = missing.rsplit('/').next().unwrap();
    world.notices.client.create_queue().queue_name(name).send().await.unwrap();
    let later = Queue::existing(&missing).await;
    // The sending lease is 15 s (docs/transactions.md).
    tokio::time::sleep(Duration::from_secs(15 + 1)).await;
    assert!(claims_outbox(&envs, &["--send", "--json"]).as_array().unwrap().is_empty(), "sent and deleted");
    let received = later.drain().await;
    assert_eq!(received.len(), 1);
    let notice: Value = serde_json::from_str(received[0].body().unwrap()).unwrap();
    assert_eq!(notice, json!({ "account": "q", "amount": 5, "message_id": "m-q-1" }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_queue_that_takes_three_seconds_a_request_gets_each_notice_once() {
    // Past the SDK's 2 s attempt: a send cut off by an attempt's timeout had landed, and each retry landed again.
    let world = World::new().await;
    let slow = common::delay::DelayProxy::slow_service(&common::sqs::endpoint(), Duration::from_secs(3)).await.unwrap();
    let mut envs = world.direct();
    envs.retain(|(name, _)| *name != "AWS_ENDPOINT_URL_SQS");
    envs.push(("AWS_ENDPOINT_URL_SQS", slow.url.clone()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("event.json");
    let records: Vec<Value> =
        (1..=3).map(|n| record(&format!("m-s-{n}"), &format!(r#"{{"account": "s-{n}", "amount": {n}}}"#), 1)).collect();
    std::fs::write(&path, json!({ "Records": records }).to_string()).unwrap();
    // A deadline with room for the sends: a send starts only when it can end before the answer.
    let started = Instant::now();
    let output = tokio::process::Command::from(common::sqs_once_command())
        .args(["invoke", "--timeout", "30", "--metrics"])
        .arg(&path)
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env_remove("SQS_ONCE_STORE")
        .envs(envs.iter().map(|(name, value)| (*name, value.as_str())))
        .output()
        .await
        .unwrap();
    let (failed, metrics) = common::invoke_answer(&output);
    assert!(failed.is_empty(), "{failed:?}");
    assert!(started.elapsed() >= Duration::from_secs(3), "the runs' sends answered first");
    assert_eq!((metrics["OutboxSent"].as_u64(), metrics["OutboxFailed"].as_u64()), (Some(3), Some(0)));
    // Every copy a retry could have sent has landed by now.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut noticed: Vec<String> = world.notices().await.into_iter().map(|(message_id, _)| message_id).collect();
    noticed.sort();
    assert_eq!(noticed, ["m-s-1", "m-s-2", "m-s-3"], "each notice once");
    assert!(claims_outbox(&world.direct(), &["--json"]).as_array().unwrap().is_empty(), "sent and deleted");
}

/// Invokes the ledger function with `records`, due `timeout` from now; the
/// message ids it reported failed.
async fn invoke(function: &Function, records: &[Value], timeout: Duration) -> BTreeSet<String> {
    function.failed(&json!({ "Records": records }), timeout).await.into_iter().collect()
}

fn records(messages: &BTreeMap<String, String>, receive_count: u32) -> Vec<Value> {
    messages.iter().map(|(id, body)| record(id, body, receive_count)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_answered_after_the_next_invocation_started_apply_once_and_notify_once() {
    let world = World::new().await;
    // DynamoDB holds each commit 1.8 s: past the first invocation's 1.5 s deadline, within the SDK's 2 s
    // attempt timeout, so that its answer comes during the next invocation.
    let proxy = FaultProxy::holding_finishing_writes(Duration::from_millis(1800)).await;
    let function = Function::spawn(&world.envs(&proxy.url, &common::sqs::endpoint())).await;
    let (first, second): (BTreeMap<_, _>, BTreeMap<_, _>) = entries(14, 21)
        .into_iter()
        .filter(|(_, body)| !body.contains(&OVERDRAFT.to_string()))
        .partition(|(id, _)| id.ends_with(['0', '2', '4', '6', '8']));
    let failed = invoke(&function, &records(&first, 1), Duration::from_millis(1500)).await;
    assert_eq!(failed, first.keys().cloned().collect(), "uncommitted when the answer was due");
    // The next invocation starts while every commit of the first still waits for its answer.
    let failed = invoke(&function, &records(&second, 1), Duration::from_secs(12)).await;
    assert!(failed.is_empty(), "{failed:?}\n{}", function.output());
    // After the first invocation's leases (its deadline and 2 s), SQS delivers its records again: the commits
    // had landed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.hold_finishing(Duration::ZERO);
    assert!(invoke(&function, &records(&first, 2), Duration::from_secs(12)).await.is_empty());
    let all: BTreeMap<String, String> = first.into_iter().chain(second).collect();
    let report = world.check(&all).await;
    println!("ledger-report {}", json!({ "case": "answered after the next invocation", "checked": report }));
    assert_eq!(report["notices_duplicated"], 0, "a commit was sent again while its answer was on its way: {report}");
    assert_eq!(report["left_in_outbox_at_the_end"], 0, "every notice was sent by its own run: {report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncommitted_record_back_after_its_key_memory_finds_its_commit() {
    let world = World::new().await;
    // Keys remembered 1 s; the queue's visibility timeout 120 s (long enough a memory for runs to take no
    // claim), so the record may be back 120 s after its answer, or after a back-off of 2 s at most (and its
    // jitter).
    let proxy = FaultProxy::holding_finishing_writes(Duration::from_millis(1800)).await;
    let mut envs = world.envs(&proxy.url, &common::sqs::endpoint());
    envs.extend([
        ("SQS_ONCE_EXPIRES_AFTER_SECS", "1".to_owned()),
        ("SQS_ONCE_VISIBILITY_TIMEOUT_SECS", "120".to_owned()),
        ("SQS_ONCE_RETRY_BASE_SECS", "1".to_owned()),
        ("SQS_ONCE_RETRY_MAX_SECS", "2".to_owned()),
    ]);
    let function = Function::spawn(&envs).await;
    let credits: BTreeMap<String, String> =
        entries(8, 59).into_iter().filter(|(_, body)| !body.contains(&OVERDRAFT.to_string())).collect();
    // DynamoDB holds each commit past the 1.5 s deadline: every credit is reported uncommitted, and lands.
    let failed = invoke(&function, &records(&credits, 1), Duration::from_millis(1500)).await;
    assert_eq!(failed, credits.keys().cloned().collect(), "uncommitted when the answer was due");
    proxy.hold_finishing(Duration::ZERO);
    // Back 6 s later: past the key memory, within the queue's timeout. Each finds its commit landed.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let again = invoke(&function, &records(&credits, 2), Duration::from_secs(12)).await;
    assert!(again.is_empty(), "{again:?}\n{}", function.output());
    let report = world.check(&credits).await;
    println!("ledger-report {}", json!({ "case": "back after the key memory", "checked": report }));
    assert_eq!(report["notices_duplicated"], 0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_of_a_process_killed_after_its_commits_are_sent_by_runs_that_stage_nothing() {
    let world = World::new().await;
    // A notice queue endpoint that takes connections and never answers: the sends hang.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((connection, _)) = silent.accept().await {
            held.push(connection);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let messages: BTreeMap<String, String> =
        entries(7, 31).into_iter().filter(|(_, body)| !body.contains(&OVERDRAFT.to_string())).collect();
    let path = dir.path().join("commits.json");
    std::fs::write(&path, json!({ "Records": records(&messages, 1) }).to_string()).unwrap();
    let envs = world.envs(&common::dynamodb::endpoint(), &silent_url);
    let mut process = invoke_in_background(&path, "20", &envs);
    // Every commit has applied (the balances say so) while the notices hang: then the process dies.
    let started = Instant::now();
    while claims_outbox(&world.direct(), &["--json"]).as_array().unwrap().len() < messages.len() {
        assert!(started.elapsed() < Duration::from_secs(20), "the commits never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    process.start_kill().unwrap();
    process.wait().await.unwrap();
    // A function whose handler stages nothing, on the same claim table, sweeping every second.
    let mut envs = world.direct();
    envs.retain(|(name, _)| *name != "SQS_ONCE_HANDLER");
    envs.extend([("SQS_ONCE_HANDLER", "demo".to_owned()), ("SQS_ONCE_OUTBOX_SWEEP_SECS", "1".to_owned())]);
    let function = Function::spawn(&envs).await;
    let mut received = Vec::new();
    // The dead sender's leases end 15 s after it took them; a machine busy with other tests takes longer.
    for n in 0.. {
        assert!(n < 120, "the notices were never sent: {received:?}");
        let quiet = record(&format!("quiet-{n}"), "{}", 1);
        assert!(invoke(&function, &[quiet], Duration::from_secs(10)).await.is_empty());
        received.extend(world.notices().await);
        if received.len() >= messages.len() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let noticed: BTreeSet<&String> = received.iter().map(|(message_id, _)| message_id).collect();
    assert_eq!(noticed, messages.keys().collect(), "every entry noticed");
    assert_eq!(received.len(), messages.len(), "each once: its sender died before sending it");
    assert!(claims_outbox(&world.direct(), &["--json"]).as_array().unwrap().is_empty(), "the outbox emptied itself");
    for (id, body) in &messages {
        let entry: Value = serde_json::from_str(body).unwrap();
        let account = entry["account"].as_str().unwrap();
        assert_eq!(world.balance(account).await, entry["amount"].as_i64(), "{id}");
    }
}

/// The ledger's entries of `seed`, overdrafts left out: every one commits.
fn credits(keys: usize, seed: u64) -> BTreeMap<String, String> {
    entries(keys, seed).into_iter().filter(|(_, body)| !body.contains(&OVERDRAFT.to_string())).collect()
}

/// The worlds of every way the ledger commits: the key kept in the account
/// (no notice), or a transaction with its notice; claiming first or not.
async fn every_way_of_committing() -> Vec<World> {
    let mut worlds = Vec::new();
    for claim in ["auto", "always"] {
        worlds.push(World::without_notices(claim).await);
        worlds.push(World::claiming(claim).await);
    }
    worlds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_remembered_half_a_minute_still_commit_every_way() {
    // `invoke` of an event file: no queue, so nothing but SQS_ONCE_EXPIRES_AFTER_SECS says how long keys are
    // remembered. Half a minute is less than a commit needs to be sent, land and be answered; each commit's key is
    // remembered that long anyway, and every credit applies at its first delivery, once.
    for (n, world) in every_way_of_committing().await.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let credits = credits(8, 40 + n as u64);
        let path = dir.path().join("credits.json");
        std::fs::write(&path, json!({ "Records": records(&credits, 1) }).to_string()).unwrap();
        let mut envs = world.direct();
        // No dead-letter queue either: `invoke` then sends nothing to SQS (`--sqs`), and knows no queue.
        envs.retain(|(name, _)| *name != "SQS_ONCE_DLQ_URL");
        envs.push(("SQS_ONCE_EXPIRES_AFTER_SECS", "30".to_owned()));
        let envs: Vec<(&str, &str)> = envs.iter().map(|(name, value)| (*name, value.as_str())).collect();
        for delivery in ["first", "again"] {
            let answer = common::rounds::invoke(dir.path(), &path, &envs).await;
            let log = std::fs::read_to_string(path.with_extension("log")).unwrap();
            let (claim, notifying) = (world.claim, world.notifying);
            assert!(answer.failed.is_empty(), "{claim}, notices {notifying}, {delivery}: {:?}\n{log}", answer.failed);
        }
        let report = world.check(&credits).await;
        println!(
            "ledger-report {}",
            json!({ "case": "keys remembered 30 s", "claim": world.claim, "checked": report })
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poller_of_a_queue_with_a_short_visibility_timeout_commits_every_way() {
    // A visibility timeout of 20 s, retries backed off 5 s at most, keys remembered 30 s: the longest a failed
    // record stays away is 20 s, and keys are remembered past it, but not as long as a commit needs.
    for world in every_way_of_committing().await {
        let queue = Queue::create(false, 20).await;
        let credits = credits(20, 47);
        let bodies: Vec<Value> = credits.values().map(|body| serde_json::from_str(body).unwrap()).collect();
        queue.send(&bodies).await;
        let mut envs = world.direct();
        envs.extend([
            ("SQS_ONCE_EXPIRES_AFTER_SECS", "30".to_owned()),
            ("SQS_ONCE_RETRY_BASE_SECS", "1".to_owned()),
            ("SQS_ONCE_RETRY_MAX_SECS", "5".to_owned()),
        ]);
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut poller = tokio::process::Command::from(common::sqs_once_command())
            .args(["poll", "--queue-url", queue.url(), "--wait-secs", "1"])
            .env_remove("AWS_LAMBDA_RUNTIME_API")
            .env_remove("SQS_ONCE_STORE")
            .envs(envs.iter().map(|(name, value)| (*name, value.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let started = Instant::now();
        while queue.depth().await != (0, 0) {
            let logged = std::fs::read_to_string(log.path()).unwrap();
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{} left: {:?}\n{logged}",
                world.claim,
                queue.depth().await
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        poller.start_kill().unwrap();
        poller.wait().await.unwrap();
        let logged = std::fs::read_to_string(log.path()).unwrap();
        assert!(
            !logged.contains("record failed"),
            "{}, notices {}: a record failed\n{logged}",
            world.claim,
            world.notifying
        );
        // Sent once each, and the queue says nothing of message ids: the balances say each applied once.
        let ids: BTreeMap<String, String> = credits.clone();
        let mut expected: BTreeMap<String, i64> = BTreeMap::new();
        for body in ids.values() {
            let entry: Value = serde_json::from_str(body).unwrap();
            *expected.entry(entry["account"].as_str().unwrap().to_owned()).or_default() +=
                entry["amount"].as_i64().unwrap();
        }
        for (account, balance) in expected {
            assert_eq!(world.balance(&account).await, Some(balance), "{account}");
        }
    }
}
