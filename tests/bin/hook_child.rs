//! Child process of the recovery-accounting kill test: opens the runtime on DIR with a
//! virtual clock standing at NOW_MS. `start` starts three healthy runs and one poisoned one
//! and kills the process once every fiber's stash is durable; `recover` lets the start-up scan
//! re-enter them — the poisoned run's recovery hook kills the process — moving the clock on
//! in steps, and prints `ended <state> <reason>` for the poisoned run once it is finished,
//! then `bystander <state>` for each healthy one.

use durafiber_runtime::Timestamp;
use std::time::Duration;

use durafiber_runtime::{Agent, AgentError, Ctx, Recovered, RunStatus, Runtime, clock::VirtualClock};
use durafiber_store::{Store, StoreConfig};

/// Stashes and waits; its recovery works a little, then does the same, unless it is
/// poisoned (its input).
struct Doomed;

impl Agent for Doomed {
    const KIND: &'static str = "doomed";
    type Input = bool;
    type Stash = u32;
    type Output = ();
    type Message = ();

    async fn run_fiber(&self, ctx: &mut Ctx<Self>, _: bool) -> Result<(), AgentError> {
        ctx.stash("started", &1).await?;
        ctx.sleep_in_memory(Duration::from_secs(3600)).await;
        Ok(())
    }

    async fn on_fiber_recovered(&self, ctx: &mut Ctx<Self>, r: Recovered<Self>) -> Result<(), AgentError> {
        if r.input {
            // The hook takes the whole process down, every time.
            std::process::abort();
        }
        // Some work before its first boundary: the poisoned hook kills the process meanwhile.
        ctx.sleep_in_memory(Duration::from_millis(50)).await;
        ctx.stash("recovered", &2).await?;
        ctx.sleep_in_memory(Duration::from_secs(3600)).await;
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Err(e) = run(&args).await {
        eprintln!("hook-child: {e}");
        std::process::exit(1);
    }
}

async fn run(args: &[String]) -> Result<(), String> {
    let usage = "usage: hook-child DIR start|recover NOW_MS";
    let (dir, mode) = (args.get(1).ok_or(usage)?, args.get(2).ok_or(usage)?);
    let now_ms: u64 = args.get(3).and_then(|n| n.parse().ok()).ok_or(usage)?;
    let store = Store::open_at(dir, StoreConfig::default()).map_err(|e| e.to_string())?;
    let rt = Runtime::builder(store)
        .virtual_clock(VirtualClock::new(Timestamp::from_millis(now_ms)))
        .agent(Doomed)
        .open()
        .await
        .map_err(|e| e.to_string())?;
    let e = |e: durafiber_runtime::RuntimeError| e.to_string();
    if mode == "start" {
        let mut runs = Vec::new();
        for (key, poisoned) in
            [("healthy-1", false), ("healthy-2", false), ("doomed", true), ("healthy-3", false)]
        {
            runs.push(rt.start::<Doomed>(key, &poisoned).await.map_err(e)?.run_id);
        }
        // The first process dies while the fresh fibers wait, after their stashes are durable.
        for _ in 0..2_000 {
            let mut stashed = 0;
            for run in &runs {
                stashed += usize::from(rt.inspect(run).map_err(e)?.stash.is_some());
            }
            if stashed == runs.len() {
                println!("stashed");
                let _ = std::io::Write::flush(&mut std::io::stdout());
                std::process::abort();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        return Err("the fibers never stashed".into());
    }
    let filter = durafiber_runtime::ListFilter { limit: 10, ..Default::default() };
    let runs = rt.list(&filter).map_err(e)?.runs;
    let doomed = runs.iter().find(|r| r.key == "doomed").ok_or("no doomed run")?.run_id.clone();
    // Recoveries held back for a lone one are asked again on the clock: move it on.
    for _ in 0..100 {
        rt.advance(Duration::from_millis(100)).await.map_err(e)?;
        if rt.status(&doomed).map_err(e)?.is_terminal() {
            break;
        }
    }
    match rt.status(&doomed).map_err(e)? {
        RunStatus::Escalated { reason } => println!("ended escalated {reason}"),
        other => println!("ended {}", other.name()),
    }
    for run in runs.iter().filter(|r| r.run_id != doomed) {
        println!("bystander {}", rt.status(&run.run_id).map_err(e)?.name());
    }
    Ok(())
}
