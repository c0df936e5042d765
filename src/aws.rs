//! The AWS SDK configuration every client of the consumer shares.
//!
//! Loaded once per process from the SDK's default chain, so `AWS_REGION`,
//! credentials and per-service endpoints (`AWS_ENDPOINT_URL_DYNAMODB`,
//! `AWS_ENDPOINT_URL_SQS`) work as the SDK defines them. Retries and timeouts
//! are short on purpose: a call that does not answer in seconds fails its
//! record long before a Lambda timeout would fail the whole batch.

use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig, retry::RetryConfig, timeout::TimeoutConfig};
use aws_sdk_dynamodb::error::ProvideErrorMetadata;

/// Attempts per request, the first included. Throttling and 5xx answers are
/// retried with jittered exponential back-off between these bounds.
pub(crate) const MAX_ATTEMPTS: u32 = 3;
/// First retry back-off.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(50);
/// Longest retry back-off.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Time to open a connection.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Time for one attempt of a request.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Time for a request, retries included.
pub(crate) const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);

/// The shared configuration, with this module's retry and timeout settings.
pub(crate) async fn sdk_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(https_client())
        .retry_config(retries())
        .timeout_config(timeouts(None))
        .load()
        .await
}

/// This module's retries.
fn retries() -> RetryConfig {
    RetryConfig::standard()
        .with_max_attempts(MAX_ATTEMPTS)
        .with_initial_backoff(INITIAL_BACKOFF)
        .with_max_backoff(MAX_BACKOFF)
}

/// `config`, given by the program, with this module's retry and timeout
/// settings where it has none of its own: without request timeouts, a lost
/// answer would hold its record until the deadline's cut-off.
pub(crate) fn with_limits(config: &SdkConfig) -> SdkConfig {
    let mut limited = config.to_builder();
    if config.timeout_config().is_none_or(|timeouts| !timeouts.has_timeouts()) {
        limited.set_timeout_config(Some(timeouts(None)));
    }
    if config.retry_config().is_none() {
        limited.set_retry_config(Some(retries()));
    }
    limited.build()
}

/// The SDK's default HTTPS client but for its crypto: rustls on ring, where
/// the default's aws-lc took 1.8 MiB of the binary. As the default does, it
/// honours the connector settings (the connect timeout above) and the
/// proxy environment (`HTTPS_PROXY`, `NO_PROXY`…).
fn https_client() -> aws_sdk_dynamodb::config::SharedHttpClient {
    use aws_smithy_http_client::{Builder, ConnectorBuilder, proxy::ProxyConfig, tls};
    Builder::new().build_with_connector_fn(|settings, components| {
        let mut connector =
            ConnectorBuilder::default().tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring));
        connector.set_connector_settings(settings.cloned());
        connector.set_sleep_impl(components.and_then(|components| components.sleep_impl()));
        connector.set_proxy_config(Some(ProxyConfig::from_env()));
        connector.build()
    })
}

/// This module's timeouts; `long_poll` widens the attempt and operation
/// limits for a call that waits that long on purpose (SQS long polling).
pub(crate) fn timeouts(long_poll: Option<Duration>) -> TimeoutConfig {
    let wait = long_poll.unwrap_or_default();
    TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(ATTEMPT_TIMEOUT + wait)
        .operation_timeout(OPERATION_TIMEOUT + wait)
        .build()
}

/// An SDK failure in one line: the error code and message when the service
/// answered, else the whole cause chain, since the SDK's own `Display` says
/// only "service error" or "dispatch failure".
pub(crate) fn describe(error: &(impl std::error::Error + ProvideErrorMetadata)) -> String {
    if let (Some(code), Some(message)) = (error.code(), error.message()) {
        return format!("{code}: {message}");
    }
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_names_the_code_and_message() {
        use aws_sdk_sqs::{error::ErrorMetadata, operation::get_queue_url::GetQueueUrlError};

        let refused = GetQueueUrlError::generic(ErrorMetadata::builder().code("AccessDenied").message("no").build());
        assert_eq!(describe(&refused), "AccessDenied: no");
    }
}
