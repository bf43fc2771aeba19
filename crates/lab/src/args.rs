//! The `durafiber` command: every operational command of `durafiber-cli` for the demo
//! agents, and the lab's commands — the drill, the torture, the simulations and the
//! benchmarks.

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};
use durafiber_api::Timestamp;

/// durafiber: durable runs for long-running agents — the demo agents, and the lab that
/// kills, measures and simulates them.
#[derive(Debug, Parser)]
#[command(name = "durafiber", version, about)]
pub struct LabCli {
    /// The version of the demo order agent's stash to host (1 or 2): how the torture deploys
    /// a new stash shape over a store full of version 1 runs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=2))]
    pub order_stash_version: u32,
    /// Stop at this boundary (for example `after_effect_call:refund`) and wait there to be
    /// killed: the drill's deterministic crash.
    #[arg(long)]
    pub stop_at: Option<durafiber_runtime::Boundary>,
    /// The command.
    #[command(subcommand)]
    pub command: LabCommand,
}

/// Every command: the operational ones, then the lab's.
#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// The operational commands, as every durafiber binary has them.
    #[command(flatten)]
    Ops(durafiber_cli::Command),
    /// The kill-and-resume drill, end to end, with real processes.
    Drill {
        /// Print a JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Seed of the drill's random choices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where to write the recording (server logs and the JSON report).
        #[arg(long)]
        out: Option<PathBuf>,
        /// The boundary the second kill lands on: `after_effect_prepare:refund`,
        /// `after_effect_call:refund` (between the upstream call and the receipt commit) or
        /// `after_effect_commit:refund`.
        #[arg(long, default_value = "after_effect_call:refund")]
        stop_at: String,
        /// Run the drill across this many nodes sharing the PostgreSQL server of `--pg-url`
        /// (a scratch database is created there and dropped after). The second stop is then
        /// always between the refund call and its receipt, and a SIGSTOP.
        #[arg(long, requires = "pg_url")]
        nodes: Option<usize>,
        /// The PostgreSQL server for `--nodes` (`postgres://user@host:port/db`; the user
        /// needs CREATEDB).
        #[arg(long, requires = "nodes", env = "DURAFIBER_PG_URL")]
        pg_url: Option<String>,
    },
    /// The random-kill torture: a server SIGKILLed at seeded random times while runs keep
    /// starting; then every promise is checked against an independent upstream.
    Torture {
        /// Print a JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Seed of every random choice (kill times, inputs, the server's chaos).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// How many times the server is SIGKILLed.
        #[arg(long, default_value_t = 100)]
        kills: u32,
        /// Chaos eviction rate inside the server, per committed boundary (0..=1).
        #[arg(long, default_value_t = 0.05)]
        chaos: f64,
        /// Where to write the server logs and the report.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Weeks of use in an hour: a steady workload on a real server with retention on,
    /// SIGKILLed every few minutes; memory, descriptors and disk each minute, every record
    /// verified at each restart, every refund checked against its upstream at the end.
    Soak {
        /// Print a JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// How long it runs.
        #[arg(long, default_value_t = 60)]
        minutes: u64,
        /// How long each server lives before its SIGKILL ("3m").
        #[arg(long, default_value = "3m", value_parser = humantime::parse_duration)]
        kill_every: Duration,
        /// Refunds started a second.
        #[arg(long, default_value_t = 5)]
        rate: u32,
        /// Where to write the server logs and the report.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Simulations on the virtual clock.
    Sim {
        /// Which simulation.
        #[command(subcommand)]
        which: Sim,
    },
    /// Benchmarks, each beside a baseline measured in the same run.
    Bench {
        /// Which benchmark.
        #[command(subcommand)]
        which: Bench,
    },
}

/// `sim` subcommands.
#[derive(Debug, Subcommand)]
pub enum Sim {
    /// Hibernation, keep-alive heartbeats, eviction mid-fiber and recovery.
    Eviction {
        /// Print a JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Seed of the eviction draws.
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// An alarm whose handler fails K times (default: always).
    AlarmRetry {
        /// Print a JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Failures before the handler succeeds.
        #[arg(long)]
        fail_times: Option<u32>,
        /// Seed of the jitter.
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
}

/// `bench` subcommands.
#[derive(Debug, Subcommand)]
pub enum Bench {
    /// Sync-mode commits per second against the raw fdatasync rate.
    Stash {
        /// Print a JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Concurrent writers (the 1-writer figure is always measured too).
        #[arg(long, default_value_t = 1000)]
        writers: usize,
        /// Seconds per measurement: 2 by default, 10 with `--nodes` (a p99 over 2 s is one
        /// burst's; over 10 s, a busy host's).
        #[arg(long)]
        seconds: Option<f64>,
        /// Where to write samples and the histogram.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Measure fenced commits across this many node processes sharing the PostgreSQL
        /// server of `--pg-url` (a scratch database is created there and dropped after).
        #[arg(long, requires = "pg_url")]
        nodes: Option<usize>,
        /// The PostgreSQL server for `--nodes` (the user needs CREATEDB).
        #[arg(long, requires = "nodes", env = "DURAFIBER_PG_URL")]
        pg_url: Option<String>,
    },
    /// Time from a restarted process's start to every interrupted run recovered.
    Recover {
        /// Print a JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Runs in flight when the process is killed.
        #[arg(long, default_value_t = 1000)]
        runs: usize,
        /// Time each run waits before each of its steps, before and after the kill: with
        /// many runs, a short one makes their own steps compete with the recovery measured.
        #[arg(long = "pause-ms", value_parser = millis, default_value = "1000")]
        pause: Duration,
        /// Recover N times, each on a fresh copy of the killed process's data directory,
        /// and report every time with the median and the best (the machine's noise shows).
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// Boundaries each run keeps in its history (`history_max`), before the kill and
        /// after: each kept boundary is one more record a step writes (and one it deletes).
        #[arg(long, default_value_t = durafiber_runtime::limits::HISTORY_MAX_DEFAULT)]
        history_max: u32,
        /// Where to write samples and the histogram.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Alarm lateness with many alarms due at once, and memory per pending alarm.
    Alarms {
        /// Print a JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Alarms due within the same second.
        #[arg(long, default_value_t = 10_000)]
        alarms: usize,
        /// Extra alarms pending far in the future.
        #[arg(long, default_value_t = 0)]
        pending: usize,
        /// Where to write samples and the histogram.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The side-by-side workload: concurrent runs of stash steps, one run's sequential steps
    /// with a gap, and a SIGKILL with runs in flight (restart to first resumed step, steps
    /// re-run), beside raw fdatasync.
    Steps {
        /// Print a JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Concurrent runs.
        #[arg(long, default_value_t = 100)]
        runs: usize,
        /// Stash steps per concurrent run.
        #[arg(long, default_value_t = 50)]
        steps: u32,
        /// Steps of the sequential run.
        #[arg(long, default_value_t = 200)]
        sequential: u32,
        /// Gap between the sequential run's steps, ms.
        #[arg(long = "gap-ms", value_parser = millis, default_value = "1")]
        gap: Duration,
        /// Runs in flight when the process is killed.
        #[arg(long, default_value_t = 200)]
        kill_runs: usize,
        /// Busy loops to run beside the whole measurement, each a process of its own that
        /// spins on one core (a busy host's other tenants).
        #[arg(long, default_value_t = 0)]
        busy: usize,
        /// Boundaries each run keeps in its history (`history_max`); 0 measures steps
        /// without a history.
        #[arg(long, default_value_t = durafiber_runtime::limits::HISTORY_MAX_DEFAULT)]
        history_max: u32,
        /// Where to write the sequential steps' samples and histogram.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Runs waiting for approval: resident memory per waiting run once they have left
    /// memory, and how soon approved runs go on.
    Idle {
        /// Print a JSON object as the last line.
        #[arg(long)]
        json: bool,
        /// Runs that wait for approval.
        #[arg(long, default_value_t = 10_000)]
        runs: usize,
        /// The share of them approved at the end.
        #[arg(long, default_value_t = 0.01)]
        approve_share: f64,
        /// The runtime's `waiting_in_memory`; as many as `--runs` keeps every waiting fiber
        /// in memory (and `hibernate_after` at a day), to compare with parking them.
        #[arg(long, default_value_t = durafiber_runtime::limits::WAITING_IN_MEMORY_DEFAULT)]
        waiting_in_memory: usize,
    },
    /// Internal: the process whose memory `bench alarms --pending` measures.
    #[command(hide = true)]
    AlarmsMemoryChild {
        /// The data directory.
        data: PathBuf,
    },
    /// Internal: one busy loop of `bench steps --busy`.
    #[command(hide = true)]
    BusyLoop,
    /// Internal: the process `bench idle` measures.
    #[command(hide = true)]
    IdleChild {
        /// The data directory.
        data: PathBuf,
        /// Runs.
        #[arg(long)]
        runs: usize,
        /// The share approved.
        #[arg(long)]
        approve_share: f64,
        /// The runtime's `waiting_in_memory`.
        #[arg(long)]
        waiting_in_memory: usize,
    },
    /// Internal: one node of `bench stash --nodes`.
    #[command(hide = true)]
    StashNode {
        /// The database.
        url: String,
        /// This node's id.
        node_id: String,
        /// Nodes in the measurement (this one takes 1/nodes of the shards).
        nodes: usize,
        /// Concurrent writers in this node.
        writers: usize,
        /// When to start committing, ms since the epoch (every node starts together).
        #[arg(value_parser = epoch_millis)]
        start_at: Timestamp,
        /// Seconds to commit for.
        seconds: f64,
    },
    /// Internal: the process `bench steps` kills and restarts.
    #[command(hide = true)]
    StepsChild {
        /// The data directory.
        data: PathBuf,
        /// `start` or `resume`.
        mode: String,
        /// Runs.
        runs: usize,
    },
    /// Internal: the process `bench recover` kills and restarts.
    #[command(hide = true)]
    RecoverChild {
        /// The data directory.
        data: PathBuf,
        /// `start N` or `recover N`.
        mode: String,
        /// Runs.
        runs: usize,
        /// Time each run waits before each step.
        #[arg(long = "pause-ms", value_parser = millis, default_value = "1000")]
        pause: Duration,
        /// Boundaries each run keeps in its history.
        #[arg(long, default_value_t = durafiber_runtime::limits::HISTORY_MAX_DEFAULT)]
        history_max: u32,
    },
}

/// A span of time given in milliseconds (`--pause-ms 60000`).
fn millis(ms: &str) -> Result<Duration, std::num::ParseIntError> {
    ms.parse().map(Duration::from_millis)
}

/// A moment given in milliseconds since the Unix epoch.
fn epoch_millis(ms: &str) -> Result<Timestamp, std::num::ParseIntError> {
    ms.parse().map(Timestamp::from_millis)
}
