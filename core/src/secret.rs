//! [`Secret`]: a value that must never reach a log line.
//!
//! Private keys, tokens and attestation data travel through wire types that are `Debug` for
//! convenience. Wrapping them here makes `{:?}` print only their length, so a stray
//! `tracing::debug!(?request)` cannot leak key material.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A string whose content is redacted from `Debug` output; serialises transparently.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret string.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself; call only where it is used, never to log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes redacted>)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let secret = Secret::new("-----BEGIN PRIVATE KEY-----abc");
        let shown = format!("{secret:?}");
        assert!(!shown.contains("PRIVATE"), "{shown}");
        assert!(shown.contains("30 bytes"), "{shown}");
    }

    #[test]
    fn serialises_as_a_plain_string() {
        let secret = Secret::new("tok");
        assert_eq!(serde_json::to_string(&secret).unwrap(), "\"tok\"");
        let back: Secret = serde_json::from_str("\"tok\"").unwrap();
        assert_eq!(back.expose(), "tok");
    }
}
