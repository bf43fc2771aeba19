use super::*;
use crate::batch::Op;

fn put(batch: &mut Batch, i: u32) {
    batch.ops.push(Op::Put { key: format!("k{i:06}").into_bytes(), value: vec![(i % 251) as u8; 40] });
}

fn value(backend: &SledBackend, i: u32) -> Option<Vec<u8>> {
    backend.get(format!("k{i:06}").as_bytes()).expect("get")
}

/// Writes `from..to`, one batch each, each durable; nothing goes into sled by a close.
fn write(backend: &SledBackend, from: u32, to: u32) {
    for i in from..to {
        let mut batch = Batch::new();
        put(&mut batch, i);
        backend.apply(&batch).expect("apply");
        backend.barrier().expect("barrier");
    }
}

#[test]
fn records_sled_lacks_are_readable_at_once_and_reach_sled_behind_the_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal_bytes = wal::MIN_BYTES;
    // Enough to fill both halves and come back to the first: its new records are not in
    // sled when the backend goes away without a checkpoint.
    let first = SledBackend::open_sized(dir.path(), wal_bytes).expect("open");
    write(&first, 0, 2_000);
    // The back half's checkpoint runs behind the writer: let it finish.
    first.checkpoints.wait_idle().expect("checkpoint");
    let held = first.engine.stored_lsn().expect("lsn");
    assert!(held > 1_000 && held < 2_000, "the back half is not in sled: {held}");
    assert_eq!(first.log.lock().wal.half(), 0);
    drop(first);

    // The reopened store re-applies them behind the open: readable now from memory...
    let second = SledBackend::open_sized(dir.path(), wal_bytes).expect("reopen");
    assert_eq!(second.log.lock().wal.half(), 1, "the half holding the records is kept");
    assert!((0..2_000).all(|i| value(&second, i).is_some_and(|v| v == vec![(i % 251) as u8; 40])));
    // ...and the log goes on in the other half, over records sled already has, until
    // it has moved halves twice more, which waits for that checkpoint.
    write(&second, 2_000, 4_000);
    assert!(second.engine.stored_lsn().expect("lsn") >= 2_000);
    drop(second);

    let third = SledBackend::open_sized(dir.path(), wal_bytes).expect("reopen");
    assert!((0..4_000).all(|i| value(&third, i).is_some()));
    third.checkpoint().expect("checkpoint");
    assert_eq!(third.engine.stored_lsn().expect("lsn"), 4_000);
}

#[test]
fn a_marked_read_stays_current_only_until_its_key_is_written_even_through_checkpoints() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = SledBackend::open_sized(dir.path(), wal::MIN_BYTES).expect("open");
    write(&backend, 0, 10);
    backend.checkpoint().expect("checkpoint");
    let key = |i: u32| format!("k{i:06}").into_bytes();
    let (entries, mark) = backend.range_marked(&key(0), &key(10), 100).expect("range").expect("a mark");
    assert_eq!(entries.len(), 10);
    assert!((0..12).all(|i| backend.unchanged_since(mark, &key(i))));

    // Rewriting one key, or creating one, spoils the mark for that key alone...
    write(&backend, 3, 4);
    write(&backend, 11, 12);
    assert!(!backend.unchanged_since(mark, &key(3)) && !backend.unchanged_since(mark, &key(11)));
    assert!(backend.unchanged_since(mark, &key(4)));
    // ...and once a checkpoint has taken those writes out of memory, for every key.
    backend.checkpoint().expect("checkpoint");
    assert!(!backend.unchanged_since(mark, &key(3)) && !backend.unchanged_since(mark, &key(4)));

    // A checkpoint of writes made before a mark leaves it good.
    write(&backend, 1_000, 1_200);
    let (_, mark) = backend.range_marked(&key(0), &key(10), 100).expect("range").expect("a mark");
    assert!(!backend.unchanged_since(mark, &key(1_100)), "held in memory until the checkpoint");
    backend.checkpoint().expect("checkpoint");
    assert!(backend.unchanged_since(mark, &key(5)) && backend.unchanged_since(mark, &key(1_100)));
}

#[test]
fn a_quiet_writer_moves_its_log_into_sled_once_there_is_enough_of_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = SledBackend::open_sized(dir.path(), wal::MIN_BYTES).expect("open");
    // A few records are not worth a checkpoint.
    write(&backend, 0, 3);
    backend.quiet().expect("quiet");
    backend.checkpoints.wait_idle().expect("idle");
    assert_eq!(backend.engine.stored_lsn().expect("lsn"), 0);
    // Past an eighth of the half (and short of filling it), they are.
    write(&backend, 3, 200);
    assert!(
        backend.log.lock().wal.filled_past(QUIET_CHECKPOINT_SHARE) && !backend.log.lock().wal.filled_past(1)
    );
    backend.quiet().expect("quiet");
    backend.checkpoints.wait_idle().expect("idle");
    assert_eq!(backend.engine.stored_lsn().expect("lsn"), 200);
    assert!((0..200).all(|i| value(&backend, i).is_some()));
    // Gone without a close: the next open finds everything, in sled already.
    drop(backend);
    let reopened = SledBackend::open_sized(dir.path(), wal::MIN_BYTES).expect("reopen");
    assert_eq!(reopened.engine.stored_lsn().expect("lsn"), 200);
    assert!((0..200).all(|i| value(&reopened, i).is_some_and(|v| v == vec![(i % 251) as u8; 40])));
}

#[test]
fn a_quiet_store_checkpoints_a_few_records_once_they_are_old_enough() {
    let dir = tempfile::tempdir().expect("tempdir");
    let after = std::time::Duration::from_millis(300);
    let options =
        SledOptions { wal_bytes: wal::MIN_BYTES, checkpoint_after: after, ..SledOptions::default() };
    let backend = SledBackend::open_with(dir.path(), &options).expect("open");
    write(&backend, 0, 3);
    // Too few and too young: told to ask again within the interval.
    let again = backend.quiet().expect("quiet").expect("asked to be told again");
    assert!(again <= after, "{again:?}");
    backend.checkpoints.wait_idle().expect("idle");
    assert_eq!(backend.engine.stored_lsn().expect("lsn"), 0);
    // Old enough: into sled, however few.
    std::thread::sleep(again);
    assert_eq!(backend.quiet().expect("quiet"), None);
    backend.checkpoints.wait_idle().expect("idle");
    assert_eq!(backend.engine.stored_lsn().expect("lsn"), 3);
    // Nothing logged since: nothing to ask.
    assert_eq!(backend.quiet().expect("quiet"), None);
}
