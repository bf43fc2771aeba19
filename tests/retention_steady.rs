//! A store in a steady state under retention (the operations guide's "Retention"): runs
//! start and finish for a while on the real clock with a 5-second retention for completed
//! runs, and the data directory and the process's memory level off instead of growing with
//! every run ever started; a few open runs waiting for people are never touched; the store
//! verifies clean afterwards. Alone in its test binary, so the memory measured is its own.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use durafiber_runtime::{Agent, AgentError, Ctx, Retention, Runtime, RuntimeConfig};
use durafiber_store::{Store, StoreConfig};

/// How long runs start and finish.
const LOAD_FOR: Duration = Duration::from_secs(60);
/// How often the directory and memory are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(4);
/// Runs started at once, each waiting for its end before the next.
const STARTERS: usize = 8;
/// Each starter starts a run this often at most: 250 runs a second in all, a steady load
/// that retention's sweeps keep up with.
const START_EVERY: Duration = Duration::from_millis(32);
/// What the data directory may hold at most in the steady state: the runs of a few seconds,
/// sled's segments and the write-ahead log. 28–32 MiB on a quiet machine, where the same
/// load without retention grows it by 4.6 KiB a run — 100 MiB a minute and a half.
const DIR_BYTES_MAX: u64 = 64 << 20;

/// A stash, three stream chunks and a storage key, then done; or, when told to wait, a
/// human who never comes.
struct Worker;

impl Agent for Worker {
    const KIND: &'static str = "worker";
    type Input = bool;
    type Stash = u32;
    type Output = u32;
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, wait: bool) -> Result<u32, AgentError> {
        ctx.storage().put("note", &"x".repeat(200)).await?;
        for n in 0..3 {
            ctx.emit(&format!("chunk {n} {}", "y".repeat(100)))?;
        }
        ctx.stash("worked", &1).await?;
        if wait {
            ctx.request_approval("never", &"nobody looks").await?;
        }
        Ok(1)
    }
}

/// Bytes the files under `dir` take on disk.
fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => dirs.push(entry.path()),
                Ok(m) => total += m.blocks() * 512,
                Err(_) => {}
            }
        }
    }
    total
}

/// This process's resident memory, bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok());
    kib.unwrap_or(0) * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_retention_the_data_directory_and_memory_level_off_and_open_runs_stay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let store = Store::open_dir(&data, StoreConfig::default()).expect("store");
    let config = RuntimeConfig {
        retention: Retention { completed: Some(Duration::from_secs(5)), ..Retention::default() },
        checkpoint_after: Duration::from_secs(5),
        ..RuntimeConfig::default()
    };
    let rt = Runtime::builder(store.clone()).config(config).agent(Worker).open().await.expect("runtime");
    let mut waiting = Vec::new();
    for n in 0..5 {
        waiting.push(rt.start::<Worker>(&format!("waiting-{n}"), &true).await.expect("start").run_id);
    }

    let began = Instant::now();
    let starters: Vec<_> = (0..STARTERS)
        .map(|s| {
            let rt = rt.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                let mut every = tokio::time::interval(START_EVERY);
                while began.elapsed() < LOAD_FOR {
                    every.tick().await;
                    let id = rt.start::<Worker>(&format!("s{s}-{n}"), &false).await.expect("start").run_id;
                    rt.wait(&id).await.expect("wait");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut samples = Vec::new();
    while began.elapsed() < LOAD_FOR {
        tokio::time::sleep(SAMPLE_EVERY).await;
        samples.push((began.elapsed().as_secs(), dir_bytes(&data), rss_bytes()));
    }
    let mut started = 0;
    for s in starters {
        started += s.await.expect("starter");
    }
    let mib = |b: u64| b as f64 / 1_048_576.0;
    let shown: Vec<String> = samples
        .iter()
        .map(|(at, dir, rss)| format!("{at} s: dir {:.1} MiB, rss {:.1} MiB", mib(*dir), mib(*rss)))
        .collect();
    let shown = shown.join("\n");
    let deleted = rt.metrics().runs_deleted_by_retention;
    eprintln!("{shown}\n{started} runs started, {deleted} deleted by retention");

    // Level: the last third of the samples no higher than the middle third, give or take
    // what one sample's timing moves, and the directory within its stated bound.
    let third = samples.len() / 3;
    let (middle, last) = (&samples[third..2 * third], &samples[2 * third..]);
    let max = |s: &[(u64, u64, u64)], f: fn(&(u64, u64, u64)) -> u64| s.iter().map(f).max().unwrap_or(0);
    let (dir_middle, dir_last) = (max(middle, |s| s.1), max(last, |s| s.1));
    let (rss_middle, rss_last) = (max(middle, |s| s.2), max(last, |s| s.2));
    assert!(dir_last <= dir_middle + dir_middle / 2 + (4 << 20), "the data directory kept growing:\n{shown}");
    assert!(dir_last <= DIR_BYTES_MAX, "the data directory passed {} MiB:\n{shown}", DIR_BYTES_MAX >> 20);
    assert!(rss_last <= rss_middle + rss_middle / 4 + (16 << 20), "memory kept growing:\n{shown}");
    // Retention kept up: all but the last few seconds' runs are gone.
    assert!(started > 1_000, "only {started} runs in {LOAD_FOR:?}");
    assert!(deleted * 4 >= started * 3, "{deleted} of {started} runs deleted");

    // The runs waiting for people were never touched, and the store reads clean.
    for id in &waiting {
        let view = rt.inspect(id).expect("a waiting run is kept");
        assert_eq!(view.run.status.name(), "waiting_approval", "{id}");
        assert!(view.stash.is_some(), "{id} lost its stash");
    }
    rt.shutdown().await;
    let report = durafiber_store::repair::verify(&store).expect("verify");
    assert!(report.bad.is_empty(), "store verify: {:?}", report.bad);
}
