//! The http sink against a hyper test server: keep-alive, HTTPS with a CA file, headers and
//! content type, round-robin and multicast with an endpoint down, status rules, time limits;
//! the bound on connections, TLS session resumption, idempotency keys, `Retry-After` and
//! batches.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use hyper::Uri;
use nsq_dedupe::sink::{
    with_content_type, BatchFormat, Handler, HandlerError, HttpClientConfig, HttpMode, HttpSink,
    HttpSinkConfig,
};

use crate::support::http::{Answer, ConnectingWatch, HttpServer, SmallServer};

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

/// A client trusting `server`'s CA, whose file lives as long as the returned directory.
fn trusting(server: &HttpServer) -> (HttpClientConfig, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, server.ca_pem.as_ref().unwrap()).unwrap();
    let client = HttpClientConfig {
        root_ca_file: Some(ca),
        ..Default::default()
    };
    (client, dir)
}

/// Hands `bodies` to `sink` all at once, as the pipeline does with that many in flight; the
/// outcomes in the same order.
async fn handle_all(sink: &Arc<HttpSink>, bodies: Vec<Bytes>) -> Vec<Result<(), HandlerError>> {
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let sink = Arc::clone(sink);
            tokio::spawn(async move { sink.handle(body).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    outcomes
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_records_at_once_use_at_most_n_connections() {
    const N: usize = 16;
    let server = HttpServer::start(Answer {
        delay: Duration::from_millis(2),
        ..Answer::default()
    })
    .await;
    let mut config = HttpSinkConfig::new(vec![url(&server, "/in")]);
    config.concurrency = N;
    let sink = Arc::new(HttpSink::new(&config).unwrap());
    let bodies: Vec<Bytes> = (0..2000)
        .map(|i| Bytes::from(format!("{i:0100}")))
        .collect();
    let outcomes = handle_all(&sink, bodies.clone()).await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    let received: BTreeSet<Bytes> = server.received().into_iter().map(|r| r.body).collect();
    assert_eq!(received, bodies.into_iter().collect::<BTreeSet<_>>());
    assert_eq!(server.received().len(), 2000, "each record POSTed once");
    assert!(
        server.connections() <= N as u64,
        "{} connections",
        server.connections()
    );
    assert!(server.most_open() <= N as u64);
    // The bound was reached: the records did wait for each other's connections.
    assert!(server.connections() > 1);
}

/// Against a server that takes one connection at a time with a backlog of 1 and closes each
/// after its answer (as Python's `http.server`), 100 connects at once overflow the backlog:
/// most wait for the kernel's SYN retransmits (1 s, 3 s, ...) and many time out. The sink
/// connects no faster than the server takes connections, and delivers every record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_a_tiny_backlog_is_not_flooded_with_connects() {
    let server = SmallServer::start();
    let connecting = ConnectingWatch::start(server.addr.port());
    let mut config =
        HttpSinkConfig::new(vec![format!("http://{}/in", server.addr).parse().unwrap()]);
    // A request whose connect stalls tries once more, then waits for the kernel's SYN
    // retransmits (after 1 s, and 3 s): within 5 s only a flood fails.
    config.client.connect_timeout = Duration::from_secs(5);
    assert_eq!(config.concurrency, 100);
    let sink = Arc::new(HttpSink::new(&config).unwrap());
    let bodies: Vec<Bytes> = (0..400)
        .map(|i| Bytes::from(format!("record {i}")))
        .collect();
    let outcomes = handle_all(&sink, bodies.clone()).await;
    let most_connecting = connecting.most();
    drop(connecting);
    assert!(
        most_connecting <= 16,
        "{most_connecting} connects waited for the backlog at once"
    );
    let failed: Vec<_> = outcomes.iter().filter(|o| o.is_err()).collect();
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        failed.first()
    );
    let mut received = server.bodies();
    received.sort();
    let mut expected = bodies;
    expected.sort();
    assert_eq!(received, expected, "each record delivered once");
}

/// The connections follow the load up to the bound: a burst against a keep-alive server that
/// answers slowly gets all 100, each kept and reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_to_a_keep_alive_server_opens_connections_up_to_the_bound() {
    let server = HttpServer::start(Answer {
        delay: Duration::from_millis(50),
        ..Answer::default()
    })
    .await;
    let config = HttpSinkConfig::new(vec![url(&server, "/in")]);
    assert_eq!(config.concurrency, 100);
    let sink = Arc::new(HttpSink::new(&config).unwrap());
    let bodies: Vec<Bytes> = (0..3000).map(|i| Bytes::from(format!("{i}"))).collect();
    let outcomes = handle_all(&sink, bodies).await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(server.received().len(), 3000);
    assert_eq!(server.most_open(), 100, "open at once");
    assert_eq!(server.connections(), 100, "accepted, each reused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_reuses_at_most_n_connections_with_as_many_handshakes() {
    const N: usize = 8;
    let server = HttpServer::start(Answer {
        tls: true,
        delay: Duration::from_millis(2),
        ..Answer::default()
    })
    .await;
    let (client, _ca) = trusting(&server);
    let mut config = HttpSinkConfig::new(vec![url(&server, "/in")]);
    config.concurrency = N;
    config.client = client;
    let sink = Arc::new(HttpSink::new(&config).unwrap());
    let bodies: Vec<Bytes> = (0..2000).map(|i| Bytes::from(format!("{i}"))).collect();
    let outcomes = handle_all(&sink, bodies).await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(server.received().len(), 2000);
    let (full, resumed) = server.handshakes();
    assert!(
        full + resumed <= N as u64,
        "{full} full and {resumed} resumed handshakes"
    );
    assert!(server.connections() <= N as u64);
}

#[tokio::test]
async fn https_reconnects_resume_the_tls_session() {
    let server = HttpServer::start(Answer {
        tls: true,
        close: true,
        ..Answer::default()
    })
    .await;
    let (client, _ca) = trusting(&server);
    let mut config = HttpSinkConfig::new(vec![url(&server, "/in")]);
    config.client = client;
    let sink = HttpSink::new(&config).unwrap();
    for i in 0..10 {
        sink.handle(Bytes::from(format!("{i}"))).await.unwrap();
    }
    assert_eq!(
        server.connections(),
        10,
        "the server closed every connection"
    );
    assert_eq!(
        server.handshakes(),
        (1, 9),
        "one full handshake, then resumptions"
    );
}

#[tokio::test]
async fn url_user_info_goes_as_basic_authentication_and_never_into_errors() {
    let server = HttpServer::start(Answer {
        first_statuses: vec![200, 400],
        ..Answer::default()
    })
    .await;
    let with_user: Uri = format!("http://user:p%40ss@{}/in?token=hunter2", server.addr)
        .parse()
        .unwrap();
    let sink = HttpSink::new(&HttpSinkConfig::new(vec![with_user])).unwrap();
    sink.handle(Bytes::from_static(b"a")).await.unwrap();
    let received = &server.received()[0];
    // base64("user:p@ss")
    assert_eq!(received.headers["authorization"], "Basic dXNlcjpwQHNz");
    assert_eq!(received.headers["host"], server.addr.to_string());
    let error = sink.handle(Bytes::from_static(b"b")).await.unwrap_err();
    let text = error.to_string();
    assert!(text.contains("HTTP 400"), "{text}");
    assert!(
        !text.contains("p%40ss") && !text.contains("hunter2"),
        "{text}"
    );
    let debug = format!("{sink:?}");
    assert!(
        !debug.contains("p%40ss") && !debug.contains("hunter2"),
        "{debug}"
    );
}

fn key_of(received: &crate::support::http::Received, header: &str) -> Option<String> {
    received
        .headers
        .get(header)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn the_idempotency_key_is_the_same_on_a_retry() {
    let server = HttpServer::start(Answer {
        first_statuses: vec![503],
        ..Answer::default()
    })
    .await;
    let sink = HttpSink::new(&HttpSinkConfig::new(vec![url(&server, "/")])).unwrap();
    let body = Bytes::from_static(b"{\"id\":1}");
    let error = sink.handle(body.clone()).await.unwrap_err();
    assert!(matches!(error, HandlerError::Retry(_)), "{error:?}");
    sink.handle(body).await.unwrap();
    sink.handle(Bytes::from_static(b"{\"id\":2}"))
        .await
        .unwrap();
    let keys: Vec<String> = server
        .received()
        .iter()
        .map(|r| key_of(r, "idempotency-key").expect("every request has a key"))
        .collect();
    assert_eq!(keys[0], keys[1], "the retry carries the first try's key");
    assert_ne!(keys[1], keys[2], "another record, another key");
    assert_eq!(keys[0].len(), 32);
    assert!(keys[0].chars().all(|c| c.is_ascii_hexdigit()));
}

#[tokio::test]
async fn the_idempotency_header_can_be_renamed_or_left_out() {
    let server = HttpServer::start(Answer::default()).await;
    let mut config = HttpSinkConfig::new(vec![url(&server, "/")]);
    config.idempotency_header = Some(HeaderName::from_static("x-request-key"));
    HttpSink::new(&config)
        .unwrap()
        .handle(Bytes::from_static(b"a"))
        .await
        .unwrap();
    config.idempotency_header = None;
    HttpSink::new(&config)
        .unwrap()
        .handle(Bytes::from_static(b"a"))
        .await
        .unwrap();
    let received = server.received();
    assert!(key_of(&received[0], "x-request-key").is_some());
    assert_eq!(key_of(&received[0], "idempotency-key"), None);
    assert_eq!(key_of(&received[1], "x-request-key"), None);
    assert_eq!(key_of(&received[1], "idempotency-key"), None);
}

#[tokio::test]
async fn retry_after_on_429_and_503_is_passed_on() {
    for status in [429, 503] {
        let server = HttpServer::start(Answer {
            status,
            retry_after: Some("7"),
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
            error.retry_after(),
            Some(Duration::from_secs(7)),
            "{status}: {error:?}"
        );
    }
}

fn batching(server: &HttpServer, size: usize, format: BatchFormat) -> Arc<HttpSink> {
    let mut config = HttpSinkConfig::new(vec![url(server, "/mpub")]);
    config.batch_size = size;
    config.batch_timeout = Duration::from_millis(50);
    config.batch_format = format;
    Arc::new(HttpSink::new(&config).unwrap())
}

/// Hands `bodies` to `sink` in their order (each reaches the batcher on its first poll), and
/// waits for all.
async fn handle_in_order(sink: &HttpSink, bodies: &[Bytes]) -> Vec<Result<(), HandlerError>> {
    futures::future::join_all(bodies.iter().map(|b| sink.handle(b.clone()))).await
}

#[tokio::test]
async fn batches_carry_every_record_once_in_order() {
    let server = HttpServer::start(Answer::default()).await;
    let sink = batching(&server, 100, BatchFormat::Lines);
    let bodies: Vec<Bytes> = (0..250)
        .map(|i| Bytes::from(format!("record {i}")))
        .collect();
    let outcomes = handle_in_order(&sink, &bodies).await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    let received = server.received();
    let requests: Vec<Vec<&[u8]>> = received
        .iter()
        .map(|r| {
            let body = r
                .body
                .strip_suffix(b"\n")
                .expect("each record ends in a newline");
            body.split(|&b| b == b'\n').collect()
        })
        .collect();
    let expected: Vec<Vec<&[u8]>> = bodies
        .chunks(100)
        .map(|chunk| chunk.iter().map(|b| &b[..]).collect())
        .collect();
    assert_eq!(requests, expected, "batches of 100, 100 and the last 50");
    // A batch's key is neither of its records' keys, and differs between batches.
    let keys: BTreeSet<_> = received
        .iter()
        .map(|r| key_of(r, "idempotency-key"))
        .collect();
    assert_eq!(keys.len(), 3);
}

#[tokio::test]
async fn a_burst_sends_its_full_batches_at_once_and_gathers_the_rest() {
    let server = HttpServer::start(Answer::default()).await;
    let mut config = HttpSinkConfig::new(vec![url(&server, "/mpub")]);
    config.batch_size = 50;
    // Far beyond the test's bound: the last 7 records of the first burst can only leave with
    // the second burst's 43, which fill their batch.
    config.batch_timeout = Duration::from_secs(600);
    let sink = Arc::new(HttpSink::new(&config).unwrap());
    assert!(sink.handles_batches());
    let bodies: Vec<Bytes> = (0..300)
        .map(|i| Bytes::from(format!("record {i}")))
        .collect();
    let first = tokio::spawn({
        let (sink, burst) = (Arc::clone(&sink), bodies[..257].to_vec());
        async move { sink.handle_batch(burst).await }
    });
    crate::util::wait_until_or(
        "the first burst's five full batches are sent",
        Duration::from_secs(20),
        || server.received().len() == 5,
        || format!("{} requests", server.received().len()),
    )
    .await;
    assert!(!first.is_finished(), "the last 7 wait for more records");
    let second = tokio::time::timeout(
        Duration::from_secs(20),
        sink.handle_batch(bodies[257..].to_vec()),
    )
    .await
    .expect("43 more records fill the gathered batch");
    assert_eq!(second, vec![Ok(()); 43]);
    assert_eq!(first.await.unwrap(), vec![Ok(()); 257]);
    // Batches go out concurrently: put the requests in the order of their first record.
    let received = server.received();
    let mut requests: Vec<Vec<Bytes>> = received
        .iter()
        .map(|r| {
            let body = r
                .body
                .strip_suffix(b"\n")
                .expect("records end in a newline");
            body.split(|&b| b == b'\n')
                .map(Bytes::copy_from_slice)
                .collect()
        })
        .collect();
    requests.sort_by_key(|records| bodies.iter().position(|b| *b == records[0]));
    let expected: Vec<Vec<Bytes>> = bodies.chunks(50).map(<[Bytes]>::to_vec).collect();
    assert_eq!(
        requests, expected,
        "five batches of 50, then the first burst's last 7 with the second burst's 43"
    );

    // A short burst with nothing after it leaves when the batch timeout expires.
    config.batch_timeout = Duration::from_millis(100);
    let lone = HttpServer::start(Answer::default()).await;
    config.urls = vec![url(&lone, "/mpub")];
    let sink = HttpSink::new(&config).unwrap();
    let outcomes = tokio::time::timeout(
        Duration::from_secs(20),
        sink.handle_batch(bodies[..7].to_vec()),
    )
    .await
    .expect("sent after the batch timeout");
    assert_eq!(outcomes, vec![Ok(()); 7]);
    assert_eq!(lone.received().len(), 1, "one batch of 7");

    // Batch size 1: one request per record, each body as it is.
    let single = HttpServer::start(Answer::default()).await;
    let sink = HttpSink::new(&HttpSinkConfig::new(vec![url(&single, "/pub")])).unwrap();
    let outcomes = sink.handle_batch(bodies[..40].to_vec()).await;
    assert_eq!(outcomes, vec![Ok(()); 40]);
    let mut posted: Vec<Bytes> = single.received().iter().map(|r| r.body.clone()).collect();
    posted.sort_by_key(|body| bodies.iter().position(|b| b == body));
    assert_eq!(posted, bodies[..40]);
}

#[tokio::test]
async fn a_burst_answers_each_record_with_its_own_batch_or_reason() {
    // The second request fails with a 500 (requests go one at a time: concurrency 1).
    let server = HttpServer::start(Answer {
        first_statuses: vec![200, 500],
        ..Answer::default()
    })
    .await;
    let mut config = HttpSinkConfig::new(vec![url(&server, "/mpub")]);
    config.batch_size = 3;
    config.concurrency = 1;
    let sink = HttpSink::new(&config).unwrap();
    let bodies: Vec<Bytes> = ["a", "b", "c\nd", "e", "f", "g", "h"]
        .iter()
        .map(|t| Bytes::from_static(t.as_bytes()))
        .collect();
    let outcomes = sink.handle_batch(bodies).await;
    let received = server.received();
    assert_eq!(received.len(), 2, "batches [a b e] and [f g h]");
    let failed = received[1].body.clone();
    for (i, outcome) in outcomes.iter().enumerate() {
        let record = ["a", "b", "c\nd", "e", "f", "g", "h"][i];
        if i == 2 {
            assert!(
                matches!(outcome, Err(HandlerError::Reject(r)) if r.contains("line break")),
                "{outcome:?}"
            );
        } else if failed
            .split(|&b| b == b'\n')
            .any(|l| l == record.as_bytes())
        {
            assert!(
                matches!(outcome, Err(HandlerError::Retry(r)) if r.contains("HTTP 500")),
                "{record}: {outcome:?}"
            );
        } else {
            assert_eq!(outcome, &Ok(()), "{record}");
        }
    }
    let mut bodies: Vec<_> = received.iter().map(|r| r.body.clone()).collect();
    bodies.sort();
    assert_eq!(bodies, ["a\nb\ne\n", "f\ng\nh\n"]);
}

#[tokio::test]
async fn json_array_batches_are_arrays_of_the_records() {
    let server = HttpServer::start(Answer::default()).await;
    let sink = batching(&server, 3, BatchFormat::JsonArray);
    let bodies: Vec<Bytes> = ["{\"a\":1}", "[2]", "\"x\\ny\""]
        .iter()
        .map(|t| Bytes::from_static(t.as_bytes()))
        .collect();
    let outcomes = handle_in_order(&sink, &bodies).await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(server.received()[0].body, "[{\"a\":1},[2],\"x\\ny\"]");
    let error = sink
        .handle(Bytes::from_static(b"not json"))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, HandlerError::Reject(r) if r.contains("not a JSON value")),
        "{error:?}"
    );
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_failed_batch_answers_each_of_its_records() {
    // The second request fails with a 500: its records are retried, the others delivered.
    let server = HttpServer::start(Answer {
        first_statuses: vec![200, 500],
        ..Answer::default()
    })
    .await;
    let sink = batching(&server, 10, BatchFormat::Lines);
    let bodies: Vec<Bytes> = (0..30).map(|i| Bytes::from(format!("{i}"))).collect();
    let outcomes = handle_in_order(&sink, &bodies).await;
    for (i, outcome) in outcomes.iter().enumerate() {
        match i / 10 {
            1 => assert!(
                matches!(outcome, Err(HandlerError::Retry(r)) if r.contains("HTTP 500")),
                "{i}: {outcome:?}"
            ),
            _ => assert_eq!(outcome, &Ok(()), "{i}"),
        }
    }
    // A 400 refuses the whole batch, with the reason.
    let refusing = HttpServer::start(Answer {
        status: 400,
        ..Answer::default()
    })
    .await;
    let sink = batching(&refusing, 10, BatchFormat::Lines);
    let outcomes = handle_in_order(&sink, &bodies[..10]).await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Err(HandlerError::Reject(r)) if r.contains("HTTP 400"))),
        "{outcomes:?}"
    );
    assert_eq!(refusing.received().len(), 1, "one request for the batch");
}

#[tokio::test]
async fn a_record_with_a_newline_is_refused_by_lines_batches_and_the_rest_go_on() {
    let server = HttpServer::start(Answer::default()).await;
    let sink = batching(&server, 3, BatchFormat::Lines);
    let bodies = [
        Bytes::from_static(b"one"),
        Bytes::from_static(b"two\nlines"),
        Bytes::from_static(b"three"),
    ];
    let outcomes = handle_in_order(&sink, &bodies).await;
    assert_eq!(outcomes[0], Ok(()));
    assert_eq!(
        outcomes[1],
        Err(HandlerError::Reject(
            "the record holds a line break (at byte 3), so `lines` batches cannot frame it".into()
        ))
    );
    assert_eq!(outcomes[2], Ok(()));
    let received = server.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body, "one\nthree\n");
}

/// POSTs per second to a local hyper server, 2,500 at once: the http sink (at most 100
/// connections, reused) against hyper-util's pooled client that it used before (64 idle
/// connections kept, a new one whenever none is idle), alternating, three rounds; with the
/// connections each accepted.
///
/// `cargo test --release --test integration http_sink::throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn throughput() {
    const N: usize = 20_000;
    const IN_FLIGHT: usize = 2_500;
    let bodies: Vec<Bytes> = (0..N).map(|i| Bytes::from(format!("{i:0100}"))).collect();
    let run = |pooled: bool| {
        let bodies = bodies.clone();
        async move {
            let server = HttpServer::start(Answer::default()).await;
            let target = url(&server, "/");
            let sink = Arc::new(HttpSink::new(&HttpSinkConfig::new(vec![target.clone()])).unwrap());
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<http_body_util::Full<Bytes>>();
            let semaphore = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
            let started = std::time::Instant::now();
            let tasks: Vec<_> = bodies
                .into_iter()
                .map(|body| {
                    let (sink, client, target) = (sink.clone(), client.clone(), target.clone());
                    let semaphore = semaphore.clone();
                    tokio::spawn(async move {
                        let _in_flight = semaphore.acquire().await.unwrap();
                        if pooled {
                            let request = hyper::Request::post(target)
                                .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
                                .body(http_body_util::Full::new(body))
                                .unwrap();
                            let answer = client.request(request).await.unwrap();
                            http_body_util::BodyExt::collect(answer.into_body())
                                .await
                                .unwrap();
                        } else {
                            sink.handle(body).await.unwrap();
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            let rate = N as f64 / started.elapsed().as_secs_f64();
            (rate, server.connections())
        }
    };
    let (mut bounded, mut pooled) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        bounded.push(run(false).await);
        pooled.push(run(true).await);
    }
    let median = |v: &mut Vec<(f64, u64)>| {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v[v.len() / 2]
    };
    let (bounded, pooled) = (median(&mut bounded), median(&mut pooled));
    println!("{N} POSTs of 100 bytes, {IN_FLIGHT} at once, local hyper server (median of 3):");
    println!(
        "  http sink (at most 100 connections): {:>8.0} POSTs/s, {} connections",
        bounded.0, bounded.1
    );
    println!(
        "  hyper-util pooled client:            {:>8.0} POSTs/s, {} connections",
        pooled.0, pooled.1
    );
    println!("  ratio: {:.2}", bounded.0 / pooled.0);
}
