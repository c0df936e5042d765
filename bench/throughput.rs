//! The Rust side of `bench/run` and `bench/cost`: the DynamoDB ceiling, the
//! engine in process, and what a ledger credit costs.
//!
//! ```text
//! throughput ceiling --table T --requests N --concurrency C
//! throughput engine  --table T --event FILE --concurrency C --passes P
//! throughput ledger  --table T --records N --concurrency C --writes staged|direct
//! ```
//!
//! Each prints JSON objects on standard output. `ceiling` sends N claim
//! writes (conditional `PutItem`s of new keys, exactly as the store claims
//! with batching off) at C in flight; `engine` runs the event P times through one engine (the first pass
//! as a new process would, later passes with its cache warm), printing a line
//! per pass. `ledger` creates claim table T and a balances table, and runs N
//! credits (one each, over 50 accounts) through an engine whose handler
//! stages the credit to commit with the claim (`staged`: the `ledger`
//! handler) or writes it itself with an `UpdateItem` (`direct`); it counts
//! every request and write action both clients send, the process's CPU
//! time, and checks the balances.

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
    types::{AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType},
};
use futures::{StreamExt, stream};
use serde_json::{Value, json};
use sqs_once::{
    HandlerError, Record,
    claim::{ClaimPolicy, Claims},
    clock::{Clock, SystemClock},
    engine::{Engine, EngineOptions, Invocation},
    event::parse_event,
    handler_fn,
    handlers::{demo::Demo, ledger::Ledger},
    key::Keys,
    store::{ClaimStatus, ClaimStore, DynamoDbStore, PutOutcome, StoredClaim, dynamodb},
};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|arg| arg != "--bench").collect();
    let option = |name: &str| {
        let flag = format!("--{name}");
        let at = args.iter().position(|arg| *arg == flag).unwrap_or_else(|| panic!("{flag} is required"));
        args[at + 1].clone()
    };
    let (client, requests) = dynamodb::client().await;
    let store = DynamoDbStore::new(client, dynamodb::TableLayout::new(option("table")));
    let concurrency: usize = option("concurrency").parse().unwrap();
    match args.first().map(String::as_str) {
        Some("ceiling") => {
            // The ceiling is the server's rate of single conditional writes.
            let store = store.batching(false);
            let mut result = ceiling(&store, option("requests").parse().unwrap(), concurrency).await;
            result["requests"] = requests.snapshot().total().into();
            println!("{result}");
        }
        Some("engine") => {
            let engine = engine(store, concurrency);
            let event: Value = serde_json::from_str(&std::fs::read_to_string(option("event")).unwrap()).unwrap();
            for _ in 0..option("passes").parse().unwrap() {
                let before = requests.snapshot().total();
                let mut result = run(&engine, event.clone()).await;
                result["requests"] = (requests.snapshot().total() - before).into();
                println!("{result}");
            }
        }
        Some("ledger") => {
            let records: usize = option("records").parse().unwrap();
            println!("{}", ledger(&option("table"), records, concurrency, &option("writes")).await);
        }
        other => panic!("unknown mode {other:?}: expected ceiling, engine or ledger"),
    }
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
    let config = aws_sdk_dynamodb::config::Builder::from(&sqs_once::aws::sdk_config().await)
        .interceptor(CountActions(Arc::clone(actions)))
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// The process's CPU time so far (user and system), from `/proc/self/stat`
/// (in USER_HZ, 100 a second on Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// `records` ledger credits through an engine whose handler stages them
/// (`staged`) or writes them itself (`direct`).
async fn ledger(table: &str, records: usize, concurrency: usize, writes: &str) -> Value {
    let actions = Arc::new(Actions::default());
    let client = counted_client(&actions).await;
    let store = DynamoDbStore::new(client.clone(), dynamodb::TableLayout::new(table));
    store.create_table().await.unwrap();
    let balances = format!("{table}-balances");
    let key = KeySchemaElement::builder().attribute_name("pk").key_type(KeyType::Hash).build().unwrap();
    let attribute =
        AttributeDefinition::builder().attribute_name("pk").attribute_type(ScalarAttributeType::S).build().unwrap();
    let created = client.create_table().table_name(&balances).billing_mode(BillingMode::PayPerRequest);
    created.key_schema(key).attribute_definitions(attribute).send().await.unwrap();
    let handler: sqs_once::BoxHandler = match writes {
        "staged" => Arc::new(Ledger::new(&balances, None)),
        "direct" => {
            let (client, balances) = (client.clone(), balances.clone());
            Arc::new(handler_fn(move |record: Record| {
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
            }))
        }
        other => panic!("--writes {other}: expected staged or direct"),
    };
    let claims = Claims::with_policy(Arc::new(store), ClaimPolicy::default(), Arc::new(SystemClock));
    let keys = Keys::new("messageId", "bench").expect("a key specification");
    let options = EngineOptions { concurrency, ..EngineOptions::default() };
    let engine = Engine::new(handler, Arc::new(claims), keys, options);
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
    let mut result = run(&engine, json!({ "Records": event })).await;
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
    let now_ms = SystemClock.now_ms();
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

/// An engine as `sqs-once invoke` builds it: the demo handler, default policy.
fn engine(store: DynamoDbStore, concurrency: usize) -> Engine {
    let claims = Claims::with_policy(Arc::new(store), ClaimPolicy::default(), Arc::new(SystemClock));
    let keys = Keys::new("messageId", "bench").expect("a key specification");
    let options = EngineOptions { concurrency, ..EngineOptions::default() };
    Engine::new(Arc::new(Demo::default()), Arc::new(claims), keys, options)
}

/// One pass of `event` through `engine`, timed.
async fn run(engine: &Engine, event: Value) -> Value {
    let records = parse_event(event).unwrap();
    let count = records.len();
    let invocation = Invocation { deadline: SystemTime::now() + Duration::from_secs(900), request_id: "bench".into() };
    let started = Instant::now();
    let report = engine.process(&records, &invocation).await;
    let elapsed = started.elapsed();
    json!({
        "records": count,
        "failed": report.response().batch_item_failures.len(),
        "seconds": elapsed.as_secs_f64(),
        "per_second": count as f64 / elapsed.as_secs_f64(),
    })
}
