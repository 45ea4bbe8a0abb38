//! Helpers shared by the integration tests.

use std::time::{Duration, Instant};

use assert_cmd::Command;

/// The `nsq-dedupe` binary under test.
pub fn bin() -> Command {
    Command::cargo_bin("nsq-dedupe").expect("the nsq-dedupe binary is built by cargo test")
}

/// Polls `cond` every 10 ms until it holds, or panics after `limit` naming `what`.
pub async fn wait_until(what: &str, limit: Duration, cond: impl FnMut() -> bool) {
    wait_until_or(what, limit, cond, String::new).await;
}

/// As [`wait_until`], and the panic message adds `detail()`, such as the counts so far.
pub async fn wait_until_or(
    what: &str,
    limit: Duration,
    mut cond: impl FnMut() -> bool,
    detail: impl Fn() -> String,
) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}: {}",
            detail()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends `signal` (such as `-TERM`) to `child` and waits at most `limit` for it to exit.
///
/// # Panics
///
/// If `kill` fails, or `child` is still running after `limit`.
pub async fn signal_and_wait(
    child: &mut std::process::Child,
    signal: &str,
    limit: Duration,
) -> std::process::ExitStatus {
    let sent = std::process::Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill {signal} failed");
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "still running {limit:?} after {signal}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two consumers of one table (`a`, `b`) add 300 and 100 distinct messages per bucket of
/// 200 ms, and a consumer of another table (`other`) 50: once their shares cover whole
/// buckets, `a` and `b` each learn the fleet's 2,000 a second, within 10%, and `other` only
/// its own 250. The stores must have a `fleet_interval` of 200 ms.
pub async fn assert_each_learns_the_fleets_rate<S: nsq_dedupe::FleetCounters>(
    a: &S,
    b: &S,
    other: &S,
) {
    let within = |rate: f64, expected: f64| (rate - expected).abs() <= expected * 0.1;
    let learned = |(a, b, other): (f64, f64, f64)| {
        within(a, 2000.0) && within(b, 2000.0) && within(other, 250.0)
    };
    // A share that a loaded machine delays past its bucket's end counts in the next one, and
    // moves the rate of the buckets read by a sixth until it leaves them: so the rates are
    // asked to hold after a full window, in some round of three windows.
    let rounds = 3 * (nsq_dedupe::FLEET_BUCKETS + 2);
    let mut seen = Vec::new();
    for round in 0..rounds {
        tokio::time::sleep(a.until_next_share()).await;
        let rates = (
            a.share_distinct(300).await.unwrap(),
            b.share_distinct(100).await.unwrap(),
            other.share_distinct(50).await.unwrap(),
        );
        seen.push(rates);
        if round > nsq_dedupe::FLEET_BUCKETS && learned(rates) {
            return;
        }
    }
    panic!(
        "the consumers of one table learn 2,000 a second each, and another table's its own \
         250, within {rounds} shares: {seen:?}"
    );
}

/// The claims of a burst when every one was answered; the first error otherwise.
pub fn claimed(
    answers: Vec<Result<nsq_dedupe::Claim, nsq_dedupe::error::StoreError>>,
) -> Result<Vec<nsq_dedupe::Claim>, nsq_dedupe::error::StoreError> {
    answers.into_iter().collect()
}

/// Claims `digests` until every one is answered (a shared store that failed answers again),
/// every 100 ms, each burst claiming again only those whose claim failed: a claim answered
/// once is not sent again, or it would find its own claim in flight. The claims, or a panic
/// after `limit` with the first error.
pub async fn claim_until_answered<S: nsq_dedupe::Store>(
    store: &S,
    digests: &[nsq_dedupe::Digest],
    limit: Duration,
) -> Vec<nsq_dedupe::Claim> {
    let deadline = Instant::now() + limit;
    let mut claims: Vec<Option<nsq_dedupe::Claim>> = vec![None; digests.len()];
    loop {
        let unanswered: Vec<usize> = (0..digests.len())
            .filter(|&i| claims[i].is_none())
            .collect();
        if unanswered.is_empty() {
            return claims.into_iter().flatten().collect();
        }
        let burst: Vec<nsq_dedupe::Digest> = unanswered.iter().map(|&i| digests[i]).collect();
        let answers = store.claim_many(&burst).await;
        let mut first_error = None;
        for (i, answer) in unanswered.into_iter().zip(answers) {
            match answer {
                Ok(claim) => claims[i] = Some(claim),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        let Some(error) = first_error else { continue };
        let failed = claims.iter().filter(|c| c.is_none()).count();
        assert!(
            Instant::now() < deadline,
            "{failed} of {} claims still fail after {limit:?}: {error}",
            digests.len(),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
