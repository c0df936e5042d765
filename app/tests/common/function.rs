//! The bundled binary as Lambda runs it: started with `AWS_LAMBDA_RUNTIME_API`
//! pointing at the harness's Runtime API server, on the real `lambda_runtime`
//! loop, what it prints kept line by line.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Child,
};

use super::runtime_api::{Answer, RuntimeApi};

/// A running function process and what it printed.
pub struct Function {
    pub api: RuntimeApi,
    pub process: Child,
    pub stdout: Arc<Mutex<Vec<String>>>,
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl Function {
    /// Starts the function with exactly these settings (besides those Lambda sets).
    pub async fn spawn(envs: &[(&str, String)]) -> Self {
        let api = RuntimeApi::start().await;
        let mut process = api.spawn(super::sqs_once_command(), envs);
        let stdout = collect(process.stdout.take().unwrap());
        let stderr = collect(process.stderr.take().unwrap());
        Self { api, process, stdout, stderr }
    }

    /// Starts the function on a fresh claim table, with extra settings.
    pub async fn start(envs: &[(&str, &str)]) -> Self {
        let store = super::fresh_table().await;
        Self::start_on(&store.layout().table, envs).await
    }

    /// Starts the function on the claim table `table` of DynamoDB Local, with extra settings.
    pub async fn start_on(table: &str, envs: &[(&str, &str)]) -> Self {
        let mut settings =
            vec![("SQS_ONCE_TABLE", table.to_owned()), ("AWS_ENDPOINT_URL_DYNAMODB", super::dynamodb::endpoint())];
        settings.extend(envs.iter().map(|(name, value)| (*name, value.to_string())));
        Self::spawn(&settings).await
    }

    /// Invokes it with `event`, due `timeout` from now; its answer, which
    /// must come before the deadline.
    pub async fn invoke(&self, event: &Value, timeout: Duration) -> Answer {
        let (answer, answered, deadline) = self.api.invoke(event, timeout).await.expect("no answer");
        assert!(answered < deadline, "answered after the deadline");
        answer
    }

    /// The message ids the answer to `event` reported failed.
    pub async fn failed(&self, event: &Value, timeout: Duration) -> Vec<String> {
        match self.invoke(event, timeout).await {
            Answer::Response(response) => super::failed_ids(&response),
            answer => panic!("expected a response, got {answer:?}\n{}", self.output()),
        }
    }

    /// The EMF metrics lines, once `count` of them have been read from the
    /// process's output, which trails the answers it posts.
    pub async fn metrics(&self, count: usize) -> Vec<Value> {
        let metrics = |lines: &[String]| -> Vec<Value> {
            lines
                .iter()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .filter(|value| value.get("_aws").is_some())
                .collect()
        };
        wait_for(&self.stdout, |lines| metrics(lines).len() >= count).await;
        metrics(&self.stdout.lock().unwrap())
    }

    /// The JSON log lines, once `count` of them have been read.
    pub async fn logs(&self, count: usize) -> Vec<Value> {
        wait_for(&self.stderr, |lines| lines.len() >= count).await;
        let lines = self.stderr.lock().unwrap().clone();
        lines
            .iter()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not a JSON log line: {line}")))
            .collect()
    }

    /// Everything it printed so far, logs then standard output.
    pub fn output(&self) -> String {
        let (stderr, stdout) = (self.stderr.lock().unwrap(), self.stdout.lock().unwrap());
        stderr.iter().chain(stdout.iter()).cloned().collect::<Vec<_>>().join("\n")
    }
}

/// Waits, up to 10 s, until the lines read so far satisfy `done`.
pub async fn wait_for(lines: &Mutex<Vec<String>>, done: impl Fn(&[String]) -> bool) {
    let started = tokio::time::Instant::now();
    while !done(&lines.lock().unwrap()) && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn collect(stream: impl tokio::io::AsyncRead + Unpin + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    tokio::spawn(async move {
        let mut reader = BufReader::new(stream).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            sink.lock().unwrap().push(line);
        }
    });
    lines
}
