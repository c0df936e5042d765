//! The Rust side of `bench/run`: the DynamoDB ceiling and the engine in process.
//!
//! ```text
//! throughput ceiling --table T --requests N --concurrency C
//! throughput engine  --table T --event FILE --concurrency C --passes P
//! ```
//!
//! Each prints JSON objects on standard output. `ceiling` sends N claim
//! writes (conditional `PutItem`s of new keys, exactly as the store claims
//! with batching off) at C in flight; `engine` runs the event P times through one engine (the first pass
//! as a new process would, later passes with its cache warm), printing a line
//! per pass.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use futures::{StreamExt, stream};
use serde_json::{Value, json};
use sqs_once::{
    claim::{ClaimPolicy, ClaimStatus, Claims, StoredClaim},
    clock::{Clock, SystemClock},
    engine::{Engine, EngineOptions, Invocation},
    handlers::demo::Demo,
    key::KeyDeriver,
    sqs::event::parse_event,
    store::{ClaimStore, DynamoDbStore, PutOutcome, dynamodb},
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
        other => panic!("unknown mode {other:?}: expected ceiling or engine"),
    }
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
    let keys = KeyDeriver::new(Default::default(), "bench", true, Default::default());
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
