//! One module per lab command; [`run`] dispatches, handing the operational commands to
//! `durafiber-cli` with the demo agents.

pub mod bench;
mod bench_idle;
mod bench_nodes;
mod bench_recover;
mod bench_steps;
pub mod drill;
mod drill_nodes;
mod measure;
mod output;
pub mod soak;
pub mod torture;

use durafiber_demo::sim;
use output::print_report;

use crate::{
    agents::{Hosting, register},
    args::{LabCommand, Sim},
};

/// Runs one command; the exit code on success.
pub async fn run(command: LabCommand, hosting: Hosting) -> anyhow::Result<i32> {
    match command {
        LabCommand::Ops(command) => durafiber_cli::run(command, &|builder| register(builder, &hosting)).await,
        LabCommand::Drill { json, seed, out, nodes: Some(nodes), pg_url: Some(url), .. } => {
            drill_nodes::run(json, seed, out.as_deref(), nodes, &url).await
        }
        LabCommand::Drill { json, seed, out, stop_at, .. } => {
            drill::run(json, seed, out.as_deref(), &stop_at).await
        }
        LabCommand::Torture { json, seed, kills, chaos, out } => {
            torture::run(json, torture::Plan { seed, kills, chaos }, out.as_deref()).await
        }
        LabCommand::Soak { json, minutes, kill_every, rate, out } => {
            soak::run(json, soak::SoakPlan { minutes, kill_every, rate }, out.as_deref()).await
        }
        LabCommand::Sim { which: Sim::Eviction { json, seed } } => {
            let (lines, report) = sim::eviction(seed).await?;
            print_report(&lines, &report, json)?;
            Ok(0)
        }
        LabCommand::Sim { which: Sim::AlarmRetry { json, fail_times, seed } } => {
            let (lines, report) = sim::alarm_retry(seed, fail_times).await?;
            print_report(&lines, &report, json)?;
            Ok(0)
        }
        LabCommand::Bench { which } => bench::run(which).await,
    }
}
