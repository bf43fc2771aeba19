//! Retention (`retention` in the config): a settled run is deleted with everything it owns
//! once it has been settled for as long as the config keeps its kind, never before; an open
//! run and a kind without a retention are kept for ever; a sweep deletes at most
//! `SWEEP_RUNS_MAX` runs and comes back a second later for the rest; runs settled before the
//! settled index existed are found too; audit entries go after their own retention.

use durafiber_runtime::Timestamp;
use std::time::Duration;

use durafiber_runtime::{
    Agent, AgentError, Ctx, Retention, RunStatus, Runtime, RuntimeConfig, RuntimeError, clock::VirtualClock,
};
use durafiber_store::{Batch, Durability, RunId, Store, StoreConfig, access, tables::keys};
use serde::{Deserialize, Serialize};

const T0: u64 = 1_767_225_600_000;
const HOUR: Duration = Duration::from_secs(3600);

/// Ends the way its input says, after a stash, a storage key and a few stream chunks, so
/// that a deleted run has records of its own in several tables.
struct Ends;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum End {
    Complete,
    Fail,
    /// Waits for cancellation.
    Cancel,
    /// Waits for a human who never comes: open for ever.
    Wait,
}

impl Agent for Ends {
    const KIND: &'static str = "ends";
    type Input = End;
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, end: End) -> Result<u32, AgentError> {
        ctx.storage().put("note", &"kept with the run").await?;
        for n in 0..3 {
            ctx.emit(&format!("chunk {n}"))?;
        }
        ctx.stash("worked", &1).await?;
        match end {
            End::Complete => Ok(1),
            End::Fail => Err(AgentError::Fail("as asked".into())),
            End::Cancel => {
                ctx.cancelled().await;
                Err(AgentError::Cancelled("as asked".into()))
            }
            End::Wait => {
                ctx.request_approval("never", &"nobody looks").await?;
                Ok(2)
            }
        }
    }
}

fn config(retention: Retention) -> RuntimeConfig {
    // The open run's approval must not escalate while the test moves the clock by days.
    RuntimeConfig { retention, escalate_after: Duration::from_secs(365 * 86_400), ..RuntimeConfig::default() }
}

async fn open(store: &Store, clock: &VirtualClock, retention: Retention) -> Runtime {
    Runtime::builder(store.clone())
        .config(config(retention))
        .virtual_clock(clock.clone())
        .agent(Ends)
        .open()
        .await
        .expect("runtime")
}

async fn started(rt: &Runtime, key: &str, end: End) -> RunId {
    let id = rt.start::<Ends>(key, &end).await.expect("start").run_id;
    rt.settle().await;
    if end == End::Cancel {
        rt.cancel(&id, "as asked").await.expect("cancel");
        rt.settle().await;
    }
    id
}

fn exists(rt: &Runtime, id: &RunId) -> bool {
    match rt.inspect(id) {
        Ok(_) => true,
        Err(RuntimeError::UnknownRun { .. }) => false,
        Err(e) => panic!("inspect {id}: {e}"),
    }
}

/// How many stored records name `run_id` in their key.
async fn records_of(store: &Store, run_id: &RunId) -> usize {
    let entries = store.snapshot().await.expect("snapshot");
    let id = run_id.as_str().as_bytes();
    entries.iter().filter(|(key, _)| key.windows(id.len()).any(|w| w == id)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_run_goes_once_past_its_kinds_retention_and_an_open_one_never() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let clock = VirtualClock::new(Timestamp::from_millis(T0));
    let retention = Retention { completed: Some(HOUR), failed: Some(2 * HOUR), ..Retention::default() };
    let rt = open(&store, &clock, retention).await;
    let completed = started(&rt, "completed", End::Complete).await;
    let failed = started(&rt, "failed", End::Fail).await;
    let cancelled = started(&rt, "cancelled", End::Cancel).await;
    let waiting = started(&rt, "waiting", End::Wait).await;
    for (id, state) in [(&completed, "completed"), (&failed, "failed"), (&cancelled, "cancelled")] {
        assert_eq!(rt.status(id).expect("status").name(), state);
    }
    assert!(records_of(&store, &completed).await > 5, "the run owns records to delete");
    let waiting_records = records_of(&store, &waiting).await;

    // A minute short of an hour: nothing goes.
    rt.advance(Duration::from_secs(3_540)).await.expect("advance");
    assert!([&completed, &failed, &cancelled, &waiting].iter().all(|id| exists(&rt, id)));
    // Past it, at the next sweep: the completed run, with every record it owned.
    rt.advance(Duration::from_secs(121)).await.expect("advance");
    assert!(!exists(&rt, &completed), "the completed run outlived its retention");
    assert_eq!(records_of(&store, &completed).await, 0, "a record of the deleted run is left");
    assert!(exists(&rt, &failed) && exists(&rt, &cancelled) && exists(&rt, &waiting));
    // The failed run an hour later.
    rt.advance(HOUR).await.expect("advance");
    assert!(!exists(&rt, &failed), "the failed run outlived its retention");
    // A kind without a retention, and an open run, are kept for ever.
    rt.advance(Duration::from_secs(3 * 86_400)).await.expect("advance");
    assert!(exists(&rt, &cancelled) && exists(&rt, &waiting));
    assert!(matches!(rt.status(&waiting).expect("status"), RunStatus::WaitingApproval { .. }));
    assert_eq!(records_of(&store, &waiting).await, waiting_records, "the open run was touched");
    let metrics = rt.metrics();
    assert_eq!((metrics.runs_deleted_by_retention, metrics.runs_deleted), (2, 2));
    assert!(rt.check_liveness().expect("liveness").is_empty());
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_deletes_at_most_its_bound_and_comes_back_a_second_later_for_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let clock = VirtualClock::new(Timestamp::from_millis(T0));
    let rt = open(&store, &clock, Retention { completed: Some(HOUR), ..Retention::default() }).await;
    let total = durafiber_runtime::SWEEP_RUNS_MAX * 2 + 500;
    let mut ids = Vec::with_capacity(total);
    for n in 0..total {
        ids.push(rt.start::<Ends>(&format!("run-{n}"), &End::Complete).await.expect("start").run_id);
    }
    rt.settle().await;
    // Every run settled at T0; sweeps come every minute from T0, and the one at T0 + 1 h
    // finds them all due.
    rt.advance(Duration::from_secs(3_599)).await.expect("advance");
    let left = || ids.iter().filter(|id| exists(&rt, id)).count();
    assert_eq!(left(), total, "deleted before their time");
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert_eq!(left(), total - durafiber_runtime::SWEEP_RUNS_MAX, "the first sweep's bound");
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert_eq!(left(), total - 2 * durafiber_runtime::SWEEP_RUNS_MAX, "the next sweep, a second later");
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert_eq!(left(), 0);
    let index = store.keys_in(&keys::SETTLED.all(), None, usize::MAX, None).expect("settled index");
    assert!(index.is_empty(), "{} settled entries left", index.len());
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_settled_before_the_settled_index_existed_are_found_by_the_first_sweep() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let clock = VirtualClock::new(Timestamp::from_millis(T0));
    let rt = open(&store, &clock, Retention::default()).await;
    let old = started(&rt, "old", End::Complete).await;
    let waiting = started(&rt, "waiting", End::Wait).await;
    rt.shutdown().await;
    // A store of an older version: no settled index.
    let mut batch = Batch::new();
    for key in store.keys_in(&keys::SETTLED.all(), None, usize::MAX, None).expect("settled index") {
        batch.delete(key);
    }
    assert_eq!(batch.len(), 1, "the completed run's entry");
    store.commit(batch, Durability::Sync).await.expect("commit");

    clock.set(Timestamp::from_millis(T0 + 2 * HOUR.as_millis() as u64));
    let rt = open(&store, &clock, Retention { completed: Some(HOUR), ..Retention::default() }).await;
    rt.advance(Duration::from_secs(1)).await.expect("advance");
    assert!(!exists(&rt, &old), "the run settled before the index was kept");
    assert!(exists(&rt, &waiting));
    assert_eq!(records_of(&store, &old).await, 0);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_entries_go_after_their_own_retention_with_their_marks_on_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path(), StoreConfig::default()).expect("store");
    let clock = VirtualClock::new(Timestamp::from_millis(T0));
    let day = Duration::from_secs(86_400);
    let rt = open(&store, &clock, Retention { audit: Some(30 * day), ..Retention::default() }).await;
    let run = started(&rt, "audited", End::Complete).await;
    access::append(&store, "alice", "approve", Some(run.as_str()), "early", Timestamp::from_millis(T0))
        .await
        .expect("audit");
    access::append(&store, "bob", "token_create", None, "early", Timestamp::from_millis(T0 + 1))
        .await
        .expect("audit");
    rt.advance(10 * day).await.expect("advance");
    let later = T0 + 10 * day.as_millis() as u64;
    access::append(&store, "carol", "cancel", Some(run.as_str()), "later", Timestamp::from_millis(later))
        .await
        .expect("audit");

    rt.advance(20 * day + Duration::from_secs(120)).await.expect("advance");
    let kept: Vec<String> =
        access::page(&store, None, 100).expect("audit").into_iter().map(|e| e.actor).collect();
    assert_eq!(kept, ["carol"], "the entries older than 30 days go, the later one stays");
    let of_run: Vec<String> =
        access::of_run(&store, &run).expect("audit").into_iter().map(|e| e.actor).collect();
    assert_eq!(of_run, ["carol"]);
    let marks = store.keys_in(&keys::AUDIT_BY_RUN.all(), None, usize::MAX, None).expect("marks");
    assert_eq!(marks.len(), 1, "the forgotten entry's mark on its run went with it");
    assert_eq!(rt.metrics().audit_entries_deleted, 2);
    // The audit trail's retention deletes no run.
    assert!(exists(&rt, &run));
    rt.shutdown().await;
}

#[test]
fn a_retention_of_zero_is_refused_and_none_keeps_everything() {
    let zero = RuntimeConfig::from_json(r#"{"retention": {"completed": "0s"}}"#);
    assert!(matches!(zero, Err(RuntimeError::Config(m)) if m.contains("retention.completed")));
    assert!(RuntimeConfig::from_json(r#"{"retention": {"archived": "1d"}}"#).is_err());
    assert!(!RuntimeConfig::default().retention.is_on());
}
