//! Secret-bearing values as they may be printed: in logs, errors, status lines and `Debug`.
//!
//! One rule for every place settings are shown: a URL's user info and query values, every
//! header value and every secret (AUTH secrets, keys) are replaced by [`REDACTED`]. What is
//! left (scheme, host, port, path, header names) says which setting is meant without saying
//! what it holds. Logs are shipped to shared systems; a secret in them is a leaked secret.

/// What stands in for a secret wherever it would be printed.
pub(crate) const REDACTED: &str = "<redacted>";

/// `text`, a URL or an address (`http://user:pass@host/path?token=x`), as it may be printed:
/// user info and query values replaced by [`REDACTED`], and any fragment too.
pub(crate) fn url(text: &str) -> String {
    let (scheme, rest) = match text.find("://") {
        Some(at) => text.split_at(at + 3),
        None => ("", text),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, rest) = rest.split_at(authority_end);
    let mut out = String::with_capacity(text.len());
    out.push_str(scheme);
    match authority.rfind('@') {
        Some(at) => {
            out.push_str(REDACTED);
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let (before_fragment, fragment) = match rest.find('#') {
        Some(at) => (&rest[..at], Some(())),
        None => (rest, None),
    };
    match before_fragment.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let params = query.split('&').map(|param| match param.split_once('=') {
                Some((name, _)) => format!("{name}={REDACTED}"),
                None if param.is_empty() => String::new(),
                None => REDACTED.to_owned(),
            });
            out.push_str(&params.collect::<Vec<_>>().join("&"));
        }
        None => out.push_str(before_fragment),
    }
    if fragment.is_some() {
        out.push('#');
        out.push_str(REDACTED);
    }
    out
}

/// Several URLs, each through [`url`], separated by `, `.
#[cfg(feature = "sidecar")]
pub(crate) fn urls<'a>(texts: impl IntoIterator<Item = &'a str>) -> String {
    texts.into_iter().map(url).collect::<Vec<_>>().join(", ")
}

/// HTTP headers as they may be printed: the names, each value [`REDACTED`].
#[cfg(feature = "sidecar")]
pub(crate) struct Headers<'a>(pub &'a [(hyper::header::HeaderName, hyper::header::HeaderValue)]);

#[cfg(feature = "sidecar")]
impl std::fmt::Debug for Headers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(name, _)| (name.as_str(), REDACTED)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_where_and_lose_what() {
        assert_eq!(
            url("https://user:pass@host:8443/x?token=abc&v"),
            "https://<redacted>@host:8443/x?token=<redacted>&<redacted>"
        );
        assert_eq!(url("http://host/x"), "http://host/x");
        assert_eq!(url("https://u:p@h/x"), "https://<redacted>@h/x");
        assert_eq!(url("https://u@h"), "https://<redacted>@h");
        assert_eq!(url("u:p@h:4161"), "<redacted>@h:4161");
        assert_eq!(url("h:4161"), "h:4161");
        assert_eq!(
            url("http://h/p?a=1&b=2"),
            "http://h/p?a=<redacted>&b=<redacted>"
        );
        assert_eq!(url("http://h/p?"), "http://h/p?");
        assert_eq!(url("http://h/p#frag"), "http://h/p#<redacted>");
        // A path's `@` is not user info.
        assert_eq!(url("http://h/a@b"), "http://h/a@b");
    }

    #[cfg(feature = "sidecar")]
    #[test]
    fn a_list_of_urls_loses_each_one_s_secrets() {
        assert_eq!(
            urls(["http://u:p@a/", "http://b/"]),
            "http://<redacted>@a/, http://b/"
        );
    }

    #[cfg(feature = "sidecar")]
    #[test]
    fn headers_show_names_only() {
        let headers = [(
            hyper::header::AUTHORIZATION,
            hyper::header::HeaderValue::from_static("Bearer s3cret"),
        )];
        assert_eq!(
            format!("{:?}", Headers(&headers)),
            r#"{"authorization": "<redacted>"}"#
        );
    }
}
