//! The binary against DynamoDB Local: `create-table` and `invoke` on a
//! table, over TLS as on AWS, a server that cannot be reached, and batched
//! writes that DynamoDB refuses, falling back to single requests.

use crate::common;

use std::{
    collections::HashMap,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

/// Runs per key in the demo log.
fn log_counts(path: &Path) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        *counts.entry(line.split('\t').next().unwrap().to_owned()).or_default() += 1;
    }
    counts
}

#[test]
fn invoke_against_dynamodb_local_runs_once_then_sees_duplicates() {
    common::dynamodb::endpoint();
    let dir = tempfile::tempdir().unwrap();
    let table = format!("invoke-{}", uuid::Uuid::new_v4().simple());
    let created = common::command_in(dir.path()).args(["create-table", "--table", &table]).output().unwrap();
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    // It says where the table is: the endpoint the environment names, not an AWS account by default.
    let endpoint = common::dynamodb::endpoint();
    assert_eq!(
        String::from_utf8_lossy(&created.stdout).trim(),
        format!("table {table} created at {endpoint}; TTL on `expiration`")
    );
    let event = dir.path().join("event.json");
    std::fs::write(&event, json!({ "Records": testkit::records((0..30).map(|n| json!({"n": n}))) }).to_string())
        .unwrap();
    for _ in 0..2 {
        let output =
            common::command_in(dir.path()).arg("invoke").arg(&event).env("SQS_ONCE_TABLE", &table).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), r#"{"batchItemFailures":[]}"#);
    }
    assert_eq!(log_counts(&dir.path().join("demo.log")).values().sum::<usize>(), 30, "the second run ran nothing");
    assert!(!dir.path().join("claims.db").exists(), "the file store was not used");
}

/// Runs `invoke` on an event of `records` new records in `dir`, claims in
/// `table`, twice as `configure` sets the command up: first with DynamoDB
/// out of reach (`false`), when the start is refused with `refusal` in its
/// message and no handler runs, then within reach (`true`), when each runs
/// once.
fn out_of_reach_then_reached(
    dir: &Path,
    table: &str,
    records: usize,
    refusal: &str,
    configure: impl Fn(&mut Command, bool),
) {
    let event = dir.join("event.json");
    std::fs::write(&event, json!({ "Records": testkit::records((0..records).map(|n| json!({"n": n}))) }).to_string())
        .unwrap();
    for reached in [false, true] {
        let mut command = common::command_in(dir);
        command.args(["invoke", "--timeout", "20"]).arg(&event).env("SQS_ONCE_TABLE", table);
        configure(&mut command, reached);
        let output = command.output().unwrap();
        let logs = String::from_utf8_lossy(&output.stderr);
        if reached {
            assert!(output.status.success(), "{logs}");
            let response: Value = serde_json::from_slice(&output.stdout).unwrap();
            assert_eq!(common::failed_ids(&response).len(), 0, "{logs}");
        } else {
            assert_eq!(output.status.code(), Some(1), "{logs}");
            assert!(output.stdout.is_empty(), "no answer: {}", String::from_utf8_lossy(&output.stdout));
            assert!(logs.contains("DynamoDB cannot be used at ") && logs.contains(refusal), "{logs}");
            assert!(log_counts(&dir.join("demo.log")).is_empty(), "no handler ran: {logs}");
        }
    }
    assert_eq!(log_counts(&dir.join("demo.log")).values().sum::<usize>(), records, "each record ran once");
}

/// DynamoDB Local behind a TLS proxy whose certificate is trusted through
/// `SSL_CERT_FILE` or not: every record runs once when it is; when it is not,
/// the certificate is refused and the start with it, naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_reaches_dynamodb_over_tls_and_checks_its_certificate() {
    let proxy = testkit::tls::TlsProxy::start(&common::dynamodb::endpoint()).await.unwrap();
    let table = common::fresh_table().await.layout().table.clone();
    let (url, certificate) = (proxy.url.clone(), proxy.certificate.clone());
    // The proxy serves on this runtime while the binary runs.
    tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().unwrap();
        out_of_reach_then_reached(dir.path(), &table, 10, "certificate", |command, trusted| {
            command.env("AWS_ENDPOINT_URL_DYNAMODB", &url);
            if trusted {
                command.env("SSL_CERT_FILE", &certificate);
            }
        });
    })
    .await
    .unwrap();
}

/// The proxy environment, as the SDK's default client honours it: through
/// an `HTTP_PROXY` that nobody serves the start is refused; with DynamoDB
/// Local's host in `NO_PROXY`, each record runs once.
#[test]
fn invoke_goes_through_the_proxy_the_environment_names() {
    let dir = tempfile::tempdir().unwrap();
    let table = format!("proxied-{}", uuid::Uuid::new_v4().simple());
    let created = common::command_in(dir.path()).args(["create-table", "--table", &table]).output().unwrap();
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = format!("http://{}", nobody.local_addr().unwrap());
    drop(nobody);
    out_of_reach_then_reached(dir.path(), &table, 5, "onnect", |command, bypassed| {
        command.env("HTTP_PROXY", &proxy).env("NO_PROXY", if bypassed { "127.0.0.1,localhost" } else { "" });
        command.env_remove("http_proxy").env_remove("no_proxy");
    });
}

/// The commonest first mistakes stop `invoke` at start, each named with
/// where it was looked for, instead of failing every record on its own and
/// exiting 0: DynamoDB not reachable, no Region, no credentials.
#[test]
fn invoke_refuses_to_start_without_a_reachable_dynamodb_a_region_or_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", nobody.local_addr().unwrap());
    drop(nobody);
    let event = dir.path().join("event.json");
    std::fs::write(&event, json!({ "Records": testkit::records((0..5).map(|n| json!({"n": n}))) }).to_string())
        .unwrap();
    let invoke = |configure: &dyn Fn(&mut Command)| {
        let mut command = common::command_in(dir.path());
        command.args(["invoke", "--timeout", "20"]).arg(&event).env("SQS_ONCE_TABLE", "claims");
        // No profile files of the machine's, and no instance metadata service to wait for.
        command
            .env("AWS_CONFIG_FILE", dir.path().join("none"))
            .env("AWS_SHARED_CREDENTIALS_FILE", dir.path().join("none"));
        command.env("AWS_EC2_METADATA_DISABLED", "true").env_remove("AWS_PROFILE");
        configure(&mut command);
        let started = Instant::now();
        let output = command.output().unwrap();
        assert!(started.elapsed() < Duration::from_secs(20), "answered after the deadline");
        let logs = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(1), "{logs}");
        assert!(output.stdout.is_empty(), "no answer");
        logs
    };
    let down = invoke(&|command| {
        command.env("AWS_ENDPOINT_URL_DYNAMODB", &endpoint);
    });
    assert!(down.contains(&format!("DynamoDB cannot be used at {endpoint}")), "{down}");
    assert!(down.contains("Connection refused"), "{down}");
    let no_region = invoke(&|command| {
        command.env_remove("AWS_REGION").env_remove("AWS_DEFAULT_REGION");
    });
    assert!(no_region.contains("no AWS Region for DynamoDB: set AWS_REGION"), "{no_region}");
    let no_credentials = invoke(&|command| {
        command.env_remove("AWS_ACCESS_KEY_ID").env_remove("AWS_SECRET_ACCESS_KEY").env_remove("AWS_SESSION_TOKEN");
    });
    assert!(no_credentials.contains("no AWS credentials for DynamoDB: "), "{no_credentials}");
    assert!(no_credentials.contains("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"), "{no_credentials}");
    assert!(log_counts(&dir.path().join("demo.log")).is_empty(), "no handler ran");
}

/// Request-level rejections of a batched request that single requests would not meet: IAM without the PartiQL
/// grants, and an endpoint that does not accept the batched form (a parameter it refuses, or no PartiQL at all).
const REFUSALS: [(&str, &str); 3] = [
    ("AccessDeniedException", "User: test is not authorized to perform: dynamodb:PartiQLInsert"),
    ("ValidationException", "ReturnValuesOnConditionCheckFailure is not supported for this statement"),
    ("UnknownOperationException", "BatchExecuteStatement"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_batches_fall_back_to_single_requests() {
    for (code, message) in REFUSALS {
        let store = common::fresh_table().await;
        let refusing = common::dynamodb::refusing_batches(code, message).await;
        let dir = tempfile::tempdir().unwrap();
        let event = dir.path().join("event.json");
        std::fs::write(&event, json!({ "Records": testkit::records((0..50).map(|n| json!({"n": n}))) }).to_string())
            .unwrap();
        for pass in ["new", "duplicates"] {
            let output = tokio::process::Command::from(common::command_in(dir.path()))
                .args(["invoke", "--metrics"])
                .arg(&event)
                .env("SQS_ONCE_TABLE", &store.layout().table)
                .env("SQS_ONCE_LOCAL_CACHE", "0")
                .env("AWS_ENDPOINT_URL_DYNAMODB", &refusing)
                .output()
                .await
                .unwrap();
            let logs = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success(), "{logs}");
            let answer = String::from_utf8_lossy(&output.stdout);
            assert_eq!(answer.trim(), r#"{"batchItemFailures":[]}"#, "{code}, {pass}: {logs}");
            let warning = "making single requests from now on";
            assert_eq!(logs.matches(warning).count(), 1, "{code}, {pass}: said once: {logs}");
            assert!(logs.contains(message), "{code}, {pass}: with DynamoDB's reason: {logs}");
            let metrics = logs.lines().find(|line| line.contains("\"DynamoDbRequests\"")).expect("metrics line");
            let metrics: Value = serde_json::from_str(metrics).unwrap();
            // Single writes (50 claims, plus 50 completions the first time) and the batched
            // requests already on their way when the first refusal came back: at most the
            // window's first eight. No outbox sweep as `invoke` leaves: the demo handler stages
            // no message.
            let requests = metrics["DynamoDbRequests"].as_u64().unwrap();
            let singles = if pass == "new" { 100 } else { 50 };
            assert!((singles + 1..=singles + 8).contains(&requests), "{code}, {pass}: {requests} requests");
        }
        assert_eq!(log_counts(&dir.path().join("demo.log")).values().sum::<usize>(), 50, "{code}: each key ran once");
    }
}
