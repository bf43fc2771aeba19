//! `durafiber bench recover`: runs in flight in a child process that is SIGKILLed, then the
//! killed store recovered in a process of its own: the time from that process's start to the
//! store being open and to every run's recovery hook having been called, and each run's
//! recovery time. `--repeat N` recovers N fresh, synced copies of the same killed store.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use durafiber_demo::agents::{Steps, StepsInput};
use durafiber_runtime::Runtime;
use durafiber_store::{Store, StoreConfig};
use serde_json::{Value, json};

use super::measure::{Samples, epoch_ms, peak_rss_bytes, print_bench_report, progress, start_runs};

/// What `bench recover`'s runs do: how many, how long each waits before each step, and how
/// many boundaries each keeps in its history.
#[derive(Debug, Clone, Copy)]
pub(super) struct Workload {
    pub runs: usize,
    pub pause: Duration,
    pub history_max: u32,
}

impl Workload {
    /// `bench recover-child` of this workload on `data`, in `mode` (`start` or `recover`).
    fn child_command(&self, exe: &Path, data: &Path, mode: &str) -> Command {
        let mut command = Command::new(exe);
        command.args(["bench", "recover-child"]).arg(data).arg(mode).arg(self.runs.to_string());
        command.args([
            "--pause-ms",
            &self.pause.as_millis().to_string(),
            "--history-max",
            &self.history_max.to_string(),
        ]);
        command
    }
}

/// The process `bench recover` starts, kills and restarts.
pub(super) async fn child(data: &Path, mode: &str, workload: Workload) -> anyhow::Result<i32> {
    let Workload { runs, pause, history_max } = workload;
    let pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
    let process_start = Instant::now();
    let process_start_ms = epoch_ms();
    let store = Store::open_dir(data, StoreConfig::default())?;
    let store_open_ms = process_start.elapsed().as_secs_f64() * 1000.0;
    let config = durafiber_runtime::RuntimeConfig { history_max, ..Default::default() };
    let rt = Runtime::builder(store).config(config).agent(Steps::default()).open().await?;
    let runtime_open_ms = process_start.elapsed().as_secs_f64() * 1000.0;
    if mode == "start" {
        let input = StepsInput { steps: 1_000_000, pause_ms };
        let reporter = tokio::spawn(report_starts(rt.clone(), runs, pause));
        start_runs::<Steps>(&rt, runs, "bench", &input, |_| false).await?;
        reporter.abort();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        println!("ready");
        std::future::pending::<()>().await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while (rt.metrics().recoveries as usize) < runs && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let all_recovered_ms = process_start.elapsed().as_secs_f64() * 1000.0;
    let m = rt.metrics();
    // Every recovery's time since the runtime's open is in its histogram (within 1%), which
    // loses none; the runtime opens right after the store, so adding the store's open makes
    // them times since process start. The event log keeps the newest events only: its
    // samples (for `--out`) describe the runs recovered last, and `logged_runs` says how many.
    let since_start = |us: u64| ((store_open_ms + us as f64 / 1000.0) * 10.0).round() / 10.0;
    let latency = &m.recover_latency;
    let per_run = Samples(
        rt.events()
            .iter()
            .filter(|e| e.kind == "recovered")
            .map(|e| e.at_ms.as_millis().saturating_sub(process_start_ms))
            .collect(),
    );
    let report = json!({
        "runs": runs, "pause_ms": pause_ms, "history_max": history_max, "recovered": m.recoveries, "timed_runs": latency.count,
        "logged_runs": per_run.0.len(), "store_open_ms": (store_open_ms * 10.0).round() / 10.0,
        "runtime_open_ms": runtime_open_ms.round(),
        "all_recovered_ms": all_recovered_ms.round(), "p50_ms": since_start(latency.p50_us),
        "p99_ms": since_start(latency.p99_us), "max_ms": since_start(latency.max_us),
        "cold_start_p50_us": m.cold_start.p50_us, "cold_start_p99_us": m.cold_start.p99_us,
        "peak_rss_bytes": peak_rss_bytes(),
        "samples_ms": per_run.0,
    });
    println!("{report}");
    std::process::exit(0);
}

/// Says every two seconds how far the start phase is: runs started, and how many stashes
/// the started ones committed (how the machine keeps up with them shows in the latter).
/// When a commit has taken longer than the pause between a run's steps, at the median since
/// the start, three reports in a row, the runs ask more than this machine commits: the
/// process says so on stdout, in place of `ready`, and ends, where the start phase would
/// otherwise drag on for as long as the backlog grows.
async fn report_starts(rt: Runtime, runs: usize, pause: Duration) {
    let pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
    let mut stashes = 0;
    let mut behind = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let m = rt.metrics();
        let committed = m.stash_commit.count;
        let per_second = committed.saturating_sub(stashes) / 2;
        let median_ms = m.stash_commit.p50_us / 1000;
        progress(&format!(
            "{} of {runs} runs started; {per_second} stashes a second, their commits taking {median_ms} ms at the median",
            m.starts
        ));
        stashes = committed;
        // Runs with no pause ask for all the machine commits: they cannot be behind.
        behind = if pause_ms > 0 && median_ms > pause_ms { behind + 1 } else { 0 };
        if behind == 3 {
            let asked = m.starts.saturating_mul(1000) / pause_ms.max(1);
            println!(
                "{OVERLOADED}{} of {runs} runs started; they ask about {asked} stashes a second and this machine commits {per_second}, each waiting {median_ms} ms at the median, longer than the {pause_ms} ms between a run's steps",
                m.starts
            );
            std::process::exit(3);
        }
    }
}

/// What the start phase prints in place of `ready` when the machine cannot carry its runs.
const OVERLOADED: &str = "overloaded: ";

/// The runs started in a process of their own, which is SIGKILLed with every run in flight.
fn start_and_kill(workload: &Workload, exe: &Path, killed: &Path) -> anyhow::Result<()> {
    let mut child = workload.child_command(exe, killed, "start").stdout(Stdio::piped()).spawn()?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    match lines.next().transpose()?.as_deref() {
        Some("ready") => {}
        Some(line) if let Some(why) = line.strip_prefix(OVERLOADED) => {
            let _ = child.wait();
            bail!(
                "the workload is more than this machine's store commits, so its recovery cannot be measured: {why}"
            );
        }
        _ => bail!("the run-starting process did not get ready"),
    }
    progress("SIGKILL with every run in flight, then restart");
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    Ok(())
}

/// `repeat` recoveries of the killed store (each of a fresh copy when more than one): the
/// first's report and each one's time to recover every run.
fn recover_rounds(
    workload: &Workload,
    exe: &Path,
    dir: &Path,
    killed: &Path,
    repeat: usize,
) -> anyhow::Result<(Option<Value>, Vec<f64>)> {
    let runs = workload.runs;
    let mut first: Option<Value> = None;
    let mut times = Vec::with_capacity(repeat);
    for round in 0..repeat {
        // One recovery recovers the killed directory itself; several each recover a fresh,
        // synced copy of it, so every one starts from the same state.
        let data = if repeat == 1 {
            killed.to_path_buf()
        } else {
            progress(&format!("recovery {} of {repeat}, on a copy of the killed store", round + 1));
            let copy = dir.join(format!("copy-{round}"));
            copy_dir(killed, &copy)?;
            copy
        };
        let output = workload.child_command(exe, &data, "recover").stderr(Stdio::inherit()).output()?;
        let text = String::from_utf8_lossy(&output.stdout);
        let report: Value =
            serde_json::from_str(text.lines().last().unwrap_or("")).context("recovery report")?;
        let recovered = report["recovered"].as_u64().unwrap_or(0);
        if recovered != runs as u64 {
            bail!("recovery {} of {repeat}: {recovered} of {runs} runs were recovered", round + 1);
        }
        times.push(report["all_recovered_ms"].as_f64().unwrap_or(f64::NAN));
        if repeat > 1 {
            let _ = std::fs::remove_dir_all(&data);
        }
        first.get_or_insert(report);
    }
    Ok((first, times))
}

pub(super) async fn recover(
    json: bool,
    workload: Workload,
    repeat: usize,
    out: Option<&Path>,
) -> anyhow::Result<i32> {
    let Workload { runs, pause, history_max } = workload;
    let pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
    let exe = std::env::current_exe()?;
    let dir = tempfile::Builder::new().prefix("durafiber-bench-").tempdir_in(std::env::temp_dir())?;
    let killed = dir.path().join("killed");
    progress(&format!(
        "starting {runs} runs that stash every {pause_ms} ms, each keeping {history_max} boundaries in its history"
    ));
    start_and_kill(&workload, &exe, &killed)?;
    let repeat = repeat.max(1);
    let (first, times) = recover_rounds(&workload, &exe, dir.path(), &killed, repeat)?;
    let mut report = first.context("no recovery ran")?;
    let samples: Vec<u64> = serde_json::from_value(report["samples_ms"].take()).unwrap_or_default();
    if let Some(obj) = report.as_object_mut() {
        obj.remove("samples_ms");
        if repeat > 1 {
            let mut sorted = times.clone();
            sorted.sort_by(f64::total_cmp);
            obj.insert("all_recovered_ms_each".into(), json!(times));
            obj.insert("all_recovered_ms_median".into(), json!(sorted[sorted.len() / 2]));
            obj.insert("all_recovered_ms_best".into(), json!(sorted[0]));
        }
    }
    if let Some(out) = out {
        Samples(samples).write(out, "recover", "ms since process start")?;
    }
    let mut lines = vec![format!(
        "{runs} interrupted runs: store open after {} ms; all recovered {} ms after process start, {:.0} MB at the peak",
        report["store_open_ms"],
        report["all_recovered_ms"],
        report["peak_rss_bytes"].as_f64().unwrap_or(0.0) / 1e6
    )];
    if repeat > 1 {
        lines.push(format!(
            "{repeat} recoveries of the same killed store: all recovered after {} ms (median {}, best {})",
            times.iter().map(|t| format!("{t}")).collect::<Vec<_>>().join(", "),
            report["all_recovered_ms_median"],
            report["all_recovered_ms_best"]
        ));
    }
    print_bench_report(lines, report, json)?;
    Ok(0)
}

/// Copies the data directory `from` to `to` (files and folders), each file synced, so a
/// recovery of the copy reads the disk as a recovery of the original would.
fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)
                .with_context(|| format!("copying {}", entry.path().display()))?;
            std::fs::File::open(&target).and_then(|f| f.sync_all())?;
        }
    }
    std::fs::File::open(to).and_then(|d| d.sync_all())?;
    Ok(())
}
