//! The NSQ client's upgrades (TLS, snappy, deflate, AUTH) against the test broker, which
//! negotiates them as nsqd does (`support::broker`, `support::wire`).
//!
//! Each consuming test publishes, consumes and finishes a known set of messages and checks
//! that every one was finished exactly once over a connection that really was upgraded. Each
//! refusal checks that the consumer or producer reports it as permanent and names the setting.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nsq_dedupe::nsq::{
    AuthSecret, Compression, Consumer, ConsumerConfig, Error, Producer, ProducerConfig, Transport,
};
use nsq_dedupe::tls::{TlsSettings, TlsVersion};

use crate::nsq::{assert_all_finished_once, body, config, consume_finishing, CHANNEL, TOPIC};
use crate::support::broker::{Auth, Broker, BrokerConfig, Tls};
use crate::support::child::{Child, Reading};
use crate::support::wire::{ClientAuth, Pki};

const N: usize = 300;

fn tls_to(pki: &Pki) -> TlsSettings {
    TlsSettings {
        root_ca_file: Some(pki.ca_file()),
        ..TlsSettings::default()
    }
}

fn auth(topics: &[&str]) -> Option<Auth> {
    Some(Auth {
        secret: "s3cret-token".into(),
        identity: "dedupe@example".into(),
        topics: topics.iter().map(|t| t.to_string()).collect(),
    })
}

fn secret(text: &str) -> Option<AuthSecret> {
    Some(AuthSecret::new(text).unwrap())
}

fn consumer_with(addr: SocketAddr, transport: Transport) -> ConsumerConfig {
    let mut c = config(&[addr]);
    c.max_in_flight = 50;
    c.transport = transport;
    c
}

/// Publishes [`N`] messages, consumes and finishes them over `transport`, and returns what
/// the broker saw of the client.
async fn consume_all(broker: BrokerConfig, transport: Transport) -> (bool, Option<&'static str>) {
    let broker = Broker::start(broker).await;
    broker.publish_many(TOPIC, (0..N).map(body));
    let mut consumer = Consumer::new(consumer_with(broker.tcp_addr(), transport)).unwrap();
    let got = consume_finishing(&mut consumer, N, Duration::ZERO, Duration::from_secs(20)).await;
    let mut got: Vec<Bytes> = got;
    got.sort();
    let mut expected: Vec<Bytes> = (0..N).map(body).collect();
    expected.sort();
    assert_eq!(got, expected);
    let client = broker.clients().into_iter().next().expect("a client");
    consumer.shutdown(Duration::from_secs(2)).await;
    assert_all_finished_once(&broker, N);
    (client.tls, client.compression)
}

#[tokio::test]
async fn consumes_over_tls() {
    let pki = Pki::new();
    let broker = BrokerConfig {
        tls: Some(Tls(pki.server(ClientAuth::None))),
        tls_required: true,
        ..BrokerConfig::default()
    };
    let transport = Transport {
        tls: Some(tls_to(&pki)),
        ..Transport::default()
    };
    assert_eq!(consume_all(broker, transport).await, (true, None));
}

#[tokio::test]
async fn consumes_over_tls_with_a_client_certificate_and_tls_1_3() {
    let pki = Pki::new();
    let (cert, key) = pki.client_files();
    let broker = BrokerConfig {
        tls: Some(Tls(pki.server(ClientAuth::RequireVerify))),
        tls_required: true,
        ..BrokerConfig::default()
    };
    let transport = Transport {
        tls: Some(TlsSettings {
            cert_file: Some(cert),
            key_file: Some(key),
            min_version: TlsVersion::Tls13,
            ..tls_to(&pki)
        }),
        ..Transport::default()
    };
    assert_eq!(consume_all(broker, transport).await, (true, None));
}

#[tokio::test]
async fn consumes_with_snappy() {
    let transport = Transport {
        compression: Compression::Snappy,
        ..Transport::default()
    };
    assert_eq!(
        consume_all(BrokerConfig::default(), transport).await,
        (false, Some("snappy"))
    );
}

#[tokio::test]
async fn consumes_with_deflate() {
    let transport = Transport {
        compression: Compression::Deflate { level: 9 },
        ..Transport::default()
    };
    assert_eq!(
        consume_all(BrokerConfig::default(), transport).await,
        (false, Some("deflate"))
    );
}

#[tokio::test]
async fn consumes_over_tls_with_deflate_and_auth() {
    let pki = Pki::new();
    let broker = BrokerConfig {
        tls: Some(Tls(pki.server(ClientAuth::None))),
        auth: auth(&[TOPIC]),
        ..BrokerConfig::default()
    };
    let transport = Transport {
        tls: Some(tls_to(&pki)),
        compression: Compression::Deflate { level: 1 },
        auth_secret: secret("s3cret-token\n"),
    };
    assert_eq!(
        consume_all(broker, transport).await,
        (true, Some("deflate"))
    );
}

#[tokio::test]
async fn consumes_over_tls_with_snappy() {
    let pki = Pki::new();
    let broker = BrokerConfig {
        tls: Some(Tls(pki.server(ClientAuth::None))),
        ..BrokerConfig::default()
    };
    let transport = Transport {
        tls: Some(tls_to(&pki)),
        compression: Compression::Snappy,
        ..Transport::default()
    };
    assert_eq!(consume_all(broker, transport).await, (true, Some("snappy")));
}

#[tokio::test]
async fn an_nsqd_without_compression_is_used_uncompressed() {
    let broker = BrokerConfig {
        snappy: false,
        ..BrokerConfig::default()
    };
    let transport = Transport {
        compression: Compression::Snappy,
        ..Transport::default()
    };
    assert_eq!(consume_all(broker, transport).await, (false, None));
}

/// The refusal the consumer reports for `transport` against `broker`, within a bound.
async fn refusal(broker: BrokerConfig, transport: Transport) -> (Arc<Error>, Broker) {
    let broker = Broker::start(broker).await;
    broker.publish(TOPIC, "never delivered");
    let consumer = Consumer::new(consumer_with(broker.tcp_addr(), transport)).unwrap();
    let error = tokio::time::timeout(Duration::from_secs(10), consumer.refused())
        .await
        .expect("a refusal within 10 s");
    assert!(error.is_permanent(), "{error}");
    consumer.shutdown(Duration::from_secs(1)).await;
    assert_eq!(broker.depth(TOPIC, CHANNEL).2, 0, "nothing left in flight");
    (error, broker)
}

#[tokio::test]
async fn auth_refusals_are_permanent_and_name_the_secret() {
    let text = |e: Arc<Error>| e.to_string();
    let (error, broker) = refusal(
        BrokerConfig {
            auth: auth(&[TOPIC]),
            ..BrokerConfig::default()
        },
        Transport {
            auth_secret: secret("wrong"),
            ..Transport::default()
        },
    )
    .await;
    let error = text(error);
    assert!(
        error.contains("refused AUTH: E_AUTH_FAILED AUTH failed"),
        "{error}"
    );
    assert!(
        error.contains("`--auth-secret` (`consumer_opt.auth_secret`)"),
        "{error}"
    );
    assert!(
        !error.contains("wrong"),
        "the secret is never shown: {error}"
    );
    assert_eq!(broker.stats().auth_requests, 1, "no retry after a refusal");

    let (error, _) = refusal(
        BrokerConfig {
            auth: auth(&[TOPIC]),
            ..BrokerConfig::default()
        },
        Transport::default(),
    )
    .await;
    let error = text(error);
    assert!(error.contains("nsqd requires AUTH"), "{error}");
    assert!(error.contains("`--auth-secret`"), "{error}");

    let (error, _) = refusal(
        BrokerConfig {
            auth: auth(&["other-topic"]),
            ..BrokerConfig::default()
        },
        Transport {
            auth_secret: secret("s3cret-token"),
            ..Transport::default()
        },
    )
    .await;
    let error = text(error);
    assert!(
        error.contains("refused SUB: E_UNAUTHORIZED AUTH failed for SUB on \"events\" \"dedupe\""),
        "{error}"
    );
}

#[tokio::test]
async fn tls_refusals_are_permanent_and_name_the_setting() {
    let pki = Pki::new();
    let tls_broker = |client_auth| BrokerConfig {
        tls: Some(Tls(pki.server(client_auth))),
        tls_required: true,
        ..BrokerConfig::default()
    };
    // nsqd requires TLS and the client does not ask.
    let (error, _) = refusal(tls_broker(ClientAuth::None), Transport::default()).await;
    let error = error.to_string();
    assert!(
        error.contains("E_INVALID cannot SUB in current state (TLS required)"),
        "{error}"
    );
    assert!(error.contains("`--tls` (`consumer_opt.tls_v1`)"), "{error}");

    // A certificate signed by a CA the client does not trust.
    let untrusted = Transport {
        tls: Some(TlsSettings {
            root_ca_file: Some(pki.other_ca_file()),
            ..TlsSettings::default()
        }),
        ..Transport::default()
    };
    let (error, _) = refusal(tls_broker(ClientAuth::None), untrusted).await;
    let error = error.to_string();
    assert!(
        error.contains("refused TLS: invalid peer certificate"),
        "{error}"
    );
    assert!(error.contains("`--tls-root-ca-file`"), "{error}");

    // nsqd wants a client certificate.
    let transport = Transport {
        tls: Some(tls_to(&pki)),
        ..Transport::default()
    };
    let (error, _) = refusal(tls_broker(ClientAuth::RequireVerify), transport).await;
    let error = error.to_string();
    assert!(
        error.contains("`--tls-cert`") && error.contains("`--tls-key`"),
        "{error}"
    );

    // TLS asked of an nsqd that has none: refused, never used in the clear.
    let transport = Transport {
        tls: Some(tls_to(&pki)),
        ..Transport::default()
    };
    let (error, _) = refusal(BrokerConfig::default(), transport).await;
    let error = error.to_string();
    assert!(error.contains("nsqd did not agree to TLS"), "{error}");
}

#[tokio::test]
async fn skipping_verification_connects_to_an_untrusted_certificate() {
    let pki = Pki::new();
    let broker = BrokerConfig {
        tls: Some(Tls(pki.server(ClientAuth::None))),
        tls_required: true,
        ..BrokerConfig::default()
    };
    let transport = Transport {
        tls: Some(TlsSettings {
            insecure_skip_verify: true,
            ..TlsSettings::default()
        }),
        ..Transport::default()
    };
    assert_eq!(consume_all(broker, transport).await, (true, None));
}

#[tokio::test]
async fn unusable_tls_files_fail_at_start_naming_the_key() {
    let mut c = ConsumerConfig::new(TOPIC, CHANNEL);
    c.nsqd_tcp_addresses = vec!["127.0.0.1:4150".into()];
    c.transport.tls = Some(TlsSettings {
        root_ca_file: Some("/nonexistent/ca.pem".into()),
        ..TlsSettings::default()
    });
    let error = Consumer::new(c)
        .err()
        .expect("refused at start")
        .to_string();
    assert!(
        error.starts_with(
            "invalid NSQ setting `tls_root_ca_file`: cannot use CA file /nonexistent/ca.pem"
        ),
        "{error}"
    );
}

fn producer_to(addr: SocketAddr, transport: Transport) -> Producer {
    let mut config = ProducerConfig::new(vec![addr.to_string()]);
    config.transport = transport;
    config.reconnect_backoff_min = Duration::from_millis(20);
    Producer::new(config).unwrap()
}

#[tokio::test]
async fn the_producer_publishes_over_tls_with_auth_and_snappy() {
    let pki = Pki::new();
    let broker = Broker::start(BrokerConfig {
        tls: Some(Tls(pki.server(ClientAuth::None))),
        tls_required: true,
        auth: auth(&["out"]),
        ..BrokerConfig::default()
    })
    .await;
    let producer = producer_to(
        broker.tcp_addr(),
        Transport {
            tls: Some(tls_to(&pki)),
            compression: Compression::Snappy,
            auth_secret: secret("s3cret-token"),
        },
    );
    for i in 0..50 {
        producer.publish("out", body(i)).await.unwrap();
    }
    producer
        .multi_publish("out", (50..N).map(body).collect())
        .await
        .unwrap();
    assert_eq!(
        broker.messages_on("out"),
        (0..N).map(body).collect::<Vec<_>>()
    );
    let client = broker.clients().into_iter().next().expect("the producer");
    assert!(client.tls);
    assert_eq!(client.compression, Some("snappy"));
    assert_eq!(client.auth_secret.as_deref(), Some("s3cret-token"));
}

#[tokio::test]
async fn the_producer_reports_a_refusal_as_permanent() {
    let broker = Broker::start(BrokerConfig {
        auth: auth(&["out"]),
        ..BrokerConfig::default()
    })
    .await;
    let producer = producer_to(
        broker.tcp_addr(),
        Transport {
            auth_secret: secret("s3cret-token"),
            ..Transport::default()
        },
    );
    // Allowed on "out" only: publishing elsewhere is refused for good.
    let error = producer.publish("elsewhere", "x").await.unwrap_err();
    assert!(error.is_permanent(), "{error}");
    let refused = tokio::time::timeout(Duration::from_secs(5), producer.refused())
        .await
        .expect("reported");
    let text = refused.to_string();
    assert!(
        text.contains("E_UNAUTHORIZED AUTH failed for PUB on \"elsewhere\" \"\""),
        "{text}"
    );
    assert!(text.contains("`--producer-opt auth_secret,…`"), "{text}");
    assert!(broker.messages_on("elsewhere").is_empty());
}

/// Runs the binary's `run` with `args` until it exits (or panics after `limit`); returns the
/// exit code and stderr.
fn run_binary(args: Vec<String>, envs: &[(&str, &str)], limit: Duration) -> (i32, String) {
    let finished = Child::spawn_reading(
        std::process::Command::new(assert_cmd::cargo::cargo_bin("nsq-dedupe"))
            .arg("run")
            .args(["--metrics-address", "off", "--log-level", "info"])
            .args(&args)
            .envs(envs.iter().copied())
            .stdin(std::process::Stdio::null()),
        Reading::Stderr,
    )
    .wait_within(limit);
    (finished.code().unwrap_or(-1), finished.stderr)
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_when_nsqd_refuses_its_secret_and_never_shows_it() {
    let broker = Broker::start(BrokerConfig {
        auth: auth(&[TOPIC]),
        ..BrokerConfig::default()
    })
    .await;
    broker.publish(TOPIC, "kept");
    let addr = broker.tcp_addr().to_string();
    let args = strings(&[
        "--topic",
        TOPIC,
        "--channel",
        CHANNEL,
        "--nsqd-tcp-address",
        &addr,
    ]);
    let (code, stderr) = tokio::task::spawn_blocking(move || {
        run_binary(
            args,
            &[("NSQ_DEDUPE_AUTH_SECRET", "not-the-secret")],
            Duration::from_secs(20),
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{stderr}");
    // The secret came from its variable, which the advice names.
    assert_eq!(
        stderr.lines().last().unwrap(),
        format!(
            "error: stopped: nsqd {addr} refused AUTH: E_AUTH_FAILED AUTH failed; nsqd's auth \
             server refused the secret, or nsqd could not reach it; check \
             `NSQ_DEDUPE_AUTH_SECRET` and nsqd's --auth-http-address"
        )
    );
    assert!(!stderr.contains("not-the-secret"), "{stderr}");
    assert_eq!(broker.finished(TOPIC, CHANNEL).len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_when_the_sinks_nsqd_refuses_and_loses_nothing() {
    let source = Broker::start(BrokerConfig::default()).await;
    let sink = Broker::start(BrokerConfig {
        auth: auth(&["somewhere-else"]),
        ..BrokerConfig::default()
    })
    .await;
    for i in 0..5 {
        source.publish(TOPIC, body(i));
    }
    let args = strings(&[
        "--topic",
        TOPIC,
        "--channel",
        CHANNEL,
        "--nsqd-tcp-address",
        &source.tcp_addr().to_string(),
        "--sink",
        "nsq",
        "--destination-nsqd-tcp-address",
        &sink.tcp_addr().to_string(),
        "--destination-topic",
        "events.unique",
        "--producer-opt",
        "auth_secret,s3cret-token",
    ]);
    let (code, stderr) =
        tokio::task::spawn_blocking(move || run_binary(args, &[], Duration::from_secs(20)))
            .await
            .unwrap();
    assert_eq!(code, 1, "{stderr}");
    let last = stderr.lines().last().unwrap();
    // One message goes out as PUB, a burst as MPUB; the error names the command nsqd refused.
    assert!(
        ["PUB", "MPUB"].iter().any(|command| last.contains(&format!(
            "refused {command}: E_UNAUTHORIZED AUTH failed for {command} on \"events.unique\" \"\""
        ))),
        "{last}"
    );
    assert!(last.contains("`--producer-opt auth_secret,…`"), "{last}");
    // Nothing was published, so nothing was finished: every message is back on the channel.
    assert!(sink.messages_on("events.unique").is_empty());
    assert_eq!(source.finished(TOPIC, CHANNEL).len(), 0);
    let (queued, deferred, in_flight) = source.depth(TOPIC, CHANNEL);
    assert_eq!((queued + deferred, in_flight), (5, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_consumes_over_tls_with_auth_and_publishes_over_tls_with_deflate() {
    let pki = Pki::new();
    let source = Broker::start(BrokerConfig {
        tls: Some(Tls(pki.server(ClientAuth::None))),
        tls_required: true,
        auth: auth(&[TOPIC]),
        ..BrokerConfig::default()
    })
    .await;
    let sink = Broker::start(BrokerConfig {
        tls: Some(Tls(pki.server(ClientAuth::None))),
        tls_required: true,
        ..BrokerConfig::default()
    })
    .await;
    // 100 distinct bodies, each published twice (a replicated stream).
    for _copy in 0..2 {
        source.publish_many(TOPIC, (0..100).map(body));
    }
    let secret_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret_file.path(), "s3cret-token\n").unwrap();
    let ca = pki.ca_file().display().to_string();
    let producer_ca = format!("tls_root_ca_file,{ca}");
    let args = strings(&[
        "--topic",
        TOPIC,
        "--channel",
        CHANNEL,
        "--nsqd-tcp-address",
        &source.tcp_addr().to_string(),
        "--tls",
        "--tls-root-ca-file",
        &ca,
        "--snappy",
        "--auth-secret-file",
        &secret_file.path().display().to_string(),
        "--sink",
        "nsq",
        "--destination-nsqd-tcp-address",
        &sink.tcp_addr().to_string(),
        "--destination-topic",
        "events.unique",
        "--producer-opt",
        "tls_v1",
        "--producer-opt",
        &producer_ca,
        "--producer-opt",
        "deflate_level,1",
    ]);
    let child = Child::bin(
        ["run", "--metrics-address", "off"]
            .iter()
            .map(|&a| a.to_owned())
            .chain(args),
    );
    crate::util::wait_until_or(
        "every copy finished",
        Duration::from_secs(20),
        || source.finished(TOPIC, CHANNEL).len() == 200,
        || format!("finished {}", source.finished(TOPIC, CHANNEL).len()),
    )
    .await;
    child.signal("TERM");
    child
        .finish_within(Duration::from_secs(20))
        .await
        .assert_success();
    let mut published = sink.messages_on("events.unique");
    published.sort();
    let mut expected: Vec<Bytes> = (0..100).map(body).collect();
    expected.sort();
    assert_eq!(published, expected, "each body exactly once");
    assert_eq!(source.depth(TOPIC, CHANNEL), (0, 0, 0));
}

/// Consumes and FINishes `n` JSON-like 100-byte bodies over `transport`; returns messages per
/// second, from the first message to the last FIN at the broker.
async fn transport_rate(broker: BrokerConfig, transport: Transport, n: usize) -> f64 {
    let broker = Broker::start(BrokerConfig {
        record_messages: false,
        ..broker
    })
    .await;
    broker.publish_many(
        TOPIC,
        (0..n).map(|i| {
            let mut text = format!(
                "{{\"id\":{i},\"sensor\":\"s-{}\",\"value\":{},\"unit\":\"C\",\"ok\":true,\"pad\":\"",
                i % 97,
                (i * 7919) % 10007
            );
            while text.len() < 98 {
                text.push(char::from(b'a' + (i % 23) as u8));
            }
            text.push_str("\"}");
            Bytes::from(text)
        }),
    );
    let mut c = consumer_with(broker.tcp_addr(), transport);
    c.max_in_flight = 2500;
    c.msg_timeout = Some(Duration::from_secs(60));
    c.heartbeat_interval = Duration::from_secs(30);
    let mut consumer = Consumer::new(c).unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .unwrap()
        .unwrap();
    let started = std::time::Instant::now();
    first.finish().unwrap();
    for _ in 1..n {
        let m = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .unwrap()
            .unwrap();
        m.finish().unwrap();
    }
    crate::util::wait_until("all FINs", Duration::from_secs(60), || {
        broker.stats().fin_ok == n as u64
    })
    .await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    consumer.shutdown(Duration::from_secs(1)).await;
    assert_eq!(broker.depth(TOPIC, CHANNEL), (0, 0, 0));
    rate
}

/// Throughput over each transport as a ratio to plain TCP, rounds interleaved so that noise
/// hits every variant alike; medians of 5.
///
/// `cargo test --release --test integration nsq_transport::throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly in release mode"]
async fn throughput() {
    const N: usize = 200_000;
    let pki = Pki::new();
    let variants = ["plain", "tls", "snappy", "deflate", "deflate1"];
    let make = |name: &str| -> (BrokerConfig, Transport) {
        let mut broker = BrokerConfig::default();
        let mut transport = Transport::default();
        match name {
            "tls" => {
                broker.tls = Some(Tls(pki.server(ClientAuth::None)));
                transport.tls = Some(tls_to(&pki));
            }
            "snappy" => transport.compression = Compression::Snappy,
            "deflate" => transport.compression = Compression::Deflate { level: 6 },
            "deflate1" => transport.compression = Compression::Deflate { level: 1 },
            _ => {}
        }
        (broker, transport)
    };
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for _round in 0..5 {
        for (i, name) in variants.iter().enumerate() {
            let (broker, transport) = make(name);
            rates[i].push(transport_rate(broker, transport, N).await);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = rates.iter_mut().map(median).collect();
    for (name, rate) in variants.iter().zip(&medians) {
        println!(
            "transport {name:>8}: {rate:>9.0} msgs/s, {:.2} of plain",
            rate / medians[0]
        );
    }
}
