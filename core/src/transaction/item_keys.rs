//! The key kept in the business item: a run without a claim whose one
//! effect is one update of one item, and no message, commits as that update
//! alone, which records the run's key in the item and is refused when the
//! item holds it already. No claim, no completion, no transaction: one
//! conditional `UpdateItem`, a write unit for an item under 1 KB.
//!
//! An item keeps the keys of two windows of the key memory: those of the
//! window under way ([`KEYS`], begun at [`KEYS_SINCE`]) and those of the one
//! before ([`KEYS_BEFORE`]). A commit made a key memory or more after the
//! item's window began (or to an item that keeps no keys yet) begins a new
//! one: the keys of the window under way become those before, and older
//! ones go. A key is so kept at least a key memory after its commit, and at
//! most two, and an item never holds more than two windows of keys, at most
//! [`MAX_KEYS_PER_WINDOW`] each. Keys are kept as digests
//! ([`KeyInItem::digest_of`]), 24 characters each.
//!
//! Every writer of an item judges windows by its own key memory: a writer
//! with a shorter one begins windows sooner, so that the memory an item
//! keeps is its shortest writer's, as a completion's is its own writer's.

use std::{collections::BTreeSet, time::Duration};

use sha2::{Digest, Sha256};

use crate::clock::duration_ms;

/// The item's keys of the window under way: a string set.
pub const KEYS: &str = "sqs_once_keys";

/// The item's keys of the window before: a string set.
pub const KEYS_BEFORE: &str = "sqs_once_keys_before";

/// When the item's window under way began, epoch milliseconds.
pub const KEYS_SINCE: &str = "sqs_once_keys_since";

/// The attributes an item keeps its keys in, which no staged write may
/// name.
pub const KEY_ATTRIBUTES: [&str; 3] = [KEYS, KEYS_BEFORE, KEYS_SINCE];

/// What the window before holds when the window a commit closes held no key
/// (an item that kept none yet): DynamoDB keeps no empty set. No digest is
/// ever this.
pub const NO_KEY: &str = "-";

/// The most keys one window of an item holds: a commit that would add one
/// more is refused until the window turns, a key memory after it began
/// (`Committed::WindowFull`). An
/// item's keys so take at most 2 × 256 × 24 bytes, 12 KB.
pub const MAX_KEYS_PER_WINDOW: usize = 256;

/// The room a kept key takes in its item, as DynamoDB counts a set's
/// element: its digest's bytes.
pub const KEY_BYTES: usize = 24;

/// The room an item's keys may take at most: two full windows, the
/// attributes' names and the window's start.
pub(crate) const KEYS_ROOM: usize =
    2 * MAX_KEYS_PER_WINDOW * KEY_BYTES + KEYS.len() + KEYS_BEFORE.len() + KEYS_SINCE.len() + 21;

/// A commit whose one write records the run's key in its item, in place of
/// a claim and its completion ([`Commit::key_in_item`](crate::store::Commit::key_in_item)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInItem {
    /// What the item keeps of the key ([`Self::digest_of`]).
    pub digest: String,
    /// When the commit was made, epoch milliseconds: a window begun at or
    /// before `now_ms - memory_ms` is over.
    pub now_ms: u64,
    /// The key memory: how long the window under way lasts, at least.
    pub memory_ms: u64,
}

/// An item's keys, as a store read them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ItemKeys {
    /// The keys of the window under way.
    pub current: BTreeSet<String>,
    /// The keys of the window before.
    pub before: BTreeSet<String>,
    /// When the window under way began; `None` for an item that keeps no
    /// keys.
    pub since_ms: Option<u64>,
}

/// What an item's keys say of a commit that keeps its key there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InItem {
    /// The item holds the key, remembered still: the run's effect applied
    /// before.
    Duplicate,
    /// The key goes into the window under way, begun less than a key memory
    /// ago.
    SameWindow,
    /// The key begins the next window: the window under way, begun a key
    /// memory ago or more but less than two, becomes the one before; the
    /// one before goes.
    NextWindow,
    /// The key begins a first window: the item keeps no keys, or none it
    /// remembers still (its window began two key memories ago or more).
    Fresh,
    /// The window under way holds [`MAX_KEYS_PER_WINDOW`] keys.
    Full,
    /// The window under way began a key memory or more after the commit was
    /// made ([`KeyInItem::too_late_from_ms`]), and does not hold the key:
    /// the item may have held it since and forgotten it, so nothing it
    /// keeps can refuse the commit any more. Never sent: the commit is
    /// given up, and the record's redelivery decides.
    Late,
}

impl KeyInItem {
    /// The commit of the run on the key stored as `stored_key`, made at
    /// `now_ms` under a key memory of `memory`.
    pub fn new(stored_key: &str, now_ms: u64, memory: Duration) -> Self {
        Self { digest: Self::digest_of(stored_key), now_ms, memory_ms: duration_ms(memory) }
    }

    /// What an item keeps of the key stored as `stored_key`: the first 96
    /// bits of its SHA-256, in hexadecimal. A new key reads as one the item
    /// holds with a chance of one in 2^96 for each key held.
    pub fn digest_of(stored_key: &str) -> String {
        hex::encode(&Sha256::digest(stored_key.as_bytes())[..KEY_BYTES / 2])
    }

    /// A window begun `memories` key memories before this commit, or
    /// earlier, began at or before this moment (epoch milliseconds): with
    /// `1`, the window is over (its keys are those before); with `2`, its
    /// keys are forgotten.
    pub fn memories_ago_ms(&self, memories: u64) -> u64 {
        self.now_ms.saturating_sub(memories * self.memory_ms)
    }

    /// A window begun at or after this moment (epoch milliseconds) is too
    /// late for this commit ([`InItem::Late`]): one key memory after it was
    /// made. Any other run of the key that applied after this commit was
    /// made left its key in a window begun before this moment, or in the
    /// one after that window (which holds it as its keys before); only
    /// a window begun two windows later, a key memory after this moment at
    /// the earliest, has forgotten it. So the condition a commit is sent
    /// with for the window under way holds only for a window begun before
    /// this moment, and a send held for hours (a freeze, a slow store) can
    /// never apply a second time what a redelivery applied meanwhile.
    pub fn too_late_from_ms(&self) -> u64 {
        self.now_ms.saturating_add(self.memory_ms)
    }

    /// How long after this commit a window begun at `since_ms` turns: a
    /// key memory after it began.
    pub fn window_turns_in(&self, since_ms: u64) -> Duration {
        Duration::from_millis(since_ms.saturating_add(self.memory_ms).saturating_sub(self.now_ms))
    }

    /// What `keys` (the item's, as it stands) say of this commit. A key is
    /// remembered while its window began less than two key memories ago, a
    /// key of the window before while the window after it began less than
    /// one ago: at least a key memory after it was kept, whether or not the
    /// item was written since.
    pub fn judge(&self, keys: &ItemKeys) -> InItem {
        let Some(since_ms) = keys.since_ms.filter(|&since_ms| since_ms > self.memories_ago_ms(2)) else {
            return InItem::Fresh;
        };
        let under_way = since_ms > self.memories_ago_ms(1);
        if keys.current.contains(&self.digest) || (under_way && keys.before.contains(&self.digest)) {
            return InItem::Duplicate;
        }
        if since_ms >= self.too_late_from_ms() {
            return InItem::Late;
        }
        match (under_way, keys.current.len() >= MAX_KEYS_PER_WINDOW) {
            (true, true) => InItem::Full,
            (true, false) => InItem::SameWindow,
            (false, _) => InItem::NextWindow,
        }
    }

    /// `keys` with this commit's key added as `judged` says: the item's
    /// keys once the commit applied.
    pub fn added_to(&self, keys: &ItemKeys, judged: InItem) -> ItemKeys {
        let mine = || BTreeSet::from([self.digest.clone()]);
        match judged {
            InItem::SameWindow => {
                let mut current = keys.current.clone();
                current.insert(self.digest.clone());
                ItemKeys { current, ..keys.clone() }
            }
            InItem::NextWindow => {
                ItemKeys { current: mine(), before: keys.current.clone(), since_ms: Some(self.now_ms) }
            }
            InItem::Fresh => {
                ItemKeys { current: mine(), before: BTreeSet::from([NO_KEY.to_owned()]), since_ms: Some(self.now_ms) }
            }
            InItem::Duplicate | InItem::Full | InItem::Late => keys.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(current: &[&str], before: &[&str], since_ms: Option<u64>) -> ItemKeys {
        let set = |keys: &[&str]| keys.iter().map(|key| (*key).to_owned()).collect();
        ItemKeys { current: set(current), before: set(before), since_ms }
    }

    #[test]
    fn a_digest_is_twenty_four_hexadecimal_digits_the_same_for_every_run_of_a_key() {
        let digest = KeyInItem::digest_of("sqs-once#m-1");
        assert_eq!(digest.len(), KEY_BYTES);
        assert!(digest.bytes().all(|byte| byte.is_ascii_hexdigit()));
        assert_eq!(digest, KeyInItem::digest_of("sqs-once#m-1"));
        assert_ne!(digest, KeyInItem::digest_of("sqs-once#m-2"));
        assert_ne!(digest, NO_KEY);
    }

    #[test]
    fn an_item_keeps_two_windows_of_keys_and_a_key_at_least_a_key_memory() {
        let memory = Duration::from_secs(600);
        let at = |key: &str, now_ms| KeyInItem::new(key, now_ms, memory);
        // A new item: its first window begins, with nothing before.
        let first = at("k-1", 1_000_000);
        assert_eq!(first.judge(&ItemKeys::default()), InItem::Fresh);
        let item = first.added_to(&ItemKeys::default(), InItem::Fresh);
        assert_eq!(item, keys(&[&first.digest], &[NO_KEY], Some(1_000_000)));
        // The same key again: a duplicate; another, in the same window.
        assert_eq!(at("k-1", 1_000_001).judge(&item), InItem::Duplicate);
        let second = at("k-2", 1_599_999);
        assert_eq!(second.judge(&item), InItem::SameWindow);
        let item = second.added_to(&item, InItem::SameWindow);
        // A key memory after the window began, a new one: the keys before are kept, a window more.
        let third = at("k-3", 1_600_000);
        assert_eq!(third.judge(&item), InItem::NextWindow);
        let item = third.added_to(&item, InItem::NextWindow);
        assert_eq!(item.before.len(), 2);
        assert_eq!(at("k-1", 2_199_999).judge(&item), InItem::Duplicate, "k-1 kept past its key memory still");
        // Another window on: k-1 and k-2 are gone, k-3 is kept.
        let fourth = at("k-4", 2_200_000);
        let item = fourth.added_to(&item, fourth.judge(&item));
        assert_eq!(item, keys(&[&fourth.digest], &[&third.digest], Some(2_200_000)));
        assert_eq!(at("k-1", 2_200_001).judge(&item), InItem::SameWindow, "forgotten");
        // Quiet for a key memory, the item's keys before are forgotten; for two, every key of it.
        assert_eq!(at("k-3", 2_799_999).judge(&item), InItem::Duplicate);
        assert_eq!(at("k-3", 2_800_000).judge(&item), InItem::NextWindow, "k-3 was kept a key memory");
        assert_eq!(at("k-4", 3_399_999).judge(&item), InItem::Duplicate);
        let late = at("k-4", 3_400_000);
        assert_eq!(late.judge(&item), InItem::Fresh, "k-4 was kept two key memories, every key of its window one");
        assert_eq!(late.added_to(&item, InItem::Fresh), keys(&[&late.digest], &[NO_KEY], Some(3_400_000)));
    }

    #[test]
    fn a_window_begun_a_key_memory_after_the_commit_is_too_late_for_it_unless_it_holds_the_key() {
        let memory = Duration::from_secs(60);
        let commit = KeyInItem::new("k", 100_000, memory);
        let begun = |since_ms, current: &[&str]| keys(current, &[], Some(since_ms));
        assert_eq!(commit.too_late_from_ms(), 160_000);
        assert_eq!(commit.judge(&begun(159_999, &[])), InItem::SameWindow, "begun before: the window it is sent for");
        assert_eq!(commit.judge(&begun(160_000, &[])), InItem::Late, "begun a key memory after it");
        assert_eq!(commit.judge(&begun(10_000_000, &[])), InItem::Late, "hours after");
        assert_eq!(commit.judge(&begun(160_000, &[&commit.digest])), InItem::Duplicate, "held still: applied");
        let before = keys(&[], &[&commit.digest], Some(170_000));
        assert_eq!(commit.judge(&before), InItem::Duplicate, "held in the window before");
    }

    #[test]
    fn a_full_window_refuses_another_key_until_the_window_turns() {
        let memory = Duration::from_secs(60);
        let full: Vec<String> = (0..MAX_KEYS_PER_WINDOW).map(|n| KeyInItem::digest_of(&n.to_string())).collect();
        let item = ItemKeys { current: full.into_iter().collect(), before: BTreeSet::new(), since_ms: Some(1_000) };
        assert_eq!(KeyInItem::new("new", 60_999, memory).judge(&item), InItem::Full);
        assert_eq!(KeyInItem::new("0", 60_999, memory).judge(&item), InItem::Duplicate, "a key held is a duplicate");
        assert_eq!(KeyInItem::new("new", 61_000, memory).judge(&item), InItem::NextWindow);
        assert_eq!(KeyInItem::new("new", 30_000, memory).window_turns_in(1_000), Duration::from_secs(31));
        const { assert!(KEYS_ROOM < 13_000, "two full windows of keys take 12 KB") };
    }
}
