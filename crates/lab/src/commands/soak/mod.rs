//! `durafiber soak`: weeks of use in an hour. A real `durafiber serve`, with retention on,
//! takes a steady workload (`workload.rs`: refunds started, approved and forked, step runs
//! started and cancelled, settled runs deleted) while it is SIGKILLed every few minutes and
//! started again on the same data directory. Every minute the report takes the server's
//! resident memory, its open file descriptors and the data directory's bytes; at every
//! restart, while no server holds the store, `store verify` reads every record (the history
//! ring's among them) and finds none bad. At the end every refund is checked against the
//! upstream, which counts its own objects: exactly one refund and one email each.
//!
//! It passes when no effect was lost or made twice, no record was bad, and memory,
//! descriptors and disk level off: over the last half of the soak each grows by less than
//! [`GROWTH_MAX_PCT`] (the first minutes fill caches and the retention window).

mod sample;
mod workload;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use durafiber_client::Client;
use durafiber_testkit::upstream::Upstream;
use serde::Serialize;
use serde_json::json;

use super::torture::server::Server;
use sample::Sample;
use workload::Workload;

/// The most the last half of the soak may grow memory, descriptors or disk by, in percent.
pub const GROWTH_MAX_PCT: f64 = 5.0;
/// How long a server may take to start listening.
const LISTEN_DEADLINE: Duration = Duration::from_secs(60);
/// How long the last server has to settle every refund.
const FINISH_DEADLINE: Duration = Duration::from_secs(180);

/// What a soak does.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SoakPlan {
    /// How long it runs.
    pub minutes: u64,
    /// How long each server lives before its SIGKILL.
    #[serde(with = "durafiber_api::time::millis_duration", rename = "kill_every_ms")]
    pub kill_every: Duration,
    /// Refunds started a second.
    pub rate: u32,
}

/// What a soak saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SoakReport {
    /// The plan.
    pub minutes: u64,
    /// One sample a minute.
    pub samples: Vec<Sample>,
    /// At each restart: the records `store verify` read, per table, and the bad ones.
    pub verified: Vec<serde_json::Value>,
    /// Servers SIGKILLed.
    pub kills: u32,
    /// Refunds started (answered with a run id), approvals given, forks made, step runs
    /// cancelled, settled runs deleted by request.
    pub refunds: usize,
    pub approvals: usize,
    pub forks: usize,
    pub cancelled: usize,
    pub deleted: usize,
    /// Runs deleted by retention, as the last server counts them.
    pub deleted_by_retention: u64,
    /// Refunds with no refund or no email upstream at the end; with more than one.
    pub lost_effects: usize,
    pub repeated_effects: usize,
    /// Records `store verify` found bad, over every restart.
    pub bad_records: u64,
    /// Growth over the last half of the soak, in percent: resident memory, descriptors, disk.
    pub rss_growth_pct: f64,
    pub fds_growth_pct: f64,
    pub disk_growth_pct: f64,
    pub pass: bool,
}

/// `durafiber soak`: runs it with this binary and prints the report (JSON as the last line
/// with `json`); exit code 1 when it did not pass.
pub async fn run(json_line: bool, plan: SoakPlan, out: Option<&Path>) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("finding the durafiber binary")?;
    let out = match out {
        Some(dir) => dir.to_path_buf(),
        None => std::env::temp_dir().join(format!("durafiber-soak-{}", std::process::id())),
    };
    let report = soak(&exe, plan, &out).await?;
    for s in &report.samples {
        println!(
            "minute {:>3}: rss {:>6.1} MiB, fds {:>4}, data {:>7.1} MiB, {} runs",
            s.minute,
            s.rss_bytes as f64 / 1_048_576.0,
            s.fds,
            s.data_bytes as f64 / 1_048_576.0,
            s.runs
        );
    }
    println!(
        "soak of {} min: {} kills, {} refunds, {} approvals, {} forks, {} cancelled, {} deleted, {} by retention; \
         effects lost {}, repeated {}; bad records {}; last half grew rss {:.1}%, fds {:.1}%, disk {:.1}%: {}",
        report.minutes,
        report.kills,
        report.refunds,
        report.approvals,
        report.forks,
        report.cancelled,
        report.deleted,
        report.deleted_by_retention,
        report.lost_effects,
        report.repeated_effects,
        report.bad_records,
        report.rss_growth_pct,
        report.fds_growth_pct,
        report.disk_growth_pct,
        if report.pass { "PASS" } else { "FAIL" }
    );
    std::fs::write(out.join("report.json"), serde_json::to_string_pretty(&report)?)?;
    if json_line {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(i32::from(!report.pass))
}

/// The server's config: settled runs kept a minute, the audit trail ten.
fn config(out: &Path) -> anyhow::Result<PathBuf> {
    let path = out.join("config.json");
    let retention =
        json!({"completed": "1m", "failed": "1m", "cancelled": "1m", "escalated": "1m", "audit": "10m"});
    std::fs::write(&path, json!({ "retention": retention }).to_string())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

async fn soak(exe: &Path, plan: SoakPlan, out: &Path) -> anyhow::Result<SoakReport> {
    let data = out.join("data");
    if data.exists() {
        std::fs::remove_dir_all(&data).with_context(|| format!("clearing {}", data.display()))?;
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let config = config(out)?;
    let upstream = Upstream::start().await.context("starting the upstream")?;
    let mut work = Workload::new(upstream.url(), plan.rate);
    let mut report = SoakReport { minutes: plan.minutes, ..SoakReport::default() };
    let began = Instant::now();
    let end = began + Duration::from_secs(plan.minutes.saturating_mul(60));
    let mut next_sample = began + Duration::from_secs(60);
    let mut life = 0;
    while Instant::now() < end {
        life += 1;
        let log = out.join(format!("server-{life}.log"));
        let mut server = Server::spawn(exe, &data, &config, &log, 1)?;
        let client = listening(&mut server, &data).await?;
        let kill_at = (Instant::now() + plan.kill_every).min(end);
        while Instant::now() < kill_at {
            work.tick(&client).await;
            if Instant::now() >= next_sample {
                let minute = began.elapsed().as_secs() / 60;
                report.samples.push(Sample::take(minute, &server, &data, &client).await);
                eprintln!("soak: minute {minute} of {}", plan.minutes);
                next_sample += Duration::from_secs(60);
            }
            tokio::time::sleep(work.pause()).await;
        }
        server.kill();
        report.kills += 1;
        report.verified.push(verify(exe, &data)?);
    }
    let log = out.join("server-last.log");
    let mut server = Server::spawn(exe, &data, &config, &log, 1)?;
    let client = listening(&mut server, &data).await?;
    work.finish(&client, FINISH_DEADLINE).await;
    report.deleted_by_retention = sample::metric(&client, "durafiber_runs_deleted_by_retention_total ").await;
    server.kill();
    work.score(&upstream, &mut report);
    report.bad_records = report.verified.iter().filter_map(|v| v["bad_records"].as_u64()).sum();
    sample::growth(&mut report);
    report.pass = report.lost_effects == 0
        && report.repeated_effects == 0
        && report.bad_records == 0
        && report.refunds > 0
        && [report.rss_growth_pct, report.fds_growth_pct, report.disk_growth_pct]
            .iter()
            .all(|g| *g < GROWTH_MAX_PCT);
    Ok(report)
}

/// A client of `server` once it listens.
async fn listening(server: &mut Server, data: &Path) -> anyhow::Result<Client> {
    let listen_by = Instant::now() + LISTEN_DEADLINE;
    loop {
        if let Some(addr) = server.poll_addr() {
            let token = durafiber_server::read_admin_token(data);
            return Ok(Client::from_addr(addr)
                .with_timeout(Duration::from_secs(5))
                .with_retry_budget(Duration::ZERO)
                .with_token(token));
        }
        if server.exited() || Instant::now() > listen_by {
            bail!("a server did not start: {}", server.log_text().lines().last().unwrap_or(""));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `store verify --json` of the data directory, while no server holds it.
fn verify(exe: &Path, data: &Path) -> anyhow::Result<serde_json::Value> {
    let out = Command::new(exe).args(["store", "verify", "--json", "--data"]).arg(data).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or("{}");
    serde_json::from_str(last).with_context(|| format!("store verify said {text}"))
}
