use super::*;
use crate::dedup::{Claim, Digest};

fn digest(i: u64) -> Digest {
    crate::DigestAlgorithm::default().digest(&i.to_le_bytes())
}

fn geometry() -> Geometry {
    Geometry::new(1 << 12, 8).unwrap()
}

#[test]
fn a_saved_table_comes_back_whole_with_in_flight_entries_released() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    {
        let (file, table, report) =
            TableFile::open(&path, geometry(), "body xxh3", OnMismatch::Error, None).unwrap();
        assert_eq!(report, LoadReport::default());
        // 1,000 entries in 4,096 slots: none is evicted.
        for i in 0..1000 {
            assert_eq!(table.claim(digest(i)), Claim::New);
            assert!(table.commit(digest(i)));
        }
        for i in 1000..1010 {
            assert_eq!(table.claim(digest(i)), Claim::New);
        }
        file.save(&table).unwrap();
    }
    let (_file, table, report) =
        TableFile::open(&path, geometry(), "body xxh3", OnMismatch::Error, None).unwrap();
    assert_eq!((report.entries, report.released_in_flight), (1000, 10));
    assert!(report.snapshot_at.is_some());
    for i in 0..1000 {
        assert_eq!(table.claim(digest(i)), Claim::Duplicate, "entry {i}");
    }
    for i in 1000..1010 {
        assert_eq!(table.claim(digest(i)), Claim::New, "released {i}");
    }
}

#[test]
fn other_settings_and_damage_are_errors_that_say_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    let (file, table, _) =
        TableFile::open(&path, geometry(), "json:/id xxh3", OnMismatch::Error, None).unwrap();
    assert!(!table.contains_and_add(digest(1)));
    file.save(&table).unwrap();
    drop(file);
    let error = TableFile::open(
        &path,
        Geometry::new(1 << 13, 4).unwrap(),
        "body md5",
        OnMismatch::Error,
        None,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        error,
        format!(
            "table file {} was written for 4096 slots in sets of 8 ways, not 8192 in sets \
             of 4, and digests of \"json:/id xxh3\", not \"body md5\"; start fresh by \
             moving the file away (the table starts empty) or with \
             `store.table_file_on_mismatch = \"recreate\"`",
            path.display()
        )
    );
    // One flipped bit in the slots.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[HEADER_BYTES + 77] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let error = TableFile::open(&path, geometry(), "json:/id xxh3", OnMismatch::Error, None)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("is damaged: its slots do not match their checksum"),
        "{error}"
    );
    // Truncated.
    std::fs::write(&path, &bytes[..HEADER_BYTES + 100]).unwrap();
    let error = TableFile::open(&path, geometry(), "json:/id xxh3", OnMismatch::Error, None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("(truncated?)"), "{error}");
    // Recreate: the damaged file is kept aside, the table starts empty.
    let (_file, table, report) = TableFile::open(
        &path,
        geometry(),
        "json:/id xxh3",
        OnMismatch::Recreate,
        None,
    )
    .unwrap();
    assert!(report.recreated.is_some());
    assert_eq!(table.occupied(), 0);
    let aside = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("table.bad-"))
        .count();
    assert_eq!(aside, 1);
}

#[test]
fn a_file_of_another_size_is_resized_and_a_restart_keeps_every_generation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    let open = |slots: u64, policy: OnMismatch| {
        TableFile::open(
            &path,
            Geometry::new(slots, 8).unwrap(),
            "body xxh3",
            policy,
            None,
        )
    };
    {
        let (file, table, _) = open(4096, OnMismatch::Resize).unwrap();
        for i in 0..1000 {
            assert!(!table.contains_and_add(digest(i)));
        }
        file.save(&table).unwrap();
    }
    let version = |path: &Path| std::fs::read(path).unwrap()[8];
    assert_eq!(version(&path), 1, "one generation: version 1");
    let inserts_left = {
        let (file, table, report) = open(16384, OnMismatch::Resize).unwrap();
        assert_eq!(report.resized_from, Some(geometry()));
        assert_eq!((report.entries, table.slots()), (1000, 16384));
        for i in 0..1000 {
            assert_eq!(table.claim(digest(i)), Claim::Duplicate, "entry {i}");
        }
        for i in 1000..1500 {
            assert_eq!(table.claim(digest(i)), Claim::New, "entry {i}");
            assert!(table.commit(digest(i)));
        }
        // In flight at the save: released at the next start.
        assert_eq!(table.claim(digest(1500)), Claim::New);
        file.save(&table).unwrap();
        table.resizing().unwrap().inserts_left
    };
    assert_eq!(version(&path), 2, "mid-resize: version 2");
    {
        let (file, table, report) = open(16384, OnMismatch::Resize).unwrap();
        assert_eq!(report.resized_from, None);
        assert_eq!((report.entries, report.released_in_flight), (1500, 1));
        let resizing = table.resizing().unwrap();
        assert_eq!((resizing.generations, resizing.previous_slots), (2, 4096));
        assert_eq!(resizing.inserts_left, inserts_left, "the count goes on");
        assert!(inserts_left < 16384);
        for i in 0..1500 {
            assert!(table.contains(digest(i)), "entry {i}");
        }
        assert!(!table.contains(digest(1500)), "released");
        file.save(&table).unwrap();
    }
    // Resized again mid-resize: three generations, nothing forgotten.
    let (_file, table, report) = open(8192, OnMismatch::Resize).unwrap();
    assert_eq!(report.resized_from, Some(Geometry::new(16384, 8).unwrap()));
    assert_eq!(table.resizing().unwrap().generations, 3);
    for i in 0..1500 {
        assert_eq!(table.claim(digest(i)), Claim::Duplicate, "entry {i}");
    }
    drop((_file, table));
    // `error` refuses another size; `recreate` starts empty.
    let error = open(4096, OnMismatch::Error).unwrap_err().to_string();
    assert!(
        error.contains("was written for 16384 slots in sets of 8 ways, not 4096 in sets of 8"),
        "{error}"
    );
    let (_file, table, report) = open(4096, OnMismatch::Recreate).unwrap();
    assert!(report.recreated.is_some());
    assert_eq!((table.occupied(), table.resizing()), (0, None));
}

#[test]
fn times_survive_a_restart_and_max_age_can_change() {
    use crate::dedup::clock::ManualClock;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let timed = |age: u64| -> Option<(Duration, Arc<dyn Clock>)> {
        Some((Duration::from_secs(age), clock.clone()))
    };
    {
        let (file, table, _) =
            TableFile::open(&path, geometry(), "body xxh3", OnMismatch::Error, timed(60)).unwrap();
        assert!(!table.contains_and_add(digest(1)));
        clock.advance_ms(50_000);
        assert!(!table.contains_and_add(digest(2)));
        file.save(&table).unwrap();
    }
    clock.advance_ms(20_000);
    // Digest 1 is 70 s old, digest 2 is 20 s old.
    let (_file, table, report) =
        TableFile::open(&path, geometry(), "body xxh3", OnMismatch::Error, timed(60)).unwrap();
    assert_eq!(report.entries, 2);
    assert!(table.contains(digest(2)));
    assert!(
        !table.contains(digest(1)),
        "older than max_age across the restart"
    );
    drop((_file, table));
    // Without max_age, the times are dropped and both are held.
    let (_file, table, _) =
        TableFile::open(&path, geometry(), "body xxh3", OnMismatch::Error, None).unwrap();
    assert!(table.contains(digest(1)) && table.contains(digest(2)));
}

#[test]
fn a_second_user_of_the_file_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table");
    let _first = TableFile::open(&path, geometry(), "body xxh3", OnMismatch::Error, None).unwrap();
    let error = TableFile::open(&path, geometry(), "body xxh3", OnMismatch::Error, None)
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        format!(
            "table file {} is in use by process {} (its lock {}.lock is held); stop it, or \
             give this process another file",
            path.display(),
            std::process::id(),
            path.display()
        )
    );
}
