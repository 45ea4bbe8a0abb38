//! The http sink against a hyper test server: keep-alive, HTTPS with a CA file, headers and
//! content type, round-robin and multicast with an endpoint down, status rules, time limits.

use std::time::Duration;

use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use hyper::Uri;
use nsq_dedupe::http::HttpClientConfig;
use nsq_dedupe::sink::{
    with_content_type, Handler, HandlerError, HttpMode, HttpSink, HttpSinkConfig,
};

use crate::support::http::{Answer, HttpServer};

fn url(server: &HttpServer, path: &str) -> Uri {
    let scheme = if server.ca_pem.is_some() {
        "https"
    } else {
        "http"
    };
    let host = if server.ca_pem.is_some() {
        format!("localhost:{}", server.addr.port())
    } else {
        server.addr.to_string()
    };
    format!("{scheme}://{host}{path}").parse().unwrap()
}

fn sink(urls: Vec<Uri>, mode: HttpMode, client: &HttpClientConfig) -> HttpSink {
    let mut config = HttpSinkConfig::new(urls);
    config.mode = mode;
    config.client = client.clone();
    HttpSink::new(&config).unwrap()
}

/// An address nothing listens on.
fn dead_url() -> Uri {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/").parse().unwrap()
}

#[tokio::test]
async fn many_posts_share_one_kept_alive_connection() {
    let server = HttpServer::start(Answer::default()).await;
    let sink = sink(
        vec![url(&server, "/in")],
        HttpMode::RoundRobin,
        &Default::default(),
    );
    for i in 0..200 {
        sink.handle(Bytes::from(format!("record {i}")))
            .await
            .unwrap();
    }
    assert_eq!(server.received().len(), 200);
    assert_eq!(server.connections(), 1, "one connection for 200 requests");
}

#[tokio::test]
async fn https_is_trusted_through_the_ca_file_and_refused_without_it() {
    let server = HttpServer::start(Answer {
        tls: true,
        ..Answer::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, server.ca_pem.as_ref().unwrap()).unwrap();
    let trusted = HttpClientConfig {
        root_ca_file: Some(ca),
        ..Default::default()
    };
    let https = url(&server, "/secure");
    sink(vec![https.clone()], HttpMode::RoundRobin, &trusted)
        .handle(Bytes::from_static(b"secret"))
        .await
        .unwrap();
    assert_eq!(server.received()[0].body, Bytes::from_static(b"secret"));
    // Without the CA the certificate does not verify: retried, never taken as delivered.
    let error = sink(vec![https], HttpMode::RoundRobin, &Default::default())
        .handle(Bytes::from_static(b"secret"))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, HandlerError::Retry(text) if text.contains("certificate")),
        "{error:?}"
    );
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn headers_and_content_type_arrive() {
    let server = HttpServer::start(Answer::default()).await;
    let headers = with_content_type(
        "application/json",
        vec![(
            HeaderName::from_static("x-source"),
            HeaderValue::from_static("nsq-dedupe"),
        )],
    )
    .unwrap();
    let mut config = HttpSinkConfig::new(vec![url(&server, "/")]);
    config.headers = headers;
    let sink = HttpSink::new(&config).unwrap();
    sink.handle(Bytes::from_static(b"{}")).await.unwrap();
    let received = &server.received()[0];
    assert_eq!(received.headers["content-type"], "application/json");
    assert_eq!(received.headers["x-source"], "nsq-dedupe");
}

#[tokio::test]
async fn round_robin_moves_on_from_an_endpoint_that_is_down() {
    let server = HttpServer::start(Answer::default()).await;
    let sink = sink(
        vec![dead_url(), url(&server, "/")],
        HttpMode::RoundRobin,
        &Default::default(),
    );
    for i in 0..10 {
        sink.handle(Bytes::from(format!("{i}"))).await.unwrap();
    }
    assert_eq!(
        server.received().len(),
        10,
        "every record reached the live endpoint"
    );
}

#[tokio::test]
async fn multicast_is_done_only_when_every_endpoint_took_it() {
    let (one, two) = (
        HttpServer::start(Answer::default()).await,
        HttpServer::start(Answer::default()).await,
    );
    let both = sink(
        vec![url(&one, "/"), url(&two, "/")],
        HttpMode::Multicast,
        &Default::default(),
    );
    both.handle(Bytes::from_static(b"a")).await.unwrap();
    assert_eq!((one.received().len(), two.received().len()), (1, 1));
    let with_dead = sink(
        vec![url(&one, "/"), dead_url()],
        HttpMode::Multicast,
        &Default::default(),
    );
    let error = with_dead
        .handle(Bytes::from_static(b"b"))
        .await
        .unwrap_err();
    assert!(matches!(error, HandlerError::Retry(_)), "{error:?}");
    // The live endpoint took it; the requeued message will reach it again (a duplicate
    // downstream, never a loss).
    assert_eq!(one.received().len(), 2);
}

#[tokio::test]
async fn statuses_decide_retry_or_dead_letter() {
    for (status, retry) in [
        (503, true),
        (429, true),
        (408, true),
        (400, false),
        (404, false),
    ] {
        let server = HttpServer::start(Answer {
            status,
            ..Answer::default()
        })
        .await;
        let error = sink(
            vec![url(&server, "/")],
            HttpMode::RoundRobin,
            &Default::default(),
        )
        .handle(Bytes::from_static(b"x"))
        .await
        .unwrap_err();
        assert_eq!(
            matches!(error, HandlerError::Retry(_)),
            retry,
            "{status}: {error:?}"
        );
    }
}

#[tokio::test]
async fn a_slow_endpoint_is_retried_after_the_request_timeout() {
    let server = HttpServer::start(Answer {
        delay: Duration::from_secs(5),
        ..Answer::default()
    })
    .await;
    let client = HttpClientConfig {
        request_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let error = sink(vec![url(&server, "/")], HttpMode::RoundRobin, &client)
        .handle(Bytes::from_static(b"x"))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        matches!(&error, HandlerError::Retry(text) if text.contains("no answer within 200ms")),
        "{error:?}"
    );
}

/// POSTs per second through the http sink to a local hyper server, 200 at once: the pooled
/// keep-alive client against the same client with no idle connections kept (a connection per
/// request, as the sink had before), alternating, three rounds.
///
/// `cargo test --release --test integration http_sink::throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn throughput() {
    const N: usize = 20_000;
    const CONCURRENCY: usize = 200;
    let server = HttpServer::start(Answer::default()).await;
    let rate = |max_idle_per_host: usize| {
        let client = HttpClientConfig {
            max_idle_per_host,
            ..Default::default()
        };
        let sink =
            std::sync::Arc::new(sink(vec![url(&server, "/")], HttpMode::RoundRobin, &client));
        async move {
            let started = std::time::Instant::now();
            let tasks: Vec<_> = (0..CONCURRENCY)
                .map(|t| {
                    let sink = sink.clone();
                    tokio::spawn(async move {
                        for i in (t..N).step_by(CONCURRENCY) {
                            sink.handle(Bytes::from(format!("{i:0100}"))).await.unwrap();
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            N as f64 / started.elapsed().as_secs_f64()
        }
    };
    let (mut kept, mut fresh) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        kept.push(rate(CONCURRENCY).await);
        fresh.push(rate(0).await);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (kept, fresh) = (median(&mut kept), median(&mut fresh));
    println!("http sink, {N} POSTs of 100 bytes, {CONCURRENCY} at once, local hyper server:");
    println!("  keep-alive pool:        {kept:>8.0} POSTs/s (median of 3)");
    println!("  connection per request: {fresh:>8.0} POSTs/s (median of 3)");
    println!("  ratio: {:.1}", kept / fresh);
}
