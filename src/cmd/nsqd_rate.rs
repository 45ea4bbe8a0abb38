//! `size --nsqd-http-address ADDR --topic T`: the topic's message rate measured on nsqd.
//!
//! nsqd's `GET /stats?format=json&topic=T` gives each topic's `message_count`, the messages
//! published to it since nsqd started. We read it from every address, wait `--sample`, read it
//! again, and divide the growth by the time between the reads. Counts of several nsqd are
//! added: when producers publish each message to two nsqd, each copy is counted, so the rate
//! is the rate of copies, at most the replication factor times the distinct rate. That sizes
//! the table larger than needed, never smaller; give `--rate` yourself to size it exactly.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// How long one `/stats` request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The messages per second published to `topic` on all of `addresses` over `sample`.
///
/// # Errors
///
/// An address that does not answer, an answer that is not nsqd's `/stats`, or a topic that one
/// of them does not have: the message names the address and what to check.
pub(crate) fn measure(addresses: &[String], topic: &str, sample: Duration) -> Result<f64> {
    let first = total(addresses, topic)?;
    let started = Instant::now();
    std::thread::sleep(sample);
    let second = total(addresses, topic)?;
    let elapsed = started.elapsed().as_secs_f64();
    if second < first {
        bail!(
            "the message count of topic {topic:?} went down ({first} to {second}) while it was \
             sampled: an nsqd restarted; measure again"
        );
    }
    Ok((second - first) as f64 / elapsed)
}

fn total(addresses: &[String], topic: &str) -> Result<u64> {
    let mut sum = 0;
    for address in addresses {
        sum += message_count(address, topic)
            .with_context(|| format!("`--nsqd-http-address {address}`"))?;
    }
    Ok(sum)
}

/// The `message_count` of `topic` in the `/stats` of the nsqd at `address` (`host:port`).
fn message_count(address: &str, topic: &str) -> Result<u64> {
    let body = get(
        address,
        &format!("/stats?format=json&topic={}", encode(topic)),
    )?;
    count_in(&body, topic)
}

/// Finds the topic's `message_count` in a `/stats` JSON body (nsqd 1.x, or the
/// `{"data": ...}` envelope of nsqd 0.x).
fn count_in(body: &str, topic: &str) -> Result<u64> {
    let json: serde_json::Value = serde_json::from_str(body)
        .map_err(|e| anyhow!("its /stats answer is not JSON ({e}); is this nsqd's HTTP port?"))?;
    let stats = json.get("data").unwrap_or(&json);
    let topics = stats
        .get("topics")
        .and_then(|t| t.as_array())
        .ok_or_else(|| anyhow!("its /stats answer has no `topics`; is this nsqd's HTTP port?"))?;
    topics
        .iter()
        .find(|t| t.get("topic_name").and_then(|n| n.as_str()) == Some(topic))
        .and_then(|t| t.get("message_count").and_then(|c| c.as_u64()))
        .ok_or_else(|| anyhow!("it has no topic {topic:?}; check `--topic`"))
}

/// A plain HTTP/1.0 GET on loopback or the local network: the body of a 200 answer.
fn get(address: &str, path: &str) -> Result<String> {
    let addr = std::net::ToSocketAddrs::to_socket_addrs(address)
        .map_err(|e| anyhow!("cannot resolve it: {e}"))?
        .next()
        .ok_or_else(|| anyhow!("it resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT)
        .map_err(|e| anyhow!("cannot connect: {e}; is nsqd's HTTP port (4151) there?"))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {address}\r\nAccept: application/json\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream
        .take(64 << 20)
        .read_to_end(&mut answer)
        .map_err(|e| anyhow!("reading its answer failed: {e}"))?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("its answer is not HTTP"))?;
    let status = head.split(' ').nth(1).unwrap_or_default();
    if status != "200" {
        bail!(
            "GET {path} answered {:?}",
            head.lines().next().unwrap_or_default()
        );
    }
    Ok(body.to_owned())
}

/// Percent-encodes a topic name for a query string (nsqd's names are `[.a-zA-Z0-9_-]` and
/// `#ephemeral`).
fn encode(topic: &str) -> String {
    topic
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_topic_count_is_found_in_both_formats() {
        let v1 = r#"{"version":"1.3.0","health":"OK","topics":[{"topic_name":"a","message_count":5},{"topic_name":"events","message_count":1234,"channels":[]}]}"#;
        assert_eq!(count_in(v1, "events").unwrap(), 1234);
        let v0 =
            r#"{"status_code":200,"data":{"topics":[{"topic_name":"events","message_count":7}]}}"#;
        assert_eq!(count_in(v0, "events").unwrap(), 7);
        assert_eq!(
            count_in(v1, "other").unwrap_err().to_string(),
            "it has no topic \"other\"; check `--topic`"
        );
        assert_eq!(encode("events#ephemeral"), "events%23ephemeral");
    }
}
