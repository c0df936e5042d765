//! Deliveries as SQS makes them, to `sqs-once invoke` processes: every
//! pending message to two of three processes per round, until each was
//! reported successful once. The fault drains (`tests/faults.rs`,
//! `tests/ledger.rs`) and `bench/soak` run on this.

use std::{
    collections::{BTreeMap, HashSet},
    path::Path,
    process::Stdio,
    time::Duration,
};

use serde_json::{Value, json};

/// A tuning variable, or `default` when it is not set; one that does not
/// parse stops the test rather than quietly running the default.
pub fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(value) => value.parse().unwrap_or_else(|_| panic!("{name}={value:?} does not parse")),
        Err(_) => default,
    }
}

/// The seeds of the fault drains (`SQS_ONCE_FAULTS_SEEDS`, default 7).
pub fn seeds() -> Vec<u64> {
    let seeds = std::env::var("SQS_ONCE_FAULTS_SEEDS").unwrap_or_else(|_| "7".to_owned());
    seeds.split(',').map(|seed| seed.trim().parse().expect("SQS_ONCE_FAULTS_SEEDS: comma-separated numbers")).collect()
}

/// One SQS record as Lambda delivers it.
pub fn record(message_id: &str, body: &str, receive_count: u32) -> Value {
    json!({
        "messageId": message_id, "receiptHandle": format!("rh-{message_id}-{receive_count}"), "body": body,
        "attributes": {"ApproximateReceiveCount": receive_count.to_string(), "SentTimestamp": "1700000000000"},
        "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:work", "awsRegion": "us-east-1",
    })
}

/// What an `invoke` process answered, and the metrics it printed.
pub struct Answer {
    pub failed: HashSet<String>,
    pub metrics: Value,
}

/// Runs `sqs-once invoke --timeout 4 --metrics EVENT` in `dir` with `envs`
/// (and `--sqs` when `SQS_ONCE_DLQ_URL` is among them, so that permanent
/// failures move to it); its standard error goes to the event's name with
/// `.log`.
pub async fn invoke(dir: &Path, event: &Path, envs: &[(&str, &str)]) -> Answer {
    let mut command = tokio::process::Command::from(super::sqs_once_command());
    command.args(["invoke", "--timeout", "4", "--metrics"]);
    if envs.iter().any(|(name, _)| *name == "SQS_ONCE_DLQ_URL") {
        command.arg("--sqs");
    }
    let output = command
        .arg(event)
        .current_dir(dir)
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env_remove("SQS_ONCE_STORE")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    std::fs::write(event.with_extension("log"), &output.stderr).unwrap();
    let (failed, metrics) = super::invoke_answer(&output);
    Answer { failed, metrics }
}

/// What the rounds of one drain delivered, and the sums of the metrics
/// their processes published.
#[derive(Default)]
pub struct Rounds {
    pub rounds: u32,
    pub deliveries: usize,
    pub counted: BTreeMap<String, u64>,
}

impl Rounds {
    /// Three `invoke` processes per round, each pending message delivered to
    /// two of them, until each was reported successful by one (or 40 rounds).
    /// What is left pending is what never was.
    pub async fn drain(
        &mut self,
        dir: &Path,
        pending: &mut BTreeMap<String, String>,
        shuffle: &mut fastrand::Rng,
        envs: &[(&str, &str)],
    ) {
        let first = self.rounds;
        while !pending.is_empty() && self.rounds < first + 40 {
            self.rounds += 1;
            let mut events = Vec::new();
            for process in 0..3 {
                let mut records: Vec<Value> = pending
                    .iter()
                    .enumerate()
                    .filter(|(n, _)| (n + process) % 3 != 0)
                    .map(|(_, (id, body))| record(id, body, self.rounds))
                    .collect();
                shuffle.shuffle(&mut records);
                self.deliveries += records.len();
                let path = dir.join(format!("event-{}-{process}.json", self.rounds));
                std::fs::write(&path, json!({ "Records": records }).to_string()).unwrap();
                let delivered: Vec<String> =
                    records.iter().map(|r| r["messageId"].as_str().unwrap().to_owned()).collect();
                events.push((path, delivered));
            }
            let answers = futures::future::join_all(events.iter().map(|(path, _)| invoke(dir, path, envs))).await;
            for ((_, delivered), answer) in events.iter().zip(&answers) {
                for id in delivered.iter().filter(|id| !answer.failed.contains(*id)) {
                    pending.remove(id);
                }
                for (metric, value) in answer.metrics.as_object().into_iter().flatten() {
                    if let Some(value) = value.as_u64() {
                        *self.counted.entry(metric.clone()).or_default() += value;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The sum of `metric` over every process of the drain.
    pub fn sum(&self, metric: &str) -> u64 {
        self.counted.get(metric).copied().unwrap_or(0)
    }
}
