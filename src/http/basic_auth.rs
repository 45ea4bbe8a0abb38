//! A URL's user info (`https://user:pass@host/`) as HTTP basic authentication, as Go's HTTP
//! client (and so `nsq_to_http`) sends it: the request goes to the URL without its user info,
//! with `Authorization: Basic base64(user:pass)` unless the headers set one already. The
//! secret then never reaches hyper, whose logs name the connection pool by its authority.

use hyper::header::HeaderValue;
use hyper::http::uri::{Authority, Uri};

/// `url` without its user info, and the basic authorization header it stands for; `None`
/// when `url` has no user info.
pub(crate) fn split(url: &Uri) -> Option<(Uri, HeaderValue)> {
    let authority = url.authority()?.as_str();
    let (user_info, host) = authority.rsplit_once('@')?;
    let mut parts = url.clone().into_parts();
    parts.authority = Some(Authority::try_from(host).ok()?);
    let bare = Uri::from_parts(parts).ok()?;
    let (user, password) = user_info.split_once(':').unwrap_or((user_info, ""));
    let credentials = format!(
        "{}:{}",
        crate::percent::decode(user),
        crate::percent::decode(password)
    );
    let mut value =
        HeaderValue::try_from(format!("Basic {}", base64(credentials.as_bytes()))).ok()?;
    value.set_sensitive(true);
    Some((bare, value))
}

/// Standard base64 with padding (RFC 4648 section 4).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn user_info_becomes_a_basic_header() {
        let url: Uri = "https://Aladdin:open%20sesame@host:8443/x?y=1"
            .parse()
            .unwrap();
        let (bare, value) = split(&url).unwrap();
        assert_eq!(bare.to_string(), "https://host:8443/x?y=1");
        assert_eq!(value, "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
        assert!(split(&"http://host/x".parse().unwrap()).is_none());
    }
}
