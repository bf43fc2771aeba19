//! `durafiber bench`: the macro benchmarks, each beside a baseline measured in the same run
//! on the same disk, because shared machines are noisy and only ratios travel.
//!
//! - `stash`: sync-mode commits per second with 1 and with N concurrent writers, against a
//!   raw append + `fdatasync` loop. The raw loop and the single writer take turns, so a disk
//!   whose speed drifts over the run weighs on both alike;
//! - `recover` (`bench_recover.rs`): N runs in flight, SIGKILL, restart: time from the new
//!   process's start to the store being open and to every run's recovery hook having been called;
//! - `alarms`: lateness of N alarms due within one second, optionally with many more pending,
//!   scheduling throughput, and resident memory per pending alarm: the difference between
//!   two processes of their own that open the store, one before the pending alarms are
//!   written and one after (in the benchmark's own process, the bulk load's freed memory
//!   would hide the cost).

use durafiber_runtime::{RunId, Timestamp};
use parking_lot::Mutex;
use std::{
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use durafiber_runtime::testing::RuntimeTestExt;
use durafiber_runtime::{Agent, AgentError, AlarmEvent, AlarmSpec, Ctx, Recovered, Runtime, RuntimeConfig};
use durafiber_store::{Store, StoreConfig};
use serde_json::json;

use super::measure::{
    RawSyncs, Samples, bench_began, commit_until, epoch_ms, peak_rss_bytes, print_bench_report, progress,
    rss_bytes, start_runs,
};
use crate::args::Bench;

/// Runs one benchmark.
pub async fn run(which: Bench) -> anyhow::Result<i32> {
    bench_began();
    match which {
        Bench::Stash { json, writers, seconds, out, nodes: Some(nodes), pg_url: Some(url) } => {
            let seconds = seconds.unwrap_or(NODES_SECONDS);
            super::bench_nodes::stash(json, &url, nodes, writers, seconds, out.as_deref()).await
        }
        Bench::Stash { json, writers, seconds, out, .. } => {
            stash(json, writers, seconds.unwrap_or(STASH_SECONDS), out.as_deref()).await
        }
        Bench::StashNode { url, node_id, nodes, writers, start_at, seconds } => {
            super::bench_nodes::node(&url, &node_id, nodes, writers, start_at, seconds).await
        }
        Bench::Recover { json, runs, pause, repeat, history_max, out } => {
            let workload = super::bench_recover::Workload { runs, pause, history_max };
            super::bench_recover::recover(json, workload, repeat, out.as_deref()).await
        }
        Bench::Alarms { json, alarms, pending, out } => {
            bench_alarms(json, alarms, pending, out.as_deref()).await
        }
        Bench::AlarmsMemoryChild { data } => alarms_memory_child(&data).await,
        Bench::RecoverChild { data, mode, runs, pause, history_max } => {
            let workload = super::bench_recover::Workload { runs, pause, history_max };
            super::bench_recover::child(&data, &mode, workload).await
        }
        Bench::Steps { json, runs, steps, sequential, gap, kill_runs, busy, history_max, out } => {
            let plan =
                super::bench_steps::Plan { runs, steps, sequential, gap, kill_runs, busy, history_max };
            super::bench_steps::steps(json, plan, out.as_deref()).await
        }
        Bench::BusyLoop => super::bench_steps::busy_loop(),
        Bench::StepsChild { data, mode, runs } => super::bench_steps::child(&data, &mode, runs).await,
        Bench::Idle { json, runs, approve_share, waiting_in_memory } => {
            super::bench_idle::idle(json, super::bench_idle::Plan { runs, approve_share, waiting_in_memory })
                .await
        }
        Bench::IdleChild { data, runs, approve_share, waiting_in_memory } => {
            super::bench_idle::child(
                &data,
                super::bench_idle::Plan { runs, approve_share, waiting_in_memory },
            )
            .await
        }
    }
}

/// How long `bench stash` measures each figure by default.
const STASH_SECONDS: f64 = 2.0;

/// How long `bench stash --nodes` measures by default: its p99 is a busy host's, not one
/// burst's.
const NODES_SECONDS: f64 = 10.0;

/// Commits by `writers` concurrent tasks for `seconds`: the commits made, the seconds they
/// took, and their latencies.
async fn commit_for(store: &Store, writers: usize, seconds: f64) -> anyhow::Result<(u64, f64, Samples)> {
    let runs = (0..writers).map(|w| RunId::new(format!("run_bench_{w:04}"))).collect();
    let start = Instant::now();
    let (count, samples) = commit_until(store, runs, start + Duration::from_secs_f64(seconds)).await?;
    Ok((count, start.elapsed().as_secs_f64(), samples))
}

/// Turns the raw syncs and the single writer take, each of `seconds / TURNS`.
const TURNS: u32 = 8;

async fn stash(json: bool, writers: usize, seconds: f64, out: Option<&Path>) -> anyhow::Result<i32> {
    let dir = tempfile::Builder::new().prefix("durafiber-bench-").tempdir_in(std::env::temp_dir())?;
    let store = Store::open_dir(&dir.path().join("store"), StoreConfig::default())?;
    progress(&format!(
        "raw append + fdatasync and sync commits by 1 writer, {TURNS} turns each over {seconds} s, in {}",
        dir.path().display()
    ));
    let mut raw_syncs = RawSyncs::open(dir.path())?;
    let (mut one_commits, mut one_seconds, mut one_samples) = (0u64, 0.0, Vec::new());
    let turn = seconds / f64::from(TURNS);
    for _ in 0..TURNS {
        raw_syncs.run_for(turn)?;
        let (commits, took, samples) = commit_for(&store, 1, turn).await?;
        one_commits += commits;
        one_seconds += took;
        one_samples.extend(samples.0);
    }
    let (raw, one) = (raw_syncs.per_s(), one_commits as f64 / one_seconds);
    // One writer is measured once, in turns with its baseline: a continuous window of its
    // own would be a second figure for the same thing, taken while the disk was otherwise.
    let (many, mut samples) = if writers <= 1 {
        (one, Samples(one_samples))
    } else {
        progress(&format!("sync commits, {writers} writers, {seconds} s"));
        let (many_commits, many_seconds, samples) = commit_for(&store, writers, seconds).await?;
        (many_commits as f64 / many_seconds, samples)
    };
    if let Some(out) = out {
        samples.write(out, "stash-commit", "us")?;
    }
    let report = json!({
        "writers": writers, "commits_per_s": many.round(), "raw_fdatasync_per_s": raw.round(),
        "ratio": (many / raw * 100.0).round() / 100.0, "one_writer_commits_per_s": one.round(),
        "one_writer_ratio": (one / raw * 100.0).round() / 100.0,
        "p50_us": samples.quantile(0.5), "p99_us": samples.quantile(0.99),
    });
    let mut lines = vec![
        format!("raw fdatasync:           {raw:>10.0} /s"),
        format!("sync commits, 1 writer:  {one:>10.0} /s  ({:.2}x raw)", one / raw),
    ];
    if writers > 1 {
        lines.push(format!("sync commits, {writers} writers: {many:>8.0} /s  ({:.2}x raw)", many / raw));
    }
    print_bench_report(lines, report, json)?;
    Ok(0)
}

/// Holds its run open; records how late each alarm fires.
struct Ticker {
    lateness_us: Arc<Mutex<Vec<u64>>>,
}

impl Agent for Ticker {
    const KIND: &'static str = "ticker";
    type Input = ();
    type Stash = ();
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: ()) -> Result<(), AgentError> {
        ctx.cancelled().await;
        Ok(())
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, _: Recovered<Self>) -> Result<(), AgentError> {
        ctx.cancelled().await;
        Ok(())
    }

    async fn on_alarm(&self, _: &mut Ctx<Self>, alarm: AlarmEvent) -> Result<(), AgentError> {
        let now_us = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
        let late = now_us.saturating_sub(alarm.scheduled_time_ms.as_millis() * 1_000);
        self.lateness_us.lock().push(late);
        Ok(())
    }
}

/// Sets `alarms` alarms due evenly within the second after `due_from`, from 40 tasks.
async fn schedule_within_one_second(
    rt: &Runtime,
    runs: &[RunId],
    alarms: usize,
    due_from: u64,
) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for chunk in 0..alarms.div_ceil(250) {
        let (rt, runs) = (rt.clone(), runs.to_vec());
        tasks.push(tokio::spawn(async move {
            for i in chunk * 250..((chunk + 1) * 250).min(alarms) {
                let due = due_from + (i as u64 * 1_000) / alarms.max(1) as u64;
                let spec = AlarmSpec::at(Timestamp::from_millis(due), &i)?;
                rt.set_alarm(&runs[i % runs.len()], &format!("tick-{i}"), spec).await?;
            }
            Ok::<_, durafiber_runtime::RuntimeError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// The resident memory of a process of its own that opens the store in `data` and a runtime
/// on it, as `bench alarms` does, once its runs are recovered and its alarm window read.
fn opened_rss_in_child(data: &Path) -> anyhow::Result<u64> {
    let output = Command::new(std::env::current_exe()?)
        .args(["bench", "alarms-memory-child"])
        .arg(data)
        .stderr(Stdio::inherit())
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.trim().parse().with_context(|| format!("the memory-measuring process said {text:?}"))
}

/// The store in `data` and a runtime on it that hosts the tickers, which record each
/// alarm's lateness in `lateness`; no run hibernates while the benchmark lasts.
async fn open_tickers(data: &Path, lateness: Arc<Mutex<Vec<u64>>>) -> anyhow::Result<Runtime> {
    let store = Store::open_dir(data, StoreConfig::default())?;
    let config = RuntimeConfig { hibernate_after: Duration::from_secs(3600), ..RuntimeConfig::default() };
    Ok(Runtime::builder(store).config(config).agent(Ticker { lateness_us: lateness }).open().await?)
}

/// The process [`opened_rss_in_child`] starts: prints its resident memory in bytes.
async fn alarms_memory_child(data: &Path) -> anyhow::Result<i32> {
    let rt = open_tickers(data, Arc::default()).await?;
    // The open re-enters the runs and reads the window in; let both finish.
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("{}", rss_bytes());
    rt.shutdown().await;
    Ok(0)
}

async fn bench_alarms(json: bool, alarms: usize, pending: usize, out: Option<&Path>) -> anyhow::Result<i32> {
    let dir = tempfile::Builder::new().prefix("durafiber-bench-").tempdir_in(std::env::temp_dir())?;
    let lateness = Arc::new(Mutex::new(Vec::new()));
    let runs_n = alarms.clamp(1, 10_000);
    let rt = open_tickers(dir.path(), lateness.clone()).await?;
    progress(&format!("starting {runs_n} runs that hold the alarms"));
    let runs = start_runs::<Ticker>(&rt, runs_n, "ticker", &(), |_| true).await?;
    let mut rss_per_pending = 0.0;
    let mut bulk_peak_rss = 0;
    let rt = if pending > 0 {
        progress(&format!("writing {pending} pending alarms due in a day"));
        rt.shutdown().await;
        rt.store().close();
        drop(rt);
        // Memory per pending alarm: two processes of their own open the store, before the
        // alarms and after; in this one, the bulk load's freed memory would hide the cost.
        let rss_without = opened_rss_in_child(dir.path())?;
        let store = Store::open_dir(dir.path(), StoreConfig::default())?;
        let (far, step) = (Timestamp::from_millis(epoch_ms() + 86_400_000), Duration::from_millis(1));
        durafiber_demo::bulk::write_pending_alarms(&store, &runs, "later", pending, far, step).await?;
        store.close();
        drop(store);
        bulk_peak_rss = peak_rss_bytes();
        let rss_with = opened_rss_in_child(dir.path())?;
        rss_per_pending = rss_with.saturating_sub(rss_without) as f64 / pending as f64;
        open_tickers(dir.path(), lateness.clone()).await?
    } else {
        rt
    };
    progress(&format!("scheduling {alarms} alarms due within one second, 3 s from now"));
    let due_from = epoch_ms() + 3_000;
    let start = Instant::now();
    schedule_within_one_second(&rt, &runs, alarms, due_from).await?;
    let scheduled_per_s = alarms as f64 / start.elapsed().as_secs_f64();
    if epoch_ms() > due_from {
        progress("warning: scheduling took longer than the 3 s lead; lateness includes it");
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while lateness.lock().len() < alarms && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut samples = Samples(std::mem::take(&mut *lateness.lock()));
    let fired = samples.0.len();
    if let Some(out) = out {
        samples.write(out, "alarm-lateness", "us")?;
    }
    let ms = |us: u64| (us as f64 / 100.0).round() / 10.0;
    let report = json!({
        "alarms": alarms, "pending": pending, "fired": fired,
        "lateness_p50_ms": ms(samples.quantile(0.5)), "lateness_p99_ms": ms(samples.quantile(0.99)),
        "lateness_max_ms": ms(samples.quantile(1.0)), "scheduled_per_s": scheduled_per_s.round(),
        "rss_bytes_per_pending": rss_per_pending.round(), "window": rt.alarm_window_len(),
        "bulk_load_peak_rss_mb": bulk_peak_rss / (1024 * 1024), "peak_rss_mb": peak_rss_bytes() / (1024 * 1024),
        "picked_up_p50_ms": rt.metrics().alarm_lateness.p50_us / 1000, "picked_up_p99_ms": rt.metrics().alarm_lateness.p99_us / 1000,
    });
    rt.shutdown().await;
    let lines = vec![
        format!("{fired}/{alarms} alarms fired; {pending} more pending"),
        format!(
            "lateness p50 {} ms, p99 {} ms; peak RSS {} MiB ({} MiB after the bulk load)",
            report["lateness_p50_ms"],
            report["lateness_p99_ms"],
            report["peak_rss_mb"],
            report["bulk_load_peak_rss_mb"]
        ),
    ];
    print_bench_report(lines, report, json)?;
    Ok(0)
}
