//! The writer under test: group commit, lone commits, quiet spells, failures.

use std::{sync::Arc, time::Instant};

use super::*;
use crate::{Durability, SimBackend, Store, StoreConfig, tables::keys};

fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_writer_with_nothing_to_do_tells_its_backend_once_per_quiet_spell() {
    let sim = SimBackend::new();
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    // A store that wrote nothing has nothing to move: it is never told.
    std::thread::sleep(QUIET_AFTER * 2);
    assert_eq!(sim.quiet_spells(), 0);
    for spell in 1..=2u64 {
        let mut batch = Batch::new();
        batch.put(keys::meta("quiet"), &spell).expect("encode");
        store.commit_blocking(batch, Durability::Sync).expect("commit");
        wait_for("a quiet spell", || sim.quiet_spells() == spell);
        std::thread::sleep(QUIET_AFTER * 3);
        assert_eq!(sim.quiet_spells(), spell, "told once per spell, not at every wait");
    }
    store.close();
}

fn put(store: &Store, key: &str, durability: Durability) {
    let mut batch = Batch::new();
    batch.put(keys::meta(key), &key.to_string()).expect("encode");
    store.commit_blocking(batch, durability).expect("commit");
}

fn count(counter: &AtomicU64) -> u64 {
    counter.load(SeqCst)
}

#[test]
fn a_lone_sync_commit_writes_itself_and_still_starts_a_quiet_spell() {
    let sim = SimBackend::new();
    sim.write_inline(true);
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    put(&store, "lone", Durability::Sync);
    let stats = store.writer_stats();
    assert_eq!((count(&stats.inline), count(&stats.batches), count(&stats.barriers)), (1, 1, 1));
    assert!(sim.durable_len() > 0, "the barrier ran before the commit returned");
    // The writer thread never saw the write, and still tells the backend once it is quiet.
    wait_for("a quiet spell after a write of its own", || sim.quiet_spells() == 1);
    put(&store, "async", Durability::Async);
    assert_eq!(count(&stats.inline), 1, "an async commit is the thread's");
    let mut many = Batch::new();
    for i in 0..=INLINE_OPS_MAX {
        many.put(keys::meta(&format!("many-{i}")), &i).expect("encode");
    }
    store.commit_blocking(many, Durability::Sync).expect("commit");
    assert_eq!(count(&stats.inline), 1, "a commit of many writes is the thread's");
    store.close();
}

#[test]
fn a_commit_that_finds_the_writer_busy_or_the_disk_slow_goes_to_the_thread() {
    let sim = SimBackend::new();
    sim.write_inline(true);
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    let stats = store.writer_stats();
    // The first commit writes itself and hangs in its barrier, holding the writer.
    sim.stall_barriers(true);
    let first = std::thread::spawn({
        let store = store.clone();
        move || put(&store, "first", Durability::Sync)
    });
    wait_for("the first commit to write itself", || count(&stats.inline) == 1);
    let second = std::thread::spawn({
        let store = store.clone();
        move || put(&store, "second", Durability::Sync)
    });
    wait_for("the second commit to be queued", || store.writer().queued.load(SeqCst) == 1);
    std::thread::sleep(INLINE_BARRIER_MAX * 2);
    sim.stall_barriers(false);
    first.join().expect("first");
    second.join().expect("second");
    assert_eq!(count(&stats.inline), 1, "the writer was busy: the second waited for the thread");
    // A lone commit whose barrier is slow: until a quick one, lone commits go to the thread.
    sim.stall_barriers(true);
    let slow = std::thread::spawn({
        let store = store.clone();
        move || put(&store, "slow", Durability::Sync)
    });
    wait_for("the slow commit to write itself", || count(&stats.inline) == 2);
    std::thread::sleep(INLINE_BARRIER_MAX * 2);
    sim.stall_barriers(false);
    slow.join().expect("slow");
    put(&store, "after a slow barrier", Durability::Sync);
    assert_eq!(count(&stats.inline), 2);
    put(&store, "after a quick one", Durability::Sync);
    assert_eq!(count(&stats.inline), 3);
    assert_eq!(count(&stats.batches), 5);
    store.close();
}

#[tokio::test(flavor = "current_thread")]
async fn a_single_threaded_runtime_never_waits_on_the_disk_itself() {
    let sim = SimBackend::new();
    sim.write_inline(true);
    let store = Store::with_backend(Arc::new(sim.clone()), StoreConfig::default()).expect("store");
    let mut batch = Batch::new();
    batch.put(keys::meta("k"), &1u32).expect("encode");
    store.commit(batch, Durability::Sync).await.expect("commit");
    assert_eq!(count(&store.writer_stats().inline), 0);
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commits_on_a_local_disk_write_themselves_or_group_and_all_last() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..25 {
                    let mut batch = Batch::new();
                    let key = format!("t{t:02}-{i:02}");
                    batch.put(keys::meta(&key), &key).expect("encode");
                    store.commit(batch, Durability::Sync).await.expect("commit");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let stats = store.writer_stats();
    assert_eq!(count(&stats.batches), 16 * 25);
    assert!(count(&stats.barriers) <= count(&stats.batches));
    drop(store);
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("reopen");
    for t in 0..16 {
        for i in 0..25 {
            let key = format!("t{t:02}-{i:02}");
            let found: Option<String> = store.get(&keys::meta::<String>(&key)).expect("read");
            assert_eq!(found.as_deref(), Some(key.as_str()));
        }
    }
    store.close();
}

/// A group of `commits` commits, each a put of `key`.
fn group_of(commits: usize, key: &[u8]) -> Group {
    let mut group = Group::default();
    for i in 0..commits {
        group.merged.ops.push(crate::batch::Op::Put { key: key.to_vec(), value: vec![] });
        let (ack, _) = oneshot::channel();
        group.parts.push(Part {
            ops: i..i + 1,
            absent: 0..0,
            durability: Durability::Sync,
            ack,
            refused: None,
        });
    }
    group
}

#[test]
fn the_writer_spins_only_for_one_task_committing_in_a_loop() {
    let soon = SPIN_FOR / 5;
    let mut cadence = Cadence::default();
    let mut looping_after = |commits: usize, key: &[u8], waited: Duration| {
        cadence.observe(&group_of(commits, key), waited);
        cadence.looping
    };
    assert!(!looping_after(1, b"run-a", soon), "one commit is not a loop");
    assert!(looping_after(1, b"run-a", soon), "the same run again, right after its last commit");
    assert!(looping_after(1, b"run-a", soon));
    // One commit at a time, each for another run: a burst of alarm deliveries.
    assert!(!looping_after(1, b"run-b", soon));
    assert!(!looping_after(1, b"run-c", soon));
    assert!(!looping_after(1, b"run-c", SPIN_FOR * 2), "after a pause longer than the spin");
    assert!(looping_after(1, b"run-c", soon));
    // Writers enough to fill groups keep the writer busy without it.
    assert!(!looping_after(2, b"run-c", soon));
    assert!(!looping_after(1, b"run-c", soon), "a loop starts over after a group of many");
    assert!(looping_after(1, b"run-c", soon));
}

/// A group whose every batch was refused (an insert of a key that exists) writes nothing:
/// a read that settles afterwards must not wait for a barrier that no write brings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_insert_leaves_no_read_waiting_to_settle() {
    for inline in [true, false] {
        let sim = SimBackend::new();
        sim.write_inline(inline);
        let store = Store::with_backend(Arc::new(sim), StoreConfig::default()).expect("store");
        for attempt in 0..2 {
            let mut batch = Batch::new();
            batch.insert(keys::meta("once"), &attempt).expect("encode");
            let committed = store.commit(batch, Durability::Sync).await;
            assert_eq!(committed.is_ok(), attempt == 0, "inline {inline}, attempt {attempt}: {committed:?}");
        }
        let settled = tokio::time::timeout(Duration::from_secs(5), store.settle_reads()).await;
        assert!(matches!(settled, Ok(Ok(()))), "inline {inline}: reads never settled");
        store.close();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_write_sent_ahead_leads_the_next_group_past_every_queued_write() {
    let sim = SimBackend::new();
    let config = StoreConfig { group_batches_max: 2, ..StoreConfig::default() };
    let store = Store::with_backend(Arc::new(sim.clone()), config).expect("store");
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    let commit = |name: String, ahead: bool| {
        let (store, done_tx) = (store.clone(), done_tx.clone());
        tokio::spawn(async move {
            let mut batch = Batch::new();
            batch.put(keys::meta(&name), &name).expect("encode");
            if ahead {
                store.commit_ahead(batch).await.expect("commit ahead");
            } else {
                store.commit(batch, Durability::Sync).await.expect("commit");
            }
            done_tx.send(name).expect("send");
        })
    };
    let until = |what: &'static str, done: Box<dyn Fn() -> bool>| async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    // The first write holds the writer in its barrier; six queue behind it.
    sim.stall_barriers(true);
    commit("first".into(), false);
    let gathered = store.clone();
    until("the first write to be gathered", Box::new(move || count(&gathered.writer_stats().batches) == 1))
        .await;
    for i in 0..6 {
        commit(format!("q{i}"), false);
    }
    let queued = store.clone();
    until("six queued writes", Box::new(move || queued.writer().queued.load(SeqCst) == 6)).await;
    commit("ahead".into(), true);
    let woken = store.clone();
    until("the write sent ahead", Box::new(move || woken.writer().ahead.lock().len() == 1)).await;
    sim.stall_barriers(false);
    let mut order = Vec::new();
    while order.len() < 8 {
        order.push(done.recv().await.expect("a commit ended"));
    }
    // Groups of two from the queue: the write sent ahead joins the first group after the
    // barrier it arrived during, before any queued write, and the rest keep their order.
    assert_eq!(order, ["first", "ahead", "q0", "q1", "q2", "q3", "q4", "q5"]);
    assert_eq!(count(&store.writer_stats().batches), 8);
    store.close();
}

/// Two writes sent ahead at once, while the writer is idle: the second may be pushed after
/// the writer took the first and before it read the second's wake-up, so taking the wake-up
/// must take the write with it, or it waits for a command that may never come.
#[test]
fn writes_sent_ahead_at_once_are_each_answered_by_an_idle_writer() {
    let store = Store::with_backend(Arc::new(SimBackend::new()), StoreConfig::default()).expect("store");
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    for round in 0..2_000 {
        let both = (0..2).map(|lane| {
            let store = store.clone();
            rt.spawn(async move {
                let mut batch = Batch::new();
                batch.put(keys::meta(&format!("ahead-{round}-{lane}")), &round).expect("encode");
                store.commit_ahead(batch).await
            })
        });
        let both: Vec<_> = both.collect();
        let answered = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), async {
                for commit in both {
                    commit.await.expect("join").expect("commit ahead");
                }
            })
            .await
        });
        assert!(answered.is_ok(), "round {round}: a write sent ahead was never answered");
    }
    store.close();
}
