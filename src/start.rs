//! How a consumer binary starts: the Lambda function inside Lambda, the
//! command line outside it.

use std::{fmt::Display, process::ExitCode};

use futures::FutureExt;

use crate::consumer::{Builder, Consumer};
use sqs_once_core::{BoxHandler, BuildHandler, Handler};

/// Runs `handler` as the bundled `sqs-once` binary runs its own: the Lambda
/// function inside Lambda, otherwise the command line (`invoke`, `poll`,
/// `claims`, `create-table`), with the same settings, output and exit codes.
///
/// A consumer crate of one's own is then, besides its handler:
///
/// ```no_run
/// use sqs_once::{Handler, HandlerResult, Record};
///
/// struct MyHandler;
///
/// impl Handler for MyHandler {
///     async fn handle(&self, record: &Record) -> HandlerResult {
///         println!("{}", record.body);
///         Ok(None)
///     }
/// }
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> std::process::ExitCode {
///     sqs_once::run(MyHandler).await
/// }
/// ```
///
/// Built without the `cli` feature, a binary is the Lambda function alone:
/// outside Lambda it says so and exits with 1.
///
#[doc = include_str!("../docs/command-line.md")]
pub async fn run<H: Handler>(handler: H) -> ExitCode {
    Consumer::builder().run(handler).await
}

/// [`run`], with the handler built only by the commands that run it
/// (`claims` and `create-table` do not), after the settings are read. An
/// error building it stops the start with its message; inside Lambda it is
/// reported as the init error, so that a missing setting or an unreachable
/// resource shows in the function's status instead of failing every batch.
///
/// ```no_run
/// use sqs_once::{Handler, HandlerResult, Record};
///
/// struct Archive {
///     bucket: String,
/// }
///
/// impl Handler for Archive {
///     async fn handle(&self, record: &Record) -> HandlerResult {
///         println!("archiving {} to {}", record.message_id, self.bucket);
///         Ok(None)
///     }
/// }
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> std::process::ExitCode {
///     sqs_once::run_with(async || {
///         let bucket = std::env::var("ARCHIVE_BUCKET").map_err(|_| "ARCHIVE_BUCKET is not set")?;
///         Ok::<_, &str>(Archive { bucket })
///     })
///     .await
/// }
/// ```
pub async fn run_with<H, E>(build: impl AsyncFnOnce() -> Result<H, E>) -> ExitCode
where
    H: Handler,
    E: Display,
{
    Consumer::builder().run_with(build).await
}

// The builder's ways to start, here rather than beside the builder: they
// dispatch to the runners (the command line, the Lambda loop), which
// assemble their consumers through the builder, so the builder itself
// imports nothing above it.
impl Builder {
    /// Runs `handler` as the bundled `sqs-once` binary runs its own: the
    /// Lambda function inside Lambda, the command line outside it
    /// ([`crate::run`] is this with every part from the environment).
    pub async fn run(self, handler: impl Handler) -> ExitCode {
        let handler = BoxHandler::new(handler);
        self.serve(async move { Ok(handler) }.boxed_local()).await
    }

    /// [`run`](Self::run), with the handler built by `build` only by the
    /// commands that run one, after the settings are read (see
    /// [`crate::run_with`]).
    pub async fn run_with<H, E>(self, build: impl AsyncFnOnce() -> Result<H, E>) -> ExitCode
    where
        H: Handler,
        E: Display,
    {
        let handler = async move {
            let handler = build().await.map_err(|error| format!("the handler cannot start: {error}"))?;
            Ok(BoxHandler::new(handler))
        };
        self.serve(handler.boxed_local()).await
    }

    #[cfg(feature = "cli")]
    async fn serve(self, handler: BuildHandler<'_>) -> ExitCode {
        crate::cli::main(self, handler).await
    }

    #[cfg(not(feature = "cli"))]
    async fn serve(mut self, handler: BuildHandler<'_>) -> ExitCode {
        let lambda = crate::environment::Environment::current().in_lambda();
        self.start_logging(lambda);
        let result = if lambda {
            crate::lambda::start(self, handler).await
        } else {
            Err("not in Lambda, and this binary is built without the command line (the `cli` feature of sqs-once)"
                .into())
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                crate::logging::fatal(lambda, &error);
                ExitCode::FAILURE
            }
        }
    }
}
