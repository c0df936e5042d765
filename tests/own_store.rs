//! The example `own_store` (a `ClaimStore` of four methods given to
//! `Consumer::builder().store(..)`) as Lambda runs it, on the real
//! `lambda_runtime` loop against a Runtime API server, and on the command
//! line where it lacks what a command needs.

use std::{
    path::PathBuf,
    process::{Command, Output},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::Value;
use testkit::runtime_api::{Answer, RuntimeApi};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The example's binary, built as the test command builds it when missing.
fn example() -> PathBuf {
    let manifest = env!("CARGO_MANIFEST_DIR");
    // target/debug/deps/own_store-<hash> → target/debug/examples/own_store
    let profile_dir = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().to_owned();
    let binary = profile_dir.join("examples").join(format!("own_store{}", std::env::consts::EXE_SUFFIX));
    if !binary.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = Command::new(cargo)
            .args(["build", "--example", "own_store", "--manifest-path", &format!("{manifest}/Cargo.toml")])
            .status()
            .unwrap();
        assert!(built.success(), "cargo build --example own_store failed");
    }
    binary
}

fn sample(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{}/events/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The JSON lines `lines` holds with `field` set, by message id.
fn by_message(lines: &[String], field: &str) -> Vec<(String, String)> {
    lines
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|line| {
            let value = line.get(field)?.as_str()?.to_owned();
            Some((line.get("message_id")?.as_str()?.to_owned(), value))
        })
        .collect()
}

#[tokio::test]
async fn a_store_of_ones_own_serves_lambda_and_keeps_each_message_once() {
    let api = RuntimeApi::start().await;
    // No SQS_ONCE_TABLE: the store given is where claims are kept.
    let settings = [("AWS_REGION", "us-east-1".to_owned()), ("RUST_LOG", "info".to_owned())];
    let mut process = api.spawn(Command::new(example()), &settings);
    // Logs go to stderr (stdout carries the metrics).
    let logs = Arc::new(Mutex::new(Vec::new()));
    let lines = Arc::clone(&logs);
    let mut reader = BufReader::new(process.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = reader.next_line().await {
            lines.lock().unwrap().push(line);
        }
    });

    let batch = sample("batch.json");
    let ids: Vec<String> =
        batch["Records"].as_array().unwrap().iter().map(|r| r["messageId"].as_str().unwrap().to_owned()).collect();
    for round in ["first", "again"] {
        let (answer, _, _) = api.invoke(&batch, Duration::from_secs(10)).await.expect("no answer");
        let Answer::Response(response) = answer else { panic!("{round}: {answer:?}") };
        assert_eq!(response["batchItemFailures"], serde_json::json!([]), "{round}: every record done");
    }
    // The answer is posted before the last lines are read: wait for every record's outcome of both rounds.
    for _ in 0..500 {
        if by_message(&logs.lock().unwrap(), "outcome").len() >= 2 * ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lines = logs.lock().unwrap().clone();
    let greeted: Vec<String> =
        by_message(&lines, "message").into_iter().filter(|(_, m)| m == "hello").map(|(id, _)| id).collect();
    let mut once = ids.clone();
    once.sort();
    let mut greeted_sorted = greeted.clone();
    greeted_sorted.sort();
    assert_eq!(greeted_sorted, once, "each message greeted once over both invocations:\n{}", lines.join("\n"));
    let announced = lines.iter().filter(|line| line.contains(r#""message":"invocation""#)).count();
    assert_eq!(announced, 2, "the layer given to the builder saw each invocation");
    let outcomes = by_message(&lines, "outcome");
    let again: Vec<&str> = outcomes[ids.len()..].iter().map(|(_, outcome)| outcome.as_str()).collect();
    assert_eq!(again, vec!["duplicate"; ids.len()], "the second invocation finds every key done");
}

#[test]
fn a_command_the_store_cannot_serve_is_refused_naming_what_it_lacks() {
    let Output { status, stderr, .. } = Command::new(example()).args(["claims", "list"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&stderr);
    assert!(!status.success(), "claims list on a store without a listing: {stderr}");
    assert!(stderr.contains("no listing of its claims (ClaimStore::capabilities: admin)"), "{stderr}");
}
