//! The business handlers this binary can run, one file each.
//!
//! To add one: write `handlers/<name>.rs` with a type implementing
//! [`Handler`](crate::Handler), declare the module below, and add a line to
//! [`REGISTRY`]. `SQS_ONCE_HANDLER=<name>` then selects it.

use std::sync::Arc;

use crate::BoxHandler;

pub mod demo;
pub mod orders;

/// Builds a handler at start.
pub type Constructor = fn() -> BoxHandler;

/// Every handler by name, with the function that builds it at start.
pub const REGISTRY: &[(&str, Constructor)] =
    &[("demo", || Arc::new(demo::Demo::from_env())), ("orders", || Arc::new(orders::Orders))];

/// A handler name that is not in the registry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown handler `{0}` (SQS_ONCE_HANDLER): registered handlers are {names}", names = names().join(", "))]
pub struct UnknownHandler(pub String);

/// The registered names.
pub fn names() -> Vec<&'static str> {
    REGISTRY.iter().map(|(name, _)| *name).collect()
}

/// Builds the handler registered as `name`.
///
/// ```
/// assert!(sqs_once::handlers::build("demo").is_ok());
/// let error = sqs_once::handlers::build("nope").err().unwrap();
/// assert!(error.to_string().contains("demo, orders"));
/// ```
pub fn build(name: &str) -> Result<BoxHandler, UnknownHandler> {
    REGISTRY
        .iter()
        .find(|(registered, _)| *registered == name)
        .map(|(_, build)| build())
        .ok_or_else(|| UnknownHandler(name.to_owned()))
}
