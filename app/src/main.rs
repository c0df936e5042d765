//! The bundled `sqs-once` binary: `new`, which writes a consumer crate of
//! one's own, and the library's command line (`invoke`, `poll`, `claims`,
//! `create-table`, and the Lambda function) around the handler
//! `SQS_ONCE_HANDLER` names in the registry of `handlers/`.
//!
//! It uses only the public API of the `sqs-once` library, as a consumer
//! crate of one's own does.

mod new;

use std::process::ExitCode;

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
    if let Some(code) = new::command(&std::env::args_os().collect::<Vec<_>>()) {
        return code;
    }
    sqs_once::run_with(async || sqs_once_handlers::from_env()).await
}
