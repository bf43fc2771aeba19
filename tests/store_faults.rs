//! The store survives its own faults: a SIGKILL while it opens, an unfinished or damaged
//! sled snapshot, a missing engine folder, a typo in a data directory's name, and a barrier
//! that never returns.
//!
//! The kill test is real: a child opens a non-empty store and commits, and the parent kills
//! it with SIGKILL at seeded random times within the first 30 ms of its life — where sled
//! opens, replays its log and writes snapshots — 300 times in a row, reopening the store
//! after every kill and checking every acknowledged batch.

use std::{
    collections::HashSet,
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use durafiber_store::{
    Batch, Durability, SimBackend, SledBackend, Store, StoreConfig, StoreError, tables::keys,
};
use durafiber_testkit::SeededRng;

/// Every (thread, seq) batch in the store (the records `store-writer` writes).
fn batches_in(store: &Store) -> HashSet<(u32, u64)> {
    let mut found = HashSet::new();
    for (_, value) in store.scan(&keys::STORAGE.of_run("kill_test"), None, usize::MAX).expect("scan") {
        let value = value.expect("no record is torn");
        let mut fields = value.split(' ').map(str::parse::<u64>);
        let (Some(Ok(t)), Some(Ok(seq))) = (fields.next(), fields.next()) else {
            panic!("a record reads `thread seq part padding`: {}", &value[..value.len().min(40)]);
        };
        found.insert((t as u32, seq));
    }
    found
}

/// Runs the writer child, kills it after `after`, returns the batches it acknowledged.
fn write_then_kill(dir: &std::path::Path, first_seq: u64, after: Duration) -> Vec<(u32, u64)> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_store-writer"))
        .args([dir.to_str().expect("utf-8 path"), "2", &first_seq.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn store-writer");
    let stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| {
                let mut parts = l.strip_prefix("ack ")?.split(' ');
                Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
            })
            .collect::<Vec<(u32, u64)>>()
    });
    std::thread::sleep(after);
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    reader.join().expect("reader")
}

#[test]
fn a_sigkill_in_the_first_30_ms_never_leaves_the_store_unopenable() {
    let seed = std::env::var("KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20_261_201u64);
    println!("seed {seed}");
    let mut rng = SeededRng::new(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    // A non-empty store first: writes until some are acknowledged (a loaded machine may
    // take a while to start the child).
    let mut acked: HashSet<(u32, u64)> = HashSet::new();
    for attempt in 1..=20u64 {
        acked.extend(write_then_kill(
            dir.path(),
            attempt * 100_000_000,
            Duration::from_millis(150 * attempt),
        ));
        if !acked.is_empty() {
            break;
        }
    }
    assert!(!acked.is_empty(), "the writer acknowledged nothing");
    let mut next_seq = 10_000_000_000;
    for round in 0..300 {
        let after = Duration::from_millis(rng.between(0, 30));
        acked.extend(write_then_kill(dir.path(), next_seq, after));
        next_seq += 100_000_000;
        let store = Store::open_dir(dir.path(), StoreConfig::default()).unwrap_or_else(|e| {
            panic!("seed {seed}, round {round}: the store did not open after a kill at {after:?}: {e}")
        });
        let found = batches_in(&store);
        let lost: Vec<_> = acked.difference(&found).take(5).collect();
        assert!(lost.is_empty(), "seed {seed}, round {round}: acknowledged batches lost: {lost:?}");
        store.close();
    }
}

#[test]
fn an_unfinished_snapshot_is_removed_and_the_store_opens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let mut batch = Batch::new();
    batch.put(keys::storage("kill_test", "k"), &"1 1 0".to_string()).expect("encode");
    store.commit_blocking(batch, Durability::Sync).expect("commit");
    store.close();
    drop(store);
    // What a process killed while sled wrote a snapshot leaves behind: sled would pick it.
    let generating = dir.path().join("sled").join("snap.00000000FFFFFFFF.generating");
    std::fs::write(&generating, b"").expect("write");
    let store =
        Store::open_dir(dir.path(), StoreConfig::default()).expect("opens despite the unfinished snapshot");
    assert!(!generating.exists(), "the unfinished snapshot was removed");
    assert_eq!(store.raw_scan(keys::STORAGE.info(), 10).expect("scan").len(), 1, "the record is there");
}

#[test]
fn a_missing_engine_folder_is_refused_and_inspection_never_creates_a_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    Store::open_dir(&data, StoreConfig::default()).expect("store").close();
    std::fs::remove_dir_all(data.join("sled")).expect("remove sled/");
    match SledBackend::open(&data) {
        Err(StoreError::EngineMissing { path }) => assert_eq!(path, data),
        Err(other) => panic!("expected EngineMissing, got {other}"),
        Ok(_) => panic!("a store without its sled/ folder opened as an empty store"),
    }
    let typo = dir.path().join("dat");
    match Store::open_existing_dir(&typo, StoreConfig::default()) {
        Err(StoreError::NotAStore { path }) => assert_eq!(path, typo),
        Err(other) => panic!("expected NotAStore, got {other}"),
        Ok(_) => panic!("opened a store that does not exist"),
    }
    assert!(!typo.exists(), "inspection created {}", typo.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_that_never_returns_fails_the_store_and_every_write_after_it() {
    let sim = SimBackend::new();
    let config = StoreConfig { barrier_timeout: Duration::from_millis(200), ..Default::default() };
    let store = Store::with_backend(Arc::new(sim.clone()), config).expect("store");
    let write = |n: u64| {
        let mut batch = Batch::new();
        batch.put(keys::storage("kill_test", &format!("{n:012}")), &format!("0 {n} 0")).expect("encode");
        batch
    };
    store.commit(write(1), Durability::Sync).await.expect("a healthy commit");
    sim.stall_barriers(true);
    let started = Instant::now();
    let stuck = store.commit(write(2), Durability::Sync).await;
    assert!(matches!(stuck, Err(StoreError::Failed { .. })), "{stuck:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "failed after {:?}", started.elapsed());
    let health = store.health();
    assert!(health.failed.as_deref().is_some_and(|r| r.contains("has not returned")), "{health:?}");
    let later = Instant::now();
    assert!(matches!(store.commit(write(3), Durability::Sync).await, Err(StoreError::Failed { .. })));
    assert!(later.elapsed() < Duration::from_millis(100), "a later write fails at once");
    assert!(matches!(store.check_room(), Err(StoreError::Failed { .. })));
    // Closing a failed store never waits for its stuck writer.
    let closing = Instant::now();
    store.close();
    assert!(closing.elapsed() < Duration::from_secs(1));
    sim.stall_barriers(false);
}
