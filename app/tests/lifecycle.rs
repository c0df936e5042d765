//! Lambda's lifecycle, through the Runtime API with the real `lambda_runtime`
//! loop: the function is frozen (SIGSTOP) as soon as it asks for its next
//! event after answering, while DynamoDB (a proxy in front of DynamoDB Local)
//! holds its finishing writes; the proxy then drops what it had not
//! forwarded, as a frozen environment's sockets deliver nothing. It is thawed
//! later, or never, or shut down (SIGTERM). After the lease, a second
//! environment gets a copy of every message, as SQS standard queues deliver
//! one now and then even after success.
//!
//! Twenty records per batch; their handlers return 500 ms before the
//! deadline margin (a 1.2 s margin, a 4 s deadline), and each finishing
//! write is held longer than that, but less than the margin
//! (`HELD_WITHIN_MARGIN`), or longer than the whole margin
//! (`HELD_PAST_MARGIN`). The figures each case prints (`lifecycle-report`)
//! are in bench/RESULTS.md.

mod common;

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use common::{
    faults::FaultProxy,
    runtime_api::{Answer, RuntimeApi},
};
use serde_json::{Value, json};
use tokio::{process::Child, time::Instant};

const DEADLINE: Duration = Duration::from_millis(4000);
const MARGIN_MS: u64 = 1200;
/// Handlers return 500 ms before the cut-off (their claims take some of it).
const HANDLER_MS: u64 = 4000 - MARGIN_MS - 500;
/// Lands 400 ms after the cut-off, 700 ms before the answer reserve.
const HELD_WITHIN_MARGIN: Duration = Duration::from_millis(900);
/// Longer than the margin: not confirmed when the answer is due.
const HELD_PAST_MARGIN: Duration = Duration::from_millis(2500);
const RECORDS: usize = 20;

/// One environment: a Runtime API and the function process it serves,
/// whose standard error goes to a file.
struct Environment {
    api: RuntimeApi,
    process: Child,
    stderr: std::path::PathBuf,
}

impl Environment {
    async fn start(table: &str, dynamodb: &str, batching: bool, lease_margin_ms: u64, log: &Path) -> Self {
        Self::with(table, dynamodb, batching, lease_margin_ms, log, &[]).await
    }

    /// [`start`](Self::start), with more settings (another handler).
    async fn with(
        table: &str,
        dynamodb: &str,
        batching: bool,
        lease_margin_ms: u64,
        log: &Path,
        more: &[(&str, String)],
    ) -> Self {
        let api = RuntimeApi::start().await;
        let mut envs = vec![
            ("SQS_ONCE_TABLE", table.to_owned()),
            ("AWS_ENDPOINT_URL_DYNAMODB", dynamodb.to_owned()),
            ("SQS_ONCE_DYNAMODB_BATCHING", batching.to_string()),
            ("SQS_ONCE_DEADLINE_MARGIN_MS", MARGIN_MS.to_string()),
            ("SQS_ONCE_LEASE_MARGIN_MS", lease_margin_ms.to_string()),
            ("SQS_ONCE_DEMO_LOG", log.display().to_string()),
            // No SQS step: nothing here fails, and the answer reserve is then 100 ms.
            ("SQS_ONCE_CONFLICT_BACKOFF", "false".to_owned()),
            ("SQS_ONCE_RETRY_BASE_SECS", "0".to_owned()),
            ("SQS_ONCE_LOCAL_CACHE", "0".to_owned()),
        ];
        envs.extend(more.iter().cloned());
        let mut process = api.spawn(common::sqs_once_command(), &envs);
        let stderr = log.with_extension(format!("{}.err", api.address.port()));
        let mut output = tokio::fs::File::create(&stderr).await.unwrap();
        let mut piped = process.stderr.take().unwrap();
        tokio::spawn(async move { tokio::io::copy(&mut piped, &mut output).await });
        let mut stdout = process.stdout.take().unwrap();
        tokio::spawn(async move { tokio::io::copy(&mut stdout, &mut tokio::io::sink()).await });
        api.initialized().await;
        Self { api, process, stderr }
    }

    /// What the function logged, for a failure's message.
    fn logs(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Sends `event` with the test deadline and returns the answer's failures.
    async fn invoke(&self, event: &Value) -> Vec<String> {
        let (answer, _, _) = self.api.invoke(event, DEADLINE).await.expect("the function answered");
        let Answer::Response(response) = answer else { panic!("invocation error: {answer:?}") };
        common::failed_ids(&response)
    }

    /// Freezes the process at its next request for an event, and the proxy's
    /// held writes with it.
    fn freeze_at_answer(&self, proxy: &FaultProxy) {
        let pid = self.process.id().unwrap();
        let freeze = proxy.freezer();
        self.api.at_next_request(move || {
            signal(pid, "-STOP");
            freeze();
        });
    }

    fn thaw(&self) {
        signal(self.process.id().unwrap(), "-CONT");
    }
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

fn event(prefix: &str, receive_count: u32, sleep_ms: u64) -> Value {
    let records: Vec<Value> = (0..RECORDS)
        .map(|n| {
            json!({
                "messageId": format!("{prefix}-{n:02}"), "receiptHandle": format!("rh-{n}-{receive_count}"),
                "body": json!({ "n": n, "sleep_ms": sleep_ms }).to_string(),
                "attributes": {"ApproximateReceiveCount": receive_count.to_string()}, "messageAttributes": {},
                "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:work",
            })
        })
        .collect();
    json!({ "Records": records })
}

/// How many times each message id's handler started.
fn runs(log: &Path) -> HashMap<String, usize> {
    let mut runs = HashMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        *runs.entry(line.split('\t').nth(1).unwrap().to_owned()).or_default() += 1;
    }
    runs
}

/// What the thawed (or never thawed) first environment does before the copies.
#[derive(Debug, Clone, Copy)]
enum AfterFreeze {
    /// Never thawed (reclaimed without notice).
    Never,
    /// Thawed after this long, with DynamoDB answering finishing writes
    /// `HELD_WITHIN_MARGIN` late again, and invoked once.
    ThawedAndInvoked(Duration),
    /// Thawed after this long with DynamoDB answering at once, and sent SIGTERM.
    ThawedAndStopped(Duration),
}

struct Case {
    name: &'static str,
    batching: bool,
    held: Duration,
    after: AfterFreeze,
    lease_margin_ms: u64,
}

/// Runs a case; returns how many keys ran again when their copies came after the lease.
async fn run_case(case: Case) -> usize {
    let store = common::fresh_table().await;
    let table = store.layout().table.clone();
    let proxy = FaultProxy::holding_finishing_writes(case.held).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("demo.log");
    let mut first = Environment::start(&table, &proxy.url, case.batching, case.lease_margin_ms, &log).await;
    first.freeze_at_answer(&proxy);
    let sent = Instant::now();
    let deadline_ms = u64::try_from((SystemTime::now() + DEADLINE).duration_since(UNIX_EPOCH).unwrap().as_millis());
    let failed = first.invoke(&event("m", 1, HANDLER_MS)).await;
    let answered_ms = sent.elapsed().as_millis();
    assert!(failed.is_empty(), "{}: handlers returned before the cut-off: {failed:?}\n{}", case.name, first.logs());
    match case.after {
        AfterFreeze::Never => {}
        AfterFreeze::ThawedAndInvoked(after) => {
            tokio::time::sleep(after).await;
            proxy.hold_finishing(HELD_WITHIN_MARGIN);
            first.thaw();
            let failed = first.invoke(&json!({ "Records": [] })).await;
            assert!(failed.is_empty());
        }
        AfterFreeze::ThawedAndStopped(after) => {
            // Lambda sends SIGTERM only to a function that registered an extension.
            let extensions: Vec<String> = first.api.extensions().into_iter().map(|extension| extension.name).collect();
            assert_eq!(extensions, ["sqs-once-shutdown"], "{}", case.name);
            tokio::time::sleep(after).await;
            proxy.hold_finishing(Duration::ZERO);
            first.thaw();
            let pid = first.process.id().unwrap();
            signal(pid, "-TERM");
            // With internal extensions only, Lambda kills the runtime 500 ms after SIGTERM.
            let Ok(status) = tokio::time::timeout(Duration::from_millis(500), first.process.wait()).await else {
                signal(pid, "-KILL");
                panic!("{}: still running 500 ms after SIGTERM, when Lambda kills it\n{}", case.name, first.logs());
            };
            assert!(status.unwrap().success(), "{}: exit status", case.name);
        }
    }
    // Copies after the lease, to another environment.
    let lease_end_ms = deadline_ms.unwrap() + case.lease_margin_ms + 200;
    let now_ms = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap();
    tokio::time::sleep(Duration::from_millis(lease_end_ms.saturating_sub(now_ms))).await;
    proxy.hold_finishing(Duration::ZERO);
    let second = Environment::start(&table, &proxy.url, case.batching, case.lease_margin_ms, &log).await;
    let failed = second.invoke(&event("m", 2, 0)).await;
    assert!(failed.is_empty(), "{}: copies: {failed:?}\n{}", case.name, second.logs());
    let runs = runs(&log);
    assert_eq!(runs.len(), RECORDS, "{}: every key ran", case.name);
    let ran_again = runs.values().filter(|count| **count > 1).count();
    let report = json!({
        "case": case.name, "writes": if case.batching { "batched" } else { "single" },
        "held_ms": case.held.as_millis(), "answered_ms": answered_ms, "deadline_ms": DEADLINE.as_millis(),
        "after_freeze": format!("{:?}", case.after), "ran_again": ran_again, "records": RECORDS,
    });
    println!("lifecycle-report {report}");
    drop(first);
    ran_again
}

/// A fresh DynamoDB Local answers its first few thousand requests several
/// times slower: a few hundred writes first, once per test process.
async fn warm_up() {
    static WARM: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    WARM.get_or_init(common::dynamodb::warm_up).await;
}

/// The cases run one at a time: each needs its handlers' claims answered within 300 ms.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn both_ways(name: &'static str, held: Duration, after: AfterFreeze, lease_margin_ms: u64) -> [usize; 2] {
    let _alone = ONE_AT_A_TIME.lock().await;
    warm_up().await;
    let batched = run_case(Case { name, batching: true, held, after, lease_margin_ms });
    let single = run_case(Case { name, batching: false, held, after, lease_margin_ms });
    let (batched, single) = futures::future::join(batched, single).await;
    [batched, single]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_land_within_the_margin_are_confirmed_before_the_answer_and_a_freeze() {
    let ran_again = both_ways("frozen at the answer", HELD_WITHIN_MARGIN, AfterFreeze::Never, 2000).await;
    assert_eq!(ran_again, [0, 0], "keys that ran again (batched, single)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thawed_environment_lands_its_unconfirmed_writes_before_the_lease_ends() {
    let thawed = AfterFreeze::ThawedAndInvoked(Duration::from_millis(1300));
    let ran_again = both_ways("thawed 1.3 s later", HELD_PAST_MARGIN, thawed, 4000).await;
    assert_eq!(ran_again, [0, 0], "keys that ran again (batched, single)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_environment_thawed_past_the_sdks_timeouts_still_lands_its_writes() {
    // Frozen 6.5 s: longer than the SDK's 5 s operation timeout, so its own retries have given up.
    let thawed = AfterFreeze::ThawedAndInvoked(Duration::from_millis(6500));
    let ran_again = both_ways("thawed past the SDK timeouts", HELD_PAST_MARGIN, thawed, 9000).await;
    assert_eq!(ran_again, [0, 0], "keys that ran again (batched, single)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lands_the_unconfirmed_writes_before_the_process_leaves() {
    let stopped = AfterFreeze::ThawedAndStopped(Duration::from_millis(500));
    let ran_again = both_ways("SIGTERM after a thaw", HELD_PAST_MARGIN, stopped, 4000).await;
    assert_eq!(ran_again, [0, 0], "keys that ran again (batched, single)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_held_past_the_margin_and_never_thawed_is_the_window_that_remains() {
    // What no process can close: the answer is due, the completion has not landed, and the environment
    // is never run again. Every such key runs again when a copy comes after its lease.
    let ran_again = both_ways("held past the margin, never thawed", HELD_PAST_MARGIN, AfterFreeze::Never, 2000).await;
    assert_eq!(ran_again, [RECORDS, RECORDS], "keys that ran again (batched, single)");
}

/// The ledger (`handlers/ledger.rs`) through the same lifecycle: its credits
/// commit in one transaction with their keys' completions (its runs take no
/// claim, or claim first with `SQS_ONCE_CLAIM=always`), so a commit cut off
/// by the freeze is reported failed (`uncommitted`), and the copies after the
/// lease commit each credit once, whatever becomes of the frozen environment.
mod ledger {
    use super::*;

    /// The ledger's settings, its balances in `table`, its runs claiming as
    /// `claim` (`SQS_ONCE_CLAIM`) says.
    fn ledger(table: &str, claim: &str) -> Vec<(&'static str, String)> {
        vec![
            ("SQS_ONCE_HANDLER", "ledger".to_owned()),
            ("SQS_ONCE_LEDGER_TABLE", table.to_owned()),
            ("SQS_ONCE_CLAIM", claim.to_owned()),
            // Each credit in a transaction with its key's completion: what these cases prove.
            ("SQS_ONCE_LEDGER_KEYS_IN_ACCOUNTS", "false".to_owned()),
        ]
    }

    /// The ledger's settings, each credit's key kept in its account.
    fn ledger_keeping_keys(table: &str, claim: &str) -> Vec<(&'static str, String)> {
        let mut settings = ledger(table, claim);
        settings.retain(|(name, _)| *name != "SQS_ONCE_LEDGER_KEYS_IN_ACCOUNTS");
        settings
    }

    /// Twenty credits over five accounts, credit n of n + 1.
    fn credits(receive_count: u32) -> Value {
        let records: Vec<Value> = (0..RECORDS)
            .map(|n| {
                json!({
                    "messageId": format!("c-{n:02}"), "receiptHandle": format!("rh-{n}-{receive_count}"),
                    "body": json!({ "account": format!("acct-{}", n % 5), "amount": n + 1 }).to_string(),
                    "attributes": {"ApproximateReceiveCount": receive_count.to_string()}, "messageAttributes": {},
                    "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:work",
                })
            })
            .collect();
        json!({ "Records": records })
    }

    async fn balances_are_exact(table: &str) {
        for account in 0..5 {
            let expected: usize = (0..RECORDS).filter(|n| n % 5 == account).map(|n| n + 1).sum();
            let item = common::dynamodb::item(table, &format!("acct-{account}")).await;
            assert_eq!(item.map(|item| item["balance"].as_u64().unwrap()), Some(expected as u64), "acct-{account}");
        }
    }

    /// What the thawed environment logs as its late commits are refused:
    /// by their claims' tokens, or, for runs that took no claim, by the
    /// copies' completions.
    const REFUSED_BY_TOKEN: &str = "commit refused: the lease was taken over";
    const REFUSED_BY_COMPLETION: &str = "commit refused: the key was taken by another run";
    /// ... or, for credits that keep their keys in the accounts, by the keys
    /// the copies' updates kept there.
    const REFUSED_IN_ITEM: &str = "commit refused: the key is kept in its item already";

    /// Freezes the first environment at its answer while DynamoDB holds its
    /// commits `held`, delivers copies after the lease to a second one, and
    /// then, if `thawed` says what it logs, thaws the first and invokes it
    /// again. Runs claim as `claim` says. Returns the first answer's
    /// failures and the copies' outcomes.
    async fn run(held: Duration, thawed: Option<&str>, claim: &str) -> (Vec<String>, Value) {
        run_with(held, thawed, ledger, claim).await
    }

    /// [`run`], the ledger set up by `settings`.
    async fn run_with(
        held: Duration,
        thawed: Option<&str>,
        settings: fn(&str, &str) -> Vec<(&'static str, String)>,
        claim: &str,
    ) -> (Vec<String>, Value) {
        let _alone = ONE_AT_A_TIME.lock().await;
        warm_up().await;
        let store = common::fresh_table().await;
        let table = store.layout().table.clone();
        let balances = common::dynamodb::items_table().await;
        let proxy = FaultProxy::holding_finishing_writes(held).await;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("demo.log");
        let first = Environment::with(&table, &proxy.url, true, 2000, &log, &settings(&balances, claim)).await;
        first.freeze_at_answer(&proxy);
        let deadline_ms = u64::try_from((SystemTime::now() + DEADLINE).duration_since(UNIX_EPOCH).unwrap().as_millis());
        let failed_first = first.invoke(&credits(1)).await;
        let lease_end_ms = deadline_ms.unwrap() + 2000 + 200;
        let now_ms = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap();
        tokio::time::sleep(Duration::from_millis(lease_end_ms.saturating_sub(now_ms))).await;
        proxy.hold_finishing(Duration::ZERO);
        let second = Environment::with(&table, &proxy.url, true, 2000, &log, &settings(&balances, claim)).await;
        let (answer, _, _) = second.api.invoke(&credits(2), DEADLINE).await.expect("the copies were answered");
        let Answer::Response(response) = answer else { panic!("invocation error: {answer:?}") };
        assert!(common::failed_ids(&response).is_empty(), "copies: {response}\n{}", second.logs());
        if let Some(refused) = thawed {
            // The thawed environment sends its unconfirmed commits again, and they are refused.
            first.thaw();
            assert!(first.invoke(&json!({ "Records": [] })).await.is_empty());
            let logs = first.logs();
            assert!(logs.contains(refused), "{logs}");
        }
        balances_are_exact(&balances).await;
        (failed_first, outcomes(&second.logs()))
    }

    /// How many records of a function's JSON log had each outcome.
    fn outcomes(log: &str) -> Value {
        let count = |outcome: &str| log.matches(&format!("\"outcome\":\"{outcome}\"")).count();
        json!({ "processed": count("processed"), "duplicate": count("duplicate"), "failed": count("uncommitted") })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_cut_off_by_the_freeze_is_reported_failed_and_the_copies_commit_once() {
        // Held past the deadline: not confirmed when the answer is due.
        let (failed, outcomes) = run(Duration::from_secs(6), None, "auto").await;
        assert_eq!(failed.len(), RECORDS, "every credit reported failed (uncommitted), none successful");
        assert_eq!(outcomes["processed"], RECORDS, "the copies took every key over: {outcomes}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thawed_environment_cannot_commit_over_the_copies() {
        let (failed, _) = run(Duration::from_secs(6), Some(REFUSED_BY_TOKEN), "always").await;
        assert_eq!(failed.len(), RECORDS);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thawed_environment_whose_runs_took_no_claim_cannot_commit_over_the_copies() {
        let (failed, _) = run(Duration::from_secs(6), Some(REFUSED_BY_COMPLETION), "auto").await;
        assert_eq!(failed.len(), RECORDS);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thawed_environment_whose_credits_keep_their_keys_in_the_accounts_cannot_credit_twice() {
        // Each credit one conditional update of its account; the copies' updates keep their keys there first.
        for claim in ["auto", "always"] {
            let (failed, outcomes) =
                run_with(Duration::from_secs(6), Some(REFUSED_IN_ITEM), ledger_keeping_keys, claim).await;
            assert_eq!(failed.len(), RECORDS, "{claim}: every credit uncommitted at the freeze");
            assert_eq!(outcomes["processed"], RECORDS, "{claim}: the copies took every key: {outcomes}");
        }
    }

    /// Twenty credits of `prefix`'s own five accounts.
    fn credits_of(prefix: &str, receive_count: u32) -> Value {
        let mut event = credits(receive_count);
        for record in event["Records"].as_array_mut().unwrap() {
            let message_id = format!("{prefix}-{}", record["messageId"].as_str().unwrap());
            let mut body: Value = serde_json::from_str(record["body"].as_str().unwrap()).unwrap();
            body["account"] = json!(format!("{prefix}-{}", body["account"].as_str().unwrap()));
            record["messageId"] = json!(message_id);
            record["body"] = json!(body.to_string());
        }
        event
    }

    /// How a frozen environment comes back, hours later as far as its keys know.
    #[derive(Debug, Clone, Copy)]
    enum Back {
        /// Thawed for an invocation.
        Invoked,
        /// Thawed to be reclaimed: SIGTERM.
        Reclaimed,
    }

    /// Keys remembered 2 min (the least under which runs take no claim), on a queue whose records are back within 2 s
    /// (its visibility timeout, and a back-off of 1 s with its jitter), so
    /// that the key memory, not the redelivery window, says when they expire.
    fn remembered_2_min() -> [(&'static str, String); 4] {
        [
            ("SQS_ONCE_EXPIRES_AFTER_SECS", "120".to_owned()),
            ("SQS_ONCE_VISIBILITY_TIMEOUT_SECS", "2".to_owned()),
            ("SQS_ONCE_RETRY_BASE_SECS", "1".to_owned()),
            ("SQS_ONCE_RETRY_MAX_SECS", "1".to_owned()),
        ]
    }

    /// An environment frozen at its answer with its commits held (and then
    /// lost: they never reached DynamoDB), whose copies another environment
    /// commits; back after the keys' completions (2 min) expired and TTL
    /// deleted them.
    async fn frozen(table: &str, balances: &str, prefix: &str, log: &Path) -> (Environment, FaultProxy) {
        let proxy = FaultProxy::holding_finishing_writes(Duration::from_secs(6)).await;
        let mut settings = ledger(balances, "auto");
        settings.extend(remembered_2_min());
        let first = Environment::with(table, &proxy.url, true, 2000, log, &settings).await;
        first.freeze_at_answer(&proxy);
        let failed = first.invoke(&credits_of(prefix, 1)).await;
        assert_eq!(failed.len(), RECORDS, "every credit uncommitted when the answer was due");
        (first, proxy)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_environment_back_after_its_keys_expired_and_were_deleted_applies_no_credit_twice() {
        let alone = ONE_AT_A_TIME.lock().await;
        warm_up().await;
        let store = common::fresh_table().await;
        let table = store.layout().table.clone();
        let balances = common::dynamodb::items_table().await;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("demo.log");
        let ways = [("a", Back::Invoked), ("b", Back::Reclaimed)];
        let mut frozen_environments = Vec::new();
        for (prefix, back) in ways {
            frozen_environments.push((frozen(&table, &balances, prefix, &log).await, prefix, back));
        }
        // After the leases, the copies go to another environment, which commits every credit.
        tokio::time::sleep(Duration::from_secs(7)).await;
        let mut settings = ledger(&balances, "auto");
        settings.extend(remembered_2_min());
        let direct = common::dynamodb::endpoint();
        let second = Environment::with(&table, &direct, true, 2000, &log, &settings).await;
        for (prefix, _) in ways {
            assert!(second.invoke(&credits_of(prefix, 2)).await.is_empty(), "copies\n{}", second.logs());
        }
        // The completions expire, and TTL deletes them (as it may at any moment after).
        use sqs_once::store::{ClaimAdmin, ClaimQuery, ClaimStatus};
        let query = ClaimQuery { status: Some(ClaimStatus::Completed), limit: 1000, ..ClaimQuery::default() };
        let completed = store.list(&query).await.unwrap().claims;
        assert_eq!(completed.len(), 2 * RECORDS);
        let expired_s = completed.iter().map(|claim| claim.expires_at_s).max().unwrap() + 1;
        let now_s = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        // Two minutes with every environment frozen or done: the other cases run meanwhile.
        drop(alone);
        tokio::time::sleep(Duration::from_secs(expired_s.saturating_sub(now_s) + 1)).await;
        let _alone = ONE_AT_A_TIME.lock().await;
        for claim in &completed {
            store.replace_seen(Some(claim), None).await.unwrap();
        }
        // The frozen environments come back: one invoked, one reclaimed.
        let mut back_again = Vec::new();
        for ((mut first, proxy), prefix, back) in frozen_environments {
            proxy.hold_finishing(Duration::ZERO);
            first.thaw();
            match back {
                Back::Invoked => assert!(first.invoke(&json!({ "Records": [] })).await.is_empty()),
                Back::Reclaimed => {
                    signal(first.process.id().unwrap(), "-TERM");
                    let status = tokio::time::timeout(Duration::from_millis(500), first.process.wait()).await;
                    assert!(status.expect("gone 500 ms after SIGTERM").unwrap().success(), "{prefix}");
                }
            }
            back_again.push((prefix, back, first, proxy));
        }
        // The invoked one answers its empty batch while its kept commits may still be on their way again:
        // the balances are read once every kept commit has been given up.
        for (prefix, back, first, _) in &back_again {
            let started = Instant::now();
            while !first.logs().contains("WriteGivenUp") {
                let waited = started.elapsed();
                assert!(
                    waited < Duration::from_secs(30),
                    "{prefix}: {back:?}: the kept commits are given up\n{}",
                    first.logs()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        for (prefix, _) in ways {
            for account in 0..5 {
                let expected: usize = (0..RECORDS).filter(|n| n % 5 == account).map(|n| n + 1).sum();
                let item = common::dynamodb::item(&balances, &format!("{prefix}-acct-{account}")).await;
                let balance = item.map(|item| item["balance"].as_u64().unwrap());
                assert_eq!(balance, Some(expected as u64), "{prefix}-acct-{account}: each credit applied once");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commits_confirmed_before_the_answer_make_the_copies_duplicates() {
        let (failed, outcomes) = run(HELD_WITHIN_MARGIN, None, "auto").await;
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(outcomes["duplicate"], RECORDS, "{outcomes}");
    }
}
