//! The shared secret a consumer's AUTH must carry, compared in constant time.
//!
//! nsqd asks an auth server; the serve endpoint has one secret for every consumer, read from
//! a file so that it stays out of process listings and shell history.

use std::fmt;
use std::path::Path;

/// The secret AUTH must carry. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ServeSecret(Vec<u8>);

impl ServeSecret {
    /// A secret of these bytes.
    ///
    /// # Errors
    ///
    /// An empty secret, which would let any AUTH in.
    pub fn new(secret: impl Into<Vec<u8>>) -> Result<Self, String> {
        let secret = secret.into();
        if secret.is_empty() {
            return Err("the AUTH secret is empty".into());
        }
        Ok(ServeSecret(secret))
    }

    /// The secret in `path`, without its trailing line ending. The errors say what is wrong
    /// with the file, for a message that names it.
    ///
    /// # Errors
    ///
    /// The file cannot be read, or holds nothing but a line ending.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let mut text = std::fs::read(path).map_err(|error| format!("cannot be read: {error}"))?;
        while text.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            text.pop();
        }
        ServeSecret::new(text).map_err(|_| {
            "holds no secret (nothing but a line ending): write the secret consumers send with \
             AUTH"
                .to_owned()
        })
    }

    /// Whether `given` is the secret. Takes the same time for every `given` of any length
    /// (it reads as many bytes as the secret has), so a client cannot find the secret byte
    /// by byte from the answer's timing.
    pub fn matches(&self, given: &[u8]) -> bool {
        let mut diff = u8::from(given.len() != self.0.len());
        for (i, &byte) in self.0.iter().enumerate() {
            let other = given.get(i).copied().unwrap_or(!byte);
            diff |= std::hint::black_box(byte ^ other);
        }
        diff == 0
    }
}

impl fmt::Debug for ServeSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServeSecret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_secret_matches() {
        let secret = ServeSecret::new("s3cret").unwrap();
        assert!(secret.matches(b"s3cret"));
        for other in [&b""[..], b"s3cre", b"s3cret!", b"S3cret", b"s3cres"] {
            assert!(
                !secret.matches(other),
                "{:?}",
                String::from_utf8_lossy(other)
            );
        }
        assert!(ServeSecret::new("").is_err());
        assert_eq!(format!("{secret:?}"), "ServeSecret(<redacted>)");
    }

    #[test]
    fn the_file_loses_its_line_ending_only() {
        let dir = std::env::temp_dir().join(format!("serve-secret-{}", std::process::id()));
        std::fs::write(&dir, b" a b \r\n").unwrap();
        let secret = ServeSecret::from_file(&dir).unwrap();
        std::fs::write(&dir, b"\n").unwrap();
        let empty = ServeSecret::from_file(&dir).unwrap_err();
        std::fs::remove_file(&dir).unwrap();
        assert!(secret.matches(b" a b "));
        assert!(empty.contains("holds no secret"), "{empty}");
    }
}
