//! How a run ends: the write that records the handler's result (a
//! completion, a commit of what it staged, a failure record or a release),
//! and the delivery of a committed run's messages.

use parking_lot::Mutex;

use tracing::Instrument;

use super::{
    Engine,
    cutoff::Progress,
    outcome::{Ending, lease_left, won},
};
use crate::{
    claim::Lease,
    report::{Failure, Outcome, reason},
    spans,
};
use sqs_once_core::{
    ErrorKind, Record,
    store::{Committed, Fenced, OutboxEntry, StoreError},
    transaction::Staged,
};

impl Engine {
    /// Writes how the handler ended (completion, commit, failure record,
    /// release) and says what that makes of the record.
    pub(super) async fn write_ending(
        &self,
        record: &Record,
        lease: &Lease,
        ending: Ending,
        progress: &Mutex<Progress>,
    ) -> Outcome {
        match ending {
            // A run that took no claim commits its completion even with nothing staged: that write is its claim.
            Ending::Succeeded { output, staged } if !staged.is_empty() || lease.is_unclaimed() => {
                self.commit(record, lease, output, staged, progress).await
            }
            Ending::Succeeded { output, .. } => {
                let completing = self.inner.claims.complete(lease, output.as_ref());
                let confirmed = match completing.instrument(spans::write_span("complete")).await {
                    Ok(fenced) => fenced == Fenced::Applied,
                    Err(error) => {
                        tracing::error!(
                            message_id = %record.message_id, key = %record.key, %error,
                            "CompletionUnconfirmed: the handler succeeded but its completion could not be \
                             recorded; it is sent again later, and until it lands the claim stays in progress"
                        );
                        false
                    }
                };
                Outcome::Processed { confirmed }
            }
            Ending::Failed(failure) => self.write_failure(record, lease, failure, progress).await,
        }
    }

    /// Records how a handler failed (its error, its panic, or its staged
    /// writes refused): a failure record when it is permanent, a release
    /// otherwise. The answer reports the failure from now on, whether or
    /// not the write is confirmed in time.
    pub(super) async fn write_failure(
        &self,
        record: &Record,
        lease: &Lease,
        failure: Failure,
        progress: &Mutex<Progress>,
    ) -> Outcome {
        *progress.lock() = Progress::Returned(Outcome::Failed(failure.clone()));
        let written = match &failure {
            Failure::Permanent(reason) => {
                self.inner.claims.fail(lease, reason).instrument(spans::write_span("fail")).await
            }
            _ => self.inner.claims.release(lease).instrument(spans::write_span("release")).await,
        };
        log_unwritten(record, written);
        Outcome::Failed(failure)
    }

    /// Commits what the handler staged with the claim's completion. Only a
    /// confirmed commit makes the record processed, and its messages are
    /// sent then; a cancelled one is the handler's failure, as the write
    /// that cancelled it declared.
    async fn commit(
        &self,
        record: &Record,
        lease: &Lease,
        output: Option<serde_json::Value>,
        staged: Staged,
        progress: &Mutex<Progress>,
    ) -> Outcome {
        let claims = &self.inner.claims;
        let nothing_staged = staged.is_empty();
        let mut staged = staged;
        if let Err(failure) = self.offload(lease, &mut staged).await {
            return self.write_failure(record, lease, failure, progress).await;
        }
        let commit = claims.prepare_commit(lease, output.as_ref(), staged, &record.message_id);
        let entries = commit.outbox.clone();
        let outcome = match claims.commit(lease, commit).instrument(spans::write_span("commit")).await {
            Ok(committed) => self.committed(record, lease, committed, progress).await,
            Err(error) => self.commit_failed(record, lease, error, nothing_staged, &entries, progress).await,
        };
        *progress.lock() = Progress::Returned(outcome.clone());
        if outcome == (Outcome::Processed { confirmed: true }) {
            self.deliver(&entries).await;
        }
        outcome
    }

    /// What a commit the store answered makes of the record.
    async fn committed(
        &self,
        record: &Record,
        lease: &Lease,
        committed: Committed,
        progress: &Mutex<Progress>,
    ) -> Outcome {
        match committed {
            Committed::Applied => Outcome::Processed { confirmed: true },
            Committed::Refused => Outcome::Failed(Failure::LeaseLost),
            // The item kept the key: a copy's commit, or an earlier attempt of this one, applied the effect.
            Committed::InItemAlready => Outcome::Duplicate,
            // A run without a claim found the key taken: by a copy that committed first (a duplicate), a claim
            // live elsewhere, a failure recorded. Nothing of this run applied.
            Committed::Taken(existing) => match self.inner.claims.taken(lease, existing).await {
                // A record that holds the key is never a claim won.
                Ok(claim) => won(claim).err().unwrap_or(Outcome::Failed(Failure::LeaseLost)),
                Err(error) => Outcome::Failed(error.into()),
            },
            Committed::WindowFull { item, turns_in } => {
                let failure = Failure::WindowFull { item, retry_after: turns_in };
                let (message_id, key) = (&record.message_id, &record.key);
                tracing::warn!(%message_id, %key, reason = %failure, "an item's window of kept keys is full: nothing applied");
                self.write_failure(record, lease, failure, progress).await
            }
            Committed::Cancelled(cancellation) => {
                let refusal = &cancellation.refusal;
                let reason = reason::capped(&format!("{} ({})", refusal.reason, cancellation.reasons)).into_owned();
                let (message_id, key) = (&record.message_id, &record.key);
                tracing::warn!(%message_id, %key, %reason, "a staged write's condition did not hold: nothing applied");
                let failure = match refusal.kind {
                    ErrorKind::Permanent => Failure::Permanent(reason),
                    // Retryable, and any kind a later vocabulary adds: another delivery may succeed.
                    _ => Failure::Retryable(reason),
                };
                self.write_failure(record, lease, failure, progress).await
            }
        }
    }

    /// What a commit the store did not confirm makes of the record: a
    /// refusal of the staged writes is the handler's failure; otherwise the
    /// commit may have applied unseen, and is sent again.
    async fn commit_failed(
        &self,
        record: &Record,
        lease: &Lease,
        error: StoreError,
        nothing_staged: bool,
        entries: &[OutboxEntry],
        progress: &Mutex<Progress>,
    ) -> Outcome {
        let (message_id, key) = (&record.message_id, &record.key);
        match error {
            // Not "claim store rejected the request": what refused is most often the handler's own table.
            StoreError::Rejected(why) | StoreError::Unsupported(why) => {
                let reason = reason::capped(&format!("the staged writes cannot be committed: {why}")).into_owned();
                self.write_failure(record, lease, Failure::Permanent(reason), progress).await
            }
            // A run without a claim that staged nothing has no effect to lose: its completion is a completion.
            error if nothing_staged => {
                tracing::error!(
                    %message_id, %key, %error,
                    "CompletionUnconfirmed: the handler succeeded but its completion could not be recorded; it is \
                     sent again later"
                );
                Outcome::Processed { confirmed: false }
            }
            error => {
                if let Some(outbox) = self.inner.outbox.as_ref().filter(|_| !entries.is_empty()) {
                    // Applied unseen, its messages wait for a sweep.
                    outbox.note_left_unsent();
                }
                tracing::error!(
                    %message_id, %key, %error,
                    "the handler's transaction could not be confirmed: the record is reported failed and comes \
                     back after the lease; the commit is sent again, and its claim's token (or, without a claim, \
                     the key's completion) refuses it if another delivery has committed meanwhile"
                );
                Outcome::Failed(Failure::Uncommitted { retry_after: lease_left(lease, self.inner.claims.now_ms()) })
            }
        }
    }

    /// Writes to S3 the payloads of the staged messages too large to send
    /// (see [`sqs_once_core::payload::Offload`]), each under the pointer of the
    /// outbox entry it will be, and puts the pointer in its place: before
    /// the commit, so that no committed entry points to nothing, and under
    /// the same pointer however often the run commits. A payload that
    /// cannot be written fails the record, retryable, with nothing
    /// committed; an object whose commit never lands is left to the
    /// bucket's lifecycle rule.
    async fn offload(&self, lease: &Lease, staged: &mut Staged) -> Result<(), Failure> {
        // Without a bucket, staging refused every message too large to send.
        let (Some(offload), Some(store)) = (&self.inner.offload, &self.inner.payloads) else {
            return Ok(());
        };
        let messages = staged.messages_mut().iter_mut().enumerate();
        let large = messages.filter(|(_, message)| message.needs_offload(offload.threshold));
        let writes = large.map(|(n, message)| async move {
            let pointer =
                offload.pointer(&OutboxEntry::outbox_id_of(&OutboxEntry::stored_id(&lease.id, &lease.token, n)));
            store.put(&pointer, &message.body).await.map_err(|error| {
                Failure::Retryable(format!("the payload of a message to {}: {error}", message.destination.name()))
            })?;
            *message = message.through(&pointer);
            Ok(())
        });
        futures::future::join_all(writes).await.into_iter().collect()
    }

    /// Sends a committed run's messages, if the engine has an outbox, each
    /// only if it can end before the batch under way answers (see
    /// `SendWindow`; a commit answered late is sent within the next
    /// batch's): the others wait for a sweep.
    async fn deliver(&self, entries: &[OutboxEntry]) {
        if let Some(outbox) = &self.inner.outbox
            && !entries.is_empty()
        {
            let window = outbox.current_window();
            outbox.deliver_run(entries, &window).instrument(spans::send_span(entries.len())).await;
        }
    }
}

fn log_unwritten(record: &Record, written: Result<Fenced, StoreError>) {
    if let Err(error) = written {
        tracing::error!(
            message_id = %record.message_id, key = %record.key, %error,
            "could not record how the handler ended; it is sent again later, and until it lands the claim \
             stays in progress"
        );
    }
}
