//! The `sqs-once` binary: the Lambda function, and the offline `invoke` command.

use std::{
    io::{IsTerminal, Read},
    path::PathBuf,
    process::ExitCode,
    time::{Duration, SystemTime},
};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use sqs_once::{
    clock::{Clock, SystemClock},
    config::{Config, StoreChoice},
    engine::Invocation,
    event::parse_event,
    metrics::emf_line,
    startup,
};

/// Effectively-once processing of SQS batches.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Process one SQS event offline and print the partial-batch response.
    Invoke {
        /// The event file; `-` or nothing reads standard input.
        file: Option<PathBuf>,
        /// Seconds the invocation may take, as a function timeout would allow.
        #[arg(long, default_value_t = 30.0)]
        timeout: f64,
        /// Also print, on standard error, the metrics line the Lambda function would publish.
        #[arg(long)]
        metrics: bool,
    },
    /// Create the DynamoDB claim table (on-demand, TTL on the expiry attribute).
    CreateTable {
        /// The table name; defaults to SQS_ONCE_TABLE.
        #[arg(long)]
        table: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let lambda = cli.command.is_none() && std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some();
    init_logging(lambda);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return fail(anyhow::Error::new(error).context("cannot start the async runtime")),
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

fn fail(error: anyhow::Error) -> ExitCode {
    eprintln!("sqs-once: {error:#}");
    ExitCode::FAILURE
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Invoke { file, timeout, metrics }) => invoke(file, timeout, metrics).await,
        Some(Command::CreateTable { table }) => create_table(table).await,
        None if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() => lambda().await,
        None => bail!("no command given; run `sqs-once invoke EVENT.json` to process an event offline (see --help)"),
    }
}

/// The Lambda function. Configuration and clients are built once, before the
/// loop; an error there fails the init phase with one clear line.
async fn lambda() -> anyhow::Result<()> {
    let started = async {
        let config = Config::from_env()?;
        let consumer = startup::consumer(&config).await?;
        anyhow::Ok((config, consumer))
    };
    let (config, consumer) = match started.await {
        Ok(started) => started,
        Err(error) => {
            sqs_once::lambda::report_init_error("Runtime.ConfigError", &format!("{error:#}"));
            return Err(error);
        }
    };
    sqs_once::lambda::run(consumer, config.metrics).await.map_err(|error| anyhow::anyhow!(error))
}

async fn invoke(file: Option<PathBuf>, timeout: f64, metrics: bool) -> anyhow::Result<()> {
    let timeout = Duration::try_from_secs_f64(timeout)
        .ok()
        .filter(|timeout| !timeout.is_zero())
        .context("--timeout must be a positive number of seconds")?;
    let (name, text) = read_event(file)?;
    let event = serde_json::from_str(&text).with_context(|| format!("{name} is not valid JSON"))?;
    let records = parse_event(event).with_context(|| format!("{name} cannot be processed"))?;
    let config = Config::from_env()?;
    let consumer = startup::consumer(&config).await?;
    let invocation = Invocation {
        deadline: SystemTime::now() + timeout,
        request_id: format!("invoke-{}", uuid::Uuid::new_v4().simple()),
    };
    let report = consumer.engine.process(records, &invocation).await;
    println!("{}", serde_json::to_string(&report.response())?);
    if metrics {
        eprintln!("{}", emf_line(&config.metrics, &report, consumer.extra(), SystemClock.now_ms()));
    }
    Ok(())
}

async fn create_table(table: Option<String>) -> anyhow::Result<()> {
    let config = Config::from_lookup(|name| match (name, &table) {
        ("SQS_ONCE_TABLE", Some(table)) => Some(table.clone()),
        _ => std::env::var(name).ok(),
    })?;
    let StoreChoice::DynamoDb(layout) = config.store else {
        bail!("no table to create: set SQS_ONCE_TABLE or pass --table NAME");
    };
    let (store, _) = startup::dynamodb_store(layout).await;
    let layout = store.layout();
    let created = store.create_table().await.with_context(|| format!("cannot create table {}", layout.table))?;
    let state = if created { "created" } else { "already exists" };
    println!("table {} {state}; TTL on `{}`", layout.table, layout.attributes.expiry);
    Ok(())
}

/// The event's text, and a name for it in error messages.
fn read_event(file: Option<PathBuf>) -> anyhow::Result<(String, String)> {
    match file.filter(|path| path.as_os_str() != "-") {
        Some(path) => {
            let name = path.display().to_string();
            let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {name}"))?;
            Ok((name, text))
        }
        None => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).context("cannot read standard input")?;
            Ok(("standard input".to_owned(), text))
        }
    }
}

/// Logs go to standard error, so standard output carries only the answer (and,
/// in Lambda, the metrics). In Lambda, `AWS_LAMBDA_LOG_FORMAT=JSON` switches to
/// JSON lines and `AWS_LAMBDA_LOG_LEVEL` sets the level; `SQS_ONCE_LOG`, then
/// `RUST_LOG`, take precedence as a full filter.
fn init_logging(lambda: bool) {
    let lambda_level = lambda.then(|| std::env::var("AWS_LAMBDA_LOG_LEVEL").ok()).flatten();
    let filter = ["SQS_ONCE_LOG", "RUST_LOG"]
        .iter()
        .find_map(|name| tracing_subscriber::EnvFilter::try_from_env(name).ok())
        .unwrap_or_else(|| {
            let level = lambda_level.map(|level| level.to_ascii_lowercase()).unwrap_or_else(|| "info".into());
            tracing_subscriber::EnvFilter::new(format!("{level},aws_config=error"))
        });
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    if lambda && std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|format| format.eq_ignore_ascii_case("json")) {
        logs.json().flatten_event(true).with_span_list(false).init();
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
    // A handler's panic fails only its record, and the engine logs it there;
    // one line here says where it happened, without a backtrace per record.
    std::panic::set_hook(Box::new(|panic| tracing::error!(%panic, "panic")));
}
