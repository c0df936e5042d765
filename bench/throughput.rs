//! The Rust side of `bench/run`, `bench/cost` and `bench/units`: the DynamoDB
//! ceiling, the engine in process, what a ledger credit costs, and the meter
//! of DynamoDB's capacity units.
//!
//! ```text
//! throughput ceiling --table T --requests N --concurrency C
//! throughput batched-ceiling --table T --records N --concurrency K
//! throughput engine  --table T --event FILE --concurrency C --passes P
//! throughput ledger  --table T --records N --concurrency C --writes staged|direct
//! throughput delay-proxy --upstream URL --round-trip-ms MS [--tls]
//! throughput meter --upstream URL
//! throughput sqs-counter --upstream URL
//! throughput send-ceiling --queue-url URL --bodies FILE --concurrency C
//! throughput lambda --binary PATH --table T --event FILE --invocations N [--same-ids] [--pause-ms MS]
//! throughput environments --binary PATH --table T --event FILE --environments E --at-once A --invocations N
//! ```
//!
//! Each prints JSON objects on standard output. `ceiling` sends N claim
//! writes (conditional `PutItem`s of new keys, exactly as the store claims
//! with batching off) at C in flight; `batched-ceiling` is the server's
//! rate of records with batched writes, measured by a minimal client: N keys
//! claimed by conditional PartiQL `INSERT`s, then completed by conditional
//! `UPDATE`s (the statements the store sends: a claim in progress is in no
//! index), 25 statements a request, K requests in flight,
//! records/s = N ÷ the time for both; `engine` runs the event P times through one engine (the first pass
//! as a new process would, later passes with its cache warm), printing a line
//! per pass. `ledger` creates claim table T and a balances table, and runs N
//! credits (one each, over 50 accounts) through an engine whose handler
//! stages the credit to commit with the claim (`staged`: the `ledger`
//! handler) or writes it itself with an `UpdateItem` (`direct`); it counts
//! every request and write action both clients send, the process's CPU
//! time, and checks the balances. `delay-proxy` puts a network of MS
//! milliseconds' round trip in front of URL (`testkit::delay`), with TLS
//! terminated behind it if `--tls` (`testkit::tls`), prints `{"url": …,
//! "certificate": …}` (the PEM file for `SSL_CERT_FILE`, with `--tls`) and
//! serves until its standard input closes. `meter` puts testkit's capacity
//! meter in front of URL, prints `{"url": …}`, and for each line of its
//! standard input prints the units DynamoDB charged since the line before.
//! `sqs-counter` puts testkit's fault proxy, injecting nothing, in front of
//! the SQS server at URL, prints `{"url": …}`, and for each line of its
//! standard input prints the requests of each operation so far.
//! `send-ceiling` is the server's rate of messages sent with
//! `SendMessageBatch` by a minimal client: the bodies of FILE (a JSON array
//! of strings), each with one string attribute as the outbox's messages
//! carry their outbox id, ten a request, C requests in flight; it prints
//! `{"messages": …, "seconds": …, "requests": …, "failed": …}`.
//! `lambda` runs the function
//! binary as Lambda does, against testkit's Runtime API, with this process's
//! environment (endpoint, `SSL_CERT_FILE`, the handler `SQS_ONCE_HANDLER`
//! names, `demo` by default) and table T, and sends it the event N times
//! (fresh message ids each time, or the same with `--same-ids`), MS
//! milliseconds apart (0 by default: a warm environment's idle time, in
//! which the outbox's sweep interval passes); it prints
//! `{"init_ms": …, "batches_ms": […], "failed": […]}`: process start to the
//! first request for an event, then each event's delivery to its answer, and
//! how many records each answer reported failed. `environments` starts E
//! such functions, each handed A invocations at once (Lambda Managed
//! Instances' `AWS_LAMBDA_MAX_CONCURRENCY`; 1: classic Lambda), warms each
//! with one invocation, then sends N copies of the event together, round
//! robin; it prints the time to the last answer, the functions' CPU time,
//! their DynamoDB requests and the largest peak RSS.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use aws_sdk_dynamodb::{
    config::{ConfigBag, Intercept, RuntimeComponents, interceptors::BeforeTransmitInterceptorContextRef},
    error::BoxError,
    types::{
        AttributeDefinition, AttributeValue, BatchStatementRequest, BillingMode, KeySchemaElement, KeyType,
        ScalarAttributeType,
    },
};
use futures::{StreamExt, stream};
use serde_json::{Value, json};
use sqs_once::{
    Handler, HandlerError, Record,
    config::Config,
    consumer::{Consumer, Invocation},
    event::parse_event,
    handler_fn,
    store::{ClaimStatus, ClaimStore, DynamoDbStore, PutOutcome, StoredClaim, TableLayout},
};
use sqs_once_handlers::{demo::Demo, ledger::Ledger};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|arg| arg != "--bench").collect();
    // The engine in process runs on the bundled binary's runtime, to be
    // measured as it runs there; the ceilings' client, the network and the
    // Runtime API, which stand in for the world around a consumer, on all
    // cores, so that they are not what limits it.
    let mut runtime = match args.first().map(String::as_str) {
        Some("engine") => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    runtime.enable_all().build().expect("a Tokio runtime").block_on(bench(args));
}

async fn bench(args: Vec<String>) {
    let option = |name: &str| {
        let flag = format!("--{name}");
        let at = args.iter().position(|arg| *arg == flag).unwrap_or_else(|| panic!("{flag} is required"));
        args[at + 1].clone()
    };
    match args.first().map(String::as_str) {
        Some("delay-proxy") => {
            let round_trip = Duration::from_millis(option("round-trip-ms").parse().unwrap());
            return network(&option("upstream"), round_trip, args.iter().any(|arg| arg == "--tls")).await;
        }
        Some("meter") => return meter(&option("upstream")).await,
        Some("sqs-counter") => return sqs_counter(&option("upstream")).await,
        Some("send-ceiling") => {
            let bodies: Vec<String> =
                serde_json::from_str(&std::fs::read_to_string(option("bodies")).unwrap()).unwrap();
            let concurrency = option("concurrency").parse().unwrap();
            println!("{}", send_ceiling(&option("queue-url"), bodies, concurrency).await);
            return;
        }
        Some("environments") => {
            let event = std::fs::read_to_string(option("event")).unwrap();
            let number = |name: &str| option(name).parse::<usize>().unwrap();
            let (environments_n, at_once, invocations) =
                (number("environments"), number("at-once"), number("invocations"));
            println!(
                "{}",
                environments(&option("binary"), &option("table"), &event, environments_n, at_once, invocations).await
            );
            return;
        }
        Some("lambda") => {
            let event = std::fs::read_to_string(option("event")).unwrap();
            let invocations = option("invocations").parse().unwrap();
            let same_ids = args.iter().any(|arg| arg == "--same-ids");
            let pause = args.iter().position(|arg| arg == "--pause-ms").map(|at| args[at + 1].parse().unwrap());
            let pause = Duration::from_millis(pause.unwrap_or(0));
            println!("{}", lambda(&option("binary"), &option("table"), &event, invocations, same_ids, pause).await);
            return;
        }
        _ => {}
    }
    let actions = Arc::new(Actions::default());
    let client = counted_client(&actions).await;
    let store = DynamoDbStore::new(client.clone(), TableLayout::new(option("table")));
    let requests = || actions.requests.load(Ordering::Relaxed);
    let concurrency: usize = option("concurrency").parse().unwrap();
    match args.first().map(String::as_str) {
        Some("ceiling") => {
            // The ceiling is the server's rate of single conditional writes.
            let store = store.batching(false);
            let mut result = ceiling(&store, option("requests").parse().unwrap(), concurrency).await;
            result["requests"] = requests().into();
            println!("{result}");
        }
        Some("batched-ceiling") => {
            let records = option("records").parse().unwrap();
            let mut result = batched_ceiling(&client, &option("table"), records, concurrency).await;
            result["requests"] = requests().into();
            println!("{result}");
        }
        Some("engine") => {
            let consumer = consumer(store, Demo::default(), concurrency).await;
            let event = std::fs::read_to_string(option("event")).unwrap();
            for _ in 0..option("passes").parse().unwrap() {
                let before = requests();
                let mut result = run(&consumer, &event).await;
                result["requests"] = (requests() - before).into();
                println!("{result}");
            }
        }
        Some("ledger") => {
            let records: usize = option("records").parse().unwrap();
            println!("{}", ledger(&option("table"), records, concurrency, &option("writes")).await);
        }
        other => {
            panic!(
                "unknown mode {other:?}: expected ceiling, batched-ceiling, engine, ledger, delay-proxy, meter, sqs-counter, send-ceiling or lambda"
            )
        }
    }
}

/// Serves a network of `round_trip` in front of `upstream`, with TLS
/// terminated behind it if `tls`, until standard input closes.
async fn network(upstream: &str, round_trip: Duration, tls: bool) {
    let terminated = if tls { Some(testkit::tls::TlsProxy::start(upstream).await.unwrap()) } else { None };
    let upstream = terminated.as_ref().map_or(upstream, |proxy| proxy.address.as_str());
    let delayed = testkit::delay::DelayProxy::start(upstream, round_trip).await.unwrap();
    let (url, certificate) = match &terminated {
        // The certificate names localhost: the client reaches the delaying proxy by that name.
        Some(proxy) => (delayed.url.replace("http://127.0.0.1", "https://localhost"), json!(proxy.certificate)),
        None => (delayed.url.clone(), Value::Null),
    };
    println!("{}", json!({ "url": url, "certificate": certificate }));
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut Vec::new()).await;
}

/// Serves testkit's fault proxy, injecting nothing, in front of the SQS
/// server at `upstream`: prints its URL, then, for each line read from
/// standard input, the requests of each operation so far (JSON), until
/// standard input closes.
async fn sqs_counter(upstream: &str) {
    use testkit::faults::{FaultMix, FaultProxy, SQS};
    use tokio::io::AsyncBufReadExt;
    let proxy = FaultProxy::start(upstream, SQS, FaultMix::default(), &[], 0).await;
    println!("{}", json!({ "url": proxy.url }));
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(_)) = lines.next_line().await {
        println!("{}", json!(*proxy.injected.operations.lock().unwrap()));
    }
}

/// Sends `bodies` to `queue_url` with `SendMessageBatch`, ten a request,
/// `concurrency` requests in flight: the server's rate of sends.
async fn send_ceiling(queue_url: &str, bodies: Vec<String>, concurrency: usize) -> Value {
    use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
    let client = testkit::sqs::client().await;
    let entry = |(n, body): (usize, &String)| {
        let id = MessageAttributeValue::builder().data_type("String").string_value(format!("{n:064x}")).build();
        let entry = SendMessageBatchRequestEntry::builder().id(n.to_string()).message_body(body);
        entry.message_attributes("sqs_once_outbox_id", id.unwrap()).build().unwrap()
    };
    let started = Instant::now();
    let requests = bodies.chunks(10).map(|chunk| {
        let entries: Vec<_> = chunk.iter().enumerate().map(entry).collect();
        let send = client.send_message_batch().queue_url(queue_url).set_entries(Some(entries)).send();
        async move { send.await.map_or(chunk.len(), |output| output.failed().len()) }
    });
    let failed: Vec<usize> = stream::iter(requests).buffer_unordered(concurrency).collect().await;
    let seconds = started.elapsed().as_secs_f64();
    json!({
        "messages": bodies.len(), "seconds": seconds, "requests": bodies.len().div_ceil(10),
        "failed": failed.iter().sum::<usize>(),
    })
}

/// Serves testkit's capacity meter in front of `upstream`: prints its URL,
/// then, for each line read from standard input, the units charged since
/// the last one (JSON), until standard input closes.
async fn meter(upstream: &str) {
    use tokio::io::AsyncBufReadExt;
    let meter = testkit::capacity::Meter::start_to(upstream).await;
    println!("{}", json!({ "url": meter.url }));
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(_)) = lines.next_line().await {
        let units = meter.take();
        println!(
            "{}",
            json!({
                "table_writes": units.writes() - units.index_writes(), "index_writes": units.index_writes(),
                "reads": units.reads, "refused_writes": units.refused_writes, "statements": units.statements,
                "transaction_actions": units.transaction_actions,
                "requests": units.requests,
            })
        );
    }
}

/// The function `binary` as Lambda runs it: its init time, then each of
/// `invocations` copies of `event` (fresh message ids, unless `same_ids`:
/// then each copy after the first is all duplicates) from delivery to
/// answer, in milliseconds, and the records each answer reported failed;
/// `pause` between an answer and the next delivery. The handler is
/// `SQS_ONCE_HANDLER`'s, `demo` when it is not set.
async fn lambda(binary: &str, table: &str, event: &str, invocations: usize, same_ids: bool, pause: Duration) -> Value {
    let api = testkit::runtime_api::RuntimeApi::start().await;
    let started = tokio::time::Instant::now();
    let handler = std::env::var("SQS_ONCE_HANDLER").unwrap_or_else(|_| "demo".to_owned());
    let envs = [("SQS_ONCE_TABLE", table.to_owned()), ("SQS_ONCE_HANDLER", handler)];
    let mut function = api.spawn(std::process::Command::new(binary), &envs);
    // The function's logs pass through to this process's standard error; a
    // pipe left unread would stop the function once full.
    tokio::spawn(pass_through(function.stdout.take().expect("the function's output is piped")));
    tokio::spawn(pass_through(function.stderr.take().expect("the function's output is piped")));
    api.initialized().await;
    let init = api.initialized_at().expect("the function asked for an event") - started;
    let (mut batches, mut failed) = (Vec::new(), Vec::new());
    for invocation in 0..invocations {
        if invocation > 0 {
            tokio::time::sleep(pause).await;
        }
        let prefix = if same_ids { String::new() } else { format!("{invocation}-") };
        let event = event.replace("\"messageId\": \"", &format!("\"messageId\": \"{prefix}"));
        let event: Value = serde_json::from_str(&event).unwrap();
        let sent = tokio::time::Instant::now();
        let (answer, answered, _) = api.invoke(&event, Duration::from_secs(60)).await.expect("an answer");
        let response = match answer {
            testkit::runtime_api::Answer::Response(response) => response,
            failed => panic!("the function failed: {failed:?}"),
        };
        failed.push(response["batchItemFailures"].as_array().map_or(0, Vec::len));
        batches.push((answered - sent).as_secs_f64() * 1000.0);
    }
    let _ = function.kill().await;
    json!({ "init_ms": init.as_secs_f64() * 1000.0, "batches_ms": batches, "failed": failed })
}

/// Copies a function's output to standard error, line by line.
async fn pass_through(output: impl tokio::io::AsyncRead + Unpin) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(output).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        eprintln!("{line}");
    }
}

/// `environments` functions as Lambda runs them, each handed `at_once`
/// invocations at once (`AWS_LAMBDA_MAX_CONCURRENCY`, as Lambda Managed
/// Instances sets it; 1 is classic Lambda): after one invocation each to
/// open their connections, `invocations` copies of `event` (fresh message
/// ids) sent together, round robin over the environments. Prints the time
/// from the first delivery to the last answer, the functions' CPU time and
/// DynamoDB requests (their metrics lines) in it, and the largest peak RSS.
async fn environments(
    binary: &str,
    table: &str,
    event: &str,
    environments: usize,
    at_once: usize,
    invocations: usize,
) -> Value {
    let mut envs = vec![("SQS_ONCE_TABLE", table.to_owned()), ("SQS_ONCE_HANDLER", "demo".to_owned())];
    if at_once > 1 {
        envs.push(("AWS_LAMBDA_MAX_CONCURRENCY", at_once.to_string()));
    }
    let requests = Arc::new(AtomicU64::new(0));
    let mut functions = Vec::new();
    for _ in 0..environments {
        let api = testkit::runtime_api::RuntimeApi::start().await;
        let mut function = api.spawn(std::process::Command::new(binary), &envs);
        tokio::spawn(count_requests(function.stdout.take().expect("piped"), Arc::clone(&requests)));
        tokio::spawn(pass_through(function.stderr.take().expect("piped")));
        api.initialized().await;
        functions.push((api, function));
    }
    let copy = |name: &str| {
        let event = event.replace("\"messageId\": \"", &format!("\"messageId\": \"{name}-"));
        serde_json::from_str::<Value>(&event).unwrap()
    };
    for (n, (api, _)) in functions.iter().enumerate() {
        assert_eq!(failures(api, copy(&format!("warm{n}"))).await, 0, "the warm-up's records processed");
    }
    // The warm-ups' metrics lines are counted before the timed invocations start.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pids: Vec<String> = functions.iter().map(|(_, function)| function.id().expect("running").to_string()).collect();
    let (cpu, requests_before) =
        (pids.iter().map(|pid| process_cpu_seconds(pid)).sum::<f64>(), requests.load(Ordering::SeqCst));
    let started = Instant::now();
    let answers = futures::future::join_all(
        (0..invocations).map(|n| failures(&functions[n % environments].0, copy(&format!("timed{n}")))),
    )
    .await;
    let wall = started.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cpu = pids.iter().map(|pid| process_cpu_seconds(pid)).sum::<f64>() - cpu;
    let peak_rss_kib = pids.iter().map(|pid| peak_rss_kib(pid)).max().unwrap_or(0);
    for (_, mut function) in functions {
        let _ = function.kill().await;
    }
    json!({
        "wall_ms": wall.as_secs_f64() * 1000.0, "cpu_s": cpu, "failed": answers.iter().sum::<usize>(),
        "dynamodb_requests": requests.load(Ordering::SeqCst) - requests_before, "peak_rss_kib": peak_rss_kib,
    })
}

/// Invokes the function behind `api` with `event`; how many records its answer reported failed.
async fn failures(api: &testkit::runtime_api::RuntimeApi, event: Value) -> usize {
    let (answer, _, _) = api.invoke(&event, Duration::from_secs(120)).await.expect("an answer");
    match answer {
        testkit::runtime_api::Answer::Response(response) => {
            response["batchItemFailures"].as_array().map_or(0, Vec::len)
        }
        failed => panic!("the function failed: {failed:?}"),
    }
}

/// Adds up the `DynamoDbRequests` of a function's metrics lines, passing its output on to standard error.
async fn count_requests(output: impl tokio::io::AsyncRead + Unpin, requests: Arc<AtomicU64>) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(output).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(count) =
            serde_json::from_str::<Value>(&line).ok().and_then(|line| line["DynamoDbRequests"].as_u64())
        {
            requests.fetch_add(count, Ordering::SeqCst);
        }
        eprintln!("{line}");
    }
}

/// The peak resident set of process `pid` (`VmHWM`), in KiB.
fn peak_rss_kib(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|line| line.starts_with("VmHWM:")).unwrap_or_default();
    line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).unwrap_or(0)
}

/// Requests and write actions a client sends, read off each request's body
/// as it goes out: write units follow from them by DynamoDB's rules.
#[derive(Debug, Default)]
struct Actions {
    requests: AtomicU64,
    /// `PutItem`, `UpdateItem`, `DeleteItem`: one write each.
    single_writes: AtomicU64,
    /// `INSERT`, `UPDATE` and `DELETE` statements of `BatchExecuteStatement`: one write each.
    statements: AtomicU64,
    /// Actions of `TransactWriteItems`: two writes each (prepare and commit).
    transaction_actions: AtomicU64,
}

#[derive(Debug, Clone)]
struct CountActions(Arc<Actions>);

impl Intercept for CountActions {
    fn name(&self) -> &'static str {
        "CountActions"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let target = request.headers().get("x-amz-target").unwrap_or_default();
        let body: Value =
            request.body().bytes().and_then(|bytes| serde_json::from_slice(bytes).ok()).unwrap_or_default();
        let actions = &self.0;
        actions.requests.fetch_add(1, Ordering::Relaxed);
        let count = |list: &str| body[list].as_array().map_or(0, Vec::len) as u64;
        match target.rsplit('.').next() {
            Some("PutItem" | "UpdateItem" | "DeleteItem") => {
                actions.single_writes.fetch_add(1, Ordering::Relaxed);
            }
            Some("BatchExecuteStatement") => {
                actions.statements.fetch_add(count("Statements"), Ordering::Relaxed);
            }
            Some("TransactWriteItems") => {
                actions.transaction_actions.fetch_add(count("TransactItems"), Ordering::Relaxed);
            }
            _ => {}
        }
        Ok(())
    }
}

/// A client counting its requests and write actions into `actions`.
async fn counted_client(actions: &Arc<Actions>) -> aws_sdk_dynamodb::Client {
    let aws = testkit::aws_config().await;
    let config = aws_sdk_dynamodb::config::Builder::from(&aws).interceptor(CountActions(Arc::clone(actions))).build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// The process's CPU time so far (user and system), from `/proc/self/stat`
/// (in USER_HZ, 100 a second on Linux).
fn cpu_seconds() -> f64 {
    process_cpu_seconds("self")
}

/// The CPU time (user and system) of process `pid` so far, in seconds.
fn process_cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// `records` ledger credits through an engine whose handler stages them
/// (`staged`) or writes them itself (`direct`).
async fn ledger(table: &str, records: usize, concurrency: usize, writes: &str) -> Value {
    let actions = Arc::new(Actions::default());
    let client = counted_client(&actions).await;
    let store = DynamoDbStore::new(client.clone(), TableLayout::new(table));
    store.create_table().await.unwrap();
    let balances = format!("{table}-balances");
    let key = KeySchemaElement::builder().attribute_name("pk").key_type(KeyType::Hash).build().unwrap();
    let attribute =
        AttributeDefinition::builder().attribute_name("pk").attribute_type(ScalarAttributeType::S).build().unwrap();
    let created = client.create_table().table_name(&balances).billing_mode(BillingMode::PayPerRequest);
    created.key_schema(key).attribute_definitions(attribute).send().await.unwrap();
    let consumer = match writes {
        "staged" => consumer(store, Ledger::new(&balances, None), concurrency).await,
        "direct" => {
            let (client, balances) = (client.clone(), balances.clone());
            let direct = handler_fn(move |record: Record| {
                let (client, balances) = (client.clone(), balances.clone());
                async move {
                    let entry: Value = record.body_json()?;
                    client
                        .update_item()
                        .table_name(balances)
                        .key("pk", AttributeValue::S(entry["account"].as_str().unwrap_or_default().to_owned()))
                        .update_expression("ADD balance :amount")
                        .expression_attribute_values(":amount", AttributeValue::N(entry["amount"].to_string()))
                        .send()
                        .await
                        .map_err(|error| HandlerError::retryable(error.to_string()))?;
                    Ok(None)
                }
            });
            consumer(store, direct, concurrency).await
        }
        other => panic!("--writes {other}: expected staged or direct"),
    };
    let batch = uuid::Uuid::new_v4().simple().to_string();
    let event: Vec<Value> = (0..records)
        .map(|n| {
            let body = json!({ "account": format!("acct-{}", n % 50), "amount": 1 }).to_string();
            json!({ "messageId": format!("{batch}-{n}"), "body": body, "attributes": {"ApproximateReceiveCount": "1"},
                    "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:ledger" })
        })
        .collect();
    let before = Actions::default();
    for (counter, from) in [
        (&before.requests, &actions.requests),
        (&before.single_writes, &actions.single_writes),
        (&before.statements, &actions.statements),
        (&before.transaction_actions, &actions.transaction_actions),
    ] {
        counter.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    let cpu = cpu_seconds();
    let mut result = run(&consumer, &json!({ "Records": event }).to_string()).await;
    let cpu = cpu_seconds() - cpu;
    let delta = |after: &AtomicU64, before: &AtomicU64| after.load(Ordering::Relaxed) - before.load(Ordering::Relaxed);
    let requests = delta(&actions.requests, &before.requests);
    let single = delta(&actions.single_writes, &before.single_writes);
    let statements = delta(&actions.statements, &before.statements);
    let transaction = delta(&actions.transaction_actions, &before.transaction_actions);
    let mut total = 0;
    for account in 0..50 {
        let item = client
            .get_item()
            .table_name(&balances)
            .key("pk", AttributeValue::S(format!("acct-{account}")))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item
            .unwrap_or_default();
        total += item.get("balance").and_then(|value| value.as_n().ok()?.parse::<usize>().ok()).unwrap_or(0);
    }
    let per_record = |count: u64| count as f64 / records as f64;
    result["writes"] = writes.into();
    result["balances_total"] = total.into();
    result["cpu_ms_per_record"] = (cpu * 1000.0 / records as f64).into();
    result["requests_per_record"] = per_record(requests).into();
    result["write_actions"] = json!({ "single": single, "statements": statements, "transaction": transaction });
    result["write_units_per_record"] = per_record(single + statements + 2 * transaction).into();
    result
}

async fn ceiling(store: &DynamoDbStore, count: usize, concurrency: usize) -> Value {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let now_ms = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as u64;
    let started = Instant::now();
    let claimed = stream::iter(0..count)
        .map(|n| {
            let record = StoredClaim {
                id: format!("ceiling#{run}#{n}"),
                status: ClaimStatus::InProgress,
                expires_at_s: now_ms / 1000 + 3600,
                lease_until_ms: Some(now_ms + 60_000),
                token: Some(uuid::Uuid::new_v4().simple().to_string()),
                holder: Some("bench".into()),
                attempt: Some(1),
                message_id: Some(format!("m-{n}")),
                claimed_at_ms: Some(now_ms),
                updated_at_ms: Some(now_ms),
                payload_hash: None,
                result: None,
                error: None,
            };
            async move { matches!(store.put_if_free(&record, now_ms).await, Ok(PutOutcome::Claimed)) }
        })
        .buffer_unordered(concurrency)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    let elapsed = started.elapsed();
    // Only writes that claimed count: a failed or refused write is no throughput.
    json!({ "ok": claimed, "failed": count - claimed, "seconds": elapsed.as_secs_f64(),
            "per_second": claimed as f64 / elapsed.as_secs_f64() })
}

/// Statements a `BatchExecuteStatement` takes at most.
const STATEMENTS_PER_REQUEST: usize = 25;

async fn batched_ceiling(client: &aws_sdk_dynamodb::Client, table: &str, records: usize, in_flight: usize) -> Value {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let now_ms = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as u64;
    let (s, n) = (|text: &str| AttributeValue::S(text.to_owned()), |number: u64| AttributeValue::N(number.to_string()));
    let ids: Vec<String> = (0..records).map(|record| format!("ceiling#{run}#{record}")).collect();
    let statement = |text: String, parameters| {
        BatchStatementRequest::builder().statement(text).set_parameters(Some(parameters)).build().unwrap()
    };
    let inserts = ids.iter().map(|id| {
        let text = format!(
            "INSERT INTO \"{table}\" VALUE {{'id': ?, 'status': ?, 'expiration': ?, 'in_progress_expiration': ?, \
             'token': ?}}"
        );
        statement(text, vec![s(id), s("INPROGRESS"), n(now_ms / 1000 + 3600), n(now_ms + 60_000), s(&run)])
    });
    let updates = ids.iter().map(|id| {
        let text = format!(
            "UPDATE \"{table}\" SET \"status\" = ? SET \"expiration\" = ? REMOVE \"in_progress_expiration\" \
             REMOVE \"open_status\" WHERE \"id\" = ? AND \"status\" = ? AND \"token\" = ?"
        );
        statement(text, vec![s("COMPLETED"), n(now_ms / 1000 + 3600), s(id), s("INPROGRESS"), s(&run)])
    });
    let started = Instant::now();
    let inserted = execute_all(client, inserts.collect(), in_flight).await;
    let claimed = started.elapsed();
    let completed = execute_all(client, updates.collect(), in_flight).await;
    let elapsed = started.elapsed();
    // Only records whose claim and completion both applied count.
    json!({ "records": records, "inserted": inserted, "completed": completed, "seconds": elapsed.as_secs_f64(),
            "claim_seconds": claimed.as_secs_f64(), "per_second": completed.min(inserted) as f64 / elapsed.as_secs_f64() })
}

/// Sends `statements` in full requests, `in_flight` at a time: how many applied.
async fn execute_all(
    client: &aws_sdk_dynamodb::Client,
    statements: Vec<BatchStatementRequest>,
    in_flight: usize,
) -> usize {
    let requests: Vec<Vec<BatchStatementRequest>> =
        statements.chunks(STATEMENTS_PER_REQUEST).map(<[BatchStatementRequest]>::to_vec).collect();
    stream::iter(requests)
        .map(|statements| async move {
            let answer = client.batch_execute_statement().set_statements(Some(statements)).send().await;
            answer.map_or(0, |answer| answer.responses().iter().filter(|response| response.error().is_none()).count())
        })
        .buffer_unordered(in_flight)
        .fold(0, |applied, count| std::future::ready(applied + count))
        .await
}

/// A consumer as `sqs-once invoke` builds one around `handler`, on `store`:
/// default settings, keys under `bench`, nothing asked of SQS.
async fn consumer(store: DynamoDbStore, handler: impl Handler, concurrency: usize) -> Consumer {
    let config = Config::from_lookup(|name| match name {
        "SQS_ONCE_CONCURRENCY" => Some(concurrency.to_string()),
        "SQS_ONCE_KEY_PREFIX" => Some("bench".to_owned()),
        "SQS_ONCE_CONFLICT_BACKOFF" => Some("false".to_owned()),
        "SQS_ONCE_RETRY_BASE_SECS" => Some("0".to_owned()),
        _ => None,
    })
    .expect("the settings");
    Consumer::builder().config(config).store(Arc::new(store)).build(handler).await.expect("a consumer")
}

/// One pass of `event` through `consumer`, timed.
async fn run(consumer: &Consumer, event: &str) -> Value {
    let records = parse_event(event).unwrap();
    let count = records.len();
    let invocation = Invocation { deadline: SystemTime::now() + Duration::from_secs(900), request_id: "bench".into() };
    let started = Instant::now();
    let answer = consumer.process(&records, &invocation).await;
    let elapsed = started.elapsed();
    json!({
        "records": count,
        "failed": answer.response.batch_item_failures.len(),
        "seconds": elapsed.as_secs_f64(),
        "per_second": count as f64 / elapsed.as_secs_f64(),
    })
}
