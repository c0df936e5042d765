//! The Runtime API calls the function makes itself, beside `lambda_runtime`'s
//! loop: the init error, and serving an invocation whose headers
//! `lambda_runtime` cannot read.
//!
//! Lambda passes a caller's client context on as it is (`aws lambda invoke
//! --client-context`), and `lambda_runtime` reads it as the mobile SDK's
//! shape, ending its loop on one it cannot read: a `custom` value that is
//! not a string ends the process, with the batch it was given. The function
//! never reads the client context or the Cognito identity, so it serves
//! such an invocation without them and then starts the loop again.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

use http::{Request, header::HeaderMap};
use http_body_util::BodyExt;
use lambda_runtime::{Context, LambdaEvent};
use lambda_runtime_api_client::{Client, body::Body};
use serde_json::json;
use tracing::Instrument;

use super::{Event, Function};
use crate::environment::Environment;

/// Whether `lambda_runtime` stopped because one invocation's headers did
/// not parse (its client context, Cognito identity or deadline) rather than
/// because the Runtime API is gone.
pub(super) fn unreadable_headers(error: &(dyn std::error::Error + 'static)) -> bool {
    error.is::<serde_json::Error>() || error.is::<http::header::ToStrError>() || error.is::<std::num::ParseIntError>()
}

/// Serves the invocation `lambda_runtime` gave up on. The Runtime API hands
/// an unanswered invocation out again at the next `/next` (AWS's emulator
/// does; should Lambda hand out the next one instead, that one is served
/// here as well, and the one given up on fails at its timeout).
pub(super) async fn serve_unreadable(function: &Function) -> Result<(), lambda_runtime::Error> {
    let client = Client::builder().build()?;
    let next = client.call(Request::get("/2018-06-01/runtime/invocation/next").body(Body::empty())?).await?;
    let (parts, body) = next.into_parts();
    let body = body.collect().await?.to_bytes();
    let context = context(&parts.headers)?;
    let request_id = context.request_id.clone();
    let span = tracing::info_span!("Lambda runtime invoke", requestId = %request_id);
    let answer = async {
        // An `Event` reads any text: a body that is not JSON is its error.
        let event: Event = serde_json::from_slice(&body).unwrap_or_else(|error| Event(Err(error.to_string())));
        function.invoke(LambdaEvent::new(event, context)).await
    }
    .instrument(span)
    .await;
    let request = match answer {
        Ok(response) => Request::post(format!("/2018-06-01/runtime/invocation/{request_id}/response"))
            .body(Body::from(serde_json::to_vec(&response)?))?,
        Err(diagnostic) => Request::post(format!("/2018-06-01/runtime/invocation/{request_id}/error"))
            .header("Lambda-Runtime-Function-Error-Type", &diagnostic.error_type)
            .body(Body::from(serde_json::to_vec(&diagnostic)?))?,
    };
    let posted = client.call(request).await?;
    match posted.status().is_success() {
        true => Ok(()),
        false => Err(format!("the Runtime API refused the answer to {request_id}: {}", posted.status()).into()),
    }
}

/// The invocation's context from its headers, without the client context
/// and identity.
fn context(headers: &HeaderMap) -> Result<Context, lambda_runtime::Error> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let mut context = Context::default();
    context.request_id =
        header("Lambda-Runtime-Aws-Request-Id").ok_or("an invocation without a request id")?.to_owned();
    context.deadline = header("Lambda-Runtime-Deadline-Ms").ok_or("an invocation without a deadline")?.parse()?;
    context.invoked_function_arn = header("Lambda-Runtime-Invoked-Function-Arn").unwrap_or_default().to_owned();
    context.xray_trace_id = header("Lambda-Runtime-Trace-Id").map(str::to_owned);
    Ok(context)
}

/// Tells the Runtime API that initialisation failed, so Lambda reports
/// `message` as the init error instead of an anonymous exit. Best effort: the
/// process exits with the message on standard error either way. A plain
/// blocking request: it is the process's last act.
pub(crate) fn report_init_error(error_type: &str, message: &str) {
    let Some(api) = &Environment::current().runtime_api else { return };
    let body = json!({ "errorType": error_type, "errorMessage": message }).to_string();
    let request = format!(
        "POST /2018-06-01/runtime/init/error HTTP/1.1\r\nHost: {api}\r\nLambda-Runtime-Function-Error-Type: {error_type}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let sent = TcpStream::connect(api.as_str()).and_then(|mut stream| {
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(request.as_bytes())?;
        let mut status = [0; 12];
        stream.read_exact(&mut status)
    });
    if let Err(error) = sent {
        tracing::warn!(%error, "cannot report the init error to the Runtime API");
    }
}
