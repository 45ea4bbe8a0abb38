//! A minimal nsqlookupd client: `GET /lookup?topic=` over HTTP/1.1 on a plain `TcpStream`.
//!
//! We need one request shape and one response shape, so a few dozen lines replace an HTTP
//! client dependency. The response may be sized by `Content-Length`, chunked, or delimited by
//! the server closing the connection (we send `Connection: close`); it is capped at
//! [`MAX_RESPONSE_BYTES`].

use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::error::Error;

/// The largest response we read from nsqlookupd.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

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
pub fn parse_address(addr: &str) -> Result<String, Error> {
    let bad = |reason: &str| Error::Config {
        field: "lookupd_http_addresses",
        reason: format!("{addr:?}: {reason}"),
    };
    let rest = if let Some(rest) = addr.strip_prefix("http://") {
        rest
    } else if addr.starts_with("https://") {
        return Err(bad("https is not supported; use http://host:port"));
    } else {
        addr
    };
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    // Add the default port when none is given (an IPv6 literal ends with `]`).
    let has_port = match authority.rfind(':') {
        Some(i) => !authority[i..].contains(']'),
        None => false,
    };
    Ok(if has_port {
        authority.to_string()
    } else {
        format!("{authority}:80")
    })
}

/// Asks nsqlookupd `addr` which nsqd have `topic`, returning their `host:port` TCP addresses.
/// An unknown topic yields an empty list.
///
/// # Errors
///
/// [`Error::Lookupd`] for connection failures, timeouts, non-200 answers other than
/// `TOPIC_NOT_FOUND`, oversized or malformed responses; [`Error::Config`] for a bad address.
pub async fn lookup(addr: &str, topic: &str, timeout: Duration) -> Result<Vec<String>, Error> {
    let authority = parse_address(addr)?;
    let fail = |reason: String| Error::Lookupd {
        addr: addr.to_string(),
        reason,
    };
    let response = tokio::time::timeout(
        timeout,
        get(
            &authority,
            &format!("/lookup?topic={}", encode_query(topic)),
        ),
    )
    .await
    .map_err(|_| {
        fail(format!(
            "no answer within {timeout:?} (see `connect_timeout`)"
        ))
    })?
    .map_err(|e| fail(e.to_string()))?;
    let (status, body) = response;
    if status == 404 {
        return Ok(Vec::new());
    }
    if status != 200 {
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

fn encode_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One `GET` with `Connection: close`; returns the status and the de-chunked body.
async fn get(authority: &str, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    let invalid = |msg: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string());
    let mut stream = TcpStream::connect(authority).await?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: application/vnd.nsq; version=1.0\r\nUser-Agent: {}\r\nConnection: close\r\n\r\n",
        super::connection::USER_AGENT
    );
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        if raw.len() + n > MAX_RESPONSE_BYTES {
            return Err(invalid("response larger than 4 MiB"));
        }
        raw.extend_from_slice(&chunk[..n]);
        if let Some(done) = complete_response(&raw) {
            raw.truncate(done);
            break;
        }
    }
    let head_end = find(&raw, b"\r\n\r\n").ok_or_else(|| invalid("no end of headers"))?;
    let head =
        std::str::from_utf8(&raw[..head_end]).map_err(|_| invalid("headers are not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("bad status line"))?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = &raw[head_end + 4..];
    let body = if chunked {
        dechunk(body).ok_or_else(|| invalid("bad chunked body"))?
    } else {
        body.to_vec()
    };
    Ok((status, body))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn header_value<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The length of a complete response in `raw`, if it is complete and self-delimiting.
fn complete_response(raw: &[u8]) -> Option<usize> {
    let head_end = find(raw, b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..head_end]).ok()?;
    if let Some(len) = header_value(head, "content-length").and_then(|v| v.parse::<usize>().ok()) {
        let total = head_end + 4 + len;
        return (raw.len() >= total).then_some(total);
    }
    if header_value(head, "transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        let body = &raw[head_end + 4..];
        return find(body, b"0\r\n\r\n")
            .filter(|&i| i == 0 || body[..i].ends_with(b"\r\n"))
            .map(|i| head_end + 4 + i + 5);
    }
    None
}

fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = find(body, b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if body.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
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
    }

    #[test]
    fn dechunks() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap(),
            b"abcde"
        );
        assert!(dechunk(b"5\r\nab").is_none());
        assert!(dechunk(b"zz\r\n").is_none());
    }

    #[test]
    fn knows_when_a_response_is_complete() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(complete_response(r), Some(r.len()));
        assert_eq!(complete_response(&r[..r.len() - 1]), None);
        let c = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        assert_eq!(complete_response(c), Some(c.len()));
    }

    #[test]
    fn reads_both_lookup_shapes() {
        let new: LookupBody = serde_json::from_str(r#"{"channels":[],"producers":[{"broadcast_address":"127.0.0.1","tcp_port":4150,"http_port":4151,"version":"1.3.0"}]}"#).unwrap();
        assert_eq!(new.producers.len(), 1);
        let old: LookupBody = serde_json::from_str(r#"{"status_code":200,"status_txt":"OK","data":{"producers":[{"broadcast_address":"h","tcp_port":1}]}}"#).unwrap();
        assert_eq!(old.data.unwrap().producers[0].tcp_port, 1);
    }
}
