//! The AUTH secret, kept out of logs: its `Debug` shows only that there is one.

use bytes::Bytes;

/// The secret sent with `AUTH`. Neither `Debug` nor any error shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthSecret(Bytes);

impl AuthSecret {
    /// A secret; surrounding white space (a file's trailing newline) is not part of it.
    ///
    /// # Errors
    ///
    /// When nothing is left: nsqd refuses an empty AUTH body.
    pub fn new(text: &str) -> Result<Self, &'static str> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err("the secret is empty");
        }
        Ok(AuthSecret(Bytes::copy_from_slice(trimmed.as_bytes())))
    }

    /// The bytes sent.
    pub(crate) fn bytes(&self) -> &Bytes {
        &self.0
    }
}

impl std::fmt::Debug for AuthSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthSecret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_secret() {
        let secret = AuthSecret::new("hunter2\n").unwrap();
        assert_eq!(secret.bytes().as_ref(), b"hunter2");
        assert!(!format!("{secret:?}").contains("hunter2"));
        assert!(AuthSecret::new(" \n").is_err());
    }
}
