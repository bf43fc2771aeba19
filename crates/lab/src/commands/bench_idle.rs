//! `durafiber bench idle`: what runs waiting for people cost. A process of its own opens a
//! store and a runtime with the default configuration (as `serve` does), starts N runs that
//! each ask for an approval and wait, and reports its resident memory before the runs, once
//! every run waits, and once the waiting runs have left memory; then 1% of them are
//! approved and the time from each decision to its run going on is reported.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use durafiber_runtime::{
    Agent, AgentError, Ctx, Decision, Recovered, RunId, RunStatus, Runtime, RuntimeConfig,
};
use durafiber_store::{Store, StoreConfig};
use parking_lot::Mutex;
use serde_json::{Value, json};

use super::measure::{Samples, print_bench_report, progress, rss_bytes, start_runs};

/// The approval every run asks for.
const APPROVAL: &str = "go";
/// What every run shows its reviewer: one payload, so one hash approves any of them.
const PAYLOAD: &str = "may this run go on?";

/// Asks for one approval, then ends. Counts who asked and when each went on.
struct Waiter {
    asked: Arc<AtomicUsize>,
    went_on: Arc<Mutex<HashMap<RunId, Instant>>>,
}

impl Waiter {
    async fn wait_then_end(&self, ctx: &mut Ctx<Self>) -> Result<(), AgentError> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        let decision = ctx.request_approval(APPROVAL, &PAYLOAD).await?;
        self.went_on.lock().insert(ctx.run_id().clone(), Instant::now());
        if decision.approved { Ok(()) } else { Err(AgentError::fail("declined")) }
    }
}

impl Agent for Waiter {
    const KIND: &'static str = "waiter";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        self.wait_then_end(ctx).await
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, _: Recovered<Self>) -> Result<(), AgentError> {
        self.wait_then_end(ctx).await
    }
}

fn mib(bytes: u64) -> f64 {
    (bytes as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0
}

/// What `bench idle` measures.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Runs that wait.
    pub runs: usize,
    /// The share of them approved at the end.
    pub approve_share: f64,
    /// The runtime's `waiting_in_memory`; at least `runs` keeps every fiber in memory.
    pub waiting_in_memory: usize,
}

/// The parent: runs the measuring process and prints its report.
pub async fn idle(json: bool, plan: Plan) -> anyhow::Result<i32> {
    let Plan { runs, approve_share, waiting_in_memory } = plan;
    let exe = std::env::current_exe()?;
    let dir = tempfile::Builder::new().prefix("durafiber-bench-").tempdir_in(std::env::temp_dir())?;
    let mut child = Command::new(&exe)
        .args(["bench", "idle-child"])
        .arg(dir.path())
        .args(["--runs", &runs.to_string(), "--approve-share", &approve_share.to_string()])
        .args(["--waiting-in-memory", &waiting_in_memory.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut last = String::new();
    for line in BufReader::new(child.stdout.take().context("stdout")?).lines() {
        last = line?;
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("the measuring process failed: {status}");
    }
    let report: Value = serde_json::from_str(&last).context("the measuring process's report")?;
    let lines = vec![
        format!(
            "{runs} runs waiting for approval: {} MiB resident before them, {} MiB with every run waiting, {} MiB once they left memory ({} bytes a run)",
            report["rss_before_mib"],
            report["rss_waiting_mib"],
            report["rss_parked_mib"],
            report["parked_bytes_per_run"]
        ),
        format!(
            "{} approved: each went on {} ms after its decision at the median, {} ms at p99, {} ms at most; all within {} ms",
            report["approved"],
            report["went_on_p50_ms"],
            report["went_on_p99_ms"],
            report["went_on_max_ms"],
            report["all_went_on_ms"]
        ),
    ];
    print_bench_report(lines, report, json)?;
    Ok(0)
}

/// Starts `runs` runs that wait for approval, every `every`-th to be approved, and waits
/// until they all asked; those to approve, and how long the starts took, s.
async fn start_waiting(
    rt: &Runtime,
    runs: usize,
    every: usize,
    asked: &AtomicUsize,
) -> anyhow::Result<(Vec<RunId>, f64)> {
    progress(&format!("starting {runs} runs that wait for approval"));
    let began = Instant::now();
    let to_approve = start_runs::<Waiter>(rt, runs, "idle", &(), move |i| i % every == 0).await?;
    let started_s = began.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(600);
    while asked.load(Ordering::Relaxed) < runs {
        if Instant::now() > deadline {
            bail!("only {} of {runs} runs asked for approval", asked.load(Ordering::Relaxed));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((to_approve, started_s))
}

/// Waits until no run is live (or the parking's time is up); how long that took, s.
async fn wait_parked(rt: &Runtime, config: &RuntimeConfig) -> f64 {
    let parking = Instant::now();
    let limit = config.hibernate_after.min(Duration::from_secs(60)) + Duration::from_secs(30);
    while rt.live_count().await > 0 && parking.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    parking.elapsed().as_secs_f64()
}

/// Waits (2 minutes at most) until every decided run went on; how long each took from its
/// decision, µs.
async fn went_on_after(went_on: &Mutex<HashMap<RunId, Instant>>, decisions: &[(RunId, Instant)]) -> Samples {
    let deadline = Instant::now() + Duration::from_secs(120);
    while went_on.lock().len() < decisions.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let went_on = std::mem::take(&mut *went_on.lock());
    Samples(
        decisions
            .iter()
            .filter_map(|(id, decided)| {
                went_on.get(id).map(|at| at.saturating_duration_since(*decided).as_micros() as u64)
            })
            .collect(),
    )
}

/// Approves every run of `to_approve` with `hash`, from 64 tasks at most; each run with the
/// moment its decision was recorded.
async fn approve_all(
    rt: &Runtime,
    to_approve: &[RunId],
    hash: &str,
) -> anyhow::Result<Vec<(RunId, Instant)>> {
    let decisions = Arc::new(Mutex::new(Vec::with_capacity(to_approve.len())));
    let mut tasks = Vec::new();
    for ids in to_approve.chunks(to_approve.len().div_ceil(64).max(1)) {
        let (rt, ids, hash, decisions) = (rt.clone(), ids.to_vec(), hash.to_string(), decisions.clone());
        tasks.push(tokio::spawn(async move {
            for id in ids {
                let decision = Decision { approved: true, comment: String::new() };
                rt.approve(&id, APPROVAL, &hash, decision).await?;
                decisions.lock().push((id, Instant::now()));
            }
            Ok::<_, durafiber_runtime::RuntimeError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(std::mem::take(&mut *decisions.lock()))
}

/// The measuring process.
pub async fn child(data: &Path, plan: Plan) -> anyhow::Result<i32> {
    let Plan { runs, approve_share, waiting_in_memory } = plan;
    let rss_before = rss_bytes();
    let store = Store::open_dir(data, StoreConfig::default())?;
    let mut config = RuntimeConfig { waiting_in_memory, ..RuntimeConfig::default() };
    if waiting_in_memory >= runs {
        // Every fiber is to keep its future while it waits: the cost of not parking.
        config.hibernate_after = Duration::from_secs(24 * 3600);
    }
    let asked = Arc::new(AtomicUsize::new(0));
    let went_on = Arc::new(Mutex::new(HashMap::new()));
    let agent = Waiter { asked: asked.clone(), went_on: went_on.clone() };
    let rt = Runtime::builder(store).config(config.clone()).agent(agent).open().await?;
    let rss_open = rss_bytes();

    // Every `every`-th run is approved at the end; only their ids are kept.
    let every = (1.0 / approve_share.clamp(1e-6, 1.0)).round().max(1.0) as usize;
    let (to_approve, started_s) = start_waiting(&rt, runs, every, &asked).await?;
    let rss_waiting = rss_bytes();
    let live_waiting = rt.live_count().await;
    progress(&format!(
        "{runs} runs wait for approval; {live_waiting} of them live; waiting for them to leave memory"
    ));

    let parked_after_s = wait_parked(&rt, &config).await;
    let still_live = rt.live_count().await;
    // Give the allocator a moment to hand back what the runs let go of.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_parked = rss_bytes();

    let hash = rt
        .pending_approvals(to_approve.first())?
        .into_iter()
        .next()
        .map(|p| p.payload_hash)
        .context("the first run to approve has no pending approval")?;
    let approved = to_approve.len();
    progress(&format!("approving {approved} runs"));
    let approving = Instant::now();
    let decisions = approve_all(&rt, &to_approve, &hash).await?;
    let mut waits = went_on_after(&went_on, &decisions).await;
    let all_went_on_ms = approving.elapsed().as_secs_f64() * 1000.0;
    let went = waits.0.len();
    rt.settle().await;
    let mut completed = 0;
    for (id, _) in &decisions {
        if matches!(rt.status(id)?, RunStatus::Completed { .. }) {
            completed += 1;
        }
    }
    let ms = |us: u64| (us as f64 / 100.0).round() / 10.0;
    let parked_bytes_per_run = rss_parked.saturating_sub(rss_open) as f64 / runs.max(1) as f64;
    let report = json!({
        "runs": runs, "waiting_in_memory": waiting_in_memory, "started_per_s": (runs as f64 / started_s).round(),
        "store_cache_mib": mib(StoreConfig::default().cache_bytes),
        "rss_before_mib": mib(rss_before), "rss_open_mib": mib(rss_open), "rss_waiting_mib": mib(rss_waiting),
        "live_when_waiting": live_waiting, "rss_parked_mib": mib(rss_parked), "still_live": still_live,
        "left_memory_after_s": (parked_after_s * 10.0).round() / 10.0,
        "waiting_bytes_per_run": (rss_waiting.saturating_sub(rss_open) as f64 / runs.max(1) as f64).round(),
        "parked_bytes_per_run": parked_bytes_per_run.round(),
        "approved": approved, "went_on": went, "completed": completed,
        "went_on_p50_ms": ms(waits.quantile(0.5)), "went_on_p99_ms": ms(waits.quantile(0.99)),
        "went_on_max_ms": ms(waits.quantile(1.0)), "all_went_on_ms": all_went_on_ms.round(),
    });
    println!("{report}");
    rt.shutdown().await;
    Ok(0)
}
