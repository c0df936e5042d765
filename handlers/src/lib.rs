//! The business handlers the bundled `sqs-once` binary runs, one file each,
//! and the registry that names them.
//!
//! To add one: write `handlers/src/<name>.rs` with a type implementing
//! [`Handler`], declare the module below, and add a line to [`REGISTRY`].
//! `SQS_ONCE_HANDLER=<name>` then selects it.

use futures::future::BoxFuture;
use sqs_once::{Handler, HandlerResult, Record};

pub mod demo;
pub mod ledger;
pub mod orders;

/// Builds a handler at start; a handler that needs a resource it cannot get
/// (a file, a client) says why, and the process does not start.
pub type Constructor = fn() -> Result<Chosen, String>;

/// Every handler by name, with the function that builds it at start.
pub const REGISTRY: &[(&str, Constructor)] = &[
    ("demo", || Ok(Chosen::new(demo::Demo::from_env()?))),
    ("ledger", || Ok(Chosen::new(ledger::Ledger::from_env()?))),
    ("orders", || Ok(Chosen::new(orders::Orders))),
];

/// The handler the bundled binary runs when `SQS_ONCE_HANDLER` is not set.
pub const DEFAULT: &str = "demo";

/// A handler chosen by name at start, whichever type it is.
pub struct Chosen(Box<dyn Erased>);

impl Chosen {
    /// `handler`, its type forgotten.
    pub fn new(handler: impl Handler) -> Self {
        Self(Box::new(handler))
    }
}

impl std::fmt::Debug for Chosen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Chosen")
    }
}

impl Handler for Chosen {
    async fn handle(&self, record: &Record) -> HandlerResult {
        self.0.handle_boxed(record).await
    }

    fn stages_every_effect(&self) -> bool {
        self.0.stages_every_effect()
    }
}

/// [`Handler`] as a trait object: its future boxed.
trait Erased: Send + Sync {
    fn handle_boxed<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, HandlerResult>;
    fn stages_every_effect(&self) -> bool;
}

impl<H: Handler> Erased for H {
    fn handle_boxed<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, HandlerResult> {
        Box::pin(self.handle(record))
    }

    fn stages_every_effect(&self) -> bool {
        Handler::stages_every_effect(self)
    }
}

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
pub fn from_env() -> Result<Chosen, HandlerSetupError> {
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
pub fn build(name: &str) -> Result<Chosen, HandlerSetupError> {
    let (_, constructor) = REGISTRY
        .iter()
        .find(|(registered, _)| *registered == name)
        .ok_or_else(|| HandlerSetupError::Unknown(name.to_owned()))?;
    constructor().map_err(|reason| HandlerSetupError::Failed { handler: name.to_owned(), reason })
}
