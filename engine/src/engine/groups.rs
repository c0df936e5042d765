//! Message groups: FIFO records run in order within their group, and a
//! failure stops the rest of it; a standard queue's record is a group of its
//! own.

use std::collections::HashMap;

use tracing::Instrument;

use super::{
    BatchState, Engine,
    run::{RunResult, Runs},
};
use crate::{
    event::EventRecord,
    opened::Opened,
    report::{Failure, RecordReport},
};

impl Engine {
    /// Runs one message group in order; a standard queue's record is a group
    /// of its own. After a failure in a FIFO group the rest is skipped.
    /// Returns the report of each of its records, by event index: every run
    /// ends by the time the batch answers, so a group's reports are final
    /// and keep its order.
    pub(super) async fn run_group<'a>(
        &self,
        records: &'a [EventRecord],
        opened: &'a [Result<Opened<'a>, Failure>],
        group: &Group,
        state: &'a BatchState,
        runs: &Runs<'a>,
    ) -> Vec<(usize, RecordReport)> {
        let mut failed: Option<&str> = None;
        let mut reports = Vec::with_capacity(group.indices.len());
        for &index in &group.indices {
            let record = &records[index];
            let (key, run) = match (failed, &opened[index]) {
                (Some(message_id), _) => (None, RunResult::failed(Failure::GroupSkipped(message_id.to_owned()))),
                (None, Err(invalid)) => (None, RunResult::failed(invalid.clone())),
                (None, Ok(opened)) => self.run_record(opened, state, runs).instrument(state.spans[index].clone()).await,
            };
            if group.fifo && failed.is_none() && run.outcome.is_failure() {
                failed = Some(record.message_id());
            }
            let report = RecordReport {
                message_id: record.message_id().to_owned(),
                key,
                outcome: run.outcome,
                duration: run.duration,
                claim_latency: run.claim_latency,
                payload_bytes: None,
            };
            reports.push((index, report));
        }
        reports
    }
}

/// Records that must run in order, and whether they come from a FIFO queue.
pub(super) struct Group {
    indices: Vec<usize>,
    fifo: bool,
}

/// Splits the batch into FIFO message groups (in event order) and single
/// records of standard queues.
pub(super) fn message_groups(records: &[EventRecord]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    let mut by_group_id: HashMap<&str, usize> = HashMap::new();
    for (index, record) in records.iter().enumerate() {
        match record.fifo_group() {
            Some(group_id) => {
                let slot = *by_group_id.entry(group_id).or_insert_with(|| {
                    groups.push(Group { indices: Vec::new(), fifo: true });
                    groups.len() - 1
                });
                groups[slot].indices.push(index);
            }
            None => groups.push(Group { indices: vec![index], fifo: false }),
        }
    }
    groups
}
