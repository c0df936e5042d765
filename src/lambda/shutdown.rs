//! Shutting a Lambda environment down: Lambda sends the runtime SIGTERM
//! before it reclaims an environment only when an extension is registered,
//! so the function registers one of its own, internal and subscribed to no
//! event, as `lambda_runtime`'s graceful-shutdown helper does (without
//! failing the start where an emulator has no Extensions API). At SIGTERM
//! the unconfirmed finishing writes are sent again, and the messages of the
//! commits that land, within what Lambda leaves the runtime
//! ([`SHUTDOWN_TIME`]); an unfinished claim's lease ends with its
//! invocation either way.

use http::Request;
use lambda_runtime_api_client::{Client, body::Body};
use tokio::time::Instant;

use sqs_once_engine::{Engine, budget::SHUTDOWN_TIME};

/// The extension's name: one per function, and not one Lambda's own
/// extensions use.
pub(crate) const EXTENSION_NAME: &str = "sqs-once-shutdown";

/// Listens for SIGTERM and registers the extension that makes Lambda send
/// it; called in the init phase, before the runtime asks for its first
/// event. Registration is best effort: without it the function runs as
/// before, its unconfirmed writes sent again by its next invocation only.
pub(crate) async fn on_sigterm(engine: Engine) {
    listen(engine);
    if let Err(error) = register().await {
        tracing::warn!(
            %error,
            "cannot register the shutdown extension: Lambda will not send SIGTERM before it reclaims the \
             environment, and finishing writes left unconfirmed wait for the next invocation"
        );
    }
}

fn listen(engine: Engine) {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut sigterm) => {
            tokio::spawn(async move {
                if sigterm.recv().await.is_some() {
                    tracing::info!("SIGTERM: the execution environment is shutting down");
                    shut_down(&engine).await;
                    std::process::exit(0);
                }
            });
        }
        Err(error) => tracing::warn!(%error, "cannot listen for SIGTERM"),
    }
}

/// What an environment does at SIGTERM: sends its unconfirmed finishing
/// writes again, and the messages of the commits that land, within
/// [`SHUTDOWN_TIME`]; the ids of the claims whose writes are still
/// unconfirmed.
pub(crate) async fn shut_down(engine: &Engine) -> Vec<String> {
    engine.leave(Instant::now() + SHUTDOWN_TIME).await
}

/// Registers the extension with the Extensions API, then asks for its next
/// event in the background, as every extension must for the init phase to
/// end; with no event subscribed, that request waits as long as the
/// environment lives.
async fn register() -> Result<(), lambda_runtime::Error> {
    let client = Client::builder().build()?;
    let request = Request::post("/2020-01-01/extension/register")
        .header("Lambda-Extension-Name", EXTENSION_NAME)
        .header("Content-Type", "application/json")
        .body(Body::from(r#"{"events":[]}"#))?;
    let response = client.call(request).await?;
    if !response.status().is_success() {
        return Err(format!("the Extensions API answered {}", response.status()).into());
    }
    let id = response
        .headers()
        .get("Lambda-Extension-Identifier")
        .and_then(|id| id.to_str().ok())
        .ok_or("the Extensions API gave no extension identifier")?
        .to_owned();
    tokio::spawn(async move {
        loop {
            let next = Request::get("/2020-01-01/extension/event/next")
                .header("Lambda-Extension-Identifier", &id)
                .body(Body::empty())
                .map_err(lambda_runtime::Error::from);
            let answered = match next {
                Ok(next) => client.call(next).await,
                Err(error) => Err(error),
            };
            if let Err(error) = answered {
                tracing::debug!(%error, "the shutdown extension's event request ended");
                return;
            }
        }
    });
    Ok(())
}
