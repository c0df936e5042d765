//! What sqs-once promises, judged against what the simulated world did:
//!
//! - a key's staged writes apply at most once, and exactly once when a
//!   delivery of the key succeeded;
//! - a run reported failed (anything but `uncommitted`, whose commit may
//!   still land) never has its writes applied, and a run reported processed
//!   has them;
//! - no outcome contradicts the store: a key reported processed or a
//!   duplicate is completed, one reported failed before is failed;
//! - every message of a run that committed is sent, and none of a run that
//!   did not; a message is sent twice only when its send or its deletion met
//!   a fault, a freeze or a kill (its sender stopped between the two);
//! - the outbox empties itself, and the queue drains;
//! - no finishing write is sent while an earlier send of it waits for its
//!   answer (checked as it happens, by the world's store).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::world::{World, expected_bodies};
use crate::{
    lock::lock,
    report::{Failure, Outcome},
    store::{ClaimStatus, ClaimStore, OutboxQuery, OutboxStore},
};

/// Every invariant the world broke, described.
pub(super) async fn invariants(world: &World, drained: bool) -> Vec<String> {
    let mut violations = Vec::new();
    if !drained {
        violations.push("the queue did not drain".to_owned());
    }
    let applied: BTreeMap<String, u64> = world
        .store
        .items("applied")
        .into_iter()
        .map(|item| (item["pk"].as_str().unwrap_or_default().to_owned(), item["n"].as_u64().unwrap_or(0)))
        .collect();
    let applied_runs: BTreeSet<u64> =
        world.store.items("runs").into_iter().filter_map(|item| item["run"].as_u64()).collect();
    let unsent = OutboxStore::entries(&*world.store, &OutboxQuery { due_at_ms: None, limit: usize::MAX })
        .await
        .unwrap_or_default();
    let mut statuses = HashMap::new();
    let keys: BTreeSet<String> = lock(&world.ledger).reports.iter().filter_map(|report| report.key.clone()).collect();
    for key in keys {
        let status = world.store.get(&key).await.ok().flatten().map(|claim| claim.status);
        statuses.insert(key, status);
    }

    let mut ledger = lock(&world.ledger);
    ledger.stats.applied_runs = applied_runs.len() as u64;
    for (key, times) in &applied {
        if *times > 1 {
            violations.push(format!("the writes of {key} applied {times} times"));
        }
    }
    let runs: HashMap<(&str, &str), _> =
        ledger.runs.iter().map(|run| ((run.holder.as_str(), run.key.as_str()), run)).collect();
    let mut succeeded = BTreeSet::new();
    for report in &ledger.reports {
        let Some(key) = &report.key else { continue };
        let run = runs.get(&(report.holder.as_str(), key.as_str()));
        let run_applied = run.is_some_and(|run| applied_runs.contains(&run.id));
        let status = statuses.get(key).copied().flatten();
        let what = format!("{} ({key}) in {}", report.message_id, report.holder);
        match &report.outcome {
            Outcome::Failed(Failure::Uncommitted { .. }) => {}
            Outcome::Failed(failure) => {
                if run_applied {
                    violations.push(format!("{what}: reported {} but its run's writes applied", failure.label()));
                }
                if matches!(failure, Failure::FailedBefore(_)) && status != Some(ClaimStatus::Failed) {
                    violations.push(format!("{what}: reported failed before, and the claim is {status:?}"));
                }
            }
            Outcome::Processed { confirmed } => {
                succeeded.insert(key.clone());
                let staged = run.is_some_and(|run| run.spec.staged.is_some());
                if staged && !run_applied {
                    violations.push(format!("{what}: reported processed but its run's writes did not apply"));
                }
                if *confirmed && status != Some(ClaimStatus::Completed) {
                    violations.push(format!("{what}: reported processed, and the claim is {status:?}"));
                }
            }
            Outcome::Duplicate => {
                succeeded.insert(key.clone());
                if status != Some(ClaimStatus::Completed) {
                    violations.push(format!("{what}: reported a duplicate, and the claim is {status:?}"));
                }
            }
        }
    }
    for spec in &world.scenario.specs {
        let key = format!("sim#{}", spec.id);
        let times = applied.get(&spec.id).copied().unwrap_or(0);
        if spec.staged.is_some() && succeeded.contains(&key) && times != 1 {
            violations.push(format!("{key} succeeded, and its writes applied {times} times"));
        }
    }
    for run in &ledger.runs {
        let committed = applied_runs.contains(&run.id);
        for body in expected_bodies(run) {
            let sent = ledger.sends.get(&body).copied().unwrap_or(0);
            match (committed, sent) {
                (true, 0) => violations.push(format!("{body}: committed and never sent")),
                (false, 1..) => violations.push(format!("{body}: sent {sent} times, and its run never committed")),
                (true, 2..) if !ledger.disturbed.contains(&body) => {
                    violations.push(format!("{body}: sent {sent} times by senders that never stopped"))
                }
                _ => {}
            }
        }
    }
    if !unsent.is_empty() {
        let bodies: Vec<&str> = unsent.iter().map(|entry| entry.message.body.as_str()).collect();
        violations.push(format!("the outbox still holds {} entries: {}", unsent.len(), bodies.join(", ")));
    }
    violations
}
