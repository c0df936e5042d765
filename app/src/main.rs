//! The bundled `sqs-once` binary: the library's command line around the
//! handler `SQS_ONCE_HANDLER` names in the registry of `handlers/`.

use std::process::ExitCode;

use sqs_once_app::handlers;

#[tokio::main]
async fn main() -> ExitCode {
    sqs_once::run_with(async || handlers::from_env()).await
}
