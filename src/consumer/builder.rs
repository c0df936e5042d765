//! How a consumer is put together: the values given, the `SQS_ONCE_`
//! settings and the AWS SDK's own environment for the rest. The one place
//! every way to run (the Lambda function, `poll`, `invoke`, `claims`,
//! `create-table`) assembles its parts.

use std::{sync::Arc, time::Duration};

use aws_config::SdkConfig;
use lambda_runtime::{
    LambdaInvocation,
    tower::{Layer, Service, util::BoxCloneService},
};

use super::{Consumer, StartupError};

// The DynamoDB store's assembly, gated once here.
#[cfg(feature = "dynamodb")]
mod dynamodb;
use crate::{
    config::{Config, ConfigError, Fixed, StoreChoice, settings},
    destinations::AwsDestinations,
    redelivery::Redelivery,
    sqs::Sqs,
    store::{ClaimStore, MemoryStore},
};
use sqs_once_core::{BoxHandler, Handler, destinations::Destinations, payload::PayloadStore};
#[cfg(feature = "dynamodb")]
use sqs_once_dynamodb::RequestCounter;
use sqs_once_engine::{Engine, key::KeySpec};

/// The Lambda function's service as `lambda_runtime` runs it: each
/// invocation's raw request and context in, the answer posted to the
/// Runtime API. [`Builder::layer`] wraps it.
pub type LambdaService = BoxCloneService<LambdaInvocation, (), lambda_runtime::Error>;

/// The layers [`Builder::layer`] gathered, as one function.
pub(crate) type Layers = Arc<dyn Fn(LambdaService) -> LambdaService + Send + Sync>;

/// What a [`Consumer`] is made of, each part a value given here or, left
/// out, made as the `SQS_ONCE_` settings ([`crate::config`]) and the AWS
/// SDK's environment (`AWS_REGION`, credentials, `AWS_ENDPOINT_URL_*`) say.
///
/// ```no_run
/// # async fn example() -> std::process::ExitCode {
/// use std::sync::Arc;
/// use sqs_once::{Consumer, handler_fn, store::MemoryStore};
///
/// let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
/// Consumer::builder()
///     .sdk_config(aws)                        // credentials, Region, endpoints of one's own
///     .store(Arc::new(MemoryStore::default())) // any ClaimStore, instead of SQS_ONCE_TABLE's
///     .run(handler_fn(|_| async { Ok(None) }))
///     .await
/// # }
/// ```
#[derive(Default)]
pub struct Builder {
    config: Option<Config>,
    /// Settings set in code ([`key`](Builder::key), [`key_prefix`](Builder::key_prefix),
    /// [`expires_after`](Builder::expires_after), [`visibility_timeout`](Builder::visibility_timeout)).
    fixed: Fixed,
    /// Why the key given to [`key`](Builder::key) cannot be read, which
    /// stops the start.
    invalid_key: Option<ConfigError>,
    /// The handler's own `SQS_ONCE_*` settings ([`handler_settings`](Builder::handler_settings)).
    own_settings: Vec<&'static str>,
    sdk_config: Option<SdkConfig>,
    #[cfg(feature = "dynamodb")]
    dynamodb: Option<aws_sdk_dynamodb::Client>,
    sqs: Option<aws_sdk_sqs::Client>,
    store: Option<Arc<dyn ClaimStore>>,
    destinations: Option<Arc<dyn Destinations>>,
    layers: Option<Layers>,
    /// Where spans go: a provider given, or the environment's endpoint once
    /// logging starts (or why that cannot be, reported at assembly).
    #[cfg(feature = "opentelemetry")]
    export: Option<Result<crate::otlp::Export, crate::config::ConfigError>>,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("config", &self.config)
            .field("sdk_config", &self.sdk_config.is_some())
            .field("store", &self.store.is_some())
            .field("destinations", &self.destinations.is_some())
            .field("layers", &self.layers.is_some())
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// The settings, instead of [`Config::from_env`].
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// Keys each record by `spec`, as `SQS_ONCE_KEY` would (`messageId`,
    /// `body.<path>`, `envelope.<path>`, `attributes.<Name>`,
    /// `messageAttributes.<Name>`, comma-separated for a composite key).
    ///
    /// The key decides what runs once, so it belongs with the handler: set
    /// here, it is the same wherever the program runs (the Lambda function,
    /// `poll`, `invoke`, the binary run by hand) and in its tests
    /// (`TestConsumer::key`, feature `testing`). `spec` is read here into the
    /// `KeySpec` an `SQS_ONCE_KEY` is read into: one that reads otherwise
    /// stops the start (the same key spelt with other spaces does not), and
    /// an invalid `spec` does too, named. Called
    /// again, the later spec replaces the earlier. Not with
    /// [`config`](Self::config): a `Config` holds its keys already (give
    /// `SQS_ONCE_KEY` in its lookup instead), and the two together stop the
    /// start.
    ///
    /// ```no_run
    /// # async fn example() -> std::process::ExitCode {
    /// use sqs_once::{Consumer, handler_fn};
    ///
    /// const KEY: &str = "body.order_id";
    /// Consumer::builder().key(KEY).run(handler_fn(|_| async { Ok(None) })).await
    /// # }
    /// ```
    pub fn key(mut self, spec: &str) -> Self {
        (self.fixed.key, self.invalid_key) = match spec.parse::<KeySpec>() {
            Ok(parsed) => (Some((parsed, spec.trim().to_owned())), None),
            Err(error) => {
                (None, Some(ConfigError { name: settings::KEY, value: spec.to_owned(), expected: error.to_string() }))
            }
        };
        self
    }

    /// Declares the handler's own settings whose names start `SQS_ONCE_`, so
    /// that the start takes them for neither a misspelt setting nor an
    /// unknown one (see [`Config::from_env`]). Added to by each call.
    ///
    /// ```no_run
    /// # async fn example() -> std::process::ExitCode {
    /// use sqs_once::{Consumer, handler_fn};
    ///
    /// Consumer::builder().handler_settings(["SQS_ONCE_ORDERS_TABLE"]).run(handler_fn(|_| async { Ok(None) })).await
    /// # }
    /// ```
    pub fn handler_settings(mut self, names: impl IntoIterator<Item = &'static str>) -> Self {
        self.own_settings.extend(names);
        self
    }

    /// Stores keys under `prefix`, as `SQS_ONCE_KEY_PREFIX` would (`sqs-once`
    /// unless set, wherever the consumer runs). Consumers that share a claim
    /// table and a prefix (a function and a `poll` consumer of one queue,
    /// `claims` run from a laptop) see each other's keys; consumers of
    /// different work that share a table need prefixes of their own. An
    /// `SQS_ONCE_KEY_PREFIX` that says otherwise stops the start, as does
    /// [`config`](Self::config) beside it.
    pub fn key_prefix(mut self, prefix: &str) -> Self {
        self.fixed.key_prefix = Some(prefix.to_owned());
        self
    }

    /// Remembers each key for `expires_after`, as `SQS_ONCE_EXPIRES_AFTER_SECS`
    /// would (an hour unless set): a copy of a message that arrives later
    /// runs again. Keys are remembered past the queue's redelivery too (see
    /// [`visibility_timeout`](Self::visibility_timeout)), whatever is set
    /// here.
    ///
    /// The key memory decides what runs once, so like the
    /// [`key`](Self::key) it may be set here, where it holds wherever the
    /// program runs: an `SQS_ONCE_EXPIRES_AFTER_SECS` that says otherwise
    /// stops the start, as does [`config`](Self::config) beside it, and so
    /// does a duration that is no positive whole number of seconds (the
    /// stores keep keys' expiry in seconds).
    ///
    /// ```no_run
    /// # async fn example() -> std::process::ExitCode {
    /// use std::time::Duration;
    /// use sqs_once::{Consumer, handler_fn};
    ///
    /// // Orders are replayed from the archive up to a week later.
    /// let week = Duration::from_secs(7 * 24 * 3600);
    /// Consumer::builder().expires_after(week).run(handler_fn(|_| async { Ok(None) })).await
    /// # }
    /// ```
    pub fn expires_after(mut self, expires_after: Duration) -> Self {
        self.fixed.expires_after = Some(expires_after);
        self
    }

    /// The source queue's visibility timeout, as
    /// `SQS_ONCE_VISIBILITY_TIMEOUT_SECS` would: keys are remembered at least
    /// as long as a failed record can stay away from the queue (the timeout,
    /// or the back-off's longest delay where that is longer), so that its
    /// redelivery finds its key. Unknown, the timeout is taken as SQS's
    /// longest (12 hours); `poll` reads its queue's own, which wins.
    ///
    /// Set here, the environment may say the same or nothing, as for
    /// [`expires_after`](Self::expires_after); more than 12 hours, or a
    /// fraction of a second, stops the start.
    pub fn visibility_timeout(mut self, timeout: Duration) -> Self {
        self.fixed.visibility_timeout = Some(timeout);
        self
    }

    /// The AWS configuration the clients sqs-once makes are made from,
    /// instead of the SDK's default chain. The clients get sqs-once's
    /// retry and timeout settings unless it has its own: without request
    /// timeouts, a lost answer would hold a record until the deadline's
    /// cut-off.
    pub fn sdk_config(mut self, config: SdkConfig) -> Self {
        self.sdk_config = Some(config);
        self
    }

    /// The DynamoDB client of the claim store `SQS_ONCE_TABLE` names, instead
    /// of one made from the AWS configuration.
    #[cfg(feature = "dynamodb")]
    #[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
    pub fn dynamodb_client(mut self, client: aws_sdk_dynamodb::Client) -> Self {
        self.dynamodb = Some(client);
        self
    }

    /// The SQS client of the redelivery step and of `poll`, instead of one
    /// made from the AWS configuration.
    pub fn sqs_client(mut self, client: aws_sdk_sqs::Client) -> Self {
        self.sqs = Some(client);
        self
    }

    /// The claim store, instead of the one the settings choose: a store of
    /// one's own ([`crate::store`]), or one of this crate's built in code.
    pub fn store(mut self, store: Arc<dyn ClaimStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Where staged messages go, instead of the AWS services their
    /// destinations name.
    pub fn destinations(mut self, destinations: Arc<dyn Destinations>) -> Self {
        self.destinations = Some(destinations);
        self
    }

    /// Wraps the Lambda function's service in `layer`, as
    /// `lambda_runtime::Runtime::layer` does: a later layer wraps an
    /// earlier one, so it sees each invocation first. `poll` and `invoke`
    /// have no Lambda invocation to wrap and leave it out.
    ///
    /// ```no_run
    /// # async fn example() -> std::process::ExitCode {
    /// use lambda_runtime::{LambdaInvocation, tower::util::MapRequestLayer};
    /// use sqs_once::{Consumer, handler_fn};
    ///
    /// // One log line per invocation, before any record of it is read.
    /// let announced = MapRequestLayer::new(|invocation: LambdaInvocation| {
    ///     tracing::info!(request_id = %invocation.context.request_id, "invocation");
    ///     invocation
    /// });
    /// Consumer::builder().layer(announced).run(handler_fn(|_| async { Ok(None) })).await
    /// # }
    /// ```
    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<LambdaService> + Send + Sync + 'static,
        L::Service: Service<LambdaInvocation, Response = (), Error = lambda_runtime::Error> + Clone + Send + 'static,
        <L::Service as Service<LambdaInvocation>>::Future: Send + 'static,
    {
        let earlier = self.layers.take();
        self.layers = Some(Arc::new(move |service: LambdaService| {
            let service = match &earlier {
                Some(earlier) => earlier(service),
                None => service,
            };
            BoxCloneService::new(layer.layer(service))
        }));
        self
    }

    /// Records sqs-once's spans and the handlers' with `provider`, and
    /// flushes it where sqs-once flushes its own exporter: before each Lambda
    /// answer (abandoned, and counted, if it cannot finish within the
    /// answer's budget: the flush blocks a thread of its own), at the end of
    /// each batch of `poll` and `invoke`, and as the process leaves. It
    /// replaces the export `OTEL_EXPORTER_OTLP_ENDPOINT` would make. With
    /// [`build`](Self::build), the program installs the `tracing` layer
    /// over it itself; [`run`](Self::run) installs one.
    ///
    /// ```no_run
    /// use opentelemetry_sdk::trace::{SdkTracerProvider, SpanExporter};
    /// use sqs_once::{Consumer, handler_fn};
    ///
    /// async fn serve(exporter: impl SpanExporter + 'static) -> std::process::ExitCode {
    ///     let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).build();
    ///     Consumer::builder().tracer_provider(provider).run(handler_fn(|_| async { Ok(None) })).await
    /// }
    /// ```
    #[cfg(feature = "opentelemetry")]
    pub fn tracer_provider(mut self, provider: opentelemetry_sdk::trace::SdkTracerProvider) -> Self {
        self.export = Some(Ok(crate::otlp::Export::of_provider(provider)));
        self
    }

    /// Starts the log lines and, with the `opentelemetry` feature, the
    /// spans' export: the provider given, or the one the environment asks
    /// for. Every way to run does this first.
    pub(crate) fn start_logging(&mut self, lambda: bool) {
        #[cfg(feature = "opentelemetry")]
        {
            if self.export.is_none() {
                self.export = crate::otlp::Export::from_lookup(|name| std::env::var(name).ok()).transpose();
            }
            let spans = self.export.as_ref().and_then(|export| export.as_ref().ok()).map(crate::otlp::Export::layer);
            crate::logging::init(lambda, spans);
        }
        #[cfg(not(feature = "opentelemetry"))]
        crate::logging::init(lambda, None);
    }

    /// The consumer of `handler`, its parts assembled.
    pub async fn build(self, handler: impl Handler) -> Result<Consumer, StartupError> {
        Ok(self.assemble(BoxHandler::new(handler), Needs::default()).await?.0)
    }

    /// The layers given, to wrap the Lambda function's service in.
    pub(crate) fn layers(&self) -> Option<Layers> {
        self.layers.clone()
    }

    /// The settings: those given, or the environment's.
    pub(crate) fn settings(&mut self) -> Result<Config, StartupError> {
        // Taken with the settings: what they are read into holds them.
        let fixed = std::mem::take(&mut self.fixed);
        if let Some(invalid) = self.invalid_key.take() {
            return Err(StartupError::Config(invalid));
        }
        match (self.config.take(), fixed.first()) {
            (Some(config), None) => Ok(config),
            (Some(_), Some((name, value))) => Err(StartupError::Config(ConfigError {
                name,
                value,
                expected: "the settings made in code (Builder::key, key_prefix, expires_after, visibility_timeout) \
                           or a Config given (Builder::config), not both: a Config holds them already"
                    .into(),
            })),
            (None, _) => Ok(Config::from_env_fixing(&fixed, &self.own_settings)?),
        }
    }

    /// Changes the settings before the parts are made (a command's options).
    #[cfg(feature = "cli")]
    pub(crate) fn adjust(mut self, adjust: impl FnOnce(&mut Config)) -> Result<Self, StartupError> {
        let mut config = self.settings()?;
        adjust(&mut config);
        self.config = Some(config);
        Ok(self)
    }

    /// The consumer of `handler`: the engine over the claim store, the
    /// outbox when the store keeps one, the SQS step when the redelivery
    /// policy asks for one; and the SQS client, when `needs` has a queue.
    pub(crate) async fn assemble(
        mut self,
        handler: BoxHandler,
        needs: Needs,
    ) -> Result<(Consumer, Option<Sqs>), StartupError> {
        let config = self.settings()?;
        let redelivery = config.redelivery.is_active() || needs.queue_visibility;
        let parts = self.parts(&config, Needs { redelivery, ..needs }).await?;
        tracing::info!(store = %parts.store.target, "claims kept in the store");
        let store = Arc::clone(&parts.store.store);
        if handler.stages_every_effect() && Arc::clone(&store).capabilities().commits.is_none() {
            return Err(StartupError::StoreLacks(
                "commit staged writes (ClaimStore::capabilities: commits), which a handler that stages every effect needs".into(),
            ));
        }
        let times = super::outbox_times(parts.send_time, parts.store.operation_timeout)?;
        let redelivery = parts
            .sqs
            .clone()
            .filter(|_| config.redelivery.is_active())
            .map(|sqs| Redelivery::new(config.redelivery.clone(), sqs));
        let mut options = config.engine.clone();
        options.margins.sqs_step = redelivery.is_some();
        let engine = Engine::builder(store, config.keys.clone())
            .policy(config.claims.clone())
            .options(options)
            .outbox(Arc::clone(&parts.destinations), times, config.outbox_sweep)
            .payloads(parts.payloads.clone())
            .build(handler);
        let queue_visibility = (parts.sqs.clone())
            .filter(|_| needs.queue_visibility)
            .map(|sqs| Arc::new(super::QueueVisibility::new(sqs, config.visibility_timeout)));
        let queue = parts.sqs.filter(|_| needs.queue);
        let consumer = Consumer {
            engine,
            #[cfg(feature = "dynamodb")]
            dynamodb_requests: parts.store.requests,
            redelivery,
            queue_visibility,
            metrics: config.metrics.clone(),
            #[cfg(feature = "opentelemetry")]
            export: self.export.take().transpose()?,
        };
        consumer.log_key_memory();
        Ok((consumer, queue))
    }

    /// The claim store, and the AWS configuration and SQS client when
    /// `needs` asks for them: what a command that runs no handler (`claims`)
    /// and one that does share.
    pub(crate) async fn parts(&mut self, config: &Config, needs: Needs) -> Result<CommandParts, StartupError> {
        let needs_aws = (self.store.is_none() && !self.has_dynamodb_client() && config.store.is_dynamodb())
            || ((needs.redelivery || needs.queue) && self.sqs.is_none());
        // Loaded once: credentials and region are resolved once for every client.
        let aws = match (self.sdk_config.take(), needs_aws) {
            (Some(given), _) => Some(sqs_once_aws::with_limits(&given)),
            (None, true) => Some(sqs_once_aws::sdk_config().await),
            (None, false) => None,
        };
        let store = self.claim_store(config, aws.as_ref(), needs).await?;
        // A program's own destinations are held to the SDK's operation timeout; the AWS ones, to their clients'.
        let send_time = match self.destinations {
            Some(_) => sqs_once_aws::OPERATION_TIMEOUT,
            None => sqs_once_aws::operation_timeout(aws.as_ref().and_then(SdkConfig::timeout_config)),
        };
        let destinations = self.destinations.take().unwrap_or_else(|| {
            // A consumer that sends no message never loads the AWS configuration for it.
            let destinations = aws.as_ref().map_or_else(AwsDestinations::from_env, AwsDestinations::new);
            Arc::new(destinations.propagating(config.engine.propagators))
        });
        let sqs = match self.sqs.take() {
            Some(given) => Some(Sqs::from_client(Sqs::with_limits(given))),
            None => aws.as_ref().map(Sqs::new),
        };
        let sqs = sqs.filter(|_| needs.redelivery || needs.queue);
        Ok(CommandParts { store, destinations, send_time, sqs, payloads: payloads(aws.as_ref()) })
    }

    /// The claim store given, or the one the settings choose: a DynamoDB
    /// table (which must exist, outside a deployed function), a SQLite
    /// file, or memory.
    async fn claim_store(
        &mut self,
        config: &Config,
        #[cfg_attr(
            not(feature = "dynamodb"),
            expect(unused_variables, reason = "only DynamoDB's client is made from it")
        )]
        aws: Option<&SdkConfig>,
        needs: Needs,
    ) -> Result<OpenStore, StartupError> {
        if let Some(store) = self.store.take() {
            let target = "a store of one's own".into();
            return Ok(OpenStore::of(store, target));
        }
        let open = match &config.store {
            #[cfg(feature = "dynamodb")]
            StoreChoice::DynamoDb(layout) => self.dynamodb_store_open(layout, config, aws, needs).await?,
            #[cfg(feature = "sqlite")]
            StoreChoice::File(path) => {
                OpenStore::of(Arc::new(crate::store::SqliteStore::open(path)?), format!("file {}", path.display()))
            }
            StoreChoice::Memory => OpenStore::of(Arc::new(MemoryStore::default()), "memory".into()),
            StoreChoice::Unchosen if !needs.long_running => local_store()?,
            StoreChoice::Unnamed | StoreChoice::Unchosen => return Err(config.store.refusal().into()),
            #[cfg(not(feature = "dynamodb"))]
            StoreChoice::NotBuilt(..) => return Err(config.store.refusal().into()),
        };
        Ok(open)
    }
}

/// The store of `invoke` and the operator's commands when none is named:
/// the local file, in memory without the `sqlite` feature.
fn local_store() -> Result<OpenStore, StartupError> {
    #[cfg(feature = "sqlite")]
    {
        let path = std::path::Path::new(crate::config::LOCAL_STORE_PATH);
        tracing::info!("no claim store named (SQS_ONCE_TABLE, SQS_ONCE_STORE): claims are kept in {}", path.display());
        Ok(OpenStore::of(Arc::new(crate::store::SqliteStore::open(path)?), format!("file {}", path.display())))
    }
    #[cfg(not(feature = "sqlite"))]
    Ok(OpenStore::of(Arc::new(MemoryStore::default()), "memory".into()))
}

impl Builder {
    /// Whether a DynamoDB client was given.
    fn has_dynamodb_client(&self) -> bool {
        #[cfg(feature = "dynamodb")]
        return self.dynamodb.is_some();
        #[cfg(not(feature = "dynamodb"))]
        false
    }
}

/// What a command needs besides the claim store.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Needs {
    /// The redelivery step after each batch (SQS).
    pub(crate) redelivery: bool,
    /// A queue to receive from (`poll`).
    pub(crate) queue: bool,
    /// A long-running command (`poll`): a claim table that does not answer
    /// at the start is waited for ([`crate::waiting`]) rather than refused,
    /// and claims are kept nowhere by default (see [`StoreChoice::Unchosen`]).
    pub(crate) long_running: bool,
    /// The records' queue's visibility timeout, read at the first batch
    /// (the Lambda function: see [`super::QueueVisibility`]).
    pub(crate) queue_visibility: bool,
}

/// The parts every command builds on.
pub(crate) struct CommandParts {
    pub(crate) store: OpenStore,
    pub(crate) destinations: Arc<dyn Destinations>,
    /// How long a send to them may take (see [`OutboxTimes`]).
    pub(crate) send_time: Duration,
    /// The SQS client, when the command needs SQS.
    pub(crate) sqs: Option<Sqs>,
    /// Where the payloads records point to are read.
    pub(crate) payloads: Option<Arc<dyn PayloadStore>>,
}

/// The S3 payloads, through a client of `aws` (or of the SDK's default
/// configuration, loaded when the first pointer arrives).
#[cfg(feature = "s3")]
fn payloads(aws: Option<&SdkConfig>) -> Option<Arc<dyn PayloadStore>> {
    Some(Arc::new(crate::s3::S3Payloads::new(aws)))
}

/// None without the `s3` feature: a record that carries a pointer fails.
#[cfg(not(feature = "s3"))]
fn payloads(_: Option<&SdkConfig>) -> Option<Arc<dyn PayloadStore>> {
    None
}

/// A claim store, what counts its DynamoDB requests, and what it is, for logs and errors.
pub(crate) struct OpenStore {
    pub(crate) store: Arc<dyn ClaimStore>,
    #[cfg(feature = "dynamodb")]
    pub(crate) requests: Option<Arc<RequestCounter>>,
    pub(crate) target: String,
    /// How long one of its requests may take, retries included: its
    /// client's operation timeout, or the SDK's for a store of one's own.
    pub(crate) operation_timeout: Duration,
}

impl OpenStore {
    /// A store that makes no AWS request of its own: nothing to count, and
    /// the SDK's operation timeout.
    fn of(store: Arc<dyn ClaimStore>, target: String) -> Self {
        Self {
            store,
            #[cfg(feature = "dynamodb")]
            requests: None,
            target,
            operation_timeout: sqs_once_aws::OPERATION_TIMEOUT,
        }
    }
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use crate::store::{Fenced, Finish, PutOutcome, StoreError, StoredClaim};
    use sqs_once_core::{HandlerResult, Record};

    /// A store of the four core methods alone, over a memory store.
    #[derive(Default)]
    struct CoreOnly(MemoryStore);

    #[async_trait]
    impl ClaimStore for CoreOnly {
        async fn put_if_free(&self, claim: &StoredClaim, now_ms: u64) -> Result<PutOutcome, StoreError> {
            self.0.put_if_free(claim, now_ms).await
        }
        async fn get(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
            self.0.get(id).await
        }
        async fn finish(&self, id: &str, token: &str, finish: &Finish) -> Result<Fenced, StoreError> {
            self.0.finish(id, token, finish).await
        }
        async fn release(&self, id: &str, token: &str) -> Result<Fenced, StoreError> {
            self.0.release(id, token).await
        }
    }

    /// Stages every effect, so it needs commits.
    struct Staging;

    impl Handler for Staging {
        async fn handle(&self, _: &Record) -> HandlerResult {
            Ok(None)
        }

        fn stages_every_effect(&self) -> bool {
            true
        }
    }

    fn settings(pairs: &[(&str, &str)]) -> Config {
        Config::from_lookup(|name| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| (*value).to_owned()))
            .unwrap()
    }

    /// No redelivery step: the settings ask nothing of SQS.
    const NO_SQS: [(&str, &str); 2] = [("SQS_ONCE_CONFLICT_BACKOFF", "false"), ("SQS_ONCE_RETRY_BASE_SECS", "0")];

    /// Settings that reach no AWS service: claims in memory, no redelivery step.
    fn offline() -> Config {
        settings(&[("SQS_ONCE_STORE", "memory"), NO_SQS[0], NO_SQS[1]])
    }

    #[tokio::test]
    async fn a_handler_that_stages_every_effect_needs_a_store_that_commits() {
        let built = Consumer::builder().config(offline()).store(Arc::new(CoreOnly::default())).build(Staging).await;
        let Err(StartupError::StoreLacks(what)) = built else { panic!("started: {built:?}") };
        assert!(what.contains("ClaimStore::capabilities: commits"), "{what}");
        let on_memory = Consumer::builder().config(offline()).build(Staging).await;
        assert!(on_memory.is_ok(), "the memory store commits: {on_memory:?}");
    }

    #[tokio::test]
    async fn a_setting_made_in_code_and_a_config_given_are_not_both_taken() {
        let week = Duration::from_secs(7 * 24 * 3_600);
        let both = Consumer::builder().config(offline()).expires_after(week).build(Staging).await;
        let Err(StartupError::Config(error)) = both else { panic!("started: {both:?}") };
        assert_eq!((error.name, error.value.as_str()), ("SQS_ONCE_EXPIRES_AFTER_SECS", "604800"));
        assert!(error.expected.contains("not both"), "{error}");
    }

    #[tokio::test]
    async fn a_store_given_serves_where_the_settings_name_none() {
        // Inside Lambda without SQS_ONCE_TABLE: no store, unless one is given.
        let lambda = [("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001"), NO_SQS[0], NO_SQS[1]];
        let refused = Consumer::builder()
            .config(settings(&lambda))
            .build(sqs_once_core::handler_fn(|_| async { Ok(None) }))
            .await;
        let Err(StartupError::Config(error)) = refused else { panic!("started: {refused:?}") };
        assert_eq!(error.name, "SQS_ONCE_TABLE");
        let given = Consumer::builder()
            .config(settings(&lambda))
            .store(Arc::new(CoreOnly::default()))
            .build(sqs_once_core::handler_fn(|_| async { Ok(None) }))
            .await;
        assert!(given.is_ok(), "{given:?}");
    }
}
