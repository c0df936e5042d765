//! The `SQS_ONCE_` settings, read once at start.
//!
//! Every setting is an environment variable, as Lambda users expect; invalid
//! values are refused at start with a message naming the valid ones.
//!
#![doc = include_str!("../docs/configuration.md")]

use std::{fmt::Display, str::FromStr, time::Duration};

use crate::{environment::Environment, metrics::MetricsConfig, sqs::MAX_VISIBILITY};
use sqs_once_core::{clock::duration_ms, envelope::EnvelopeKind, payload::PayloadOptions};
#[cfg(feature = "dynamodb")]
use sqs_once_dynamodb::{Attributes, TableKey, TableLayout};
use sqs_once_engine::{
    ClaimPolicy, EngineOptions, KeyMemory,
    budget::{ANSWER_TIME, Margins},
    key::{KeySpec, Keys, OnMissingKey},
    redelivery::{RedeliveryPolicy, RetryBackoff},
};

use self::unknown::Unknown;

pub(crate) mod settings;
mod unknown;

/// How often a process that sends through the outbox sweeps it, unless
/// `SQS_ONCE_OUTBOX_SWEEP_SECS` says otherwise.
pub(crate) const DEFAULT_OUTBOX_SWEEP: Duration = Duration::from_secs(60);

/// Where `invoke` and the operator's commands keep claims when no store is
/// named, and `SQS_ONCE_STORE=file` when no path is.
pub(crate) const LOCAL_STORE_PATH: &str = ".sqs-once/claims.db";

/// The endpoint variables of the services the consumer calls, which the
/// SDK reads.
const ENDPOINTS: &[&str] = &[
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_ENDPOINT_URL_SQS",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL_SNS",
    "AWS_ENDPOINT_URL_EVENTBRIDGE",
];

/// What `SQS_ONCE_STORE` takes.
const STORES: &str = match (cfg!(feature = "dynamodb"), cfg!(feature = "sqlite")) {
    (true, true) => "dynamodb, file or memory",
    (true, false) => "dynamodb or memory (file needs the sqlite feature)",
    (false, true) => "file or memory (dynamodb needs the dynamodb feature)",
    (false, false) => "memory (dynamodb and file need the dynamodb and sqlite features)",
};

/// What `SQS_ONCE_EXPIRES_AFTER_SECS` takes: a key remembered for no time
/// would not be deduplicated at all.
const EXPIRES_AFTER: &str = "a positive number of seconds";
/// What `SQS_ONCE_DEADLINE_MARGIN_MS` takes: with less, the answer could not
/// reach Lambda before the deadline, and the whole batch would time out.
const DEADLINE_MARGIN: &str =
    "a number of milliseconds, at least 100 (what posting the answer needs before the deadline)";

/// Where claims are kept (`SQS_ONCE_STORE`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant, reason = "one value per process")]
pub(crate) enum StoreChoice {
    /// In process memory; nothing survives the process.
    Memory,
    /// A SQLite file, shared safely by concurrent processes.
    #[cfg(feature = "sqlite")]
    File(std::path::PathBuf),
    /// A DynamoDB table: the production store.
    #[cfg(feature = "dynamodb")]
    DynamoDb(TableLayout),
    /// None named, inside Lambda: only a store given to
    /// [`Builder::store`](crate::consumer::Builder::store) will do.
    Unnamed,
    /// None named, outside Lambda: `invoke` and the operator's commands,
    /// there for trying things out, keep claims in [`LOCAL_STORE_PATH`]
    /// (in memory without the `sqlite` feature); a long-running consumer
    /// (`poll`) refuses to start, as no other consumer of its queue would
    /// see its claims, and a restart would lose them.
    Unchosen,
    /// DynamoDB, which `.0` asks for with the value `.1`, in a program
    /// built without the `dynamodb` feature: only a store given to the
    /// builder will do.
    #[cfg(not(feature = "dynamodb"))]
    NotBuilt(&'static str, String),
}

impl StoreChoice {
    /// Whether claims are kept in DynamoDB.
    pub(crate) fn is_dynamodb(&self) -> bool {
        #[cfg(feature = "dynamodb")]
        return matches!(self, Self::DynamoDb(_));
        #[cfg(not(feature = "dynamodb"))]
        false
    }

    /// Whether the choice may stand inside Lambda, where memory or a file
    /// would keep claims that the next environment never sees.
    fn fits_lambda(&self) -> bool {
        match self {
            Self::Memory => false,
            #[cfg(feature = "sqlite")]
            Self::File(_) => false,
            _ => true,
        }
    }

    /// Why there is no store when none was given to the builder: none
    /// named inside Lambda or for a long-running consumer, or one this
    /// program was built without.
    pub(crate) fn refusal(&self) -> ConfigError {
        #[cfg(not(feature = "dynamodb"))]
        if let Self::NotBuilt(name, value) = self {
            let expected = "nothing: this program was built without sqs-once's `dynamodb` feature, which keeps \
                            claims in DynamoDB; give Consumer::builder().store(..) a store";
            return ConfigError { name, value: value.clone(), expected: expected.into() };
        }
        if let Self::Unchosen = self {
            return ConfigError {
                name: settings::TABLE,
                value: String::new(),
                expected: format!(
                    "the name of the DynamoDB claim table: a long-running consumer keeps its claims where every \
                     consumer of its queue sees them, and a restart keeps them; SQS_ONCE_STORE=file keeps them in a \
                     file of this host instead (SQS_ONCE_STORE_PATH, {LOCAL_STORE_PATH} by default), for processes \
                     of one host alone, chosen on purpose"
                ),
            };
        }
        ConfigError {
            name: settings::TABLE,
            value: String::new(),
            expected: "the name of the DynamoDB claim table: inside Lambda, claims must be kept in DynamoDB \
                       (or in a store given to Consumer::builder().store(..))"
                .into(),
        }
    }
}

/// A setting with an invalid value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {name}={value:?}: expected {expected}")]
#[non_exhaustive]
pub struct ConfigError {
    /// The variable.
    pub name: &'static str,
    /// The value it had.
    pub value: String,
    /// What would have been accepted.
    pub expected: String,
}

/// The settings a program sets in code ([`Builder::key`],
/// [`key_prefix`](crate::consumer::Builder::key_prefix),
/// [`expires_after`](crate::consumer::Builder::expires_after) and
/// [`visibility_timeout`](crate::consumer::Builder::visibility_timeout)), as
/// the values their variables are read into: the environment may say the
/// same, never otherwise.
///
/// [`Builder::key`]: crate::consumer::Builder::key
#[derive(Debug, Clone, Default)]
pub(crate) struct Fixed {
    /// The key, with the text it was given as (which a refusal quotes).
    pub(crate) key: Option<(KeySpec, String)>,
    /// The prefix keys are stored under.
    pub(crate) key_prefix: Option<String>,
    /// How long keys are remembered (`SQS_ONCE_EXPIRES_AFTER_SECS`).
    pub(crate) expires_after: Option<Duration>,
    /// The source queue's visibility timeout (`SQS_ONCE_VISIBILITY_TIMEOUT_SECS`).
    pub(crate) visibility_timeout: Option<Duration>,
}

impl Fixed {
    /// Each setting set in code, as its variable's name and its value as
    /// that variable would say it.
    fn each(&self) -> impl Iterator<Item = (&'static str, String)> {
        let seconds = |duration: &Duration| in_seconds(*duration);
        [
            self.key.as_ref().map(|(_, text)| (settings::KEY, text.clone())),
            self.key_prefix.clone().map(|prefix| (settings::KEY_PREFIX, prefix)),
            self.expires_after.as_ref().map(|after| (settings::EXPIRES_AFTER_SECS, seconds(after))),
            self.visibility_timeout.as_ref().map(|timeout| (settings::VISIBILITY_TIMEOUT_SECS, seconds(timeout))),
        ]
        .into_iter()
        .flatten()
    }

    /// The first setting set in code, as a name and its value.
    pub(crate) fn first(&self) -> Option<(&'static str, String)> {
        self.each().next()
    }

    /// Whether `set`, the environment's value of `name`, says what this
    /// program set in code: the key compared as what it reads
    /// (`body.a,body.b` is `body.a, body.b`), durations as durations, the
    /// prefix as it is written.
    fn agrees(&self, name: &str, set: &str) -> bool {
        let seconds = |set: &str| set.trim().parse().ok().map(Duration::from_secs);
        match name {
            settings::KEY => set.parse::<KeySpec>().ok() == self.key.as_ref().map(|(spec, _)| spec.clone()),
            settings::KEY_PREFIX => self.key_prefix.as_deref().map(str::trim) == Some(set.trim()),
            settings::EXPIRES_AFTER_SECS => seconds(set) == self.expires_after,
            settings::VISIBILITY_TIMEOUT_SECS => seconds(set) == self.visibility_timeout,
            _ => false,
        }
    }
}

/// `duration` as a variable of seconds says it, or as Rust writes it when it
/// is no whole number of seconds (which such a variable cannot say).
fn in_seconds(duration: Duration) -> String {
    match duration.subsec_nanos() {
        0 => duration.as_secs().to_string(),
        _ => format!("{duration:?}"),
    }
}

/// All settings, resolved: what [`Consumer`](crate::consumer::Consumer)
/// is built from. The settings are documented above.
#[derive(Debug, Clone)]
pub struct Config {
    /// Which parts of a message make its key, and how it is stored
    /// (`SQS_ONCE_KEY`, `SQS_ONCE_KEY_PREFIX`, `SQS_ONCE_HASH_KEYS`,
    /// `SQS_ONCE_ON_MISSING_KEY`).
    pub(crate) keys: Keys,
    /// The claim state machine's tuning.
    pub(crate) claims: ClaimPolicy,
    /// The batch engine's tuning.
    pub(crate) engine: EngineOptions,
    /// Where claims are kept.
    pub(crate) store: StoreChoice,
    /// Whether the DynamoDB store sends the writes of concurrent records
    /// together (`SQS_ONCE_DYNAMODB_BATCHING`, default on; see
    /// [`crate::store::DynamoDbStore::batching`]).
    #[cfg(feature = "dynamodb")]
    pub(crate) dynamodb_batching: bool,
    /// The metrics published per Lambda invocation.
    pub(crate) metrics: MetricsConfig,
    /// What SQS does with failed records besides redelivering them.
    pub(crate) redelivery: RedeliveryPolicy,
    /// How often a process that sends through the outbox sweeps it for
    /// entries left unsent (`SQS_ONCE_OUTBOX_SWEEP_SECS`; `None`: never on
    /// its own).
    pub(crate) outbox_sweep: Option<Duration>,
    /// The source queue's visibility timeout as the settings name it
    /// (`SQS_ONCE_VISIBILITY_TIMEOUT_SECS`), when they do: the Lambda
    /// function compares it with its queue's.
    pub(crate) visibility_timeout: Option<Duration>,
}

impl Config {
    /// Reads the settings from the process environment.
    ///
    /// A variable that starts `SQS_ONCE_` and is no setting is logged as a
    /// warning naming the setting it most likely stands for
    /// (`SQS_ONCE_TABEL`: `SQS_ONCE_TABLE`); one that looks like a setting
    /// of where claims are kept, what makes a key or where failures go
    /// (`SQS_ONCE_TABLE_NAME`, `SQS_ONCE_IDEMPOTENCY_KEY`, `SQS_ONCE_DLQ`)
    /// is an error: ignored, it would change what runs once.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_env_fixing(&Fixed::default(), &[])
    }

    /// [`from_env`](Self::from_env) with the settings `fixed` in code (the
    /// builder's key and key prefix): a variable that gives one of them
    /// another value is refused, as the two could not both hold. The names
    /// `own` are a handler's own settings, not reported as unknown.
    pub(crate) fn from_env_fixing(fixed: &Fixed, own: &[&str]) -> Result<Self, ConfigError> {
        // An empty value counts as unset, as everywhere.
        let set = std::env::vars_os().filter(|(_, value)| !value.to_string_lossy().trim().is_empty());
        let names = set.filter_map(|(name, _)| name.into_string().ok());
        for unknown in Unknown::among(names, own) {
            if unknown.decides() {
                return Err(unknown.refusal());
            }
            let Unknown { name, meant } = unknown;
            tracing::warn!(
                "{name} is not a setting of sqs-once and is ignored: did you mean {meant}? (a handler's own \
                 setting: declare it with Builder::handler_settings)"
            );
        }
        Self::from_lookup_fixing(|name| std::env::var(name).ok(), fixed)
    }

    /// [`from_lookup`](Self::from_lookup) with the settings `fixed` in code,
    /// refusing a value of `lookup` that disagrees with one
    /// ([`Fixed::agrees`]).
    fn from_lookup_fixing(lookup: impl Fn(&str) -> Option<String>, fixed: &Fixed) -> Result<Self, ConfigError> {
        let env = Env(&lookup);
        if fixed.key_prefix.as_ref().is_some_and(|prefix| prefix.trim().is_empty()) {
            let expected = "a value set in code: empty in code, the setting would fall back to its default";
            return Err(ConfigError {
                name: settings::KEY_PREFIX,
                value: fixed.key_prefix.clone().unwrap_or_default(),
                expected: expected.into(),
            });
        }
        for (name, in_code) in fixed.each() {
            if let Some(set) = env.text(name).filter(|set| !fixed.agrees(name, set)) {
                let expected = format!(
                    "{in_code}, which this program sets in code, or nothing: a setting made in code holds wherever \
                     the program runs, and this one decides what runs once (unset {name})"
                );
                return Err(ConfigError { name, value: set, expected });
            }
        }
        Self::read(&env, fixed)
    }

    /// How long keys are remembered: `SQS_ONCE_EXPIRES_AFTER_SECS` (or
    /// [`Builder::expires_after`](crate::consumer::Builder::expires_after)),
    /// and how long a failed record can stay away from the queue, which
    /// keys are remembered past too (from `SQS_ONCE_VISIBILITY_TIMEOUT_SECS`
    /// and the retry back-off; `poll` learns its queue's own timeout).
    ///
    /// ```
    /// use std::time::Duration;
    /// use sqs_once::config::Config;
    ///
    /// let template = |name: &str| (name == "SQS_ONCE_VISIBILITY_TIMEOUT_SECS").then(|| "180".to_owned());
    /// let memory = Config::from_lookup(template).unwrap().key_memory();
    /// assert_eq!(memory.expires_after, Duration::from_secs(3600));
    /// // The back-off's longest delay, 15 minutes, with its jitter: a redelivery finds its key.
    /// assert_eq!(memory.redelivered_within, Some(Duration::from_secs(1_081)));
    /// ```
    pub fn key_memory(&self) -> KeyMemory {
        KeyMemory::from(&self.claims)
    }

    /// Reads the settings from `lookup`, which plays the environment.
    ///
    /// ```
    /// use sqs_once::config::Config;
    ///
    /// assert!(Config::from_lookup(|name| (name == "SQS_ONCE_CONCURRENCY").then(|| "8".to_owned())).is_ok());
    ///
    /// let error = Config::from_lookup(|name| (name == "SQS_ONCE_ON_MISSING_KEY").then(|| "skip".to_owned()));
    /// assert_eq!(error.unwrap_err().to_string(), r#"invalid SQS_ONCE_ON_MISSING_KEY="skip": expected fail or message-id"#);
    /// ```
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Self::read(&Env(&lookup), &Fixed::default())
    }

    /// The settings `env` gives, with those `fixed` in code in place of
    /// theirs.
    fn read(env: &Env<'_>, fixed: &Fixed) -> Result<Self, ConfigError> {
        // One prefix wherever the consumer runs (not the function's name): a
        // `poll` consumer, `claims` on a laptop and the function share keys.
        let key_prefix = (fixed.key_prefix.clone().or_else(|| env.text(settings::KEY_PREFIX)))
            .unwrap_or_else(|| sqs_once_engine::key::DEFAULT_KEY_PREFIX.to_owned());
        // Lambda's own variables, read as the process reads them (`Environment::current`).
        let lambda = Environment::from_lookup(|name| env.text(name));
        env.log_filter()?;
        env.endpoints()?;
        let mut claims = env.claim_policy(fixed.expires_after)?;
        let engine = env.engine_options()?;
        let store = env.store(&key_prefix, &lambda)?;
        let keys = env.keys(key_prefix, engine.envelope, fixed.key.as_ref().map(|(spec, _)| spec.clone()))?;
        let redelivery = env.redelivery()?;
        // Unknown, the queue's visibility timeout is taken as SQS's longest; `poll` reads its queue's, and the
        // Lambda function its records'.
        let visibility_timeout = env.visibility_timeout(fixed.visibility_timeout)?;
        claims.redelivered_within = Some(redelivery.redelivered_within(visibility_timeout.unwrap_or(MAX_VISIBILITY)));
        Ok(Self {
            keys,
            claims,
            engine,
            store,
            #[cfg(feature = "dynamodb")]
            dynamodb_batching: env.flag(settings::DYNAMODB_BATCHING, true)?,
            metrics: env.metrics(&lambda)?,
            redelivery,
            outbox_sweep: env.outbox_sweep()?,
            visibility_timeout,
        })
    }
}

/// The environment, with parsing that names the variable on failure.
struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    /// How claims are taken and kept: `SQS_ONCE_EXPIRES_AFTER_SECS`, the
    /// lease margin, payload validation, stored results, the local cache.
    /// `in_code`: the key memory the program set, in place of the variable's.
    fn claim_policy(&self, in_code: Option<Duration>) -> Result<ClaimPolicy, ConfigError> {
        const NAME: &str = settings::EXPIRES_AFTER_SECS;
        let defaults = ClaimPolicy::default();
        let expires_after = match in_code {
            Some(expires_after) => expires_after,
            None => Duration::from_secs(self.parse(NAME, defaults.expires_after.as_secs(), EXPIRES_AFTER)?),
        };
        // Whole seconds, as the stores keep them (a DynamoDB TTL is a number of seconds).
        if expires_after.is_zero() || expires_after.subsec_nanos() != 0 {
            return Err(self.invalid_in(NAME, in_code, EXPIRES_AFTER));
        }
        let claims = ClaimPolicy {
            expires_after,
            lease_margin: Duration::from_millis(self.parse(
                settings::LEASE_MARGIN_MS,
                duration_ms(defaults.lease_margin),
                "a number of milliseconds",
            )?),
            validate_payload: self.flag(settings::VALIDATE_PAYLOAD, defaults.validate_payload)?,
            store_result: self.flag(settings::STORE_RESULT, defaults.store_result)?,
            keys_in_items: self.flag(settings::KEYS_IN_ITEMS, defaults.keys_in_items)?,
            local_cache_entries: self.parse(
                settings::LOCAL_CACHE,
                defaults.local_cache_entries,
                "a number of entries (0 turns the cache off)",
            )?,
            ..defaults
        };
        Ok(claims)
    }

    /// How batches run: concurrency, the deadline margin, body logging, the
    /// envelope, whether a run that stages every effect takes a claim.
    fn engine_options(&self) -> Result<EngineOptions, ConfigError> {
        let defaults = EngineOptions::default();
        let engine = EngineOptions {
            concurrency: self.parse(settings::CONCURRENCY, defaults.concurrency, "a positive number of records")?,
            margins: Margins {
                deadline_margin: Duration::from_millis(self.parse(
                    settings::DEADLINE_MARGIN_MS,
                    duration_ms(defaults.margins.deadline_margin),
                    DEADLINE_MARGIN,
                )?),
                ..defaults.margins
            },
            log_bodies: self.flag(settings::LOG_BODIES, defaults.log_bodies)?,
            envelope: self.parse(settings::ENVELOPE, defaults.envelope, "none, sns or eventbridge")?,
            claim: self.parse(settings::CLAIM, defaults.claim, "auto or always")?,
            propagators: self.parse("OTEL_PROPAGATORS", defaults.propagators, sqs_once_core::trace::PROPAGATORS)?,
            payloads: self.payload_options()?,
        };
        if engine.concurrency == 0 {
            return Err(self.invalid(settings::CONCURRENCY, "a positive number of records"));
        }
        if engine.margins.deadline_margin < ANSWER_TIME {
            return Err(self.invalid(settings::DEADLINE_MARGIN_MS, DEADLINE_MARGIN));
        }
        Ok(engine)
    }

    /// How records that carry an S3 pointer are read, and where staged
    /// messages too large to send go: `SQS_ONCE_LARGE_PAYLOADS`,
    /// `SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES`, `SQS_ONCE_LARGE_PAYLOAD_DELETE`,
    /// `SQS_ONCE_LARGE_PAYLOAD_BUCKET`.
    fn payload_options(&self) -> Result<PayloadOptions, ConfigError> {
        let defaults = PayloadOptions::default();
        let options = PayloadOptions {
            fetch: self.flag(settings::LARGE_PAYLOADS, defaults.fetch)?,
            max_bytes: self.parse(
                settings::LARGE_PAYLOAD_MAX_BYTES,
                defaults.max_bytes,
                "a positive number of bytes",
            )?,
            delete_after: self.flag(settings::LARGE_PAYLOAD_DELETE, defaults.delete_after)?,
            memory: self.parse(settings::LARGE_PAYLOAD_MEMORY, defaults.memory, "a positive number of bytes")?,
            bucket: self.text(settings::LARGE_PAYLOAD_BUCKET).map(|bucket| bucket.trim().to_owned()),
            threshold: self.parse(settings::LARGE_PAYLOAD_THRESHOLD, defaults.threshold, "a number of bytes")?,
        };
        if options.memory < options.max_bytes {
            return Err(self.invalid(
                settings::LARGE_PAYLOAD_MEMORY,
                format!(
                    "at least SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES ({}): room for the largest payload",
                    options.max_bytes
                ),
            ));
        }
        if options.bucket.is_some() && !cfg!(feature = "s3") {
            return Err(self.invalid(
                settings::LARGE_PAYLOAD_BUCKET,
                "nothing: this program was built without sqs-once's `s3` feature, which writes to S3",
            ));
        }
        if options.max_bytes == 0 {
            return Err(self.invalid(settings::LARGE_PAYLOAD_MAX_BYTES, "a positive number of bytes"));
        }
        if options.delete_after && !options.fetch {
            return Err(self.invalid(
                settings::LARGE_PAYLOAD_DELETE,
                "false while SQS_ONCE_LARGE_PAYLOADS is off: no payload is read, so none is deleted",
            ));
        }
        Ok(options)
    }

    /// The claim store `SQS_ONCE_STORE` and `SQS_ONCE_TABLE` name. Inside
    /// Lambda only DynamoDB, or a store given to the builder, will do.
    fn store(&self, key_prefix: &str, lambda: &Environment) -> Result<StoreChoice, ConfigError> {
        let in_lambda = lambda.in_lambda();
        let file = || {
            #[cfg(feature = "sqlite")]
            return Some(StoreChoice::File(self.text(settings::STORE_PATH).unwrap_or(LOCAL_STORE_PATH.into()).into()));
            #[cfg(not(feature = "sqlite"))]
            None
        };
        let store = match self.text(settings::STORE).as_deref() {
            None if self.text(settings::TABLE).is_some() => self.dynamodb(settings::TABLE, key_prefix)?,
            // A store given to the builder will do; without one, the consumer refuses to start.
            None if in_lambda => StoreChoice::Unnamed,
            // A file's path is a store named too.
            None if self.text(settings::STORE_PATH).is_some() => file().unwrap_or(StoreChoice::Unchosen),
            None => StoreChoice::Unchosen,
            Some("dynamodb") => self.dynamodb(settings::STORE, key_prefix)?,
            Some("file") => file().ok_or_else(|| self.invalid(settings::STORE, STORES))?,
            Some("memory") => StoreChoice::Memory,
            Some(_) => return Err(self.invalid(settings::STORE, STORES)),
        };
        if in_lambda && !store.fits_lambda() {
            return Err(StoreChoice::Unnamed.refusal());
        }
        Ok(store)
    }

    /// How each record is keyed: `SQS_ONCE_KEY` (whose `envelope.` parts need
    /// an `envelope`), hashing, and what a record without its key gets.
    fn keys(&self, key_prefix: String, envelope: EnvelopeKind, in_code: Option<KeySpec>) -> Result<Keys, ConfigError> {
        let spec = match in_code {
            Some(spec) => spec,
            None => self.parse_with(settings::KEY, KeySpec::default(), |e: <KeySpec as FromStr>::Err| e.to_string())?,
        };
        if spec.reads_envelope() && envelope == EnvelopeKind::None {
            return Err(self.invalid(settings::KEY, "no envelope.<path> part while SQS_ONCE_ENVELOPE is none"));
        }
        let on_missing = self.parse(settings::ON_MISSING_KEY, OnMissingKey::default(), "fail or message-id")?;
        Ok(Keys::of(spec, key_prefix).hashed(self.flag(settings::HASH_KEYS, true)?).on_missing(on_missing))
    }

    /// How often the outbox is swept for entries left unsent; `None` when
    /// `SQS_ONCE_OUTBOX_SWEEP_SECS` is 0.
    fn outbox_sweep(&self) -> Result<Option<Duration>, ConfigError> {
        let every = self.parse(
            settings::OUTBOX_SWEEP_SECS,
            DEFAULT_OUTBOX_SWEEP.as_secs(),
            "a number of seconds (0 turns the sweep off)",
        )?;
        Ok(Some(Duration::from_secs(every)).filter(|every| !every.is_zero()))
    }

    /// Refuses an `SQS_ONCE_LOG` the log lines' filter would not take (and
    /// so leave for `RUST_LOG` or `info`), or would read as something else
    /// than meant: a bare word that is no level (`verbose`) is a target's
    /// name to the filter, and turns every other line off.
    fn log_filter(&self) -> Result<(), ConfigError> {
        let Some(filter) = self.text(settings::LOG) else { return Ok(()) };
        let expected = "a level (trace, debug, info, warn, error, off) or target=level directives, comma-separated \
                        (info,sqs_once=debug)";
        if let Err(error) = tracing_subscriber::EnvFilter::try_new(&filter) {
            return Err(self.invalid(settings::LOG, format!("{expected}: {error}")));
        }
        let bare_word = |directive: &&str| !directive.is_empty() && !directive.contains(['=', '[']);
        let not_a_level = |directive: &&str| directive.parse::<tracing::level_filters::LevelFilter>().is_err();
        match filter.split(',').map(str::trim).filter(bare_word).find(not_a_level) {
            None => Ok(()),
            Some(word) => Err(self.invalid(settings::LOG, format!("{expected}; `{word}` is neither"))),
        }
    }

    /// A variable's value; empty counts as unset, as it does in Lambda's console.
    fn text(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|value| !value.trim().is_empty())
    }

    fn parse<T: FromStr>(&self, name: &'static str, default: T, expected: &str) -> Result<T, ConfigError> {
        self.parse_with(name, default, |_| expected.to_owned())
    }

    fn parse_with<T: FromStr>(
        &self,
        name: &'static str,
        default: T,
        expected: impl FnOnce(T::Err) -> String,
    ) -> Result<T, ConfigError> {
        match self.text(name) {
            None => Ok(default),
            Some(value) => value.trim().parse().map_err(|error| ConfigError { name, value, expected: expected(error) }),
        }
    }

    /// The DynamoDB store, which `variable` asked for.
    #[cfg(feature = "dynamodb")]
    fn dynamodb(&self, _variable: &'static str, key_prefix: &str) -> Result<StoreChoice, ConfigError> {
        Ok(StoreChoice::DynamoDb(self.table_layout(key_prefix)?))
    }

    /// The DynamoDB store, which `variable` asked for, in a program built
    /// without it: a store given to the builder, or a start-up error rather
    /// than memory, which would forget every key with the process.
    #[cfg(not(feature = "dynamodb"))]
    fn dynamodb(&self, variable: &'static str, _key_prefix: &str) -> Result<StoreChoice, ConfigError> {
        Ok(StoreChoice::NotBuilt(variable, self.text(variable).unwrap_or_default()))
    }

    /// The DynamoDB table and attribute names (`SQS_ONCE_TABLE`, `SQS_ONCE_ATTR_*`,
    /// `SQS_ONCE_TABLE_SORT_KEY`, `SQS_ONCE_TABLE_PARTITION_VALUE`).
    #[cfg(feature = "dynamodb")]
    fn table_layout(&self, key_prefix: &str) -> Result<TableLayout, ConfigError> {
        let table = self.text(settings::TABLE).ok_or_else(|| {
            self.invalid(settings::TABLE, "the name of the DynamoDB claim table, which SQS_ONCE_STORE=dynamodb needs")
        })?;
        let defaults = Attributes::default();
        let name = |variable: &str, default: String| self.text(variable).unwrap_or(default);
        let partition = name(settings::ATTR_ID, defaults.id);
        let (id, key) = match self.text(settings::TABLE_SORT_KEY) {
            None => (partition, TableKey::Partition),
            Some(sort_key) => {
                let partition_value = name(settings::TABLE_PARTITION_VALUE, format!("idempotency#{key_prefix}"));
                (sort_key, TableKey::Sorted { partition_attribute: partition, partition_value })
            }
        };
        let attributes = Attributes {
            id,
            expiry: name(settings::ATTR_EXPIRY, defaults.expiry),
            lease: name(settings::ATTR_IN_PROGRESS_EXPIRY, defaults.lease),
            status: name(settings::ATTR_STATUS, defaults.status),
            data: name(settings::ATTR_DATA, defaults.data),
            validation: name(settings::ATTR_VALIDATION, defaults.validation),
        };
        Ok(TableLayout { table, attributes, key })
    }

    /// `SQS_ONCE_METRICS`, `SQS_ONCE_METRICS_NAMESPACE` and
    /// `SQS_ONCE_METRICS_DIMENSIONS` (`Name=Value` pairs, comma-separated; the
    /// default is the function name).
    fn metrics(&self, lambda: &Environment) -> Result<MetricsConfig, ConfigError> {
        let defaults = MetricsConfig::default();
        let dimensions = match self.text(settings::METRICS_DIMENSIONS) {
            Some(pairs) => pairs
                .split(',')
                .map(|pair| match pair.split_once('=') {
                    Some((name, value)) if !name.trim().is_empty() => Ok((name.trim().into(), value.trim().into())),
                    _ => Err(self.invalid(settings::METRICS_DIMENSIONS, "comma-separated Name=Value pairs")),
                })
                .collect::<Result<_, _>>()?,
            None => lambda.function_name.clone().map(|name| ("FunctionName".into(), name)).into_iter().collect(),
        };
        Ok(MetricsConfig {
            enabled: self.flag(settings::METRICS, defaults.enabled)?,
            namespace: self.text(settings::METRICS_NAMESPACE).unwrap_or(defaults.namespace),
            dimensions,
        })
    }

    /// `SQS_ONCE_CONFLICT_BACKOFF`, `SQS_ONCE_RETRY_BASE_SECS` (0 turns the
    /// retry back-off off), `SQS_ONCE_RETRY_MAX_SECS` and `SQS_ONCE_DLQ_URL`.
    fn redelivery(&self) -> Result<RedeliveryPolicy, ConfigError> {
        const SECONDS: &str = "a number of seconds, at most 43200 (12 hours, the longest SQS visibility timeout)";
        let seconds = |name, default| {
            let seconds: u64 = self.parse(name, default, SECONDS)?;
            let duration = Duration::from_secs(seconds);
            if duration > MAX_VISIBILITY { Err(self.invalid(name, SECONDS)) } else { Ok(duration) }
        };
        let defaults = RedeliveryPolicy::default();
        let backoff = defaults.retry_backoff.unwrap_or_default();
        let base = seconds(settings::RETRY_BASE_SECS, backoff.base.as_secs())?;
        let max = seconds(settings::RETRY_MAX_SECS, backoff.max.as_secs())?;
        if max < base {
            return Err(self.invalid(settings::RETRY_MAX_SECS, "at least SQS_ONCE_RETRY_BASE_SECS"));
        }
        let mut policy = defaults;
        policy.conflict_backoff = self.flag(settings::CONFLICT_BACKOFF, policy.conflict_backoff)?;
        policy.longest_delay = max;
        policy.retry_backoff = (!base.is_zero()).then_some(RetryBackoff { base, max });
        policy.dead_letter_queue = self.dead_letter_queue()?;
        Ok(policy)
    }

    /// `SQS_ONCE_VISIBILITY_TIMEOUT_SECS`: the source queue's visibility
    /// timeout, as the template hands it to the function, or `in_code`, as
    /// the program set it.
    fn visibility_timeout(&self, in_code: Option<Duration>) -> Result<Option<Duration>, ConfigError> {
        const SECONDS: &str = "the source queue's visibility timeout in seconds, at most 43200 (12 hours)";
        const NAME: &str = settings::VISIBILITY_TIMEOUT_SECS;
        let timeout = match in_code {
            Some(timeout) => timeout,
            None if self.text(NAME).is_none() => return Ok(None),
            None => Duration::from_secs(self.parse(NAME, 0, SECONDS)?),
        };
        // Whole seconds, as SQS keeps it.
        match timeout > MAX_VISIBILITY || timeout.subsec_nanos() != 0 {
            true => Err(self.invalid_in(NAME, in_code, SECONDS)),
            false => Ok(Some(timeout)),
        }
    }

    /// `SQS_ONCE_DLQ_URL`: a queue URL, or nothing. (Run locally by SAM, a
    /// template's `!Ref` of a queue arrives as the queue's logical id.)
    fn dead_letter_queue(&self) -> Result<Option<String>, ConfigError> {
        let Some(url) = self.text(settings::DLQ_URL) else { return Ok(None) };
        let path = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
        match path.map(|path| path.split('/').filter(|part| !part.is_empty()).count()) {
            Some(3..) => Ok(Some(url)),
            _ => Err(self.invalid(
                settings::DLQ_URL,
                "a queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME); run by `sam local invoke`, a template's \
                 !Ref of a queue is its logical id: give the local queue's URL in env.json",
            )),
        }
    }

    fn flag(&self, name: &'static str, default: bool) -> Result<bool, ConfigError> {
        match self.text(name).map(|value| value.trim().to_ascii_lowercase()).as_deref() {
            None => Ok(default),
            Some("1" | "true" | "yes" | "on") => Ok(true),
            Some("0" | "false" | "no" | "off") => Ok(false),
            Some(_) => Err(self.invalid(name, "true or false")),
        }
    }

    /// Refuses an endpoint that is no URL (`localhost:9324`, without its
    /// scheme): the SDK fails each request to it as a connection it could
    /// not make, which a poller waits out, forever.
    fn endpoints(&self) -> Result<(), ConfigError> {
        for name in ENDPOINTS {
            let Some(value) = self.text(name) else { continue };
            let value = value.trim();
            let host = value.strip_prefix("http://").or_else(|| value.strip_prefix("https://"));
            if host.is_none_or(|host| host.is_empty() || host.starts_with('/')) {
                return Err(self.invalid(name, "a URL with its scheme, such as http://localhost:9324"));
            }
        }
        Ok(())
    }

    fn invalid(&self, name: &'static str, expected: impl Display) -> ConfigError {
        ConfigError { name, value: self.text(name).unwrap_or_default(), expected: expected.to_string() }
    }

    /// [`invalid`](Self::invalid), of the duration `in_code` where the
    /// program set one in place of the variable.
    fn invalid_in(&self, name: &'static str, in_code: Option<Duration>, expected: impl Display) -> ConfigError {
        match in_code {
            Some(duration) => ConfigError { name, value: in_seconds(duration), expected: expected.to_string() },
            None => self.invalid(name, expected),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_lookup(|name| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string()))
    }

    #[test]
    fn large_payloads_are_read_by_default_and_their_settings_must_make_sense() {
        let payloads = config(&[]).unwrap().engine.payloads;
        let defaults = PayloadOptions {
            fetch: true,
            max_bytes: 16 * 1024 * 1024,
            delete_after: false,
            memory: 128 * 1024 * 1024,
            bucket: None,
            threshold: 256 * 1024,
        };
        assert_eq!(payloads, defaults);
        let error = config(&[("SQS_ONCE_LARGE_PAYLOAD_MEMORY", "1048576")]).unwrap_err();
        assert_eq!(error.name, "SQS_ONCE_LARGE_PAYLOAD_MEMORY", "no room for a payload of the largest size");
        let room = config(&[("SQS_ONCE_LARGE_PAYLOAD_MEMORY", "16777216")]).unwrap().engine.payloads;
        assert_eq!(room.memory, room.max_bytes, "a payload is held once: room for one of the largest will do");
        let error = config(&[("SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES", "0")]).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"invalid SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES="0": expected a positive number of bytes"#
        );
        let error =
            config(&[("SQS_ONCE_LARGE_PAYLOADS", "off"), ("SQS_ONCE_LARGE_PAYLOAD_DELETE", "true")]).unwrap_err();
        assert_eq!(error.name, "SQS_ONCE_LARGE_PAYLOAD_DELETE", "nothing read, nothing to delete");
        let payloads =
            config(&[("SQS_ONCE_LARGE_PAYLOAD_DELETE", "true"), ("SQS_ONCE_LARGE_PAYLOAD_MAX_BYTES", "1048576")])
                .unwrap()
                .engine
                .payloads;
        assert_eq!(payloads, PayloadOptions { max_bytes: 1_048_576, delete_after: true, ..defaults });
        let bucket = config(&[("SQS_ONCE_LARGE_PAYLOAD_BUCKET", "large")]);
        if cfg!(feature = "s3") {
            assert_eq!(bucket.unwrap().engine.payloads.bucket.as_deref(), Some("large"));
        } else {
            assert_eq!(bucket.unwrap_err().name, "SQS_ONCE_LARGE_PAYLOAD_BUCKET", "without `s3`, refused at the start");
        }
    }

    #[test]
    fn keys_are_remembered_past_the_queues_redelivery_its_timeout_known_or_the_longest_assumed() {
        let within = |pairs: &[(&str, &str)]| config(pairs).unwrap().claims.redelivered_within;
        // Unknown, the visibility timeout is SQS's longest: twelve hours.
        assert_eq!(within(&[]), Some(MAX_VISIBILITY));
        // The template's queue, 180 s, and the default back-off's ceiling, 900 s with its jitter (181 s).
        assert_eq!(within(&[("SQS_ONCE_VISIBILITY_TIMEOUT_SECS", "180")]), Some(Duration::from_secs(1_081)));
        let short = [("SQS_ONCE_VISIBILITY_TIMEOUT_SECS", "180"), ("SQS_ONCE_RETRY_MAX_SECS", "60")];
        assert_eq!(within(&short), Some(Duration::from_secs(180)));
        let error = config(&[("SQS_ONCE_VISIBILITY_TIMEOUT_SECS", "43201")]).unwrap_err();
        assert_eq!(error.name, "SQS_ONCE_VISIBILITY_TIMEOUT_SECS");
        assert!(config(&[("SQS_ONCE_VISIBILITY_TIMEOUT_SECS", "soon")]).is_err());
    }

    #[test]
    fn runs_claim_first_unless_told_they_need_not() {
        use sqs_once_engine::ClaimFirst;
        assert_eq!(config(&[]).unwrap().engine.claim, ClaimFirst::Auto);
        assert_eq!(config(&[("SQS_ONCE_CLAIM", "always")]).unwrap().engine.claim, ClaimFirst::Always);
        assert!(!config(&[]).unwrap().claims.keys_in_items, "keys in items only where a handler's update asks");
        assert!(config(&[("SQS_ONCE_KEYS_IN_ITEMS", "true")]).unwrap().claims.keys_in_items);
        let error = config(&[("SQS_ONCE_CLAIM", "never")]).unwrap_err();
        assert_eq!(error.to_string(), r#"invalid SQS_ONCE_CLAIM="never": expected auto or always"#);
    }

    #[test]
    fn a_deadline_margin_leaves_the_answer_its_time() {
        for margin in ["0", "99"] {
            let error = config(&[("SQS_ONCE_DEADLINE_MARGIN_MS", margin)]).unwrap_err();
            assert_eq!(error.name, "SQS_ONCE_DEADLINE_MARGIN_MS");
            assert!(error.to_string().contains("at least 100"), "{error}");
        }
        let config = config(&[("SQS_ONCE_DEADLINE_MARGIN_MS", "100")]).unwrap();
        assert_eq!(config.engine.margins.deadline_margin, ANSWER_TIME);
    }

    #[cfg(feature = "dynamodb")]
    #[test]
    fn the_table_selects_dynamodb_with_powertools_names_and_an_optional_sort_key() {
        let plain = config(&[("SQS_ONCE_TABLE", "claims")]).unwrap();
        assert_eq!(plain.store, StoreChoice::DynamoDb(TableLayout::new("claims")));
        assert!(plain.dynamodb_batching, "writes are batched by default");
        let single = config(&[("SQS_ONCE_TABLE", "claims"), ("SQS_ONCE_DYNAMODB_BATCHING", "false")]).unwrap();
        assert!(!single.dynamodb_batching);
        let sorted = config(&[
            ("SQS_ONCE_TABLE", "shared"),
            ("SQS_ONCE_KEY_PREFIX", "payments"),
            ("SQS_ONCE_TABLE_SORT_KEY", "sk"),
            ("SQS_ONCE_ATTR_EXPIRY", "ttl"),
        ])
        .unwrap();
        let StoreChoice::DynamoDb(layout) = sorted.store else { panic!("not DynamoDB") };
        assert_eq!((layout.attributes.id.as_str(), layout.attributes.expiry.as_str()), ("sk", "ttl"));
        let partition =
            TableKey::Sorted { partition_attribute: "id".into(), partition_value: "idempotency#payments".into() };
        assert_eq!(layout.key, partition);
        assert_eq!(sorted.keys.prefix(), "payments");
    }

    #[test]
    fn keys_have_one_prefix_wherever_the_consumer_runs() {
        let lambda = config(&[("AWS_LAMBDA_FUNCTION_NAME", "payments-ConsumerFunction-Ab12Cd34")]).unwrap();
        assert_eq!(lambda.keys.prefix(), "sqs-once", "the function's name is not the prefix");
        assert_eq!(config(&[]).unwrap().keys.prefix(), "sqs-once");
        assert_eq!(config(&[("SQS_ONCE_KEY_PREFIX", "payments")]).unwrap().keys.prefix(), "payments");
    }

    #[test]
    fn keys_set_in_code_win_and_a_setting_that_disagrees_is_refused() {
        let spec = "body.order_id, body.line";
        let fixed = Fixed {
            key: Some((spec.parse().unwrap(), spec.to_owned())),
            key_prefix: Some("payments".to_owned()),
            ..Fixed::default()
        };
        let with = |pairs: &[(&str, &str)]| {
            let lookup = |name: &str| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string());
            Config::from_lookup_fixing(lookup, &fixed)
        };
        let config = with(&[]).unwrap();
        assert_eq!(config.keys.prefix(), "payments");
        // The same key, spelled with other spaces, agrees.
        assert!(with(&[("SQS_ONCE_KEY", "body.order_id,body.line"), ("SQS_ONCE_KEY_PREFIX", "payments")]).is_ok());
        let error = with(&[("SQS_ONCE_KEY", "messageId")]).unwrap_err().to_string();
        assert!(
            error.starts_with(r#"invalid SQS_ONCE_KEY="messageId": expected body.order_id, body.line, which this"#)
        );
        // A key that does not read at all cannot say the same.
        assert_eq!(with(&[("SQS_ONCE_KEY", "body.")]).unwrap_err().name, "SQS_ONCE_KEY");
        let error = with(&[("SQS_ONCE_KEY_PREFIX", "orders")]).unwrap_err();
        assert_eq!(error.name, "SQS_ONCE_KEY_PREFIX");
        let empty = Fixed { key_prefix: Some(" ".to_owned()), ..Fixed::default() };
        let empty = Config::from_lookup_fixing(|_| None, &empty).unwrap_err();
        assert!(empty.expected.contains("empty in code"), "{empty}");
    }

    #[test]
    fn a_key_memory_set_in_code_is_a_duration_the_environment_may_only_repeat() {
        let hours = |hours: u64| Duration::from_secs(hours * 3600);
        let fixed = Fixed {
            expires_after: Some(hours(2)),
            visibility_timeout: Some(Duration::from_secs(180)),
            ..Fixed::default()
        };
        let with = |fixed: &Fixed, pairs: &[(&str, &str)]| {
            let lookup = |name: &str| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string());
            Config::from_lookup_fixing(lookup, fixed)
        };
        let memory = with(&fixed, &[]).unwrap().key_memory();
        assert_eq!(memory.expires_after, hours(2));
        // The queue's 180 s and the default back-off's 900 s ceiling with its jitter.
        assert_eq!(memory.redelivered_within, Some(Duration::from_secs(1_081)));
        let same = [("SQS_ONCE_EXPIRES_AFTER_SECS", " 7200 "), ("SQS_ONCE_VISIBILITY_TIMEOUT_SECS", "180")];
        assert!(with(&fixed, &same).is_ok(), "the same durations, said in seconds");
        let error = with(&fixed, &[("SQS_ONCE_EXPIRES_AFTER_SECS", "3600")]).unwrap_err().to_string();
        assert!(
            error.starts_with(r#"invalid SQS_ONCE_EXPIRES_AFTER_SECS="3600": expected 7200, which this program sets"#),
            "{error}"
        );
        let error = with(&fixed, &[("SQS_ONCE_VISIBILITY_TIMEOUT_SECS", "30")]).unwrap_err();
        assert_eq!(error.name, "SQS_ONCE_VISIBILITY_TIMEOUT_SECS");
        // In code as from the environment: no key memory of nothing, or of a fraction of a second.
        for expires_after in [Duration::ZERO, Duration::from_millis(1_500)] {
            let fixed = Fixed { expires_after: Some(expires_after), ..Fixed::default() };
            let error = with(&fixed, &[]).unwrap_err();
            assert_eq!(error.name, "SQS_ONCE_EXPIRES_AFTER_SECS");
            assert_eq!(error.expected, EXPIRES_AFTER);
        }
        let fixed = Fixed { expires_after: Some(Duration::from_millis(1_500)), ..Fixed::default() };
        assert_eq!(with(&fixed, &[]).unwrap_err().value, "1.5s", "the value as it was set");
        let fixed = Fixed { visibility_timeout: Some(hours(13)), ..Fixed::default() };
        let error = with(&fixed, &[]).unwrap_err();
        assert_eq!((error.name, error.value.as_str()), ("SQS_ONCE_VISIBILITY_TIMEOUT_SECS", "46800"));
        assert_eq!(fixed.first(), Some(("SQS_ONCE_VISIBILITY_TIMEOUT_SECS", "46800".to_owned())));
    }

    #[test]
    fn a_log_filter_that_is_no_level_is_refused() {
        for fine in
            ["debug", "INFO", "info,sqs_once=debug", "warn,aws_config=error", "sqs_once[record]=trace", "off", "3"]
        {
            assert!(config(&[("SQS_ONCE_LOG", fine)]).is_ok(), "{fine}");
        }
        // A directive the filter itself refuses, which would leave the lines at `info` unsaid.
        assert!(config(&[("SQS_ONCE_LOG", "sqs_once=verbose")]).is_err());
        let error = config(&[("SQS_ONCE_LOG", "verbose")]).unwrap_err().to_string();
        assert!(error.starts_with(r#"invalid SQS_ONCE_LOG="verbose": expected a level (trace, debug"#), "{error}");
        assert!(error.ends_with("`verbose` is neither"), "{error}");
        assert!(config(&[("SQS_ONCE_LOG", "info,chatty")]).is_err());
    }

    #[test]
    fn an_envelope_is_chosen_by_name_and_envelope_keys_need_one() {
        assert_eq!(config(&[]).unwrap().engine.envelope, EnvelopeKind::None);
        let sns = config(&[("SQS_ONCE_ENVELOPE", "sns"), ("SQS_ONCE_KEY", "envelope.MessageId")]).unwrap();
        assert_eq!(sns.engine.envelope, EnvelopeKind::Sns);
        assert_eq!(config(&[("SQS_ONCE_ENVELOPE", "eventbridge")]).unwrap().engine.envelope, EnvelopeKind::EventBridge);
        let unknown = config(&[("SQS_ONCE_ENVELOPE", "kinesis")]).unwrap_err();
        assert_eq!(unknown.to_string(), r#"invalid SQS_ONCE_ENVELOPE="kinesis": expected none, sns or eventbridge"#);
        let orphan = config(&[("SQS_ONCE_KEY", "envelope.MessageId")]).unwrap_err();
        assert_eq!(orphan.name, "SQS_ONCE_KEY");
        assert!(orphan.expected.contains("SQS_ONCE_ENVELOPE is none"), "{orphan}");
    }

    #[test]
    fn redelivery_backs_off_by_default_and_dead_letters_when_asked() {
        let default = config(&[]).unwrap().redelivery;
        assert!(default.conflict_backoff);
        assert_eq!(
            default.retry_backoff,
            Some(RetryBackoff { base: Duration::from_secs(5), max: Duration::from_secs(900) })
        );
        assert_eq!(default.dead_letter_queue, None);
        let custom = config(&[
            ("SQS_ONCE_CONFLICT_BACKOFF", "off"),
            ("SQS_ONCE_RETRY_BASE_SECS", "0"),
            ("SQS_ONCE_DLQ_URL", "https://sqs.eu-west-1.amazonaws.com/1/dlq"),
        ])
        .unwrap()
        .redelivery;
        assert!(!custom.conflict_backoff && custom.retry_backoff.is_none());
        assert_eq!(custom.dead_letter_queue.as_deref(), Some("https://sqs.eu-west-1.amazonaws.com/1/dlq"));
        for not_a_url in ["DeadLetterQueue", "https://sqs.eu-west-1.amazonaws.com/dlq", "sqs://x/1/dlq"] {
            let error = config(&[("SQS_ONCE_DLQ_URL", not_a_url)]).unwrap_err().to_string();
            assert!(error.contains("a queue URL") && error.contains(not_a_url), "{error}");
        }
        let inverted = config(&[("SQS_ONCE_RETRY_BASE_SECS", "60"), ("SQS_ONCE_RETRY_MAX_SECS", "30")]).unwrap_err();
        assert_eq!(inverted.name, "SQS_ONCE_RETRY_MAX_SECS");
        let too_long = config(&[("SQS_ONCE_RETRY_MAX_SECS", "50000")]).unwrap_err();
        assert!(too_long.to_string().contains("43200"), "{too_long}");
    }

    #[test]
    fn inside_lambda_only_dynamodb_will_do() {
        let unnamed = config(&[("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001")]).unwrap();
        assert_eq!(unnamed.store, StoreChoice::Unnamed, "left to the builder, which refuses it without a store");
        assert!(config(&[("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001"), ("SQS_ONCE_TABLE", "t")]).is_ok());
        let memory = config(&[("AWS_LAMBDA_RUNTIME_API", "x"), ("SQS_ONCE_TABLE", "t"), ("SQS_ONCE_STORE", "memory")]);
        assert!(memory.is_err(), "an explicit non-DynamoDB store is refused in Lambda too");
    }

    #[test]
    fn an_endpoint_that_is_no_url_stops_the_start() {
        let error = config(&[("AWS_ENDPOINT_URL_SQS", "localhost:9324")]).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"invalid AWS_ENDPOINT_URL_SQS="localhost:9324": expected a URL with its scheme, such as http://localhost:9324"#
        );
        assert_eq!(config(&[("AWS_ENDPOINT_URL", "http://")]).unwrap_err().name, "AWS_ENDPOINT_URL");
        assert!(config(&[("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:8000")]).is_ok());
        assert!(config(&[("AWS_ENDPOINT_URL_S3", "https://s3.example.com/")]).is_ok());
    }

    #[test]
    fn outside_lambda_a_store_is_named_or_left_unchosen_never_picked() {
        assert_eq!(config(&[]).unwrap().store, StoreChoice::Unchosen, "invoke's local file, poll's refusal");
        let refusal = StoreChoice::Unchosen.refusal().to_string();
        assert!(refusal.contains("SQS_ONCE_TABLE") && refusal.contains("SQS_ONCE_STORE=file"), "{refusal}");
        assert_eq!(config(&[("SQS_ONCE_STORE", "memory")]).unwrap().store, StoreChoice::Memory);
        #[cfg(feature = "sqlite")]
        {
            let file = config(&[("SQS_ONCE_STORE", "file")]).unwrap().store;
            assert_eq!(file, StoreChoice::File(LOCAL_STORE_PATH.into()));
            let path = config(&[("SQS_ONCE_STORE_PATH", "/var/lib/claims.db")]).unwrap().store;
            assert_eq!(path, StoreChoice::File("/var/lib/claims.db".into()), "a path names a file store");
        }
    }

    #[test]
    fn metrics_dimensions_default_to_the_function_and_parse_pairs() {
        let default = config(&[("AWS_LAMBDA_FUNCTION_NAME", "orders")]).unwrap();
        assert_eq!(default.metrics.dimensions, [("FunctionName".to_owned(), "orders".to_owned())]);
        let custom = config(&[("SQS_ONCE_METRICS_DIMENSIONS", "Service=payments, Stage=prod")]).unwrap();
        let expected = [("Service".to_owned(), "payments".to_owned()), ("Stage".to_owned(), "prod".to_owned())];
        assert_eq!(custom.metrics.dimensions, expected);
        assert!(config(&[("SQS_ONCE_METRICS_DIMENSIONS", "nope")]).is_err());
        assert!(!config(&[("SQS_ONCE_METRICS", "off")]).unwrap().metrics.enabled);
    }

    #[test]
    fn flags_and_numbers_name_the_variable_when_invalid() {
        let error = config(&[("SQS_ONCE_VALIDATE_PAYLOAD", "maybe")]).unwrap_err();
        assert_eq!(error.to_string(), r#"invalid SQS_ONCE_VALIDATE_PAYLOAD="maybe": expected true or false"#);
        let error = config(&[("SQS_ONCE_EXPIRES_AFTER_SECS", "-1")]).unwrap_err();
        assert_eq!(error.name, "SQS_ONCE_EXPIRES_AFTER_SECS");
        let error = config(&[("SQS_ONCE_EXPIRES_AFTER_SECS", "0")]).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"invalid SQS_ONCE_EXPIRES_AFTER_SECS="0": expected a positive number of seconds"#
        );
        let empty = config(&[("SQS_ONCE_CONCURRENCY", "  ")]).unwrap();
        assert_eq!(empty.engine.concurrency, 64, "an empty value counts as unset");
    }
}
