//! The command line every consumer binary shares, so that a crate of one's
//! own gets all of it from [`run`](crate::run): the offline `invoke`, the
//! `poll` consumer, the operator's `create-table` and `claims` commands,
//! and the Lambda function when `AWS_LAMBDA_RUNTIME_API` is set and no
//! command is given. (`new`, which writes such a crate, is the bundled
//! `sqs-once` binary's own, in `sqs-once-cli`.)
//!
//! This is the binary's edge: errors are reported with their context here,
//! as one line on standard error and an exit code.

mod received;

use std::{
    io::Read,
    path::PathBuf,
    process::ExitCode,
    sync::Arc,
    time::{Duration, SystemTime},
};

use anyhow::{Context, bail};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::{
    config::{Config, settings},
    consumer::{Builder, CommandParts, Needs},
    environment::Environment,
    logging,
    metrics::{Counters, emf_line},
    operator::{Operator, Selection, Verdict, time_given, timestamp},
    poll::{PollOptions, PollSummary, Poller},
    store::{ClaimQuery, ClaimStore},
    store::{ClaimStatus, StoredClaim},
};
use sqs_once_core::{
    BuildHandler,
    clock::{Clock, SystemClock},
    destinations::Destinations,
    store::{OutboxEntry, OutboxQuery},
};
use sqs_once_engine::{
    Invocation,
    budget::LEAVING_TIME,
    event::{Invoked, parse_invocation},
    outbox::{Outbox, OutboxTimes},
    redelivery::RedeliveryPolicy,
    report::BatchReport,
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
        /// Also act on failed records through SQS as the Lambda function does (visibility back-off,
        /// dead-letter queue); the event's receipt handles and queue ARN must be real.
        #[arg(long)]
        sqs: bool,
    },
    /// Consume a queue directly, outside Lambda: long polling, deleting what succeeded, until SIGINT or SIGTERM.
    Poll {
        /// The queue URL.
        #[arg(long, env = settings::QUEUE_URL)]
        queue_url: String,
        /// ReceiveMessage calls in flight at once.
        #[arg(long, default_value_t = 2)]
        receivers: usize,
        /// Messages received and not yet settled, at most.
        #[arg(long, default_value_t = 100)]
        max_in_flight: usize,
        /// Seconds a ReceiveMessage waits for messages (long polling, 0 to 20).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=20))]
        wait_secs: u64,
        /// Seconds each record may take from its receipt; defaults to the queue's visibility timeout.
        #[arg(long)]
        timeout: Option<f64>,
    },
    /// Create the DynamoDB claim table (on-demand, TTL on the expiry attribute).
    #[cfg(feature = "dynamodb")]
    CreateTable {
        /// The table name; defaults to SQS_ONCE_TABLE.
        #[arg(long)]
        table: Option<String>,
    },
    /// Find stuck and failed work, and act on it (exit 0 found/done, 1 not found, 2 refused, 3 error).
    #[command(subcommand)]
    Claims(ClaimsCommand),
}

#[derive(Debug, Subcommand)]
enum ClaimsCommand {
    /// List claims: by default the open ones (in progress and failed).
    List {
        /// Only claims in this state.
        #[arg(long, value_enum)]
        status: Option<StatusArg>,
        /// Only in-progress claims whose lease has ended: work that crashed or timed out, and work whose
        /// handler succeeded but whose completion never landed (the `CompletionUnconfirmed` log lines name
        /// their message ids).
        #[arg(long)]
        stale: bool,
        /// At most this many claims.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// JSON for scripts instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one claim.
    Show {
        #[command(flatten)]
        target: WhichClaim,
        /// JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Delete a failed or stale claim so that the next delivery runs again.
    Release {
        #[command(flatten)]
        target: WhichClaim,
        /// Also release a live lease or a completed claim.
        #[arg(long)]
        force: bool,
    },
    /// Release in bulk the claims a cause left failed (or in progress, their lease ended), picked by reason
    /// and time, so that their next deliveries run again. Without --yes it lists them and changes nothing.
    ReleaseAll {
        /// Failed claims, or in-progress ones whose lease has ended (work that crashed or timed out).
        #[arg(long, value_enum, default_value = "failed")]
        status: BulkStatus,
        /// Only claims whose failure reason contains this text (a table's name, an error code).
        #[arg(long)]
        reason: Option<String>,
        /// Only claims that failed (or were claimed) at or after this time: a UTC time as listings print it
        /// (2026-11-28T10:00:00Z) or an age (90s, 30m, 2h, 1d).
        #[arg(long)]
        since: Option<String>,
        /// Only claims that failed (or were claimed) at or before this time, in the same forms.
        #[arg(long)]
        until: Option<String>,
        /// Release them; without it, only list and count them.
        #[arg(long)]
        yes: bool,
        /// JSON for scripts instead of a table (the listing without --yes).
        #[arg(long)]
        json: bool,
    },
    /// Mark a key done by hand, so that its deliveries are duplicates.
    Complete {
        #[command(flatten)]
        target: WhichClaim,
        /// Also complete a claim whose lease is live.
        #[arg(long)]
        force: bool,
    },
    /// List the outbox: messages committed by handlers and not yet sent.
    Outbox {
        /// Send those whose sending lease has ended first (no sender is at them), then list what is left.
        #[arg(long, conflicts_with = "drop")]
        send: bool,
        /// Drop the entry with this id (as listed, or its outbox id): its message is never sent. Logs the
        /// entry, message and all, so that it can be sent by hand.
        #[arg(long, value_name = "ID")]
        drop: Option<String>,
        /// Drop without asking (`--drop` refuses without it).
        #[arg(long, requires = "drop")]
        force: bool,
        /// At most this many entries.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// JSON for scripts instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Which claim: the key as the user knows it, the stored id, or the message
/// id of the delivery that claimed it.
#[derive(Debug, clap::Args)]
struct WhichClaim {
    /// The key as in the message (e.g. the messageId or body field value); one value per part of a
    /// composite SQS_ONCE_KEY. Prefix and hashing are applied as configured.
    #[arg(required_unless_present_any = ["id", "message_id"], conflicts_with_all = ["id", "message_id"])]
    key: Vec<String>,
    /// The stored id itself, as `claims list` prints it.
    #[arg(long, conflicts_with = "message_id")]
    id: Option<String>,
    /// The SQS message id of the delivery that made the claim, as `claims list` and the logs print it.
    #[arg(long)]
    message_id: Option<String>,
}

/// The claims a bulk release picks from.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BulkStatus {
    Failed,
    Stale,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum StatusArg {
    InProgress,
    Failed,
    Completed,
}

/// Parses the command line and runs its command; `handler` is awaited only
/// by the commands that run one.
pub(crate) async fn main(mut builder: Builder, handler: BuildHandler<'_>) -> ExitCode {
    // Named as the user typed it: a consumer crate's binary is not `sqs-once`.
    let program = logging::program();
    let mut parser = Cli::command().name(program.clone()).bin_name(program.clone());
    if program != "sqs-once" {
        parser = parser.about(format!("{program}: an SQS consumer built with sqs-once, each message processed once"));
    }
    let matches = parser.get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    let lambda = cli.command.is_none() && Environment::current().in_lambda();
    // `claims` keeps 1 and 2 for "not found" and "refused".
    let error_code = if matches!(cli.command, Some(Command::Claims(_))) { 3 } else { 1 };
    builder.start_logging(lambda);
    match command(cli, builder, handler).await {
        Ok(code) => code.unwrap_or(ExitCode::SUCCESS),
        Err(error) => {
            logging::fatal(lambda, &format_args!("{error:#}"));
            ExitCode::from(error_code)
        }
    }
}

async fn command(cli: Cli, builder: Builder, handler: BuildHandler<'_>) -> anyhow::Result<Option<ExitCode>> {
    match cli.command {
        Some(Command::Invoke { file, timeout, metrics, sqs }) => {
            invoke(file, timeout, metrics, sqs, builder, handler).await
        }
        Some(Command::Poll { queue_url, receivers, max_in_flight, wait_secs, timeout }) => {
            let timeout = timeout.map(seconds).transpose()?;
            let options = PollOptions { receivers, max_in_flight, wait: Duration::from_secs(wait_secs), timeout };
            poll(queue_url, options, builder, handler).await
        }
        #[cfg(feature = "dynamodb")]
        Some(Command::CreateTable { table }) => create_table(table, builder).await,
        Some(Command::Claims(command)) => claims(command, builder).await,
        None if Environment::current().in_lambda() => {
            crate::lambda::start(builder, handler).await.map_err(anyhow::Error::msg)?;
            Ok(None)
        }
        None => bail!(
            "no command given; run `{} invoke EVENT.json` to process an event offline (see --help)",
            logging::program()
        ),
    }
}

/// A positive `--timeout`.
fn seconds(timeout: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(timeout)
        .ok()
        .filter(|timeout| !timeout.is_zero())
        .context("--timeout must be a positive number of seconds")
}

async fn invoke(
    file: Option<PathBuf>,
    timeout: f64,
    metrics: bool,
    sqs: bool,
    builder: Builder,
    handler: BuildHandler<'_>,
) -> anyhow::Result<Option<ExitCode>> {
    let timeout = seconds(timeout)?;
    let (name, text) = read_event(file)?;
    // `aws sqs receive-message` output is taken as the event Lambda would deliver with its messages.
    let text = received::as_event(&text).unwrap_or(text);
    let invoked = parse_invocation(&text).with_context(|| format!("{name} cannot be processed"))?;
    // The text is not needed once parsed; a 10,000-record event is megabytes.
    drop(text);
    let builder = builder.adjust(|config| {
        if !sqs {
            // Offline events carry made-up receipt handles: leave SQS alone. No queue delivers their records
            // again, so keys are remembered for SQS_ONCE_EXPIRES_AFTER_SECS alone.
            config.redelivery = RedeliveryPolicy::none();
            config.claims.redelivered_within = None;
        }
    })?;
    let handler = handler.await.map_err(anyhow::Error::msg)?;
    let (consumer, _) = builder.assemble(handler, Needs::default()).await?;
    let invocation = Invocation {
        deadline: SystemTime::now() + timeout,
        request_id: format!("invoke-{}", uuid::Uuid::new_v4().simple()),
    };
    let records = match invoked {
        Invoked::Batch(records) => records,
        Invoked::OutboxSweep => {
            let sent = consumer.engine.sweep_outbox(invocation.deadline).await;
            println!("{}", serde_json::json!({ "outboxSent": sent }));
            if metrics {
                eprintln!(
                    "{}",
                    emf_line(&consumer.metrics, &BatchReport::default(), consumer.counters(), SystemClock.now_ms())
                );
            }
            return Ok(None);
        }
    };
    let processed = consumer.process(&records, &invocation).await;
    println!("{}", serde_json::to_string(&processed.response)?);
    // Writes that did not land before the answer land before the process leaves, if they can.
    consumer.leave(tokio::time::Instant::now() + LEAVING_TIME).await;
    if metrics {
        let counters = Counters { redelivery: processed.redelivery, ..consumer.counters() };
        eprintln!("{}", emf_line(&consumer.metrics, &processed.report, counters, SystemClock.now_ms()));
    }
    Ok(None)
}

/// `poll`: runs until SIGINT or SIGTERM, then prints what it did as JSON.
async fn poll(
    queue_url: String,
    options: PollOptions,
    builder: Builder,
    handler: BuildHandler<'_>,
) -> anyhow::Result<Option<ExitCode>> {
    let shutdown = crate::poll::interrupted();
    tokio::pin!(shutdown);
    let handler = handler.await.map_err(anyhow::Error::msg)?;
    // Boxed: the waits nest deep enough to overflow the compiler's query depth when inlined.
    let starting = Box::pin(async {
        let needs = Needs { queue: true, long_running: true, ..Needs::default() };
        let (consumer, sqs) = builder.assemble(handler, needs).await?;
        let sqs = sqs.context("no SQS client to receive with")?;
        Poller::new(consumer, sqs, &queue_url, options).await.with_context(|| format!("cannot poll {queue_url}"))
    });
    // A signal while the start waits for the table or the queue ends it: nothing was received.
    let poller = tokio::select! {
        poller = starting => poller?,
        () = &mut shutdown => {
            tracing::info!("stopped before polling");
            println!("{}", serde_json::to_string(&PollSummary::default())?);
            return Ok(None);
        }
    };
    let summary = poller.run(shutdown).await;
    println!("{}", serde_json::to_string(&summary)?);
    Ok(None)
}

#[cfg(feature = "dynamodb")]
async fn create_table(table: Option<String>, mut builder: Builder) -> anyhow::Result<Option<ExitCode>> {
    let config = match table {
        // The table `--table` names, and every other setting as the environment says.
        Some(table) => Config::from_lookup(|name| match name {
            settings::TABLE => Some(table.clone()),
            _ => std::env::var(name).ok(),
        })?,
        None => builder.settings()?,
    };
    let crate::config::StoreChoice::DynamoDb(layout) = config.store else {
        bail!("no table to create: set SQS_ONCE_TABLE or pass --table NAME");
    };
    let (store, endpoint) = builder.dynamodb_store(layout).await;
    let layout = store.layout();
    let created =
        store.create_table().await.with_context(|| format!("cannot create table {} at {endpoint}", layout.table))?;
    let state = if created { "created" } else { "already exists" };
    println!("table {} {state} at {endpoint}; TTL on `{}`", layout.table, layout.attributes.expiry);
    Ok(None)
}

/// `claims`: what it did, or why not, naming the store it acted on.
async fn claims(command: ClaimsCommand, builder: Builder) -> anyhow::Result<Option<ExitCode>> {
    // One request at a time: nothing to batch, and no batch permissions needed.
    #[cfg(feature = "dynamodb")]
    let builder = builder.adjust(|config| config.dynamodb_batching = false)?;
    let mut builder = builder;
    let config = builder.settings()?;
    let parts = builder.parts(&config, Needs::default()).await?;
    let target = parts.store.target.clone();
    claims_in(command, config, parts).await.with_context(|| format!("claims in {target}"))
}

async fn claims_in(command: ClaimsCommand, config: Config, parts: CommandParts) -> anyhow::Result<Option<ExitCode>> {
    let times = crate::consumer::outbox_times(parts.send_time, parts.store.operation_timeout)?;
    let store = parts.store.store;
    let operator = Operator::new(Arc::clone(&store), Arc::new(SystemClock), config.claims.expires_after)?;
    // The stored id a target names; `None` when no claim has its message id.
    let id = async |target: WhichClaim| -> anyhow::Result<Option<String>> {
        Ok(match (target.id, target.message_id) {
            (Some(id), _) => Some(id),
            (None, Some(message_id)) => operator.find_by_message_id(&message_id).await?.map(|claim| claim.id),
            (None, None) => Some(config.keys.stored_id(&target.key)),
        })
    };
    let action = match command {
        ClaimsCommand::Outbox { drop: Some(id), force, .. } => match operator.drop_outbox(&id, force).await? {
            Verdict::NotFound => {
                eprintln!("no outbox entry has the id {id}");
                return Ok(Some(ExitCode::from(1)));
            }
            action => action,
        },
        ClaimsCommand::Outbox { send, limit, json, .. } => {
            return outbox(store, (parts.destinations, times), send, limit, json).await;
        }
        ClaimsCommand::List { status, stale, limit, json } => {
            let status = status.map(|status| match status {
                StatusArg::InProgress => ClaimStatus::InProgress,
                StatusArg::Failed => ClaimStatus::Failed,
                StatusArg::Completed => ClaimStatus::Completed,
            });
            let query = ClaimQuery { status, stale_at_ms: stale.then(|| operator.now_ms()), message_id: None, limit };
            let listing = operator.list(&query).await?;
            print_claims(&listing.claims, operator.now_ms(), json);
            return Ok(None);
        }
        ClaimsCommand::Show { target, json } => {
            let found = match id(target).await? {
                Some(id) => operator.show(&id).await?,
                None => None,
            };
            return Ok(match found {
                Some(claim) => {
                    print_claims(std::slice::from_ref(&claim), operator.now_ms(), json);
                    None
                }
                None => {
                    eprintln!("no claim found");
                    Some(ExitCode::from(1))
                }
            });
        }
        ClaimsCommand::Release { target, force } => match id(target).await? {
            Some(id) => operator.release(&id, force).await?,
            None => Verdict::NotFound,
        },
        ClaimsCommand::ReleaseAll { status, reason, since, until, yes, json } => {
            return release_all(&operator, status, reason, (since, until), yes, json).await;
        }
        ClaimsCommand::Complete { target, force } => match id(target).await? {
            Some(id) => operator.complete(&id, force).await?,
            None => Verdict::NotFound,
        },
    };
    Ok(match action {
        Verdict::Done(what) => {
            println!("{what}");
            None
        }
        Verdict::NotFound => {
            eprintln!("no claim found");
            Some(ExitCode::from(1))
        }
        Verdict::Refused(why) => {
            eprintln!("refused: {why}");
            Some(ExitCode::from(2))
        }
    })
}

/// `claims release-all`: lists the claims picked, and releases them if
/// `yes`, each as it was listed.
async fn release_all(
    operator: &Operator,
    status: BulkStatus,
    reason: Option<String>,
    (since, until): (Option<String>, Option<String>),
    yes: bool,
    json: bool,
) -> anyhow::Result<Option<ExitCode>> {
    let now_ms = operator.now_ms();
    let time = |option: &str, given: Option<String>| -> anyhow::Result<Option<u64>> {
        given
            .map(|text| {
                time_given(&text, now_ms).with_context(|| {
                    format!("--{option} {text:?}: expected a UTC time as listings print it (2026-11-28T10:00:00Z) or an age (90s, 30m, 2h, 1d)")
                })
            })
            .transpose()
    };
    let status = match status {
        BulkStatus::Failed => ClaimStatus::Failed,
        BulkStatus::Stale => ClaimStatus::InProgress,
    };
    let selection = Selection { status, reason, since_ms: time("since", since)?, until_ms: time("until", until)? };
    let picked = operator.select(&selection).await?;
    if !yes {
        print_claims(&picked, now_ms, json);
        eprintln!(
            "{} claim(s) picked; nothing changed. Run again with --yes to release them: each delivery of theirs \
             from then on runs the handler",
            picked.len()
        );
        return Ok(None);
    }
    let (released, left) = operator.release_each(&picked).await;
    for (id, why) in &left {
        eprintln!("left {id} alone: {why}");
    }
    println!("released {released} of {} claim(s); their next deliveries run the handler", picked.len());
    Ok((!left.is_empty()).then(|| ExitCode::from(2)))
}

/// `claims outbox`: sends what is due if asked, then lists what is left.
async fn outbox(
    store: Arc<dyn ClaimStore>,
    (destinations, times): (Arc<dyn Destinations>, OutboxTimes),
    send: bool,
    limit: usize,
    json: bool,
) -> anyhow::Result<Option<ExitCode>> {
    let Some(store) = store.capabilities().outbox else {
        bail!("this claim store keeps no outbox (ClaimStore::capabilities: outbox)")
    };
    if send {
        let outbox = Outbox::new(Arc::clone(&store), destinations, Arc::new(SystemClock), times, None);
        let sent = outbox.send_due().await?;
        let failed = outbox.failed_sends();
        eprintln!("sent {sent} message(s); {failed} could not be sent and stay in the outbox");
    }
    let entries = store.entries(&OutboxQuery { due_at_ms: None, limit }).await?;
    let unreadable = store.unreadable(limit).await?;
    let now_ms = SystemClock.now_ms();
    let (released, leased): (Vec<&OutboxEntry>, Vec<&OutboxEntry>) =
        entries.iter().filter(|entry| !entry.is_due(now_ms)).partition(|entry| entry.is_released());
    if let Some(last) = released.iter().map(|entry| entry.lease_until_ms).max() {
        // Held by no one: their last send failed (logged above when this command sent them).
        eprintln!(
            "{} entr{} failed to send and {} sent again by sweeps from {} at the latest, or at once by `claims \
             outbox --send`",
            released.len(),
            if released.len() == 1 { "y" } else { "ies" },
            if released.len() == 1 { "is" } else { "are" },
            timestamp(last)
        );
    }
    if let Some(last) = leased.iter().map(|entry| entry.lease_until_ms).max() {
        // A sweep sends no entry another sender holds: say until when, or "sent 0" reads as a failure.
        eprintln!(
            "{} entr{} leased to a sender (the run that committed it, or a sweep) until {} at the latest; sent once \
             the lease ends, by the next sweep",
            leased.len(),
            if leased.len() == 1 { "y is" } else { "ies are" },
            timestamp(last)
        );
    }
    if json {
        let rows: Vec<serde_json::Value> = entries
            .iter()
            .map(|entry| {
                serde_json::json!({
                    "id": entry.id,
                    "outbox_id": entry.outbox_id(),
                    "message_id": entry.message_id,
                    "destination": entry.message.destination,
                    "due": entry.is_due(now_ms),
                    "released": entry.is_released(),
                    "failed_sends": entry.failed_sends(),
                    "lease_until_ms": entry.lease_until_ms,
                    "created_at_ms": entry.created_at_ms,
                    "body": entry.message.body,
                })
            })
            .chain(unreadable.iter().map(|entry| serde_json::json!({ "id": entry.id, "unreadable": entry.reason })))
            .collect();
        println!("{}", serde_json::Value::from(rows));
        return Ok(None);
    }
    let mut rows =
        vec![["ID", "MESSAGE ID", "DESTINATION", "STATE", "LEASED UNTIL", "CREATED", "BYTES"].map(String::from)];
    rows.extend(entries.iter().map(|entry| {
        let (state, until) = match (entry.is_due(now_ms), entry.is_released()) {
            (true, _) => ("due", "-".to_owned()),
            // Held by no one: sent again from then, or by `--send` now.
            (false, true) => ("retry", timestamp(entry.lease_until_ms)),
            (false, false) => ("leased", timestamp(entry.lease_until_ms)),
        };
        [
            entry.id.clone(),
            entry.message_id.clone(),
            entry.message.destination.name().to_owned(),
            state.to_owned(),
            until,
            timestamp(entry.created_at_ms),
            entry.message.body.len().to_string(),
        ]
    }));
    rows.extend(
        unreadable.iter().map(|entry| [entry.id.as_str(), "-", "-", "unreadable", "-", "-", "-"].map(String::from)),
    );
    print_table(rows);
    // Never sent while they stay: each named with why, and what gives it up.
    for entry in &unreadable {
        eprintln!(
            "{} cannot be read by this version ({}); `sqs-once claims outbox --drop {} --force` gives it up",
            entry.id, entry.reason, entry.id
        );
    }
    Ok(None)
}

/// Rows as aligned columns, the first row a header.
fn print_table<const N: usize>(rows: Vec<[String; N]>) {
    let widths: Vec<usize> = (0..N).map(|column| rows.iter().map(|row| row[column].len()).max().unwrap_or(0)).collect();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, width)| format!("{cell:width$}")).collect();
        println!("{}", cells.join("  ").trim_end());
    }
}

/// Claims as an aligned table, or as JSON.
fn print_claims(claims: &[StoredClaim], now_ms: u64, json: bool) {
    if json {
        let rows: Vec<serde_json::Value> = claims
            .iter()
            .map(|claim| {
                serde_json::json!({
                    "id": claim.id,
                    "status": claim.status.as_str(),
                    "stale": claim.is_stale(now_ms),
                    "holder": claim.holder,
                    "attempt": claim.attempt,
                    "message_id": claim.message_id,
                    "claimed_at_ms": claim.claimed_at_ms,
                    "lease_until_ms": claim.lease_until_ms,
                    "expires_at_s": claim.expires_at_s,
                    "error": claim.error,
                })
            })
            .collect();
        println!("{}", serde_json::Value::from(rows));
        return;
    }
    let time = |ms: Option<u64>| ms.map(timestamp).unwrap_or_else(|| "-".into());
    let mut rows = vec![
        ["KEY", "STATUS", "MESSAGE ID", "HOLDER", "ATTEMPT", "CLAIMED", "LEASE ENDS", "EXPIRES", "ERROR"]
            .map(String::from),
    ];
    rows.extend(claims.iter().map(|claim| {
        let status = if claim.is_stale(now_ms) { "INPROGRESS (stale)" } else { claim.status.as_str() };
        [
            claim.id.clone(),
            status.to_owned(),
            claim.message_id.clone().unwrap_or_else(|| "-".into()),
            claim.holder.clone().unwrap_or_else(|| "-".into()),
            claim.attempt.map_or_else(|| "-".into(), |attempt| attempt.to_string()),
            time(claim.claimed_at_ms),
            time(claim.lease_until_ms),
            timestamp(claim.expires_at_s * 1000),
            claim.error.clone().unwrap_or_else(|| "-".into()),
        ]
    }));
    print_table(rows);
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
