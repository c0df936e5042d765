//! The source queue's visibility timeout, as a Lambda function reads it:
//! once, at its first batch, from the records' queue (`GetQueueAttributes`,
//! which an event source mapping's role is granted). Completed keys are
//! remembered past a failed record's redelivery, which the queue's timeout
//! bounds: `SQS_ONCE_VISIBILITY_TIMEOUT_SECS` says what it should be, the
//! queue says what it is, and the longer counts. A setting shorter than the
//! queue's is named in a warning (it would have kept keys too briefly for
//! the records SQS brings back after the queue's own timeout); with no
//! setting, the queue's timeout takes the place of SQS's longest, which kept
//! keys a day and a half in items. Unread (SQS did not answer in time, or
//! refused), what was set stands, and the read is tried again later.

use parking_lot::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::Consumer;
use crate::sqs::Sqs;
use sqs_once_engine::event::EventRecord;

/// How long the read may hold a batch: a request's time.
const READ_WITHIN: Duration = Duration::from_secs(1);

/// How long after a failed read the next is tried.
const READ_AGAIN_AFTER: Duration = Duration::from_secs(300);

/// The read of the queue's visibility timeout, and where it stands.
#[derive(Debug)]
pub(crate) struct QueueVisibility {
    sqs: Sqs,
    /// `SQS_ONCE_VISIBILITY_TIMEOUT_SECS` (or `Builder::visibility_timeout`), when set.
    told: Option<Duration>,
    state: Mutex<Read>,
}

/// Where the read stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Not read yet, or to be tried again from this moment.
    Due(Option<Instant>),
    /// A batch is reading it now.
    Reading,
    /// Read, or nothing to read (records of no queue).
    Done,
}

impl QueueVisibility {
    /// Reads with `sqs`; `told` is the visibility timeout the settings name.
    pub(crate) fn new(sqs: Sqs, told: Option<Duration>) -> Self {
        Self { sqs, told, state: Mutex::new(Read::Due(None)) }
    }

    /// Reads the visibility timeout of the queue `records` came from, unless
    /// it was read (or is being read, or failed a moment ago), and has
    /// `consumer` remember keys past it.
    pub(crate) async fn read_once(&self, consumer: &Consumer, records: &[EventRecord]) {
        let arn = records.iter().find_map(|record| match record {
            EventRecord::Message(message) => message.event_source_arn.clone(),
            _ => None,
        });
        {
            let mut state = self.state.lock();
            match *state {
                Read::Due(Some(at)) if Instant::now() < at => return,
                Read::Due(_) if arn.is_some() => *state = Read::Reading,
                _ => return,
            }
        }
        let url = arn.as_deref().and_then(Sqs::queue_url);
        let read = match &url {
            Some(url) => tokio::time::timeout(READ_WITHIN, self.sqs.queue_info(url)).await,
            None => {
                // Not a queue's ARN: there is nothing to read, now or later.
                *self.state.lock() = Read::Done;
                return;
            }
        };
        let next = match read {
            Ok(Ok(queue)) => {
                self.remember_past(consumer, queue.visibility_timeout);
                Read::Done
            }
            failed => {
                let reason = match failed {
                    Ok(Err(error)) => error.to_string(),
                    _ => format!("no answer within {READ_WITHIN:?}"),
                };
                tracing::warn!(
                    queue = arn.as_deref().unwrap_or_default(), %reason,
                    "the queue's visibility timeout could not be read (GetQueueAttributes); keys are remembered past \
                     SQS_ONCE_VISIBILITY_TIMEOUT_SECS, or SQS's longest when it is unset, until it is"
                );
                Read::Due(Some(Instant::now() + READ_AGAIN_AFTER))
            }
        };
        *self.state.lock() = next;
    }

    /// Has `consumer` remember keys past the redelivery of a queue whose
    /// visibility timeout is `read`, or the one set, if that is longer.
    fn remember_past(&self, consumer: &Consumer, read: Duration) {
        if let Some(told) = self.told.filter(|told| *told < read) {
            tracing::warn!(
                setting_s = told.as_secs(),
                queue_s = read.as_secs(),
                "SQS_ONCE_VISIBILITY_TIMEOUT_SECS is shorter than the source queue's visibility timeout: keys are \
                 remembered past the queue's; set it to the queue's"
            );
        }
        consumer.redelivered_by_queue(read.max(self.told.unwrap_or_default()), Duration::ZERO);
    }
}
