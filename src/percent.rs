//! Percent-encoding of URL parts (RFC 3986 section 2.1): decoding user info and passwords
//! typed into URLs, encoding query values this program puts into URLs.

/// `%XX` escapes decoded (user info may escape `:`, `@` and `/`); anything else, a `%` without
/// two hexadecimal digits included, is kept as it is.
pub(crate) fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `text` as a query value: unreserved characters as they are, every other byte `%XX`.
#[cfg(feature = "nsq")]
pub(crate) fn encode_query(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_round_trip_and_stray_percents_stay() {
        assert_eq!(decode("s%40cret%3A%2f"), "s@cret:/");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%4"), "%4");
        assert_eq!(decode("%zz"), "%zz");
        assert_eq!(encode_query("a b&c/é"), "a%20b%26c%2F%C3%A9");
        assert_eq!(decode(&encode_query("a b&c/é")), "a b&c/é");
    }
}
