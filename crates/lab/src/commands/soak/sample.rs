//! What the soak measures of a server every minute, and how much it grew.

use std::path::Path;

use durafiber_client::Client;
use serde::Serialize;

use super::{Server, SoakReport};

/// One minute's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Minutes since the soak began.
    pub minute: u64,
    /// The server's resident memory.
    pub rss_bytes: u64,
    /// Its open file descriptors.
    pub fds: u64,
    /// The data directory's bytes.
    pub data_bytes: u64,
    /// Runs the store holds (`durafiber_runs`, every state).
    pub runs: u64,
}

impl Sample {
    pub(super) async fn take(minute: u64, server: &Server, data: &Path, client: &Client) -> Sample {
        let pid = server.child.id();
        Sample {
            minute,
            rss_bytes: rss_of(pid),
            fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64),
            data_bytes: bytes_under(data),
            runs: metric(client, "durafiber_runs{").await,
        }
    }
}

/// Resident memory of process `pid` (`VmRSS`), in bytes.
fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next());
    kb.and_then(|kb| kb.parse::<u64>().ok()).unwrap_or(0) * 1024
}

/// Bytes of every file under `dir`.
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => bytes_under(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The sum of the samples on the server's `/metrics` whose line starts with `series` (a
/// metric's name and a space, or its name and labels), 0 when it shows none.
pub(super) async fn metric(client: &Client, series: &str) -> u64 {
    let Ok(bytes) = client.get_bytes("/metrics").await else { return 0 };
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Fills in how much memory, descriptors and disk grew over the last half of the soak: the
/// mean of its last three samples against the mean of the three at its middle.
pub(super) fn growth(report: &mut SoakReport) {
    let samples = &report.samples;
    let half = samples.len() / 2;
    if samples.len() < 6 {
        return;
    }
    let mean = |range: &[Sample], f: fn(&Sample) -> u64| {
        range.iter().map(f).sum::<u64>() as f64 / range.len() as f64
    };
    let pct = |f: fn(&Sample) -> u64| {
        let (mid, last) = (mean(&samples[half - 1..half + 2], f), mean(&samples[samples.len() - 3..], f));
        if mid <= 0.0 { 0.0 } else { ((last - mid) / mid * 1000.0).round() / 10.0 }
    };
    report.rss_growth_pct = pct(|s| s.rss_bytes);
    report.fds_growth_pct = pct(|s| s.fds);
    report.disk_growth_pct = pct(|s| s.data_bytes);
}
