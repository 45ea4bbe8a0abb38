//! The nsqlookupd client: `GET /lookup?topic=` on the shared HTTP client (keep-alive, time
//! limits), answers capped at the client's 4 MiB.

use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue, ACCEPT, USER_AGENT};
use hyper::Method;
use serde::Deserialize;

use super::error::Error;
use crate::http::HttpClient;

#[derive(Debug, Deserialize)]
struct LookupBody {
    #[serde(default)]
    producers: Vec<Producer>,
    /// nsqlookupd before 1.0 wrapped the answer in `{"status_code", "data"}`.
    data: Option<Box<LookupBody>>,
}

#[derive(Debug, Deserialize)]
struct Producer {
    broadcast_address: String,
    tcp_port: u16,
}

/// Splits a configured lookupd address (`host:port` or `http://host:port[/...]`) into the
/// `host:port` to connect to and the `Host` header.
///
/// # Errors
///
/// [`Error::Config`] for an empty address or an `https://` one.
pub(crate) fn parse_address(addr: &str) -> Result<String, Error> {
    let bad = |reason: &str| Error::Config {
        field: "lookupd_http_addresses",
        reason: format!("{addr:?}: {reason}"),
    };
    let rest = if let Some(rest) = addr.strip_prefix("http://") {
        rest
    } else if addr.starts_with("https://") {
        return Err(bad("https is not supported; use http://host:port"));
    } else if let Some((scheme, _)) = addr.split_once("://") {
        return Err(bad(&format!(
            "the scheme {scheme:?} is not supported; use host:port or http://host:port"
        )));
    } else {
        addr
    };
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    // Add the default port when none is given (an IPv6 literal ends with `]`).
    match authority.rfind(':') {
        Some(i) if !authority[i..].contains(']') => {
            let port_ok = authority[i + 1..].parse::<u16>().is_ok_and(|port| port > 0);
            if i == 0 || !port_ok {
                return Err(bad(
                    "expected host:port or http://host:port, such as 127.0.0.1:4161",
                ));
            }
            Ok(authority.to_string())
        }
        _ => Ok(format!("{authority}:80")),
    }
}

/// Asks nsqlookupd `addr` which nsqd have `topic`, returning their `host:port` TCP addresses.
/// An unknown topic yields an empty list.
///
/// # Errors
///
/// [`Error::Lookupd`] for connection failures, timeouts, non-200 answers other than
/// `TOPIC_NOT_FOUND`, oversized or malformed responses; [`Error::Config`] for a bad address.
pub(crate) async fn lookup(
    client: &HttpClient,
    addr: &str,
    topic: &str,
) -> Result<Vec<String>, Error> {
    let authority = parse_address(addr)?;
    let fail = |reason: String| Error::Lookupd {
        addr: addr.to_string(),
        reason,
    };
    let url = format!(
        "http://{authority}/lookup?topic={}",
        crate::percent::encode_query(topic)
    )
    .parse()
    .map_err(|e| fail(format!("cannot form a URL: {e}")))?;
    let headers: [(HeaderName, HeaderValue); 2] = [
        (
            ACCEPT,
            HeaderValue::from_static("application/vnd.nsq; version=1.0"),
        ),
        (
            USER_AGENT,
            HeaderValue::from_static(super::identify::USER_AGENT),
        ),
    ];
    let (status, body) = client
        .send(Method::GET, &url, &headers, Bytes::new())
        .await
        .map_err(|e| fail(e.to_string()))?;
    if status.as_u16() == 404 {
        return Ok(Vec::new());
    }
    if !status.is_success() {
        return Err(fail(format!(
            "HTTP status {status}: {}",
            String::from_utf8_lossy(&body)
        )));
    }
    let parsed: LookupBody =
        serde_json::from_slice(&body).map_err(|e| fail(format!("bad JSON: {e}")))?;
    let parsed = match parsed.data {
        Some(inner) => *inner,
        None => parsed,
    };
    Ok(parsed
        .producers
        .into_iter()
        .map(|p| {
            if p.broadcast_address.contains(':') && !p.broadcast_address.starts_with('[') {
                format!("[{}]:{}", p.broadcast_address, p.tcp_port)
            } else {
                format!("{}:{}", p.broadcast_address, p.tcp_port)
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        assert_eq!(parse_address("127.0.0.1:4161").unwrap(), "127.0.0.1:4161");
        assert_eq!(
            parse_address("http://127.0.0.1:4161").unwrap(),
            "127.0.0.1:4161"
        );
        assert_eq!(
            parse_address("http://lookupd:4161/").unwrap(),
            "lookupd:4161"
        );
        assert_eq!(parse_address("http://lookupd").unwrap(), "lookupd:80");
        assert_eq!(parse_address("[::1]:4161").unwrap(), "[::1]:4161");
        assert!(parse_address("https://x:1").is_err());
        assert!(parse_address("http://").is_err());
        assert!(parse_address("lookupd:").is_err());
    }

    #[test]
    fn reads_both_lookup_shapes() {
        let new: LookupBody = serde_json::from_str(r#"{"channels":[],"producers":[{"broadcast_address":"127.0.0.1","tcp_port":4150,"http_port":4151,"version":"1.3.0"}]}"#).unwrap();
        assert_eq!(new.producers.len(), 1);
        let old: LookupBody = serde_json::from_str(r#"{"status_code":200,"status_txt":"OK","data":{"producers":[{"broadcast_address":"h","tcp_port":1}]}}"#).unwrap();
        assert_eq!(old.data.unwrap().producers[0].tcp_port, 1);
    }

    /// A stand-in for nsqlookupd's `/lookup`: topic `t` is on 127.0.0.1:4150, any other topic
    /// is unknown (404, as nsqlookupd answers). One request per connection.
    async fn lookupd() -> tokio::net::TcpListener {
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()
    }

    async fn answer(listener: tokio::net::TcpListener) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let head = String::from_utf8_lossy(&request);
            let (status, body) = if head.starts_with("GET /lookup?topic=t ") {
                (
                    "200 OK",
                    r#"{"channels":[],"producers":[{"broadcast_address":"127.0.0.1","tcp_port":4150,"http_port":4151}]}"#,
                )
            } else {
                ("404 Not Found", r#"{"message":"TOPIC_NOT_FOUND"}"#)
            };
            let answer = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    }

    #[tokio::test]
    async fn reads_producers_and_unknown_topics_and_names_a_lookupd_that_is_down() {
        let listener = lookupd().await;
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(answer(listener));
        let client = HttpClient::new(&crate::http::HttpClientConfig {
            request_timeout: std::time::Duration::from_secs(2),
            ..Default::default()
        })
        .unwrap();
        let plain = addr.to_string();
        let url = format!("http://{addr}");
        let producers = vec!["127.0.0.1:4150".to_owned()];
        assert_eq!(lookup(&client, &plain, "t").await.unwrap(), producers);
        assert_eq!(lookup(&client, &url, "t").await.unwrap(), producers);
        assert!(lookup(&client, &url, "unknown").await.unwrap().is_empty());
        server.abort();
        let _ = server.await;
        let err = lookup(&client, &url, "t").await.unwrap_err();
        assert!(matches!(err, Error::Lookupd { .. }), "{err}");
        assert!(err.to_string().contains(&url), "{err}");
    }
}
