//! A run's history is a ring of `history_max` slots: each boundary's stash overwrites the one
//! `history_max` back, so the store holds no more entries than that and a stash deletes
//! nothing. The history lists and forks from the last `history_max` boundaries, oldest
//! first; a store whose history was keyed by boundary (before the ring) reads as it did,
//! and its entries leave the history as the ring's new ones pass them. A fork copies the
//! source's output stream up to the mark the history gives for its boundary, and is refused
//! when that mark was recorded before the oldest boundary the history keeps.

use std::time::Duration;

use durafiber_runtime::{
    Agent, AgentError, Ctx, ForkOptions, Recovered, RunId, RunStatus, Runtime, RuntimeConfig, RuntimeError,
};
use durafiber_store::{
    Batch, Durability, Store, StoreConfig,
    tables::{HistoryRecord, keys},
};

/// Seven stashes, numbered 1 to 7; before the fifth it waits for the event `more`.
#[derive(Clone, Default)]
struct Counter;

impl Counter {
    async fn count(&self, ctx: &mut Ctx<Self>, from: u32) -> Result<u32, AgentError> {
        for n in from + 1..=7 {
            if n == 5 {
                let _: Option<()> = ctx.wait_for_event("more", None).await?;
            }
            ctx.stash("counted", &n).await?;
        }
        Ok(7)
    }
}

impl Agent for Counter {
    const KIND: &'static str = "counter";
    type Input = ();
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<u32, AgentError> {
        self.count(ctx, 0).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        self.count(ctx, r.stash.unwrap_or(0)).await
    }
}

async fn open(dir: &std::path::Path, history_max: u32) -> Runtime {
    let store = Store::open_dir(dir, StoreConfig::default()).expect("store");
    let config = RuntimeConfig { history_max, ..RuntimeConfig::default() };
    Runtime::builder(store).config(config).agent(Counter).open().await.expect("runtime")
}

fn seqs(rt: &Runtime, run: &RunId) -> Vec<u64> {
    rt.history(run).expect("history").iter().map(|h| h.seq).collect()
}

/// Polls until the run's history ends at boundary `seq`.
async fn reaches(rt: &Runtime, run: &RunId, seq: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seqs(rt, run).last() != Some(&seq) {
        assert!(std::time::Instant::now() < deadline, "run {run} never reached boundary {seq}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn completes(rt: &Runtime, run: &RunId) {
    let status = tokio::time::timeout(Duration::from_secs(30), rt.wait(run)).await.expect("in time");
    assert_eq!(status.expect("wait"), RunStatus::Completed { output_json: "7".into() });
}

fn refused_at(outcome: Result<durafiber_runtime::StartOutcome, RuntimeError>, at: u64) {
    match outcome {
        Err(RuntimeError::ForkRefused { reason, .. }) => {
            assert!(reason.contains(&format!("boundary {at} is not in its history")), "{reason}");
        }
        other => panic!("a fork at boundary {at}: {other:?}"),
    }
}

fn stored_entries(dir: &std::path::Path, run: &RunId) -> Vec<(Vec<u8>, HistoryRecord)> {
    let store = Store::open_dir(dir, StoreConfig::default()).expect("store");
    let scanned = store.scan(&keys::HISTORY.of_run(run), None, usize::MAX).expect("scan");
    scanned.into_iter().map(|(key, entry)| (key.as_bytes().to_vec(), entry.expect("entry"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_keeps_the_last_history_max_boundaries_in_as_many_entries() {
    let dir = tempfile::tempdir().expect("dir");
    let rt = open(dir.path(), 3).await;
    let run = rt.start::<Counter>("c", &()).await.expect("start").run_id;
    reaches(&rt, &run, 4).await;
    assert_eq!(seqs(&rt, &run), [2, 3, 4]);
    rt.send_event(&run, "more", &(), None).await.expect("more");
    completes(&rt, &run).await;
    assert_eq!(seqs(&rt, &run), [5, 6, 7]);
    let counted: Vec<String> =
        rt.history(&run).expect("history").iter().map(|h| h.stash.to_string()).collect();
    assert_eq!(counted, ["5", "6", "7"]);
    refused_at(rt.fork(&run, 4, "f4", ForkOptions::default()).await, 4);
    let fork = rt.fork(&run, 6, "f6", ForkOptions::default()).await.expect("fork").run_id;
    completes(&rt, &fork).await;
    assert_eq!(seqs(&rt, &fork), [6, 7], "the fork's own history begins at its point");
    rt.shutdown().await;
    drop(rt);
    let entries = stored_entries(dir.path(), &run);
    let mut stored: Vec<u64> = entries.iter().map(|(_, e)| e.stash.seq).collect();
    stored.sort_unstable();
    assert_eq!(stored, [5, 6, 7], "seven boundaries written, three entries stored");
    for (key, entry) in &entries {
        let slot = entry.stash.seq % 3;
        assert!(key.ends_with(&slot.to_be_bytes()), "boundary {} is in slot {slot}", entry.stash.seq);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_keyed_by_boundary_reads_as_before_and_gives_way_to_the_ring() {
    let dir = tempfile::tempdir().expect("dir");
    let rt = open(dir.path(), 3).await;
    let run = rt.start::<Counter>("c", &()).await.expect("start").run_id;
    reaches(&rt, &run, 4).await;
    rt.shutdown().await;
    drop(rt);
    // The store as the history keyed by boundary left it: boundaries 2 to 4 under their own
    // number, and one older entry, which a pruning cut short by a crash could leave behind.
    let entries = stored_entries(dir.path(), &run);
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let mut batch = Batch::new();
    for (key, entry) in entries {
        batch.delete_stored(key);
        batch.put(keys::history(&run, entry.stash.seq, 0), &entry).expect("put");
        if entry.stash.seq == 2 {
            let older = HistoryRecord {
                stash: durafiber_store::tables::StashRecord { seq: 1, ..entry.stash.clone() },
                ..entry
            };
            batch.put(keys::history(&run, 1, 0), &older).expect("put");
        }
    }
    store.commit(batch, Durability::Sync).await.expect("commit");
    drop(store);

    let rt = open(dir.path(), 3).await;
    assert_eq!(seqs(&rt, &run), [2, 3, 4]);
    refused_at(rt.fork(&run, 1, "f1", ForkOptions::default()).await, 1);
    rt.send_event(&run, "more", &(), None).await.expect("more");
    completes(&rt, &run).await;
    // Boundaries 5 to 7 went to slots 2, 0 and 1, over the old entries of 2 and 1; those of
    // 3 and 4 stay under their numbers, older than the history now.
    assert_eq!(seqs(&rt, &run), [5, 6, 7]);
    refused_at(rt.fork(&run, 4, "f4", ForkOptions::default()).await, 4);
    let fork = rt.fork(&run, 5, "f5", ForkOptions::default()).await.expect("fork").run_id;
    completes(&rt, &fork).await;
    rt.shutdown().await;
}

/// Five stashes, numbered 1 to 5; it emits `a` before the first and `b`, `c` before the third.
#[derive(Clone, Default)]
struct Talker;

impl Talker {
    async fn talk(&self, ctx: &mut Ctx<Self>, from: u32) -> Result<u32, AgentError> {
        for n in from + 1..=5 {
            match n {
                1 => drop(ctx.emit("a")?),
                3 => drop((ctx.emit("b")?, ctx.emit("c")?)),
                _ => {}
            }
            ctx.stash("talked", &n).await?;
        }
        Ok(5)
    }
}

impl Agent for Talker {
    const KIND: &'static str = "talker";
    type Input = ();
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<u32, AgentError> {
        self.talk(ctx, 0).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<u32, AgentError> {
        self.talk(ctx, r.stash.unwrap_or(0)).await
    }
}

async fn talked(rt: &Runtime, run: &RunId) -> Vec<String> {
    let status = tokio::time::timeout(Duration::from_secs(30), rt.wait(run)).await.expect("in time");
    assert_eq!(status.expect("wait"), RunStatus::Completed { output_json: "5".into() });
    let chunks = rt.stream_chunks(run, 0, 100).expect("stream");
    chunks.iter().map(|c| c.data::<String>().expect("a string chunk")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_copies_the_stream_up_to_the_mark_its_history_gives_and_refuses_an_older_one() {
    for (history_max, at, fork) in [
        (32, 2, Some(["a", "b", "c"])),
        (32, 4, Some(["a", "b", "c"])),
        (3, 5, Some(["a", "b", "c"])),
        (2, 5, None),
    ] {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
        let config = RuntimeConfig { history_max, ..RuntimeConfig::default() };
        let rt = Runtime::builder(store).config(config).agent(Talker).open().await.expect("runtime");
        let run = rt.start::<Talker>("t", &()).await.expect("start").run_id;
        assert_eq!(talked(&rt, &run).await, ["a", "b", "c"]);
        let forked = rt.fork(&run, at, "f", ForkOptions::default()).await;
        match (forked, fork) {
            // Copied up to the mark at `at`, the rest emitted by the fork itself.
            (Ok(forked), Some(stream)) => assert_eq!(talked(&rt, &forked.run_id).await, stream),
            (Err(RuntimeError::ForkRefused { reason, .. }), None) => {
                assert!(
                    reason.contains("stream mark at that boundary is older than its history"),
                    "{reason}"
                );
            }
            (other, _) => panic!("history_max {history_max}, a fork at {at}: {other:?}"),
        }
        rt.shutdown().await;
    }
}
