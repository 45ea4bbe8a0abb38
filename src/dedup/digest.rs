//! Content digests and the keys they are taken from.
//!
//! NSQ gives each copy of a replicated message its own ID, so copies can only be recognised by
//! content. A [`Keyer`] takes the key out of a body (the whole body, or one field of a JSON body)
//! and hashes it to a 128-bit [`Digest`]. xxh3-128 is the default: fast and well distributed.
//! MD5 is offered for compatibility with tables written by other implementations. Keyed BLAKE3
//! ([`DigestKey`]) is for bodies that untrusted parties can shape: without the key nobody can
//! predict where a body lands or make two bodies collide.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use md5::{Digest as _, Md5};

use crate::error::{KeyError, SpecError};

/// A 128-bit content digest.
///
/// The high 64 bits choose the set of a table; the low 64 bits give the fingerprint kept in a
/// slot. Tests and callers with their own hashing can build one with [`Digest::from_u128`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(u128);

impl Digest {
    /// Wraps a precomputed 128-bit value.
    pub const fn from_u128(value: u128) -> Self {
        Digest(value)
    }

    /// The 128-bit value.
    pub const fn as_u128(self) -> u128 {
        self.0
    }

    /// The high 64 bits (these pick the set).
    pub const fn hi(self) -> u64 {
        (self.0 >> 64) as u64
    }

    /// The low 64 bits (these give the fingerprint).
    pub const fn lo(self) -> u64 {
        self.0 as u64
    }

    /// Big-endian bytes.
    pub const fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// From big-endian bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Digest(u128::from_be_bytes(bytes))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({:032x})", self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// The hash function that turns a key into a [`Digest`].
///
/// Defaults to: `xxh3` with seed 0.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum DigestAlgorithm {
    /// xxh3-128 with a seed (tables built with different seeds do not share entries).
    Xxh3 {
        /// The seed.
        seed: u64,
    },
    /// MD5 (slower; for compatibility).
    Md5,
    /// BLAKE3 in keyed mode, truncated to 128 bits: unpredictable without the key.
    Blake3Keyed(DigestKey),
}

impl fmt::Debug for DigestAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Display shows the key's fingerprint, never the key.
        write!(f, "DigestAlgorithm({self})")
    }
}

/// A 32-byte key for [`DigestAlgorithm::Blake3Keyed`]. Neither `Debug` nor `Display` shows
/// it; [`DigestKey::fingerprint`] names it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DigestKey([u8; 32]);

impl DigestKey {
    /// A key from a file's contents: 32 raw bytes, or 64 hexadecimal digits (white space
    /// around them ignored).
    ///
    /// # Errors
    ///
    /// What the contents are instead, and how to make a key.
    pub fn from_file_contents(contents: &[u8]) -> Result<Self, String> {
        if let Ok(raw) = <[u8; 32]>::try_from(contents) {
            return Ok(DigestKey(raw));
        }
        let make = "make a key with `head -c 32 /dev/urandom > FILE`";
        let Some(text) = std::str::from_utf8(contents)
            .ok()
            .map(str::trim)
            .filter(|text| !text.chars().any(char::is_control))
        else {
            // Not text: a raw key of the wrong length. Its bytes are never shown.
            return Err(format!(
                "expected 32 bytes or 64 hexadecimal digits, found {} bytes; {make}",
                contents.len()
            ));
        };
        // The file is a secret: what is wrong is named by position, never by its characters.
        let not_hex: Vec<usize> = text
            .chars()
            .enumerate()
            .filter(|(_, c)| !c.is_ascii_hexdigit())
            .map(|(i, _)| i + 1)
            .collect();
        if !not_hex.is_empty() {
            let shown: Vec<String> = not_hex.iter().take(5).map(ToString::to_string).collect();
            let more = if not_hex.len() > 5 { ", ..." } else { "" };
            return Err(format!(
                "expected 32 bytes or 64 hexadecimal digits (0-9, a-f), found {} characters of \
                 which {} {} not hexadecimal ({} {}{more}); {make}",
                text.chars().count(),
                not_hex.len(),
                if not_hex.len() == 1 { "is" } else { "are" },
                if not_hex.len() == 1 {
                    "character"
                } else {
                    "characters"
                },
                shown.join(", ")
            ));
        }
        if text.len() != 64 {
            return Err(format!(
                "expected 32 bytes or 64 hexadecimal digits, found {} hexadecimal digits; {make}",
                text.len()
            ));
        }
        let mut key = [0u8; 32];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
                .expect("every character was checked to be a hexadecimal digit");
        }
        Ok(DigestKey(key))
    }

    /// Eight hexadecimal digits derived from the key (not the key, and not enough of it to
    /// guess it): tells keys apart in logs and Memcached namespaces.
    pub fn fingerprint(&self) -> String {
        let derived = blake3::derive_key("nsq-dedupe 2026 digest key fingerprint", &self.0);
        derived[..4].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DigestKey({})", self.fingerprint())
    }
}

impl Default for DigestAlgorithm {
    fn default() -> Self {
        DigestAlgorithm::Xxh3 { seed: 0 }
    }
}

impl DigestAlgorithm {
    /// Hashes `bytes`.
    #[inline]
    pub fn digest(&self, bytes: &[u8]) -> Digest {
        match *self {
            DigestAlgorithm::Xxh3 { seed: 0 } => Digest(xxhash_rust::xxh3::xxh3_128(bytes)),
            DigestAlgorithm::Xxh3 { seed } => {
                Digest(xxhash_rust::xxh3::xxh3_128_with_seed(bytes, seed))
            }
            DigestAlgorithm::Md5 => Digest::from_bytes(Md5::digest(bytes).into()),
            DigestAlgorithm::Blake3Keyed(DigestKey(key)) => {
                let hash = blake3::keyed_hash(&key, bytes);
                let mut first = [0u8; 16];
                first.copy_from_slice(&hash.as_bytes()[..16]);
                Digest::from_bytes(first)
            }
        }
    }
}

impl FromStr for DigestAlgorithm {
    type Err = SpecError;

    /// Parses `xxh3`, `xxh3:<seed>` or `md5`. Keyed BLAKE3 needs its key, so it is built with
    /// [`DigestAlgorithm::Blake3Keyed`] and a [`DigestKey`], not parsed.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "xxh3" => Ok(DigestAlgorithm::Xxh3 { seed: 0 }),
            "md5" => Ok(DigestAlgorithm::Md5),
            _ => match s.strip_prefix("xxh3:").map(str::parse::<u64>) {
                Some(Ok(seed)) => Ok(DigestAlgorithm::Xxh3 { seed }),
                _ => Err(SpecError::Digest(s.to_owned())),
            },
        }
    }
}

impl fmt::Display for DigestAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DigestAlgorithm::Xxh3 { seed: 0 } => f.write_str("xxh3"),
            DigestAlgorithm::Xxh3 { seed } => write!(f, "xxh3:{seed}"),
            DigestAlgorithm::Md5 => f.write_str("md5"),
            DigestAlgorithm::Blake3Keyed(key) => write!(f, "blake3-keyed:{}", key.fingerprint()),
        }
    }
}

/// Which part of a body is the de-duplication key.
///
/// Defaults to: `body`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KeySpec {
    /// The whole body, byte for byte.
    #[default]
    Body,
    /// One field of a JSON body, named by a JSON pointer (RFC 6901) such as `/id` or
    /// `/meta/request_id`. The key is the field's value in compact JSON, so values of different
    /// JSON types never share a key: `"1"` and `1` differ, as do `"true"` and `true`. Equal
    /// values written differently share one (`"\u0041"` and `"A"`; objects whatever the order of
    /// their members). Numbers keep their written kind: `1` and `1.0` differ.
    Json(String),
}

impl KeySpec {
    /// Takes the key out of `body`.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when the key is a JSON field and the body is not JSON or lacks the field.
    /// Callers decide what that means; the sidecar passes such bodies on as unique.
    pub fn extract<'a>(&self, body: &'a [u8]) -> Result<Cow<'a, [u8]>, KeyError> {
        match self {
            KeySpec::Body => Ok(Cow::Borrowed(body)),
            KeySpec::Json(pointer) => {
                let key =
                    super::json_key::key_at(body, pointer).map_err(|err| KeyError::NotJson {
                        pointer: pointer.clone(),
                        detail: err.to_string(),
                    })?;
                key.map(Cow::Owned).ok_or_else(|| KeyError::MissingField {
                    pointer: pointer.clone(),
                })
            }
        }
    }
}

impl FromStr for KeySpec {
    type Err = SpecError;

    /// Parses `body` or `json:<pointer>`, where the pointer starts with `/` and is valid by
    /// RFC 6901: each `~` is followed by `0` (for `~`) or `1` (for `/`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "body" {
            return Ok(KeySpec::Body);
        }
        match s.strip_prefix("json:") {
            Some(pointer) if pointer.starts_with('/') => {
                let mut escapes = pointer.split('~').skip(1);
                if escapes.any(|rest| !rest.starts_with(['0', '1'])) {
                    return Err(SpecError::Pointer(pointer.to_owned()));
                }
                Ok(KeySpec::Json(pointer.to_owned()))
            }
            _ => Err(SpecError::Key(s.to_owned())),
        }
    }
}

impl fmt::Display for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySpec::Body => f.write_str("body"),
            KeySpec::Json(pointer) => write!(f, "json:{pointer}"),
        }
    }
}

/// Turns message bodies into digests: a [`KeySpec`] plus a [`DigestAlgorithm`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keyer {
    key: KeySpec,
    algorithm: DigestAlgorithm,
}

impl Keyer {
    /// A keyer for `key` hashed with `algorithm`.
    pub fn new(key: KeySpec, algorithm: DigestAlgorithm) -> Self {
        Keyer { key, algorithm }
    }

    /// The key specification.
    pub fn key(&self) -> &KeySpec {
        &self.key
    }

    /// The digest algorithm.
    pub fn algorithm(&self) -> DigestAlgorithm {
        self.algorithm
    }

    /// The digest of `body`'s key.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when the body has no key (see [`KeySpec::extract`]).
    #[inline]
    pub fn digest(&self, body: &[u8]) -> Result<Digest, KeyError> {
        Ok(self.algorithm.digest(&self.key.extract(body)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_blake3_depends_on_the_key_and_never_shows_it() {
        let hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
        let key = DigestKey::from_file_contents(format!("{hex}\n").as_bytes()).unwrap();
        let raw: Vec<u8> = (0u8..32).collect();
        assert_eq!(DigestKey::from_file_contents(&raw).unwrap(), key);
        let keyed = DigestAlgorithm::Blake3Keyed(key);
        // The digest is the first 128 bits of BLAKE3's keyed hash.
        assert_eq!(
            &keyed.digest(b"").to_string()[..8],
            &blake3::keyed_hash(&raw.clone().try_into().unwrap(), b"").to_hex()[..8]
        );
        assert_eq!(keyed.digest(b"hello"), keyed.digest(b"hello"));
        let other = DigestAlgorithm::Blake3Keyed(DigestKey([7; 32]));
        assert_ne!(keyed.digest(b"hello"), other.digest(b"hello"));
        assert_ne!(key.fingerprint(), DigestKey([7; 32]).fingerprint());
        for shown in [format!("{keyed}"), format!("{keyed:?}"), format!("{key:?}")] {
            assert!(shown.contains(&key.fingerprint()), "{shown}");
            assert!(!shown.contains("0102030405"), "{shown}");
        }
        let error = DigestKey::from_file_contents(&[1, 2, 3, 0xff, 0]).unwrap_err();
        assert!(error.starts_with("expected 32 bytes or 64 hexadecimal digits, found 5 bytes"));
    }

    #[test]
    fn xxh3_and_md5_match_reference_values() {
        // MD5("") is the well-known d41d8cd98f00b204e9800998ecf8427e.
        let md5 = DigestAlgorithm::Md5.digest(b"");
        assert_eq!(md5.to_string(), "d41d8cd98f00b204e9800998ecf8427e");
        let a = DigestAlgorithm::default().digest(b"hello");
        assert_eq!(a, DigestAlgorithm::Xxh3 { seed: 0 }.digest(b"hello"));
        assert_ne!(a, DigestAlgorithm::Xxh3 { seed: 7 }.digest(b"hello"));
        assert_ne!(a, DigestAlgorithm::default().digest(b"hello "));
    }

    #[test]
    fn json_key_reads_the_field_and_reports_missing_ones() {
        let keyer = Keyer::new("json:/id".parse().unwrap(), DigestAlgorithm::default());
        let one = keyer.digest(br#"{"id":"x1","ts":1}"#).unwrap();
        let two = keyer.digest(br#"{"ts":2, "id": "x1"}"#).unwrap();
        assert_eq!(one, two, "same id, different other fields");
        assert_ne!(one, keyer.digest(br#"{"id":"x2"}"#).unwrap());
        assert_eq!(
            keyer.digest(br#"{"other":1}"#).unwrap_err().to_string(),
            "body has no field at JSON pointer `/id` of the key `json:/id`"
        );
        let err = keyer.digest(b"not json").unwrap_err().to_string();
        assert!(err.starts_with("body is not valid JSON ("), "{err}");
        // The key is the value's compact JSON: types never share a key.
        let key = |body: &[u8]| {
            KeySpec::Json("/id".into())
                .extract(body)
                .unwrap()
                .into_owned()
        };
        assert_eq!(key(br#"{"id":7}"#), b"7");
        assert_eq!(key(br#"{"id":"7"}"#), br#""7""#);
        assert_ne!(
            keyer.digest(br#"{"id":1}"#).unwrap(),
            keyer.digest(br#"{"id":"1"}"#).unwrap()
        );
        assert_ne!(
            keyer.digest(br#"{"id":true}"#).unwrap(),
            keyer.digest(br#"{"id":"true"}"#).unwrap()
        );
        // Equal values written differently share a key.
        assert_eq!(key(br#"{"id":"\u0041"}"#), key(br#"{"id":"A"}"#));
        assert_eq!(
            key(br#"{"id":{"a":1,"b":2}}"#),
            key(br#"{"id":{"b":2, "a":1}}"#)
        );
    }

    #[test]
    fn specs_parse_and_print() {
        for text in ["body", "json:/id", "json:/a/b"] {
            assert_eq!(text.parse::<KeySpec>().unwrap().to_string(), text);
        }
        for text in ["xxh3", "xxh3:42", "md5"] {
            assert_eq!(text.parse::<DigestAlgorithm>().unwrap().to_string(), text);
        }
        assert_eq!(
            "json:id".parse::<KeySpec>().unwrap_err().to_string(),
            "expected `body` or `json:<JSON pointer>` such as `json:/id`"
        );
        assert!("sha1".parse::<DigestAlgorithm>().is_err());
        for bad in ["json:/a~2", "json:/a~", "json:/~x/b"] {
            assert_eq!(
                bad.parse::<KeySpec>().unwrap_err().to_string(),
                "a JSON pointer escapes `~` as `~0` and `/` as `~1`; no other `~` may appear",
                "{bad}"
            );
        }
        assert_eq!(
            "json:/a~0b~1c".parse::<KeySpec>().unwrap(),
            KeySpec::Json("/a~0b~1c".into())
        );
        // An escaped pointer reads the field its name spells.
        assert_eq!(
            KeySpec::Json("/a~1b".into())
                .extract(br#"{"a/b":"x"}"#)
                .unwrap()
                .as_ref(),
            br#""x""#
        );
    }
}
