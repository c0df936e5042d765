//! One CloudWatch Embedded Metric Format (EMF) line per invocation, so that
//! duplicates, conflicts and failures can be graphed without a metric filter.

use serde_json::{Map, Value, json};

use crate::redelivery::RedeliveryCounts;
use sqs_once_engine::{EngineCounts, report::BatchReport};

/// What to publish (`SQS_ONCE_METRICS*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetricsConfig {
    /// Whether to print the EMF line at all.
    pub enabled: bool,
    /// The CloudWatch namespace.
    pub namespace: String,
    /// Dimension names and values; every metric is published under this one set.
    pub dimensions: Vec<(String, String)>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self { enabled: true, namespace: "sqs-once".into(), dimensions: Vec::new() }
    }
}

/// Counts that come from outside the batch report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// What the engine counted: finishing writes refused, landed later or
    /// given up; the outbox's sends, failures and refusals, and its oldest
    /// entry's age when a sweep measured it (zero for an empty outbox).
    pub engine: EngineCounts,
    /// DynamoDB requests made during the invocation, when the store is DynamoDB.
    pub dynamodb_requests: Option<u64>,
    /// What the SQS step did, when there is one.
    pub redelivery: Option<RedeliveryCounts>,
    /// What the span exports came to, when spans are exported.
    pub trace_export: Option<TraceExportCounts>,
}

/// Span exports (feature `opentelemetry`) that failed or were abandoned at
/// their time, and the spans lost with them or over a full buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TraceExportCounts {
    pub failed: u64,
    pub dropped: u64,
}

/// CloudWatch keeps at most 100 values of one metric per EMF line.
const MAX_VALUES: usize = 100;

/// Each metric: its name, unit, and which outcome labels it counts.
const COUNTS: &[(&str, &[&str])] = &[
    ("Processed", &["processed"]),
    ("Duplicates", &["duplicate"]),
    ("Conflicts", &["conflict"]),
    ("FailedRetryable", &["retryable", "panicked"]),
    ("FailedPermanent", &["permanent", "failed_before", "payload_mismatch", "invalid_record"]),
    ("FailedMissingKey", &["missing_key"]),
    ("FailedStoreError", &["store_error"]),
    ("FailedPayloadUnavailable", &["payload_unavailable"]),
    ("FailedDeadline", &["deadline"]),
    ("FailedGroupSkipped", &["group_skipped"]),
    ("FailedUncommitted", &["uncommitted"]),
    ("FailedLeaseLost", &["lease_lost"]),
    ("FailedWindowFull", &["window_full"]),
];

/// The EMF line for one invocation.
pub(crate) fn emf_line(config: &MetricsConfig, report: &BatchReport, counters: Counters, timestamp_ms: u64) -> String {
    let counts = report.counts();
    let mut values = Map::new();
    let mut metrics = Vec::new();
    let mut put = |name: &str, unit: &str, value: Value| {
        metrics.push(json!({ "Name": name, "Unit": unit }));
        values.insert(name.to_owned(), value);
    };
    put("Records", "Count", report.records.len().into());
    put("Failed", "Count", report.records.iter().filter(|record| record.outcome.is_failure()).count().into());
    let unconfirmed = report.records.iter().filter(|record| record.outcome.is_unconfirmed()).count();
    put("CompletionUnconfirmed", "Count", unconfirmed.into());
    for (name, labels) in COUNTS {
        put(name, "Count", labels.iter().map(|label| counts.get(label).copied().unwrap_or(0)).sum::<usize>().into());
    }
    let engine = counters.engine;
    put("LeaseTakeoversRefused", "Count", engine.lease_takeovers_refused.into());
    put("CompletionsLandedLater", "Count", engine.completions_landed_later.into());
    put("WritesGivenUp", "Count", engine.writes_given_up.into());
    put("OutboxSent", "Count", engine.outbox_sent.into());
    put("OutboxFailed", "Count", engine.outbox_failed.into());
    put("OutboxRefused", "Count", engine.outbox_refused.into());
    if let Some(age) = engine.outbox_oldest_age {
        put("OutboxOldestAge", "Seconds", age.as_secs().into());
    }
    if let Some(requests) = counters.dynamodb_requests {
        put("DynamoDbRequests", "Count", requests.into());
    }
    if let Some(export) = counters.trace_export {
        put("TraceExportsFailed", "Count", export.failed.into());
        put("TraceSpansDropped", "Count", export.dropped.into());
    }
    if let Some(sqs) = counters.redelivery {
        put("VisibilityChanged", "Count", sqs.visibility_changed.into());
        put("VisibilityChangeFailed", "Count", sqs.visibility_failed.into());
        put("DeadLettered", "Count", sqs.dead_lettered.into());
        put("DeadLetterFailed", "Count", sqs.dead_letter_failed.into());
    }
    let mut latencies: Vec<f64> = report
        .records
        .iter()
        .filter_map(|record| record.claim_latency)
        .map(|latency| latency.as_secs_f64() * 1000.0)
        .collect();
    if !latencies.is_empty() {
        latencies.sort_by(f64::total_cmp);
        put("ClaimLatency", "Milliseconds", quantiles(&latencies).into());
    }
    let fetched: Vec<u64> = report.records.iter().filter_map(|record| record.payload_bytes).collect();
    put("PayloadsFetched", "Count", fetched.len().into());
    put("PayloadBytesFetched", "Bytes", fetched.iter().sum::<u64>().into());
    let dimension_names: Vec<&str> = config.dimensions.iter().map(|(name, _)| name.as_str()).collect();
    for (name, value) in &config.dimensions {
        values.insert(name.clone(), value.clone().into());
    }
    values.insert(
        "_aws".into(),
        json!({
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": config.namespace,
                "Dimensions": [dimension_names],
                "Metrics": metrics,
            }],
        }),
    );
    Value::Object(values).to_string()
}

/// At most [`MAX_VALUES`] evenly spaced order statistics of sorted `values`,
/// so that CloudWatch's percentiles over them follow the whole distribution.
fn quantiles(sorted: &[f64]) -> Vec<f64> {
    if sorted.len() <= MAX_VALUES {
        return sorted.to_vec();
    }
    (0..MAX_VALUES).map(|i| sorted[i * (sorted.len() - 1) / (MAX_VALUES - 1)]).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use sqs_once_engine::report::{Failure, Outcome, RecordReport};

    fn record(outcome: Outcome, claim_ms: Option<u64>) -> RecordReport {
        let mut record = RecordReport::of("m", outcome);
        record.claim_latency = claim_ms.map(Duration::from_millis);
        record
    }

    #[test]
    fn every_outcome_is_counted_under_its_metric() {
        let mut records = vec![
            record(Outcome::Processed { confirmed: true }, Some(4)),
            record(Outcome::Processed { confirmed: false }, None),
            record(Outcome::Duplicate, Some(2)),
            record(Outcome::Duplicate, None),
            record(Outcome::Failed(Failure::Conflict { retry_after: Duration::ZERO }), Some(3)),
            record(Outcome::Failed(Failure::Panicked("x".into())), Some(1)),
            record(Outcome::Failed(Failure::Retryable("x".into())), Some(1)),
            record(Outcome::Failed(Failure::MissingKey("x".into())), None),
            record(Outcome::Failed(Failure::Deadline), None),
            record(Outcome::Failed(Failure::Permanent("x".into())), Some(1)),
            record(Outcome::Failed(Failure::FailedBefore(None)), Some(1)),
            record(Outcome::Failed(Failure::PayloadMismatch), Some(1)),
            record(Outcome::Failed(Failure::InvalidRecord("x".into())), None),
            record(Outcome::Failed(Failure::GroupSkipped("m-0".into())), None),
            record(Outcome::Failed(Failure::Uncommitted { retry_after: Duration::ZERO }), Some(1)),
            record(Outcome::Failed(Failure::LeaseLost), Some(1)),
            record(Outcome::Failed(Failure::WindowFull { item: "t (pk=1)".into(), retry_after: Duration::ZERO }), None),
            record(Outcome::Failed(Failure::PayloadUnavailable("gone".into())), None),
        ];
        records[0].payload_bytes = Some(300_000);
        records[1].payload_bytes = Some(2_000_000);
        records.extend((0..300).map(|n| record(Outcome::Failed(Failure::Store("down".into())), Some(n))));
        let report = BatchReport::of(records);
        let redelivery =
            RedeliveryCounts { visibility_changed: 4, visibility_failed: 1, dead_lettered: 2, dead_letter_failed: 3 };
        let engine = EngineCounts {
            lease_takeovers_refused: 2,
            completions_landed_later: 3,
            writes_given_up: 8,
            outbox_sent: 5,
            outbox_failed: 6,
            outbox_refused: 1,
            outbox_oldest_age: Some(Duration::from_millis(61_900)),
        };
        let counters = Counters {
            engine,
            dynamodb_requests: Some(9),
            redelivery: Some(redelivery),
            trace_export: Some(TraceExportCounts { failed: 1, dropped: 7 }),
        };
        let line: Value = serde_json::from_str(&emf_line(&MetricsConfig::default(), &report, counters, 1)).unwrap();
        let expected = [
            ("Records", 318),
            ("Failed", 314),
            ("CompletionUnconfirmed", 1),
            ("Processed", 2),
            ("Duplicates", 2),
            ("Conflicts", 1),
            ("FailedRetryable", 2),
            ("FailedPermanent", 4),
            ("FailedMissingKey", 1),
            ("FailedStoreError", 300),
            ("FailedDeadline", 1),
            ("FailedGroupSkipped", 1),
            ("FailedUncommitted", 1),
            ("FailedLeaseLost", 1),
            ("FailedWindowFull", 1),
            ("FailedPayloadUnavailable", 1),
            ("PayloadsFetched", 2),
            ("PayloadBytesFetched", 2_300_000),
            ("LeaseTakeoversRefused", 2),
            ("CompletionsLandedLater", 3),
            ("WritesGivenUp", 8),
            ("OutboxSent", 5),
            ("OutboxFailed", 6),
            ("OutboxRefused", 1),
            ("OutboxOldestAge", 61),
            ("DynamoDbRequests", 9),
            ("VisibilityChanged", 4),
            ("VisibilityChangeFailed", 1),
            ("DeadLettered", 2),
            ("DeadLetterFailed", 3),
            ("TraceExportsFailed", 1),
            ("TraceSpansDropped", 7),
        ];
        for (name, value) in expected {
            assert_eq!(line[name], value, "{name}");
        }
        // Every outcome label is counted under exactly one metric.
        let counted: Vec<&str> = COUNTS.iter().flat_map(|(_, labels)| labels.iter().copied()).collect();
        for record in &report.records {
            assert_eq!(counted.iter().filter(|label| **label == record.outcome.label()).count(), 1);
        }
        let latency = line["ClaimLatency"].as_array().unwrap();
        assert_eq!(latency.len(), 100);
        assert_eq!((latency[0].as_f64(), latency[99].as_f64()), (Some(0.0), Some(299.0)));
        let declared = line["_aws"]["CloudWatchMetrics"][0]["Metrics"].as_array().unwrap();
        assert!(declared.iter().all(|metric| line.get(metric["Name"].as_str().unwrap()).is_some()));
    }

    #[test]
    fn an_emf_line_names_its_namespace_and_dimensions() {
        let config = MetricsConfig { dimensions: vec![("FunctionName".into(), "orders".into())], ..Default::default() };
        let line = emf_line(&config, &BatchReport::default(), Counters::default(), 1_700_000_000_000);
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["Records"], 0);
        assert_eq!(value["FunctionName"], "orders");
        assert_eq!(value["_aws"]["CloudWatchMetrics"][0]["Namespace"], "sqs-once");
    }

    #[test]
    fn every_metric_published_is_documented_and_every_documented_one_published() {
        let redelivery = Some(RedeliveryCounts::default());
        let counters = Counters {
            dynamodb_requests: Some(1),
            redelivery,
            engine: EngineCounts { outbox_oldest_age: Some(std::time::Duration::ZERO), ..EngineCounts::default() },
            trace_export: Some(TraceExportCounts::default()),
        };
        let report = BatchReport::of(vec![record(Outcome::Duplicate, Some(1))]);
        let line: Value = serde_json::from_str(&emf_line(&MetricsConfig::default(), &report, counters, 0)).unwrap();
        let published: std::collections::BTreeSet<String> = line["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|metric| metric["Name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(published, testkit::documented_metrics());
    }
}
