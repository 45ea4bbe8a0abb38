//! The serve endpoint's HTTP port: `/ping`, `/lookup?topic=T` as nsqlookupd answers it (so
//! consumers configured with a lookupd address find the served port), and `/info` and
//! `/stats?format=json` in nsqd's shape for the served topic and channel (so `nsq_stat` and
//! scripts that read nsqd's stats work).
//!
//! Every answer is in the form nsqlookupd and nsqd 1.x give: the bare JSON with the header
//! `X-NSQ-Content-Type: nsq; version=1.0`, and an error as its HTTP status with
//! `{"message":"..."}`. go-nsq reads the body as is when it sees that header (else it expects
//! the wrapped form of nsq before 1.0); pynsq, `nsq_stat` and scripts read the bare JSON.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::Shared;

/// The header that tells clients the body is the bare JSON.
const NSQ_CONTENT_TYPE: &str = "X-NSQ-Content-Type";
const NSQ_V1: &str = "nsq; version=1.0";

/// Serves HTTP until the endpoint stops.
pub(crate) async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let cancel = shared.cancel.clone();
    let respond: crate::http::server::Responder = Arc::new(move |request| answer(&shared, request));
    crate::http::server::serve_with(listener, respond, cancel.cancelled_owned()).await;
}

fn answer(shared: &Shared, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, Err("METHOD_NOT_ALLOWED"));
    }
    let query = request.uri().query().unwrap_or("");
    match request.uri().path() {
        "/ping" => {
            let mut response = Response::new(Full::new(Bytes::from_static(b"OK")));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            response
        }
        "/lookup" => match param(query, "topic") {
            None => reply(StatusCode::BAD_REQUEST, Err("MISSING_ARG_TOPIC")),
            Some(topic) if topic != shared.config.topic => {
                reply(StatusCode::NOT_FOUND, Err("TOPIC_NOT_FOUND"))
            }
            Some(_) => reply(StatusCode::OK, Ok(lookup(shared))),
        },
        "/stats" => reply(StatusCode::OK, Ok(stats(shared))),
        "/info" => reply(StatusCode::OK, Ok(info(shared))),
        _ => reply(StatusCode::NOT_FOUND, Err("NOT_FOUND")),
    }
}

/// The value of `name` in a query string (no percent-decoding: topic names need none).
fn param<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// A JSON answer as nsqlookupd and nsqd 1.x give it: bare, with the version header.
fn reply(status: StatusCode, body: Result<Value, &'static str>) -> Response<Full<Bytes>> {
    let text = match body {
        Ok(data) => data,
        Err(message) => json!({ "message": message }),
    };
    let mut response = Response::new(Full::new(Bytes::from(text.to_string())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    headers.insert(NSQ_CONTENT_TYPE, HeaderValue::from_static(NSQ_V1));
    response
}

/// `/info`, as nsqd answers it: `nsq_stat` reads it to find the TCP port of a producer it
/// was given by its HTTP address. `version` is ours, a semantic version as nsqd's is.
fn info(shared: &Shared) -> Value {
    let tcp = shared.tcp_address;
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "broadcast_address": tcp.ip().to_string(),
        "hostname": crate::nsq::short_hostname(),
        "http_port": shared.http_address.map_or(0, |a| a.port()),
        "tcp_port": tcp.port(),
    })
}

/// `/lookup`: the served port as the one producer of the served topic.
fn lookup(shared: &Shared) -> Value {
    let tcp = shared.tcp_address;
    let hostname = crate::nsq::short_hostname();
    json!({
        "channels": [shared.config.channel],
        "producers": [{
            "remote_address": tcp.to_string(),
            "hostname": hostname,
            "broadcast_address": tcp.ip().to_string(),
            "tcp_port": tcp.port(),
            "http_port": shared.http_address.map_or(0, |a| a.port()),
            "version": env!("CARGO_PKG_VERSION"),
        }],
    })
}

/// `/stats`: nsqd's shape for the served topic and channel.
fn stats(shared: &Shared) -> Value {
    let stats = shared.dispatcher.stats();
    let counters = stats.counters;
    let clients: Vec<Value> = stats
        .consumers
        .iter()
        .map(|c| {
            json!({
                "client_id": c.info.client_id,
                "hostname": c.info.hostname,
                "version": "V2",
                "remote_address": c.info.remote_address,
                "state": 3,
                "ready_count": c.ready_count,
                "in_flight_count": c.in_flight_count,
                "message_count": c.message_count,
                "finish_count": c.finish_count,
                "requeue_count": c.requeue_count,
                "connect_ts": c.connect_ts,
                "sample_rate": 0,
                "deflate": false,
                "snappy": false,
                "user_agent": c.info.user_agent,
                "tls": c.info.tls,
                "authed": c.info.authed,
            })
        })
        .collect();
    let channel = json!({
        "channel_name": shared.config.channel,
        "depth": stats.waiting,
        "backend_depth": 0,
        "in_flight_count": stats.in_flight,
        "deferred_count": 0,
        "message_count": counters.delivered,
        "requeue_count": counters.requeued + counters.abandoned,
        "timeout_count": counters.timed_out,
        "client_count": clients.len(),
        "clients": clients,
        "paused": false,
        "e2e_processing_latency": {"count": 0, "percentiles": null, "topic": shared.config.topic, "channel": shared.config.channel, "host": ""},
    });
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "health": "OK",
        "start_time": shared.started_at,
        "topics": [{
            "topic_name": shared.config.topic,
            "channels": [channel],
            "depth": stats.waiting,
            "backend_depth": 0,
            "message_count": counters.delivered,
            "message_bytes": 0,
            "paused": false,
            "e2e_processing_latency": {"count": 0, "percentiles": null, "topic": shared.config.topic, "channel": "", "host": ""},
        }],
        "producers": [],
    })
}
