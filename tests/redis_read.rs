//! The Redis store's claims decided on a plain read of a full set (`src/dedup/redis/read.rs`):
//! the set is read with `GET`, and an absent digest written by a script that first checks the
//! set's header. Between the read and the write other consumers may change the set. What must
//! hold all the same: two claims of one digest are never both new (the second write is
//! refused, and its claim finds the first), and what others wrote in between stands.

use std::time::Duration;

use nsq_dedupe::{Claim, Geometry, RedisConfig, RedisStore, Store};

use crate::store_contract::{digest, unique_namespace};
use crate::support::hold::Hold;
use crate::support::redis::RedisServer;

/// One set of two ways.
fn geometry() -> Geometry {
    Geometry::new(2, 2).unwrap()
}

fn config(url: String, namespace: &str) -> RedisConfig {
    RedisConfig {
        urls: vec![url],
        namespace: namespace.to_owned(),
        lease: Duration::from_secs(60),
        timeout: Duration::from_secs(5),
        ..RedisConfig::default()
    }
}

/// Stores on one namespace: `a` through a proxy that holds its next script run, `b` and `c`
/// straight to the server.
async fn stores(
    server: &RedisServer,
    hold: &Hold,
    tag: &str,
) -> (RedisStore, RedisStore, RedisStore) {
    let namespace = unique_namespace(tag);
    let direct = || RedisStore::connect(config(server.url(), &namespace), geometry());
    let a = RedisStore::connect(
        config(format!("redis://{}", hold.addr), &namespace),
        geometry(),
    )
    .await
    .unwrap();
    (a, direct().await.unwrap(), direct().await.unwrap())
}

/// Runs `a`'s claim of `d` with its write held at the proxy, `meanwhile` done before the
/// write goes on; the claim's answer.
async fn claim_held(
    hold: &Hold,
    a: &RedisStore,
    d: nsq_dedupe::Digest,
    meanwhile: impl std::future::Future<Output = ()>,
) -> Claim {
    let held = hold.arm();
    let a = a.clone();
    let claim = tokio::spawn(async move { a.claim(d).await });
    tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("the claim's write reached the proxy")
        .unwrap();
    meanwhile.await;
    hold.release.notify_one();
    claim.await.unwrap().unwrap()
}

/// The copies of one message claimed by two consumers at once: `a` reads the full set and
/// finds the digest absent, and before its write, `b` claims the same digest. `a`'s write is
/// refused (the header moved), and its claim finds `b`'s in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_the_same_digest_between_the_read_and_the_write_refuses_the_write() {
    let server = RedisServer::start();
    let hold = Hold::start(server.addr().parse().unwrap(), b"EVALSHA").await;
    let (a, b, c) = stores(&server, &hold, "read-same").await;
    let (x, y, d) = (digest(1), digest(2), digest(3));
    // The set full: x and y, done.
    assert_eq!(b.claim_done_many(&[x, y]).await, vec![Ok(Claim::New); 2]);
    let claim = claim_held(&hold, &a, d, async {
        assert_eq!(b.claim(d).await.unwrap(), Claim::New);
    })
    .await;
    assert_eq!(claim, Claim::InFlight, "claimed new by b first");
    assert!(!a.commit(d).await.unwrap(), "a holds no claim of d");
    assert!(b.commit(d).await.unwrap());
    assert_eq!(c.claim(d).await.unwrap(), Claim::Duplicate);
}

/// The write holds only the new entry and the header: a commit of another entry of the set
/// made between the read and the write stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_between_the_read_and_the_write_stands() {
    let server = RedisServer::start();
    let hold = Hold::start(server.addr().parse().unwrap(), b"EVALSHA").await;
    let (a, b, c) = stores(&server, &hold, "read-commit").await;
    let (x, y, z, d) = (digest(1), digest(2), digest(3), digest(4));
    // b claims x and y (the set full), then z, which takes x's slot, the cursor's: the
    // cursor is at y's slot now, which a's claim takes; z lies between it and the header.
    assert_eq!(b.claim_many(&[x, y]).await, vec![Ok(Claim::New); 2]);
    assert_eq!(b.claim(z).await.unwrap(), Claim::New);
    let claim = claim_held(&hold, &a, d, async {
        assert!(b.commit(z).await.unwrap());
    })
    .await;
    assert_eq!(claim, Claim::New);
    assert_eq!(
        c.claim(z).await.unwrap(),
        Claim::Duplicate,
        "z's commit stands"
    );
    assert_eq!(c.claim(d).await.unwrap(), Claim::InFlight);
    assert!(a.commit(d).await.unwrap());
    assert_eq!(c.claim(d).await.unwrap(), Claim::Duplicate);
    assert_eq!(
        c.claim(y).await.unwrap(),
        Claim::New,
        "y was pushed out by d"
    );
}
