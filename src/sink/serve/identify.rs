//! IDENTIFY on the served port: what a consumer asks for, checked as nsqd checks it
//! (`client_v2.go`), and the JSON nsqd answers under feature negotiation.

use std::time::Duration;

use super::command::ErrorFrame;
use super::config::{ServeConfig, DEFAULT_OUTPUT_BUFFER_SIZE, DEFAULT_OUTPUT_BUFFER_TIMEOUT_MS};

/// nsqd's bounds on `output_buffer_timeout` (`--min-output-buffer-timeout`,
/// `--max-output-buffer-timeout`) and `output_buffer_size` (`--max-output-buffer-size`).
const MIN_OUTPUT_BUFFER_TIMEOUT_MS: i64 = 25;
const MAX_OUTPUT_BUFFER_TIMEOUT_MS: i64 = 30_000;
const MAX_OUTPUT_BUFFER_SIZE: i64 = 64 * 1024;

/// The fields of an IDENTIFY body the endpoint reads; go-nsq and pynsq send more, ignored.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct Request {
    feature_negotiation: bool,
    heartbeat_interval: i64,
    output_buffer_size: i64,
    output_buffer_timeout: i64,
    sample_rate: i64,
    msg_timeout: i64,
    tls_v1: bool,
    client_id: String,
    hostname: String,
    user_agent: String,
}

/// What a consumer's IDENTIFY settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identified {
    /// `None`: heartbeats disabled (SUB is then refused).
    pub(crate) heartbeat_interval: Option<Duration>,
    pub(crate) msg_timeout: Duration,
    /// The JSON answer, or `OK` without feature negotiation.
    pub(crate) response: Vec<u8>,
    /// The consumer asked for TLS and the endpoint offers it: the handshake follows.
    pub(crate) tls: bool,
    pub(crate) client_id: String,
    pub(crate) hostname: String,
    pub(crate) user_agent: String,
}

/// Reads an IDENTIFY body for a connection whose heartbeat interval is `heartbeat` now.
///
/// # Errors
///
/// nsqd's fatal `E_BAD_BODY` for a body that is not JSON or asks for what is out of range.
pub(crate) fn identify(
    body: &[u8],
    config: &ServeConfig,
    heartbeat: Option<Duration>,
    msg_timeout: Duration,
) -> Result<Identified, ErrorFrame> {
    let request: Request = serde_json::from_slice(body)
        .map_err(|_| ErrorFrame::fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body"))?;
    let invalid = |what: &str, value: i64| {
        ErrorFrame::fatal(
            "E_BAD_BODY",
            format_args!("IDENTIFY {what} ({value}) is invalid"),
        )
    };
    let millis = |d: Duration| d.as_millis() as i64;
    let heartbeat_interval = match request.heartbeat_interval {
        -1 => None,
        0 => heartbeat,
        ms if (1000..=millis(config.max_heartbeat_interval)).contains(&ms) => {
            Some(Duration::from_millis(ms as u64))
        }
        ms => return Err(invalid("heartbeat interval", ms)),
    };
    let mut output_buffer_timeout = match request.output_buffer_timeout {
        -1 => 0,
        0 => DEFAULT_OUTPUT_BUFFER_TIMEOUT_MS,
        ms if (MIN_OUTPUT_BUFFER_TIMEOUT_MS..=MAX_OUTPUT_BUFFER_TIMEOUT_MS).contains(&ms) => ms,
        ms => return Err(invalid("output buffer timeout", ms)),
    };
    let output_buffer_size = match request.output_buffer_size {
        -1 => {
            output_buffer_timeout = 0;
            1
        }
        0 => DEFAULT_OUTPUT_BUFFER_SIZE,
        size if (64..=MAX_OUTPUT_BUFFER_SIZE).contains(&size) => size,
        size => return Err(invalid("output buffer size", size)),
    };
    if !(0..=99).contains(&request.sample_rate) {
        return Err(invalid("sample rate", request.sample_rate));
    }
    let msg_timeout = match request.msg_timeout {
        0 => msg_timeout,
        ms if (1000..=millis(config.max_msg_timeout)).contains(&ms) => {
            Duration::from_millis(ms as u64)
        }
        ms => return Err(invalid("msg timeout", ms)),
    };
    let tls = config.tls.is_some() && request.tls_v1;
    let response = if request.feature_negotiation {
        serde_json::json!({
            "max_rdy_count": config.max_rdy_count,
            "version": concat!("nsq-dedupe/", env!("CARGO_PKG_VERSION")),
            "max_msg_timeout": millis(config.max_msg_timeout),
            "msg_timeout": millis(msg_timeout),
            "tls_v1": tls,
            // Compression is not offered: the served port is meant for loopback.
            "deflate": false,
            "deflate_level": 6,
            "max_deflate_level": 6,
            "snappy": false,
            // Every consumer gets every message it has RDY for: sampling would drop some.
            "sample_rate": 0,
            "auth_required": config.auth_secret.is_some(),
            "output_buffer_size": output_buffer_size,
            "output_buffer_timeout": output_buffer_timeout,
        })
        .to_string()
        .into_bytes()
    } else {
        b"OK".to_vec()
    };
    Ok(Identified {
        heartbeat_interval,
        msg_timeout,
        response,
        tls,
        client_id: request.client_id,
        hostname: request.hostname,
        user_agent: request.user_agent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ServeConfig {
        ServeConfig::new("t", "c")
    }

    fn ask(body: &str) -> Result<Identified, ErrorFrame> {
        identify(
            body.as_bytes(),
            &config(),
            Some(Duration::from_secs(30)),
            Duration::from_secs(60),
        )
    }

    #[test]
    fn answers_nsqds_fields_under_feature_negotiation() {
        let got = ask(r#"{"feature_negotiation":true,"heartbeat_interval":5000,"msg_timeout":2000,"snappy":true,"deflate":true,"tls_v1":true,"client_id":"x","user_agent":"go-nsq/1.1.0"}"#).unwrap();
        assert_eq!(got.heartbeat_interval, Some(Duration::from_secs(5)));
        assert_eq!(got.msg_timeout, Duration::from_secs(2));
        assert!(!got.tls, "no TLS configured");
        let json: serde_json::Value = serde_json::from_slice(&got.response).unwrap();
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut expected = vec![
            "max_rdy_count",
            "version",
            "max_msg_timeout",
            "msg_timeout",
            "tls_v1",
            "deflate",
            "deflate_level",
            "max_deflate_level",
            "snappy",
            "sample_rate",
            "auth_required",
            "output_buffer_size",
            "output_buffer_timeout",
        ];
        expected.sort_unstable();
        let mut keys = keys;
        keys.sort_unstable();
        assert_eq!(keys, expected);
        assert_eq!(json["msg_timeout"], 2000);
        assert_eq!(json["max_rdy_count"], 2500);
        assert_eq!(json["snappy"], false);
        assert_eq!(json["deflate"], false);
        assert_eq!(json["output_buffer_size"], 16384);
        assert_eq!(json["output_buffer_timeout"], 250);
    }

    #[test]
    fn without_negotiation_answers_ok_and_keeps_the_defaults() {
        let got = ask("{}").unwrap();
        assert_eq!(got.response, b"OK");
        assert_eq!(got.heartbeat_interval, Some(Duration::from_secs(30)));
        assert_eq!(
            ask(r#"{"heartbeat_interval":-1}"#)
                .unwrap()
                .heartbeat_interval,
            None
        );
    }

    #[test]
    fn out_of_range_asks_are_nsqds_bad_body() {
        let cases = [
            (
                r#"{"heartbeat_interval":999}"#,
                "E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid",
            ),
            (
                r#"{"msg_timeout":900001}"#,
                "E_BAD_BODY IDENTIFY msg timeout (900001) is invalid",
            ),
            (
                r#"{"sample_rate":100}"#,
                "E_BAD_BODY IDENTIFY sample rate (100) is invalid",
            ),
            (
                r#"{"output_buffer_size":10}"#,
                "E_BAD_BODY IDENTIFY output buffer size (10) is invalid",
            ),
            (
                r#"{"output_buffer_timeout":1}"#,
                "E_BAD_BODY IDENTIFY output buffer timeout (1) is invalid",
            ),
            ("not json", "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        ];
        for (body, expected) in cases {
            let error = ask(body).unwrap_err();
            assert_eq!(error.text, expected);
            assert!(error.fatal);
        }
    }
}
