//! The bundled `sqs-once` binary: the library's command line around the
//! handler `SQS_ONCE_HANDLER` names in the registry of `handlers/`, and
//! `sqs-once new`, which writes a consumer crate of one's own.

use std::{path::PathBuf, process::ExitCode};

use clap::Parser;
use sqs_once_app::{
    handlers,
    new::{self, Library},
};

// mimalloc takes about a tenth less CPU per record than glibc's allocator
// (bench/RESULTS.md). Transparent huge pages off (`no_thp`) keep its peak
// RSS at glibc's: with them, a 10,000-record batch held 17 MiB more.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// One thread: a batch waits on DynamoDB far more than it computes, and the
// multi-thread runtime's wake-ups between threads cost a fifth of the CPU per
// record (README, "Runtime"). Handlers must not block it.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // `new` is this binary's own command; every other is the library's.
    if std::env::args_os().nth(1).is_some_and(|command| command == "new") {
        return new_consumer(New::parse_from(std::env::args_os().skip(1)));
    }
    sqs_once::run_with(async || handlers::from_env()).await
}

/// Writes a consumer crate of one's own: a handler with its tests, a SAM
/// template (queue, dead-letter queue, claim table, alarms), a sample event.
#[derive(Debug, Parser)]
#[command(name = "sqs-once new", bin_name = "sqs-once new")]
struct New {
    /// The directory to create; its last component names the crate.
    path: PathBuf,
    /// Depend on the sqs-once library in this directory (a checkout, or a
    /// package unpacked) instead of the checkout this binary was built from
    /// (or, built from crates.io, the release it was built with).
    #[arg(long, value_name = "DIR")]
    library_path: Option<PathBuf>,
}

fn new_consumer(args: New) -> ExitCode {
    let library = args.library_path.as_deref().map(Library::local).transpose().map(Option::unwrap_or_default);
    let created = library.and_then(|library| Ok((new::create(&args.path, &library)?, library)));
    match created {
        Ok((files, library)) => {
            let path = args.path.display();
            println!("created {path}, depending on {library}:");
            files.iter().for_each(|file| println!("  {}", file.display()));
            println!("next: cd {path} && cargo test && cargo run -- invoke events/batch.json");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("sqs-once new: {error}");
            ExitCode::FAILURE
        }
    }
}
