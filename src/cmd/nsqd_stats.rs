//! One read of a topic's message count from nsqd's HTTP API
//! (`GET /stats?format=json&topic=T`), for `size --nsqd-http-address`. Each error names the
//! address as it was typed and says how to fix it.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use hyper::header::{HeaderValue, ACCEPT};
use hyper::{Method, Uri};
use serde::Deserialize;

use crate::http::{HttpClient, HttpError};

/// nsqd's HTTP port when an address gives none (nsqd's `--http-address` default).
const DEFAULT_HTTP_PORT: u16 = 4151;

/// The fix for an address that is not nsqd's HTTP API, said once for every such error.
const GIVE_THE_HTTP_ADDRESS: &str =
    "give nsqd's HTTP address (nsqd --http-address, port 4151 by default)";

/// An nsqd's HTTP address: as typed, and as the URL base it stands for.
#[derive(Debug, Clone)]
pub(crate) struct NsqdAddress {
    /// As the user typed it; errors and output name it so.
    pub(crate) typed: String,
    /// `http://host:port` or `https://host:port`.
    base: String,
    /// `host:port`, to tell whether anything listens there.
    authority: String,
}

impl NsqdAddress {
    /// Reads `host:port`, `host` (port 4151) or an `http://` or `https://` URL whose path, if
    /// any, is `/`.
    ///
    /// # Errors
    ///
    /// What is wrong with `typed`, naming the flag.
    pub(crate) fn parse(typed: &str) -> Result<NsqdAddress> {
        let bad = |reason: &str| {
            anyhow!(
                "invalid `--nsqd-http-address` {typed:?}: {reason}; expected nsqd's HTTP \
                 address as host:port or an http:// URL, such as 127.0.0.1:4151"
            )
        };
        let trimmed = typed.trim();
        let (scheme, rest) = match trimmed.split_once("://") {
            Some((scheme @ ("http" | "https"), rest)) => (scheme, rest),
            Some((scheme, _)) => return Err(bad(&format!("{scheme}:// is not HTTP"))),
            None => ("http", trimmed),
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if !path.is_empty() && path != "/" {
            return Err(bad(&format!(
                "give the address alone, without the path {path:?}"
            )));
        }
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        // An IPv6 literal ends with `]` when it has no port.
        let port = authority
            .rfind(':')
            .filter(|&i| !authority[i..].contains(']'))
            .map(|i| &authority[i + 1..]);
        let authority = if let Some(port) = port {
            if port.parse::<u16>().is_err() {
                return Err(bad(&format!("the port {port:?} is not a port number")));
            }
            authority.to_owned()
        } else {
            format!("{authority}:{DEFAULT_HTTP_PORT}")
        };
        let base = format!("{scheme}://{authority}");
        base.parse::<Uri>()
            .map_err(|error| bad(&format!("not a host:port ({error})")))?;
        Ok(NsqdAddress {
            typed: typed.to_owned(),
            base,
            authority,
        })
    }

    /// Whether two addresses reach the same nsqd by the same name.
    pub(crate) fn same_as(&self, other: &NsqdAddress) -> bool {
        self.base == other.base
    }

    /// The `/stats` URL for `topic` (every topic when `None`), without clients or memory.
    fn stats_url(&self, topic: Option<&str>) -> Uri {
        let topic = topic.map_or_else(String::new, |t| {
            format!("&topic={}", crate::percent::encode_query(t))
        });
        format!(
            "{}/stats?format=json&include_clients=false&include_mem=false{topic}",
            self.base
        )
        .parse()
        .expect("the base URL parsed and the query is encoded")
    }
}

/// What one read of `/stats` says of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TopicCount {
    /// Messages published to the topic on this nsqd since it started (`message_count`).
    pub(crate) messages: u64,
    /// When the nsqd started (`start_time`, Unix seconds): a change means a restart.
    pub(crate) start_time: i64,
}

/// nsqd's `/stats?format=json` answer, the part read here (nsqd v1.x: no envelope).
#[derive(Debug, Deserialize)]
struct Stats {
    start_time: i64,
    /// `null` when nsqd has no such topic.
    topics: Option<Vec<TopicStats>>,
}

#[derive(Debug, Deserialize)]
struct TopicStats {
    topic_name: String,
    message_count: u64,
}

/// Reads `topic`'s message count from the nsqd at `address`.
///
/// # Errors
///
/// Nothing listens there; something listens but does not answer HTTP (such as nsqd's TCP
/// port); no answer in time; an answer that is not nsqd's stats JSON; no such topic.
pub(crate) async fn read_count(
    client: &HttpClient,
    address: &NsqdAddress,
    topic: &str,
) -> Result<TopicCount> {
    let stats = read_stats(client, address, Some(topic)).await?;
    let found = stats
        .topics
        .unwrap_or_default()
        .into_iter()
        .find(|t| t.topic_name == topic);
    match found {
        Some(t) => Ok(TopicCount {
            messages: t.message_count,
            start_time: stats.start_time,
        }),
        None => {
            // The topics it has help tell a typo from the wrong nsqd.
            let known = match read_stats(client, address, None).await {
                Ok(all) => {
                    let names: Vec<String> = all
                        .topics
                        .unwrap_or_default()
                        .into_iter()
                        .map(|t| t.topic_name)
                        .collect();
                    if names.is_empty() {
                        "it has no topic yet".to_owned()
                    } else {
                        format!("its topics: {}", names.join(", "))
                    }
                }
                Err(_) => "its topics could not be listed".to_owned(),
            };
            bail!(
                "nsqd at `{}` has no topic `{topic}` ({known}): check `--topic`, and that \
                 this nsqd receives the topic (nsqd creates a topic at its first message)",
                address.typed
            )
        }
    }
}

async fn read_stats(
    client: &HttpClient,
    address: &NsqdAddress,
    topic: Option<&str>,
) -> Result<Stats> {
    let url = address.stats_url(topic);
    let headers = [(ACCEPT, HeaderValue::from_static("application/json"))];
    let typed = &address.typed;
    let (status, body) = match client.send(Method::GET, &url, &headers, Bytes::new()).await {
        Ok(answer) => answer,
        Err(HttpError::Timeout { after, .. }) => bail!(
            "nsqd at `{typed}` gave no answer to {url} within {}: check that this is nsqd \
             and that it is not overloaded; {GIVE_THE_HTTP_ADDRESS}",
            describe(after)
        ),
        Err(error) => return Err(unanswered(address, &url, &error).await),
    };
    if !status.is_success() {
        bail!(
            "`{typed}` answered {url} with HTTP status {status} ({}): is it nsqd? \
             {GIVE_THE_HTTP_ADDRESS}",
            excerpt(&body)
        );
    }
    serde_json::from_slice(&body).map_err(|error| {
        anyhow!(
            "`{typed}` answered {url} with something other than nsqd's stats JSON ({error}; \
             the answer begins {}): is it nsqd? {GIVE_THE_HTTP_ADDRESS}",
            excerpt(&body)
        )
    })
}

/// The error for a request that got no answer: nothing listens at the address, or something
/// listens that does not speak HTTP (nsqd's TCP port answers `E_BAD_PROTOCOL` and closes).
async fn unanswered(address: &NsqdAddress, url: &Uri, error: &HttpError) -> anyhow::Error {
    let typed = &address.typed;
    let probe = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(address.authority.as_str()),
    )
    .await;
    match probe {
        Ok(Ok(_)) => anyhow!(
            "`{typed}` accepts connections but does not answer HTTP ({error}): is it nsqd's \
             TCP address? {GIVE_THE_HTTP_ADDRESS}"
        ),
        Ok(Err(cause)) => anyhow!(
            "cannot reach nsqd at `{typed}` ({url}): {cause}: check that nsqd runs there; \
             {GIVE_THE_HTTP_ADDRESS}"
        ),
        Err(_) => anyhow!(
            "cannot reach nsqd at `{typed}` ({url}): no connection within 2s: check that \
             nsqd runs there and that no firewall is in the way; {GIVE_THE_HTTP_ADDRESS}"
        ),
    }
}

fn describe(duration: Duration) -> String {
    crate::units::format_duration(duration)
}

/// The start of an answer's body, quoted, for errors.
fn excerpt(body: &[u8]) -> String {
    const MOST: usize = 60;
    let text = String::from_utf8_lossy(&body[..body.len().min(MOST)]);
    if body.is_empty() {
        "an empty body".to_owned()
    } else if body.len() > MOST {
        format!("{text:?}...")
    } else {
        format!("{text:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_take_nsqds_http_port_by_default() {
        let base = |typed: &str| NsqdAddress::parse(typed).map(|a| a.base);
        assert_eq!(base("127.0.0.1:4151").unwrap(), "http://127.0.0.1:4151");
        assert_eq!(base("nsqd").unwrap(), "http://nsqd:4151");
        assert_eq!(base("http://nsqd:80/").unwrap(), "http://nsqd:80");
        assert_eq!(base("https://nsqd:4152").unwrap(), "https://nsqd:4152");
        assert_eq!(base("[::1]").unwrap(), "http://[::1]:4151");
        assert_eq!(base("[::1]:9").unwrap(), "http://[::1]:9");
        for bad in [
            "",
            "http://",
            "tcp://nsqd:4150",
            "nsqd:4151/stats",
            "nsqd:port",
        ] {
            assert!(NsqdAddress::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reads_nsqd_1_3_stats() {
        // As nsqd v1.3.0 answers `/stats?format=json&topic=t1&include_clients=false`.
        let known: Stats = serde_json::from_str(
            r#"{"version":"1.3.0","health":"OK","start_time":1795522339,"topics":[{"topic_name":"t1","channels":[],"depth":1,"backend_depth":0,"message_count":1,"message_bytes":2,"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}],"producers":null}"#,
        )
        .unwrap();
        let topics = known.topics.unwrap();
        assert_eq!(
            (topics[0].topic_name.as_str(), topics[0].message_count),
            ("t1", 1)
        );
        let unknown: Stats = serde_json::from_str(
            r#"{"version":"1.3.0","health":"OK","start_time":1795522339,"topics":null,"producers":null}"#,
        )
        .unwrap();
        assert!(unknown.topics.is_none());
    }

    #[test]
    fn topics_are_encoded_in_the_query() {
        let address = NsqdAddress::parse("127.0.0.1:4151").unwrap();
        assert_eq!(
            address.stats_url(Some("a#ephemeral")).to_string(),
            "http://127.0.0.1:4151/stats?format=json&include_clients=false&include_mem=false&topic=a%23ephemeral"
        );
    }
}
