//! How a handler fails: [`HandlerError`] and its [`ErrorKind`]. A leaf of
//! the vocabulary, below the handler, the record and the transaction, which
//! all speak of it.

use std::fmt;

/// Whether another delivery of the same message could succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Transient: release the claim and let SQS redeliver.
    Retryable,
    /// Final: record the failure; later deliveries are not run.
    Permanent,
}

/// A handler's failure, classified as retryable or permanent.
///
/// ```
/// use sqs_once::{ErrorKind, HandlerError};
///
/// let error = HandlerError::retryable("payment provider timed out");
/// assert_eq!(error.kind(), ErrorKind::Retryable);
/// assert_eq!(error.to_string(), "payment provider timed out");
/// ```
#[derive(Debug)]
pub struct HandlerError {
    kind: ErrorKind,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl HandlerError {
    /// A failure that a later delivery may not repeat.
    pub fn retryable(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self { kind: ErrorKind::Retryable, source: error.into() }
    }

    /// A failure that no later delivery can fix.
    pub fn permanent(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self { kind: ErrorKind::Permanent, source: error.into() }
    }

    /// Retryable or permanent.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl std::error::Error for HandlerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}
