//! The key at a JSON pointer, found while parsing, without building the document.
//!
//! `json:/id` keys used to parse each body into a `serde_json::Value`, look the pointer up and
//! print the value: every string of the body allocated, every object became a map, all to keep
//! one field. Here the parser walks the body once; the value at the pointer is written as
//! compact JSON straight from the parser (a string or number without becoming a `Value`; an
//! object or array through one), and every other value is parsed and dropped as it goes,
//! without allocating.
//!
//! The answer is the one `serde_json::from_slice::<Value>(body)?.pointer(pointer)` printed
//! compactly gives, for every body: the whole body is still parsed with the same rules (one
//! JSON value, nothing after it, numbers in range, valid escapes), so a body is JSON here
//! exactly when it was before; a key that occurs twice in an object takes its last value, as
//! `Value`'s map does; and array indices follow `Value::pointer` (digits, no leading zero). The
//! property test below holds the two to the same answers.

use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

/// The compact JSON of the value at `pointer` (RFC 6901, starting with `/`) in the JSON
/// document `body`, or `None` when there is none or it is `null`.
///
/// # Errors
///
/// The parser's error when `body` is not one JSON value.
pub(crate) fn key_at(body: &[u8], pointer: &str) -> Result<Option<Vec<u8>>, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    if !pointer.is_empty() && !pointer.starts_with('/') {
        // Not a pointer (`KeySpec`'s parser refuses it; its variant can still be built by
        // hand): nothing is there, as `Value::pointer` says, once the body is known to be JSON.
        Skip::deserialize(&mut deserializer)?;
        deserializer.end()?;
        return Ok(None);
    }
    let found = At { rest: pointer }.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(match found {
        Some(Found::Json(json)) => Some(json),
        Some(Found::Null) | None => None,
    })
}

/// A value at the pointer: `null`, or any other value as compact JSON.
enum Found {
    Null,
    Json(Vec<u8>),
}

/// Compact JSON of `value`, as `Value`'s `Display` writes it.
fn compact<T: serde::Serialize + ?Sized>(value: &T) -> Found {
    Found::Json(serde_json::to_vec(value).expect("a parsed JSON value serializes"))
}

/// The first reference token of `rest` (which starts with `/`), unescaped, and what follows it.
fn split_token(rest: &str) -> (std::borrow::Cow<'_, str>, &str) {
    let after_slash = &rest[1..];
    let (token, rest) = match after_slash.find('/') {
        Some(end) => (&after_slash[..end], &after_slash[end..]),
        None => (after_slash, ""),
    };
    let token = if token.contains('~') {
        std::borrow::Cow::Owned(token.replace("~1", "/").replace("~0", "~"))
    } else {
        std::borrow::Cow::Borrowed(token)
    };
    (token, rest)
}

/// An array index as `Value::pointer` reads one: decimal digits, no sign, no leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

/// Parses one value and yields what `rest` points to inside it.
struct At<'p> {
    rest: &'p str,
}

impl<'de> DeserializeSeed<'de> for At<'_> {
    type Value = Option<Found>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        if self.rest.is_empty() {
            return deserializer.deserialize_any(Capture).map(Some);
        }
        let (token, rest) = split_token(self.rest);
        deserializer.deserialize_any(Step {
            token: &token,
            rest,
        })
    }
}

/// One step of the pointer: `token` names a member or an element, `rest` goes on inside it.
struct Step<'t, 'p> {
    token: &'t str,
    rest: &'p str,
}

impl<'de> Visitor<'de> for Step<'_, '_> {
    type Value = Option<Found>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(is_token) = map.next_key_seed(KeyIs(self.token))? {
            if is_token {
                // A later member of the same name replaces an earlier one, as in `Value`.
                found = map.next_value_seed(At { rest: self.rest })?;
            } else {
                map.next_value::<Skip>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let wanted = array_index(self.token);
        let mut found = None;
        let mut index = 0;
        loop {
            if Some(index) == wanted {
                match seq.next_element_seed(At { rest: self.rest })? {
                    Some(value) => found = value,
                    None => break,
                }
            } else if seq.next_element::<Skip>()?.is_none() {
                break;
            }
            index += 1;
        }
        Ok(found)
    }

    // A scalar has no members: nothing is at the pointer.
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// The value at the pointer, written as compact JSON from what the parser hands over; an
/// object or array becomes a `Value` first, so that its members are ordered and deduplicated
/// as `Value` orders them.
struct Capture;

impl<'de> Visitor<'de> for Capture {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Found, A::Error> {
        Ok(compact(&Value::deserialize(MapAccessDeserializer::new(
            map,
        ))?))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Found, A::Error> {
        Ok(compact(&Value::deserialize(SeqAccessDeserializer::new(
            seq,
        ))?))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Found, E> {
        Ok(compact(&v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Found, E> {
        Ok(compact(&v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Found, E> {
        Ok(compact(&v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Found, E> {
        // `Value` keeps a finite float as a number and anything else as null; the parser hands
        // over only finite ones.
        Ok(if v.is_finite() {
            compact(&v)
        } else {
            Found::Null
        })
    }
    fn visit_str<E>(self, v: &str) -> Result<Found, E> {
        Ok(compact(v))
    }
    fn visit_unit<E>(self) -> Result<Found, E> {
        Ok(Found::Null)
    }
}

/// Whether an object's key is the pointer's token, decided on the parser's borrowed text.
struct KeyIs<'t>(&'t str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

/// A value parsed as `Value` would parse it (numbers converted, so one out of range is an
/// error as it is there; strings unescaped), and dropped. `serde::de::IgnoredAny` is not enough: it only
/// checks the syntax of numbers.
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Skip, D::Error> {
        deserializer.deserialize_any(SkipVisitor)
    }
}

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = Skip;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_key::<IgnoredKey>()?.is_some() {
            map.next_value::<Skip>()?;
        }
        Ok(Skip)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
}

/// An object key, unescaped and dropped.
struct IgnoredKey;

impl<'de> Deserialize<'de> for IgnoredKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<IgnoredKey, D::Error> {
        deserializer.deserialize_str(IgnoredKeyVisitor)
    }
}

struct IgnoredKeyVisitor;

impl<'de> Visitor<'de> for IgnoredKeyVisitor {
    type Value = IgnoredKey;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, _: &str) -> Result<IgnoredKey, E> {
        Ok(IgnoredKey)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What the whole-document parse says: the reference.
    fn reference(body: &[u8], pointer: &str) -> Result<Option<Vec<u8>>, ()> {
        let value: Value = serde_json::from_slice(body).map_err(|_| ())?;
        Ok(match value.pointer(pointer) {
            Some(Value::Null) | None => None,
            Some(value) => Some(value.to_string().into_bytes()),
        })
    }

    fn same(body: &str, pointer: &str) {
        assert_eq!(
            key_at(body.as_bytes(), pointer).map_err(|_| ()),
            reference(body.as_bytes(), pointer),
            "body {body:?}, pointer {pointer:?}"
        );
    }

    #[test]
    fn agrees_with_the_whole_document_on_the_edges() {
        for (body, pointer) in [
            (r#"{"id":1}"#, "/id"),
            (r#"{"id":"a\u0041"}"#, "/id"),
            (r#"{"id":1,"id":2}"#, "/id"),
            (r#"{"id":{"x":1},"id":3}"#, "/id/x"),
            (r#"{"id":1,"x":1e400}"#, "/id"),
            (r#"{"id":1,"x":"\ud800"}"#, "/id"),
            (r#"{"id":1} x"#, "/id"),
            (r#"{"id":1}  "#, "/id"),
            (r#"{"a/b":1,"m~n":2}"#, "/a~1b"),
            (r#"{"a/b":1,"m~n":2}"#, "/m~0n"),
            (r#"{"a":[10,20,30]}"#, "/a/1"),
            (r#"{"a":[10,20,30]}"#, "/a/01"),
            (r#"{"a":[10,20,30]}"#, "/a/+1"),
            (r#"{"a":[10,20,30]}"#, "/a/3"),
            (r#"{"a":[10,[1,2],30]}"#, "/a/1/0"),
            (r#"{"a":{"":5}}"#, "/a/"),
            (r#"{"id":null}"#, "/id"),
            (r#"[1,2]"#, "/0"),
            (r#""text""#, "/id"),
            (r#"{"id":1.0,"n":-0}"#, "/id"),
            (r#"{"id":{"b":1,"a":[true,null]}}"#, "/id"),
            (r#"{"id":{"b":1,"b":2,"a":"\u00e9\t"}}"#, "/id"),
            (r#"{"id":"x","id":null}"#, "/id"),
            (r#"{"id":[1,2.5e3,-7,"\""]}"#, "/id"),
            (r#"{"id":-12}"#, "/id"),
            (r#"{"id":12.0}"#, "/id"),
            (r#"{"id":1e-7}"#, "/id"),
            (r#"{"id":false}"#, "/id"),
            (r#"{"id":1"#, "/id"),
            ("", "/id"),
            (r#"{"id":1}"#, "id"),
            (r#"{"éd":1}"#, "éd"),
            (r#"{"id":1"#, "id"),
            (r#"{"id":1}"#, ""),
        ] {
            same(body, pointer);
        }
    }

    /// JSON text, sometimes with duplicate keys, escapes, odd numbers and whitespace.
    fn json_text() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| format!("{f:e}")),
            Just("1e400".to_owned()),
            Just("-0.0".to_owned()),
            "[a-c]{0,3}".prop_map(|s| format!("\"{s}\"")),
            Just(r#""\u0061\n\"""#.to_owned()),
        ];
        leaf.prop_recursive(4, 40, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec(
                    (
                        prop_oneof![Just("a"), Just("b"), Just("a/b"), Just("~")],
                        inner
                    ),
                    0..5
                )
                .prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(k, v)| format!("{:?} : {v}", k))
                        .collect();
                    format!("{{ {} }}", members.join(", "))
                }),
            ]
        })
    }

    fn pointer() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                Just("a"),
                Just("b"),
                Just("a~1b"),
                Just("~0"),
                Just("0"),
                Just("1"),
                Just("01"),
                Just("")
            ],
            1..4,
        )
        .prop_map(|tokens| tokens.iter().map(|t| format!("/{t}")).collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Same answer as parsing the whole document, for valid and damaged bodies.
        #[test]
        fn agrees_with_the_whole_document(
            body in json_text(),
            cut in any::<prop::sample::Index>(),
            damage in any::<bool>(),
            pointer in pointer(),
        ) {
            let body = if damage {
                let end = cut.index(body.len() + 1);
                body[..end].to_owned()
            } else {
                body
            };
            prop_assert_eq!(
                key_at(body.as_bytes(), &pointer).map_err(|_| ()),
                reference(body.as_bytes(), &pointer),
                "body {:?}, pointer {:?}", body, pointer
            );
        }
    }
}
