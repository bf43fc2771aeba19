//! What the benchmarks share: latency samples with their quantiles and histogram, progress
//! lines, the raw `fdatasync` figures every figure is compared with (the back-to-back rate,
//! and the latency of syncs a gap apart), writers that commit stash-sized sync boundaries
//! until a deadline, and the report, which says how much CPU time the host took meanwhile.

use durafiber_runtime::{Agent, RunId, Runtime, Timestamp};
use std::{
    io::Write,
    path::Path,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use anyhow::Context as _;
use durafiber_store::{
    Batch, Durability, Store,
    tables::{StashRecord, keys},
};
use serde_json::Value;

use super::output::print_report;

/// One writer per run of `runs`, each committing a stash of about 200 bytes for its run in
/// `sync` mode until `deadline`: the commits made, and each one's latency.
pub(super) async fn commit_until(
    store: &Store,
    runs: Vec<RunId>,
    deadline: Instant,
) -> anyhow::Result<(u64, Samples)> {
    let count = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for run_id in runs {
        let (store, count, samples) = (store.clone(), count.clone(), samples.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            let mut seq = 0u64;
            while Instant::now() < deadline {
                let stash = StashRecord {
                    run_id: run_id.clone(),
                    attempt: 1,
                    step: "step".into(),
                    seq,
                    stash_json: "3".repeat(160),
                    written_at_ms: Timestamp::from_millis(0),
                };
                let mut batch = Batch::new();
                batch.put(keys::stash(&run_id), &stash)?;
                let t = Instant::now();
                store.commit(batch, Durability::Sync).await?;
                mine.push(t.elapsed().as_micros() as u64);
                count.fetch_add(1, Ordering::Relaxed);
                seq += 1;
            }
            samples.lock().extend(mine);
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let samples = std::mem::take(&mut *samples.lock());
    Ok((count.load(Ordering::Relaxed), Samples(samples)))
}

/// Latency samples in microseconds.
#[derive(Default)]
pub(super) struct Samples(pub(super) Vec<u64>);

impl Samples {
    pub(super) fn quantile(&mut self, q: f64) -> u64 {
        if self.0.is_empty() {
            return 0;
        }
        self.0.sort_unstable();
        let i = ((self.0.len() as f64 - 1.0) * q).round() as usize;
        self.0[i.min(self.0.len() - 1)]
    }

    /// Writes `samples.csv` and a histogram as `histogram.svg` into `out`.
    pub(super) fn write(&mut self, out: &Path, name: &str, unit: &str) -> anyhow::Result<()> {
        std::fs::create_dir_all(out)?;
        let mut csv = String::from(unit);
        csv.push('\n');
        for s in &self.0 {
            csv.push_str(&format!("{s}\n"));
        }
        std::fs::write(out.join(format!("{name}-samples.csv")), csv)?;
        std::fs::write(out.join(format!("{name}-histogram.svg")), svg_histogram(&mut self.0, name, unit))?;
        Ok(())
    }
}

/// A histogram over log2 buckets, as a small self-contained SVG.
fn svg_histogram(samples: &mut [u64], title: &str, unit: &str) -> String {
    let mut buckets = [0u64; 40];
    for s in samples.iter() {
        buckets[(64 - s.leading_zeros() as usize).min(39)] += 1;
    }
    let first = buckets.iter().position(|n| *n > 0).unwrap_or(0);
    let last = buckets.iter().rposition(|n| *n > 0).unwrap_or(0);
    let shown = &buckets[first..=last];
    let max = shown.iter().copied().max().unwrap_or(1).max(1);
    let (w, h, bar) = ((60 + shown.len() * 40).max(560), 260, 36);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"monospace\" font-size=\"10\">\n\
         <text x=\"10\" y=\"16\" font-size=\"13\">{title}: {} samples ({unit}, log2 buckets)</text>\n",
        samples.len()
    );
    for (i, n) in shown.iter().enumerate() {
        let bh = (*n as f64 / max as f64 * 180.0) as usize;
        let x = 40 + i * 40;
        let upper = 1u64 << (first + i);
        svg.push_str(&format!(
            "<rect x=\"{x}\" y=\"{}\" width=\"{bar}\" height=\"{bh}\" fill=\"#4a7ab0\"/>\n\
             <text x=\"{x}\" y=\"{}\">{n}</text>\n<text x=\"{x}\" y=\"250\">&lt;{upper}</text>\n",
            220 - bh,
            215 - bh
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

/// The process's peak resident memory so far (`VmHWM`), in bytes.
pub(super) fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// The process's resident memory now (`/proc/self/statm`), in bytes.
pub(super) fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
}

/// Runs started per task by [`start_runs`].
const STARTS_PER_TASK: usize = 500;

/// Starts runs `0..runs` of `A` with `input`, keyed `{prefix}-{i}`, from one task per 500
/// starts, and returns the ids of the runs `keep` picks, in order: only those, as a million
/// ids would weigh on the memory a benchmark measures. Shows progress every 100,000 runs.
pub(super) async fn start_runs<A: Agent>(
    rt: &Runtime,
    runs: usize,
    prefix: &str,
    input: &A::Input,
    keep: impl Fn(usize) -> bool + Copy + Send + 'static,
) -> anyhow::Result<Vec<RunId>> {
    let mut tasks = Vec::new();
    for chunk in 0..runs.div_ceil(STARTS_PER_TASK) {
        let (rt, input, prefix) = (rt.clone(), input.clone(), prefix.to_string());
        tasks.push(tokio::spawn(async move {
            let mut kept = Vec::new();
            for i in chunk * STARTS_PER_TASK..((chunk + 1) * STARTS_PER_TASK).min(runs) {
                let started = rt.start::<A>(&format!("{prefix}-{i}"), &input).await?;
                if keep(i) {
                    kept.push(started.run_id);
                }
            }
            Ok::<_, durafiber_runtime::RuntimeError>(kept)
        }));
    }
    let mut kept = Vec::new();
    for (done, task) in tasks.into_iter().enumerate() {
        kept.extend(task.await??);
        let started = (done + 1) * STARTS_PER_TASK;
        if started.is_multiple_of(100_000) && started < runs {
            progress(&format!("{started} runs started"));
        }
    }
    Ok(kept)
}

pub(super) fn progress(msg: &str) {
    eprintln!("bench: {msg}");
}

/// The machine's CPU time counters, from the first line of `/proc/stat` (clock ticks, all
/// cores): how much went to steal — time a virtual machine's host gave to others while
/// this machine had work — against all of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct CpuTimes {
    steal: u64,
    total: u64,
}

impl CpuTimes {
    fn now() -> Option<CpuTimes> {
        CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    fn parse(stat: &str) -> Option<CpuTimes> {
        let mut fields = stat.lines().next()?.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        // user nice system idle iowait irq softirq steal, then guest time, which `user`
        // already counts.
        let ticks: Vec<u64> = fields.take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
        let steal = *ticks.get(7)?;
        ticks.iter().try_fold(0u64, |sum, t| sum.checked_add(*t)).map(|total| CpuTimes { steal, total })
    }

    /// The share of the CPU time since `earlier` that went to steal, in percent.
    fn steal_pct_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total).filter(|t| *t > 0)?;
        let steal = self.steal.checked_sub(earlier.steal)?;
        Some((steal as f64 * 1000.0 / total as f64).round() / 10.0)
    }
}

/// The machine's load average over the last minute, from `/proc/loadavg`: how many tasks
/// wanted a core, beside the cores there are.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// The counters when the benchmark began ([`bench_began`]).
static BEGAN: OnceLock<Option<CpuTimes>> = OnceLock::new();

/// Marks the start of the benchmark whose report [`print_bench_report`] prints.
pub(super) fn bench_began() {
    BEGAN.get_or_init(CpuTimes::now);
}

/// Prints a benchmark's report with `host_steal_pct`: the share of the machine's CPU time
/// its host took for others since [`bench_began`] (null where the kernel does not say),
/// and `load_avg_1m` and `cores` at its end. Figures measured while a host takes a tenth,
/// or beside other work, are not those of a quiet machine.
pub(super) fn print_bench_report(
    mut lines: Vec<String>,
    mut report: Value,
    json: bool,
) -> anyhow::Result<()> {
    let began = BEGAN.get().copied().flatten();
    let steal_pct = began.zip(CpuTimes::now()).and_then(|(began, now)| now.steal_pct_since(&began));
    if let Some(pct) = steal_pct {
        lines.push(format!("the host took {pct}% of this machine's CPU time meanwhile (steal)"));
    }
    let load = load_average();
    let cores = std::thread::available_parallelism().map(std::num::NonZero::get).ok();
    if let (Some(load), Some(cores)) = (load, cores) {
        lines.push(format!("load average {load:.2} (last minute) on {cores} cores"));
    }
    if let Some(fields) = report.as_object_mut() {
        fields.insert("host_steal_pct".into(), steal_pct.into());
        fields.insert("load_avg_1m".into(), load.into());
        fields.insert("cores".into(), cores.into());
    }
    print_report(&lines, &report, json)
}

/// `n` raw writes of a stash-sized record into a file written in full beforehand (as the
/// store's log is), each followed by `fdatasync`, with `gap` of sleep between them: the
/// latency, µs, of each. A sync after an idle gap costs this disk more than one right
/// after another, so a step `gap` apart is measured against this, not against the rate.
pub(super) fn raw_gapped_fdatasync_us(
    dir: &Path,
    n: usize,
    gap: std::time::Duration,
) -> anyhow::Result<Samples> {
    use std::os::unix::fs::FileExt as _;
    const SLOT: u64 = 512;
    let record = [7u8; 256];
    let path = dir.join("raw-gapped-fdatasync.bin");
    let f = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path)?;
    let slots = u64::try_from(n)?.checked_add(1).and_then(|s| s.checked_mul(SLOT)).context("too many")?;
    f.write_all_at(&vec![0u8; usize::try_from(slots)?], 0)?;
    f.sync_all()?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..u64::try_from(n)? {
        std::thread::sleep(gap);
        let t = Instant::now();
        f.write_all_at(&record, i * SLOT)?;
        f.sync_data()?;
        samples.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
    }
    std::fs::remove_file(&path)?;
    Ok(Samples(samples))
}

pub(super) fn raw_fdatasync_per_s(dir: &Path, seconds: f64) -> anyhow::Result<f64> {
    let mut raw = RawSyncs::open(dir)?;
    raw.run_for(seconds)?;
    Ok(raw.per_s())
}

/// Back-to-back appends of a stash-sized record, each followed by `fdatasync`: the rate a
/// store's sync commits are compared with. It can run in turns with what it is compared
/// with ([`RawSyncs::run_for`] adds up), so a disk whose speed drifts over a run weighs on
/// both alike.
pub(super) struct RawSyncs {
    file: std::fs::File,
    syncs: u64,
    seconds: f64,
}

impl RawSyncs {
    pub(super) fn open(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("raw-fdatasync.bin");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        Ok(Self { file, syncs: 0, seconds: 0.0 })
    }

    /// Syncs for `seconds` more.
    pub(super) fn run_for(&mut self, seconds: f64) -> anyhow::Result<()> {
        let record = [7u8; 256];
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < seconds {
            self.file.write_all(&record)?;
            self.file.sync_data()?;
            self.syncs += 1;
        }
        self.seconds += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// Syncs per second over every turn so far.
    pub(super) fn per_s(&self) -> f64 {
        self.syncs as f64 / self.seconds
    }
}

/// The wall clock, ms since the Unix epoch (0 before it).
pub(super) fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steal_share_is_read_off_the_first_line_of_proc_stat() {
        let before = CpuTimes::parse("cpu  100 0 50 800 10 0 5 35 7 0\ncpu0 50 0 25 400 5 0 2 18 3 0\n");
        let after = CpuTimes::parse("cpu  200 0 100 1500 20 0 10 170 9 0\n");
        assert_eq!(before, Some(CpuTimes { steal: 35, total: 1000 }));
        // 135 of the 1,000 ticks between them were stolen; guest time is not counted twice.
        let pct = after.zip(before).and_then(|(after, before)| after.steal_pct_since(&before));
        assert_eq!(pct, Some(13.5));
        assert_eq!(before.and_then(|b| b.steal_pct_since(&b)), None, "no time passed");
    }

    #[test]
    fn a_kernel_without_steal_or_a_garbled_file_says_nothing() {
        assert_eq!(CpuTimes::parse("cpu  100 0 50 800\n"), None);
        assert_eq!(CpuTimes::parse("intr 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(CpuTimes::parse("cpu  1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(CpuTimes::parse(""), None);
    }

    #[test]
    fn this_machine_tells_its_cpu_times() {
        // Linux has had the steal column since 2.6.11; the benchmarks run on Linux.
        let now = CpuTimes::now().expect("/proc/stat with a steal column");
        assert!(now.total > 0 && now.steal <= now.total, "{now:?}");
    }
}
