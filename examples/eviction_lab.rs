//! An agent's life under hibernation, eviction and alarm retries, as a timeline, on the
//! virtual clock: ten minutes of keep-alive and seven alarm attempts take milliseconds.
//! The same simulations back `durafiber sim eviction` and `durafiber sim alarm-retry`.
//!
//! Run: `cargo run -p durafiber-examples --example eviction_lab -- [SEED]`

use durafiber_demo::sim;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seed = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(7);
    println!("== hibernation, keep-alive, eviction mid-fiber (seed {seed})");
    let (timeline, report) = sim::eviction(seed).await?;
    for line in timeline.iter().filter(|l| !l.contains("heartbeat")) {
        println!("{line}");
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    println!("\n== an alarm whose handler fails twice, then succeeds");
    let (timeline, report) = sim::alarm_retry(seed, Some(2)).await?;
    for line in timeline {
        println!("{line}");
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
