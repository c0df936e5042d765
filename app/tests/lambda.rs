//! The compiled binary as Lambda runs it: started with `AWS_LAMBDA_RUNTIME_API`
//! pointing at a Runtime API server, on the real `lambda_runtime` loop, with
//! claims in DynamoDB Local.

use crate::common;

use std::{path::Path, sync::atomic::Ordering, time::Duration};

use crate::common::{
    delay::DelayProxy,
    function::{Function, wait_for},
    runtime_api::Answer,
    sqs::{LARGEST_MESSAGE, body_of_size},
};
use serde_json::{Value, json};
use sqs_once::store::{ClaimAdmin, ClaimQuery, ClaimStatus};

/// `AWS_LAMBDA_INITIALIZATION_TYPE` of an environment initialized ahead of
/// its invocations.
const PROVISIONED: &str = "provisioned-concurrency";

fn sample(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../events").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn failures(answer: &Answer) -> Vec<String> {
    let Answer::Response(response) = answer else { panic!("expected a response, got {answer:?}") };
    common::failed_ids(response)
}

fn ids(numbers: &[u32], prefix: &str) -> Vec<String> {
    numbers.iter().map(|n| format!("{prefix}{n:012}")).collect()
}

fn batch(bodies: &[Value]) -> Value {
    let records: Vec<Value> = bodies
        .iter()
        .enumerate()
        .map(|(n, body)| json!({"messageId": format!("m-{n}"), "body": body.to_string(), "eventSource": "aws:sqs"}))
        .collect();
    json!({ "Records": records })
}

const SECONDS_30: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_batches_report_exactly_their_failures_and_the_process_keeps_serving() {
    let function = Function::start(&[("SQS_ONCE_KEY", "body.order_id")]).await;
    // Mixed directives, in-batch duplicates, a panic and a non-JSON body under a body key.
    let answer = function.invoke(&sample("batch.json"), SECONDS_30).await;
    assert_eq!(failures(&answer), ids(&[5, 6, 7, 8], "b0000000-0000-4000-8000-"));
    let logs = function.logs(10).await;
    let outcome = |id: &str| {
        logs.iter().find(|line| line["message_id"] == id).map(|line| line["outcome"].as_str().unwrap().to_owned())
    };
    assert_eq!(outcome("b0000000-0000-4000-8000-000000000007").as_deref(), Some("panicked"));
    // The panic's own line says which invocation it happened in.
    let panic = logs.iter().find(|line| line["message"] == "panic").expect("a panic line");
    assert!(panic["span"]["requestId"].is_string(), "{panic}");
    assert_eq!(outcome("b0000000-0000-4000-8000-000000000008").as_deref(), Some("missing_key"));
    assert!(logs.iter().all(|line| line.get("body").is_none()), "bodies are not logged by default");

    // The panic stayed in its record: the same process answers the next event.
    let answer = function.invoke(&sample("single.json"), SECONDS_30).await;
    assert!(failures(&answer).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sns_notifications_are_handled_by_their_message_and_a_bare_body_fails_alone() {
    let function = Function::start(&[("SQS_ONCE_ENVELOPE", "sns"), ("SQS_ONCE_KEY", "envelope.MessageId")]).await;
    // o-77 arrives twice (one SNS publish, two SQS messages); o-78's message asks to fail.
    let answer = function.invoke(&sample("sns.json"), SECONDS_30).await;
    assert_eq!(failures(&answer), ["c0000000-0000-4000-8000-000000000003"]);
    let answer = function.invoke(&batch(&[json!({"order_id": "o-79"})]), SECONDS_30).await;
    assert_eq!(failures(&answer), ["m-0"]);
    wait_for(&function.stderr, |lines| lines.iter().filter(|line| line.contains(r#""outcome""#)).count() >= 4).await;
    let logs = function.logs(4).await;
    let outcomes: Vec<&str> = logs.iter().filter_map(|line| line["outcome"].as_str()).collect();
    // o-77's second message is a copy of the first in the batch: a duplicate of its run.
    assert_eq!(outcomes, ["processed", "duplicate", "retryable", "invalid_record"]);
    let invalid = logs.iter().find(|line| line["outcome"] == "invalid_record").unwrap();
    let reason = invalid["reason"].as_str().unwrap();
    assert!(reason.starts_with("invalid record: body is not an SNS notification"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_batch_stops_its_failed_group_only() {
    let function = Function::start(&[]).await;
    let answer = function.invoke(&sample("fifo.json"), SECONDS_30).await;
    assert_eq!(failures(&answer), ids(&[3, 5], "f0000000-0000-4000-8000-"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_deadline_is_answered_in_time_with_the_unfinished_records() {
    // 2.5 s for the two quick records: room for the arm64 build under emulation on a loaded machine.
    let function = Function::start(&[("SQS_ONCE_DEADLINE_MARGIN_MS", "500")]).await;
    let event = batch(&[json!({}), json!({"sleep_ms": 10_000}), json!({}), json!({"sleep_ms": 10_000})]);
    let answer = function.invoke(&event, Duration::from_millis(3000)).await;
    assert_eq!(failures(&answer), ["m-1", "m-3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_the_largest_size_are_handled_and_answered() {
    let function = Function::start(&[]).await;
    let full = |fields| serde_json::from_str(&body_of_size(fields, LARGEST_MESSAGE)).unwrap();
    let event = batch(&[full(json!({"n": 0})), full(json!({"n": 1, "fail": "retryable"})), json!({"n": 2})]);
    assert_eq!(failures(&function.invoke(&event, SECONDS_30).await), ["m-1"]);
    // Delivered again: the two that succeeded are duplicates, the one that failed runs again.
    assert_eq!(failures(&function.invoke(&event, SECONDS_30).await), ["m-1"]);
    let metrics = function.metrics(2).await;
    assert_eq!((metrics[1]["Duplicates"].as_u64(), metrics[1]["FailedRetryable"].as_u64()), (Some(2), Some(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_process_answers_redeliveries_as_duplicates_without_dynamodb_requests() {
    let function = Function::start(&[]).await;
    let event = batch(&(0..10).map(|n| json!({"n": n})).collect::<Vec<_>>());
    assert!(failures(&function.invoke(&event, SECONDS_30).await).is_empty());
    assert!(failures(&function.invoke(&event, SECONDS_30).await).is_empty());
    let metrics = function.metrics(2).await;
    assert_eq!(metrics.len(), 2, "one metrics line per invocation");
    assert_eq!(metrics[0]["Processed"].as_u64(), Some(10));
    // Claims share requests, and so do completions (20 writes as single requests).
    let requests = metrics[0]["DynamoDbRequests"].as_u64().unwrap();
    assert!((2..=10).contains(&requests), "{requests} requests for 10 new records");
    assert_eq!((metrics[1]["Duplicates"].as_u64(), metrics[1]["DynamoDbRequests"].as_u64()), (Some(10), Some(0)));
    assert_eq!(metrics[1]["FunctionName"], "sqs-once-test");
    assert_eq!(metrics[1]["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([["FunctionName"]]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_provisioned_concurrency_the_init_phase_opens_the_connections_the_first_batch_needs() {
    let proxy = DelayProxy::start(&common::dynamodb::endpoint(), Duration::from_millis(5)).await.unwrap();
    let store = common::fresh_table().await;
    let envs = [("AWS_ENDPOINT_URL_DYNAMODB", proxy.url.as_str()), ("AWS_LAMBDA_INITIALIZATION_TYPE", PROVISIONED)];
    let function = Function::start_on(&store.layout().table, &envs).await;
    function.api.initialized().await;
    // Eight requests at once at most: as many as the window's first requests of a kind.
    assert_eq!(proxy.connections.load(Ordering::SeqCst), 8, "connections open when the function asks for an event");
    // Eight new records have at most eight requests under way (each its claim, then its completion).
    let event = batch(&(0..8).map(|n| json!({"n": n})).collect::<Vec<_>>());
    assert!(failures(&function.invoke(&event, SECONDS_30).await).is_empty());
    assert_eq!(proxy.connections.load(Ordering::SeqCst), 8, "the first batch opened connections of its own");
    let completed = ClaimQuery { status: Some(ClaimStatus::Completed), limit: 100, ..ClaimQuery::default() };
    assert_eq!(store.list(&completed).await.unwrap().claims.len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_init_phase_registers_an_extension_so_that_lambda_sends_sigterm() {
    let function = Function::start(&[]).await;
    function.api.initialized().await;
    let extensions = function.api.extensions();
    assert_eq!(extensions.len(), 1, "{extensions:?}");
    assert_eq!(extensions[0].name, "sqs-once-shutdown");
    assert_eq!(extensions[0].events, json!([]), "internal, subscribed to no event");
    assert!(extensions[0].in_init, "registered before the function asked for its first event");
    assert!(failures(&function.invoke(&batch(&[json!({"n": 1})]), SECONDS_30).await).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_the_init_phase_opens_no_connection() {
    let proxy = DelayProxy::start(&common::dynamodb::endpoint(), Duration::from_millis(5)).await.unwrap();
    let store = common::fresh_table().await;
    let envs = [("AWS_ENDPOINT_URL_DYNAMODB", proxy.url.as_str()), ("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand")];
    let function = Function::start_on(&store.layout().table, &envs).await;
    function.api.initialized().await;
    // An invocation waits for the init phase: connecting there would only add a round trip.
    assert_eq!(proxy.connections.load(Ordering::SeqCst), 0);
    let event = batch(&[json!({"n": 1})]);
    assert!(failures(&function.invoke(&event, SECONDS_30).await).is_empty());
    assert!(proxy.connections.load(Ordering::SeqCst) > 0, "the batch went through the proxy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_that_is_not_sqs_is_an_invocation_error_and_the_process_keeps_serving() {
    let function = Function::start(&[]).await;
    let answer = function.invoke(&json!({"detail-type": "Scheduled Event", "source": "aws.events"}), SECONDS_30).await;
    let Answer::Error(error) = answer else { panic!("expected an error, got {answer:?}") };
    assert_eq!(error["errorType"], "InvalidEvent");
    assert!(error["errorMessage"].as_str().unwrap().contains("not an SQS event"), "{error}");
    let answer = function.invoke(&batch(&[json!({})]), SECONDS_30).await;
    assert!(failures(&answer).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_configuration_fails_the_init_phase_with_one_clear_line() {
    let mut function = Function::start(&[("SQS_ONCE_HANDLER", "nope")]).await;
    let status = tokio::time::timeout(Duration::from_secs(20), function.process.wait()).await.unwrap().unwrap();
    assert!(!status.success());
    wait_for(&function.stderr, |lines| !lines.is_empty()).await;
    let stderr = function.stderr.lock().unwrap().clone();
    assert_eq!(stderr.len(), 1, "{stderr:?}");
    // Under AWS_LAMBDA_LOG_FORMAT=JSON, the init error's line is JSON too.
    let line: Value = serde_json::from_str(&stderr[0]).unwrap_or_else(|_| panic!("not JSON: {stderr:?}"));
    assert_eq!(line["level"], "ERROR");
    assert!(line["message"].as_str().unwrap().contains("unknown handler `nope`"), "{stderr:?}");
    let init_errors = function.api.init_errors();
    assert_eq!(init_errors.len(), 1);
    assert!(init_errors[0]["errorMessage"].as_str().unwrap().contains("registered handlers are demo, ledger, orders"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_sent_as_a_timeout_is_counted_from_now() {
    // `cargo lambda watch` sends the function timeout (ms) where Lambda sends an epoch deadline.
    let function = Function::start(&[]).await;
    let event = batch(&[json!({}), json!({"sleep_ms": 50})]);
    let (answer, _, _) = function.api.invoke_with_deadline_header(&event, SECONDS_30, 30_000).await.expect("no answer");
    assert!(failures(&answer).is_empty(), "{answer:?}");
}

#[tokio::test]
async fn failed_records_back_off_and_permanent_ones_leave_for_the_dead_letter_queue() {
    let (queue, dead_letters) =
        (common::sqs::Queue::create(false, 60).await, common::sqs::Queue::create(false, 60).await);
    let bodies = [json!({"fail": "retryable"}), json!({"fail": "permanent"}), json!({"ok": true})];
    queue.send(&bodies).await;
    let messages = queue.receive(3).await;
    let id_of = |directive: &str| {
        let message = messages.iter().find(|message| message.body.as_deref().unwrap().contains(directive)).unwrap();
        message.message_id.clone().unwrap()
    };
    let function = Function::start(&[
        ("AWS_ENDPOINT_URL_SQS", &common::sqs::endpoint()),
        ("SQS_ONCE_DLQ_URL", dead_letters.url()),
        ("SQS_ONCE_RETRY_BASE_SECS", "3"),
    ])
    .await;
    let before = common::sqs::now_ms();
    let answer = function.invoke(&queue.event(&messages), Duration::from_secs(10)).await;
    let after = common::sqs::now_ms();
    assert_eq!(failures(&answer), [id_of("retryable")], "the dead-lettered record is reported done");

    let metrics = &function.metrics(1).await[0];
    assert_eq!((metrics["VisibilityChanged"].as_u64(), metrics["DeadLettered"].as_u64()), (Some(1), Some(1)));
    let moved = &dead_letters.receive(1).await[0];
    assert_eq!(moved.body.as_deref(), Some(r#"{"fail":"permanent"}"#));
    let retry_at = common::sqs::visible_at()[&id_of("retryable")];
    assert!(retry_at >= before + 3_000 && retry_at <= after + 3_000 + 600 + 2_000, "{}", retry_at - before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_invocations_claim_is_taken_over_by_a_delivery_after_its_lease() {
    let store = common::fresh_table().await;
    let table = store.layout().table.clone();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("demo.log").display().to_string();
    let envs = [("SQS_ONCE_LEASE_MARGIN_MS", "1000"), ("SQS_ONCE_DEMO_LOG", log.as_str())];
    let event = batch(&[json!({"sleep_ms": 1500})]);
    let runs = || std::fs::read_to_string(&log).unwrap_or_default().lines().count();

    // The first environment dies (killed, as Lambda ends a crashed or timed-out one) while its handler runs.
    let mut first = Function::start_on(&table, &envs).await;
    first.api.initialized().await;
    let deadline_ms = common::sqs::now_ms() + 3_000;
    let invoked = first.api.invoke_with_deadline_header(&event, Duration::from_secs(3), deadline_ms);
    let crash = async {
        while runs() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        first.process.start_kill().unwrap();
    };
    tokio::select! {
        _ = invoked => panic!("the first environment answered before it was killed"),
        () = crash => {}
    }
    let query = sqs_once::store::ClaimQuery { limit: 10, ..Default::default() };
    let open = sqs_once::store::ClaimAdmin::list(&store, &query).await.unwrap().claims;
    let [claim] = open.as_slice() else { panic!("one open claim, the crashed run's: {open:?}") };
    assert_eq!(claim.lease_until_ms, Some(deadline_ms + 1000), "Lambda mode leases until the deadline plus the margin");

    // A copy delivered to a second environment while the lease is live is a conflict; after it, a takeover.
    let second = Function::start_on(&table, &envs).await;
    assert_eq!(failures(&second.invoke(&event, SECONDS_30).await), ["m-0"], "a conflict while the lease is live");
    while common::sqs::now_ms() <= deadline_ms + 1000 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(failures(&second.invoke(&event, SECONDS_30).await).is_empty(), "taken over after the lease");
    assert_eq!(runs(), 2, "the crashed run, and the one that took over");
    let metrics = second.metrics(2).await;
    assert_eq!((metrics[0]["Conflicts"].as_u64(), metrics[1]["Processed"].as_u64()), (Some(1), Some(1)));
}

/// How long past now (seconds) the one completed claim of `store` is remembered.
async fn remembered_for_s(store: &sqs_once::store::DynamoDbStore) -> u64 {
    let query = ClaimQuery { status: Some(ClaimStatus::Completed), limit: 10, ..ClaimQuery::default() };
    let claims = ClaimAdmin::list(store, &query).await.unwrap().claims;
    assert_eq!(claims.len(), 1, "{claims:?}");
    claims[0].expires_at_s - common::sqs::now_ms() / 1000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_function_remembers_keys_past_its_queues_own_visibility_timeout() {
    // Keys remembered a minute, no back-off: a completion is kept past its lease for twice the longest a failed
    // record stays away, which is the queue's visibility timeout, 120 s.
    for told in [None, Some("30"), Some("300")] {
        let queue = common::sqs::Queue::create(false, 120).await;
        queue.send(&[json!({"n": 1})]).await;
        let event = queue.event(&queue.receive(1).await);
        let store = common::fresh_table().await;
        let mut envs = vec![
            ("SQS_ONCE_EXPIRES_AFTER_SECS", "60"),
            ("SQS_ONCE_RETRY_BASE_SECS", "0"),
            ("SQS_ONCE_CONFLICT_BACKOFF", "off"),
        ];
        let endpoint = common::sqs::endpoint();
        envs.push(("AWS_ENDPOINT_URL_SQS", &endpoint));
        envs.extend(told.map(|told| ("SQS_ONCE_VISIBILITY_TIMEOUT_SECS", told)));
        let function = Function::start_on(&store.layout().table, &envs).await;
        assert_eq!(failures(&function.invoke(&event, SECONDS_30).await), Vec::<String>::new());
        let remembered = remembered_for_s(&store).await;
        let output = function.output();
        match told {
            // Unset: the queue's 120 s, not SQS's longest (a day past the lease).
            None => assert!((270..=300).contains(&remembered), "{remembered} s\n{output}"),
            // Shorter than the queue's: the queue's counts, and the setting is named.
            Some("30") => {
                assert!((270..=300).contains(&remembered), "{remembered} s\n{output}");
                assert!(output.contains("SQS_ONCE_VISIBILITY_TIMEOUT_SECS is shorter"), "{output}");
            }
            // Longer: the setting counts.
            _ => assert!((630..=660).contains(&remembered), "{remembered} s\n{output}"),
        }
    }
}
