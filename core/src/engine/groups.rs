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
    envelope::Opened,
    event::EventRecord,
    lock::lock,
    report::{Failure, Outcome, RecordReport},
};

impl Engine {
    /// Runs one message group in order; a standard queue's record is a group
    /// of its own. After a failure in a FIFO group the rest is skipped.
    pub(super) async fn run_group<'a>(
        &self,
        records: &'a [EventRecord],
        opened: &'a [Result<Opened<'a>, Failure>],
        group: &Group,
        state: &'a BatchState,
        runs: &Runs<'a>,
    ) {
        let mut failed: Option<&str> = None;
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
            lock(&state.reports)[index] = Some(report);
        }
    }
}

/// FIFO order, whatever path each report took: after the first failed record
/// of a FIFO group, every later record of the group fails too. (A record
/// answered at the deadline from another group's run of the same key could
/// otherwise succeed after its own group's earlier record failed.)
pub(super) fn keep_group_order(groups: &[Group], reports: &mut [RecordReport]) {
    for group in groups.iter().filter(|group| group.fifo) {
        let mut failed: Option<String> = None;
        for &index in &group.indices {
            let report = &mut reports[index];
            match &failed {
                None if report.outcome.is_failure() => failed = Some(report.message_id.clone()),
                Some(first) if !report.outcome.is_failure() => {
                    report.outcome = Outcome::Failed(Failure::GroupSkipped(first.clone()));
                }
                _ => {}
            }
        }
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
