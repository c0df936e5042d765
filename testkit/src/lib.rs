//! What the tests of `sqs-once` run against: DynamoDB Local and the SQS
//! server as the test command (`scripts/test`) starts them, proxies that
//! answer chosen requests to measure ([`dynamodb::proxy`]) or misbehave at
//! random ([`faults::FaultProxy`]), a network that takes time
//! ([`delay::DelayProxy`]), one that is down until told otherwise
//! ([`outage::Outage`]), an HTTPS endpoint ([`tls::TlsProxy`]), and a
//! Lambda Runtime API that drives a
//! function process as Lambda does ([`runtime_api::RuntimeApi`]).
//!
//! It knows nothing of `sqs-once` itself, so that the library's own unit
//! tests use it as freely as the integration tests of the library and the
//! binary.

pub mod capacity;
pub mod delay;
pub mod dynamodb;
pub mod extended_client;
pub mod faults;
pub mod otlp;
pub mod outage;
pub mod runtime_api;
pub mod sqs;
pub mod tls;

/// The AWS configuration the test command's environment describes: the
/// local endpoints (`AWS_ENDPOINT_URL_DYNAMODB`, `AWS_ENDPOINT_URL_SQS`…), a
/// region and test credentials; HTTPS through rustls on ring, as the
/// library's own clients.
pub async fn aws_config() -> aws_config::SdkConfig {
    use aws_smithy_http_client::{Builder, tls};
    let https =
        Builder::new().tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring)).build_https();
    aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(https).load().await
}

/// [`aws_config`] with every service's endpoint at `url` (a proxy's),
/// whatever the environment's `AWS_ENDPOINT_URL_SQS` and the like say.
pub async fn aws_config_through(url: &str) -> aws_config::SdkConfig {
    aws_config().await.to_builder().service_config(NoEnvironment).endpoint_url(url).build()
}

/// Service settings that read no environment variable, so that a
/// configuration's endpoint wins over `AWS_ENDPOINT_URL_SQS` and the like.
#[derive(Debug)]
struct NoEnvironment;

impl aws_types::service_config::LoadServiceConfig for NoEnvironment {
    fn load_config(&self, _key: aws_types::service_config::ServiceConfigKey<'_>) -> Option<String> {
        None
    }
}

/// SQS records of a Lambda event with these JSON bodies, their message ids
/// `m-0000`, `m-0001`… in order.
pub fn records(bodies: impl IntoIterator<Item = serde_json::Value>) -> Vec<serde_json::Value> {
    bodies
        .into_iter()
        .enumerate()
        .map(|(n, body)| {
            serde_json::json!({"messageId": format!("m-{n:04}"), "body": body.to_string(), "eventSource": "aws:sqs"})
        })
        .collect()
}

/// The metrics docs/outcomes.md documents: the names in the first column of
/// the table under its `## Metrics` heading.
pub fn documented_metrics() -> std::collections::BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/outcomes.md");
    let text = std::fs::read_to_string(path).expect("docs/outcomes.md");
    let after = text.split("\n## Metrics").nth(1).expect("a Metrics section");
    // The section ends at the next heading of its level (the spans' table follows it).
    let section = after.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter(|line| line.starts_with("| `"))
        .flat_map(|line| line.split('|').nth(1).unwrap_or_default().split(','))
        .map(|name| name.trim().trim_matches('`').to_owned())
        .collect()
}
