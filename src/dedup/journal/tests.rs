use super::*;
use crate::dedup::table_file::{OnMismatch, TableFile};
use crate::dedup::{Claim, Geometry};

fn digest(i: u64) -> Digest {
    crate::DigestAlgorithm::default().digest(&i.to_le_bytes())
}

fn geometry() -> Geometry {
    Geometry::new(1 << 14, 8).unwrap()
}

/// Opens the table file and its journal as the sidecar does.
fn open(path: &Path) -> (TableFile, Table, Journal, JournalReport) {
    let (file, table, loaded) =
        TableFile::open(path, geometry(), "body xxh3", OnMismatch::Error, None).unwrap();
    let (journal, report) = Journal::open(&file, loaded.journal, &table, false).unwrap();
    (file, table, journal, report)
}

/// Claims and commits `digests` as the pipeline does: the table, then the journal.
fn deliver(table: &Table, journal: &Journal, digests: impl Iterator<Item = u64>) {
    for i in digests {
        assert_eq!(table.claim(digest(i)), Claim::New, "digest {i}");
        assert!(table.commit(digest(i)));
        journal.commit(digest(i));
    }
}

#[test]
fn commits_since_the_last_snapshot_survive_a_process_that_never_saved_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    {
        let (file, table, journal, report) = open(&path);
        assert!(
            report.saved_at_start,
            "a new journal starts with a snapshot"
        );
        deliver(&table, &journal, 0..300);
        journal.save(&file, &table).unwrap();
        deliver(&table, &journal, 300..1000);
        // Dropped without a snapshot: what a kill -9 leaves (the map's pages are the file's).
    }
    let (_file, table, _journal, report) = open(&path);
    assert_eq!((report.commits, report.erases), (700, 0));
    assert!(report.saved_at_start);
    for i in 0..1000 {
        assert_eq!(table.claim(digest(i)), Claim::Duplicate, "digest {i}");
    }
    assert_eq!(table.claim(digest(1000)), Claim::New);
}

#[test]
fn an_erase_after_a_commit_is_replayed_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    {
        let (_file, table, journal, _) = open(&path);
        deliver(&table, &journal, 0..10);
        assert!(table.erase(digest(3)));
        journal.erase(digest(3));
    }
    let (_file, table, _journal, report) = open(&path);
    assert_eq!((report.commits, report.erases), (10, 1));
    assert_eq!(table.claim(digest(3)), Claim::New);
    assert_eq!(table.claim(digest(4)), Claim::Duplicate);
}

#[test]
fn a_truncated_tail_is_ignored_and_the_records_before_it_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    {
        let (_file, table, journal, _) = open(&path);
        deliver(&table, &journal, 0..100);
    }
    // The new journal's first generation after its start snapshot writes to half 0... or 1:
    // find the half that holds the records, and cut the file in the middle of record 40.
    let journal_file = journal_path(&path);
    let bytes = std::fs::read(&journal_file).unwrap();
    let half = (bytes.len() - HEADER_BYTES) / 2;
    let start = if bytes[HEADER_BYTES..HEADER_BYTES + 24]
        .iter()
        .any(|&b| b != 0)
    {
        HEADER_BYTES
    } else {
        HEADER_BYTES + half
    };
    std::fs::write(&journal_file, &bytes[..start + 40 * RECORD_BYTES + 13]).unwrap();
    let (_file, table, _journal, report) = open(&path);
    assert_eq!(report.commits, 40);
    assert_eq!(report.ignored, None);
    for i in 0..40 {
        assert_eq!(table.claim(digest(i)), Claim::Duplicate, "digest {i}");
    }
    assert_eq!(table.claim(digest(40)), Claim::New, "cut off with the tail");
}

#[test]
fn a_graceful_stop_leaves_nothing_to_replay_and_no_snapshot_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    {
        let (file, table, journal, _) = open(&path);
        deliver(&table, &journal, 0..100);
        journal.save(&file, &table).unwrap();
        deliver(&table, &journal, 100..150);
        journal.save(&file, &table).unwrap();
    }
    let (file, table, journal, report) = open(&path);
    assert_eq!(report.commits, 0);
    assert!(!report.saved_at_start);
    for i in 0..150 {
        assert_eq!(table.claim(digest(i)), Claim::Duplicate, "digest {i}");
    }
    // It goes on journalling where the snapshot left off.
    deliver(&table, &journal, 1000..1005);
    drop((file, table, journal));
    let (_file, table, _journal, report) = open(&path);
    assert_eq!(report.commits, 5);
    assert_eq!(table.claim(digest(1004)), Claim::Duplicate);
}

#[test]
fn a_journal_of_another_table_file_is_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    {
        let (_file, table, journal, _) = open(&path);
        deliver(&table, &journal, 0..10);
    }
    // The table file moved away: a fresh start must not take the old journal's commits.
    std::fs::rename(&path, dir.path().join("elsewhere")).unwrap();
    let (_file, table, _journal, report) = open(&path);
    assert_eq!(report.commits, 0);
    assert!(report.ignored.is_some(), "{report:?}");
    assert_eq!(table.claim(digest(1)), Claim::New);
}

#[test]
fn a_full_half_asks_for_a_snapshot_and_counts_what_it_could_not_hold() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    let (file, table, journal, _) = open(&path);
    let capacity = journal.capacity;
    for i in 0..capacity + 5 {
        journal.commit(digest(i));
    }
    assert_eq!(journal.unjournalled(), 5);
    // The request made at half full is waiting.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        tokio::time::timeout(std::time::Duration::from_secs(1), journal.wants_snapshot())
            .await
            .expect("a snapshot was asked for");
    });
    // A snapshot starts an empty half.
    journal.save(&file, &table).unwrap();
    journal.commit(digest(u64::MAX));
    assert_eq!(journal.unjournalled(), 5);
}

#[tokio::test]
async fn with_fsync_a_commit_returns_once_its_record_is_synced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    let (file, table, loaded) =
        TableFile::open(&path, geometry(), "body xxh3", OnMismatch::Error, None).unwrap();
    let (journal, _) = Journal::open(&file, loaded.journal, &table, true).unwrap();
    assert!(journal.syncs());
    for i in 0..20 {
        journal.commit(digest(i));
        tokio::time::timeout(std::time::Duration::from_secs(10), journal.synced())
            .await
            .expect("synced");
    }
    let sync = journal.sync.as_ref().unwrap();
    assert!(*sync.finished.borrow() >= 20, "one sync per waiting commit");
}

#[test]
fn a_fifo_in_the_journal_s_place_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    let journal = journal_path(&path);
    let made = std::process::Command::new("mkfifo")
        .arg(&journal)
        .status()
        .unwrap();
    assert!(made.success());
    let (file, table, loaded) =
        TableFile::open(&path, geometry(), "body xxh3", OnMismatch::Error, None).unwrap();
    let error = Journal::open(&file, loaded.journal, &table, false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        format!(
            "{} is a FIFO: a table file, its lock, its temporary file and its journal are \
             regular files or do not exist yet; give another path",
            journal.display()
        )
    );
}
