//! `durafiber bench`: stub replaced below.
use crate::args::Bench;

/// Runs a benchmark.
pub async fn run(_which: Bench) -> anyhow::Result<i32> {
    anyhow::bail!("benchmarks are not built yet")
}
