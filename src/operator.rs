//! What an on-call engineer does with claims: find stuck and failed work, and
//! let one message be processed again or mark it done by hand.
//!
//! Every change is conditioned on the state the operator saw, so acting on a
//! claim that moved on in the meantime is refused, never applied blindly.

use std::{sync::Arc, time::Duration};

use crate::{
    store::{ClaimAdmin, ClaimQuery, ClaimStore, Fenced, Listing, StoreError},
    store::{ClaimStatus, StoredClaim},
};
use sqs_once_core::{clock::Clock, store::OutboxQuery};

/// What an operator's command on one claim came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Done; the text says what was done.
    Done(String),
    /// No claim has that key.
    NotFound,
    /// Not done; the text says why.
    Refused(String),
}

/// Claims, as an operator sees them.
pub(crate) struct Operator {
    store: Arc<dyn ClaimStore>,
    admin: Arc<dyn ClaimAdmin>,
    clock: Arc<dyn Clock>,
    expires_after: Duration,
}

impl std::fmt::Debug for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator").field("expires_after", &self.expires_after).finish_non_exhaustive()
    }
}

impl Operator {
    /// Operations on `store`; claims completed by hand are remembered for
    /// `expires_after`. A store that offers no listing ([`Capabilities::admin`](crate::store::Capabilities::admin))
    /// is refused.
    pub(crate) fn new(
        store: Arc<dyn ClaimStore>,
        clock: Arc<dyn Clock>,
        expires_after: Duration,
    ) -> Result<Self, StoreError> {
        let admin = Arc::clone(&store).capabilities().admin.ok_or_else(|| {
            StoreError::Unsupported(
                "this claim store offers no listing of its claims (ClaimStore::capabilities: admin)".into(),
            )
        })?;
        Ok(Self { store, admin, clock, expires_after })
    }

    /// The current time, for `--stale` listings.
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Claims matching `query`.
    pub(crate) async fn list(&self, query: &ClaimQuery) -> Result<Listing, StoreError> {
        self.admin.list(query).await
    }

    /// The claim stored as `id`.
    pub(crate) async fn show(&self, id: &str) -> Result<Option<StoredClaim>, StoreError> {
        self.store.get(id).await
    }

    /// The claim made by the delivery with SQS message id `message_id`.
    /// Failed claims are looked up first, as the DynamoDB store's index
    /// serves them; claims in progress and completed ones after, each of
    /// which on DynamoDB reads the whole table.
    pub(crate) async fn find_by_message_id(&self, message_id: &str) -> Result<Option<StoredClaim>, StoreError> {
        for status in [ClaimStatus::Failed, ClaimStatus::InProgress, ClaimStatus::Completed].map(Some) {
            let query =
                ClaimQuery { status, message_id: Some(message_id.to_owned()), limit: 1, ..ClaimQuery::default() };
            if let Some(claim) = self.admin.list(&query).await?.claims.into_iter().next() {
                return Ok(Some(claim));
            }
        }
        Ok(None)
    }

    /// Deletes a failed or stale claim so that a redelivery runs again. A live
    /// lease (someone is running it) and a completed claim (it would run twice)
    /// are refused unless `force`.
    pub(crate) async fn release(&self, id: &str, force: bool) -> Result<Verdict, StoreError> {
        let Some(seen) = self.store.get(id).await? else { return Ok(Verdict::NotFound) };
        if let Some(reason) = self.busy(&seen).filter(|_| !force) {
            return Ok(Verdict::Refused(format!("{reason}; pass --force to release it anyway")));
        }
        let done = format!("released {id} (was {}); its next delivery runs the handler", describe(&seen));
        Ok(self.applied(self.admin.replace_seen(Some(&seen), None).await?, done))
    }

    /// The claims `selection` picks, oldest first: those a cause left
    /// failed, or in progress with their lease ended, by reason and time.
    pub(crate) async fn select(&self, selection: &Selection) -> Result<Vec<StoredClaim>, StoreError> {
        let now_ms = self.clock.now_ms();
        let stale = selection.status == ClaimStatus::InProgress;
        let query = ClaimQuery {
            status: Some(selection.status),
            stale_at_ms: stale.then_some(now_ms),
            limit: usize::MAX,
            ..ClaimQuery::default()
        };
        let mut claims = self.admin.list(&query).await?.claims;
        claims.retain(|claim| selection.picks(claim));
        Ok(claims)
    }

    /// Releases each of `claims` as it was listed, so that its next delivery
    /// runs again: one that changed since (completed, or claimed again) is
    /// left alone. Returns how many were released and why the others were
    /// not.
    pub(crate) async fn release_each(&self, claims: &[StoredClaim]) -> (usize, Vec<(String, String)>) {
        let mut released = 0;
        let mut left = Vec::new();
        for claim in claims {
            match self.admin.replace_seen(Some(claim), None).await {
                Ok(Fenced::Applied) => released += 1,
                Ok(Fenced::Refused) => left.push((claim.id.clone(), "it changed since it was listed".to_owned())),
                Err(error) => left.push((claim.id.clone(), error.to_string())),
            }
        }
        (released, left)
    }

    /// Marks a key completed by hand (the work was done elsewhere), so that
    /// deliveries until it expires are duplicates. A live lease is refused
    /// unless `force`; a key with no claim gets a completed one.
    pub(crate) async fn complete(&self, id: &str, force: bool) -> Result<Verdict, StoreError> {
        let seen = self.store.get(id).await?;
        if let Some(seen) = &seen {
            if seen.status == ClaimStatus::Completed {
                return Ok(Verdict::Done(format!("{id} was already completed")));
            }
            if let Some(reason) = self.busy(seen).filter(|_| !force) {
                return Ok(Verdict::Refused(format!("{reason}; pass --force to complete it anyway")));
            }
        }
        let now_ms = self.clock.now_ms();
        let completed = StoredClaim {
            id: id.to_owned(),
            status: ClaimStatus::Completed,
            expires_at_s: now_ms / 1000 + self.expires_after.as_secs(),
            lease_until_ms: None,
            token: Some(format!("operator-{now_ms}")),
            holder: Some("operator".into()),
            attempt: seen.as_ref().and_then(|seen| seen.attempt),
            message_id: seen.as_ref().and_then(|seen| seen.message_id.clone()),
            claimed_at_ms: Some(seen.as_ref().and_then(|seen| seen.claimed_at_ms).unwrap_or(now_ms)),
            updated_at_ms: Some(now_ms),
            payload_hash: seen.as_ref().and_then(|seen| seen.payload_hash.clone()),
            result: None,
            error: None,
        };
        let was = seen.as_ref().map_or("no claim".to_owned(), describe);
        let done = format!("completed {id} by hand (was {was}); deliveries are duplicates until it expires");
        Ok(self.applied(self.admin.replace_seen(seen.as_ref(), Some(&completed)).await?, done))
    }

    /// Drops the outbox entry `id` (its stored id or its outbox id) that an
    /// operator gives up on: its message is never sent. Only with `force`;
    /// the entry, message and all, is logged as it goes, so that it can be
    /// sent by hand. A sender that took the entry over meanwhile refuses it.
    pub(crate) async fn drop_outbox(&self, id: &str, force: bool) -> Result<Verdict, StoreError> {
        let outbox = Arc::clone(&self.store).capabilities().outbox.ok_or_else(|| {
            StoreError::Unsupported("this claim store keeps no outbox (ClaimStore::capabilities: outbox)".into())
        })?;
        let entries = outbox.entries(&OutboxQuery { due_at_ms: None, limit: usize::MAX }).await?;
        let found = match entries.into_iter().find(|entry| entry.id == id || entry.outbox_id() == id) {
            Some(entry) => {
                Some((entry.id.clone(), entry.token.clone(), serde_json::to_string(&entry).unwrap_or_default()))
            }
            // An entry this version cannot read is dropped by its stored id, as stored.
            None => outbox.unreadable(usize::MAX).await?.into_iter().find(|entry| entry.id == id).map(|entry| {
                let content = format!("an entry this version cannot read ({})", entry.reason);
                (entry.id, entry.token, content)
            }),
        };
        let Some((id, token, content)) = found else {
            return Ok(Verdict::NotFound);
        };
        if !force {
            return Ok(Verdict::Refused(format!(
                "dropping an outbox entry gives its message up for good; pass --force to drop it: {content}"
            )));
        }
        Ok(match outbox.entry_sent(&id, &token).await? {
            Fenced::Applied => {
                tracing::warn!(%id, entry = %content, "outbox entry dropped by an operator: its message is not sent");
                Verdict::Done(format!("dropped {id}; its message is not sent: {content}"))
            }
            Fenced::Refused => Verdict::Refused("a sender took the entry over just now; look again".into()),
        })
    }

    /// Why changing `claim` by hand could do harm, if it could.
    fn busy(&self, claim: &StoredClaim) -> Option<String> {
        match claim.status {
            ClaimStatus::InProgress if !claim.is_stale(self.clock.now_ms()) => Some(format!(
                "{} holds a live lease on it until {}",
                claim.holder.as_deref().unwrap_or("another invocation"),
                claim.lease_until_ms.map(timestamp).unwrap_or_else(|| "its expiry".into())
            )),
            ClaimStatus::Completed => Some("it completed; releasing it lets the handler run again".into()),
            _ => None,
        }
    }

    fn applied(&self, fenced: Fenced, done: String) -> Verdict {
        match fenced {
            Fenced::Applied => Verdict::Done(done),
            Fenced::Refused => Verdict::Refused("the claim changed since it was read; look again".into()),
        }
    }
}

/// Which claims a bulk release picks: those of `status` (failed, or in
/// progress with their lease ended), whose failure reason holds `reason`,
/// last changed within `since_ms..=until_ms` (epoch milliseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Selection {
    pub(crate) status: ClaimStatus,
    pub(crate) reason: Option<String>,
    pub(crate) since_ms: Option<u64>,
    pub(crate) until_ms: Option<u64>,
}

impl Selection {
    fn picks(&self, claim: &StoredClaim) -> bool {
        let changed_ms = claim.updated_at_ms.or(claim.claimed_at_ms).unwrap_or(0);
        let reason = claim.error.as_deref().unwrap_or_default();
        self.reason.as_ref().is_none_or(|text| reason.contains(text.as_str()))
            && self.since_ms.is_none_or(|since| changed_ms >= since)
            && self.until_ms.is_none_or(|until| changed_ms <= until)
    }
}

/// A time as `--since` and `--until` take it, in epoch milliseconds: an
/// ISO 8601 UTC time to the second (`2026-11-28T10:00:00Z`, as listings
/// print them) or an age before `now_ms` (`90s`, `30m`, `2h`, `1d`).
pub(crate) fn time_given(text: &str, now_ms: u64) -> Option<u64> {
    let text = text.trim();
    let unit_ms = match text.chars().last()? {
        's' => Some(1_000),
        'm' => Some(60_000),
        'h' => Some(3_600_000),
        'd' => Some(86_400_000),
        _ => None,
    };
    if let Some(unit_ms) = unit_ms {
        let count: u64 = text[..text.len() - 1].parse().ok()?;
        return Some(now_ms.saturating_sub(count.saturating_mul(unit_ms)));
    }
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let number = |part: Option<&str>| part?.parse::<i64>().ok();
    let mut date = date.split('-');
    let (year, month, day) = (number(date.next())?, number(date.next())?, number(date.next())?);
    let mut time = time.split(':');
    let (hour, minute, second) = (number(time.next())?, number(time.next())?, number(time.next())?);
    let valid = (1..=12).contains(&month) && (1..=31).contains(&day) && hour < 24 && minute < 60 && second < 60;
    if !valid || date.next().is_some() || time.next().is_some() {
        return None;
    }
    // Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm), as `timestamp` reverses.
    let year = year - i64::from(month <= 2);
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    u64::try_from(((days * 86_400 + hour * 3_600 + minute * 60 + second) * 1_000).max(0)).ok()
}

fn describe(claim: &StoredClaim) -> String {
    match (claim.status, &claim.error) {
        (ClaimStatus::Failed, Some(error)) => format!("FAILED: {error}"),
        (status, _) => status.as_str().to_owned(),
    }
}

/// Epoch milliseconds as an ISO 8601 UTC time, to the second.
pub(crate) fn timestamp(epoch_ms: u64) -> String {
    let seconds = epoch_ms / 1000;
    let (days, time) = (seconds / 86_400, seconds % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", time / 3600, time % 3600 / 60, time % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use sqs_once_core::clock::SystemClock;
    use sqs_once_engine::testing::{ClaimRequest, Claims};

    #[test]
    fn timestamps_are_utc_seconds() {
        assert_eq!(timestamp(1_700_000_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn times_are_given_as_listings_print_them_or_as_ages() {
        let now_ms = 1_700_000_000_000;
        for at_ms in [0, 951_782_400_000, now_ms, 4_102_444_800_000] {
            assert_eq!(time_given(&timestamp(at_ms), now_ms), Some(at_ms), "{}", timestamp(at_ms));
        }
        assert_eq!(time_given("2h", now_ms), Some(now_ms - 7_200_000));
        assert_eq!(time_given("90s", now_ms), Some(now_ms - 90_000));
        assert_eq!(time_given("1d", now_ms), Some(now_ms - 86_400_000));
        for wrong in ["", "2w", "h", "2023-11-14", "2023-13-14T22:13:20Z", "2023-11-14T22:13Z", "yesterday"] {
            assert_eq!(time_given(wrong, now_ms), None, "{wrong}");
        }
    }

    #[tokio::test]
    async fn a_bulk_release_picks_by_status_reason_and_time_and_leaves_what_changed_since() {
        use std::sync::Arc;

        let store = Arc::new(MemoryStore::default());
        let admin = Arc::clone(&store).capabilities().admin.unwrap();
        let failed = |id: &str, error: &str, at_ms: u64| StoredClaim {
            id: id.into(),
            status: ClaimStatus::Failed,
            expires_at_s: u64::MAX / 2000,
            lease_until_ms: None,
            token: Some(format!("t-{id}")),
            holder: None,
            attempt: Some(1),
            message_id: Some(format!("m-{id}")),
            claimed_at_ms: Some(at_ms),
            updated_at_ms: Some(at_ms),
            payload_hash: None,
            result: None,
            error: Some(error.into()),
        };
        let missing = "the handler's table `charges` does not exist";
        for claim in [failed("a", missing, 1_000), failed("b", missing, 5_000), failed("c", "card declined", 5_000)] {
            assert_eq!(admin.replace_seen(None, Some(&claim)).await.unwrap(), Fenced::Applied);
        }
        let operator = Operator::new(store, Arc::new(SystemClock), std::time::Duration::from_secs(3600)).unwrap();
        let selection = |since_ms| Selection {
            status: ClaimStatus::Failed,
            reason: Some("`charges`".into()),
            since_ms,
            until_ms: None,
        };
        let ids = |claims: &[StoredClaim]| claims.iter().map(|claim| claim.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&operator.select(&selection(None)).await.unwrap()), ["a", "b"], "by reason");
        let picked = operator.select(&selection(Some(2_000))).await.unwrap();
        assert_eq!(ids(&picked), ["b"], "and by time");
        // `b` fails again with another token after it was listed: left alone.
        let again = StoredClaim { token: Some("t-again".into()), ..picked[0].clone() };
        assert_eq!(admin.replace_seen(Some(&picked[0]), Some(&again)).await.unwrap(), Fenced::Applied);
        let (released, left) = operator.release_each(&picked).await;
        assert_eq!((released, left.len()), (0, 1), "{left:?}");
        let (released, left) = operator.release_each(&operator.select(&selection(None)).await.unwrap()).await;
        assert_eq!((released, left), (2, vec![]));
        assert_eq!(ids(&operator.select(&selection(None)).await.unwrap()), Vec::<String>::new());
        assert_eq!(operator.show("c").await.unwrap().unwrap().status, ClaimStatus::Failed, "another cause's stays");
    }

    #[tokio::test]
    async fn a_claim_is_found_by_its_message_id() {
        use std::{sync::Arc, time::Duration};

        let store = Arc::new(MemoryStore::default());
        let request = ClaimRequest {
            id: "orders#o-1",
            body: "{}",
            deadline_ms: u64::MAX / 2,
            holder: "h",
            attempt: 1,
            message_id: "m-7",
        };
        Claims::new(store.clone()).claim(&request).await.unwrap();
        let operator = Operator::new(store, Arc::new(SystemClock), Duration::from_secs(3600)).unwrap();
        assert_eq!(operator.find_by_message_id("m-7").await.unwrap().unwrap().id, "orders#o-1");
        assert!(operator.find_by_message_id("m-8").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn releasing_nothing_is_not_found_and_completing_by_hand_is_done() {
        use std::sync::Arc;

        let operator = Operator::new(
            Arc::new(MemoryStore::default()),
            Arc::new(SystemClock),
            std::time::Duration::from_secs(3600),
        )
        .unwrap();
        assert_eq!(operator.release("orders#o-1", false).await.unwrap(), Verdict::NotFound);
        assert!(matches!(operator.complete("orders#o-1", false).await.unwrap(), Verdict::Done(_)));
    }
}
