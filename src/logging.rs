//! Where logs go: standard error, so that standard output carries only the
//! answer (and, in Lambda, the metrics).

use std::io::IsTerminal;

use tracing_subscriber::{
    Layer, Registry, filter::filter_fn, layer::SubscriberExt, registry::LookupSpan, util::SubscriberInitExt,
};

use crate::{config::settings, environment::Environment};

/// A layer beside the log lines' that records spans (the `opentelemetry`
/// feature's), with its own filter.
pub(crate) type SpanLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Installs the subscriber and the panic hook. In Lambda,
/// `AWS_LAMBDA_LOG_FORMAT=JSON` switches to JSON lines and
/// `AWS_LAMBDA_LOG_LEVEL` sets the level; `SQS_ONCE_LOG`, then `RUST_LOG`,
/// take precedence as a full filter. `spans`, when given, records spans
/// beside the lines. A subscriber the program installed before stays.
pub(crate) fn init(lambda: bool, spans: Option<SpanLayer>) {
    // Two subscribers rather than an optional layer: an absent `Option`
    // layer takes an interest in every callsite, so that each of the AWS
    // SDK's `trace!` events would be built and filtered per record.
    let _ = match spans {
        Some(spans) => tracing_subscriber::registry().with(spans).with(lines(lambda)).try_init(),
        None => tracing_subscriber::registry().with(lines(lambda)).try_init(),
    };
    // A handler's panic fails only its record, and the engine logs it there;
    // one line here says where it happened, without a backtrace per record:
    // one line, though the panic's text puts its message on a line of its own.
    std::panic::set_hook(Box::new(|panic| {
        let panic = one_line(&panic.to_string());
        tracing::error!(%panic, "panic");
    }));
}

/// `text` on one line: a log line per event, as log readers split them.
fn one_line(text: &str) -> String {
    text.split('\n').map(str::trim).filter(|line| !line.is_empty()).collect::<Vec<_>>().join(" ")
}

/// The log lines' layer, its filter the settings'.
fn lines<S>(lambda: bool) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    let environment = Environment::current();
    let filter = [settings::LOG, "RUST_LOG"]
        .iter()
        .find_map(|name| tracing_subscriber::EnvFilter::try_from_env(name).ok())
        .unwrap_or_else(|| {
            let level = environment.log_level.filter(|_| lambda).unwrap_or("info");
            tracing_subscriber::EnvFilter::new(format!("{level},aws_config=error"))
        });
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_target(false);
    let logs = match lambda && environment.json_logs {
        true => logs.json().flatten_event(true).with_span_list(false).boxed(),
        false => logs.with_ansi(std::io::stderr().is_terminal()).boxed(),
    };
    // The batch's and records' spans (the engine's, under sqs_once_core::trace::TARGET) are for a subscriber
    // that collects spans, not for log lines: at any level, a line keeps the
    // invocation's span (its request id) and nothing more. The settings'
    // filter is the outer one, so that its maximum level still lets every
    // callsite above it be skipped at one comparison.
    let no_trace_spans =
        filter_fn(|metadata| !(metadata.is_span() && metadata.target() == sqs_once_core::trace::TARGET));
    logs.with_filter(no_trace_spans).with_filter(filter)
}

/// Reports the error that ends the process: in Lambda as a log line (JSON
/// under `AWS_LAMBDA_LOG_FORMAT=JSON`, like every other line there);
/// elsewhere as one line on standard error, named after the program.
pub(crate) fn fatal(lambda: bool, error: &dyn std::fmt::Display) {
    match lambda {
        true => tracing::error!("{error}"),
        false => eprintln!("{}: {error}", program()),
    }
}

/// The running program's name, as its user typed it: `sqs-once`, or a
/// consumer crate's own binary.
pub(crate) fn program() -> String {
    std::env::args_os()
        .next()
        .as_deref()
        .and_then(|path| std::path::Path::new(path).file_stem())
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "sqs-once".to_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_panics_text_is_logged_on_one_line() {
        let text = "panicked at handlers/src/demo.rs:97:20:\ndemo: asked to panic";
        assert_eq!(super::one_line(text), "panicked at handlers/src/demo.rs:97:20: demo: asked to panic");
    }
}
