//! A record's body: the message's text, shared rather than copied.

use std::{borrow::Borrow, fmt, ops::Deref, sync::Arc};

/// The text of a [`Record`](crate::Record)'s message, shared rather than
/// copied: a payload read from S3 is held once, in the buffer it was read
/// into, by the engine and the handler's record alike, as the memory budget
/// (`SQS_ONCE_LARGE_PAYLOAD_MEMORY`) counts it. Cloning it shares it.
///
/// It reads as a `&str` wherever one is expected, compares with strings,
/// and turns into a `String` where an API takes one:
///
/// ```
/// let record = sqs_once::testing::record(r#"{"id": 7}"#);
/// let text: &str = &record.body;
/// assert_eq!(record.body, r#"{"id": 7}"#);
/// assert!(text.starts_with('{') && record.body.contains("id"));
/// let owned: String = record.body.clone().into();
/// assert_eq!(owned, text);
/// ```
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Body(Arc<String>);

impl Body {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for Body {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Body {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Body {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Takes the text as it is: no copy.
impl From<String> for Body {
    fn from(text: String) -> Self {
        Self(Arc::new(text))
    }
}

impl From<&str> for Body {
    fn from(text: &str) -> Self {
        Self::from(text.to_owned())
    }
}

/// The text, copied only while another clone shares it.
impl From<Body> for String {
    fn from(body: Body) -> Self {
        Arc::try_unwrap(body.0).unwrap_or_else(|shared| (*shared).clone())
    }
}

impl PartialEq<str> for Body {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Body {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Body {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<Body> for str {
    fn eq(&self, other: &Body) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Body> for &str {
    fn eq(&self, other: &Body) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<Body> for String {
    fn eq(&self, other: &Body) -> bool {
        self == other.as_str()
    }
}
