//! What the store promises besides surviving a kill: every backend (sled, simulated,
//! PostgreSQL) passes the conformance suite; one process at a time owns a database; a corrupt record is a typed error naming it while every other record stays
//! readable; a second process cannot open a directory in use; and the simulated backend
//! loses exactly the writes after the last barrier.

use durafiber_testkit::process::{CHILD_DEADLINE, OutputWithin};
use std::sync::Arc;

use durafiber_store::PgBackend;
use durafiber_store::{
    Backend, Batch, Durability, RunId, SimBackend, SimCrash, SledBackend, Store, StoreConfig, StoreError,
    batch::Op,
    tables::{Key, keys},
};
use durafiber_testkit::{conformance, postgres::PgServer};

/// The records these tests write: text (as run ids) under idempotency keys of a kind
/// `things`, which belong to no run (the rollback witness, which sums each run's records, leaves them out).
fn key(name: &str) -> Key<RunId> {
    keys::run_by_key("things", name)
}

fn put(store: &Store, name: &str, value: &str, durability: Durability) {
    let mut b = Batch::new();
    b.put(key(name), &RunId::from(value)).expect("encode");
    store.commit_blocking(b, durability).expect("commit");
}

#[test]
fn the_sled_backend_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().expect("tempdir");
    conformance::run_all(&SledBackend::open(dir.path()).expect("open"));
}

#[test]
fn the_postgres_backend_passes_the_conformance_suite() {
    let server = PgServer::start().expect("a PostgreSQL server");
    let url = server.fresh_database().expect("a database");
    conformance::run_all(&PgBackend::open(&url).expect("open"));
}

#[test]
fn a_second_process_on_the_same_database_is_refused_while_the_first_holds_it() {
    let server = PgServer::start().expect("a PostgreSQL server");
    let url = server.fresh_database().expect("a database");
    let first = PgBackend::open(&url).expect("open");
    match PgBackend::open(&url) {
        Err(StoreError::DatabaseLocked { url: shown }) => {
            assert!(shown.ends_with(url.rsplit('/').next().unwrap_or("")));
        }
        Err(e) => panic!("expected DatabaseLocked, got {e}"),
        Ok(_) => panic!("a second owner opened the database"),
    }
    drop(first);
    PgBackend::open(&url).expect("the database is free once the first closed");
}

#[test]
fn the_simulated_backend_passes_the_conformance_suite() {
    conformance::run_all(&SimBackend::new());
}

#[test]
fn a_flipped_byte_in_one_record_is_a_typed_error_and_the_others_stay_readable() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("open");
        for name in ["a", "b", "c"] {
            put(&store, name, &format!("value of {name}"), Durability::Sync);
        }
    }
    {
        // Damage record "b" under the envelope, as bit rot or a bad write would.
        let backend = SledBackend::open(dir.path()).expect("open raw");
        let mut sealed = backend.get(key("b").as_bytes()).expect("get").expect("present");
        let last = sealed.len() - 1;
        sealed[last] ^= 0x5a;
        let mut b = Batch::new();
        b.ops.push(Op::Put { key: key("b").into_bytes(), value: sealed });
        backend.apply(&b).expect("apply");
        backend.barrier().expect("barrier");
    }
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("reopen");
    assert_eq!(store.get(&key("a")).expect("a reads"), Some("value of a".into()));
    assert_eq!(store.get(&key("c")).expect("c reads"), Some("value of c".into()));
    match store.get(&key("b")) {
        Err(StoreError::Corrupt { table, key, .. }) => {
            assert_eq!(table, "run_keys");
            assert!(key.contains('b'), "the error names the record: {key}");
        }
        other => panic!("expected Corrupt for b, got {other:?}"),
    }
    let scanned = store.scan(&keys::RUN_KEYS.of_run("things"), None, 10).expect("scan");
    assert_eq!(scanned.iter().filter(|(_, r)| r.is_ok()).count(), 2);
    assert_eq!(scanned.iter().filter(|(_, r)| r.is_err()).count(), 1);
}

#[test]
fn a_second_process_gets_a_clear_error_for_a_directory_in_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _held = Store::open_dir(dir.path(), StoreConfig::default()).expect("open");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_store-writer"))
        .args([dir.path().to_str().expect("utf-8"), "1", "0"])
        .output_within(CHILD_DEADLINE)
        .expect("run store-writer");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("in use by another process"), "stderr: {stderr}");
}

#[test]
fn a_second_store_in_the_same_process_is_refused_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _held = Store::open_dir(dir.path(), StoreConfig::default()).expect("open");
    assert!(matches!(Store::open_dir(dir.path(), StoreConfig::default()), Err(StoreError::DirLocked { .. })));
}

#[test]
fn the_simulated_crash_loses_exactly_the_writes_after_the_last_barrier() {
    let sim = SimBackend::new();
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    put(&store, "durable", "1", Durability::Sync);
    // Async writes are applied but, until a barrier, not durable.
    let mut b = Batch::new();
    b.put(key("volatile"), &RunId::from("2")).expect("encode");
    sim.crash_at(SimCrash::AfterApply(1));
    assert!(store.commit_blocking(b, Durability::Async).is_ok());
    assert!(sim.is_crashed());
    sim.revive();
    let after = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    assert_eq!(after.get(&key("durable")).expect("get"), Some("1".into()));
    assert_eq!(after.get(&key("volatile")).expect("get"), None);
}

#[test]
fn a_crash_right_after_a_barrier_keeps_what_it_covered() {
    let sim = SimBackend::new();
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    sim.crash_at(SimCrash::AfterBarrier(1));
    let mut b = Batch::new();
    b.put(key("covered"), &RunId::from("3")).expect("encode");
    // The barrier completed, but the writer "died" before acknowledging.
    assert!(store.commit_blocking(b, Durability::Sync).is_err());
    sim.revive();
    let after = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    assert_eq!(after.get(&key("covered")).expect("get"), Some("3".into()));
}

/// A read may see a group the writer applied before its barrier returned; `settle_reads`
/// returns only once that group is durable, and costs no barrier when nothing is in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_reads_waits_until_what_a_read_saw_is_durable() {
    let sim = SimBackend::new();
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    put(&store, "settled", "1", Durability::Sync);
    let barriers = store.writer_stats().barriers.load(std::sync::atomic::Ordering::Relaxed);
    store.settle_reads().await.expect("settle");
    assert_eq!(
        store.writer_stats().barriers.load(std::sync::atomic::Ordering::Relaxed),
        barriers,
        "nothing in flight: no barrier"
    );

    sim.stall_barriers(true);
    let writer = store.clone();
    let commit = tokio::spawn(async move {
        let mut b = Batch::new();
        b.put(key("in flight"), &RunId::from("2")).expect("encode");
        writer.commit(b, Durability::Sync).await
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.get(&key("in flight")).expect("read").is_none() {
        assert!(std::time::Instant::now() < deadline, "the write was never applied");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    // Seen but not durable: settling waits for the barrier.
    let settling = tokio::spawn({
        let store = store.clone();
        async move { store.settle_reads().await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!settling.is_finished(), "settled before the barrier returned");
    sim.stall_barriers(false);
    settling.await.expect("join").expect("settle");
    commit.await.expect("join").expect("commit");
    sim.crash();
    sim.revive();
    let reopened = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("reopen");
    assert_eq!(reopened.get(&key("in flight")).expect("read"), Some("2".into()));
}
