//! The function run locally by `sam local invoke`: in Docker, under AWS's
//! Runtime Interface Emulator, with the AWS credentials and Region of whoever
//! runs it. There it must reach local services only (DynamoDB Local, a local
//! SQS and S3 server): it refuses to start unless every AWS endpoint it may call is
//! set (the project's `env.json` sets them, `template.yaml` declares them for
//! local invocations only) and none is AWS's own, rather than claim keys in,
//! or send messages from, a real account.

use crate::environment::SAM_LOCAL;

/// The services the function calls: the claim store, SQS (the SQS step and
/// the outbox), SNS and EventBridge (the outbox), S3 (large messages'
/// payloads).
const ENDPOINTS: [&str; 5] = [
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_ENDPOINT_URL_SQS",
    "AWS_ENDPOINT_URL_SNS",
    "AWS_ENDPOINT_URL_EVENTBRIDGE",
    "AWS_ENDPOINT_URL_S3",
];

/// Why the function must not start, when SAM runs it locally (`AWS_SAM_LOCAL`
/// is `true`) and an endpoint is missing or AWS's; `None` elsewhere.
pub(super) fn refusal(lookup: impl Fn(&str) -> Option<String>) -> Option<String> {
    if lookup(SAM_LOCAL).as_deref() != Some("true") {
        return None;
    }
    let set = |name: &str| lookup(name).filter(|value| !value.trim().is_empty());
    let every_service = set("AWS_ENDPOINT_URL");
    ENDPOINTS.into_iter().find_map(|name| match set(name).or_else(|| every_service.clone()) {
        None => Some(format!(
            "{name} is not set: a local invocation (sam local invoke) reaches local services only, and the function \
             refuses to start rather than reach the AWS account of whoever runs it; env.json sets it (docs/lambda.md, \
             Running it locally)"
        )),
        Some(url) if is_aws(&url) => Some(format!(
            "{name}={url} is an AWS endpoint: a local invocation (sam local invoke) reaches local services only; point \
             it at DynamoDB Local or the local SQS server in env.json (docs/lambda.md, Running it locally)"
        )),
        Some(_) => None,
    })
}

/// Whether `url` is one of AWS's own endpoints.
fn is_aws(url: &str) -> bool {
    let host = url.split("://").nth(1).unwrap_or(url).split(['/', ':']).next().unwrap_or_default();
    let host = host.to_ascii_lowercase();
    ["amazonaws.com", "amazonaws.com.cn", "api.aws"]
        .iter()
        .any(|domain| host == *domain || host.ends_with(&format!(".{domain}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal_with(pairs: &[(&str, &str)]) -> Option<String> {
        refusal(|name| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string()))
    }

    const LOCAL: &str = "http://host.docker.internal:8000";

    #[test]
    fn a_local_invocation_needs_every_endpoint_and_none_of_aws() {
        assert_eq!(refusal_with(&[]), None, "deployed: AWS_SAM_LOCAL is not set");
        let every = ENDPOINTS.map(|name| (name, LOCAL));
        let with = |pairs: &[(&'static str, &'static str)]| {
            let mut all = vec![("AWS_SAM_LOCAL", "true")];
            all.extend_from_slice(pairs);
            refusal_with(&all)
        };
        assert_eq!(with(&every), None);
        assert_eq!(with(&[("AWS_ENDPOINT_URL", LOCAL)]), None, "one endpoint for every service");
        let missing = with(&every[..3]).unwrap();
        assert!(missing.starts_with("AWS_ENDPOINT_URL_EVENTBRIDGE is not set"), "{missing}");
        // A pointer's payload, or a large message's, would be read from or written to the account's S3.
        let missing = with(&every[..4]).unwrap();
        assert!(missing.starts_with("AWS_ENDPOINT_URL_S3 is not set"), "{missing}");
        // SAM passes a declared variable env.json does not set as empty.
        let mut empty = every;
        empty[0].1 = "";
        assert!(with(&empty).unwrap().starts_with("AWS_ENDPOINT_URL_DYNAMODB is not set"));
        let mut real = every;
        real[1].1 = "https://sqs.us-east-1.amazonaws.com";
        assert!(with(&real).unwrap().contains("is an AWS endpoint"));
        real[1].1 = "https://dynamodb.us-east-1.api.aws";
        assert!(with(&real).unwrap().contains("is an AWS endpoint"));
        real[1].1 = "http://localstack:4566";
        assert_eq!(with(&real), None);
    }
}
