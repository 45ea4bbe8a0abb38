//! The Redis store's commit without the script (`src/dedup/redis/commit.rs`): it reads its
//! entry and then writes it whole, two round trips between which other consumers' claims may
//! take the slot. What must hold all the same: a digest is a duplicate only once some owner
//! delivered it, every digest is delivered, and a set that such a write made in a key that
//! held nothing is read as a set.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nsq_dedupe::{Claim, Digest, Geometry, RedisConfig, Store};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::redis::connect_sets;
use crate::store_contract::{digest, unique_namespace};
use crate::support::hold::Hold;
use crate::support::redis::RedisServer;

fn config(server: &RedisServer, namespace: &str, lease: Duration) -> RedisConfig {
    RedisConfig {
        urls: vec![server.url()],
        namespace: namespace.to_owned(),
        lease,
        timeout: Duration::from_secs(2),
        ..RedisConfig::default()
    }
}

/// Four owners claim digests of one set of two ways at once, "process" each for a moment,
/// and commit it, or (one time in four) fail and erase it; a digest answered in flight is
/// tried again later, as a requeued message is. So entries are pushed out and taken over
/// while commits are between their read and their write. A digest is answered duplicate
/// only once an owner delivered it, and every digest is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commits_racing_claims_of_their_slot_answer_duplicate_only_for_delivered_digests() {
    const OWNERS: u64 = 4;
    const POOL: u64 = 24;
    let server = RedisServer::start();
    let namespace = unique_namespace("commit-race");
    let geometry = Geometry::new(2, 2).unwrap();
    let lease = Duration::from_millis(150);
    let delivered: Arc<Mutex<HashSet<Digest>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut workers = Vec::new();
    for owner in 0..OWNERS {
        let store = connect_sets(config(&server, &namespace, lease), geometry)
            .await
            .unwrap();
        let delivered = Arc::clone(&delivered);
        workers.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(owner);
            let (mut rounds, mut writes) = (0u32, 0u32);
            loop {
                let undelivered: Vec<Digest> = {
                    let delivered = delivered.lock().unwrap();
                    (0..POOL)
                        .map(digest)
                        .filter(|d| !delivered.contains(d))
                        .collect()
                };
                // Enough rounds that commits meet claims, and every digest delivered.
                if (undelivered.is_empty() && rounds >= 200) || Instant::now() > deadline {
                    return (undelivered.len(), writes);
                }
                rounds += 1;
                let batch: Vec<Digest> = (0..3).map(|_| digest(rng.gen_range(0..POOL))).collect();
                let claims = store.claim_many(&batch).await;
                let mut commits = Vec::new();
                for (&d, claim) in batch.iter().zip(claims) {
                    match claim.unwrap() {
                        Claim::New => {
                            if rng.gen_range(0..4) == 0 {
                                store.erase(d).await.unwrap();
                            } else {
                                commits.push(d);
                            }
                        }
                        Claim::Duplicate => assert!(
                            delivered.lock().unwrap().contains(&d),
                            "{d:?} answered duplicate before anyone delivered it"
                        ),
                        Claim::InFlight => {}
                    }
                }
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..4))).await;
                // Delivered, then committed, as the sidecar does.
                delivered.lock().unwrap().extend(commits.iter().copied());
                writes += u32::try_from(commits.len()).unwrap();
                for answer in store.commit_many(&commits).await {
                    answer.unwrap();
                }
            }
        }));
    }
    for worker in workers {
        let (undelivered, writes) = worker.await.unwrap();
        assert_eq!(undelivered, 0, "digests never delivered");
        assert!(writes > 20, "too few commits to race: {writes}");
    }
    // The commits went through the read and the write, not the script alone.
    let calls = crate::redis::command_calls(&server);
    assert!(
        calls.get("setrange").copied().unwrap_or(0) > 100,
        "commits written without the script: {calls:?}"
    );
}

/// A commit's write into a key that no longer holds its set (removed between the read and
/// the write) leaves zeros before its entry. The script reads that as a set holding the
/// entry, not as a foreign value, and the next claim of the set writes its header.
#[tokio::test]
async fn a_set_made_by_a_commits_write_is_read_and_its_header_written() {
    let server = RedisServer::start();
    let geometry = Geometry::new(64, 4).unwrap();
    let store = connect_sets(
        config(
            &server,
            &unique_namespace("zero-header"),
            Duration::from_secs(60),
        ),
        geometry,
    )
    .await
    .unwrap();
    let owner = store.owner();
    let d = digest(1);
    let key = store.set_key(d);
    // The entry a commit writes in slot 2: slot, digest, done, time 0, owner.
    let entry = [
        &[2u8][..],
        &d.to_bytes(),
        &[2],
        &0u64.to_be_bytes(),
        &owner.to_be_bytes(),
    ]
    .concat();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let length: i64 = redis::cmd("SETRANGE")
        .arg(&key)
        .arg(3 + 2 * 34)
        .arg(&entry)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(length, 3 + 3 * 34);

    assert_eq!(store.claim(d).await.unwrap(), Claim::Duplicate);
    // Other digests of the same set: the next goes after the last entry, which fills the
    // set; the one after takes the cursor's slot, the first slot of zeros.
    let mut same_set = (2..).map(digest).filter(|&e| store.set_key(e) == key);
    let (e, f) = (same_set.next().unwrap(), same_set.next().unwrap());
    assert_eq!(store.claim(e).await.unwrap(), Claim::New);
    assert_eq!(store.unreadable_values(), 0, "read as a set");
    let value: Vec<u8> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(&value[..3], &[1, 0, 4], "version 1, cursor 0, 4 ways");
    assert_eq!(
        &value[3 + 2 * 34..3 + 3 * 34],
        &entry[..],
        "the committed entry kept"
    );
    assert_eq!(
        &value[3 + 3 * 34 + 1..3 + 3 * 34 + 17],
        &e.to_bytes(),
        "in slot 3"
    );
    assert_eq!(store.claim(f).await.unwrap(), Claim::New);
    let value: Vec<u8> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(&value[..3], &[1, 1, 4], "the cursor moved on");
    assert_eq!(&value[4..20], &f.to_bytes(), "in slot 0");
    let other = connect_sets(
        RedisConfig {
            namespace: store.config().namespace.clone(),
            ..config(&server, "", Duration::from_secs(60))
        },
        geometry,
    )
    .await
    .unwrap();
    assert_eq!(
        other
            .claim_many(&[d, e])
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect::<Vec<_>>(),
        [Claim::Duplicate, Claim::InFlight]
    );
}

/// The race the commit's two round trips allow, made to happen: between a commit's read of
/// its entry and its write, another owner's claim pushes the entry out of a full set and
/// takes its slot. The commit still writes its own digest done, which it delivered; the
/// other claim's digest is forgotten, so it is claimed new again (a possible duplicate), and
/// never answered duplicate while nobody delivered it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_between_a_commits_read_and_write_is_forgotten_not_made_a_duplicate() {
    let server = RedisServer::start();
    let hold = Hold::start(server.addr().parse().unwrap(), b"SETRANGE").await;
    let namespace = unique_namespace("commit-hold");
    // One set of one way: each new claim pushes the last one out.
    let geometry = Geometry::new(1, 1).unwrap();
    let lease = Duration::from_secs(60);
    let via_hold = RedisConfig {
        urls: vec![format!("redis://{}", hold.addr)],
        ..config(&server, &namespace, lease)
    };
    let a = connect_sets(via_hold, geometry).await.unwrap();
    let b = connect_sets(config(&server, &namespace, lease), geometry)
        .await
        .unwrap();
    let c = connect_sets(config(&server, &namespace, lease), geometry)
        .await
        .unwrap();
    let (d, e) = (digest(1), digest(2));
    assert_eq!(a.claim(d).await.unwrap(), Claim::New);
    let held = hold.arm();
    let commit = tokio::spawn(async move { a.commit(d).await });
    tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("the commit's write reached the proxy")
        .unwrap();
    // a read its entry in flight; now b's claim pushes it out.
    assert_eq!(b.claim(e).await.unwrap(), Claim::New);
    hold.release.notify_one();
    assert_eq!(commit.await.unwrap(), Ok(true));
    // d was delivered: a duplicate. e was not: never a duplicate, and still claimable.
    assert_eq!(c.claim(d).await.unwrap(), Claim::Duplicate);
    assert!(!b.commit(e).await.unwrap(), "e's entry is gone");
    assert_eq!(
        c.claim(e).await.unwrap(),
        Claim::New,
        "e forgotten, not lost"
    );
}
