//! What sqs-once promises, judged against what the simulated world did:
//!
//! - a run's staged writes apply at most once, ever: across expiry, TTL
//!   and DynamoDB's token window;
//! - a key's writes apply again only by a run that decided to apply them
//!   (claimed, or judged the key free) after the last application, once
//!   that application's completion had expired: never by a run that
//!   decided before it (a commit kept and sent again late);
//! - never by a record the queue delivered again because its last delivery
//!   ended without a deletion (reported failed: `uncommitted`, a conflict,
//!   retryable; or held past its visibility timeout) while the key's last
//!   application was decided and remembered, whenever the queue brings it
//!   back (a visibility timeout of hours, a back-off, a failed visibility
//!   change), however short the key memory; a redrive from the dead-letter
//!   queue after the key memory may run it again, as documented;
//! - a run reported failed (anything but `uncommitted`, whose commit may
//!   still land) never has its writes applied, and a run reported processed
//!   has them;
//! - no outcome contradicts the table while the key is remembered: a key
//!   reported processed or a duplicate is completed, one reported failed
//!   before is failed;
//! - every message of a run that committed is sent, within a bound of its
//!   commit or of the faults' healing (a sending lease and a scheduled
//!   sweep), whether or not traffic goes on; none of a run that did not
//!   commit; a run's messages in the order they were staged; and a message
//!   twice only when a process died or froze while its send or deletion was
//!   under way, its send's answer was lost, or its deletion failed;
//! - a FIFO group's messages apply in the order they were sent;
//! - the outbox empties itself, and the queue drains;
//! - no finishing write is sent while an earlier send of it waits for its
//!   answer (checked as it happens, by the world's link).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::Duration,
};

use super::{
    ledger::{Ledger, RunInfo},
    table::Application,
    workload::{Spec, message_body},
    world::World,
};
use crate::{
    claim::SENDING_LEASE,
    report::{Failure, Outcome},
};
use sqs_once_core::{
    clock::duration_ms,
    store::{ClaimStatus, ClaimStore},
};

/// Every invariant the world broke, described.
pub(super) async fn invariants(world: &World, drained: bool) -> Vec<String> {
    let mut violations = Vec::new();
    if !drained {
        violations.push(format!(
            "the queue did not drain: {:?}, a timeout of {:?}",
            world.scenario.queue, world.scenario.timeout
        ));
    }
    let applications = world.table.applications();
    let mut run_items: BTreeMap<u64, u64> = world
        .table
        .items("runs")
        .into_iter()
        .filter_map(|item| Some((item["run"].as_u64()?, item["n"].as_u64().unwrap_or(0))))
        .collect();
    // A run that kept its key in the item wrote no run item: each of its applications counts.
    let mut kept_runs: BTreeMap<u64, u64> = BTreeMap::new();
    for application in applications.iter().filter(|application| !run_items.contains_key(&application.run)) {
        *kept_runs.entry(application.run).or_default() += 1;
    }
    run_items.extend(kept_runs);
    let unsent = world.table.unsent();
    let mut statuses = HashMap::new();
    let keys: BTreeSet<String> = world.ledger.lock().reports.iter().filter_map(|report| report.key.clone()).collect();
    let specs = world.specs();
    let kept_in: HashMap<String, &str> =
        specs.iter().filter_map(|spec| Some((format!("sim#{}", spec.id), spec.kept_in()?))).collect();
    // A key kept in its item has no claim: the item says it completed while it keeps it.
    let memory = world.scenario.kept_key_memory();
    for key in keys {
        // The item, where it keeps the key, says what the key came to: a claim beside it may be a run's in
        // progress, or a completion lost after the item applied (its lease ends it).
        let kept = kept_in.get(&key).is_some_and(|pk| world.table.keeps_in_item(&key, pk, memory));
        let status = match kept {
            true => Some(ClaimStatus::Completed),
            false => world.table.get(&key).await.ok().flatten().map(|claim| claim.status),
        };
        statuses.insert(key, status);
    }

    let mut ledger = world.ledger.lock();
    ledger.stats.applied_runs = run_items.len() as u64;
    for (run, times) in &run_items {
        if *times > 1 {
            violations.push(format!("the writes of run {run} applied {times} times"));
        }
    }
    violations.extend(reapplications(&applications));
    let window = world.scenario.queue.redelivered_within();
    let (back, back_violations) = applied_again_when_back(&ledger, &applications, window);
    violations.extend(back_violations);
    ledger.stats.back_after_applied += back;
    let runs: HashMap<(&str, &str), &RunInfo> =
        ledger.runs.iter().map(|run| ((run.holder.as_str(), run.key.as_str()), run)).collect();
    let mut succeeded = BTreeSet::new();
    for report in &ledger.reports {
        let Some(key) = &report.key else { continue };
        let run = runs.get(&(report.holder.as_str(), key.as_str()));
        let run_applied = run.is_some_and(|run| run_items.contains_key(&run.id));
        // Once the key's finished claim was forgotten (deleted by TTL, replaced once expired), the table no
        // longer says what it said when the batch answered.
        let status = statuses.get(key).copied().flatten();
        // A key kept in its item is forgotten once the item's windows have passed it; a claim in progress beside
        // it says nothing of it (a run's under way, or a completion lost after the item applied: the item is what
        // says the key's effect applied, and the claim's lease ends it).
        let forgotten_in_item =
            kept_in.contains_key(key.as_str()) && matches!(status, None | Some(ClaimStatus::InProgress));
        let judged = !world.table.forgotten_since(key, report.batch_started_ms) && !forgotten_in_item;
        let what = format!("{} ({key}) in {}", report.message_id, report.holder);
        match &report.outcome {
            // An uncommitted run's commit may still land; a skipped record did not run (a record of its key that
            // did, earlier in the batch, reports its own outcome).
            Outcome::Failed(Failure::Uncommitted { .. } | Failure::GroupSkipped(_)) => {}
            Outcome::Failed(failure) => {
                if run_applied {
                    violations.push(format!("{what}: reported {} but its run's writes applied", failure.label()));
                }
                if matches!(failure, Failure::FailedBefore(_)) && judged && status != Some(ClaimStatus::Failed) {
                    violations.push(format!("{what}: reported failed before, and the claim is {status:?}"));
                }
            }
            Outcome::Processed { confirmed } => {
                succeeded.insert(key.clone());
                let staged = run.is_some_and(|run| run.spec.staged.is_some());
                if staged && !run_applied {
                    violations.push(format!("{what}: reported processed but its run's writes did not apply"));
                }
                if *confirmed && judged && status != Some(ClaimStatus::Completed) {
                    violations.push(format!("{what}: reported processed, and the claim is {status:?}"));
                }
            }
            Outcome::Duplicate => {
                succeeded.insert(key.clone());
                if judged && status != Some(ClaimStatus::Completed) {
                    violations.push(format!("{what}: reported a duplicate, and the claim is {status:?}"));
                }
            }
        }
    }
    for spec in &specs {
        let key = format!("sim#{}", spec.id);
        let applied = applications.iter().any(|application| application.key == key);
        if spec.staged.is_some() && succeeded.contains(&key) && !applied {
            violations.push(format!("{key} succeeded, and its writes never applied"));
        }
    }
    violations.extend(progress(world, &ledger, &specs, &succeeded, &applications));
    violations.extend(sends(world, &mut ledger, &applications));
    violations.extend(group_order(world, &applications));
    if !unsent.is_empty() {
        let bodies: Vec<&str> = unsent.iter().map(|entry| entry.message.body.as_str()).collect();
        violations.push(format!("the outbox still holds {} entries: {}", unsent.len(), bodies.join(", ")));
    }
    violations
}

/// The other half of the promise: what is delivered often enough is
/// committed. Once the faults healed, nothing but the world's drawn
/// settings (its key memory, its queue's clocks, its consumers' ways of
/// committing) stands between a record and its commit, so every record of
/// the tail succeeds (none left to the dead-letter queue) and every one
/// that staged writes has them applied.
fn progress(
    world: &World,
    ledger: &Ledger,
    specs: &[Spec],
    succeeded: &BTreeSet<String>,
    applications: &[Application],
) -> Vec<String> {
    let mut violations = Vec::new();
    for spec in specs.iter().filter(|spec| spec.id.starts_with("tail-")) {
        let key = format!("sim#{}", spec.id);
        if world.out_of_order(&spec.id.replacen("tail-", "t-", 1)) || !succeeded.contains(&key) {
            let last = ledger.reports.iter().rev().find(|report| report.key.as_deref() == Some(key.as_str()));
            let last = last.map_or_else(|| "none".to_owned(), |report| format!("{:?}", report.outcome));
            violations.push(format!("{key}, sent once the faults healed, never succeeded (its last outcome: {last})"));
        } else if spec.staged.is_some() && !applications.iter().any(|application| application.key == key) {
            violations.push(format!("{key}, sent once the faults healed, succeeded and its writes never applied"));
        }
    }
    violations
}

/// A key's writes applied again by a run that decided before the last
/// application, or while it was still remembered.
fn reapplications(applications: &[Application]) -> Vec<String> {
    let mut last: HashMap<&str, &Application> = HashMap::new();
    let mut violations = Vec::new();
    for application in applications {
        if let Some(before) = last.get(application.key.as_str()) {
            if application.decided_ms <= before.applied_ms {
                violations.push(format!(
                    "the writes of {} applied again by run {}, which decided at {} ms, before run {} applied them at \
                     {} ms",
                    application.key, application.run, application.decided_ms, before.run, before.applied_ms
                ));
            } else if application.applied_ms / 1000 <= before.expires_at_s {
                violations.push(format!(
                    "the writes of {} applied again by run {} at {} ms, while run {}'s completion was remembered \
                     (until {} s)",
                    application.key, application.run, application.applied_ms, before.run, before.expires_at_s
                ));
            }
        }
        last.insert(&application.key, application);
    }
    violations
}

/// The applications of a key's writes by a run of a record the queue
/// delivered again after a delivery of it that met an earlier application
/// (received before that run's lease ended, ended after the run decided:
/// the run's own delivery, or one that met its lease as a conflict). What
/// the framework promises (docs/guarantees.md): the earlier application is
/// remembered until its lease's end and twice the redelivery `window` after
/// it, so that the framework's own redelivery, received by then, finds it. A
/// redelivery received later (held in a backlog no consumer reached, or
/// redriven) may run again: the documented choice. Returns how many such
/// records there were (the check means something only where there are) and
/// the violations.
fn applied_again_when_back(ledger: &Ledger, applications: &[Application], window: Duration) -> (u64, Vec<String>) {
    let run_ids: HashMap<(&str, &str), u64> =
        ledger.runs.iter().map(|run| ((run.holder.as_str(), run.key.as_str()), run.id)).collect();
    let applied_by: HashMap<u64, &Application> =
        applications.iter().map(|application| (application.run, application)).collect();
    let promised_ms = |application: &Application| application.lease_until_ms + 2 * duration_ms(window);
    let mut back = 0;
    let mut short = BTreeSet::new();
    let mut violations = Vec::new();
    for report in &ledger.reports {
        let (Some(key), Some(ended)) = (&report.key, report.back_after) else { continue };
        let met = |application: &&Application| {
            application.key == *key
                && ended.received_ms <= application.lease_until_ms
                && application.decided_ms <= ended.ended_ms
        };
        let earlier: Vec<&Application> = applications.iter().filter(met).collect();
        if earlier.is_empty() {
            continue;
        }
        back += 1;
        for before in &earlier {
            if before.expires_at_s * 1000 < promised_ms(before) && short.insert(before.run) {
                violations.push(format!(
                    "run {}'s completion of {key} is remembered until {} s, short of its lease's end ({} ms) and \
                     twice the redelivery window ({window:?})",
                    before.run, before.expires_at_s, before.lease_until_ms
                ));
            }
        }
        let Some(run) = run_ids.get(&(report.holder.as_str(), key.as_str())) else { continue };
        let Some(applied) = applied_by.get(run) else { continue };
        let within = |before: &&&Application| report.batch_started_ms <= promised_ms(before);
        for before in earlier.iter().filter(|before| before.run != applied.run).filter(within) {
            violations.push(format!(
                "the writes of {key} applied again by run {}, for {} received again at {} ms, back from the queue \
                 after its delivery received at {} ms ended at {} ms, which met run {} (decided at {} ms, its lease \
                 until {} ms, remembered until {} s)",
                applied.run,
                report.message_id,
                report.batch_started_ms,
                ended.received_ms,
                ended.ended_ms,
                before.run,
                before.decided_ms,
                before.lease_until_ms,
                before.expires_at_s
            ));
        }
    }
    (back, violations)
}

/// Every message of a committed run sent, within the bound, in the run's
/// order; none of a run that did not commit; none twice unexcused.
fn sends(world: &World, ledger: &mut Ledger, applications: &[Application]) -> Vec<String> {
    let first_sent: HashMap<&str, (usize, u64)> =
        ledger.first_sent.iter().enumerate().map(|(at, (body, at_ms))| (body.as_str(), (at, *at_ms))).collect();
    let committed_ms: HashMap<u64, u64> =
        applications.iter().map(|application| (application.run, application.applied_ms)).collect();
    let healed_ms = world.healed_ms.load(std::sync::atomic::Ordering::SeqCst);
    // A sending lease for the sender that stopped, or the longest retry time of a send that failed before the
    // faults healed, then the next scheduled sweep, and its own time.
    let waits = SENDING_LEASE.max(crate::outbox::retry_after(u32::MAX));
    let bound_ms = duration_ms(waits + world.scenario.schedule_every) + 60_000;
    let mut violations = Vec::new();
    let mut send_ms = Vec::new();
    for run in &ledger.runs {
        let committed = committed_ms.get(&run.id).copied();
        let messages = run.spec.staged.as_ref().map_or(0, |staged| staged.messages);
        let bodies: Vec<String> = (0..messages).map(|n| message_body(run.id, n)).collect();
        for (n, body) in bodies.iter().enumerate() {
            let sent = ledger.sends.get(body).copied().unwrap_or(0);
            match (committed, sent) {
                (Some(_), 0) => violations.push(format!("{body}: committed and never sent")),
                (None, 1..) => violations.push(format!("{body}: sent {sent} times, and its run never committed")),
                (Some(_), 2..) if !ledger.excused.contains(body) => {
                    violations.push(format!("{body}: sent {sent} times by senders that never stopped"))
                }
                _ => {}
            }
            let Some(&(at, sent_ms)) = first_sent.get(body.as_str()) else { continue };
            if let Some(committed_ms) = committed {
                send_ms.push(sent_ms.saturating_sub(committed_ms));
            }
            if let Some(committed_ms) = committed
                && sent_ms > committed_ms.max(healed_ms) + bound_ms
            {
                let waited_s = (sent_ms - committed_ms.max(healed_ms)) / 1000;
                violations.push(format!("{body}: sent {waited_s} s after its commit, or the faults' healing"));
            }
            if let Some(earlier) = n.checked_sub(1).map(|n| &bodies[n])
                && first_sent.get(earlier.as_str()).is_none_or(|&(earlier_at, _)| earlier_at > at)
            {
                violations.push(format!("{body}: sent before {earlier}, which its run staged first"));
            }
        }
    }
    ledger.stats.send_ms[usize::from(!world.scenario.tail)] = send_ms;
    violations
}

/// The keys of a FIFO group applied out of the order their messages were
/// sent (of the keys one message alone carries, another's may come from
/// another group; and of the messages not dead-lettered: SQS's order ends
/// there, and the group goes on without it).
fn group_order(world: &World, applications: &[Application]) -> Vec<String> {
    let scenario = &world.scenario;
    if scenario.groups == 0 {
        return Vec::new();
    }
    let first_applied: HashMap<&str, usize> =
        applications.iter().enumerate().rev().map(|(at, application)| (application.key.as_str(), at)).collect();
    let mut violations = Vec::new();
    for group in 0..scenario.groups {
        let mut last: Option<(&str, usize)> = None;
        let specs = scenario.messages.iter().enumerate().filter(|(n, _)| n % scenario.groups == group);
        for (n, &spec) in specs {
            if scenario.messages.iter().filter(|&&other| other == spec).count() > 1
                || world.out_of_order(&format!("m-{n}"))
            {
                continue;
            }
            let key = format!("sim#{}", scenario.specs[spec].id);
            let Some(&at) = first_applied.get(key.as_str()) else { continue };
            if let Some((before, before_at)) = last
                && before_at > at
            {
                violations.push(format!("group g-{group}: {key} applied before {before}, which was sent first"));
            }
            last = Some((applications[at].key.as_str(), at));
        }
    }
    violations
}
