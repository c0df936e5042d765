//! The DynamoDB client the store uses, counting its requests, and how its
//! errors become [`StoreError`]s.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use aws_sdk_dynamodb::{
    Client,
    config::{
        ConfigBag, Intercept, RuntimeComponents, http::HttpResponse, interceptors::BeforeTransmitInterceptorContextRef,
    },
    error::{BoxError, ProvideErrorMetadata, SdkError},
    operation::{delete_item::DeleteItemError, put_item::PutItemError, update_item::UpdateItemError},
    types::{AttributeValue, error::ConditionalCheckFailedException},
};

use sqs_once_core::store::StoreError;

/// DynamoDB requests made by a client, counted as they are sent (retries
/// count again), per operation.
#[derive(Debug, Default)]
pub struct RequestCounter {
    put: AtomicU64,
    get: AtomicU64,
    update: AtomicU64,
    delete: AtomicU64,
    query: AtomicU64,
    scan: AtomicU64,
    batch_statement: AtomicU64,
    batch_get: AtomicU64,
    transact: AtomicU64,
    other: AtomicU64,
}

/// A snapshot of a [`RequestCounter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// `PutItem` requests (claims).
    pub put: u64,
    /// `GetItem` requests (reads after a claim that returned no item).
    pub get: u64,
    /// `UpdateItem` requests (completions and failure records).
    pub update: u64,
    /// `DeleteItem` requests (releases).
    pub delete: u64,
    /// `Query` requests (listing open claims through the index).
    pub query: u64,
    /// `Scan` requests (listing without an index).
    pub scan: u64,
    /// `BatchExecuteStatement` requests (batched claims, completions,
    /// failure records and releases).
    pub batch_statement: u64,
    /// `BatchGetItem` requests (batched reads after a refused claim).
    pub batch_get: u64,
    /// `TransactWriteItems` requests (handlers' staged writes committed
    /// with their claims).
    pub transact: u64,
    /// Any other request.
    pub other: u64,
}

impl RequestCounts {
    /// All requests.
    pub fn total(&self) -> u64 {
        let batched = self.batch_statement + self.batch_get;
        self.put + self.get + self.update + self.delete + self.query + self.scan + batched + self.transact + self.other
    }
}

impl RequestCounter {
    /// The counts so far.
    pub fn snapshot(&self) -> RequestCounts {
        RequestCounts {
            put: self.put.load(Ordering::Relaxed),
            get: self.get.load(Ordering::Relaxed),
            update: self.update.load(Ordering::Relaxed),
            delete: self.delete.load(Ordering::Relaxed),
            query: self.query.load(Ordering::Relaxed),
            scan: self.scan.load(Ordering::Relaxed),
            batch_statement: self.batch_statement.load(Ordering::Relaxed),
            batch_get: self.batch_get.load(Ordering::Relaxed),
            transact: self.transact.load(Ordering::Relaxed),
            other: self.other.load(Ordering::Relaxed),
        }
    }
}

/// Counts each request as the SDK sends it, by its `X-Amz-Target` operation.
#[derive(Debug, Clone)]
struct CountRequests(Arc<RequestCounter>);

impl Intercept for CountRequests {
    fn name(&self) -> &'static str {
        "CountRequests"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let target = context.request().headers().get("x-amz-target").unwrap_or_default();
        let counter = match target.rsplit('.').next() {
            Some("PutItem") => &self.0.put,
            Some("GetItem") => &self.0.get,
            Some("UpdateItem") => &self.0.update,
            Some("DeleteItem") => &self.0.delete,
            Some("Query") => &self.0.query,
            Some("Scan") => &self.0.scan,
            Some("BatchExecuteStatement") => &self.0.batch_statement,
            Some("BatchGetItem") => &self.0.batch_get,
            Some("TransactWriteItems") => &self.0.transact,
            _ => &self.0.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A DynamoDB client as this store uses it, made from `shared` (the SDK's
/// default chain, where `AWS_REGION`, credentials and
/// `AWS_ENDPOINT_URL_DYNAMODB` work as the SDK defines them, or a
/// configuration given), counting its requests.
pub fn client_from(shared: &aws_config::SdkConfig) -> (Client, Arc<RequestCounter>) {
    let counter = Arc::new(RequestCounter::default());
    let config =
        aws_sdk_dynamodb::config::Builder::from(shared).interceptor(CountRequests(Arc::clone(&counter))).build();
    (Client::from_conf(config), counter)
}

/// A DynamoDB client given by the program, with the timeouts it lacks
/// filled in as [`sqs_once_aws::with_limits`] fills a configuration's.
pub fn with_limits(client: Client) -> Client {
    let config = client.config();
    Client::from_conf(config.to_builder().timeout_config(sqs_once_aws::filled(config.timeout_config())).build())
}

/// An SDK failure as a store error, in one line ([`sqs_once_aws::describe`]):
/// [`StoreError::Rejected`] when DynamoDB refused the request for what it
/// holds (`ValidationException`: sending it again cannot succeed), else
/// [`StoreError::Unavailable`].
pub(crate) fn unavailable(error: impl std::error::Error + ProvideErrorMetadata) -> StoreError {
    if error.code() == Some("ValidationException") {
        return StoreError::Rejected(described(&error));
    }
    StoreError::unavailable(described(&error))
}

/// What DynamoDB did with a conditional write.
pub(crate) enum Conditional {
    /// The condition held and the write applied.
    Applied,
    /// The condition failed: the item it failed on, when DynamoDB returned
    /// it (`ReturnValuesOnConditionCheckFailure`), `None` when there is no
    /// item or it was not asked for.
    Refused(Option<HashMap<String, AttributeValue>>),
}

/// The answer to a conditional `PutItem`, `UpdateItem` or `DeleteItem`:
/// applied, refused by its condition, or the store's error.
pub(crate) fn conditional<T, E: ConditionFailure>(
    sent: Result<T, SdkError<E, HttpResponse>>,
) -> Result<Conditional, StoreError> {
    let Err(error) = sent else { return Ok(Conditional::Applied) };
    match E::condition_failed(error) {
        Ok(failed) => Ok(Conditional::Refused(failed.item.filter(|item| !item.is_empty()))),
        Err(other) => Err(unavailable(other)),
    }
}

/// The errors of the operations that take a condition, each with a variant
/// of its own for a failed one.
pub(crate) trait ConditionFailure: std::error::Error + ProvideErrorMetadata + Sized {
    /// The failed condition, or the service's error.
    fn condition_failed(error: SdkError<Self, HttpResponse>) -> Result<ConditionalCheckFailedException, Self>;
}

macro_rules! condition_failure {
    ($($error:ty),*) => {$(
        impl ConditionFailure for $error {
            fn condition_failed(error: SdkError<Self, HttpResponse>) -> Result<ConditionalCheckFailedException, Self> {
                match error.into_service_error() {
                    Self::ConditionalCheckFailedException(failed) => Ok(failed),
                    other => Err(other),
                }
            }
        }
    )*};
}

condition_failure!(PutItemError, UpdateItemError, DeleteItemError);

/// An SDK failure in one line, naming DynamoDB.
pub(crate) fn described(error: &(impl std::error::Error + ProvideErrorMetadata)) -> String {
    format!("DynamoDB: {}", sqs_once_aws::describe(error))
}

/// Why an attempt of a commit with a deadline is not sent: its time to be
/// sent has passed ([`Commit::send_by_ms`](sqs_once_core::store::Commit::send_by_ms)),
/// read from the wall clock at the attempt, since an attempt held by a
/// freeze goes out at the thaw. The answer is an error, and the commit is
/// given up (its record was reported failed, and its redelivery decides).
pub(crate) fn too_late(send_by_ms: Option<u64>) -> Option<StoreError> {
    let send_by_ms = send_by_ms?;
    let now_ms = sqs_once_core::clock::epoch_ms(std::time::SystemTime::now());
    (now_ms > send_by_ms).then(|| {
        StoreError::unavailable(format!(
            "a commit is sent by {send_by_ms} (epoch ms), and it is {now_ms}: what would refuse it a second time \
             (the key's completion, or the key kept in its item) could be forgotten by the time it lands, or \
             DynamoDB's token window has passed; given up unsent, the record's redelivery decides"
        ))
    })
}

/// Whether a query failed because the table has no such index (DynamoDB:
/// `ValidationException`, "The table does not have the specified index"),
/// as opposed to any other failure that merely mentions the index (access
/// denied on it, throttling, an index still being built).
pub(crate) fn no_such_index(error: &impl ProvideErrorMetadata) -> bool {
    error.code() == Some("ValidationException")
        && error.message().is_some_and(|message| message.contains("does not have the specified index"))
}
