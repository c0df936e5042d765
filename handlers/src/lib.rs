//! The business handlers the bundled `sqs-once` binary runs, one file each,
//! and the registry that names them.
//!
//! To add one: write `handlers/src/<name>.rs` with a type implementing
//! [`Handler`](sqs_once::Handler), declare the module below, and add a line to [`REGISTRY`].
//! `SQS_ONCE_HANDLER=<name>` then selects it.

use sqs_once::BoxHandler;

pub mod demo;
pub mod ledger;
pub mod orders;

/// Builds a handler at start; a handler that needs a resource it cannot get
/// (a file, a client) says why, and the process does not start.
pub type Constructor = fn() -> Result<BoxHandler, String>;

/// Every handler by name, with the function that builds it at start.
pub const REGISTRY: &[(&str, Constructor)] = &[
    ("demo", || Ok(BoxHandler::new(demo::Demo::from_env()?))),
    ("ledger", || Ok(BoxHandler::new(ledger::Ledger::from_env()?))),
    ("orders", || Ok(BoxHandler::new(orders::Orders))),
];

/// The handler the bundled binary runs when `SQS_ONCE_HANDLER` is not set.
pub const DEFAULT: &str = "demo";

/// Why the configured handler could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerSetupError {
    /// The name is not in the registry.
    #[error("unknown handler `{0}` (SQS_ONCE_HANDLER): registered handlers are {names}", names = names().join(", "))]
    Unknown(String),
    /// The handler's constructor failed.
    #[error("handler `{handler}` cannot start: {reason}")]
    Failed {
        /// The handler's name.
        handler: String,
        /// What its constructor said.
        reason: String,
    },
}

/// The registered names.
pub fn names() -> Vec<&'static str> {
    REGISTRY.iter().map(|(name, _)| *name).collect()
}

/// Builds the handler `SQS_ONCE_HANDLER` names ([`DEFAULT`] when unset).
pub fn from_env() -> Result<BoxHandler, HandlerSetupError> {
    let name = std::env::var("SQS_ONCE_HANDLER").ok().filter(|name| !name.trim().is_empty());
    build(name.as_deref().unwrap_or(DEFAULT))
}

/// Builds the handler registered as `name`.
///
/// ```
/// assert!(sqs_once_handlers::build("demo").is_ok());
/// let error = sqs_once_handlers::build("nope").err().unwrap();
/// assert!(error.to_string().contains("demo, ledger, orders"));
/// ```
pub fn build(name: &str) -> Result<BoxHandler, HandlerSetupError> {
    let (_, constructor) = REGISTRY
        .iter()
        .find(|(registered, _)| *registered == name)
        .ok_or_else(|| HandlerSetupError::Unknown(name.to_owned()))?;
    constructor().map_err(|reason| HandlerSetupError::Failed { handler: name.to_owned(), reason })
}
