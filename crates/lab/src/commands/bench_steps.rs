//! `durafiber bench steps`: the workload durafiber is compared with other engines on, as one
//! command, beside raw `fdatasync` measured in the same run:
//!
//! 1. `runs` concurrent runs of `steps` sync stashes each: durable steps per second;
//! 2. `sequential` steps, `gap` apart: the latency of one step (its stash, as the agent
//!    times it), beside raw write + `fdatasync` just as far apart as the steps really were
//!    (a sync after an idle gap costs a disk more than back-to-back ones, and more the
//!    longer the gap). Steps and raw syncs take turns of up to 25 each, so a disk whose
//!    speed drifts over the run weighs on both alike; `--out` writes both sets of times;
//! 3. `kill_runs` runs in flight in a child process that is SIGKILLed: the time from the
//!    restarted process's spawn to its first resumed step, and the steps re-run — steps whose
//!    stash was acknowledged before the kill and that ran again (must be 0).
//!
//! `busy` loops — processes of their own, each spinning on a core as a busy host's other
//! tenants do — run beside all three and their baselines.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use durafiber_demo::agents::{Steps, StepsInput, StepsOutput};
use durafiber_runtime::{ListFilter, RunStatus, Runtime};
use durafiber_store::{Store, StoreConfig};
use serde_json::{Value, json};

use super::measure::{Samples, print_bench_report, progress, raw_fdatasync_per_s, raw_gapped_fdatasync_us};

/// What `bench steps` measures.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub runs: usize,
    pub steps: u32,
    pub sequential: u32,
    pub gap: Duration,
    pub kill_runs: usize,
    pub busy: usize,
    /// Boundaries each run keeps in its history (`history_max`): 0 measures steps without it.
    pub history_max: u32,
}

/// `busy` processes that each spin on a core until dropped.
struct BusyLoops(Vec<std::process::Child>);

impl BusyLoops {
    fn start(busy: usize) -> anyhow::Result<BusyLoops> {
        let exe = std::env::current_exe()?;
        let mut loops = BusyLoops(Vec::with_capacity(busy));
        for _ in 0..busy {
            let child = Command::new(&exe).args(["bench", "busy-loop"]).stdin(Stdio::null()).spawn()?;
            loops.0.push(child);
        }
        Ok(loops)
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The process of one busy loop: spins until killed, or for an hour at most should its
/// parent die without killing it.
pub fn busy_loop() -> anyhow::Result<i32> {
    let until = Instant::now() + Duration::from_secs(3_600);
    let mut spins = 0u64;
    while Instant::now() < until {
        for _ in 0..10_000 {
            spins = std::hint::black_box(spins.wrapping_add(1));
        }
    }
    Ok(0)
}

/// Steps of each run the killed process starts, and the pause before each.
const KILL_STEPS: u32 = 40;
const KILL_PAUSE_MS: u64 = 20;

async fn runtime(dir: &Path, agent: Steps, history_max: u32) -> anyhow::Result<Runtime> {
    let store = Store::open_dir(dir, StoreConfig::default())?;
    let config = durafiber_runtime::RuntimeConfig { history_max, ..Default::default() };
    Ok(Runtime::builder(store).config(config).agent(agent).open().await?)
}

/// Every run of the store, all pages.
fn all_runs(rt: &Runtime) -> anyhow::Result<Vec<durafiber_runtime::RunRecord>> {
    let mut runs = Vec::new();
    let mut after = None;
    loop {
        let page = rt.list(&ListFilter { after, limit: 1_000, ..ListFilter::default() })?;
        runs.extend(page.runs);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(runs),
        }
    }
}

pub async fn steps(json: bool, plan: Plan, out: Option<&Path>) -> anyhow::Result<i32> {
    let dir = tempfile::Builder::new().prefix("durafiber-bench-").tempdir_in(std::env::temp_dir())?;
    if plan.busy > 0 {
        progress(&format!("{} busy loops beside everything measured", plan.busy));
    }
    let _busy = BusyLoops::start(plan.busy)?;
    progress("raw append + fdatasync for 1 s");
    let raw = raw_fdatasync_per_s(dir.path(), 1.0)?;

    progress(&format!("{} concurrent runs x {} steps", plan.runs, plan.steps));
    let steps_per_s = concurrent_steps(&dir.path().join("concurrent"), &plan).await?;

    let Sequential { mut step, mut raw_gapped, gap, turns, cores } = sequential(dir.path(), &plan).await?;
    if let Some(out) = out {
        // Written before the quantiles sort them: the files keep the steps' order.
        step.write(out, "step", "us")?;
        raw_gapped.write(out, "raw-gapped-fdatasync", "us")?;
    }
    let (step_p50, step_p99) = (step.quantile(0.5), step.quantile(0.99));
    let (raw_gapped_p50, raw_gapped_p99) = (raw_gapped.quantile(0.5), raw_gapped.quantile(0.99));

    progress(&format!("{} runs in flight, SIGKILL, restart", plan.kill_runs));
    let killed = kill_and_resume(&dir.path().join("killed"), plan.kill_runs).await?;

    let ms = |us: u64| (us as f64 / 10.0).round() / 100.0;
    let report = json!({
        "raw_fdatasync_per_s": raw.round(),
        "runs": plan.runs, "steps": plan.steps, "steps_per_s": steps_per_s.round(),
        "steps_ratio_to_raw": (steps_per_s / raw * 100.0).round() / 100.0,
        "busy_loops": plan.busy, "sequential_cores": cores,
        "step_to_raw_gapped_p50": (step_p50 as f64 / raw_gapped_p50.max(1) as f64 * 100.0).round() / 100.0,
        "sequential_steps": plan.sequential, "sequential_turns": turns, "gap_ms": plan.gap.as_millis() as u64, "step_gap_p50_ms": ms(gap),
        "step_p50_ms": ms(step_p50), "step_p99_ms": ms(step_p99),
        "raw_gapped_fdatasync_p50_ms": ms(raw_gapped_p50), "raw_gapped_fdatasync_p99_ms": ms(raw_gapped_p99),
        "kill_runs": plan.kill_runs, "acked_before_kill": killed.acked,
        "restart_to_first_step_ms": killed.first_step.as_millis() as u64, "steps_rerun": killed.rerun,
        "restart_phases_ms": restart_phases(&killed),
    });
    let lines = vec![
        format!("raw fdatasync:              {raw:>10.0} /s"),
        format!(
            "{} runs x {} steps:         {steps_per_s:>10.0} steps/s ({:.1}x raw)",
            plan.runs,
            plan.steps,
            steps_per_s / raw
        ),
        format!(
            "sequential step:            p50 {} ms, p99 {} ms ({} ms apart at the median)",
            ms(step_p50),
            ms(step_p99),
            ms(gap)
        ),
        format!(
            "raw fdatasync, as far apart: p50 {} ms, p99 {} ms (step p50 {:.2}x)",
            ms(raw_gapped_p50),
            ms(raw_gapped_p99),
            step_p50 as f64 / raw_gapped_p50.max(1) as f64
        ),
        format!(
            "SIGKILL with {} runs:       first resumed step {} ms after restart, {} acknowledged steps re-run",
            plan.kill_runs,
            killed.first_step.as_millis(),
            killed.rerun
        ),
        format!("  where the restart went, ms from the spawn: {}", restart_phases(&killed)),
    ];
    print_bench_report(lines, report, json)?;
    Ok(i32::from(killed.rerun != 0))
}

/// Steps a second of `plan.runs` runs stashing side by side, from their starts to their ends.
async fn concurrent_steps(dir: &Path, plan: &Plan) -> anyhow::Result<f64> {
    let rt = runtime(dir, Steps::default(), plan.history_max).await?;
    let started = Instant::now();
    let mut ids = Vec::new();
    for i in 0..plan.runs {
        let input = StepsInput { steps: plan.steps, pause_ms: 0 };
        ids.push(rt.start::<Steps>(&format!("run-{i}"), &input).await?.run_id);
    }
    for id in &ids {
        rt.wait(id).await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    rt.shutdown().await;
    Ok((plan.runs as f64 * f64::from(plan.steps)) / elapsed)
}

/// Sequential steps per turn, at most: a turn of these and then as many raw syncs.
const STEPS_PER_TURN: u32 = 25;
/// Turns the sequential steps and their raw syncs take, at most.
const TURNS_MAX: u32 = 8;

/// The sequential steps' times and their baseline's, µs, and the steps' median gap.
struct Sequential {
    step: Samples,
    raw_gapped: Samples,
    gap: u64,
    turns: u32,
    /// The cores the steps' writes returned on, one per turn at most (and so the raw syncs').
    cores: Vec<usize>,
}

/// `plan.sequential` steps `gap` apart, in turns with raw write + `fdatasync` just as
/// far apart, so that a disk whose speed drifts over the run weighs on both alike. Each turn
/// is a run of its own; its raw syncs are paced by the gaps its steps had, since a clock
/// sleep ends on the runtime timer's next millisecond and the steps' real gaps are longer
/// than `gap_ms`.
async fn sequential(dir: &Path, plan: &Plan) -> anyhow::Result<Sequential> {
    let turns = (plan.sequential / STEPS_PER_TURN).clamp(1, TURNS_MAX);
    progress(&format!(
        "{} sequential steps {} ms apart, in {turns} turns with raw write + fdatasync as far apart",
        plan.sequential,
        plan.gap.as_millis()
    ));
    let times = durafiber_demo::agents::StashTimes::default();
    let agent = Steps { stash_times: Some(times.clone()), ..Steps::default() };
    let rt = runtime(&dir.join("sequential"), agent, plan.history_max).await?;
    let (mut step, mut raw_gapped, mut gaps, mut cores) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for turn in 0..turns {
        let steps = plan.sequential / turns + u32::from(turn < plan.sequential % turns);
        let input = StepsInput { steps, pause_ms: plan.gap.as_millis() as u64 };
        let id = rt.start::<Steps>(&format!("sequential-{turn}"), &input).await?.run_id;
        rt.wait(&id).await?;
        let timed = std::mem::take(&mut *times.lock());
        let turn_gaps: Vec<u64> = timed.windows(2).map(|w| gap_us((w[0].0, w[0].1), w[1].0)).collect();
        let gap = median_gap(turn_gaps.clone(), plan.gap);
        gaps.extend(turn_gaps);
        step.extend(timed.iter().map(|&(_, took, _)| took));
        // The raw syncs wait on the core the steps' writes waited on: a disk's completion
        // reaches one core, and a thread waiting on another is woken later.
        let core = most_common(timed.iter().map(|&(_, _, core)| core));
        cores.extend(core);
        let (dir, n) = (dir.to_path_buf(), timed.len());
        // A thread of its own, so that no pooled thread stays pinned.
        let syncing = std::thread::spawn(move || {
            if let Some(core) = core {
                pin_to(core);
            }
            raw_gapped_fdatasync_us(&dir, n, Duration::from_micros(gap))
        });
        let synced = tokio::task::spawn_blocking(move || syncing.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the raw syncs' thread panicked"))??;
        raw_gapped.extend(synced.0);
    }
    rt.shutdown().await;
    let gap = median_gap(gaps, plan.gap);
    cores.sort_unstable();
    cores.dedup();
    Ok(Sequential { step: Samples(step), raw_gapped: Samples(raw_gapped), gap, turns, cores })
}

/// The value seen most often, the least of equals; `None` when there is none.
fn most_common(values: impl Iterator<Item = usize>) -> Option<usize> {
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for v in values {
        *counts.entry(v).or_default() += 1;
    }
    counts.into_iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0))).map(|(v, _)| v)
}

/// Keeps the calling thread on `core`; a core it may not
/// use leaves it where it was, and the report says which cores the steps ran on.
fn pin_to(core: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(core);
    if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
        progress(&format!("could not keep the raw syncs on core {core}: {e}"));
    }
}

/// The median of `gaps`, µs; the requested gap when there are none (a turn of one step).
fn median_gap(gaps: Vec<u64>, requested: Duration) -> u64 {
    match gaps.len() {
        0 => u64::try_from(requested.as_micros()).unwrap_or(u64::MAX),
        _ => Samples(gaps).quantile(0.5),
    }
}

/// µs from the end of a step (`started` + `took`) to the start of the next.
fn gap_us((started, took): (Instant, u64), next: Instant) -> u64 {
    let gap = next.saturating_duration_since(started).saturating_sub(Duration::from_micros(took));
    u64::try_from(gap.as_micros()).unwrap_or(u64::MAX)
}

struct Killed {
    acked: u64,
    first_step: Duration,
    /// When the restarted process reached each phase, from its spawn.
    phases: Vec<(String, Duration)>,
    rerun: u64,
}

/// A child's stdout lines, read on a thread so that the parent can wait with a deadline.
fn lines_of(child: &mut std::process::Child) -> anyhow::Result<mpsc::Receiver<String>> {
    let stdout = child.stdout.take().context("child stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

/// `ack <run_id> <done>` → `(run_id, done)`.
fn ack(line: &str) -> Option<(String, u32)> {
    let mut parts = line.strip_prefix("ack ")?.split(' ');
    Some((parts.next()?.to_string(), parts.next()?.parse().ok()?))
}

/// The steps each run acknowledged before its process was SIGKILLed, a few steps after every
/// run was in flight.
fn acked_until_killed(mut child: std::process::Child) -> anyhow::Result<BTreeMap<String, u32>> {
    let lines = lines_of(&mut child)?;
    let mut acked: BTreeMap<String, u32> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut ready, mut kill_at) = (false, None);
    while kill_at.is_none_or(|at| Instant::now() < at) {
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the run-starting process did not get ready");
        }
        match lines.recv_timeout(Duration::from_millis(5)) {
            Ok(line) if line == "ready" => ready = true,
            Ok(line) => {
                if let Some((run, done)) = ack(&line) {
                    acked.insert(run, done);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the run-starting process ended by itself"),
        }
        // Kill once every run is in flight and steps are acknowledged, a few steps later.
        if ready && kill_at.is_none() && !acked.is_empty() {
            kill_at = Some(Instant::now() + Duration::from_millis(KILL_PAUSE_MS * 8));
        }
    }
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    // Acknowledgements already written to the pipe before the kill still count.
    while let Ok(line) = lines.try_recv() {
        if let Some((run, done)) = ack(&line) {
            acked.insert(run, done);
        }
    }
    Ok(acked)
}

/// When the restarted process reached each phase, ms from its spawn (to 0.1 ms): its
/// process running, its store open, its runtime open (every interrupted run re-entered),
/// its first step.
fn restart_phases(killed: &Killed) -> Value {
    let ms = |d: Duration| (d.as_secs_f64() * 10_000.0).round() / 10.0;
    let mut phases: serde_json::Map<String, Value> =
        killed.phases.iter().map(|(name, at)| (name.clone(), json!(ms(*at)))).collect();
    phases.insert("first_step".into(), json!(ms(killed.first_step)));
    Value::Object(phases)
}

/// The step each run resumed from in the restarted process, and how long after its spawn the
/// first step came.
fn resumed_from(
    mut child: std::process::Child,
    spawned: Instant,
    phases: &mut Vec<(String, Duration)>,
) -> anyhow::Result<(BTreeMap<String, u32>, Option<Duration>)> {
    let lines = lines_of(&mut child)?;
    let mut first_step = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    let resumed: BTreeMap<String, u32> = loop {
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the restarted process did not finish every run");
        }
        match lines.recv_timeout(Duration::from_millis(50)) {
            Ok(line) if line.starts_with("ack ") => {
                first_step.get_or_insert(spawned.elapsed());
            }
            Ok(line) if line.starts_with("phase ") => {
                phases.push((line.trim_start_matches("phase ").to_string(), spawned.elapsed()));
            }
            Ok(line) if line.starts_with('{') => {
                let report: Value = serde_json::from_str(&line).context("the restarted process's report")?;
                break serde_json::from_value(report["resumed_from"].clone()).unwrap_or_default();
            }
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the restarted process ended without a report")
            }
        }
    };
    let _ = child.wait();
    Ok((resumed, first_step))
}

async fn kill_and_resume(data: &Path, runs: usize) -> anyhow::Result<Killed> {
    let exe = std::env::current_exe()?;
    let spawn = |mode: &str| {
        Command::new(&exe)
            .args(["bench", "steps-child"])
            .arg(data)
            .args([mode, &runs.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
    };
    let acked = acked_until_killed(spawn("start")?)?;
    let spawned = Instant::now();
    let mut phases = Vec::new();
    let (resumed, first_step) = resumed_from(spawn("resume")?, spawned, &mut phases)?;
    let rerun = acked
        .iter()
        .map(|(run, done)| u64::from(done.saturating_sub(resumed.get(run).copied().unwrap_or(*done))))
        .sum();
    Ok(Killed {
        acked: acked.values().map(|d| u64::from(*d)).sum(),
        first_step: first_step.unwrap_or_default(),
        phases,
        rerun,
    })
}

/// The process `bench steps` kills (`start`) and restarts (`resume`). Restarted, it says
/// when it got to run, when its store was open and when its runtime was (`phase NAME`), for
/// the report's breakdown of the restart.
pub async fn child(data: &Path, mode: &str, runs: usize) -> anyhow::Result<i32> {
    println!("phase process");
    let agent = Steps { print_acks: true, ..Steps::default() };
    let store = Store::open_dir(data, StoreConfig::default())?;
    println!("phase store_open");
    let config = durafiber_runtime::RuntimeConfig {
        history_max: durafiber_runtime::limits::HISTORY_MAX_DEFAULT,
        ..Default::default()
    };
    let rt = Runtime::builder(store).config(config).agent(agent).open().await?;
    println!("phase runtime_open");
    if mode == "start" {
        let input = StepsInput { steps: KILL_STEPS, pause_ms: KILL_PAUSE_MS };
        for i in 0..runs {
            rt.start::<Steps>(&format!("killed-{i}"), &input).await?;
        }
        println!("ready");
        std::future::pending::<()>().await;
    }
    // Resume: the runtime recovered every run when it opened; wait for each to finish.
    let mut resumed_from = BTreeMap::new();
    for run in all_runs(&rt)? {
        let status = rt.wait(&run.run_id).await?;
        if let RunStatus::Completed { output_json } = status {
            let out: StepsOutput = serde_json::from_str(&output_json)?;
            // A run that finished before the kill was not recovered: nothing of it ran again.
            resumed_from.insert(run.run_id, out.resumed_from.first().copied().unwrap_or(out.done));
        }
    }
    println!("{}", json!({ "resumed_from": resumed_from }));
    rt.shutdown().await;
    Ok(0)
}
