//! The function under AWS's own Runtime Interface Emulator, the one SAM CLI
//! runs in its containers (shipped in the `aws-sam-cli` wheel, which the test
//! command installs), without Docker: natively, or the arm64 artifact through
//! `SQS_ONCE_TEST_RUNNER`. The emulator does what the project's Runtime API
//! harness (tests/lambda.rs) does not: it tries a failed init again at every
//! invocation, counts the init against the first deadline, kills a function
//! that answers late and starts a new one at the next invocation, passes a
//! caller's client context on, and sends no trace id. The harness keeps what
//! the emulator cannot do: freezes, and deadlines to the millisecond.

use crate::common;

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use crate::common::delay::DelayProxy;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    process::{Child, Command},
};

/// The emulator's binary for this machine: `SQS_ONCE_RIE`, or the one in the
/// test command's SAM CLI installation.
fn emulator_binary() -> PathBuf {
    if let Ok(path) = std::env::var("SQS_ONCE_RIE") {
        return PathBuf::from(path);
    }
    let arch = if cfg!(target_arch = "aarch64") { "arm64" } else { "x86_64" };
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/venv/lib");
    std::fs::read_dir(&lib)
        .into_iter()
        .flatten()
        .flatten()
        .map(|python| python.path().join(format!("site-packages/samcli/local/rapid/aws-lambda-rie-{arch}")))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no aws-lambda-rie-{arch} under {}: run scripts/test once (it installs SAM CLI), or set SQS_ONCE_RIE",
                lib.display()
            )
        })
}

/// A port nobody listens on, for the emulator to take.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The emulator running the function, and what both printed.
struct Emulator {
    process: Child,
    address: String,
    dir: tempfile::TempDir,
}

impl Emulator {
    /// The emulator with the function timeout `timeout_secs`, claims in a
    /// fresh table on DynamoDB Local, and `envs` on top.
    async fn start(timeout_secs: u32, envs: &[(&str, &str)]) -> Self {
        let table = common::fresh_table().await.layout().table.clone();
        let mut settings = vec![
            ("SQS_ONCE_TABLE".to_owned(), table),
            ("AWS_ENDPOINT_URL_DYNAMODB".to_owned(), common::dynamodb::endpoint()),
            ("AWS_LAMBDA_FUNCTION_TIMEOUT".to_owned(), timeout_secs.to_string()),
        ];
        settings.extend(envs.iter().map(|(name, value)| (name.to_string(), value.to_string())));
        Self::start_with(&settings).await
    }

    async fn start_with(settings: &[(String, String)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let function = common::sqs_once_command();
        let address = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.path().join("emulator.log")).unwrap();
        let mut emulator = Command::new(emulator_binary());
        for name in common::HARNESS {
            emulator.env_remove(name);
        }
        let process = emulator
            .arg("--runtime-interface-emulator-address")
            .arg(&address)
            .arg("--runtime-api-address")
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg(function.get_program())
            .args(function.get_args())
            .env_remove("AWS_LAMBDA_RUNTIME_API")
            .env("SQS_ONCE_DEMO_LOG", dir.path().join("demo.log"))
            .envs(settings.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("start the emulator");
        for _ in 0..200 {
            if TcpStream::connect(&address).await.is_ok() {
                return Self { process, address, dir };
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the emulator is not listening on {address}");
    }

    /// Invokes the function as `aws lambda invoke` does, with a client
    /// context (its JSON, base64-encoded on the way) if given; the answer's
    /// body, JSON when it is.
    async fn invoke(&self, event: &Value, client_context: Option<&str>) -> Value {
        self.invoke_with_body(&event.to_string(), client_context).await
    }

    /// [`invoke`](Self::invoke), with the request's body as it is.
    async fn invoke_with_body(&self, body: &str, client_context: Option<&str>) -> Value {
        let mut request = format!(
            "POST /2015-03-31/functions/function/invocations HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n",
            self.address,
            body.len()
        );
        if let Some(context) = client_context {
            request.push_str(&format!("X-Amz-Client-Context: {}\r\n", base64(context.as_bytes())));
        }
        request.push_str("\r\n");
        request.push_str(body);
        let mut stream = TcpStream::connect(&self.address).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let (_, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP answer: {answer}"));
        serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()))
    }

    /// What the emulator and the function printed so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("emulator.log")).unwrap()
    }

    /// How many times the emulator started the function's init.
    fn inits(&self) -> usize {
        self.log().matches("INIT START").count()
    }

    /// Each key's side-effect runs, from the demo handler's log.
    fn runs(&self) -> std::collections::BTreeMap<String, usize> {
        let log = std::fs::read_to_string(self.dir.path().join("demo.log")).unwrap_or_default();
        let mut runs = std::collections::BTreeMap::new();
        for line in log.lines() {
            let message_id = line.split('\t').nth(1).unwrap().to_owned();
            *runs.entry(message_id).or_default() += 1;
        }
        runs
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.process.start_kill();
    }
}

/// Standard base64, as the Lambda API carries a client context.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut text = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, byte)| n | u32::from(*byte) << (16 - 8 * i));
        for i in 0..4 {
            let sextet = (n >> (18 - 6 * i)) & 63;
            text.push(if i <= chunk.len() { ALPHABET[sextet as usize] as char } else { '=' });
        }
    }
    text
}

fn sample(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../events").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn failures(answer: &Value) -> Vec<String> {
    common::failed_ids(answer).into_iter().map(|id| id[id.len() - 2..].to_owned()).collect()
}

/// A batch whose records all come at delivery `receive_count`.
fn batch(bodies: &[(&str, Value)], receive_count: u32) -> Value {
    let records: Vec<Value> = bodies
        .iter()
        .map(|(id, body)| {
            json!({
                "messageId": id,
                "receiptHandle": format!("handle-{id}"),
                "body": body.to_string(),
                "attributes": { "ApproximateReceiveCount": receive_count.to_string() },
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:work",
            })
        })
        .collect();
    json!({ "Records": records })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_error_is_reported_and_the_init_tried_again_at_every_invocation() {
    let emulator = Emulator::start(5, &[("SQS_ONCE_KEY", "bogus")]).await;
    for _ in 0..2 {
        let answer = emulator.invoke(&sample("single.json"), None).await;
        assert_eq!(answer["errorType"], "Runtime.ConfigError", "{answer}");
        assert!(answer["errorMessage"].as_str().unwrap().starts_with("invalid SQS_ONCE_KEY=\"bogus\""), "{answer}");
    }
    // Once as the emulator starts, then once more for each invocation.
    assert_eq!(emulator.inits(), 3, "{}", emulator.log());
    assert!(emulator.runs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_context_that_does_not_parse_is_served_by_the_same_process() {
    let emulator = Emulator::start(10, &[]).await;
    // `custom` values must be strings in the mobile SDK's shape; Lambda passes any JSON on.
    let answer = emulator.invoke(&sample("batch.json"), Some(r#"{"custom":{"a":1}}"#)).await;
    assert_eq!(failures(&answer), ["05", "06", "07"], "{answer}\n{}", emulator.log());
    let again = emulator.invoke(&sample("batch.json"), Some(r#"{"custom":{"tenant":"t-1"}}"#)).await;
    assert_eq!(failures(&again), ["05", "06", "07"], "a key that failed for good fails again: {again}");
    assert_eq!(emulator.inits(), 1, "one process served both: {}", emulator.log());
    let runs = emulator.runs();
    assert_eq!(runs.len(), 10, "{runs:?}");
    for (message_id, count) in runs {
        // The retryable failure and the panic ran again; the permanent failure did not.
        let retried = message_id.ends_with("05") || message_id.ends_with("07");
        assert_eq!(count, if retried { 2 } else { 1 }, "{message_id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_trace_id_the_samples_answer_and_an_event_that_is_not_sqs_fails_alone() {
    // The emulator sends no `Lambda-Runtime-Trace-Id`, as Lambda does when tracing is off.
    let emulator = Emulator::start(10, &[]).await;
    let answer = emulator.invoke(&sample("fifo.json"), None).await;
    assert_eq!(failures(&answer), ["03", "05"], "{answer}");
    for (body, error) in [("hello", "not JSON"), (r#"{"detail-type": "x"}"#, "not an SQS event")] {
        let answer = emulator.invoke_with_body(body, None).await;
        assert_eq!(answer["errorType"], "InvalidEvent", "{answer}");
        assert!(answer["errorMessage"].as_str().unwrap().starts_with(error), "{answer}");
        assert_eq!(emulator.log().matches(error).count(), 1, "logged once: {}", emulator.log());
    }
    let answer = emulator.invoke(&sample("single.json"), None).await;
    assert_eq!(answer, json!({ "batchItemFailures": [] }));
    assert_eq!(emulator.inits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_is_killed_and_the_next_process_runs_each_key_once() {
    // The first record blocks the function's thread on its first delivery,
    // before its side effect, past the 2 s timeout: the emulator kills the
    // process, claims in flight and all, and starts a new one at the next
    // invocation.
    let emulator = Emulator::start(2, &[]).await;
    let bodies = [("late-1", json!({ "block_first_ms": 4000 })), ("late-2", json!({})), ("late-3", json!({}))];
    let killed = emulator.invoke(&batch(&bodies, 1), None).await;
    assert!(killed.to_string().contains("Task timed out after 2.00 seconds"), "{killed}");
    // SQS delivers the batch again until every record succeeds; the claims
    // of the killed process are other holders' until their leases end.
    let mut answers = Vec::new();
    for delivery in 2..=8 {
        let answer = emulator.invoke(&batch(&bodies, delivery), None).await;
        let done = common::failed_ids(&answer).is_empty();
        answers.push(answer);
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(common::failed_ids(answers.last().unwrap()).is_empty(), "{answers:?}\n{}", emulator.log());
    let again = emulator.invoke(&batch(&bodies, 9), None).await;
    assert_eq!(again, json!({ "batchItemFailures": [] }));
    assert!(emulator.log().contains("outcome=\"duplicate\""));
    // Each side effect ran once: the killed process had started none, and
    // what the next one completed is a duplicate afterwards.
    let runs = emulator.runs();
    assert_eq!(
        runs.into_iter().collect::<Vec<_>>(),
        [("late-1".into(), 1), ("late-2".into(), 1), ("late-3".into(), 1)]
    );
    assert_eq!(emulator.inits(), 2, "a new process after the kill: {}", emulator.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_that_takes_most_of_the_first_deadline_still_answers_by_it() {
    // Run as `sam local invoke` runs it (AWS_SAM_LOCAL, local endpoints): the
    // init then checks that the claim table exists, through a network with a
    // 0.8 s round trip, which takes two of them (the connection, then the
    // request). The first invocation, sent as the emulator starts, waits for
    // the init, and its 3 s count from when it was sent.
    let slow = DelayProxy::start(&common::dynamodb::endpoint(), Duration::from_millis(800)).await.unwrap();
    let sqs = common::sqs::endpoint();
    let envs = [
        ("AWS_SAM_LOCAL", "true"),
        ("AWS_ENDPOINT_URL_DYNAMODB", slow.url.as_str()),
        ("AWS_ENDPOINT_URL_SQS", sqs.as_str()),
        ("AWS_ENDPOINT_URL_SNS", sqs.as_str()),
        ("AWS_ENDPOINT_URL_EVENTBRIDGE", sqs.as_str()),
        ("AWS_ENDPOINT_URL_S3", sqs.as_str()),
    ];
    let emulator = Emulator::start(3, &envs).await;
    let answer = emulator.invoke(&batch(&[("m-1", json!({}))], 1), None).await;
    let log = emulator.log();
    // Answered, not killed: the cut-off came 0.5 s before a deadline that
    // the init had already eaten into, whatever became of the record.
    assert!(answer["batchItemFailures"].is_array(), "{answer}\n{log}");
    assert!(log.contains("deadline margin reached"), "{log}");
    assert_eq!(emulator.inits(), 1, "{log}");
    assert!(emulator.runs().values().all(|runs| *runs == 1));
}
