//! The AWS SDK settings every client of [sqs-once](https://docs.rs/sqs-once)
//! shares: the DynamoDB store's client and the consumer's SQS, SNS,
//! EventBridge and S3 clients. A crate of its own, below the DynamoDB store
//! and the consumer, because `sqs-once` without its DynamoDB store still
//! makes the others, and the engine (`sqs-once-engine`) makes no AWS request.
//!
//! Loaded once per process from the SDK's default chain, so `AWS_REGION`,
//! credentials and per-service endpoints (`AWS_ENDPOINT_URL_DYNAMODB`,
//! `AWS_ENDPOINT_URL_SQS`) work as the SDK defines them. Retries and timeouts
//! are short on purpose: a call that does not answer in seconds fails its
//! record long before a Lambda timeout would fail the whole batch.
//!
//! Beside the settings, the [`batched`] module gathers concurrent calls
//! into the requests of the AWS batch APIs, for the store's statements and
//! the outbox's sends alike.
//!
//! Use it through `sqs-once`; its API changes with sqs-once's own, at the
//! same version.

use std::time::Duration;

pub mod batched;

use aws_config::{BehaviorVersion, SdkConfig, retry::RetryConfig, timeout::TimeoutConfig};
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

/// Attempts per request, the first included. Throttling and 5xx answers are
/// retried with jittered exponential back-off between these bounds.
pub const MAX_ATTEMPTS: u32 = 3;
/// First retry back-off.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(50);
/// Longest retry back-off.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Time to open a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Time for one attempt of a request.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Time for a request, retries included.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);

/// The shared configuration, with this crate's retry and timeout settings.
///
/// Its HTTPS client is the SDK's default but for its crypto: rustls on ring,
/// where the default's aws-lc took 1.8 MiB of the binary. As the default
/// does, it honours the connector settings (the connect timeout below) and
/// the proxy environment (`HTTPS_PROXY`, `NO_PROXY`…).
pub async fn sdk_config() -> SdkConfig {
    use aws_smithy_http_client::{Builder, ConnectorBuilder, proxy::ProxyConfig, tls};
    let https = Builder::new().build_with_connector_fn(|settings, components| {
        let mut connector =
            ConnectorBuilder::default().tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring));
        connector.set_connector_settings(settings.cloned());
        connector.set_sleep_impl(components.and_then(|components| components.sleep_impl()));
        connector.set_proxy_config(Some(ProxyConfig::from_env()));
        connector.build()
    });
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(https)
        .retry_config(retries())
        .timeout_config(timeouts(None))
        .load()
        .await
}

/// This crate's retries.
fn retries() -> RetryConfig {
    RetryConfig::standard()
        .with_max_attempts(MAX_ATTEMPTS)
        .with_initial_backoff(INITIAL_BACKOFF)
        .with_max_backoff(MAX_BACKOFF)
}

/// `config`, given by the program, with this crate's retries where it has
/// none, and each of this crate's timeouts (connect, attempt, operation)
/// that it lacks filled in on its own: `aws_config::load_defaults` sets a
/// connect timeout and nothing else, and without the others a lost answer
/// would hold its write until the deadline's cut-off, and a send could
/// outlast its outbox lease (see `sqs_once_engine::outbox`). A timeout the program
/// set stays as it set it.
pub fn with_limits(config: &SdkConfig) -> SdkConfig {
    let mut limited = config.to_builder();
    limited.set_timeout_config(Some(filled(config.timeout_config())));
    if config.retry_config().is_none() {
        limited.set_retry_config(Some(retries()));
    }
    limited.build()
}

/// `given` timeouts, each of connect, attempt and operation that is unset
/// (or disabled) filled in with this crate's.
pub fn filled(given: Option<&TimeoutConfig>) -> TimeoutConfig {
    let given = given.cloned().unwrap_or_else(TimeoutConfig::disabled);
    let mut timeouts = TimeoutConfig::builder()
        .connect_timeout(given.connect_timeout().unwrap_or(CONNECT_TIMEOUT))
        .operation_attempt_timeout(given.operation_attempt_timeout().unwrap_or(ATTEMPT_TIMEOUT))
        .operation_timeout(given.operation_timeout().unwrap_or(OPERATION_TIMEOUT));
    if let Some(read) = given.read_timeout() {
        timeouts = timeouts.read_timeout(read);
    }
    timeouts.build()
}

/// `config` for the clients that send messages (the outbox's
/// destinations), with its timeouts filled in as [`with_limits`] fills
/// them, and one attempt allowed the whole operation: an attempt cut off by
/// its timeout may have delivered its message, and the SDK's retry would
/// deliver it again. A destination slower than an attempt (3 s a request
/// against the 2 s attempt) so received each message three times a send,
/// and, the send never confirmed, three times again at every sweep. Retries
/// stay for the answers that say the message was not taken (throttling, a
/// server error) and for connections that could not be made.
pub fn sending(config: &SdkConfig) -> SdkConfig {
    let timeouts = filled(config.timeout_config());
    let mut one_attempt = TimeoutConfig::builder().operation_attempt_timeout(operation_timeout(Some(&timeouts)));
    if let Some(connect) = timeouts.connect_timeout() {
        one_attempt = one_attempt.connect_timeout(connect);
    }
    if let Some(read) = timeouts.read_timeout() {
        one_attempt = one_attempt.read_timeout(read);
    }
    let mut sending = config.to_builder();
    sending.set_timeout_config(Some(one_attempt.operation_timeout(operation_timeout(Some(&timeouts))).build()));
    sending.build()
}

/// The operation timeout of clients made with `timeouts` (after
/// [`filled`], always one): how long one of their requests may take,
/// retries included.
pub fn operation_timeout(timeouts: Option<&TimeoutConfig>) -> Duration {
    timeouts.and_then(TimeoutConfig::operation_timeout).unwrap_or(OPERATION_TIMEOUT)
}

/// This crate's timeouts; `long_poll` widens the attempt and operation
/// limits for a call that waits that long on purpose (SQS long polling).
pub fn timeouts(long_poll: Option<Duration>) -> TimeoutConfig {
    let wait = long_poll.unwrap_or_default();
    TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(ATTEMPT_TIMEOUT + wait)
        .operation_timeout(OPERATION_TIMEOUT + wait)
        .build()
}

/// Whether `error` is a call that got no answer, for a reason that may pass:
/// a timeout, a connection refused or lost, an answer that could not be
/// read. Not a request that could not be built, nor one the caller's
/// settings failed (a dispatch failure of the user's kind), nor any answer
/// of the service's. The HTTP client calls a connection closed mid-answer
/// an "other" failure, as it does an endpoint that is no URL: both count as
/// unanswered, and whoever waits logs the reason.
pub fn unanswered<E, R>(error: &SdkError<E, R>) -> bool {
    match error {
        SdkError::TimeoutError(_) | SdkError::ResponseError(_) => true,
        SdkError::DispatchFailure(failure) => !failure.is_user(),
        _ => false,
    }
}

/// An SDK failure in one line: the error code and message when the service
/// answered, else the whole cause chain, since the SDK's own `Display` says
/// only "service error" or "dispatch failure".
pub fn describe(error: &(impl std::error::Error + ProvideErrorMetadata)) -> String {
    if let (Some(code), Some(message)) = (error.code(), error.message()) {
        return format!("{code}: {message}");
    }
    with_causes(error)
}

/// An error and its causes on one line, a cause left out where the text
/// before it already ends with it (the AWS SDK's errors repeat their
/// source's text).
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        let cause_text = error.to_string();
        if !text.ends_with(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        cause = error.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use aws_config::Region;

    use super::*;

    /// A configuration as programs load it: `aws_config::defaults(..).load()`,
    /// which sets a connect timeout of 3.1 s and no other.
    async fn loaded(timeouts: Option<TimeoutConfig>) -> SdkConfig {
        let loader = aws_config::defaults(BehaviorVersion::latest()).region(Region::new("us-east-1")).no_credentials();
        match timeouts {
            Some(timeouts) => loader.timeout_config(timeouts).load().await,
            None => loader.load().await,
        }
    }

    #[tokio::test]
    async fn a_configuration_loaded_the_usual_way_gets_every_timeout_it_lacks() {
        let given = loaded(None).await;
        assert_eq!(given.timeout_config().unwrap().operation_timeout(), None, "the SDK's default loader sets none");
        let limited = with_limits(&given);
        let timeouts = limited.timeout_config().unwrap();
        assert_eq!(timeouts.operation_timeout(), Some(OPERATION_TIMEOUT));
        assert_eq!(timeouts.operation_attempt_timeout(), Some(ATTEMPT_TIMEOUT));
        assert_eq!(timeouts.connect_timeout(), Some(Duration::from_millis(3100)), "the loader's own connect timeout");
        assert!(limited.retry_config().is_some());
    }

    #[tokio::test]
    async fn a_timeout_the_program_set_stays_and_disabled_ones_are_filled_in() {
        let own = TimeoutConfig::builder()
            .operation_timeout(Duration::from_secs(9))
            .read_timeout(Duration::from_secs(4))
            .build();
        let limited = with_limits(&loaded(Some(own)).await);
        let timeouts = limited.timeout_config().unwrap();
        assert_eq!(timeouts.operation_timeout(), Some(Duration::from_secs(9)));
        assert_eq!(operation_timeout(limited.timeout_config()), Duration::from_secs(9));
        assert_eq!(timeouts.read_timeout(), Some(Duration::from_secs(4)));
        assert_eq!(timeouts.operation_attempt_timeout(), Some(ATTEMPT_TIMEOUT));
        let disabled = with_limits(&loaded(Some(TimeoutConfig::disabled())).await);
        assert_eq!(disabled.timeout_config().unwrap().operation_timeout(), Some(OPERATION_TIMEOUT));
    }

    #[tokio::test]
    async fn a_sending_client_takes_one_attempt_for_its_whole_operation() {
        for given in [loaded(None).await, with_limits(&loaded(None).await)] {
            let timeouts = sending(&given).timeout_config().cloned().unwrap();
            assert_eq!(timeouts.operation_timeout(), Some(OPERATION_TIMEOUT));
            assert_eq!(timeouts.operation_attempt_timeout(), Some(OPERATION_TIMEOUT));
            assert_eq!(timeouts.connect_timeout(), Some(Duration::from_millis(3100)));
        }
        let own = loaded(Some(TimeoutConfig::builder().operation_timeout(Duration::from_secs(4)).build())).await;
        let timeouts = sending(&own).timeout_config().cloned().unwrap();
        assert_eq!(timeouts.operation_attempt_timeout(), Some(Duration::from_secs(4)), "the program's operation");
    }

    #[test]
    fn a_call_without_an_answer_is_unanswered_and_one_that_could_not_be_made_is_not() {
        use aws_smithy_runtime_api::client::result::ConnectorError;
        use aws_smithy_types::error::ErrorMetadata;
        let failed = || -> Box<dyn std::error::Error + Send + Sync> { "failed".into() };
        let unanswered: [SdkError<ErrorMetadata, ()>; 5] = [
            SdkError::timeout_error(failed()),
            SdkError::dispatch_failure(ConnectorError::io(failed())),
            SdkError::dispatch_failure(ConnectorError::timeout(failed())),
            SdkError::dispatch_failure(ConnectorError::other(failed(), None)),
            SdkError::response_error(failed(), ()),
        ];
        assert!(unanswered.iter().all(super::unanswered));
        let not_made_or_answered: [SdkError<ErrorMetadata, ()>; 3] = [
            SdkError::construction_failure(failed()),
            SdkError::dispatch_failure(ConnectorError::user(failed())),
            SdkError::service_error(ErrorMetadata::builder().code("InternalError").build(), ()),
        ];
        assert!(!not_made_or_answered.iter().any(super::unanswered));
    }

    #[test]
    fn describe_names_the_code_and_message() {
        let refused = aws_smithy_types::error::ErrorMetadata::builder().code("AccessDenied").message("no").build();
        assert_eq!(describe(&refused), "AccessDenied: no");
    }
}
