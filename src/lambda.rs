//! The Lambda function: the `lambda_runtime` loop around the engine, one
//! invocation at a time, or as many at once as Lambda Managed Instances
//! hands the environment (`AWS_LAMBDA_MAX_CONCURRENCY`).
//!
//! The event is taken as JSON text and split per record, so one odd record
//! fails alone; an event that is not an SQS event at all is an invocation
//! error. Handler panics never reach the runtime (the engine catches them per
//! record), so the runtime's own panic handling never fails a whole batch.

use parking_lot::Mutex;
use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use aws_lambda_events::sqs::SqsBatchResponse;
use lambda_runtime::{Diagnostic, LambdaEvent, service_fn, tower::layer::layer_fn};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

mod local;
mod runtime_api;
pub(crate) mod shutdown;

use runtime_api::report_init_error;

use crate::{
    consumer::{Builder, Consumer, LambdaService, Layers, Needs},
    environment::Environment,
    metrics::{Counters, TraceExportCounts, emf_line},
    redelivery::RedeliveryCounts,
};
use sqs_once_core::{
    BuildHandler,
    clock::{Clock, SystemClock},
    trace::TraceContext,
};
use sqs_once_engine::{
    Engine, Invocation,
    event::{InvalidEvent, Invoked, parse_invocation},
    report::BatchReport,
};

/// The longest the init phase waits for the claim store's connections: a
/// store out of reach must not hold the function's start (Lambda allows its
/// init phase 10 seconds in all).
const CONNECT_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// How an event that is no SQS batch is answered: Lambda's error for the
/// whole invocation.
fn diagnostic(error: InvalidEvent) -> Diagnostic {
    Diagnostic { error_type: "InvalidEvent".into(), error_message: error.to_string() }
}

/// The function's state across invocations of one warm process.
struct Function {
    consumer: Consumer,
    /// Counters at the end of the previous invocation, to publish deltas.
    seen: Mutex<Counters>,
}

/// Starts the function: reads the settings, builds the handler and the
/// consumer once, before the loop, so that clients and configuration are
/// shared by every invocation of the warm process, then serves invocations.
/// An error before the loop is reported to the Runtime API as the init error.
pub(crate) async fn start(builder: Builder, handler: BuildHandler<'_>) -> Result<(), String> {
    let layers = builder.layers();
    let started = async {
        if let Some(refusal) = local::refusal(|name| std::env::var(name).ok()) {
            return Err(refusal);
        }
        let handler = handler.await?;
        let assembled = builder.assemble(handler, Needs { queue_visibility: true, ..Needs::default() }).await;
        assembled.map(|(consumer, _)| consumer).map_err(|error| sqs_once_aws::with_causes(&error))
    };
    let consumer = match started.await {
        Ok(consumer) => consumer,
        Err(error) => {
            report_init_error("Runtime.ConfigError", &error);
            return Err(error);
        }
    };
    run(consumer, layers).await.map_err(|error| error.to_string())
}

/// Serves invocations from the Lambda Runtime API until the process ends,
/// the function's service wrapped in `layers`.
async fn run(consumer: Consumer, layers: Option<Layers>) -> Result<(), lambda_runtime::Error> {
    let environment = Environment::current();
    if let Some(missing) = environment.missing {
        return Err(format!("{missing} is not set: the Lambda runtime sets it; outside Lambda use `invoke`").into());
    }
    shutdown::on_sigterm(consumer.engine.clone()).await;
    // Only when Lambda runs the init phase ahead of any invocation (provisioned
    // concurrency) are the claim store's connections opened in it: on demand,
    // an invocation waits for the init phase, and the connecting requests'
    // own round trip would come on top of the handshakes they save its first
    // batch.
    if environment.initialized_ahead {
        // Still in the init phase: the first batch finds its connections open.
        consumer.engine.connect(CONNECT_WITHIN).await;
    }
    let function = Arc::new(Function { consumer, seen: Mutex::new(Counters::default()) });
    let invoked = Arc::clone(&function);
    let service = service_fn(move |event: LambdaEvent<Event>| {
        let function = Arc::clone(&function);
        async move { function.invoke(event).await }
    });
    if let Some(invocations) = environment.invocations_at_once {
        let runtime = runtime(service, layers.as_ref());
        return serve_at_once(invocations, runtime, invoked.consumer.engine.clone()).await;
    }
    loop {
        match runtime(service.clone(), layers.as_ref()).run().await {
            Err(error) if runtime_api::unreadable_headers(&*error) => {
                tracing::warn!(
                    %error,
                    "an invocation's headers do not parse (a client context that is not the mobile SDK's: `custom` \
                     values must be strings); it is served without them"
                );
                runtime_api::serve_unreadable(&invoked).await?;
            }
            ended => return ended,
        }
    }
}

/// The `lambda_runtime` runtime around the function's `service`: its
/// tracing (as `lambda_runtime::run` adds it), then the program's `layers`.
fn runtime<S>(service: S, layers: Option<&Layers>) -> lambda_runtime::Runtime<LambdaService>
where
    S: lambda_runtime::Service<LambdaEvent<Event>, Response = SqsBatchResponse, Error = Diagnostic>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let boxed = lambda_runtime::Runtime::new(service)
        .layer(lambda_runtime::layers::TracingLayer::new())
        .layer(layer_fn(LambdaService::new));
    match layers {
        Some(layers) => boxed.layer(layer_fn(|inner| layers(inner))),
        None => boxed,
    }
}

/// Serves `invocations` at once, as Lambda Managed Instances hands them to
/// one environment, which is never frozen: the writes and the outbox are
/// tended in the background, between batches too. The environment has
/// vCPUs to spare for them: if `main` runs a runtime of one thread, the
/// invocations are served on a runtime of a thread per CPU of its own
/// (`TOKIO_WORKER_THREADS` sets another number).
async fn serve_at_once(
    invocations: u32,
    runtime: lambda_runtime::Runtime<LambdaService>,
    engine: Engine,
) -> Result<(), lambda_runtime::Error> {
    tracing::info!(invocations, "serving invocations at once (AWS_LAMBDA_MAX_CONCURRENCY)");
    let serve = async move {
        tokio::spawn(async move { engine.tend(std::future::pending()).await });
        runtime.run_concurrent().await
    };
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let one_thread = tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread;
    if cpus == 1 || !one_thread {
        return serve.await;
    }
    let (served, finished) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("sqs-once-invocations".into()).spawn(move || {
        let served_by = |runtime: tokio::runtime::Runtime| runtime.block_on(serve);
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build();
        let _ = served.send(runtime.map_err(lambda_runtime::Error::from).and_then(served_by));
    })?;
    finished.await?
}

/// The invocation's payload: the event as JSON text, or why the text is not
/// JSON. Reading never fails, so that an event that is not JSON is answered
/// `InvalidEvent` like one that is not an SQS event, instead of with
/// `lambda_runtime`'s deserialization error; the text is checked once, by
/// the same pass that reads it.
struct Event(Result<Box<RawValue>, String>);

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self(Box::<RawValue>::deserialize(deserializer).map_err(|error| error.to_string())))
    }
}

impl Function {
    /// Serves one invocation. An event that is not an SQS event fails it as
    /// a whole; `lambda_runtime` logs that error, once.
    async fn invoke(&self, event: LambdaEvent<Event>) -> Result<SqsBatchResponse, Diagnostic> {
        let (Event(payload), context) = event.into_parts();
        let invoked = payload
            .map_err(InvalidEvent::NotJson)
            .and_then(|payload| parse_invocation(payload.get()))
            .map_err(diagnostic)?;
        let invocation = Invocation { deadline: deadline(context.deadline), request_id: context.request_id };
        let records = match invoked {
            Invoked::Batch(records) => records,
            Invoked::OutboxSweep => {
                let sent = self.consumer.engine.sweep_outbox(invocation.deadline).await;
                tracing::info!(sent, "outbox swept, as the schedule asked");
                self.publish(&BatchReport::default(), None);
                return Ok(SqsBatchResponse::default());
            }
        };
        // Lambda's own trace: the batch's span is its child.
        let trace = context.xray_trace_id.as_deref().filter(|_| self.consumer.engine.propagators().lambda);
        let trace = trace.and_then(TraceContext::from_xray);
        let processed = self.consumer.process_in(&records, &invocation, trace.as_ref()).await;
        self.publish(&processed.report, processed.redelivery);
        Ok(processed.response)
    }

    /// Prints the invocation's metrics line, when metrics are on.
    fn publish(&self, report: &BatchReport, redelivery: Option<RedeliveryCounts>) {
        let metrics = &self.consumer.metrics;
        if metrics.enabled {
            let counters = Counters { redelivery, ..self.delta() };
            println!("{}", emf_line(metrics, report, counters, SystemClock.now_ms()));
        }
    }

    /// Counters gathered since the previous metrics line. Read under the
    /// lock, so that the lines of invocations running at once (Lambda
    /// Managed Instances) each take their own share and add up exactly.
    fn delta(&self) -> Counters {
        let mut seen = self.seen.lock();
        let now = self.consumer.counters();
        let delta = Counters {
            engine: now.engine.since(&seen.engine),
            dynamodb_requests: now.dynamodb_requests.map(|total| total - seen.dynamodb_requests.unwrap_or(0)),
            redelivery: None,
            trace_export: now.trace_export.map(|total| {
                let seen = seen.trace_export.unwrap_or_default();
                TraceExportCounts { failed: total.failed - seen.failed, dropped: total.dropped - seen.dropped }
            }),
        };
        *seen = now;
        delta
    }
}

/// The invocation deadline from `Lambda-Runtime-Deadline-Ms`, epoch milliseconds.
/// Emulators such as `cargo lambda watch` send the function timeout there
/// instead (600000); a value too small to be a date is taken as that, counted
/// from now, since a deadline in 1970 would fail every record and leave leases
/// that end before they start.
fn deadline(deadline_ms: u64) -> SystemTime {
    // 2001-09-09: no real deadline is earlier, no timeout is longer.
    const EARLIEST_DATE_MS: u64 = 1_000_000_000_000;
    if deadline_ms < EARLIEST_DATE_MS {
        tracing::warn!(deadline_ms, "the deadline is not a date; taking it as milliseconds from now");
        return SystemTime::now() + Duration::from_millis(deadline_ms);
    }
    UNIX_EPOCH + Duration::from_millis(deadline_ms)
}
