//! The business handler: the one trait a user implements.

use std::{fmt, future::Future, sync::Arc};

use futures::future::{BoxFuture, LocalBoxFuture};
use serde_json::Value;

use crate::{Record, error::HandlerError};

/// What a successful handler returns: an optional JSON value, kept in the
/// stored claim when result storage is on.
pub type HandlerResult = Result<Option<Value>, HandlerError>;

/// Business logic for one SQS record.
///
/// The framework calls `handle` only for the record that won the claim on its
/// idempotency key, so the side effects inside run once per key. Return
/// [`HandlerError::retryable`] for failures that another delivery may fix (the
/// claim is released and SQS redelivers the message) and
/// [`HandlerError::permanent`] for ones it cannot (the failure is recorded and
/// later deliveries are not run again). A panic counts as retryable.
///
/// Records run concurrently on the async runtime, which in the bundled binary
/// and the crates `sqs-once new` writes has a single thread: a handler must
/// not block it (a blocking call holds up every other record and the
/// deadline's cut-off), so blocking work goes to
/// [`tokio::task::spawn_blocking`](https://docs.rs/tokio/1/tokio/task/fn.spawn_blocking.html).
///
/// A complete handler; [`sqs_once::run`](https://docs.rs/sqs-once/latest/sqs_once/fn.run.html) makes a binary of it:
///
/// ```
/// use serde::Deserialize;
/// use serde_json::json;
/// use sqs_once::{Handler, HandlerError, HandlerResult, Record};
///
/// #[derive(Deserialize)]
/// struct Shipment {
///     order_id: String,
///     parcels: u32,
/// }
///
/// struct ShipOrder;
///
/// impl Handler for ShipOrder {
///     async fn handle(&self, record: &Record) -> HandlerResult {
///         let shipment: Shipment = record.body_json()?;
///         if shipment.parcels == 0 {
///             return Err(HandlerError::permanent("a shipment needs at least one parcel"));
///         }
///         // Call the carrier here; a timeout would be `HandlerError::retryable(..)`.
///         Ok(Some(json!({ "order_id": shipment.order_id, "label": "1Z999" })))
///     }
/// }
///
/// # let record = sqs_once::testing::record(r#"{"order_id":"o-1","parcels":2}"#);
/// # let output = tokio::runtime::Runtime::new().unwrap().block_on(ShipOrder.handle(&record));
/// # assert_eq!(output.unwrap().unwrap()["label"], "1Z999");
/// ```
pub trait Handler: Send + Sync + 'static {
    /// Processes one record.
    fn handle(&self, record: &Record) -> impl Future<Output = HandlerResult> + Send;

    /// Whether every side effect of [`handle`](Self::handle) is staged on
    /// the record's [`transaction`](crate::transaction): DynamoDB writes
    /// and messages, nothing sent or written any other way. Such a handler
    /// needs no claim before it runs. It runs, and its transaction writes
    /// the claim's completion, conditioned on the key being free, with what
    /// it staged, in one request: exactly once for the price of that
    /// transaction. Two runs of one key may then run at once (a copy
    /// delivered meanwhile); one commits, the other is a duplicate and
    /// nothing of it applies. `false` (the default) claims the key first,
    /// so that only the claim's winner runs, as a handler with effects
    /// outside the transaction needs. `SQS_ONCE_CLAIM=always` claims first
    /// whatever this says.
    ///
    /// ```
    /// use sqs_once::{Handler, HandlerResult, Record, transaction::{Key, Update}};
    ///
    /// struct Credit;
    ///
    /// impl Handler for Credit {
    ///     async fn handle(&self, record: &Record) -> HandlerResult {
    ///         let account: String = record.body_json()?;
    ///         record.transaction().stage(Update::new("ledger", Key::new("pk", account)).add("balance", 5))?;
    ///         Ok(None)
    ///     }
    ///
    ///     // Its only effect is the staged update.
    ///     fn stages_every_effect(&self) -> bool {
    ///         true
    ///     }
    /// }
    /// ```
    fn stages_every_effect(&self) -> bool {
        false
    }
}

/// A shared handler is a handler, so tests and callers can keep a reference
/// to the state a handler records.
impl<H: Handler> Handler for Arc<H> {
    fn handle(&self, record: &Record) -> impl Future<Output = HandlerResult> + Send {
        H::handle(self, record)
    }

    fn stages_every_effect(&self) -> bool {
        H::stages_every_effect(self)
    }
}

/// A handler made of an async function of the record, as `service_fn` makes
/// a service: for handlers with no state of their own beyond what the
/// closure captures. The function gets its own copy of the record.
///
/// ```
/// use sqs_once::{HandlerError, Record, handler_fn};
///
/// let handler = handler_fn(|record: Record| async move {
///     if record.body.is_empty() {
///         return Err(HandlerError::permanent("empty message"));
///     }
///     Ok(None)
/// });
/// # fn is_handler(_: &impl sqs_once::Handler) {}
/// # is_handler(&handler);
/// ```
pub fn handler_fn<F, Fut>(f: F) -> HandlerFn<F>
where
    F: Fn(Record) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send,
{
    HandlerFn(f)
}

/// The handler [`handler_fn`] returns.
#[derive(Debug, Clone, Copy)]
pub struct HandlerFn<F>(F);

impl<F, Fut> Handler for HandlerFn<F>
where
    F: Fn(Record) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send,
{
    fn handle(&self, record: &Record) -> impl Future<Output = HandlerResult> + Send {
        (self.0)(record.clone())
    }
}

/// Any handler, its type forgotten: the handler behind one name, chosen at
/// run time (by a setting, from a registry of handlers), as tower's
/// `BoxService` is any service. The engine holds every handler so, which is
/// why it and the command line are compiled once, not once per handler type.
/// Cloning shares the handler.
///
/// ```
/// use sqs_once::{BoxHandler, HandlerError, handler_fn};
///
/// fn chosen(name: &str) -> Option<BoxHandler> {
///     match name {
///         "accept" => Some(BoxHandler::new(handler_fn(|_| async { Ok(None) }))),
///         "refuse" => Some(BoxHandler::new(handler_fn(|_| async {
///             Err(HandlerError::permanent("refused"))
///         }))),
///         _ => None,
///     }
/// }
/// # fn is_handler(_: &impl sqs_once::Handler) {}
/// # is_handler(&chosen("accept").unwrap());
/// ```
#[derive(Clone)]
pub struct BoxHandler(Arc<dyn DynHandler>);

impl BoxHandler {
    /// `handler`, its type forgotten.
    pub fn new(handler: impl Handler) -> Self {
        Self(Arc::new(handler))
    }
}

impl fmt::Debug for BoxHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BoxHandler")
    }
}

impl Handler for BoxHandler {
    async fn handle(&self, record: &Record) -> HandlerResult {
        self.0.handle_boxed(record).await
    }

    fn stages_every_effect(&self) -> bool {
        self.0.stages_every_effect()
    }
}

/// The handler, built when a command that runs one awaits it; an error is
/// the reason it cannot start.
pub type BuildHandler<'a> = LocalBoxFuture<'a, Result<BoxHandler, String>>;

/// Object-safe form of [`Handler`], implemented for every handler: what a
/// [`BoxHandler`] holds.
trait DynHandler: Send + Sync + 'static {
    /// [`Handler::handle`] with its future boxed.
    fn handle_boxed<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, HandlerResult>;

    /// [`Handler::stages_every_effect`].
    fn stages_every_effect(&self) -> bool;
}

impl<H: Handler> DynHandler for H {
    fn handle_boxed<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, HandlerResult> {
        Box::pin(self.handle(record))
    }

    fn stages_every_effect(&self) -> bool {
        Handler::stages_every_effect(self)
    }
}
