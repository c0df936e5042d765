//! What Lambda tells a process about where it runs, through variables of its
//! own (`AWS_LAMBDA_*`, and SAM CLI's `AWS_SAM_LOCAL` when it runs a function
//! locally): read from the environment once, into typed values, for the
//! Lambda loop, the logs and the choice between the function and the command
//! line; and where the AWS clients send their requests (`AWS_ENDPOINT_URL_*`),
//! for logs and errors. The `SQS_ONCE_` settings are [`crate::config`]'s.

use std::sync::OnceLock;

/// The variable Lambda sets in its execution environments, and nowhere
/// else: the address of its Runtime API.
pub(crate) const LAMBDA_RUNTIME_API: &str = "AWS_LAMBDA_RUNTIME_API";

/// The variable SAM CLI sets (to `true`) in the function it runs locally.
pub(crate) const SAM_LOCAL: &str = "AWS_SAM_LOCAL";

/// The variable Lambda sets to the function's name.
const FUNCTION_NAME: &str = "AWS_LAMBDA_FUNCTION_NAME";

/// Variables the runtime needs, all set by Lambda itself.
const RUNTIME_VARIABLES: [&str; 4] =
    [LAMBDA_RUNTIME_API, FUNCTION_NAME, "AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "AWS_LAMBDA_FUNCTION_VERSION"];

/// What Lambda's variables say; all empty outside Lambda.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Environment {
    /// `AWS_LAMBDA_RUNTIME_API`: set inside Lambda, and only there.
    pub(crate) runtime_api: Option<String>,
    /// `AWS_LAMBDA_FUNCTION_NAME`: the function's name, which the metrics'
    /// dimension and the spans' service default to.
    pub(crate) function_name: Option<String>,
    /// The first variable the runtime needs that is not set.
    pub(crate) missing: Option<&'static str>,
    /// `AWS_LAMBDA_INITIALIZATION_TYPE=provisioned-concurrency`: Lambda runs
    /// the init phase ahead of any invocation.
    pub(crate) initialized_ahead: bool,
    /// `AWS_LAMBDA_MAX_CONCURRENCY`, which Lambda Managed Instances sets,
    /// when above 1: how many invocations this environment is handed at
    /// once. Unset, 1 or unreadable, one at a time, as classic Lambda does.
    pub(crate) invocations_at_once: Option<u32>,
    /// `AWS_LAMBDA_LOG_LEVEL`, as tracing names it: Lambda's levels are
    /// TRACE to FATAL, tracing's stop at ERROR. `None` when unset or unknown.
    pub(crate) log_level: Option<&'static str>,
    /// `AWS_LAMBDA_LOG_FORMAT=JSON`: log lines as JSON.
    pub(crate) json_logs: bool,
    /// `AWS_SAM_LOCAL=true`: SAM CLI runs the function locally.
    pub(crate) sam_local: bool,
}

impl Environment {
    /// This process's, read once: Lambda sets its variables before the
    /// process starts and never changes them.
    pub(crate) fn current() -> &'static Self {
        static CURRENT: OnceLock<Environment> = OnceLock::new();
        CURRENT.get_or_init(|| Self::from_lookup(|name| std::env::var(name).ok()))
    }

    /// The variables as `lookup` gives them.
    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let log_level = lookup("AWS_LAMBDA_LOG_LEVEL").and_then(|level| {
            Some(match level.to_ascii_lowercase().as_str() {
                "trace" => "trace",
                "debug" => "debug",
                "info" => "info",
                "warn" => "warn",
                "error" | "fatal" => "error",
                _ => return None,
            })
        });
        Self {
            runtime_api: lookup(LAMBDA_RUNTIME_API),
            function_name: lookup(FUNCTION_NAME).filter(|name| !name.trim().is_empty()),
            missing: RUNTIME_VARIABLES.into_iter().find(|name| lookup(name).is_none()),
            initialized_ahead: lookup("AWS_LAMBDA_INITIALIZATION_TYPE").as_deref() == Some("provisioned-concurrency"),
            invocations_at_once: lookup("AWS_LAMBDA_MAX_CONCURRENCY")
                .and_then(|invocations| invocations.trim().parse().ok())
                .filter(|invocations| *invocations > 1),
            log_level,
            json_logs: lookup("AWS_LAMBDA_LOG_FORMAT").is_some_and(|format| format.eq_ignore_ascii_case("json")),
            sam_local: lookup(SAM_LOCAL).as_deref() == Some("true"),
        }
    }

    /// Whether this process runs inside Lambda (or SAM CLI's emulation of it).
    pub(crate) fn in_lambda(&self) -> bool {
        self.runtime_api.is_some()
    }

    /// Whether this process is a deployed Lambda function: inside Lambda, and
    /// not SAM CLI's local emulation of it.
    #[cfg_attr(not(feature = "dynamodb"), expect(dead_code, reason = "the DynamoDB table's start-up check alone asks"))]
    pub(crate) fn deployed(&self) -> bool {
        self.in_lambda() && !self.sam_local
    }
}

/// Where a client sends its requests, for logs and errors: the endpoint the
/// service's variable `variable` (or `AWS_ENDPOINT_URL`) sets, or AWS in
/// `region`.
#[cfg(any(feature = "cli", feature = "dynamodb"))]
pub(crate) fn endpoint(variable: &str, region: Option<&aws_config::Region>) -> String {
    let named = |name: &str| std::env::var(name).ok().filter(|value| !value.trim().is_empty());
    match named(variable).or_else(|| named("AWS_ENDPOINT_URL")) {
        Some(url) => url,
        None => format!(
            "AWS, region {} (no {variable}: the account the credentials name)",
            region.map_or("unset", |region| region.as_ref())
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn environment(variables: &[(&str, &str)]) -> Environment {
        Environment::from_lookup(|name| {
            variables.iter().find(|(variable, _)| *variable == name).map(|(_, value)| (*value).to_owned())
        })
    }

    #[test]
    fn outside_lambda_nothing_is_set() {
        let outside = environment(&[]);
        assert!(!outside.in_lambda() && !outside.deployed());
        assert_eq!(outside.missing, Some(LAMBDA_RUNTIME_API));
        assert_eq!((outside.invocations_at_once, outside.log_level, outside.json_logs), (None, None, false));
    }

    #[test]
    fn lambda_s_variables_read_as_lambda_means_them() {
        let deployed = environment(&[
            (LAMBDA_RUNTIME_API, "127.0.0.1:9001"),
            ("AWS_LAMBDA_FUNCTION_NAME", "payments"),
            ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128"),
            ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST"),
            ("AWS_LAMBDA_INITIALIZATION_TYPE", "provisioned-concurrency"),
            ("AWS_LAMBDA_MAX_CONCURRENCY", " 8 "),
            ("AWS_LAMBDA_LOG_LEVEL", "FATAL"),
            ("AWS_LAMBDA_LOG_FORMAT", "Json"),
        ]);
        assert!(deployed.in_lambda() && deployed.deployed());
        assert_eq!(deployed.missing, None);
        assert_eq!(deployed.function_name.as_deref(), Some("payments"));
        assert!(deployed.initialized_ahead && deployed.json_logs);
        assert_eq!(deployed.invocations_at_once, Some(8));
        assert_eq!(deployed.log_level, Some("error"), "tracing's levels stop at ERROR");
    }

    #[test]
    fn one_invocation_at_a_time_unless_more_are_said_and_sam_local_is_not_deployed() {
        for at_once in ["1", "0", "many", ""] {
            assert_eq!(environment(&[("AWS_LAMBDA_MAX_CONCURRENCY", at_once)]).invocations_at_once, None);
        }
        let local = environment(&[(LAMBDA_RUNTIME_API, "x"), (SAM_LOCAL, "true"), ("AWS_LAMBDA_LOG_LEVEL", "loud")]);
        assert!(local.in_lambda() && !local.deployed());
        assert_eq!(local.missing, Some("AWS_LAMBDA_FUNCTION_NAME"));
        assert_eq!(local.log_level, None);
        assert_eq!(local.function_name, None);
    }
}
