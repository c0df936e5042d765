//! Every `SQS_ONCE_` setting, declared once: its name, and its default where
//! the default is a value the variable takes. The settings are read by name
//! from here (never spelt again), a variable that starts `SQS_ONCE_` and is
//! none of them is reported as unknown, and docs/configuration.md's table
//! documents each: a test holds the table to this list, row for row, its
//! defaults included.

/// One setting: an environment variable the consumer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Setting {
    /// The variable's name.
    pub(crate) name: &'static str,
    /// Its default, as the variable would say it: setting it to this is
    /// leaving it unset. `None` where unset means nothing set, or a default
    /// worked out at start (docs/configuration.md says how).
    pub(crate) default: Option<&'static str>,
}

/// Declares each setting's name as a constant, and [`ALL`] with their
/// defaults, in docs/configuration.md's order.
macro_rules! settings {
    ($($setting:ident = $name:literal $(, default $default:literal)?;)*) => {
        $(
            #[doc = concat!("`", $name, "`.")]
            pub(crate) const $setting: &str = $name;
        )*

        /// Every setting, in docs/configuration.md's order.
        pub(crate) const ALL: &[Setting] = &[$(Setting { name: $setting, default: settings!(@default $($default)?) }),*];
    };
    (@default) => { None };
    (@default $default:literal) => { Some($default) };
}

// Read by the bundled binary (`SQS_ONCE_HANDLER`), `poll` (`SQS_ONCE_QUEUE_URL`)
// and the bundled handlers (`SQS_ONCE_DEMO_LOG`, `SQS_ONCE_LEDGER_*`) as well as
// by the settings here: each is a setting wherever the consumer runs, so that a
// function deployed with the template's variables hears nothing of them.
settings! {
    HANDLER = "SQS_ONCE_HANDLER", default "demo";
    KEY = "SQS_ONCE_KEY", default "messageId";
    ENVELOPE = "SQS_ONCE_ENVELOPE", default "none";
    LARGE_PAYLOADS = "SQS_ONCE_LARGE_PAYLOADS", default "true";
    LARGE_PAYLOAD_MAX_BYTES = "SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES", default "16777216";
    LARGE_PAYLOAD_MEMORY = "SQS_ONCE_LARGE_PAYLOAD_MEMORY", default "134217728";
    LARGE_PAYLOAD_THRESHOLD = "SQS_ONCE_LARGE_PAYLOAD_THRESHOLD", default "262144";
    LARGE_PAYLOAD_BUCKET = "SQS_ONCE_LARGE_PAYLOAD_BUCKET";
    LARGE_PAYLOAD_DELETE = "SQS_ONCE_LARGE_PAYLOAD_DELETE", default "false";
    KEY_PREFIX = "SQS_ONCE_KEY_PREFIX", default "sqs-once";
    HASH_KEYS = "SQS_ONCE_HASH_KEYS", default "true";
    ON_MISSING_KEY = "SQS_ONCE_ON_MISSING_KEY", default "fail";
    EXPIRES_AFTER_SECS = "SQS_ONCE_EXPIRES_AFTER_SECS", default "3600";
    VISIBILITY_TIMEOUT_SECS = "SQS_ONCE_VISIBILITY_TIMEOUT_SECS";
    CLAIM = "SQS_ONCE_CLAIM", default "auto";
    KEYS_IN_ITEMS = "SQS_ONCE_KEYS_IN_ITEMS", default "false";
    LEASE_MARGIN_MS = "SQS_ONCE_LEASE_MARGIN_MS", default "2000";
    CONCURRENCY = "SQS_ONCE_CONCURRENCY", default "64";
    DEADLINE_MARGIN_MS = "SQS_ONCE_DEADLINE_MARGIN_MS", default "500";
    VALIDATE_PAYLOAD = "SQS_ONCE_VALIDATE_PAYLOAD", default "false";
    STORE_RESULT = "SQS_ONCE_STORE_RESULT", default "false";
    LOCAL_CACHE = "SQS_ONCE_LOCAL_CACHE", default "1024";
    TABLE = "SQS_ONCE_TABLE";
    STORE = "SQS_ONCE_STORE";
    STORE_PATH = "SQS_ONCE_STORE_PATH";
    ATTR_ID = "SQS_ONCE_ATTR_ID", default "id";
    ATTR_EXPIRY = "SQS_ONCE_ATTR_EXPIRY", default "expiration";
    ATTR_IN_PROGRESS_EXPIRY = "SQS_ONCE_ATTR_IN_PROGRESS_EXPIRY", default "in_progress_expiration";
    ATTR_STATUS = "SQS_ONCE_ATTR_STATUS", default "status";
    ATTR_DATA = "SQS_ONCE_ATTR_DATA", default "data";
    ATTR_VALIDATION = "SQS_ONCE_ATTR_VALIDATION", default "validation";
    TABLE_SORT_KEY = "SQS_ONCE_TABLE_SORT_KEY";
    TABLE_PARTITION_VALUE = "SQS_ONCE_TABLE_PARTITION_VALUE";
    DYNAMODB_BATCHING = "SQS_ONCE_DYNAMODB_BATCHING", default "true";
    LOG = "SQS_ONCE_LOG";
    LOG_BODIES = "SQS_ONCE_LOG_BODIES", default "false";
    METRICS = "SQS_ONCE_METRICS", default "true";
    METRICS_NAMESPACE = "SQS_ONCE_METRICS_NAMESPACE", default "sqs-once";
    METRICS_DIMENSIONS = "SQS_ONCE_METRICS_DIMENSIONS";
    CONFLICT_BACKOFF = "SQS_ONCE_CONFLICT_BACKOFF", default "true";
    RETRY_BASE_SECS = "SQS_ONCE_RETRY_BASE_SECS", default "5";
    RETRY_MAX_SECS = "SQS_ONCE_RETRY_MAX_SECS", default "900";
    DLQ_URL = "SQS_ONCE_DLQ_URL";
    OUTBOX_SWEEP_SECS = "SQS_ONCE_OUTBOX_SWEEP_SECS", default "60";
    QUEUE_URL = "SQS_ONCE_QUEUE_URL";
    DEMO_LOG = "SQS_ONCE_DEMO_LOG";
    LEDGER_TABLE = "SQS_ONCE_LEDGER_TABLE";
    LEDGER_NOTIFY_URL = "SQS_ONCE_LEDGER_NOTIFY_URL";
    LEDGER_KEYS_IN_ACCOUNTS = "SQS_ONCE_LEDGER_KEYS_IN_ACCOUNTS", default "true";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// docs/configuration.md's rows: each variable's name and its default as
    /// the table writes it.
    fn documented() -> Vec<(&'static str, &'static str)> {
        include_str!("../../docs/configuration.md")
            .lines()
            .filter_map(|line| {
                let mut columns = line.strip_prefix("| `")?.splitn(3, " | ");
                let name = columns.next()?.strip_suffix('`')?;
                Some((name, columns.next()?)).filter(|(name, _)| name.starts_with("SQS_ONCE_"))
            })
            .collect()
    }

    #[test]
    fn the_documentation_lists_every_setting_with_its_default() {
        let documented = documented();
        let names: Vec<&str> = documented.iter().map(|(name, _)| *name).collect();
        let declared: Vec<&str> = ALL.iter().map(|setting| setting.name).collect();
        assert_eq!(names, declared, "docs/configuration.md's table lists the settings declared, in their order");
        for (setting, (_, default)) in ALL.iter().zip(&documented) {
            if let Some(value) = setting.default {
                assert_eq!(*default, format!("`{value}`"), "{}'s documented default", setting.name);
            }
        }
    }

    #[test]
    fn setting_a_variable_to_its_default_changes_nothing() {
        let unset = format!("{:?}", Config::from_lookup(|_| None).unwrap());
        for setting in ALL {
            let Some(default) = setting.default else { continue };
            let set = Config::from_lookup(|name| (name == setting.name).then(|| default.to_owned()));
            let set = set.unwrap_or_else(|error| panic!("{} = {default:?}: {error}", setting.name));
            assert_eq!(format!("{set:?}"), unset, "{} = {default:?} is its default", setting.name);
        }
    }

    #[test]
    fn a_setting_whose_default_differs_is_read() {
        // The check above cannot fail for a setting the configuration ignores: one it reads, set otherwise, is seen.
        let unset = format!("{:?}", Config::from_lookup(|_| None).unwrap());
        let set = Config::from_lookup(|name| (name == CONCURRENCY).then(|| "7".to_owned())).unwrap();
        assert_ne!(format!("{set:?}"), unset);
    }
}
