//! Test support shared by the binary's integration tests: the binary under
//! test, its answers, and a claim table as `sqs-once create-table` makes it.
//! The servers and proxies the tests run against are the testkit's.

// Each test crate uses a part of this support, and reaches it through `mod
// common`, never as a public API.
#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod function;
pub mod rounds;

pub use testkit::{delay, dynamodb, extended_client, faults, otlp, outage, runtime_api, sqs};

use sqs_once::store::{DynamoDbStore, TableLayout};

/// The `sqs-once` binary under test, as a command to add arguments to: the one
/// cargo built for the tests, or the artifact named by `SQS_ONCE_TEST_BINARY`
/// (what `sam build` deploys), started through `SQS_ONCE_TEST_RUNNER` when it
/// is set (`qemu-aarch64` for the arm64 build on another machine).
pub fn sqs_once_command() -> std::process::Command {
    let binary = std::env::var("SQS_ONCE_TEST_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_sqs-once").to_owned());
    let mut command = match std::env::var("SQS_ONCE_TEST_RUNNER") {
        Ok(runner) if !runner.is_empty() => {
            let mut command = std::process::Command::new(runner);
            command.arg(binary);
            command
        }
        _ => std::process::Command::new(binary),
    };
    for name in HARNESS {
        command.env_remove(name);
    }
    command
}

/// The test harness's own variables (the artifact and its runner, the
/// emulator, the drains' sizes, the simulation's seeds): not the binary's
/// settings, which would report each as one it does not know.
pub const HARNESS: &[&str] = &[
    "SQS_ONCE_TEST_BINARY",
    "SQS_ONCE_TEST_RUNNER",
    "SQS_ONCE_TEST_PYTHON",
    "SQS_ONCE_RIE",
    "SQS_ONCE_BIN",
    "SQS_ONCE_FAULTS_KEYS",
    "SQS_ONCE_FAULTS_RATE",
    "SQS_ONCE_FAULTS_SEEDS",
    "SQS_ONCE_FAULTS_KEEP",
    "SQS_ONCE_FAULTS_TRACE",
    "SQS_ONCE_SIM_SEED",
    "SQS_ONCE_SIM_SEEDS",
    "SQS_ONCE_SIM_TRACE",
    "SQS_ONCE_SAM_CRATE",
    "SQS_ONCE_SAM_IMAGE",
    "SQS_ONCE_SAM_BUILT_CRATE",
];

/// The binary as a user runs it in `dir`, outside Lambda: claims in the
/// file `dir/claims.db` unless the test chooses another store, the demo
/// handler's log in `dir/demo.log`, nothing on standard input.
pub fn command_in(dir: &std::path::Path) -> std::process::Command {
    let mut command = sqs_once_command();
    command
        .current_dir(dir)
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env_remove("AWS_LAMBDA_FUNCTION_NAME")
        .env_remove("SQS_ONCE_STORE")
        .env_remove("SQS_ONCE_TABLE")
        .env("SQS_ONCE_STORE_PATH", dir.join("claims.db"))
        .env("SQS_ONCE_DEMO_LOG", dir.join("demo.log"))
        .stdin(std::process::Stdio::null());
    command
}

/// What `sqs-once invoke --metrics` answered: the message ids in its
/// `batchItemFailures`, and the metrics line it printed on standard error.
pub fn invoke_answer(output: &std::process::Output) -> (std::collections::HashSet<String>, serde_json::Value) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "invoke failed: {stderr}");
    let response: serde_json::Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|_| panic!("stdout is not one JSON object: {stderr}"));
    let failures = failed_ids(&response).into_iter().collect();
    let metrics = stderr
        .lines()
        .find_map(|line| serde_json::from_str::<serde_json::Value>(line).ok().filter(|line| line.get("_aws").is_some()))
        .unwrap_or_else(|| panic!("no metrics line: {stderr}"));
    (failures, metrics)
}

/// The message ids a partial-batch response names in its `batchItemFailures`, in order.
pub fn failed_ids(response: &serde_json::Value) -> Vec<String> {
    response["batchItemFailures"]
        .as_array()
        .unwrap_or_else(|| panic!("no batchItemFailures list: {response}"))
        .iter()
        .map(|failure| failure["itemIdentifier"].as_str().unwrap().to_owned())
        .collect()
}

/// A fresh claim table on DynamoDB Local with a unique name, created by
/// `sqs-once create-table` as a user creates one, and a store on it for
/// reading what it holds.
pub async fn fresh_table() -> DynamoDbStore {
    let name = dynamodb::unique_name("claims");
    let output = sqs_once_command()
        .args(["create-table", "--table", &name])
        .env("AWS_ENDPOINT_URL_DYNAMODB", dynamodb::endpoint())
        .output()
        .expect("run create-table");
    assert!(output.status.success(), "create-table: {}", String::from_utf8_lossy(&output.stderr));
    DynamoDbStore::new(dynamodb::client().await, TableLayout::new(name))
}
