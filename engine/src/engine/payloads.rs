//! The payloads of records that point to S3 (see [`sqs_once_core::payload`]): read
//! before the batch runs, in place of the pointers, within the process's
//! memory budget; deleted once their records succeeded, when asked.

use std::{collections::HashSet, sync::Arc};

use futures::{StreamExt, future::join_all};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::{Instant, timeout_at},
};

use super::Engine;
use crate::{
    opened::{Opened, Text},
    report::{BatchReport, Failure, Outcome},
};
use sqs_once_core::{
    Body,
    clock::duration_ms,
    payload::{PayloadError, PayloadPointer},
};

/// The bytes of payloads the process holds at once, in units of a KiB (a
/// semaphore counts its permits in `u32` at a time).
#[derive(Debug, Clone)]
pub(super) struct PayloadMemory {
    kib: Arc<Semaphore>,
    budget: u64,
}

impl PayloadMemory {
    /// A budget of `bytes` (`SQS_ONCE_LARGE_PAYLOAD_MEMORY`).
    pub(super) fn new(bytes: u64) -> Self {
        let kib = usize::try_from(bytes / 1024).unwrap_or(usize::MAX).min(Semaphore::MAX_PERMITS);
        Self { kib: Arc::new(Semaphore::new(kib)), budget: bytes }
    }

    /// Room for a payload of `bytes` more, held until the permit is
    /// dropped; `None` when the payloads held already leave too little. A
    /// payload is held once: the key, the checks, the logs and the handler's
    /// record all read the buffer it was read into.
    fn hold(&self, bytes: u64) -> Option<OwnedSemaphorePermit> {
        let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        Arc::clone(&self.kib).try_acquire_many_owned(kib).ok()
    }
}

/// A payload read in place of a record's pointer, and its room in the
/// process's memory budget, held until the batch has answered.
#[derive(Debug)]
pub(super) struct Fetched {
    pub(super) pointer: PayloadPointer,
    pub(super) bytes: u64,
    _held: OwnedSemaphorePermit,
}

impl Engine {
    /// Reads the payload of each record that carries an S3 pointer in place
    /// of its body, at most `concurrency` reads at once, by the cut-off. A
    /// payload holds its room in the process's budget
    /// (`SQS_ONCE_LARGE_PAYLOAD_MEMORY`, the size its pointer declares)
    /// until the batch has answered: a record whose payload would pass it
    /// fails `payload_unavailable` and comes back, as does one whose
    /// payload cannot be read. Returns, by event index, what was read.
    pub(super) async fn fetch_payloads(
        &self,
        opened: &mut [Result<Opened<'_>, Failure>],
        cutoff: Instant,
    ) -> Vec<Option<Fetched>> {
        let options = &self.inner.options.payloads;
        let pointers: Vec<_> = opened
            .iter()
            .map(|opened| {
                let opened = opened.as_ref().ok().filter(|_| options.fetch)?;
                Some(opened.pointer()?.map(|pointer| (pointer, opened.declared_size())))
            })
            .collect();
        if pointers.iter().all(Option::is_none) {
            return opened.iter().map(|_| None).collect();
        }
        let reads = pointers.into_iter().map(|pointer| async move {
            let (pointer, declared) = match pointer? {
                Ok(found) => found,
                Err(invalid) => return Some(Err(Failure::InvalidRecord(invalid))),
            };
            Some(self.fetch(pointer, declared, cutoff).await)
        });
        let concurrency = self.inner.options.concurrency.max(1);
        let read: Vec<_> = futures::stream::iter(reads).buffered(concurrency).collect().await;
        opened
            .iter_mut()
            .zip(read)
            .map(|(opened, read)| match (opened, read?) {
                (Ok(message), Ok((fetched, payload))) => {
                    message.body = Text::Read(Body::from(payload));
                    Some(fetched)
                }
                (opened, Err(failure)) => {
                    *opened = Err(failure);
                    None
                }
                (Err(_), Ok(_)) => None,
            })
            .collect()
    }

    /// The payload at `pointer`, which declares `declared` bytes, with its
    /// room in the budget.
    async fn fetch(
        &self,
        pointer: PayloadPointer,
        declared: Option<u64>,
        cutoff: Instant,
    ) -> Result<(Fetched, String), Failure> {
        let (options, memory) = (&self.inner.options.payloads, &self.inner.payload_memory);
        let Some(store) = &self.inner.payloads else {
            return Err(Failure::PayloadUnavailable(format!(
                "{pointer}: this consumer reads no payloads from S3 (it was built without the `s3` feature)"
            )));
        };
        let room = declared.unwrap_or(options.max_bytes).min(options.max_bytes);
        let Some(held) = memory.hold(room) else {
            return Err(Failure::PayloadUnavailable(format!(
                "{pointer}: its {room} bytes would pass SQS_ONCE_LARGE_PAYLOAD_MEMORY={} with the payloads held \
                 now; delivered again",
                memory.budget
            )));
        };
        let started = Instant::now();
        match timeout_at(cutoff, store.get(&pointer, options.max_bytes)).await {
            Ok(Ok(payload)) => {
                let bytes = payload.len() as u64;
                tracing::debug!(%pointer, bytes, ms = duration_ms(started.elapsed()), "payload read from S3");
                Ok((Fetched { pointer, bytes, _held: held }, payload))
            }
            // No later delivery reaches it either: failed for good, to the dead-letter queue at once.
            Ok(Err(error @ PayloadError::Unreachable { .. })) => Err(Failure::Permanent(error.to_string())),
            Ok(Err(error)) => Err(Failure::PayloadUnavailable(error.to_string())),
            Err(_) => Err(Failure::Deadline),
        }
    }

    /// Deletes the objects read for records that succeeded, or whose key had
    /// (`SQS_ONCE_LARGE_PAYLOAD_DELETE`); an object that cannot be deleted
    /// is left to the bucket's lifecycle rule.
    pub(super) async fn delete_payloads(&self, fetched: &[Option<Fetched>], report: &BatchReport) {
        let Some(store) = &self.inner.payloads else { return };
        let done = fetched.iter().zip(&report.records).filter_map(|(fetched, report)| {
            let succeeded = matches!(report.outcome, Outcome::Processed { confirmed: true } | Outcome::Duplicate);
            fetched.as_ref().filter(|_| succeeded).map(|fetched| &fetched.pointer)
        });
        let unique: HashSet<&PayloadPointer> = done.collect();
        join_all(unique.into_iter().map(|pointer| async move {
            if let Err(error) = store.delete(pointer).await {
                tracing::warn!(%error, "the payload of a record that succeeded was not deleted; a lifecycle rule removes it");
            }
        }))
        .await;
    }
}
