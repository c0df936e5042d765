//! Variables that start `SQS_ONCE_` and are no setting: each taken for the
//! setting it most likely stands for, and refused at start when that one
//! decides what runs once.

use super::{ConfigError, settings::ALL};

/// Words of unknown names that make them look like a setting of where
/// claims are kept, what makes a key, or where failures go: ignored, such a
/// name would change what runs once without a word, so the start stops.
const DECISIVE_WORDS: &[&str] = &["TABLE", "STORE", "KEY", "IDEMPOTENCY", "DLQ", "DEAD", "LETTER"];

/// An `SQS_ONCE_*` variable that is no setting, and the setting it most
/// likely stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unknown {
    pub(super) name: String,
    pub(super) meant: &'static str,
}

impl Unknown {
    /// The names among `names` that start `SQS_ONCE_` and are neither a
    /// setting nor among `own` (a handler's own settings), each with the
    /// setting it most likely stands for: one a letter or two off (a typo),
    /// else the one that shares the most words with it and has the fewest
    /// words of its own besides, the nearest in letters among those.
    pub(super) fn among(names: impl Iterator<Item = String>, own: &[&str]) -> Vec<Self> {
        names
            .filter(|name| name.starts_with("SQS_ONCE_") && !own.contains(&name.as_str()))
            .filter(|name| !ALL.iter().any(|setting| setting.name == name))
            .filter_map(|name| {
                let likeness = |setting: &&'static str| {
                    let distance = edit_distance(&name, setting);
                    let shared = words(setting).filter(|word| words(&name).any(|ours| ours == *word)).count();
                    let besides = words(setting).count() - shared;
                    (distance <= 2, shared, std::cmp::Reverse(besides), std::cmp::Reverse(distance))
                };
                let meant = ALL.iter().map(|setting| setting.name).max_by_key(likeness)?;
                Some(Self { name, meant })
            })
            .collect()
    }

    /// Whether it looks like a store, key or dead-letter setting: a word of
    /// [`DECISIVE_WORDS`], or a letter or two off a setting that has one.
    pub(super) fn decides(&self) -> bool {
        let decisive = |name: &str| words(name).any(|word| DECISIVE_WORDS.contains(&word));
        decisive(&self.name) || (edit_distance(&self.name, self.meant) <= 2 && decisive(self.meant))
    }

    /// Why the start stops.
    pub(super) fn refusal(self) -> ConfigError {
        // Leaked once, by a start that fails: the error names the variable as it was set.
        let name: &'static str = Box::leak(self.name.into_boxed_str());
        let value = std::env::var(name).unwrap_or_default();
        let expected = format!(
            "no such variable: it is not a setting of sqs-once, and looks like one that decides where claims are \
             kept, what makes a key or where failures go, which ignored would change what runs once. Did you mean \
             {}? Rename or unset it (a handler's own setting: declare it with Builder::handler_settings)",
            self.meant
        );
        ConfigError { name, value, expected }
    }
}

/// The words of a variable's name after `SQS_ONCE_`.
fn words(name: &str) -> impl Iterator<Item = &str> {
    name.strip_prefix("SQS_ONCE_").unwrap_or(name).split('_').filter(|word| !word.is_empty())
}

/// Levenshtein distance: letters inserted, deleted or replaced.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, a) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, b) in b.iter().enumerate() {
            let replaced = diagonal + usize::from(a != *b);
            diagonal = row[j + 1];
            row[j + 1] = replaced.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_name_is_taken_for_the_setting_it_most_likely_meant_and_a_decisive_one_stops_the_start() {
        let names = [
            "SQS_ONCE_KEYS",
            "SQS_ONCE_TABEL",
            "SQS_ONCE_TABLE_NAME",
            "SQS_ONCE_IDEMPOTENCY_KEY",
            "SQS_ONCE_DLQ",
            "SQS_ONCE_CONCURENCY",
            "SQS_ONCE_PAYMENT_URL",
            "SQS_ONCE_KEY",
            "SQS_ONCE_ORDERS_TABLE",
            "AWS_REGION",
        ];
        let unknown = Unknown::among(names.into_iter().map(String::from), &["SQS_ONCE_ORDERS_TABLE"]);
        let taken: Vec<(&str, &str, bool)> =
            unknown.iter().map(|unknown| (unknown.name.as_str(), unknown.meant, unknown.decides())).collect();
        assert_eq!(
            taken,
            [
                ("SQS_ONCE_KEYS", "SQS_ONCE_KEY", true),
                ("SQS_ONCE_TABEL", "SQS_ONCE_TABLE", true),
                ("SQS_ONCE_TABLE_NAME", "SQS_ONCE_TABLE", true),
                ("SQS_ONCE_IDEMPOTENCY_KEY", "SQS_ONCE_KEY", true),
                ("SQS_ONCE_DLQ", "SQS_ONCE_DLQ_URL", true),
                ("SQS_ONCE_CONCURENCY", "SQS_ONCE_CONCURRENCY", false),
                ("SQS_ONCE_PAYMENT_URL", "SQS_ONCE_QUEUE_URL", false),
            ],
            "a setting, a handler's own declared name and another prefix are left alone"
        );
        let refusal = unknown[2].clone().refusal();
        assert_eq!(refusal.name, "SQS_ONCE_TABLE_NAME");
        assert!(refusal.expected.contains("Did you mean SQS_ONCE_TABLE?"), "{refusal}");
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
