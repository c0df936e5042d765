//! A consumer: the engine around a handler, the claim store and keys the
//! settings choose, and the SQS step that follows each batch. Every way to
//! run (Lambda, `poll`, `invoke`) builds one at start and processes batches
//! with it.
//!
#![doc = include_str!("../docs/redelivery.md")]

use std::time::{Duration, SystemTime};

use aws_lambda_events::sqs::SqsBatchResponse;

pub use crate::redelivery::RedeliveryCounts;
pub use sqs_once_engine::Invocation;

mod builder;
mod visibility;

#[cfg(feature = "cli")]
pub(crate) use builder::CommandParts;
pub use builder::{Builder, LambdaService};
pub(crate) use builder::{Layers, Needs};
pub(crate) use visibility::QueueVisibility;

use crate::{
    config::ConfigError,
    metrics::{Counters, MetricsConfig, TraceExportCounts},
    redelivery::Redelivery,
    store::StoreError,
};
use sqs_once_core::trace::TraceContext;
use sqs_once_engine::{
    Engine, KeyMemory,
    event::EventRecord,
    outbox::{LeaseTooShort, OutboxTimes},
    report::BatchReport,
};

/// Why a consumer could not be put together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartupError {
    /// A setting has a value it cannot have.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store could not be opened.
    #[error("cannot open the claim store")]
    Store(#[from] StoreError),
    /// The claim store lacks a capability the consumer needs (see
    /// [`ClaimStore`](crate::store::ClaimStore)): it does not do what the
    /// text says.
    #[error("the claim store does not {0}")]
    StoreLacks(String),
    /// The DynamoDB claim table does not exist. Checked at start outside a
    /// deployed function (`invoke`, `poll`, `sam local invoke`, `claims`),
    /// where a table not created yet is the likely mistake: every record
    /// would otherwise fail `store_error`. A deployed function starts
    /// without the check (a request less at every cold start), and its
    /// records fail instead.
    #[error(
        "the claim table `{table}` does not exist at {endpoint}: create it with {} (or deploy template.yaml, which \
         makes it)",
        create_table_command(table)
    )]
    MissingTable {
        /// The table `SQS_ONCE_TABLE` names.
        table: String,
        /// Where it was looked for.
        endpoint: String,
    },
    /// The AWS configuration names no Region, so no request to DynamoDB can
    /// be sent. Checked where a missing table is.
    #[error(
        "no AWS Region for DynamoDB: set AWS_REGION (the SDK also reads AWS_DEFAULT_REGION, and the `region` of the \
         profile AWS_PROFILE names in ~/.aws/config)"
    )]
    NoRegion,
    /// No AWS credentials could be loaded. Checked where a missing table is.
    #[error(
        "no AWS credentials for DynamoDB: {reason} (the SDK looks in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, the \
         profile AWS_PROFILE names in ~/.aws/credentials and ~/.aws/config, AWS_WEB_IDENTITY_TOKEN_FILE, the \
         container's credentials endpoint, then the instance's metadata service)"
    )]
    NoCredentials {
        /// Why the last place looked in gave none.
        reason: String,
    },
    /// DynamoDB did not answer the claim table's `DescribeTable`, or
    /// refused its credentials. Checked where a missing table is.
    #[error("DynamoDB cannot be used at {endpoint}: {reason}")]
    StoreUnreachable {
        /// Where it was looked for.
        endpoint: String,
        /// Why no answer came, or why it refused.
        reason: String,
    },
    /// The operation timeouts of the clients that send outbox messages and
    /// delete their entries are too long for an entry's sending lease
    /// (docs/transactions.md): a send and its deletion could outlast it,
    /// and another sender send the message while the first is under way.
    #[error(
        "outbox sends may take {send:?} and their deletions {delete:?} (the clients' operation timeouts): more than \
         the outbox's 15 s sending lease holds, with a second to spare; give the SDK configuration shorter \
         operation timeouts"
    )]
    OutboxTimeouts {
        /// The operation timeout of the destinations' clients.
        send: Duration,
        /// The operation timeout of the claim store's client.
        delete: Duration,
    },
}

/// The outbox's times for sends of `send` and deletions of `delete`, or the
/// refusal to start when a sending lease cannot hold them.
pub(crate) fn outbox_times(send: Duration, delete: Duration) -> Result<OutboxTimes, StartupError> {
    OutboxTimes { send, delete }
        .checked()
        .map_err(|LeaseTooShort(times)| StartupError::OutboxTimeouts { send: times.send, delete: times.delete })
}

/// The command that creates `table`, as the user runs it: the running
/// binary's `create-table`, through `cargo run` when cargo ran it (a binary
/// of one's own is not on the PATH then), or, under Lambda's name for every
/// function's binary (`bootstrap`, as `sam local invoke` runs it), the
/// consumer's.
fn create_table_command(table: &str) -> String {
    // `cargo run` tells the program it runs its manifest's directory.
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR").filter(|_| std::env::var_os("CARGO").is_some()) {
        return format!("`cargo run -- create-table --table {table}` (in {})", std::path::Path::new(&dir).display());
    }
    match crate::logging::program().as_str() {
        "bootstrap" => format!(
            "the consumer's `create-table` (`cargo run -- create-table --table {table}` in its crate, `sqs-once \
             create-table --table {table}` for the bundled binary)"
        ),
        program => format!("`{program} create-table --table {table}`"),
    }
}

/// The engine around a handler, the claim store and keys the settings
/// choose, and the SQS step after each batch: what the Lambda function runs,
/// for a program that serves batches its own way.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::time::{Duration, SystemTime};
/// use sqs_once::{config::Config, consumer::{Consumer, Invocation}, event::parse_event, handler_fn};
///
/// let config = Config::from_lookup(|name| match name {
///     "SQS_ONCE_STORE" => Some("memory".to_owned()),
///     _ => None,
/// })
/// .unwrap();
/// let consumer = Consumer::builder().config(config).build(handler_fn(|_| async { Ok(None) })).await.unwrap();
/// let event = r#"{ "Records": [{ "messageId": "m-1", "body": "{}" }] }"#;
/// let invocation = Invocation { deadline: SystemTime::now() + Duration::from_secs(30), request_id: "r-1".into() };
/// let answer = consumer.process(&parse_event(event).unwrap(), &invocation).await;
/// assert!(answer.response.batch_item_failures.is_empty());
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct Consumer {
    /// The engine: handler, claims, keys.
    pub(crate) engine: Engine,
    /// DynamoDB requests made so far, when the store is DynamoDB.
    #[cfg(feature = "dynamodb")]
    pub(crate) dynamodb_requests: Option<std::sync::Arc<sqs_once_dynamodb::RequestCounter>>,
    /// What SQS does with failed records, unless the policy asks nothing.
    pub(crate) redelivery: Option<Redelivery>,
    /// The source queue's visibility timeout, read at the first batch: in
    /// the Lambda function, which is told it only by a setting.
    pub(crate) queue_visibility: Option<std::sync::Arc<visibility::QueueVisibility>>,
    /// The metrics published after each batch.
    pub(crate) metrics: MetricsConfig,
    /// Where spans go, when they are exported.
    #[cfg(feature = "opentelemetry")]
    pub(crate) export: Option<crate::otlp::Export>,
}

/// What a batch comes to: the engine's report and the answer Lambda returns.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Answer {
    /// Every record's fate, as the engine saw it.
    pub report: BatchReport,
    /// The partial-batch response: the engine's failures less the records
    /// moved to the dead-letter queue.
    pub response: SqsBatchResponse,
    /// What the SQS step did, when there is one.
    pub redelivery: Option<RedeliveryCounts>,
}

impl Consumer {
    /// Puts a consumer together from values, the environment supplying the
    /// rest: see [`Builder`].
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Processes a batch, then carries out the redelivery policy on its
    /// failures.
    pub async fn process(&self, records: &[EventRecord], invocation: &Invocation) -> Answer {
        self.process_in(records, invocation, None).await
    }

    /// [`process`](Self::process), the batch's span a child of `parent` (in
    /// Lambda, the invocation's trace); the spans are exported before the
    /// answer, within its budget.
    pub(crate) async fn process_in(
        &self,
        records: &[EventRecord],
        invocation: &Invocation,
        parent: Option<&TraceContext>,
    ) -> Answer {
        if let Some(visibility) = &self.queue_visibility {
            visibility.read_once(self, records).await;
        }
        let report = self.engine.process(records, invocation, parent).await;
        let answer = self.redeliver(records, report, invocation.deadline).await;
        self.export_spans(self.engine.budget(invocation.deadline).sqs_by()).await;
        answer
    }

    /// Sends the spans finished so far, when they are exported, by `by` at
    /// the latest (then abandoned and counted).
    pub(crate) async fn export_spans(&self, by: tokio::time::Instant) {
        #[cfg(feature = "opentelemetry")]
        if let Some(export) = &self.export {
            export.flush(by).await;
        }
        #[cfg(not(feature = "opentelemetry"))]
        let _ = by;
    }

    /// Remembers keys past the redelivery of a queue whose visibility
    /// timeout is `visibility_timeout`, for batches of `timeout` at most
    /// (see [`ClaimPolicy::redelivered_within`](sqs_once_engine::claim::ClaimPolicy)),
    /// in place of what the settings said: `poll` reads its queue's, and
    /// the Lambda function its records' (the longer of it and the setting).
    pub(crate) fn redelivered_by_queue(&self, visibility_timeout: Duration, timeout: Duration) {
        let within = match &self.redelivery {
            Some(redelivery) => redelivery.policy().redelivered_within(visibility_timeout),
            None => visibility_timeout,
        };
        let within = within.max(timeout);
        self.engine.set_redelivered_within(Some(within));
        self.log_key_memory();
    }

    /// Says at start how long completed keys are remembered when a queue's
    /// redelivery asks for longer than `SQS_ONCE_EXPIRES_AFTER_SECS`.
    pub(crate) fn log_key_memory(&self) {
        let KeyMemory { expires_after, redelivered_within, .. } = self.engine.key_memory();
        if let Some(within) = redelivered_within.filter(|within| *within > expires_after) {
            tracing::info!(
                expires_after_s = expires_after.as_secs(),
                redelivered_within_s = within.as_secs(),
                "completed keys are remembered past their lease for as long as a failed record can stay away from \
                 the queue (its visibility timeout, SQS_ONCE_VISIBILITY_TIMEOUT_SECS, or SQS_ONCE_RETRY_MAX_SECS \
                 with jitter), longer than SQS_ONCE_EXPIRES_AFTER_SECS: the record's redelivery finds its commit"
            );
        }
    }

    /// The redelivery step of [`process`](Self::process). It is best effort
    /// and ends by `deadline` (less the time to post the answer): when SQS is
    /// slow or down, the engine's own answer stands, which is correct on its
    /// own (failed records come back after the queue's timeout).
    pub(crate) async fn redeliver(&self, records: &[EventRecord], report: BatchReport, deadline: SystemTime) -> Answer {
        let Some(redelivery) = &self.redelivery else {
            return Answer { response: report.response(), report, redelivery: None };
        };
        let sqs_by = self.engine.budget(deadline).sqs_by();
        let (response, counts) = redelivery.apply(records, &report, sqs_by).await;
        Answer { response, report, redelivery: Some(counts) }
    }

    /// The counts metrics take from outside the batch report, since start,
    /// and the outbox's age if a sweep measured it since the last call.
    pub(crate) fn counters(&self) -> Counters {
        Counters {
            engine: self.engine.counts(),
            dynamodb_requests: self.dynamodb_requests(),
            redelivery: None,
            trace_export: self.trace_export(),
        }
    }

    #[cfg(feature = "dynamodb")]
    fn dynamodb_requests(&self) -> Option<u64> {
        self.dynamodb_requests.as_ref().map(|counter| counter.snapshot().total())
    }

    #[cfg(not(feature = "dynamodb"))]
    fn dynamodb_requests(&self) -> Option<u64> {
        None
    }

    #[cfg(feature = "opentelemetry")]
    fn trace_export(&self) -> Option<TraceExportCounts> {
        let counters = self.export.as_ref()?.counters();
        let load = |counter: &std::sync::atomic::AtomicU64| counter.load(std::sync::atomic::Ordering::Relaxed);
        let (failed, dropped) = (load(&counters.failed), load(&counters.dropped));
        Some(TraceExportCounts { failed, dropped })
    }

    #[cfg(not(feature = "opentelemetry"))]
    fn trace_export(&self) -> Option<TraceExportCounts> {
        None
    }

    /// Before the process leaves: sends the unconfirmed finishing writes
    /// again (and the messages of the commits that land), then sweeps the
    /// outbox for messages left unsent, until `until`. Returns the ids of
    /// the claims whose writes are still unconfirmed.
    pub async fn leave(&self, until: tokio::time::Instant) -> Vec<String> {
        let left = self.engine.leave_sweeping(until).await;
        self.export_spans(until).await;
        left
    }
}

#[cfg(test)]
mod tests {
    use Duration;

    use super::*;

    #[test]
    fn outbox_times_a_sending_lease_cannot_hold_refuse_to_start() {
        assert!(outbox_times(Duration::from_secs(5), Duration::from_secs(5)).is_ok());
        let refused = outbox_times(Duration::from_secs(10), Duration::from_secs(5)).unwrap_err();
        assert!(matches!(refused, StartupError::OutboxTimeouts { .. }), "{refused}");
        assert!(refused.to_string().contains("shorter operation timeouts"), "{refused}");
    }
}
