//! Just enough HTTP/1.1 for the sidecar: a client that POSTs a body to an `http://` URL, and a
//! server that answers `GET /metrics`.
//!
//! We write these ourselves on tokio instead of adding an HTTP stack: the client sends one
//! request per connection (`Connection: close`) and reads the status line, and the server
//! answers one request per connection. Both bound every read by size and time. `https://` is
//! not supported: put a local TLS proxy (stunnel, nginx, envoy) in front and POST to it over
//! loopback.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The largest response head (status line and headers) the client reads.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// The most response body bytes the client reads before closing (the body is not used).
const MAX_BODY_BYTES: usize = 64 * 1024;

/// An `http://host:port/path?query` URL, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// `host:port` to connect to (port 80 if the URL gave none).
    pub authority: String,
    /// The `Host` header value, as written in the URL.
    pub host: String,
    /// Path and query, at least `/`.
    pub path: String,
}

impl std::str::FromStr for HttpUrl {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, String> {
        let rest = match url.strip_prefix("http://") {
            Some(rest) => rest,
            None if url.starts_with("https://") => {
                return Err(format!(
                    "`{url}`: https is not supported; run a local TLS proxy and POST to it over http://127.0.0.1"
                ))
            }
            None => return Err(format!("`{url}` is not an http:// URL")),
        };
        let (host, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_owned()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_owned()),
        };
        if host.is_empty() || host.contains(['@', ' ']) {
            return Err(format!(
                "`{url}` has no usable host (expected http://host:port/path)"
            ));
        }
        let authority = if host
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            host.to_owned()
        } else if host.starts_with('[') && host.ends_with(']') || !host.contains(':') {
            format!("{host}:80")
        } else {
            return Err(format!("`{url}` has an invalid port"));
        };
        if path.contains([' ', '\r', '\n']) {
            return Err(format!("`{url}` has spaces or line breaks in its path"));
        }
        Ok(HttpUrl {
            authority,
            host: host.to_owned(),
            path,
        })
    }
}

impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.host, self.path)
    }
}

/// Why a request got no status code.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Connecting, writing or reading failed.
    #[error("HTTP request to {url} failed: {cause}")]
    Io {
        /// The URL.
        url: String,
        /// The socket error, in the message so that a log line of this error alone says why.
        cause: std::io::Error,
    },
    /// The whole exchange took longer than the timeout.
    #[error("HTTP request to {url} timed out after {after:?} (raise `sink.timeout`)")]
    Timeout {
        /// The URL.
        url: String,
        /// The timeout.
        after: Duration,
    },
    /// The answer was not an HTTP/1.x response.
    #[error("HTTP response from {url} is malformed: {detail}")]
    Malformed {
        /// The URL.
        url: String,
        /// What was wrong.
        detail: String,
    },
}

/// POSTs `body` to `url` with extra `headers`; returns the status code. The whole exchange
/// (connect, write, read the status) is bounded by `timeout`.
///
/// # Errors
///
/// [`HttpError`] when no status code could be read in time.
pub async fn post(
    url: &HttpUrl,
    headers: &[(String, String)],
    body: &[u8],
    timeout: Duration,
) -> Result<u16, HttpError> {
    match tokio::time::timeout(timeout, post_inner(url, headers, body)).await {
        Ok(result) => result,
        Err(_) => Err(HttpError::Timeout {
            url: url.to_string(),
            after: timeout,
        }),
    }
}

async fn post_inner(
    url: &HttpUrl,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<u16, HttpError> {
    let io = |cause| HttpError::Io {
        url: url.to_string(),
        cause,
    };
    let mut stream = TcpStream::connect(&url.authority).await.map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    let mut request = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: nsq-dedupe/{}\r\nContent-Length: {}\r\nConnection: close\r\n",
        url.path,
        url.host,
        env!("CARGO_PKG_VERSION"),
        body.len()
    );
    let mut has_content_type = false;
    for (name, value) in headers {
        has_content_type |= name.eq_ignore_ascii_case("content-type");
        request.push_str(name);
        request.push_str(": ");
        request.push_str(value);
        request.push_str("\r\n");
    }
    if !has_content_type {
        request.push_str("Content-Type: application/octet-stream\r\n");
    }
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).await.map_err(io)?;
    let head = read_head(&mut stream).await.map_err(io)?;
    let Some((head, body_read)) = head else {
        return Err(HttpError::Malformed {
            url: url.to_string(),
            detail: "connection closed before a complete response head".into(),
        });
    };
    let status = parse_status(&head).ok_or_else(|| HttpError::Malformed {
        url: url.to_string(),
        detail: format!(
            "status line {:?}",
            String::from_utf8_lossy(head.split(|&b| b == b'\n').next().unwrap_or_default())
        ),
    })?;
    // Read (and discard) the body, so that the server does not see a reset while it is still
    // writing: exactly Content-Length bytes if given, else until the server closes, which
    // `Connection: close` asked for. The status is known already, so a server that keeps the
    // connection open anyway costs at most a short wait, never an error.
    let mut remaining = content_length(&head).map_or(MAX_BODY_BYTES, |n| n.min(MAX_BODY_BYTES));
    remaining = remaining.saturating_sub(body_read);
    let mut sink = [0u8; 4096];
    while remaining > 0 {
        match tokio::time::timeout(Duration::from_millis(100), stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => remaining = remaining.saturating_sub(n),
            _ => break,
        }
    }
    Ok(status)
}

/// Reads up to the blank line that ends an HTTP head; returns the head and how many bytes
/// after it were read too. `None` if the peer closed first.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<(Vec<u8>, usize)>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = find(&head, b"\r\n\r\n") {
            let extra = head.len() - (end + 4);
            head.truncate(end + 4);
            return Ok(Some((head, extra)));
        }
        if head.len() > MAX_HEAD_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("HTTP head longer than {MAX_HEAD_BYTES} bytes"),
            ));
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&chunk[..n]);
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn content_length(head: &[u8]) -> Option<usize> {
    std::str::from_utf8(head).ok()?.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })
}

fn parse_status(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut parts = line.splitn(3, ' ');
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let code = parts.next()?;
    if code.len() != 3 {
        return None;
    }
    code.parse().ok()
}

/// Serves `GET <path>` with the text that `render` returns, on an already bound listener, until
/// `shutdown` completes. Other paths get 404, other methods 405. One request per connection.
pub async fn serve_text<F, S>(
    listener: TcpListener,
    path: &'static str,
    render: Arc<F>,
    shutdown: S,
) where
    F: Fn() -> String + Send + Sync + 'static,
    S: Future<Output = ()>,
{
    tokio::pin!(shutdown);
    loop {
        let (mut stream, _) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "Metrics listener failed to accept.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let render = render.clone();
        tokio::spawn(async move {
            let answer = async {
                let head = read_head(&mut stream).await?;
                let response = match head.as_ref().map(|(head, _)| request_line(head)) {
                    Some(Some(("GET", target))) if target.split('?').next() == Some(path) => {
                        response(200, "OK", "text/plain; version=0.0.4", &render())
                    }
                    Some(Some(("GET", _))) => response(
                        404,
                        "Not Found",
                        "text/plain",
                        "not found; try GET /metrics\n",
                    ),
                    Some(Some(_)) => {
                        response(405, "Method Not Allowed", "text/plain", "only GET\n")
                    }
                    _ => response(400, "Bad Request", "text/plain", "bad request\n"),
                };
                stream.write_all(response.as_bytes()).await?;
                stream.shutdown().await
            };
            let _ = tokio::time::timeout(Duration::from_secs(5), answer).await;
        });
    }
}

fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut parts = line.split(' ');
    Some((parts.next()?, parts.next()?))
}

fn response(code: u16, reason: &str, content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Binds `addr` for [`serve_text`].
///
/// # Errors
///
/// The bind error.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u: HttpUrl = "http://127.0.0.1:8080/ingest?x=1".parse().unwrap();
        assert_eq!(u.authority, "127.0.0.1:8080");
        assert_eq!(u.path, "/ingest?x=1");
        let u: HttpUrl = "http://example.com".parse().unwrap();
        assert_eq!(u.authority, "example.com:80");
        assert_eq!(u.path, "/");
        let u: HttpUrl = "http://h:9?q".parse().unwrap();
        assert_eq!(u.path, "/?q");
        assert!("https://x/"
            .parse::<HttpUrl>()
            .unwrap_err()
            .contains("TLS proxy"));
        assert!("ftp://x/".parse::<HttpUrl>().is_err());
        assert!("http://".parse::<HttpUrl>().is_err());
    }

    #[test]
    fn parses_status_lines() {
        assert_eq!(parse_status(b"HTTP/1.1 204 No Content\r\n\r\n"), Some(204));
        assert_eq!(parse_status(b"HTTP/1.0 500\r\n\r\n"), Some(500));
        assert_eq!(parse_status(b"SSH-2.0\r\n\r\n"), None);
        assert_eq!(parse_status(b"HTTP/1.1 2000 x\r\n\r\n"), None);
        assert_eq!(
            content_length(b"HTTP/1.1 200 OK\r\ncontent-LENGTH: 12\r\n\r\n"),
            Some(12)
        );
        assert_eq!(content_length(b"HTTP/1.1 200 OK\r\n\r\n"), None);
    }

    #[tokio::test]
    async fn posts_to_the_metrics_server_and_gets_405() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_text(
            listener,
            "/metrics",
            Arc::new(|| "x 1\n".to_string()),
            async move {
                let _ = stopped.await;
            },
        ));
        let url: HttpUrl = format!("http://{addr}/metrics").parse().unwrap();
        let code = post(&url, &[], b"hello", Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(code, 405);
        let _ = stop.send(());
        server.await.unwrap();
    }
}
