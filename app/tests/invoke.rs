//! The `sqs-once invoke` command, run as a user runs it.

use crate::common;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use serde_json::{Value, json};

/// A folder with an event file, a claims database and a demo log.
struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    fn new() -> Self {
        Self { dir: tempfile::tempdir().unwrap() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn event(&self, name: &str, bodies: &[Value]) -> PathBuf {
        let records: Vec<Value> = bodies
            .iter()
            .enumerate()
            .map(|(n, body)| {
                json!({"messageId": format!("m-{n:04}"), "body": body.to_string(), "eventSource": "aws:sqs",
                       "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {}})
            })
            .collect();
        let path = self.path(name);
        std::fs::write(&path, json!({ "Records": records }).to_string()).unwrap();
        path
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = common::command_in(self.dir.path());
        command.args(args);
        command
    }

    fn invoke(&self, args: &[&str]) -> Output {
        self.invoke_with(args, &[])
    }

    fn invoke_with(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        self.command(args).envs(envs.iter().copied()).output().unwrap()
    }

    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("demo.log")).unwrap_or_default().lines().map(str::to_owned).collect()
    }
}

fn failures(output: &Output) -> Vec<String> {
    assert!(output.status.success(), "invoke failed: {}", String::from_utf8_lossy(&output.stderr));
    common::failed_ids(&serde_json::from_slice(&output.stdout).expect("stdout is one JSON object"))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_second_invoke_of_the_same_event_runs_no_handler() {
    let ws = Workspace::new();
    let event = ws.event("event.json", &(0..50).map(|n| json!({"n": n})).collect::<Vec<_>>());
    let first = ws.invoke(&["invoke", event.to_str().unwrap()]);
    assert_eq!(failures(&first), Vec::<String>::new());
    assert_eq!(ws.log().len(), 50);
    let second = ws.invoke(&["invoke", event.to_str().unwrap()]);
    assert_eq!(failures(&second), Vec::<String>::new());
    assert_eq!(ws.log().len(), 50, "the second run ran no handler");
    assert_eq!(stderr(&second).matches("outcome=\"duplicate\"").count(), 50);
}

#[test]
fn log_lines_carry_no_record_spans_even_at_the_most_verbose_level() {
    let ws = Workspace::new();
    // The panic's line is logged inside the handler's span, under the record's and the batch's.
    let event = ws.event("event.json", &[json!({"n": 1}), json!({"fail": "panic"})]);
    let output = ws.invoke_with(&["invoke", event.to_str().unwrap()], &[("SQS_ONCE_LOG", "trace")]);
    assert_eq!(failures(&output), ["m-0001"]);
    let stderr = stderr(&output);
    assert!(stderr.contains("batch received") && stderr.contains("asked to panic"), "{stderr}");
    for span_field in ["messaging.", "sqs_once.", "process{", "handler{", "claim{"] {
        assert!(!stderr.contains(span_field), "{span_field} in the log lines: {stderr}");
    }
}

#[test]
fn the_sample_batch_reports_its_failing_directives_and_reads_stdin() {
    let ws = Workspace::new();
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../events/batch.json");
    let mut child = ws
        .command(&["invoke", "-"])
        .env("SQS_ONCE_KEY", "body.order_id")
        .stdin(std::fs::File::open(sample).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take();
    let output = child.wait_with_output().unwrap();
    let expected: Vec<String> = [5, 6, 7, 8].iter().map(|n| format!("b0000000-0000-4000-8000-{n:012}")).collect();
    assert_eq!(failures(&output), expected);
    assert_eq!(
        ws.log().len(),
        7,
        "8 keyed records, one an in-batch duplicate of o-2 and one of o-1: 10 - 2 - 1 without a key"
    );
}

#[test]
fn two_processes_racing_on_one_batch_run_each_key_once() {
    let ws = Workspace::new();
    // Ten records at a time, 10 ms each: each process alone would take about 300 ms, so they overlap.
    let bodies: Vec<Value> = (0..300).map(|_| json!({"sleep_ms": 10})).collect();
    let event = ws.event("event.json", &bodies);
    let spawn = || {
        ws.command(&["invoke", event.to_str().unwrap()])
            .env("SQS_ONCE_CONCURRENCY", "10")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let (failed_a, failed_b) = (failures(&a), failures(&b));
    let mut runs: HashMap<String, usize> = HashMap::new();
    for line in ws.log() {
        *runs.entry(line.split('\t').nth(1).unwrap().to_owned()).or_default() += 1;
    }
    assert!(runs.values().all(|&count| count == 1), "a key ran twice");
    assert_eq!(runs.len(), 300, "every key ran once in total");
    // A record one process lost to the other's live claim is failed there, never lost.
    assert!(failed_a.iter().all(|id| !failed_b.contains(id)), "a record failed in both processes");
    // And the race happened: both processes ran handlers.
    let processed = |output: &Output| stderr(output).matches("outcome=\"processed\"").count();
    assert!(processed(&a) > 0 && processed(&b) > 0, "no race: {} and {}", processed(&a), processed(&b));
    assert_eq!(processed(&a) + processed(&b), 300);
}

#[test]
fn bad_input_exits_non_zero_with_one_clear_line() {
    let ws = Workspace::new();
    std::fs::write(ws.path("broken.json"), "{ nope").unwrap();
    std::fs::write(ws.path("other.json"), r#"{"detail-type": "Scheduled Event"}"#).unwrap();
    std::fs::write(ws.path("no-id.json"), r#"{"Records": [{"body": "x"}]}"#).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["invoke", "missing.json"], "cannot read missing.json"),
        (&["invoke", "broken.json"], "broken.json cannot be processed: not JSON"),
        (&["invoke", "other.json"], "not an SQS event"),
        (&["invoke", "no-id.json"], "record 0 has no messageId"),
        (&["invoke", "other.json", "--timeout", "0"], "--timeout must be a positive number"),
    ];
    for (args, expected) in cases {
        let output = ws.invoke(args);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(output.stdout.is_empty(), "{args:?} printed a response");
        assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
        assert!(stderr(&output).contains(expected), "{args:?}: {}", stderr(&output));
    }
    let event = ws.event("ok.json", &[json!({})]);
    let config_errors = [
        ("SQS_ONCE_HANDLER", "nope", "registered handlers are demo, ledger, orders"),
        ("SQS_ONCE_HANDLER", "ledger", "handler `ledger` cannot start: SQS_ONCE_LEDGER_TABLE is not set"),
        ("SQS_ONCE_OUTBOX_SWEEP_SECS", "soon", "SQS_ONCE_OUTBOX_SWEEP_SECS"),
        ("SQS_ONCE_ON_MISSING_KEY", "skip", "expected fail or message-id"),
        ("SQS_ONCE_STORE", "redis", "expected dynamodb, file or memory"),
        ("SQS_ONCE_CONCURRENCY", "0", "SQS_ONCE_CONCURRENCY"),
        (
            "SQS_ONCE_KEY",
            "header.x",
            "invalid SQS_ONCE_KEY=\"header.x\": expected messageId, body.<path>, envelope.<path>, attributes.<Name> or messageAttributes.<Name>, comma-separated for a composite key (`header.x` is none of these)",
        ),
        ("SQS_ONCE_ENVELOPE", "kinesis", "expected none, sns or eventbridge"),
        ("SQS_ONCE_KEY", "envelope.MessageId", "while SQS_ONCE_ENVELOPE is none"),
        ("SQS_ONCE_DEMO_LOG", "/nonexistent/demo.log", "handler `demo` cannot start: cannot open SQS_ONCE_DEMO_LOG"),
    ];
    for (name, value, expected) in config_errors {
        let output = ws.invoke_with(&["invoke", event.to_str().unwrap()], &[(name, value)]);
        assert!(!output.status.success(), "{name}={value} accepted");
        assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
        assert!(stderr(&output).contains(expected), "{name}: {}", stderr(&output));
    }
}

#[test]
fn inside_lambda_a_table_is_required() {
    let ws = Workspace::new();
    let event = ws.event("ok.json", &[json!({})]);
    let output = ws.invoke_with(&["invoke", event.to_str().unwrap()], &[("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001")]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("SQS_ONCE_TABLE"), "{}", stderr(&output));
    assert!(stderr(&output).contains("inside Lambda, claims must be kept in DynamoDB"), "{}", stderr(&output));
}

fn sample(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../events").join(name).to_str().unwrap().to_owned()
}

/// The keys the demo handler ran with, sorted.
fn keys_run(ws: &Workspace) -> Vec<String> {
    let mut keys: Vec<String> = ws.log().iter().map(|line| line.split('\t').next().unwrap().to_owned()).collect();
    keys.sort();
    keys
}

#[test]
fn sns_notifications_are_keyed_logged_and_handled_by_the_message_inside() {
    let unhashed = [("SQS_ONCE_HASH_KEYS", "false"), ("SQS_ONCE_LOG_BODIES", "true"), ("SQS_ONCE_ENVELOPE", "sns")];
    for key in ["body.order_id", "envelope.MessageId"] {
        let ws = Workspace::new();
        let output =
            ws.invoke_with(&["invoke", &sample("sns.json")], &[unhashed.as_slice(), &[("SQS_ONCE_KEY", key)]].concat());
        // The directive inside o-78's message is obeyed; SNS's second copy of o-77 does not run.
        assert_eq!(failures(&output), ["c0000000-0000-4000-8000-000000000003"], "{key}");
        assert_eq!(ws.log().len(), 2, "{key}: {:?}", ws.log());
        let logged = stderr(&output);
        assert!(logged.contains(r#"body="{\"order_id\":\"o-77\",\"amount_cents\":2599}""#), "{logged}");
        assert!(!logged.contains("Notification"), "the envelope is not logged as the body: {logged}");
    }
    let ws = Workspace::new();
    let keyed = [("SQS_ONCE_ENVELOPE", "sns"), ("SQS_ONCE_KEY", "body.order_id"), ("SQS_ONCE_HASH_KEYS", "false")];
    ws.invoke_with(&["invoke", &sample("sns.json")], &keyed);
    assert_eq!(keys_run(&ws), ["sqs-once#o-77", "sqs-once#o-78"]);
}

#[test]
fn a_key_path_enters_the_json_string_of_an_envelope_left_closed() {
    let ws = Workspace::new();
    let settings = [("SQS_ONCE_KEY", "body.Message.order_id"), ("SQS_ONCE_HASH_KEYS", "false")];
    let output = ws.invoke_with(&["invoke", &sample("sns.json")], &settings);
    // The handler gets the envelope, so the directive inside the message is not seen.
    assert_eq!(failures(&output), Vec::<String>::new());
    // SNS's two copies of o-77 share one run.
    assert_eq!(keys_run(&ws), ["sqs-once#o-77", "sqs-once#o-78"]);
}

#[test]
fn eventbridge_events_are_keyed_and_handled_by_their_detail() {
    for key in ["body.order_id", "envelope.id"] {
        let ws = Workspace::new();
        let settings = [("SQS_ONCE_ENVELOPE", "eventbridge"), ("SQS_ONCE_KEY", key), ("SQS_ONCE_LOG_BODIES", "true")];
        let output = ws.invoke_with(&["invoke", &sample("eventbridge.json")], &settings);
        assert_eq!(failures(&output), Vec::<String>::new(), "{key}");
        assert_eq!(ws.log().len(), 2, "{key}: the second copy of one event does not run");
        assert!(
            stderr(&output).contains(r#"body="{\"order_id\":\"o-91\",\"amount_cents\":750}""#),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn a_body_that_is_not_the_envelope_fails_alone_with_its_reason() {
    let ws = Workspace::new();
    let notification = |message: &str| {
        json!({"Type": "Notification", "MessageId": "sns-1", "TopicArn": "arn:aws:sns:us-east-1:123456789012:t",
               "Timestamp": "2026-11-23T10:00:00.000Z", "Message": message})
    };
    let event = ws.event(
        "event.json",
        &[notification(r#"{"order_id":"o-1"}"#), json!({"order_id": "o-2"}), notification("order o-3, not JSON")],
    );
    let settings = [("SQS_ONCE_ENVELOPE", "sns"), ("SQS_ONCE_KEY", "body.order_id")];
    let output = ws.invoke_with(&["invoke", event.to_str().unwrap()], &settings);
    assert_eq!(failures(&output), ["m-0001", "m-0002"]);
    assert_eq!(ws.log().len(), 1);
    let logged = stderr(&output);
    assert!(logged.contains("outcome=\"invalid_record\""), "{logged}");
    assert!(logged.contains("body is not an SNS notification"), "{logged}");
    assert!(logged.contains("outcome=\"missing_key\""), "{logged}");
    assert!(logged.contains("body.order_id: body is not JSON"), "{logged}");
}

#[test]
fn a_key_is_remembered_for_exactly_the_configured_expiry() {
    let ws = Workspace::new();
    let event = ws.event("event.json", &[json!({"n": 1})]);
    let remembered_for = |secs: &str| {
        let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let output = ws.invoke_with(&["invoke", event.to_str().unwrap()], &[("SQS_ONCE_EXPIRES_AFTER_SECS", secs)]);
        assert_eq!(failures(&output), Vec::<String>::new());
        let shown =
            ws.command(&["claims", "show", "m-0000", "--json"]).env("SQS_ONCE_KEY", "messageId").output().unwrap();
        assert!(shown.status.success(), "{}", stderr(&shown));
        let claim: Value = serde_json::from_slice::<Value>(&shown.stdout).unwrap()[0].clone();
        claim["expires_at_s"].as_u64().unwrap() - before
    };
    // Remembered for 2 s: the same message is a duplicate until then, and runs again after.
    assert!((2..=3).contains(&remembered_for("2")));
    let again = ws.invoke_with(&["invoke", event.to_str().unwrap()], &[("SQS_ONCE_EXPIRES_AFTER_SECS", "2")]);
    assert_eq!((failures(&again), ws.log().len()), (vec![], 1), "a duplicate within the expiry");
    std::thread::sleep(std::time::Duration::from_secs(3));
    let later = remembered_for("86400");
    assert_eq!(ws.log().len(), 2, "run again once the key was forgotten");
    assert!((86_400..=86_401).contains(&later), "{later}");
}

#[test]
fn a_long_running_consumer_without_a_store_named_refuses_to_start_and_invoke_keeps_the_local_file() {
    let dir = tempfile::tempdir().unwrap();
    let unnamed = || {
        let mut command = common::command_in(dir.path());
        command.env_remove("SQS_ONCE_STORE_PATH");
        command
    };
    let queue = "https://sqs.us-east-1.amazonaws.com/123456789012/work";
    let polled = unnamed().args(["poll", "--queue-url", queue]).output().unwrap();
    let refused = stderr(&polled);
    assert_eq!(polled.status.code(), Some(1), "{refused}");
    assert!(refused.contains("SQS_ONCE_TABLE") && refused.contains("SQS_ONCE_STORE=file"), "{refused}");
    assert!(!dir.path().join(".sqs-once").exists(), "no claims kept where no other consumer would see them");
    // `invoke`, there for trying things out, keeps them in the local file.
    let invoked = unnamed().args(["invoke", &sample("batch.json")]).output().unwrap();
    assert!(invoked.status.success(), "{}", stderr(&invoked));
    assert!(dir.path().join(".sqs-once/claims.db").exists());
}

#[test]
fn a_misspelt_store_setting_stops_the_start_naming_the_one_it_most_likely_means() {
    let ws = Workspace::new();
    let event = ws.event("event.json", &[json!({"n": 1})]);
    let output = ws.invoke_with(&["invoke", event.to_str().unwrap()], &[("SQS_ONCE_TABLE_NAME", "claims")]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("SQS_ONCE_TABLE_NAME") && stderr(&output).contains("Did you mean SQS_ONCE_TABLE?")
    );
    assert!(ws.log().is_empty(), "no record ran");
    // One that decides nothing is reported, and the start goes on.
    let output = ws.invoke_with(&["invoke", event.to_str().unwrap()], &[("SQS_ONCE_CONCURENCY", "8")]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).contains(
        "SQS_ONCE_CONCURENCY is not a setting of sqs-once and is ignored: did you mean SQS_ONCE_CONCURRENCY?"
    ));
}
