//! Why something failed, as it is stored, logged and sent: a failure's reason.
//!
//! A handler's error text can be any size (a whole response body, a dump of
//! a request). Stored whole it could push a failure record over DynamoDB's
//! 400 KB item limit, and sent whole as a dead-letter attribute over SQS's
//! 1 MiB message limit, losing the very failure it explains. Every reason is
//! therefore capped, with the cut marked.

use std::borrow::Cow;

/// The longest reason kept, in bytes of UTF-8.
pub const MAX_BYTES: usize = 2048;

/// `text` cut to [`MAX_BYTES`] on a character boundary, with how much was
/// cut said at its end.
pub fn capped(text: &str) -> Cow<'_, str> {
    if text.len() <= MAX_BYTES {
        return Cow::Borrowed(text);
    }
    // The marker's own length depends on the number it holds: reserve enough for any.
    let room = MAX_BYTES - " … [18446744073709551615 more bytes cut]".len();
    let end = (0..=room).rev().find(|end| text.is_char_boundary(*end)).unwrap_or(0);
    Cow::Owned(format!("{} … [{} more bytes cut]", &text[..end], text.len() - end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_reason_is_capped_on_a_character_boundary() {
        assert_eq!(capped("timed out"), "timed out");
        let long = "é".repeat(MAX_BYTES);
        let cut = capped(&long);
        assert!(
            cut.len() <= MAX_BYTES
                && cut.ends_with(&format!("[{} more bytes cut]", long.len() - cut.find(" …").unwrap()))
        );
    }
}
