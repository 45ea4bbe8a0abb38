//! The `http` sink: POSTs each unique body to a URL.

use std::time::Duration;

use bytes::Bytes;

use super::{Handler, HandlerError};
use crate::http::{post, HttpUrl};

/// POSTs each body to an `http://` URL with fixed headers. 2xx is success; 5xx, timeouts and
/// connection errors are retried; other statuses (4xx, and 1xx/3xx, which we do not follow) go
/// to the dead-letter. For `https://`, run a local TLS proxy and POST to it.
#[derive(Debug)]
pub struct HttpSink {
    url: HttpUrl,
    headers: Vec<(String, String)>,
    timeout: Duration,
}

impl HttpSink {
    /// A sink POSTing to `url` with `headers`, each request bounded by `timeout`.
    pub fn new(url: HttpUrl, headers: Vec<(String, String)>, timeout: Duration) -> Self {
        HttpSink {
            url,
            headers,
            timeout,
        }
    }
}

impl Handler for HttpSink {
    async fn handle(&self, body: Bytes) -> Result<(), HandlerError> {
        match post(&self.url, &self.headers, &body, self.timeout).await {
            Ok(code) if (200..300).contains(&code) => Ok(()),
            Ok(code) if (500..600).contains(&code) || code == 429 || code == 408 => Err(
                HandlerError::Retry(format!("{} answered HTTP {code}", self.url)),
            ),
            Ok(code) => Err(HandlerError::Reject(format!(
                "{} answered HTTP {code}",
                self.url
            ))),
            Err(error) => Err(HandlerError::Retry(error.to_string())),
        }
    }
}
