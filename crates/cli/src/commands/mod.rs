//! One module per command; [`run`] dispatches.

pub mod sim;

use crate::args::{Command, Sim};

/// Prints `lines`, then `report` as the last line when `json` is set.
pub fn print_report<T: serde::Serialize>(lines: &[String], report: &T, json: bool) -> anyhow::Result<()> {
    for line in lines {
        println!("{line}");
    }
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!("{}", serde_json::to_string_pretty(report)?);
    }
    Ok(())
}

/// Runs one command; the exit code on success.
pub async fn run(command: Command) -> anyhow::Result<i32> {
    match command {
        Command::Sim { which: Sim::Eviction { json, seed } } => {
            let (lines, report) = sim::eviction(seed).await?;
            print_report(&lines, &report, json)?;
            Ok(0)
        }
        Command::Sim { which: Sim::AlarmRetry { json, fail_times, seed } } => {
            let (lines, report) = sim::alarm_retry(seed, fail_times).await?;
            print_report(&lines, &report, json)?;
            Ok(0)
        }
        _ => anyhow::bail!("not available in this build"),
    }
}
